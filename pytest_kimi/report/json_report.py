"""``--perf-json``: the one machine-readable record of a run; other reports read this shape."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .. import __version__

SCHEMA_VERSION = 1


def build_report(endpoint: dict[str, Any] | None, tests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "plugin_version": __version__,
        "endpoint": endpoint or {},
        "tests": tests,
    }


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Atomic: a reader never sees half a report, an interrupted run never leaves one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
