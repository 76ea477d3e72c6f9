"""``kimi-perf calibrate``: the measured noise, and what it lets the gate vouch for.

The figures are the gate's own functions at the measured noise (checked against them here), the
warnings appear exactly where the settings cannot be met, and the command reads a real
``--perf-sessions`` report of the simulator (its sessions draw known noise factors).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_kimi.cli import main
from pytest_kimi.gate import two_sample
from pytest_kimi.gate.calibration import calibrate, paired_launches_needed, stored_mdd
from pytest_kimi.gate.paired import compare_paired
from pytest_kimi.gate.session_noise import NoiseEstimate

pytest_plugins = ["pytester"]


def _estimate(sigma: float, within: float = 0.003, sessions: int = 5) -> NoiseEstimate:
    return NoiseEstimate(
        sigma=sigma,
        low=sigma / 2,
        high=sigma * 3,
        sessions=sessions,
        trials=3 * sessions,
        within_sd=within,
        df_between=sessions - 1,
    )


def test_quiet_noise_vouches_and_warns_of_nothing() -> None:
    cal = calibrate("t C=1", _estimate(0.004))
    assert cal.sigma == 0.005  # rounded up as the gate uses it
    assert cal.vouchable_drop == pytest.approx(
        two_sample.smallest_vouchable_drop(0.05, 0.05, 0.005, 0.95)
    )
    assert cal.vouchable_drop < cal.stored_mdd < 0.15
    assert cal.paired_launches == 4 and cal.warnings() == []


def test_loud_noise_says_what_cannot_be_vouched_and_what_can() -> None:
    cal = calibrate("t C=1", _estimate(0.06))
    words = " ".join(cal.warnings())
    assert "more than the tolerance 5%" in words
    assert "pass is unreachable against a stored baseline" in words
    assert cal.vouchable_drop > 0.15
    # the paired comparison still can, given launches
    assert cal.paired_launches is not None and cal.paired_launches > 4


def test_the_paired_launches_are_where_the_comparison_reaches_the_drop() -> None:
    """At the launches it names, the comparison's own minimum detectable drop is within the
    target, and at one block fewer it is not."""
    sd = 0.02
    n = paired_launches_needed(
        sd, tolerance=0.05, alpha=0.05, power=0.95, detectable_drop=0.1, max_launches=12
    )
    assert n is not None and n > 4

    def mdd(launches: int) -> float:
        k = launches // 2
        # k launches a side whose log figures have a sample sd of exactly `sd`
        x = np.array([(-1.0) ** i for i in range(k)])
        x -= x.mean()
        x /= x.std(ddof=1)
        side = list(np.exp(sd * x))
        return compare_paired(side, side, max_blocks=6, tolerance=0.05).min_detectable_drop

    assert mdd(n) <= 0.1 + 1e-9
    assert mdd(n - 2) > 0.1


def test_more_trials_lower_the_stored_mdd_but_not_below_the_session_floor() -> None:
    few = stored_mdd(0.01, 0.02, 3, tolerance=0.05, alpha=0.05, power=0.95)
    many = stored_mdd(0.01, 0.02, 30, tolerance=0.05, alpha=0.05, power=0.95)
    floor = two_sample.smallest_vouchable_drop(0.05, 0.05, 0.01, 0.95)
    assert few > many > floor


def test_the_command_reads_a_sessions_report_of_the_simulator(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makepyfile(
        test_suite="""
        from pytest_kimi import throughput

        @throughput(concurrency=[4], max_tokens=64, trials=3)
        def test_x():
            pass
        """
    )
    report = pytester.path / "aa.json"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--endpoint=sim:speed=10,stream_interval=8,noise=0.02,seed=19",
        "--perf-sessions=4",
        f"--perf-json={report}",
    )
    result.assert_outcomes(passed=4)
    out_json = pytester.path / "cal.json"
    code = main(["calibrate", str(report), "--json", str(out_json)])
    text = capsys.readouterr().out
    assert code == 0
    assert "test_suite.py::test_x C=4: session noise" in text
    assert "stored baseline: catches a" in text and "paired: vouches for a 15% drop" in text
    figures = json.loads(out_json.read_text())
    assert figures[-1]["where"] == "all levels pooled"
    section = json.loads(report.read_text())["session_noise"]
    assert figures[-1]["estimate"]["sigma"] == section["pooled"]["sigma"]


def test_a_report_without_sessions_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"schema": 1, "tests": []}))
    assert main(["calibrate", str(path)]) == 2
    assert "needs a run with --perf-sessions 2 or more" in capsys.readouterr().err
    assert main(["calibrate"]) == 2
    assert "--sessions N (2 or more)" in capsys.readouterr().err
