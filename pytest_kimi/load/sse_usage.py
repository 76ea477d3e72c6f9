"""A stream's token counts outside the parser's hot path: the request's ``max_tokens``, the
server's ``usage`` and whether to believe it, reasoning tokens, a read's running usage.

Stands on its own because these run once per request or per decoded event, never per read,
and are shared: the request reads its bound here, the trial's usage checks
(:mod:`pytest_kimi.measure.usage_checks`) their texts and running usage, and the parser
(:mod:`pytest_kimi.load.sse`) the rest.
"""

from __future__ import annotations

import json
import re
from typing import Any

_MAX_TOKENS_KEY = b'"max_tokens":'
_MAX_TOKENS_VALUE = re.compile(rb"[ \t]*(\d{1,12})")


def body_max_tokens(body: bytes) -> int:
    """The ``max_tokens`` a request body asks for, 0 when it names none.

    Read once per request (not per chunk) with one ``rfind`` from the end, where the encoded
    bodies (:func:`pytest_kimi.workload.prompts.encode_bodies`, compact JSON) put the key after
    the prompt.  In JSON a ``"`` inside a string is escaped, so the pattern ``"max_tokens":``
    can only be the key itself, never prompt text.
    """
    i = body.rfind(_MAX_TOKENS_KEY)
    if i < 0:
        return 0
    m = _MAX_TOKENS_VALUE.match(body, i + len(_MAX_TOKENS_KEY))
    return int(m.group(1)) if m else 0


def usage_below_events_message(completion_tokens: int, events: int) -> str:
    return (
        f"usage.completion_tokens={completion_tokens} is below the {events} token events streamed"
    )


def usage_fell_message(before: int, after: int) -> str:
    return (
        f"usage.completion_tokens went down within the stream, from {before} to {after} (a "
        "running count of the tokens so far never falls)"
    )


def usage_above_max_tokens_message(completion_tokens: int, max_tokens: int) -> str:
    return (
        f"usage.completion_tokens={completion_tokens} is above the request's "
        f"max_tokens={max_tokens}"
    )


def usage_problem(value: object) -> str | None:
    """Why a ``usage.completion_tokens`` value is no token count, or None when it is one.

    An integral float (``12.0``) is a count; ``bool`` is refused although Python takes it as an
    ``int`` (``true`` would otherwise read as 1 token).
    """
    if isinstance(value, bool):
        return f"usage.completion_tokens is a bool ({json.dumps(value)}), not a count"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return None if value >= 0 else f"usage.completion_tokens={value} is negative"
    if isinstance(value, float):
        return f"usage.completion_tokens={value!r} is fractional"
    return f"usage.completion_tokens={json.dumps(value)[:40]} is not a number"


def usage_reasoning_tokens(usage: dict[str, Any]) -> int:
    """The reasoning-token count a ``usage`` object reports; 0 when it reports none.

    OpenAI (and SGLang when non-zero) put it in ``completion_tokens_details.reasoning_tokens``;
    SGLang 0.5.23 also sends a top-level ``reasoning_tokens`` (``UsageInfo`` in
    ``sglang/srt/entrypoints/openai/protocol.py``).
    """
    details = usage.get("completion_tokens_details")
    n = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if not isinstance(n, int) or isinstance(n, bool):
        n = usage.get("reasoning_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def reasoning_tokens(
    events: int, from_usage: int, completion_tokens: int, tokens_per_event: float
) -> int:
    """A request's reasoning tokens, given that ``events`` (> 0) reasoning events arrived.

    The server's count when it gave one (it may include the end-of-thinking marker, which is
    not streamed); else the events scaled by the request's tokens per event (1 unless the
    server packs tokens, ``--stream-interval``).  At least 1, since the stream did carry
    reasoning, and never more than all output tokens.
    """
    n = from_usage if from_usage > 0 else round(events * tokens_per_event)
    if completion_tokens > 0:
        n = min(n, completion_tokens)
    return max(n, 1)


_RUNNING_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def running_usage(block: bytes) -> int | None:
    """The last ``completion_tokens`` a read block carries (``continuous_usage_stats`` puts
    the usage so far on every chunk), or None.  Read once per cut stream and by a stationary
    trial's budget on a few streams per poll -- never per chunk."""
    found = _RUNNING_USAGE.findall(block)
    return int(found[-1]) if found else None
