"""HTTP to a server the launcher started: bounded urllib calls and the readiness probe.

Why urllib and not the load client's aiohttp: the launcher is synchronous and thread-safe, so
it can be driven from pytest hooks, a plain thread or an ``atexit`` handler, none of which has
a running event loop.  Every read is capped (:data:`DISCOVERY_MAX_BYTES`), so a server that
streams without end cannot hold a probe thread or its memory, and loopback traffic never goes
through an ``http_proxy`` from the environment.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from pytest_kimi.endpoint.bounded import (
    DISCOVERY_MAX_BYTES,
    BodyTooLarge,
    loads_bounded,
    read_stream_capped,
)

PROBE_TIMEOUT_S = 5.0
"""A probe that takes longer is retried; it runs in a thread so it never delays crash
detection."""
ERROR_BODY_BYTES = 4096
"""Of an HTTP error answer only its head is read (what a message quotes)."""

# Loopback traffic must never be routed through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ResponseTooLarge(OSError):
    """An answer past :data:`DISCOVERY_MAX_BYTES`: not read to its end (the server
    answered, so it is up; what it sent is no use)."""


def _http(
    method: str,
    url: str,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
) -> tuple[int, bytes]:
    """(status, body); HTTP error statuses are returned, connection failures raise OSError.

    The body is read up to :data:`DISCOVERY_MAX_BYTES` (:class:`ResponseTooLarge` past it), an
    error page's up to :data:`ERROR_BODY_BYTES` (its head, for a message): a server that
    streams without end cannot hold a probe thread or its memory."""
    headers = dict(headers or {})
    data: bytes | None = b"" if method == "POST" else None
    if json_body is not None:
        data = json.dumps(json_body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, method=method, headers=headers, data=data)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            try:
                return resp.status, read_stream_capped(resp, DISCOVERY_MAX_BYTES)
            except BodyTooLarge as exc:
                raise ResponseTooLarge(f"{url} answered {resp.status} but {exc}") from None
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(ERROR_BODY_BYTES)
        except OSError:
            body = b""
        return exc.code, body
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from None


class _Probe:
    """One readiness check running in a daemon thread.

    A server that is still loading can accept a connection and then sit on it; running
    the probe off the waiting thread keeps the process-exit check on its 0.1 s tick.
    With ``generate`` (engines whose health endpoint answers before any generation was
    tried, like vLLM), a 200 from the health path is followed by a real one-token
    completion for the first model ``/v1/models`` lists; only its 200 counts as ready.
    """

    def __init__(
        self, base: str, path: str, headers: dict[str, str], *, generate: bool = False
    ) -> None:
        self.url = base + path
        self.base = base
        self.generate = generate
        self.started = time.monotonic()
        self.done = threading.Event()
        self.ok = False
        self.detail = "no answer yet"
        threading.Thread(
            target=self._run, args=(headers,), name="pytest-kimi-probe", daemon=True
        ).start()

    def _run(self, headers: dict[str, str]) -> None:
        try:
            status, _ = _http("GET", self.url, timeout=PROBE_TIMEOUT_S, headers=headers)
            self.ok = status == 200
            self.detail = f"HTTP {status}"
            if self.ok and self.generate:
                self.ok, self.detail = self._one_token(headers)
        except Exception as exc:  # noqa: BLE001 - any failure just means "not ready yet"
            self.ok = False
            self.detail = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def _one_token(self, headers: dict[str, str]) -> tuple[bool, str]:
        status, body = _http(
            "GET", self.base + "/v1/models", timeout=PROBE_TIMEOUT_S, headers=headers
        )
        if status != 200:
            return False, f"health OK but /v1/models answered HTTP {status}"
        listing = loads_bounded(body)
        data = listing.get("data") if isinstance(listing, dict) else None
        models = [m.get("id") for m in data or [] if isinstance(m, dict)]
        if not models or not isinstance(models[0], str):
            return False, "health OK but /v1/models lists no model yet"
        status, body = _http(
            "POST",
            self.base + "/v1/completions",
            timeout=PROBE_TIMEOUT_S,
            headers=headers,
            json_body={"model": models[0], "prompt": "ready?", "max_tokens": 1, "temperature": 0},
        )
        if status != 200:
            return False, (
                f"health OK but a one-token completion answered HTTP {status}: "
                f"{body[:120].decode('utf-8', 'replace')}"
            )
        return True, "HTTP 200 and a one-token completion"
