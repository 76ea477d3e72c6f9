"""A server on 127.0.0.1 whose discovery answers are hostile: huge, deep, not JSON, slow.

Why beside :mod:`support.hostile` and not in it: that server lies in its *streams*; this one
lies where the plugin asks the server about itself (``/v1/models``, ``/server_info``,
``/get_server_info``, ``/version``), and otherwise streams honestly (the same chunks,
:func:`support.hostile.token_chunk` and friends, at the same pace), so a session against it
runs to its end whenever discovery lets it.

Each discovery path gets a *body mode* (:data:`BODIES`).  The server counts, per path, the
bytes it got onto the socket and whether the client hung up before the body's end
(:attr:`DiscoveryServer.sent`, :attr:`DiscoveryServer.hangups`): what proves that a read
stopped at its cap rather than at the body's end.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from support.threaded_app import ThreadedApp

from support.hostile import (
    DONE,
    MODEL,
    TOKEN_GAP_S,
    finish_chunk,
    max_tokens_of,
    role_chunk,
    token_chunk,
    usage_chunk,
)

HUGE_BYTES = 200 * 2**20
"""What the huge modes offer: 200 MB, the answer the tester's run read whole for 115 s."""
BLOCK = 2**16
"""Write size of the huge and trickling modes."""
DEEP_LEVELS = 200_000
"""Nesting of ``deep``: far past Python's recursion limit (1000), as the tester's was."""
TRICKLE_GAP_S = 0.2
"""``trickle`` sends one byte per gap, for ever (until the client hangs up)."""

MODELS_OK = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
INFO_OK = {"model_path": "/models/hostile", "tp_size": 2, "version": "0.0-discovery"}

BODIES = (
    "ok",
    "absent",
    "huge_chunked",
    "huge_announced",
    "deep",
    "deep_in_strings",
    "html",
    "bigint",
    "trickle",
)
"""``ok``: an honest answer (:data:`MODELS_OK` / :data:`INFO_OK`); ``absent``: 404;
``huge_chunked``: a JSON array of :data:`HUGE_BYTES` with no ``Content-Length``;
``huge_announced``: ``Content-Length`` of :data:`HUGE_BYTES`, then the same bytes;
``deep``: ``[[[...]]]`` :data:`DEEP_LEVELS` deep; ``deep_in_strings``: an honest answer whose
string values hold thousands of brackets (not nesting: must pass); ``html``: a web server's
page; ``bigint``: a number of 100 000 digits; ``trickle``: a byte per :data:`TRICKLE_GAP_S`."""


def _honest(path: str) -> Any:
    return MODELS_OK if path == "/v1/models" else INFO_OK


@dataclass
class DiscoveryServer(ThreadedApp):
    """Serves ``bodies[path]`` for each discovery path (``ok`` for a path not named, except
    the server-info paths, ``absent`` unless named) and honest streams for generation."""

    bodies: dict[str, str] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)
    """Bytes written per path (what reached the socket before the client hung up)."""
    hangups: Counter[str] = field(default_factory=Counter)
    """Bodies per path the client closed before their end."""
    requests: Counter[str] = field(default_factory=Counter)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        bad = {m for m in self.bodies.values() if m not in BODIES}
        if bad:
            raise ValueError(f"unknown body modes {sorted(bad)}; modes: {BODIES}")

    @property
    def thread_name(self) -> str:
        return "hostile-discovery"

    def mode(self, path: str) -> str:
        default = "ok" if path == "/v1/models" else "absent"
        return self.bodies.get(path, default)

    # ------------------------------------------------------------------ bodies
    async def _stream(
        self, request: web.Request, path: str, announced: int | None, gap_s: float = 0.0
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if announced is None:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = announced
        try:
            await resp.prepare(request)
            if gap_s:
                while True:  # one byte at a time, until the client gives up
                    await resp.write(b" ")
                    self.sent[path] += 1
                    await asyncio.sleep(gap_s)
            await resp.write(b"[")
            block = b'"' + b"x" * (BLOCK - 4) + b'",'
            while self.sent[path] + len(block) < HUGE_BYTES:
                await resp.write(block)
                self.sent[path] += len(block)
            await resp.write(b'"end"]')
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            self.hangups[path] += 1
        except asyncio.CancelledError:
            self.hangups[path] += 1
            raise
        return resp

    async def _discovery(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests[path] += 1
        mode = self.mode(path)
        if mode == "ok":
            return web.json_response(_honest(path))
        if mode == "absent":
            return web.json_response({"error": "not found"}, status=404)
        if mode == "huge_chunked":
            return await self._stream(request, path, None)
        if mode == "huge_announced":
            return await self._stream(request, path, HUGE_BYTES)
        if mode == "trickle":
            return await self._stream(request, path, None, gap_s=TRICKLE_GAP_S)
        if mode == "deep":
            text = "[" * DEEP_LEVELS + "]" * DEEP_LEVELS
        elif mode == "deep_in_strings":
            value = dict(_honest(path))
            value["notes"] = "[{" * 5000
            text = json.dumps(value)
        elif mode == "html":
            text = "<html><body>\x1b[2J welcome to nginx</body></html>"
        else:  # bigint
            text = '{"data": ' + "9" * 100_000 + "}"
        return web.Response(text=text, content_type="application/json")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = max_tokens_of(body if isinstance(body, dict) else {})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(role_chunk())
        for i in range(n):
            await asyncio.sleep(TOKEN_GAP_S)
            await resp.write(token_chunk(i))
        await resp.write(finish_chunk() + usage_chunk(n) + DONE)
        await resp.write_eof()
        return resp

    def _app(self) -> web.Application:
        async def health(request: web.Request) -> web.StreamResponse:
            return web.json_response({})

        app = web.Application()
        for path in ("/v1/models", "/server_info", "/get_server_info", "/version"):
            app.router.add_get(path, self._discovery)
        app.router.add_get("/health", health)
        app.router.add_post("/v1/chat/completions", self._generate)
        return app
