"""Baselines end to end: record, rerun, regress, corrupt, change the workload, refuse to record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

SIM = "sim:speed=50"
SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], max_tokens={max_tokens}, trials=3, warmup=1)
def test_sweep():
    pass
"""
BASELINE = Path("baselines/sim/test_suite/test_sweep.yaml")
GATE = ("--perf-max-trials=4", "--perf-tolerance=0.1")


def _suite(pytester: pytest.Pytester, max_tokens: int = 64) -> None:
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=max_tokens))


def _record(pytester: pytest.Pytester) -> pytest.RunResult:
    _suite(pytester)
    result = pytester.runpytest(f"--endpoint={SIM}", "--update-baselines", *GATE)
    result.assert_outcomes(passed=1)
    return result


def _levels(path: Path) -> list[dict]:
    return json.loads(path.read_text())["tests"][0]["levels"]


def test_record_then_rerun_unchanged_passes(pytester: pytest.Pytester) -> None:
    result = _record(pytester)
    path = pytester.path / BASELINE
    data = yaml.safe_load(path.read_text())
    assert data["schema"] == 1 and data["profile"] == "sim"
    assert [lv["workload"]["concurrency"] for lv in data["levels"]] == [1, 4]
    assert all(len(lv["trials_tok_s"]) == 4 for lv in data["levels"]), "recording runs max trials"
    assert data["provenance"]["model"] == "kimi-k2.6-sim"
    result.stdout.fnmatch_lines(["*pytest-kimi baselines*", "*(new)*", "*git add*test_sweep.yaml*"])

    report = pytester.path / "perf.json"
    result = pytester.runpytest(f"--endpoint={SIM}", *GATE, f"--perf-json={report}")
    result.assert_outcomes(passed=1)
    for lv in _levels(report):
        # unchanged: never a regression (pass, or underpowered/inconclusive on a busy machine)
        assert lv["verdict"] in ("pass", "underpowered", "inconclusive"), lv
        assert lv["baseline_tok_s"] and abs(lv["change_pct"]) < 10
        assert lv["ci90"][0] < lv["change_pct"] < lv["ci90"][1]
        assert 0 <= lv["p_value"] <= 1
        assert 3 <= lv["trials"] <= 4


def test_slowed_server_is_a_regression_with_the_deploy_change_named(
    pytester: pytest.Pytester,
) -> None:
    _record(pytester)
    report = pytester.path / "perf.json"
    result = pytester.runpytest(f"--endpoint={SIM},slowdown=1.5", *GATE, f"--perf-json={report}")
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
    assert all(lv["change_pct"] < -20 for lv in levels)
    assert all(lv["trials"] == 3 for lv in levels), "a clear regression stops at the first look"


def test_corrupt_baseline_is_named_and_left_untouched(pytester: pytest.Pytester) -> None:
    _record(pytester)
    path = pytester.path / BASELINE
    text = path.read_text().replace("trials_tok_s: [", "trials_tok_s: [-5, ", 1)
    path.write_text(text)
    result = pytester.runpytest(f"--endpoint={SIM}", *GATE)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*{BASELINE}: levels[[]0[]]*trials_tok_s must be a list of positive numbers; item 0 is -5"
        ]
    )
    assert "During handling" not in result.stdout.str()
    assert path.read_text() == text
    path.write_text("schema: 1\nlevels: [\n")
    result = pytester.runpytest(f"--endpoint={SIM}", *GATE, "--update-baselines")
    result.stdout.fnmatch_lines([f"*{BASELINE}*"])
    assert path.read_text() == "schema: 1\nlevels: [\n"


def test_workload_change_finds_no_baseline(pytester: pytest.Pytester) -> None:
    _record(pytester)
    _suite(pytester, max_tokens=48)
    report = pytester.path / "perf.json"
    result = pytester.runpytest(f"--endpoint={SIM}", *GATE, f"--perf-json={report}")
    result.assert_outcomes(passed=1)
    assert [lv["verdict"] for lv in _levels(report)] == ["no-baseline", "no-baseline"]
    result.stdout.fnmatch_lines(["*no baseline level for *test_sweep*max_tokens*48*"])
    result = pytester.runpytest(f"--endpoint={SIM}", *GATE, "--perf-require-baseline")
    result.assert_outcomes(failed=1)


def test_update_refuses_a_run_with_failures(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    result = pytester.runpytest(f"--endpoint={SIM},error_rate=0.5", "--update-baselines", *GATE)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test_sweep: not recorded (C=1 error*--update-baselines=force*"])
    assert not (pytester.path / BASELINE).exists()
