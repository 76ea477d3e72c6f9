"""Start, wait for, inspect and stop the server a profile describes.

Why the plugin owns this instead of a shell script: a Kimi deployment takes minutes to
come up (570 s for TP8 with CUDA graphs), fails in ways that only show in its log (an OOM,
a ``ZeroDivisionError`` for an impossible TP/EP split) and leaves GPU-holding child
processes behind when it is killed carelessly.  So the launcher

* runs the server in its **own process group** under a small supervisor process
  (``supervisor.py``) and stops it the staged way: SIGTERM to the main process, which
  shuts its schedulers down itself, ``stop_grace_s``; SIGTERM to the whole group,
  ``stop_timeout_s``; SIGKILL.  The supervisor also stops the server when pytest dies
  without a teardown (SIGKILL, the OOM killer, a killed xdist worker), scrubs secrets from
  the server's output on its way to the log, and records the server under
  ``.kimi/servers/`` so that a later run stops (or refuses to start beside) a server
  whose supervisor died too (``leftovers.py``);
* decides readiness by the engine's rule (a real generation probe or the engine's own
  "ready" log line), never by ``/v1/models``, which answers before warm-up;
* notices a dead server within a fraction of a second and reports its exit code, log path
  and the log tail (the traceback) instead of waiting out the startup timeout;
* reports progress while it waits, so a ten-minute start does not look like a hang.

The API is synchronous and thread-safe (HTTP via urllib), so it can be driven from pytest
hooks, a plain thread or an ``atexit`` handler, none of which has a running event loop.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pytest_kimi.endpoint.bounded import (
    DISCOVERY_MAX_BYTES,
    BodyTooLarge,
    NotJSON,
    loads_bounded,
    read_stream_capped,
)
from pytest_kimi.scrub import is_secret_name, known_secrets, scrub_argv, scrub_text
from pytest_kimi.server import leftovers
from pytest_kimi.server.procgroup import (
    DEAD_LEADER_GRACE_S,
    describe_pids,
    nice_session,
    port_listeners,
)
from pytest_kimi.server.procgroup import group_members as _group_members  # noqa: F401 - tests/engine use it
from pytest_kimi.server.profile import ServerProfile, argv, profile_secrets
from pytest_kimi.server.supervisor import Supervised, SupervisedHandle, describe_exit

__all__ = [
    "ExternalServer",
    "ManagedServer",
    "ProgressFn",
    "Server",
    "ServerError",
    "ServerProcessWarning",
    "ServerStartError",
    "open_server",
]

ProgressFn = Callable[[str], None]
"""Receives one human-readable line about a server that is still starting."""

POLL_S = 0.5
"""How often the readiness probe is sent while a server starts."""
TICK_S = 0.1
"""How often the process and the log are checked: bounds how late a crash is noticed."""
PROBE_TIMEOUT_S = 5.0
"""A probe that takes longer is retried; it runs in a thread so it never delays crash
detection."""
TAIL_LINES = 40
"""Log lines quoted in start errors: enough for a Python traceback with its context."""
ERROR_BODY_BYTES = 4096
"""Of an HTTP error answer only its head is read (what a message quotes)."""
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

# Loopback traffic must never be routed through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

_S = TypeVar("_S", bound="_ServerBase")


class ResponseTooLarge(OSError):
    """An answer past :data:`DISCOVERY_MAX_BYTES`: not read to its end (the server
    answered, so it is up; what it sent is no use)."""


class ServerProcessWarning(UserWarning):
    """A server's stop found processes beyond its process group: ones that had left it
    (stopped with it, named so that the profile can be fixed), ones SIGKILL cannot end yet,
    or a stranger still holding the server's port.  Shown in pytest's warnings summary."""


class ServerError(RuntimeError):
    """A managed or external server cannot be used (not started, unreachable, ...)."""


class ServerStartError(ServerError):
    """The server did not become ready; the message carries everything needed to fix it.

    ``reason`` is one of ``"exited"`` (the server process died), ``"start-failed"`` (an
    external profile's ``start:`` command failed), ``"timeout"``, ``"stopped"`` (stop was
    requested while it started), ``"spawn"`` (the command could not be run at all) or
    ``"leftover"`` (a server of an earlier or concurrent run still runs and was not
    stopped; the message names its pid and how to stop it).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        log_path: Path | None = None,
        returncode: int | None = None,
        elapsed_s: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.log_path = log_path
        self.returncode = returncode
        self.elapsed_s = elapsed_s


# ---------------------------------------------------------------------- HTTP


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


# ---------------------------------------------------------------------- processes

PORT_FLOOR = 10000
"""Lowest port the launcher picks: well above the range services are usually pinned to."""
PORT_CEILING = 21700
"""Highest port it picks.  SGLang picks its own NCCL port from 22000-29999
(``sglang/srt/utils/network.py`` ``get_free_port_below_ephemeral``), and with DP attention
it binds ``port + 233`` to ``port + 240`` (``sglang/srt/server_args.py``,
``ZMQ_TCP_PORT_DELTA``); staying below 21700 keeps all of them apart."""
_PORT_TRIES = 64


def _ephemeral_low() -> int:
    """Start of the kernel's ephemeral port range (outgoing connections and bind(0))."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS's is 49152


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def _free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, chosen **below** the ephemeral range.

    SGLang binds its HTTP port only after loading, minutes after start; a port from the
    ephemeral range (what bind(0) hands out) can meanwhile be taken as the source port of
    any outgoing connection, and the server then dies with "address already in use" after
    a ten-minute load.  Ports below the range are never handed out that way.  Falls back to
    bind(0) where the range leaves no room (a tuned ip_local_port_range).
    """
    import random

    bind_host = "0.0.0.0" if host in _WILDCARD_HOSTS else host
    high = min(PORT_CEILING, _ephemeral_low() - 1)
    if high - PORT_FLOOR >= _PORT_TRIES:
        for port in random.sample(range(PORT_FLOOR, high + 1), _PORT_TRIES):
            if _port_free(bind_host, port):
                return port
    family = socket.AF_INET6 if ":" in bind_host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((bind_host.strip("[]"), 0))
        return int(s.getsockname()[1])


def _connect_host(host: str) -> str:
    """Where to connect to a server bound to ``host`` (a wildcard bind is reached locally)."""
    if host in _WILDCARD_HOSTS:
        return "127.0.0.1"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def _child_env(extra: dict[str, str | None]) -> dict[str, str]:
    env = dict(os.environ)
    # Engines print() some progress; unbuffered output keeps the log (and the "ready"
    # line and progress messages read from it) current.
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "server"


def _new_log(log_dir: Path, name: str) -> Path:
    """``<log_dir>/<name>-<YYYYmmdd-HHMMSS>.log``, never overwriting an earlier log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{_safe_name(name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    for i in range(1, 1000):
        path = log_dir / (f"{stem}.log" if i == 1 else f"{stem}-{i}.log")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise ServerError(f"cannot create a log file for {name!r} in {log_dir}")


class _LogFollower:
    """Reads what was appended to the log since the last call: the ready line and the
    latest line for progress messages."""

    def __init__(self, path: Path, needle: str | None, offset: int = 0) -> None:
        self.path = path
        self.needle = needle
        self.offset = offset
        self.partial = ""
        self.last_line = ""
        self.found = False

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except OSError:
            return
        if not data:
            return
        self.offset += len(data)
        parts = re.split(r"\r\n|\r|\n", self.partial + data.decode("utf-8", "replace"))
        self.partial = parts.pop()
        for line in parts + [self.partial]:
            if self.needle and self.needle in line:
                self.found = True
            if line.strip():
                self.last_line = line.strip()


# ---------------------------------------------------------------------- servers


class _ServerBase(SupervisedHandle):
    """What managed and external servers share: log, readiness loop, HTTP extras, stop."""

    def __init__(
        self,
        profile: ServerProfile,
        log_dir: str | os.PathLike[str],
        *,
        progress_every_s: float = 5.0,
        record_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.profile = profile
        self.name = profile.name
        self.engine = profile.engine_spec
        self.log_dir = Path(log_dir)
        self.record_dir = (
            Path(record_dir) if record_dir is not None else self.log_dir.parent / "servers"
        )
        """Where the supervisor records running servers (``.kimi/servers`` beside the
        ``.kimi/logs`` the plugin uses)."""
        self.progress_every_s = progress_every_s
        self.log_path: Path | None = None
        self.url: str | None = None
        self.ready = False
        self._group: Supervised | None = None
        self._started_at: float | None = None
        self._follower: _LogFollower | None = None
        self._stop_requested = False
        self._stopped = False
        self._stop_lock = threading.Lock()
        self._stop_owner: int | None = None
        self._wake = threading.Event()
        self._adopt(profile)

    def _adopt(self, profile: ServerProfile) -> None:
        """Check that the profile is of this class's kind and set the kind's own state."""
        raise NotImplementedError

    # -- overridden ----------------------------------------------------------------

    def start(self: _S, progress: ProgressFn | None = None) -> _S:
        raise NotImplementedError

    def _startup_failure(self, elapsed: float) -> ServerStartError | None:
        """An error when the launch is known to have failed (process exited, ...)."""
        raise NotImplementedError

    def _stop_impl(self) -> None:
        raise NotImplementedError

    def _describe(self) -> str:
        return f"server {self.name!r}"

    # -- identity ------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The process the plugin started (managed: the server; external: ``start:``)."""
        return self._group.pid if self._group is not None else None

    @property
    def pgid(self) -> int | None:
        return self._group.pgid if self._group is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status of that process once it ended (negative: killed by a signal)."""
        return self._group.exit_code() if self._group is not None else None

    @property
    def started(self) -> bool:
        return self._started_at is not None

    def _tail_block(self) -> str:
        excerpt = self._scrub(self.crash_excerpt(TAIL_LINES))
        if not excerpt:
            return f"log: {self.log_path} (empty)"
        if excerpt.startswith("--- "):  # the traceback sits above the tail: shown first
            return f"log: {self.log_path}\n{excerpt}"
        return f"log: {self.log_path}\n--- last {TAIL_LINES} log lines ---\n{excerpt}"

    def _after_stop(self, group: Supervised, port: int | None) -> list[str]:
        """Warn (the log, and a :class:`ServerProcessWarning`) about what the stop found
        outside the server's process group, naming each pid; the messages.

        The supervisor is a subreaper (``procgroup.become_subreaper``), so what left the
        group (a ``setsid`` helper, a daemonised server) was still found and stopped: said,
        because the profile's command should not detach it.  Processes SIGKILL did not end,
        and a process still listening on the server's own ``port`` after the stop (started
        outside the tree: a service manager's), are what is left running: said with the
        command that ends them."""
        messages: list[str] = []
        if group.strays:
            names = ", ".join(str(s.get("name") or s["pid"]) for s in group.strays)
            fix = (
                "give the profile a stop: command that stops what start: leaves running"
                if self.profile.external
                else "a profile's command should keep its processes in its group"
            )
            messages.append(
                f"{self._describe()}: processes {names} had left the server's process group "
                f"(started with setsid, or daemonised) and were stopped with it; {fix}"
            )
        if group.survivors:
            pids = " ".join(map(str, group.survivors))
            messages.append(
                f"{self._describe()}: processes {describe_pids(group.survivors)} of the "
                f"server still run after SIGKILL (stuck in the kernel or a driver?); check "
                f"them with `ps -o pid,stat,wchan,cmd -p {pids}`"
            )
        holders = port_listeners(port) if port else None
        if holders:
            pids = " ".join(map(str, holders))
            messages.append(
                f"{self._describe()}: port {port} is still held by {describe_pids(holders)} "
                "after the server was stopped: a process the plugin did not start or could "
                f"not see (a service manager's?); stop it with `kill {pids}`"
            )
        for message in messages:
            text = self._scrub(message)
            self._append_log(f"# pytest-kimi: warning: {text}")
            warnings.warn(ServerProcessWarning(text), stacklevel=3)
        return messages

    def _append_log(self, text: str) -> None:
        if self.log_path is None:
            return
        try:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
        except OSError:
            pass

    # -- readiness -----------------------------------------------------------------

    def wait_ready(
        self: _S, progress: ProgressFn | None = None, *, timeout_s: float | None = None
    ) -> _S:
        """Block until the server is ready; :class:`ServerStartError` otherwise.

        The timeout (``startup_timeout_s`` unless given) counts from :meth:`start`.  On
        any failure, including KeyboardInterrupt, the server is stopped before the error
        propagates, so a failed start never leaves processes behind.
        """
        if self._started_at is None:
            raise ServerError(f"{self._describe()}: call start() before wait_ready()")
        if self.ready:
            return self
        assert self.url is not None
        timeout = timeout_s if timeout_s is not None else self.profile.startup_timeout_s
        probe_path = self.profile.readiness_path()
        probe_url = self.url + probe_path
        headers = self._headers()
        deadline = self._started_at + timeout
        next_progress = time.monotonic() + self.progress_every_s
        probe: _Probe | None = None
        last_probe = "not probed yet"
        try:
            while True:
                now = time.monotonic()
                elapsed = now - self._started_at
                if self._stop_requested:
                    raise ServerStartError(
                        f"{self._describe()}: stopped while starting ({elapsed:.1f} s after "
                        f"start)\n{self._tail_block()}",
                        reason="stopped",
                        log_path=self.log_path,
                        returncode=self.returncode,
                        elapsed_s=elapsed,
                    )
                failure = self._startup_failure(elapsed)
                if failure is not None:
                    raise failure
                if self._follower is not None:
                    self._follower.poll()
                    if self._follower.found:
                        break
                if probe is not None and probe.done.is_set():
                    if probe.ok:
                        break
                    last_probe = probe.detail
                    if now - probe.started >= POLL_S:
                        probe = None
                if probe is None:
                    probe = _Probe(
                        self.url, probe_path, headers, generate=self.engine.generation_probe
                    )
                if now >= deadline:
                    raise ServerStartError(
                        f"{self._describe()}: not ready after {timeout:g} s "
                        f"(startup_timeout_s in {self.profile.source}); last probe of "
                        f"{probe_url}: {last_probe}. The server was stopped.\n"
                        f"{self._tail_block()}",
                        reason="timeout",
                        log_path=self.log_path,
                        elapsed_s=elapsed,
                    )
                if progress is not None and now >= next_progress:
                    next_progress = now + self.progress_every_s
                    progress(self._progress_line(elapsed, timeout))
                self._wake.wait(TICK_S)
        except BaseException:
            self.stop()
            raise
        self.ready = True
        return self

    def _progress_line(self, elapsed: float, timeout: float) -> str:
        line = self._follower.last_line if self._follower is not None else ""
        if len(line) > 200:
            line = line[:197] + "..."
        return (
            f"{self.name}: starting for {elapsed:.0f} s (timeout {timeout:g} s); "
            f"last log line: {line or '(none yet)'}"
        )

    def launch(self: _S, progress: ProgressFn | None = None) -> _S:
        """:meth:`start` then :meth:`wait_ready`: the usual one-call use."""
        self.start(progress)
        return self.wait_ready(progress)

    # -- stop ----------------------------------------------------------------------

    def stop(self) -> int | None:
        """Stop the server and everything it spawned; idempotent and thread-safe.

        Safe from ``atexit``, from a KeyboardInterrupt handler and from another thread
        while :meth:`wait_ready` is still waiting (which then raises "stopped").  A
        re-entrant call (a signal handler firing during a stop) returns at once.
        """
        me = threading.get_ident()
        if self._stop_owner == me:
            return self.returncode
        self._stop_requested = True
        self._wake.set()
        with self._stop_lock:
            self._stop_owner = me
            try:
                if not self._stopped and self._started_at is not None:
                    try:
                        self._stop_impl()
                    finally:
                        self._stopped = True
                        try:
                            atexit.unregister(self.stop)
                        except Exception:  # noqa: BLE001 - interpreter shutting down
                            pass
            finally:
                self._stop_owner = None
        return self.returncode

    # -- HTTP extras ---------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {}

    def _require_url(self) -> str:
        if self.url is None:
            raise ServerError(f"{self._describe()}: not started")
        return self.url

    def server_info(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The server's effective arguments (SGLang ``/server_info``), ``{}`` when the
        engine has no such endpoint.  :class:`ServerError` when the server is unreachable,
        because then the caller has a bigger problem than missing provenance."""
        base = self._require_url()
        for path in self.engine.info_paths:
            try:
                status, body = _http("GET", base + path, timeout=timeout_s, headers=self._headers())
            except ResponseTooLarge:
                return {}  # provenance only: an answer past the cap is no server info
            except OSError as exc:
                raise ServerError(f"{self._describe()}: GET {base}{path} failed: {exc}") from None
            if status in (404, 405):
                continue
            if status != 200:
                return {}
            try:
                data = loads_bounded(body)
            except NotJSON:
                return {}
            return data if isinstance(data, dict) else {}
        return {}

    def flush_cache(self, timeout_s: float = 30.0, api_key: str | None = None) -> bool:
        """Drop the server's prefix cache so a measurement does not inherit cache hits.

        True when flushed.  False when the engine has no flush endpoint, or the server
        refused; then ``self.flush_error`` says why (None after a success).  SGLang 0.5.23
        flushes only an idle scheduler (400 otherwise) and waits up to ``?timeout=`` seconds
        for it to become idle (``sglang/srt/entrypoints/http_server.py`` ``flush_cache``,
        ``sglang/srt/managers/scheduler_components/flush_wrapper.py``), so this asks it to
        wait ``timeout_s``.  The endpoint is ``ADMIN_OPTIONAL`` (``sglang/srt/utils/auth.py``):
        it takes the admin key when the server has one, else the API key.  So this sends the
        profile's ``admin-api-key``, else its ``api-key``, else ``api_key`` (the key the
        load client sends: ``--api-key``/``KIMI_API_KEY``, the only key an external profile,
        which has no ``args:``, can have).
        """
        self.flush_error: str | None = None
        base = self._require_url()
        path = self.engine.flush_path
        if path is None:
            self.flush_error = f"engine {self.engine.kind!r} has no cache flush endpoint"
            return False
        args = self.profile.args
        key = next(
            (
                str(args[k])
                for k in ("admin-api-key", "api-key")
                if args.get(k) not in (None, False, True)
            ),
            api_key,
        )
        headers = {"Authorization": f"Bearer {key}"} if key else self._headers()
        url = f"{base}{path}?timeout={timeout_s:g}"
        for method in ("POST", "GET"):  # older SGLang releases only route GET
            try:
                status, body = _http(method, url, timeout=timeout_s + 10.0, headers=headers)
            except OSError as exc:
                raise ServerError(
                    f"{self._describe()}: {method} {base}{path} failed: {exc}"
                ) from None
            if status == 405:
                continue
            if status == 200:
                return True
            text = body.decode("utf-8", "replace").strip()[:200]
            if status in (401, 403):
                self.flush_error = f"{method} {path} answered HTTP {status}: " + self._key_hint(
                    sent=bool(key)
                )
            elif status == 404:
                self.flush_error = (
                    f"{method} {path} answered HTTP 404: the server has no such endpoint"
                )
            else:
                self.flush_error = f"{method} {path} answered HTTP {status}: {text or '(no text)'}"
            return False
        self.flush_error = f"{path} accepts neither POST nor GET (HTTP 405)"
        return False

    def _key_hint(self, sent: bool) -> str:
        """What to fix after a 401 on the flush, in terms this profile type has: a managed
        profile's ``args:`` can carry the keys, an external one has no ``args:``."""
        what = "the key it was sent was refused" if sent else "it needs a key"
        if self.profile.external:
            return (
                f"{what}; it takes the server's admin key (or its API key when it has no "
                "admin key): give it with --api-key or KIMI_API_KEY (an external profile "
                "has no args: to hold one)"
            )
        return (
            f"{what}; it takes the admin key (admin-api-key in the profile's args:) or, "
            "when the server has none, the API key (api-key in args:)"
        )

    # -- context manager (``with``: SupervisedHandle) ------------------------------

    def _enter(self: _S) -> _S:
        return self.launch()

    # -- spawning ------------------------------------------------------------------

    def _open_log(self, header: list[str]) -> None:
        self.log_path = _new_log(self.log_dir, self.name)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._append_log(
            "\n".join(
                f"# pytest-kimi: {h}"
                for h in [
                    f"{self._describe()} from {self.profile.source}",
                    f"started at {stamp}",
                    *header,
                ]
            )
        )

    def secrets(self) -> list[str]:
        """Literal values never to be shown: the profile's (:func:`profile_secrets`: secret
        args, secret env values, the values of the variables ``secret_env`` names) and
        whatever the process registered (``--api-key`` given to pytest)."""
        return sorted(known_secrets() | set(profile_secrets(self.profile)))

    def _scrub(self, text: str) -> str:
        return scrub_text(text, self.secrets())

    def _env_summary(self) -> str:
        parts = []
        for k, v in self.profile.env.items():
            if v is None:
                parts.append(f"-{k}")
            elif k in self.profile.secret_env or is_secret_name(k):
                parts.append(f"{k}=<redacted>")
            else:
                parts.append(f"{k}={v}")
        return self._scrub("env: " + (" ".join(parts) if parts else "(inherited)"))

    def _spawn(
        self,
        args: list[str],
        *,
        record: dict[str, Any] | None = None,
        leader_grace_s: float | None = None,
    ) -> Supervised:
        """Run ``args`` under a supervisor, output scrubbed into the log (OSError if the
        command cannot be run)."""
        assert self.log_path is not None
        record_path = None
        if record is not None:
            record_path = leftovers.record_path(
                self.record_dir, _safe_name(self.name), f"{os.getpid()}-{id(self):x}"
            )
        return Supervised(
            args,
            env=_child_env(self.profile.env),
            log_path=self.log_path,
            secrets=self.secrets(),
            leader_grace_s=self.profile.stop_grace_s if leader_grace_s is None else leader_grace_s,
            group_grace_s=self.profile.stop_timeout_s,
            record_path=record_path,
            record_info=record,
        )


class ManagedServer(_ServerBase):
    """A server process the plugin launches from a managed profile and owns completely.

    ``url``, ``port``, ``pid``, ``pgid``, ``log_path`` and ``command`` are set by
    :meth:`start`.  Use :meth:`launch` (or ``with``) to start and wait in one call.
    """

    def __init__(
        self,
        profile: ServerProfile,
        log_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        progress_every_s: float = 5.0,
        record_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.host = str(profile.args.get("host") or host)
        self._port_request = port
        super().__init__(profile, log_dir, progress_every_s=progress_every_s, record_dir=record_dir)

    def _adopt(self, profile: ServerProfile) -> None:
        if profile.external:
            raise ServerError(
                f"{profile.source}: an external profile (url:) needs "
                f"ExternalServer; use open_server()"
            )
        self.port: int | None = None
        self.command: list[str] = []
        self._crash_code: int | None = None
        self._stopped_by_us = False

    def _describe(self) -> str:
        return f"server {self.name!r}"

    @property
    def api_key(self) -> str | None:
        """The profile's ``api-key`` arg, which clients of this server must send."""
        key = self.profile.args.get("api-key")
        return str(key) if key not in (None, False, True) else None

    def _headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def start(self, progress: ProgressFn | None = None) -> ManagedServer:
        """Spawn the server in a new process group on a free port; returns at once (see
        :meth:`wait_ready`).

        First, servers recorded in ``record_dir`` by earlier runs are dealt with
        (``leftovers.clear``): one whose run is gone is stopped (said through
        ``progress``); one that cannot safely be stopped fails this start with reason
        ``"leftover"`` instead of starting a second server beside it.
        """
        if self._started_at is not None:
            raise ServerError(
                f"{self._describe()}: already started (a ManagedServer is "
                f"single-use; create a new one to restart)"
            )
        if self._stop_requested:
            raise ServerError(f"{self._describe()}: stop() was called before start()")
        try:
            leftovers.clear(self.record_dir, progress)
        except leftovers.LeftoverServer as exc:
            self._stopped = True
            raise ServerStartError(
                f"{self._describe()}: {self._scrub(str(exc))}", reason="leftover"
            ) from None
        pinned = self.profile.args.get("port")
        self.port = int(pinned) if pinned else (self._port_request or _free_port(self.host))
        self.url = f"http://{_connect_host(self.host)}:{self.port}"
        self.command = argv(self.profile, host=self.host, port=self.port)
        shown = scrub_argv(self._niced(self.command), self.secrets())
        self._open_log(
            [
                self._scrub(f"command: {' '.join(shown)}"),
                self._env_summary(),
                f"stop: SIGTERM to the main process, {self.profile.stop_grace_s:g} s "
                f"(stop_grace_s); SIGTERM to its group, "
                f"{self.profile.stop_timeout_s:g} s (stop_timeout_s); SIGKILL",
            ]
        )
        assert self.log_path is not None
        for warning in self.profile.flag_warnings:  # a deprecated flag: said, not fatal
            self._append_log(f"# pytest-kimi: warning: {self._scrub(warning)}")
            if progress is not None:
                progress(f"warning: {self._scrub(warning)}")
        self._follower = _LogFollower(
            self.log_path, self.engine.ready_log_line, offset=self.log_path.stat().st_size
        )
        self._started_at = time.monotonic()
        try:
            self._group = self._spawn(
                self._niced(self.command),
                record={
                    "kind": "managed",
                    "name": self.name,
                    "profile": self.profile.source,
                    "host": self.host,
                    "port": self.port,
                    "cwd": os.getcwd(),
                },
            )
        except OSError as exc:
            self._stopped = True
            self._append_log(f"# pytest-kimi: cannot run the command: {exc}")
            raise ServerStartError(
                f"{self._describe()}: cannot run {self.command[0]!r} "
                f"(command in {self.profile.source}): {exc}",
                reason="spawn",
                log_path=self.log_path,
            ) from None
        if self.profile.nice and self._group.pid is not None:
            note = nice_session(self._group.pid, self.profile.nice)
            if note:
                self._append_log(f"# pytest-kimi: {note}")
        atexit.register(self.stop)
        return self

    def _niced(self, words: list[str]) -> list[str]:
        """``nice -n N`` execs the server in place: same pid, so the process group is kept."""
        return ["nice", "-n", str(self.profile.nice), *words] if self.profile.nice else words

    def _startup_failure(self, elapsed: float) -> ServerStartError | None:
        assert self._group is not None
        code = self._group.exit_code()
        if code is None or self._stop_requested:
            return None  # a requested stop is reported as "stopped" by the caller
        self.stop()  # its children may linger; clean up before reporting
        return ServerStartError(
            f"{self._describe()}: the server process {describe_exit(code)} "
            f"before it was ready ({elapsed:.1f} s after start)\n"
            f"command: {' '.join(scrub_argv(self.command, self.secrets()))}\n"
            f"{self._tail_block()}",
            reason="exited",
            log_path=self.log_path,
            returncode=code,
            elapsed_s=elapsed,
        )

    def _stop_impl(self) -> None:
        group = self._group
        if group is None or group.reaped:
            return
        code = group.exit_code()
        if code is not None:
            if not self._stopped_by_us:
                self._crash_code = code
            group.terminate(0.0, min(self.profile.stop_timeout_s, DEAD_LEADER_GRACE_S))
        else:
            self._stopped_by_us = True
            group.terminate()
        how = " after SIGKILL" if group.killed else ""
        self._append_log(f"# pytest-kimi: stopped (exit code {group.exit_code()}){how}")
        self._after_stop(group, self.port)

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self._group is not None and self._group.exit_code() is None

    def crashed(self) -> int | None:
        """The exit code if the server died on its own (not through :meth:`stop`).

        Meant for a failing measurement: "connection refused" then has a cause, and the
        log tail (:meth:`log_tail`) has the traceback.
        """
        if self._crash_code is not None:
            return self._crash_code
        if self._group is None or self._stopped_by_us:
            return None
        return self._group.exit_code()

    def __repr__(self) -> str:
        return f"ManagedServer(name={self.name!r}, pid={self.pid}, url={self.url!r})"


class ExternalServer(_ServerBase):
    """A server someone else runs: ``start:``/``stop:`` shell commands and a ``url:``.

    ``start:`` may return at once (``systemctl start ...``) or keep running (``ssh host
    python -m sglang.launch_server ...``); either way readiness is the engine's probe at
    ``url``.  A non-zero exit of ``start:`` fails the start at once.  At :meth:`stop`,
    ``stop:`` runs (bounded by ``stop_timeout_s``), then whatever ``start:`` left running
    in its process group is stopped as well.
    """

    def _adopt(self, profile: ServerProfile) -> None:
        if not profile.external:
            raise ServerError(
                f"{profile.source}: not an external profile (no url:); use "
                f"ManagedServer or open_server()"
            )
        self.url = profile.url
        self._foreground = False
        self._stopped_by_us = False

    def _describe(self) -> str:
        return f"external server {self.name!r} at {self.url}"

    def start(self, progress: ProgressFn | None = None) -> ExternalServer:
        """Run ``start:`` (if any) in its own process group; returns at once.

        ``start:`` runs under the same supervisor as a managed server, so a foreground
        ``ssh host ...`` is stopped when pytest dies without a teardown as well."""
        if self._started_at is not None:
            raise ServerError(f"{self._describe()}: already started")
        if self._stop_requested:
            raise ServerError(f"{self._describe()}: stop() was called before start()")
        self._open_log(
            [
                self._scrub(f"start: {self.profile.start or '(none)'}"),
                self._scrub(f"stop: {self.profile.stop or '(none)'}"),
                self._env_summary(),
            ]
        )
        self._started_at = time.monotonic()
        if self.profile.start:
            try:
                self._group = self._spawn(["/bin/sh", "-c", self.profile.start], leader_grace_s=0.0)
            except OSError as exc:
                self._stopped = True
                raise ServerStartError(
                    f"{self._describe()}: cannot run start command: {exc}",
                    reason="spawn",
                    log_path=self.log_path,
                ) from None
        atexit.register(self.stop)
        return self

    def wait_ready(
        self, progress: ProgressFn | None = None, *, timeout_s: float | None = None
    ) -> ExternalServer:
        super().wait_ready(progress, timeout_s=timeout_s)
        # A start command still running at this point is the server itself (foreground).
        self._foreground = self._group is not None and self._group.exit_code() is None
        return self

    def _startup_failure(self, elapsed: float) -> ServerStartError | None:
        if self._group is None:
            return None
        code = self._group.exit_code()
        if code is None or code == 0 or self._stop_requested:
            return None  # still running, or returned after handing off: keep probing
        self.stop()
        return ServerStartError(
            f"{self._describe()}: the start command exited with code {code} "
            f"({elapsed:.1f} s after start): {self._scrub(self.profile.start or '')}\n"
            f"{self._tail_block()}",
            reason="start-failed",
            log_path=self.log_path,
            returncode=code,
            elapsed_s=elapsed,
        )

    def _stop_impl(self) -> None:
        self._stopped_by_us = True
        try:
            if self.profile.stop:
                self._run_stop_command(self.profile.stop)
        finally:
            # Even after a Ctrl-C during stop:, nothing start: left in its group survives,
            # nor what it detached from the group (a daemonised server: the supervisor is
            # its subreaper, so it outlives start: there and is stopped here).
            if self._group is not None and not self._group.reaped:
                self._group.terminate(0.0, self.profile.stop_timeout_s)
                self._after_stop(self._group, None)

    def _run_stop_command(self, command: str) -> None:
        self._append_log(f"# pytest-kimi: running stop command: {self._scrub(command)}")
        try:
            group = self._spawn(["/bin/sh", "-c", command], leader_grace_s=0.0)
        except OSError as exc:
            self._append_log(f"# pytest-kimi: cannot run stop command: {exc}")
            return
        try:
            deadline = time.monotonic() + self.profile.stop_timeout_s
            while time.monotonic() < deadline and group.exit_code() is None:
                time.sleep(TICK_S)
            if group.exit_code() is None:
                self._append_log(
                    f"# pytest-kimi: stop command still running after "
                    f"{self.profile.stop_timeout_s:g} s; killing it"
                )
        finally:
            code = group.terminate(0.0, 1.0)
        self._append_log(f"# pytest-kimi: stop command exited with code {code}")

    def alive(self) -> bool:
        """Whether the server answers at ``url`` (``/v1/models``: liveness, not readiness;
        it is cheap and does not queue behind a running benchmark)."""
        try:
            status, _ = _http("GET", f"{self.url}/v1/models", timeout=2.0)
        except ResponseTooLarge:
            return True  # it answered
        except OSError:
            return False
        return status < 500

    def crashed(self) -> int | None:
        """The exit code of a foreground ``start:`` command that ended on its own; None
        otherwise (a detached external server's death shows as connection errors)."""
        if not self._foreground or self._stopped_by_us or self._group is None:
            return None
        return self._group.exit_code()

    def __repr__(self) -> str:
        return f"ExternalServer(name={self.name!r}, url={self.url!r})"


Server = ManagedServer | ExternalServer


def open_server(
    profile: ServerProfile, log_dir: str | os.PathLike[str], **kwargs: Any
) -> ManagedServer | ExternalServer:
    """The right server object for ``profile``, not started yet (call :meth:`launch`)."""
    if profile.external:
        return ExternalServer(profile, log_dir, **kwargs)
    return ManagedServer(profile, log_dir, **kwargs)
