"""aiohttp application that looks like SGLang's OpenAI-compatible server to a benchmark client.

Only what a throughput client touches is modelled, but that part is modelled faithfully:
SGLang-shaped SSE chunks (one per token, ``usage`` chunk on request, ``[DONE]``), the
side endpoints a harness probes (``/get_server_info``, ``/health_generate``, ``/metrics``)
and the faults a client must survive (HTTP 500s, stalls, dropped connections, malformed
events, a server that is still warming up, a missing ``usage``).

The per-token path is a list lookup and a bytes join: every token's complete SSE event is
pre-encoded per request, so the server keeps up with its own schedule at tens of thousands
of tokens per second instead of spending its time in ``json.dumps``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import math
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from aiohttp import web

from pytest_kimi.sim.engine import EngineNotRunning, Sequence, SeqState, SimEngine, prefix_pages
from pytest_kimi.sim.config import SimConfig

__all__ = [
    "ENGINE_KEY",
    "PROFILE_KEY",
    "VOCAB",
    "SimServer",
    "count_prompt_tokens",
    "create_app",
    "start_server",
    "SIM_VERSION",
]

SIM_VERSION = "0.1.0-sim"
ALLOWED_HOSTS = ("127.0.0.1",)

ENGINE_KEY: web.AppKey[SimEngine] = web.AppKey("pytest_kimi_sim_engine", SimEngine)
PROFILE_KEY: web.AppKey[SimConfig] = web.AppKey("pytest_kimi_sim_profile", SimConfig)

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
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_HEALTH_EXEMPT = ("/health", "/health_generate", "/metrics", "/sim/")
_ADMIN_OPTIONAL = ("/flush_cache",)
"""SGLang's ``AuthLevel.ADMIN_OPTIONAL`` endpoints (``sglang/srt/utils/auth.py``,
``decide_request_auth``): the admin key when one is set, else the API key, else open."""
MAX_MODEL_LEN = 262144


def count_prompt_tokens(text: str) -> int:
    """Deterministic prompt size: one token per 4 UTF-8 bytes, rounded up, at least 1.

    Real tokenizers average roughly 4 bytes per token on English; what matters here is
    that client and server can both compute the same number without a tokenizer.
    """
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


def _token_text(offset: int, i: int) -> str:
    return VOCAB[(offset + i) % len(VOCAB)]


# ---------------------------------------------------------------------- request parsing


class BadRequest(Exception):
    """A request body the server rejects with 400 and this message."""


@dataclass(frozen=True, slots=True)
class GenParams:
    """What the engine and the writer need from a generation request body."""

    kind: str  # "chat" | "completion"
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    continuous_usage: bool = False
    """``stream_options.continuous_usage_stats``: every token chunk carries the usage so far
    (SGLang's ``serving_chat.py``, vLLM alike), not only the last chunk."""
    thinking: bool = True
    """Chat: the response opens with the profile's reasoning phase (off with
    ``chat_template_kwargs: {"thinking": false}``, as Kimi's template reads it)."""
    separate_reasoning: bool = True
    """Chat: reasoning streams as ``reasoning_content``; false streams it as content (SGLang's
    ``separate_reasoning`` request field) while usage still counts it."""
    prompt_key: bytes = b""
    """The prompt as the simulator tokenizes it (4 bytes a token), for the prefix cache."""


def _thinking(body: dict[str, Any]) -> bool:
    """Whether a chat request leaves thinking on: SGLang maps ``reasoning_effort: "none"`` to
    ``thinking`` / ``enable_thinking`` false in ``chat_template_kwargs`` (``protocol.py``);
    Kimi K2's template reads ``thinking``, Qwen3's ``enable_thinking``: either turns it off."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object")
    on = body.get("reasoning_effort") != "none"
    for key in ("thinking", "enable_thinking"):
        value = kwargs.get(key)
        if value is not None:
            on = on and bool(value)
    return on


def _opt_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean, got {json.dumps(value)}")
    return value


def _max_tokens(body: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"'{key}' must be an integer >= 1, got {json.dumps(value)}")
        return value
    return 16


def _chat_prompt_tokens(body: dict[str, Any]) -> int:
    return count_prompt_tokens(_chat_prompt_text(body))


def _chat_prompt_text(body: dict[str, Any]) -> str:
    """The text the simulator counts for a chat request: every message's content, joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    texts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
        content = msg.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise BadRequest(f"messages[{i}].content[{j}] must be an object")
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        else:
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null")
    return "".join(texts)


def _completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_prompt_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return len(prompt)
        if len(prompt) == 1:
            only = prompt[0]
            if isinstance(only, str):
                return count_prompt_tokens(only)
            if (
                isinstance(only, list)
                and only
                and all(isinstance(x, int) and not isinstance(x, bool) for x in only)
            ):
                return len(only)
        if len(prompt) > 1 and all(isinstance(x, (str, list)) for x in prompt):
            raise BadRequest(
                "batched prompts are not supported by the simulator; send one prompt per request"
            )
    raise BadRequest("'prompt' must be a string, a list of token ids, or a one-element list")


def _token_bytes(ids: list[int]) -> bytes:
    """Token ids as prompt bytes, 4 a token, like text is counted."""
    return array("I", [x & 0xFFFFFFFF for x in ids]).tobytes()


def _completion_prompt_key(body: dict[str, Any]) -> bytes:
    """The completion prompt's bytes (its shape was checked by ``_completion_prompt_tokens``)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.encode("utf-8")
    return _token_bytes(prompt) if isinstance(prompt, list) else b""


def tokenize_text(text: str) -> list[int]:
    """The simulator's token ids of ``text``: each 4 UTF-8 bytes one id, as
    :func:`count_prompt_tokens` counts them (and the prefix cache matches them)."""
    data = text.encode("utf-8")
    ids = [int.from_bytes(data[at : at + 4], "little") for at in range(0, len(data), 4)]
    return ids or [0]


def parse_generation(body: object, kind: str) -> GenParams:
    """Validate a chat or completions body; raises :class:`BadRequest` with a clear reason."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"'n' must be 1 in the simulator, got {json.dumps(n)}")
    if kind == "chat":
        text = _chat_prompt_text(body)
        prompt_tokens = count_prompt_tokens(text)
        prompt_key = text.encode("utf-8")
        max_tokens = _max_tokens(body, ("max_tokens", "max_completion_tokens"))
    else:
        prompt_tokens = _completion_prompt_tokens(body)
        prompt_key = _completion_prompt_key(body)
        max_tokens = _max_tokens(body, ("max_tokens",))
    stream = _opt_bool(body, "stream", False)
    options = body.get("stream_options")
    include_usage = continuous_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object")
        include_usage = _opt_bool(options, "include_usage", False)
        # independent of include_usage, as in SGLang 0.5.23 (should_include_usage in
        # entrypoints/openai/utils.py); vLLM needs both
        continuous_usage = _opt_bool(options, "continuous_usage_stats", False)
    ignore_eos = _opt_bool(body, "ignore_eos", False)
    chat = kind == "chat"
    return GenParams(
        kind=kind,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        ignore_eos=ignore_eos,
        thinking=chat and _thinking(body),
        separate_reasoning=_opt_bool(body, "separate_reasoning", True),
        prompt_key=prompt_key,
    )


# ---------------------------------------------------------------------- SSE encoding


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


# ---------------------------------------------------------------------- responses


def _error(status: int, message: str, etype: str) -> web.Response:
    """An error shaped like SGLang's OpenAI-compatible error body."""
    return web.json_response(
        {"object": "error", "message": message, "type": etype, "param": None, "code": status},
        status=status,
    )


def _drop_connection(request: web.Request) -> None:
    """Close the TCP connection under a response so the client sees a broken stream."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.close()


async def _stream(
    request: web.Request, engine: SimEngine, seq: Sequence, params: GenParams, enc: _Encoder
) -> web.StreamResponse:
    """Write the SSE stream; on a deliberate drop or a vanished client return the prepared
    response, whose ``write_eof`` then fails and aiohttp quietly closes the connection."""
    resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        await _write_events(request, resp, engine.profile, seq, params, enc)
    except ConnectionError:
        _drop_connection(request)
    return resp


async def _write_events(
    request: web.Request,
    resp: web.StreamResponse,
    profile: SimConfig,
    seq: Sequence,
    params: GenParams,
    enc: _Encoder,
) -> None:
    disc = profile.disconnect_after_tokens
    mal = profile.malformed_after_tokens
    if disc == 0:
        _drop_connection(request)
        return
    sent = 0
    interval = profile.stream_interval
    hold = profile.keepalive_after_tokens
    running = params.prompt_tokens if params.continuous_usage and not profile.no_usage else None
    while True:
        if hold is not None and sent >= hold:
            await _keep_alive(request, resp)
            return
        await seq.wait_progress(sent)
        # SGLang 0.5.23's --stream-interval: the first token at once, then an event whenever
        # `interval` tokens are unsent, the rest with the finish (Encoder.merged)
        while interval > 1 and sent and seq.generated < sent + interval and not seq.done:
            await seq.wait_progress(seq.generated)
        if seq.state is SeqState.ABORTED:
            _drop_connection(request)
            return
        n = seq.generated
        if interval > 1 and not seq.done and n > 1:
            n = 1 + (n - 1) // interval * interval  # the last event end SGLang has sent by now
        if hold is not None:
            n = min(n, hold)
        upto = n if disc is None or n < disc else disc
        if mal is not None and sent <= mal <= upto:
            data = enc.tokens(sent, mal, running) + _MALFORMED + enc.tokens(mal, upto, running)
            mal = None
        elif interval > 1:
            data = enc.merged(sent, upto, interval, running)
        else:
            data = enc.tokens(sent, upto, running)
        sent = upto
        if disc is not None and sent >= disc:
            if data:
                await resp.write(data)
            _drop_connection(request)
            return
        if seq.state is SeqState.FINISHED and sent >= seq.target:
            # SGLang's chat stream: a finish chunk without usage (completions: the finish on
            # the last token's chunk), then the usage-only chunk when include_usage asked
            # for it (serving_chat.py, _generate_chat_stream; serving_completions.py)
            tail = [enc.finish(seq.finish_reason, data)]
            if params.include_usage and not profile.no_usage:
                tail.append(enc.usage(params.prompt_tokens, sent))
            tail.append(_DONE)
            await resp.write(b"".join(tail))
            await resp.write_eof()
            return
        if data:
            await resp.write(data)


async def _keep_alive(request: web.Request, resp: web.StreamResponse) -> None:
    """Bytes that carry no token, until the client goes away (the write then raises) or the
    simulator shuts down (the connection is then dropped, as for an aborted stream)."""
    engine = request.app[ENGINE_KEY]
    while engine.is_running:
        await resp.write(_KEEPALIVE)
        await asyncio.sleep(KEEPALIVE_INTERVAL_S)
    _drop_connection(request)


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


async def _complete(
    engine: SimEngine, seq: Sequence, params: GenParams, enc: _Encoder
) -> web.Response:
    await seq.wait_done()
    if seq.state is not SeqState.FINISHED:
        return _error(
            503, "request aborted: the simulator is shutting down", "ServiceUnavailableError"
        )
    n = seq.generated
    reasoning, text = enc.message(n)
    matched = EOS_TOKEN_ID if seq.finish_reason == "stop" else None
    if params.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "reasoning_content": reasoning,
                "tool_calls": None,
            },
            "logprobs": None,
            "finish_reason": seq.finish_reason,
            "matched_stop": matched,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": seq.finish_reason,
            "matched_stop": matched,
        }
        obj = "text_completion"
    usage = (
        None
        if engine.profile.no_usage
        else {**_usage(params.prompt_tokens, n), **enc.reasoning_usage(n)}
    )
    body = {
        "id": enc.rid,
        "object": obj,
        "created": enc.created,
        "model": enc.model,
        "choices": [choice],
        "usage": usage,
    }
    return web.Response(
        body=json.dumps(body, ensure_ascii=False).encode("utf-8"), content_type="application/json"
    )


def _crash(after: int) -> NoReturn:
    """Die like a server whose scheduler raised: traceback on stderr, exit 1, sockets dropped."""
    sys.stderr.write(
        "Traceback (most recent call last):\n"
        '  File "sglang/srt/managers/scheduler.py", line 2417, in run_scheduler_process\n'
        f"RuntimeError: simulated crash after {after} generation requests (crash_after_requests)\n"
    )
    sys.stderr.flush()
    os._exit(1)


def _warming_up(engine: SimEngine) -> bool:
    return engine.uptime_s() < engine.profile.slow_start_s


def _generation_handler(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        engine = request.app[ENGINE_KEY]
        if _warming_up(engine):
            return _error(503, "server is starting up (slow_start_s)", "ServiceUnavailableError")
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
        try:
            params = parse_generation(body, kind)
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        crash_after = engine.profile.crash_after_requests
        if crash_after is not None and engine.requests_received >= crash_after:
            _crash(crash_after)
        if engine.inject_error():
            return _error(
                500,
                f"simulated internal server error (error_rate={engine.profile.error_rate})",
                "InternalServerError",
            )
        enc = _Encoder(
            kind,
            engine.profile.model,
            engine.requests_received,
            thinking=engine.profile.reasoning_tokens if params.thinking else 0,
            separate=params.separate_reasoning,
        )
        try:
            keys = () if engine.profile.disable_radix_cache else prefix_pages(params.prompt_key)
            seq = engine.submit(
                params.prompt_tokens,
                params.max_tokens,
                ignore_eos=params.ignore_eos,
                prefix_keys=keys,
            )
        except EngineNotRunning:
            return _error(503, "the simulator engine is not running", "ServiceUnavailableError")
        try:
            if params.stream:
                return await _stream(request, engine, seq, params, enc)
            return await _complete(engine, seq, params, enc)
        finally:
            # a no-op when finished; frees the slot when the client left -- unless the profile
            # imitates a server that does not abort: the request then decodes to its end
            if engine.profile.abort_on_disconnect or not engine.is_running:
                engine.abort(seq)

    return handler


# ---------------------------------------------------------------------- side endpoints


async def _models(request: web.Request) -> web.Response:
    model = request.app[PROFILE_KEY].model
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sglang",
                    "root": model,
                    "max_model_len": 262144,
                }
            ],
        }
    )


def server_info(profile: SimConfig, port: int | None) -> dict[str, Any]:
    """A dict shaped like SGLang's ``/get_server_info`` (server args plus a few extras).

    The numbers describe the deployment the default profile imitates; the ``sim`` key
    holds the simulator's own knobs so a report can tell a simulated run apart.
    """
    info: dict[str, Any] = {
        "model_path": profile.model,
        "tokenizer_path": profile.model,
        "served_model_name": profile.model,
        "host": "127.0.0.1",
        "port": port,
        "tp_size": 8,
        "ep_size": 8,
        "dp_size": 1,
        "pp_size": 1,
        "nnodes": 1,
        "max_running_requests": profile.max_running_requests,
        "max_total_tokens": 1_048_576,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "num_continuous_decode_steps": 1,
        "schedule_policy": "fcfs",
        "enable_eplb": False,
        "enable_dp_attention": False,
        "moe_a2a_backend": "deepep",
        "attention_backend": "flashinfer",
        "context_length": 262144,
        "dtype": "bfloat16",
        "kv_cache_dtype": "auto",
        "mem_fraction_static": 0.85,
        "cuda_graph_max_bs_decode": 256,
        "disable_radix_cache": profile.disable_radix_cache,
        "speculative_algorithm": None,
        "reasoning_parser": "kimi_k2" if profile.reasoning_tokens else None,
        "api_key": "***" if profile.api_key else None,
        "admin_api_key": "***" if profile.admin_api_key else None,
        "version": SIM_VERSION,
        # the knobs, less server_args: those are merged at the top level already
        "sim": {
            **{k: v for k, v in profile.describe().items() if k != "server_args"},
            "pid": os.getpid(),
        },
    }
    info.update(profile.server_args)
    return info


async def _deprecated_server_info(request: web.Request) -> web.Response:
    """SGLang 0.5.23 keeps ``/get_server_info`` as an alias that logs a warning on every call
    (``sglang/srt/entrypoints/http_server.py``); so does the simulator, so a client that asks
    it first shows up in the server's log."""
    print(
        f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Endpoint '/get_server_info' is deprecated "
        "and will be removed in a future version. Please use '/server_info' instead.",
        file=sys.stderr,
        flush=True,
    )
    return await _server_info(request)


async def _server_info(request: web.Request) -> web.Response:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None
    return web.json_response(server_info(request.app[PROFILE_KEY], port))


async def _model_info(request: web.Request) -> web.Response:
    model = request.app[PROFILE_KEY].model
    return web.json_response({"model_path": model, "tokenizer_path": model, "is_generation": True})


async def _health(request: web.Request) -> web.Response:
    if _warming_up(request.app[ENGINE_KEY]):
        return web.Response(status=503, text="starting up")
    return web.Response(status=200)


async def _health_generate(request: web.Request) -> web.Response:
    """Runs a real one-token generation so a probe proves the batching loop is alive."""
    engine = request.app[ENGINE_KEY]
    if _warming_up(engine):
        return web.Response(status=503, text="starting up")
    try:
        seq = engine.submit(1, 1, ignore_eos=True, faults=False)
    except EngineNotRunning:
        return web.Response(status=503, text="engine not running")
    try:
        await seq.wait_done()
    finally:
        engine.abort(seq)
    if seq.state is not SeqState.FINISHED:
        return web.Response(status=503, text="generation aborted")
    return web.Response(status=200)


async def _flush_cache(request: web.Request) -> web.Response:
    """Empty the prefix cache, as SGLang 0.5.23 does: only while the scheduler is idle.

    ``?timeout=S`` (seconds, >= 0) waits up to S for running and waiting requests to finish;
    without it a busy server refuses at once.  Refusals are HTTP 400 with the reason as text;
    one flush at a time.  (``sglang/srt/entrypoints/http_server.py`` ``flush_cache``,
    ``sglang/srt/managers/scheduler_components/flush_wrapper.py``.)
    """
    engine = request.app[ENGINE_KEY]
    raw = request.query.get("timeout", "0")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not (timeout >= 0.0 and math.isfinite(timeout)):
        return web.json_response(
            {
                "detail": [
                    {
                        "loc": ["query", "timeout"],
                        "input": raw,
                        "msg": "timeout must be a number of seconds >= 0",
                    }
                ]
            },
            status=422,
        )
    if engine.flush_pending:
        return web.Response(status=400, text="Another flush_cache is already in progress.\n")
    if timeout > 0.0 and not engine.idle:
        engine.flush_pending = True
        try:
            deadline = engine.time() + timeout
            while not engine.idle and engine.time() < deadline:
                await asyncio.sleep(0.005)
        finally:
            engine.flush_pending = False
        if not engine.idle:
            return web.Response(
                status=400,
                text=f"Cache not flushed: timed out after "
                f"{timeout:g} s waiting for an idle scheduler.\n",
            )
    if not engine.flush_cache():
        return web.Response(
            status=400,
            text=f"Cache not flushed: {engine.num_running} running "
            f"and {engine.num_waiting} waiting requests.\n",
        )
    return web.Response(text="Cache flushed.\n")


async def _tokenize(request: web.Request) -> web.Response:
    """SGLang's ``/tokenize`` (and ``/v1/tokenize``): the counts generation requests would see.

    ``{"prompt": str | [str, ...]}`` or ``{"messages": [...]}`` -> ``{"tokens", "count",
    "max_model_len"}`` (``sglang/srt/entrypoints/openai/protocol.py`` ``TokenizeRequest``,
    ``TokenizeResponse``; ``.../openai/serving_tokenize.py``).  404 with ``no_tokenize``.
    """
    if request.app[PROFILE_KEY].no_tokenize:
        raise web.HTTPNotFound()
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "BadRequestError")
    tokens: list[int] | list[list[int]]
    count: int | list[int]
    try:
        if body.get("messages") is not None:
            tokens = tokenize_text(_chat_prompt_text(body))
            count = len(tokens)
        elif isinstance(body.get("prompt"), str):
            tokens = tokenize_text(body["prompt"])
            count = len(tokens)
        elif isinstance(body.get("prompt"), list) and all(
            isinstance(p, str) for p in body["prompt"]
        ):
            tokens = [tokenize_text(p) for p in body["prompt"]]
            count = [len(t) for t in tokens]
        else:
            raise BadRequest("give 'prompt' (a string or a list of strings) or 'messages'")
    except BadRequest as exc:
        return _error(400, str(exc), "BadRequestError")
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": MAX_MODEL_LEN})


async def _metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    label = "{model_name=" + json.dumps(engine.profile.model, ensure_ascii=False) + "}"
    rows = [
        (
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            engine.prompt_tokens,
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            engine.finished_generated_tokens
            if engine.profile.metrics_per_request
            else engine.generated_tokens,
        ),
        (
            "sglang:num_requests_total",
            "counter",
            "Number of requests processed.",
            engine.requests_finished,
        ),
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", engine.num_running),
        (
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue.",
            engine.num_waiting,
        ),
    ]
    lines: list[str] = []
    for name, mtype, help_text, value in rows:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {mtype}")
        lines.append(f"{name}{label} {float(value)}")
    lines += _prefix_cache_metrics(engine, label)
    return web.Response(
        text="\n".join(lines) + "\n",
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


def _prefix_cache_metrics(engine: SimEngine, label: str) -> list[str]:
    """The prefix cache's counters under both engines' names, in prompt tokens, so each reader
    of :mod:`pytest_kimi.crosscheck.prefix_cache` has a server to read: SGLang's
    ``sglang:cached_tokens_total`` (labelled by ``cache_source``; its ``prompt_tokens_total``
    above is the denominator) and vLLM's ``vllm:prefix_cache_queries_total`` /
    ``vllm:prefix_cache_hits_total``.  The simulator counts both at admission, when a prompt
    is matched against the cache (vLLM does the same; SGLang adds a request's counts when it
    finishes)."""
    cached = float(engine.cached_prompt_tokens)
    source = label[:-1] + ',cache_source="device"}'
    return [
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source "
        "(device/host/storage).",
        "# TYPE sglang:cached_tokens_total counter",
        f"sglang:cached_tokens_total{source} {cached}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of "
        "queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{label} {float(engine.prompt_tokens)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached "
        "tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{label} {cached}",
    ]


async def _sim_stats(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    data = asdict(engine.stats())
    data["profile"] = engine.profile.describe()
    return web.json_response(data)


async def _sim_truth(request: web.Request) -> web.Response:
    """``GET /sim/truth?start=T0&end=T1``: what the engine really delivered in a window of the
    client's ``perf_counter`` clock (the same CLOCK_MONOTONIC as the engine's), so a check can
    hold the plugin's figure for exactly the window it measured against the truth."""
    engine = request.app[ENGINE_KEY]
    try:
        start = float(request.query["start"])
        end = float(request.query["end"])
    except (KeyError, ValueError):
        return _error(400, "give start= and end= (perf_counter seconds)", "BadRequestError")
    if not end > start:
        return _error(400, "end must be after start", "BadRequestError")
    tokens, steps, span = engine.truth(start, end)
    wall_tok_s = tokens / span if span > 0 else 0.0
    between = engine.tokens_between(start, end)
    return web.json_response(
        {
            "tokens": tokens,
            "steps": steps,
            "wall_tok_s": wall_tok_s,
            "tok_s": wall_tok_s / engine.profile.speed,
            "speed": engine.profile.speed,
            "edge_lag_s": engine.edge_lag(start, end),
            # the window's ends anywhere, each step's tokens spread over its duration
            "between_tokens": between,
            "between_tok_s": between / (end - start) / engine.profile.speed,
        }
    )


# ---------------------------------------------------------------------- middlewares


@web.middleware
async def _auth_and_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """API-key check (health, metrics and /sim/ stay open, as probes need them) and JSON
    bodies for unknown paths and methods, so clients can always parse an error."""
    profile = request.app[PROFILE_KEY]
    key = profile.api_key
    if request.path.startswith(_ADMIN_OPTIONAL) and profile.admin_api_key is not None:
        key = profile.admin_api_key  # with both keys set, only the admin key opens these
    if key is not None and not request.path.startswith(_HEALTH_EXEMPT):
        if request.headers.get("Authorization", "") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _error(404, f"Not Found: {request.path}", "NotFoundError")
    except web.HTTPMethodNotAllowed:
        return _error(
            405, f"Method {request.method} not allowed for {request.path}", "MethodNotAllowedError"
        )


# ---------------------------------------------------------------------- app and server


def create_app(profile: SimConfig) -> web.Application:
    """The simulator application; its engine starts and stops with the app."""
    app = web.Application(middlewares=[_auth_and_errors], client_max_size=64 * 1024 * 1024)
    engine = SimEngine(profile)
    app[PROFILE_KEY] = profile
    app[ENGINE_KEY] = engine

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        await engine.start()
        yield
        await engine.stop()

    async def abort_all(app: web.Application) -> None:
        # Shutdown waits for in-flight handlers; aborting every sequence first makes open
        # streams end at once instead of holding a SIGTERM'd server for their full length.
        await engine.stop()

    app.cleanup_ctx.append(engine_ctx)
    app.on_shutdown.append(abort_all)
    app.router.add_post("/v1/chat/completions", _generation_handler("chat"))
    app.router.add_post("/v1/completions", _generation_handler("completion"))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/get_server_info", _deprecated_server_info)
    app.router.add_get("/server_info", _server_info)
    app.router.add_get("/get_model_info", _model_info)
    app.router.add_get("/health", _health)
    app.router.add_get("/health_generate", _health_generate)
    app.router.add_route("POST", "/flush_cache", _flush_cache)
    app.router.add_route("GET", "/flush_cache", _flush_cache)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/v1/tokenize", _tokenize)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/stats", _sim_stats)
    app.router.add_get("/sim/truth", _sim_truth)
    return app


@dataclass
class SimServer:
    """An in-process simulator listening on 127.0.0.1 (tests and embedding)."""

    runner: web.AppRunner
    engine: SimEngine
    profile: SimConfig
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()

    async def __aenter__(self) -> SimServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def check_host(host: str) -> None:
    """The simulator only ever listens on loopback; anything else is a configuration error."""
    if host not in ALLOWED_HOSTS:
        raise ValueError(f"the pytest-kimi simulator binds 127.0.0.1 only; refusing host {host!r}")


async def start_server(
    profile: SimConfig | None = None, port: int = 0, host: str = "127.0.0.1"
) -> SimServer:
    """Start the simulator in the current event loop; ``port=0`` picks a free port."""
    check_host(host)
    profile = profile or SimConfig()
    app = create_app(profile)
    # No access log (it would cost more than a token) and cancel handlers of clients that
    # hang up, so their sequences release their batch slots at once.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    return SimServer(runner=runner, engine=app[ENGINE_KEY], profile=profile, port=bound)
