"""The latency gate: a level's TTFT and ITL against the baseline's, beyond noise.

Why.  The throughput gate compares tok/s only, so a deployment whose time to first token
doubles at the same tok/s (a slower prefill path, a scheduler that batches admissions) passed.
Here every compared level's TTFT and ITL, at p50 and at the marker's ``percentile=`` (95 by
default), are compared with the baseline's with their own tolerance
(``--perf-latency-tolerance``, 25% slower by default; the marker's ``latency_tolerance=``).

The statistic is the throughput gate's, unchanged (:func:`family_verdicts.compare_level`): the sample is
one trial's figure (its requests share a batch, so they are not independent samples), the
comparison is a one-sided Welch test on the log scale with the session noise as a known
variance component, against a margin.  Latency is a time, where slower is larger, so the
samples enter as their reciprocals (a rate: one first token per TTFT), where slower is smaller
as for tok/s: a latency ``tol`` slower is a rate ``1 - 1 / (1 + tol)`` lower, the same margin
on the log scale.  The p-values of every latency figure of the test (levels x 4) are adjusted
together with Holm, so a test's chance of any false latency regression stays at ``alpha``.

A significant slow-down beyond the tolerance makes the level ``regression`` (with a reason
naming the figure, measured vs baseline and the tolerance) unless it already failed for a
stronger reason (``fail``, ``invalid``, ``error``, ``not-run``).  Nothing else changes a
verdict: latency gives no ``pass`` of its own, so no power is claimed for it (the smallest
slow-down the run could have caught is reported beside it).  No pytest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_kimi.baseline import TestBaseline
from pytest_kimi.gate import family_verdicts, two_sample
from pytest_kimi.measure.latency import LatencyFigure, level_latency, voided_note
from pytest_kimi.measure.results import LevelResult, ThroughputResult, level_key, workload_dict
from pytest_kimi.verdicts import Verdict
from pytest_kimi.workload.workload_spec import Targets

DEFAULT_LATENCY_TOLERANCE = 0.25
"""A latency 25% above the baseline's is tolerated.  Latency is noisier than tok/s (a p95 of
one trial rests on its slowest few requests; a TTFT includes the client's own scheduling), so
the throughput gate's 5% would flag the noise of a busy client machine rather than the server."""

OUTRANKS = frozenset({Verdict.FAIL, Verdict.INVALID, Verdict.ERROR, Verdict.NOT_RUN})
"""Level verdicts a latency regression never replaces: each is the stronger claim."""

OLD_BASELINE = (
    "latency not compared: the baseline has no per-trial latency (recorded before the latency "
    "gate); re-record it with --update-baselines to gate TTFT and ITL"
)


def latency_tolerance(targets: Targets, session: float) -> float:
    """The marker's ``latency_tolerance=`` where it gives one, else the session's option."""
    return session if targets.latency_tolerance is None else targets.latency_tolerance


def rate_tolerance(latency_tolerance: float) -> float:
    """The drop of a rate (1 / latency) that a latency slower by ``latency_tolerance`` is."""
    if not (latency_tolerance > 0 and math.isfinite(latency_tolerance)):
        raise ValueError(f"latency tolerance must be a number > 0, got {latency_tolerance!r}")
    return 1.0 - 1.0 / (1.0 + latency_tolerance)


def apply_latency_gate(
    result: ThroughputResult,
    baseline: TestBaseline | None,
    *,
    tolerance: float = DEFAULT_LATENCY_TOLERANCE,
    alpha: float = two_sample.DEFAULT_ALPHA,
    session_sigma: float = two_sample.DEFAULT_SESSION_SIGMA,
) -> None:
    """Give every measured level its latency section and compare it with the baseline's.

    Sets ``level.latency`` on each level that has trials (the per-trial figures are what
    ``--update-baselines`` stores), its comparison where the baseline holds the same figure,
    and turns a significant slow-down beyond ``tolerance`` into ``regression``.
    """
    rate_tol = rate_tolerance(tolerance)
    compared: list[tuple[LevelResult, LatencyFigure, two_sample.LevelComparison]] = []
    targets = result.targets
    common = workload_dict(result.workload)
    for level in result.levels:
        if not level.trials:
            continue
        latency = level_latency(level.trials, level.figures, targets.max_ttft_s, targets.max_itl_s)
        latency.tolerance_pct = round(tolerance * 100, 2)
        level.latency = latency
        if not Verdict(level.verdict).comparable:
            latency.note = f"latency not compared: the level is {level.verdict}"
            continue
        if baseline is None:
            latency.note = "latency not compared: no baseline"
            continue
        stored = baseline.level_for(level_key(level.to_dict(), common))
        if stored is None:
            latency.note = "latency not compared: the baseline has no level of this workload"
            continue
        missing: list[str] = []
        unmade: list[str] = []
        for fig in latency.figures:
            base = stored.latency_trials(fig.kind, fig.stat)
            summary = stored.latency_summary(fig.kind, fig.stat)
            fig.baseline = summary if summary is not None else _median(base)
            fig.baseline_trials = base
            if not base:
                missing.append(fig.label)
                continue
            if not fig.trials:
                unmade.append(unmade_reason(fig, len(latency.voided)))
                continue
            cmp = family_verdicts.compare_level(
                [1.0 / x for x in base],
                [1.0 / x for x in fig.trials],
                tolerance=rate_tol,
                alpha=alpha,
                session_sigma=session_sigma,
            )
            compared.append((level, fig, cmp))
        notes: list[str] = []
        if len(missing) == len(latency.figures):
            notes.append(OLD_BASELINE)
        elif missing:
            notes.append(
                f"latency not compared for {', '.join(missing)}: the baseline holds no such "
                "per-trial figures (recorded at another percentile=); re-record it with "
                "--update-baselines"
            )
        notes.extend(unmade)
        if latency.voided:
            notes.append(voided_note(latency.voided, len(level.trials)))
        latency.note = "; ".join(notes) or None
    if not compared:
        return
    raw = [_p(cmp) for _, _, cmp in compared]
    adjusted = family_verdicts.holm(raw)
    for (level, fig, cmp), p_raw, p_adj in zip(compared, raw, adjusted):
        _fill(fig, cmp, p_raw, p_adj)
        assert level.latency is not None
        level.latency.compared = True
        if p_adj > alpha:
            fig.verdict = Verdict.PASS.value
            continue
        fig.verdict = Verdict.REGRESSION.value
        level.reasons.append(regression_reason(fig, tolerance, p_adj))
        if Verdict(level.verdict) not in OUTRANKS:
            level.verdict = Verdict.REGRESSION.value


def unmade_reason(fig: LatencyFigure, voided: int) -> str:
    """Why a figure the baseline holds was not compared: no current trial gave one (too few
    values a trial for its pNN, or trials whose client stalled)."""
    why = []
    if fig.note is not None:
        why.append(fig.note)
    if voided:
        why.append(f"{voided} trial(s) left out for a client stall")
    return f"latency not compared for {fig.label}: no current trial gave one" + (
        f" ({'; '.join(why)})" if why else ""
    )


def regression_reason(fig: LatencyFigure, tolerance: float, p_adjusted: float) -> str:
    """``latency regression: TTFT p95 0.082 s vs baseline 0.041 s (+100.0%, 90% CI ...),
    beyond the tolerance +25%, p=...``: the figure, both values and the tolerance."""
    lo, hi = fig.ci90 or (None, None)
    ci = f"90% CI {_pct(lo)} .. {_pct(hi)}"
    change = "?" if fig.change_pct is None else f"{fig.change_pct:+.1f}%"
    # the change is the per-trial figures' (geometric means), which the pooled figures shown
    # first need not agree with (a p95 over all requests fell while the trials' p95s rose):
    # both pairs are said, so the percentage can be reconciled with the figures it came from
    per_trial = (
        f"{_s(_geomean(fig.trials))} vs {_s(_geomean(fig.baseline_trials))}"
        if fig.trials and fig.baseline_trials
        else "?"
    )
    return (
        f"latency regression: {fig.label} {_s(fig.value)} vs baseline {_s(fig.baseline)}; "
        f"per trial (geometric means) {per_trial}: {change}, {ci}, slower beyond the latency "
        "tolerance "
        f"+{tolerance * 100:g}% (p={p_adjusted:.3g}, adjusted for the test's latency figures)"
    )


def _fill(fig: LatencyFigure, cmp: two_sample.LevelComparison, p_raw: float, p_adj: float) -> None:
    """The comparison's figures on the latency scale: a rate ratio r is a latency ratio 1/r."""
    lo, hi = cmp.ci90
    fig.change_pct = _latency_pct(cmp.ratio)
    fig.ci90 = (_latency_pct(hi), _latency_pct(lo))
    fig.p_value = _finite(p_raw)
    fig.p_adjusted = _finite(p_adj)
    drop = cmp.min_detectable_drop
    if math.isfinite(drop) and 0 <= drop < 1:
        fig.min_detectable_pct = round((1.0 / (1.0 - drop) - 1.0) * 100, 1)


def _p(cmp: two_sample.LevelComparison) -> float:
    p = cmp.p_regression_raw if math.isfinite(cmp.p_regression_raw) else cmp.p_regression
    return p if math.isfinite(p) else 1.0


def _latency_pct(rate_ratio: float) -> float | None:
    """A rate ratio as the latency's change in percent (None where unbounded)."""
    if not (math.isfinite(rate_ratio) and rate_ratio > 0):
        return None
    return round((1.0 / rate_ratio - 1.0) * 100, 2)


def _geomean(values: Sequence[float] | None) -> float | None:
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _finite(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:+.1f}%"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g} s"
