"""The dashboard's run pages: one page per run, and the site-wide facts every page reads.

A run page shows who ran it, when and where, the change points that took effect in it, its
tests with their verdicts as its report had them (the HTML report's columns), its provenance,
and whatever else the store keeps of it.  Everything shown comes from user-controlled strings
(test ids, provenance, branch names, CI URLs), so every one goes through
:func:`~pytest_kimi.report.htmlkit.e`; a CI URL becomes a link only when it is ``http(s)``.

Why a module of its own: a run page reads the store's details (an open-ended mapping), the
index reads the series; apart from :class:`_Site`, worked out once for a site of a thousand
pages, the two share nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from pytest_kimi.history.dashboard_cells import (
    _STYLES,
    _Style,
    _baseline_of,
    _bracket,
    _date,
    _glyph,
    _load,
    _safe_href,
    _verdict_html,
    _vs_cell,
)
from pytest_kimi.history.dashboard_changes import _Mark, _mark
from pytest_kimi.history.model import LevelSeries, Point, RunInfo
from pytest_kimi.report.capacity_cells import capacity_html
from pytest_kimi.report.htmlkit import e as _e
from pytest_kimi.report.htmlkit import levels_table, page, safe_name
from pytest_kimi.report.markdown import VERDICT_HELP, level_label, workload_text
from pytest_kimi.report.svg import tok as _tok
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import StoredTest


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


def _all_runs(series: Sequence[LevelSeries], runs: Mapping[int, Mapping[str, Any]]) -> list[int]:
    ids = {p.run.id for s in series for p in s.points}
    ids |= {int(k) for k in runs}
    return sorted(ids)


def _run_infos(series: Sequence[LevelSeries]) -> dict[int, RunInfo]:
    return {p.run.id: p.run for s in series for p in s.points}


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


def _report_test(test: StoredTest, site: _Site, run_id: int) -> str:
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
        stored: list[StoredTest] = tests  # the store's run details: JSON
        body += [_report_test(t, site, run_id) for t in stored if isinstance(t, Mapping)]
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
