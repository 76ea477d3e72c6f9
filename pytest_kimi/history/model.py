"""The history's read model: what the analyses (change points, session noise, dashboard) see.

A run is one pytest session that measured something; a series is one test level's figures
across runs, in time order, or a ``@capacity`` test's capacity across runs (``kind``
``capacity``: one point per run with the capacity, its bracket and boundary; the loads its
search probed are no series).  The analyses read a point's :attr:`Point.figure`: tok/s, or a
capacity's interpolated boundary, the quantity its gate compares.  These records are plain data, built by the store from the
database and by tests from made-up numbers, so every analysis is tested without a database.
Pure: no SQLAlchemy, no pytest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One stored run: when, from which suite commit, on which deployment, and where in CI."""

    id: int
    """The database's id of the run: stable, the dashboard links to it."""
    time: datetime
    """When the run finished, timezone-aware UTC."""
    commit: str | None = None
    """The test suite's git commit, when the suite is a git checkout."""
    branch: str | None = None
    ci_url: str | None = None
    """The CI run's page (GitHub Actions: server/repo/actions/runs/id), when there is one."""
    deployment: str | None = None
    """The baseline profile the run measured (server profile name, ``sim`` or ``default``)."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """Scrubbed provenance flattened to dotted keys (``server_info.tp_size``: 8): what the
    server said it was, the model, the plugin version; never a secret."""
    plugin_version: str | None = None


THROUGHPUT = "throughput"
CAPACITY = "capacity"


@dataclass(frozen=True, slots=True)
class CapacityFigures:
    """A ``@capacity`` test's result in one run (the report's ``capacity`` object)."""

    metric: str | None
    """``concurrency`` or ``rate``: what the loads are."""
    value: float | None
    """The capacity: the highest load that held (None when the bottom of the range broke)."""
    low: float | None
    """The bracket the search ended with: ``low`` held, ``high`` broke.  ``high`` None: the top
    of the range held (the capacity is at least ``low``); ``low`` None: the bottom broke."""
    high: float | None
    estimate: float | None
    """The boundary interpolated inside the bracket (None for a bound): the quantity the gate
    compares, and so the one change points and noise read."""
    estimate_ci90: tuple[float | None, float | None] = (None, None)
    log_se: float | None = None
    """Standard error of ``ln(estimate)`` from the trial noise of the bracket's ends."""
    slope: float | None = None
    """How fast the binding latency's margin falls per unit ``ln(load)`` at the boundary."""
    baseline: float | None = None
    baseline_low: float | None = None
    baseline_high: float | None = None
    baseline_estimate: float | None = None

    @property
    def baseline_compared(self) -> float | None:
        """The baseline's side of the gate's comparison: its boundary, else its capacity."""
        return self.baseline_estimate if self.baseline_estimate is not None else self.baseline


@dataclass(frozen=True, slots=True)
class Point:
    """One run's figures for one test level."""

    run: RunInfo
    tok_s: float | None
    """The level's throughput (median of its trials), None when it measured nothing valid."""
    trials: tuple[float, ...] = ()
    """Every valid trial's tok/s: the within-run scatter, which the analyses use as noise."""
    verdict: str | None = None
    baseline_tok_s: float | None = None
    """The baseline the run was compared with, when there was one."""
    tolerance_pct: float | None = None
    """The tolerance the gate applied to that baseline (the band drawn around it)."""
    change_pct: float | None = None
    """The gate's change against the baseline, in percent."""
    session: int | None = None
    """With ``--perf-sessions N``: which fresh deployment session of the run (0-based) these
    figures come from; one run then gives N points of a series.  None otherwise."""
    ci90: tuple[float | None, float | None] | None = None
    """The 90% interval of ``change_pct`` in percent (an end None where it is unbounded);
    None when the level was not compared."""
    capacity: CapacityFigures | None = None
    """A capacity series' point: the capacity, its bracket and boundary (``tok_s`` is None)."""

    @property
    def figure(self) -> float | None:
        """What the analyses read: tok/s, or a capacity's boundary (None for a bound)."""
        return self.capacity.estimate if self.capacity is not None else self.tok_s

    @property
    def value(self) -> float | None:
        """What a chart plots: tok/s, or the capacity (the highest load that held)."""
        return self.capacity.value if self.capacity is not None else self.tok_s


@dataclass(frozen=True, slots=True)
class LevelSeries:
    """One test level across runs: same test, same level key, same deployment."""

    test: str
    """The test's node id, without the deployment parameter."""
    level: str
    """The level's label (``C=64``, ``rate=4/s``)."""
    key: Mapping[str, Any]
    """The level's baseline key (workload, concurrency/rate, max_tokens, protocol...): two
    runs of a test whose workload changed are two series, never one."""
    deployment: str | None
    points: tuple[Point, ...]
    """In run time order, oldest first."""
    kind: str = THROUGHPUT
    """``throughput`` (a level's tok/s) or ``capacity`` (a ``@capacity`` test's capacity;
    ``key`` is then the capacity's baseline key)."""
    metric: str | None = None
    """A capacity series: ``concurrency`` or ``rate``."""

    @property
    def unit(self) -> str:
        """The unit of the points' figures: ``tok/s``; a capacity's ``streams`` or ``req/s``."""
        if self.kind != CAPACITY:
            return "tok/s"
        return "req/s" if self.metric == "rate" else "streams"

    @property
    def ident(self) -> str:
        """A short stable name for the series (dashboard anchors, JSON)."""
        where = f" [{self.deployment}]" if self.deployment else ""
        return f"{self.test} {self.level}{where}"


__all__ = ["CAPACITY", "THROUGHPUT", "CapacityFigures", "LevelSeries", "Point", "RunInfo"]
