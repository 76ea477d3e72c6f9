"""The plugin's pytest hooks: configure the session, plan perf tests at collection, fail a
missed target in the call phase, attach each test's record to its report.

Flow: markers are planned at collection (a bad one stops the run before any GPU time is
spent), each planned test is measured in its setup phase by the ``_kimi_measure`` fixture, a
missed target fails the test in its call phase with the per-level table, and the record rides
on the test report (so it survives pytest-xdist) into the reporter.

Lazy, as Hypothesis' plugin is: importing the plugin loads pytest and the plugin's own wiring
alone, and a session that collects no perf test (and sets no option that launches or checks a
deployment) never imports the run stage, numpy, scipy or aiohttp: each hook imports what it
uses where a perf test (a planned item, a ``kimi_*`` fixture) or such an option needs it.
``tests/unit/core/test_import_budget.py`` holds that budget.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimi.plugin.addoptions import add_options, options_from_config
from pytest_kimi.plugin.nodeids import baseline_id
from pytest_kimi.plugin.reporter import REPORTER_NAME, PerfReporter
from pytest_kimi.plugin.rootdir import check_rootdir
from pytest_kimi.plugin.state import (
    DEPLOYMENTS,
    INTERRUPTS,
    KIMI_OPTIONS,
    PASS_UNREACHABLE,
    PLAN,
    REPORT_ATTR,
    REQUESTS,
    RESULT,
    STATE,
    RunState,
    gate_context,
    is_worker,
    kimi_options,
    measured_only,
    paired,
    perf_sessions,
    racing,
)
from pytest_kimi.plugin.uncaptured import say
from pytest_kimi.plugin.xdist import PERF_GROUP, group_perf_tests, worker_groups
from pytest_kimi.scrub import register_secret, scrub_text
from pytest_kimi.verdicts import Verdict

if TYPE_CHECKING:  # everything else is imported where a perf test or option needs it
    from pytest_kimi.options import KimiOptions
    from pytest_kimi.report.record import TestRecord

ASYNCIO_LOOP_SCOPE = "asyncio_default_fixture_loop_scope"

STARTS_SERVERS = frozenset({"kimi_server", "kimi_endpoint", "kimi_load", "_kimi_measurer"})
"""The fixtures that may launch a server or the simulator, or send load (every test has the
autouse ``_kimi_measure`` and its parameters, which do neither without a plan)."""

PERF_MARKERS = ("throughput", "capacity")
"""The markers that make a test a perf test: :data:`pytest_kimi.run.plan.PERF_MARKERS`, stated
here so that telling a plain test from a perf test imports nothing (a test checks they agree)."""


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    add_options(parser)
    _default_asyncio_loop_scope(parser, pluginmanager)


def _default_asyncio_loop_scope(
    parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager
) -> None:
    """Users of the plugin never see pytest-asyncio's "loop scope is unset" deprecation.

    pytest-asyncio (a dependency: ``async def`` tests drive ``kimi_load``) declares its ini
    ``asyncio_default_fixture_loop_scope`` with no default and warns in every session that does
    not set it.  The plugin declares the same ini again with pytest-asyncio's coming default,
    ``function``; a value in the user's ini or ``-o`` still wins, as for any ini.  The second
    declaration must come after pytest-asyncio's, so where pytest-asyncio would be loaded after
    this plugin it is registered here first, under its entry point's name ``asyncio`` (then
    pytest's entry-point loop skips it); ``-p no:asyncio`` and disabled autoloading are left
    alone.
    """
    if pluginmanager.is_blocked("asyncio"):
        return
    if pluginmanager.get_plugin("asyncio") is None:
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            return
        try:
            import pytest_asyncio.plugin as asyncio_plugin
        except ImportError:
            return
        if not pluginmanager.is_registered(asyncio_plugin):
            pluginmanager.register(asyncio_plugin, "asyncio")
    parser.addini(
        ASYNCIO_LOOP_SCOPE,
        type="string",
        help="default scope of the asyncio event loop used to execute async fixtures "
        "(pytest-kimi sets 'function', pytest-asyncio's coming default)",
        default="function",
    )


def pytest_configure(config: pytest.Config) -> None:
    from pytest_kimi.history.urls import url_secrets
    from pytest_kimi.workload.capacity_marker import CAPACITY_SIGNATURE
    from pytest_kimi.workload.markers import MARKER_SIGNATURE

    config.addinivalue_line("markers", MARKER_SIGNATURE)
    config.addinivalue_line("markers", CAPACITY_SIGNATURE)
    config.addinivalue_line(
        "markers", "perf: a throughput test (added to every @throughput and @capacity test)"
    )
    if config.option.help:
        # pytest configures plugins before it prints --help: a bad KIMI_* variable or ini
        # value must not take every project's help away (the next real run reports it)
        return
    if not is_worker(config):  # before any path is taken from a rootdir pytest moved
        check_rootdir(config)
    opts = config.stash[KIMI_OPTIONS] = options_from_config(config)
    register_secret(opts.api_key)
    for secret in url_secrets(opts.perf_history):  # a history URL's password
        register_secret(secret)
    if not is_worker(config):  # the controller writes the reports, and checked their paths
        _check_report_paths(config, opts)
    _open_requests_file(config, opts)
    config.stash[STATE] = RunState()
    # the gate (baselines, the history's session noise) is resolved where a perf test first
    # needs it (state.gate_context), and "pass is unreachable" said when one is collected
    sessions = _load_deployments(config, opts)
    if sessions > 1:
        from pytest_kimi.plugin.ordering import SessionOrder

        config.pluginmanager.register(SessionOrder(config), "kimi-session-order")
    if paired(config):
        from pytest_kimi.plugin.paired_wiring import PairedLaunches

        config.pluginmanager.register(PairedLaunches(config), "kimi-paired-launches")
    config.pluginmanager.register(PerfReporter(config), REPORTER_NAME)
    group_perf_tests(config)
    if getattr(config.option, "numprocesses", None) and not is_worker(config):
        # an xdist controller collects nothing, so it cannot wait for a perf test to show
        _install_interrupts(config)


def _load_deployments(config: pytest.Config, opts: KimiOptions) -> int:
    """``--server-profile`` deployments into the stash, checked with ``--perf-sessions`` and
    ``--perf-max-launches`` (and ``--perf-culprit``); the number of sessions.  Without those
    options there is nothing to load or refuse, and the run stage is not imported."""
    if not (
        opts.server_profile
        or opts.perf_sessions != 1
        or opts.perf_max_launches
        or opts.perf_culprit
        or opts.perf_race
    ):
        config.stash[DEPLOYMENTS] = []
        return 1
    from pytest_kimi.run.setup import SetupError, check_server_starts, load_deployments

    try:
        config.stash[DEPLOYMENTS] = load_deployments(opts)
        sessions = check_server_starts(opts, config.stash[DEPLOYMENTS])
    except SetupError as exc:
        raise pytest.UsageError(str(exc)) from None
    if opts.perf_race:
        from pytest_kimi.plugin.race_wiring import check_race_process

        check_race_process(config)
    return sessions


def _check_report_paths(config: pytest.Config, opts: KimiOptions) -> None:
    """A report that cannot be written is a usage error now, not a lost report after hours of
    measurement (see run/output_paths.py); pytest's own ``--junitxml`` is checked with ours."""
    junitxml = getattr(config.option, "xmlpath", None)
    if junitxml:  # as pytest's junitxml plugin reads it
        junitxml = os.path.expanduser(os.path.expandvars(junitxml))
    reports = ("perf_json", "perf_markdown", "perf_html", "perf_requests")
    if not junitxml and all(getattr(opts, name) is None for name in reports):
        return  # no report path to check
    from pytest_kimi.run.output_paths import OutputPathError, check_output_paths, report_paths

    try:
        check_output_paths(report_paths(opts, junitxml))
    except OutputPathError as exc:
        raise pytest.UsageError(str(exc)) from None


def _open_requests_file(config: pytest.Config, opts: KimiOptions) -> None:
    """``--perf-requests``: every measuring process appends to the one file (xdist workers
    too, under a lock: report/requests_file.py); the controller empties it first, so it holds
    this run's requests only."""
    if opts.perf_requests is None:
        return
    from pytest_kimi.report.requests_file import RequestsFile
    from pytest_kimi.report.requests_file import start as start_requests_file

    if not is_worker(config):
        try:
            start_requests_file(opts.perf_requests)
        except OSError as exc:
            raise pytest.UsageError(
                f"{opts.source('perf_requests')} {opts.perf_requests}: cannot be written: "
                f"{exc.strerror or exc}; give another path"
            ) from None
    config.stash[REQUESTS] = RequestsFile(opts.perf_requests, Path(config.rootpath) / ".kimi")


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """The gate's up-front warning, under "collected N items" (``-q`` hides it, as it hides
    the header; the same text is in the warnings summary)."""
    unreachable = config.stash.get(PASS_UNREACHABLE, None)
    return [] if unreachable is None or config.get_verbosity() < 0 else [unreachable]


def _install_interrupts(config: pytest.Config) -> None:
    """SIGTERM (``timeout``, a cancelled CI job, a container stop) is handled like Ctrl-C:
    the measurement stops, servers are stopped gracefully, reports are written, exit 2.  A
    second SIGTERM or Ctrl-C kills the servers and exits at once.  See server/interrupts.py.

    Installed where a session first needs it: a perf test or a ``kimi_*`` fixture collected
    (a server or the simulator may start), or an xdist controller; a session without them
    keeps pytest's own handling."""
    if INTERRUPTS in config.stash:
        return
    from pytest_kimi.server.interrupts import Interrupts

    def announce(text: str) -> None:
        if not say(config, text, bold=True):
            raise RuntimeError("no terminal")

    interrupts = Interrupts(say=announce)
    if interrupts.install():
        config.stash[INTERRUPTS] = interrupts


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, Any, Any]:
    """``--perf-require-measurement``: a session that recorded no perf test (none selected,
    none reached an endpoint) fails with one line instead of ending green or with pytest's
    "no tests" code alone."""
    result = yield
    config = session.config
    if (
        not is_worker(config)
        and kimi_options(config).perf_require_measurement
        and not config.stash[STATE].tests
        and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    ):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        from pytest_kimi.run.setup import NOTHING_MEASURED

        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(NOTHING_MEASURED, red=True)
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    interrupts = config.stash.get(INTERRUPTS, None)
    if interrupts is not None:
        interrupts.restore()
        del config.stash[INTERRUPTS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With server profiles, every perf test runs once per deployment, grouped by deployment.

    ``kimi_deployment`` is session-scoped, so pytest orders the tests deployment by deployment
    and tears one server down before it launches the next: one server up at a time.  With
    ``--perf-sessions N`` perf tests are also parametrized over ``kimi_perf_session`` (ids
    ``s1``..``sN``), on which the server and the simulator depend: each session is a fresh start.
    """
    if not _is_perf(metafunc.definition):
        return
    deployments = metafunc.config.stash[DEPLOYMENTS]
    if deployments:
        metafunc.parametrize(
            "kimi_deployment",
            deployments,
            ids=[d.name for d in deployments],
            scope="session",
            indirect=True,  # one fixture for every test: see kimi_deployment
        )
    sessions = perf_sessions(metafunc.config)
    if sessions > 1:
        from pytest_kimi.measure.results import session_id

        # session-scoped too: each server start is torn down before the next (SessionOrder)
        metafunc.parametrize(
            "kimi_perf_session",
            range(sessions),
            ids=[session_id(k) for k in range(sessions)],
            scope="session",
            indirect=True,
        )


def _is_perf(node: pytest.Item) -> bool:
    """A ``@throughput`` or ``@capacity`` test: measured, and parametrized over deployments."""
    return any(node.get_closest_marker(name) is not None for name in PERF_MARKERS)


def pytest_collection_finish(session: pytest.Session) -> None:
    if kimi_options(session.config).perf_race:
        from pytest_kimi.plugin.race_wiring import check_race_session

        check_race_session(session.config, session.items)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    worker_groups(config)
    perf = [item for item in items if _is_perf(item)]
    if perf:
        _plan(config, perf)
    if perf or any(STARTS_SERVERS & set(getattr(item, "fixturenames", ())) for item in items):
        _install_interrupts(config)


def _plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The perf tests' plans (a malformed marker stops the run before any GPU time is spent),
    their markers, and the gate's warnings: the session's, then each marker's own."""
    from pytest_kimi.run.gating import marker_pass_unreachable
    from pytest_kimi.run.plan import MarkerProblem, PlanError, malformed_markers, plan_test
    from pytest_kimi.run.setup import NO_ENDPOINT_REASON

    _warn_pass_unreachable(config)
    problems: list[MarkerProblem] = []
    endpoint = kimi_options(config).endpoint or config.stash[DEPLOYMENTS] or None
    settings = gate_context(config).settings
    for item in items:
        try:
            plan = plan_test(
                item.nodeid,
                [(m.args, m.kwargs) for m in item.iter_markers("throughput")],
                [(m.args, m.kwargs) for m in item.iter_markers("capacity")],
                allow_large=kimi_options(config).perf_allow_large,
            )
        except PlanError as exc:
            problems.append(exc.problem)
            continue
        if plan is None:
            continue
        item.stash[PLAN] = plan
        if plan.capacity is None:  # a capacity's gate has no power rule (gate/capacity_gate.py)
            warning = marker_pass_unreachable(item.nodeid, settings, plan.targets)
            if warning is not None:
                item.warn(pytest.PytestConfigWarning(warning))
        item.add_marker(pytest.mark.perf)
        if config.pluginmanager.hasplugin("xdist"):  # xdist registers the marker
            item.add_marker(pytest.mark.xdist_group(PERF_GROUP))
        if endpoint is None and not kimi_options(config).perf_require_measurement:
            item.add_marker(pytest.mark.skip(reason=NO_ENDPOINT_REASON))
        # with --perf-require-measurement the endpoint fixture fails the test with the reason
    if problems:
        raise pytest.UsageError(malformed_markers(problems))


def _warn_pass_unreachable(config: pytest.Config) -> None:
    """When the gate's settings leave no compared level a way to ``pass``, say so once before
    any trial: computed when perf tests are collected (it needs the statistics, scipy), shown
    under the collection line and in the warnings summary.  Under xdist the controller
    collects nothing: the first worker says it, and xdist brings the warning over."""
    from pytest_kimi.run.gating import session_pass_unreachable

    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get("workerid", "gw0") != "gw0":
        return
    unreachable = session_pass_unreachable(kimi_options(config))
    if unreachable is not None:
        config.stash[PASS_UNREACHABLE] = unreachable
        config.issue_config_time_warning(pytest.PytestConfigWarning(unreachable), stacklevel=2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    result = item.stash.get(RESULT, None)
    if result is not None:
        from pytest_kimi.gate.capacity_gate import capacity_failure
        from pytest_kimi.report.terminal import format_test

        verdicts = gate_context(item.config).settings.failing_verdicts()
        if measured_only(item.config):  # a launch is judged with the others (deploy gate, race)
            verdicts = verdicts - {Verdict.NO_BASELINE.value}
        failing = result.failing_levels(verdicts)
        capacity = capacity_failure(result.capacity, verdicts)  # a @capacity test's own verdict
        # the levels as a whole, when none is significant alone
        shift = result.shift_failure(verdicts)
        if failing or capacity or shift:
            kinds = ", ".join(
                dict.fromkeys(
                    k if k.startswith("latency") else f"throughput {k}"
                    for k in (_headline(lv.verdict, lv.reasons) for lv in failing)
                )
            )
            headline = capacity or (kinds if failing else f"throughput {shift}")
            lines = format_test(result.to_dict())[1:]
            pytest.fail(scrub_text(f"{headline}:\n" + "\n".join(lines)), pytrace=False)
    return (yield)


def _headline(verdict: str, reasons: Sequence[str] = ()) -> str:
    """How the failure message names a failing level's verdict (a word it does not know as
    itself); a regression of latency alone says so, not "throughput regression"."""
    known = Verdict.of(verdict)
    if known is Verdict.REGRESSION and not any(r.startswith("regression ") for r in reasons):
        if any(r.startswith("latency regression") for r in reasons):
            return "latency regression beyond its tolerance"
    return verdict if known is None else known.headline


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    report = yield
    record = _record(item, report)
    if record is not None:
        state = item.config.stash[STATE]
        # the endpoint this test measured: each deployment's baselines record its own server
        record.endpoint = state.current_endpoint or state.endpoint
        setattr(report, REPORT_ATTR, record.to_json())
    return report


def _record(item: pytest.Item, report: pytest.TestReport) -> TestRecord | None:
    """The test's record for the reports, from the phase that carries it: the call phase
    (its figures), or a setup that failed (after measuring, or before: then the reports still
    name the test and why, so a CI step that uploads them finds them)."""
    result = item.stash.get(RESULT, None)
    plan = item.stash.get(PLAN, None)
    if result is None and plan is None:
        return None  # not a perf test
    from pytest_kimi.report.record import TestRecord

    if result is not None and (
        report.when == "call" or report.when == "setup" and not report.passed
    ):
        outcome = report.outcome if report.when == "call" else "error"
        return TestRecord(result.nodeid, outcome, result.workload, result)
    skipped_start = report.skipped and racing(item.config)  # a race's failed start
    if plan is not None and report.when == "setup" and (report.failed or skipped_start):
        params = getattr(getattr(item, "callspec", None), "params", {})
        session = params.get("kimi_perf_session")
        deployment = getattr(params.get("kimi_deployment"), "name", None)
        return TestRecord(
            baseline_id(item),
            "skipped" if skipped_start else "error",
            plan.workload,
            error=scrub_text(_error_text(report))[:2000],
            perf_session=session if isinstance(session, int) else None,
            profile=deployment if isinstance(deployment, str) else None,
        )
    return None


def _error_text(report: pytest.TestReport) -> str:
    """What went wrong, without the traceback: the exception line, a pytest.fail message, or
    a skip's reason."""
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[-1]).removeprefix("Skipped: ").strip()
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if isinstance(message, str) and message:
        return message.removeprefix("Failed: ").strip()
    return report.longreprtext.strip()
