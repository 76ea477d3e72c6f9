"""The dashboard's vocabulary for one point: its figure as text, its verdict's marker.

Why a module of its own: the index's charts and tables and the run pages all write a point
the same way (the "vs baseline (90% CI)" cell, a capacity as ``C=40``, a verdict as a shape
and a word), so they share these small functions rather than each growing its own.

Colours are the Okabe-Ito palette of the chart kit (:mod:`pytest_kimi.report.svg`), and no
meaning rests on colour alone: every verdict has a shape and a word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from pytest_kimi.history.model import CAPACITY, LevelSeries, Point
from pytest_kimi.report import svg
from pytest_kimi.report.htmlkit import e as _e
from pytest_kimi.report.svg import tok as _tok
from pytest_kimi.verdicts import Verdict

RUNS_DIR = "runs"

# the kit's Okabe-Ito palette: distinguishable with protanopia, deuteranopia and tritanopia
BLUE = svg.BLUE
"""The run figure's line and a passing run's marker."""
SKY = svg.SKY
"""Trial dots."""
GREEN = svg.GREEN
"""``improved``."""
ORANGE = svg.ORANGE
"""Warnings (``underpowered``, ``inconclusive``)."""
VERMILLION = svg.VERMILLION
"""Verdicts that fail a run."""
PURPLE = svg.PURPLE
"""Change points, and nothing else: a page without a change point has no pixel of it."""
GREY = svg.GREY
BAND = svg.BAND

# ------------------------------------------------------------------------------- helpers


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:+.1f}%"


def _date(when: datetime | None, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    return when.strftime(fmt) if when is not None else "–"


def _short_commit(commit: str | None) -> str:
    """Seven hex digits, ``+`` when the suite had local changes (``abc1234+dirty``)."""
    if not commit:
        return ""
    return commit[:7] + ("+" if commit.endswith("+dirty") else "")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _safe_href(url: Any) -> str | None:
    """A URL fit for ``href``: only http(s), so a stored ``javascript:`` URL never runs."""
    if not isinstance(url, str):
        return None
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        return None
    return url if scheme in ("http", "https") else None


def _unbounded(value: float | None, sign: str) -> str:
    return f"{sign}∞" if value is None or not math.isfinite(value) else f"{value:+.1f}%"


def _has_baseline(p: Point) -> bool:
    """Whether the point had a baseline to be compared with (a capacity's may be a bound)."""
    c = p.capacity
    if c is not None:
        return any(x is not None for x in (c.baseline, c.baseline_high, c.baseline_estimate))
    return p.baseline_tok_s is not None


def vs_baseline(p: Point | None) -> str:
    """The "vs baseline (90% CI)" cell: ``-9.8% (-12.6% .. -6.9%)``; ``no-baseline`` for a point
    that had no baseline; ``–`` for one that had a baseline but no change (nothing valid to
    compare)."""
    if p is None:
        return "–"
    if p.change_pct is None or not math.isfinite(p.change_pct):
        return "–" if _has_baseline(p) else "no-baseline"
    text = f"{p.change_pct:+.1f}%"
    if p.ci90 is not None:
        lo, hi = p.ci90
        text += f" ({_unbounded(lo, '−')} .. {_unbounded(hi, '+')})"
    return text


def _vs_cell(p: Point | None) -> str:
    """The "vs baseline" ``<td>``: the change and its interval each kept on one line, so a
    narrow column breaks between them and never inside a number."""
    change, _, ci = vs_baseline(p).partition(" (")
    parts = [f'<span style="white-space:nowrap">{_e(change)}</span>']
    if ci:
        parts.append(f'<span style="white-space:nowrap">({_e(ci)}</span>')
    return f'<td class="num vs">{" ".join(parts)}</td>'


def _load(series: LevelSeries | None, value: float | None) -> str:
    """A capacity as its reports write it (``C=40``, ``rate=2.5/s``); tok/s otherwise."""
    if value is None or not math.isfinite(value):
        return "–"
    if series is None or series.kind != CAPACITY:
        return _tok(value)
    if series.metric == "rate":
        return f"rate={value:.4g}/s"
    return f"C={value:.4g}"


def _num_text(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _bracket(p: Point) -> str:
    """``[29..31]``: the search's bracket, ``[128..)`` when the top held, ``(..4)`` when the
    bottom broke."""
    c = p.capacity
    if c is None:
        return "–"
    lo = "" if c.low is None else f"{c.low:.4g}"
    hi = "" if c.high is None else f"{c.high:.4g}"
    return f"{'[' if lo else '('}{lo}..{hi}{']' if hi else ')'}"


def _plotted(p: Point) -> float | None:
    """Where a point's marker sits: tok/s or the capacity; a capacity known only to be below
    ``high`` (the bottom of the range broke) at ``high``, the bound it is below."""
    c = p.capacity
    if c is not None:
        return c.value if c.value is not None else c.high
    return p.tok_s


def _baseline_of(p: Point) -> float | None:
    """The baseline drawn for a point: tok/s, or the baseline capacity's compared boundary."""
    return p.capacity.baseline_compared if p.capacity is not None else p.baseline_tok_s


def run_page_name(run_id: int) -> str:
    """The run page's path relative to the site root (``runs/12.html``): ids are ints from the
    store, so the name needs no escaping, and a link can never leave the site."""
    return f"{RUNS_DIR}/{int(run_id)}.html"


# ------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class _Style:
    """How a verdict is drawn: its shape says it without colour."""

    name: str
    shape: str
    colour: str
    label: str


_STYLES = {
    "pass": _Style("pass", "circle", BLUE, "pass"),
    "no-baseline": _Style("no-baseline", "ring", BLUE, "no baseline"),
    "improved": _Style("improved", "up", GREEN, "improved"),
    "warning": _Style("warning", "diamond", ORANGE, "warning (underpowered, inconclusive)"),
    "failing": _Style("failing", "down", VERMILLION, "fails the run"),
    "other": _Style("other", "square", GREY, "not run / unknown"),
    "none": _Style("none", "cross", VERMILLION, "no valid figure"),
    # a capacity search's probes (run pages only): which side of the ceilings a load fell on,
    # not a verdict on the deployment, so neither pass's colour nor a failing one
    "held": _Style("held", "circle", GREY, "probe held the ceilings"),
    "broke": _Style("broke", "down", GREY, "probe broke a ceiling"),
}


def _style(point: Point) -> _Style:
    if _plotted(point) is None:
        return _STYLES["none"]
    verdict = Verdict.of(point.verdict)
    if verdict is None or verdict is Verdict.NOT_RUN:
        return _STYLES["other"]
    if verdict.fails():
        return _STYLES["failing"]
    if verdict is Verdict.IMPROVED:
        return _STYLES["improved"]
    if verdict is Verdict.NO_BASELINE:
        return _STYLES["no-baseline"]
    if verdict.warning:
        return _STYLES["warning"]
    return _STYLES["pass"]


def _shape(style: _Style, x: float, y: float, size: float = 5.0) -> str:
    """The verdict's marker centred on (x, y) (the kit's shapes)."""
    return svg.shape(style.shape, style.colour, x, y, size)


def _glyph(style: _Style) -> str:
    """The marker as a small inline icon, for legends and tables."""
    return svg.marker_glyph(style.shape, style.colour)


def _verdict_html(point: Point | None) -> str:
    if point is None:
        return "–"
    style = _style(point)
    word = point.verdict or ("no figure" if _plotted(point) is None else "–")
    return f'<span class="verdict m-{style.name}">{_glyph(style)} {_e(word)}</span>'
