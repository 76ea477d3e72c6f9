"""One test as every report sees it: its typed result and its pytest outcome, as JSON.

The plugin makes a :class:`TestRecord` for each perf test's report and attaches
:meth:`TestRecord.to_json` to pytest's test report, so it survives xdist (a worker's report is
serialised to the controller); the controller's ``--perf-json`` is the list of those objects.
The JSON's shape is documented in ``docs/reference/json-report.md`` and versioned by
:data:`pytest_kimi.report.json_report.SCHEMA_VERSION`; every renderer (terminal, Markdown,
HTML, JUnit, history, dashboard, ``kimi-perf``) reads that shape, since ``kimi-perf`` renders
the same reports again from a saved file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pytest_kimi.measure.results import PERF_SESSION, ThroughputResult, workload_dict
from pytest_kimi.wire import TestEntry
from pytest_kimi.workload.workload_spec import Workload

Outcome = Literal["passed", "failed", "skipped", "error", "interrupted"]


@dataclass(slots=True)
class TestRecord:
    """A perf test for the reports: measured (``result``) or failed before measuring."""

    __test__ = False  # not a pytest test class, whatever its name

    nodeid: str
    outcome: Outcome
    workload: Workload
    result: ThroughputResult | None = None
    """None when nothing was measured (endpoint unreachable, server did not start, corrupt
    baseline); ``error`` then says why."""
    error: str | None = None
    perf_session: int | None = None
    profile: str | None = None
    """The deployment it was to measure, when nothing was measured (``result`` carries it
    otherwise): a race reads a deployment's failed start from it."""
    endpoint: dict[str, Any] | None = None
    """The endpoint (URL, model, server info) it measured; the reporter files it per deployment
    and drops it from the test's object (the report has one ``endpoint``)."""

    def to_json(self) -> TestEntry:
        if self.result is not None:
            out = self.result.to_dict()
        else:
            out = {"nodeid": self.nodeid, "workload": workload_dict(self.workload), "levels": []}
            if self.perf_session is not None:
                out[PERF_SESSION] = self.perf_session
            if self.profile is not None:
                out["profile"] = self.profile
        out["outcome"] = self.outcome
        if self.error is not None:
            out["error"] = self.error
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint
        return out
