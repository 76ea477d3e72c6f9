"""The statistical gate: is the current throughput at a level worse than the baseline's?

Pure functions over plain numbers (no I/O, no pytest): the plugin calls them between trials
and at the end of a test, and the same calls compare two saved reports offline or two
deployments measured in the same run (A/B: reference profile vs candidate).

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
:func:`compare_family` also returns the test's common shift.  One test per level, at the end;
the one look at ``d`` the trial policy takes (*Trials*) is accounted for by its
:class:`Design`.

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

Trials (variance-driven sample size, one look at the estimate)
--------------------------------------------------------------
At the variance rule's first stop, a powered level whose estimate lies beyond the tolerance
without a significant regression is ``undecided`` (:attr:`StopReason.UNDECIDED`) and runs to
``max_trials``; the final test then uses the null distribution of this procedure
(:class:`Design`, :func:`pytest_kimi.gate.family.single_adaptive_p`), since taking the
extended data at face value raised the false-alarm rate at the tolerance to 5.6% (4.6% with
the design; ``bench/stat_power.py --no-design``).  Otherwise:

After ``min_trials`` (3) current trials, :func:`decide` stops a level that is already powered.
Otherwise it asks, from the current variance estimates, for the smallest number of current
trials (at most ``max_trials``, 10) that makes the level powered, and is called again after
them; if even ``max_trials`` cannot (the session-noise floor), it stops at once (*futility*:
more trials cannot help).  Only the sample variances enter this rule, never ``d`` -- an
internal pilot -- so one final test at the full alpha replaces the looks of version 1.  The
pilot is not quite free: levels whose first trials happened to agree would stop with a slightly
small ``se`` (a true drop of exactly the tolerance, the worst case, was flagged 5.2% of the time
instead of the 4.9-5.0% of a fixed number of trials), so the current side's within-session
variance is never taken below the baseline's (:func:`_core`); simulated (bench/stat_power.py,
defaults, 3% session and 2% trial noise) the worst case is then flagged 4.8%, no change 0.1%.  A level without a baseline runs all
``max_trials`` so the run makes a good baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

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


class StopReason(str, Enum):
    """Why :func:`decide` stopped (or did not stop) adding trials."""

    POWERED = "powered"
    """The level is powered with the trials it has: the final test can vouch for it."""
    FUTILITY = "futility"
    """Even ``max_trials`` current trials would leave the level underpowered (the noise, most
    often the session term, is too large for ``detectable_drop``): more trials cannot help."""
    MAX_TRIALS = "max-trials"
    CONTINUE = "continue"
    UNDECIDED = "undecided"
    """Powered, but the estimate lies beyond the tolerance without a significant regression:
    run to ``max_trials`` (the one look that reads the estimate; :class:`Design`)."""
    NO_BASELINE = "no-baseline"
    """Nothing to compare with: run the whole schedule so the run makes a good baseline."""


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
class Decision:
    """What to do after a level's trials so far."""

    stop: bool
    next_trials: int
    """How many more current trials to run before calling :func:`decide` again (0 on stop)."""
    reason: StopReason
    look: int
    """The ``look`` the caller passed (how many times it asked before; for display only)."""
    alpha_weight: float
    """Always 1.0: the trial count never depends on the estimate, so no alpha is spent on
    looks.  Kept so callers that hand it to :func:`compare_test` keep working."""
    comparison: LevelComparison
    """The comparison with the trials so far (single level, no Holm) -- for progress display."""


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


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Vectorised results of :func:`decide_batch`."""

    stop: NDArray[np.bool_]
    reason: NDArray[np.str_]
    next_trials: NDArray[np.int64]
    alpha_weight: float


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
    k = float(_st().norm.ppf(1.0 - alpha) + _st().norm.ppf(power))
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


# --------------------------------------------------------------------------- Holm


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (:func:`pytest_kimi.gate.family.holm`)."""
    from pytest_kimi.gate import family

    return family.holm(list(p_values))


# --------------------------------------------------------------------------- trials


def look_schedule(
    min_trials: int = DEFAULT_MIN_TRIALS, max_trials: int = DEFAULT_MAX_TRIALS
) -> tuple[int, ...]:
    """The bounds of a level's current trial count: ``(min_trials, max_trials)``.

    The first :func:`decide` comes after ``min_trials``; the variance-driven top-ups never go
    past ``max_trials``.  ``(max_trials,)`` when both are equal (a fixed number of trials).
    """
    if min_trials < 1 or max_trials < min_trials:
        raise ValueError(
            f"need 1 <= min_trials <= max_trials, got min_trials={min_trials}, "
            f"max_trials={max_trials}"
        )
    return (max_trials,) if max_trials == min_trials else (min_trials, max_trials)


def _projected_mdd(
    core: _Core,
    n_b: int,
    n_c: int,
    session_sigma: float,
    tolerance: float,
    alpha: float,
    power: float,
) -> NDArray[np.float64]:
    """Minimum detectable drop if the level had ``n_c`` current trials (``n_c >= 2``) with
    the variances estimated so far (a side without one borrows the other's)."""
    var_c = core.var_c if core.var_c is not None else core.var_b
    w, denom = _within_terms(core.var_b, n_b, var_c, n_c, core.d.size)
    se2 = session_sigma**2 + w
    return _mdd(np.sqrt(se2), se2**2 / denom, tolerance, alpha, power)


# --------------------------------------------------------------------------- public API


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


def trials_stopped(
    n: int,
    design: Design | None,
    max_trials: int,
    *,
    p_raw: float,
    p_final: float,
    alpha: float,
) -> str:
    """Why a level's current trials stopped at ``n``, as it happened: for the reason of a level
    whose verdict more trials might have changed (``inconclusive``).

    ``design``: the trial policy's look (:class:`Design`; None: a fixed number of trials);
    ``p_raw``/``p_final``: the level's own p and the one its verdict was decided at.  Before,
    the reason said "or raise --perf-max-trials" after 3 of 10 trials, where the rule had
    stopped because the drop was significant at its look (p=0.0469) and only the final test,
    which pays for that look, put it at 0.0537: more trials would not have been run.
    """
    if n >= max_trials:
        return f"the cap of {max_trials} trials (--perf-max-trials) was reached"
    if design is None:
        return f"{n} trials were all the run planned (a fixed number, no look at the figures)"
    if design.extend_to > design.interim_trials and n == design.interim_trials:
        return (
            f"the trial policy stopped after {n} of at most {max_trials}: at its look the "
            f"level was powered and its drop significant on its own (p={p_raw:.3g} <= alpha "
            f"{alpha:g}), so it was not extended; the final test, which pays for that look "
            f"(and the test's other levels), decided at {p_final:.3g}: this rule would not "
            "have run more trials, a rerun decides"
        )
    if design.extend_to == design.interim_trials and n == design.interim_trials:
        return (
            f"the trial policy stopped after {n} of at most {max_trials} (futility): even "
            f"{max_trials} trials could not have made the level powered at this noise, so "
            "more trials would not help"
        )
    return (
        f"{n} trials gave a figure of the {design.extend_to} the trial policy planned "
        f"(at most {max_trials})"
    )


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

    def to_dict(self) -> dict[str, Any]:
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


def decide_batch(
    baseline: ArrayLike,
    current: ArrayLike,
    *,
    look: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    min_trials: int = DEFAULT_MIN_TRIALS,
    max_trials: int = DEFAULT_MAX_TRIALS,
    n_levels: int = 1,
    power: float = DEFAULT_POWER,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
) -> BatchDecision:
    """Vectorised :func:`decide` over independent rows (same trial counts in every row).

    Reads only the trial counts and the sample variances, never the means: rows with the
    same scatter get the same answer whatever their ratio.
    """
    _check_params(tolerance, alpha, session_sigma, power, detectable_drop)
    if n_levels < 1:
        raise ValueError(f"n_levels must be >= 1, got {n_levels}")
    if look < 0:
        raise ValueError(f"look must be >= 0, got {look}")
    look_schedule(min_trials, max_trials)  # validates the bounds
    log_b, log_c = _log_samples("baseline", baseline, 2), _log_samples("current", current, 2)
    rows, n_c = log_c.shape
    n_b = log_b.shape[1]
    if n_c == 0:
        raise ValueError("decide needs at least one current trial")

    def answer(reason: NDArray[np.str_], nxt: NDArray[np.int64]) -> BatchDecision:
        stop = (reason != StopReason.CONTINUE.value) & (reason != StopReason.UNDECIDED.value)
        return BatchDecision(
            stop=stop,
            reason=reason,
            next_trials=np.where(stop, 0, nxt).astype(np.int64),
            alpha_weight=1.0,
        )

    reason = np.full(rows, StopReason.CONTINUE.value, dtype="<U12")
    if n_b == 0:
        if n_c >= max_trials:
            reason[:] = StopReason.NO_BASELINE.value
        return answer(reason, np.full(rows, max_trials - n_c, dtype=np.int64))
    if n_c < min_trials:  # the pilot is not complete yet
        return answer(reason, np.full(rows, min_trials - n_c, dtype=np.int64))

    core = _core(log_b, log_c, session_sigma)
    valid = np.isfinite(core.se) & np.isfinite(core.df)
    mdd_now = np.where(
        valid,
        _mdd(np.where(valid, core.se, 1.0), np.where(valid, core.df, 1.0), tolerance, alpha, power),
        1.0,
    )
    powered = mdd_now <= detectable_drop
    if n_c >= max_trials:
        reason[:] = StopReason.MAX_TRIALS.value
        reason[powered] = StopReason.POWERED.value
        return answer(reason, np.zeros(rows, dtype=np.int64))
    if core.var_b is None and core.var_c is None:  # one trial each: get a second one
        return answer(reason, np.ones(rows, dtype=np.int64))
    target = np.zeros(rows, dtype=np.int64)
    for n in range(max_trials, n_c, -1):  # downwards: the smallest n that suffices wins
        target[
            _projected_mdd(core, n_b, n, session_sigma, tolerance, alpha, power) <= detectable_drop
        ] = n
    reason[target == 0] = StopReason.FUTILITY.value
    reason[powered] = StopReason.POWERED.value
    # Powered, but the estimate lies beyond the tolerance and its regression is not
    # significant: neither ``pass`` nor ``regression`` is vouched for, so take every trial the
    # cap allows.  This look reads the estimate; the final test accounts for it (Design).
    t = _tests(core, tolerance, alpha, alpha, power, detectable_drop)
    undecided = powered & (t.p_regression > alpha) & (t.ratio < 1.0 - tolerance)
    reason[undecided] = StopReason.UNDECIDED.value
    return answer(reason, np.where(undecided, max_trials - n_c, target - n_c).astype(np.int64))


def decide(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    look: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    min_trials: int = DEFAULT_MIN_TRIALS,
    max_trials: int = DEFAULT_MAX_TRIALS,
    n_levels: int = 1,
    power: float = DEFAULT_POWER,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
) -> Decision:
    """Between trials: stop now, or run ``next_trials`` more current trials and call again.

    Protocol: run ``min_trials`` trials and call; while ``not stop`` run ``next_trials`` more
    and call again (``look`` counts the calls, for display).  Stops when the level is powered
    (``min_detectable_drop <= detectable_drop``), when even ``max_trials`` could not power it
    (futility), or at ``max_trials``; otherwise ``next_trials`` is the smallest top-up that
    powers the level under the variances estimated so far.  Finish with :func:`compare_test`
    over all levels of the test.  The rule never reads the estimated ratio, so no alpha is
    spent on looks (the pilot's small cost: module docstring).  A level without a baseline runs all ``max_trials``.  ``n_levels`` is accepted
    for compatibility and does not change the rule (power is per level, at ``alpha``).  The
    caller bounds the trials it runs when trials can fail without giving a figure: the rule
    only sees the figures.  For an A/B run the caller may add the same number of trials to
    both sides.
    """
    dec = decide_batch(
        [list(baseline)],
        [list(current)],
        look=look,
        tolerance=tolerance,
        alpha=alpha,
        session_sigma=session_sigma,
        min_trials=min_trials,
        max_trials=max_trials,
        n_levels=n_levels,
        power=power,
        detectable_drop=detectable_drop,
    )
    comparison = compare_level(
        baseline,
        current,
        tolerance=tolerance,
        alpha=alpha,
        session_sigma=session_sigma,
        power=power,
        detectable_drop=detectable_drop,
    )
    return Decision(
        stop=bool(dec.stop[0]),
        next_trials=int(dec.next_trials[0]),
        reason=StopReason(str(dec.reason[0])),
        look=look,
        alpha_weight=1.0,
        comparison=comparison,
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
    logs = [_log_samples("session", s, 1, f"session {i}: ")[0] for i, s in enumerate(sessions)]
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


__all__ = [
    "BatchComparison",
    "BatchDecision",
    "CI_LEVEL",
    "DEFAULT_ALPHA",
    "DEFAULT_DETECTABLE_DROP",
    "DEFAULT_MAX_TRIALS",
    "DEFAULT_MIN_TRIALS",
    "DEFAULT_POWER",
    "DEFAULT_SESSION_SIGMA",
    "DEFAULT_TOLERANCE",
    "Decision",
    "LevelComparison",
    "MIN_LOG_SD",
    "StopReason",
    "Verdict",
    "compare_batch",
    "compare_level",
    "compare_test",
    "decide",
    "decide_batch",
    "estimate_session_sigma",
    "holm",
    "look_schedule",
    "smallest_vouchable_drop",
    "trials_stopped",
]
