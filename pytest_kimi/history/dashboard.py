"""``kimi-perf dashboard``: the history as a static site people open, online or from disk.

Why a static site of plain files: the dashboard is built by a CI job and read as its artifact
(downloaded, unzipped, opened from ``file://``) or published to any static host, often where
the network the runner had is out of reach.  So nothing is loaded from elsewhere: no scripts,
no fonts, no CDN, CSS inline in every page, and the plots are SVG drawn here in Python, inline
in the page.  Inline SVG (not PNGs, not a JS chart library) because a point can then *be* a
link to its run's page, hovering it shows its figures (``<title>``), text stays sharp at any
zoom, and the page needs neither matplotlib nor JavaScript.

What a chart shows, per test level (one :class:`~.model.LevelSeries`): the run's figure as a
line with one marker per run (its shape and colour say the verdict), every trial as a small dot
(the within-run scatter a reader judges a step against), the baseline the run was compared with
and the drop its tolerance allows as a grey band, and each change point as a vertical line
labelled ``▼ -15.2% at run 12``.  The x axis is run order (runs are irregular in time; a week
without runs should not look like a trend), labelled with run id, date and commit.

A ``@capacity`` test is one chart (its series has ``kind`` ``capacity``), not one per load its
search probed: the capacity per run (the highest load that held) as the line and markers, the
bracket the search ended with (``low`` held .. ``high`` broke) as a whisker, the interpolated
boundary (what the gate compares, and what change points read) as a tick on it, and the
baseline's boundary with the drop its tolerance allows as the grey band.  Its markers take the
capacity gate's verdict (``regression`` is drawn failing, whatever the probes said).  The
probes are detail on the run pages, as the run report shows them.

Every table that lists a run's figure has a "vs baseline (90% CI)" column: the change against
the baseline in percent with the gate's 90% interval (a capacity's: of the compared
boundaries), or ``no-baseline`` where the level had none to be compared with.

Accessibility: colours are the Okabe-Ito palette (distinguishable with the common colour-vision
deficiencies), and no meaning rests on colour alone: verdicts have shapes and words, change
points a line and a text label, every chart a ``<title>``/``<desc>`` and a data table.

Everything shown comes from user-controlled strings (test ids, provenance, branch names, CI
URLs), so every one goes through :func:`~pytest_kimi.report.htmlkit.e`; links are made only
from run ids (ints) and series anchors (``[A-Za-z0-9._-]``), and from a CI URL only when it is
``http(s)``.

The page shell, stylesheet, levels table and chart primitives (markers, grid, the ``<svg>``
root with its ``<title>``/``<desc>``) are the kit the run report (``--perf-html``) uses too:
:mod:`pytest_kimi.report.htmlkit` and :mod:`pytest_kimi.report.svg`.  What is drawn here is
only what a history chart has and a run report's does not: run order, change points, links.

Pure: no pytest, no database; the store (or a test) hands in the read model.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence
from urllib.parse import urlsplit

from pytest_kimi.files import write_atomic
from pytest_kimi.verdicts import Verdict
from pytest_kimi.history.model import CAPACITY, LevelSeries, Point, RunInfo
from pytest_kimi.report import svg
from pytest_kimi.report.capacity_cells import capacity_html
from pytest_kimi.report.htmlkit import e as _e
from pytest_kimi.report.htmlkit import levels_table, page, safe_name
from pytest_kimi.report.markdown import VERDICT_HELP, level_label, workload_text
from pytest_kimi.report.svg import tok as _tok

INDEX_NAME = "index.html"
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

# chart geometry, in CSS pixels (the SVG is drawn 1:1 and shrinks with the page)
_W = 960
_LEFT = 66
_RIGHT = 18
_PLOT_H = 210
_BOTTOM = 56
_LABEL_ROW = 22
_MIN_TICK_PX = 64
_COMMIT_CLASS = ' class="commit"'
_ATTENTION_CLASS = ' class="attention"'


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


# ------------------------------------------------------------------------------- charts


def _y_range(values: Sequence[float]) -> tuple[float, float, float]:
    """(low, high, tick step) of the y axis.

    Not from zero: a history's question is whether a few percent moved, which a zero-based
    axis flattens to a pixel or two.  But never narrower than 20% of the median, so run-to-run
    noise of 1% does not fill the chart and look like cliffs; the ticks are labelled, and the
    change points state their size in words.
    """
    if not values:
        return 0.0, 1.0, 0.2
    lo, hi = min(values), max(values)
    mid = statistics.median(values)
    least = 0.2 * abs(mid) if mid else 1.0
    if hi - lo < least:
        centre = (hi + lo) / 2
        lo, hi = centre - least / 2, centre + least / 2
    pad = 0.08 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    if lo < 0 <= min(values):
        lo = 0.0
    step = svg.nice_step(hi - lo)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step, step


@dataclass
class _Chart:
    """One series laid out: slot i holds point i; the x axis is run order."""

    series: LevelSeries
    marks: list[_Mark]
    anchor: str
    slots: int = 0
    lo: float = 0.0
    hi: float = 1.0
    step: float = 1.0
    top: float = 0.0
    placed: list[tuple[_Mark, int, int]] = field(default_factory=list)
    """(mark, first slot of its run, label row) for the marks whose run is in the series."""
    unplaced: list[_Mark] = field(default_factory=list)

    def __post_init__(self) -> None:
        points = self.series.points
        self.slots = len(points)
        values: list[float] = []
        for p in points:
            c = p.capacity
            own = (p.tok_s, *p.trials) if c is None else (c.value, c.low, c.high, c.estimate)
            values += [v for v in own if v is not None and math.isfinite(v)]
            base = _baseline_of(p)
            if base is not None:
                values.append(base)
                if p.tolerance_pct is not None:
                    values.append(base * (1 - p.tolerance_pct / 100))
        for m in self.marks:
            values += [v for v in (m.before, m.after) if v is not None]
        self.lo, self.hi, self.step = _y_range(values)
        first_slot: dict[int, int] = {}
        for i, p in enumerate(points):
            first_slot.setdefault(p.run.id, i)
        rows_end: list[float] = []  # right edge of the last label on each row
        for m in sorted(self.marks, key=lambda m: first_slot.get(m.run, -1)):
            slot = first_slot.get(m.run)
            if slot is None:
                self.unplaced.append(m)
                continue
            x = self.boundary(slot)
            left, right = self._label_span(m, x)
            row = next((r for r, end in enumerate(rows_end) if left > end + 8), len(rows_end))
            if row == len(rows_end):
                rows_end.append(right)
            else:
                rows_end[row] = right
            self.placed.append((m, slot, row))
        self.top = 14 + _LABEL_ROW * max(len(rows_end), 1)

    # geometry
    @property
    def height(self) -> float:
        return self.top + _PLOT_H + _BOTTOM

    @property
    def bottom(self) -> float:
        return self.top + _PLOT_H

    @property
    def slot_w(self) -> float:
        return (_W - _LEFT - _RIGHT) / max(self.slots, 1)

    def x(self, slot: float) -> float:
        return _LEFT + (slot + 0.5) * self.slot_w

    def boundary(self, slot: int) -> float:
        """Between slot-1 and slot: where a change that took effect at ``slot`` is drawn."""
        return _LEFT + slot * self.slot_w if slot > 0 else self.x(0)

    def y(self, value: float) -> float:
        frac = (value - self.lo) / (self.hi - self.lo) if self.hi > self.lo else 0.5
        return self.bottom - frac * _PLOT_H

    @staticmethod
    def _label_width(mark: _Mark) -> float:
        return 7.4 * len(mark.label) + 14

    def _label_span(self, mark: _Mark, x: float) -> tuple[float, float]:
        width = self._label_width(mark)
        if x + width > _W - _RIGHT:
            return x - width, x
        return x, x + width


def _ticks(chart: _Chart) -> list[int]:
    """Slots that get an x label: the first slot of each run, thinned to fit, always keeping
    the last run and the runs where a change point took effect."""
    points = chart.series.points
    firsts = [i for i, p in enumerate(points) if i == 0 or points[i - 1].run.id != p.run.id]
    if not firsts:
        return []
    stride = max(1, math.ceil(len(firsts) * _MIN_TICK_PX / (_W - _LEFT - _RIGHT)))
    must = {slot for _, slot, _ in chart.placed} | {firsts[-1]}
    chosen = sorted(set(firsts[::stride]) | must)
    kept: list[int] = []
    for slot in chosen:  # drop a thinned tick that would print over a must-keep one
        if kept and (chart.x(slot) - chart.x(kept[-1])) < _MIN_TICK_PX * 0.9:
            if slot in must and kept[-1] not in must:
                kept[-1] = slot
            continue
        kept.append(slot)
    return kept


def _figure_text(series: LevelSeries, p: Point) -> str:
    """A point's figure in words: ``57.5 tok/s``; ``capacity C=29 [29..31], boundary 30.48``."""
    c = p.capacity
    if c is None:
        return f"{_tok(p.tok_s)} tok/s" if p.tok_s is not None else "no valid figure"
    if c.value is None and c.high is None:
        return "capacity not found"
    if c.value is None:
        return f"capacity below {_load(series, c.high)} (the bottom of the range broke)"
    text = f"capacity {_load(series, c.value)} {_bracket(p)}"
    if c.high is None:
        text += " (the top of the range held)"
    if c.estimate is not None:
        text += f", boundary {c.estimate:.4g}"
    return text


def _point_title(p: Point, series: LevelSeries | None = None) -> str:
    """The marker's tooltip: the run and its figures, the way a reader checks a point."""
    run = p.run
    lines = [f"run {run.id} · {_date(run.time)}"]
    if run.commit:
        lines.append(
            f"commit {_short_commit(run.commit)}" + (f" ({run.branch})" if run.branch else "")
        )
    if series is not None and p.capacity is not None:
        lines.append(f"{_figure_text(series, p)} · {p.verdict or 'no verdict'}")
        c = p.capacity
        if _has_baseline(p):
            base = f"baseline {_load(series, c.baseline)} [{_num_text(c.baseline_low)}.."
            base += f"{_num_text(c.baseline_high)}]"
            if c.baseline_estimate is not None:
                base += f", boundary {c.baseline_estimate:.4g}"
            lines.append(base)
        lines.append(f"vs baseline {vs_baseline(p)}")
        if p.session is not None:
            lines.append(f"session {p.session}")
        lines.append("click: the run's search, provenance and verdicts")
        return "\n".join(lines)
    figure = f"{_tok(p.tok_s)} tok/s" if p.tok_s is not None else "no valid figure"
    lines.append(f"{figure} · {p.verdict or 'no verdict'}")
    if p.trials:
        lines.append("trials: " + ", ".join(_tok(t) for t in p.trials))
    if p.baseline_tok_s is not None:
        tol = f" (tolerance {p.tolerance_pct:g}%)" if p.tolerance_pct is not None else ""
        lines.append(f"baseline {_tok(p.baseline_tok_s)} tok/s{tol}, vs baseline {vs_baseline(p)}")
    if p.session is not None:
        lines.append(f"session {p.session}")
    lines.append("click: the run's provenance and verdicts")
    return "\n".join(lines)


def _chart_svg(chart: _Chart) -> str:
    """The chart as inline SVG: drawn back to front (grid, band, trials, line, change points,
    run markers, labels), so what a reader clicks is on top."""
    s = chart.series
    pts = s.points
    aid = chart.anchor
    out: list[str] = []
    left, right = _LEFT, _W - _RIGHT
    # grid and y axis
    out.append(svg.y_grid(chart.y, svg.ticks(chart.lo, chart.hi, chart.step), left, right, _tok))
    out.append(
        f'<text x="{left - 8}" y="{chart.top - 10:.1f}" class="yunit">{_e(s.unit)}</text>'
        f'<line x1="{left}" x2="{left}" y1="{chart.top}" y2="{chart.bottom}" class="axis"/>'
        f'<line x1="{left}" x2="{right}" y1="{chart.bottom}" y2="{chart.bottom}" class="axis"/>'
    )
    # baseline and its tolerance band, per run (a baseline can be re-recorded)
    w = chart.slot_w
    for i, p in enumerate(pts):
        base = _baseline_of(p)
        if base is None:
            continue
        x0, x1 = chart.x(i) - w / 2, chart.x(i) + w / 2
        yb = chart.y(base)
        if p.tolerance_pct is not None:
            yt = chart.y(base * (1 - p.tolerance_pct / 100))
            out.append(
                f'<rect x="{x0:.2f}" y="{yb:.1f}" width="{x1 - x0:.2f}" height="{yt - yb:.1f}" '
                f'class="band"/>'
            )
        out.append(f'<line x1="{x0:.2f}" x2="{x1:.2f}" y1="{yb:.1f}" y2="{yb:.1f}" class="base"/>')
    # x labels
    for slot in _ticks(chart):
        run = pts[slot].run
        x = chart.x(slot)
        yb = chart.bottom
        lines = [f"#{run.id}", _date(run.time, "%b %d"), _short_commit(run.commit)]
        spans = "".join(
            f'<tspan x="{x:.1f}" dy="{13 if k else 0}"{_COMMIT_CLASS if k == 2 else ""}>'
            f"{_e(text)}</tspan>"
            for k, text in enumerate(lines)
            if text
        )
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{yb}" y2="{yb + 4}" class="axis"/>'
            f'<text x="{x:.1f}" y="{yb + 16}" class="xtick">{spans}</text>'
        )
    # markers shrink with the slots, so a long history stays a line of points, not a blob
    marker = max(2.0, min(5.0, w * 0.32))
    dot = max(1.2, min(2.3, w * 0.15))
    # trials: a small spread inside the slot so equal values stay visible
    dots = []
    for i, p in enumerate(pts):
        n = len(p.trials)
        spread = min(w * 0.5, 12.0)
        for k, t in enumerate(p.trials):
            if t is None or not math.isfinite(t):
                continue
            dx = (k - (n - 1) / 2) / max(n - 1, 1) * spread if n > 1 else 0.0
            dots.append(f'<circle cx="{chart.x(i) + dx:.1f}" cy="{chart.y(t):.1f}" r="{dot:.1f}"/>')
    if dots:
        out.append(f'<g class="trials" fill="{SKY}" fill-opacity="0.75">{"".join(dots)}</g>')
    if s.kind == CAPACITY:
        out.append(_whiskers(chart, w))
    # the run figure: a line, broken where a run has no figure
    segment: list[str] = []
    segments: list[list[str]] = []
    for i, p in enumerate(pts):
        value = _plotted(p)
        if value is None:
            if segment:
                segments.append(segment)
            segment = []
            continue
        segment.append(f"{chart.x(i):.1f},{chart.y(value):.1f}")
    if segment:
        segments.append(segment)
    for seg in segments:
        if len(seg) > 1:
            out.append(f'<polyline points="{" ".join(seg)}" class="figure"/>')
    # change points: the step's levels dashed, a vertical line at the first run after it
    bounds = sorted({slot for _, slot, _ in chart.placed})
    for mark, slot, _row in chart.placed:
        xc = chart.boundary(slot)
        prev = max((b for b in bounds if b < slot), default=0)
        nxt = min((b for b in bounds if b > slot), default=chart.slots)
        if mark.before is not None and slot > 0:
            yb = chart.y(mark.before)
            out.append(
                f'<line x1="{chart.x(prev) - w * 0.3:.1f}" x2="{xc:.1f}" y1="{yb:.1f}" '
                f'y2="{yb:.1f}" class="level"/>'
            )
        if mark.after is not None:
            ya = chart.y(mark.after)
            out.append(
                f'<line x1="{xc:.1f}" x2="{chart.x(nxt - 1) + w * 0.3:.1f}" y1="{ya:.1f}" '
                f'y2="{ya:.1f}" class="level"/>'
            )
        out.append(
            f'<line x1="{xc:.1f}" x2="{xc:.1f}" y1="{chart.top - 4:.1f}" y2="{chart.bottom}" '
            f'class="change" data-run="{mark.run}"/>'
        )
    # run markers, each a link to its run's page
    for i, p in enumerate(pts):
        style = _style(p)
        value = _plotted(p)
        y = chart.y(value) if value is not None else chart.bottom - 8
        title = _point_title(p, s)
        size = marker * (1.2 if style.name in ("failing", "none") else 1.0)
        said = f"run {p.run.id}: {_figure_text(s, p)}, {p.verdict or 'no verdict'}"
        out.append(
            f'<a href="{run_page_name(p.run.id)}" class="run" aria-label="{_e(said)}">'
            f"<title>{_e(title)}</title>"
            f'<circle cx="{chart.x(i):.1f}" cy="{y:.1f}" r="11" class="hit"/>'
            f"{_shape(style, chart.x(i), y, size)}</a>"
        )
    # change labels on top, in the margin above the plot, linked to the run
    for mark, slot, row in chart.placed:
        xc = chart.boundary(slot)
        x0, x1 = chart._label_span(mark, xc)
        y0 = chart.top - 10 - _LABEL_ROW * (row + 1) + 4
        tip = f"change point {mark.label}: {mark.detail()}"
        out.append(
            f'<a href="{run_page_name(mark.run)}" class="change-label" aria-label="{_e(tip)}">'
            f"<title>{_e(tip)}</title>"
            f'<line x1="{xc:.1f}" x2="{xc:.1f}" y1="{y0 + 18:.1f}" y2="{chart.top - 4:.1f}" '
            f'class="change"/>'
            f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="18" rx="4" '
            f'fill="{PURPLE}"/>'
            f'<text x="{x0 + 7:.1f}" y="{y0 + 13:.1f}" class="clabel">{_e(mark.label)}</text></a>'
        )
    if not pts:
        out.append(f'<text x="{_W / 2}" y="{chart.top + _PLOT_H / 2}" class="empty">no runs</text>')
    title = f"{s.test} {s.level}" + (f" on {s.deployment}" if s.deployment else "")
    what = "capacity over runs: " if s.kind == CAPACITY else "tok/s over runs: "
    # no role="img": the markers are links, which must stay reachable by keyboard and reader
    return svg.chart(
        _W,
        chart.height,
        aid,
        what + title,
        _describe(chart),
        "".join(out),
        role=None,
    )


def _whiskers(chart: _Chart, w: float) -> str:
    """A capacity chart's brackets: a whisker from the load that held to the one that broke,
    capped at each end it has (an open bracket, the top of the range held or the bottom broke,
    runs on to the plot's edge uncapped), and the interpolated boundary as a tick across it."""
    parts = []
    cap = max(3.0, min(7.0, w * 0.22))
    for i, p in enumerate(chart.series.points):
        c = p.capacity
        if c is None:
            continue
        x = chart.x(i)
        lo, hi = c.low, c.high
        y_lo = chart.y(lo) if lo is not None else chart.bottom
        y_hi = chart.y(hi) if hi is not None else chart.top
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y_lo:.1f}" y2="{y_hi:.1f}"/>')
        for end, y in ((lo, y_lo), (hi, y_hi)):
            if end is not None:
                parts.append(
                    f'<line x1="{x - cap:.1f}" x2="{x + cap:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>'
                )
        if c.estimate is not None:
            ye = chart.y(c.estimate)
            parts.append(
                f'<line x1="{x - cap * 1.4:.1f}" x2="{x + cap * 1.4:.1f}" y1="{ye:.1f}" '
                f'y2="{ye:.1f}" stroke="{SKY}" stroke-width="2.5" class="boundary"/>'
            )
    return (
        f'<g class="brackets" stroke="{GREY}" stroke-width="1.4" fill="none">{"".join(parts)}</g>'
        if parts
        else ""
    )


def _describe(chart: _Chart) -> str:
    """The chart in one paragraph, for screen readers (the SVG's ``<desc>``)."""
    s = chart.series
    pts = s.points
    if not pts:
        return "No runs recorded."
    figures = [v for v in (_plotted(p) for p in pts) if v is not None]
    latest = _figure_text(s, pts[-1]) if s.kind == CAPACITY else f"{_tok(pts[-1].tok_s)} tok/s"
    text = (
        f"{len({p.run.id for p in pts})} runs from {_date(pts[0].run.time, '%Y-%m-%d')} to "
        f"{_date(pts[-1].run.time, '%Y-%m-%d')}; latest {latest} "
        f"({pts[-1].verdict or 'no verdict'})"
    )
    if figures and s.kind == CAPACITY:
        text += f"; capacity from {_load(s, min(figures))} to {_load(s, max(figures))}"
    elif figures:
        text += f"; range {_tok(min(figures))} to {_tok(max(figures))} tok/s"
    if chart.placed:
        text += "; change points: " + "; ".join(m.label for m, _, _ in chart.placed)
    else:
        text += "; no change point"
    return text + "."


def _legend(chart: _Chart) -> str:
    """The symbols this chart uses, and only those (an unused swatch would be noise)."""
    pts = chart.series.points
    if chart.series.kind == CAPACITY:
        items = [
            f"<span>{svg.glyph(svg.key_line(BLUE), 26)}capacity (the highest load that held)</span>"
        ]
        whisker = svg.line(7, 1, 7, 13, stroke=GREY, stroke_width=1.4) + "".join(
            svg.line(3, y, 11, y, stroke=GREY, stroke_width=1.4) for y in (1, 13)
        )
        items.append(f"<span>{svg.glyph(whisker)}bracket: held .. broke</span>")
        if any(p.capacity is not None and p.capacity.estimate is not None for p in pts):
            tick = svg.line(1, 7, 13, 7, stroke=SKY, stroke_width=2.5)
            items.append(
                f"<span>{svg.glyph(tick)}boundary (interpolated; what the gate compares)</span>"
            )
    else:
        items = [
            f"<span>{svg.glyph(svg.key_line(BLUE), 26)}run figure (median of its trials)</span>"
        ]
    if any(p.trials for p in pts):
        dots = svg.circle(4, 9, 2.3, fill=SKY) + svg.circle(10, 5, 2.3, fill=SKY)
        items.append(f"<span>{svg.glyph(dots)}trials</span>")
    if any(_baseline_of(p) is not None for p in pts):
        band = svg.rect(1, 4, 24, 8, fill=BAND, fill_opacity=".45") + svg.line(
            1, 4, 25, 4, stroke=GREY, stroke_width=1.5, stroke_dasharray="4 3"
        )
        items.append(
            f"<span>{svg.glyph(band, 26)}baseline, and the drop its tolerance allows</span>"
        )
    seen = []
    for p in pts:
        st = _style(p)
        if st not in seen:
            seen.append(st)
    order = list(_STYLES.values())
    for st in sorted(seen, key=order.index):
        items.append(f"<span>{_glyph(st)}{_e(st.label)}</span>")
    if chart.placed:
        mark = svg.line(7, 0, 7, 14, stroke=PURPLE, stroke_width=2.5)
        items.append(f"<span>{svg.glyph(mark)}change point</span>")
    return f'<p class="legend">{"".join(items)}</p>'


def _data_table(chart: _Chart) -> str:
    """The chart's numbers as a table: the text alternative, and what a reader copies."""
    s = chart.series
    rows = []
    for p in s.points:
        run = p.run
        head = (
            f'<tr><td><a href="{run_page_name(run.id)}">#{run.id}</a></td>'
            f"<td>{_e(_date(run.time))}</td><td><code>{_e(_short_commit(run.commit))}</code></td>"
        )
        c = p.capacity
        if c is not None:
            base = _load(s, c.baseline) if c.baseline is not None else "–"
            if c.baseline_low is not None or c.baseline_high is not None:
                base += f" [{_num_text(c.baseline_low)}..{_num_text(c.baseline_high)}]"
            figures = (
                f'<td class="num">{_e(_load(s, c.value))}</td>'
                f'<td class="num">{_e(_bracket(p))}</td>'
                f'<td class="num">{_e(_num_text(c.estimate))}</td>'
                f'<td class="num">{_e(base)}</td>'
            )
        else:
            figures = (
                f'<td class="num">{_e(_tok(p.tok_s))}</td>'
                f'<td class="num">{_e(", ".join(_tok(t) for t in p.trials))}</td>'
                f'<td class="num">{_e(_tok(p.baseline_tok_s))}</td>'
            )
        rows.append(head + figures + _vs_cell(p) + f"<td>{_verdict_html(p)}</td></tr>")
    cols = (
        "<th>capacity</th><th>bracket</th><th>boundary</th><th>baseline</th>"
        if s.kind == CAPACITY
        else "<th>tok/s</th><th>trials</th><th>baseline</th>"
    )
    return (
        "<details><summary>the numbers</summary><table><thead><tr><th>run</th><th>time</th>"
        f"<th>commit</th>{cols}<th>vs baseline (90% CI)</th>"
        f"<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table></details>"
    )


def _changes_list(chart: _Chart) -> str:
    marks = [m for m, _, _ in chart.placed] + chart.unplaced
    if not marks:
        return ""
    items = []
    for m in marks:
        when = " · ".join(
            x for x in (_date(m.time, "%Y-%m-%d") if m.time else "", _short_commit(m.commit)) if x
        )
        where = f" ({_e(when)})" if when else ""
        items.append(
            f'<li><a href="{run_page_name(m.run)}">{_e(m.label)}</a>{where}: {_e(m.detail())}</li>'
        )
    return f'<ul class="changes">{"".join(items)}</ul>'


def _section(chart: _Chart) -> str:
    s = chart.series
    dep = f' <span class="dep">on <code>{_e(s.deployment)}</code></span>' if s.deployment else ""
    return (
        f'<section id="{chart.anchor}"><h2><code>{_e(s.test)}</code> '
        f'<span class="lvl">{_e(s.level)}</span>{dep}</h2>'
        f"{_legend(chart)}{_chart_svg(chart)}{_changes_list(chart)}{_data_table(chart)}</section>"
    )


# ------------------------------------------------------------------------------- pages


def _anchors(series: Sequence[LevelSeries]) -> list[str]:
    """A unique id per series, from ``[A-Za-z0-9._-]`` only, so it is safe in any attribute."""
    used: set[str] = set()
    out = []
    for s in series:
        stem = "s-" + safe_name(s.ident, max_len=70)
        name, n = stem, 2
        while name in used:
            name, n = f"{stem}-{n}", n + 1
        used.add(name)
        out.append(name)
    return out


def _latest(points: Sequence[Point]) -> Point | None:
    return points[-1] if points else None


def _first_figure(points: Sequence[Point]) -> float | None:
    return next((v for v in (_plotted(p) for p in points) if v is not None), None)


def _summary(charts: Sequence[_Chart]) -> str:
    rows = []
    for c in charts:
        pts = c.series.points
        last = _latest(pts)
        first = _first_figure(pts)
        latest_value = _plotted(last) if last is not None else None
        since = (
            (latest_value / first - 1) * 100
            if last is not None and latest_value is not None and first
            else None
        )
        marks = [m for m, _, _ in c.placed] + c.unplaced
        latest_mark = max(marks, key=lambda m: m.run, default=None)
        change = (
            f'<a href="{run_page_name(latest_mark.run)}">{_e(latest_mark.label)}</a>'
            if latest_mark
            else "none"
        )
        attention = last is not None and _style(last).name in ("failing", "none")
        s = c.series
        latest = (
            f'<a href="{run_page_name(last.run.id)}">{_e(_load(s, latest_value))}</a>'
            if last is not None
            else "–"
        )
        rows.append(
            f"<tr{_ATTENTION_CLASS if attention else ''}>"
            f'<td><a href="#{c.anchor}"><code>{_e(s.test)}</code> {_e(s.level)}</a></td>'
            f"<td>{_e(s.deployment or '')}</td>"
            f'<td class="num">{len({p.run.id for p in pts})}</td>'
            f'<td class="num">{latest}</td><td class="num">{_e(_pct(since))}</td>'
            + _vs_cell(last)
            + f"<td>{change}</td><td>{_verdict_html(last)}</td></tr>"
        )
    return (
        '<table class="summary"><thead><tr><th>series</th><th>deployment</th><th>runs</th>'
        "<th>latest</th><th>since first run</th><th>vs baseline (90% CI)</th>"
        "<th>last change point</th>"
        f"<th>latest verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _all_runs(series: Sequence[LevelSeries], runs: Mapping[int, Mapping[str, Any]]) -> list[int]:
    ids = {p.run.id for s in series for p in s.points}
    ids |= {int(k) for k in runs}
    return sorted(ids)


def _run_infos(series: Sequence[LevelSeries]) -> dict[int, RunInfo]:
    return {p.run.id: p.run for s in series for p in s.points}


def _runs_table(
    ids: Sequence[int],
    infos: Mapping[int, RunInfo],
    series: Sequence[LevelSeries],
    prefix: str = "",
) -> str:
    per_run: dict[int, list[Point]] = {}
    for s in series:
        for p in s.points:
            per_run.setdefault(p.run.id, []).append(p)
    rows = []
    for rid in reversed(ids):
        info = infos.get(rid)
        pts = per_run.get(rid, [])
        failing = sum(1 for p in pts if _style(p).name in ("failing", "none"))
        rows.append(
            f'<tr><td><a href="{prefix}{run_page_name(rid)}">#{rid}</a></td>'
            f"<td>{_e(_date(info.time) if info else '–')}</td>"
            f"<td><code>{_e(_short_commit(info.commit) if info else '')}</code></td>"
            f"<td>{_e((info.branch or '') if info else '')}</td>"
            f"<td>{_e((info.deployment or '') if info else '')}</td>"
            f'<td class="num">{len(pts)}</td>'
            f'<td class="num">{failing or ""}</td></tr>'
        )
    return (
        "<table><thead><tr><th>run</th><th>time</th><th>commit</th><th>branch</th>"
        "<th>deployment</th><th>levels</th><th>failing</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def render_index(
    series: Sequence[LevelSeries],
    changes: Sequence[Any],
    runs: Mapping[int, Mapping[str, Any]] | None = None,
) -> str:
    """The index page as a string: headline, summary table, one chart per series, the runs."""
    runs = runs or {}
    marks = _marks_by_series(changes)
    anchors = _anchors(series)
    charts = [
        _Chart(s, marks.get(_series_key(s.test, s.level, s.deployment), []), a)
        for s, a in zip(series, anchors)
    ]
    ids = _all_runs(series, runs)
    infos = _run_infos(series)
    times = [i.time for i in infos.values()]
    n_changes = sum(len(c.placed) + len(c.unplaced) for c in charts)
    facts = [f"{len(series)} series", f"{len(ids)} runs"]
    if times:
        facts.append(f"{_date(min(times), '%Y-%m-%d')} to {_date(max(times), '%Y-%m-%d')}")
    facts.append(f"{n_changes} change point{'s' if n_changes != 1 else ''}")
    body = [
        "<h1>Throughput history</h1>",
        f'<p class="meta">{_e(" · ".join(facts))}</p>',
        _summary(charts) if charts else "<p>No runs recorded yet.</p>",
        '<p class="meta">Each chart: tok/s per run (a <code>@capacity</code> test: its '
        "capacity, with the search's bracket), oldest left; a marker links to its run. "
        "The y axis does not start at zero.</p>",
        *(_section(c) for c in charts),
    ]
    if ids:
        body += ["<h2>Runs</h2>", _runs_table(ids, infos, series)]
    return page("Throughput history", "\n".join(body))


# ------------------------------------------------------------------------------- run pages

_FACT_KEYS = ("time", "commit", "branch", "deployment", "model", "plugin_version", "ci_url")
_SHOWN_KEYS = frozenset({*_FACT_KEYS, "id", "provenance", "deployments", "endpoint", "tests"})
"""Keys of the store's run details that the page shows in their own place; any other key is
shown under "Stored details", so nothing the store adds is hidden."""


def _value_html(value: Any, depth: int = 0) -> str:
    """Any stored value as escaped HTML: mappings as key/value tables, lists of mappings as
    tables with their keys as columns, the rest as text.  The store's detail format may grow;
    whatever it adds is shown, and nothing in it can inject markup."""
    if isinstance(value, Mapping):
        if not value:
            return "–"
        if depth >= 3:
            return f"<code>{_e(dict(value))}</code>"
        rows = "".join(
            f"<tr><th>{_e(k)}</th><td>{_value_html(v, depth + 1)}</td></tr>"
            for k, v in value.items()
        )
        return f'<table class="kv">{rows}</table>'
    if isinstance(value, (list, tuple)):
        if not value:
            return "–"
        if all(isinstance(v, Mapping) for v in value) and depth < 3:
            cols: list[str] = []
            for v in value:
                cols += [str(k) for k in v if str(k) not in cols]
            head = "".join(f"<th>{_e(c)}</th>" for c in cols)
            body = "".join(
                "<tr>"
                + "".join(f"<td>{_value_html(_get(v, c), depth + 1)}</td>" for c in cols)
                + "</tr>"
                for v in value
            )
            return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return _e(", ".join(_plain(v) for v in value))
    if isinstance(value, datetime):
        return _e(_date(value))
    if isinstance(value, float):
        return _e(_tok(value))
    return _e("–" if value is None else value)


def _get(mapping: Mapping[Any, Any], key: str) -> Any:
    if key in mapping:
        return mapping[key]
    return next((v for k, v in mapping.items() if str(k) == key), None)


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return _tok(value)
    return str(value)


def _facts(info: RunInfo | None, details: Mapping[str, Any]) -> str:
    """The run's who/when/where: the read model's RunInfo, else the store's details."""
    values: dict[str, Any] = {}
    if info is not None:
        values = {
            "time": info.time,
            "commit": info.commit,
            "branch": info.branch,
            "deployment": info.deployment,
            "plugin_version": info.plugin_version,
            "ci_url": info.ci_url,
        }
    for key in _FACT_KEYS:
        if values.get(key) is None and details.get(key) is not None:
            values[key] = details[key]
    rows = []
    for key in _FACT_KEYS:
        value = values.get(key)
        if value is None or value == "":
            continue
        if key == "ci_url":
            href = _safe_href(value)
            shown = f'<a href="{_e(href)}">{_e(value)}</a>' if href else f"<code>{_e(value)}</code>"
        elif key == "time" and isinstance(value, datetime):
            shown = _e(_date(value))
        elif key == "commit":
            shown = f"<code>{_e(value)}</code>"
        else:
            shown = _e(value)
        rows.append(f"<dt>{_e(key.replace('_', ' '))}</dt><dd>{shown}</dd>")
    endpoint = details.get("endpoint")
    if isinstance(endpoint, Mapping) and endpoint.get("url"):
        rows.append(f"<dt>endpoint</dt><dd><code>{_e(endpoint['url'])}</code></dd>")
    return f'<dl class="facts">{"".join(rows)}</dl>' if rows else ""


def _provenance_table(provenance: Mapping[str, Any]) -> str:
    if not provenance:
        return "<p><em>no provenance stored</em></p>"
    rows = "".join(
        f"<tr><th><code>{_e(k)}</code></th><td>{_value_html(v, 2)}</td></tr>"
        for k, v in sorted(provenance.items(), key=lambda kv: str(kv[0]))
    )
    return f'<table class="kv provenance">{rows}</table>'


@dataclass
class _Site:
    """Everything a page needs, worked out once for the whole site (a history of a thousand
    runs writes a thousand pages; each must not rescan every series)."""

    series: Sequence[LevelSeries]
    changes: Sequence[Any]
    runs: Mapping[int, Mapping[str, Any]]
    anchors: list[str] = field(default_factory=list)
    infos: dict[int, RunInfo] = field(default_factory=dict)
    levels: dict[int, list[tuple[LevelSeries, str, Point]]] = field(default_factory=dict)
    marks: dict[int, list[tuple[str, _Mark]]] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.anchors = _anchors(self.series)
        self.infos = _run_infos(self.series)
        for s, anchor in zip(self.series, self.anchors):
            for p in s.points:
                self.levels.setdefault(p.run.id, []).append((s, anchor, p))
        for change in self.changes:
            mark = _mark(change)
            if mark is not None:
                name = f"{getattr(change, 'test', '')} {getattr(change, 'level', '')}"
                self.marks.setdefault(mark.run, []).append((name, mark))
        self.ids = _all_runs(self.series, self.runs)


def _levels_table(site: _Site, run_id: int) -> str:
    """The run's levels as the series have them (when the store gave no report details)."""
    rows = []
    for s, anchor, p in site.levels.get(run_id, []):
        session = f" (session {p.session})" if p.session is not None else ""
        if p.capacity is not None:
            figure, detail = _load(s, p.capacity.value), _bracket(p)
            base = _load(s, p.capacity.baseline_compared)
        else:
            figure, detail = _tok(p.tok_s), ", ".join(_tok(t) for t in p.trials)
            base = _tok(p.baseline_tok_s)
        if _baseline_of(p) is not None and p.tolerance_pct is not None:
            base += f" (−{p.tolerance_pct:g}%)"
        rows.append(
            f'<tr><td><a href="../index.html#{anchor}"><code>{_e(s.test)}</code></a></td>'
            f"<td>{_e(s.level + session)}</td><td>{_e(s.deployment or '')}</td>"
            f'<td class="num">{_e(figure)}</td>'
            f'<td class="num">{_e(detail)}</td>'
            f'<td class="num">{_e(base)}</td>' + _vs_cell(p) + f"<td>{_verdict_html(p)}</td></tr>"
        )
    if not rows:
        return "<p><em>no level of this run is in the history's series</em></p>"
    return (
        "<table><thead><tr><th>test</th><th>level</th><th>deployment</th><th>tok/s or capacity"
        "</th><th>trials or bracket</th><th>baseline</th><th>vs baseline (90% CI)</th><th>verdict</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _verdict_style(verdict: str) -> _Style:
    """How a report's verdict word is drawn: as its chart marker would be."""
    known = Verdict.of(verdict)
    if known is Verdict.HELD or known is Verdict.BROKE:
        return _STYLES[known.value]
    if known is None or known is Verdict.NOT_RUN:
        return _STYLES["other"]
    if known.fails():
        return _STYLES["failing"]
    if known is Verdict.IMPROVED:
        return _STYLES["improved"]
    if known is Verdict.NO_BASELINE:
        return _STYLES["no-baseline"]
    if known.warning:
        return _STYLES["warning"]
    return _STYLES["pass"]


def _report_verdict(verdict: str) -> str:
    """A report level's verdict word with the glyph its chart marker has."""
    style = _verdict_style(verdict)
    help_text = VERDICT_HELP.get(verdict, "")
    return (
        f'<span class="verdict m-{style.name}" title="{_e(help_text)}">'
        f"{_glyph(style)} {_e(verdict)}</span>"
    )


def _report_test(test: Mapping[str, Any], site: _Site, run_id: int) -> str:
    """One test of the run as its report had it: the HTML report's columns (the Markdown
    column model, so the run page, the job summary and ``--perf-html`` agree), the reasons
    behind each verdict, and links to the test's charts."""
    name = str(test.get("test") or test.get("nodeid") or "?")
    deployment = test.get("deployment")
    head = f"<h3><code>{_e(test.get('nodeid', name))}</code>"
    if deployment:
        head += f' <span class="dep">on <code>{_e(deployment)}</code></span>'
    if test.get("session") is not None:
        head += f' <span class="dep">session {_e(test.get("session"))}</span>'
    if test.get("outcome"):
        head += f' <span class="outcome">{_e(test.get("outcome"))}</span>'
    parts = [head + "</h3>"]
    charts = [
        f'<a href="../index.html#{anchor}">{_e(s.level)}</a>'
        for s, anchor, _ in site.levels.get(run_id, [])
        if s.test == name and (s.deployment or None) == (deployment or None)
    ]
    meta = []
    if charts:
        meta.append("charts: " + " · ".join(dict.fromkeys(charts)))
    if isinstance(test.get("workload"), Mapping):
        meta.append(f"workload <code>{_e(workload_text(test['workload']))}</code>")
    if test.get("baseline_file"):
        meta.append(f"baseline <code>{_e(test['baseline_file'])}</code>")
    if meta:
        parts.append(f'<p class="meta">{" · ".join(meta)}</p>')
    levels = [lv for lv in test.get("levels") or [] if isinstance(lv, Mapping)]
    capacity = test.get("capacity")
    if isinstance(capacity, Mapping):  # the capacity is the result; the levels its probes
        verdict = str(capacity.get("verdict", "?"))
        parts.append(capacity_html(test, f"verdict m-{_verdict_style(verdict).name}"))
        if levels:
            parts.append(
                '<p class="meta">the levels the search probed (detail: the capacity above is '
                "the test's result and its series)</p>"
            )
    if levels:
        parts.append(
            levels_table(
                levels, lambda lv: f"<td>{_report_verdict(str(lv.get('verdict', '?')))}</td>"
            )
        )
    notes = [
        f"<li><b>{_e(level_label(lv, test))}</b> {_e(lv.get('verdict', '?'))}: {_e(reason)}</li>"
        for lv in levels
        for reason in lv.get("reasons") or []
    ]
    if notes:
        parts.append(f'<ul class="reasons">{"".join(notes)}</ul>')
    if test.get("error"):
        parts.append(f"<pre>{_e(test['error'])}</pre>")
    changed = test.get("provenance_changes") or []
    if isinstance(changed, list) and changed:
        parts.append(
            '<p class="meta">changed since the baseline: '
            + "; ".join(f"<code>{_e(c)}</code>" for c in changed)
            + "</p>"
        )
    return "\n".join(parts)


def _run_page(site: _Site, run_id: int, neighbours: tuple[int | None, int | None]) -> str:
    """One run's page: who/when/where, the change points that took effect in it, its levels
    with their verdicts, its provenance, and whatever else the store keeps of it."""
    raw = site.runs.get(run_id)
    details: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    info = site.infos.get(run_id)
    body = [f"<h1>Run {int(run_id)}</h1>"]
    nav = ['<a href="../index.html">← all series</a>']
    prev_id, next_id = neighbours
    if prev_id is not None:
        nav.append(f'<a href="{int(prev_id)}.html">← run {int(prev_id)}</a>')
    if next_id is not None:
        nav.append(f'<a href="{int(next_id)}.html">run {int(next_id)} →</a>')
    body.append(f"<nav>{''.join(nav)}</nav>")
    body.append(_facts(info, details))
    here = [
        f"<li><code>{_e(name)}</code>: {_e(mark.label)}: {_e(mark.detail())}</li>"
        for name, mark in site.marks.get(run_id, [])
    ]
    if here:
        body.append(f"<h2>Change points that took effect in this run</h2><ul>{''.join(here)}</ul>")
    tests = details.get("tests")
    if isinstance(tests, list) and tests:
        body.append("<h2>Tests and verdicts</h2>")
        body += [_report_test(t, site, run_id) for t in tests if isinstance(t, Mapping)]
    else:
        body.append("<h2>Levels and verdicts</h2>")
        body.append(_levels_table(site, run_id))
    provenance = details.get("provenance")
    if not isinstance(provenance, Mapping):
        provenance = info.provenance if info is not None else {}
    body.append("<h2>Provenance</h2>")
    body.append(_provenance_table(provenance))
    deployments = details.get("deployments")
    if isinstance(deployments, Mapping) and deployments:
        body += [
            f"<details><summary>provenance of deployment <code>{_e(name)}</code></summary>"
            f"{_provenance_table(prov if isinstance(prov, Mapping) else {})}</details>"
            for name, prov in deployments.items()
        ]
    rest = {
        k: v for k, v in details.items() if k not in _SHOWN_KEYS and v not in (None, "", [], {})
    }
    if rest:
        body.append("<h2>Stored details</h2>")
        body.append(_value_html(rest))
    return page(f"Run {int(run_id)}", "\n".join(b for b in body if b))


# ------------------------------------------------------------------------------- writing


def write_dashboard(
    series: Sequence[LevelSeries],
    changes: Sequence[Any],
    out: Path,
    runs: Mapping[int, Mapping[str, Any]],
) -> Path:
    """Write the static site into ``out``: ``index.html`` and ``runs/<id>.html`` for every run
    a series holds or ``runs`` names; return the index's path.

    ``changes`` are change points (:class:`ChangeLike`: the detector's ``Change``); ``runs``
    maps a run id to the store's details of it (provenance, verdicts, levels), shown on its
    page.  Run pages are written first and the index last, each atomically
    (:func:`pytest_kimi.files.write_atomic`), so an index that exists links only to pages that
    exist and a page that exists is whole.  Pages of runs no longer in the history are left alone.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    site = _Site(series, changes, runs)
    ids = site.ids
    for k, rid in enumerate(ids):
        neighbours = (ids[k - 1] if k > 0 else None, ids[k + 1] if k + 1 < len(ids) else None)
        write_atomic(out / run_page_name(rid), _run_page(site, rid, neighbours))
    index = out / INDEX_NAME
    write_atomic(index, render_index(series, changes, runs))
    return index


__all__ = ["ChangeLike", "render_index", "run_page_name", "write_dashboard"]
