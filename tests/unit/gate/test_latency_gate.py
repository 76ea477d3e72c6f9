"""The latency gate (pytest_kimi/gate/latency_gate.py) on synthetic trials: per-trial TTFT and
ITL figures, their comparison with a baseline's, the verdicts and reasons it gives, what the
baseline file stores, and what every report shows of it."""

from __future__ import annotations

import math
import random
import re
from array import array

import pytest

from pytest_kimi.baseline import BaselineError, LevelBaseline, TestBaseline, WorkloadKey
from pytest_kimi.baseline.provenance import Provenance
from pytest_kimi.baseline.update import reference_baseline
from pytest_kimi.baseline.yaml_io import dumps, loads
from pytest_kimi.gate.latency_gate import (
    OLD_BASELINE,
    apply_latency_gate,
    latency_tolerance,
    rate_tolerance,
)
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.latency import trial_latencies
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.results import ThroughputResult, judge_level, level_key, workload_dict
from pytest_kimi.report.html import render_html
from pytest_kimi.report.junit import junit_properties
from pytest_kimi.report.markdown import render_markdown
from pytest_kimi.report.terminal import format_test
from pytest_kimi.workload.capacity_marker import parse_capacity
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import LevelSpec, MarkerError, Targets, Workload
from support.paths import REPO

LEVEL = LevelSpec(concurrency=1, rate=None, max_tokens=32)
WORKLOAD = Workload(levels=(LEVEL,))


def _record(index: int, start: float, ttft: float, itl: float, tokens: int = 32) -> RequestRecord:
    """A stream sent at ``start`` whose first token comes ``ttft`` later, then one per ``itl``."""
    rec = RequestRecord(
        index=index, worker=0, scheduled=start, sent=start, status=200, completion_tokens=tokens
    )
    rec.first_token = start + ttft
    rec.chunk_times = array("d", [start + ttft + i * itl for i in range(tokens)])
    rec.chunk_events = array("I", [1] * tokens)
    rec.end = rec.chunk_times[-1]
    return rec


def _trial(
    index: int, ttft: float, itl: float, *, valid: bool = True, requests: int = 20
) -> TrialResult:
    """``requests`` requests of a trial, their TTFTs spread +-10% around ``ttft``: 20 by
    default, the fewest a per-trial p95 is taken from (``min_values``)."""
    last = max(requests - 1, 1)
    records = [
        _record(i, i * 10.0, ttft * (0.9 + 0.2 * i / last), itl * (0.98 + 0.04 * i / last))
        for i in range(requests)
    ]
    return TrialResult(
        index=index,
        label="C=1",
        tok_s=1.0 / itl,
        window_s=1.0,
        window_tokens=1.0 / itl,
        requests_ok=requests,
        requests_failed=0,
        wall_s=40.0,
        client=ClientSignals(),
        records=records,
        invalid=[] if valid else ["a made-up reason"],
    )


def _result(
    ttft: float,
    itl: float = 0.015,
    trials: int = 3,
    *,
    seed: int = 0,
    noise: float = 0.02,
    targets: Targets | None = None,
) -> ThroughputResult:
    """A one-level result whose trials' latencies scatter by ``noise`` (log sd) around the
    given TTFT and ITL; tok/s is the same whatever the TTFT."""
    rng = random.Random(seed)
    runs = [
        _trial(i, ttft * math.exp(rng.gauss(0, noise)), itl * math.exp(rng.gauss(0, noise)))
        for i in range(trials)
    ]
    targets = Targets() if targets is None else targets
    level = judge_level(LEVEL, WORKLOAD, targets, runs, "builtin:diverse")
    return ThroughputResult("t.py::t", WORKLOAD, targets, levels=[level])


def _baseline(ttft: float = 0.02, itl: float = 0.015) -> TestBaseline:
    """A recorded baseline of 10 trials (the A/B reference path shapes it as the update does)."""
    recorded = _result(ttft, itl, trials=10, seed=99)
    apply_latency_gate(recorded, None)
    return reference_baseline(recorded, Provenance(model="m"), "sim")


# ------------------------------------------------------------------------------- the statistic


def test_a_latency_tolerance_is_the_same_log_margin_as_a_rate_drop() -> None:
    assert rate_tolerance(0.25) == pytest.approx(0.2)  # 25% slower = a rate 20% lower
    assert rate_tolerance(1.0) == pytest.approx(0.5)  # twice as slow = half the rate
    assert math.log(1 - rate_tolerance(0.25)) == pytest.approx(-math.log(1.25))
    for bad in (0.0, -0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="latency tolerance"):
            rate_tolerance(bad)


def test_each_valid_trial_gives_one_figure_per_statistic() -> None:
    trials = [
        _trial(0, 0.02, 0.01, requests=100),
        _trial(1, 0.04, 0.02, requests=100),
        _trial(2, 0.08, 0.04, valid=False, requests=100),
    ]
    got = trial_latencies(trials, 99.0)
    assert set(got) == {"ttft_s", "itl_s"} and set(got["ttft_s"]) == {"p50", "p99"}
    assert len(got["ttft_s"]["p50"]) == 2, "the invalid trial is no sample"
    assert got["ttft_s"]["p50"] == pytest.approx([0.02, 0.04], rel=0.05)
    assert got["ttft_s"]["p99"][0] > got["ttft_s"]["p50"][0]
    assert got["itl_s"]["p50"] == pytest.approx([0.01, 0.02], rel=0.03)
    assert trial_latencies(trials, 50.0)["ttft_s"].keys() == {"p50"}
    # in the server's clock: a simulator at speed 10 has its latencies multiplied by 10
    assert trial_latencies(trials, 50.0, clock=10.0)["ttft_s"]["p50"][0] == pytest.approx(
        10 * got["ttft_s"]["p50"][0]
    )


# ---------------------------------------------------------------------------------- verdicts


def test_doubled_ttft_at_equal_tok_s_is_a_regression_naming_ttft() -> None:
    current = _result(0.04)
    apply_latency_gate(current, _baseline())
    (level,) = current.levels
    assert level.verdict == "regression"
    assert level.latency is not None and level.latency.compared
    verdicts = {f.name: f.verdict for f in level.latency.figures}
    assert verdicts == {
        "ttft_s_p50": "regression",
        "ttft_s_p95": "regression",
        "itl_s_p50": "pass",
        "itl_s_p95": "pass",
    }
    reasons = [r for r in level.reasons if r.startswith("latency regression")]
    assert len(reasons) == 2
    assert "TTFT p95" in reasons[1] and "vs baseline" in reasons[1]
    assert "latency tolerance +25%" in reasons[1]
    ttft = level.latency.figure("ttft_s", "p95")
    assert ttft is not None and ttft.change_pct == pytest.approx(100, abs=10)
    assert ttft.ci90 is not None and ttft.ci90[0] is not None and ttft.ci90[0] > 25
    assert ttft.p_adjusted is not None and ttft.p_value is not None
    assert ttft.p_adjusted >= ttft.p_value  # Holm over the test's four figures


def test_unchanged_latency_passes_and_leaves_the_verdict_alone() -> None:
    current = _result(0.02, seed=5)
    apply_latency_gate(current, _baseline())
    (level,) = current.levels
    assert level.verdict == "pass" and level.reasons == []
    assert level.latency is not None and level.latency.compared and level.latency.note is None
    assert {f.verdict for f in level.latency.figures} == {"pass"}
    assert all(f.change_pct is not None and abs(f.change_pct) < 10 for f in level.latency.figures)


def test_the_tolerance_decides_what_slow_down_is_tolerated() -> None:
    # 30% slower with little noise: beyond a 2% tolerance, within a 50% one
    for tolerance, verdict in ((0.02, "regression"), (0.5, "pass")):
        current = _result(0.026, seed=7, noise=0.005)
        apply_latency_gate(current, _baseline(), tolerance=tolerance, session_sigma=0.0)
        assert current.levels[0].verdict == verdict, tolerance
        fig = current.levels[0].latency.figure("ttft_s", "p50")  # type: ignore[union-attr]
        assert fig is not None and fig.verdict == verdict
        assert fig.change_pct == pytest.approx(30, abs=5)
    current = _result(0.022, seed=7, noise=0.005)  # 10% slower: within the default 25%
    apply_latency_gate(current, _baseline(), session_sigma=0.0)
    assert current.levels[0].verdict == "pass"


def test_a_latency_regression_never_replaces_fail() -> None:
    current = _result(0.04, targets=Targets(max_ttft_s=0.03))  # the ceiling is missed too
    assert current.levels[0].verdict == "fail"
    apply_latency_gate(current, _baseline())
    (level,) = current.levels
    assert level.verdict == "fail"
    assert any(r.startswith("TTFT p95") for r in level.reasons)  # the target's reason
    assert any(r.startswith("latency regression: TTFT") for r in level.reasons)
    fig = level.latency.figure("ttft_s", "p95")  # type: ignore[union-attr]
    assert fig is not None and fig.target == 0.03
    assert level.latency.figure("ttft_s", "p50").target is None  # type: ignore[union-attr]


def test_an_old_baseline_without_latency_loads_and_is_not_compared() -> None:
    base = _baseline()
    (stored,) = base.levels
    old = LevelBaseline(stored.workload, stored.trials_tok_s, ttft_s={"p50": 0.02, "p95": 0.022})
    text = dumps(TestBaseline(base.test, base.profile, base.provenance, (old,)))
    assert "trials_ttft_s" not in text and "itl_s" not in text
    loaded = loads(text)  # a file written before the latency gate
    current = _result(0.04)
    apply_latency_gate(current, loaded)
    (level,) = current.levels
    assert level.verdict == "pass", "nothing to compare latency with: it cannot regress"
    assert level.latency is not None and not level.latency.compared
    assert level.latency.note == OLD_BASELINE
    assert "not compared" in OLD_BASELINE and "--update-baselines" in OLD_BASELINE
    # the old file's pooled TTFT is still shown as the baseline's figure
    assert level.latency.figure("ttft_s", "p95").baseline == 0.022  # type: ignore[union-attr]
    assert level.latency.figure("itl_s", "p50").baseline is None  # type: ignore[union-attr]


def test_no_baseline_or_an_invalid_level_is_not_compared() -> None:
    current = _result(0.04)
    apply_latency_gate(current, None)
    assert current.levels[0].latency.note == "latency not compared: no baseline"  # type: ignore[union-attr]
    assert current.levels[0].latency.figures[0].trials  # type: ignore[union-attr]
    current = _result(0.04)
    current.levels[0].verdict = "invalid"
    apply_latency_gate(current, _baseline())
    assert current.levels[0].verdict == "invalid"
    assert "invalid" in (current.levels[0].latency.note or "")  # type: ignore[union-attr]


def test_another_percentile_than_the_baseline_s_is_said() -> None:
    current = _result(0.02, targets=Targets(percentile=99))
    apply_latency_gate(current, _baseline())
    latency = current.levels[0].latency
    assert latency is not None and latency.compared  # p50 still is
    assert latency.note is not None and "TTFT p99, ITL p99" in latency.note


def test_the_marker_s_latency_tolerance_overrides_the_session_s() -> None:
    _, targets = parse_throughput((), {"latency_tolerance": 0.5})
    assert targets.latency_tolerance == 0.5
    assert latency_tolerance(targets, 0.25) == 0.5
    assert latency_tolerance(Targets(), 0.25) == 0.25
    with pytest.raises(MarkerError, match="latency_tolerance"):
        parse_throughput((), {"latency_tolerance": -1})
    with pytest.raises(MarkerError, match="latency_tolerance= is"):
        parse_capacity((), {"max_itl_s": 0.05, "latency_tolerance": 0.5})


# ---------------------------------------------------------------------------------- baseline


def test_the_baseline_file_stores_each_trial_s_latency() -> None:
    base = _baseline()
    text = dumps(base)
    assert "trials_ttft_s: {p50: [" in text and "trials_itl_s: {p50: [" in text
    assert "itl_s: {p50: " in text
    again = loads(text)
    assert again == base and dumps(again) == text
    (level,) = again.levels
    assert len(level.latency_trials("ttft_s", "p95")) == 10
    assert level.latency_trials("ttft_s", "p99") == ()
    key = level_key(_result(0.02).levels[0].to_dict(), workload_dict(WORKLOAD))
    assert again.level_for(key) is level
    bad = text.replace("trials_ttft_s: {p50: [", "trials_ttft_s: {p50: [-1, ", 1)
    with pytest.raises(BaselineError, match="trials_ttft_s.p50 must be a list of positive"):
        loads(bad)
    with pytest.raises(ValueError, match="keys must be percentiles"):
        LevelBaseline(WorkloadKey.from_dict({"concurrency": 1}), (1.0,), trials_itl_s={"x": [1]})


# ----------------------------------------------------------------------------------- reports


def test_every_report_shows_measured_target_and_baseline_latency() -> None:
    current = _result(0.04, targets=Targets(max_ttft_s=0.5))
    apply_latency_gate(current, _baseline())
    test = {**current.to_dict(), "outcome": "failed"}
    section = test["levels"][0]["latency"]
    assert set(section["figures"]) == {"ttft_s_p50", "ttft_s_p95", "itl_s_p50", "itl_s_p95"}
    p95 = section["figures"]["ttft_s_p95"]
    assert p95["target"] == 0.5 and p95["verdict"] == "regression"
    shown = f"{p95['value']:.4g} (max 0.5) vs {p95['baseline']:.4g}"
    terminal = "\n".join(format_test(test))
    assert "TTFT p95 s" in terminal and shown in terminal and "regression (TTFT p50" in terminal
    markdown = render_markdown({"tests": [test]})
    assert "| level | TTFT p50 s | TTFT p95 s | ITL p50 ms | ITL p95 ms |" in markdown
    assert shown in markdown and "tolerance +25% slower" in markdown
    page = render_html({"tests": [test]})
    assert '<table class="latency">' in page and shown in page
    props = dict(junit_properties(test))
    assert props["kimi.C1.ttft_s_p95_target"] == 0.5
    assert props["kimi.C1.ttft_s_p95_baseline"] == p95["baseline"]
    assert props["kimi.C1.ttft_s_p95"] == test["levels"][0]["ttft_s_p95"]
    assert props["kimi.C1.ttft_s_p95_verdict"] == "regression"
    assert props["kimi.C1.itl_s_p95"] == section["figures"]["itl_s_p95"]["value"]


def test_a_report_says_when_latency_was_not_compared() -> None:
    current = _result(0.02)
    apply_latency_gate(current, None)
    test = {**current.to_dict(), "outcome": "passed"}
    assert "C=1: latency not compared: no baseline" in "\n".join(format_test(test))
    assert "not compared" in render_markdown({"tests": [test]})


def test_every_latency_key_is_documented_in_the_json_schema() -> None:
    """tests/unit/core/test_json_schema.py builds a level without a latency section: this checks its keys."""
    doc = (REPO / "docs" / "reference" / "json-report.md").read_text()
    documented = set(re.findall(r"`([a-z_0-9]+)`", doc))
    current = _result(0.04)
    apply_latency_gate(current, _baseline())
    section = current.levels[0].to_dict()["latency"]
    assert "latency" in documented
    assert not set(section) - documented
    for figure in section["figures"].values():
        assert not set(figure) - documented


def test_a_regression_reason_shows_the_figures_its_change_comes_from() -> None:
    """Issue 34: "TTFT p95 0.1125 vs 0.1463 +24.8%" read as a rise beside a value that fell:
    the pooled figures and the per-trial ones can disagree, so the reason gives both, and the
    change is exactly the per-trial geometric means' ratio."""
    from pytest_kimi.gate.latency_gate import regression_reason
    from pytest_kimi.measure.latency import LatencyFigure

    fig = LatencyFigure(
        "ttft_s",
        "p95",
        0.1125,
        trials=(0.15, 0.16, 0.14),
        baseline=0.1463,
        baseline_trials=(0.12, 0.121, 0.119),
        change_pct=round(
            (math.exp(sum(map(math.log, (0.15, 0.16, 0.14))) / 3) / 0.12 - 1) * 100, 2
        ),
        ci90=(20.0, 30.0),
    )
    text = regression_reason(fig, 0.25, 0.01)
    assert "0.1125 s vs baseline 0.1463 s" in text
    assert "per trial (geometric means) 0.1498 s vs 0.12 s: +24.8%" in text
