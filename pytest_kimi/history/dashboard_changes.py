"""Change points as the dashboard draws them: read off whatever object the detector gave.

Why a module of its own: the detector (:mod:`pytest_kimi.history.changes`, Apache Otava) is
optional and its objects may gain or lose fields between versions, so everything the
dashboard reads of a change point goes through :class:`ChangeLike` and the tolerant
``getattr`` readers here, once, for the charts and the run pages alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Protocol

from pytest_kimi.history.dashboard_cells import _num, _pct
from pytest_kimi.history.model import RunInfo
from pytest_kimi.report.svg import tok as _tok


class ChangeLike(Protocol):
    """What the dashboard reads of a change point (:class:`pytest_kimi.history.changes.Change`).

    Read-only properties, so a frozen dataclass matches.  Optional attributes (``time``,
    ``commit``, the uncertainty and the changed provenance fields) are read with ``getattr``,
    so a change point from an older or newer detector still draws.
    """

    @property
    def test(self) -> str: ...
    @property
    def level(self) -> str: ...
    @property
    def deployment(self) -> str | None: ...
    @property
    def run(self) -> int: ...
    @property
    def change_pct(self) -> float: ...
    @property
    def before_tok_s(self) -> float: ...
    @property
    def after_tok_s(self) -> float: ...


# ------------------------------------------------------------------------------- changes


@dataclass(frozen=True, slots=True)
class _Mark:
    """One change point, read off whatever object the detector gave."""

    run: int
    change_pct: float | None
    before: float | None
    after: float | None
    time: datetime | None
    commit: str | None
    uncertainty: str | None
    changed: tuple[str, ...]
    unit: str = "tok/s"

    @property
    def label(self) -> str:
        arrow = "▼" if (self.change_pct or 0) < 0 else "▲"
        return f"{arrow} {_pct(self.change_pct)} at run {self.run}"

    def detail(self) -> str:
        """The step in numbers (the label already gives its size), its uncertainty and the
        provenance that changed with it: the first thing to check for a cause."""
        text = f"{_tok(self.before)} → {_tok(self.after)} {self.unit}"
        if self.uncertainty:
            text += f" ({self.uncertainty})"
        if self.changed:
            text += "; changed: " + "; ".join(self.changed)
        return text


def _uncertainty(change: Any) -> str | None:
    """The detector's uncertainty of the step as text: its interval (``ci_pct`` with
    ``ci_level``: ``90% CI -17.1% to -12.8%``), or a ± percentage from a detector that gives one."""
    ci = getattr(change, "ci_pct", None)
    if isinstance(ci, (tuple, list)) and len(ci) == 2:
        lo, hi = _num(ci[0]), _num(ci[1])
        if lo is not None and hi is not None:
            level = _num(getattr(change, "ci_level", None))
            name = f"{level:.0%} CI" if level is not None and 0 < level < 1 else "CI"
            return f"{name} {lo:+.1f}% to {hi:+.1f}%"
    for name in ("uncertainty_pct", "uncertainty"):
        value = getattr(change, name, None)
        number = _num(value)
        if number is not None:
            return f"±{abs(number):.1f}%"
        if isinstance(value, str) and value:
            return value
    return None


def _changed_fields(change: Any) -> tuple[str, ...]:
    """The provenance fields that changed at the change point, as ``field: old -> new``."""
    for name in ("provenance_changes", "changed", "changed_fields"):
        value = getattr(change, name, None)
        if isinstance(value, Mapping):
            out = []
            for key, diff in value.items():
                if isinstance(diff, (tuple, list)) and len(diff) == 2:
                    out.append(f"{key}: {diff[0]} -> {diff[1]}")
                else:
                    out.append(f"{key}: {diff}")
            return tuple(out)
        if isinstance(value, (list, tuple)):
            return tuple(str(v) for v in value)
        if isinstance(value, str) and value:
            return (value,)
    return ()


def _mark(change: Any) -> _Mark | None:
    run = getattr(change, "run", None)
    if isinstance(run, RunInfo):  # a detector that hands the run itself
        run = run.id
    if isinstance(run, bool) or not isinstance(run, int):
        return None
    when = getattr(change, "time", None)
    commit = getattr(change, "commit", None)
    return _Mark(
        run=run,
        change_pct=_num(getattr(change, "change_pct", None)),
        before=_num(getattr(change, "before_tok_s", None)),
        after=_num(getattr(change, "after_tok_s", None)),
        time=when if isinstance(when, datetime) else None,
        commit=str(commit) if commit else None,
        uncertainty=_uncertainty(change),
        changed=_changed_fields(change),
        unit=str(getattr(change, "unit", None) or "tok/s"),
    )


def _series_key(test: Any, level: Any, deployment: Any) -> tuple[str, str, str | None]:
    return (str(test), str(level), None if deployment is None else str(deployment))


def _marks_by_series(changes: Iterable[Any]) -> dict[tuple[str, str, str | None], list[_Mark]]:
    out: dict[tuple[str, str, str | None], list[_Mark]] = {}
    for change in changes:
        mark = _mark(change)
        if mark is None:
            continue
        key = _series_key(
            getattr(change, "test", ""),
            getattr(change, "level", ""),
            getattr(change, "deployment", None),
        )
        out.setdefault(key, []).append(mark)
    return out
