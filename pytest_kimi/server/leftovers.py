"""Servers an earlier run left behind: found through their records in ``.kimi/servers/``.

The supervisor (``supervisor.py``) writes one JSON record per server it starts (pid, process
group, start time, command with secrets redacted, port, the run that owns it) and removes it
once the group is gone.  A record that is still there at the next start means the
supervisor itself did not finish: it was SIGKILLed together with pytest (``kill -9`` of the
whole process group, a container's cgroup OOM kill) or the machine rebooted.  Before a new
server is started, :func:`clear` looks at every record:

* the process is gone, or the pid now belongs to another program (its start time differs):
  the record is stale and removed;
* the server still runs and the run that started it is gone: it is stopped the graceful way
  (leader SIGTERM, grace, group SIGTERM, grace, SIGKILL) with a message saying so, and so
  is every process the record lists as having left the group (``strays``: a ``setsid``
  helper, a daemonised server; the supervisor, their subreaper, keeps that list current),
  each only while its pid still names the process recorded (its start time);
* the server still runs and the run that started it **is still running** (another pytest in
  the same checkout), or the identity cannot be checked (no ``/proc``): nothing is touched,
  and :class:`LeftoverServer` refuses the new start, naming the pid and how to stop it.

Never two servers side by side: on an 8-GPU box the second one fails with out-of-memory
minutes later, after loading weights, which is the expensive way to learn about the first.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_kimi.server import procgroup

__all__ = ["LeftoverServer", "clear", "describe", "live_records", "record_path"]


class LeftoverServer(RuntimeError):
    """A recorded server still runs and cannot safely be stopped by this run."""


def record_path(directory: Path, name: str, token: str) -> Path:
    return directory / f"{name}-{token}.json"


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def _same_process(pid: int | None, starttime: Any) -> bool | None:
    """True/False when ``pid`` is/is not the process started at ``starttime``; None when
    this cannot be told (no /proc, or no start time recorded)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not procgroup.pid_alive(pid):
        return False
    now = procgroup.process_starttime(pid)
    if now is None or not isinstance(starttime, int):
        return None
    return now == starttime


def _live_strays(rec: dict[str, Any]) -> list[int]:
    """The recorded strays (processes that had left the server's group; the supervisor
    keeps them in the record) that are still the processes recorded: pid and start time
    both match, so a reused pid is never touched."""
    out: list[int] = []
    for entry in rec.get("strays") or ():
        if not isinstance(entry, dict):
            continue
        pid, started = entry.get("pid"), entry.get("starttime")
        if isinstance(pid, int) and isinstance(started, int) and _same_process(pid, started):
            out.append(pid)
    return out


def _stop_strays(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM, up to ``grace_s``, SIGKILL; the pids still alive after a last short wait."""
    for pid in pids:
        procgroup.signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(procgroup.pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if procgroup.pid_alive(pid):
            procgroup.signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(procgroup.pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if procgroup.pid_alive(p)]


def describe(rec: dict[str, Any]) -> str:
    parts = [
        f"server {rec.get('name', '?')!r} (pid {rec['pid']}, process group "
        f"{rec.get('pgid', rec['pid'])}"
    ]
    if rec.get("port"):
        parts.append(f", port {rec['port']}")
    if rec.get("started_at"):
        parts.append(f", started {rec['started_at']}")
    if rec.get("owner_pid"):
        parts.append(f" by pid {rec['owner_pid']}")
    parts.append(")")
    command = rec.get("command")
    if isinstance(command, list) and command:
        parts.append(f": {' '.join(map(str, command))[:300]}")
    return "".join(parts)


def live_records(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Records whose server may still run; stale ones are removed on the way."""
    out = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        rec = _load(path)
        if rec is None or _same_process(rec["pid"], rec.get("starttime")) is False:
            # unreadable, or its process is gone; its group may still hold members, and
            # what left the group may still run
            if rec is not None and (
                procgroup.group_members(int(rec.get("pgid", rec["pid"]))) or _live_strays(rec)
            ):
                out.append((path, rec))
                continue
            try:
                path.unlink()
            except OSError:
                pass
            continue
        out.append((path, rec))
    return out


def clear(
    directory: Path,
    progress: Callable[[str], None] | None = None,
    *,
    refuse_when_owner_alive: bool = True,
) -> list[str]:
    """Stop servers left by runs that are gone; refuse (raise) where that is not safe.

    Returns the messages given to ``progress``.
    """
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        if progress is not None:
            progress(text)

    me = os.getpid()
    for path, rec in live_records(directory):
        pid = int(rec["pid"])
        pgid = int(rec.get("pgid", pid))
        owner = rec.get("owner_pid")
        owner_alive = (
            isinstance(owner, int)
            and owner != me
            and _same_process(owner, rec.get("owner_starttime")) is not False
        )
        if owner == me:
            continue  # ours, still being managed by this process
        same = _same_process(pid, rec.get("starttime"))
        how = (
            f"stop it with `kill -TERM {pid}` (its main process shuts the rest down), "
            f"then `kill -KILL -- -{pgid}` if the group outlives its grace; then delete "
            f"{path}"
        )
        if owner_alive:
            if not refuse_when_owner_alive:
                continue
            raise LeftoverServer(
                f"{describe(rec)} is still running, started by pid {owner} which is still "
                f"running too (another pytest session in this directory?); not starting a "
                f"second server beside it. Wait for that run to end, or {how}"
            )
        if same is None:
            raise LeftoverServer(
                f"{describe(rec)} was left by an earlier run and may still be running; its "
                f"identity cannot be checked here (no /proc), so it is not stopped "
                f"automatically. {how[0].upper()}{how[1:]}"
            )
        leader_grace = float(rec.get("leader_grace_s", 60.0))
        group_grace = float(rec.get("group_grace_s", 30.0))
        say(
            f"found {describe(rec)}, left running by an earlier run (pid {owner}, gone); "
            f"stopping it before starting another (up to {leader_grace + group_grace:g} s)"
        )
        started = rec.get("starttime")

        def leader_gone(p: int = pid, s: Any = started) -> bool:
            return _same_process(p, s) is False

        stopper = procgroup.StagedStop(
            pid,
            pgid,
            leader_grace_s=leader_grace,
            group_grace_s=group_grace,
            leader_gone=leader_gone,
        )
        stopper.run()
        strays = _live_strays(rec)
        if strays:
            say(
                f"stopping what the leftover server had detached from its process group: "
                f"{procgroup.describe_pids(strays)}"
            )
        left = (procgroup.group_members(pgid) or []) + _stop_strays(strays, group_grace)
        if left:
            raise LeftoverServer(
                f"{describe(rec)} could not be stopped: processes {left} of "
                f"its tree survive SIGKILL (stuck in the driver?)"
            )
        say(f"stopped the leftover server (pid {pid})")
        try:
            path.unlink()
        except OSError:
            pass
    return said
