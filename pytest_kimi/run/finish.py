"""The end of a session, without pytest: reports, the history row, the baseline update.

The plugin's reporter calls :func:`finish_run` once, on the controller, with every test's
record (the workers' arrive with their test reports).  Each sink is independent: a report that
cannot be written, or a history database that is down, costs one line of the summary and never
the other sinks, the results or the exit code (a finished measurement is never lost to a
failing sink).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimi.baseline.update import update_baselines
from pytest_kimi.options import KimiOptions
from pytest_kimi.report.json_report import build_report, write_json, write_text
from pytest_kimi.run.gating import GateContext
from pytest_kimi.run.server_starts import pool_sessions, session_noise
from pytest_kimi.scrub import scrub, scrub_text


@dataclass(slots=True)
class RunSummary:
    """What the terminal summary says after the run's reports were written."""

    session_noise: dict[str, Any] | None = None
    updates: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Baselines ``--update-baselines`` refused to write: the run then exits non-zero."""
    history: tuple[str, bool] | None = None
    """``--perf-history``: where the run went (False) or why it did not (True)."""
    problems: list[str] = field(default_factory=list)
    """Sinks that failed (a report path that cannot be written): one line each."""
    interrupted: str | None = None
    """What stopped the run before its end (the report's ``interrupted``), or None."""


def finish_run(
    opts: KimiOptions,
    gate: GateContext,
    endpoint: Mapping[str, Any] | None,
    tests: Sequence[Mapping[str, Any]],
    endpoints: Mapping[str, Mapping[str, Any]],
    *,
    rootdir: Path,
    deployments: Sequence[str],
    interrupted: str | None = None,
) -> RunSummary:
    """Write every sink from the run's test records (the ``--perf-json`` test objects);
    ``interrupted`` (what stopped the run, when a signal did) heads every report."""
    summary = RunSummary(interrupted=interrupted)
    tests = list(tests)
    summary.session_noise = session_noise(tests, current_sigma=opts.perf_session_sigma)
    report = build_report(
        dict(endpoint) if endpoint else None,
        [dict(t) for t in tests],
        summary.session_noise,
        gate.report_fields(),
        interrupted=interrupted,
    )
    summary.problems.extend(
        write_reports(opts, report, gate.settings.failing_verdicts(), os.environ)
    )
    summary.history = store_history(opts, gate, report, endpoints, rootdir, deployments)
    if gate.update is not None and tests:
        summary.updates, summary.refused = update_baselines(
            gate.root,
            gate.profile,
            gate.update,
            pool_sessions(tests),  # --perf-sessions: one baseline of all starts
            {k: dict(v) for k, v in endpoints.items()},
            rootdir,
        )
    return summary


def write_reports(
    opts: KimiOptions,
    report: dict[str, Any],
    failing: frozenset[str],
    environ: Mapping[str, str],
) -> list[str]:
    """JSON, Markdown (also to GitHub's step summary) and HTML, each from the one report dict;
    the problems of those that could not be written (each sink on its own).

    The dict is scrubbed once more here: server info was cleaned where it entered, but error
    texts and notes come from everywhere, and these files get uploaded and published.
    """
    if not report["tests"]:
        return []
    report = scrub(report)
    problems: list[str] = []

    def sink(what: str, write: Any) -> None:
        try:
            write()
        except Exception as exc:  # one sink's failure costs a line, never the others
            problems.append(scrub_text(f"{what} not written: {type(exc).__name__}: {exc}"))

    if opts.perf_json is not None:
        path = opts.perf_json
        sink(f"--perf-json {path}", lambda: write_json(path, report))
    markdown_path = opts.perf_markdown
    step_summary = environ.get("GITHUB_STEP_SUMMARY")
    if markdown_path or step_summary:
        from pytest_kimi.report.markdown import render_markdown

        text = render_markdown(report, failing_verdicts=failing)
        if markdown_path:
            sink(f"--perf-markdown {markdown_path}", lambda: write_text(markdown_path, text))
        if step_summary:

            def append() -> None:
                with open(step_summary, "a", encoding="utf-8") as fh:
                    fh.write(text + "\n")

            sink(f"GITHUB_STEP_SUMMARY {step_summary}", append)
    if opts.perf_html is not None:
        from pytest_kimi.report.html import write_html

        html_dir = opts.perf_html
        sink(
            f"--perf-html {html_dir}",
            lambda: write_html(report, html_dir, failing_verdicts=failing),
        )
    return problems


def store_history(
    opts: KimiOptions,
    gate: GateContext,
    report: dict[str, Any],
    endpoints: Mapping[str, Mapping[str, Any]],
    rootdir: Path,
    deployments: Sequence[str],
) -> tuple[str, bool] | None:
    """Append the run to ``--perf-history``; the summary's line, and whether it failed.

    Nothing is written for ``off`` or a run that measured nothing.  A database that is down or
    refuses the write costs this one line (URL without password, and why), never the run's
    results or exit code: every exception is caught here, not only the store's own.
    """
    from pytest_kimi.history.record import measured_anything

    if opts.perf_history is None or not measured_anything(report):
        return None
    from pytest_kimi.history.urls import HistoryError, display_url

    shown = display_url(opts.perf_history, rootdir)
    try:
        from pytest_kimi.history.store import RunMeta, open_history

        meta = RunMeta.collect(
            report,
            suite_dir=rootdir,
            deployment=",".join(deployments) if deployments else gate.profile,
            endpoints={k: dict(v) for k, v in endpoints.items()},
        )
        with open_history(opts.perf_history) as history:
            run_id = history.record_run(scrub(report), meta)
    except Exception as exc:  # the history must never cost the run, whatever went wrong
        why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
        why = why.removeprefix(f"history {display_url(opts.perf_history)}: ")
        where = f"{shown} ({opts.source('perf_history')})"  # shown: password hidden already
        return f"history: run not stored in {where}: {scrub_text(why)}", True
    return f"history: run {run_id} -> {shown}", False
