"""One level of a capacity search: the search's settings, what a load's trials gave
(:class:`LevelOutcome`) and its judgement (:class:`CapacityLevel`, :func:`judge`).

Apart from the search (:mod:`pytest_kimi.measure.capacity_search`) because judging one level
needs no search state: the search, the plugin's driver (:mod:`pytest_kimi.measure.capacity_run`)
and the report all read these records.

**A level holds** when, for every ceiling, the latency at the percentile -- pooled over the
level's trials, as ``@throughput`` judges a ceiling, except that a request's ITL is its mean
time per token, taken at the percentile across requests -- is at or below it
(:mod:`pytest_kimi.measure.capacity_latency`: why, and the stalls and jitter of the client that
this keeps out of the capacity).  Its *margin*
is ``min over ceilings of ln(ceiling / latency)``: positive where it held, negative where it
broke, and roughly linear in ``ln(load)`` near the boundary (latency grows as a power of the
load there), which is what the search interpolates on.

**Trial noise.**  Each trial gives its own percentile, so each gives its own margin; their
scatter is the noise of the level's decision.  ``sure`` is the probability (Student t over the
trials) that the true margin lies on the side the pooled one fell.  A level whose trials cannot
rule out (at ``confidence``, 95%) that it belongs on the other side by more than half a search
step's worth of margin gets more trials, as many as its scatter says it needs, up to
``max_trials``.  Levels far from the boundary are sure at once; a level within half a step of
it gets none either, since its side moves the capacity by less than a step.

A load the server cannot run at all (a stationary trial whose streams never all ran: the
server's running limit is below C) counts as broken; a level that failed requests or whose
figures cannot be trusted stops the search (``problem``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

from pytest_kimi.logscale import MIN_LOG_SD
from pytest_kimi.workload.capacity_marker import (
    DEFAULT_MAX_LEVELS,
    DEFAULT_RESOLUTION,
    ItlStatistic,
)
from pytest_kimi.wire import CapacityLevelEntry


Metric = Literal["concurrency", "rate"]
LATENCIES = ("ttft_s", "itl_s", "e2e_s")
"""The latency figures a ceiling can apply to (``max_ttft_s`` -> ``ttft_s`` and so on)."""

CONFIDENCE = 0.95
"""A level is *sure* of its side when the trials put the true margin there with this
probability; less sure levels get more trials."""


def _t_cdf(x: float, df: int) -> float:
    """Student t distribution function (scipy's, imported on first use)."""
    from scipy import stats

    return float(stats.t.cdf(x, df))


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """What the search looks for and how hard it may try."""

    metric: Metric
    low: float
    high: float
    ceilings: Mapping[str, float]
    """Latency name (:data:`LATENCIES`) -> ceiling in seconds, in the server's clock."""
    percentile: float = 95.0
    resolution: float = DEFAULT_RESOLUTION
    max_levels: int = DEFAULT_MAX_LEVELS
    first_trials: int = 3
    max_trials: int = 10
    confidence: float = CONFIDENCE
    must_probe: float | None = None
    """A load the search measures if its final bracket straddles it (``min_capacity``), so
    a floor is decided by a measurement, not by the step."""
    interpolate: bool = True
    """False: plain doubling, then geometric bisection (the baseline ``bench/capacity.py``
    compares the interpolating search with)."""
    itl: ItlStatistic = "request"
    """How an ITL ceiling is judged: each request's mean time per token at the percentile
    across requests (``request``), or every gap between reads (``token``, ``@throughput``'s
    figure; :mod:`pytest_kimi.measure.capacity_latency`)."""

    def __post_init__(self) -> None:
        if not self.ceilings:
            raise ValueError("a capacity search needs at least one latency ceiling")
        unknown = set(self.ceilings) - set(LATENCIES)
        if unknown:
            raise ValueError(f"unknown latency {sorted(unknown)}; known: {', '.join(LATENCIES)}")
        if not 0 < self.low < self.high:
            raise ValueError(f"range ({self.low}, {self.high}): expected 0 < low < high")
        if not 0 < self.resolution < 1:
            raise ValueError(f"resolution={self.resolution}: expected 0 < x < 1")

    def step(self, load: float) -> float:
        """The search step at ``load``: how wide its final bracket may be."""
        if self.metric == "concurrency":
            return float(max(1, math.floor(self.resolution * load)))
        return self.resolution * load

    def converged(self, held: float, broke: float) -> bool:
        if self.metric == "concurrency":
            return broke - held <= self.step(held)
        # rates are rounded to 4 significant digits: allow that much
        return broke <= held * (1.0 + self.resolution) * (1.0 + 1e-3)

    def grid(self, load: float) -> float:
        """A load as it is measured: a whole concurrency, a rate of 4 significant digits."""
        if self.metric == "concurrency":
            return float(max(1, round(load)))
        digits = 3 - math.floor(math.log10(abs(load)))
        return float(round(load, digits))


@dataclass(frozen=True, slots=True)
class LevelOutcome:
    """What one load's trials gave: its latencies at the percentile, pooled and per trial."""

    latencies: Mapping[str, float | None]
    """Pooled over the level's trials (what the level's verdict is judged on)."""
    trial_latencies: Sequence[Mapping[str, float | None]] = ()
    """One mapping per trial: its own percentile of each latency."""
    problem: str | None = None
    """The level cannot be judged (requests failed, a figure cannot be trusted): the search
    stops and the capacity says why."""
    beyond: str | None = None
    """The server could not run this load at all (fewer than C at once): counted as broken."""
    warnings: Sequence[str] = ()
    """What the report should say about the figures (client jitter, re-measured trials);
    they do not change the decision."""
    jitter: float | None = None
    """Per-gap ITL at the percentile over its median (about 1 where the client keeps up)."""
    replaced: int = 0
    """Trials voided by a client stall and measured again."""


@dataclass(slots=True)
class CapacityLevel:
    """One load of the search, judged."""

    load: float
    order: int
    """1-based: the position in which the search first measured it."""
    trials: int
    held: bool | None
    """None: not judged (``note`` says why, and the search stopped there)."""
    margin: float | None
    """min over the ceilings of ln(ceiling / latency), pooled; None without a figure."""
    se: float | None
    """Standard error of ``margin`` from its trials' scatter (None with fewer than 2)."""
    sure: float | None
    """Probability that the true margin is on the side the level was judged."""
    binding: str | None
    """The latency with the least margin: the one that sets the capacity here."""
    latencies: dict[str, float | None] = field(default_factory=dict)
    note: str | None = None
    warnings: list[str] = field(default_factory=list)
    """Client jitter in the level's tails, trials re-measured for a client stall (report only)."""
    jitter: float | None = None
    replaced: int = 0

    def to_dict(self) -> CapacityLevelEntry:
        return {
            "load": _load_out(self.load),
            "order": self.order,
            "held": self.held,
            "trials": self.trials,
            "margin_pct": None if self.margin is None else round(math.expm1(self.margin) * 100, 2),
            "sure": None if self.sure is None else round(self.sure, 4),
            "binding": self.binding,
            "latencies": {k: None if v is None else round(v, 6) for k, v in self.latencies.items()},
            "note": self.note,
            "warnings": list(self.warnings),
            "itl_p95_p50": None if self.jitter is None else round(self.jitter, 3),
            "replaced": self.replaced,
        }


def _load_out(load: float) -> float:
    """A load for reports: concurrency as an int, rates as they were measured."""
    return int(load) if float(load).is_integer() else load


def judge(
    settings: SearchSettings, load: float, outcome: LevelOutcome, order: int
) -> CapacityLevel:
    """The level's decision and how sure it is (module docstring: *trial noise*), with the
    outcome's warnings."""
    level = _judge(settings, load, outcome, order)
    level.warnings = list(outcome.warnings)
    level.jitter, level.replaced = outcome.jitter, outcome.replaced
    return level


def _judge(
    settings: SearchSettings, load: float, outcome: LevelOutcome, order: int
) -> CapacityLevel:
    n = len(outcome.trial_latencies)
    if outcome.problem is not None:
        return CapacityLevel(load, order, n, None, None, None, None, None, note=outcome.problem)
    latencies = {name: outcome.latencies.get(name) for name in settings.ceilings}
    margins: dict[str, float] = {}
    for name, ceiling in settings.ceilings.items():
        value = latencies[name]
        if value is not None and value > 0:
            margins[name] = math.log(ceiling / value)
    if outcome.beyond is not None and len(margins) < len(settings.ceilings):
        # queued past the server's limit: no figure, and no doubt either
        return CapacityLevel(
            load, order, n, False, None, None, 1.0, None, latencies, outcome.beyond
        )
    missing = [name for name in settings.ceilings if name not in margins]
    if missing:
        why = f"no {', '.join(missing)} figure at this load (too few tokens or requests)"
        return CapacityLevel(load, order, n, None, None, None, None, None, latencies, why)
    binding = min(margins, key=margins.__getitem__)
    margin: float | None = margins[binding]
    held = outcome.beyond is None and margins[binding] >= 0.0
    if outcome.beyond is not None and margins[binding] >= 0.0:
        margin = None  # the streams that ran were fine, but the load never ran: no slope here
    per_trial = []
    for trial in outcome.trial_latencies:
        values = [trial.get(name) for name in settings.ceilings]
        if all(v is not None and v > 0 for v in values):
            per_trial.append(
                min(math.log(c / v) for c, v in zip(settings.ceilings.values(), values) if v)
            )
    se: float | None = None
    sure: float | None = 1.0 if outcome.beyond is not None else None
    if len(per_trial) >= 2 and outcome.beyond is None and margin is not None:
        sd = max(statistics.stdev(per_trial), MIN_LOG_SD)
        se = sd / math.sqrt(len(per_trial))
        sure = _t_cdf(abs(margin) / se, len(per_trial) - 1)
    return CapacityLevel(load, order, n, held, margin, se, sure, binding, latencies, outcome.beyond)


def merge_outcomes(first: LevelOutcome, more: LevelOutcome) -> LevelOutcome:
    """Two measurements of one load as one, for synthetic outcomes: pooled latencies become the
    trial-weighted mean of the two (the plugin re-pools the records themselves instead)."""
    n1, n2 = len(first.trial_latencies), len(more.trial_latencies)
    pooled: dict[str, float | None] = {}
    for name in set(first.latencies) | set(more.latencies):
        a, b = first.latencies.get(name), more.latencies.get(name)
        pooled[name] = None if a is None or b is None else (a * n1 + b * n2) / max(n1 + n2, 1)
    return LevelOutcome(
        pooled,
        [*first.trial_latencies, *more.trial_latencies],
        first.problem or more.problem,
        first.beyond or more.beyond,
        [*first.warnings, *(w for w in more.warnings if w not in first.warnings)],
        more.jitter if more.jitter is not None else first.jitter,
        first.replaced + more.replaced,
    )
