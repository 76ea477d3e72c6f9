"""The figures peers report, in the reports: one row per level.

The JSON carries every statistic (:mod:`pytest_kimi.measure.peer_figures`); the Markdown and
HTML reports show a compact table of them (p50/p90/p99 and the mean of TTFT, ITL, TPOT and
E2E, requests/s, input and total tok/s), and the terminal the most important few that fit its
width: a column that does not fit is dropped, least important first, rather than wrapped (a
wrapped table reads as garbage in a CI log).
"""

from __future__ import annotations

import html
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pytest_kimi.wire import LevelEntry, TestEntry

MIN_WIDTH = 40
"""Below this pytest's terminal writer assumes a broken size report and uses 80; so do we."""


def terminal_width() -> int:
    """The terminal's width as pytest's terminal writer takes it (``COLUMNS``, else the
    terminal's size, else 80), so the summary's lines match its separators."""
    width = shutil.get_terminal_size(fallback=(80, 24)).columns
    return width if width >= MIN_WIDTH else 80


def has_peer(levels: Sequence[LevelEntry]) -> bool:
    """Whether any level carries the peer figures (a report saved before them does not)."""
    return any(isinstance(lv.get("peer_counts"), Mapping) for lv in levels)


def _label(lv: LevelEntry) -> str:
    label = str(lv.get("label") or f"C={lv.get('concurrency', '?')}")
    return f"{lv['profile']} {label}" if lv.get("profile") else label


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x * 1e3:.4g}"


def _s(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def _rate(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}" if x < 100 else f"{x:.0f}"


_UNIT: dict[str, Callable[[Any], str]] = {
    "ttft_s": _ms,
    "itl_s": _ms,
    "tpot_s": _ms,
    "e2e_s": _s,
}
_NAME = {"ttft_s": "TTFT", "itl_s": "ITL", "tpot_s": "TPOT", "e2e_s": "E2E"}


def _stat_cell(name: str, stat: str) -> Callable[[LevelEntry], str]:
    return lambda lv: _UNIT[name](lv.get(f"{name}_{stat}"))


def _summary_cell(name: str) -> Callable[[LevelEntry], str]:
    """``12.1/15.3/20.4 (13.0)``: p50/p90/p99 and the mean."""
    fmt = _UNIT[name]

    def cell(lv: LevelEntry) -> str:
        if lv.get(f"{name}_p50") is None:
            return "-"
        tail = "/".join(fmt(lv.get(f"{name}_{q}")) for q in ("p50", "p90", "p99"))
        return f"{tail} ({fmt(lv.get(f'{name}_mean'))})"

    return cell


def _unit(name: str) -> str:
    return "s" if name == "e2e_s" else "ms"


@dataclass(frozen=True, slots=True)
class PeerColumn:
    header: str
    value: Callable[[LevelEntry], str]
    rank: int
    """Importance in the terminal: 0 is never dropped; the highest goes first."""


RATE_COLUMNS = [
    PeerColumn("req/s", lambda lv: _rate(lv.get("requests_per_s")), 1),
    PeerColumn("input tok/s", lambda lv: _rate(lv.get("input_tok_s")), 9),
    PeerColumn("total tok/s", lambda lv: _rate(lv.get("total_tok_s")), 8),
]

TERMINAL_COLUMNS: list[PeerColumn] = [
    PeerColumn("level", _label, 0),
    PeerColumn("TTFT p50 ms", _stat_cell("ttft_s", "p50"), 2),
    PeerColumn("TTFT p99 ms", _stat_cell("ttft_s", "p99"), 3),
    PeerColumn("ITL p50 ms", _stat_cell("itl_s", "p50"), 4),
    PeerColumn("ITL p99 ms", _stat_cell("itl_s", "p99"), 5),
    PeerColumn("TPOT p50 ms", _stat_cell("tpot_s", "p50"), 6),
    PeerColumn("E2E p50 s", _stat_cell("e2e_s", "p50"), 7),
    PeerColumn("E2E p99 s", _stat_cell("e2e_s", "p99"), 10),
    PeerColumn("TTFT mean ms", _stat_cell("ttft_s", "mean"), 11),
    PeerColumn("TPOT p99 ms", _stat_cell("tpot_s", "p99"), 12),
    RATE_COLUMNS[0],
    RATE_COLUMNS[2],
    RATE_COLUMNS[1],
]
"""The terminal's columns in their order; ``rank`` decides which go when it is narrow (at 80
columns: the level, TTFT p50/p99, ITL p50/p99 and requests/s)."""

TABLE_COLUMNS: list[PeerColumn] = [
    PeerColumn("level", _label, 0),
    *(
        PeerColumn(f"{_NAME[n]} {_unit(n)} p50/p90/p99 (mean)", _summary_cell(n), 1)
        for n in ("ttft_s", "itl_s", "tpot_s", "e2e_s")
    ),
    *RATE_COLUMNS,
]
"""The Markdown and HTML table: every latency's p50/p90/p99 and mean in one cell, the rates."""

TITLE = (
    "peer figures (as vllm bench serve / GuideLLM report them; TPOT = (e2e - ttft) / "
    "(tokens - 1); rates over the steady-state windows, like tok/s)"
)


def _rows(
    levels: Sequence[LevelEntry], columns: Sequence[PeerColumn]
) -> tuple[list[str], list[list[str]]]:
    shown = [lv for lv in levels if isinstance(lv.get("peer_counts"), Mapping)]
    return [c.header for c in columns], [[c.value(lv) for c in columns] for lv in shown]


def fit_columns(levels: Sequence[LevelEntry], width: int, indent: int = 0) -> list[PeerColumn]:
    """The terminal's columns that fit ``width`` (less ``indent``), least important dropped
    first; the level's label always stays."""
    columns = list(TERMINAL_COLUMNS)
    while len(columns) > 1:
        header, rows = _rows(levels, columns)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        if indent + sum(widths) + 2 * (len(widths) - 1) <= width:
            break
        columns.remove(max(columns, key=lambda c: c.rank))
    return columns


def peer_lines(test: TestEntry, width: int | None = None, indent: int = 2) -> list[str]:
    """The terminal's peer table, every line at most ``width`` (default: the terminal's)
    including the ``indent`` the caller adds; empty when no level carries the figures."""
    levels = list(test.get("levels") or [])
    if not has_peer(levels):
        return []
    width = terminal_width() if width is None else width
    columns = fit_columns(levels, width, indent + 2)
    header, rows = _rows(levels, columns)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    title = "peer figures:" if len(TITLE) + 1 + indent > width else TITLE + ":"
    lines = [title[: max(width - indent, 1)]]
    for row in [header, *rows]:
        line = "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths))
        lines.append(line[: max(width - indent, 1)])  # a label longer than the terminal
    return lines


def peer_markdown(test: TestEntry, cell: Any, text: Any) -> list[str]:
    """The Markdown table (``cell``/``text``: the summary's escaping), a blank line first."""
    levels = list(test.get("levels") or [])
    if not has_peer(levels):
        return []
    header, rows = _rows(levels, TABLE_COLUMNS)
    out = ["", f"*{text(TITLE)}*", ""]
    out.append("| " + " | ".join(cell(h) for h in header) + " |")
    out.append("|:---|" + "---:|" * (len(header) - 1))
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def peer_html(test: TestEntry) -> str:
    """The HTML table; empty when no level carries the figures."""
    levels = list(test.get("levels") or [])
    if not has_peer(levels):
        return ""
    e = html.escape
    header, rows = _rows(levels, TABLE_COLUMNS)
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f'<p class="peer"><b>{e(TITLE)}</b></p>\n'
        f'<table class="peer"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )
