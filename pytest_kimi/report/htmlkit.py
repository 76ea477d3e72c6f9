"""The HTML kit of every page pytest-kimi writes: ``--perf-html`` / ``kimi-perf plot`` (the run
report, :mod:`pytest_kimi.report.html`) and ``kimi-perf dashboard`` (the history,
:mod:`pytest_kimi.history.dashboard`).

One stylesheet, one page shell, one escaping rule, one levels table, so the run report and the
dashboard's run pages look alike and a fix to one is a fix to both.  The pages are read as CI
artifacts, downloaded and opened from ``file://`` where the runner's network is out of reach,
so the shell loads nothing: no scripts, no fonts, no external stylesheet; the CSS is inline in
every page, and charts are inline SVG (:mod:`pytest_kimi.report.svg`, styled by
:data:`CHART_CSS`, which is part of :data:`CSS`).

Everything shown comes from user-controlled strings (test ids, provenance, branch names, error
texts), so every one goes through :func:`e`.

Layering: :mod:`pytest_kimi.history` imports this module, never the reverse.  No pytest, no
numpy: a page is strings.
"""

from __future__ import annotations

import hashlib
import html
import re
from typing import Any, Callable, Sequence

from pytest_kimi.report.markdown import is_warning, summary_columns
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import LevelEntry

FONT = 'system-ui,-apple-system,"Segoe UI",sans-serif'

CHART_CSS = (
    "svg.chart{max-width:100%;height:auto;display:block}"
    "svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axis{stroke:#888;stroke-width:1}"
    f"svg text{{font-family:{FONT}}}svg text:where(:not([fill])){{fill:#333}}"
    "svg .ytick,svg .yunit{font-size:11px;text-anchor:end}svg .yunit{font-weight:600}"
    "svg .xtick{font-size:10px;text-anchor:middle}"
    "svg .commit{font-family:ui-monospace,monospace;fill:#666}"
    "svg .ctitle{font-size:13px;font-weight:600}svg .csub{font-size:12px;fill:#555}"
    "svg .axlabel{font-size:12px;text-anchor:middle}svg .ltext{font-size:11px}"
    "svg .note{font-size:10px;font-weight:700}svg .plabel{font-size:10px}"
    "svg .band{fill:#BBBBBB;fill-opacity:.45;shape-rendering:crispEdges}"
    "svg .base{stroke:#6E6E6E;stroke-width:1.5;stroke-dasharray:5 4}"
    "svg .dash{fill:none;stroke-width:1.6;stroke-dasharray:5 4}"
    "svg .figure{fill:none;stroke:#0072B2;stroke-width:2;stroke-linejoin:round}"
    "svg .series{fill:none;stroke-width:2;stroke-linejoin:round}"
    "svg .change{stroke:#CC79A7;stroke-width:3}"
    "svg .level{stroke:#CC79A7;stroke-width:1.5;stroke-dasharray:6 4}"
    "svg .clabel{font-size:12px;font-weight:700;fill:#000}"
    "svg .hit{fill:#fff;fill-opacity:0}"
    "svg a.run:hover .hit,svg a.run:focus .hit{fill:#0072B2;fill-opacity:.15}"
    "svg .empty{font-size:14px;text-anchor:middle;fill:#777}"
)
"""The charts' rules: inline SVG takes them from the page; a chart written as its own ``.svg``
file carries them in a ``<style>`` of its own (:func:`pytest_kimi.report.svg.standalone`).
Colours that differ per series are presentation attributes, never rules here."""

CSS = (
    f"body{{font-family:{FONT};margin:1.5rem auto;max-width:1000px;"
    "padding:0 1rem;color:#222;line-height:1.4}\n"
    "h1{font-size:1.5rem;margin:0 0 .3rem}h2{font-size:1.05rem;margin:2rem 0 .3rem;"
    "border-top:1px solid #ddd;padding-top:.9rem}h2 .lvl{font-weight:700}"
    "h2 .dep{font-weight:400;color:#555}h3{font-size:1rem;margin:1.4rem 0 .2rem}\n"
    "code{background:#f3f3f3;padding:0 .25em;border-radius:3px}a{color:#0b4f8a}\n"
    "table{border-collapse:collapse;margin:.6rem 0;font-size:.88rem}"
    "th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}th{background:#f3f3f3}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
    ".meta{color:#555}p.legend{font-size:.8rem;color:#333;margin:.2rem 0}"
    "p.legend span{margin-right:1rem;white-space:nowrap}"
    ".glyph{vertical-align:-2px;margin-right:.25rem}\n"
    # a run's status, and a verdict as a table cell (the run report)
    ".status{font-weight:700;padding:.1rem .5rem;border-radius:4px;color:#fff}"
    ".s-failed,.v-failing{background:#c62828;color:#fff}.s-passed{background:#2e7d32}"
    ".s-none{background:#777}.s-interrupted{background:#e65100}"
    ".v-failing{font-weight:700}.v-warning{background:#fff3cd}"
    ".v-improved{background:#e3f2e3}\n"
    # a verdict as its chart marker and word (the dashboard)
    ".verdict{white-space:nowrap}.m-failing,.m-none{font-weight:700}"
    "tr.attention td:first-child{box-shadow:inset 4px 0 0 #D55E00}\n"
    "p.changes{background:#fff8e1;padding:.4rem .6rem;border-left:4px solid #f0ad4e}"
    "ul.changes{font-size:.88rem;margin:.3rem 0}\n"
    "figure{margin:1rem 0}figcaption{color:#555;font-size:.85rem}"
    "details{font-size:.88rem}summary{cursor:pointer;color:#555}\n"
    "dl.legend dt{font-weight:700;float:left;clear:left;width:8rem}dl.legend dd{margin-left:8.5rem}"
    "dl.facts{display:grid;grid-template-columns:max-content auto;gap:.15rem 1rem;margin:.6rem 0}"
    "dl.facts dt{font-weight:600}dl.facts dd{margin:0}nav{margin:.3rem 0 1rem;font-size:.9rem}"
    "nav a{margin-right:1rem}\n"
    ".outcome{font-size:.8rem;font-weight:600;padding:.05rem .45rem;border:1px solid #888;"
    "border-radius:3px;vertical-align:2px}\n" + CHART_CSS + "\n"
)
"""The one stylesheet, inline in every page."""


def e(value: Any) -> str:
    """``value`` as text in HTML or SVG, attribute values included (quotes escaped too)."""
    return html.escape(str(value), quote=True)


def safe_name(nodeid: str, max_len: int = 80) -> str:
    """A file-name stem or anchor for a test: ``tests/perf/test_x.py::test_y[c8]`` ->
    ``tests-perf-test_x-test_y-c8``.

    Only ``[A-Za-z0-9._-]`` survive, so the name is valid on every filesystem, in a URL and in
    any attribute; a long name is cut and suffixed with a hash of the nodeid so two tests never
    share a name.
    """
    stem = nodeid.replace(".py::", "::")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    stem = re.sub(r"[-.]*-[-.]*", "-", stem).strip("-.") or "test"  # "c8/../x" -> "c8-x"
    if len(stem) > max_len:
        digest = hashlib.sha1(nodeid.encode("utf-8")).hexdigest()[:8]
        stem = f"{stem[: max_len - 9].rstrip('-.')}-{digest}"
    return stem


def page(title: str, body: str) -> str:
    """A whole page: the shell, :data:`CSS` inline, ``body`` (already HTML) inside."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def verdict_class(verdict: str, failing: frozenset[str]) -> str:
    """The class of a verdict's table cell: ``v-failing`` for the verdicts that fail the run
    (``failing``: the session's set), ``v-warning``, ``v-improved``, else none."""
    if verdict in failing:
        return "v-failing"
    if is_warning(verdict):
        return "v-warning"
    if verdict == Verdict.IMPROVED:
        return "v-improved"
    return ""


def levels_table(
    levels: Sequence[LevelEntry],
    verdict_cell: Callable[[LevelEntry], str],
) -> str:
    """A test's levels as a table: the Markdown report's columns (so the HTML report, the job
    summary and the dashboard's run pages never disagree), then a verdict column whose
    ``<td>`` each page draws its own way (``verdict_cell`` gives the whole cell)."""
    cols = summary_columns(levels)
    head = "".join(f"<th>{e(c.header)}</th>" for c in cols) + "<th>verdict</th>"
    rows = "".join(
        "<tr>"
        + "".join(f'<td class="{"num" if c.numeric else ""}">{e(c.value(lv))}</td>' for c in cols)
        + verdict_cell(lv)
        + "</tr>"
        for lv in levels
    )
    return f'<table class="levels"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


__all__ = [
    "CHART_CSS",
    "CSS",
    "FONT",
    "e",
    "levels_table",
    "page",
    "safe_name",
    "verdict_class",
]
