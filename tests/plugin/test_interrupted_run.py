"""A run stopped by Ctrl-C or SIGTERM is never reported as a success.

A cancelled CI job sends SIGINT then SIGTERM, and its step summary is what the plugin appended:
a headline of PASSED over "1 interrupted" told the operator the gate passed.  The session test
runs pytest against the simulator in a subprocess, signals it once its first level has finished
(read from the progress output: no fixed sleep), and reads every report it wrote; the others
pin the pieces under it (the load loop's stop, the baseline update's refusal, signals that
arrive together taken as one).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import shutil
from pathlib import Path

import pytest

from pytest_kimi.baseline.update import refusal
from pytest_kimi.load.loop_thread import LoopThread
from pytest_kimi.server.interrupts import TOGETHER_S, Interrupts
from support.busy_machine import INNER_ADDOPTS
from support.timing import SESSION_S, apoll_until, read_until

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4, 8], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass
"""
FIRST_LEVEL_DONE = "[kimi] C=1: "
"""The progress line that ends the first level (``C=1: 64.3 tok/s (median of 2 trials)``);
two more levels of two trials each (about 3 wall seconds) follow, which the signal cuts."""


def _session(where: Path, *, under: list[str] | None = None) -> subprocess.Popen[str]:
    """The sweep's pytest session in a subprocess (``under``: a command it runs under, such as
    ``timeout``), writing every report into ``where``."""
    return subprocess.Popen(
        [
            *(under or []),
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--endpoint=sim:speed=10",
            "--perf-history=off",
            f"--perf-json={where / 'perf.json'}",
            f"--perf-markdown={where / 'perf.md'}",
            f"--perf-html={where / 'html'}",
        ],
        cwd=where,
        env={
            **os.environ,
            "PYTEST_ADDOPTS": INNER_ADDOPTS,
            "GITHUB_STEP_SUMMARY": str(where / "step-summary.md"),
            "COLUMNS": "250",  # content, not layout: the headline on one line
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _signalled(proc: subprocess.Popen[str], send: list[tuple[int, int]]) -> str:
    """Send each (pid, signal) of ``send`` at once after the first level, then the output."""
    try:
        head = read_until(proc, FIRST_LEVEL_DONE)
        for pid, signum in send:
            os.kill(pid, signum)
        out, _ = proc.communicate(timeout=SESSION_S)
        return head + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_says_so_in_every_report(
    pytester: pytest.Pytester, signum: signal.Signals
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    where = pytester.path
    step_summary = where / "step-summary.md"
    proc = _session(where)
    out = _signalled(proc, [(proc.pid, signum)])
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    # a clean stop: no traceback after it (the cut streams' CancelledError used to follow)
    for text in ("Traceback", "CancelledError", "exception was never retrieved"):
        assert text not in out, out[-3000:]
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C (SIGINT)"

    report = json.loads((where / "perf.json").read_text())
    assert report["status"] == "interrupted"
    assert report["interrupted"].startswith(f"run interrupted by {name}")
    (test,) = report["tests"]
    assert test["outcome"] == "interrupted"
    levels = {lv["label"]: lv["verdict"] for lv in test["levels"]}
    # the level that finished keeps the verdict the gate gives it: no baseline file, so
    # no-baseline (it used to say pass); the level the signal cut is not reported
    assert levels.get("C=1") == "no-baseline", (levels, out[-3000:])
    assert "C=8" not in levels, levels
    assert "no baseline yet" in test["baseline_note"]

    for markdown in (where / "perf.md", step_summary):
        text = markdown.read_text()
        assert text.startswith("## pytest-kimi throughput: INTERRUPTED\n"), text[:300]
        assert "PASSED" not in text
        assert f"run interrupted by {name}" in text
        assert "| C=1 |" in text and "no-baseline" in text
    html = (where / "html" / "index.html").read_text()
    assert '<span class="status s-interrupted">INTERRUPTED</span></h1>' in html
    assert "PASSED" not in html
    # the terminal summary's headline
    assert f"INTERRUPTED: run interrupted by {name}" in out


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU coreutils' timeout")
@pytest.mark.parametrize("how", ["timeout", "TERM+INT"])
def test_signals_that_arrive_together_are_one_stop_and_every_report_is_written(
    pytester: pytest.Pytester, how: str
) -> None:
    """GNU ``timeout`` (without ``--foreground``) sends its signal to pytest, then to pytest's
    process group: pytest got SIGTERM twice within microseconds, took the second for "stop
    now" and exited 143 without the JSON and Markdown.  Here ``timeout`` is sent SIGTERM, which
    it relays exactly as when its time runs out (the child, then the group, then SIGCONT); and,
    as a delivery the kernel cannot merge, SIGTERM and SIGINT back to back (a runner's
    signal and a terminal's at once)."""
    pytester.makepyfile(test_suite=SUITE)
    where = pytester.path
    if how == "timeout":
        proc = _session(where, under=["timeout", "--signal=TERM", f"{SESSION_S:g}"])
        out = _signalled(proc, [(proc.pid, signal.SIGTERM)])  # timeout relays it
    else:
        proc = _session(where)
        out = _signalled(proc, [(proc.pid, signal.SIGTERM), (proc.pid, signal.SIGINT)])
    # timeout exits with its child's status when it was signalled rather than timed out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "again: killing the servers" not in out, out[-3000:]
    report = json.loads((where / "perf.json").read_text())
    assert report["status"] == "interrupted", report.get("status")
    # the first handled names the stop (Python runs pending handlers in signal order, so
    # SIGINT may come first of the pair)
    by = ("SIGTERM",) if how == "timeout" else ("SIGTERM", "Ctrl-C (SIGINT)")
    headline = report["interrupted"]
    assert headline.startswith(tuple(f"run interrupted by {name}" for name in by)), headline
    (test,) = report["tests"]
    assert {lv["label"]: lv["verdict"] for lv in test["levels"]}.get("C=1") == "no-baseline"
    for markdown in (where / "perf.md", where / "step-summary.md"):
        assert markdown.read_text().startswith("## pytest-kimi throughput: INTERRUPTED\n")
    assert f"INTERRUPTED: {headline}" in out


class _Recording(Interrupts):
    """The handler's decisions without a real exit: ``hard_stop`` records its signal."""

    def __init__(self) -> None:
        super().__init__(say=lambda text: None)
        self.hard_stops: list[int] = []

    def hard_stop(self, signum: int) -> None:
        self.hard_stops.append(signum)


def test_a_signal_with_the_first_is_the_same_stop_one_after_it_stops_at_once() -> None:
    """What the handler does with each delivery, called as the signal module calls it."""
    interrupts = _Recording()
    with pytest.raises(KeyboardInterrupt):
        interrupts._handle(signal.SIGTERM, None)
    # timeout's signal to the group, a second signal sent with the first: the same stop
    interrupts._handle(signal.SIGTERM, None)
    interrupts._handle(signal.SIGINT, None)
    assert interrupts.hard_stops == []
    assert (interrupts.count, interrupts.echoes, interrupts.first) == (1, 2, signal.SIGTERM)
    interrupts._first_at -= TOGETHER_S  # as if the window had passed: a person's second Ctrl-C
    interrupts._handle(signal.SIGINT, None)
    assert interrupts.hard_stops == [signal.SIGINT]


def test_an_interrupted_loop_run_returns_once_its_coroutine_has_stopped() -> None:
    """Ctrl-C in the main thread cancels the coroutine on the load loop; ``run`` re-raises
    only once the coroutine's ``finally`` has run.  It used to return at once, and the caller
    read a sweep's partial result while the level that had just finished was still being
    appended to it (reported as "no levels measured")."""
    loop = LoopThread()
    stopped: list[str] = []

    main = threading.main_thread().ident or 0

    def main_waits() -> bool:
        frame = sys._current_frames().get(main)
        return frame is not None and frame.f_code.co_name == "wait"  # in run()'s result()

    async def measuring() -> None:
        await apoll_until(main_waits, "the main thread waits for the measurement")
        signal.pthread_kill(main, signal.SIGINT)  # what Ctrl-C does to it
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.2)  # cleanup that takes loop turns (cut streams, a level)
            stopped.append("finally ran")

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(measuring())
        assert stopped == ["finally ran"]
    finally:
        loop.close()


def test_update_baselines_refuses_an_interrupted_test_unless_forced() -> None:
    """The levels an interrupted test finished are sound, but the rest never ran: recorded,
    the file would mix this run's levels with the old ones' (a cancelled update job)."""
    level = {"label": "C=1", "verdict": "no-baseline", "reasons": [], "trials_tok_s": [64.0]}
    test = {"nodeid": "t.py::t", "outcome": "interrupted", "levels": [level]}
    why = refusal(test)
    assert why is not None and why.startswith("t.py::t: not recorded (interrupted: ")
    assert "--update-baselines=force" in why
    assert refusal({**test, "outcome": "passed"}) is None
