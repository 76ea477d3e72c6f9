"""An OpenAI-compatible endpoint: URL validation, discovery (/v1/models, server info), health.

Errors here are the first thing a user meets when the URL is wrong or the server is down,
so each says what was tried, what came back, and what to do.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp

from pytest_kimi.endpoint.bounded import (
    DISCOVERY_MAX_BYTES,
    BodyTooLarge,
    NotJSON,
    loads_bounded,
    read_body_capped,
)
from pytest_kimi.endpoint.serverinfo import clean_server_info
from pytest_kimi.printable import printable


class EndpointError(RuntimeError):
    """The endpoint cannot be used; the message names the URL, the problem and the fix."""


@dataclass(slots=True)
class EndpointInfo:
    url: str
    """Base URL without credentials, path or trailing slash (``http://host:port``)."""
    model: str
    models: list[str] = field(default_factory=list)
    server_info: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    server_pid: int | None = None
    """The serving process's pid where the server says it (the simulator's ``sim.pid``): which
    start measured a test under ``--perf-sessions``.  Not provenance (it changes at every
    start), so it is kept here and never in ``server_info``."""
    """Kept only to build request headers; never printed or written."""

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    @property
    def clock(self) -> float:
        """Server seconds per wall second: the simulator's ``speed`` (its ``server_info`` says
        it), 1.0 for a real server.  Figures are reported in the server's own clock, so a
        simulator at speed 20 shows EP8's tok/s and latencies, not twenty times them."""
        sim = self.server_info.get("sim")
        speed = sim.get("speed") if isinstance(sim, dict) else None
        if isinstance(speed, (int, float)) and not isinstance(speed, bool) and speed > 0:
            return float(speed)
        return 1.0

    def public(self) -> dict[str, Any]:
        """What reports may show: URL without credentials, model, server info."""
        return {"url": self.url, "model": self.model, "server_info": self.server_info}


def normalize_url(raw: str, source: str) -> str:
    """Validate a base URL and strip credentials, query and trailing ``/`` or ``/v1``."""
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(
            f"{source}: {redact_url(raw)!r} is not an http(s) URL; give the server's base URL, "
            "e.g. --endpoint=http://127.0.0.1:30000 (or --endpoint=sim for the built-in simulator)"
        )
    try:
        port = parts.port
    except ValueError:
        raise EndpointError(f"{source}: {redact_url(raw)!r} has an invalid port") from None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if port is None else f"{host}:{port}"
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def redact_url(raw: str) -> str:
    """The URL with any ``user:password@`` removed, for messages and reports."""
    parts = urlsplit(raw)
    if parts.username is None and parts.password is None:
        return raw
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


ERROR_BODY_BYTES = 4096
"""Of an error answer (a non-200 status) only this much is read: its head is all a message
quotes, however long the page."""
INFO_TIMEOUT_S = 10.0
"""Limit on each optional server-info GET (``/server_info``, ``/get_server_info``,
``/version``): a server that trickles one of them costs the run seconds, not the discovery
timeout three times over, and its silence is not reported as ``/v1/models``'s."""


async def _get_json(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    timeout: aiohttp.ClientTimeout | None = None,
) -> tuple[int, Any]:
    """(status, parsed JSON) for a 200, (status, the error page's head) otherwise.

    Bounded both ways (:mod:`pytest_kimi.endpoint.bounded`): the body is read up to
    :data:`DISCOVERY_MAX_BYTES` and its JSON checked for depth before parsing.  Raises
    :class:`EndpointError` naming the URL and the check that failed: a redirect, a body past
    the cap, "not JSON" with its reason (never the body itself)."""
    # Redirects are not followed: the server that answers at their target is not the one
    # named (a 307 to another port would have the plugin measure that one), and a generation
    # request would not follow them either (pytest_kimi.load.request).
    kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
    async with session.get(url, headers=headers, allow_redirects=False, **kwargs) as resp:
        if 300 <= resp.status < 400:
            location = resp.headers.get("Location")
            target = redact_url(urljoin(url, location))[:200] if location else "(no Location)"
            raise EndpointError(
                f"{url} answered HTTP {resp.status}, a redirect to {target}: redirects are not "
                "followed (the server there would be measured instead); point --endpoint at "
                "the final URL"
            )
        if resp.status != 200:
            head = await read_body_capped(resp, ERROR_BODY_BYTES, truncate=True)
            return resp.status, head.decode("utf-8", errors="replace")[:200]
        try:
            body = await read_body_capped(resp, DISCOVERY_MAX_BYTES)
        except BodyTooLarge as exc:
            raise EndpointError(
                f"{url} answered 200 but {exc} (DISCOVERY_MAX_BYTES; a model list or server "
                "info is a few kB): it was not read -- is something other than an "
                "OpenAI-compatible server (SGLang, vLLM) answering there? check the port"
            ) from None
    try:
        return 200, loads_bounded(body)
    except NotJSON as exc:
        raise EndpointError(
            f"{url} answered 200 but not JSON ({exc.reason}): is this an OpenAI-compatible "
            "server (SGLang, vLLM)? check the port"
        ) from None


async def _optional_json(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> dict[str, Any] | None:
    """A server-info answer that is a JSON object, or None for anything else (a 404, an
    error, a body past the cap, not JSON, no answer within :data:`INFO_TIMEOUT_S`): server
    info is provenance, and a server without it is still measured."""
    try:
        status, body = await _get_json(
            session, url, headers, aiohttp.ClientTimeout(total=INFO_TIMEOUT_S)
        )
    except (EndpointError, aiohttp.ClientError, asyncio.TimeoutError):
        return None
    return body if status == 200 and isinstance(body, dict) else None


async def discover(
    base_url: str, *, api_key: str | None, model: str | None, timeout_s: float = 30.0
) -> EndpointInfo:
    """Ask the server which models it serves and, where it can say, how it was launched."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                status, body = await _get_json(session, f"{base_url}/v1/models", headers)
            except asyncio.TimeoutError:
                raise EndpointError(
                    f"{base_url} did not answer /v1/models within {timeout_s:g} s: is it still "
                    "starting?"
                ) from None
            if status == 401 or status == 403:
                raise EndpointError(
                    f"{base_url}/v1/models answered {status}: the server wants an API key; pass "
                    "--api-key or set KIMI_API_KEY"
                )
            if status != 200:
                raise EndpointError(
                    f"{base_url}/v1/models answered HTTP {status}: {printable(body, 500)}"
                )
            models = _model_ids(body, base_url)
            server_info: dict[str, Any] = {}
            # /server_info first: SGLang 0.5.23 keeps /get_server_info only as a deprecated
            # alias that logs a warning on every call (sglang/srt/entrypoints/http_server.py).
            for path in ("/server_info", "/get_server_info"):
                info = await _optional_json(session, base_url + path, headers)
                if info:
                    server_info = info
                    break
            if not server_info:
                # vLLM reports no launch arguments outside its dev mode, but its version.
                info = await _optional_json(session, base_url + "/version", headers)
                if info is not None and isinstance(info.get("version"), str):
                    server_info = {"version": info["version"]}
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        raise EndpointError(
            f"cannot connect to {base_url} ({exc.__class__.__name__}: {exc.strerror or exc}): "
            "is the server up and listening on that host and port?"
        ) from None
    except aiohttp.ClientError as exc:
        raise EndpointError(f"{base_url}: {exc.__class__.__name__}: {exc}") from None
    chosen = model or models[0]
    if model and models and model not in models:
        raise EndpointError(
            f"model {model!r} is not served by {base_url}; it serves: {', '.join(models)}"
        )
    # The edge where server info enters: SGLang returns api_key, admin_api_key and a
    # launch_command with --api-key VALUE in clear; nothing after this point sees them.
    return EndpointInfo(
        url=base_url,
        model=chosen,
        models=models,
        server_info=clean_server_info(server_info, [api_key] if api_key else []),
        api_key=api_key,
        server_pid=_sim_pid(server_info),
    )


def _sim_pid(server_info: Any) -> int | None:
    sim = server_info.get("sim") if isinstance(server_info, dict) else None
    pid = sim.get("pid") if isinstance(sim, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _model_ids(body: Any, base_url: str) -> list[str]:
    data = body.get("data") if isinstance(body, dict) else None
    ids = [str(m["id"]) for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise EndpointError(
            f"{base_url}/v1/models lists no models ({str(body)[:120]}); pass --model explicitly"
        )
    return ids
