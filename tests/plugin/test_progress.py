"""Live progress: updating lines on a terminal, plain lines in CI logs, through pytest's reporter."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from pytest_kimi.measure.trials import Progress
from pytest_kimi.report.progress import PLAIN_HEARTBEAT_S, ProgressPrinter, format_progress
from support.timing import SESSION_S

SUITE = """
from pytest_kimi import throughput

# whole requests: a trial of one request per stream, which the lines below count
@throughput(concurrency=[1, 2], max_tokens=64, trials=2, warmup=0, protocol="whole-requests")
def test_sweep():
    pass
"""


def _tick(elapsed: float, kind: str = "tick") -> Progress:
    return Progress(kind, "C=8", 1, 3, 5, 16, 1, 1234.5, elapsed)  # type: ignore[arg-type]


def test_format() -> None:
    assert (
        format_progress(_tick(2.0))
        == "C=8 trial 1/3: 5/16 requests, ~1,234.5 tok/s, 1 errors, 2.0 s"
    )
    assert format_progress(_tick(2.0, "trial")).startswith(
        "C=8 trial 1/3: 5/16 requests, 1,234.5 tok/s"
    )
    assert (
        format_progress(_tick(9.0, "level"))
        == "C=8: 1,234.5 tok/s (median of 3 trials), 5 requests, 1 failed, 9.0 s"
    )


def test_plain_mode_prints_trial_ends_and_a_heartbeat_only() -> None:
    lines: list[str] = []
    printer = ProgressPrinter(lines.append, None)
    for t in range(0, 95):
        printer(_tick(float(t)))
    printer(_tick(95.0, "trial"))
    ticks = [line for line in lines if "~" in line]
    assert len(ticks) == 1 + 94 // int(PLAIN_HEARTBEAT_S)
    assert lines[-1].endswith("95.0 s") and "~" not in lines[-1]


def test_tty_mode_rewrites_one_line_per_level() -> None:
    written: list[tuple[str, str]] = []
    printer = ProgressPrinter(
        lambda s: written.append(("line", s)), lambda s: written.append(("rewrite", s))
    )
    for t in range(3):
        printer(_tick(float(t)))
    printer(_tick(3.0, "level"))
    assert [kind for kind, _ in written] == ["rewrite"] * 4 + ["line"]


@pytest.mark.parametrize("flags", [[], ["-q", "-s"]])
def test_non_tty_session_prints_plain_lines(pytester: pytest.Pytester, flags: list[str]) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("--endpoint=sim:speed=50", *flags)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*[[]kimi[]] measuring test_suite.py::test_sweep",
            "[[]kimi[]] C=1 trial 1/2: 1/1 requests, * tok/s, 0 errors, * s",
            "[[]kimi[]] C=1: * tok/s (median of 2 trials), 2 requests, 0 failed, * s",
            "[[]kimi[]] C=2 trial 2/2: 2/2 requests, * tok/s, 0 errors, * s",
        ]
    )
    assert "\r" not in result.stdout.str()


def test_tty_session_rewrites_the_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--endpoint=sim:speed=50", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "120"},
    )
    os.close(slave)
    chunks = []
    # A read of the pty blocks until output comes: wait for it with select, so that the
    # deadline can fire even while the session prints nothing.
    deadline = time.monotonic() + SESSION_S
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "the session did not finish: " + b"".join(chunks).decode()[-2000:]
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the session exited and closed its end
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=SESSION_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    out = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, out[-2000:]
    assert "\r[kimi] C=1 trial 1/2" in out
    assert "[kimi] C=2: " in out
