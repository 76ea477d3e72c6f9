"""Tests of the statistical gate: Holm, the Welch/session test, verdicts, edge cases, and a
seeded power simulation asserting the acceptance properties (false alarms, power)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from scipy import stats as st

from pytest_kimi.gate.stats import (
    FINAL_LOOK_SHARE,
    LevelComparison,
    StopReason,
    Verdict,
    compare_batch,
    compare_level,
    compare_test,
    decide,
    decide_batch,
    estimate_session_sigma,
    holm,
    look_schedule,
    look_weights,
)

BASE = [1000.0, 1010.0, 990.0, 1005.0, 995.0]


# --------------------------------------------------------------------------- Holm


def test_holm_hand_computed() -> None:
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1, monotone: 0.3*3=0.9, 0.4*2=0.8 -> 0.9, 0.9*1 -> 0.9
    assert holm([0.4, 0.3, 0.9]) == pytest.approx([0.9, 0.9, 0.9])
    assert holm([0.6, 0.5]) == pytest.approx([1.0, 1.0])
    assert holm([0.02]) == pytest.approx([0.02])
    assert holm([]) == []


def test_holm_ties_and_nan_passthrough() -> None:
    assert holm([0.01, 0.01, 0.01]) == pytest.approx([0.03, 0.03, 0.03])
    out = holm([0.01, math.nan, 0.04])  # m = 2: 0.02, max(0.02, 0.04)
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)


def test_holm_equals_closed_testing_of_bonferroni() -> None:
    """Holm is the closed-testing procedure over Bonferroni local tests; brute-force it."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        m = int(rng.integers(1, 6))
        p = rng.uniform(0, 0.2, m).round(3).tolist()
        brute = []
        for i in range(m):
            worst = 0.0
            for size in range(1, m + 1):
                for subset in itertools.combinations(range(m), size):
                    if i in subset:
                        worst = max(worst, min(1.0, size * min(p[j] for j in subset)))
            brute.append(worst)
        assert holm(p) == pytest.approx(brute)


def test_holm_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        holm([0.1, 1.2])


# --------------------------------------------------------------------------- the test itself


def test_matches_scipy_welch_without_session_noise() -> None:
    """With session_sigma=0 the regression p is scipy's one-sided Welch t-test on log scale,
    shifted by the margin."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        b = 1000 * np.exp(rng.normal(0, 0.02, int(rng.integers(2, 11))))
        c = 960 * np.exp(rng.normal(0, 0.03, int(rng.integers(2, 11))))
        r = compare_level(b, c, session_sigma=0.0, tolerance=0.05)
        ref = st.ttest_ind(
            np.log(c) - math.log(0.95), np.log(b), equal_var=False, alternative="less"
        )
        assert r.p_regression_raw == pytest.approx(ref.pvalue, rel=1e-9)
        assert r.df == pytest.approx(ref.df, rel=1e-9)
        up = st.ttest_ind(
            np.log(c) - math.log(1.05), np.log(b), equal_var=False, alternative="greater"
        )
        assert r.p_improved_raw == pytest.approx(up.pvalue, rel=1e-9)
        assert r.p_pass_raw == pytest.approx(1 - r.p_regression_raw)


def test_session_sigma_adds_known_variance() -> None:
    b, c = [1000, 1020, 980], [930, 950, 940]
    naive = compare_level(b, c, session_sigma=0.0)
    honest = compare_level(b, c, session_sigma=0.03)
    assert honest.se_log**2 == pytest.approx(naive.se_log**2 + 0.03**2)
    assert honest.df > naive.df  # the known part carries no estimation uncertainty
    assert honest.p_regression > naive.p_regression
    assert honest.ratio == pytest.approx(naive.ratio)


def test_ratio_ci_and_medians() -> None:
    r = compare_level([100, 100, 400], [50, 50, 200], session_sigma=0.0)
    assert r.ratio == pytest.approx(0.5)  # geometric means, not arithmetic
    assert r.baseline_median == 100 and r.current_median == 50
    lo, hi = r.ci90
    assert lo < r.ratio < hi
    assert (r.n_baseline, r.n_current) == (3, 3)


@pytest.mark.parametrize("session", [0.0, 0.03])
def test_ci90_covers_true_ratio_at_nominal_rate(session: float) -> None:
    rng = np.random.default_rng(2024)
    sims, true_ratio = 4000, 0.9
    b = 1000 * np.exp(rng.normal(0, 0.02, (sims, 4)))
    c = (
        1000
        * true_ratio
        * np.exp(rng.normal(0, session, (sims, 1)) + rng.normal(0, 0.02, (sims, 6)))
    )
    res = compare_batch(b, c, session_sigma=session)
    cover = np.mean((res.ci_lo <= true_ratio) & (true_ratio <= res.ci_hi))
    assert 0.88 <= cover <= 0.92, cover


def test_estimate_session_sigma_recovers_the_simulated_value() -> None:
    rng = np.random.default_rng(8)
    per_session = 0.03 / math.sqrt(2)  # ratio of two sessions has sd 3%
    sessions = [
        1000 * np.exp(rng.normal(0, per_session) + rng.normal(0, 0.02, 5)) for _ in range(400)
    ]
    assert estimate_session_sigma(sessions) == pytest.approx(0.03, rel=0.1)
    assert estimate_session_sigma([[1000, 1001], [1000, 1001]]) == 0.0
    with pytest.raises(ValueError):
        estimate_session_sigma([[1000.0, 1010.0]])


# --------------------------------------------------------------------------- verdicts


def test_verdict_order_cases() -> None:
    quiet = dict(session_sigma=0.0)
    assert compare_level(BASE, [x * 0.8 for x in BASE], **quiet).verdict is Verdict.REGRESSION
    assert compare_level(BASE, [x * 1.2 for x in BASE], **quiet).verdict is Verdict.IMPROVED
    assert compare_level(BASE, [x * 1.01 for x in BASE], **quiet).verdict is Verdict.PASS
    # estimate right on the margin, precise data: not significant, but well powered
    at_margin = compare_level(BASE, [x * 0.95 for x in BASE], **quiet)
    assert at_margin.verdict is Verdict.INCONCLUSIVE
    assert at_margin.min_detectable_drop < 0.05
    # same data, 3% session noise and a 1% drop: cannot certify 5%
    weak = compare_level(BASE, [x * 0.99 for x in BASE])
    assert weak.verdict is Verdict.UNDERPOWERED
    assert weak.min_detectable_drop > 0.05


def test_significant_beats_underpowered() -> None:
    """A clear 30% drop is a regression even though the MDD exceeds the tolerance."""
    r = compare_level([1000, 1050, 950], [700, 740, 660], session_sigma=0.03)
    assert r.min_detectable_drop > 0.05
    assert r.verdict is Verdict.REGRESSION


def test_holm_across_levels_changes_the_verdict() -> None:
    cur = [x * 0.939 for x in [1000, 1012, 988, 1003, 997]]
    alone = compare_level(BASE, cur, session_sigma=0.0)
    assert 0.025 < alone.p_regression < 0.05 and alone.verdict is Verdict.REGRESSION
    both = compare_test([(BASE, cur), (BASE, cur)], session_sigma=0.0)
    for lv in both:
        assert lv.p_regression == pytest.approx(2 * alone.p_regression)
        assert lv.p_regression_raw == pytest.approx(alone.p_regression)
        assert lv.verdict is not Verdict.REGRESSION
    # a clear regression elsewhere does not need the other level's help
    mixed = compare_test([(BASE, [x * 0.7 for x in BASE]), (BASE, cur)], session_sigma=0.0)
    assert mixed[0].verdict is Verdict.REGRESSION
    assert mixed[1].p_regression == pytest.approx(alone.p_regression)  # Holm step 2: x1


def test_alpha_weight_divides_p_values() -> None:
    cur = [x * 0.939 for x in [1000, 1012, 988, 1003, 997]]
    full = compare_level(BASE, cur, session_sigma=0.0)
    early = compare_level(BASE, cur, session_sigma=0.0, alpha_weight=0.1)
    assert early.p_regression == pytest.approx(min(1.0, full.p_regression / 0.1))
    assert early.verdict is not Verdict.REGRESSION


def test_to_dict_is_json_ready() -> None:
    d = compare_level(BASE, [x * 0.9 for x in BASE]).to_dict()
    json.dumps(d)
    assert d["verdict"] == "regression" and isinstance(d["ci90"], list)
    assert set(d) == set(LevelComparison.__dataclass_fields__)


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("bad", [0.0, -5.0, math.nan, math.inf])
def test_invalid_throughput_raises(bad: float) -> None:
    with pytest.raises(ValueError, match=r"finite and > 0 tok/s.*current\[1\]"):
        compare_level(BASE, [1000.0, bad, 990.0])
    with pytest.raises(ValueError, match="baseline"):
        decide([1000.0, bad], [1000.0, 1000.0, 1000.0], look=0)


def test_non_numeric_raises() -> None:
    with pytest.raises(ValueError, match="numbers"):
        compare_level(["fast", "slow"], BASE)  # type: ignore[list-item]


def test_empty_current_raises_and_empty_baseline_is_no_baseline() -> None:
    with pytest.raises(ValueError, match="no current trials"):
        compare_level(BASE, [])
    r = compare_level([], [1000.0, 1001.0])
    assert r.verdict is Verdict.NO_BASELINE and r.n_baseline == 0
    assert math.isnan(r.p_regression) and r.current_median == 1000.5
    # a level without baseline stays out of the Holm family
    levels = compare_test([([], BASE), (BASE, [x * 0.939 for x in BASE])], session_sigma=0.0)
    alone = compare_level(BASE, [x * 0.939 for x in BASE], session_sigma=0.0)
    assert levels[1].p_regression == pytest.approx(alone.p_regression)


def test_single_samples() -> None:
    one = compare_level([1000.0], [800.0])
    assert one.verdict is Verdict.UNDERPOWERED
    assert one.p_regression == 1.0 and one.ci90 == (0.0, math.inf)
    assert one.min_detectable_drop == 1.0 and one.ratio == pytest.approx(0.8)
    # one side single: borrows the other side's scatter, still a real test
    r = compare_level(BASE, [700.0], session_sigma=0.0)
    assert r.verdict is Verdict.REGRESSION and math.isfinite(r.df) and r.df == pytest.approx(4)
    r = compare_level([1000.0], [700.0, 705.0, 695.0], session_sigma=0.0)
    assert r.verdict is Verdict.REGRESSION and r.df == pytest.approx(2)


@pytest.mark.parametrize("session", [0.0, 0.03])
def test_identical_samples_do_not_divide_by_zero(session: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = compare_level([1000.0] * 3, [1000.0] * 3, session_sigma=session)
        drop = compare_level([1000.0] * 3, [900.0] * 4, session_sigma=session)
        up = compare_level([1000.0] * 3, [1200.0] * 3, session_sigma=session)
        dec = decide([1000.0] * 3, [1000.0] * 3, look=0, session_sigma=session)
    for r in (same, drop, up):
        assert all(math.isfinite(x) for x in (r.p_regression, r.se_log, r.df, *r.ci90))
    assert drop.verdict is Verdict.REGRESSION and up.verdict is Verdict.IMPROVED
    if session == 0.0:  # a noiseless simulator: exact answers
        assert same.verdict is Verdict.PASS and same.ci90 == pytest.approx((1, 1), abs=1e-3)
        assert dec.stop and dec.reason is StopReason.PASS


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(tolerance=0.0),
        dict(tolerance=1.0),
        dict(alpha=0.5),
        dict(alpha=0.0),
        dict(session_sigma=-0.1),
        dict(alpha_weight=0.0),
        dict(power=1.0),
    ],
)
def test_bad_parameters_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        compare_level(BASE, BASE, **kwargs)


# --------------------------------------------------------------------------- adaptive trials


def test_schedule_and_weights() -> None:
    assert look_schedule() == (3, 10)
    assert look_schedule(5, 5) == (5,)
    assert look_weights(1) == (1.0,)
    w = look_weights(2)
    assert sum(w) == pytest.approx(1.0) and w[-1] == FINAL_LOOK_SHARE
    with pytest.raises(ValueError):
        look_schedule(4, 3)


def test_decide_stops_on_clear_regression() -> None:
    d = decide(BASE, [800.0, 805.0, 795.0], look=0)
    assert d.stop and d.next_trials == 0 and d.reason is StopReason.REGRESSION
    assert d.alpha_weight == pytest.approx(1 - FINAL_LOOK_SHARE)
    assert d.comparison.verdict is Verdict.REGRESSION
    assert d.comparison.alpha_weight == d.alpha_weight


def test_decide_continues_when_unclear_and_stops_at_final_look() -> None:
    cur = [940.0, 960.0, 950.0]
    d = decide(BASE, cur, look=0, futility=0.0)
    assert not d.stop and d.reason is StopReason.CONTINUE and d.next_trials == 7
    last = decide(BASE, cur + [950.0] * 7, look=1, futility=0.0)
    assert last.stop and last.next_trials == 0 and last.alpha_weight == FINAL_LOOK_SHARE


def test_decide_futility_when_session_noise_makes_the_answer_unreachable() -> None:
    d = decide(BASE, [975.0, 980.0, 985.0], look=0)  # 2% drop: 5% cannot be certified
    assert d.stop and d.reason is StopReason.FUTILITY
    assert d.comparison.verdict is Verdict.UNDERPOWERED


def test_decide_without_baseline_runs_the_whole_schedule() -> None:
    d = decide([], [1000.0] * 3, look=0)
    assert not d.stop and d.reason is StopReason.NO_BASELINE and d.next_trials == 7
    assert decide([], [1000.0] * 10, look=1).stop


def test_decide_n_levels_is_stricter_for_regression() -> None:
    cur = [x * 0.9 for x in [1000, 1012, 988]]
    one = decide(BASE, cur, look=0, session_sigma=0.0, futility=0.0)
    many = decide(BASE, cur, look=0, session_sigma=0.0, futility=0.0, n_levels=10**6)
    assert one.reason is StopReason.REGRESSION and many.reason is not StopReason.REGRESSION


def test_decide_rejects_bad_look() -> None:
    with pytest.raises(ValueError, match="look"):
        decide(BASE, BASE, look=2)


def test_batch_agrees_with_scalar() -> None:
    rng = np.random.default_rng(9)
    b = 1000 * np.exp(rng.normal(0, 0.02, (30, 4)))
    c = 950 * np.exp(rng.normal(0, 0.04, (30, 3)))
    res = compare_batch(b, c, alpha_weight=0.5)
    dec = decide_batch(b, c, look=0)
    for i in range(30):
        one = compare_level(b[i], c[i], alpha_weight=0.5)
        assert res.p_regression[i] == pytest.approx(one.p_regression)
        assert res.verdict[i] == one.verdict
        assert bool(dec.stop[i]) == decide(b[i], c[i], look=0).stop


# --------------------------------------------------------------------------- power simulation


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "bench" / "stat_power.py"
    spec = importlib.util.spec_from_file_location("kimi_stat_power", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _bench()


@pytest.mark.parametrize("scheme", ["fixed 3", "fixed 5", "fixed 10", "adaptive"])
def test_acceptance_no_false_alarms(bench: ModuleType, scheme: str) -> None:
    """No change and a 2% drop (inside the 5% tolerance): flagged at most alpha of the time,
    with 3% session and 2% within-session noise."""
    for drop in (0.0, 0.02):
        rng = np.random.default_rng(bench_seed(scheme, drop))
        cell = _run(bench, rng, scheme, 1000, drop)
        assert cell.flagged <= 0.05, (scheme, drop, cell.flagged)


@pytest.mark.parametrize("scheme", ["fixed 10", "adaptive"])
def test_acceptance_detects_15_percent_drop(bench: ModuleType, scheme: str) -> None:
    rng = np.random.default_rng(bench_seed(scheme, 0.15))
    cell = _run(bench, rng, scheme, 2000, 0.15)
    assert cell.flagged >= 0.95, (scheme, cell.flagged)
    assert cell.mean_trials <= 10


def test_adaptive_saves_trials(bench: ModuleType) -> None:
    for drop, most in ((0.0, 7.0), (0.15, 6.0)):
        cell = _run(
            bench, np.random.default_rng(bench_seed("adaptive", drop)), "adaptive", 1000, drop
        )
        assert cell.mean_trials <= most, (drop, cell.mean_trials)


def test_naive_welch_raises_false_alarms(bench: ModuleType) -> None:
    """Why session_sigma exists: ignoring the session factor, a 2% drop (inside tolerance)
    is flagged more often than alpha with 10 trials."""
    rng = np.random.default_rng(77)
    cell = bench.run_fixed(rng, 4000, 10, 0.02, bench.Noise(), bench.Gate(session_sigma=0.0))
    assert cell.flagged > 0.06


def bench_seed(scheme: str, drop: float) -> list[int]:
    return [
        314159,
        len(scheme),
        int(scheme.split()[-1]) if scheme[0] == "f" else 0,
        round(drop * 100),
    ]


def _run(bench: ModuleType, rng: np.random.Generator, scheme: str, sims: int, drop: float):
    if scheme == "adaptive":
        return bench.run_adaptive(rng, sims, 10, drop, bench.Noise(), bench.Gate())
    return bench.run_fixed(rng, sims, int(scheme.split()[1]), drop, bench.Noise(), bench.Gate())
