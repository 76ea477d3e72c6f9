"""``apply_gate`` on hand-made results: how a level's absolute verdict and its baseline
comparison merge, which levels are compared at all, and that ``kimi-perf compare`` writes the
same fields and notes as the live gate."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_kimi.baseline import LevelBaseline, Provenance, TestBaseline, WorkloadKey
from pytest_kimi.cli import compare_reports
from pytest_kimi.gate import family_verdicts, two_sample
from pytest_kimi.gate.policy import (
    GateSettings,
    apply_gate,
    compared_level,
    merge_verdicts,
    result_level_key,
)
from pytest_kimi.verdicts import Verdict
from pytest_kimi.measure.metrics import LevelFigures
from pytest_kimi.measure.results import BaselineComparison, LevelResult, ThroughputResult
from pytest_kimi.workload.workload_spec import LevelSpec, Targets, Workload

BASE = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
SLOWER = [x * 0.8 for x in BASE]
FASTER = [x * 1.2 for x in BASE]
SAME = [x * 1.001 for x in BASE]
QUIET = GateSettings(session_sigma=0.0)
"""No between-session noise: the verdicts below are clear-cut (as in test_stats)."""
PROV = Provenance(model="kimi-k2.6-sim", server_info={"ep_size": 8})


def _level(
    concurrency: int, verdict: str, samples: list[float], reasons: list[str] | None = None
) -> LevelResult:
    figures = LevelFigures(
        tok_s=sorted(samples)[len(samples) // 2] if samples else None,
        trials_tok_s=list(samples),
        spread_pct=None,
        request_tok_s_p50=None,
        ttft_s_p50=None,
        ttft_s_p95=None,
        itl_s_p50=None,
        requests_ok=len(samples),
        requests_failed=0,
    )
    return LevelResult(
        spec=LevelSpec(concurrency=concurrency, rate=None, max_tokens=64),
        label=f"C={concurrency}",
        prompts_key="builtin:diverse",
        trials=[],
        figures=figures,
        verdict=verdict,
        reasons=list(reasons or []),
    )


def _result(*levels: LevelResult) -> ThroughputResult:
    workload = Workload(levels=tuple(lv.spec for lv in levels), prompts="builtin:diverse")
    return ThroughputResult(
        nodeid="test_g.py::test_sweep", workload=workload, targets=Targets(), levels=list(levels)
    )


def _baseline(
    result: ThroughputResult, samples: dict[int, list[float]], provenance: Provenance = PROV
) -> TestBaseline:
    """A baseline with these samples at these concurrencies, keyed as the result's levels."""
    levels = []
    for lv in result.levels:
        if lv.spec.concurrency in samples:
            key = WorkloadKey.from_dict(result_level_key(result, lv))
            levels.append(LevelBaseline(key, tuple(samples[lv.spec.concurrency])))
    return TestBaseline(
        test=result.nodeid, profile="sim", provenance=provenance, levels=tuple(levels)
    )


def _gate(
    result: ThroughputResult, baseline: TestBaseline | None, current: Provenance = PROV
) -> list[Any]:
    return apply_gate(result, baseline, "baselines/sim/test_g.yaml", current, QUIET)


# ------------------------------------------------------------------------- verdict merging


@pytest.mark.parametrize(
    ("samples", "verdict", "note"),
    [
        (SLOWER, "regression", "regression -20.0%"),
        (FASTER, "improved", "improved +20.0%"),
        (SAME, "pass", None),
    ],
)
def test_a_passing_level_takes_the_comparison_verdict(
    samples: list[float], verdict: str, note: str | None
) -> None:
    result = _result(_level(1, "pass", samples))
    _gate(result, _baseline(result, {1: BASE}))
    lv = result.levels[0]
    assert lv.verdict == verdict and type(lv.verdict) is str
    if note is None:
        assert lv.reasons == []
    else:
        assert len(lv.reasons) == 1 and lv.reasons[0].startswith(note)
    assert lv.to_dict()["baseline_trials"] == 5 and lv.to_dict()["baseline_trials_tok_s"] == BASE
    assert lv.to_dict()["change_pct"] == pytest.approx((samples[0] / BASE[0] - 1) * 100, abs=0.05)
    assert lv.to_dict()["verdict"] == verdict


def test_a_failing_level_stays_fail_with_the_regression_noted() -> None:
    """Missing the floor is the stronger, absolute claim; the regression is still said."""
    result = _result(
        _level(1, "fail", SLOWER, ["aggregate 800.0 tok/s < min_tok_s 900"]),
        _level(4, "fail", FASTER, ["aggregate 1200.0 tok/s < min_tok_s 5000"]),
    )
    _gate(result, _baseline(result, {1: BASE, 4: BASE}))
    slow, fast = result.levels
    assert slow.verdict == "fail" and fast.verdict == "fail"
    assert slow.reasons[0].startswith("aggregate") and slow.reasons[1].startswith(
        "regression -20.0%"
    )
    assert fast.reasons[1].startswith("improved +20.0%")
    assert slow.comparison is not None
    assert slow.comparison.p_value is not None and slow.comparison.p_value < 0.05


@pytest.mark.parametrize("verdict", ["error", "invalid", "not-run"])
def test_untrustworthy_levels_are_not_compared(verdict: str) -> None:
    result = _result(_level(1, verdict, SLOWER, ["why"]), _level(4, "pass", SLOWER))
    _gate(result, _baseline(result, {1: BASE, 4: BASE}))
    bad, good = result.levels
    assert bad.verdict == verdict and bad.reasons == ["why"] and bad.comparison is None
    assert good.verdict == "regression"


def test_a_level_without_figures_is_not_compared() -> None:
    result = _result(_level(1, "pass", []))
    _gate(result, _baseline(result, {1: BASE}))
    assert result.levels[0].verdict == "pass" and result.levels[0].comparison is None


def test_no_baseline_file() -> None:
    """No file at all: a passing level becomes no-baseline, said once for the test (not per level)."""
    result = _result(_level(1, "pass", BASE), _level(4, "fail", BASE, ["floor"]))
    assert _gate(result, None) == []
    ok, failed = result.levels
    assert ok.verdict == "no-baseline" and ok.reasons == []
    assert failed.verdict == "fail" and failed.reasons == ["floor"]
    for lv in result.levels:
        assert lv.comparison == BaselineComparison(found=False)
        data = lv.to_dict()
        assert {k: data[k] for k in ("baseline_tok_s", "change_pct", "ci90", "p_value")} == {
            "baseline_tok_s": None,
            "change_pct": None,
            "ci90": None,
            "p_value": None,
        }


def test_no_baseline_level_in_the_file_says_why() -> None:
    result = _result(_level(1, "pass", BASE), _level(8, "pass", SLOWER))
    _gate(result, _baseline(result, {8: BASE}))
    missing, compared = result.levels
    assert missing.verdict == "no-baseline"
    assert len(missing.reasons) == 1 and "no baseline level" in missing.reasons[0]
    assert compared.verdict == "regression"


def test_the_regression_note_names_what_changed() -> None:
    result = _result(_level(1, "pass", SLOWER))
    current = Provenance(model="kimi-k2.6-sim", server_info={"ep_size": 4})
    changes = _gate(result, _baseline(result, {1: BASE}), current)
    assert [str(c) for c in changes] == ["ep_size: 8 -> 4"]
    assert result.levels[0].reasons[0].endswith("; changed: ep_size: 8 -> 4")


def test_strict_flags_only_change_which_verdicts_fail_not_the_verdicts() -> None:
    result = _result(_level(1, "pass", BASE))
    apply_gate(result, None, "x", PROV, GateSettings(strict=True, require_baseline=True))
    assert result.levels[0].verdict == "no-baseline"
    assert [
        lv.label
        for lv in result.failing_levels(GateSettings(require_baseline=True).failing_verdicts())
    ] == ["C=1"]
    assert result.failing_levels() == []


def test_merge_verdicts() -> None:
    for compared in Verdict:
        assert merge_verdicts("pass", compared) == compared.value
        assert merge_verdicts("fail", compared) == "fail"


# --------------------------------------------------------------- one wording, two callers


def _report(samples: dict[int, list[float]]) -> dict[str, Any]:
    levels = [
        {
            "label": f"C={c}",
            "concurrency": c,
            "rate": None,
            "max_tokens": 64,
            "prompts": "builtin:diverse",
            "tok_s": s[2],
            "trials_tok_s": s,
            "verdict": "pass",
            "reasons": [],
            "errors": [],
        }
        for c, s in samples.items()
    ]
    return {
        "schema": 1,
        "endpoint": {"model": "kimi-k2.6-sim", "server_info": {}},
        "tests": [
            {
                "nodeid": "test_g.py::test_sweep",
                "workload": {"prompts": "builtin:diverse"},
                "outcome": "passed",
                "levels": levels,
            }
        ],
    }


def test_offline_compare_writes_what_the_gate_writes() -> None:
    old = _report({1: BASE, 4: BASE, 8: BASE})
    new = copy.deepcopy(old)
    for lv, samples in zip(new["tests"][0]["levels"], (SLOWER, FASTER, SAME)):
        lv["trials_tok_s"] = samples
    cmp = compare_reports(
        old,
        new,
        tolerance=two_sample.DEFAULT_TOLERANCE,
        alpha=two_sample.DEFAULT_ALPHA,
        session_sigma=0.0,
    )
    rows = cmp.report["tests"][0]["levels"]
    comparisons = family_verdicts.compare_test(
        [(BASE, s) for s in (SLOWER, FASTER, SAME)],
        tolerance=two_sample.DEFAULT_TOLERANCE,
        alpha=two_sample.DEFAULT_ALPHA,
        session_sigma=0.0,
    )
    for row, c in zip(rows, comparisons):
        fields, note = compared_level(
            c, BASE, tolerance=two_sample.DEFAULT_TOLERANCE, alpha=two_sample.DEFAULT_ALPHA
        )
        fields_dict = fields.to_dict()
        assert {k: row[k] for k in fields_dict} == fields_dict
        assert row["verdict"] == c.verdict.value
        assert row["reasons"] == ([note] if note else [])
    assert [r["verdict"] for r in rows] == ["regression", "improved", "pass"]
    # and the live gate, on the same samples, reads the same
    result = _result(_level(1, "pass", SLOWER), _level(4, "pass", FASTER), _level(8, "pass", SAME))
    _gate(result, _baseline(result, {1: BASE, 4: BASE, 8: BASE}))
    for row, lv in zip(rows, result.levels):
        assert row["reasons"] == lv.reasons
        for key in (
            "baseline_tok_s",
            "change_pct",
            "ci90",
            "p_value",
            "min_detectable_drop_pct",
            "tolerance_pct",
        ):
            assert row[key] == lv.to_dict()[key], key
