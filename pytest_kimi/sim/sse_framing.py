"""Server-sent events as SGLang 0.5.23 frames them, pre-encoded per request.

The chunks are SGLang-shaped (one per token, ``usage`` chunk on request, ``[DONE]``), byte
for byte as its encoders write them, so a client parsing the simulator parses SGLang.

Why pre-encoded: the per-token path is a list lookup and a bytes join, since every token's
complete SSE event is encoded once per request, so the simulator keeps up with its own
schedule instead of spending its time in ``json.dumps``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any


VOCAB: tuple[str, ...] = (
    " The",
    " answer",
    " is",
    " 4",
    ".",
    " café",
    " naïve",
    " 日本",
    "語",
    " 🚀",
    " 🙂",
    ' "quoted"',
    " back\\slash",
    "\n",
    "\t",
    " <b>",
    " &",
    " über",
    ",",
    " and",
    " résumé",
    " 😀",
    " so",
    " on",
)
"""Token texts: multi-byte UTF-8 and JSON-escaped characters on purpose, so a client that
splits UTF-8 or unescapes JSON wrongly is caught by the plugin's own tests."""

EOS_TOKEN_ID = 163586
"""Reported as ``matched_stop`` when a sequence ends at its simulated EOS (arbitrary id)."""

_VOCAB_JSON: tuple[bytes, ...] = tuple(
    json.dumps(t, ensure_ascii=False).encode("utf-8") for t in VOCAB
)
_DONE = b"data: [DONE]\n\n"
_MALFORMED = b'data: {"object":"chat.completion.chunk","choices":[{"delta":{"content":"trunc\n\n'
_CHAT_CONTENT = b'"delta":{"reasoning_content":null,"content":'
_CHAT_TAIL = b'},"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
"""A chat chunk as SGLang 0.5.23 encodes it (``build_sse_content`` in
``sglang/srt/entrypoints/openai/sse_utils.py``, msgspec structs): the delta's
``reasoning_content`` always, first, then ``role`` and ``content`` where set; no ``tool_calls``;
no ``usage`` key unless there is usage (``omit_defaults``)."""
_TEXT_TAIL = b',"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
"""A completions chunk: pydantic's ``model_dump_json`` of ``CompletionStreamResponse``
(``serving_completions.py``), so ``"usage":null`` where there is none."""
_REASONING_TAIL = _CHAT_TAIL
"""Closes a reasoning chunk, whose delta is ``{"reasoning_content":"..."}`` alone as in SGLang
0.5.23 (``StreamDelta`` omits a None ``content``)."""
_KEEPALIVE = b": keep-alive\n\n"
KEEPALIVE_INTERVAL_S = 0.1
"""Wall seconds between the comments of a ``keepalive_after_tokens`` stream: far inside any
silence timeout, so only a trial's wall-clock limit ends it."""


def _token_text(offset: int, i: int) -> str:
    return VOCAB[(offset + i) % len(VOCAB)]


class _Encoder:
    """Pre-encoded SSE events for one request: per-token cost is a list lookup."""

    __slots__ = (
        "kind",
        "rid",
        "created",
        "model",
        "offset",
        "events",
        "_head",
        "thinking",
        "split",
        "r_events",
        "role_event",
    )

    def __init__(
        self, kind: str, model: str, offset: int, thinking: int = 0, separate: bool = True
    ) -> None:
        self.kind = kind
        self.rid = uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.offset = offset % len(VOCAB)
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self._head = (
            f'data: {{"id":"{self.rid}","object":"{obj}","created":{self.created},'
            f'"model":{json.dumps(model, ensure_ascii=False)},'
        ).encode("utf-8")
        head = self._head + b'"choices":[{"index":0,'
        if kind == "chat":
            self.events = [head + _CHAT_CONTENT + enc + _CHAT_TAIL for enc in _VOCAB_JSON]
        else:
            self.events = [head + b'"text":' + enc + _TEXT_TAIL for enc in _VOCAB_JSON]
        self.thinking = thinking if kind == "chat" else 0
        """Reasoning tokens this response opens with (usage counts them either way)."""
        self.split = self.thinking if separate else 0
        """First token streamed as content; the ones before it are ``reasoning_content``."""
        self.r_events: list[bytes] = []
        self.role_event = b""
        """A chat stream opens with a chunk of its own that carries the role and no token,
        as SGLang 0.5.23's does (``_generate_chat_stream`` in ``serving_chat.py``: the first
        output yields ``build_sse_content(role="assistant", content="")``, then the tokens)."""
        if kind == "chat":
            self.role_event = (
                head
                + b'"delta":{"reasoning_content":null,"role":"assistant","content":""'
                + _CHAT_TAIL
            )
        if self.split:
            # SGLang with a reasoning parser: one chunk per step with reasoning text, then
            # content chunks (serving_chat.py, 0.5.23)
            self.r_events = [
                head + b'"delta":{"reasoning_content":' + enc + _REASONING_TAIL
                for enc in _VOCAB_JSON
            ]

    def tokens(self, start: int, stop: int, running: int | None = None) -> bytes:
        """The SSE events of tokens ``start`` (inclusive) to ``stop`` (exclusive), one a token.

        ``running``: the prompt's tokens when every token chunk carries the usage so far
        (``continuous_usage_stats``); None: ``"usage":null`` on each, as pre-encoded."""
        if stop <= start:
            return b""
        ev = self.events
        v = len(ev)
        off = self.offset
        role = self.role_event if start == 0 else b""
        if start < self.split:
            mid = min(stop, self.split)
            rev = self.r_events
            parts = [rev[(off + i) % v] for i in range(start, mid)] + [
                ev[(off + i) % v] for i in range(mid, stop)
            ]
        else:
            parts = [ev[(off + i) % v] for i in range(start, stop)]
        if running is not None:
            parts = [
                _usage_tail(e, self.running_usage(running, start + j + 1))
                for j, e in enumerate(parts)
            ]
        return role + b"".join(parts)

    def merged(self, start: int, stop: int, interval: int, running: int | None = None) -> bytes:
        """Tokens ``start``..``stop`` as SGLang 0.5.23 streams them with ``--stream-interval``
        ``interval``: the first token in an event of its own, then events of ``interval``
        tokens, the last one shorter (the rest, sent with the finish).

        ``OutputStreamer.accept`` (``scheduler_components/output_streamer.py``) sends a
        stream's output when it has no token sent yet, or when at least ``interval`` tokens
        are unsent, or when it finishes; with one token a step that puts the events' ends at
        tokens 1, 1 + interval, 1 + 2 * interval, ...  ``start`` is such an end (the writer
        only stops on them), so the events come out the same however late it writes.
        ``running`` as in :meth:`tokens`: each event then carries the usage up to its end."""
        out = []
        lo = start
        while lo < stop:
            hi = min(1 if lo == 0 else lo + interval, stop)
            usage = None if running is None else self.running_usage(running, hi)
            if lo == 0:
                out.append(self.role_event)
            if lo < self.split:
                # the step that ends the thinking yields a reasoning chunk, then a content one
                text = json.dumps(
                    "".join(_token_text(self.offset, i) for i in range(lo, min(hi, self.split))),
                    ensure_ascii=False,
                ).encode("utf-8")
                out.append(
                    _usage_tail(
                        self._head
                        + b'"choices":[{"index":0,"delta":{"reasoning_content":'
                        + text
                        + _REASONING_TAIL,
                        usage,
                    )
                )
                if hi <= self.split:
                    lo = hi
                    continue
                mid = self.split
            else:
                mid = lo
            text = json.dumps(
                "".join(_token_text(self.offset, i) for i in range(mid, hi)), ensure_ascii=False
            ).encode("utf-8")
            head = self._head + b'"choices":[{"index":0,'
            if self.kind == "chat":
                event = head + _CHAT_CONTENT + text + _CHAT_TAIL
            else:
                event = head + b'"text":' + text + _TEXT_TAIL
            out.append(_usage_tail(event, usage))
            lo = hi
        return b"".join(out)

    def running_usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """``"usage":{...}}\n\n``, the end of a token chunk under ``continuous_usage_stats``:
        SGLang 0.5.23's ``UsageProcessor.calculate_token_usage(...).model_dump()`` in its
        key order (``UsageInfo`` in ``protocol.py``), the reasoning so far included."""
        r = min(self.thinking, completion_tokens)
        details = b'{"reasoning_tokens":%d}' % r if r else b"null"
        return (
            b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,'
            % (
                prompt_tokens,
                prompt_tokens + completion_tokens,
                completion_tokens,
            )
            + b'"prompt_tokens_details":null,"reasoning_tokens":%d,"completion_tokens_details":%s}}\n\n'
            % (
                r,
                details,
            )
        )

    def finish(self, reason: str, data: bytes = b"") -> bytes:
        """The end of a stream's tokens, ``data`` being its last events.

        Chat (``_generate_chat_stream``): a chunk of its own after the last token, its delta
        ``{"reasoning_content":null}``, no usage.  Completions (``serving_completions.py``):
        the finish rides on the last token's chunk (its ``finish_reason`` and
        ``matched_stop`` set), so ``data`` comes back with them in place; a chunk of its own
        only where ``data`` holds no token event."""
        matched = b"%d" % EOS_TOKEN_ID if reason == "stop" else b"null"
        done = b'"finish_reason":"%s","matched_stop":%s' % (reason.encode(), matched)
        if self.kind == "chat":
            return data + (
                self._head + b'"choices":[{"index":0,"delta":{"reasoning_content":null},'
                b'"logprobs":null,' + done + b"}]}\n\n"
            )
        at = data.rfind(_OPEN_FINISH)
        if at >= 0:
            return data[:at] + done + data[at + len(_OPEN_FINISH) :]
        return data + (
            self._head
            + b'"choices":[{"index":0,"text":"","logprobs":null,'
            + done
            + b'}],"usage":null}\n\n'
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The usage-only chunk after the finish.  Chat: ``model_dump_json()`` of the stream
        response, every ``UsageInfo`` key in its order, nulls included (as
        :meth:`running_usage`); completions: ``model_dump_json(exclude_none=True)``."""
        if self.kind == "chat":
            return (
                self._head + b'"choices":[],' + self.running_usage(prompt_tokens, completion_tokens)
            )
        body: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "reasoning_tokens": 0,
        }
        usage = json.dumps(body, separators=(",", ":"))
        return self._head + f'"choices":[],"usage":{usage}}}\n\n'.encode()

    def reasoning_usage(self, completion_tokens: int) -> dict[str, Any]:
        """SGLang 0.5.23's usage keys for thinking (``UsageInfo`` in ``protocol.py``: top-level
        ``reasoning_tokens`` and, when non-zero, ``completion_tokens_details``); left out when
        there is none, so a response without thinking looks as it always did."""
        n = min(self.thinking, completion_tokens)
        return (
            {"reasoning_tokens": n, "completion_tokens_details": {"reasoning_tokens": n}}
            if n
            else {}
        )

    def text(self, n: int) -> str:
        return "".join(_token_text(self.offset, i) for i in range(n))

    def message(self, n: int) -> tuple[str | None, str]:
        """A whole response of ``n`` tokens as (reasoning_content, content)."""
        if not self.split:
            return None, self.text(n)
        full = [_token_text(self.offset, i) for i in range(n)]
        return "".join(full[: self.split]), "".join(full[self.split :])


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


_NULL_USAGE_END = b'"usage":null}\n\n'
_NO_USAGE_END = b"}\n\n"
_OPEN_FINISH = b'"finish_reason":null,"matched_stop":null'


def _usage_tail(event: bytes, usage: bytes | None) -> bytes:
    """``event`` (a pre-encoded chunk ending ``"usage":null}`` as completions chunks do, or
    without a usage key as chat chunks) with ``usage`` (``"usage":{...}}``) in its place."""
    if usage is None:
        return event
    if event.endswith(_NULL_USAGE_END):
        return event[: -len(_NULL_USAGE_END)] + usage
    return event[: -len(_NO_USAGE_END)] + b"," + usage
