"""The parent's side of the supervisor: a command run under :mod:`.supervisor`, in a process
group of its own, and what a handle on such a child offers (its log's tail, ``with``).

Why a module apart from the supervisor: the supervisor is a script that a fresh ``python -I``
runs, standard library only; this side lives in pytest's process (the launcher, the
simulator's :class:`~pytest_kimi.sim.process.SimProcess`) and talks to it over its pipes:
one JSON line of configuration, then ``stop LEADER_GRACE GROUP_GRACE`` or ``kill``; back come
``started``, ``error``, ``exited`` and ``gone``.  It also holds this process's registry of
live groups, so that an interrupt can stop them all (:func:`kill_all`, :func:`hurry`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pytest_kimi.server import procgroup

__all__ = [
    "Supervised",
    "SupervisedHandle",
    "SupervisorError",
    "describe_exit",
    "hurry",
    "kill_all",
    "last_traceback",
    "live",
    "read_tail",
]

SCRIPT = Path(__file__).resolve().with_name("supervisor.py")
"""The supervisor script each :class:`Supervised` runs (``python -I SCRIPT``)."""


class SupervisorError(RuntimeError):
    """The supervisor could not be started or stopped talking."""


_LIVE: weakref.WeakSet[Supervised] = weakref.WeakSet()
_HURRY = threading.Event()


def live() -> list[Supervised]:
    """Supervised groups of this process that are not gone yet."""
    return [s for s in list(_LIVE) if not s.gone]


def hurry() -> None:
    """From now on every stop of this process skips the graces (SIGKILL at once)."""
    _HURRY.set()


def kill_all(wait_s: float = 5.0) -> None:
    """SIGKILL every supervised group of this process and wait (bounded) until they are
    gone.  Safe from a signal handler: it only writes to pipes and polls flags."""
    hurry()
    groups = live()
    for group in groups:
        group.kill()
    deadline = time.monotonic() + wait_s
    for group in groups:
        group.wait_gone(max(0.0, deadline - time.monotonic()))


_H = TypeVar("_H", bound="SupervisedHandle")


def read_tail(path: Path | None, n: int) -> str:
    """The last ``n`` non-empty lines of a log (its last 64 KiB read); "" when there is none.

    ``\r`` splits lines too: progress bars (tqdm) redraw with carriage returns.
    """
    if path is None or n <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return "\n".join(lines[-n:])


_TRACEBACK = "Traceback (most recent call last)"
TRACEBACK_SCAN_BYTES = 16 * 1024 * 1024
"""How much of a log's end is searched for its last traceback: a multi-rank server's
traceback can be thousands of lines above the end (the other ranks keep logging)."""


def last_traceback(path: Path | None, max_lines: int = 80) -> str:
    """The last Python traceback in a log: its ``Traceback`` line, the indented frames, and
    the exception line that ends it ("" when the log has none).

    Why: when one rank of an 8-GPU server dies, the other ranks' output fills the lines after
    its traceback, so the last lines of the log (what an error message quotes) miss the
    one thing that says what went wrong.
    """
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TRACEBACK_SCAN_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return ""
    lines = text[text.rfind("\n", 0, at) + 1 :].split("\n")
    block = [lines[0]]
    for line in lines[1:]:
        if not line.strip():
            continue
        block.append(line)
        if not line[:1].isspace():  # the exception line closes the traceback
            break
    if len(block) > max_lines:
        block = block[:1] + ["  ..."] + block[-(max_lines - 2) :]
    return "\n".join(block)


def describe_exit(code: int) -> str:
    """``exited with code 1``, or ``was killed by SIGKILL (exit code -9)`` for a negative
    status: a server that died of a signal (SGLang kills its own tree with SIGKILL when a
    scheduler dies, the OOM killer does too) is not one that exited with an error."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


class SupervisedHandle:
    """What a handle on a supervised child (a managed server, the simulator) offers the same
    way: its log's tail for error messages, and ``with`` that starts it and always stops it.

    Subclasses set ``log_path`` and implement :meth:`_enter` (start and wait until usable)
    and :meth:`stop` (idempotent; the supervisor stops the group however we got there).
    """

    log_path: Path | None = None

    def _enter(self: _H) -> _H:
        raise NotImplementedError

    def stop(self) -> int | None:
        raise NotImplementedError

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` non-empty lines of the child's log."""
        return read_tail(self.log_path, n)

    def crash_excerpt(self, n: int = 40) -> str:
        """What a crash report quotes: the log's last traceback (:func:`last_traceback`),
        when the last ``n`` lines do not already hold it, then those lines."""
        tail = read_tail(self.log_path, n)
        block = last_traceback(self.log_path)
        if not block or block.split("\n", 1)[0] in tail and block.rsplit("\n", 1)[-1] in tail:
            return tail
        return f"--- last traceback in the log ---\n{block}\n--- last {n} log lines ---\n{tail}"

    def __enter__(self: _H) -> _H:
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Supervised:
    """A command running under a supervisor, in a process group of its own.

    ``pid`` (= ``pgid``) is the command's; :meth:`exit_code`, :meth:`alive` and
    :meth:`terminate` have the meaning they had when pytest was the direct parent.
    Raises OSError when the command cannot be run (as :class:`subprocess.Popen` would).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        secrets: Iterable[str] = (),
        stdout_fd: int | None = None,
        leader_grace_s: float = 60.0,
        group_grace_s: float = 30.0,
        record_path: str | os.PathLike[str] | None = None,
        record_info: Mapping[str, Any] | None = None,
        notes: bool = True,
        python: str | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.argv = list(argv)
        self.leader_grace_s = leader_grace_s
        self.group_grace_s = group_grace_s
        self.pid: int | None = None
        self.starttime: int | None = None
        self.gone = False
        self.killed = False
        self.strays: list[dict[str, Any]] = []
        """Processes of the command's tree that had left its process group (``setsid``, a
        daemonising fork) and were stopped with it: ``{"pid", "name"}`` each, from the
        supervisor's last word.  What a warning names."""
        self.survivors: list[int] = []
        """Processes of the tree still alive when the supervisor gave up (stuck in the
        kernel: SIGKILL cannot end them yet)."""
        self._code: int | None = None
        self._events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._wlock = threading.RLock()  # kill() may run in a signal handler mid-_send
        cfg: dict[str, Any] = {
            "argv": self.argv,
            "env": dict(env) if env is not None else None,
            "cwd": os.fspath(cwd) if cwd is not None else None,
            "log": os.fspath(log_path) if log_path is not None else None,
            "secrets": sorted({s for s in secrets if s}),
            "stdout_fd": stdout_fd,
            "leader_grace_s": leader_grace_s,
            "group_grace_s": group_grace_s,
            "record": os.fspath(record_path) if record_path is not None else None,
            "record_info": dict(record_info or {}),
            "notes": notes,
            "parent_pid": os.getpid(),
        }
        if record_path is not None:
            cfg["record_info"].update(
                owner_pid=os.getpid(),
                owner_starttime=procgroup.process_starttime(os.getpid()),
                leader_grace_s=leader_grace_s,
                group_grace_s=group_grace_s,
            )
        err = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
        try:
            self._sup = subprocess.Popen(
                [python or sys.executable, "-I", str(SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                close_fds=True,
                pass_fds=(stdout_fd,) if stdout_fd is not None else (),
            )
        finally:
            if log_path is not None:
                err.close()  # type: ignore[union-attr]
        assert self._sup.stdin is not None and self._sup.stdout is not None
        self._ctl = self._sup.stdin.fileno()
        self._send(json.dumps(cfg))
        self._reader = threading.Thread(
            target=self._read, name="pytest-kimi-supervisor", daemon=True
        )
        self._reader.start()
        with self._cond:
            self._cond.wait_for(
                lambda: self.pid is not None or self._error is not None or self.gone,
                timeout=start_timeout_s,
            )
        if self._error is not None:
            self._close()
            raise (
                OSError(self._error.get("errno"), self._error["message"])
                if self._error.get("errno")
                else OSError(self._error["message"])
            )
        if self.pid is None:
            self.kill()
            self._close()
            raise SupervisorError(
                f"the supervisor of {self.argv[0]!r} did not start it within {start_timeout_s:g} s"
            )
        _LIVE.add(self)

    _error: dict[str, Any] | None = None

    @property
    def pgid(self) -> int | None:
        return self.pid

    @property
    def reaped(self) -> bool:
        return self.gone

    @property
    def supervisor_pid(self) -> int:
        return self._sup.pid

    def _read(self) -> None:
        out = self._sup.stdout
        assert out is not None
        for raw in out:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                kind = event.get("event")
                if kind == "started":
                    self.pid = int(event["pid"])
                    self.starttime = event.get("starttime")
                elif kind == "error":
                    self._error = event
                elif kind == "exited":
                    self._code = event.get("code")
                elif kind == "gone":
                    if event.get("code") is not None:
                        self._code = event["code"]
                    self.killed = bool(event.get("killed"))
                    self.strays = [
                        s for s in event.get("strays") or [] if isinstance(s, dict) and "pid" in s
                    ]
                    self.survivors = [p for p in event.get("survivors") or [] if isinstance(p, int)]
                    self.gone = True
                self._cond.notify_all()
        with self._cond:  # EOF: the supervisor exited (or was killed)
            if (
                not self.gone
                and self.pid is not None
                and self._code is None
                and not procgroup.pid_alive(self.pid)
            ):
                self._code = -1
            self.gone = True
            self._cond.notify_all()

    def _send(self, line: str) -> bool:
        with self._wlock:
            try:
                os.write(self._ctl, (line + "\n").encode())
                return True
            except (OSError, ValueError):
                return False

    def exit_code(self) -> int | None:
        """The command's exit status (negative: killed by that signal), None while it runs."""
        if (
            self._code is None
            and self.pid is not None
            and not self.gone
            and not procgroup.pid_alive(self.pid)
        ):
            # Dead (a zombie until the supervisor reaps it); its report is on the way.
            with self._cond:
                self._cond.wait_for(lambda: self._code is not None or self.gone, timeout=2.0)
        return self._code

    def alive(self) -> bool:
        """Whether anything in the group still runs (the leader or a lingering child)."""
        if self.gone or self.pid is None:
            return False
        members = procgroup.group_members(self.pid)
        if members is None:
            return self._code is None
        return bool(members)

    def kill(self) -> None:
        """SIGKILL the group now (does not wait)."""
        if not self.gone:
            self._send("kill")

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self.gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
        return True

    def terminate(
        self, leader_grace_s: float | None = None, group_grace_s: float | None = None
    ) -> int | None:
        """Stop the group the staged way and wait until it is gone; the exit status.

        A KeyboardInterrupt while waiting (a second Ctrl-C) turns the stop into a SIGKILL
        and is re-raised once the group is gone.  After :func:`hurry` the graces are
        skipped.
        """
        if self.gone:
            self._close()
            return self._code
        lg = self.leader_grace_s if leader_grace_s is None else leader_grace_s
        gg = self.group_grace_s if group_grace_s is None else group_grace_s
        if _HURRY.is_set():
            self._send("kill")
        else:
            self._send(f"stop {lg:g} {gg:g}")
        try:
            if not self.wait_gone(lg + gg + 20.0):
                self._send("kill")
                self.wait_gone(15.0)
        except KeyboardInterrupt:
            self._send("kill")
            self.wait_gone(15.0)
            self._close()
            raise
        self._close()
        return self._code

    def _close(self) -> None:
        try:
            assert self._sup.stdin is not None
            self._sup.stdin.close()  # EOF: a supervisor still running stops its group
        except (OSError, ValueError):
            pass
        try:
            self._sup.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        _LIVE.discard(self)

    def __repr__(self) -> str:
        return f"Supervised(pid={self.pid}, argv0={self.argv[0]!r}, gone={self.gone})"
