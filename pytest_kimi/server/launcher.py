"""Start, wait for, inspect and stop the server a profile describes.

Why the plugin owns this instead of a shell script: a Kimi deployment takes minutes to come
up, fails in ways that only show in its log (an OOM, a ``ZeroDivisionError`` for an impossible
TP/EP split) and leaves GPU-holding child processes behind when it is killed carelessly.  So
the launcher

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

The parts: :mod:`.server_base` (errors, log, the readiness wait and the stop both kinds of
server share), :mod:`.server_http` (bounded HTTP and the readiness probe), :mod:`.ports`,
:mod:`.supervised` (the supervisor's parent side).  Here: the two kinds of server and
:func:`open_server`.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Any

from pytest_kimi.scrub import scrub_argv
from pytest_kimi.server import leftovers
from pytest_kimi.server.ports import _connect_host, _free_port
from pytest_kimi.server.procgroup import DEAD_LEADER_GRACE_S, nice_session
from pytest_kimi.server.profile import ServerProfile, argv
from pytest_kimi.server.server_base import (
    TICK_S,
    ProgressFn,
    ServerError,
    ServerStartError,
    _LogFollower,
    _ServerBase,
)
from pytest_kimi.server.server_http import ResponseTooLarge, _http
from pytest_kimi.server.supervised import describe_exit

__all__ = [
    "ExternalServer",
    "ManagedServer",
    "Server",
    "open_server",
]


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
