"""The supervisor: a tiny parent process between pytest and every server it starts.

Why a process of its own.  pytest can die without running any teardown: ``kill -9``, the
OOM killer (a load client holding a million records is a likely victim), an xdist worker
killed by its controller.  A server started directly by pytest is then re-parented to init
and keeps all eight GPUs until someone logs in.  ``PR_SET_PDEATHSIG`` on the server reaches
only that one process (SGLang's schedulers are its children) and fires when the *thread*
that forked exits, and it exists only on Linux.  So pytest starts this supervisor instead
(``python -I .../supervisor.py``, in a session of its own), and the supervisor starts the
server in a process group of its own and

* watches pytest through its stdin pipe: EOF without a ``stop`` first means pytest is gone
  (however it died), and the supervisor stops the group the graceful way
  (:class:`procgroup.StagedStop`) and exits.  This works on every POSIX system and for a
  server that forks its own children;
* copies the server's stdout/stderr to the log **scrubbed** of secrets (the API key is on
  SGLang's command line and in the ServerArgs it logs at start), line by line and at once,
  so readiness detection from the log still works and the server never blocks on a full
  pipe;
* records what it started under ``.kimi/servers/`` and removes the record once the group is
  gone, so a later run can find a server whose supervisor was killed too
  (``leftovers.py``);
* sets ``PR_SET_PDEATHSIG(SIGTERM)`` on the server's main process (Linux): should the
  supervisor itself be SIGKILLed, SGLang still gets the SIGTERM it shuts down cleanly on
  (and its scheduler processes carry their own death signal tied to it:
  ``sglang/srt/utils/common.py`` ``kill_itself_when_parent_died``).

Protocol.  stdin: one JSON line of configuration, then commands ``stop LEADER_GRACE
GROUP_GRACE`` and ``kill``; EOF = parent gone.  stdout: JSON lines ``started`` (pid),
``error`` (could not run the command), ``exited`` (the leader's exit status) and ``gone``
(the whole group is gone; the last line).

:class:`Supervised` is the parent's side; it is what the launcher and the simulator use.
Standard library only: the script loads ``procgroup.py``, ``../scrub.py`` and ``../files.py``
by path.
"""

from __future__ import annotations

import json
import os
import selectors
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

if __package__:
    from pytest_kimi import files as _files
    from pytest_kimi import scrub as _scrub
    from pytest_kimi.server import procgroup
else:  # run as a script: load the siblings by path, never the pytest_kimi package
    import importlib.util

    def _load(name: str, path: Path) -> Any:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    _HERE = Path(__file__).resolve().parent
    procgroup = _load("_kimi_procgroup", _HERE / "procgroup.py")
    _scrub = _load("_kimi_scrub", _HERE.parent / "scrub.py")
    _files = _load("_kimi_files", _HERE.parent / "files.py")

__all__ = ["Supervised", "SupervisorError", "hurry", "kill_all", "live"]

SCRIPT = Path(__file__).resolve()
TICK_S = 0.1
"""How often the supervisor looks at the server when nothing was written: bounds how late
a crash is reported."""
STRAY_SCAN_S = 5.0
"""How often the tree outside the process group is looked for when no child ended: each
look reads all of ``/proc``, so not at every tick."""
MAX_PARTIAL = 65536
"""Bytes of an unterminated line held back for scrubbing before they are written anyway."""


class SupervisorError(RuntimeError):
    """The supervisor could not be started or stopped talking."""


# ====================================================================== the supervisor


def _pdeathsig_fn(sig: int) -> Any:
    """A preexec_fn giving the child ``sig`` when this (single-threaded) process dies; None
    off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, sig, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return preexec


class _Supervisor:
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.cfg = cfg
        self.secrets = [s for s in cfg.get("secrets") or () if s]
        self.notes = bool(cfg.get("notes", True))
        log = cfg.get("log")
        self.log = open(log, "ab", buffering=0) if log else None
        self.partial = b""
        self.proc: subprocess.Popen[bytes] | None = None
        self.code: int | None = None
        self.stopper: Any = None
        self.term_signal = 0
        self.record = cfg.get("record")
        self.subreaper = False
        """Whether orphans of the server's tree re-parent to this process (Linux), so that
        the ones that left the process group can still be found and stopped."""
        self.strays_stopped: dict[int, str] = {}
        """Processes outside the group this supervisor had to stop (pid: program name)."""
        self._recorded_strays: list[dict[str, Any]] = []
        self._last_strays: list[int] = []
        self._next_stray_scan = 0.0

    # -- output ------------------------------------------------------------------------

    def emit(self, **event: Any) -> None:
        try:
            os.write(1, (json.dumps(event) + "\n").encode())
        except OSError:
            pass  # the parent is gone; carry on stopping the server

    def note(self, text: str) -> None:
        if self.notes:
            self.write_log(f"# pytest-kimi supervisor: {text}\n".encode())

    def write_log(self, data: bytes) -> None:
        if self.log is not None:
            try:
                self.log.write(data)
            except OSError:
                pass

    def pump(self, data: bytes, final: bool = False) -> None:
        """Scrub complete lines (``\\n`` or ``\\r``: progress bars) and append them."""
        buf = self.partial + data
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        if final or len(buf) - cut > MAX_PARTIAL:
            cut = len(buf)
        done, self.partial = buf[:cut], buf[cut:]
        if done:
            text = done.decode("utf-8", "replace")
            lines = text.splitlines(keepends=True)
            out = "".join(_scrub.scrub_text(line, self.secrets) for line in lines)
            self.write_log(out.encode("utf-8"))

    # -- record ------------------------------------------------------------------------

    def write_record(self, pid: int) -> None:
        if not self.record:
            return
        info = dict(self.cfg.get("record_info") or {})
        info.update(
            pid=pid,
            pgid=pid,
            starttime=procgroup.process_starttime(pid),
            supervisor_pid=os.getpid(),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            command=_scrub.scrub_argv(list(self.cfg["argv"]), self.secrets),
            log=self.cfg.get("log"),
        )
        path = Path(self.record)
        try:
            # no fsync: a machine crash that loses the record ends the server too; but a later
            # run's leftovers.py must never read half a record
            _files.write_atomic(path, json.dumps(info, indent=1) + "\n", fsync=False)
        except OSError as exc:
            self.note(f"cannot write {path}: {exc}")

    def update_record_strays(self, strays: list[int]) -> None:
        """Keep the strays (pid and start time) in the record, so that a later run can stop
        them too should this supervisor be SIGKILLed (they then re-parent to PID 1)."""
        self._last_strays = list(strays)
        if not self.record:
            return
        entries = [{"pid": p, "starttime": procgroup.process_starttime(p)} for p in strays]
        if entries == self._recorded_strays:
            return
        self._recorded_strays = entries
        try:
            info = json.loads(Path(self.record).read_text(encoding="utf-8"))
            info["strays"] = entries
            _files.write_atomic(Path(self.record), json.dumps(info, indent=1) + "\n", fsync=False)
        except (OSError, ValueError) as exc:
            self.note(f"cannot update {self.record}: {exc}")

    def remove_record(self) -> None:
        if self.record:
            try:
                os.unlink(self.record)
            except OSError:
                pass

    # -- lifecycle ---------------------------------------------------------------------

    def spawn(self) -> int | None:
        cfg = self.cfg
        r, w = os.pipe()
        stdout_fd = cfg.get("stdout_fd")
        try:
            self.proc = subprocess.Popen(
                list(cfg["argv"]),
                stdin=subprocess.DEVNULL,
                stdout=stdout_fd if stdout_fd is not None else w,
                stderr=w,
                env=cfg.get("env"),
                cwd=cfg.get("cwd"),
                start_new_session=True,
                close_fds=True,
                preexec_fn=_pdeathsig_fn(signal.SIGTERM),
            )
        except OSError as exc:
            os.close(r)
            os.close(w)
            self.emit(event="error", message=str(exc), errno=exc.errno)
            return None
        finally:
            if stdout_fd is not None:
                try:
                    os.close(stdout_fd)
                except OSError:
                    pass
        os.close(w)
        self.write_record(self.proc.pid)
        self.emit(
            event="started", pid=self.proc.pid, starttime=procgroup.process_starttime(self.proc.pid)
        )
        return r

    # -- the tree outside the group ----------------------------------------------------

    def strays(self, table: dict[int, tuple[int, int, bytes]] | None = None) -> list[int]:
        """Live processes of the server's tree outside its process group: descendants of
        this (subreaper) process whose group is not the server's.  Empty without a
        subreaper: orphans then re-parent to PID 1 and cannot be told from strangers."""
        if not self.subreaper or self.proc is None:
            return []
        table = table if table is not None else procgroup.process_table()
        if table is None:
            return []
        found = procgroup.descendants(os.getpid(), table) or []
        return [pid for pid in found if table[pid][1] != self.proc.pid]

    def reap_orphans(self, table: dict[int, tuple[int, int, bytes]] | None = None) -> None:
        """Collect the exit status of re-parented orphans that ended (not the leader's:
        its unreaped zombie keeps its pid, the group's id, from being reused)."""
        if not self.subreaper or self.proc is None:
            return
        table = table if table is not None else (procgroup.process_table() or {})
        me = os.getpid()
        for pid, (ppid, _pgrp, state) in table.items():
            if ppid == me and state == b"Z" and pid != self.proc.pid:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def look_at_strays(self) -> list[int]:
        """One read of ``/proc``: ended orphans reaped, the live strays recorded and
        returned."""
        table = procgroup.process_table() if self.subreaper else None
        if table is not None:
            self.reap_orphans(table)
        strays = self.strays(table) if table is not None else []
        self.update_record_strays(strays)
        return strays

    def tree_ended(self, scan: bool) -> bool:
        """Whether nothing of the server runs any more: its group is empty and no stray is
        left.  Strays are looked at when ``scan`` says it is time, and always before an
        end is declared (never on what an earlier look saw: a daemon may have been forked
        since); while the last look saw strays and it is not time, the answer is no."""
        assert self.proc is not None
        if procgroup.group_members(self.proc.pid):
            return False
        if not scan and self._last_strays:
            return False
        return not self.look_at_strays()

    def leader_gone(self) -> bool:
        assert self.proc is not None
        if self.code is None:
            code = procgroup.exit_status(self.proc.pid)
            if code is not None:
                self.code = code
                self.emit(event="exited", code=code)
        return self.code is not None

    def begin_stop(self, leader_grace: float, group_grace: float, why: str | None) -> None:
        assert self.proc is not None
        if self.stopper is not None:
            return
        if why:
            self.note(why)
        self.stopper = procgroup.StagedStop(
            self.proc.pid,
            self.proc.pid,
            leader_grace_s=leader_grace,
            group_grace_s=group_grace,
            leader_gone=self.leader_gone,
            note=self.note,
            strays=self.strays,
        )
        self.stopper.start()

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "stop":
            try:
                lg, gg = float(words[1]), float(words[2])
            except (IndexError, ValueError):
                lg, gg = self.default_graces()
            self.begin_stop(lg, gg, None)
        elif words[0] == "kill":
            self.begin_stop(0, 0, None)
            self.stopper.kill()

    def default_graces(self) -> tuple[float, float]:
        return float(self.cfg.get("leader_grace_s", 60)), float(self.cfg.get("group_grace_s", 30))

    def run(self, ctl_buf: bytes) -> int:
        self.subreaper = procgroup.become_subreaper()
        out_fd = self.spawn()
        if out_fd is None:
            return 3
        assert self.proc is not None
        parent = self.cfg.get("parent_pid")
        sel = selectors.DefaultSelector()
        sel.register(out_fd, selectors.EVENT_READ, "out")
        sel.register(0, selectors.EVENT_READ, "ctl")
        # SIGCHLD wakes the loop at once: a crash is reported within milliseconds.
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        ctl_open = True
        stopped_ok = False
        for line in ctl_buf.decode().splitlines():
            self.command(line)
        try:
            while True:
                child_event = False
                for key, _ in sel.select(TICK_S):
                    if key.data == "wake":
                        child_event = True  # SIGCHLD: a process of the tree may have ended
                        try:
                            os.read(wake_r, 4096)
                        except OSError:
                            pass
                    elif key.data == "out":
                        try:
                            data = os.read(out_fd, 65536)
                        except OSError:
                            data = b""
                        if data:
                            self.pump(data)
                        else:
                            sel.unregister(out_fd)
                            self.pump(b"", final=True)
                    else:
                        try:
                            data = os.read(0, 4096)
                        except OSError:
                            data = b""
                        if not data:
                            sel.unregister(0)
                            ctl_open = False
                            if self.stopper is None:
                                lg, gg = self.default_graces()
                                self.begin_stop(
                                    lg,
                                    gg,
                                    f"the process that started this "
                                    f"server (pid {parent}) is gone; stopping it",
                                )
                        else:
                            ctl_buf += data
                            while b"\n" in ctl_buf:
                                raw, ctl_buf = ctl_buf.split(b"\n", 1)
                                self.command(raw.decode("utf-8", "replace"))
                if self.term_signal and self.stopper is None:
                    lg, gg = self.default_graces()
                    self.begin_stop(lg, gg, f"got signal {self.term_signal}; stopping the server")
                gone = self.leader_gone()
                # the tree outside the group is looked at when a child ended and every
                # STRAY_SCAN_S besides (one read of /proc each), not at every tick
                now = time.monotonic()
                scan = child_event or now >= self._next_stray_scan
                if scan:
                    self._next_stray_scan = now + STRAY_SCAN_S
                if self.stopper is not None:
                    if self.stopper.step():
                        stopped_ok = True
                        break
                elif gone and self.tree_ended(scan):
                    break  # ended by itself, nothing left in its group or outside it
                elif scan and not gone:
                    self.look_at_strays()
        finally:
            procgroup.signal_group(self.proc.pid, signal.SIGKILL)  # no-op when empty
            for pid in self.strays():  # whatever left the group and is still there
                self.strays_stopped.setdefault(pid, procgroup.describe_pids([pid]))
                procgroup.signal_pid(pid, signal.SIGKILL)
            try:
                code = self.proc.wait(timeout=10)
                if self.code is None:
                    self.code = code
                    self.emit(event="exited", code=code)
            except subprocess.TimeoutExpired:
                pass  # unkillable (uninterruptible sleep in a driver)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and (
                procgroup.group_members(self.proc.pid) or self.strays()
            ):
                self.reap_orphans()
                time.sleep(0.02)
            self.reap_orphans()
            # Whatever the group wrote last (a traceback) still reaches the log.
            deadline = time.monotonic() + 1.0
            while out_fd in [k.fd for k in sel.get_map().values()] and time.monotonic() < deadline:
                if sel.select(0.1):
                    try:
                        data = os.read(out_fd, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        break
                    self.pump(data)
            self.pump(b"", final=True)
            self.remove_record()
            killed = bool(self.stopper is not None and self.stopper.killed)
            if self.stopper is not None:
                self.strays_stopped = {**self.stopper.stray_pids, **self.strays_stopped}
            stopped = sorted(self.strays_stopped.items())
            strays = [{"pid": p, "name": n} for p, n in stopped]
            if stopped:
                self.note(
                    "stopped processes that had left the server's process group: "
                    + ", ".join(n for _, n in stopped)
                )
            survivors = self.strays() + (procgroup.group_members(self.proc.pid) or [])
            self.emit(
                event="gone", code=self.code, killed=killed, strays=strays, survivors=survivors
            )
        del ctl_open, stopped_ok
        return 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is pytest's to handle
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal must not orphan the server
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(0, 65536)
        if not chunk:
            return 2  # the parent died before it said what to run
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    sup = _Supervisor(json.loads(line))

    def on_term(signum: int, _frame: Any) -> None:
        sup.term_signal = signum

    signal.signal(signal.SIGTERM, on_term)
    return sup.run(rest)


# ====================================================================== the parent's side

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


if __name__ == "__main__":
    sys.exit(main())
