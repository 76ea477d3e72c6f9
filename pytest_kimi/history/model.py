"""The history's read model: what the analyses (change points, session noise, dashboard) see.

A run is one pytest session that measured something; a series is one test level's figures
across runs, in time order.  These records are plain data, built by the store from the
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

    @property
    def ident(self) -> str:
        """A short stable name for the series (dashboard anchors, JSON)."""
        where = f" [{self.deployment}]" if self.deployment else ""
        return f"{self.test} {self.level}{where}"


__all__ = ["LevelSeries", "Point", "RunInfo"]
