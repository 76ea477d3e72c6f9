"""Report cells and lines for the workload shapes: open-loop rates (ramps) and conversations.

Shared by the terminal table, the Markdown summary and (through its columns) the HTML report;
they read the ``--perf-json`` level shape only.

* An open-loop level (a step of a ``rate=ramp(...)``, or any ``rate=``) shows the rate offered,
  the rate the client sent at and the rate the server completed requests at, in requests per
  second of the server's clock: ``8/7.98/5.1``.  Sent below offered means the client fell
  behind its schedule; completed below offered means the server did (its queue grows).
* A multi-turn level gets one line with the mean prompt tokens and the median TTFT per turn,
  since the level's own figures mix every turn.
* An open-loop level whose window was short against its requests gets a line that says its
  figures include the server filling up (``fill_up``, :func:`pytest_kimi.measure.shapes.fill_up_note`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pytest_kimi.wire import LevelEntry

RATES_HEADER = "req/s offered/sent/done"


def _rate(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.3g}"


def rates_cell(level: LevelEntry) -> str:
    """``offered/sent/done`` requests per second of an open-loop level (``-`` otherwise)."""
    offered = level.get("offered_rate", level.get("rate"))
    if offered is None:
        return "-"
    return f"{offered:g}/{_rate(level.get('achieved_rate'))}/{_rate(level.get('completed_rate'))}"


def has_rates(levels: Sequence[LevelEntry]) -> bool:
    return any(lv.get("rate") is not None for lv in levels)


def turns_text(level: LevelEntry) -> str | None:
    """``turn 1: 25 tok, TTFT 0.120 s; turn 2: 51 tok, 0.180 s; ...`` or None."""
    turns = level.get("turns")
    if not isinstance(turns, list) or not turns:
        return None
    parts = []
    for entry in turns:
        if not isinstance(entry, Mapping):
            continue
        tokens = entry.get("prompt_tokens_mean")
        ttft = entry.get("ttft_s_p50")
        parts.append(
            f"turn {entry.get('turn')}: "
            + ("-" if tokens is None else f"{tokens:.0f}")
            + " prompt tok, TTFT p50 "
            + ("-" if ttft is None else f"{ttft:.3f} s")
        )
    return "; ".join(parts) or None


def shape_lines(levels: Sequence[LevelEntry]) -> list[str]:
    """One line per multi-turn level (``C=4 by turn: turn 1: ...``) and per open-loop level
    whose window was short against its requests (``rate=8/s note: the window ...``)."""
    out = []
    for lv in levels:
        label = lv.get("label") or f"C={lv.get('concurrency')}"
        text = turns_text(lv)
        if text is not None:
            out.append(f"{label} by turn: {text}")
        if isinstance(lv.get("fill_up"), str):
            out.append(f"{label} note: {lv['fill_up']}")
    return out
