"""``--perf-json``: the one machine-readable record of a run; other reports read this shape."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kimi import __version__
from pytest_kimi.files import write_atomic
from pytest_kimi.wire import EndpointEntry, GateEntry, Report, SessionNoiseSection, TestEntry

SCHEMA_VERSION = 1


def build_report(
    endpoint: Mapping[str, Any] | None,
    tests: list[TestEntry],
    session_noise: SessionNoiseSection | None = None,
    gate: GateEntry | None = None,
    *,
    interrupted: str | None = None,
) -> Report:
    """The report dict; ``session_noise`` (``--perf-sessions``, see
    :func:`pytest_kimi.run.server_starts.session_noise`) only when there is one; ``gate``:
    the settings the verdicts were judged by, the session noise and its source among them;
    ``interrupted``: what stopped the run before its end (a signal), when something did."""
    report: Report = {
        "schema": SCHEMA_VERSION,
        "plugin_version": __version__,
        "status": run_status(tests, interrupted=interrupted is not None),
        "endpoint": endpoint_entry(endpoint),
        "tests": tests,
    }
    if interrupted is not None:
        report["interrupted"] = interrupted
    if gate is not None:
        report["gate"] = gate
    if session_noise is not None:
        report["session_noise"] = session_noise
    return report


def endpoint_entry(endpoint: Mapping[str, Any] | None) -> EndpointEntry:
    """The report's ``endpoint`` from the plugin's (``Endpoint.public``): its URL, model and
    server info, each where it is known (an empty object without an endpoint)."""
    out: EndpointEntry = {}
    if endpoint:
        if "url" in endpoint:
            out["url"] = endpoint["url"]
        if "model" in endpoint:
            out["model"] = endpoint["model"]
        if "server_info" in endpoint:
            out["server_info"] = endpoint["server_info"]
    return out


def run_status(tests: Sequence[TestEntry], *, interrupted: bool = False) -> str:
    """The run's one word, every report's headline: ``interrupted``, ``failed``, ``passed`` or
    ``no-tests``.

    An interrupted run is never ``passed``, even when every test it finished passed: a
    cancelled CI job appends this summary, and an operator gating on it must not read a
    stopped run as a green one.  The run counts as interrupted when the session says so
    (``interrupted``: also between two tests) or a test was stopped mid-measurement.
    """
    outcomes = {t.get("outcome") for t in tests}
    if interrupted or "interrupted" in outcomes:
        return "interrupted"
    if outcomes & {"failed", "error"}:
        return "failed"
    return "passed" if tests else "no-tests"


def write_json(path: Path, report: Report) -> None:
    write_text(path, json.dumps(report, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """Atomic: a reader never sees half a report, an interrupted run never leaves one."""
    write_atomic(path, text)
