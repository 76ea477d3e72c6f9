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

:class:`~pytest_kimi.server.supervised.Supervised` (:mod:`.supervised`) is the parent's side;
it is what the launcher and the simulator use.  This file is the supervisor process itself,
run as a script.  Standard library only: the script loads ``procgroup.py``, ``../scrub.py``
and ``../files.py`` by path.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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

__all__ = ["main"]

TICK_S = 0.1
"""How often the supervisor looks at the server when nothing was written: bounds how late
a crash is reported."""
STRAY_SCAN_S = 5.0
"""How often the tree outside the process group is looked for when no child ended: each
look reads all of ``/proc``, so not at every tick."""
MAX_PARTIAL = 65536
"""Bytes of an unterminated line held back for scrubbing before they are written anyway."""


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


if __name__ == "__main__":
    sys.exit(main())
