"""Baselines end to end: record, rerun, regress, corrupt, change the workload, refuse to record.

Every session spawns a simulator of its own, and runs in this process (``pytester.runpytest``,
bounded as a subprocess would be: tests/support/inprocess.py).  The simulator runs at speed 10:
at 50 it streams ~12,000 tok/s, which keeps a core busy, and on a machine that shares its cores
the trials then measure the CPU they got (seen: 23% spread at C=1) instead of the server, and a
50% slowdown comes out underpowered; at 10 it needs a few percent of a core and keeps time.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from support.busy_machine import INNER_ADDOPTS, MACHINE_VOIDED, SESSION_ATTEMPTS
from support.timing import SESSION_S

SIM = "sim:speed=10"
SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], max_tokens={max_tokens}, trials=3, warmup=1{targets})
def test_sweep():
    pass
"""
BASELINE = Path("baselines/sim/test_suite/test_sweep.yaml")
GATE = ("--perf-max-trials=4", "--perf-tolerance=0.1")


def _suite(pytester: pytest.Pytester, max_tokens: int = 64, targets: str = "") -> None:
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=max_tokens, targets=targets))


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # content, not layout: a wide COLUMNS keeps each message of the summary on one line
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "2000")
        return pytester.runpytest(*args)


class Recording(NamedTuple):
    text: str
    """The baseline file the recording wrote."""
    stdout: pytest.LineMatcher
    """What the recording session printed."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """One baseline recorded for every test that starts from one (a session each saved; the
    first test checks what the recording says).  Run again, from scratch, while the machine
    voided it (as ``pytester``'s sessions are: tests/support/busy_machine.py)."""
    args = [f"--endpoint={SIM}", "--update-baselines", *GATE]
    for _ in range(SESSION_ATTEMPTS):
        where = tmp_path_factory.mktemp("recording")
        (where / "test_suite.py").write_text(SUITE.format(max_tokens=64, targets=""))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
            cwd=where,
            env={**os.environ, "PYTEST_ADDOPTS": INNER_ADDOPTS},  # (before the autouse fixture)
            capture_output=True,
            text=True,
            timeout=SESSION_S,
        )
        if proc.returncode == 0 or MACHINE_VOIDED not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Recording((where / BASELINE).read_text(), pytest.LineMatcher(proc.stdout.splitlines()))


@pytest.fixture(scope="module")
def recording(recorded: Recording) -> str:
    return recorded.text


def _recorded(pytester: pytest.Pytester, recording: str) -> None:
    _suite(pytester)
    path = pytester.path / BASELINE
    path.parent.mkdir(parents=True)
    path.write_text(recording)


def _levels(path: Path) -> list[dict]:
    return json.loads(path.read_text())["tests"][0]["levels"]


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _holds(expected_pct: float, lv: dict) -> bool:
    """``expected_pct`` inside the level's 90% interval widened to twice its width (the
    interval is the level's own measure of its noise; doubled, it misses a true value about
    once in a thousand levels instead of once in ten)."""
    lo, hi = lv["ci90"]
    half = (hi - lo) / 2
    return lo - half <= expected_pct <= hi + half


def test_record_then_rerun_unchanged_passes(pytester: pytest.Pytester, recorded: Recording) -> None:
    _recorded(pytester, recorded.text)
    path = pytester.path / BASELINE
    data = yaml.safe_load(path.read_text())
    assert data["schema"] == 1 and data["profile"] == "sim"
    assert [lv["workload"]["concurrency"] for lv in data["levels"]] == [1, 4]
    assert all(len(lv["trials_tok_s"]) == 4 for lv in data["levels"]), "recording runs max trials"
    assert data["provenance"]["model"] == "kimi-k2.6-sim"
    recorded.stdout.fnmatch_lines(
        ["*pytest-kimi baselines*", "*(new)*", "*git add*test_sweep.yaml*"]
    )

    report = pytester.path / "perf.json"
    result = _run(pytester, f"--endpoint={SIM}", *GATE, f"--perf-json={report}")
    result.assert_outcomes(passed=1)
    for lv, stored in zip(_levels(report), data["levels"]):
        # unchanged: never a regression (pass, or underpowered/inconclusive on a busy machine)
        assert lv["verdict"] in ("pass", "underpowered", "inconclusive"), lv
        # compared with its own level's recording, trial by trial
        assert lv["baseline_trials_tok_s"] == stored["trials_tok_s"]
        base, cur = stored["trials_tok_s"], lv["trials_tok_s"]
        assert lv["baseline_tok_s"] == pytest.approx(statistics.median(base), abs=0.01)
        assert lv["change_pct"] == pytest.approx(
            (_geomean(cur) / _geomean(base) - 1) * 100, abs=0.01
        )
        assert lv["ci90"][0] < lv["change_pct"] < lv["ci90"][1]
        assert _holds(0.0, lv), lv  # nothing changed: no change, within the measured noise
        assert 0 <= lv["p_value"] <= 1
        assert 3 <= lv["trials"] <= 4


def test_slowed_server_is_a_regression_with_the_deploy_change_named(
    pytester: pytest.Pytester, recording: str
) -> None:
    _recorded(pytester, recording)
    report = pytester.path / "perf.json"
    result = _run(pytester, f"--endpoint={SIM},slowdown=1.5", *GATE, f"--perf-json={report}")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*throughput regression beyond noise:*",
            "*C=1 regression: regression -*% (90% CI*",
            "*changed*: sim.slowdown: 1.0 -> 1.5*",
        ]
    )
    levels = _levels(report)
    assert [lv["verdict"] for lv in levels] == ["regression", "regression"]
    # every step 1.5x longer: -33% at every level, within the measured noise
    assert all(_holds((1 / 1.5 - 1) * 100, lv) for lv in levels), levels
    assert all(lv["trials"] == 3 for lv in levels), "a clear regression stops at the first look"


def test_corrupt_baseline_is_named_and_left_untouched(
    pytester: pytest.Pytester, recording: str
) -> None:
    _recorded(pytester, recording)
    path = pytester.path / BASELINE
    text = path.read_text().replace("trials_tok_s: [", "trials_tok_s: [-5, ", 1)
    path.write_text(text)
    result = _run(pytester, f"--endpoint={SIM}", *GATE)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*{BASELINE}: levels[[]0[]]*trials_tok_s must be a list of positive numbers; item 0 is -5"
        ]
    )
    assert "During handling" not in result.stdout.str()
    assert path.read_text() == text
    path.write_text("schema: 1\nlevels: [\n")
    result = _run(pytester, f"--endpoint={SIM}", *GATE, "--update-baselines")
    result.assert_outcomes(errors=1)
    # the file, the line, and the three ways out
    result.stdout.fnmatch_lines(
        [
            f"*{BASELINE}: YAML syntax error at line 3, column 1: *",
            f"*fix the file by hand, restore it with `git checkout -- {BASELINE}`, or rewrite "
            "it from this run with --update-baselines=force",
        ]
    )
    assert path.read_text() == "schema: 1\nlevels: [\n"
    # force measures the test as without a baseline and replaces the file
    result = _run(pytester, f"--endpoint={SIM}", *GATE, "--update-baselines=force")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [f"*{BASELINE} (replaced a corrupt file: YAML syntax error at line 3*", "*git diff --*"]
    )
    data = yaml.safe_load(path.read_text())
    assert [lv["workload"]["concurrency"] for lv in data["levels"]] == [1, 4]


def test_workload_change_finds_no_baseline(pytester: pytest.Pytester, recording: str) -> None:
    _recorded(pytester, recording)
    _suite(pytester, max_tokens=48)
    report = pytester.path / "perf.json"
    result = _run(pytester, f"--endpoint={SIM}", *GATE, f"--perf-json={report}")
    result.assert_outcomes(passed=1)
    assert [lv["verdict"] for lv in _levels(report)] == ["no-baseline", "no-baseline"]
    result.stdout.fnmatch_lines(["*no baseline level for *test_sweep*max_tokens*48*"])
    # the same unrecorded workload, one of its levels: now the missing baseline fails it
    path = pytester.path / "test_suite.py"
    path.write_text(path.read_text().replace("concurrency=[1, 4]", "concurrency=[4]"))
    result = _run(
        pytester, f"--endpoint={SIM}", *GATE, "--perf-require-baseline", f"--perf-json={report}"
    )
    result.assert_outcomes(failed=1)
    assert [lv["verdict"] for lv in _levels(report)] == ["no-baseline"]


def test_update_refuses_a_run_with_failures(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    result = _run(pytester, f"--endpoint={SIM},error_rate=0.5", "--update-baselines", *GATE)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test_sweep: not recorded (C=1 error*--update-baselines=force*"])
    assert not (pytester.path / BASELINE).exists()


def _session_ids(path: Path) -> list[str]:
    return yaml.safe_load(path.read_text())["provenance"]["session_ids"]


def _tok_s(text: str) -> dict[int, float]:
    """A baseline file's median tok/s by concurrency."""
    return {lv["workload"]["concurrency"]: lv["tok_s"] for lv in yaml.safe_load(text)["levels"]}


def test_update_refuses_a_level_below_its_floor_unless_forced(
    pytester: pytest.Pytester, recording: str
) -> None:
    """A ``fail`` level used to be recorded: the figure below the floor became the baseline."""
    _recorded(pytester, recording)
    _suite(pytester, targets=", min_tok_s={4: 100000}")  # the targets are not in the key
    path = pytester.path / BASELINE
    result = _run(pytester, f"--endpoint={SIM}", *GATE, "--update-baselines")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*test_suite.py::test_sweep: not recorded (*C=4 fail: aggregate * tok/s < "
            "min_tok_s 100000*): *record it anyway with --update-baselines=force*"
        ]
    )
    assert path.read_text() == recording
    result = _run(pytester, f"--endpoint={SIM}", *GATE, "--update-baselines=force")
    result.assert_outcomes(failed=1)  # recorded, and still failed: force records, never passes
    assert "not recorded" not in result.stdout.str()
    assert path.read_text() != recording
    assert _session_ids(path) != yaml.safe_load(recording)["provenance"]["session_ids"]


def test_update_refuses_a_regression_unless_forced(
    pytester: pytest.Pytester, recording: str
) -> None:
    """A ``regression`` used to be recorded: the slower server became the target."""
    _recorded(pytester, recording)
    path = pytester.path / BASELINE
    slowed = (f"--endpoint={SIM},slowdown=1.5", *GATE)
    result = _run(pytester, *slowed, "--update-baselines")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_suite.py::test_sweep: not recorded (C=1 regression: regression -*% (90% CI*"
            "C=4 regression: regression -*--update-baselines=force*"
        ]
    )
    assert path.read_text() == recording
    result = _run(pytester, *slowed, "--update-baselines=force")
    result.assert_outcomes(failed=1)
    old, new = _tok_s(recording), _tok_s(path.read_text())
    # every step 1.5x longer: the slower figures (-33%) are the target now
    assert all(new[c] < 0.8 * old[c] for c in (1, 4)), (old, new)
