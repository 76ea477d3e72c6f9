"""Charts as SVG text: the one way pytest-kimi draws a figure (the run report's throughput and
latency figures, the dashboard's history charts).

Inline SVG, drawn here in Python, rather than PNGs from a plotting library or a JavaScript
chart library: it needs no dependency (the report used to need matplotlib, about 100 MB of
extra install for two figures), it is text in the page (no image files to keep next to it, no
``data:`` URIs), it stays sharp at any zoom, a point can carry its figures as a tooltip
(``<title>``) and be a link, every chart has a ``<title>``/``<desc>`` for screen readers, and
tests can read it in the DOM.  The same chart written as its own ``.svg`` file
(:func:`standalone`) opens in any browser and pastes into a PR.

Colours are the Okabe-Ito palette (distinguishable with the common colour-vision
deficiencies); :data:`VERMILLION` means "fails the run" and :data:`PURPLE` "change point", and
neither is ever a series colour (:data:`SERIES`), so a reader (and a pixel test) can trust them.
Markers have shapes as well as colours (:func:`shape`), so no meaning rests on colour alone.

Every text goes through :func:`~pytest_kimi.report.htmlkit.e`; numbers are formatted here.
Pure strings: no pytest, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from pytest_kimi.report.htmlkit import CHART_CSS, e

# Okabe-Ito
BLACK = "#000000"
ORANGE = "#E69F00"
SKY = "#56B4E9"
"""Trial dots."""
GREEN = "#009E73"
"""``improved``."""
YELLOW = "#F0E442"
BLUE = "#0072B2"
"""The first series (and the dashboard's run figure)."""
VERMILLION = "#D55E00"
"""Verdicts that fail a run, and nothing else."""
PURPLE = "#CC79A7"
"""Change points, and nothing else: a chart without a change point has no pixel of it."""
GREY = "#6E6E6E"
"""Baselines."""
BAND = "#BBBBBB"
"""The band of a baseline's spread."""

SERIES = (BLUE, ORANGE, GREEN, SKY, BLACK, GREY)
"""Series colours in order: never VERMILLION nor PURPLE, which keep their one meaning."""

SHAPES = ("circle", "ring", "square", "diamond", "up", "down", "cross")


def n(value: float) -> str:
    """A coordinate: one decimal (a tenth of a pixel is below what a screen shows)."""
    return f"{value:.1f}"


def tok(value: float | None) -> str:
    """tok/s as people read it: ``1,432``, ``64.2``, ``3.15``; ``–`` for no figure."""
    if value is None or not math.isfinite(value):
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def tick_label(value: float) -> str:
    """An axis tick: ``0``, ``2.5``, ``1,500``."""
    if value == 0:
        return "0"
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:g}"


# ------------------------------------------------------------------------------ elements


def attrs(cls: str | None = None, **kw: object) -> str:
    """`` class="..." name="value"...``: ``stroke_width`` is written ``stroke-width``, values
    are escaped, None is left out."""
    out = f' class="{e(cls)}"' if cls else ""
    for key, value in kw.items():
        if value is None:
            continue
        out += f' {key.rstrip("_").replace("_", "-")}="{e(value)}"'
    return out


def line(x1: float, y1: float, x2: float, y2: float, cls: str | None = None, **kw: object) -> str:
    return f'<line x1="{n(x1)}" x2="{n(x2)}" y1="{n(y1)}" y2="{n(y2)}"{attrs(cls, **kw)}/>'


def polyline(points: Iterable[tuple[float, float]], cls: str | None = None, **kw: object) -> str:
    pts = " ".join(f"{n(x)},{n(y)}" for x, y in points)
    return f'<polyline points="{pts}"{attrs(cls, **kw)}/>'


def rect(x: float, y: float, w: float, h: float, cls: str | None = None, **kw: object) -> str:
    return (
        f'<rect x="{n(x)}" y="{n(y)}" width="{n(max(w, 0.0))}" height="{n(max(h, 0.0))}"'
        f"{attrs(cls, **kw)}/>"
    )


def circle(x: float, y: float, r: float, cls: str | None = None, **kw: object) -> str:
    return f'<circle cx="{n(x)}" cy="{n(y)}" r="{n(r)}"{attrs(cls, **kw)}/>'


def text(x: float, y: float, content: str, cls: str | None = None, **kw: object) -> str:
    """A text element; ``content`` is escaped (x and y come first: tests read them)."""
    return f'<text x="{n(x)}" y="{n(y)}"{attrs(cls, **kw)}>{e(content)}</text>'


def tip(title: str, body: str, cls: str | None = None) -> str:
    """``body`` in a group whose ``<title>`` is its tooltip (and its accessible name)."""
    return f"<g{attrs(cls)}><title>{e(title)}</title>{body}</g>"


def shape(kind: str, colour: str, x: float, y: float, size: float = 5.0) -> str:
    """One marker centred on (x, y), white-outlined so it stands out on a line or a band.

    ``kind`` is one of :data:`SHAPES`: ``circle``, ``ring`` (hollow), ``square``,
    ``diamond``, ``up``/``down`` (triangles), ``cross``.
    """
    c, s = colour, size
    edge = 'stroke="#fff" stroke-width="1.2"'
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{s:.1f}" fill="{c}" {edge}/>'
    if kind == "ring":
        return (
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{s - 0.8:.1f}" fill="#fff" '
            f'stroke="{c}" stroke-width="2"/>'
        )
    if kind == "square":
        return (
            f'<rect x="{x - s * 0.85:.1f}" y="{y - s * 0.85:.1f}" width="{s * 1.7:.1f}" '
            f'height="{s * 1.7:.1f}" fill="{c}" {edge}/>'
        )
    if kind == "diamond":
        d = s * 1.3
        pts = f"{x:.1f},{y - d:.1f} {x + d:.1f},{y:.1f} {x:.1f},{y + d:.1f} {x - d:.1f},{y:.1f}"
        return f'<polygon points="{pts}" fill="{c}" {edge}/>'
    if kind in ("up", "down"):
        d = s * 1.35
        sign = -1 if kind == "up" else 1
        pts = (
            f"{x - d:.1f},{y - sign * d * 0.6:.1f} {x + d:.1f},{y - sign * d * 0.6:.1f} "
            f"{x:.1f},{y + sign * d:.1f}"
        )
        return f'<polygon points="{pts}" fill="{c}" {edge}/>'
    d = s * 0.9  # cross: no figure
    return (
        f'<path d="M{x - d:.1f},{y - d:.1f}L{x + d:.1f},{y + d:.1f}M{x - d:.1f},{y + d:.1f}'
        f'L{x + d:.1f},{y - d:.1f}" stroke="{c}" stroke-width="2.4" fill="none"/>'
    )


def glyph(inner: str, width: int = 14, height: int = 14) -> str:
    """A small inline icon for HTML legends and tables (hidden from screen readers: the word
    beside it says it)."""
    return (
        f'<svg class="glyph" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-hidden="true">{inner}</svg>'
    )


def marker_glyph(kind: str, colour: str) -> str:
    """A marker (:func:`shape`) as a 14 px icon."""
    return glyph(shape(kind, colour, 7, 7, 4.2))


def chart(
    width: float,
    height: float,
    ident: str,
    title: str,
    desc: str,
    body: str,
    *,
    role: str | None = "img",
) -> str:
    """The ``<svg>`` root of a chart: sized 1:1 in CSS pixels (it shrinks with the page),
    named by its ``<title>`` and described by its ``<desc>`` (``aria-labelledby``).

    ``ident`` makes the two ids; it must be unique in the page and made of
    ``[A-Za-z0-9._-]`` (:func:`~pytest_kimi.report.htmlkit.safe_name`).  ``role="img"`` makes
    the chart one image to a screen reader; pass None for a chart whose points are links, so
    they stay reachable.
    """
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}"'
        + (f' role="{e(role)}"' if role else "")
        + f' aria-labelledby="t-{e(ident)} d-{e(ident)}">'
        f'<title id="t-{e(ident)}">{e(title)}</title>'
        f'<desc id="d-{e(ident)}">{e(desc)}</desc>' + body + "</svg>"
    )


def standalone(svg: str) -> str:
    """A chart (:func:`chart`) as the text of its own ``.svg`` file: an XML declaration, a
    white background, and the chart CSS it takes from the page when inline."""
    head, sep, rest = svg.partition(">")
    if not sep or not head.startswith("<svg"):
        raise ValueError("not an <svg> element")
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'{head} style="background:#fff"><style>{CHART_CSS}</style>{rest}\n'
    )


# ------------------------------------------------------------------------------ scales


def nice_step(span: float, target: int = 5) -> float:
    """A tick step of 1, 2, 2.5 or 5 times a power of ten giving about ``target`` ticks."""
    raw = span / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return mult * mag
    return 10 * mag


def zero_based(values: Sequence[float], headroom: float = 0.12) -> tuple[float, float, float]:
    """(0, top, step) for an axis of throughput or latency: from zero (a truncated axis makes
    a 3% wobble look like a cliff), with ``headroom`` above the highest value for labels."""
    top = max((v for v in values if math.isfinite(v)), default=0.0) * (1 + headroom)
    if top <= 0:
        return 0.0, 1.0, 0.2
    step = nice_step(top)
    return 0.0, math.ceil(top / step - 1e-9) * step, step


def ticks(lo: float, hi: float, step: float) -> list[float]:
    """``lo``, ``lo + step``, ... up to ``hi`` (inclusive, against rounding)."""
    out, k = [], 0
    while lo + k * step <= hi + step / 2:
        out.append(lo + k * step)
        k += 1
    return out


@dataclass(frozen=True, slots=True)
class Scale:
    """Data to pixels along one axis: linear, or log2 (``log=True``, for concurrency)."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            a, b, v = math.log2(self.lo), math.log2(self.hi), math.log2(value)
        else:
            a, b, v = self.lo, self.hi, value
        frac = (v - a) / (b - a) if b > a else 0.5
        return self.px_lo + frac * (self.px_hi - self.px_lo)


def y_grid(
    scale: Callable[[float], float],
    values: Iterable[float],
    left: float,
    right: float,
    fmt: Callable[[float], str] = tick_label,
) -> str:
    """Horizontal grid lines at ``values`` with their tick labels (``fmt``) left of ``left``."""
    out = []
    for v in values:
        y = scale(v)
        out.append(
            f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 8}" y="{y + 4:.1f}" class="ytick">{e(fmt(v))}</text>'
        )
    return "".join(out)


def y_label(x: float, y: float, content: str) -> str:
    """An axis label written upwards along a y axis, centred on (x, y)."""
    return (
        f'<text x="{n(x)}" y="{n(y)}" class="axlabel" '
        f'transform="rotate(-90 {n(x)} {n(y)})">{e(content)}</text>'
    )


# ------------------------------------------------------------------------------ legends


@dataclass(frozen=True, slots=True)
class Key:
    """One legend entry: its symbol (SVG drawn in a 26 x 14 box at the origin) and its words."""

    symbol: str
    label: str


def key_line(colour: str, *, dashed: bool = False, marker: str | None = None) -> str:
    """A legend symbol: a line (dashed for a baseline), with a marker on it if given."""
    dash = ' stroke-dasharray="5 4"' if dashed else ""
    out = f'<line x1="1" x2="25" y1="7" y2="7" stroke="{colour}" stroke-width="2"{dash}/>'
    return out + (shape(marker, colour, 13, 7, 3.6) if marker else "")


def legend(keys: Sequence[Key], x: float, y: float, width: float) -> tuple[str, float]:
    """Legend entries in rows from (x, y), wrapped at ``width``: (SVG, height used)."""
    out: list[str] = []
    cx, row = x, 0
    for k in keys:
        w = 34 + 6.2 * len(k.label) + 18
        if cx > x and cx + w > x + width:
            cx, row = x, row + 1
        yy = y + row * 18
        out.append(
            f'<g transform="translate({n(cx)},{n(yy - 10)})">{k.symbol}</g>'
            + text(cx + 32, yy + 1, k.label, "ltext")
        )
        cx += w
    return "".join(out), (row + 1) * 18 if keys else 0.0


__all__ = [
    "BAND",
    "BLACK",
    "BLUE",
    "GREEN",
    "GREY",
    "Key",
    "ORANGE",
    "PURPLE",
    "SERIES",
    "SHAPES",
    "SKY",
    "Scale",
    "VERMILLION",
    "YELLOW",
    "attrs",
    "chart",
    "circle",
    "glyph",
    "key_line",
    "legend",
    "line",
    "marker_glyph",
    "n",
    "nice_step",
    "polyline",
    "rect",
    "shape",
    "standalone",
    "text",
    "tick_label",
    "ticks",
    "tip",
    "tok",
    "y_grid",
    "y_label",
    "zero_based",
]
