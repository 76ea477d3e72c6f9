"""A level's latency figures per trial, and how they compare with the baseline's.

Why per trial.  The throughput gate's sample is one trial's aggregate tok/s, because requests
inside a trial share the server's batch and are correlated; the same holds for their latencies.
So each trial gives one TTFT p50, one TTFT pNN, one ITL p50 and one ITL pNN (over that trial's
requests alone; ITL as each request's mean time per token, as ``@capacity`` judges it, since
per-gap tails carry the client's read timing), and the latency gate (:mod:`pytest_kimi.gate.latency_gate`)
compares those samples with the baseline's the way the throughput gate compares tok/s.

The figure a report shows as *measured* stays the level's own (every trial's requests pooled,
as ``ttft_s_pct`` and the latency ceilings have always been read); the per-trial samples are
what the comparison tests.  No pytest, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence, overload

from pytest_kimi.measure.capacity_latency import (
    min_gaps_for,
    read_gaps,
    request_itl,
    stall_reason,
)
from pytest_kimi.measure.metrics import LevelFigures, TrialResult
from pytest_kimi.measure.stream_timing import percentile
from pytest_kimi.wire import LatencyEntry, LatencyFigureEntry

KINDS = ("ttft_s", "itl_s")
"""The latencies the gate compares: time to first token, inter-token latency (seconds)."""

NAMES = {"ttft_s": "TTFT", "itl_s": "ITL"}


def stat_name(q: float) -> str:
    """``p95`` for 95, ``p99.9`` for 99.9: how a percentile is keyed in JSON and YAML."""
    return f"p{q:g}"


def stats_for(q: float) -> tuple[str, ...]:
    """The statistics compared at a marker's ``percentile=``: p50 and pNN (p50 once at 50)."""
    return ("p50",) if stat_name(q) == "p50" else ("p50", stat_name(q))


LATENCY_STALL_SHARE = 0.05
"""A client stall that moved a trial's latency percentile (p50 or pNN, TTFT or ITL) by more
than this share voids the trial's latencies (:func:`latency_void`): the requests whose judged
reads fell in a stall of the client's event loop are left out, and the percentile is taken
again (:func:`~pytest_kimi.measure.capacity_latency.stall_reason`, the ``@capacity`` probes'
check).  A fifth of the default latency tolerance (25%): a stall below it cannot make a
regression, and one above it (a TTFT p50 read +266% on a server 10% faster) is the client's."""


def min_values(q: float) -> int:
    """Values a sample needs before its pNN is its own: ``ceil(100 / (100 - q))`` above the
    median (20 for p95, 100 for p99), 1 for p50 and below.

    Why.  With fewer values than that, the top ``100 - q`` percent of the sample holds less
    than one value, so the "p95" of 3 requests is an interpolation between its two largest and
    the p95 of one request is that request: at C=1 (a couple of requests a trial) each
    trial's p95 was its p50, and a comparison of "p95s" compared medians or maxima.  A median
    (p50) is the middle of any sample, one value included.
    """
    if q <= 50:
        return 1
    return math.ceil(100.0 / (100.0 - q) - 1e-9)


def latency_void(trial: TrialResult, q: float, clock: float = 1.0) -> str | None:
    """Why ``trial``'s latencies are not the server's, or None: the load client stalled
    during it (:attr:`TrialResult.client_stall`: a stall that voided or only noted its tok/s),
    or a stall of its event loop moved one of its latency percentiles by more than
    :data:`LATENCY_STALL_SHARE` (at the trial's start too, before its window: the tok/s
    checks look inside the window only)."""
    if trial.client_stall is not None:
        return trial.client_stall
    names = dict.fromkeys(KINDS, 0.0)
    for stat in stats_for(q):
        why = stall_reason(trial, names, float(stat[1:]), clock, share=LATENCY_STALL_SHARE)
        if why is not None:
            return why
    return None


def mark_latency_void(trials: Sequence[TrialResult], q: float, clock: float = 1.0) -> None:
    """Set every trial's :attr:`TrialResult.latency_void` (the level's figures and the latency
    gate then leave its latencies out)."""
    for trial in trials:
        trial.latency_void = latency_void(trial, q, clock)


def _void(trial: TrialResult) -> str | None:
    return trial.latency_void or trial.client_stall


@dataclass(slots=True)
class TrialLatencies:
    """Per trial, each kind's p50 and pNN, and why trials gave none."""

    values: dict[str, dict[str, list[float]]]
    """``{kind: {stat: [one figure per trial]}}`` in the server's clock."""
    voided: list[str] = field(default_factory=list)
    """One reason per valid trial whose latencies were left out (a client stall)."""
    few: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """``{kind: {stat: [values of each trial too small for that pNN]}}``."""


def per_trial_latencies(
    trials: Sequence[TrialResult], q: float, clock: float = 1.0
) -> TrialLatencies:
    """Per valid trial, each kind's p50 and pNN in the server's clock, and why some gave none.

    Only the trials whose tok/s is a sample (:attr:`TrialResult.valid`) give one, so the
    latency samples and the throughput samples come from the same trials; a trial whose load
    client stalled (:func:`latency_void`) gives none, whatever its tok/s; a trial without a
    positive figure of a kind (no successful request, a single-token stream) gives none of it;
    and a trial gives a pNN only from :func:`min_values` values of its own, or none (its
    "p95" would be its largest value, or its median).
    """
    stats = stats_for(q)
    out = TrialLatencies({k: {s: [] for s in stats} for k in KINDS})
    out.few = {k: {s: [] for s in stats} for k in KINDS}
    for trial in trials:
        if not trial.valid:
            continue
        why = _void(trial)
        if why is not None:
            out.voided.append(why)
            continue
        ok = [r for r in trial.records if r.ok]
        gaps = min_gaps_for(ok)
        values = {
            "ttft_s": [x * clock for x in (r.ttft for r in ok) if x is not None],
            # each request's mean time per token, as @capacity judges ITL: a client that
            # reads late lengthens one gap and shortens the next, so per-gap tails carry the
            # client's timing (x speed on the simulator) and a busy machine read as a latency
            # regression; a request's mean moves only with its first or last read
            "itl_s": [
                x * clock
                for x in (request_itl(r) for r in ok if read_gaps(r) >= gaps)
                if x is not None
            ],
        }
        for kind in KINDS:
            for stat in stats:
                pq = float(stat[1:])
                if values[kind] and len(values[kind]) < min_values(pq):
                    out.few[kind][stat].append(len(values[kind]))
                    continue
                value = percentile(values[kind], pq)
                if value is not None and math.isfinite(value) and value > 0:
                    out.values[kind][stat].append(value)
    return out


def trial_latencies(
    trials: Sequence[TrialResult], q: float, clock: float = 1.0
) -> dict[str, dict[str, list[float]]]:
    """Per valid trial, each kind's p50 and pNN in the server's clock: ``{kind: {stat: [..]}}``
    (:func:`per_trial_latencies`' figures)."""
    return per_trial_latencies(trials, q, clock).values


def few_values_note(stat: str, counts: Sequence[int], kind: str) -> str:
    """Why a pNN has no per-trial figure from trials with too few values."""
    lo, hi = min(counts), max(counts)
    many = f"{lo}" if lo == hi else f"{lo}-{hi}"
    what = "requests" if kind == "ttft_s" else "requests long enough for an ITL"
    return (
        f"{NAMES.get(kind, kind)} {stat} per trial needs {min_values(float(stat[1:]))} values "
        f"a trial, and {len(counts)} trial(s) had {many} {what}: no per-trial {stat} (its "
        "largest value or its median would stand in for it); more requests a trial "
        "(requests_per_stream=) or a higher concurrency give one"
    )


def voided_note(voided: Sequence[str], valid: int) -> str:
    """Which trials' latencies were left out, and why (the first reason)."""
    return (
        f"latencies of {len(voided)} of {valid} trial(s) left out, the load client's and not "
        f"the server's: {voided[0]}"
    )


def pooled_value(figures: LevelFigures, kind: str, stat: str) -> float | None:
    """The level's own figure (every trial's requests pooled): what the reports have always
    shown, and what the latency ceilings (``max_ttft_s``, ``max_itl_s``) are judged on."""
    if stat == "p50":
        return figures.ttft_s_p50 if kind == "ttft_s" else figures.itl_s_p50
    if stat != stat_name(figures.percentile):
        return None
    return figures.ttft_s_pct if kind == "ttft_s" else figures.itl_s_pct


@dataclass(slots=True)
class LatencyFigure:
    """One latency statistic of a level (``ttft_s_p95``): measured, target, baseline, change."""

    kind: str
    """``ttft_s`` or ``itl_s``."""
    stat: str
    """``p50`` or the marker's ``pNN``."""
    value: float | None
    """The level's figure, every trial pooled (the one ``max_ttft_s`` / ``max_itl_s`` judge)."""
    trials: tuple[float, ...] = ()
    """Each valid trial's figure: the samples the comparison tests."""
    note: str | None = None
    """Why trials gave no figure of this statistic (too few values for a per-trial pNN)."""
    target: float | None = None
    """``max_ttft_s`` / ``max_itl_s`` (at pNN only; p50 has none)."""
    baseline: float | None = None
    """The baseline's figure of the same kind (pooled when it stored one, else the median of
    its trials); None when it has none."""
    baseline_trials: tuple[float, ...] = ()
    change_pct: float | None = None
    """Current vs baseline geometric mean of the trials, in percent (+ is slower)."""
    ci90: tuple[float | None, float | None] | None = None
    p_value: float | None = None
    """One-sided p of a slow-down beyond the latency tolerance, for this figure alone."""
    p_adjusted: float | None = None
    """The same, Holm-adjusted over every latency figure of the test: the verdict's p."""
    min_detectable_pct: float | None = None
    """The slow-down (percent) this comparison would have flagged with 95% probability: what
    a figure that is not a regression vouches for."""
    verdict: str | None = None
    """``pass``, ``regression`` or ``improved``; None when not compared."""

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.stat}"

    @property
    def label(self) -> str:
        """``TTFT p95``: how reasons and reports name it."""
        return f"{NAMES.get(self.kind, self.kind)} {self.stat}"

    def to_dict(self) -> LatencyFigureEntry:
        return {
            "value": _round(self.value),
            "trials": [_round(x) for x in self.trials],
            "target": self.target,
            "baseline": _round(self.baseline),
            "baseline_trials": list(self.baseline_trials),
            "change_pct": self.change_pct,
            "ci90": None if self.ci90 is None else list(self.ci90),
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "min_detectable_pct": self.min_detectable_pct,
            "verdict": self.verdict,
            "note": self.note,
        }


@dataclass(slots=True)
class LevelLatency:
    """A level's latency section (JSON ``latency``): its figures and whether they were compared."""

    percentile: float
    figures: list[LatencyFigure] = field(default_factory=list)
    tolerance_pct: float | None = None
    """The slow-down the gate tolerated (``--perf-latency-tolerance``), in percent."""
    compared: bool = False
    note: str | None = None
    """Why the latency was not compared (an old baseline, none at all, an untrustworthy level),
    or not for every figure (too few values a trial, trials whose client stalled)."""
    voided: list[str] = field(default_factory=list)
    """One reason per valid trial whose latencies were left out (:func:`latency_void`)."""

    def figure(self, kind: str, stat: str) -> LatencyFigure | None:
        return next((f for f in self.figures if f.kind == kind and f.stat == stat), None)

    def to_dict(self) -> LatencyEntry:
        return {
            "percentile": self.percentile,
            "tolerance_pct": self.tolerance_pct,
            "compared": self.compared,
            "note": self.note,
            "figures": {f.name: f.to_dict() for f in self.figures},
        }


def level_latency(
    trials: Sequence[TrialResult],
    figures: LevelFigures,
    max_ttft_s: float | None,
    max_itl_s: float | None,
) -> LevelLatency:
    """The latency section of a measured level, before any comparison."""
    q = figures.percentile
    per_trial = per_trial_latencies(trials, q, figures.clock)
    targets = {"ttft_s": max_ttft_s, "itl_s": max_itl_s}
    out = LevelLatency(percentile=q, voided=list(per_trial.voided))
    for kind in KINDS:
        for stat in stats_for(q):
            few = per_trial.few[kind][stat]
            out.figures.append(
                LatencyFigure(
                    kind=kind,
                    stat=stat,
                    value=pooled_value(figures, kind, stat),
                    trials=tuple(per_trial.values[kind][stat]),
                    target=targets[kind] if stat != "p50" or q == 50 else None,
                    note=few_values_note(stat, few, kind) if few else None,
                )
            )
    return out


@overload
def _round(x: float) -> float: ...


@overload
def _round(x: None) -> None: ...


@overload
def _round(x: float | None) -> float | None: ...


def _round(x: float | None) -> float | None:
    """Seconds to 4 significant digits, as the baseline stores them (``round_latency``)."""
    if x is None or x == 0 or not math.isfinite(x):
        return x
    return round(x, 3 - math.floor(math.log10(abs(x))))
