"""Process groups: who is in one, how to stop one the graceful way, how to tell a pid is ours.

Shared by the supervisor (``supervisor.py``, the parent of every managed server and of the
simulator), by the clean-up of servers an earlier run left behind (``leftovers.py``) and by
the launcher.  Standard library only and no relative imports: the supervisor loads this file
by path, so that starting it costs a bare interpreter, not an import of pytest.

The stop is staged the way a multi-process inference server wants it (see
:class:`StagedStop`): SIGTERM to the **leader** alone first, because SGLang's main process
drains and then shuts its schedulers down itself (``sglang/srt/managers/tokenizer_manager.py``,
``sigterm_watchdog``: ShutdownReq to the schedulers, wait for them to release the GPU memory,
then ``kill_process_tree``); a SIGTERM to every rank at once, or a SIGKILL mid-release, is how
GPU memory survives a shutdown.  Only then the whole group gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

__all__ = [
    "DEAD_LEADER_GRACE_S",
    "StagedStop",
    "become_subreaper",
    "descendants",
    "describe_pids",
    "exit_status",
    "group_members",
    "nice_session",
    "pid_alive",
    "port_listeners",
    "process_starttime",
    "process_table",
    "signal_group",
    "signal_pid",
]

DEAD_LEADER_GRACE_S = 3.0
"""Grace for the children of a leader that already died: nothing is left to shut down
cleanly, and a start error should not wait the full stop timeout."""


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the command name: [state, ppid, pgrp, ...]; None if gone
    or where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ..."; comm may contain spaces and parentheses.
    return stat[stat.rfind(b")") + 2 :].split()


PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option (Linux 3.4+, ``<linux/prctl.h>``)."""


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); whether it is.

    Why: a server's tree can leave its process group, and so the reach of ``killpg``: a
    helper started with ``setsid``, a server that daemonises (fork, ``setsid``, fork, the
    parent exits).  Without this such a process re-parents to PID 1 and outlives the run,
    holding the GPUs and the port, and nothing names it any more.  With it, every orphan of
    the tree re-parents to this process instead, so :func:`descendants` still finds it and
    the stop ends it.  Not inherited across ``fork``: only the supervisor holds it.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, int, bytes]] | None:
    """``{pid: (ppid, pgrp, state)}`` of every process (one read of ``/proc``), None where
    there is no ``/proc``.  What :func:`descendants` walks: one scan, whatever the tree."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table: dict[int, tuple[int, int, bytes]] = {}
    for name in names:
        if not name.isdigit():
            continue
        rest = _stat_fields(int(name))
        if rest and len(rest) >= 3:
            try:
                table[int(name)] = (int(rest[1]), int(rest[2]), rest[0])
            except ValueError:
                continue
    return table


def descendants(
    root: int, table: dict[int, tuple[int, int, bytes]] | None = None
) -> list[int] | None:
    """Live (non-zombie) descendants of ``root``, at any depth; None without ``/proc``."""
    if table is None:
        table = process_table()
        if table is None:
            return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgrp, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(children.get(root, ()))
    seen = {root}
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if table[pid][2] not in (b"Z", b"X"):
            out.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(out)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            raw = f.read(64).strip()
    except OSError:
        return "?"
    # the program names itself: shown escaped, never as control characters
    return "".join(c if c.isprintable() else "?" for c in raw.decode("utf-8", "replace"))


def describe_pids(pids: Iterable[int]) -> str:
    """``1234 (sleep), 1240 (python3)``: pids with their program names, for a warning."""
    return ", ".join(f"{pid} ({_comm(pid)})" for pid in pids)


def port_listeners(port: int) -> list[int] | None:
    """Processes with a TCP socket listening on ``port`` (any address, IPv4 or IPv6) whose
    descriptors this process may read (its own user's); None where there is no ``/proc``.

    The last sweep after a stop: what still holds the server's port was started outside
    the tree the stop could see (through a service manager, or before a subreaper existed).
    """
    inodes: set[bytes] = set()
    found_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, "rb") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        found_table = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != b"0A":  # 0A: LISTEN
                continue
            try:
                if int(fields[1].rsplit(b":", 1)[1], 16) == port:
                    inodes.add(fields[9])
            except (IndexError, ValueError):
                continue
    if not found_table:
        return None
    if not inodes:
        return []
    wanted = {b"socket:[" + inode + b"]" for inode in inodes}
    out: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}").encode() in wanted:
                    out.append(int(name))
                    break
            except OSError:
                continue
    return sorted(out)


def have_proc() -> bool:
    return os.path.isdir("/proc/self")


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes in group ``pgid``; None where /proc is unavailable.

    Zombies are skipped: a killed grandchild reparented to an init that does not reap
    (common in containers) would otherwise look alive forever.
    """
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    out: list[int] = []
    want = str(pgid).encode()
    for name in names:
        if not name.isdigit():
            continue
        rest = _stat_fields(int(name))
        if rest and len(rest) >= 3 and rest[0] not in (b"Z", b"X") and rest[2] == want:
            out.append(int(name))
    return out


AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"


def nice_session(pid: int, nice: int, switch: str = AUTOGROUP_SWITCH) -> str | None:
    """Lower the CPU share of the whole session ``pid`` leads; a note for its log, or None.

    Why ``nice -n`` is not enough: with the kernel's autogroup scheduling (Linux,
    ``sched_autogroup_enabled`` = 1, the default of most distributions) the CPU is shared
    between *sessions* first, and a process's own nice only weighs against the other
    processes of its session.  A managed server runs in a session of its own (so that its
    whole tree can be stopped), so its nice was void against the load client: measured with
    vLLM's CPU build at nice 10 on 2 cores, an idle process elsewhere that slept 5 ms at a
    time woke up to 2 s late (the plugin read that as a stalled client and voided the
    trials); with the session's autogroup at nice 19 it woke at most 7 ms late.  The
    autogroup's nice (``/proc/PID/autogroup``) is what weighs against other sessions, and
    later children of the server join its session, hence its autogroup, by themselves.
    """
    try:
        with open(switch) as f:
            if f.read().strip() != "1":
                return None
    except OSError:
        return None  # not Linux, or a kernel without autogroup: plain nice already counts
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError as exc:
        return f"cannot set the nice of the server's session (autogroup) to {nice}: {exc}"
    return f"nice {nice} for the server's whole session (its autogroup), not only its process"


def process_starttime(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    With the pid it names one process for the life of the machine: a recorded pid whose
    start time differs has been reused by a stranger.  None where there is no /proc.
    """
    rest = _stat_fields(pid)
    if rest is None or len(rest) < 20:
        return None
    try:
        return int(rest[19])
    except ValueError:
        return None


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (dead, not yet reaped) is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    rest = _stat_fields(pid)
    if rest is None:
        return not have_proc()  # no /proc: trust kill(0); with /proc: it just vanished
    return rest[0] not in (b"Z", b"X")


def exit_status(pid: int) -> int | None:
    """Exit status of our child ``pid`` without reaping it (negative: killed by that
    signal); None while it runs.  The unreaped zombie keeps the pid (and so the process
    group id) from being reused, so a later group signal cannot reach a stranger."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -1  # reaped elsewhere; the status is lost
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class StagedStop:
    """Stop a process group: leader SIGTERM, ``leader_grace_s``; group SIGTERM,
    ``group_grace_s``; group SIGKILL.

    A state machine (call :meth:`step` every tick until it returns True) so that the
    supervisor can keep copying the server's output to the log while it stops it.  Each
    phase ends early once the group is empty; the leader phase also ends when the leader
    exits (its children then get the group SIGTERM).  ``leader_gone`` says whether the
    leader exited (``exit_status`` for a child, ``not pid_alive`` for a leftover).
    """

    def __init__(
        self,
        leader: int,
        pgid: int,
        *,
        leader_grace_s: float,
        group_grace_s: float,
        leader_gone: Callable[[], bool],
        note: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        strays: Callable[[], list[int]] | None = None,
    ) -> None:
        self.leader = leader
        self._strays = strays
        """The tree's live processes *outside* the group (they left it with ``setsid``):
        signalled one by one with the group's SIGTERM and SIGKILL."""
        self.stray_pids: dict[int, str] = {}
        """Every stray that got a signal, with its program name: what a warning names."""
        self.pgid = pgid
        self.leader_grace_s = max(0.0, leader_grace_s)
        self.group_grace_s = max(0.0, group_grace_s)
        self._leader_gone = leader_gone
        self._note = note or (lambda _msg: None)
        self._clock = clock
        self.phase = "new"
        self._deadline = 0.0
        self.killed = False
        """Whether SIGKILL was needed (some process ignored or outlived its SIGTERM)."""

    def _strays_now(self) -> list[int]:
        return self._strays() if self._strays is not None else []

    def _signal_strays(self, sig: int) -> list[int]:
        strays = self._strays_now()
        for pid in strays:
            if pid not in self.stray_pids:
                self.stray_pids[pid] = describe_pids([pid])
            signal_pid(pid, sig)
        return strays

    def _empty(self) -> bool:
        members = group_members(self.pgid)
        if members is None:
            return self._leader_gone() and not self._strays_now()
        return not members and not self._strays_now()

    def _enter(self, phase: str) -> None:
        self.phase = phase
        now = self._clock()
        if phase == "leader":
            signal_pid(self.leader, signal.SIGTERM)
            self._deadline = now + self.leader_grace_s
            self._note(
                f"sent SIGTERM to the main process {self.leader}; it has "
                f"{self.leader_grace_s:g} s to shut down"
            )
        elif phase == "group":
            signal_group(self.pgid, signal.SIGTERM)
            strays = self._signal_strays(signal.SIGTERM)
            grace = self.group_grace_s
            self._deadline = now + grace
            self._note(f"sent SIGTERM to process group {self.pgid}; {grace:g} s until SIGKILL")
            if strays:
                self._note(
                    f"sent SIGTERM to processes that left the group: {describe_pids(strays)}"
                )
        elif phase == "kill":
            if not self._empty():
                self.killed = True
                self._note(f"sent SIGKILL to process group {self.pgid}")
            signal_group(self.pgid, signal.SIGKILL)
            strays = self._signal_strays(signal.SIGKILL)
            if strays:
                self._note(
                    f"sent SIGKILL to processes that left the group: {describe_pids(strays)}"
                )
            self.phase = "done"

    def start(self) -> None:
        if self.phase != "new":
            return
        if self._empty():
            self.phase = "done"
        elif self._leader_gone():
            self.group_grace_s = min(self.group_grace_s, DEAD_LEADER_GRACE_S)
            self._enter("group")
        else:
            self._enter("leader")

    def kill(self) -> None:
        """Skip the graces: SIGKILL the group now."""
        if self.phase != "done":
            self._enter("kill")

    def step(self) -> bool:
        """Advance; True once the group got its final signal or is empty."""
        if self.phase == "new":
            self.start()
        if self.phase == "done":
            return True
        if self._empty():
            self.phase = "done"
            return True
        if self.phase == "leader" and (self._leader_gone() or self._clock() >= self._deadline):
            self._enter("group")
        elif self.phase == "group" and self._clock() >= self._deadline:
            self._enter("kill")
        return self.phase == "done"

    def run(self, tick_s: float = 0.1, should_kill: Callable[[], bool] = lambda: False) -> None:
        """Blocking form (for processes that are not our children)."""
        self.start()
        while not self.step():
            if should_kill():
                self.kill()
                break
            time.sleep(tick_s)
        deadline = self._clock() + 5.0  # SIGKILLed members vanish once they are reaped
        while self._clock() < deadline and not self._empty():
            time.sleep(0.05)
