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
* pass (the mirrored, equivalence-style "not worse than the margin" test):
  H0 ``ratio <= 1 - tol`` vs H1 ``ratio > 1 - tol``;  p = 1 - T_df((d - m) / se)
* improved: H0 ``ratio <= 1 + tol`` vs H1 ``ratio > 1 + tol``

p-values are first divided by the share of alpha that the look they were taken at holds
(sequential trials, see :func:`look_weights`), then the regression and improved p-values are
Holm-adjusted across the levels of one test.  The pass p-value is not Holm-adjusted: a test is
green only if *every* level passes, and an intersection-union claim needs no multiplicity
correction.

Verdict, first match wins
-------------------------
1. ``regression``   adjusted p_regression <= alpha.
2. ``improved``     adjusted p_improved <= alpha (implies pass; reported as the stronger claim).
3. ``pass``         adjusted p_pass <= alpha.
4. ``underpowered`` none of the above, and the minimum detectable drop (``1 - exp(-(t_{1-a} +
   t_{power}) * se)``) exceeds the tolerance: with this noise and these samples a drop of
   exactly the tolerance cannot be told from no change (equivalently: even if nothing had
   changed, the pass test would succeed less than ``power`` of the time).  The fix is more
   trials, less noise or a wider tolerance, not a code change.
5. ``inconclusive`` none of the above with enough power: the estimate sits close to the margin.
``no-baseline`` is returned when the baseline is empty; the caller decides what that means.
These are six of the ten values of :class:`pytest_kimi.gate.verdicts.Verdict` (re-exported
here); the others are the absolute verdicts a level gets before it is compared.

Significant results rank above ``underpowered``: a significant test is valid whatever its
power, and low power only explains why a result is *not* significant.  Regression ranks first
because it is the one that fails the build.  Regression and pass can never both hold: their
p-values sum to 1 and ``alpha < 0.5`` (and improved implies pass).

Adaptive trials
---------------
Two looks, fixed in advance: after ``min_trials`` (3) and after ``max_trials`` (10).  Alpha is
split Bonferroni-style, 10% of it at the early look and 90% at the final one
(:func:`look_weights`); a level's p-values are divided by the share of the look it stopped at.
The early look stops a level on a clear regression, a clear pass, or futility (under the
current trend, the final look would give neither with probability >= 10%).  Because the union
bound holds whatever the stopping rule, no stopping decision can raise the false-alarm rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats as _st

from pytest_kimi.gate.verdicts import Verdict

DEFAULT_TOLERANCE = 0.05
DEFAULT_ALPHA = 0.05
DEFAULT_SESSION_SIGMA = 0.03
DEFAULT_POWER = 0.80
DEFAULT_MIN_TRIALS = 3
DEFAULT_MAX_TRIALS = 10
DEFAULT_FUTILITY = 0.10
FINAL_LOOK_SHARE = 0.9
"""Share of alpha kept for the last look; earlier looks split the rest equally."""
CI_LEVEL = 0.90
MIN_LOG_SD = 1e-4
"""Floor of the within-session log standard deviation (0.01%).  Identical samples (a
noiseless simulator) would otherwise give a zero standard error and a division by zero; the
floor is far below any real timer or token-count resolution, so it never masks real noise."""


class StopReason(str, Enum):
    """Why :func:`decide` stopped (or did not stop) adding trials."""

    REGRESSION = "regression"
    """Clear regression at this look's alpha share (and Bonferroni over levels, so the final
    Holm step is certain to agree)."""
    PASS = "pass"
    FUTILITY = "futility"
    """Even running every remaining trial would very likely leave the verdict unclear."""
    FINAL_LOOK = "final-look"
    CONTINUE = "continue"
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
    looks or levels, so it is a description, the verdict comes from the adjusted p-values)."""
    p_regression: float
    """Adjusted (look share, then Holm across levels) p-value of H0 ``ratio >= 1 - tol``."""
    p_improved: float
    """Adjusted (look share, then Holm across levels) p-value of H0 ``ratio <= 1 + tol``."""
    p_pass: float
    """Look-adjusted p-value of H0 ``ratio <= 1 - tol`` (no Holm: intersection-union)."""
    min_detectable_drop: float
    """Smallest drop from ratio 1 that these samples detect with probability ``power`` at the
    alpha share of their look (fraction, e.g. 0.08 = 8%); 1.0 when the noise cannot be
    estimated at all."""
    verdict: Verdict
    n_baseline: int
    n_current: int
    p_regression_raw: float = math.nan
    """Single-test p-value before any multiplicity adjustment."""
    p_improved_raw: float = math.nan
    p_pass_raw: float = math.nan
    se_log: float = math.nan
    """Standard error of the log ratio, session noise included."""
    df: float = math.nan
    """Welch-Satterthwaite degrees of freedom."""
    alpha_weight: float = 1.0
    """Share of alpha held by the look this comparison was taken at."""

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
    """What to do after a look of the adaptive trial schedule."""

    stop: bool
    next_trials: int
    """How many more current trials to run before calling :func:`decide` again (0 on stop)."""
    reason: StopReason
    look: int
    """0-based index of this look in :func:`look_schedule`."""
    alpha_weight: float
    """This look's share of alpha: pass it to :func:`compare_test` for a level stopped here."""
    comparison: LevelComparison
    """The comparison at this look (single level, no Holm) -- for progress display."""


@dataclass(frozen=True, slots=True)
class BatchComparison:
    """Vectorised results of :func:`compare_batch`: one entry per independent row."""

    ratio: NDArray[np.float64]
    ci_lo: NDArray[np.float64]
    ci_hi: NDArray[np.float64]
    p_regression: NDArray[np.float64]
    p_improved: NDArray[np.float64]
    p_pass: NDArray[np.float64]
    min_detectable_drop: NDArray[np.float64]
    verdict: NDArray[np.str_]
    """Verdict values (``"pass"``, ``"regression"`` ...); compares equal to :class:`Verdict`."""
    valid: NDArray[np.bool_]
    """Rows whose noise is defined (finite standard error); the others read as no evidence."""


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Vectorised results of :func:`decide_batch`."""

    stop: NDArray[np.bool_]
    reason: NDArray[np.str_]
    next_trials: NDArray[np.int64]
    alpha_weight: float


# --------------------------------------------------------------------------- validation


def _check_params(tolerance: float, alpha: float, session_sigma: float, power: float) -> None:
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance must be a fraction in (0, 1), got {tolerance!r}")
    if not 0.0 < alpha < 0.5:
        # alpha >= 0.5 would let regression and pass be significant at once.
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if not (session_sigma >= 0.0 and math.isfinite(session_sigma)):
        raise ValueError(f"session_sigma must be a finite number >= 0, got {session_sigma!r}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be in (0, 1), got {power!r}")


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
    """Per-row sample variance with the :data:`MIN_LOG_SD` floor; None below two samples."""
    if log_x.shape[1] < 2:
        return None
    var: NDArray[np.float64] = np.maximum(log_x.var(axis=1, ddof=1), MIN_LOG_SD**2)
    return var


def _within_terms(
    var_b: NDArray[np.float64] | None,
    n_b: int,
    var_c: NDArray[np.float64] | None,
    n_c: int,
    rows: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Within-session variance of the difference of means and its Satterthwaite denominator.

    A side with a single sample borrows the other side's variance (the noise is a property of
    the serving stack, similar in both sessions) and with it that side's degrees of freedom.
    Both sides single: nothing to estimate the noise from -- NaN, and the level is reported
    underpowered instead of pretending to know.
    """
    if var_b is not None and var_c is not None:
        wb, wc = var_b / n_b, var_c / n_c
        return wb + wc, wb**2 / (n_b - 1) + wc**2 / (n_c - 1)
    if var_b is not None or var_c is not None:
        var, k = (var_b, n_b) if var_b is not None else (var_c, n_c)
        assert var is not None
        w = var * (1.0 / n_b + 1.0 / n_c)
        return w, w**2 / (k - 1)
    nan = np.full(rows, np.nan)
    return nan, nan


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
    w, denom = _within_terms(var_b, n_b, var_c, n_c, log_b.shape[0])
    se2 = session_sigma**2 + w
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2**2 / denom
    d = log_c.mean(axis=1) - log_b.mean(axis=1)
    return _Core(d=d, se=np.sqrt(se2), df=df, var_b=var_b, var_c=var_c)


def _tests(
    core: _Core, tolerance: float, alpha: float, alpha_eff: ArrayLike, power: float
) -> BatchComparison:
    """Raw one-sided p-values, CI, minimum detectable drop (scipy's t distribution) and the
    verdicts they give, before any adjustment for looks or levels."""
    valid = np.isfinite(core.se) & np.isfinite(core.df)
    se = np.where(valid, core.se, 1.0)
    df = np.where(valid, core.df, 1.0)
    m_lo, m_hi = math.log1p(-tolerance), math.log1p(tolerance)
    t_lo = (core.d - m_lo) / se
    p_reg = _st.t.cdf(t_lo, df)
    p_pass = _st.t.sf(t_lo, df)
    p_imp = _st.t.sf((core.d - m_hi) / se, df)
    q = _st.t.ppf(0.5 + CI_LEVEL / 2.0, df)
    ci_lo, ci_hi = np.exp(core.d - q * se), np.exp(core.d + q * se)
    k = _st.t.ppf(1.0 - np.asarray(alpha_eff, dtype=np.float64), df) + _st.t.ppf(power, df)
    mdd = -np.expm1(-k * se)
    one = np.ones_like(core.d)
    p_reg = np.where(valid, p_reg, one)
    p_pass = np.where(valid, p_pass, one)
    p_imp = np.where(valid, p_imp, one)
    mdd = np.where(valid, mdd, one)
    return BatchComparison(
        ratio=np.exp(core.d),
        ci_lo=np.where(valid, ci_lo, 0.0),
        ci_hi=np.where(valid, ci_hi, np.inf),
        p_regression=p_reg,
        p_improved=p_imp,
        p_pass=p_pass,
        min_detectable_drop=mdd,
        verdict=_verdicts(p_reg, p_imp, p_pass, mdd, tolerance, alpha),
        valid=valid,
    )


def _verdicts(
    p_reg: NDArray[np.float64],
    p_imp: NDArray[np.float64],
    p_pass: NDArray[np.float64],
    mdd: NDArray[np.float64],
    tolerance: float,
    alpha: float,
) -> NDArray[np.str_]:
    """Apply the verdict order of the module docstring (later assignments win)."""
    out = np.full(p_reg.shape, Verdict.INCONCLUSIVE.value, dtype="<U12")
    out[mdd > tolerance] = Verdict.UNDERPOWERED.value
    out[p_pass <= alpha] = Verdict.PASS.value
    out[p_imp <= alpha] = Verdict.IMPROVED.value
    out[p_reg <= alpha] = Verdict.REGRESSION.value
    return out


def _look_adjust(p: NDArray[np.float64], weight: ArrayLike) -> NDArray[np.float64]:
    """Bonferroni over looks: rejecting at ``alpha * w`` is rejecting ``p / w`` at alpha."""
    return np.minimum(1.0, p / np.asarray(weight, dtype=np.float64))


def _check_weight(weight: float) -> None:
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"alpha_weight must be in (0, 1], got {weight!r}")


# --------------------------------------------------------------------------- Holm


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    The smallest p is multiplied by m, the next by m - 1, ..., and a running maximum keeps the
    adjusted values monotone in the raw ones (a level can never look more significant than one
    with a smaller raw p).  Reject where adjusted <= alpha: this controls the chance of *any*
    false alarm across the levels of a test at alpha, and is never less powerful than plain
    Bonferroni.  NaN entries (levels not tested, e.g. no baseline) pass through as NaN and do
    not count towards m.
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


# --------------------------------------------------------------------------- sequential looks


def look_schedule(
    min_trials: int = DEFAULT_MIN_TRIALS, max_trials: int = DEFAULT_MAX_TRIALS
) -> tuple[int, ...]:
    """Trial counts at which the adaptive scheme looks: ``(min_trials, max_trials)``.

    Fixed in advance because the alpha split needs it.  Two looks beat three here: with
    session noise common to every look, a middle look (e.g. at 5 of 3..10) stops few extra
    levels yet takes its share of alpha from the final look (simulated: same power, more
    trials spent under a real drop than with 3 -> 10).
    """
    if min_trials < 1 or max_trials < min_trials:
        raise ValueError(
            f"need 1 <= min_trials <= max_trials, got min_trials={min_trials}, "
            f"max_trials={max_trials}"
        )
    return (max_trials,) if max_trials == min_trials else (min_trials, max_trials)


def look_weights(n_looks: int) -> tuple[float, ...]:
    """Share of alpha spent at each look (Bonferroni split, sums to 1).

    The last look keeps :data:`FINAL_LOOK_SHARE` (90%); earlier looks share the rest.  Session
    noise is common to every look, so the looks are strongly correlated and an early look
    rarely finds a regression the final one would miss -- it is there to *save trials* on
    clear cases, which need little alpha.  A Bonferroni split is valid whatever the stopping
    rule, so stopping early (for any reason) can never raise the false-alarm rate.
    """
    if n_looks < 1:
        raise ValueError(f"n_looks must be >= 1, got {n_looks}")
    if n_looks == 1:
        return (1.0,)
    early = round((1.0 - FINAL_LOOK_SHARE) / (n_looks - 1), 12)
    return (early,) * (n_looks - 1) + (FINAL_LOOK_SHARE,)


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
) -> BatchComparison:
    """Compare many independent (baseline, current) pairs at once: arrays (rows, trials).

    Rows are independent comparisons (e.g. simulated repetitions), not levels of one test:
    no Holm across rows.  Same maths as :func:`compare_level`; exists so that power
    simulations of thousands of comparisons take milliseconds.
    """
    _check_params(tolerance, alpha, session_sigma, power)
    _check_weight(alpha_weight)
    log_b, log_c = _log_samples("baseline", baseline, 2), _log_samples("current", current, 2)
    if log_b.shape[0] != log_c.shape[0]:
        raise ValueError(f"row counts differ: baseline {log_b.shape}, current {log_c.shape}")
    if log_b.shape[1] == 0 or log_c.shape[1] == 0:
        raise ValueError("compare_batch needs at least one baseline and one current trial")
    core = _core(log_b, log_c, session_sigma)
    t = _tests(core, tolerance, alpha, alpha * alpha_weight, power)
    p_reg, p_imp, p_pass = (
        _look_adjust(p, alpha_weight) for p in (t.p_regression, t.p_improved, t.p_pass)
    )
    return replace(
        t,
        p_regression=p_reg,
        p_improved=p_imp,
        p_pass=p_pass,
        verdict=_verdicts(p_reg, p_imp, p_pass, t.min_detectable_drop, tolerance, alpha),
    )


def compare_test(
    levels: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    alpha_weights: Sequence[float] | None = None,
    power: float = DEFAULT_POWER,
) -> list[LevelComparison]:
    """Final verdicts for all levels of one test, Holm-adjusted across the levels.

    ``levels`` holds one ``(baseline, current)`` pair of tok/s sequences per level; an empty
    baseline gives ``no-baseline`` (NaN p-values, outside the Holm family).  ``alpha_weights``
    is, per level, the alpha share of the look at which its trials stopped
    (:attr:`Decision.alpha_weight`); default 1.0 = a fixed number of trials, one look.
    """
    _check_params(tolerance, alpha, session_sigma, power)
    weights = [1.0] * len(levels) if alpha_weights is None else [float(w) for w in alpha_weights]
    if len(weights) != len(levels):
        raise ValueError(f"{len(weights)} alpha_weights for {len(levels)} levels")
    for w in weights:
        _check_weight(w)

    raw: list[tuple[_Core, BatchComparison, int, int, float, float] | None] = []
    for i, (base, cur) in enumerate(levels):
        where = f"level {i}: " if len(levels) > 1 else ""
        log_c = _log_samples("current", cur, 1, where)
        log_b = _log_samples("baseline", base, 1, where)
        if log_c.shape[1] == 0:
            raise ValueError(f"{where}no current trials to compare")
        if log_b.shape[1] == 0:
            raw.append(None)
            continue
        core = _core(log_b, log_c, session_sigma)
        t = _tests(core, tolerance, alpha, alpha * weights[i], power)
        raw.append(
            (
                core,
                t,
                log_b.shape[1],
                log_c.shape[1],
                float(np.median(np.asarray(base, dtype=np.float64))),
                float(np.median(np.asarray(cur, dtype=np.float64))),
            )
        )

    def family(pick: str) -> list[float]:
        return [
            math.nan if r is None else float(_look_adjust(getattr(r[1], pick), w)[0])
            for r, w in zip(raw, weights)
        ]

    p_reg_adj, p_imp_adj = holm(family("p_regression")), holm(family("p_improved"))
    p_pass_adj = family("p_pass")

    out: list[LevelComparison] = []
    for i, r in enumerate(raw):
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
                    p_pass=math.nan,
                    min_detectable_drop=math.nan,
                    verdict=Verdict.NO_BASELINE,
                    n_baseline=0,
                    n_current=int(only.size),
                    alpha_weight=weights[i],
                )
            )
            continue
        core, t, n_b, n_c, med_b, med_c = r
        verdict = _verdicts(
            np.array([p_reg_adj[i]]),
            np.array([p_imp_adj[i]]),
            np.array([p_pass_adj[i]]),
            t.min_detectable_drop,
            tolerance,
            alpha,
        )[0]
        valid = bool(t.valid[0])
        out.append(
            LevelComparison(
                baseline_median=med_b,
                current_median=med_c,
                ratio=float(np.exp(core.d[0])),
                ci90=(float(t.ci_lo[0]), float(t.ci_hi[0])),
                p_regression=p_reg_adj[i],
                p_improved=p_imp_adj[i],
                p_pass=p_pass_adj[i],
                min_detectable_drop=float(t.min_detectable_drop[0]),
                verdict=Verdict(verdict),
                n_baseline=n_b,
                n_current=n_c,
                p_regression_raw=float(t.p_regression[0]),
                p_improved_raw=float(t.p_improved[0]),
                p_pass_raw=float(t.p_pass[0]),
                se_log=float(core.se[0]) if valid else math.nan,
                df=float(core.df[0]) if valid else math.nan,
                alpha_weight=weights[i],
            )
        )
    return out


def compare_level(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    alpha_weight: float = 1.0,
    power: float = DEFAULT_POWER,
) -> LevelComparison:
    """Verdict for a single level (a one-level :func:`compare_test`: Holm is the identity)."""
    return compare_test(
        [(baseline, current)],
        tolerance=tolerance,
        alpha=alpha,
        session_sigma=session_sigma,
        alpha_weights=[alpha_weight],
        power=power,
    )[0]


def decide_batch(
    baseline: ArrayLike,
    current: ArrayLike,
    *,
    look: int,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    min_trials: int = DEFAULT_MIN_TRIALS,
    max_trials: int = DEFAULT_MAX_TRIALS,
    n_levels: int = 1,
    futility: float = DEFAULT_FUTILITY,
    power: float = DEFAULT_POWER,
) -> BatchDecision:
    """Vectorised :func:`decide` over independent rows (same trial counts in every row)."""
    _check_params(tolerance, alpha, session_sigma, power)
    if n_levels < 1:
        raise ValueError(f"n_levels must be >= 1, got {n_levels}")
    if not 0.0 <= futility < 1.0:
        raise ValueError(f"futility must be in [0, 1), got {futility!r}")
    looks = look_schedule(min_trials, max_trials)
    if not 0 <= look < len(looks):
        raise ValueError(f"look must be in 0..{len(looks) - 1} for schedule {looks}, got {look}")
    weights = look_weights(len(looks))
    w = weights[look]
    log_b, log_c = _log_samples("baseline", baseline, 2), _log_samples("current", current, 2)
    rows, n_c = log_c.shape
    if n_c == 0:
        raise ValueError("decide needs at least one current trial")
    final = look == len(looks) - 1 or n_c >= looks[-1]
    nxt = 0 if final else max(1, looks[look + 1] - n_c)
    if log_b.shape[1] == 0:
        return BatchDecision(
            stop=np.full(rows, final),
            reason=np.full(rows, StopReason.NO_BASELINE.value, dtype="<U12"),
            next_trials=np.full(rows, nxt, dtype=np.int64),
            alpha_weight=w,
        )

    core = _core(log_b, log_c, session_sigma)
    t = _tests(core, tolerance, alpha, alpha * w, power)
    # Regression is called at alpha*w/n_levels (Bonferroni over levels): a level stopped for
    # regression is then certain to stay a regression after the final Holm step.
    clear_reg = t.p_regression <= alpha * w / n_levels
    clear_pass = t.p_pass <= alpha * w
    reason = np.full(rows, StopReason.CONTINUE.value, dtype="<U12")
    if final:
        reason[:] = StopReason.FINAL_LOOK.value
    elif futility > 0.0:
        reason[
            _futile(
                core,
                log_b.shape[1],
                n_c,
                looks[-1],
                tolerance,
                alpha * weights[-1],
                n_levels,
                futility,
            )
        ] = StopReason.FUTILITY.value
    reason[clear_pass] = StopReason.PASS.value
    reason[clear_reg] = StopReason.REGRESSION.value
    stop = reason != StopReason.CONTINUE.value
    return BatchDecision(
        stop=stop,
        reason=reason,
        next_trials=np.where(stop, 0, nxt).astype(np.int64),
        alpha_weight=w,
    )


def _futile(
    core: _Core,
    n_b: int,
    n_c: int,
    n_final: int,
    tolerance: float,
    alpha_final: float,
    n_levels: int,
    futility: float,
) -> NDArray[np.bool_]:
    """Conditional power, under the current trend, of a clear verdict at the final look.

    If the remaining trials behave like those so far, the final log ratio is normal around
    today's estimate with variance ``v (n_final - n_c) / n_final**2`` (the new trials only
    move the current mean).  The session factor is already baked into today's estimate, which
    is why extra trials so rarely change the outcome once session noise dominates.  Stopping
    here never rejects anything, so it cannot raise the false-alarm rate.
    """
    var_c = core.var_c if core.var_c is not None else core.var_b
    if var_c is None:
        return np.zeros(core.d.shape, dtype=bool)  # no noise estimate: keep measuring
    se_now2 = core.se**2
    w_now, _ = _within_terms(core.var_b, n_b, core.var_c, n_c, core.d.size)
    w_fin, denom_fin = _within_terms(core.var_b, n_b, var_c, n_final, core.d.size)
    se_fin2 = se_now2 - w_now + w_fin
    df_fin = se_fin2**2 / denom_fin
    se_fin = np.sqrt(se_fin2)
    tau = np.sqrt(var_c * (n_final - n_c)) / n_final
    m_lo = math.log1p(-tolerance)
    c_reg = _st.t.ppf(1.0 - alpha_final / n_levels, df_fin)
    c_pass = _st.t.ppf(1.0 - alpha_final, df_fin)
    cp_reg = _st.norm.cdf((m_lo - c_reg * se_fin - core.d) / tau)
    cp_pass = _st.norm.cdf((core.d - m_lo - c_pass * se_fin) / tau)
    return np.maximum(cp_reg, cp_pass) < futility


def decide(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    look: int,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    session_sigma: float = DEFAULT_SESSION_SIGMA,
    min_trials: int = DEFAULT_MIN_TRIALS,
    max_trials: int = DEFAULT_MAX_TRIALS,
    n_levels: int = 1,
    futility: float = DEFAULT_FUTILITY,
    power: float = DEFAULT_POWER,
) -> Decision:
    """Between trials: stop now, or run ``next_trials`` more and call again with ``look + 1``.

    Protocol: run ``look_schedule(min_trials, max_trials)[0]`` trials, call with ``look=0``;
    while ``not stop`` run ``next_trials`` more and call with the next look.  When a level
    stops, keep :attr:`Decision.alpha_weight` and hand it to :func:`compare_test` with the
    other levels for the final, Holm-adjusted verdicts.  Stops at a clear regression, a clear
    pass, futility (conditional power of either below ``futility``; 0 disables) or the last
    look.  ``n_levels`` is the number of levels in the test (see :func:`decide_batch`).  For an
    A/B run the caller may add the same number of trials to both sides.
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
        futility=futility,
        power=power,
    )
    comparison = compare_level(
        baseline,
        current,
        tolerance=tolerance,
        alpha=alpha,
        session_sigma=session_sigma,
        alpha_weight=dec.alpha_weight,
        power=power,
    )
    return Decision(
        stop=bool(dec.stop[0]),
        next_trials=int(dec.next_trials[0]),
        reason=StopReason(str(dec.reason[0])),
        look=look,
        alpha_weight=dec.alpha_weight,
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
    "DEFAULT_FUTILITY",
    "DEFAULT_MAX_TRIALS",
    "DEFAULT_MIN_TRIALS",
    "DEFAULT_POWER",
    "DEFAULT_SESSION_SIGMA",
    "DEFAULT_TOLERANCE",
    "Decision",
    "FINAL_LOOK_SHARE",
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
    "look_weights",
]
