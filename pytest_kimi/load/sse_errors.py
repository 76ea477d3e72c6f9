"""What the SSE parser says when a stream ends in an error, and how it tells an error event.

Stands on its own because the texts are shared: the parser writes them onto the record, and
the tests' JSON-decoding reference builds the same ones, without the parser's byte counting
(:mod:`pytest_kimi.load.sse`).  The oversized-event text stays beside its limit there.
"""

from __future__ import annotations

import json
from typing import Any


def past_max_tokens_message(events: int, max_tokens: int) -> str:
    return (
        f"stream passed max_tokens={max_tokens}: {events} token events arrived (each carries at "
        "least one token), so the server ignores max_tokens and, with ignore_eos, would never "
        "end; the stream was closed: fix the server, or the proxy in front of it"
    )


def malformed_message(payload: bytes) -> str:
    """The error text for an undecodable event (shared with the test reference)."""
    return "malformed SSE event: " + payload[:80].decode("utf-8", "replace")


def error_event_message(obj: dict[str, Any]) -> str:
    """Readable text for a server-sent error event (SGLang ``{"error": {...}}`` / vLLM
    ``{"object": "error", "message": ...}``)."""
    err = obj.get("error")
    if err is None or obj.get("object") == "error":
        err = obj
    if isinstance(err, dict):
        msg = err.get("message") or err.get("msg") or err.get("detail") or json.dumps(err)[:200]
        code = err.get("code") or err.get("type")
        text = f"{msg} ({code})" if code else str(msg)
    else:
        text = str(err)
    return "server error event: " + text[:300]


def is_error_object(obj: dict[str, Any]) -> bool:
    return obj.get("error") is not None or obj.get("object") == "error"
