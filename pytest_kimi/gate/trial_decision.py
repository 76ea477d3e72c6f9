"""The adaptive trials: between a level's trials, stop now or run how many more?

Why a module of its own: this is the only part of the gate that runs *during* a measurement
(the trial policy asks it after each batch of trials), and it answers with a trial count, not
a verdict; the final test (:mod:`pytest_kimi.gate.family_verdicts`) then accounts for the one
look it takes at the estimate (:class:`~pytest_kimi.gate.family_verdicts.Design`).

Trials (variance-driven sample size, one look at the estimate)
--------------------------------------------------------------
At the variance rule's first stop, a powered level whose estimate lies beyond the tolerance
without a significant regression is ``undecided`` (:attr:`StopReason.UNDECIDED`) and runs to
``max_trials``; the final test then uses the null distribution of this procedure
(:class:`Design`, :func:`pytest_kimi.gate.family.single_adaptive_p`), since taking the
extended data at face value raised the false-alarm rate at the tolerance above alpha
(``bench/stat_power.py --no-design``; docs/evidence/gate.md, "The gate's error rates,
simulated").  Otherwise:

After ``min_trials`` (3) current trials, :func:`decide` stops a level that is already powered.
Otherwise it asks, from the current variance estimates, for the smallest number of current
trials (at most ``max_trials``, 10) that makes the level powered, and is called again after
them; if even ``max_trials`` cannot (the session-noise floor), it stops at once (*futility*:
more trials cannot help).  Only the sample variances enter this rule, never ``d`` -- an
internal pilot -- so one final test at the full alpha replaces the looks of version 1.  The
pilot is not quite free: levels whose first trials happened to agree would stop with a slightly
small ``se`` (a true drop of exactly the tolerance, the worst case, was flagged a little more
often than with a fixed number of trials), so the current side's within-session variance is
never taken below the baseline's (:func:`pytest_kimi.gate.two_sample._core`), which brings the
worst case back within alpha (``bench/stat_power.py``; docs/evidence/gate.md, "The gate's error
rates, simulated").  A level without a baseline runs all
``max_trials`` so the run makes a good baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pytest_kimi.gate.family_verdicts import Design, compare_level
from pytest_kimi.gate.two_sample import (
    DEFAULT_ALPHA,
    DEFAULT_DETECTABLE_DROP,
    DEFAULT_MAX_TRIALS,
    DEFAULT_MIN_TRIALS,
    DEFAULT_POWER,
    DEFAULT_SESSION_SIGMA,
    DEFAULT_TOLERANCE,
    LevelComparison,
    _check_params,
    _Core,
    _core,
    _log_samples,
    _mdd,
    _tests,
    _within_terms,
)


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
class BatchDecision:
    """Vectorised results of :func:`decide_batch`."""

    stop: NDArray[np.bool_]
    reason: NDArray[np.str_]
    next_trials: NDArray[np.int64]
    alpha_weight: float


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
