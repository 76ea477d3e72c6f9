"""Session noise with its uncertainty: how far two server starts of one build differ.

The gate adds ``session_sigma`` (the standard deviation of the log ratio of two independent
sessions) to every comparison as a *known* variance component (:mod:`pytest_kimi.gate.two_sample`).
If the real noise is larger, false alarms rise in proportion; if it is smaller, power is
wasted.  So it is worth measuring, and a measurement from a handful of sessions is worth
nothing without its uncertainty: with 4 sessions the between-session variance rests on 3
degrees of freedom.  This module is the one statistical core for both measurements of it,
``--perf-sessions`` (the deployment restarted N times in one run) and the history store (past
runs of an unchanged build, :mod:`pytest_kimi.history.noise`).  Pure: plain sequences of tok/s
in, plain numbers out; no pytest, no I/O.

Model (one level, one deployment; log scale)::

    log x_ij = mu + s_i + e_ij,   s_i ~ N(0, tau^2) per session, e_ij ~ N(0, w^2) per trial

``session_sigma = sqrt(2) * tau`` (a ratio of two sessions holds two session factors).  The
point estimate is the method of moments of :func:`estimate_session_sigma`
(and equals it for one level): the variance of the session means, less the part trial noise
explains, ``A - W`` with ``A = var(means)`` (``k - 1`` degrees of freedom) and ``W = w^2 *
mean(1 / n_i)`` (``sum(n_i - 1)``).

Interval.  ``tau^2 = E[A] - E[W]`` is a *difference* of two mean squares, so the textbook
chi-square interval on ``A`` alone (which ignores that ``W`` is estimated too, and can only
be shifted by it) is not quite right, and a bootstrap over 3-10 sessions resamples too few
units to say anything about a variance.  We use the modified large-sample (MLS) interval of
Ting, Burdick, Graybill, Jeyaratnam and Lu (1990) for ``c1 S1^2 - c2 S2^2``, the interval
Burdick and Graybill (1992, *Confidence Intervals on Variance Components*) recommend for the
between-group component of the one-way random model: it is exact when either term vanishes
(``W = 0`` gives the chi-square interval on ``A``), its lower end is 0 exactly where the F-test
of "no session noise" stops rejecting, and its coverage stays near the nominal level for any
ratio of the two terms (``bench/session_noise.py`` measures it).  Unbalanced sessions (adaptive
trials: 3 in one, 10 in another) use the harmonic mean of the trial counts, as the point
estimate does (Thomas and Hultquist 1978).

Pooling levels.  The levels (and tests) of one server start share its session factor: the
simulator's ``noise`` multiplies every step, and a real server's clocks, placement and
thermal state slow every level alike.  Their estimates are therefore *not* independent, and
treating L levels as L independent sets of sessions would shrink the interval by a factor
the data does not support.  :func:`pooled` averages each session's level means into one
session score (the fixed level effects cancel in the scatter across sessions), so the
between term keeps ``k - 1`` degrees of freedom however many levels there are, and only the
trial noise averages down; the levels' within terms combine into one with Satterthwaite's
degrees of freedom before the MLS interval.  Independent deployments (two ``--server-profile``
of an A/B) add their sessions' degrees of freedom.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pytest_kimi.gate import two_sample
from pytest_kimi.wire import NoiseEstimateEntry

DEFAULT_CONFIDENCE = 0.90
"""Two-sided, 5% in each tail: the confidence of the gate's own intervals (``two_sample.CI_LEVEL``)."""

RECOMMEND_STEP = 0.005
"""A recommended ``--perf-session-sigma`` is the estimate rounded *up* to this (half a percent):
the figure is rough, and the gate errs toward fewer false alarms when it errs."""

PRIOR_DF = 2.0
"""The weight of the assumed default session noise (0.03) in degrees of freedom, when the gate
combines it with measurements (:mod:`pytest_kimi.gate.noise_evidence`): a recording of three
starts (two degrees of freedom) counts as much as the assumption."""

FEW_SESSIONS = 5
"""Fewer sessions than this: the recommendation says the estimate is rough (docs/statistics.md
asks for at least 5)."""

Sessions = Sequence[Sequence[float]]
"""One level's trials, per session: ``sessions[i]`` is session ``i``'s per-trial tok/s."""


@dataclass(frozen=True, slots=True)
class NoiseEstimate:
    """``session_sigma`` (log sd of the ratio of two sessions) estimated from repeated sessions.

    ``sigma`` is the method-of-moments point estimate (0 when the session means agree better
    than trial noise predicts), ``low``..``high`` its ``confidence`` interval (MLS; see the
    module docstring).  ``tau = sigma / sqrt(2)`` is the sd of one session's factor.
    """

    sigma: float
    low: float
    high: float
    sessions: int
    """Sessions that entered (summed over deployments when pooled)."""
    confidence: float = DEFAULT_CONFIDENCE
    trials: int = 0
    """Trials that entered, in all."""
    levels: int = 1
    """Levels averaged into each session's score (1 for a single level)."""
    within_sd: float = 0.0
    """Pooled within-session log sd of one trial (the trial noise, for comparison)."""
    df_between: int = 0
    """Degrees of freedom of the scatter of session scores: sessions less one per deployment."""
    df_within: float = 0.0
    """(Satterthwaite) degrees of freedom of the trial-noise term."""

    @property
    def tau(self) -> float:
        """The sd of one session's log factor (``sigma / sqrt(2)``)."""
        return self.sigma / math.sqrt(2.0)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> NoiseEstimateEntry:
        """The JSON shape (the reports read it back with :func:`from_dict`)."""
        return {
            "sigma": round(self.sigma, 6),
            "low": round(self.low, 6),
            "high": round(self.high, 6),
            "confidence": self.confidence,
            "sessions": self.sessions,
            "trials": self.trials,
            "levels": self.levels,
            "within_sd": round(self.within_sd, 6),
            "df_between": self.df_between,
            "df_within": round(self.df_within, 2),
        }

    @classmethod
    def from_dict(cls, data: NoiseEstimateEntry) -> NoiseEstimate:
        return cls(
            sigma=float(data["sigma"]),
            low=float(data["low"]),
            high=float(data["high"]),
            sessions=int(data["sessions"]),
            confidence=float(data.get("confidence", DEFAULT_CONFIDENCE)),
            trials=int(data.get("trials", 0)),
            levels=int(data.get("levels", 1)),
            within_sd=float(data.get("within_sd", 0.0)),
            df_between=int(data.get("df_between", 0)),
            df_within=float(data.get("df_within", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The ``--perf-session-sigma`` to use, and why, in words a report can print."""

    value: float
    estimate: NoiseEstimate
    text: str


@dataclass(frozen=True, slots=True)
class _Level:
    """One level's sessions, reduced to what the estimates need (log scale)."""

    means: tuple[float, ...]
    within_var: float
    """Pooled within-session variance of one trial's log tok/s."""
    df_within: int
    inv_n: float
    """Mean over sessions of 1 / trials: the harmonic-mean weight of the within term."""
    trials: int


def _level(sessions: Sessions, where: str = "") -> _Level:
    logs = [
        two_sample._log_samples("session", s, 1, f"{where}session {i}: ")[0]
        for i, s in enumerate(sessions)
    ]
    if len(logs) < 2 or any(x.size == 0 for x in logs):
        raise ValueError(f"{where}need at least two sessions, each with at least one trial")
    dof = sum(x.size - 1 for x in logs)
    if dof == 0:
        raise ValueError(f"{where}need at least one session with two or more trials")
    within = sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / dof
    return _Level(
        means=tuple(float(x.mean()) for x in logs),
        within_var=within,
        df_within=dof,
        inv_n=float(np.mean([1.0 / x.size for x in logs])),
        trials=sum(x.size for x in logs),
    )


def estimate_session_sigma(sessions: Sequence[Sequence[float]]) -> float:
    """Calibrate ``session_sigma`` from one build measured in several sessions.

    ``sessions`` holds each session's per-trial tok/s at one level (at least two sessions, at
    least two trials in one of them).  Method of moments on the log scale: the scatter of the
    session means, minus the part the within-session noise explains, is the variance of one
    session's factor; the gate needs the variance of the *ratio* of two independent sessions,
    twice that.  Returns 0 when the session means agree better than trial noise predicts.
    With few sessions this estimate is itself noisy: prefer rounding it up.
    """
    logs = [
        two_sample._log_samples("session", s, 1, f"session {i}: ")[0]
        for i, s in enumerate(sessions)
    ]
    if len(logs) < 2 or any(x.size == 0 for x in logs):
        raise ValueError("need at least two sessions, each with at least one trial")
    dof = sum(x.size - 1 for x in logs)
    if dof == 0:
        raise ValueError("need at least one session with two or more trials")
    within = sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / dof
    means = np.array([x.mean() for x in logs])
    inv_n = float(np.mean([1.0 / x.size for x in logs]))
    between = max(0.0, float(means.var(ddof=1)) - within * inv_n)
    return math.sqrt(2.0 * between)


def estimate_with_interval(
    sessions: Sessions, confidence: float = DEFAULT_CONFIDENCE
) -> NoiseEstimate:
    """``session_sigma`` of one level from its sessions' trials, with its interval.

    ``sessions[i]`` holds session ``i``'s per-trial tok/s (at least two sessions, at least
    one of them with two or more trials).  The point estimate equals
    :func:`estimate_session_sigma`.  Raises ``ValueError`` for too
    little data or a sample that is not a positive finite number.
    """
    return pooled([[sessions]], confidence)


def pooled(
    deployments: Sequence[Sequence[Sessions]], confidence: float = DEFAULT_CONFIDENCE
) -> NoiseEstimate:
    """One ``session_sigma`` from several levels of one or more deployments.

    ``deployments[d][l][i]`` is the trials of level ``l`` in session ``i`` of deployment ``d``:
    within a deployment, session ``i`` must be the same server start at every level (they share
    its factor, which is why they are averaged rather than counted as independent; see the
    module docstring), and every level must have the same number of sessions.  Deployments are
    independent server starts of their own.  A level whose sessions hold one trial each says
    nothing about trial noise and is left out.  Raises ``ValueError`` when nothing is left.
    """
    _check_confidence(confidence)
    ss_between = 0.0
    df_between = 0
    terms: list[tuple[float, float, int]] = []
    """(coefficient, within variance, its df) per level, before dividing by df_between."""
    sessions = trials = levels = 0
    within_ss = 0.0
    within_df = 0
    for d, deployment in enumerate(deployments):
        where = f"deployment {d}: " if len(deployments) > 1 else ""
        counts = {len(level) for level in deployment}
        if len(counts) > 1:
            raise ValueError(
                f"{where}every level needs the same sessions (got {sorted(counts)} sessions)"
            )
        parsed = []
        for li, level in enumerate(deployment):
            lwhere = f"{where}level {li}: " if len(deployment) > 1 else where
            try:
                parsed.append(_level(level, lwhere))
            except ValueError as exc:
                if "two or more trials" in str(exc) and len(deployment) > 1:
                    continue  # no trial noise to subtract at this level: leave it out
                raise
        if not parsed:
            continue
        k = len(parsed[0].means)
        n_levels = len(parsed)
        scores = np.mean(np.array([lv.means for lv in parsed]), axis=0)
        ss_between += float(((scores - scores.mean()) ** 2).sum())
        df_between += k - 1
        for lv in parsed:
            terms.append(((k - 1) * lv.inv_n / n_levels**2, lv.within_var, lv.df_within))
            within_ss += lv.within_var * lv.df_within
            within_df += lv.df_within
            trials += lv.trials
        sessions += k
        levels = max(levels, n_levels)
    if df_between == 0:
        raise ValueError("need at least two sessions with two or more trials in one of them")
    between = ss_between / df_between
    parts = [c / df_between * var for c, var, _ in terms]
    within = sum(parts)
    df_w = (
        within**2 / sum(p**2 / df for p, (_, _, df) in zip(parts, terms))
        if within > 0
        else math.inf
    )
    low, high = _mls(between, df_between, within, df_w, confidence)
    return NoiseEstimate(
        sigma=math.sqrt(2.0 * max(between - within, 0.0)),
        low=math.sqrt(2.0 * max(low, 0.0)),
        high=math.sqrt(2.0 * max(high, 0.0)),
        sessions=sessions,
        confidence=confidence,
        trials=trials,
        levels=levels,
        within_sd=math.sqrt(within_ss / within_df) if within_df else 0.0,
        df_between=df_between,
        df_within=df_w,
    )


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


_LARGE_DF = 1e9
"""Stands in for infinite degrees of freedom in scipy's F quantiles."""


def _mls(s1: float, n1: float, s2: float, n2: float, confidence: float) -> tuple[float, float]:
    """The MLS interval for ``s1 - s2`` (mean squares with ``n1`` and ``n2`` degrees of
    freedom; their expectations' difference is the variance component).

    Ting et al. (1990) with ``c1 = c2 = 1``; ``F(a; n, m)`` below is the ``a`` quantile, so
    the upper-tail point of Burdick and Graybill's notation ``F_{alpha: n, m}`` is
    ``F(1 - alpha; n, m)``.  Either end may be negative (the component cannot): the caller
    clips at 0.
    """
    # Satterthwaite's df is an approximation to begin with: a tenth is plenty, and lets the
    # cache serve the next call
    g1, h1, g2, h2, g12, h12 = _mls_constants(n1, round(min(n2, _LARGE_DF), 1), confidence)
    point = s1 - s2
    v_low = g1**2 * s1**2 + h2**2 * s2**2 + g12 * s1 * s2
    v_high = h1**2 * s1**2 + g2**2 * s2**2 + h12 * s1 * s2
    return point - math.sqrt(max(v_low, 0.0)), point + math.sqrt(max(v_high, 0.0))


@functools.lru_cache(maxsize=512)
def _mls_constants(
    n1: float, n2: float, confidence: float
) -> tuple[float, float, float, float, float, float]:
    """G1, H1, G2, H2, G12, H12 of Ting et al. for these degrees of freedom (cached: a run or a
    coverage simulation asks for the same few designs over and over)."""
    st = two_sample._st()
    alpha = (1.0 - confidence) / 2.0

    def chi_f(q: float, n: float) -> float:  # F(q; n, inf) = chi2(q; n) / n
        return float(st.chi2.ppf(q, n)) / n

    g1 = 1.0 - 1.0 / chi_f(1.0 - alpha, n1)
    h1 = 1.0 / chi_f(alpha, n1) - 1.0
    g2 = 1.0 - 1.0 / chi_f(1.0 - alpha, n2)
    h2 = 1.0 / chi_f(alpha, n2) - 1.0
    f_hi = float(st.f.ppf(1.0 - alpha, n1, n2))
    f_lo = float(st.f.ppf(alpha, n1, n2))
    g12 = ((f_hi - 1.0) ** 2 - g1**2 * f_hi**2 - h2**2) / f_hi
    h12 = ((1.0 - f_lo) ** 2 - h1**2 * f_lo**2 - g2**2) / f_lo
    return g1, h1, g2, h2, g12, h12


def gate_sigma(sigma: float, step: float = RECOMMEND_STEP) -> float:
    """The figure the gate uses for a measured session noise: rounded *up* to ``step`` (half
    a percent) and never below it (a measured 0 is not a server without noise), as the
    history, a baseline's recording and ``kimi-perf calibrate`` all state it."""
    if step <= 0:
        raise ValueError(f"step must be > 0, got {step!r}")
    return round(max(step, math.ceil(round(sigma / step, 9)) * step), 6)


def recommend(
    estimate: NoiseEstimate,
    *,
    current: float | None = None,
    step: float = RECOMMEND_STEP,
) -> Recommendation:
    """The ``--perf-session-sigma`` to use: the point estimate rounded up to ``step``.

    Why not the interval's upper end: with a handful of sessions it is two to three times the
    estimate, and a gate run with it cannot vouch for any drop it should catch (the session
    floor, :func:`two_sample.smallest_vouchable_drop`, grows with it); the estimate rounded up is
    what docs/statistics.md has always asked for.  The text gives the interval and, with
    fewer than :data:`FEW_SESSIONS` sessions, says the figure is rough and names the upper end
    for a gate that must not false-alarm.  ``current``: the value the run's gate used, to say
    whether it is too small (false alarms above alpha) or larger than needed (power lost).
    """
    if step <= 0:
        raise ValueError(f"step must be > 0, got {step!r}")
    value = math.ceil(round(estimate.sigma / step, 9)) * step
    value = round(value, 6)
    pct = f"{estimate.confidence:.0%}"
    words = (
        f"--perf-session-sigma {value:g} (estimate {estimate.sigma:.4f}, {pct} interval "
        f"{estimate.low:.4f}..{estimate.high:.4f}, from {estimate.sessions} sessions"
    )
    if estimate.levels > 1:
        words += f" x {estimate.levels} levels"
    words += ")"
    if estimate.sessions < FEW_SESSIONS:
        words += (
            f"; {estimate.sessions} sessions make a rough figure: run {FEW_SESSIONS} or more, or "
            f"use the upper end {estimate.high:.3f} where a false alarm costs more than power"
        )
    if current is not None:
        if current < estimate.low:
            words += (
                f"; the {current:g} this run used is below the interval: expect more false "
                "alarms than alpha"
            )
        elif current > estimate.high:
            words += (
                f"; the {current:g} this run used is above the interval: the gate gives up "
                "power it could have"
            )
        else:
            words += f"; the {current:g} this run used is inside the interval"
    return Recommendation(value=value, estimate=estimate, text=words)


__all__ = [
    "DEFAULT_CONFIDENCE",
    "FEW_SESSIONS",
    "NoiseEstimate",
    "RECOMMEND_STEP",
    "gate_sigma",
    "Recommendation",
    "Sessions",
    "estimate_with_interval",
    "pooled",
    "recommend",
]
