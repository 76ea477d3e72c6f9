"""A hostile OpenAI-compatible server on 127.0.0.1: one way of lying or misbehaving per mode.

Why a server of its own and not the simulator's fault knobs: the simulator models an honest
engine that fails (errors, stalls, crashes); what this one does an honest engine never does:
streams past ``max_tokens``, reports impossible ``usage`` (or a running usage that counts
down), sends one event of 50 MB, buffers a whole response into one gzip write, floods the stream
with empty events, answers its headers or its body late, redirects, rate-limits.  Each is a
case the plugin must end in bounded time with a reason that names it
(tests/plugin/test_hostile_streams.py; at C=1 and with ``--update-baselines``:
tests/plugin/test_hostile_streams_c1.py).

The server runs an aiohttp app in a thread of the test process, on a loop of its own and a free
port, so a pytest session in a subprocess (``pytester.runpytest_subprocess``) reaches it over
TCP like any server.  It serves ``/v1/models``, ``/health`` and ``/v1/chat/completions``; the
generation route's behaviour is :data:`MODES`'s handler for the server's mode.  A new mode is
one async function added to that dict (it gets the server, the request and the decoded body).
Every request's method, path and headers are kept in :attr:`HostileServer.seen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

from support.threaded_app import ThreadedApp

MODEL = "hostile-model"

TOKEN_GAP_S = 0.002
"""Pause between two token events of a streamed answer: a decode step of a fast server, long
enough that the client reads each event on its own (what an honest stream looks like), short
enough that a 32-token answer takes a few dozen milliseconds."""

HUGE_LINE_BYTES = 50 * 2**20
"""The single SSE line of ``huge_line``: 50 MB without a newline, as the tester sent."""

HUGE_WRITE_BYTES = 2**16
"""``huge_line`` writes its line in pieces of this size, as a socket would deliver it."""

RETRY_AFTER = "7"
"""What ``too_many_requests`` asks the client to wait, in seconds (the ``Retry-After`` value)."""

FAST_FIRST = 2
"""``slow_headers`` and ``slow_body`` answer this many generation requests honestly first: the
warm-up's (two by default), so the client has seen a fast server when it sizes each trial's
wall-clock limit, and the slow ones that follow reach that limit long before the request's
silence timeout (which would name the stall itself)."""

STALL_CAP_S = 120.0
"""How long ``slow_headers`` / ``slow_body`` hold a request if no client ever hangs up (a test
that fails does not leave a handler waiting forever)."""

FLOOD_EVENTS = 400
"""Empty events ``event_flood`` sends before each token: about 40 KB of events that carry no
text per token event, where an honest stream sends a few hundred bytes."""

ENDLESS_CAP_TOKENS = 1_000_000
"""``endless`` stops after this many tokens if no client ever hangs up, so that a test that
fails does not leave a thread streaming forever."""


@dataclass(slots=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]


Handler = Callable[["HostileServer", web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def _chunk(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "hostile",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def role_chunk() -> bytes:
    """The first chunk of an OpenAI chat stream: the role, no text."""
    return _chunk(_choice({"role": "assistant", "content": ""}))


def token_chunk(i: int) -> bytes:
    """The ``i``-th token's chunk (one token per event, as SGLang and vLLM send by default)."""
    return _chunk(_choice({"content": f"t{i} "}))


def token_usage_chunk(i: int, completion_tokens: int) -> bytes:
    """The ``i``-th token's chunk with a running usage on it (``continuous_usage_stats``)."""
    payload = _choice({"content": f"t{i} "})
    payload["usage"] = {"prompt_tokens": 8, "completion_tokens": completion_tokens}
    return _chunk(payload)


def empty_chunk() -> bytes:
    """A chunk whose delta carries no text: no token (a role-less keep-alive of sorts)."""
    return _chunk(_choice({}))


def finish_chunk() -> bytes:
    return _chunk(_choice({}, "length"))


def usage_chunk(completion_tokens: Any, prompt_tokens: int = 8) -> bytes:
    """The trailing ``choices: []`` chunk ``stream_options.include_usage`` asks for; the value
    of ``completion_tokens`` is whatever the mode wants to claim (any JSON value)."""
    return _chunk(
        {
            "id": "hostile",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        }
    )


DONE = b"data: [DONE]\n\n"


def max_tokens_of(body: dict[str, Any]) -> int:
    n = body.get("max_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 16


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    return resp


async def _stream_answer(request: web.Request, n: int, usage: Any) -> web.StreamResponse:
    """An honest stream of ``n`` paced tokens whose usage claims ``usage`` tokens."""
    resp = await _open_stream(request)
    await resp.write(role_chunk())
    for i in range(n):
        await asyncio.sleep(TOKEN_GAP_S)
        await resp.write(token_chunk(i))
    await resp.write(finish_chunk() + usage_chunk(usage) + DONE)
    await resp.write_eof()
    return resp


def _usage_mode(claim: Callable[[int], Any]) -> Handler:
    """A mode that streams ``max_tokens`` honest tokens and reports ``claim(max_tokens)``."""

    async def handler(
        server: HostileServer, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse:
        n = max_tokens_of(body)
        return await _stream_answer(request, n, claim(n))

    return handler


async def _endless(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """Tokens past ``max_tokens`` and never a ``[DONE]``: a server that ignores the limit (with
    ``ignore_eos`` nothing else ends the stream).  Stops when the client hangs up."""
    resp = await _open_stream(request)
    async with server.hangup_counted():
        await resp.write(role_chunk())
        for i in range(ENDLESS_CAP_TOKENS):
            await asyncio.sleep(TOKEN_GAP_S)
            await resp.write(token_chunk(i))
    return resp


async def _huge_line(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """A role chunk, then one SSE line of :data:`HUGE_LINE_BYTES` without a newline."""
    resp = await _open_stream(request)
    piece = b"x" * HUGE_WRITE_BYTES
    async with server.hangup_counted():
        await resp.write(role_chunk() + b'data: {"pad":"')
        for _ in range(HUGE_LINE_BYTES // HUGE_WRITE_BYTES):
            await resp.write(piece)
        await resp.write(b'"}\n\n' + DONE)
        await resp.write_eof()
    return resp


def _gzip(pace_s: float) -> Handler:
    """A gzip-buffered answer decoded at ``pace_s`` a token behind the proxy: ``gzip_buffered``
    at a fast server's pace, ``gzip_fast`` at once (the whole answer in well under a
    millisecond: the tester's C=1 case, whose lump the client took for its own stall)."""

    async def handler(
        server: HostileServer, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse:
        return await _gzip_buffered(request, body, pace_s)

    return handler


async def _gzip_buffered(
    request: web.Request, body: dict[str, Any], pace_s: float
) -> web.StreamResponse:
    """What a compressing (or buffering) proxy hands on: the whole answer, decoded at a
    server's pace behind it, then gzipped into one write."""
    n = max_tokens_of(body)
    await asyncio.sleep(n * pace_s)
    raw = (
        role_chunk()
        + b"".join(token_chunk(i) for i in range(n))
        + finish_chunk()
        + usage_chunk(n)
        + DONE
    )
    return web.Response(
        body=gzip.compress(raw),
        headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"},
    )


async def _usage_down(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """Paced tokens whose running usage counts *down* (``n``, ``n - 1``, ...), then an honest
    final usage: a cumulative count that falls, which no server's accounting can produce.  A
    stream cut early claims far more tokens than it streamed (its running usage is all a cut
    stream has), so the tester's run recorded 296.2 tok/s against a true ~185."""
    n = max_tokens_of(body)
    resp = await _open_stream(request)
    await resp.write(role_chunk())
    for i in range(n):
        await asyncio.sleep(TOKEN_GAP_S)
        await resp.write(token_usage_chunk(i, n - i))
    await resp.write(finish_chunk() + usage_chunk(n) + DONE)
    await resp.write_eof()
    return resp


async def _event_flood(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """Paced tokens, each after :data:`FLOOD_EVENTS` empty events: the client spends its time
    parsing events that carry nothing, whatever the number of streams."""
    n = max_tokens_of(body)
    flood = empty_chunk() * FLOOD_EVENTS
    resp = await _open_stream(request)
    async with server.hangup_counted():
        await resp.write(role_chunk())
        for i in range(n):
            await asyncio.sleep(TOKEN_GAP_S)
            await resp.write(flood + token_chunk(i))
        await resp.write(finish_chunk() + usage_chunk(n) + DONE)
        await resp.write_eof()
    return resp


def _after_warmup(slow: Handler) -> Handler:
    """``ok`` for the first :data:`FAST_FIRST` generation requests, ``slow`` after them."""

    async def handler(
        server: HostileServer, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse:
        if len(server.generations()) <= FAST_FIRST:
            return await _ok(server, request, body)
        return await slow(server, request, body)

    return handler


async def _slow_headers(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """No response (not even its headers) until the client hangs up."""
    async with server.hangup_counted():
        await asyncio.sleep(STALL_CAP_S)
    return await _ok(server, request, body)


async def _slow_body(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """Headers and the role chunk at once, then no token until the client hangs up."""
    resp = await _open_stream(request)
    async with server.hangup_counted():
        await resp.write(role_chunk())
        await asyncio.sleep(STALL_CAP_S)
        await resp.write(finish_chunk() + DONE)
        await resp.write_eof()
    return resp


def _redirect(status: int) -> Handler:
    async def handler(
        server: HostileServer, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse:
        target = server.redirect_to or server.url
        return web.Response(status=status, headers={"Location": target + "/v1/chat/completions"})

    return handler


async def _too_many_requests(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    return web.json_response(
        {"error": {"message": "rate limit exceeded", "type": "rate_limit"}},
        status=429,
        headers={"Retry-After": RETRY_AFTER},
    )


async def _ok(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    n = max_tokens_of(body)
    return await _stream_answer(request, n, n)


MODES: dict[str, Handler] = {
    "ok": _ok,
    "endless": _endless,
    "usage_one": _usage_mode(lambda n: 1),
    "usage_negative": _usage_mode(lambda n: -165),
    "usage_float": _usage_mode(lambda n: n - 0.5),
    "usage_string": _usage_mode(str),
    "usage_bool": _usage_mode(lambda n: True),
    "huge_line": _huge_line,
    "gzip_buffered": _gzip(TOKEN_GAP_S),
    "gzip_fast": _gzip(0.0),
    "usage_down": _usage_down,
    "event_flood": _event_flood,
    "slow_headers": _after_warmup(_slow_headers),
    "slow_body": _after_warmup(_slow_body),
    "redirect_307": _redirect(307),
    "redirect_302": _redirect(302),
    "too_many_requests": _too_many_requests,
}
"""The generation route's behaviour per mode (``ok``: an honest, paced stream)."""

DISCOVERY_MODES = {"redirect_models"}
"""Modes that act on discovery instead: ``redirect_models`` answers ``/v1/models`` with a 307
to :attr:`HostileServer.redirect_to` (generation then behaves as ``ok``)."""


@dataclass
class HostileServer(ThreadedApp):
    """The hostile server of one mode, on a free port of 127.0.0.1 while in ``with``."""

    mode: str
    redirect_to: str | None = None
    """Where the redirect modes send the client (another server's base URL; None: this one)."""
    seen: list[Seen] = field(default_factory=list)
    hangups: int = 0
    """Streams of ``endless`` / ``huge_line`` the client closed before the server was done."""
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES and self.mode not in DISCOVERY_MODES:
            raise ValueError(f"unknown mode {self.mode!r}; modes: {sorted(MODES)}")

    @property
    def thread_name(self) -> str:
        return f"hostile-{self.mode}"

    @contextlib.asynccontextmanager
    async def hangup_counted(self) -> AsyncIterator[None]:
        """Count a client that hangs up inside the block (aiohttp cancels the handler, or its
        next write fails), and end the handler quietly."""
        try:
            yield
        except (ConnectionError, RuntimeError):
            self.hangups += 1
        except asyncio.CancelledError:
            self.hangups += 1
            raise

    def generations(self) -> list[Seen]:
        """The generation requests received so far."""
        return [s for s in self.seen if s.path == "/v1/chat/completions"]

    # ------------------------------------------------------------------ routes
    def _app(self) -> web.Application:
        @web.middleware
        async def record(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            self.seen.append(Seen(request.method, request.path, dict(request.headers)))
            return await handler(request)

        async def models(request: web.Request) -> web.StreamResponse:
            if self.mode == "redirect_models":
                target = self.redirect_to or self.url
                return web.Response(status=307, headers={"Location": target + "/v1/models"})
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        async def health(request: web.Request) -> web.StreamResponse:
            return web.json_response({})

        async def generate(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            mode = "ok" if self.mode in DISCOVERY_MODES else self.mode
            return await MODES[mode](self, request, body if isinstance(body, dict) else {})

        app = web.Application(middlewares=[record])
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", health)
        app.router.add_post("/v1/chat/completions", generate)
        return app
