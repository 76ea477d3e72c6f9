"""What managed and external servers share: their errors, their log, the readiness wait,
the HTTP extras (server info, cache flush) and the staged stop.

Why a module apart from :mod:`.launcher`: the two kinds of server differ only in how they
start, fail and stop (:class:`~.launcher.ManagedServer`, :class:`~.launcher.ExternalServer`);
the loop that waits for readiness (a real generation probe or the engine's "ready" log line,
never ``/v1/models``, which answers before warm-up) and notices a dead server within a
fraction of a second, and the log every message quotes, are the same for both, and are here.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pytest_kimi.endpoint.bounded import NotJSON, loads_bounded
from pytest_kimi.scrub import is_secret_name, known_secrets, scrub_text
from pytest_kimi.server import leftovers
from pytest_kimi.server.procgroup import describe_pids, port_listeners
from pytest_kimi.server.profile import ServerProfile, profile_secrets
from pytest_kimi.server.server_http import ResponseTooLarge, _http, _Probe
from pytest_kimi.server.supervised import Supervised, SupervisedHandle

__all__ = [
    "ProgressFn",
    "ServerError",
    "ServerProcessWarning",
    "ServerStartError",
]

ProgressFn = Callable[[str], None]
"""Receives one human-readable line about a server that is still starting."""

POLL_S = 0.5
"""How often the readiness probe is sent while a server starts."""
TICK_S = 0.1
"""How often the process and the log are checked: bounds how late a crash is noticed."""
TAIL_LINES = 40
"""Log lines quoted in start errors: enough for a Python traceback with its context."""

_S = TypeVar("_S", bound="_ServerBase")


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
