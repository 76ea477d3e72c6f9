"""Figures of a run, from the ``--perf-json`` shape: throughput per concurrency, and the
per-request latency a deployment pays for its aggregate throughput.

Drawn as inline SVG with the chart kit (:mod:`pytest_kimi.report.svg`), the way the history
dashboard draws its charts: no plotting library to install (a perf gate on a GPU runner must
not pull a plotting stack to write its report), nothing that could touch a user's pyplot
state, and every point carries its figures as a tooltip.  Each figure is a ``<svg>`` string
with a ``<title>`` and a ``<desc>`` that says its numbers in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from pytest_kimi.report import svg
from pytest_kimi.report.htmlkit import safe_name
from pytest_kimi.report.svg import GREY, VERMILLION, Key, Scale
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import LevelEntry, TestEntry

FAILING = Verdict.failing()
"""Levels drawn with a red ring: the verdicts that fail a run whatever the flags."""

_NO_PROFILE = ""
_W = 960
_RIGHT = 24
_TOP = 58
_INK = "#222222"


@dataclass(frozen=True, slots=True)
class PlotImage:
    """One rendered figure: what ``write_html`` shows inline and writes next to ``index.html``."""

    kind: str
    """``throughput`` or ``latency``."""
    title: str
    svg: str
    """The ``<svg>`` element, for inline use (:func:`pytest_kimi.report.svg.standalone` makes
    it a file of its own)."""


# ----------------------------------------------------------------------------------- helpers


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _series(levels: Sequence[LevelEntry]) -> dict[str, list[LevelEntry]]:
    """Levels grouped by ``profile`` (deployment) and swept lengths, each sorted by concurrency.

    Open-loop (rate) levels have no concurrency and are left out of these figures.
    """
    groups: dict[str, list[LevelEntry]] = {}
    swept = [k for k in ("max_tokens", "input_tokens") if len({lv.get(k) for lv in levels}) > 1]
    for lv in levels:
        if _finite(lv.get("concurrency")) is None:
            continue
        name = str(lv.get("profile") or _NO_PROFILE)
        if swept:
            lengths = " ".join(f"{k}={lv.get(k)}" for k in swept)
            name = lengths if name == _NO_PROFILE else f"{name} {lengths}"
        groups.setdefault(name, []).append(lv)
    for group in groups.values():
        group.sort(key=lambda lv: _x(lv))
    return groups


def _x(level: LevelEntry) -> float:
    """The concurrency a figure plots a level at (:func:`_series` keeps only levels that
    have one)."""
    c = level["concurrency"]
    return math.nan if c is None else float(c)


def _points(
    xs: Sequence[float], group: Sequence[LevelEntry], key: str
) -> list[tuple[float, float, LevelEntry]]:
    """(x, level[key], level) for the levels where ``key`` holds a positive finite number:
    an errored level has no figures and is left out of a line instead of breaking it."""
    out: list[tuple[float, float, LevelEntry]] = []
    for x, lv in zip(xs, group):
        y = _finite(lv.get(key))
        if y is not None and math.isfinite(x):
            out.append((x, y, lv))
    return out


def _baseline_samples(level: LevelEntry) -> list[float]:
    """Baseline trial samples when the report carries them (``baseline_trials_tok_s``, or
    ``baseline_trials`` as a list); today's reports carry only their count."""
    for key in ("baseline_trials_tok_s", "baseline_trials"):
        value = level.get(key)
        if isinstance(value, list):
            return [v for v in (_finite(x) for x in value) if v is not None]
    return []


def _trials(level: LevelEntry) -> list[float]:
    return [v for v in (_finite(s) for s in level.get("trials_tok_s") or []) if v is not None]


def _short(nodeid: str, limit: int = 70) -> str:
    return nodeid if len(nodeid) <= limit else "…" + nodeid[-(limit - 1) :]


def _concurrency(level: LevelEntry) -> str:
    return f"C={level.get('concurrency')}"


def _verdict_note(level: LevelEntry) -> str:
    """``REGRESSION -12.3%``: the label of a failing level."""
    change = level.get("change_pct")
    number = isinstance(change, (int, float)) and not isinstance(change, bool)
    return str(level.get("verdict", "")).upper() + (f" {change:+.1f}%" if number else "")


def _header(test: TestEntry, subtitle: str) -> str:
    return svg.text(12, 20, _short(str(test.get("nodeid", "?"))), "ctitle") + svg.text(
        12, 38, subtitle, "csub"
    )


def _trial_dots(colour: str) -> str:
    return svg.circle(8, 9, 2.6, fill=colour, fill_opacity=0.55) + svg.circle(
        17, 5, 2.6, fill=colour, fill_opacity=0.55
    )


# ------------------------------------------------------------------------------- throughput


def throughput_svg(test: TestEntry, ident: str = "throughput") -> str:
    """Aggregate output tok/s against concurrency (log2): trials as dots, medians as a line,
    baseline median dashed (with the min-max band of its trials when the report has them),
    absolute targets as black dashes, failing levels ringed in red with their verdict."""
    left, right, plot_h = 76, _W - _RIGHT, 300.0
    top, bottom = _TOP, _TOP + plot_h
    groups = _series(list(test.get("levels") or []))
    all_c = [_x(lv) for g in groups.values() for lv in g]
    xs_scale = (
        Scale(min(all_c) / 1.5, max(all_c) * 1.5, left, right, log=True)
        if all_c
        else Scale(0.0, 1.0, left, right)
    )
    values: list[float] = []
    for g in groups.values():
        for lv in g:
            values += _trials(lv) + _baseline_samples(lv)
            values += [
                v
                for v in (_finite(lv.get(k)) for k in ("tok_s", "baseline_tok_s", "target_tok_s"))
                if v is not None
            ]
    lo, hi, step = svg.zero_based(values, 0.12)
    ys = Scale(lo, hi, bottom, top)
    back: list[str] = []  # bands and baselines, under everything
    mid: list[str] = []  # trials and medians
    front: list[str] = []  # targets, rings, labels
    keys: list[Key] = []
    words: list[str] = []
    target_keyed = fail_keyed = False
    for i, (profile, group) in enumerate(groups.items()):
        colour = svg.SERIES[i % len(svg.SERIES)]
        name = profile or "current"
        xs = [_x(lv) for lv in group]
        # trials: slight horizontal offsets so repeated values stay visible
        dots = []
        for x, lv in zip(xs, group):
            samples = _trials(lv)
            k_n = len(samples)
            for k, v in enumerate(samples):
                dx = 2 ** (0.06 * (k - (k_n - 1) / 2) / max(k_n - 1, 1))
                dots.append(svg.circle(xs_scale(x * dx), ys(v), 2.6))
        if dots:
            mid.append(
                f'<g fill="{colour}" fill-opacity="0.55" stroke="#fff" stroke-width="0.4">'
                + "".join(dots)
                + "</g>"
            )
            keys.append(Key(_trial_dots(colour), f"{name}: trials"))
        med = _points(xs, group, "tok_s")
        if med:
            if len(med) > 1:
                mid.append(
                    svg.polyline([(xs_scale(x), ys(y)) for x, y, _ in med], "series", stroke=colour)
                )
            for x, y, lv in med:
                n_trials = len(_trials(lv))
                said = (
                    f"{name} {_concurrency(lv)}: {svg.tok(y)} tok/s (median of {n_trials} "
                    f"trial{'s' if n_trials != 1 else ''}), {lv.get('verdict', 'no verdict')}"
                )
                mid.append(svg.tip(said, svg.shape("circle", colour, xs_scale(x), ys(y), 4.5)))
            keys.append(Key(svg.key_line(colour, marker="circle"), f"{name}: median"))
            words.append(
                f"{name}: "
                + ", ".join(
                    f"{_concurrency(lv)} {svg.tok(y)} tok/s ({lv.get('verdict', 'no verdict')})"
                    for _, y, lv in med
                )
            )
        # baseline: dashed median line, band when samples are known
        base = [(x, y, _baseline_samples(lv)) for x, y, lv in _points(xs, group, "baseline_tok_s")]
        if base:
            line_colour = GREY if not profile else colour
            banded = [(x, min(s), max(s)) for x, _, s in base if s]
            if banded:
                if len(banded) == 1:
                    x, b_lo, b_hi = banded[0]
                    outline = [
                        (x / 1.25, b_lo),
                        (x * 1.25, b_lo),
                        (x * 1.25, b_hi),
                        (x / 1.25, b_hi),
                    ]
                else:
                    outline = [(x, b) for x, b, _ in banded] + [
                        (x, t) for x, _, t in reversed(banded)
                    ]
                pts = " ".join(f"{svg.n(xs_scale(x))},{svg.n(ys(y))}" for x, y in outline)
                back.append(f'<polygon points="{pts}" fill="{line_colour}" fill-opacity="0.15"/>')
            if len(base) == 1:  # one level: a short horizontal dash instead of a line
                x, y, _ = base[0]
                back.append(
                    svg.line(
                        xs_scale(x / 1.25),
                        ys(y),
                        xs_scale(x * 1.25),
                        ys(y),
                        "dash",
                        stroke=line_colour,
                    )
                )
            else:
                back.append(
                    svg.polyline(
                        [(xs_scale(x), ys(y)) for x, y, _ in base], "dash", stroke=line_colour
                    )
                )
            label = f"{name}: baseline median" if profile else "baseline median"
            keys.append(Key(svg.key_line(line_colour, dashed=True), label))
            if banded:
                band_label = f"{name}: baseline min-max" if profile else "baseline trials min-max"
                keys.append(
                    Key(svg.rect(1, 3, 24, 8, fill=line_colour, fill_opacity=0.15), band_label)
                )
            words.append(
                f"{'baseline of ' + name if profile else 'baseline'}: "
                + ", ".join(f"{svg.tok(y)} tok/s" for _, y, _ in base)
            )
        targets = _points(xs, group, "target_tok_s")
        for x, y, lv in targets:
            front.append(
                svg.tip(
                    f"{_concurrency(lv)}: target at least {svg.tok(y)} tok/s",
                    svg.line(
                        xs_scale(x) - 10,
                        ys(y),
                        xs_scale(x) + 10,
                        ys(y),
                        stroke="#000",
                        stroke_width=2.5,
                    ),
                )
            )
        if targets:
            words.append(
                "targets: "
                + ", ".join(f"{_concurrency(lv)} {svg.tok(y)} tok/s" for _, y, lv in targets)
            )
            if not target_keyed:
                keys.append(
                    Key(
                        svg.line(6, 7, 20, 7, stroke="#000", stroke_width=2.5), "target (min tok/s)"
                    )
                )
                target_keyed = True
        # several deployments: the first series labels above its points, the others below, so
        # the labels of two nearby curves do not print over each other
        above = len(groups) > 1 and i == 0
        for x, y, lv in med:
            if str(lv.get("verdict", "")) not in FAILING:
                continue
            px, py = xs_scale(x), ys(y)
            front.append(
                svg.circle(px, py, 9, fill="none", stroke=VERMILLION, stroke_width=1.8)
                + svg.text(
                    px,
                    py - 14 if above else py + 25,
                    _verdict_note(lv),
                    "note",
                    fill=VERMILLION,
                    text_anchor="middle",
                )
            )
            if not fail_keyed:
                keys.append(
                    Key(
                        svg.circle(13, 7, 5.5, fill="none", stroke=VERMILLION, stroke_width=1.8),
                        "failing level",
                    )
                )
                fail_keyed = True
    axes = [svg.y_grid(ys, svg.ticks(lo, hi, step), left, right)]
    for c in sorted(set(all_c)):
        x = xs_scale(c)
        axes.append(
            svg.line(x, top, x, bottom, "grid")
            + svg.line(x, bottom, x, bottom + 4, "axis")
            + svg.text(x, bottom + 16, f"{c:g}", "xtick")
        )
    axes.append(
        svg.line(left, top, left, bottom, "axis") + svg.line(left, bottom, right, bottom, "axis")
    )
    if not all_c:
        axes.append(svg.text((left + right) / 2, top + plot_h / 2, "no measured levels", "empty"))
    axes.append(
        svg.text(
            (left + right) / 2,
            bottom + 38,
            "concurrency (requests in flight, log2 scale)",
            "axlabel",
        )
        + svg.y_label(18, top + plot_h / 2, "aggregate output throughput (tok/s)")
    )
    key_svg, key_h = svg.legend(keys, left, bottom + 62, right - left)
    height = bottom + 62 + key_h + 4
    nodeid = str(test.get("nodeid", "?"))
    desc = (
        "Aggregate output tok/s at each measured concurrency. "
        + ("; ".join(words) if words else "No measured levels")
        + "."
    )
    return svg.chart(
        _W,
        height,
        ident,
        f"{nodeid}: output throughput vs concurrency",
        desc,
        _header(test, "output throughput vs concurrency")
        + "".join(axes + back + mid + front)
        + key_svg,
    )


# --------------------------------------------------------------------------------- latency


def latency_svg(test: TestEntry, ident: str = "latency") -> str:
    """The latency/throughput trade-off: per-request tok/s p50 (top) and TTFT p95 (bottom)
    against aggregate tok/s, one point per level labelled ``C=N``, one line per profile.

    This is the view a deployment choice turns on (e.g. EP8 vs TP8): the configuration with
    more aggregate tok/s may give each user fewer tok/s or a longer first token.
    """
    left, right, panel_h, gap = 84, _W - _RIGHT, 190.0, 26.0
    groups = _series(list(test.get("levels") or []))
    ttft_values = [
        y for g in groups.values() for _, y, _ in _points([0.0] * len(g), g, "ttft_s_p95")
    ]
    in_ms = not ttft_values or max(ttft_values) < 10.0
    factor_ttft, unit = (1e3, "ms") if in_ms else (1.0, "s")
    panels = (
        ("request_tok_s_p50", 1.0, "per-request tok/s (p50)", 6.0, "start"),
        ("ttft_s_p95", factor_ttft, f"TTFT p95 ({unit})", -6.0, "end"),
    )
    # per group and panel: (aggregate tok/s, figure, level)
    drawn: dict[tuple[int, int], list[tuple[float, float, LevelEntry]]] = {}
    for i, group in enumerate(groups.values()):
        aggregate = [_finite(lv.get("tok_s")) for lv in group]
        for j, (key, factor, *_rest) in enumerate(panels):
            pts = _points([x if x is not None else math.nan for x in aggregate], group, key)
            if pts:
                drawn[(i, j)] = [(x, y * factor, lv) for x, y, lv in pts]
    agg = [x for pts in drawn.values() for x, _, _ in pts]
    _, x_hi, x_step = svg.zero_based(agg, 0.08)
    xs = Scale(0.0, x_hi, left, right)
    bottom_all = _TOP + 2 * panel_h + gap
    out: list[str] = []
    any_failing = False
    for j, (_key, _factor, label, dx, anchor) in enumerate(panels):
        top = _TOP + j * (panel_h + gap)
        bottom = top + panel_h
        figures = [y for (_, jj), pts in drawn.items() if jj == j for _, y, _ in pts]
        lo, hi, step = svg.zero_based(figures, 0.18)
        ys = Scale(lo, hi, bottom, top)
        out.append(svg.y_grid(ys, svg.ticks(lo, hi, step), left, right))
        for x_tick in svg.ticks(0.0, x_hi, x_step):
            out.append(svg.line(xs(x_tick), top, xs(x_tick), bottom, "grid"))
        out.append(
            svg.line(left, top, left, bottom, "axis")
            + svg.line(left, bottom, right, bottom, "axis")
            + svg.y_label(22, top + panel_h / 2, label)
        )
        for i, (profile, _group) in enumerate(groups.items()):
            line = drawn.get((i, j))
            if not line:
                continue
            colour = svg.SERIES[i % len(svg.SERIES)]
            name = profile or "current run"
            if len(line) > 1:
                out.append(
                    svg.polyline(
                        [(xs(x), ys(y)) for x, y, _ in line],
                        "series",
                        stroke=colour,
                        stroke_width=1.5,
                    )
                )
            for x, y, lv in line:
                failing = str(lv.get("verdict", "")) in FAILING
                any_failing |= failing
                shown = f"{svg.tok(y)} {unit}" if j == 1 else f"{svg.tok(y)} tok/s"
                said = (
                    f"{name} {_concurrency(lv)}: {svg.tok(x)} tok/s aggregate, {label} {shown}, "
                    f"{lv.get('verdict', 'no verdict')}"
                )
                out.append(
                    svg.tip(said, svg.shape("circle", colour, xs(x), ys(y), 4.5))
                    + svg.text(
                        xs(x) + dx,
                        ys(y) - 6,
                        _concurrency(lv),
                        "plabel",
                        fill=VERMILLION if failing else _INK,
                        text_anchor=anchor,
                        font_weight=700 if failing else 400,
                    )
                )
    for x_tick in svg.ticks(0.0, x_hi, x_step):
        out.append(
            svg.line(xs(x_tick), bottom_all, xs(x_tick), bottom_all + 4, "axis")
            + svg.text(xs(x_tick), bottom_all + 16, svg.tick_label(x_tick), "xtick")
        )
    out.append(
        svg.text(
            (left + right) / 2, bottom_all + 38, "aggregate output throughput (tok/s)", "axlabel"
        )
    )
    if not drawn:
        out.append(svg.text((left + right) / 2, _TOP + panel_h / 2, "no measured levels", "empty"))
    keys = [
        Key(
            svg.key_line(svg.SERIES[i % len(svg.SERIES)], marker="circle"), profile or "current run"
        )
        for i, profile in enumerate(groups)
        if (i, 0) in drawn or (i, 1) in drawn
    ]
    if any_failing:
        keys.append(
            Key(
                svg.text(13, 11, "C", "note", fill=VERMILLION, text_anchor="middle"),
                "red label: failing level",
            )
        )
    key_svg, key_h = svg.legend(keys, left, bottom_all + 62, right - left)
    height = bottom_all + 62 + key_h + 4
    words = []
    for i, profile in enumerate(groups):
        per = {lv.get("concurrency"): (x, y) for x, y, lv in drawn.get((i, 0), [])}
        ttft = {lv.get("concurrency"): y for _, y, lv in drawn.get((i, 1), [])}
        items = []
        for c in dict.fromkeys([*per, *ttft]):
            parts = []
            if c in per:
                parts += [
                    f"{svg.tok(per[c][0])} tok/s aggregate",
                    f"{svg.tok(per[c][1])} per request",
                ]
            if c in ttft:
                parts.append(f"TTFT p95 {svg.tok(ttft[c])} {unit}")
            items.append(f"C={c}: " + ", ".join(parts))
        if items:
            words.append(f"{profile or 'current run'}: " + "; ".join(items))
    desc = (
        "Per-request output tok/s (p50) and TTFT p95 against aggregate output tok/s, one point "
        "per concurrency C. " + (" | ".join(words) if words else "No measured levels") + "."
    )
    nodeid = str(test.get("nodeid", "?"))
    return svg.chart(
        _W,
        height,
        ident,
        f"{nodeid}: latency / throughput trade-off",
        desc,
        _header(test, "latency / throughput trade-off (one point per concurrency C)")
        + "".join(out)
        + key_svg,
    )


# ---------------------------------------------------------------------------------- render


def render_test(test: TestEntry, stem: str | None = None) -> list[PlotImage]:
    """Both figures of one test; ``stem`` (default: from its nodeid) names their ids, so two
    tests' charts in one page never share one."""
    nodeid = str(test.get("nodeid", "?"))
    stem = stem or safe_name(nodeid)
    return [
        PlotImage(
            "throughput",
            f"{nodeid}: output throughput vs concurrency",
            throughput_svg(test, f"{stem}-throughput"),
        ),
        PlotImage(
            "latency",
            f"{nodeid}: latency / throughput trade-off",
            latency_svg(test, f"{stem}-latency"),
        ),
    ]


__all__ = [
    "FAILING",
    "PlotImage",
    "latency_svg",
    "render_test",
    "throughput_svg",
]
