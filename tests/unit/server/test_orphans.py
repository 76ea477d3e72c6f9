"""No server outlives its run: SIGKILL and SIGTERM of pytest, a killed xdist worker, leftovers.

Each test runs pytest in a subprocess against the fake SGLang (tests/fake_sglang, forking
two "scheduler" children that do not die with their parent) or the simulator, waits (by
polling its output and the supervisor's record under ``.kimi/servers/``) until a
measurement is under way, signals it, and then polls, with generous deadlines, until the
server, its children and its supervisor are gone.  A finalizer SIGKILLs everything a test
started, so a failing test never leaks a process either.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.server.interrupts import TOGETHER_S
from pytest_kimi.server.procgroup import group_members, pid_alive, process_starttime
from support.paths import REPO

FAKE = REPO / "tests" / "fake_sglang"
KEY = "sk-orphan-test-" + "k" * 24
GONE_WITHIN_S = 60.0
"""Deadline for processes to disappear; generous for a busy 2-core CI machine (measured:
about a second on an idle one)."""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="checks processes through /proc"
)

LONG_SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1], max_tokens=8, trials=1, warmup=0, protocol="whole-requests")
def test_a_quick():  # one request of 8 tokens: 0.15 s in real time
    pass

@throughput(concurrency=[1, 2], max_tokens={max_tokens}, trials=1, warmup=0)
def test_b_long():
    pass
"""


# ---------------------------------------------------------------------- helpers


class Run:
    """A pytest subprocess in ``path``; its output goes to a file that is polled."""

    def __init__(self, path: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.path = path
        self.out = path / "pytest-out.txt"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                cwd=path,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )

    def text(self) -> str:
        try:
            return self.out.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, what: Callable[[], Any], label: str, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            if self.proc.poll() is not None:
                value = what()
                if value:
                    return value
                pytest.fail(
                    f"pytest exited ({self.proc.returncode}) before {label}:\n{self.text()[-4000:]}"
                )
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {label}:\n{self.text()[-4000:]}")

    def records(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted((self.path / ".kimi" / "servers").glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
        return out


@pytest.fixture
def reaper() -> Iterator[Callable[..., None]]:
    """Register pids / process groups to SIGKILL at the end, whatever the outcome."""
    pids: list[int] = []
    groups: list[int] = []

    def add(*, pid: int | None = None, pgid: int | None = None) -> None:
        if pid is not None:
            pids.append(pid)
        if pgid is not None:
            groups.append(pgid)

    yield add
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _setup(
    path: Path, backend: str, max_tokens: int = 4096, speed: int = 4
) -> tuple[list[str], str]:
    """pytest arguments for ``backend`` ('sglang': the fake behind a server profile with
    an API key and two scheduler children; 'sim': --endpoint=sim) and a unique marker.
    ``speed`` 4 where the long test only has to be under way (each of its levels still lasts
    its window's wall-clock minimum, 0.7 s); 1, real time, where a signal must land inside one
    of its levels (several seconds each)."""
    (path / "pytest.ini").write_text("[pytest]\n")
    (path / "test_suite.py").write_text(LONG_SUITE.format(max_tokens=max_tokens))
    marker = f"/models/kimi-orphan-{uuid.uuid4().hex[:12]}"
    if backend == "sim":
        return [f"--endpoint=sim:speed={speed},model={marker}"], marker
    env = {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.3",
        "FAKE_SGLANG_SPEED": str(speed),
        "FAKE_SGLANG_SCHEDULERS": "2",
        "HF_TOKEN": "hf-" + KEY,
    }
    env_yaml = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items())
    (path / "fake.yaml").write_text(
        f"args:\n  model-path: {marker}\n  tp-size: 8\n  max-running-requests: 256\n"
        f"  api-key: {KEY}\nenv:\n{env_yaml}\nstartup_timeout_s: 60\nstop_grace_s: 10\n"
        f"stop_timeout_s: 5\n"
    )
    return ["--server-profile=fake.yaml"], marker


def _server(run: Run, reaper: Callable[..., None]) -> dict[str, Any]:
    """The supervisor's record of the running server (registered for the reaper)."""
    (rec,) = run.wait_for(run.records, "the server's record in .kimi/servers")
    reaper(pgid=rec["pgid"], pid=rec["supervisor_pid"])
    return rec


def _children(path: Path) -> list[int]:
    logs = list((path / ".kimi" / "logs").glob("fake-*.log"))
    text = "".join(p.read_text(errors="replace") for p in logs)
    return [int(m) for m in re.findall(r"scheduler child pid (\d+)", text)]


def _gone(rec: dict[str, Any], extra: list[int] = ()) -> bool:  # type: ignore[assignment]
    pids = [rec["pid"], rec["supervisor_pid"], *extra]
    return not any(pid_alive(p) for p in pids) and not group_members(rec["pgid"])


def _wait_gone(rec: dict[str, Any], extra: list[int], timeout: float = GONE_WITHIN_S) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _gone(rec, extra):
            return time.monotonic() - t0
        time.sleep(0.05)
    alive = [p for p in [rec["pid"], rec["supervisor_pid"], *extra] if pid_alive(p)]
    pytest.fail(f"still running {timeout:g} s later: {alive}, group {group_members(rec['pgid'])}")


def _no_key_anywhere(path: Path) -> None:
    for sub in (".kimi/logs", ".kimi/servers"):
        for file in (path / sub).glob("*"):
            text = file.read_text(errors="replace")
            assert KEY not in text, f"{file} shows the API key"


# ---------------------------------------------------------------------- SIGKILL


@pytest.mark.parametrize("backend", ["sglang", "sim"])
def test_sigkill_of_pytest_leaves_no_server(tmp_path: Path, reaper: Any, backend: str) -> None:
    args, _ = _setup(tmp_path, backend)
    run = Run(tmp_path, ["-m", "perf", *args])
    reaper(pgid=run.proc.pid)
    rec = _server(run, reaper)
    run.wait_for(lambda: "measuring test_suite.py::test_b_long" in run.text(), "the measurement")
    children = _children(tmp_path) if backend == "sglang" else []
    assert len(children) == (2 if backend == "sglang" else 0)
    assert all(pid_alive(p) for p in [rec["pid"], *children])
    assert rec["starttime"] == process_starttime(rec["pid"])

    run.proc.send_signal(signal.SIGKILL)  # no handler sees this one
    run.proc.wait(timeout=30)
    elapsed = _wait_gone(rec, children)
    assert not run.records(), "the supervisor removes its record once the group is gone"
    log = Path(rec["log"]).read_text(errors="replace")
    assert (
        f"the process that started this server (pid {rec['owner_pid']}) is gone" in log
        or backend == "sim"
    )
    if backend == "sglang":
        _no_key_anywhere(tmp_path)
        assert "<redacted>" in log  # the ServerArgs line the fake logs carried the key
    print(f"{backend}: gone {elapsed:.2f} s after SIGKILL of pytest")


# ---------------------------------------------------------------------- SIGTERM


@pytest.mark.parametrize("backend", ["sglang", "sim"])
def test_sigterm_of_pytest_is_handled_like_ctrl_c(
    tmp_path: Path, reaper: Any, backend: str
) -> None:
    # real time: C=2 (the level the signal must land in) lasts several seconds
    args, _ = _setup(tmp_path, backend, max_tokens=256, speed=1)
    report = tmp_path / "perf.json"
    markdown = tmp_path / "perf.md"
    junit = tmp_path / "junit.xml"
    run = Run(
        tmp_path,
        [
            "-m",
            "perf",
            *args,
            f"--perf-json={report}",
            f"--perf-markdown={markdown}",
            f"--junitxml={junit}",
        ],
    )
    reaper(pgid=run.proc.pid)
    rec = _server(run, reaper)
    children = _children(tmp_path) if backend == "sglang" else []
    # C=1 of the long test done, C=2 (several seconds) under way
    run.wait_for(
        lambda: (
            re.search(
                r"\[kimi\] C=1: .*tok/s",
                run.text().split("measuring test_suite.py::test_b_long", 1)[-1],
            )
            if "test_b_long" in run.text()
            else None
        ),
        "the first level of the long test",
    )

    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(timeout=120)
    out = run.text()
    assert code == 2, out[-3000:]  # pytest's "interrupted"
    assert "KeyboardInterrupt" in out and "SIGTERM: stopping like Ctrl-C" in out
    _wait_gone(rec, children, timeout=10)  # stopped before pytest exited
    assert not run.records()
    if backend == "sglang":
        log = Path(rec["log"]).read_text(errors="replace")
        assert "sent SIGTERM to the main process" in log  # leader first
        _no_key_anywhere(tmp_path)

    data = json.loads(report.read_text())
    tests = {t["nodeid"]: t for t in data["tests"]}
    assert set(tests) == {"test_suite.py::test_a_quick", "test_suite.py::test_b_long"}
    assert tests["test_suite.py::test_a_quick"]["outcome"] == "passed"
    long = tests["test_suite.py::test_b_long"]
    assert long["outcome"] == "interrupted"
    assert [lv["label"] for lv in long["levels"]] == ["C=1"], long["levels"]
    assert long["levels"][0]["tok_s"] > 0
    assert "interrupted" in markdown.read_text().lower()
    assert junit.exists() and "test_a_quick" in junit.read_text()


def test_second_sigterm_stops_at_once_and_still_reaps(tmp_path: Path, reaper: Any) -> None:
    args, _ = _setup(tmp_path, "sglang")
    # a server that ignores SIGTERM: the first signal's graceful stop would take its grace
    (tmp_path / "fake.yaml").write_text(
        (tmp_path / "fake.yaml")
        .read_text()
        .replace("env:\n", 'env:\n  FAKE_SGLANG_MODE: "ignore-sigterm"\n')
        .replace("stop_grace_s: 10", "stop_grace_s: 300")
    )
    run = Run(tmp_path, ["-m", "perf", *args])
    reaper(pgid=run.proc.pid)
    rec = _server(run, reaper)
    run.wait_for(lambda: "measuring test_suite.py::test_b_long" in run.text(), "the measurement")
    children = _children(tmp_path)
    run.proc.send_signal(signal.SIGTERM)
    t_first = time.monotonic()
    log = Path(rec["log"])
    run.wait_for(
        lambda: "sent SIGTERM to the main process" in log.read_text(errors="replace"),
        "the graceful stop",
    )
    # a signal within TOGETHER_S of the first is the same stop (GNU timeout's group TERM)
    run.wait_for(lambda: time.monotonic() - t_first > TOGETHER_S, "the together window")
    t0 = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(timeout=60)
    assert code == 128 + signal.SIGTERM, run.text()[-3000:]
    assert time.monotonic() - t0 < 30, "the second signal must not wait out the 300 s grace"
    _wait_gone(rec, children, timeout=10)
    assert "again: killing the servers" in run.text()


# ---------------------------------------------------------------------- xdist


def test_killed_xdist_worker_leaves_no_server(tmp_path: Path, reaper: Any) -> None:
    pytest.importorskip("xdist")
    # real time: the long test (the one the worker is killed in) lasts several seconds
    args, _ = _setup(tmp_path, "sglang", speed=1)
    run = Run(tmp_path, ["-m", "perf", "-n", "1", *args])
    reaper(pgid=run.proc.pid)
    rec = _server(run, reaper)
    worker = rec["owner_pid"]
    assert worker != run.proc.pid, "the worker, not the controller, started the server"
    reaper(pid=worker)
    # a worker's progress lines stay in the worker: the quick test's "." means the long
    # one is being measured
    run.wait_for(lambda: "." in run.text().partition("[2 items]")[2], "the quick test")
    children = _children(tmp_path)
    os.kill(worker, signal.SIGKILL)
    elapsed = _wait_gone(rec, children)
    print(f"xdist: gone {elapsed:.2f} s after SIGKILL of the worker")
    # Now the whole run dies at once (controller and any replacement worker): whatever
    # server a replacement started is stopped by its supervisor as well.
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait(timeout=30)
    run.wait_for(lambda: not run.records(), "the records to go", timeout=GONE_WITHIN_S)


# ---------------------------------------------------------------------- leftovers


def _leftover(
    tmp_path: Path, reaper: Any, owner: int, owner_starttime: int | None
) -> tuple[subprocess.Popen[bytes], Path]:
    """A running fake server recorded as a previous run's supervisor would have."""
    port_env = {
        **os.environ,
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/models/leftover",
            "--port",
            "0",
            "--api-key",
            KEY,
        ],
        env=port_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    reaper(pgid=proc.pid)
    deadline = time.monotonic() + 30
    while process_starttime(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    records = tmp_path / ".kimi" / "servers"
    records.mkdir(parents=True)
    path = records / "ep8-12345-abc.json"
    path.write_text(
        json.dumps(
            {
                "kind": "managed",
                "name": "ep8",
                "pid": proc.pid,
                "pgid": proc.pid,
                "starttime": process_starttime(proc.pid),
                "supervisor_pid": 999999999,
                "owner_pid": owner,
                "owner_starttime": owner_starttime,
                "port": 30000,
                "started_at": "2026-01-01T00:00:00+0000",
                "leader_grace_s": 5,
                "group_grace_s": 2,
                "command": ["python", "-m", "sglang.launch_server", "--api-key", "<redacted>"],
            }
        )
    )
    return proc, path


def test_leftover_of_a_dead_run_is_stopped_first(tmp_path: Path, reaper: Any) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    args, _ = _setup(tmp_path, "sglang", max_tokens=8)
    leftover, record = _leftover(tmp_path, reaper, dead.pid, 1)
    run = Run(tmp_path, ["-m", "perf", "-k", "quick", *args])
    reaper(pgid=run.proc.pid)
    code = run.proc.wait(timeout=180)
    out = run.text()
    assert code == 0, out[-3000:]
    assert f"found server 'ep8' (pid {leftover.pid}" in out
    assert "left running by an earlier run" in out and "stopped the leftover server" in out
    assert leftover.wait(timeout=10) is not None
    assert not record.exists()
    assert KEY not in out


def test_leftover_of_a_live_run_is_refused(tmp_path: Path, reaper: Any) -> None:
    me = os.getpid()  # "another pytest session", still running
    args, _ = _setup(tmp_path, "sglang", max_tokens=8)
    leftover, record = _leftover(tmp_path, reaper, me, process_starttime(me))
    run = Run(tmp_path, ["-m", "perf", "-k", "quick", *args])
    reaper(pgid=run.proc.pid)
    code = run.proc.wait(timeout=120)
    out = run.text()
    assert code != 0
    assert f"server 'ep8' (pid {leftover.pid}" in out and "is still running" in out
    assert "not starting a second server beside it" in out
    assert f"kill -TERM {leftover.pid}" in out
    assert leftover.poll() is None, "a live run's server is not touched"
    assert record.exists()
    assert not list((tmp_path / ".kimi" / "logs").glob("fake-*.log")), "no second server"
