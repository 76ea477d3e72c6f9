"""Session noise measured from the history: how far runs of one unchanged build scatter.

The gate adds ``--perf-session-sigma`` (default 0.03) to every comparison as a known variance:
the standard deviation of the log *ratio* of two independent sessions (server starts), which
is ``sqrt(2)`` times the sd of one session's own factor.  A history of runs of an unchanged
build is exactly the data to measure it from, and this module does, per test level and pooled
over the levels, with an interval, and recommends a value.

Which runs count as one build
-----------------------------
A *session* is one server start: one run's points of a level (with ``--perf-sessions`` each of
a run's sessions is one).  Its trials are the session's samples.  Sessions are grouped into
*unchanged builds*, and only the scatter within a group is noise:

* equal provenance apart from what changes with every launch (:func:`comparable_provenance`:
  the suite's commit, the time, the client host, session ids, ports, pids, SGLang's
  ``random_seed``, and the simulator's ``seed``, which draws a launch's noise factor exactly as
  a real server start draws its own; its ``noise``, ``slowdown`` and ``speed`` do count), and
* no change point (:func:`pytest_kimi.history.changes.find_changes`) between them: a step in
  the series is a change of the build or the machine that the provenance did not record (a
  driver, a kernel, the suite's own code), not noise.

Each group has its own mean, so a build that is 15% slower adds nothing to the estimate: its
sessions only scatter around their own level.  Groups of one session say nothing and are left
out.

The statistics (one core, :mod:`pytest_kimi.gate.session_noise`)
-----------------------------------------------------------------
The point estimate is the method of moments of
:func:`pytest_kimi.gate.stats.estimate_session_sigma` (the scatter of session means less the
part trial noise explains), and the interval is the modified large-sample (MLS) interval for
a difference of two mean squares (Ting et al. 1990; Burdick and Graybill 1992), the same core
``--perf-sessions`` uses, chosen there over a chi-square interval on the session means alone
(which ignores that the trial-noise term is estimated too) and over a bootstrap (3-10 sessions
are too few units to resample a variance from).  Groups (builds, deployments) enter as
independent sets of sessions: their degrees of freedom add.  Levels of one server start share
its factor, so the pooled estimate averages each session's level means into one score before
the scatter is taken (:func:`pytest_kimi.gate.session_noise.pooled`): L levels do not count as
L independent measurements.  ``bench/session_noise_history.py`` measures the interval's
coverage on synthetic histories built like this module reads them.

The recommendation (:func:`pytest_kimi.gate.session_noise.recommend`) is the pooled point
estimate rounded up to half a percent, with its interval and a warning below 5 sessions.

Capacities
----------
A ``@capacity`` test's series (its capacity, one point per server start; the loads its search
probed are no series) has no trials: a session's figure is the interpolated boundary ``u =
ln(estimate)`` with its trial standard error ``log_se``.  Its sessions are grouped into
builds as a level's are, and :class:`CapacityNoise` gives the sd of one session's ``u`` with
the trial part taken out: ``tau_u**2 = s**2 - mean(log_se**2)``, ``s**2`` the scatter of ``u``
within the groups (``sum(n_g - 1)`` degrees of freedom), its interval the chi-square one of
``s**2`` less the same trial part (``log_se`` treated as known: it is the small term, and its
own few degrees of freedom would only widen the low end).  The capacity gate models a server
start as a common latency factor of log sd ``session_sigma / sqrt(2)`` that moves the boundary
by that over the latency's ``slope`` (:mod:`pytest_kimi.gate.capacity_gate`), so ``sqrt(2) *
tau_u * slope`` (the sessions' median slope) is the ``--perf-session-sigma`` this capacity's
scatter implies: a check of the gate's capacity noise, reported beside the throughput levels'
estimate, not pooled into it (it is read through the slope, and the boundary moves for reasons
a throughput level does not see).  A run whose capacity is a bound (no boundary) is left out.

Pure: no pytest, no database; numpy/scipy (and Otava for the change points) on first use.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kimi.gate.session_noise import (
    DEFAULT_CONFIDENCE,
    NoiseEstimate,
    Recommendation,
    pooled,
    recommend,
)
from pytest_kimi.history.changes import (
    DEFAULT_MAX_PVALUE,
    DEFAULT_MIN_MAGNITUDE,
    HISTORY_IGNORE,
    Change,
    comparable_provenance,
    find_changes,
    trusted,
)
from pytest_kimi.history.model import CAPACITY, LevelSeries, Point, RunInfo

__all__ = [
    "CapacityNoise",
    "NoiseReport",
    "SeriesNoise",
    "build_groups",
    "capacity_noise",
    "estimate_noise",
]

SessionKey = tuple[int, int | None]
"""(run id, ``--perf-sessions`` session or None): one server start."""


@dataclass(frozen=True, slots=True)
class Session:
    """One server start's trials at one level."""

    key: SessionKey
    run: RunInfo
    trials: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SeriesNoise:
    """One test level's session noise, from its unchanged-build groups."""

    test: str
    level: str
    deployment: str | None
    series: str
    estimate: NoiseEstimate
    """``estimate.sigma`` is ``session_sigma`` (log sd of the ratio of two sessions);
    ``estimate.tau`` the sd of one session's log factor (``sigma / sqrt(2)``)."""
    groups: int
    """Unchanged-build groups that entered (each of two or more sessions)."""
    runs: tuple[int, ...]
    """Ids of the runs whose sessions entered."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "level": self.level,
            "deployment": self.deployment,
            "series": self.series,
            "groups": self.groups,
            "runs": list(self.runs),
            **_estimate_dict(self.estimate),
        }

    def describe(self) -> str:
        return f"{self.series}: {_estimate_text(self.estimate)}; {_groups_text(self)}"


@dataclass(frozen=True, slots=True)
class CapacityNoise:
    """One capacity series' session noise, from its unchanged-build groups (module docstring,
    *Capacities*): how far one server start moves ``ln`` of its boundary."""

    test: str
    level: str
    deployment: str | None
    series: str
    sd: float
    """The sd of one session's ``ln(boundary)``, trial noise taken out (0 when the sessions
    agree better than their ``log_se`` predicts)."""
    low: float
    high: float
    confidence: float
    scatter_sd: float
    """The sd of ``ln(boundary)`` within the groups, trial noise included."""
    trial_sd: float
    """The root mean square ``log_se``: the part trial noise explains."""
    sessions: int
    groups: int
    df: int
    slope: float | None
    """The sessions' median slope (None where none was estimated)."""
    runs: tuple[int, ...]

    def implied_sigma(self, value: float) -> float | None:
        """``--perf-session-sigma`` that a one-session sd ``value`` of ``ln(boundary)``
        implies through the slope (None without a slope)."""
        return None if self.slope is None else math.sqrt(2.0) * value * self.slope

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "level": self.level,
            "deployment": self.deployment,
            "series": self.series,
            "one_session_sd": round(self.sd, 6),
            "one_session_sd_low": round(self.low, 6),
            "one_session_sd_high": round(self.high, 6),
            "confidence": self.confidence,
            "scatter_sd": round(self.scatter_sd, 6),
            "trial_sd": round(self.trial_sd, 6),
            "sessions": self.sessions,
            "groups": self.groups,
            "df": self.df,
            "slope": None if self.slope is None else round(self.slope, 4),
            "implied_session_sigma": _round6(self.implied_sigma(self.sd)),
            "implied_session_sigma_low": _round6(self.implied_sigma(self.low)),
            "implied_session_sigma_high": _round6(self.implied_sigma(self.high)),
            "runs": list(self.runs),
        }

    def describe(self) -> str:
        text = (
            f"{self.series}: one session sd of ln(boundary) {self.sd:.4f} "
            f"({self.confidence:.0%} CI {self.low:.4f}..{self.high:.4f}; scatter "
            f"{self.scatter_sd:.4f}, trial part {self.trial_sd:.4f}); {self.sessions} sessions"
        )
        implied = self.implied_sigma(self.sd)
        if implied is not None and self.slope is not None:
            lo, hi = self.implied_sigma(self.low), self.implied_sigma(self.high)
            text += (
                f"; at slope {self.slope:.2f} that is session sigma {implied:.4f} "
                f"({lo:.4f}..{hi:.4f})"
            )
        runs = f"run {self.runs[0]}" if len(self.runs) == 1 else f"runs {_ranges(self.runs)}"
        return text + f"; {self.groups} build group{'s' if self.groups != 1 else ''} ({runs})"


def _round6(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass(frozen=True, slots=True)
class NoiseReport:
    """Per-level estimates, the pooled one and the recommended ``--perf-session-sigma``."""

    series: tuple[SeriesNoise, ...]
    pooled: NoiseEstimate | None
    """All levels together: a session's levels averaged into one score per server start,
    groups (builds, deployments) as independent sets of sessions; None when no level had two
    sessions of one build."""
    recommendation: Recommendation | None
    skipped: tuple[str, ...] = ()
    """Levels left out, each with why (``test C=1 [sim]: 1 session of one build``)."""
    changes: tuple[Change, ...] = field(default=(), compare=False)
    """The change points that split the groups."""
    capacities: tuple[CapacityNoise, ...] = ()
    """The capacity series' session noise, each on its own (module docstring, *Capacities*)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": [s.to_dict() for s in self.series],
            "capacities": [c.to_dict() for c in self.capacities],
            "pooled": None if self.pooled is None else _estimate_dict(self.pooled),
            "recommendation": None
            if self.recommendation is None
            else {"session_sigma": self.recommendation.value, "text": self.recommendation.text},
            "skipped": list(self.skipped),
            "change_points": len(self.changes),
        }

    def describe(self) -> list[str]:
        """The report as text: what the figures mean, per level, pooled, the advice."""
        lines = [
            "session sigma: sd of the log ratio of two sessions (what --perf-session-sigma "
            "takes); one session: sd of one server start's log factor = sigma / sqrt(2)",
        ]
        for s in self.series:
            lines.append("  " + s.describe())
        for c in self.capacities:
            lines.append("  " + c.describe())
        for why in self.skipped:
            lines.append(f"  left out: {why}")
        if self.pooled is None or self.recommendation is None:
            lines.append(
                "no estimate: no test level has two sessions of one unchanged build "
                "(record more runs, or a run with --perf-sessions N)"
            )
            return lines
        lines.append(f"pooled: {_estimate_text(self.pooled)}")
        lines.append(f"recommendation: {self.recommendation.text}")
        return lines


def _estimate_dict(e: NoiseEstimate) -> dict[str, Any]:
    r2 = math.sqrt(2.0)
    return {
        "session_sigma": round(e.sigma, 6),
        "session_sigma_low": round(e.low, 6),
        "session_sigma_high": round(e.high, 6),
        "one_session_sd": round(e.sigma / r2, 6),
        "one_session_sd_low": round(e.low / r2, 6),
        "one_session_sd_high": round(e.high / r2, 6),
        "confidence": e.confidence,
        "sessions": e.sessions,
        "trials": e.trials,
        "levels": e.levels,
        "trial_sd": round(e.within_sd, 6),
        "df_between": e.df_between,
        "df_within": round(e.df_within, 2) if math.isfinite(e.df_within) else None,
    }


def _estimate_text(e: NoiseEstimate) -> str:
    r2 = math.sqrt(2.0)
    text = (
        f"session sigma {e.sigma:.4f} ({e.confidence:.0%} CI {e.low:.4f}..{e.high:.4f}), "
        f"one session {e.sigma / r2:.4f} ({e.low / r2:.4f}..{e.high / r2:.4f}); "
        f"trial sd {e.within_sd:.4f}; {e.sessions} sessions, {e.trials} trials"
    )
    if e.levels > 1:
        text += f", {e.levels} levels"
    return text


def _groups_text(s: SeriesNoise) -> str:
    runs = f"run {s.runs[0]}" if len(s.runs) == 1 else f"runs {_ranges(s.runs)}"
    return f"{s.groups} build group{'s' if s.groups != 1 else ''} ({runs})"


def _ranges(ids: Sequence[int]) -> str:
    """``1-4, 7, 9-10``."""
    out: list[str] = []
    items = sorted(set(ids))
    start = prev = items[0]
    for x in items[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


# ------------------------------------------------------------------------------ grouping


def _sessions(series: LevelSeries) -> list[Session]:
    """The series' server starts with their valid trials, in order (a point without trials
    holds no session's scatter, and one whose verdict distrusts its figures none to trust:
    both are left out)."""
    out = []
    for point in series.points:
        trials = _trials(point) if trusted(point) else ()
        if trials:
            out.append(Session(key=(point.run.id, point.session), run=point.run, trials=trials))
    return out


def _trials(point: Point) -> tuple[float, ...]:
    return tuple(t for t in point.trials if math.isfinite(t) and t > 0.0)


def _run_order(run: RunInfo) -> tuple[Any, int]:
    return (run.time, run.id)


def _segment(run: RunInfo, change_runs: Sequence[RunInfo]) -> int:
    """How many of the series' change points lie at or before ``run`` (the build segment)."""
    here = _run_order(run)
    return sum(1 for c in change_runs if _run_order(c) <= here)


def _signature(run: RunInfo, ignore: Sequence[str]) -> str:
    return json.dumps(
        comparable_provenance(run.provenance, ignore=ignore), sort_keys=True, default=str
    )


def _change_runs(series: LevelSeries, changes: Iterable[Change]) -> list[RunInfo]:
    runs = {p.run.id: p.run for p in series.points}
    return [
        runs[c.run]
        for c in changes
        if (c.test, c.level, c.deployment) == (series.test, series.level, series.deployment)
        and c.run in runs
    ]


def build_groups(
    series: LevelSeries,
    changes: Iterable[Change],
    *,
    ignore: Sequence[str] = HISTORY_IGNORE,
) -> list[list[Session]]:
    """The series' sessions in unchanged-build groups (equal provenance apart from volatile
    fields, no change point between them), in order of their first session; groups of one
    session included (the caller leaves them out)."""
    return _by_build(_sessions(series), _change_runs(series, changes), ignore)


def _by_build(sessions: Iterable[Any], cuts: Sequence[RunInfo], ignore: Sequence[str]) -> list[Any]:
    """Sessions (anything with a ``run``) grouped by build segment and provenance."""
    groups: dict[tuple[int, str], list[Any]] = {}
    for session in sessions:
        key = (_segment(session.run, cuts), _signature(session.run, ignore))
        groups.setdefault(key, []).append(session)
    return list(groups.values())


@dataclass(frozen=True, slots=True)
class _CapacitySession:
    """One server start's capacity: ``ln`` of its boundary, its trial error and slope."""

    key: SessionKey
    run: RunInfo
    u: float
    log_se: float
    slope: float | None


def _capacity_sessions(series: LevelSeries) -> list[_CapacitySession]:
    out = []
    for point in series.points:
        cap = point.capacity
        if cap is None or not trusted(point):
            continue
        if cap.estimate is None or not math.isfinite(cap.estimate) or cap.estimate <= 0:
            continue
        log_se = cap.log_se if cap.log_se is not None and math.isfinite(cap.log_se) else 0.0
        out.append(
            _CapacitySession(
                key=(point.run.id, point.session),
                run=point.run,
                u=math.log(cap.estimate),
                log_se=max(log_se, 0.0),
                slope=cap.slope if cap.slope is not None and cap.slope > 0 else None,
            )
        )
    return out


def capacity_noise(
    series: LevelSeries,
    changes: Iterable[Change],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    ignore: Sequence[str] = HISTORY_IGNORE,
) -> CapacityNoise | str:
    """One capacity series' session noise (module docstring, *Capacities*), or why there is
    none."""
    from scipy import stats

    groups = _by_build(_capacity_sessions(series), _change_runs(series, changes), ignore)
    usable = [g for g in groups if len(g) >= 2]
    if not usable:
        n = max((len(g) for g in groups), default=0)
        return f"{series.ident}: " + (
            "no capacity boundary stored"
            if not groups
            else f"at most {n} session{'s' if n != 1 else ''} of one build"
        )
    df = sum(len(g) - 1 for g in usable)
    ss = 0.0
    for g in usable:
        mean = sum(x.u for x in g) / len(g)
        ss += sum((x.u - mean) ** 2 for x in g)
    scatter = ss / df
    members = [x for g in usable for x in g]
    trial = sum(x.log_se**2 for x in members) / len(members)
    alpha = 1.0 - confidence
    upper = ss / float(stats.chi2.ppf(alpha / 2.0, df))
    lower = ss / float(stats.chi2.ppf(1.0 - alpha / 2.0, df))
    slopes = sorted(x.slope for x in members if x.slope is not None)
    slope = None
    if slopes:
        mid = len(slopes) // 2
        slope = slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0
    return CapacityNoise(
        test=series.test,
        level=series.level,
        deployment=series.deployment,
        series=series.ident,
        sd=math.sqrt(max(scatter - trial, 0.0)),
        low=math.sqrt(max(lower - trial, 0.0)),
        high=math.sqrt(max(upper - trial, 0.0)),
        confidence=confidence,
        scatter_sd=math.sqrt(scatter),
        trial_sd=math.sqrt(trial),
        sessions=len(members),
        groups=len(usable),
        df=df,
        slope=slope,
        runs=tuple(sorted({x.key[0] for x in members})),
    )


def _usable(group: Sequence[Session]) -> bool:
    """Two or more sessions, one of them with two or more trials (else nothing to subtract
    trial noise with)."""
    return len(group) >= 2 and any(len(s.trials) >= 2 for s in group)


# ------------------------------------------------------------------------------ estimates


def estimate_noise(
    series: Sequence[LevelSeries],
    *,
    changes: Sequence[Change] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    current: float | None = None,
    ignore: Sequence[str] = HISTORY_IGNORE,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    min_magnitude: float = DEFAULT_MIN_MAGNITUDE,
) -> NoiseReport:
    """Session noise per level and pooled, from the sessions of unchanged builds.

    ``changes``: the change points that split builds (found with ``max_pvalue`` and
    ``min_magnitude`` when not given).  ``current``: the ``--perf-session-sigma`` in use, for
    the recommendation to say whether it is inside the interval.  Raises ``ValueError`` for a
    confidence outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if changes is None:
        changes = find_changes(series, max_pvalue=max_pvalue, min_magnitude=min_magnitude)
    per_series: list[SeriesNoise] = []
    capacities: list[CapacityNoise] = []
    skipped: list[str] = []
    # per deployment: (series, its usable groups keyed by build) for the pooled estimate
    by_deployment: dict[str | None, list[tuple[LevelSeries, dict[SessionKey, Session]]]] = {}
    for s in series:
        if s.kind == CAPACITY:
            found = capacity_noise(s, changes, confidence=confidence, ignore=ignore)
            if isinstance(found, str):
                skipped.append(found)
            else:
                capacities.append(found)
            continue
        groups = build_groups(s, changes, ignore=ignore)
        usable = [g for g in groups if _usable(g)]
        if not usable:
            n = max((len(g) for g in groups), default=0)
            skipped.append(
                f"{s.ident}: "
                + (
                    "no trials stored"
                    if not groups
                    else f"at most {n} session{'s' if n != 1 else ''} of one build"
                    + ("" if n < 2 else " and no session with two trials")
                )
            )
            continue
        estimate = pooled([[[list(x.trials) for x in g]] for g in usable], confidence)
        per_series.append(
            SeriesNoise(
                test=s.test,
                level=s.level,
                deployment=s.deployment,
                series=s.ident,
                estimate=estimate,
                groups=len(usable),
                runs=tuple(sorted({x.key[0] for g in usable for x in g})),
            )
        )
        by_deployment.setdefault(s.deployment, []).append((s, {x.key: x for x in _sessions(s)}))
    total = _pooled(by_deployment, changes, confidence, ignore)
    return NoiseReport(
        series=tuple(per_series),
        pooled=total,
        recommendation=None if total is None else recommend(total, current=current),
        skipped=tuple(skipped),
        changes=tuple(changes),
        capacities=tuple(capacities),
    )


def _pooled(
    by_deployment: dict[str | None, list[tuple[LevelSeries, dict[SessionKey, Session]]]],
    changes: Sequence[Change],
    confidence: float,
    ignore: Sequence[str],
) -> NoiseEstimate | None:
    """All levels together.  Within a deployment a build group is now cut by a change point
    in *any* of its levels (the levels share the server starts, so a build is one for all of
    them), and each group takes the levels that share most of its sessions (a level added
    later, or one that failed in a run, is left out of that group rather than shrinking it;
    see :func:`_block`)."""
    blocks: list[list[list[list[float]]]] = []
    for members in by_deployment.values():
        cuts = [c for s, _ in members for c in _change_runs(s, changes)]
        starts: dict[SessionKey, RunInfo] = {}
        for _, sessions in members:
            for key, x in sessions.items():
                starts.setdefault(key, x.run)
        groups: dict[tuple[int, str], list[SessionKey]] = {}
        for key, run in sorted(starts.items(), key=lambda kv: (_run_order(kv[1]), str(kv[0]))):
            groups.setdefault((_segment(run, cuts), _signature(run, ignore)), []).append(key)
        for keys in groups.values():
            block = _block(keys, [sessions for _, sessions in members])
            if block is not None:
                blocks.append(block)
    if not blocks:
        return None
    return pooled(blocks, confidence)


def _block(
    keys: list[SessionKey], levels: list[dict[SessionKey, Session]]
) -> list[list[list[float]]] | None:
    """One group's sessions at the levels that share them: of the sets of levels that come
    from dropping, one by one, the level that covers the fewest sessions, the one whose shared
    sessions are most (the between-session degrees of freedom are what the interval lives
    on), then with most levels; None below two sessions."""
    candidates = [lv for lv in levels if sum(k in lv for k in keys) >= 2]
    best: tuple[int, int, list[list[list[float]]]] | None = None
    while candidates:
        common = [k for k in keys if all(k in lv for lv in candidates)]
        if len(common) >= 2:
            rows = [[list(lv[k].trials) for k in common] for lv in candidates]
            rows = [r for r in rows if any(len(t) >= 2 for t in r)]
            if rows and (best is None or (len(common), len(rows)) > best[:2]):
                best = (len(common), len(rows), rows)
        candidates.remove(min(candidates, key=lambda lv: sum(k in lv for k in keys)))
    return None if best is None else best[2]
