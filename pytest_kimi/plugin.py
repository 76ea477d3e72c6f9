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
from pytest_kimi.verdicts import Verdict
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
from pytest_kimi.spec.capacity import CAPACITY_SIGNATURE, CapacitySpec, parse_capacity
from pytest_kimi.gate.capacity import capacity_failure, measure_capacity_gated
from pytest_kimi.report.json_report import build_report, write_json, write_text
from pytest_kimi.baseline.update import update_baselines
from pytest_kimi.report.junit import junit_properties
from pytest_kimi.report.progress import ProgressPrinter
from pytest_kimi.report.terminal import format_session_noise, format_test
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
from pytest_kimi.history.urls import url_secrets
from pytest_kimi.server.interrupts import Interrupts
from pytest_kimi.endpoint.serverinfo import clean_server_info
from pytest_kimi.measure.session import KimiLoad, PerfSession
from pytest_kimi.measure.sessions import (
    PERF_SERVER,
    PERF_SESSION,
    pool_sessions,
    run_order,
    session_id,
    session_noise,
)

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
    capacity: CapacitySpec | None = None
    """Set for a ``@capacity`` test: the search; ``workload`` then holds its one level shape."""


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
    config.addinivalue_line("markers", CAPACITY_SIGNATURE)
    config.addinivalue_line(
        "markers", "perf: a throughput test (added to every @throughput and @capacity test)"
    )
    if config.option.help:
        # pytest configures plugins before it prints --help: a bad KIMI_* variable or ini
        # value must not take every project's help away (the next real run reports it)
        return
    opts = config.stash[KIMI_OPTIONS] = KimiOptions.from_config(config)
    register_secret(opts.api_key)
    for secret in url_secrets(opts.perf_history):  # a history URL's password
        register_secret(secret)
    config.stash[STATE] = RunState()
    config.stash[GATE] = _gate_context(opts)
    config.stash[DEPLOYMENTS] = _load_deployments(opts)
    if _check_perf_sessions(opts, config.stash[DEPLOYMENTS]) > 1:
        config.pluginmanager.register(SessionOrder(config), "kimi-session-order")
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
    floor = opts.gate_settings().pass_floor()
    if floor is None:
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


def _check_perf_sessions(opts: KimiOptions, deployments: list[ServerProfile]) -> int:
    """The number of sessions; a UsageError where the plugin cannot restart the deployment.

    A session is a fresh server start, and only a deployment the plugin starts can be started
    afresh: the simulator and server profiles with ``command``/``args`` or ``start:``.  An
    external ``--endpoint`` URL (or a profile with only ``url:``) would give N runs against
    one server start, whose scatter says nothing about the noise between starts.
    """
    n = opts.perf_sessions
    if n == 1:
        return n
    given = f"{opts.source('perf_sessions')} = {n}"
    fix = (
        "give a --server-profile the plugin launches (command/args, or start:/stop:), or "
        "measure the simulator with --endpoint=sim, or run the sessions as separate pytest runs "
        "(restarting the server between them) and let the history estimate the noise"
    )
    if opts.endpoint is not None and not opts.is_sim:
        raise pytest.UsageError(
            f"{given}: {opts.source('endpoint')} names a server that someone else runs, which "
            f"the plugin cannot restart between sessions; {fix}"
        )
    fixed = [d.name for d in deployments if d.external and d.start is None]
    if fixed:
        raise pytest.UsageError(
            f"{given}: server profile {', '.join(fixed)} has only url: (a running server the "
            f"plugin never starts or stops), so it cannot be restarted between sessions; {fix}"
        )
    return n


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With server profiles, every perf test runs once per deployment, grouped by deployment.

    ``kimi_deployment`` is session-scoped, so pytest orders the tests deployment by deployment
    and tears one server down before it launches the next: one server up at a time.  With
    ``--perf-sessions N`` perf tests are also parametrized over ``kimi_perf_session`` (ids
    ``s1``..``sN``), on which the server and the simulator depend: each session is a fresh start.
    """
    deployments = metafunc.config.stash[DEPLOYMENTS]
    if deployments and _is_perf(metafunc.definition):
        metafunc.parametrize(
            "kimi_deployment",
            deployments,
            ids=[d.name for d in deployments],
            scope="session",
            indirect=True,  # one fixture for every test: see kimi_deployment
        )
    sessions = perf_sessions(metafunc.config)
    if sessions > 1 and _is_perf(metafunc.definition):
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


PERF_MARKERS = ("throughput", "capacity")


def perf_sessions(config: pytest.Config) -> int:
    """``--perf-sessions`` where it applies: a deployment the plugin starts (else 1: without an
    endpoint the perf tests skip once each; an external one was refused at start-up)."""
    opts = kimi_options(config)
    return opts.perf_sessions if opts.is_sim or config.stash[DEPLOYMENTS] else 1


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
    """The test's id without xdist's ``@group`` suffix or the deployment's and session's ids.

    Baselines are keyed by it, so they do not depend on ``-n`` or on which deployments run.
    """
    suffix = "@" + PERF_GROUP
    nodeid = item.nodeid[: -len(suffix)] if item.nodeid.endswith(suffix) else item.nodeid
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    # our ids, in the order pytest_generate_tests adds them: "ep8", "s2" or "ep8-s2"
    ours = [params["kimi_deployment"].name] if params.get("kimi_deployment") is not None else []
    if isinstance(params.get("kimi_perf_session"), int):
        ours.append(session_id(params["kimi_perf_session"]))
    if not ours or not nodeid.endswith("]"):
        return nodeid
    head, _, inner = nodeid[:-1].rpartition("[")
    name = "-".join(ours)
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
        parsed = _perf_item(item)
        if parsed is None:
            continue
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        item.stash[PERF_ITEM] = parsed
        if parsed.capacity is None:  # a capacity's gate has no power rule (gate/capacity.py)
            _warn_if_the_marker_cannot_pass(config, item, parsed.targets)
        item.add_marker(pytest.mark.perf)
        item.add_marker(pytest.mark.xdist_group(PERF_GROUP))
        if endpoint is None:
            item.add_marker(pytest.mark.skip(reason=NO_ENDPOINT_REASON))
    if problems:
        kind = "@capacity" if all(": @capacity " in p for p in problems) else "@throughput"
        raise pytest.UsageError(f"malformed {kind} marker:\n  " + "\n  ".join(problems))


def _warn_if_the_marker_cannot_pass(
    config: pytest.Config, item: pytest.Item, targets: Targets
) -> None:
    """A marker's own ``tolerance=`` or ``alpha=`` can make ``pass`` unreachable where the
    session's settings do not (with 3% session noise, a 12% tolerance cannot vouch for a 15%
    detectable drop): said at collection, on the test, before any trial is spent on it."""
    if targets.tolerance is None and targets.alpha is None:
        return
    settings = config.stash[GATE].settings
    if settings.pass_floor() is not None:
        return  # the session-wide warning (pytest_configure) already says so
    mine = settings.for_test(targets)
    floor = mine.pass_floor()
    if floor is None:
        return
    item.warn(
        pytest.PytestConfigWarning(
            f"{item.nodeid}: no level of this test can pass: with the marker's tolerance "
            f"{mine.tolerance:.1%} and alpha {mine.alpha:g} and session noise "
            f"{settings.session_sigma:g}, no number of trials catches a drop smaller than "
            f"{floor:.1%} with {stats.DEFAULT_POWER:.0%} probability, but the detectable drop "
            f"is {settings.detectable_drop:.1%}; every level without a significant change will "
            "be underpowered.  Use a smaller tolerance= (or a larger alpha=) in the marker, or "
            f"raise --perf-detectable-drop to {math.ceil(floor * 1000) / 10:g}% or more."
        )
    )


def _perf_item(item: pytest.Item) -> PerfItem | str | None:
    """The item's ``@throughput`` or ``@capacity`` arguments, validated; a problem's text; or
    None for a test that carries neither."""
    throughput = list(item.iter_markers("throughput"))
    capacity = list(item.iter_markers("capacity"))
    if throughput and capacity:
        return (
            f"{item.nodeid}: @throughput and @capacity on one test: a test measures fixed levels "
            "or searches its capacity, not both"
        )
    marks = throughput or capacity
    if not marks:
        return None
    args, kwargs = merge_marker_kwargs([(m.args, m.kwargs) for m in marks])
    try:
        if capacity:
            search, workload, targets = parse_capacity(args, kwargs)
            return PerfItem(workload, targets, search)
        workload, targets = parse_throughput(args, kwargs)
    except MarkerError as exc:
        return f"{item.nodeid}: @{marks[0].name} {exc}"
    return PerfItem(workload, targets)


class SessionOrder:
    """``--perf-sessions``: perf tests run server start by server start, in ABBA order.

    Registered only for N > 1.  pytest's own ordering groups the items of a session-scoped
    parameter together, but picks the order of the groups itself; this hook runs after it
    (trylast) and lays the perf tests out start by start as :func:`run_order` says (A1 B1 B2 A2
    ...), the tests in the same order in every start, as one block where the first perf test
    was.  Since each start's tests are contiguous, pytest tears its server down (the parameter
    changes) before the next one launches: one server up at a time.  Under xdist every worker
    computes the same order and the perf tests are one group on one worker, run in it.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = _session_ordered(
            items, self.config.stash[DEPLOYMENTS], perf_sessions(self.config)
        )
        _name_the_perf_group(self.config, items)


def _name_the_perf_group(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, give perf tests the ``@kimi-perf`` suffix ``--dist loadgroup`` groups by.

    xdist's worker sets ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is the
    structured ``_id``), so without this every perf test is a group of its own and the tests of
    one session spread over the workers, each launching a server of its own for it: two
    deployments up at once, and sessions that are not one start each.  Older pytest: xdist's
    own suffix is in place and this does nothing.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not workerinput.get("kimi_loadgroup"):
        return
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9.2
    except ImportError:
        return
    suffix = "@" + PERF_GROUP
    for item in items:
        if item.stash.get(PERF_ITEM, None) is not None and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


def _session_ordered(
    items: list[pytest.Item], deployments: list[ServerProfile], sessions: int
) -> list[pytest.Item]:
    names = [d.name for d in deployments]
    rank = {start: i for i, start in enumerate(run_order(len(names), sessions))}
    perf: list[tuple[int, int, pytest.Item]] = []
    first_seen: dict[str, int] = {}
    rest: list[pytest.Item] = []
    at: int | None = None
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not isinstance(params.get("kimi_perf_session"), int):
            rest.append(item)
            continue
        at = len(rest) if at is None else at
        deployment = params.get("kimi_deployment")
        d = names.index(deployment.name) if deployment is not None else 0
        test = first_seen.setdefault(_perf_nodeid(item), len(first_seen))
        perf.append((rank[(d, params["kimi_perf_session"])], test, item))
    if at is None:
        return items
    perf.sort(key=lambda entry: entry[:2])
    return [*rest[:at], *(item for _, _, item in perf), *rest[at:]]


@pytest.fixture(scope="session")
def _kimi_session(pytestconfig: pytest.Config) -> Iterator[PerfSession]:
    session = PerfSession(workers=kimi_options(pytestconfig).perf_workers)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(scope="session")
def kimi_deployment(request: pytest.FixtureRequest) -> ServerProfile | None:
    """The server profile under test; parametrized over ``--server-profile`` for perf tests.

    Parametrized indirectly, so that a test that is not parametrized (a plain test using
    ``kimi_load``) and the perf tests share this one fixture: a direct parametrization is a
    fixture of its own, and a server or simulator first set up for a plain test would then be
    kept (its cache key unchanged) for every deployment and session after it.
    """
    return getattr(request, "param", None)


@pytest.fixture(scope="session")
def kimi_perf_session(request: pytest.FixtureRequest) -> int:
    """The session (0-based fresh server start) under test; parametrized (indirectly, as
    ``kimi_deployment``) over ``--perf-sessions N`` for perf tests, 0 everywhere else."""
    return int(getattr(request, "param", 0))


@pytest.fixture(scope="session")
def kimi_server(
    pytestconfig: pytest.Config, kimi_deployment: ServerProfile | None, kimi_perf_session: int
) -> Iterator[Any]:
    """The managed deployment (launched, ready, torn down at the end), or None without a profile.

    Depends on ``kimi_perf_session`` so that each ``--perf-sessions`` session is a fresh launch.
    """
    if kimi_deployment is None:
        yield None
        return
    label = kimi_deployment.name + _session_label(pytestconfig, kimi_perf_session)
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
                reporter.write_line(scrub_text(f"[kimi {label}] {message}"))

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
    pytestconfig: pytest.Config,
    _kimi_session: PerfSession,
    kimi_server: Any,
    kimi_perf_session: int,
) -> Iterator[EndpointInfo]:
    """The endpoint under test: URL, model and server info (launching the simulator for ``sim``,
    afresh for each ``--perf-sessions`` session, with the spec's seed plus the session index)."""
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
            sim = _start_sim(pytestconfig, opts, api_key, kimi_perf_session)
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


def _start_sim(
    config: pytest.Config, opts: KimiOptions, api_key: str | None, perf_session: int = 0
) -> Any:
    from pytest_kimi.sim.process import SimProcess
    from pytest_kimi.sim.profile import SimConfigError, parse_sim_spec

    try:
        profile = parse_sim_spec(str(opts.endpoint), opts.source("endpoint"))
    except SimConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    if api_key and profile.api_key is None:
        profile = dataclasses.replace(profile, api_key=api_key)
    if perf_session:
        # a restart redraws the session factor (the ``noise`` knob) as a real server's would
        profile = dataclasses.replace(profile, seed=(profile.seed + perf_session) % 2**63)
    kimi = Path(config.rootpath) / ".kimi"
    sim = SimProcess(profile, log_dir=kimi / "logs", record_dir=kimi / "servers")
    sim.start()
    label = _session_label(config, perf_session)
    if label:
        _say(config, f"[kimi sim{label}] started (pid {sim.pid}, seed {profile.seed}) at {sim.url}")
    return sim


def _session_label(config: pytest.Config, perf_session: int) -> str:
    """`` s2`` in a server's progress lines with ``--perf-sessions``; nothing without."""
    return f" {session_id(perf_session)}" if perf_sessions(config) > 1 else ""


def _say(config: pytest.Config, text: str) -> None:
    """A line on the terminal past output capture (a fixture's setup is captured)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        reporter.ensure_newline()
        reporter.write_line(scrub_text(text))


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
    request: pytest.FixtureRequest, kimi_deployment: ServerProfile | None, kimi_perf_session: int
) -> ThroughputResult | None:
    """Measure a ``@throughput`` test before its body runs and judge it against its baseline.

    Never raises on a bad level (verdicts say what went wrong); a corrupt or incomparable
    baseline fails the test before any load is sent.  In a same-run A/B, deployments after the
    first are judged against the first one's figures from this very run (with
    ``--perf-sessions``, the reference's latest session).  ``kimi_perf_session`` is requested
    here so that it is in every test's closure and ``--perf-sessions`` can parametrize it.
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
            common: dict[str, Any] = dict(
                rootdir=Path(config.rootpath),
                trials=kimi_options(config).perf_trials,
                server=request.getfixturevalue("kimi_server"),
                progress=_progress_printer(
                    config, nodeid + _session_label(config, kimi_perf_session)
                ),
                server_metrics=kimi_options(config).perf_server_metrics,
                protocol=kimi_options(config).perf_protocol,
            )
            session = request.getfixturevalue("_kimi_session")
            endpoint = request.getfixturevalue("kimi_endpoint")
            if perf.capacity is not None:  # @capacity: a search (pytest_kimi/gate/capacity.py)
                result = measure_capacity_gated(
                    session,
                    endpoint,
                    nodeid,
                    perf.capacity,
                    perf.workload,
                    perf.targets,
                    gate.settings,
                    comparison,
                    **common,
                )
            else:
                result = measure_gated(
                    session,
                    endpoint,
                    nodeid,
                    perf.workload,
                    perf.targets,
                    gate.settings,
                    comparison,
                    **common,
                )
    except GateProblem as exc:
        problem = str(exc)
    except MeasurementInterrupted as exc:
        exc.result.extra.update(_session_fields(request, kimi_perf_session))
        _report_interrupted(config, exc.result)
        raise KeyboardInterrupt from None  # what pytest and users know an interrupt by
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    result.extra["measured"] = [round(x, 3) for x in config.stash[STATE].intervals[-1]]
    result.extra.update(_session_fields(request, kimi_perf_session))
    item.stash[RESULT] = result
    item.user_properties.extend(
        (name, scrub_text(value) if isinstance(value, str) else value)
        for name, value in junit_properties(result.to_dict())
    )
    return result


def _session_fields(request: pytest.FixtureRequest, perf_session: int) -> dict[str, Any]:
    """With ``--perf-sessions``: the test's session and which server start measured it (its
    pid; the simulator's seed), for the session-noise report and the history."""
    if perf_sessions(request.config) == 1:
        return {}
    server = request.getfixturevalue("kimi_server")
    info = request.getfixturevalue("kimi_endpoint").server_info or {}
    sim = info.get("sim")
    sim = sim if isinstance(sim, dict) else {}
    who: dict[str, Any] = {"pid": getattr(server, "pid", None) or sim.get("pid")}
    if "seed" in sim:
        who["seed"] = sim["seed"]
    return {PERF_SESSION: perf_session, PERF_SERVER: who}


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
    """All levels, trials and per-request records of this test's measurement (a ``@capacity``
    test's: the levels its search measured)."""
    if _kimi_measure is None:
        pytest.fail(
            "throughput_result needs the test to carry @throughput(...) or @capacity(...)",
            pytrace=False,
        )
    return _kimi_measure


@pytest.fixture
def capacity_result(throughput_result: ThroughputResult) -> dict[str, Any]:
    """A ``@capacity`` test's capacity: the report's ``capacity`` object (value, bracket,
    boundary estimate, the search's levels, baseline and verdict)."""
    capacity = throughput_result.extra.get("capacity")
    if not isinstance(capacity, dict):
        pytest.fail("capacity_result needs the test to carry @capacity(...)", pytrace=False)
    return capacity


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    result = item.stash.get(RESULT, None)
    if result is not None:
        verdicts = item.config.stash[GATE].settings.failing_verdicts()
        failing = result.failing_levels(verdicts)
        capacity = capacity_failure(result.extra, verdicts)  # a @capacity test's own verdict
        if failing or capacity:
            kinds = ", ".join(dict.fromkeys(_headline(lv.verdict) for lv in failing))
            headline = capacity or f"throughput {kinds}"  # a search's failed level is in it
            lines = format_test(result.to_dict())[1:]
            pytest.fail(scrub_text(f"{headline}:\n" + "\n".join(lines)), pytrace=False)
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
        session = getattr(getattr(item, "callspec", None), "params", {}).get("kimi_perf_session")
        if isinstance(session, int):
            data[PERF_SESSION] = session
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


def store_history(
    config: pytest.Config, report: dict[str, Any], endpoints: dict[str, dict[str, Any]]
) -> tuple[str, bool] | None:
    """Append the run to ``--perf-history``; the summary's line, and whether it failed.

    Nothing is written for ``off`` or a run that measured nothing.  A database that is down or
    refuses the write costs this one line (URL without password, and why), never the run's
    results or exit code: every exception is caught here, not only the store's own.
    """
    from pytest_kimi.history.record import measured_anything

    opts = kimi_options(config)
    if opts.perf_history is None or not measured_anything(report):
        return None
    from pytest_kimi.history.urls import HistoryError, display_url

    rootdir = Path(config.rootpath)
    shown = display_url(opts.perf_history, rootdir)
    try:
        from pytest_kimi.history.store import RunMeta, open_history

        names = [d.name for d in config.stash[DEPLOYMENTS]]
        meta = RunMeta.collect(
            report,
            suite_dir=rootdir,
            deployment=",".join(names) if names else config.stash[GATE].profile,
            endpoints=endpoints,
        )
        with open_history(opts.perf_history) as history:
            run_id = history.record_run(scrub(report), meta)
    except Exception as exc:  # the history must never cost the run, whatever went wrong
        why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
        why = why.removeprefix(f"history {display_url(opts.perf_history)}: ")
        where = f"{shown} ({opts.source('perf_history')})"  # shown: password hidden already
        return f"history: run not stored in {where}: {scrub_text(why)}", True
    return f"history: run {run_id} -> {shown}", False


class PerfReporter:
    """Collects the figures from test reports (also those xdist workers send) and writes reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = config.stash[STATE]
        self.updates: list[str] = []
        self.refused: list[str] = []
        self.session_noise: dict[str, Any] | None = None
        """``--perf-sessions``: the session-noise section (controller side, at the end)."""
        self.history: tuple[str, bool] | None = None
        """``--perf-history``: the summary's line (where the run went, or why not: True)."""

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
        if self.session_noise is not None:
            terminalreporter.section("pytest-kimi session noise")
            for line in format_session_noise(self.session_noise):
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
        if self.history is not None:
            text, failed = self.history
            terminalreporter.write_line(text, yellow=failed)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # the controller writes, from the reports the workers sent
        self.session_noise = session_noise(
            self.state.tests, current_sigma=kimi_options(self.config).perf_session_sigma
        )
        report = build_report(self.state.endpoint, self.state.tests, self.session_noise)
        write_reports(self.config, report, self.config.stash[GATE].settings.failing_verdicts())
        self.history = store_history(self.config, report, self.state.endpoints)
        gate = self.config.stash[GATE]
        if gate.update is not None and self.state.tests:
            self.updates, self.refused = update_baselines(
                gate.root,
                gate.profile,
                gate.update,
                pool_sessions(self.state.tests),  # --perf-sessions: one baseline of all starts
                self.state.endpoints,
                Path(self.config.rootpath),
            )
            if self.refused and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
