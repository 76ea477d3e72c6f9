"""``--perf-html DIR`` / ``kimi-perf plot``: one self-contained page, its figures inline SVG,
each figure also written as its own ``.svg`` file.

Self-contained (charts inline, CSS inline, no scripts, no external assets) because the page is
read as a CI artifact: downloaded, unzipped and opened from disk, often on a machine without
access to the network the runner had.  The figures are written on their own too, so they can
be pasted into a PR or a design doc.  Tables use the Markdown report's column model, and page,
CSS and charts come from the kit the history dashboard uses (:mod:`.htmlkit`, :mod:`.svg`), so
the page, the job summary and the dashboard never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_kimi.files import write_atomic
from pytest_kimi.verdicts import Verdict
from pytest_kimi.report.capacity_cells import capacity_html
from pytest_kimi.report.latency_cells import latency_html
from pytest_kimi.report.peer_cells import peer_html
from pytest_kimi.report.htmlkit import e as _e
from pytest_kimi.report.htmlkit import levels_table, page, safe_name, verdict_class
from pytest_kimi.report.markdown import (
    gate_line,
    run_facts,
    VERDICT_HELP,
    headline,
    level_label,
    test_title,
    verdict_counts,
    workload_text,
)
from pytest_kimi.report.terminal import price_text
from pytest_kimi.report.plots import PlotImage, render_test
from pytest_kimi.report.svg import standalone
from pytest_kimi.wire import LevelEntry, Report, TestEntry

INDEX_NAME = "index.html"

_STATUS_CLASS = {"FAILED": "s-failed", "PASSED": "s-passed", "INTERRUPTED": "s-interrupted"}


def _table(levels: list[LevelEntry], failing: frozenset[str]) -> str:
    def verdict_cell(lv: LevelEntry) -> str:
        verdict = str(lv.get("verdict", "?"))
        shown = verdict.upper() if verdict in failing else verdict
        return (
            f'<td class="{verdict_class(verdict, failing)}" '
            f'title="{_e(VERDICT_HELP.get(verdict, ""))}">{_e(shown)}</td>'
        )

    return levels_table(levels, verdict_cell)


def _figure(image: PlotImage, filename: str) -> str:
    return (
        f"<figure>{image.svg}<figcaption>{_e(image.title)} ({_e(filename)})</figcaption></figure>"
    )


def _test_section(
    test: TestEntry, failing: frozenset[str], figures: list[tuple[PlotImage, str]]
) -> str:
    nodeid = str(test.get("nodeid", "?"))
    outcome = str(test.get("outcome", "?"))
    cls = (
        "s-failed"
        if outcome in ("failed", "error")
        else _STATUS_CLASS.get(outcome.upper(), "s-none")
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
        parts.append(capacity_html(test, verdict_class(str(capacity.get("verdict")), failing)))
    latency = latency_html(test)  # TTFT/ITL vs target and baseline
    if latency:
        parts.append(latency)
    peer = peer_html(test)  # the figures vLLM/GuideLLM report
    if peer:
        parts.append(peer)
    if test.get("error"):
        parts.append(f'<pre class="error">{_e(test["error"])}</pre>')
    notes = []
    for lv in levels:
        verdict = str(lv.get("verdict", "?"))
        for reason in lv.get("reasons") or []:
            notes.append(
                f'<li><b>{_e(level_label(lv, test))}</b> <span class="{verdict_class(verdict, failing)}">'
                f"{_e(verdict)}</span>: {_e(reason)}</li>"
            )
        for error in (lv.get("errors") or [])[:5]:
            notes.append(f"<li><b>{_e(level_label(lv, test))}</b> error: {_e(error)}</li>")
    shift = test.get("shift")
    if isinstance(shift, Mapping) and shift.get("text"):
        verdict = str(shift.get("verdict", "?"))
        notes.append(
            f'<li><b>all levels</b> <span class="{verdict_class(verdict, failing)}">'
            f"{_e(verdict)}</span>: {_e(shift['text'])}</li>"
        )
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
    report: Report,
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
    judged = gate_line(report)
    if judged:
        head.append(f'<p class="meta">{_e(judged)}</p>')
    counts = verdict_counts(tests)
    if counts:
        head.append(
            "<p>Levels: "
            + ", ".join(
                f'<span class="{verdict_class(v, failing)}">{n} {_e(v)}</span>'
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
    culprit = report.get("culprit")
    if isinstance(culprit, Mapping):
        sections.append(_culprit_section(culprit))
    race = report.get("race")
    if isinstance(race, Mapping):
        sections.append(_race_section(race))
    body = (
        "\n".join(head)
        + "\n"
        + "\n".join(sections)
        + f'\n<h2>Verdicts</h2><dl class="legend">{legend}</dl>'
        '<p class="meta">no-baseline fails with --perf-require-baseline; underpowered fails '
        "with --perf-strict; inconclusive (an estimate beyond the tolerance) always fails.</p>"
    )
    return page(f"{title}: {status}", body)


def _culprit_section(section: Mapping[str, Any]) -> str:
    """``--perf-culprit``: the search's steps as a table, then its answer (the terminal's
    lines, :func:`pytest_kimi.report.culprit_text.format_culprit`, one row per step)."""
    from pytest_kimi.report.culprit_text import format_culprit

    head, *steps, answer = format_culprit(section, 10_000)
    rows = "".join(f"<li><code>{_e(line.strip())}</code></li>" for line in steps)
    return (
        f'<h2 id="culprit">Which change did it</h2><p>{_e(head)}</p>'
        f"<ul>{rows}</ul><p><b>{_e(answer)}</b></p>"
    )


def _race_section(section: Mapping[str, Any]) -> str:
    """``--perf-race``: the ranking as a table (the Markdown summary's rows,
    :func:`pytest_kimi.report.race_text.race_rows`), the answer, then the frontier chart
    (:func:`pytest_kimi.report.race_chart.frontier_svg`) when the race measured one."""
    from pytest_kimi.report.race_chart import frontier_svg
    from pytest_kimi.report.race_text import HEADER, answer_text, head_text, race_rows

    head = "".join(f"<th>{_e(h)}</th>" for h in HEADER)
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td><b>{_e(c)}</b></td>" if row[-1] == "winner" and i == 1 else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in race_rows(section)
    )
    parts = [
        f'<h2 id="race">Which deployment is best</h2><p>{_e(head_text(section))}</p>',
        f'<table class="race"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>',
        f"<p><b>{_e(answer_text(section))}</b></p>",
    ]
    frontier = [c for c in section.get("frontier") or [] if isinstance(c, Mapping)]
    if any(c.get("points") for c in frontier):
        parts.append(f"<figure>{frontier_svg(section)}</figure>")
    return "\n".join(parts)


def plot_tests(tests: Iterable[TestEntry]) -> list[TestEntry]:
    """One entry per nodeid to plot: the entries of a same-run A/B (one per deployment, each
    with a test-level ``profile``) merged, their levels tagged with that profile, so a figure
    shows the deployments side by side as one series each."""
    merged: dict[str, TestEntry] = {}
    for test in tests:
        nodeid = str(test.get("nodeid", "?"))
        profile = test.get("profile")
        levels: list[LevelEntry] = []
        for lv in test.get("levels") or []:
            level = lv.copy()
            if profile:
                level["profile"] = lv.get("profile", profile)
            levels.append(level)
        if nodeid in merged:
            merged[nodeid]["levels"] += levels
        else:
            merged[nodeid] = {**test, "levels": levels}
    return list(merged.values())


def write_html(
    report: Report,
    out_dir: Path,
    *,
    plots: bool = True,
    failing_verdicts: Iterable[str] | None = None,
) -> Path:
    """Write ``index.html`` and ``<test>-throughput.svg`` / ``<test>-latency.svg`` into
    ``out_dir``; return the path of ``index.html``.

    ``plots=False`` writes the tables only.  Every file is written atomically
    (:func:`pytest_kimi.files.write_atomic`) and ``index.html`` last, so a page that exists is
    whole and its figure files exist.
    """
    out_dir = Path(out_dir)
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
            for image in render_test(test, stem):
                filename = f"{stem}-{image.kind}.svg"
                write_atomic(out_dir / filename, standalone(image.svg))
                pairs.append((image, filename))
            figures[nodeid] = pairs
    index = out_dir / INDEX_NAME
    write_atomic(index, render_html(report, figures, failing_verdicts=failing_verdicts))
    return index
