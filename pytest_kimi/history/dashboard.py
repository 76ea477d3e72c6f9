"""``kimi-perf dashboard``: the history as a static site people open, online or from disk.

Why a static site of plain files: the dashboard is built by a CI job and read as its artifact
(downloaded, unzipped, opened from ``file://``) or published to any static host, often where
the network the runner had is out of reach.  So nothing is loaded from elsewhere: no scripts,
no fonts, no CDN, CSS inline in every page, and the plots are SVG drawn here in Python, inline
in the page.  Inline SVG (not PNGs, not a JS chart library) because a point can then *be* a
link to its run's page, hovering it shows its figures (``<title>``), text stays sharp at any
zoom, and the page needs neither matplotlib nor JavaScript.

What the index shows: a summary table (per series: the latest figure, the change since the
first run, the last change point, the latest verdict), one chart per series
(:mod:`.dashboard_chart`), and every run, each linking to its page (:mod:`.dashboard_runs`).

Every table that lists a run's figure has a "vs baseline (90% CI)" column: the change against
the baseline in percent with the gate's 90% interval (a capacity's: of the compared
boundaries), or ``no-baseline`` where the level had none to be compared with.


Everything shown comes from user-controlled strings (test ids, provenance, branch names, CI
URLs), so every one goes through :func:`~pytest_kimi.report.htmlkit.e`; links are made only
from run ids (ints) and series anchors (``[A-Za-z0-9._-]``), and from a CI URL only when it is
``http(s)``.

The page shell, stylesheet, levels table and chart primitives (markers, grid, the ``<svg>``
root with its ``<title>``/``<desc>``) are the kit the run report (``--perf-html``) uses too:
:mod:`pytest_kimi.report.htmlkit` and :mod:`pytest_kimi.report.svg`.  What is drawn here is
only what a history chart has and a run report's does not: run order, change points, links.

Modules: this one writes the site and its index; :mod:`.dashboard_chart` draws a chart,
:mod:`.dashboard_runs` a run page, :mod:`.dashboard_changes` reads change points and
:mod:`.dashboard_cells` writes one point's figure and verdict.

Pure: no pytest, no database; the store (or a test) hands in the read model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_kimi.files import write_atomic
from pytest_kimi.history.dashboard_cells import (
    _date,
    _load,
    _pct,
    _plotted,
    _short_commit,
    _style,
    _verdict_html,
    _vs_cell,
    run_page_name,
)
from pytest_kimi.history.dashboard_changes import ChangeLike, _marks_by_series, _series_key
from pytest_kimi.history.dashboard_chart import _Chart, _section
from pytest_kimi.history.dashboard_runs import _all_runs, _anchors, _run_infos, _run_page, _Site
from pytest_kimi.history.model import LevelSeries, Point, RunInfo
from pytest_kimi.report.htmlkit import e as _e
from pytest_kimi.report.htmlkit import page

INDEX_NAME = "index.html"
_ATTENTION_CLASS = ' class="attention"'


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
