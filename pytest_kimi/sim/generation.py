"""The generation routes (``/v1/chat/completions``, ``/v1/completions``): a request through
the engine, streamed as SSE or answered whole, with the faults a client must survive.

The faults are the profile's knobs: HTTP 500s, stalls, dropped connections, malformed events,
a server that is still warming up, a missing ``usage``, a stream that never ends, a crash.

Why a module of its own: the streaming loop (SGLang's ``--stream-interval``, the finish and
usage chunks, the drops) is the one timing-sensitive path of the app; the side endpoints and
the app's wiring live elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from aiohttp import web

from pytest_kimi.sim.app_common import ENGINE_KEY, _error, _warming_up
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.sim.engine import EngineNotRunning, Sequence, SeqState, SimEngine, prefix_pages
from pytest_kimi.sim.request_parsing import BadRequest, GenParams, parse_generation
from pytest_kimi.sim.sse_framing import (
    _DONE,
    _KEEPALIVE,
    _MALFORMED,
    EOS_TOKEN_ID,
    KEEPALIVE_INTERVAL_S,
    _Encoder,
    _usage,
)

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


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
