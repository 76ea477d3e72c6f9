"""The end of a session, without pytest: the baseline update, the history row, the reports.

The plugin's reporter calls :func:`finish_run` once, on the controller, with every test's
record (the workers' arrive with their test reports).  Each sink is independent: a report that
cannot be written, a history database that is down or a baseline directory that refuses the
write costs one line of the summary and never the other sinks or the results (a finished
measurement is never lost to a failing sink); a failed sink fails the run's exit status.

The order is baselines, history, reports: the stores first, because they are what the next
run reads and what cannot be rebuilt from anything else, the files last, because they are what
most often cannot be written (a path, a full disk) and every one of them can be rebuilt from
the history (``kimi-perf``).  Every stage catches every exception, not only ``OSError``: a
renderer's bug in one report must not cost the history row of a two-hour run.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_kimi.baseline.update import update_baselines
from pytest_kimi.options import KimiOptions
from pytest_kimi.report.json_report import build_report, write_json, write_text
from pytest_kimi.report.requests_file import problems_in
from pytest_kimi.run.culprit_run import CulpritReport
from pytest_kimi.run.deploy_gate import DeployGate, deploy_changes, judge
from pytest_kimi.run.gating import GateContext
from pytest_kimi.run.server_starts import attach_session_noise, pool_sessions, session_noise
from pytest_kimi.scrub import scrub, scrub_text
from pytest_kimi.wire import Report, SessionNoiseSection, TestEntry

if TYPE_CHECKING:  # a run without --perf-race never loads the race
    from pytest_kimi.run.race_run import RaceReport

_T = TypeVar("_T")


@dataclass(slots=True)
class RunSummary:
    """What the terminal summary says after the run's reports were written."""

    session_noise: SessionNoiseSection | None = None
    updates: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Baselines ``--update-baselines`` refused to write: the run then exits non-zero."""
    history: tuple[str, bool] | None = None
    """``--perf-history``: where the run went (False) or why it did not (True)."""
    problems: list[str] = field(default_factory=list)
    """Sinks that failed (a report path that cannot be written): one line each."""
    interrupted: str | None = None
    """What stopped the run before its end (the report's ``interrupted``), or None."""
    deploy_gate: DeployGate | None = None
    """``--perf-max-launches``: the paired deploy comparison (also the report's
    ``deploy_gate``)."""
    deploy_failed: list[str] = field(default_factory=list)
    """The paired comparison's failing levels, one line each: the run then exits non-zero."""
    culprit: CulpritReport | None = None
    """``--perf-culprit``: the search for the change behind the deploy gate's regression
    (also the report's ``culprit``)."""
    race: RaceReport | None = None
    """``--perf-race``: which deployment is best (also the report's ``race``)."""


def winner_tests(race: RaceReport, tests: Sequence[TestEntry]) -> tuple[list[TestEntry], list[str]]:
    """``--perf-race --update-baselines`` (the approved-tuning flow): the winner's record of
    the raced test is what may become its baseline (under its own name, every refusal rule
    still applying); a race without a winner records nothing, and says so."""
    if race.winner is None:
        stop = race.result.stop if race.result is not None else "not run"
        return [], [
            f"race: no baseline recorded: the race has no winner ({stop}); record the "
            "deployment you choose with a run of its profile and --update-baselines"
        ]
    mine = [t for t in tests if t.get("profile") == race.winner and t.get("nodeid") == race.nodeid]
    return mine, []


def finish_run(
    opts: KimiOptions,
    gate: GateContext,
    endpoint: Mapping[str, Any] | None,
    tests: Sequence[TestEntry],
    endpoints: Mapping[str, Mapping[str, Any]],
    *,
    rootdir: Path,
    deployments: Sequence[str],
    interrupted: str | None = None,
    culprit: CulpritReport | None = None,
    race: RaceReport | None = None,
) -> RunSummary:
    """Write every sink from the run's test records (the ``--perf-json`` test objects), in
    the order baselines, history, reports, each on its own; ``interrupted`` (what stopped the
    run, when a signal did) heads every report."""
    summary = RunSummary(interrupted=interrupted, culprit=culprit, race=race)
    tests = list(tests)
    mode = gate.update
    recorded = tests
    if race is not None and mode is not None:
        recorded, refused = winner_tests(race, tests)
        summary.refused.extend(refused)
    if mode is not None and recorded:

        def update() -> None:
            pooled = pool_sessions(copy.deepcopy(recorded))  # --perf-sessions: all starts in one
            attach_session_noise(pooled, session_noise(recorded))  # and the noise they measured
            from pytest_kimi.gate.noise_evidence import occasion_noise

            summary.updates, summary.refused = update_baselines(
                gate.root,
                gate.profile,
                mode,
                pooled,
                {k: dict(v) for k, v in endpoints.items()},
                rootdir,
                pool=occasion_noise,
            )

        _sink(summary.problems, f"baselines not updated in {gate.root}", update)

    def build() -> Report:
        summary.session_noise = session_noise(tests, current_sigma=opts.perf_session_sigma)
        report = build_report(
            dict(endpoint) if endpoint else None,
            [t.copy() for t in tests],
            summary.session_noise,
            gate.report_fields(),
            interrupted=interrupted,
        )
        if opts.perf_max_launches and len(deployments) == 2:
            summary.deploy_gate = judge(
                tests,
                deployments,
                max_launches=opts.perf_max_launches,
                tolerance=gate.settings.tolerance,
                alpha=gate.settings.alpha,
                finished=True,
            )
            if summary.deploy_gate is not None:
                summary.deploy_gate.changes = {
                    name: deploy_changes(endpoints, deployments[0], name)
                    for name in deployments[1:]
                }
                report["deploy_gate"] = summary.deploy_gate.to_dict()
                summary.deploy_failed = [
                    f"{lv.nodeid} {lv.label} on {lv.candidate}: {lv.verdict}"
                    for lv in summary.deploy_gate.failing(gate.settings.failing_verdicts())
                ]
        if culprit is not None:
            report["culprit"] = culprit.to_dict()
        if race is not None:
            report["race"] = race.to_dict()
        return report

    report = _sink(summary.problems, "run report not built (no history row, no report)", build)
    if report is None:
        return summary
    summary.history = store_history(opts, gate, report, endpoints, rootdir, deployments)
    summary.problems.extend(
        write_reports(opts, report, gate.settings.failing_verdicts(), os.environ)
    )
    if opts.perf_requests is not None:  # appended by the measuring processes, as levels ended
        summary.problems.extend(problems_in(tests))
    return summary


def _sink(problems: list[str], what: str, write: Callable[[], _T]) -> _T | None:
    """``write()``'s result; on any exception, None and one line in ``problems``."""
    try:
        return write()
    except Exception as exc:  # one sink's failure costs a line, never the others
        problems.append(scrub_text(f"{what}: {type(exc).__name__}: {exc}"))
        return None


def write_reports(
    opts: KimiOptions,
    report: Report,
    failing: frozenset[str],
    environ: Mapping[str, str],
) -> list[str]:
    """JSON, Markdown (also to GitHub's step summary) and HTML, each from the one report dict;
    the problems of those that could not be written (each sink on its own: its rendering as
    well as its write, so one report's bug costs that report alone).

    The dict is scrubbed once more here: server info was cleaned where it entered, but error
    texts and notes come from everywhere, and these files get uploaded and published.
    """
    if not report["tests"]:
        return []
    problems: list[str] = []
    scrubbed = _sink(problems, "reports not written (scrubbing failed)", lambda: scrub(report))
    if scrubbed is None:
        return problems
    report = scrubbed

    if opts.perf_json is not None:
        path = opts.perf_json
        _sink(problems, f"--perf-json {path} not written", lambda: write_json(path, report))
    markdown_path = opts.perf_markdown
    step_summary = environ.get("GITHUB_STEP_SUMMARY")
    if markdown_path or step_summary:
        rendered: list[str] = []

        def markdown() -> str:
            """Rendered once for both its sinks, by the first that needs it."""
            if not rendered:
                from pytest_kimi.report.markdown import render_markdown

                rendered.append(render_markdown(report, failing_verdicts=failing))
            return rendered[0]

        if markdown_path:
            _sink(
                problems,
                f"--perf-markdown {markdown_path} not written",
                lambda: write_text(markdown_path, markdown()),
            )
        if step_summary:

            def append() -> None:
                text = markdown()
                with open(step_summary, "a", encoding="utf-8") as fh:
                    fh.write(text + "\n")

            _sink(problems, f"GITHUB_STEP_SUMMARY {step_summary} not written", append)
    if opts.perf_html is not None:
        html_dir = opts.perf_html

        def html() -> None:
            from pytest_kimi.report.html import write_html

            write_html(report, html_dir, failing_verdicts=failing)

        _sink(problems, f"--perf-html {html_dir} not written", html)
    return problems


def store_history(
    opts: KimiOptions,
    gate: GateContext,
    report: Report,
    endpoints: Mapping[str, Mapping[str, Any]],
    rootdir: Path,
    deployments: Sequence[str],
) -> tuple[str, bool] | None:
    """Append the run to ``--perf-history``; the summary's line, and whether it failed.

    Nothing is written for ``off`` or a run that measured nothing.  A database that is down or
    refuses the write costs this one line (URL without password, and why), never the run's
    results or exit code: every exception is caught here, not only the store's own.
    """
    from pytest_kimi.history.rows import measured_anything

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
