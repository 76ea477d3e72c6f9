"""A run stopped by Ctrl-C or SIGTERM is never reported as a success.

A cancelled CI job sends SIGINT then SIGTERM, and its step summary is what the plugin appended:
a headline of PASSED over "1 interrupted" told the operator the gate passed.  The session test
runs pytest against the simulator in a subprocess, signals it once its first level has finished
(read from the progress output: no fixed sleep), and reads every report it wrote; the others
pin the two pieces under it (the load loop's stop, the baseline update's refusal).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from pytest_kimi.baseline.update import refusal
from pytest_kimi.load.loop_thread import LoopThread
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_says_so_in_every_report(
    pytester: pytest.Pytester, signum: signal.Signals
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    where = pytester.path
    step_summary = where / "step-summary.md"
    proc = subprocess.Popen(
        [
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
            "GITHUB_STEP_SUMMARY": str(step_summary),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        head = read_until(proc, FIRST_LEVEL_DONE)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=SESSION_S)
        out = head + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
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
