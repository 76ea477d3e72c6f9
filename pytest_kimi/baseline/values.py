"""How a baseline spells a value: the absent marker, numbers, a value as text, a timestamp.

Shared by the data model (:mod:`pytest_kimi.baseline.model`: workload keys, their messages),
the provenance (:mod:`pytest_kimi.baseline.provenance`: what changed, ``recorded_at``), the
file format (:mod:`pytest_kimi.baseline.yaml_io`) and the update summary
(:mod:`pytest_kimi.baseline.review`), so every one of them says "unset", ``true`` or
``2026-11-29T08:00:00Z`` the same way.  It sits below all of them and imports none: the model
holds provenance and provenance spells values, so these helpers cannot live in either without a
circle.  No pytest, no I/O.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

__all__ = ["ABSENT", "is_number", "scalar_text", "utc_timestamp"]

ABSENT: Any = type("_AbsentType", (), {"__repr__": lambda self: "<absent>"})()
"""A field on one side of a comparison only (a change from or to nothing, not to ``None``)."""


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` but not a ``bool`` (``true`` is never the number 1 here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalar_text(value: Any) -> str:
    """A value as a reviewer reads it in YAML: ``true``, ``null``, ``512``, ``builtin:diverse``."""
    if value is ABSENT:
        return "(absent)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if is_number(value):
        return repr(value)
    return json.dumps(value, sort_keys=True, default=str)


def utc_timestamp(when: _dt.datetime | None = None) -> str:
    """``2026-11-29T08:00:00Z``: second resolution, UTC, the form written to ``recorded_at``."""
    when = when or _dt.datetime.now(_dt.timezone.utc)
    if when.tzinfo is not None:
        when = when.astimezone(_dt.timezone.utc)
    return when.replace(tzinfo=None, microsecond=0).isoformat() + "Z"
