"""A test's latency in the reports: TTFT and ITL at p50 and pNN, measured, target, baseline.

Every renderer reads the levels' ``latency`` sections (:mod:`pytest_kimi.measure.latency`, filled
by :mod:`pytest_kimi.gate.latency_gate`), so the terminal, the failure message, the Markdown
summary and the HTML page show the same table: one row per level, one column per figure,
each cell the level's figure, its ceiling where the marker sets one, and the baseline's with
the change; then why a level's latency was not compared (an old baseline, none at all).
Before this a test gated on ``max_ttft_s`` showed no TTFT at its percentile unless it failed.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from pytest_kimi.wire import LatencyEntry, LatencyFigureEntry, LevelEntry, TestEntry

NAMES = {"ttft_s": "TTFT", "itl_s": "ITL"}
_MS = {"itl_s"}
"""Shown in milliseconds (as the main table's ITL column), the others in seconds."""


def has_latency(levels: Sequence[LevelEntry]) -> bool:
    return any(isinstance(lv.get("latency"), Mapping) for lv in levels)


def _names(levels: Sequence[LevelEntry]) -> list[str]:
    """The figures any level carries, in the sections' order (``ttft_s_p50``, ``ttft_s_p95``...)."""
    names: list[str] = []
    for lv in levels:
        section = lv.get("latency")
        if isinstance(section, Mapping):
            for name in section.get("figures") or {}:
                if name not in names:
                    names.append(name)
    return names


def _header(name: str) -> str:
    kind, _, stat = name.rpartition("_")
    return f"{NAMES.get(kind, kind)} {stat} {'ms' if kind in _MS else 's'}"


def _value(x: Any, kind: str) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.4g}" if kind in _MS else f"{x:.4g}"


def figure_cell(name: str, figure: LatencyFigureEntry | None) -> str:
    """``0.0735 (max 0.1) vs 0.0261 +158.9% REGRESSION``: measured, ceiling, baseline, change."""
    if not isinstance(figure, Mapping):
        return "-"
    kind = name.rpartition("_")[0]
    out = _value(figure.get("value"), kind)
    if figure.get("target") is not None:
        out += f" (max {_value(figure['target'], kind)})"
    if figure.get("baseline") is not None:
        out += f" vs {_value(figure['baseline'], kind)}"
        change = figure.get("change_pct")
        if change is not None:
            out += f" {change:+.1f}%"
    if figure.get("verdict") == "regression":
        out += " REGRESSION"
    return out


def verdict_cell(section: LatencyEntry) -> str:
    """``regression (TTFT p95)``, ``pass`` or ``not compared``."""
    figures = section.get("figures") or {}
    slow = [
        f"{NAMES.get(n.rpartition('_')[0], n)} {n.rpartition('_')[2]}"
        for n, f in figures.items()
        if isinstance(f, Mapping) and f.get("verdict") == "regression"
    ]
    if slow:
        return f"regression ({', '.join(slow)})"
    return "pass" if section.get("compared") else "not compared"


def latency_table(levels: Sequence[LevelEntry]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the levels that carry a latency section; plain text, unescaped."""
    names = _names(levels)
    header = ["level", *(_header(n) for n in names), "latency vs baseline"]
    rows = []
    for lv in levels:
        section = lv.get("latency")
        if not isinstance(section, Mapping):
            continue
        figures = section.get("figures") or {}
        label = str(lv.get("label") or f"C={lv.get('concurrency', '?')}")
        if lv.get("profile"):
            label = f"{lv['profile']} {label}"
        rows.append(
            [label, *(figure_cell(n, figures.get(n)) for n in names), verdict_cell(section)]
        )
    return header, rows


def latency_title(levels: Sequence[LevelEntry]) -> str:
    """``Latency (measured vs baseline, tolerance +25%)``: what the table compares."""
    tolerances = {
        lv["latency"].get("tolerance_pct")
        for lv in levels
        if isinstance(lv.get("latency"), Mapping) and lv["latency"].get("tolerance_pct") is not None
    }
    tol = f"; tolerance +{next(iter(tolerances)):g}% slower" if len(tolerances) == 1 else ""
    return f"latency: measured (max: the marker's ceiling) vs baseline, change per trial{tol}"


def latency_notes(levels: Sequence[LevelEntry]) -> list[str]:
    """Why latency was not compared, once per distinct reason with the levels it concerns."""
    by_note: dict[str, list[str]] = {}
    for lv in levels:
        section = lv.get("latency")
        if isinstance(section, Mapping) and section.get("note"):
            label = str(lv.get("label") or f"C={lv.get('concurrency', '?')}")
            by_note.setdefault(str(section["note"]), []).append(label)
    return [f"{', '.join(labels)}: {note}" for note, labels in by_note.items()]


def latency_lines(test: TestEntry) -> list[str]:
    """The terminal's (and a failure message's) latency table and notes; empty without one."""
    levels = list(test.get("levels") or [])
    if not has_latency(levels):
        return []
    header, rows = latency_table(levels)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [latency_title(levels) + ":"]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(header, widths))]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines += [f"  note: {note}" for note in latency_notes(levels)]
    return lines


def latency_markdown(test: TestEntry, cell: Any, text: Any) -> list[str]:
    """The Markdown table (``cell``/``text``: the summary's escaping), with a blank line first."""
    levels = list(test.get("levels") or [])
    if not has_latency(levels):
        return []
    header, rows = latency_table(levels)
    out = ["", f"*{text(latency_title(levels))}*", ""]
    out.append("| " + " | ".join(cell(h) for h in header) + " |")
    out.append("|:---|" + "---:|" * (len(header) - 2) + ":---|")
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    notes = latency_notes(levels)
    if notes:
        out += ["", *(f"- {text(n)}" for n in notes)]
    return out


def latency_html(test: TestEntry) -> str:
    """The HTML table and notes; empty without a latency section."""
    levels = list(test.get("levels") or [])
    if not has_latency(levels):
        return ""
    e = html.escape
    header, rows = latency_table(levels)
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    parts = [
        f'<p class="latency"><b>{e(latency_title(levels))}</b></p>',
        f'<table class="latency"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
    ]
    notes = latency_notes(levels)
    if notes:
        parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(parts)
