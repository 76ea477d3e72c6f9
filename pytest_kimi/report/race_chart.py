"""The race's frontier as an inline SVG chart: tok/s per user (interactivity) across, tok/s
per GPU (what the hardware yields) up, one line per deployment through its load levels.

Why this figure: a race ranks deployments on one number, but the choice it stands for is a
trade-off (EP8 may give more tok/s per GPU at high concurrency and fewer tok/s to each user).
The frontier shows where each deployment sits on that trade-off, with the 90% band of each
point's tok/s per GPU over its launches, so a reader sees whether the winner is ahead
everywhere or only at the level the objective looked at.  The winner is drawn last, thicker,
and named so in the legend; each deployment also has its own marker shape, so nothing rests
on colour alone (:mod:`pytest_kimi.report.svg`'s rule).

Drawn with the chart kit every figure of pytest-kimi uses, so it needs nothing and loads
nothing.  Deployment names and level labels come from profile files and servers: they are made
printable (:func:`~pytest_kimi.printable.printable`: a control character is not even valid
XML) and escaped by the kit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pytest_kimi.printable import printable
from pytest_kimi.report import svg
from pytest_kimi.report.race_text import NAME_LIMIT, objective_text
from pytest_kimi.report.svg import BLACK, Key, Scale

_W = 960
_LEFT = 84
_RIGHT = _W - 24
_TOP = 58
_PLOT_H = 320.0
_WINNER_STROKE = 3.5
_STROKE = 1.8


@dataclass(frozen=True, slots=True)
class _Point:
    x: float
    y: float
    band: tuple[float, float] | None
    label: str
    launches: Any


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _points(curve: Mapping[str, Any]) -> list[_Point]:
    """The curve's points with both coordinates, sorted by tok/s per user; the band only where
    ``tok_s_per_gpu_ci90`` is a finite ``[lo, hi]``."""
    out: list[_Point] = []
    for p in curve.get("points") or []:
        if not isinstance(p, Mapping):
            continue
        x, y = _positive(p.get("tok_s_per_user")), _positive(p.get("tok_s_per_gpu"))
        if x is None or y is None:
            continue
        ci = p.get("tok_s_per_gpu_ci90")
        band = None
        if isinstance(ci, (list, tuple)) and len(ci) == 2:
            lo, hi = _positive(ci[0]), _positive(ci[1])
            if lo is not None and hi is not None:
                band = (min(lo, hi), max(lo, hi))
        label = printable(str(p.get("label") or f"C={p.get('concurrency')}"), 40)
        out.append(_Point(x, y, band, label, p.get("launches")))
    out.sort(key=lambda pt: pt.x)
    return out


def _bands(points: list[_Point]) -> list[list[tuple[float, float, float]]]:
    """Runs of consecutive points that have a band, as (x, lo, hi): a point without one breaks
    the polygon, so no band is drawn where none was measured."""
    runs: list[list[tuple[float, float, float]]] = [[]]
    for p in points:
        if p.band is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((p.x, *p.band))
    return [r for r in runs if r]


def frontier_svg(section: Mapping[str, Any], ident: str = "race-frontier") -> str:
    """The chart (an ``<svg>`` element) of the section's ``frontier``: a polyline per
    deployment with its translucent 90% band, the winner emphasised, the per-user floor of
    the objective as a dashed line when it has one.  ``ident`` names the chart's ids (unique
    in the page)."""
    winner = section.get("winner")
    curves: list[tuple[str, bool, list[_Point]]] = []
    for curve in section.get("frontier") or []:
        if isinstance(curve, Mapping):
            dep = curve.get("deployment")
            shown = printable(str(dep), NAME_LIMIT)
            curves.append((shown, winner is not None and dep == winner, _points(curve)))
    objective = section.get("objective")
    floor = (
        _positive(objective.get("min_request_tok_s")) if isinstance(objective, Mapping) else None
    )
    top, bottom = _TOP, _TOP + _PLOT_H
    xs_all = [p.x for _, _, pts in curves for p in pts] + ([floor] if floor else [])
    ys_all = [v for _, _, pts in curves for p in pts for v in (p.y, *(p.band or ()))]
    _, x_hi, x_step = svg.zero_based(xs_all, 0.08)
    _, y_hi, y_step = svg.zero_based(ys_all, 0.12)
    xs, ys = Scale(0.0, x_hi, _LEFT, _RIGHT), Scale(0.0, y_hi, bottom, top)

    axes = [svg.y_grid(ys, svg.ticks(0.0, y_hi, y_step), _LEFT, _RIGHT)]
    for tick in svg.ticks(0.0, x_hi, x_step):
        axes.append(
            svg.line(xs(tick), top, xs(tick), bottom, "grid")
            + svg.line(xs(tick), bottom, xs(tick), bottom + 4, "axis")
            + svg.text(xs(tick), bottom + 16, svg.tick_label(tick), "xtick")
        )
    axes.append(
        svg.line(_LEFT, top, _LEFT, bottom, "axis")
        + svg.line(_LEFT, bottom, _RIGHT, bottom, "axis")
        + svg.text((_LEFT + _RIGHT) / 2, bottom + 38, "output tok/s per user (p50)", "axlabel")
        + svg.y_label(22, top + _PLOT_H / 2, "output tok/s per GPU")
    )
    keys: list[Key] = []
    if floor is not None:
        axes.append(
            svg.tip(
                f"the objective's floor: at least {svg.tok(floor)} tok/s per user",
                svg.line(xs(floor), top, xs(floor), bottom, "dash", stroke=BLACK),
            )
        )

    back: list[str] = []
    front: list[str] = []
    words: list[str] = []
    order = sorted(range(len(curves)), key=lambda i: curves[i][1])  # the winner last, on top
    for i in order:
        dep, is_winner, pts = curves[i]
        colour = svg.SERIES[i % len(svg.SERIES)]
        marker = svg.SHAPES[i % len(svg.SHAPES)]
        width = _WINNER_STROKE if is_winner else _STROKE
        for run in _bands(pts):
            if len(run) == 1:  # one point: a short bar across its interval
                x, lo, hi = run[0]
                back.append(
                    svg.rect(xs(x) - 4, ys(hi), 8, ys(lo) - ys(hi), fill=colour, fill_opacity=0.2)
                )
                continue
            outline = [(xs(x), ys(lo)) for x, lo, _ in run] + [
                (xs(x), ys(hi)) for x, _, hi in reversed(run)
            ]
            pts_text = " ".join(f"{svg.n(x)},{svg.n(y)}" for x, y in outline)
            back.append(f'<polygon points="{pts_text}" fill="{colour}" fill-opacity="0.2"/>')
        if len(pts) > 1:
            front.append(
                svg.polyline(
                    [(xs(p.x), ys(p.y)) for p in pts], "series", stroke=colour, stroke_width=width
                )
            )
        for p in pts:
            band = f" (90% CI {svg.tok(p.band[0])} .. {svg.tok(p.band[1])})" if p.band else ""
            said = (
                f"{dep} {p.label}: {svg.tok(p.x)} tok/s per user, {svg.tok(p.y)} tok/s per GPU"
                f"{band}, {p.launches} launch(es)"
            )
            front.append(
                svg.tip(
                    said, svg.shape(marker, colour, xs(p.x), ys(p.y), 5.5 if is_winner else 4.5)
                )
            )
            if is_winner:
                front.append(svg.text(xs(p.x) + 7, ys(p.y) - 8, p.label, "plabel"))
        if pts:
            words.append(
                f"{dep}{' (winner)' if is_winner else ''}: "
                + ", ".join(
                    f"{p.label} {svg.tok(p.x)} per user, {svg.tok(p.y)} per GPU" for p in pts
                )
            )
    for i, (dep, is_winner, pts) in enumerate(curves):  # the legend in the section's order
        colour = svg.SERIES[i % len(svg.SERIES)]
        width = _WINNER_STROKE if is_winner else _STROKE
        symbol = (
            f'<line x1="1" x2="25" y1="7" y2="7" stroke="{colour}" stroke-width="{width}"/>'
            + svg.shape(svg.SHAPES[i % len(svg.SHAPES)], colour, 13, 7, 3.6)
        )
        label = f"{dep} (winner)" if is_winner else dep
        keys.append(Key(symbol, label if pts else f"{label} (no point)"))
    if floor is not None:
        keys.append(Key(svg.key_line(BLACK, dashed=True), f"floor {svg.tok(floor)} tok/s/user"))
    if any(p.band for _, _, pts in curves for p in pts):
        keys.append(Key(svg.rect(1, 3, 24, 8, fill=svg.GREY, fill_opacity=0.2), "90% interval"))
    if not words:
        axes.append(
            svg.text((_LEFT + _RIGHT) / 2, top + _PLOT_H / 2, "no frontier points", "empty")
        )
    key_svg, key_h = svg.legend(keys, _LEFT, bottom + 62, _RIGHT - _LEFT)
    height = bottom + 62 + key_h + 4
    title = "which deployment is best: tok/s per GPU vs tok/s per user"
    header = svg.text(12, 20, title, "ctitle") + svg.text(
        12, 38, objective_text(section)[:140], "csub"
    )
    desc = (
        "Output tok/s per GPU against output tok/s per user, one line per deployment through "
        "its load levels, with the 90% interval of tok/s per GPU. "
        + ("; ".join(words) if words else "No frontier points")
        + "."
    )
    return svg.chart(
        _W, height, ident, title, desc, header + "".join(axes + back + front) + key_svg
    )


__all__ = ["frontier_svg"]
