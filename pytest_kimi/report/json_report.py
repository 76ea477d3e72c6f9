"""``--perf-json``: the one machine-readable record of a run; other reports read this shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_kimi import __version__
from pytest_kimi.files import write_atomic

SCHEMA_VERSION = 1


def build_report(
    endpoint: dict[str, Any] | None,
    tests: list[dict[str, Any]],
    session_noise: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report dict; ``session_noise`` (``--perf-sessions``, see
    :func:`pytest_kimi.run.server_starts.session_noise`) only when there is one."""
    report = {
        "schema": SCHEMA_VERSION,
        "plugin_version": __version__,
        "endpoint": endpoint or {},
        "tests": tests,
    }
    if session_noise is not None:
        report["session_noise"] = session_noise
    return report


def write_json(path: Path, report: dict[str, Any]) -> None:
    write_text(path, json.dumps(report, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """Atomic: a reader never sees half a report, an interrupted run never leaves one."""
    write_atomic(path, text)
