"""The plugin's state: stash keys and what the session accumulates for its reports.

Everything the plugin keeps lives on ``config.stash`` or ``item.stash`` under these keys
(never as ad-hoc attributes), so two plugin instances in one process -- a ``pytester`` inner
session inside a test run -- cannot see each other's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the keys' types only: a session without perf tests loads no run stage
    from pytest_kimi.baseline import TestBaseline
    from pytest_kimi.measure.results import ThroughputResult
    from pytest_kimi.options import KimiOptions
    from pytest_kimi.report.requests_file import RequestsFile
    from pytest_kimi.run.conductor import TestPlan
    from pytest_kimi.run.gating import GateContext
    from pytest_kimi.server import ServerProfile
    from pytest_kimi.server.interrupts import Interrupts
    from pytest_kimi.wire import TestEntry

REPORT_ATTR = "kimi_perf"
"""Attribute on TestReport carrying a test's JSON object (serialised by xdist with the report)."""


@dataclass(slots=True)
class RunState:
    """What the session accumulates for its reports (controller side under xdist)."""

    endpoint: dict[str, Any] | None = None
    current_endpoint: dict[str, Any] | None = None
    """The endpoint opened last in this process: the one the tests running now measure (each
    deployment's, in an A/B), which their records carry."""
    tests: list[TestEntry] = field(default_factory=list)
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Endpoint (URL, model, server info) per deployment name ('' without profiles)."""
    references: dict[str, TestBaseline] = field(default_factory=dict)
    """Same-run A/B: the reference deployment's results per test, as a baseline for the others."""
    intervals: list[tuple[float, float]] = field(default_factory=list)
    """Wall-clock (start, end) of each measurement of this process."""


# annotated, not subscripted: the types are not imported at run time (see above)
STATE: pytest.StashKey[RunState] = pytest.StashKey()
DEPLOYMENTS: pytest.StashKey[list[ServerProfile]] = pytest.StashKey()
GATE: pytest.StashKey[GateContext] = pytest.StashKey()
"""The session's gate, resolved on first use: :func:`gate_context`."""
KIMI_OPTIONS: pytest.StashKey[KimiOptions] = pytest.StashKey()
"""The session's options (defaults, precedence, paths: see :mod:`pytest_kimi.options`)."""
PLAN: pytest.StashKey[TestPlan] = pytest.StashKey()
"""A perf test's plan, set at collection."""
RESULT: pytest.StashKey[ThroughputResult] = pytest.StashKey()
"""A perf test's result, set by the measuring fixture."""
INTERRUPTS: pytest.StashKey[Interrupts] = pytest.StashKey()
REQUESTS: pytest.StashKey[RequestsFile] = pytest.StashKey()
"""``--perf-requests``: the file every measuring process appends its levels' requests to."""
PASS_UNREACHABLE: pytest.StashKey[str] = pytest.StashKey()
"""Set when the gate's settings make ``pass`` unreachable: said before any trial runs."""


def kimi_options(config: pytest.Config) -> KimiOptions:
    """The session's options, built once in ``pytest_configure``."""
    return config.stash[KIMI_OPTIONS]


def gate_context(config: pytest.Config) -> GateContext:
    """The session's gate (baseline store, settings, the session noise chosen from the
    history), resolved where a perf test first needs it and kept: a session without perf tests
    never reads the baselines or the history, nor imports the statistics."""
    gate = config.stash.get(GATE, None)
    if gate is None:
        from pytest_kimi.run.gating import GateContext

        gate = config.stash[GATE] = GateContext.from_options(kimi_options(config))
    return gate


def perf_sessions(config: pytest.Config) -> int:
    """``--perf-sessions`` where it applies: a deployment the plugin starts (else 1: without an
    endpoint the perf tests skip once each; an external one was refused at start-up)."""
    opts = kimi_options(config)
    if opts.perf_max_launches and len(config.stash[DEPLOYMENTS]) == 2:
        return opts.perf_max_launches // 2  # the paired experiment's blocks (setup checked it)
    return opts.perf_sessions if opts.is_sim or config.stash[DEPLOYMENTS] else 1


def paired(config: pytest.Config) -> bool:
    """``--perf-max-launches``: the run is a paired deploy comparison of two deployments."""
    return bool(kimi_options(config).perf_max_launches) and len(config.stash[DEPLOYMENTS]) == 2


def racing(config: pytest.Config) -> bool:
    """``--perf-race``: the session's launches are a race's first round."""
    return kimi_options(config).perf_race and len(config.stash[DEPLOYMENTS]) >= 2


def measured_only(config: pytest.Config) -> bool:
    """A launch is measured, not judged on its own: the deploy gate or the race judges the
    launches together (no baseline, no same-run reference)."""
    return paired(config) or racing(config)


def is_worker(config: pytest.Config) -> bool:
    """An xdist worker: it measures, the controller reports."""
    return hasattr(config, "workerinput")
