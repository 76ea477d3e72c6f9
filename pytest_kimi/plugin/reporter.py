"""The plugin's reporter: collects each perf test's record from the test reports (also those
xdist workers send), prints the summary, and hands the run to :func:`finish_run` once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.measure.results import ThroughputResult
from pytest_kimi.plugin.state import (
    DEPLOYMENTS,
    GATE,
    INTERRUPTS,
    REPORT_ATTR,
    STATE,
    is_worker,
    kimi_options,
)
from pytest_kimi.report.record import TestRecord
from pytest_kimi.report.terminal import format_session_noise, format_test
from pytest_kimi.run.finish import RunSummary, finish_run
from pytest_kimi.scrub import scrub_text

REPORTER_NAME = "kimi-perf-reporter"


class PerfReporter:
    """Collects the records from test reports and writes the reports at the session's end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = config.stash[STATE]
        self.summary: RunSummary | None = None

    def collect(self, data: dict[str, Any]) -> None:
        """One test's JSON object: filed under its deployment's endpoint."""
        data = dict(data)
        endpoint = data.pop("endpoint", None)
        if endpoint is not None:
            self.state.endpoints.setdefault(data.get("profile") or "", endpoint)
            if self.state.endpoint is None:
                self.state.endpoint = endpoint
        self.state.tests.append(data)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTR, None)
        if data is not None:
            self.collect(data)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.state.tests:
            return
        terminalreporter.section("pytest-kimi throughput")
        if self.summary is not None and self.summary.interrupted is not None:
            # the headline, as in every report: a stopped run never reads as a finished one
            terminalreporter.write_line(f"INTERRUPTED: {self.summary.interrupted}", red=True)
        if self.state.endpoint:
            ep = self.state.endpoint
            terminalreporter.write_line(f"endpoint {ep['url']}  model {ep['model']}")
        settings = self.config.stash[GATE].settings
        terminalreporter.write_line(
            scrub_text(
                f"gate: tolerance {settings.tolerance * 100:g}%, alpha {settings.alpha:g}, "
                f"session noise {settings.session_sigma:g} from {settings.sigma_source}"
            )
        )
        for test in self.state.tests:
            for line in format_test(test):
                terminalreporter.write_line(scrub_text(line))
        summary = self.summary
        if summary is None:
            return
        if summary.session_noise is not None:
            terminalreporter.section("pytest-kimi session noise")
            for line in format_session_noise(summary.session_noise):
                terminalreporter.write_line(scrub_text(line))
        if summary.updates or summary.refused:
            terminalreporter.section("pytest-kimi baselines")
            for text in summary.updates:
                terminalreporter.write_line(text)
            for text in summary.refused:
                terminalreporter.write_line(text, red=True)
            if summary.updates:
                terminalreporter.write_line(
                    "Review the YAML diff and commit it in a pull request: its approval is the "
                    "approval of the new baseline."
                )
        for text in summary.problems:
            terminalreporter.write_line(text, red=True)
        if summary.history is not None:
            text, failed = summary.history
            terminalreporter.write_line(text, yellow=failed)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """First among the session-finish hooks: another plugin's that raises (pytest's own
        ``--junitxml`` writer, whose directory vanished) would stop pluggy before ours, and the
        baselines, the history row and the reports would never be written."""
        if is_worker(self.config):
            return  # the controller writes, from the reports the workers sent
        try:
            names = [d.name for d in self.config.stash[DEPLOYMENTS]]
            interrupted = interruption(self.config, session, self.state.tests)
            self.summary = finish_run(
                kimi_options(self.config),
                self.config.stash[GATE],
                self.state.endpoint,
                self.state.tests,
                self.state.endpoints,
                rootdir=Path(self.config.rootpath),
                deployments=names,
                interrupted=interrupted,
            )
        except Exception as exc:  # finish_run guards each sink; this is the last line
            self.summary = RunSummary(
                problems=[scrub_text(f"pytest-kimi: run not finished: {type(exc).__name__}: {exc}")]
            )
        failed = self.summary.refused or self.summary.problems
        if failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def interruption(
    config: pytest.Config, session: pytest.Session, tests: list[dict[str, Any]]
) -> str | None:
    """What stopped the run before its end, as the reports say it; None when nothing did.

    pytest's exit status says so for an interrupt anywhere (also between two tests, where no
    test record does), a test record for one that stopped a measurement; the signal handler
    (:mod:`pytest_kimi.server.interrupts`) knows which signal it was.
    """
    stopped = session.exitstatus == pytest.ExitCode.INTERRUPTED or any(
        t.get("outcome") == "interrupted" for t in tests
    )
    if not stopped:
        return None
    interrupts = config.stash.get(INTERRUPTS, None)
    first = interrupts.first if interrupts is not None else None
    by = {int(signal.SIGTERM): "SIGTERM", int(signal.SIGINT): "Ctrl-C (SIGINT)"}.get(
        first if first is not None else -1, "an interrupt"
    )
    return (
        f"run interrupted by {by}: the levels that finished keep their verdicts, "
        "the rest did not run"
    )


def report_interrupted(config: pytest.Config, result: ThroughputResult) -> None:
    """The levels an interrupted test finished go into the reports (outcome "interrupted"):
    pytest makes no test report for it, so its record is handed to the reporter directly."""
    reporter = config.pluginmanager.get_plugin(REPORTER_NAME)
    if not isinstance(reporter, PerfReporter):
        return
    record = TestRecord(
        result.nodeid,
        "interrupted",
        result.workload,
        result,
        endpoint=config.stash[STATE].endpoint,
    )
    reporter.collect(record.to_json())
