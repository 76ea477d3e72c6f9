"""The plugin's reporter: collects each perf test's record from the test reports (also those
xdist workers send), prints the summary, and hands the run to :func:`finish_run` once."""

from __future__ import annotations

import signal
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimi.plugin.state import (
    DEPLOYMENTS,
    GATE,
    INTERRUPTS,
    REPORT_ATTR,
    STATE,
    gate_context,
    is_worker,
    kimi_options,
)
from pytest_kimi.printable import printable
from pytest_kimi.scrub import scrub, scrub_text

if TYPE_CHECKING:  # the run stage is imported where a perf test's record needs it
    from pytest_kimi.measure.results import ThroughputResult
    from pytest_kimi.run.finish import RunSummary
    from pytest_kimi.wire import TestEntry

REPORTER_NAME = "kimi-perf-reporter"

HEADER_LIMIT = 200
"""Characters of the endpoint's URL and model id the summary's header shows: both come from
the server or its operator, and a model id is a short name, never a page."""


class PerfReporter:
    """Collects the records from test reports and writes the reports at the session's end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = config.stash[STATE]
        self.summary: RunSummary | None = None

    def collect(self, data: TestEntry) -> None:
        """One test's JSON object: filed under its deployment's endpoint."""
        data = data.copy()
        endpoint = data.pop("endpoint", None)
        if endpoint is not None:
            self.state.endpoints.setdefault(data.get("profile") or "", endpoint)
            if self.state.endpoint is None:
                self.state.endpoint = endpoint
        self.state.tests.append(data)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A perf test's failure, as pytest prints it (the longrepr, the short summary's
        line, captured output), made printable: its message quotes a server (a model id, an
        HTTP error body from discovery) and pytest would print it raw."""
        report = yield
        if uses_kimi(item):
            printable_longrepr(report)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTR, None)
        if data is not None:
            self.collect(data)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The summary: every line scrubbed like the JSON (a model id's userinfo or
        ``token=``), printable (a server's ESC, CR or BS is shown escaped, never acted on) and
        within the terminal's width (:func:`~pytest_kimi.report.terminal.summary_width`)."""
        if not self.state.tests:
            return
        from pytest_kimi.report.terminal import (
            fit_lines,
            format_session_noise,
            format_test,
            summary_width,
        )

        width = summary_width(bool(getattr(terminalreporter, "isatty", False)))

        def write(text: str, **markup: bool) -> None:
            # a text of several lines (a baseline update lists its levels under its path)
            # keeps them, each fitted; one that is not indented is, so that no line a server's
            # text starts can pass for one of the summary's own
            first, *rest = scrub_text(text).split("\n")
            lines = [first, *(line if line.startswith(" ") else "  " + line for line in rest)]
            for line in fit_lines(lines, width):
                terminalreporter.write_line(line, **markup)

        terminalreporter.section("pytest-kimi throughput")
        if self.summary is not None and self.summary.interrupted is not None:
            # the headline, as in every report: a stopped run never reads as a finished one
            write(f"INTERRUPTED: {self.summary.interrupted}", red=True)
        if self.state.endpoint:
            ep = self.state.endpoint
            url, model = (
                printable(scrub_text(str(ep.get(k))), HEADER_LIMIT) for k in ("url", "model")
            )
            write(f"endpoint {url}  model {model}")
        settings = gate_context(self.config).settings
        write(
            f"gate: tolerance {settings.tolerance * 100:g}%, alpha {settings.alpha:g}, "
            f"session noise {settings.session_sigma:g} from {settings.sigma_source}"
        )
        for test in self.state.tests:
            # scrubbed whole before it is laid out: a secret wrapped over two lines would
            # escape a scrub of each line
            for line in format_test(scrub(test), width):
                write(line)
        summary = self.summary
        if summary is None:
            return
        if summary.session_noise is not None:
            terminalreporter.section("pytest-kimi session noise")
            for line in format_session_noise(scrub(summary.session_noise), width):
                write(line)
        if summary.deploy_gate is not None:
            from pytest_kimi.report.deploy_gate_text import format_deploy_gate

            terminalreporter.section("pytest-kimi deploy gate")
            for line in format_deploy_gate(scrub(summary.deploy_gate.to_dict()), width):
                write(line)
            if summary.deploy_failed:
                write(
                    f"the deploy gate fails the run: {len(summary.deploy_failed)} level(s) "
                    "not vouched for:",
                    red=True,
                )
                for text in summary.deploy_failed:
                    write(f"  {text}", red=True)
        if summary.culprit is not None:
            from pytest_kimi.report.culprit_text import format_culprit

            terminalreporter.section("pytest-kimi culprit")
            for line in format_culprit(scrub(summary.culprit.to_dict()), width):
                write(line)
        if summary.race is not None:
            from pytest_kimi.report.race_text import format_race

            terminalreporter.section("pytest-kimi race")
            for line in format_race(scrub(summary.race.to_dict()), width):
                write(line)
        if summary.updates or summary.refused:
            terminalreporter.section("pytest-kimi baselines")
            for text in summary.updates:
                write(text)
            for text in summary.refused:
                write(text, red=True)
            if summary.updates:
                write(
                    "Review the YAML diff and commit it in a pull request: its approval is the "
                    "approval of the new baseline."
                )
        for text in summary.problems:
            write(text, red=True)
        if summary.history is not None:
            text, failed = summary.history
            write(text, yellow=failed)

    def _junit_global(self, properties: dict[str, str]) -> None:
        """Global properties of ``--junitxml``, as ``record_testsuite_property`` adds them, for
        what runs after the last test (the culprit search, the race); called before pytest's
        own junitxml writer (this session finish runs first)."""
        try:
            from _pytest.junitxml import xml_key  # what record_testsuite_property uses
        except ImportError:  # pragma: no cover - a pytest without it writes no junit properties
            return
        xml = self.config.stash.get(xml_key, None)
        if xml is not None:
            for name, value in properties.items():
                xml.add_global_property(name, value)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """First among the session-finish hooks: another plugin's that raises (pytest's own
        ``--junitxml`` writer, whose directory vanished) would stop pluggy before ours, and the
        baselines, the history row and the reports would never be written."""
        if is_worker(self.config):
            return  # the controller writes, from the reports the workers sent
        culprit = None
        if self.state.tests and kimi_options(self.config).perf_culprit:
            # before the reports are written, while Ctrl-C still stops the session
            from pytest_kimi.plugin.culprit_wiring import junit_culprit, run_culprit

            culprit = run_culprit(session, self.state.tests)
            if culprit is not None:
                self._junit_global(junit_culprit(culprit))
        race = None
        if self.state.tests and kimi_options(self.config).perf_race:
            from pytest_kimi.plugin.race_wiring import junit_race, run_race

            race = run_race(session, self.state.tests)
            if race is not None:
                self._junit_global(junit_race(race))
        interrupts = self.config.stash.get(INTERRUPTS, None)
        if interrupts is not None:
            # the tests are over: a signal from now on must not cut the reports, a server's
            # graceful stop or the summary short (a traceback, rc 130 under a PASSED report)
            interrupts.finishing()
        if not self.state.tests and GATE not in self.config.stash:
            # no perf test ran here nor sent a record: no sink has anything to write (the
            # run stage is never imported for a session without perf tests)
            if interrupts is not None:
                interrupts.settle(int(session.exitstatus))
            return
        from pytest_kimi.run.finish import RunSummary, finish_run

        try:
            names = [d.name for d in self.config.stash[DEPLOYMENTS]]
            interrupted = interruption(self.config, session, self.state.tests)
            self.summary = finish_run(
                kimi_options(self.config),
                gate_context(self.config),
                self.state.endpoint,
                self.state.tests,
                self.state.endpoints,
                rootdir=Path(self.config.rootpath),
                deployments=names,
                interrupted=interrupted,
                culprit=culprit,
                race=race,
            )
        except Exception as exc:  # finish_run guards each sink; this is the last line
            self.summary = RunSummary(
                problems=[scrub_text(f"pytest-kimi: run not finished: {type(exc).__name__}: {exc}")]
            )
        failed = self.summary.refused or self.summary.problems or self.summary.deploy_failed
        if failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if interrupts is not None:
            interrupts.settle(int(session.exitstatus))


KIMI_FIXTURES = frozenset({"throughput_result", "capacity_result"})
"""The plugin's fixtures not named ``kimi_*``."""


def uses_kimi(item: pytest.Item) -> bool:
    """Whether ``item`` is a perf test or uses one of the plugin's fixtures (whose failures
    may quote what a server sent)."""
    if item.get_closest_marker("throughput") or item.get_closest_marker("capacity"):
        return True
    names = getattr(item, "fixturenames", ())
    return any(name.startswith("kimi_") or name in KIMI_FIXTURES for name in names)


def printable_longrepr(report: pytest.TestReport) -> None:
    """Every text of ``report``'s failure made printable in place (newlines kept): the
    message and its first line the short summary shows, each traceback line, the captured
    sections.  pytest's representation classes are walked by their attributes; one this does
    not know is replaced by its printable text (its colours lost, never its words)."""
    longrepr = report.longrepr
    if longrepr is None:
        return
    if isinstance(longrepr, str):
        report.longrepr = printable(longrepr, None, lines=True)
        return
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        report.longrepr = (*longrepr[:-1], printable(longrepr[-1], None, lines=True))
        return
    try:
        _printable_repr(longrepr)
    except (AttributeError, TypeError, ValueError):
        report.longrepr = printable(str(longrepr), None, lines=True)


def _printable_repr(longrepr: Any) -> None:
    """:func:`printable_longrepr` for pytest's ``ExceptionChainRepr`` / ``ReprExceptionInfo``
    (or anything with their attributes)."""

    def clean(text: Any) -> Any:
        return printable(text, None, lines=True) if isinstance(text, str) else text

    chain = getattr(longrepr, "chain", None) or [(longrepr.reprtraceback, longrepr.reprcrash, None)]
    for traceback, crash, _ in chain:
        if crash is not None:
            crash.message = clean(crash.message)
        for entry in getattr(traceback, "reprentries", None) or []:
            entry.lines = [clean(line) for line in entry.lines]
            location = getattr(entry, "reprfileloc", None)
            if location is not None:
                location.message = clean(location.message)
            local_vars = getattr(entry, "reprlocals", None)
            if local_vars is not None:
                local_vars.lines = [clean(line) for line in local_vars.lines]
            args = getattr(entry, "reprfuncargs", None)
            if args is not None:
                args.args = [(name, clean(value)) for name, value in args.args]
        if isinstance(getattr(traceback, "extraline", None), str):
            traceback.extraline = clean(traceback.extraline)
    longrepr.sections = [
        (clean(title), clean(content), sep) for title, content, sep in longrepr.sections
    ]


def interruption(
    config: pytest.Config, session: pytest.Session, tests: list[TestEntry]
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
    from pytest_kimi.report.record import TestRecord

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
