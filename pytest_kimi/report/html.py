"""``--perf-html DIR`` / ``kimi-perf plot``: one self-contained page plus the figures as PNGs.

Self-contained (figures as ``data:`` URIs, inline CSS, no scripts, no external assets) because
the page is read as a CI artifact: downloaded, unzipped and opened from disk, often on a
machine without access to the network the runner had.  The PNGs are also written on their own
so they can be pasted into a PR or a design doc.  Tables use the Markdown report's column
model, so the page and the job summary never disagree.
"""

from __future__ import annotations

import base64
import html
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_kimi.verdicts import Verdict
from pytest_kimi.report.capacity import capacity_html
from pytest_kimi.report.markdown import (
    run_facts,
    VERDICT_HELP,
    headline,
    is_warning,
    level_label,
    summary_columns,
    test_title,
    verdict_counts,
    workload_text,
)
from pytest_kimi.report.terminal import price_text
from pytest_kimi.report.plots import PlotImage, render_test, require_matplotlib, safe_name

INDEX_NAME = "index.html"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:1100px;
padding:0 1rem;color:#222;line-height:1.4}
h1{font-size:1.5rem;margin-bottom:.3rem}h2{font-size:1.1rem;margin-top:2.2rem;border-top:1px solid #ddd;
padding-top:1rem}code{background:#f3f3f3;padding:0 .25em;border-radius:3px}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .55rem}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{font-weight:700;padding:.1rem .5rem;border-radius:4px;color:#fff}
.s-failed,.v-failing{background:#c62828;color:#fff}.s-passed{background:#2e7d32}.s-none{background:#777}
.v-failing{font-weight:700}.v-warning{background:#fff3cd}.v-improved{background:#e3f2e3}
.meta{color:#555}.changes{background:#fff8e1;padding:.4rem .6rem;border-left:4px solid #f0ad4e}
figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.85rem}dl.legend dt{font-weight:700;float:left;clear:left;width:8rem}
dl.legend dd{margin-left:8.5rem}
"""


_STATUS_CLASS = {"FAILED": "s-failed", "PASSED": "s-passed"}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _verdict_class(verdict: str, failing: frozenset[str]) -> str:
    if verdict in failing:
        return "v-failing"
    if is_warning(verdict):
        return "v-warning"
    if verdict == Verdict.IMPROVED:
        return "v-improved"
    return ""


def _table(levels: list[Mapping[str, Any]], failing: frozenset[str]) -> str:
    cols = summary_columns(levels)
    head = "".join(f"<th>{_e(c.header)}</th>" for c in cols) + "<th>verdict</th>"
    rows = []
    for lv in levels:
        verdict = str(lv.get("verdict", "?"))
        cells = "".join(
            f'<td class="{"num" if c.numeric else ""}">{_e(c.value(lv))}</td>' for c in cols
        )
        shown = verdict.upper() if verdict in failing else verdict
        cells += f'<td class="{_verdict_class(verdict, failing)}" title="{_e(VERDICT_HELP.get(verdict, ""))}">{_e(shown)}</td>'
        rows.append(f"<tr>{cells}</tr>")
    return f'<table class="levels"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _figure(image: PlotImage, filename: str) -> str:
    data = base64.b64encode(image.png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{_e(image.title)}">'
        f"<figcaption>{_e(image.title)} ({_e(filename)})</figcaption></figure>"
    )


def _test_section(
    test: Mapping[str, Any], failing: frozenset[str], figures: list[tuple[PlotImage, str]]
) -> str:
    nodeid = str(test.get("nodeid", "?"))
    outcome = str(test.get("outcome", "?"))
    cls = (
        "s-failed"
        if outcome in ("failed", "error")
        else ("s-passed" if outcome == "passed" else "s-none")
    )
    where = f" on <code>{_e(test['profile'])}</code>" if test.get("profile") else ""
    parts = [
        f'<h2 id="{_e(safe_name(test_title(test)))}"><code>{_e(nodeid)}</code>{where} '
        f'<span class="status {cls}">{_e(outcome.upper())}</span></h2>'
    ]
    meta = []
    if test.get("workload"):
        meta.append(f"workload <code>{_e(workload_text(test['workload']))}</code>")
    if test.get("compared_with"):
        meta.append(f"compared with {_e(test['compared_with'])}")
    elif test.get("baseline_profile"):
        meta.append(f"baseline profile <code>{_e(test['baseline_profile'])}</code>")
    if test.get("baseline_file") and not test.get("compared_with"):
        meta.append(f"baseline file <code>{_e(test['baseline_file'])}</code>")
    price = price_text(test)
    if price:
        meta.append(_e(price))
    if meta:
        parts.append(f'<p class="meta">{" · ".join(meta)}</p>')
    levels = list(test.get("levels") or [])
    parts.append(_table(levels, failing) if levels else "<p><em>no levels measured</em></p>")
    capacity = test.get("capacity")
    if isinstance(capacity, Mapping):  # a @capacity test: its capacity and search
        parts.append(capacity_html(test, _verdict_class(str(capacity.get("verdict")), failing)))
    if test.get("error"):
        parts.append(f'<pre class="error">{html.escape(str(test["error"]))}</pre>')
    notes = []
    for lv in levels:
        verdict = str(lv.get("verdict", "?"))
        for reason in lv.get("reasons") or []:
            notes.append(
                f'<li><b>{_e(level_label(lv, test))}</b> <span class="{_verdict_class(verdict, failing)}">'
                f"{_e(verdict)}</span>: {_e(reason)}</li>"
            )
        for error in (lv.get("errors") or [])[:5]:
            notes.append(f"<li><b>{_e(level_label(lv, test))}</b> error: {_e(error)}</li>")
    if notes:
        parts.append(f"<ul>{''.join(notes)}</ul>")
    if test.get("baseline_note"):
        parts.append(f"<p>{_e(test['baseline_note'])}</p>")
    changes = test.get("provenance_changes") or []
    if changes:
        against = f"vs {test['compared_with']}" if test.get("compared_with") else "since baseline"
        parts.append(
            f'<p class="changes">changed {_e(against)}: '
            + "; ".join(f"<code>{_e(c)}</code>" for c in changes)
            + "</p>"
        )
    parts += [_figure(image, filename) for image, filename in figures]
    return "\n".join(parts)


def render_html(
    report: Mapping[str, Any],
    figures: Mapping[str, list[tuple[PlotImage, str]]] | None = None,
    *,
    failing_verdicts: Iterable[str] | None = None,
) -> str:
    """The page as a string; ``figures`` maps a nodeid to its (image, file name) pairs."""
    failing = frozenset(failing_verdicts) if failing_verdicts is not None else Verdict.failing()
    figures = figures or {}
    tests = list(report.get("tests") or [])
    status, summary = headline(report)
    title = str(report.get("title") or "pytest-kimi throughput")
    head = [
        f'<h1>{_e(title)} <span class="status {_STATUS_CLASS.get(status, "s-none")}">{_e(status)}</span></h1>',
        f"<p><b>{_e(summary)}</b></p>",
    ]
    where = [
        f"{label} <code>{_e(v)}</code>" if is_code else f"{label} {_e(v)}"
        for label, v, is_code in run_facts(report)
    ]
    if where:
        head.append(f'<p class="meta">{" · ".join(where)}</p>')
    counts = verdict_counts(tests)
    if counts:
        head.append(
            "<p>Levels: "
            + ", ".join(
                f'<span class="{_verdict_class(v, failing)}">{n} {_e(v)}</span>'
                for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            )
            + "</p>"
        )
    head += [f"<p>{_e(note)}</p>" for note in report.get("notes") or []]
    if len(tests) > 1:
        head.append(
            "<ul>"
            + "".join(
                f'<li><a href="#{_e(safe_name(test_title(t)))}">{_e(test_title(t))}</a> '
                f"({_e(t.get('outcome', '?'))})</li>"
                for t in tests
            )
            + "</ul>"
        )
    # an A/B run has one entry per deployment for the same nodeid and one figure pair for
    # all of them: shown after the last entry, so it follows every table it draws
    last = {str(t.get("nodeid")): i for i, t in enumerate(tests)}
    sections = [
        _test_section(
            t,
            failing,
            figures.get(str(t.get("nodeid")), []) if last[str(t.get("nodeid"))] == i else [],
        )
        for i, t in enumerate(tests)
    ]
    legend = "".join(
        f"<dt>{_e(v)}</dt><dd>{_e(meaning)}{' <b>(fails the run)</b>' if v in failing else ''}</dd>"
        for v, meaning in VERDICT_HELP.items()
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}: {_e(status)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(head)
        + "\n"
        + "\n".join(sections)
        + f'\n<h2>Verdicts</h2><dl class="legend">{legend}</dl>'
        '<p class="meta">no-baseline fails with --perf-require-baseline; inconclusive and '
        "underpowered fail with --perf-strict.</p>\n</body></html>\n"
    )


def plot_tests(tests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per nodeid to plot: the entries of a same-run A/B (one per deployment, each
    with a test-level ``profile``) merged, their levels tagged with that profile, so a figure
    shows the deployments side by side as one series each."""
    merged: dict[str, dict[str, Any]] = {}
    for test in tests:
        nodeid = str(test.get("nodeid", "?"))
        profile = test.get("profile")
        levels = [
            dict(lv, profile=lv.get("profile", profile)) if profile else dict(lv)
            for lv in test.get("levels") or []
        ]
        if nodeid in merged:
            merged[nodeid]["levels"] += levels
        else:
            merged[nodeid] = {**test, "levels": levels}
    return list(merged.values())


def write_html(
    report: Mapping[str, Any],
    out_dir: Path,
    *,
    plots: bool = True,
    failing_verdicts: Iterable[str] | None = None,
) -> Path:
    """Write ``index.html`` and ``<test>-throughput.png`` / ``<test>-latency.png`` into
    ``out_dir``; return the path of ``index.html``.

    ``plots=True`` needs matplotlib and raises :class:`~.plots.PlotUnavailable` before
    anything is written; ``plots=False`` writes the tables only.  ``index.html`` is written
    last and atomically, so a page that exists always refers to PNGs that exist.
    """
    if plots:
        require_matplotlib()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, list[tuple[PlotImage, str]]] = {}
    used: set[str] = set()
    if plots:
        for test in plot_tests(report.get("tests") or []):
            nodeid = str(test.get("nodeid", "?"))
            stem = safe_name(nodeid)
            n = 2
            while stem in used:  # two nodeids that sanitise alike (a[b] vs a-b)
                stem = f"{safe_name(nodeid)}-{n}"
                n += 1
            used.add(stem)
            pairs = []
            for image in render_test(test):
                filename = f"{stem}-{image.kind}.png"
                (out_dir / filename).write_bytes(image.png)
                pairs.append((image, filename))
            figures[nodeid] = pairs
    page = render_html(report, figures, failing_verdicts=failing_verdicts)
    index = out_dir / INDEX_NAME
    fd, tmp = tempfile.mkstemp(prefix=f".{INDEX_NAME}.", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the page from a web server / other users
        os.replace(tmp, index)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return index
