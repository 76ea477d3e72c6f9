"""One level's comparison with its baseline: is the current throughput worse than the baseline's?


Pure functions over plain numbers (no I/O, no pytest): the plugin calls them between trials
and at the end of a test, and the same calls compare two saved reports offline or two
deployments measured in the same run (A/B: reference profile vs candidate).

Why a module of its own: this is the two-sample test every other part of the gate stands on
(the test's levels as one family, :mod:`pytest_kimi.gate.family_verdicts`; the adaptive trials,
:mod:`pytest_kimi.gate.trial_decision`; the latency gate; the session noise), and it reads no
more than two samples of tok/s and the gate's settings.  :mod:`pytest_kimi.gate.stats` keeps
the documented names importable from one place.

Model
-----
* **Sample unit** -- one trial's aggregate output tok/s at one concurrency level.  Requests
  inside a trial share the server's batch and KV cache, so they are correlated and are never
  used as samples.
* **Log scale** -- throughput noise is multiplicative (a slower GPU clock slows every token by
  the same factor), so we compare ``mean(log current) - mean(log baseline)``: the log of the
  ratio of geometric means.  A 5% tolerance is then the same margin at 100 tok/s and 10k tok/s.
* **Welch** -- baseline and current variances are estimated separately (they come from
  different sessions, machines or builds); degrees of freedom by Welch-Satterthwaite.
* **Session noise** -- two sessions differ by a random factor (clock, thermal state, placement)
  that is constant within a session and therefore invisible in either sample's scatter.
  ``session_sigma`` (default 0.03, the standard deviation of the log ratio between two
  sessions) is added as a *known* variance component to the variance of the difference of
  means; it contributes no uncertainty of its own to the degrees of freedom.  Without it a
  naive Welch test calls the session lottery a regression far more often than ``alpha``.
  Set it to 0 for an interleaved A/B on the same machine or for a noiseless simulator.

Tests per level (``m = log(1 - tolerance)``, ``d`` the log ratio, ``se`` its standard error)
-------------------------------------------------------------------------------------------
* regression: H0 ``ratio >= 1 - tol`` vs H1 ``ratio < 1 - tol``;  p = T_df((d - m) / se)
* improved: H0 ``ratio <= 1 + tol`` vs H1 ``ratio > 1 + tol``;  p = 1 - T_df((d - log(1 + tol)) / se)

Across the levels of one test both are adjusted by closed testing over the levels' common
shifts, with the session term they share (:mod:`pytest_kimi.gate.family`): a sweep whose
levels move together is as sensitive as one level, and the family-wise rate stays at alpha.
:func:`~pytest_kimi.gate.family_verdicts.compare_family` also returns the test's common shift.  One test per level, at the end;
the one look at ``d`` the trial policy takes (:mod:`pytest_kimi.gate.trial_decision`) is
accounted for by its :class:`~pytest_kimi.gate.family_verdicts.Design`.

Power: what ``pass`` vouches for
--------------------------------
A test with no significant regression proves nothing by itself: with few, noisy trials a real
drop goes unseen.  ``pass`` therefore also needs power: a true drop of ``detectable_drop``
(default 15%) must have been flagged with probability ``power`` (default 0.95).  The
**minimum detectable drop** of a level is the true drop that its regression test flags with
probability ``power``::

    min_detectable_drop = 1 - exp(log(1 - tol) - (t_{1-alpha,df} + t_{power,df}) * se)

and the level is powered when ``min_detectable_drop <= detectable_drop``.  Since ``se`` never
falls below ``session_sigma``, no number of trials gets below
:func:`smallest_vouchable_drop` (``se = session_sigma``, no within-session noise); with the
defaults that is ``1 - 0.95 * exp(-3.29 * 0.03) = 14.0% < 15%``, so the defaults can vouch for
an unchanged deployment.  The plugin warns once, up front, when a user's settings cannot.

(The gate of version 1 called ``pass`` only when a mirrored equivalence test showed the ratio
significantly *above* ``1 - tol``.  With ``se >= session_sigma = 3%`` that needs
``d > log(0.95) + 1.645 * 0.031 ~ 0``: an unchanged deployment passed half of the time.)

Verdict, first match wins
-------------------------
1. ``regression``   adjusted p_regression <= alpha.
2. ``improved``     adjusted p_improved <= alpha.
3. ``inconclusive`` the estimated ratio lies beyond the tolerance (``< 1 - tol``) and the
   drop is not significant: the data vouch for neither ``pass`` nor ``regression``.
4. ``underpowered`` min_detectable_drop > detectable_drop: this run cannot vouch for the level
   (more trials, less noise or a larger ``detectable_drop``; not a code change).
5. ``pass``         no significant regression beyond the tolerance, the estimate within it,
   and a drop of ``detectable_drop`` would have been caught with probability ``power``.
``no-baseline`` is returned when the baseline is empty; the caller decides what that means.

Significant results rank above ``underpowered``: a significant test is valid whatever its
power, and low power only explains why a result is *not* significant.  Regression ranks first
because it is the one that fails the build.  Regression and improved never both hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pytest_kimi.logscale import MIN_LOG_SD
from pytest_kimi.verdicts import Verdict


def _st() -> Any:
    """scipy.stats, imported on first use: the plugin imports this module in every session
    (and each subprocess session), and scipy costs about a second that a session without a
    baseline comparison never needs."""
    from scipy import stats

    return stats


DEFAULT_TOLERANCE = 0.05
DEFAULT_ALPHA = 0.05
DEFAULT_SESSION_SIGMA = 0.03
DEFAULT_POWER = 0.95
DEFAULT_DETECTABLE_DROP = 0.15
"""The true drop the gate must catch with probability ``power`` before it says ``pass``."""
DEFAULT_MIN_TRIALS = 3
DEFAULT_MAX_TRIALS = 10
CI_LEVEL = 0.90


@dataclass(frozen=True, slots=True)
class LevelComparison:
    """Everything the reports show for one level."""

    baseline_median: float
    """Median tok/s of the baseline trials (robust headline figure, not used by the test)."""
    current_median: float
    ratio: float
    """current / baseline ratio of geometric means."""
    ci90: tuple[float, float]
    """90% Welch confidence interval of ``ratio`` (session noise included; not widened for
    levels, so it is a description, the verdict comes from the adjusted p-values)."""
    p_regression: float
    """Holm-adjusted (across levels) p-value of H0 ``ratio >= 1 - tol``."""
    p_improved: float
    """Holm-adjusted (across levels) p-value of H0 ``ratio <= 1 + tol``."""
    min_detectable_drop: float
    """The true drop (fraction, e.g. 0.12 = 12%) that these samples flag as a regression with
    probability ``power``; 1.0 when the noise cannot be estimated at all."""
    verdict: Verdict
    n_baseline: int
    n_current: int
    p_regression_raw: float = math.nan
    """Single-test p-value before any multiplicity adjustment."""
    p_improved_raw: float = math.nan
    se_log: float = math.nan
    """Standard error of the log ratio, session noise included."""
    df: float = math.nan
    """Welch-Satterthwaite degrees of freedom."""
    alpha_weight: float = 1.0
    """Share of alpha this level was tested at (1.0: the adaptive trials spend none on looks)."""
    detectable_drop: float = math.nan
    """The drop the level had to be able to catch to ``pass`` (the setting it was judged by)."""
    power: float = math.nan
    """The probability with which it had to catch it."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping (floats, lists, the verdict's string value)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class BatchComparison:
    """Vectorised results of :func:`compare_batch`: one entry per independent row."""

    ratio: NDArray[np.float64]
    ci_lo: NDArray[np.float64]
    ci_hi: NDArray[np.float64]
    p_regression: NDArray[np.float64]
    p_improved: NDArray[np.float64]
    min_detectable_drop: NDArray[np.float64]
    verdict: NDArray[np.str_]
    """Verdict values (``"pass"``, ``"regression"`` ...); compares equal to :class:`Verdict`."""
    valid: NDArray[np.bool_]
    """Rows whose noise is defined (finite standard error); the others read as no evidence."""
    se_log: NDArray[np.float64]
    """Standard error of the log ratio (session noise included); NaN where not ``valid``."""
    df: NDArray[np.float64]
    """Welch-Satterthwaite degrees of freedom; NaN where not ``valid``."""


# --------------------------------------------------------------------------- validation


def _check_params(
    tolerance: float, alpha: float, session_sigma: float, power: float, detectable_drop: float
) -> None:
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance must be a fraction in (0, 1), got {tolerance!r}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if not (session_sigma >= 0.0 and math.isfinite(session_sigma)):
        raise ValueError(f"session_sigma must be a finite number >= 0, got {session_sigma!r}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    if not 0.0 < detectable_drop < 1.0:
        raise ValueError(f"detectable_drop must be a fraction in (0, 1), got {detectable_drop!r}")


def _log_samples(name: str, values: ArrayLike, ndim: int, where: str = "") -> NDArray[np.float64]:
    """Validate throughputs and return their logs as a 2-D array (rows are comparisons)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}{name} throughput samples must be numbers: {exc}") from None
    if arr.ndim != ndim:
        raise ValueError(f"{where}{name} samples must be {ndim}-dimensional, got shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr > 0.0))
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        idx = pos[0] if ndim == 1 else list(pos)
        raise ValueError(
            f"{where}{name} throughput must be finite and > 0 tok/s (one trial's aggregate "
            f"rate); got {name}[{idx}] = {float(arr[pos])!r}: a trial that produced no tokens "
            "is an error to report, not a sample"
        )
    return np.log(arr.reshape(1, -1) if ndim == 1 else arr)


# --------------------------------------------------------------------------- core maths


def _within_var(log_x: NDArray[np.float64]) -> NDArray[np.float64] | None:
    """Per-row sample variance with the :data:`~pytest_kimi.logscale.MIN_LOG_SD` floor; None
    below two samples."""
    if log_x.shape[1] < 2:
        return None
    var: NDArray[np.float64] = np.maximum(log_x.var(axis=1, ddof=1), MIN_LOG_SD**2)
    return var


def _side_terms(
    var_b: NDArray[np.float64] | None,
    n_b: int,
    var_c: NDArray[np.float64] | None,
    n_c: int,
    rows: int,
) -> tuple[NDArray[np.float64], ...]:
    """The within-session variance of the difference of means by side:
    ``(wb, denom_b, vc, w, denom)`` -- the baseline's part of the variance and of its
    Satterthwaite denominator, the current side's per-trial variance, and the totals.

    A side with a single sample borrows the other side's variance (the noise is a property of
    the serving stack, similar in both sessions) and with it that side's degrees of freedom.
    Both sides single: nothing to estimate the noise from -- NaN, and the level is reported
    underpowered instead of pretending to know.
    """
    if var_b is not None and var_c is not None:
        wb, wc = var_b / n_b, var_c / n_c
        db = wb**2 / (n_b - 1)
        return wb, db, var_c, wb + wc, db + wc**2 / (n_c - 1)
    if var_b is not None:  # one current trial: the baseline's scatter and degrees of freedom
        w = var_b * (1.0 / n_b + 1.0 / n_c)
        return var_b / n_b, w**2 / (n_b - 1), var_b, w, w**2 / (n_b - 1)
    if var_c is not None:  # one baseline trial: the current side's
        w = var_c * (1.0 / n_b + 1.0 / n_c)
        return var_c / n_b, np.zeros(rows), var_c, w, w**2 / (n_c - 1)
    nan = np.full(rows, np.nan)
    return nan, nan, nan, nan, nan


def _within_terms(
    var_b: NDArray[np.float64] | None,
    n_b: int,
    var_c: NDArray[np.float64] | None,
    n_c: int,
    rows: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Within-session variance of the difference of means and its Satterthwaite denominator
    (:func:`_side_terms`)."""
    terms = _side_terms(var_b, n_b, var_c, n_c, rows)
    return terms[3], terms[4]


@dataclass(frozen=True, slots=True)
class _Core:
    d: NDArray[np.float64]
    se: NDArray[np.float64]
    df: NDArray[np.float64]
    var_b: NDArray[np.float64] | None
    var_c: NDArray[np.float64] | None


def _core(log_b: NDArray[np.float64], log_c: NDArray[np.float64], session_sigma: float) -> _Core:
    """Log ratio, its standard error with the session component, and Welch df, per row."""
    n_b, n_c = log_b.shape[1], log_c.shape[1]
    var_b, var_c = _within_var(log_b), _within_var(log_c)
    if var_b is not None and var_c is not None:
        # The current side never counts as quieter than its baseline.  A level stops after its
        # 3-trial pilot when those trials happen to agree, so a pilot's own variance is biased
        # low among the levels that stop: taken at face value it let 5.2% of levels at a drop
        # of exactly the tolerance be flagged (bench/stat_power.py); floored at the baseline's
        # (recorded with 10 trials, and the serving stack's noise is the same in both
        # sessions) it is 4.9%, for 0.3 more trials per level.
        var_c = np.maximum(var_c, var_b)
    w, denom = _within_terms(var_b, n_b, var_c, n_c, log_b.shape[0])
    se2 = session_sigma**2 + w
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2**2 / denom
    d = log_c.mean(axis=1) - log_b.mean(axis=1)
    return _Core(d=d, se=np.sqrt(se2), df=df, var_b=var_b, var_c=var_c)


def _mdd(
    se: NDArray[np.float64],
    df: NDArray[np.float64],
    tolerance: float,
    alpha: float | NDArray[np.float64],
    power: float,
) -> NDArray[np.float64]:
    """The true drop flagged with probability ``power`` at this standard error (module doc)."""
    k = _st().t.ppf(1.0 - np.asarray(alpha, dtype=np.float64), df) + _st().t.ppf(power, df)
    out: NDArray[np.float64] = -np.expm1(math.log1p(-tolerance) - k * se)
    return out


def smallest_vouchable_drop(
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    power: float = DEFAULT_POWER,
) -> float:
    """The smallest ``detectable_drop`` any number of trials can vouch for: the minimum
    detectable drop with no within-session noise at all (``se = session_sigma``, known, so
    normal quantiles).  When it exceeds ``detectable_drop`` every compared level ends
    ``underpowered`` (or significant): ``pass`` is unreachable with these settings."""
    _check_params(tolerance, alpha, session_sigma, power, 0.5)
    # the standard library's normal quantile: every perf session asks this at collection, and
    # scipy.stats would cost it half a second before any measurement needs scipy
    normal = NormalDist()
    k = normal.inv_cdf(1.0 - alpha) + normal.inv_cdf(power)
    return float(-math.expm1(math.log1p(-tolerance) - k * session_sigma))


def _tests(
    core: _Core,
    tolerance: float,
    alpha: float,
    alpha_eff: ArrayLike,
    power: float,
    detectable_drop: float,
) -> BatchComparison:
    """Raw one-sided p-values, CI, minimum detectable drop (scipy's t distribution) and the
    verdicts they give, before any adjustment for levels."""
    valid = np.isfinite(core.se) & np.isfinite(core.df)
    se = np.where(valid, core.se, 1.0)
    df = np.where(valid, core.df, 1.0)
    m_lo, m_hi = math.log1p(-tolerance), math.log1p(tolerance)
    p_reg = _st().t.cdf((core.d - m_lo) / se, df)
    p_imp = _st().t.sf((core.d - m_hi) / se, df)
    q = _st().t.ppf(0.5 + CI_LEVEL / 2.0, df)
    ci_lo, ci_hi = np.exp(core.d - q * se), np.exp(core.d + q * se)
    mdd = _mdd(se, df, tolerance, np.asarray(alpha_eff, dtype=np.float64), power)
    one = np.ones_like(core.d)
    p_reg = np.where(valid, p_reg, one)
    p_imp = np.where(valid, p_imp, one)
    mdd = np.where(valid, mdd, one)
    return BatchComparison(
        ratio=np.exp(core.d),
        ci_lo=np.where(valid, ci_lo, 0.0),
        ci_hi=np.where(valid, ci_hi, np.inf),
        p_regression=p_reg,
        p_improved=p_imp,
        min_detectable_drop=mdd,
        verdict=_verdicts(
            p_reg, p_imp, mdd, detectable_drop, alpha, ratio=np.exp(core.d), tolerance=tolerance
        ),
        valid=valid,
        se_log=np.where(valid, core.se, np.nan),
        df=np.where(valid, core.df, np.nan),
    )


def _verdicts(
    p_reg: NDArray[np.float64],
    p_imp: NDArray[np.float64],
    mdd: NDArray[np.float64],
    detectable_drop: float,
    alpha: float,
    *,
    ratio: NDArray[np.float64] | None = None,
    tolerance: float | None = None,
) -> NDArray[np.str_]:
    """Apply the verdict order of the module docstring (later assignments win)."""
    out = np.full(p_reg.shape, Verdict.PASS.value, dtype="<U12")
    out[mdd > detectable_drop] = Verdict.UNDERPOWERED.value
    if ratio is not None and tolerance is not None:
        out[ratio < 1.0 - tolerance] = Verdict.INCONCLUSIVE.value
    out[p_imp <= alpha] = Verdict.IMPROVED.value
    out[p_reg <= alpha] = Verdict.REGRESSION.value
    return out


def _weight_adjust(p: NDArray[np.float64], weight: ArrayLike) -> NDArray[np.float64]:
    """A test at ``alpha * w`` is the test of ``p / w`` at alpha."""
    return np.minimum(1.0, p / np.asarray(weight, dtype=np.float64))


def _check_weight(weight: float) -> None:
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"alpha_weight must be in (0, 1], got {weight!r}")


def compare_batch(
    baseline: ArrayLike,
    current: ArrayLike,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    alpha_weight: float = 1.0,
    power: float = DEFAULT_POWER,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
    interim_trials: ArrayLike | None = None,
    extend_to: ArrayLike | None = None,
) -> BatchComparison:
    """Compare many independent (baseline, current) pairs at once: arrays (rows, trials).

    Rows are independent comparisons (e.g. simulated repetitions), not levels of one test:
    no adjustment across rows.  Same maths as :func:`compare_level`; exists so that power
    simulations of thousands of comparisons take milliseconds.  ``alpha_weight``: test at
    ``alpha * alpha_weight`` (p-values divided by it); 1.0 unless the caller splits alpha.
    ``interim_trials`` / ``extend_to``: per row, the trial policy's look (:class:`Design`);
    the regression p then accounts for it (both sides need two or more trials).
    """
    _check_params(tolerance, alpha, session_sigma, power, detectable_drop)
    _check_weight(alpha_weight)
    log_b, log_c = _log_samples("baseline", baseline, 2), _log_samples("current", current, 2)
    if log_b.shape[0] != log_c.shape[0]:
        raise ValueError(f"row counts differ: baseline {log_b.shape}, current {log_c.shape}")
    if log_b.shape[1] == 0 or log_c.shape[1] == 0:
        raise ValueError("compare_batch needs at least one baseline and one current trial")
    core = _core(log_b, log_c, session_sigma)
    t = _tests(core, tolerance, alpha, alpha * alpha_weight, power, detectable_drop)
    p_reg = t.p_regression
    if interim_trials is not None and extend_to is not None:
        from pytest_kimi.gate import family

        if core.var_b is None or core.var_c is None:
            raise ValueError("a design needs two or more trials on both sides")
        n_b = log_b.shape[1]
        wb = core.var_b / n_b
        p_reg = family.single_adaptive_p(
            p_reg,
            session_sigma=session_sigma,
            wb=wb,
            denom_b=wb**2 / (n_b - 1),
            vc=core.var_c,
            n_interim=np.broadcast_to(np.asarray(interim_trials, dtype=np.float64), p_reg.shape),
            n_extended=np.broadcast_to(np.asarray(extend_to, dtype=np.float64), p_reg.shape),
            alpha=alpha,
        )
    elif alpha_weight == 1.0:
        return t
    p_reg = _weight_adjust(p_reg, alpha_weight)
    p_imp = _weight_adjust(t.p_improved, alpha_weight)
    return BatchComparison(
        ratio=t.ratio,
        ci_lo=t.ci_lo,
        ci_hi=t.ci_hi,
        p_regression=p_reg,
        p_improved=p_imp,
        min_detectable_drop=t.min_detectable_drop,
        verdict=_verdicts(
            p_reg,
            p_imp,
            t.min_detectable_drop,
            detectable_drop,
            alpha,
            ratio=t.ratio,
            tolerance=tolerance,
        ),
        valid=t.valid,
        se_log=t.se_log,
        df=t.df,
    )
