"""No process of a profile survives its session, not even one that left its process group.

A tester's managed profile whose command detached a helper with ``setsid``, and an external
profile whose ``start:`` daemonised the server into its own session, left those processes
running under PID 1 after a passing session, with no warning (on a GPU host: a server
holding the GPUs and the port).  ``killpg`` cannot reach a process that left the group, and
once its parent is gone nothing names it.  The supervisor is now the tree's subreaper
(``procgroup.become_subreaper``): orphans re-parent to it, the stop finds every descendant
outside the group and ends it too, and a warning names each pid.

Each case records the pids of the processes that leave the group (a helper writes its own
pid to a file before it ``exec``s), and after the session or the stop checks those very pids.
A finalizer SIGKILLs every recorded pid, so a failing test leaks nothing either.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kimi.server import leftovers
from pytest_kimi.server.launcher import open_server
from pytest_kimi.server.ports import _free_port
from pytest_kimi.server.server_base import ServerProcessWarning
from pytest_kimi.server.procgroup import (
    descendants,
    pid_alive,
    port_listeners,
    process_starttime,
)
from pytest_kimi.server.profile import load_profile
from pytest_kimi.server.supervised import Supervised
from support.timing import SESSION_S, poll_until
from support.paths import REPO

FAKE = REPO / "tests" / "fake_sglang"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a subreaper and /proc are Linux's"
)


def _helper(pid_file: Path, seconds: int) -> str:
    """Shell words for a process that leaves the group (``setsid``) and names itself."""
    return f"setsid sh -c 'echo $$ > {pid_file}; exec sleep {seconds}' </dev/null >/dev/null 2>&1"


def _detaching(tmp: Path) -> tuple[str, Path, Path]:
    """A shell prologue that leaves two processes outside its group: a ``setsid`` child
    (its parent stays: the server) and a daemon (``setsid`` in a subshell that exits at
    once, so the daemon is orphaned: with no subreaper it would re-parent to PID 1)."""
    child, daemon = tmp / "setsid-child.pid", tmp / "daemon.pid"
    prologue = f"{_helper(child, 100001)} & ( {_helper(daemon, 100002)} & ) ;"
    return prologue, child, daemon


def _pid(path: Path) -> int:
    text = poll_until(lambda: path.exists() and path.read_text().strip(), f"{path.name} written")
    return int(text)


@pytest.fixture
def killer() -> Iterator[Callable[[int], None]]:
    """Register pids to SIGKILL at the end, whatever the outcome."""
    pids: list[int] = []
    yield pids.append
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_this_machine_has_a_subreaper() -> None:
    """What every test below stands on: Linux grants ``PR_SET_CHILD_SUBREAPER`` to an
    unprivileged process (checked in a child, which must not keep it)."""
    code = (
        "import sys; from pytest_kimi.server.procgroup import become_subreaper; "
        "sys.exit(0 if become_subreaper() else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ------------------------------------------------------------------ the supervisor


def test_processes_that_left_the_group_are_stopped_and_named(
    tmp_path: Path, killer: Callable[[int], None]
) -> None:
    prologue, child_file, daemon_file = _detaching(tmp_path)
    log = tmp_path / "server.log"
    group = Supervised(
        ["/bin/sh", "-c", f"{prologue} exec sleep 100003"],
        log_path=log,
        leader_grace_s=1.0,
        group_grace_s=1.0,
    )
    child, daemon = _pid(child_file), _pid(daemon_file)
    for pid in (child, daemon):
        killer(pid)
    # the daemon's parent exited: it is the supervisor's now, not PID 1's
    poll_until(
        lambda: daemon in (descendants(group.supervisor_pid) or []), "the daemon re-parented"
    )
    assert os.getpgid(child) != group.pgid and os.getpgid(daemon) != group.pgid
    group.terminate()
    assert not pid_alive(child) and not pid_alive(daemon)
    assert sorted(s["pid"] for s in group.strays) == sorted([child, daemon])
    assert all(s["name"] == f"{s['pid']} (sleep)" for s in group.strays), group.strays
    assert group.survivors == []
    text = log.read_text()
    assert "sent SIGTERM to processes that left the group:" in text, text
    assert "stopped processes that had left the server's process group: " in text


def test_a_command_that_hands_off_to_a_daemon_is_not_gone_until_the_daemon_is(
    tmp_path: Path, killer: Callable[[int], None]
) -> None:
    """An external ``start:`` that daemonises exits 0 at once; its supervisor stays (the
    daemon is its child now), records the daemon for a later run, and stops it at the
    stop.  Before, the supervisor saw an empty group, said "gone", and the daemon ran on."""
    daemon_file = tmp_path / "daemon.pid"
    records = tmp_path / "servers"
    records.mkdir()
    record = records / "ext-1.json"
    group = Supervised(
        ["/bin/sh", "-c", f"( {_helper(daemon_file, 100004)} & ) ; exit 0"],
        log_path=tmp_path / "start.log",
        leader_grace_s=0.0,
        group_grace_s=1.0,
        record_path=record,
        record_info={"name": "ext"},
    )
    daemon = _pid(daemon_file)
    killer(daemon)
    poll_until(lambda: group.exit_code() is not None, "start: exited")
    assert group.exit_code() == 0
    strays = poll_until(
        lambda: record.exists() and json.loads(record.read_text()).get("strays"),
        "the daemon recorded as a stray",
    )
    assert [s["pid"] for s in strays] == [daemon]
    assert strays[0]["starttime"] == process_starttime(daemon)
    assert not group.gone and pid_alive(daemon)
    group.terminate()
    assert not pid_alive(daemon) and [s["pid"] for s in group.strays] == [daemon]
    assert not record.exists()


def test_a_leftover_daemon_of_a_killed_supervisor_is_stopped_by_the_next_run(
    tmp_path: Path, killer: Callable[[int], None]
) -> None:
    """The supervisor itself SIGKILLed (with pytest, by ``kill -9`` of everything): the
    daemon re-parents to PID 1, but the record names it (pid and start time), and the next
    run's clean-up stops it."""
    prologue, child_file, daemon_file = _detaching(tmp_path)
    records = tmp_path / "servers"
    records.mkdir()
    record = records / "ep8-1.json"
    group = Supervised(
        ["/bin/sh", "-c", f"{prologue} exec sleep 100005"],
        log_path=tmp_path / "server.log",
        leader_grace_s=1.0,
        group_grace_s=1.0,
        record_path=record,
        record_info={"name": "ep8"},
    )
    child, daemon = _pid(child_file), _pid(daemon_file)
    for pid in (child, daemon, group.supervisor_pid):
        killer(pid)
    poll_until(
        lambda: record.exists() and len(json.loads(record.read_text()).get("strays", [])) == 2,
        "both strays recorded",
    )
    os.kill(group.supervisor_pid, signal.SIGKILL)
    poll_until(lambda: not pid_alive(group.pgid or 0), "the leader died with its supervisor")
    assert pid_alive(child) and pid_alive(daemon), "what left the group outlived it"
    # the run that owned it is gone
    dead = subprocess.Popen(["true"])
    dead.wait()
    data = json.loads(record.read_text())
    data.update(owner_pid=dead.pid, owner_starttime=1)
    record.write_text(json.dumps(data))
    said: list[str] = []
    leftovers.clear(records, said.append)
    assert not pid_alive(child) and not pid_alive(daemon)
    assert any("detached from its process group" in s and str(daemon) in s for s in said), said
    assert not record.exists()


# ------------------------------------------------------------------ the port sweep


def test_port_listeners_names_the_process_that_holds_a_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_listeners(port) == [], "bound is not listening"
        s.listen()
        assert port_listeners(port) == [os.getpid()]
    assert port_listeners(port) == []


def test_a_port_still_held_after_the_stop_is_warned_about_by_pid(
    tmp_path: Path, killer: Callable[[int], None]
) -> None:
    """The last sweep: a process the stop could not see (started outside the tree) that
    still listens on the server's own port is named with the command that ends it."""
    profile = tmp_path / "p.yaml"
    profile.write_text(f"args:\n  model-path: /models/x\nenv:\n  PYTHONPATH: {FAKE}\n")
    server = open_server(load_profile(profile), tmp_path / "logs")
    port = _free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); "
            "print('ok', flush=True); time.sleep(1000)",
        ],
        stdout=subprocess.PIPE,
    )
    killer(holder.pid)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"ok"
    group: Any = SimpleNamespace(strays=[], survivors=[])
    with pytest.warns(ServerProcessWarning) as caught:
        messages = server._after_stop(group, port)
    assert len(messages) == 1 and len(caught) == 1
    assert f"port {port} is still held by {holder.pid} (python" in messages[0]
    assert f"`kill {holder.pid}`" in messages[0]
    holder.kill()
    holder.wait()
    assert server._after_stop(group, port) == [], "a free port: nothing to say"


# ------------------------------------------------------------------ sessions

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0, protocol="whole-requests")
def test_reaped():
    pass
"""


def _env_yaml() -> str:
    env = {"PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}", "FAKE_SGLANG_STARTUP_S": "0.2"}
    return "env:\n" + "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items()) + "\n"


def _session(pytester: pytest.Pytester, profile: Path) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest_subprocess(
        "-m", "perf", f"--server-profile={profile}", "-W", "default", timeout=SESSION_S
    )


def test_a_managed_profile_that_detaches_helpers_leaves_no_process(
    pytester: pytest.Pytester, killer: Callable[[int], None]
) -> None:
    prologue, child_file, daemon_file = _detaching(pytester.path)
    wrapper = pytester.path / "serve.sh"
    wrapper.write_text(f'{prologue}\nexec {sys.executable} -m sglang.launch_server "$@"\n')
    profile = pytester.path / "detaching.yaml"
    profile.write_text(
        f"command: /bin/sh {wrapper}\nargs:\n  model-path: /models/detaching\n  tp-size: 2\n"
        f"{_env_yaml()}startup_timeout_s: 60\nstop_timeout_s: 3\n"
    )
    result = _session(pytester, profile)
    child, daemon = _pid(child_file), _pid(daemon_file)
    for pid in (child, daemon):
        killer(pid)
    result.assert_outcomes(passed=1)
    assert not pid_alive(child) and not pid_alive(daemon), "a profile's process survived"
    result.stdout.fnmatch_lines(
        [
            "*ServerProcessWarning: server 'detaching': processes * had left the server's "
            "process group (started with setsid, or daemonised) and were stopped with it*"
        ]
    )
    out = result.stdout.str()
    assert f"{child} (sleep)" in out and f"{daemon} (sleep)" in out


def test_an_external_start_that_daemonises_leaves_no_process(
    pytester: pytest.Pytester, killer: Callable[[int], None]
) -> None:
    """``start:`` forks the server into a session of its own and returns; with no ``stop:``
    the run still ends it (it is the supervisor's child, not PID 1's), and says so."""
    port = _free_port()
    daemon_file = pytester.path / "server.pid"
    serve = (
        f"echo $$ > {daemon_file}; exec {sys.executable} -m sglang.launch_server "
        f"--model-path /models/daemonised --port {port}"
    )
    start = f"( setsid sh -c '{serve}' </dev/null >/dev/null 2>&1 & ) ; exit 0"
    profile = pytester.path / "daemonised.yaml"
    profile.write_text(
        f"url: http://127.0.0.1:{port}\nstart: {json.dumps(start)}\n{_env_yaml()}"
        "startup_timeout_s: 60\nstop_timeout_s: 3\n"
    )
    result = _session(pytester, profile)
    daemon = _pid(daemon_file)
    killer(daemon)
    result.assert_outcomes(passed=1)
    assert not pid_alive(daemon), "the daemonised server survived its session"
    assert port_listeners(port) == [], "nothing holds its port"
    result.stdout.fnmatch_lines(
        [f"*ServerProcessWarning: external server 'daemonised'*processes {daemon} (*"]
    )
