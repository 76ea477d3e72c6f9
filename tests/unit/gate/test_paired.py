"""The deploy gate's paired sequential comparison (pytest_kimi.gate.paired): pure functions,
tested on synthetic launches with no server at all (the culprit search and the race use the
same comparison as their oracle)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_kimi.gate import paired
from pytest_kimi.verdicts import Verdict


def test_blocks_alternate_abba() -> None:
    assert [paired.block_order(b) for b in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]
    with pytest.raises(ValueError):
        paired.block_order(-1)


def test_the_nominal_level_shrinks_with_the_looks_and_one_look_is_alpha() -> None:
    levels = [paired.nominal_alpha(0.05, k) for k in (2, 3, 4, 6, 8)]
    assert levels[0] == 0.05
    assert all(a > b for a, b in zip(levels, levels[1:]))
    assert levels[-1] > 0.05 / 7  # Pocock is less conservative than Bonferroni over 7 looks
    with pytest.raises(ValueError, match="--perf-max-launches 4"):
        paired.nominal_alpha(0.05, 1)


@pytest.mark.parametrize("sigma", [0.005, 0.05])
def test_a_change_at_the_tolerance_is_flagged_at_most_alpha_whatever_the_noise(
    sigma: float,
) -> None:
    """The false-alarm rate at the margin (a true drop of exactly the tolerance), over every
    look of the budget: alpha, for any launch noise (the t statistic is scale-free).  3,000
    seeded experiments: the Monte Carlo sd of a 5% rate is 0.4%."""
    rng = np.random.default_rng(7)
    blocks = 6
    flagged = 0
    runs = 3000
    for _ in range(runs):
        ref = np.exp(rng.normal(0.0, sigma, blocks))
        cand = 0.95 * np.exp(rng.normal(0.0, sigma, blocks))
        out = paired.run_sequential(ref, cand, max_blocks=blocks)
        flagged += out.comparison.verdict is Verdict.REGRESSION
    assert flagged / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


def test_a_clear_drop_stops_at_the_first_look_with_its_verdict_and_figures() -> None:
    ref = [1000.0, 1010.0, 995.0, 1005.0, 1000.0, 990.0]
    cand = [800.0, 805.0, 798.0, 810.0, 790.0, 800.0]
    out = paired.run_sequential(ref, cand, max_blocks=6)
    c = out.comparison
    assert c.verdict is Verdict.REGRESSION and c.decided
    assert out.blocks == paired.MIN_BLOCKS and c.launches == 4
    assert c.ci90[1] < 0.95 and c.ratio == pytest.approx(
        math.exp(np.mean(np.log(cand[:2])) - np.mean(np.log(ref[:2])))
    )
    assert c.launch_sigma > 0 and c.df == 2
    d = c.to_dict()
    assert d["verdict"] == "regression" and d["launches"] == 4 and d["change_pct"] < -15


def test_an_unchanged_deployment_is_pass_once_the_noise_allows_it() -> None:
    rng = np.random.default_rng(3)
    ref = list(1000 * np.exp(rng.normal(0, 0.01, 6)))
    cand = list(1000 * np.exp(rng.normal(0, 0.01, 6)))
    out = paired.run_sequential(ref, cand, max_blocks=6)
    c = out.comparison
    assert c.verdict is Verdict.PASS and c.decided
    assert c.ci90[0] > 0.95  # pass: the whole interval inside the tolerance
    assert c.min_detectable_drop < 0.15


def test_the_budget_ends_undecided_with_the_word_the_estimate_allows() -> None:
    """Noise too large for the budget: never ``pass``; ``inconclusive`` when the estimate lies
    beyond the tolerance, ``underpowered`` when inside it, and the smallest drop the
    experiment could have caught is said."""
    ref = [1000.0, 1200.0, 850.0, 1100.0]
    beyond = paired.compare_paired(ref, [900.0, 1050.0, 800.0, 1000.0], max_blocks=4)
    assert beyond.verdict is Verdict.INCONCLUSIVE and not beyond.decided and beyond.ratio < 0.95
    inside = paired.compare_paired(ref, [1000.0, 1150.0, 870.0, 1080.0], max_blocks=4)
    assert inside.verdict is Verdict.UNDERPOWERED and not inside.decided
    assert inside.min_detectable_drop > 0.15


def test_bad_launch_figures_are_named() -> None:
    with pytest.raises(ValueError, match="each side needs 2"):
        paired.compare_paired([1.0], [1.0, 2.0], max_blocks=4)
    with pytest.raises(ValueError, match="candidate launch figures must be finite and positive"):
        paired.compare_paired([1.0, 2.0], [1.0, 0.0], max_blocks=4)
