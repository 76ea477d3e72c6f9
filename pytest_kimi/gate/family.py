"""The levels of one test as one family: closed testing over common shifts.

Why not Holm.  Holm rejects a level only when its p-value is below ``alpha / m``, so a sweep
whose levels all drop by 10% together was *less* sensitive than one of its levels alone
(docs/evidence/gate.md, "The gate's error rates, simulated").  Yet levels
that move together are the common case -- a slower kernel, clock or build slows every load --
and the levels of one session are not independent: they share its session factor.

Model (log scale, per level ``i`` of one test)::

    d_i = log(current_i / baseline_i) = delta_i + s + e_i

``s`` is the difference of the two sessions' factors, the *same* for every level of the test
(one server start measured them all, and one recorded the baseline), with the known variance
``session_sigma**2``; ``e_i`` is level ``i``'s own trial noise, variance ``w_i`` (Welch:
baseline and current scatter, Satterthwaite degrees of freedom), independent across levels.

Intersection tests.  For a subset ``S`` of the levels, ``H_S``: every level in ``S`` is within
the tolerance (``delta_i >= m``, ``m = log(1 - tol)``).  Under ``H_S`` the mean of the ``d_i``
over ``S`` is at least ``m``, so the one-sided test of the *common shift*

    t_S = (mean_S d - m) / se_S,   se_S**2 = session_sigma**2 + sum_S w_i / |S|**2

is a level-alpha test of ``H_S``.  The session term is *not* divided by ``|S|``: it is shared,
and averaging levels removes only their own noise.  Degrees of freedom by Satterthwaite over
the levels' within terms (the session term is known and adds none).

Closed testing (Marcus, Peritz and Gabriel 1976).  Level ``i`` is a ``regression`` when every
``H_S`` with ``i`` in ``S`` is rejected; its adjusted p-value is the largest ``p_S`` over those
subsets.  This controls the family-wise error rate -- the chance that *any* level within the
tolerance is called a regression -- at alpha in the strong sense, whatever the other levels
do.  When the levels move together, every subset's mean moves by the same amount with a
standard error no larger than the noisiest level's, so the sweep is (about) as sensitive as
its levels are alone; one level's adjusted p-value is its own.  The *common shift* of the test
(``S`` = all levels) is itself a hypothesis of the family: rejecting it says the test's levels
as a whole dropped beyond the tolerance, at the same family-wise alpha (every intersection
that contains it is tested by the all-levels test, which is level alpha under it).  The same
procedure runs for ``improved`` with ``log(1 + tol)``.  More than :data:`MAX_CLOSED` levels
fall back to Holm over the single levels (``2**L`` subsets).

Adaptive trials.  The trial policy extends a level whose estimate lies beyond the tolerance
while its regression is not significant (``undecided``) to ``max_trials``.  That look reads
the estimate, and testing the final data at the full alpha as if the trial count were fixed
would raise the false-alarm rate at the tolerance above alpha (``python bench/stat_power.py
--sims 40000 --drops 0.05 [--no-design]``; docs/evidence/gate.md, "The gate's error rates,
simulated").
So a subset with an extendable level is tested against the null distribution of *the
procedure*: :func:`adaptive_pvalues` simulates, at the boundary ``delta_i = m`` and with the
variances estimated, the interim estimate, the extension rule and the final mean, with one
shared session draw per simulated session, and gives the share of simulated statistics at or
below the observed one.  A subset whose levels could not have been extended (no interim look,
or already at ``max_trials``) keeps its exact t-test.  The simulation uses a fixed seed, so a
verdict is a function of the data; its Monte Carlo error is ``sqrt(p (1 - p) / MC_DRAWS)``,
0.0015 at p = 0.05.

Pure numpy/scipy on plain arrays; no pytest.  :mod:`pytest_kimi.gate.two_sample` builds the arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

MAX_CLOSED = 8
"""Up to this many compared levels the closed procedure enumerates every subset (255)."""

MC_DRAWS = 20_000
"""Simulated sessions for the null distribution of an adaptive subset test."""

MC_SEED = 20261203


def _st() -> Any:
    from scipy import stats

    return stats


@dataclass(frozen=True, slots=True)
class LevelTerms:
    """What the family needs of each compared level (log scale, arrays of the levels)."""

    d: NDArray[np.float64]
    """Log ratio current / baseline of geometric means."""
    w: NDArray[np.float64]
    """Within-session variance of ``d`` (baseline and current scatter), session term excluded."""
    denom: NDArray[np.float64]
    """Satterthwaite denominator of ``w`` (``sum of (var/n)**2 / (n - 1)`` over both sides)."""
    wb: NDArray[np.float64]
    """The baseline side's part of ``w``."""
    denom_b: NDArray[np.float64]
    """The baseline side's part of ``denom``."""
    vc: NDArray[np.float64]
    """The current side's per-trial variance (``w - wb = vc / n_final``)."""
    n_interim: NDArray[np.int64]
    """Current trials when the trial policy looked at the estimate (the final count if never)."""
    n_extended: NDArray[np.int64]
    """Current trials the policy extends an undecided level to (``n_interim`` if it cannot)."""
    n_final: NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Shift:
    """A subset's common shift: the mean log ratio and its test."""

    d: float
    se: float
    df: float
    p_regression: float
    p_improved: float


@dataclass(frozen=True, slots=True)
class FamilyTests:
    """Closed-testing results of one test's compared levels."""

    p_regression: list[float]
    """Per level: the largest regression p-value over the subsets that contain it."""
    p_improved: list[float]
    shift: Shift
    """All levels' common shift (adaptive-corrected p-values where it applies)."""
    method: str
    """``closed`` or ``holm`` (more than :data:`MAX_CLOSED` levels)."""


def _subset_stats(
    terms: LevelTerms, mask: NDArray[np.bool_], session_sigma: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Mean d, se and df of every subset (rows of ``mask``)."""
    k = mask.sum(axis=1).astype(np.float64)
    dbar = (mask * terms.d).sum(axis=1) / k
    w = (mask * terms.w).sum(axis=1) / k**2
    denom = (mask * terms.denom).sum(axis=1) / k**4
    se2 = session_sigma**2 + w
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(denom > 0, se2**2 / np.where(denom > 0, denom, 1.0), np.inf)
    return dbar, np.sqrt(se2), df


def _t_cdf(x: NDArray[np.float64], df: NDArray[np.float64]) -> NDArray[np.float64]:
    st = _st()
    finite = np.isfinite(df)
    out: NDArray[np.float64] = np.where(
        finite, st.t.cdf(x, np.where(finite, df, 1.0)), st.norm.cdf(x)
    )
    return out


@dataclass(frozen=True, slots=True)
class _Null:
    """Simulated sessions at the boundary: every level's final log ratio (centred at the
    margin) and its within variance, per draw (rows) and level (columns)."""

    d: NDArray[np.float64]
    w: NDArray[np.float64]


def _simulate(terms: LevelTerms, *, session_sigma: float, alpha: float, adaptive: bool) -> _Null:
    """The null distribution of the procedure (module docstring, *Adaptive trials*)."""
    st = _st()
    rng = np.random.default_rng(MC_SEED)
    n_levels = terms.d.size
    n_fin = terms.n_final.astype(np.float64)
    vc, wb = terms.vc, terms.wb
    s = rng.standard_normal((MC_DRAWS, 1)) * session_sigma  # one per session: shared
    eb = rng.standard_normal((MC_DRAWS, n_levels)) * np.sqrt(wb)
    if not adaptive:
        ec = rng.standard_normal((MC_DRAWS, n_levels)) * np.sqrt(vc / n_fin)
        return _Null(s + ec - eb, np.broadcast_to(wb + vc / n_fin, (MC_DRAWS, n_levels)))
    n1 = terms.n_interim.astype(np.float64)
    n2 = terms.n_extended.astype(np.float64)
    ec1 = rng.standard_normal((MC_DRAWS, n_levels)) * np.sqrt(vc / n1)
    ec2 = rng.standard_normal((MC_DRAWS, n_levels)) * np.sqrt(vc / np.maximum(n2 - n1, 1.0))
    d1 = s + ec1 - eb
    se1 = np.sqrt(session_sigma**2 + wb + vc / n1)
    # the interim rule of trial_decision.decide_batch: not significant at alpha, estimate beyond m
    den1 = terms.denom_b + (vc / n1) ** 2 / np.maximum(n1 - 1.0, 1.0)
    finite = den1 > 0
    df1 = np.where(finite, se1**4 / np.where(finite, den1, 1.0), 1.0)
    crit = np.where(finite, st.t.ppf(alpha, df1), st.norm.ppf(alpha))
    ext = (d1 > crit * se1) & (d1 < 0.0) & (n2 > n1)
    d_final = np.where(ext, s + (n1 * ec1 + (n2 - n1) * ec2) / n2 - eb, d1)
    return _Null(d_final, np.where(ext, wb + vc / n2, wb + vc / n1))


def _minimum_p(
    null: _Null,
    mask: NDArray[np.bool_],
    z_levels: NDArray[np.float64],
    z_means: NDArray[np.float64],
    session_sigma: float,
    sign: float,
) -> NDArray[np.float64]:
    """Per subset: the chance under the null that the smallest of its common-shift statistic
    and its levels' own statistics falls at or below the observed smallest.

    ``sign`` -1 turns the improvement side into the same lower-tail question.
    """
    z_each = sign * null.d / np.sqrt(session_sigma**2 + null.w)
    out = np.empty(mask.shape[0])
    for row in range(mask.shape[0]):
        cols = np.flatnonzero(mask[row])
        k = float(cols.size)
        mean = null.d[:, cols].sum(axis=1) / k
        se = np.sqrt(session_sigma**2 + null.w[:, cols].sum(axis=1) / k**2)
        t = np.minimum(sign * mean / se, z_each[:, cols].min(axis=1))
        observed = min(float(z_means[row]), float(z_levels[cols].min()))
        out[row] = float(np.mean(t <= observed))
    # never a p of exactly 0 from a finite simulation
    return np.maximum(out, 1.0 / MC_DRAWS)


def _bvn(
    h: NDArray[np.float64], k: NDArray[np.float64], rho: NDArray[np.float64]
) -> NDArray[np.float64]:
    """P(X <= h, Y <= k) for a standard bivariate normal with correlation ``rho`` < 1, by
    Owen's T function (vectorised; scipy's multivariate normal is not, over ``rho``)."""
    from scipy import special

    st = _st()
    h = np.where(h == 0.0, 1e-12, h)
    k = np.where(k == 0.0, 1e-12, k)
    r = np.sqrt(np.maximum(1.0 - rho**2, 1e-18))
    a_h, a_k = (k - rho * h) / (h * r), (h - rho * k) / (k * r)
    beta = np.where(h * k < 0.0, 0.5, 0.0)
    out: NDArray[np.float64] = (
        0.5 * st.norm.cdf(h)
        + 0.5 * st.norm.cdf(k)
        - special.owens_t(h, a_h)
        - special.owens_t(k, a_k)
        - beta
    )
    return np.clip(out, 0.0, 1.0)


def single_adaptive_p(
    p_fixed: NDArray[np.float64],
    *,
    session_sigma: float,
    wb: NDArray[np.float64],
    denom_b: NDArray[np.float64],
    vc: NDArray[np.float64],
    n_interim: NDArray[np.float64],
    n_extended: NDArray[np.float64],
    alpha: float,
) -> NDArray[np.float64]:
    """One level's regression p-value under the adaptive-extension null, in closed form.

    The interim statistic ``Z1`` (``n_interim`` trials) and the extended one ``Z2``
    (``n_extended``) are bivariate normal with correlation ``se2 / se1`` (the extended mean
    contains the interim one; session and baseline terms are shared).  The final statistic is
    ``Z1`` where the rule did not extend (significant at the interim, or estimate within the
    tolerance) and ``Z2`` where it did, so ``P(final <= z) = P(Z1 <= min(c, z)) + P(c < Z1 < 0,
    Z2 <= z) + P(0 <= Z1 <= z)`` with ``c`` the interim critical value.  Rows with
    ``n_extended <= n_interim`` keep ``p_fixed``.  The same null as :func:`_simulate`, exact.
    """
    st = _st()
    n1 = np.asarray(n_interim, dtype=np.float64)
    n2 = np.asarray(n_extended, dtype=np.float64)
    se1 = np.sqrt(session_sigma**2 + wb + vc / n1)
    se2 = np.sqrt(session_sigma**2 + wb + vc / np.maximum(n2, n1))
    den1 = denom_b + (vc / n1) ** 2 / np.maximum(n1 - 1.0, 1.0)
    finite = den1 > 0
    df1 = np.where(finite, se1**4 / np.where(finite, den1, 1.0), 1.0)
    c = np.where(finite, st.t.ppf(alpha, df1), st.norm.ppf(alpha))
    z = st.norm.ppf(np.clip(p_fixed, 1e-300, 1.0 - 1e-16))
    rho = se2 / se1
    zero = np.zeros_like(z)
    p = (
        st.norm.cdf(np.minimum(c, z))
        + np.maximum(_bvn(zero, z, rho) - _bvn(c, z, rho), 0.0)
        + np.maximum(st.norm.cdf(z) - 0.5, 0.0)
    )
    out: NDArray[np.float64] = np.where(n2 > n1, np.clip(p, 0.0, 1.0), p_fixed)
    return out


def subset_pvalues(
    terms: LevelTerms,
    mask: NDArray[np.bool_],
    *,
    session_sigma: float,
    tolerance: float,
    alpha: float,
) -> tuple[
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.float64],
]:
    """Regression and improvement p-values of each subset's intersection hypothesis, and its
    common shift's mean, se and df.

    The intersection test is the smaller of the common shift's statistic and the levels' own
    (a union-intersection test): the mean alone would let a level that drops 20% hide behind
    one that gains 20%, the levels alone would ignore that they move together.  Its null
    distribution, with the levels' shared session term and the trial policy's look, comes
    from :func:`_simulate`; observed statistics enter as their t-test p-values mapped to
    normal quantiles, so small-sample tails are kept.  One level that could not have been
    extended keeps its exact t-test.
    """
    st = _st()
    m_lo, m_hi = math.log1p(-tolerance), math.log1p(tolerance)
    dbar, se, df = _subset_stats(terms, mask, session_sigma)
    p_reg_mean = _t_cdf((dbar - m_lo) / se, df)
    p_imp_mean = _t_cdf(-(dbar - m_hi) / se, df)
    se_i = np.sqrt(session_sigma**2 + terms.w)
    with np.errstate(divide="ignore", invalid="ignore"):
        df_i = np.where(
            terms.denom > 0, se_i**4 / np.where(terms.denom > 0, terms.denom, 1.0), np.inf
        )
    p_reg_i = _t_cdf((terms.d - m_lo) / se_i, df_i)
    p_imp_i = _t_cdf(-(terms.d - m_hi) / se_i, df_i)
    extendable_levels = terms.n_extended > terms.n_interim
    extendable = bool(extendable_levels.any())
    if terms.d.size == 1:  # one level: its own test, the look in closed form
        p_one = single_adaptive_p(
            p_reg_mean,
            session_sigma=session_sigma,
            wb=terms.wb,
            denom_b=terms.denom_b,
            vc=terms.vc,
            n_interim=terms.n_interim.astype(np.float64),
            n_extended=terms.n_extended.astype(np.float64),
            alpha=alpha,
        )
        return p_one, p_imp_mean, dbar, se, df

    def z(p: NDArray[np.float64]) -> NDArray[np.float64]:
        q: NDArray[np.float64] = st.norm.ppf(np.clip(p, 1e-300, 1.0 - 1e-16))
        return q

    reg_null = _simulate(terms, session_sigma=session_sigma, alpha=alpha, adaptive=extendable)
    imp_null = _simulate(terms, session_sigma=session_sigma, alpha=alpha, adaptive=False)
    p_reg = _minimum_p(reg_null, mask, z(p_reg_i), z(p_reg_mean), session_sigma, 1.0)
    p_imp = _minimum_p(imp_null, mask, z(p_imp_i), z(p_imp_mean), session_sigma, -1.0)
    # a single level's own test needs no simulation: its exact p (the look in closed form)
    single = mask.sum(axis=1) == 1
    idx = mask[single].argmax(axis=1)
    p_reg[single] = single_adaptive_p(
        p_reg_i[idx],
        session_sigma=session_sigma,
        wb=terms.wb[idx],
        denom_b=terms.denom_b[idx],
        vc=terms.vc[idx],
        n_interim=terms.n_interim[idx].astype(np.float64),
        n_extended=terms.n_extended[idx].astype(np.float64),
        alpha=alpha,
    )
    p_imp[single] = p_imp_i[idx]
    return p_reg, p_imp, dbar, se, df


def closed_tests(
    terms: LevelTerms,
    *,
    session_sigma: float,
    tolerance: float,
    alpha: float,
) -> FamilyTests:
    """Closed testing over the compared levels (module docstring); at least one level."""
    n = terms.d.size
    if n == 0:
        raise ValueError("closed_tests needs at least one compared level")
    if n > MAX_CLOSED:
        singles = np.vstack([np.eye(n, dtype=bool), np.ones((1, n), dtype=bool)])
        p_reg, p_imp, dbar, se, df = subset_pvalues(
            terms, singles, session_sigma=session_sigma, tolerance=tolerance, alpha=alpha
        )
        return FamilyTests(
            holm(list(p_reg[:n])),
            holm(list(p_imp[:n])),
            Shift(float(dbar[n]), float(se[n]), float(df[n]), float(p_reg[n]), float(p_imp[n])),
            "holm",
        )
    mask = np.array(
        [[bool(bits >> i & 1) for i in range(n)] for bits in range(1, 2**n)], dtype=bool
    )
    p_reg, p_imp, dbar, se, df = subset_pvalues(
        terms, mask, session_sigma=session_sigma, tolerance=tolerance, alpha=alpha
    )
    adj_reg = [float(p_reg[mask[:, i]].max()) for i in range(n)]
    adj_imp = [float(p_imp[mask[:, i]].max()) for i in range(n)]
    last = mask.shape[0] - 1  # bits = 2**n - 1: every level
    shift = Shift(
        float(dbar[last]), float(se[last]), float(df[last]), float(p_reg[last]), float(p_imp[last])
    )
    return FamilyTests(adj_reg, adj_imp, shift, "closed")


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order (NaN entries pass through).

    The smallest p is multiplied by m, the next by m - 1, ..., with a running maximum so that
    a level never looks more significant than one with a smaller raw p.  Used beyond
    :data:`MAX_CLOSED` levels, and kept for callers of :func:`pytest_kimi.gate.family_verdicts.holm`.
    """
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    tested = np.flatnonzero(~np.isnan(p))
    if ((p[tested] < 0.0) | (p[tested] > 1.0)).any():
        raise ValueError(f"p-values must lie in [0, 1], got {list(p_values)!r}")
    m = tested.size
    order = tested[np.argsort(p[tested], kind="stable")]
    adjusted = np.full(p.shape, np.nan)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        adjusted[i] = running
    return [float(x) for x in adjusted]


__all__ = [
    "FamilyTests",
    "LevelTerms",
    "MAX_CLOSED",
    "Shift",
    "closed_tests",
    "holm",
    "subset_pvalues",
]
