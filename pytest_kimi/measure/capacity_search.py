"""Capacity under an SLO: the highest load at which every latency ceiling holds, by search.

A ``@capacity`` test asks a question a sweep answers badly: *how much load can this deployment
take before its p95 ITL passes 50 ms?*  A sweep over fixed levels spends most of its time far
from the answer and still only brackets it between two of its levels.  This module finds the
boundary with few levels and says how sure it is.

Pure core, no pytest and no I/O: :class:`CapacitySearch` is an ask/tell object (``next_probe``
says which load to measure and with how many trials, ``tell`` takes what was measured), so it
is driven by the plugin's level measurement
(:func:`~pytest_kimi.measure.capacity_run.run_capacity`) or by a synthetic latency
model in tests and ``bench/capacity.py`` alike.

How a level is judged (it holds, its margin, how sure it is) is in
:mod:`pytest_kimi.measure.capacity_levels`; a search interpolates on its margins.

**The search** (``docs/guide/workloads.md``, *Capacity under an SLO*):

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
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from pytest_kimi.logscale import Z90
from pytest_kimi.measure.capacity_levels import (
    CapacityLevel,
    LevelOutcome,
    Metric,
    SearchSettings,
    _t_cdf,
    judge,
    merge_outcomes,
)


MIN_GROWTH = 2.0
MAX_GROWTH = 4.0
"""Growth per level before anything broke: at least doubling (so a wide range costs log2 of
its width), at most quadrupling (an extrapolation from far below the boundary overshoots)."""
DEFAULT_SLOPE = 0.5
"""The latency's elasticity with load assumed before two levels measure it (the simulator's
decode step has 0.3 at C=16, 0.58 at C=40, 0.7 at C=256)."""


def _norm_ppf(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


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
