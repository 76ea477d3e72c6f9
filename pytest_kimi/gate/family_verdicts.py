"""The levels of one test judged together: every level's final verdict and the test's common shift.

Why a module of its own: the two-sample test of one level (:mod:`pytest_kimi.gate.two_sample`)
knows nothing of the other levels of its test; here the levels are brought together as one
family (closed testing over their common shifts, :mod:`pytest_kimi.gate.family`, with Holm
beside it), the trial policy's look at the estimate is paid for (:class:`Design`), and the
test's common shift (:class:`ShiftComparison`) is reported.  :func:`compare_test` and
:func:`compare_level` are the same call for callers that need no shift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from pytest_kimi.gate.two_sample import (
    CI_LEVEL,
    DEFAULT_ALPHA,
    DEFAULT_DETECTABLE_DROP,
    DEFAULT_POWER,
    DEFAULT_SESSION_SIGMA,
    DEFAULT_TOLERANCE,
    BatchComparison,
    LevelComparison,
    _check_params,
    _check_weight,
    _Core,
    _core,
    _log_samples,
    _mdd,
    _side_terms,
    _st,
    _tests,
    _verdicts,
)
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import ShiftEntry


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (:func:`pytest_kimi.gate.family.holm`)."""
    from pytest_kimi.gate import family

    return family.holm(list(p_values))


@dataclass(frozen=True, slots=True)
class Design:
    """How the trial policy planned a level's current trials, for the final test to account
    for the look it took at the estimate (:mod:`pytest_kimi.gate.family`, *Adaptive trials*).

    ``interim_trials``: the current trials when the variance rule stopped and the policy read
    the estimate; ``extend_to``: the count an undecided level is extended to (``max_trials``),
    or ``interim_trials`` when the level could not have been extended (futility, already at
    the cap).  None (the default everywhere) is a fixed design: the offline comparison of two
    reports, or a level that never reached the look.
    """

    interim_trials: int
    extend_to: int


@dataclass(frozen=True, slots=True)
class ShiftComparison:
    """The common shift of a test's compared levels: all of them as one hypothesis.

    ``regression`` here means the levels *as a whole* dropped beyond the tolerance, at the
    same family-wise alpha as the levels' own verdicts (:mod:`pytest_kimi.gate.family`).  A
    test fails on it even where no single level is significant on its own.
    """

    ratio: float
    """exp(mean log ratio) over the levels."""
    ci90: tuple[float, float]
    p_regression: float
    p_improved: float
    verdict: Verdict
    """By the levels' rules (:func:`_verdicts`): ``regression``, ``improved``,
    ``inconclusive`` (the common estimate beyond the tolerance, not significant),
    ``underpowered`` (the shift could not have caught ``detectable_drop``) or ``pass``."""
    levels: int
    se_log: float
    df: float
    min_detectable_drop: float = math.nan

    def to_dict(self) -> ShiftEntry:
        return {
            "change_pct": _pct_round(self.ratio),
            "ci90": [_pct_round(self.ci90[0]), _pct_round(self.ci90[1])],
            "p_value": _round_p(self.p_regression),
            "p_improved": _round_p(self.p_improved),
            "verdict": self.verdict.value,
            "levels": self.levels,
            "min_detectable_drop_pct": _pct_round(1.0 + self.min_detectable_drop),
        }


def _pct_round(ratio: float) -> float | None:
    return round((ratio - 1) * 100, 2) if math.isfinite(ratio) else None


def _round_p(p: float) -> float | None:
    return round(p, 6) if math.isfinite(p) else None


@dataclass(frozen=True, slots=True)
class FamilyComparison:
    """:func:`compare_family`: every level's comparison, and the test's common shift (None
    with fewer than two compared levels: then the shift is the level)."""

    levels: list[LevelComparison]
    shift: ShiftComparison | None
    method: str
    """How the levels were adjusted: ``closed`` (closed testing over common shifts), ``holm``
    (more than :data:`pytest_kimi.gate.family.MAX_CLOSED` levels), ``single``."""


def _level_terms(
    log_b: NDArray[np.float64], log_c: NDArray[np.float64], core: _Core
) -> tuple[float, float, float, float, float]:
    """One level's ``(w, denom, wb, denom_b, vc)`` for the family (see LevelTerms)."""
    wb, db, vc, w, denom = (
        float(x[0]) for x in _side_terms(core.var_b, log_b.shape[1], core.var_c, log_c.shape[1], 1)
    )
    return w, denom, wb, db, vc


def compare_family(
    levels: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    alpha_weights: Sequence[float] | None = None,
    power: float = DEFAULT_POWER,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
    designs: Sequence[Design | None] | None = None,
) -> FamilyComparison:
    """Final verdicts for all levels of one test, as one family (closed testing over their
    common shifts, :mod:`pytest_kimi.gate.family`), and the test's common shift.

    ``levels`` holds one ``(baseline, current)`` pair of tok/s sequences per level; an empty
    baseline gives ``no-baseline`` (NaN p-values, outside the family), and so does a level
    whose noise cannot be estimated at all (one trial on each side: outside the family, its
    p-values 1).  ``alpha_weights``: per level, the share of alpha to test it at (default 1.0;
    a subset is tested at its smallest member's share).  ``designs``: per level, how the trial
    policy planned its trials (:class:`Design`; None: fixed).
    """
    from pytest_kimi.gate import family

    _check_params(tolerance, alpha, session_sigma, power, detectable_drop)
    weights = [1.0] * len(levels) if alpha_weights is None else [float(w) for w in alpha_weights]
    if len(weights) != len(levels):
        raise ValueError(f"{len(weights)} alpha_weights for {len(levels)} levels")
    for w in weights:
        _check_weight(w)
    plans = [None] * len(levels) if designs is None else list(designs)
    if len(plans) != len(levels):
        raise ValueError(f"{len(plans)} designs for {len(levels)} levels")

    @dataclass
    class _Row:
        core: _Core
        t: BatchComparison
        n_b: int
        n_c: int
        med_b: float
        med_c: float
        terms: tuple[float, float, float, float, float]

    rows: list[_Row | None] = []
    for i, (base, cur) in enumerate(levels):
        where = f"level {i}: " if len(levels) > 1 else ""
        log_c = _log_samples("current", cur, 1, where)
        log_b = _log_samples("baseline", base, 1, where)
        if log_c.shape[1] == 0:
            raise ValueError(f"{where}no current trials to compare")
        if log_b.shape[1] == 0:
            rows.append(None)
            continue
        core = _core(log_b, log_c, session_sigma)
        t = _tests(core, tolerance, alpha, alpha * weights[i], power, detectable_drop)
        nan = math.nan
        parts = _level_terms(log_b, log_c, core) if bool(t.valid[0]) else (nan, nan, nan, nan, nan)
        rows.append(
            _Row(
                core,
                t,
                log_b.shape[1],
                log_c.shape[1],
                float(np.median(np.asarray(base, dtype=np.float64))),
                float(np.median(np.asarray(cur, dtype=np.float64))),
                parts,
            )
        )

    family_idx = [i for i, r in enumerate(rows) if r is not None and bool(r.t.valid[0])]
    p_reg_adj: dict[int, float] = {}
    p_imp_adj: dict[int, float] = {}
    shift: ShiftComparison | None = None
    method = "single"
    if family_idx:
        picked = [rows[i] for i in family_idx]
        assert all(r is not None for r in picked)

        def arr(k: int) -> NDArray[np.float64]:
            return np.array([r.terms[k] for r in picked if r is not None])

        n_final = np.array([r.n_c for r in picked if r is not None], dtype=np.int64)
        n1 = np.array(
            [
                n if plans[i] is None else min(n, plans[i].interim_trials)  # type: ignore[union-attr]
                for i, n in zip(family_idx, n_final)
            ],
            dtype=np.int64,
        )
        n2 = np.array(
            [
                n1[j] if plans[i] is None else max(n1[j], plans[i].extend_to)  # type: ignore[union-attr]
                for j, i in enumerate(family_idx)
            ],
            dtype=np.int64,
        )
        level_terms = family.LevelTerms(
            d=np.array([float(r.core.d[0]) for r in picked if r is not None]),
            w=arr(0),
            denom=arr(1),
            wb=arr(2),
            denom_b=arr(3),
            vc=arr(4),
            n_interim=n1,
            n_extended=n2,
            n_final=n_final,
        )
        tests = family.closed_tests(
            level_terms, session_sigma=session_sigma, tolerance=tolerance, alpha=alpha
        )
        w_min = min(weights[i] for i in family_idx)
        for j, i in enumerate(family_idx):
            p_reg_adj[i] = min(1.0, tests.p_regression[j] / weights[i])
            p_imp_adj[i] = min(1.0, tests.p_improved[j] / weights[i])
        method = tests.method if len(family_idx) > 1 else "single"
        if len(family_idx) > 1:
            sh = tests.shift
            q = (
                float(_st().t.ppf(0.5 + CI_LEVEL / 2.0, sh.df))
                if math.isfinite(sh.df)
                else float(_st().norm.ppf(0.5 + CI_LEVEL / 2.0))
            )
            p_r, p_i = min(1.0, sh.p_regression / w_min), min(1.0, sh.p_improved / w_min)
            sh_df = np.array([sh.df if math.isfinite(sh.df) else 1e9])
            sh_mdd = float(_mdd(np.array([sh.se]), sh_df, tolerance, alpha * w_min, power)[0])
            shift = ShiftComparison(
                ratio=math.exp(sh.d),
                ci90=(math.exp(sh.d - q * sh.se), math.exp(sh.d + q * sh.se)),
                p_regression=p_r,
                p_improved=p_i,
                verdict=Verdict(
                    _verdicts(
                        np.array([p_r]),
                        np.array([p_i]),
                        np.array([sh_mdd]),
                        detectable_drop,
                        alpha,
                        ratio=np.array([math.exp(sh.d)]),
                        tolerance=tolerance,
                    )[0]
                ),
                levels=len(family_idx),
                se_log=sh.se,
                df=sh.df,
                min_detectable_drop=sh_mdd,
            )

    out: list[LevelComparison] = []
    for i, r in enumerate(rows):
        if r is None:
            only = np.asarray(levels[i][1], dtype=np.float64)
            out.append(
                LevelComparison(
                    baseline_median=math.nan,
                    current_median=float(np.median(only)),
                    ratio=math.nan,
                    ci90=(math.nan, math.nan),
                    p_regression=math.nan,
                    p_improved=math.nan,
                    min_detectable_drop=math.nan,
                    verdict=Verdict.NO_BASELINE,
                    n_baseline=0,
                    n_current=int(only.size),
                    alpha_weight=weights[i],
                    detectable_drop=detectable_drop,
                    power=power,
                )
            )
            continue
        valid = bool(r.t.valid[0])
        p_reg = p_reg_adj.get(i, 1.0)
        p_imp = p_imp_adj.get(i, 1.0)
        verdict = _verdicts(
            np.array([p_reg]),
            np.array([p_imp]),
            r.t.min_detectable_drop,
            detectable_drop,
            alpha,
            ratio=r.t.ratio,
            tolerance=tolerance,
        )[0]
        out.append(
            LevelComparison(
                baseline_median=r.med_b,
                current_median=r.med_c,
                ratio=float(np.exp(r.core.d[0])),
                ci90=(float(r.t.ci_lo[0]), float(r.t.ci_hi[0])),
                p_regression=p_reg,
                p_improved=p_imp,
                min_detectable_drop=float(r.t.min_detectable_drop[0]),
                verdict=Verdict(verdict),
                n_baseline=r.n_b,
                n_current=r.n_c,
                p_regression_raw=float(r.t.p_regression[0]),
                p_improved_raw=float(r.t.p_improved[0]),
                se_log=float(r.core.se[0]) if valid else math.nan,
                df=float(r.core.df[0]) if valid else math.nan,
                alpha_weight=weights[i],
                detectable_drop=detectable_drop,
                power=power,
            )
        )
    return FamilyComparison(out, shift, method)


def compare_test(
    levels: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    alpha_weights: Sequence[float] | None = None,
    power: float = DEFAULT_POWER,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
    designs: Sequence[Design | None] | None = None,
) -> list[LevelComparison]:
    """The levels' part of :func:`compare_family` (for callers that need no common shift)."""
    return compare_family(
        levels,
        tolerance=tolerance,
        alpha=alpha,
        session_sigma=session_sigma,
        alpha_weights=alpha_weights,
        power=power,
        detectable_drop=detectable_drop,
        designs=designs,
    ).levels


def compare_level(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    alpha_weight: float = 1.0,
    power: float = DEFAULT_POWER,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
) -> LevelComparison:
    """Verdict for a single level (a one-level :func:`compare_test`: Holm is the identity)."""
    return compare_test(
        [(baseline, current)],
        tolerance=tolerance,
        alpha=alpha,
        session_sigma=session_sigma,
        alpha_weights=[alpha_weight],
        power=power,
        detectable_drop=detectable_drop,
    )[0]
