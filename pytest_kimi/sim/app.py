"""aiohttp application that looks like SGLang's OpenAI-compatible server to a benchmark client.

Only what a throughput client touches is modelled, but that part is modelled faithfully:
SGLang-shaped SSE chunks (one per token, ``usage`` chunk on request, ``[DONE]``), the
side endpoints a harness probes (``/get_server_info``, ``/health_generate``, ``/metrics``)
and the faults a client must survive (HTTP 500s, stalls, dropped connections, malformed
events, a server that is still warming up, a missing ``usage``).

This module wires the app (routes, the API-key middleware) and serves it in-process.  The
parts: :mod:`.request_parsing` (bodies), :mod:`.sse_framing` (the pre-encoded SSE chunks),
:mod:`.generation` (the generation routes), :mod:`.side_endpoints`, :mod:`.metrics_endpoint`,
:mod:`.app_common` (what the handlers share).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from pytest_kimi.sim.app_common import ENGINE_KEY, PROFILE_KEY, _error
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.sim.engine import SimEngine
from pytest_kimi.sim.generation import _generation_handler
from pytest_kimi.sim.metrics_endpoint import _metrics
from pytest_kimi.sim.side_endpoints import (
    _deprecated_server_info,
    _flush_cache,
    _health,
    _health_generate,
    _model_info,
    _models,
    _server_info,
    _sim_stats,
    _sim_truth,
    _tokenize,
)

__all__ = [
    "ALLOWED_HOSTS",
    "SimServer",
    "check_host",
    "create_app",
    "start_server",
]

ALLOWED_HOSTS = ("127.0.0.1",)
_HEALTH_EXEMPT = ("/health", "/health_generate", "/metrics", "/sim/")
_ADMIN_OPTIONAL = ("/flush_cache",)
"""SGLang's ``AuthLevel.ADMIN_OPTIONAL`` endpoints (``sglang/srt/utils/auth.py``,
``decide_request_auth``): the admin key when one is set, else the API key, else open."""


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
