"""pytest hooks and fixtures: wiring only; measuring, judging and reporting live elsewhere.

Flow: markers are validated at collection (a bad one stops the run before any GPU time is
spent), each marked test is measured in its setup phase by ``_kimi_measure``, a missed target
fails the test in its call phase with the per-level table, and the figures ride on the test
report (so they survive pytest-xdist) into the terminal summary and ``--perf-json``.

Options are read from the one :class:`~pytest_kimi.options.KimiOptions` that
``pytest_configure`` stores on ``config.stash`` (:func:`kimi_options`), never with a default
supplied here: defaults, precedence and the base of relative paths are decided in
:mod:`pytest_kimi.options` alone, so what ``--help`` and the README say is what runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

import pytest

from pytest_kimi import options
from pytest_kimi.options import KimiOptions
from pytest_kimi.baseline import BaselineStore, TestBaseline
from pytest_kimi.gate import stats
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.gate.verdicts import Verdict
from pytest_kimi.gate.run import Comparison, GateProblem, MeasurementInterrupted, measure_gated
from pytest_kimi.endpoint.discovery import EndpointError, EndpointInfo, normalize_url
from pytest_kimi.spec.markers import (
    MARKER_SIGNATURE,
    MarkerError,
    Targets,
    Workload,
    merge_marker_kwargs,
    parse_throughput,
)
from pytest_kimi.report.json_report import build_report, write_json, write_text
from pytest_kimi.baseline.update import update_baselines
from pytest_kimi.report.junit import junit_properties
from pytest_kimi.report.progress import ProgressPrinter
from pytest_kimi.report.terminal import format_test
from pytest_kimi.measure.results import ThroughputResult, workload_dict
from pytest_kimi.server import (
    ProfileError,
    ServerProfile,
    ServerStartError,
    described_server_info,
    load_profile,
    open_server,
)
from pytest_kimi.scrub import is_secret_name, register_secret, scrub, scrub_text
from pytest_kimi.server.interrupts import Interrupts
from pytest_kimi.endpoint.serverinfo import clean_server_info
from pytest_kimi.measure.session import KimiLoad, PerfSession

REPORT_ATTR = "kimi_perf"
"""Attribute on TestReport carrying a test's result dict (serialised by xdist with the report)."""

NO_ENDPOINT_REASON = (
    "no endpoint given: pass --endpoint=URL (an OpenAI-compatible server, e.g. "
    "http://127.0.0.1:30000), --endpoint=sim (the built-in simulator) or --server-profile=PATH "
    "(a deployment to launch), or set KIMI_ENDPOINT or the ini key kimi_endpoint"
)


@dataclass(slots=True)
class RunState:
    """What the session accumulates for its reports (controller side under xdist)."""

    endpoint: dict[str, Any] | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Endpoint (URL, model, server info) per deployment name ('' without profiles)."""
    references: dict[str, TestBaseline] = field(default_factory=dict)
    intervals: list[tuple[float, float]] = field(default_factory=list)
    """Wall-clock (start, end) of each measurement of this process."""
    """Same-run A/B: the reference deployment's results per test, as a baseline for the others."""


@dataclass(frozen=True, slots=True)
class PerfItem:
    workload: Workload
    targets: Targets


@dataclass(frozen=True, slots=True)
class GateContext:
    """Resolved once per session: where baselines live and how strictly they are judged."""

    settings: GateSettings
    root: Path
    profile: str
    """--baseline-profile, else the deployment's name, else 'sim' or 'default'."""
    profile_explicit: bool
    update: str | None
    """None, 'yes' or 'force' (--update-baselines)."""

    def store(self, deployment: ServerProfile | None = None) -> BaselineStore:
        name = (
            deployment.name
            if deployment is not None and not self.profile_explicit
            else self.profile
        )
        return BaselineStore(self.root, name)


STATE = pytest.StashKey[RunState]()
DEPLOYMENTS = pytest.StashKey[list[ServerProfile]]()
GATE = pytest.StashKey[GateContext]()
KIMI_OPTIONS = pytest.StashKey[KimiOptions]()
"""The session's options (defaults, precedence, paths: see :mod:`pytest_kimi.options`)."""
PERF_ITEM = pytest.StashKey[PerfItem]()
RESULT = pytest.StashKey[ThroughputResult]()
INTERRUPTS = pytest.StashKey[Interrupts]()


def kimi_options(config: pytest.Config) -> KimiOptions:
    """The session's options, built once in ``pytest_configure``."""
    return config.stash[KIMI_OPTIONS]


def _gate_context(opts: KimiOptions) -> GateContext:
    return GateContext(
        opts.gate_settings(),
        opts.baseline_dir,
        opts.default_profile(),
        opts.baseline_profile is not None,
        opts.update_baselines,
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_SIGNATURE)
    config.addinivalue_line("markers", "perf: a throughput test (added to every @throughput test)")
    opts = config.stash[KIMI_OPTIONS] = KimiOptions.from_config(config)
    register_secret(opts.api_key)
    config.stash[STATE] = RunState()
    config.stash[GATE] = _gate_context(opts)
    config.stash[DEPLOYMENTS] = _load_deployments(opts)
    if opts.perf_html is not None and not hasattr(config, "workerinput"):
        from pytest_kimi.report.plots import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as exc:
            raise pytest.UsageError(f"{opts.source('perf_html')}: {exc}") from None
    config.pluginmanager.register(PerfReporter(config), "kimi-perf-reporter")
    _group_perf_tests_under_xdist(config)
    _install_interrupts(config)
    unreachable = _pass_unreachable(opts)
    if unreachable is not None and not hasattr(config, "workerinput"):
        config.stash[PASS_UNREACHABLE] = unreachable
        config.issue_config_time_warning(pytest.PytestConfigWarning(unreachable), stacklevel=2)


PASS_UNREACHABLE = pytest.StashKey[str]()
"""Set when the gate's settings make ``pass`` unreachable: said before any trial runs."""


def _pass_unreachable(opts: KimiOptions) -> str | None:
    """The up-front warning when no number of trials can make a compared level ``pass``.

    The standard error of a level never falls below the session noise, so a drop smaller than
    :func:`stats.smallest_vouchable_drop` cannot be caught with the gate's power however many
    trials run; if ``--perf-detectable-drop`` asks for that, every compared level ends
    ``underpowered`` (or significant) and the trials are spent for nothing.
    """
    floor = stats.smallest_vouchable_drop(
        opts.perf_tolerance, opts.perf_alpha, opts.perf_session_sigma, stats.DEFAULT_POWER
    )
    if floor <= opts.perf_detectable_drop:
        return None
    return (
        f"pytest-kimi: no compared level can pass: with session noise "
        f"{opts.perf_session_sigma:g} ({opts.source('perf_session_sigma')}), tolerance "
        f"{opts.perf_tolerance:.1%} and alpha {opts.perf_alpha:g}, no number of trials catches a "
        f"drop smaller than {floor:.1%} with {stats.DEFAULT_POWER:.0%} probability, but the "
        f"detectable drop is {opts.perf_detectable_drop:.1%} "
        f"({opts.source('perf_detectable_drop')}); every level without a significant change "
        f"will be underpowered.  Raise --perf-detectable-drop to {math.ceil(floor * 1000) / 10:g}% "
        "or more, or measure the session noise (a lower --perf-session-sigma), or use a "
        "smaller --perf-tolerance."
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The gate's up-front warning, where the header is shown (``-q`` hides it; the same text
    is in the warnings summary)."""
    unreachable = config.stash.get(PASS_UNREACHABLE, None)
    return [] if unreachable is None else [unreachable]


def _install_interrupts(config: pytest.Config) -> None:
    """SIGTERM (``timeout``, a cancelled CI job, a container stop) is handled like Ctrl-C:
    the measurement stops, servers are stopped gracefully, reports are written, exit 2.  A
    second SIGTERM or Ctrl-C kills the servers and exits at once.  See server/interrupts.py."""

    def say(text: str) -> None:  # past output capture, as the progress lines are
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            raise RuntimeError("no terminal")
        with (
            capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
        ):
            reporter.ensure_newline()
            reporter.write_line(text, bold=True)

    interrupts = Interrupts(say=say)
    if interrupts.install():
        config.stash[INTERRUPTS] = interrupts


def pytest_unconfigure(config: pytest.Config) -> None:
    interrupts = config.stash.get(INTERRUPTS, None)
    if interrupts is not None:
        interrupts.restore()
        del config.stash[INTERRUPTS]


def _load_deployments(opts: KimiOptions) -> list[ServerProfile]:
    source = opts.source("server_profile")
    profiles = []
    for path in opts.server_profile:
        try:
            profiles.append(load_profile(path))
        except ProfileError as exc:
            raise pytest.UsageError(f"{source}: {exc}") from None
    for profile in profiles:
        _register_profile_secrets(profile)
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise pytest.UsageError(f"{source}: two server profiles share a name: {names}")
    if profiles and opts.endpoint is not None:
        raise pytest.UsageError(
            f"{source} and {opts.source('endpoint')} both name the endpoint: "
            "give a server profile or an endpoint, not both"
        )
    return profiles


def _register_profile_secrets(profile: ServerProfile) -> None:
    """A profile's ``api-key``-like args and secret-named env values are never shown."""
    for key, value in profile.args.items():
        if is_secret_name(key) and isinstance(value, str):
            register_secret(value)
    for key, value in profile.env.items():
        if is_secret_name(key) and isinstance(value, str):
            register_secret(value)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With server profiles, every perf test runs once per deployment, grouped by deployment.

    ``kimi_deployment`` is session-scoped, so pytest orders the tests deployment by deployment
    and tears one server down before it launches the next: one server up at a time.
    """
    deployments = metafunc.config.stash[DEPLOYMENTS]
    if deployments and metafunc.definition.get_closest_marker("throughput") is not None:
        metafunc.parametrize(
            "kimi_deployment", deployments, ids=[d.name for d in deployments], scope="session"
        )


PERF_GROUP = "kimi-perf"


def _group_perf_tests_under_xdist(config: pytest.Config) -> None:
    """Perf tests share one endpoint: parallel workers would measure each other's load.

    With ``-n N`` the controller switches xdist to ``--dist loadgroup`` and every perf test gets
    the same ``xdist_group``, so they all run, one after another, on one worker.  Workers are
    told through ``workerinput`` (see ``pytest_configure_node``) since they parse the original
    command line, where the distribution mode is still ``load``.
    """
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") in (
        "load",
        "no",
    ):
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker that perf tests are grouped."""
    node.workerinput["kimi_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


def _perf_nodeid(item: pytest.Item) -> str:
    """The test's id without xdist's ``@group`` suffix or the deployment's parameter id.

    Baselines are keyed by it, so they do not depend on ``-n`` or on which deployments run.
    """
    suffix = "@" + PERF_GROUP
    nodeid = item.nodeid[: -len(suffix)] if item.nodeid.endswith(suffix) else item.nodeid
    callspec = getattr(item, "callspec", None)
    deployment = callspec.params.get("kimi_deployment") if callspec is not None else None
    if deployment is None or not nodeid.endswith("]"):
        return nodeid
    head, _, inner = nodeid[:-1].rpartition("[")
    name = deployment.name
    if inner == name:
        return head
    if inner.endswith("-" + name):
        return f"{head}[{inner[: -len(name) - 1]}]"
    if inner.startswith(name + "-"):
        return f"{head}[{inner[len(name) + 1 :]}]"
    return nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get("kimi_loadgroup"):
        # xdist's worker reads this right after us, when it names the groups' tests
        config.option.loadgroup = True
    problems: list[str] = []
    endpoint = kimi_options(config).endpoint or config.stash[DEPLOYMENTS] or None
    for item in items:
        marks = list(item.iter_markers("throughput"))
        if not marks:
            continue
        args, kwargs = merge_marker_kwargs([(m.args, m.kwargs) for m in marks])
        try:
            workload, targets = parse_throughput(args, kwargs)
        except MarkerError as exc:
            problems.append(f"{item.nodeid}: @throughput {exc}")
            continue
        item.stash[PERF_ITEM] = PerfItem(workload, targets)
        item.add_marker(pytest.mark.perf)
        item.add_marker(pytest.mark.xdist_group(PERF_GROUP))
        if endpoint is None:
            item.add_marker(pytest.mark.skip(reason=NO_ENDPOINT_REASON))
    if problems:
        raise pytest.UsageError("malformed @throughput marker:\n  " + "\n  ".join(problems))


@pytest.fixture(scope="session")
def _kimi_session(pytestconfig: pytest.Config) -> Iterator[PerfSession]:
    session = PerfSession(workers=kimi_options(pytestconfig).perf_workers)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(scope="session")
def kimi_deployment() -> ServerProfile | None:
    """The server profile under test; parametrized over ``--server-profile`` for perf tests."""
    return None


@pytest.fixture(scope="session")
def kimi_server(
    pytestconfig: pytest.Config, kimi_deployment: ServerProfile | None
) -> Iterator[Any]:
    """The managed deployment (launched, ready, torn down at the end), or None without a profile."""
    if kimi_deployment is None:
        yield None
        return
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capman = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def progress(message: str) -> None:
        if reporter is not None:  # past output capture (fd capture would swallow it)
            with (
                capman.global_and_fixture_disabled()
                if capman is not None
                else contextlib.nullcontext()
            ):
                reporter.ensure_newline()
                reporter.write_line(scrub_text(f"[kimi {kimi_deployment.name}] {message}"))

    server = open_server(kimi_deployment, Path(pytestconfig.rootpath) / ".kimi" / "logs")
    problem = None
    started = time.monotonic()
    progress(f"launching {kimi_deployment.source} (up to {kimi_deployment.startup_timeout_s:g} s)")
    try:
        server.launch(progress=progress)
        pid = f" (pid {server.pid})" if server.pid is not None else ""
        progress(
            f"ready at {server.url}{pid} after {time.monotonic() - started:.1f} s; log {server.log_path}"
        )
    except ServerStartError as exc:
        problem = (
            f"server profile {kimi_deployment.name} ({kimi_deployment.source}) did not start: {exc}"
        )
    if problem is not None:
        pytest.fail(scrub_text(problem), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kimi_endpoint(
    pytestconfig: pytest.Config, _kimi_session: PerfSession, kimi_server: Any
) -> Iterator[EndpointInfo]:
    """The endpoint under test: URL, model and server info (launching the simulator for ``sim``)."""
    opts = kimi_options(pytestconfig)
    if opts.endpoint is None and kimi_server is None:
        pytest.skip(NO_ENDPOINT_REASON)
    api_key = opts.api_key
    model = opts.model
    sim = None
    problem = None
    try:
        if kimi_server is not None:
            api_key = api_key or getattr(kimi_server, "api_key", None)
            base = normalize_url(kimi_server.url, f"server profile {kimi_server.profile.name}")
        elif opts.is_sim:
            sim = _start_sim(pytestconfig, opts, api_key)
            base = sim.url
        else:
            base = normalize_url(str(opts.endpoint), opts.source("endpoint"))
        info = _kimi_session.discover(base, api_key=api_key, model=model)
        if kimi_server is not None:
            info.server_info = clean_server_info(
                described_server_info(kimi_server.profile, info.server_info)
            )
    except EndpointError as exc:
        problem = str(exc)
    if problem is not None:
        if sim is not None:
            sim.stop()
        pytest.fail(scrub_text(problem), pytrace=False)
    if pytestconfig.stash[STATE].endpoint is None:
        pytestconfig.stash[STATE].endpoint = info.public()
    try:
        yield info
    finally:
        if sim is not None:
            sim.stop()


def _start_sim(config: pytest.Config, opts: KimiOptions, api_key: str | None) -> Any:
    from pytest_kimi.sim.process import SimProcess
    from pytest_kimi.sim.profile import SimConfigError, parse_sim_spec

    try:
        profile = parse_sim_spec(str(opts.endpoint), opts.source("endpoint"))
    except SimConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    if api_key and profile.api_key is None:
        profile = dataclasses.replace(profile, api_key=api_key)
    kimi = Path(config.rootpath) / ".kimi"
    sim = SimProcess(profile, log_dir=kimi / "logs", record_dir=kimi / "servers")
    sim.start()
    return sim


@pytest.fixture
def kimi_load(
    request: pytest.FixtureRequest, kimi_endpoint: EndpointInfo, _kimi_session: PerfSession
) -> KimiLoad:
    """The load engine bound to the endpoint: ``await kimi_load.sweep(concurrency=[1, 8])``."""
    return KimiLoad(
        _kimi_session,
        kimi_endpoint,
        _perf_nodeid(request.node),
        Path(request.config.rootpath),
        kimi_options(request.config).perf_trials,
        kimi_options(request.config).perf_protocol,
    )


@pytest.fixture(autouse=True)
def _kimi_measure(
    request: pytest.FixtureRequest, kimi_deployment: ServerProfile | None
) -> ThroughputResult | None:
    """Measure a ``@throughput`` test before its body runs and judge it against its baseline.

    Never raises on a bad level (verdicts say what went wrong); a corrupt or incomparable
    baseline fails the test before any load is sent.  In a same-run A/B, deployments after the
    first are judged against the first one's figures from this very run.
    """
    item = request.node
    perf = item.stash.get(PERF_ITEM, None)
    if perf is None:
        return None
    config = request.config
    gate = config.stash[GATE]
    deployments = config.stash[DEPLOYMENTS]
    nodeid = _perf_nodeid(item)
    comparison = Comparison(
        store=gate.store(kimi_deployment),
        deployment=kimi_deployment.name if kimi_deployment is not None else None,
        reference=deployments[0].name if len(deployments) > 1 else None,
        references=config.stash[STATE].references,
    )
    problem: str | None = None
    try:
        with _one_measurement_at_a_time(config):
            result = measure_gated(
                request.getfixturevalue("_kimi_session"),
                request.getfixturevalue("kimi_endpoint"),
                nodeid,
                perf.workload,
                perf.targets,
                gate.settings,
                comparison,
                rootdir=Path(config.rootpath),
                trials=kimi_options(config).perf_trials,
                server=request.getfixturevalue("kimi_server"),
                progress=_progress_printer(config, nodeid),
                server_metrics=kimi_options(config).perf_server_metrics,
                protocol=kimi_options(config).perf_protocol,
            )
    except GateProblem as exc:
        problem = str(exc)
    except MeasurementInterrupted as exc:
        _report_interrupted(config, exc.result)
        raise KeyboardInterrupt from None  # what pytest and users know an interrupt by
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    result.extra["measured"] = [round(x, 3) for x in config.stash[STATE].intervals[-1]]
    item.stash[RESULT] = result
    item.user_properties.extend(
        (name, scrub_text(value) if isinstance(value, str) else value)
        for name, value in junit_properties(result.to_dict())
    )
    return result


def _report_interrupted(config: pytest.Config, result: ThroughputResult) -> None:
    """The levels an interrupted test finished go into the reports (outcome "interrupted"):
    pytest makes no test report for it, so it is handed to the reporter directly."""
    reporter = config.pluginmanager.get_plugin("kimi-perf-reporter")
    if reporter is None:
        return
    data = result.to_dict()
    data["outcome"] = "interrupted"
    endpoint = config.stash[STATE].endpoint
    if endpoint is not None:
        data["endpoint"] = endpoint
    reporter.pytest_runtest_logreport(types.SimpleNamespace(**{REPORT_ATTR: data}))


@contextlib.contextmanager
def _one_measurement_at_a_time(config: pytest.Config) -> Iterator[None]:
    """Under xdist, measurements of different workers take turns (a lock file in .kimi/).

    Grouping perf tests on one worker (``--dist loadgroup``) is the first line; this holds even
    where that grouping does not (xdist's group suffix is ignored by pytest 9.2's node ids).
    The measured interval is recorded so a report shows that runs did not overlap.
    """
    started = time.time()
    if not hasattr(config, "workerinput"):
        yield
    else:
        # filelock, not fcntl: the plugin must import wherever pytest runs (Windows too).
        from filelock import FileLock

        path = Path(config.rootpath) / ".kimi" / "measure.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path)):
            started = time.time()
            yield
    config.stash[STATE].intervals.append((started, time.time()))


def _progress_printer(config: pytest.Config, nodeid: str) -> ProgressPrinter | None:
    """Live lines through pytest's terminal reporter: updating on a TTY, plain in CI logs.

    Output capture is suspended around each write (as pytest's live logging does), so the
    lines reach the terminal while the test's setup is captured, with or without ``-s``.
    """
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or config.get_verbosity() < -1:
        return None

    def uncaptured(write: Callable[[], None]) -> None:
        if capman is None:
            write()
            return
        with capman.global_and_fixture_disabled():
            write()

    def line(text: str) -> None:
        def write() -> None:
            reporter.ensure_newline()
            reporter.write_line(text)

        uncaptured(write)

    def rewrite(text: str) -> None:
        uncaptured(lambda: reporter.rewrite(text, erase=True))

    line(f"[kimi] measuring {nodeid}")
    return ProgressPrinter(line, rewrite if reporter.isatty else None, prefix="[kimi] ")


@pytest.fixture
def throughput_result(
    request: pytest.FixtureRequest, _kimi_measure: ThroughputResult | None
) -> ThroughputResult:
    """All levels, trials and per-request records of this test's measurement."""
    if _kimi_measure is None:
        pytest.fail("throughput_result needs the test to carry @throughput(...)", pytrace=False)
    return _kimi_measure


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    result = item.stash.get(RESULT, None)
    if result is not None:
        failing = result.failing_levels(item.config.stash[GATE].settings.failing_verdicts())
        if failing:
            kinds = ", ".join(dict.fromkeys(_headline(lv.verdict) for lv in failing))
            lines = format_test(result.to_dict())[1:]
            pytest.fail(scrub_text(f"throughput {kinds}:\n" + "\n".join(lines)), pytrace=False)
    return (yield)


def _headline(verdict: str) -> str:
    """How the failure message names a failing level's verdict (a word it does not know as itself)."""
    known = Verdict.of(verdict)
    return verdict if known is None else known.headline


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    report = yield
    result = item.stash.get(RESULT, None)
    perf = item.stash.get(PERF_ITEM, None)
    data: dict[str, Any] | None = None
    # The call phase carries the figures; a setup that failed after measuring carries them too.
    if result is not None and (
        report.when == "call" or report.when == "setup" and not report.passed
    ):
        data = result.to_dict()
        data["outcome"] = report.outcome if report.when == "call" else "error"
    elif perf is not None and report.when == "setup" and report.failed:
        # Nothing was measured (endpoint unreachable, server did not start, corrupt baseline):
        # the reports still name the test and why, so a CI step that uploads them finds them.
        data = {
            "nodeid": _perf_nodeid(item),
            "workload": workload_dict(perf.workload),
            "levels": [],
            "outcome": "error",
            "error": scrub_text(_error_text(report))[:2000],
        }
    if data is not None:
        endpoint = item.config.stash[STATE].endpoint
        if endpoint is not None:
            data["endpoint"] = endpoint
        setattr(report, REPORT_ATTR, data)
    return report


def _error_text(report: pytest.TestReport) -> str:
    """What went wrong, without the traceback: the exception line, or a pytest.fail message."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if isinstance(message, str) and message:
        return message.removeprefix("Failed: ").strip()
    return report.longreprtext.strip()


def write_reports(config: pytest.Config, report: dict[str, Any], failing: frozenset[str]) -> None:
    """JSON, Markdown (also to GitHub's step summary) and HTML, each from the one report dict.

    The dict is scrubbed once more here: server info was cleaned where it entered, but error
    texts and notes come from everywhere, and these files get uploaded and published.
    """
    if not report["tests"]:
        return
    report = scrub(report)
    opts = kimi_options(config)
    if opts.perf_json is not None:
        write_json(opts.perf_json, report)
    markdown_path = opts.perf_markdown
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if markdown_path or step_summary:
        from pytest_kimi.report.markdown import render_markdown

        text = render_markdown(report, failing_verdicts=failing)
        if markdown_path:
            write_text(markdown_path, text)
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
    if opts.perf_html is not None:
        from pytest_kimi.report.html import write_html

        write_html(report, opts.perf_html, failing_verdicts=failing)


class PerfReporter:
    """Collects the figures from test reports (also those xdist workers send) and writes reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = config.stash[STATE]
        self.updates: list[str] = []
        self.refused: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTR, None)
        if data is None:
            return
        data = dict(data)
        endpoint = data.pop("endpoint", None)
        if endpoint is not None:
            self.state.endpoints.setdefault(data.get("profile") or "", endpoint)
            if self.state.endpoint is None:
                self.state.endpoint = endpoint
        self.state.tests.append(data)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.state.tests:
            return
        terminalreporter.section("pytest-kimi throughput")
        if self.state.endpoint:
            ep = self.state.endpoint
            terminalreporter.write_line(f"endpoint {ep['url']}  model {ep['model']}")
        for test in self.state.tests:
            for line in format_test(test):
                terminalreporter.write_line(scrub_text(line))
        if self.updates or self.refused:
            terminalreporter.section("pytest-kimi baselines")
            for text in self.updates:
                terminalreporter.write_line(text)
            for text in self.refused:
                terminalreporter.write_line(text, red=True)
            if self.updates:
                terminalreporter.write_line(
                    "Review the YAML diff and commit it in a pull request: its approval is the "
                    "approval of the new baseline."
                )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # the controller writes, from the reports the workers sent
        report = build_report(self.state.endpoint, self.state.tests)
        write_reports(self.config, report, self.config.stash[GATE].settings.failing_verdicts())
        gate = self.config.stash[GATE]
        if gate.update is not None and self.state.tests:
            self.updates, self.refused = update_baselines(
                gate.root,
                gate.profile,
                gate.update,
                self.state.tests,
                self.state.endpoints,
                Path(self.config.rootpath),
            )
            if self.refused and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
