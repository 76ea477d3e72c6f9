"""Figures of a run, from the ``--perf-json`` shape: throughput per concurrency, and the
per-request latency a deployment pays for its aggregate throughput.

matplotlib is optional (``pip install 'pytest-kimi[plot]'``): a perf gate on a GPU runner must
not pull a plotting stack just to pass or fail.  It is therefore imported inside
:func:`require_matplotlib`, never at module import, and only through its object-oriented API
with the Agg canvas: no pyplot global state (the plugin may run inside a user's process that
uses pyplot itself), no GUI backend, never a window.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_kimi.verdicts import Verdict

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'pytest-kimi[plot]'"

FAILING = Verdict.failing()
"""Levels drawn with a red ring: the verdicts that fail a run whatever the flags."""

_NO_PROFILE = ""
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
_BASELINE_COLOUR = "#555555"
_FAIL_COLOUR = "#d62728"
_DPI = 110


class PlotUnavailable(RuntimeError):
    """Plots were asked for but matplotlib is not installed (it is an optional extra)."""


def require_matplotlib() -> None:
    """Import matplotlib or raise :class:`PlotUnavailable` naming the extra to install.

    Called before any file is written, so a missing extra fails fast instead of leaving a
    half-written report directory.
    """
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailable(
            f"plots need matplotlib, which is not installed ({exc}); install the extra: {INSTALL_HINT}"
        ) from None


@dataclass(frozen=True, slots=True)
class PlotImage:
    """One rendered figure: what ``write_html`` embeds and writes next to ``index.html``."""

    kind: str
    """``throughput`` or ``latency``."""
    title: str
    png: bytes


# ----------------------------------------------------------------------------------- helpers


def safe_name(nodeid: str, max_len: int = 80) -> str:
    """A file-name stem for a test: ``tests/perf/test_x.py::test_y[c8]`` -> ``tests-perf-test_x-test_y-c8``.

    Only ``[A-Za-z0-9._-]`` survive, so the name is valid on every filesystem and in a URL; a
    long name is cut and suffixed with a hash of the nodeid so two tests never share a file.
    """
    stem = nodeid.replace(".py::", "::")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    stem = re.sub(r"[-.]*-[-.]*", "-", stem).strip("-.") or "test"  # "c8/../x" -> "c8-x"
    if len(stem) > max_len:
        digest = hashlib.sha1(nodeid.encode("utf-8")).hexdigest()[:8]
        stem = f"{stem[: max_len - 9].rstrip('-.')}-{digest}"
    return stem


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _series(levels: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Levels grouped by ``profile`` (deployment) and swept lengths, each sorted by concurrency.

    Open-loop (rate) levels have no concurrency and are left out of these figures.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
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
        group.sort(key=lambda lv: float(lv["concurrency"]))
    return groups


def _points(
    xs: Sequence[float], group: Sequence[Mapping[str, Any]], key: str
) -> list[tuple[float, float, Mapping[str, Any]]]:
    """(x, level[key], level) for the levels where ``key`` holds a positive finite number:
    an errored level has no figures and is left out of a line instead of breaking it."""
    out: list[tuple[float, float, Mapping[str, Any]]] = []
    for x, lv in zip(xs, group):
        y = _finite(lv.get(key))
        if y is not None:
            out.append((x, y, lv))
    return out


def _baseline_samples(level: Mapping[str, Any]) -> list[float]:
    """Baseline trial samples when the report carries them (``baseline_trials_tok_s``, or
    ``baseline_trials`` as a list); today's reports carry only their count."""
    for key in ("baseline_trials_tok_s", "baseline_trials"):
        value = level.get(key)
        if isinstance(value, list):
            return [v for v in (_finite(x) for x in value) if v is not None]
    return []


def _short(nodeid: str, limit: int = 70) -> str:
    return nodeid if len(nodeid) <= limit else "…" + nodeid[-(limit - 1) :]


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _log2_concurrency_axis(ax: Axes, values: Sequence[float]) -> None:
    """Log2 x axis ticked at the measured concurrencies, labelled as plain integers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    lo, hi = min(ticks), max(ticks)
    ax.set_xlim(lo / 1.5, hi * 1.5)


def _zero_based_ylim(ax: Axes, headroom: float = 0.12) -> None:
    """Throughput and latency start at 0 (a truncated axis makes a 3% wobble look like a
    cliff), with headroom above the highest artist so labels and dashes are not clipped."""
    ax.autoscale_view()  # dataLim already holds every artist; relim() would drop collections
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top * (1 + headroom) if top > 0 else 1)


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


# ------------------------------------------------------------------------------- throughput


def throughput_figure(test: Mapping[str, Any]) -> Figure:
    """Aggregate output tok/s against concurrency (log2): trials as points, medians as a line,
    baseline median dashed (with the min-max band of its trials when the report has them),
    absolute targets as markers, failing levels ringed in red with their verdict."""
    require_matplotlib()
    fig = _new_figure(7.5, 4.6)
    ax = fig.add_subplot()
    levels = list(test.get("levels") or [])
    groups = _series(levels)
    all_c: list[float] = []
    target_labelled = fail_labelled = False
    for i, (profile, group) in enumerate(groups.items()):
        colour = _PALETTE[i % len(_PALETTE)]
        name = profile or "current"
        xs = [float(lv["concurrency"]) for lv in group]
        all_c += xs
        # trials: slight horizontal offsets so repeated values stay visible
        tx, ty = [], []
        for x, lv in zip(xs, group):
            samples = [
                v for v in (_finite(s) for s in lv.get("trials_tok_s") or []) if v is not None
            ]
            n = len(samples)
            for k, v in enumerate(samples):
                tx.append(x * 2 ** (0.06 * (k - (n - 1) / 2) / max(n - 1, 1)))
                ty.append(v)
        if tx:
            ax.scatter(
                tx,
                ty,
                s=16,
                color=colour,
                alpha=0.55,
                edgecolors="white",
                linewidths=0.4,
                label=f"{name}: trials",
                zorder=5,
            )
        med = _points(xs, group, "tok_s")
        if med:
            ax.plot(
                [x for x, _, _ in med],
                [y for _, y, _ in med],
                "-o",
                color=colour,
                lw=2,
                ms=5,
                label=f"{name}: median",
                zorder=4,
            )
        # baseline: dashed median line, band when samples are known
        base = [(x, y, _baseline_samples(lv)) for x, y, lv in _points(xs, group, "baseline_tok_s")]
        if base:
            bx = [x for x, _, _ in base]
            by = [y for _, y, _ in base]
            label = f"{name}: baseline median" if profile else "baseline median"
            if len(base) == 1:  # one level: a short horizontal dash instead of a line
                x = bx[0]
                ax.hlines(
                    by[0],
                    x / 1.25,
                    x * 1.25,
                    colors=_BASELINE_COLOUR if not profile else colour,
                    linestyles="--",
                    lw=1.6,
                    label=label,
                    zorder=2,
                )
            else:
                ax.plot(
                    bx,
                    by,
                    "--",
                    color=_BASELINE_COLOUR if not profile else colour,
                    lw=1.6,
                    label=label,
                    zorder=2,
                )
            banded = [(x, min(s), max(s)) for x, _, s in base if s]
            if banded:
                band_colour = _BASELINE_COLOUR if not profile else colour
                band_label = f"{name}: baseline min-max" if profile else "baseline trials min-max"
                if len(banded) == 1:
                    x, lo, hi = banded[0]
                    ax.fill_between(
                        [x / 1.25, x * 1.25],
                        [lo, lo],
                        [hi, hi],
                        color=band_colour,
                        alpha=0.15,
                        lw=0,
                        label=band_label,
                        zorder=1,
                    )
                else:
                    ax.fill_between(
                        [b[0] for b in banded],
                        [b[1] for b in banded],
                        [b[2] for b in banded],
                        color=band_colour,
                        alpha=0.15,
                        lw=0,
                        label=band_label,
                        zorder=1,
                    )
        targets = _points(xs, group, "target_tok_s")
        if targets:
            ax.scatter(
                [x for x, _, _ in targets],
                [y for _, y, _ in targets],
                marker="_",
                s=400,
                linewidths=2.5,
                color="black",
                label=None if target_labelled else "target (min tok/s)",
                zorder=5,
            )
            target_labelled = True
        for x, lv in zip(xs, group):
            verdict = str(lv.get("verdict", ""))
            y = _finite(lv.get("tok_s"))
            if verdict in FAILING and y is not None:
                ax.scatter(
                    [x],
                    [y],
                    s=150,
                    facecolors="none",
                    edgecolors=_FAIL_COLOUR,
                    linewidths=1.8,
                    zorder=6,
                    label=None if fail_labelled else "failing level",
                )
                fail_labelled = True
                change = lv.get("change_pct")
                note = verdict.upper() + (
                    f" {change:+.1f}%" if isinstance(change, (int, float)) else ""
                )
                # several deployments: the first series labels above its points, the others
                # below, so the labels of two nearby curves do not print over each other
                above = len(groups) > 1 and i == 0
                ax.annotate(
                    note,
                    (x, y),
                    xytext=(0, 14 if above else -16),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if above else "top",
                    fontsize=8,
                    color=_FAIL_COLOUR,
                    zorder=7,
                )
    if all_c:
        _log2_concurrency_axis(ax, all_c)
    else:
        ax.text(0.5, 0.5, "no measured levels", transform=ax.transAxes, ha="center", va="center")
    _zero_based_ylim(ax)
    ax.set_xlabel("concurrency (requests in flight, log2 scale)")
    ax.set_ylabel("aggregate output throughput (tok/s)")
    ax.set_title(
        f"{_short(str(test.get('nodeid', '?')))}\noutput throughput vs concurrency", fontsize=10
    )
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        # outside the axes: inside, it hides whichever line happens to run under it
        fig.legend(fontsize=8, loc="outside right upper", framealpha=0.85)
    return fig


# --------------------------------------------------------------------------------- latency


def latency_figure(test: Mapping[str, Any]) -> Figure:
    """The latency/throughput trade-off: per-request tok/s p50 (top) and TTFT p95 (bottom)
    against aggregate tok/s, one point per level labelled ``C=N``, one line per profile.

    This is the view a deployment choice turns on (e.g. EP8 vs TP8): the configuration with
    more aggregate tok/s may give each user fewer tok/s or a longer first token.
    """
    require_matplotlib()
    fig = _new_figure(7.5, 6.2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    groups = _series(list(test.get("levels") or []))
    ttft_values = [
        y for g in groups.values() for _, y, _ in _points([0.0] * len(g), g, "ttft_s_p95")
    ]
    in_ms = not ttft_values or max(ttft_values) < 10.0
    scale, unit = (1e3, "ms") if in_ms else (1.0, "s")
    drawn = any_failing = False
    for i, (profile, group) in enumerate(groups.items()):
        colour = _PALETTE[i % len(_PALETTE)]
        name = profile or "current run"
        # top curve falls to the right, bottom one rises: label on the side away from the line
        for ax, key, factor, dx, ha in (
            (top, "request_tok_s_p50", 1.0, 6, "left"),
            (bottom, "ttft_s_p95", scale, -6, "right"),
        ):
            xs = [_finite(lv.get("tok_s")) for lv in group]
            pts = [
                (x, y * factor, lv)
                for x, y, lv in _points([x or math.nan for x in xs], group, key)
                if math.isfinite(x)
            ]
            if not pts:
                continue
            drawn = True
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "-o",
                color=colour,
                lw=1.5,
                ms=6,
                label=name,
            )
            for x, y, lv in pts:
                failing = str(lv.get("verdict", "")) in FAILING
                any_failing |= failing
                ax.annotate(
                    f"C={lv.get('concurrency')}",
                    (x, y),
                    xytext=(dx, 6),
                    textcoords="offset points",
                    fontsize=8,
                    ha=ha,
                    color=_FAIL_COLOUR if failing else "#222222",
                )
    top.set_ylabel("per-request output\ntok/s (p50)")
    bottom.set_ylabel(f"TTFT p95 ({unit})")
    bottom.set_xlabel("aggregate output throughput (tok/s)")
    top.set_title(
        f"{_short(str(test.get('nodeid', '?')))}\nlatency / throughput trade-off "
        "(one point per concurrency C)",
        fontsize=10,
    )
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        _zero_based_ylim(ax, headroom=0.18)
    lo, hi = bottom.get_xlim()
    bottom.set_xlim(0, hi + 0.08 * (hi - lo))
    if not drawn:
        top.text(0.5, 0.5, "no measured levels", transform=top.transAxes, ha="center", va="center")
    if drawn:
        from matplotlib.lines import Line2D

        handles, labels = top.get_legend_handles_labels()
        if any_failing:
            handles.append(Line2D([], [], ls="none", marker="$C$", color=_FAIL_COLOUR))
            labels.append("red label: failing level")
        top.legend(
            handles,
            labels,
            fontsize=8,
            loc="upper right",
            title="profile" if any(groups) else None,
            title_fontsize=8,
        )
    return fig


# ---------------------------------------------------------------------------------- render


def render_test(test: Mapping[str, Any]) -> list[PlotImage]:
    """Both figures of one test as PNG bytes (figures are closed by dropping them: no pyplot)."""
    require_matplotlib()
    nodeid = str(test.get("nodeid", "?"))
    return [
        PlotImage(
            "throughput",
            f"{nodeid}: output throughput vs concurrency",
            png_bytes(throughput_figure(test)),
        ),
        PlotImage(
            "latency", f"{nodeid}: latency / throughput trade-off", png_bytes(latency_figure(test))
        ),
    ]
