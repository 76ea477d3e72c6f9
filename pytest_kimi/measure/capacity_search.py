"""Capacity under an SLO: the highest load at which every latency ceiling holds, by search.

A ``@capacity`` test asks a question a sweep answers badly: *how much load can this deployment
take before its p95 ITL passes 50 ms?*  A sweep over fixed levels spends most of its time far
from the answer and still only brackets it between two of its levels.  This module finds the
boundary with few levels and says how sure it is.

Pure core, no pytest and no I/O: :class:`CapacitySearch` is an ask/tell object (``next_probe``
says which load to measure and with how many trials, ``tell`` takes what was measured), so it
is driven by the plugin's level measurement (:func:`run_capacity`) or by a synthetic latency
model in tests and ``bench/capacity.py`` alike.

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

**The search** (``docs/workloads.md``, *Capacity under an SLO*):

1. measure the bottom of the range; if it breaks, the capacity is below the range;
2. grow: the next load is where the held levels' margins extrapolate the boundary to be (in
   log-log), kept between 2x and 4x the last load, until a level breaks or the top holds;
3. narrow the bracket [highest held, lowest broken]: interpolate the boundary from the two
   ends' margins and probe just below and just above it, half a search step either side, so an
   accurate prediction closes the bracket in two levels; a bracket that two probes did not
   halve is bisected (geometric midpoint) instead, so the worst case is bisection's;
4. stop when the bracket is one *search step* wide: ``resolution`` (10%) of the load, at least
   1 for concurrency.

**The boundary estimate** is the crossing of the margin line through the bracket's two ends,
in ``ln(load)``.  Its *slope* (how fast the binding latency's margin falls per unit of
``ln(load)``, an elasticity) is fitted through every level within a factor of 2 of the bracket:
the two ends alone are the levels noise put on either side of the boundary, and their slope
comes out too steep.  The estimate's standard error (delta method on the two ends' margin
errors, over that slope) and the slope are what the gate
(:mod:`pytest_kimi.gate.capacity_gate`) turns into the capacity's noise.

A load the server cannot run at all (a stationary trial whose streams never all ran: the
server's running limit is below C) counts as broken; a level that failed requests or whose
figures cannot be trusted stops the search (``problem``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Literal, Mapping, Sequence

from pytest_kimi.logscale import MIN_LOG_SD, Z90
from pytest_kimi.workload.capacity_marker import (
    DEFAULT_MAX_LEVELS,
    DEFAULT_RESOLUTION,
    ItlStatistic,
)

Metric = Literal["concurrency", "rate"]
LATENCIES = ("ttft_s", "itl_s", "e2e_s")
"""The latency figures a ceiling can apply to (``max_ttft_s`` -> ``ttft_s`` and so on)."""

CONFIDENCE = 0.95
"""A level is *sure* of its side when the trials put the true margin there with this
probability; less sure levels get more trials."""
MIN_GROWTH = 2.0
MAX_GROWTH = 4.0
"""Growth per level before anything broke: at least doubling (so a wide range costs log2 of
its width), at most quadrupling (an extrapolation from far below the boundary overshoots)."""
DEFAULT_SLOPE = 0.5
"""The latency's elasticity with load assumed before two levels measure it (the simulator's
decode step has 0.3 at C=16, 0.58 at C=40, 0.7 at C=256)."""


def _t_cdf(x: float, df: int) -> float:
    """Student t distribution function (scipy's, imported on first use)."""
    from scipy import stats

    return float(stats.t.cdf(x, df))


def _norm_ppf(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


# ------------------------------------------------------------------------------------ settings


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


# ------------------------------------------------------------------------------------ outcomes


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

    def to_dict(self) -> dict[str, Any]:
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


def _load_out(load: float | None) -> float | int | None:
    """A load for reports: concurrency as an int, rates as they were measured."""
    if load is None:
        return None
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


# ----------------------------------------------------------------------------------- the search


@dataclass(frozen=True, slots=True)
class Probe:
    """What to measure next: ``trials`` trials at ``load`` (more of a load already measured
    when ``top_up``: the driver adds them to the level's trials and tells the whole level)."""

    load: float
    trials: int
    top_up: bool = False


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """Where the search ended: the capacity, its bracket and how sure the boundary is."""

    metric: Metric
    value: float | None
    """The capacity: the highest load measured to hold below the lowest that broke (None when
    the bottom of the range broke)."""
    low: float | None
    """The bracket the search ended with: ``low`` held (= ``value``), ``high`` broke; ``high``
    is None when the top of the range held (the capacity is at least ``low``), ``low`` None
    when the bottom broke (it is below ``high``)."""
    high: float | None
    estimate: float | None
    """The boundary interpolated between the bracket's ends (None when one end is missing)."""
    log_se: float | None
    """Standard error of ``ln(estimate)`` from the trial noise of the two ends."""
    log_se_df: int | None
    """Its degrees of freedom: the fewer trials of the two ends, less one (the gate's t test
    needs them: a scatter seen in 3 trials is itself uncertain)."""
    slope: float | None
    """d margin / d ln(load) near the boundary: the binding latency's elasticity with load."""
    ci90: tuple[float, float] | None
    """90% interval of the boundary under trial noise."""
    step: float
    """The search step at the boundary (the resolution the search aimed for)."""
    levels: tuple[CapacityLevel, ...]
    """In the order the search measured them."""
    stop: str
    """``converged``, ``above`` (the top held), ``below`` (the bottom broke), ``max-levels``
    or ``problem`` (a level could not be judged)."""
    problem: str | None = None
    non_monotonic: tuple[float, ...] = ()
    """Loads that held above a lower one that broke (noise near the boundary, or a server
    whose latency is not monotonic in load); the capacity stays below the lowest break."""

    @property
    def censored(self) -> Literal["above", "below"] | None:
        if self.problem is not None:
            return None
        if self.high is None:
            return "above"
        if self.low is None:
            return "below"
        return None


class CapacitySearch:
    """The ask/tell search (module docstring)."""

    def __init__(self, settings: SearchSettings) -> None:
        self.settings = settings
        self.levels: dict[float, CapacityLevel] = {}
        self._last: float | None = None
        self._narrowed: list[float] = []
        """ln(high / low) after each narrowing probe (the bisection safeguard reads it)."""
        self.stop: str | None = None
        self.problem: str | None = None

    # ---------------------------------------------------------------- asking

    def next_probe(self) -> Probe | None:
        """The next load to measure, more trials of the last one, or None when done."""
        s = self.settings
        if self.stop is not None:
            return None
        last = self.levels.get(self._last) if self._last is not None else None
        if last is not None:
            more = self._more_trials(last)
            if more:
                return Probe(last.load, more, top_up=True)
        if not self.levels:
            return Probe(s.grid(s.low), s.first_trials)
        if last is not None and last.held is None:
            self.stop, self.problem = "problem", f"{self._label(last.load)}: {last.note}"
            return None
        low, high = self.bracket()
        if low is None:
            self.stop = "below"
            return None
        if high is None:
            if low >= s.grid(s.high):
                self.stop = "above"
                return None
            return self._measure(self._grow(low))
        probe = None if s.converged(low, high) else self._narrow(low, high)
        if probe is None:
            must = s.must_probe
            if must is not None and low < s.grid(must) < high:
                return Probe(s.grid(must), s.first_trials)  # beyond max_levels: it decides a floor
            self.stop = "converged"
            return None
        return self._measure(probe)

    def _measure(self, load: float) -> Probe | None:
        if len(self.levels) >= self.settings.max_levels:
            self.stop = "max-levels"
            return None
        return Probe(load, self.settings.first_trials)

    def _more_trials(self, level: CapacityLevel) -> int:
        """Top-up for a level whose trials cannot rule out that it belongs on the other side by
        more than :meth:`slack` (``confidence``, one-sided): enough trials for its scatter to
        rule that out.  A level closer to the boundary than that gets none: which side it falls
        on moves the bracket by less than a step, which the capacity's uncertainty already
        says; chasing it would cost ``max_trials`` for nothing the answer needs."""
        s = self.settings
        room = s.max_trials - level.trials
        if level.held is None or room <= 0:
            return 0
        if level.sure is not None and level.sure >= s.confidence:
            return 0
        if level.se is None or level.margin is None:  # fewer than 2 trials: no scatter yet
            return min(room, max(1, 3 - level.trials))
        reach = abs(level.margin) + self.slack()
        if _t_cdf(reach / level.se, level.trials - 1) >= s.confidence:
            return 0
        sd = level.se * math.sqrt(level.trials)
        needed = math.ceil((_norm_ppf(s.confidence) * sd / reach) ** 2)
        return max(1, min(room, needed - level.trials))

    def slack(self) -> float:
        """Half a search step as a margin: how much the binding latency changes over half a
        step of load (its slope near the boundary so far, else 0.5), the error a level's side
        may have without moving the capacity by more than a step."""
        low, high = self.bracket()
        slope = self._slope(low, high) or DEFAULT_SLOPE
        return slope * math.log1p(self.settings.resolution) / 2.0

    def bracket(self) -> tuple[float | None, float | None]:
        """(highest held below the lowest broken, lowest broken); None where there is none."""
        broke = [x for x, lv in self.levels.items() if lv.held is False]
        high = min(broke) if broke else None
        held = [x for x, lv in self.levels.items() if lv.held and (high is None or x < high)]
        return (max(held) if held else None), high

    def _grow(self, low: float) -> float:
        """Before anything broke: the next load from the held levels' margins (extrapolated
        in log-log), between 2x and 4x ``low``, within the range."""
        s = self.settings
        top = self.levels[low]
        held = sorted(x for x, lv in self.levels.items() if lv.held and x < low)
        if not s.interpolate:
            return min(s.grid(MIN_GROWTH * low), s.grid(s.high))
        slope = 1.0  # latency proportional to load, before two levels say otherwise
        if held and top.margin is not None:
            below = self.levels[held[-1]]
            if below.margin is not None and below.margin > top.margin:
                slope = (below.margin - top.margin) / math.log(low / held[-1])
        predicted = low * math.exp((top.margin or 0.0) / slope) * (1.0 + s.resolution / 2.0)
        target = min(max(predicted, MIN_GROWTH * low), MAX_GROWTH * low, s.high)
        nxt = s.grid(target)
        if nxt <= low:
            nxt = s.grid(low + s.step(low)) if s.metric == "concurrency" else s.grid(low * 1.5)
        return min(nxt, s.grid(s.high))

    def crossing(self, low: float, high: float) -> float:
        """ln of the boundary the margins at ``low`` and ``high`` interpolate (the midpoint
        when either has no margin)."""
        a, b = self.levels[low], self.levels[high]
        la, lb = math.log(low), math.log(high)
        if a.margin is None or b.margin is None or a.margin - b.margin <= 0:
            return (la + lb) / 2.0
        w = min(max(a.margin / (a.margin - b.margin), 0.0), 1.0)
        return la + (lb - la) * w

    def _narrow(self, low: float, high: float) -> float | None:
        """The next probe inside (low, high): straddle the interpolated boundary half a step
        either side, or bisect when interpolation has not been halving the bracket."""
        s = self.settings
        width = math.log(high / low)
        self._narrowed.append(width)
        mid = math.exp((math.log(low) + math.log(high)) / 2.0)
        if not s.interpolate or (
            len(self._narrowed) >= 3 and self._narrowed[-1] > 0.5 * self._narrowed[-3]
        ):
            candidates = [mid]  # the safeguard: interpolation is not converging fast enough
        else:
            x = math.exp(self.crossing(low, high))
            if s.metric == "concurrency":
                p_lo = s.grid(x - s.step(x) / 2.0)
                p_hi = p_lo + s.step(p_lo)
            else:
                p_lo = s.grid(x / math.sqrt(1.0 + s.resolution))
                p_hi = s.grid(p_lo * (1.0 + s.resolution))
            candidates = [p for p, todo in ((p_lo, low < p_lo), (p_hi, high > p_hi)) if todo]
            if not candidates:
                candidates = [mid]
        # the candidate nearest the bracket's middle learns the most if the prediction is off
        pick = min(candidates, key=lambda p: abs(math.log(p) - math.log(mid)))
        return self._inside(pick, low, high)

    def _inside(self, load: float, low: float, high: float) -> float | None:
        """``load`` on the grid, strictly inside (low, high); None when there is no room."""
        s = self.settings
        if s.metric == "concurrency":
            lo, hi = low + 1, high - 1
            if lo > hi:
                return None
            return float(min(max(s.grid(load), lo), hi))
        margin = 1.0 + s.resolution / 10.0
        lo, hi = low * margin, high / margin
        if lo >= hi:
            return None
        x = min(max(load, lo), hi)
        gx = s.grid(x)
        return gx if low < gx < high else x

    # ---------------------------------------------------------------- telling

    def tell(self, load: float, outcome: LevelOutcome) -> CapacityLevel:
        """Record a load's outcome (all its trials so far, after a top-up too)."""
        before = self.levels.get(load)
        order = before.order if before is not None else len(self.levels) + 1
        level = judge(self.settings, load, outcome, order)
        self.levels[load] = level
        self._last = load
        return level

    def _label(self, load: float) -> str:
        return f"C={int(load)}" if self.settings.metric == "concurrency" else f"rate={load:g}/s"

    # ---------------------------------------------------------------- the answer

    def estimate(self) -> CapacityEstimate:
        """The capacity, its bracket and the boundary's uncertainty, from what was measured."""
        s = self.settings
        levels = tuple(sorted(self.levels.values(), key=lambda lv: lv.order))
        stop = self.stop or "stopped"
        if self.problem is not None or any(lv.held is None for lv in levels):
            bad = next((lv for lv in levels if lv.held is None), None)
            problem = self.problem or (
                f"{self._label(bad.load)}: {bad.note}" if bad is not None else "no level judged"
            )
            low, high = self.bracket()
            return CapacityEstimate(
                metric=s.metric,
                value=low,
                low=low,
                high=high,
                estimate=None,
                log_se=None,
                log_se_df=None,
                slope=None,
                ci90=None,
                step=s.step(low or s.low),
                levels=levels,
                stop="problem",
                problem=problem,
            )
        low, high = self.bracket()
        non_monotonic = tuple(
            sorted(x for x, lv in self.levels.items() if lv.held and high is not None and x > high)
        )
        slope = self._slope(low, high)
        estimate = log_se = None
        log_se_df: int | None = None
        ci90 = None
        if low is not None and high is not None:
            a, b = self.levels[low], self.levels[high]
            u = self.crossing(low, high)
            span = math.log(high / low)
            if a.margin is not None and b.margin is not None and a.margin > b.margin:
                # u = ln(low) + span * m_a / (m_a - m_b): each end's margin error moves u by
                # its weight over the slope (delta method, with the fitted slope: the two
                # ends' own slope is too steep, see _slope)
                d = a.margin - b.margin
                per = slope if slope is not None else d / span
                w_a, w_b = -b.margin / d, a.margin / d
                var = (w_a * (a.se if a.se is not None else span * per)) ** 2 + (
                    w_b * (b.se if b.se is not None else span * per)
                ) ** 2
                log_se = math.sqrt(var) / per
                if a.se is not None and b.se is not None:
                    log_se_df = min(a.trials, b.trials) - 1
            else:
                log_se = span / math.sqrt(12.0)  # uniform over the bracket
            estimate = math.exp(u)
            ci90 = (math.exp(u - Z90 * log_se), math.exp(u + Z90 * log_se))
        at = estimate if estimate is not None else (low if low is not None else high or s.low)
        return CapacityEstimate(
            metric=s.metric,
            value=low,
            low=low,
            high=high,
            estimate=estimate,
            log_se=log_se,
            log_se_df=log_se_df,
            slope=slope,
            ci90=ci90,
            step=s.step(at),
            levels=levels,
            stop=stop,
            non_monotonic=non_monotonic,
        )

    def _slope(self, low: float | None, high: float | None) -> float | None:
        """d margin / d ln(load) near the boundary (positive: latency rises with load).

        A least-squares line through every level within a factor of 2 of the bracket, not the
        bracket's two ends alone: those are the levels the noise put on either side of the
        boundary, so their margins are pushed apart, and a slope from them alone comes out
        too steep (0.87 for a true 0.58 with 3% trial noise, ``bench/capacity.py``); a wider
        span also averages the noise down.  With fewer than two such levels, the two levels
        nearest the end that exists."""
        pts = [(math.log(x), lv.margin) for x, lv in self.levels.items() if lv.margin is not None]
        ends = [x for x in (low, high) if x is not None]
        if not ends or len(pts) < 2:
            return None
        center = sum(math.log(x) for x in ends) / len(ends)
        near = [(u, m) for u, m in pts if abs(u - center) <= math.log(2.0) + 1e-9]
        if len({u for u, _ in near}) < 2:
            near = sorted(pts, key=lambda p: abs(p[0] - center))[:2]
        mu = statistics.fmean(u for u, _ in near)
        mm = statistics.fmean(m for _, m in near)
        var = sum((u - mu) ** 2 for u, _ in near)
        if var <= 0:
            return None
        slope = -sum((u - mu) * (m - mm) for u, m in near) / var
        return slope if slope > 0 else None


def search_offline(
    settings: SearchSettings, measure: Any, *, max_probes: int = 200
) -> CapacityEstimate:
    """Run a search with a synchronous ``measure(load, trials) -> LevelOutcome`` (a synthetic
    latency model in tests and benches); top-ups call it for the extra trials and the outcomes
    are merged here."""
    search = CapacitySearch(settings)
    seen: dict[float, LevelOutcome] = {}
    for _ in range(max_probes):
        probe = search.next_probe()
        if probe is None:
            break
        new = measure(probe.load, probe.trials)
        if probe.top_up and probe.load in seen:
            new = merge_outcomes(seen[probe.load], new)
        seen[probe.load] = new
        search.tell(probe.load, new)
    return search.estimate()


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


# -------------------------------------------------------------------- measured (the plugin side)


def outcome_of(level: Any, settings: SearchSettings) -> LevelOutcome:
    """A measured :class:`~pytest_kimi.measure.results.LevelResult` as the search sees it.

    The pooled latencies are the ceilings' latencies over all the level's requests
    (:func:`~pytest_kimi.measure.capacity_latency.probe_latencies`: TTFT and end-to-end as the
    level's own figures, ITL per request); each trial's percentiles are computed the same way
    from that trial's records alone.  A level that failed requests or cannot be trusted is a
    *problem*, except one whose only fault is that the server never had every stream running
    at once: that load is beyond what the server runs, so it is *beyond* (broken), not
    unjudgeable.  Client jitter in the level's ITL tail and trials re-measured for a client
    stall become the outcome's warnings.
    """
    from pytest_kimi.measure.capacity_latency import jitter, probe_latencies
    from pytest_kimi.verdicts import Verdict

    clock, names, q = level.figures.clock, list(settings.ceilings), settings.percentile
    pooled = probe_latencies(level.trials, names, q, clock, settings.itl)
    per_trial = [
        probe_latencies([trial], names, q, clock, settings.itl)
        for trial in level.trials
        if any(r.ok for r in trial.records)
    ]
    tail = jitter(level.trials, q, clock)
    warnings = [w for w in [tail.warning() if tail is not None else None] if w is not None]
    replaced = len(level.replaced_trials)
    if replaced:
        warnings.append(
            f"{replaced} trial(s) re-measured, not counted: " + "; ".join(level.replaced_trials)
        )
    extra: dict[str, Any] = {
        "warnings": warnings,
        "jitter": tail.ratio if tail is not None else None,
        "replaced": replaced,
    }
    verdict = Verdict.of(level.verdict)
    if verdict in (Verdict.ERROR, Verdict.NOT_RUN):
        return LevelOutcome(pooled, per_trial, problem="; ".join(level.reasons) or "error", **extra)
    if verdict is Verdict.INVALID:
        invalid = [t for t in level.trials if t.invalid]
        if invalid and all(
            t.window is None and t.requests_ok > 0 and len(t.invalid) == 1 and not t.transient
            for t in invalid
        ):
            return LevelOutcome(
                pooled,
                per_trial,
                beyond="the server never ran every stream at once (more than its running "
                "limit): beyond its capacity",
                **extra,
            )
        return LevelOutcome(
            pooled, per_trial, problem="; ".join(level.reasons) or "invalid", **extra
        )
    return LevelOutcome(pooled, per_trial, **extra)


@dataclass(slots=True)
class CapacityRun:
    """What :func:`run_capacity` measured: the levels (as a test's results) and the estimate."""

    result: Any
    """The :class:`~pytest_kimi.measure.results.ThroughputResult` holding the levels."""
    estimate: CapacityEstimate


async def run_capacity(
    client: Any,
    spec: Any,
    settings: SearchSettings,
    progress: Any = None,
) -> CapacityRun:
    """Drive a search with the plugin's own level measurement.

    ``spec`` is the test's :class:`~pytest_kimi.measure.measure_spec.MeasureSpec`, whose workload holds
    one level (lengths and prompts: the template); each probe measures that level at the
    probe's load with :func:`~pytest_kimi.measure.trials.measure_level`, the protocol the test
    runs with (stationary by default), after one warm-up.  A top-up measures the extra trials
    and re-judges the level on all its trials.  The levels are left on ``spec.partial`` as they
    finish, so an interrupted search still reports them.  Each trial passes
    :class:`~pytest_kimi.measure.capacity_latency.ProbeStallCheck` (around the test's own
    observer): a trial whose judged latency a client stall inflated is measured again.
    """
    from pytest_kimi.measure.capacity_latency import ProbeStallCheck
    from pytest_kimi.measure.results import ThroughputResult
    from pytest_kimi.measure.one_trial import warm_up
    from pytest_kimi.measure.trials import _account, close_guard, measure_level

    template = spec.workload.levels[0]
    base_workload = spec.workload
    result = ThroughputResult(spec.nodeid, spec.workload, spec.targets)
    spec.partial = result
    search = CapacitySearch(settings)
    measured: dict[float, Any] = {}
    own_observer = spec.observer
    observer = ProbeStallCheck(
        own_observer, settings.ceilings, settings.percentile, spec.clock, settings.itl
    )
    spec.observer = observer
    try:
        await observer.open()
        warm_start = perf_counter()
        await warm_up(client, spec)
        result.warmup_server_time_s = round((perf_counter() - warm_start) * spec.clock, 3)
        while (probe := search.next_probe()) is not None:
            level_spec = dataclasses.replace(
                template,
                concurrency=int(probe.load) if settings.metric == "concurrency" else None,
                rate=probe.load if settings.metric == "rate" else None,
            )
            previous = measured.get(probe.load) if probe.top_up else None
            done = len(previous.trials) if previous is not None else 0
            # top-ups continue the trial numbering (open-loop arrivals are seeded by it)
            spec.workload = dataclasses.replace(base_workload, seed=base_workload.seed + done)
            spec.trials = probe.trials
            try:
                level = await measure_level(client, spec, level_spec, progress)
            finally:
                spec.workload = base_workload
            if previous is not None:
                level = _merged(previous, level, spec)
            measured[probe.load] = level
            judged = search.tell(probe.load, outcome_of(level, settings))
            _label_level(level, judged, settings)
            result.levels = sorted(measured.values(), key=lambda lv: lv.spec.load)
            if spec.level_done is not None:
                spec.level_done(level)
        estimate = search.estimate()
    finally:
        try:
            await observer.close()
        finally:
            await close_guard(spec)
            spec.observer = own_observer
            _account(result, spec.clock)
    return CapacityRun(result, estimate)


def _merged(first: Any, more: Any, spec: Any) -> Any:
    """One level from two measurements of the same load: re-judged on all the trials."""
    from pytest_kimi.measure.results import judge_level
    from pytest_kimi.measure.trials import prompt_tokens_summary

    for i, trial in enumerate(more.trials):
        trial.index = len(first.trials) + i
    trials = [*first.trials, *more.trials]
    level = judge_level(
        first.spec, spec.workload, spec.targets, trials, first.prompts_key, spec.clock
    )
    level.protocol = first.protocol
    level.extra = {**first.extra, **more.extra}
    for name in ("turns", "fill_up", "input_tokens_sizing"):
        setattr(level, name, getattr(more, name) or getattr(first, name))
    level.server_time_s = round((first.server_time_s or 0.0) + (more.server_time_s or 0.0), 3)
    level.prompt_tokens = prompt_tokens_summary(trials)
    level.replaced_trials = [*first.replaced_trials, *more.replaced_trials]
    level.trial_windows = [
        *first.trial_windows,
        *(
            dataclasses.replace(w, trial=len(first.trial_windows) + i)
            for i, w in enumerate(more.trial_windows)
        ),
    ]
    notes = [e for e in [*first.errors, *more.errors] if e.startswith("note:")]
    level.errors.extend(n for n in dict.fromkeys(notes) if n not in level.errors)
    return level


def _label_level(level: Any, judged: CapacityLevel, settings: SearchSettings) -> None:
    """A search level's verdict says what the search learned there: ``held`` or ``broke``
    (a missed ceiling is the point of the search, not a failure); others keep theirs.  Its
    reasons are the ceilings the search judged it on (a ``@throughput`` reason would quote the
    per-gap ITL, which is not what broke it), then the warnings as notes."""
    from pytest_kimi.measure.capacity_latency import NAMES
    from pytest_kimi.verdicts import Verdict

    notes = [f"note: {w}" for w in judged.warnings]
    if judged.held is True:
        level.verdict = Verdict.HELD.value
        level.reasons = notes
    elif judged.held is False:
        level.verdict = Verdict.BROKE.value
        missed = [
            f"{NAMES[name]} p{settings.percentile:g} {value:.4g} s > max_{name} {limit:g}"
            + (
                " (each request's mean ITL)"
                if name == "itl_s" and settings.itl == "request"
                else ""
            )
            for name, limit in settings.ceilings.items()
            if (value := judged.latencies.get(name)) is not None and value > limit
        ]
        level.reasons = [*missed, *([judged.note] if judged.note else []), *notes]
    else:
        level.reasons = [*level.reasons, *(n for n in notes if n not in level.reasons)]
    level.capacity_level = judged.to_dict()
