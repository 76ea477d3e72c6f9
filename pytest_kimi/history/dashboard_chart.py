"""One history chart: a series laid out in run order and drawn as inline SVG.

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

Accessibility: no meaning rests on colour alone: verdicts have shapes and words, change
points a line and a text label, every chart a ``<title>``/``<desc>`` and a data table.

Why a module of its own: the chart is the one part of the site with geometry (slots, label
rows, ticks); the pages around it only place its section.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Sequence

from pytest_kimi.history.dashboard_cells import (
    BAND,
    BLUE,
    GREY,
    PURPLE,
    SKY,
    _STYLES,
    _baseline_of,
    _bracket,
    _date,
    _glyph,
    _has_baseline,
    _load,
    _num_text,
    _plotted,
    _shape,
    _short_commit,
    _style,
    _verdict_html,
    _vs_cell,
    run_page_name,
    vs_baseline,
)
from pytest_kimi.history.dashboard_changes import _Mark
from pytest_kimi.history.model import CAPACITY, LevelSeries, Point
from pytest_kimi.report import svg
from pytest_kimi.report.htmlkit import e as _e
from pytest_kimi.report.svg import tok as _tok

# chart geometry, in CSS pixels (the SVG is drawn 1:1 and shrinks with the page)
_W = 960
_LEFT = 66
_RIGHT = 18
_PLOT_H = 210
_BOTTOM = 56
_LABEL_ROW = 22
_MIN_TICK_PX = 64
_COMMIT_CLASS = ' class="commit"'


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
