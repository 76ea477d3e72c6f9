"""Run the simulator as a child process: :class:`SimProcess`.

The simulator must not share an event loop (or a Python interpreter) with the load client,
or the two would steal each other's timer slots and the "known" rate would no longer be
known.  So it runs as ``python -m pytest_kimi.sim`` in its own process group, and this
module owns that process completely: start, wait for the readiness line, and a stop that
cannot leave an orphan behind (SIGTERM, a grace period, SIGKILL to the group, reap), even
when called twice, from ``atexit``, or from a signal handler while a stop is in progress.

The child runs under the same supervisor as a managed server
(``pytest_kimi/server/supervisor.py``): should pytest die without a teardown (SIGKILL, the
OOM killer, a killed xdist worker), the supervisor sees its pipe close and stops the
simulator; with ``record_dir`` it is also recorded there, so that a later run stops one
whose supervisor died as well.
"""

from __future__ import annotations

import atexit
import os
import selectors
import sys
import tempfile
import time
from pathlib import Path

from pytest_kimi.server import leftovers
from pytest_kimi.server.supervised import Supervised, SupervisedHandle
from pytest_kimi.sim.config import SimConfig

__all__ = ["SimProcess", "SimProcessError", "READY_PREFIX", "API_KEY_ENV"]

READY_PREFIX = "pytest-kimi sim listening on "
"""Start of the one stdout line the child prints when it accepts connections."""
API_KEY_ENV = "PYTEST_KIMI_SIM_API_KEY"
"""Environment variable the child reads when ``--api-key`` is absent (keeps the key out of
the process list)."""

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""Directory holding the ``pytest_kimi`` package, put on the child's PYTHONPATH so the
child imports the same code even when the project is not installed."""


class SimProcessError(RuntimeError):
    """The simulator process failed to start or to become ready."""


class SimProcess(SupervisedHandle):
    """A simulator child process; use as a context manager or call start()/stop().

    ``url``, ``pid`` and ``port`` are valid once :meth:`start` returned.  stderr goes to
    ``log_path`` when given (always kept); otherwise to a fresh file in ``log_dir`` (or
    the temp directory) that is removed after a clean or silent exit and kept when it
    could explain a failure, which :meth:`log_tail` and the start errors quote.
    """

    def __init__(
        self,
        profile: SimConfig | None = None,
        *,
        log_path: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        ready_timeout_s: float = 30.0,
        grace_s: float = 5.0,
        port: int = 0,
        python: str | None = None,
        record_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.profile = profile or SimConfig()
        self.ready_timeout_s = ready_timeout_s
        self.grace_s = grace_s
        self._port_request = port
        self._python = python or sys.executable
        self._log_given = log_path is not None
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._record_dir = Path(record_dir) if record_dir is not None else None
        self._proc: Supervised | None = None
        self._ready_fd: int | None = None
        self._stopping = False
        self.url: str | None = None
        self.port: int | None = None
        self.pid: int | None = None
        self.returncode: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        """The child's argv (the API key travels in the environment, not here)."""
        return [
            self._python,
            "-m",
            "pytest_kimi.sim",
            "--port",
            str(self._port_request),
            *self.profile.to_cli_args(include_secrets=False),
        ]

    def start(self) -> SimProcess:
        """Spawn the simulator and block until it prints its ready line."""
        if self._proc is not None:
            raise SimProcessError("simulator process already started")
        if self.log_path is None:
            if self._log_dir is not None:
                self._log_dir.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="pytest-kimi-sim-", suffix=".log", dir=self._log_dir)
            os.close(fd)
            self.log_path = Path(name)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(_PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env["PYTHONUNBUFFERED"] = "1"
        env.pop(API_KEY_ENV, None)
        if self.profile.api_key is not None:
            env[API_KEY_ENV] = self.profile.api_key
        record = None
        if self._record_dir is not None:
            # Simulators hold no GPU: only those of runs that are gone are stopped.
            leftovers.clear(self._record_dir, refuse_when_owner_alive=False)
            record = leftovers.record_path(self._record_dir, "sim", f"{os.getpid()}-{id(self):x}")
        # The ready line comes through a pipe of our own; stderr goes to the log through
        # the supervisor, scrubbed of the API key.
        ready_r, ready_w = os.pipe()
        try:
            self._proc = Supervised(
                self.command(),
                env=env,
                log_path=self.log_path,
                secrets=[self.profile.api_key] if self.profile.api_key else [],
                stdout_fd=ready_w,
                leader_grace_s=self.grace_s,
                group_grace_s=self.grace_s,
                record_path=record,
                record_info={"kind": "sim", "name": "sim"},
                notes=False,
                python=self._python,
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        self._ready_fd = ready_r
        self.pid = self._proc.pid
        atexit.register(self.stop)
        try:
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def _wait_ready(self) -> str:
        proc = self._proc
        fd = self._ready_fd
        assert proc is not None and fd is not None
        deadline = time.monotonic() + self.ready_timeout_s
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SimProcessError(
                        f"simulator (pid {proc.pid}) not ready after {self.ready_timeout_s:g} s"
                        f"\n{self._tail_block()}"
                    )
                if sel.select(min(remaining, 0.1)):
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        self._raise_died()
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        text = line.decode("utf-8", "replace").strip()
                        if text.startswith(READY_PREFIX):
                            return text[len(READY_PREFIX) :]
                elif proc.exit_code() is not None:
                    self._raise_died()

    def _raise_died(self) -> None:
        proc = self._proc
        assert proc is not None
        proc.wait_gone(5.0)
        code = proc.exit_code()
        raise SimProcessError(
            f"simulator exited before it was ready (exit code {code}): "
            f"{' '.join(self.command())}\n{self._tail_block()}"
        )

    def stop(self) -> int | None:
        """Terminate the process group and reap the child; idempotent.

        SIGTERM first so the server closes its sockets; after ``grace_s`` SIGTERM to the
        group, after another ``grace_s`` SIGKILL (the supervisor's staged stop).  The leader
        is reaped only after the group SIGKILL: until then its pid (which is the group id)
        cannot be reused, so the group signal can never hit a stranger.  A second Ctrl-C
        while waiting kills at once.  A re-entrant call (a signal handler firing during a
        stop) returns at once.
        """
        proc = self._proc
        if proc is None or self._stopping:
            return self.returncode
        self._stopping = True
        try:
            self.returncode = proc.terminate(self.grace_s, self.grace_s)
            if self._ready_fd is not None:
                try:
                    os.close(self._ready_fd)
                except OSError:
                    pass
                self._ready_fd = None
            self._proc = None
            try:
                atexit.unregister(self.stop)
            except Exception:
                pass
            if not self._log_given and self.log_path is not None:
                self._remove_temp_log()
        finally:
            self._stopping = False
        return self.returncode

    def _remove_temp_log(self) -> None:
        """Delete our temporary log after a clean exit, or when it is empty; a log that
        could explain a failure stays behind (its path is in the error message)."""
        assert self.log_path is not None
        try:
            if self.returncode == 0 or self.log_path.stat().st_size == 0:
                self.log_path.unlink()
        except OSError:
            pass

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.exit_code() is None

    # ------------------------------------------------------------------ diagnostics

    def _tail_block(self) -> str:
        tail = self.log_tail()
        return f"--- log {self.log_path} ---\n{tail}" if tail else f"(log {self.log_path} empty)"

    # ------------------------------------------------------------------ ``with``

    def _enter(self) -> SimProcess:
        return self.start()

    def __repr__(self) -> str:
        return f"SimProcess(pid={self.pid}, url={self.url!r})"
