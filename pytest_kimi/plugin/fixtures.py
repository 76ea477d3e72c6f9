"""The plugin's fixtures: the measurer, the deployment, the server, the endpoint, and the
autouse fixture that runs a perf test's plan through the conductor before its body.

Each fixture only wires pytest to a pytest-free stage: :mod:`pytest_kimi.run.setup` resolves
the endpoint, :func:`pytest_kimi.run.conductor.conduct` measures and judges.  The stages are
imported in the fixtures' bodies, so that a session that uses none of them never loads them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimi.plugin.nodeids import baseline_id
from pytest_kimi.plugin.state import (
    DEPLOYMENTS,
    PLAN,
    REQUESTS,
    RESULT,
    STATE,
    gate_context,
    kimi_options,
    measured_only,
    perf_sessions,
    racing,
)
from pytest_kimi.plugin.uncaptured import progress_printer, say
from pytest_kimi.plugin.xdist import one_measurement_at_a_time
from pytest_kimi.scrub import scrub_text

if TYPE_CHECKING:
    from pytest_kimi.endpoint.discovery import EndpointInfo
    from pytest_kimi.measure.results import ThroughputResult
    from pytest_kimi.report.requests_file import TestRequests
    from pytest_kimi.run.conductor import conduct
    from pytest_kimi.run.measurer import KimiLoad, Measurer
    from pytest_kimi.server import ServerProfile
    from pytest_kimi.wire import CapacityEntry, PerfServer
else:

    def conduct(*args: Any, **kwargs: Any) -> Any:
        """:func:`pytest_kimi.run.conductor.conduct`, imported by the first perf test; a module
        attribute still, which a test may wrap (``fixtures.conduct = ...``)."""
        from pytest_kimi.run.conductor import conduct

        return conduct(*args, **kwargs)


def session_label(config: pytest.Config, perf_session: int) -> str:
    """`` s2`` in a server's progress lines with ``--perf-sessions``; nothing without."""
    if perf_sessions(config) == 1:
        return ""
    from pytest_kimi.measure.results import session_id

    return f" {session_id(perf_session)}"


@pytest.fixture(scope="session")
def _kimi_measurer(pytestconfig: pytest.Config) -> Iterator[Measurer]:
    from pytest_kimi.run.measurer import Measurer

    measurer = Measurer(workers=kimi_options(pytestconfig).perf_workers)
    try:
        yield measurer
    finally:
        measurer.close()


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
    from pytest_kimi.server import ServerStartError, open_server

    label = kimi_deployment.name + session_label(pytestconfig, kimi_perf_session)

    def progress(message: str) -> None:
        say(pytestconfig, f"[kimi {label}] {message}")

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
        if racing(pytestconfig):  # eliminated in the race's first round, with this reason
            pytest.skip(scrub_text(f"race: {problem}"))
        pytest.fail(scrub_text(problem), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kimi_endpoint(
    pytestconfig: pytest.Config,
    _kimi_measurer: Measurer,
    kimi_server: Any,
    kimi_perf_session: int,
) -> Iterator[EndpointInfo]:
    """The endpoint under test: URL, model and server info (launching the simulator for ``sim``,
    afresh for each ``--perf-sessions`` session, with the spec's seed plus the session index)."""
    from pytest_kimi.endpoint.discovery import EndpointError
    from pytest_kimi.run.setup import NO_ENDPOINT_REASON, SetupError, open_endpoint

    opts = kimi_options(pytestconfig)
    if opts.endpoint is None and kimi_server is None:
        if opts.perf_require_measurement:
            pytest.fail(f"{NO_ENDPOINT_REASON} (--perf-require-measurement)", pytrace=False)
        pytest.skip(NO_ENDPOINT_REASON)
    label = session_label(pytestconfig, kimi_perf_session)
    problem = None
    try:
        endpoint = open_endpoint(
            opts,
            _kimi_measurer,
            kimi_server,
            rootdir=Path(pytestconfig.rootpath),
            perf_session=kimi_perf_session,
            say=(lambda text: _say_sim(pytestconfig, label, text)) if label else None,
        )
    except SetupError as exc:
        raise pytest.UsageError(str(exc)) from None
    except EndpointError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(scrub_text(problem), pytrace=False)
    public = endpoint.info.public()
    if pytestconfig.stash[STATE].endpoint is None:
        pytestconfig.stash[STATE].endpoint = public
    # the tests measured from now on measure this one (a deployment of an A/B, a launch)
    pytestconfig.stash[STATE].current_endpoint = public
    try:
        yield endpoint.info
    finally:
        endpoint.close()


def _say_sim(config: pytest.Config, label: str, text: str) -> None:
    say(config, f"[kimi sim{label}] {text}")


@pytest.fixture
def kimi_load(
    request: pytest.FixtureRequest, kimi_endpoint: EndpointInfo, _kimi_measurer: Measurer
) -> KimiLoad:
    """The load engine bound to the endpoint: ``await kimi_load.sweep(concurrency=[1, 8])``."""
    from pytest_kimi.run.measurer import KimiLoad

    config = request.config
    opts = kimi_options(config)
    return KimiLoad(
        _kimi_measurer,
        kimi_endpoint,
        baseline_id(request.node),
        Path(config.rootpath),
        opts.perf_trials,
        opts.perf_protocol,
        allow_large=opts.perf_allow_large,
        hold=lambda: one_measurement_at_a_time(config, kimi_endpoint.url),
    )


@pytest.fixture(autouse=True)
def _kimi_measure(
    request: pytest.FixtureRequest, kimi_deployment: ServerProfile | None, kimi_perf_session: int
) -> ThroughputResult | None:
    """Measure a perf test before its body runs and judge it: its plan, through the conductor.

    Never raises on a bad level (verdicts say what went wrong); a corrupt or incomparable
    baseline fails the test before any load is sent.  In a same-run A/B, deployments after the
    first are judged against the first one's figures from this very run.  ``kimi_perf_session``
    is requested here so that it is in every test's closure and ``--perf-sessions`` can
    parametrize it.
    """
    item = request.node
    plan = item.stash.get(PLAN, None)
    if plan is None:
        return None
    from pytest_kimi.report.junit import junit_properties
    from pytest_kimi.run.conductor import (
        Conditions,
        GateProblem,
        RACE_COMPARISON,
        JudgedAgainst,
        MeasurementInterrupted,
    )
    from pytest_kimi.run.endpoint_lock import EndpointBusy, EndpointLockError

    config = request.config
    opts = kimi_options(config)
    gate = gate_context(config)
    deployments = config.stash[DEPLOYMENTS]
    nodeid = baseline_id(item)
    name = kimi_deployment.name if kimi_deployment is not None else None
    race = racing(config)
    comparison = JudgedAgainst(
        store=gate.store(name),
        deployment=name,
        reference=deployments[0].name
        if len(deployments) > 1 and not measured_only(config)
        else None,
        references=config.stash[STATE].references,
        paired=measured_only(config),
        **({"judged_by": RACE_COMPARISON} if race else {}),
    )
    conditions = Conditions.of(
        opts,
        Path(config.rootpath),
        replace_corrupt=gate.update == "force",
        level_done=_requests_of(config, nodeid, name, kimi_perf_session),
    )
    problem: str | None = None
    endpoint = request.getfixturevalue("kimi_endpoint")  # the lock is the endpoint's
    try:
        with one_measurement_at_a_time(config, endpoint.url):
            result = conduct(
                plan,
                nodeid,
                request.getfixturevalue("_kimi_measurer"),
                endpoint,
                gate.settings,
                comparison,
                conditions,
                server=request.getfixturevalue("kimi_server"),
                progress=progress_printer(
                    config, nodeid + session_label(config, kimi_perf_session)
                ),
            )
    except (GateProblem, EndpointBusy, EndpointLockError) as exc:
        problem = str(exc)
    except MeasurementInterrupted as exc:
        _where(request, exc.result, kimi_perf_session)
        from pytest_kimi.plugin.reporter import report_interrupted

        report_interrupted(config, exc.result)
        raise KeyboardInterrupt from None  # what pytest and users know an interrupt by
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    intervals = config.stash[STATE].intervals
    result.measured = intervals[-1] if intervals else None
    _where(request, result, kimi_perf_session)
    item.stash[RESULT] = result
    item.user_properties.extend(
        (name, scrub_text(value) if isinstance(value, str) else value)
        for name, value in junit_properties(result.to_dict())
    )
    return result


def _requests_of(
    config: pytest.Config, nodeid: str, deployment: str | None, perf_session: int
) -> TestRequests | None:
    """``--perf-requests``: the test's level sink (its lines name the test as the JSON does:
    id, deployment, ``--perf-sessions`` start); None without the option."""
    requests = config.stash.get(REQUESTS, None)
    if requests is None:
        return None
    session = perf_session if perf_sessions(config) > 1 else None
    return requests.for_test(nodeid, profile=deployment, perf_session=session)


def _where(request: pytest.FixtureRequest, result: ThroughputResult, perf_session: int) -> None:
    """With ``--perf-sessions``: the test's session and which server start measured it (its
    pid; the simulator's seed), for the session-noise report and the history."""
    if perf_sessions(request.config) == 1:
        return
    server = request.getfixturevalue("kimi_server")
    endpoint = request.getfixturevalue("kimi_endpoint")
    info = endpoint.server_info or {}
    sim = info.get("sim")
    sim = sim if isinstance(sim, dict) else {}
    who: PerfServer = {"pid": getattr(server, "pid", None) or endpoint.server_pid}
    if "seed" in sim:
        who["seed"] = sim["seed"]
    result.perf_session = perf_session
    result.perf_server = who


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
def capacity_result(throughput_result: ThroughputResult) -> CapacityEntry:
    """A ``@capacity`` test's capacity: the report's ``capacity`` object (value, bracket,
    boundary estimate, the search's levels, baseline and verdict)."""
    capacity = throughput_result.capacity
    if capacity is None:
        pytest.fail("capacity_result needs the test to carry @capacity(...)", pytrace=False)
    return capacity
