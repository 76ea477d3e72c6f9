"""Fixtures shared by the test modules that measure the simulator directly (no pytester)."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import signal
import sys
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.results import LevelResult
from pytest_kimi.run.measurer import Measurer, build_spec
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.markers import parse_throughput

from support.otava import require_otava
from support.inprocess import bounded_inprocess
from support.timing import SESSION_S
from support.busy_machine import INNER_ADDOPTS, SESSION_ATTEMPTS, rerun_when_the_machine_voided

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None or sys.dont_write_bytecode:
    # The suite starts hundreds of Python processes (pytest sessions, simulators, engines'
    # fakes), each importing the plugin, numpy, scipy and aiohttp; without bytecode caches
    # every one compiles them all from source again (and pytest's assertion rewriting of the
    # plugin's modules besides): about a second of CPU a session on a 2-core machine.  The
    # caches go where Python puts them (``__pycache__``, ignored by git).
    sys.dont_write_bytecode = False

INNER_SESSION_IMPORTS = ("pytest_kimi", "alembic.command", "alembic.script")
"""What every in-process inner session (``pytester.runpytest``) would import for itself,
imported once here.  ``pytester`` puts ``sys.modules`` back as it was after each inline session,
so a module first imported inside one (the run stage, the history's SQLAlchemy and, for a new
history, Alembic) was dropped again and imported anew by the next, in every one of hundreds
of sessions.  Modules present before a session are kept, and shared
by the sessions as the plugin's own wiring always was."""


def _import_inner_session_modules() -> None:
    for name in INNER_SESSION_IMPORTS:
        module = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{name}."):
            if not info.name.endswith("__main__") and ".migrations." not in info.name:
                importlib.import_module(info.name)


_import_inner_session_modules()


if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A shell without job control starts background commands with SIGINT ignored, and an
    # ignored signal stays ignored across exec: the Ctrl-C tests' children (pytest sessions,
    # load clients) would never see the SIGINT they are sent.  A handler (unlike SIG_IGN) is
    # reset to the default in every child, where Python turns it into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class SimMeasurement:
    """One level measured through the plugin's pipeline against a simulator of its own, with
    the simulator's counters read after it (so they speak of this level alone)."""

    level: LevelResult
    sim_stats: dict[str, Any] = field(default_factory=dict)
    truths: list[dict[str, Any] | None] = field(default_factory=list)
    """Per trial, what the engine delivered over exactly the steps the trial's window held
    (``/sim/truth``: tokens, steps, ``wall_tok_s``); None for a trial without a window."""

    @property
    def sim_lag_s(self) -> float:
        """The latest the simulator delivered any step behind its schedule (its own count,
        from its start to the end of the level): how far a token may be from the time its step
        model says."""
        return float(self.sim_stats["max_lag_s"])

    @property
    def client_lag_s(self) -> float:
        """The client's longest event-loop stall over the level's trials."""
        return max(t.client.loop_lag_max_s for t in self.level.trials)

    def edge_slack_s(self, trial: TrialResult) -> float:
        """How far the measured ends of a trial's steady-state window may sit from the steps
        that bound it: each end is late by the simulator's lateness at that step and by the
        client's stall then (its lag monitor's word); both are measured, not assumed."""
        assert trial.window is not None
        start, end = trial.window
        return 2 * self.sim_lag_s + trial.client.stall_at(start) + trial.client.stall_at(end)

    def window_slack(self, trial: TrialResult) -> float:
        """The relative error the ends of ``trial``'s window may put on its tok/s, as measured."""
        return self.edge_slack_s(trial) / trial.window_s

    def request_slack(self) -> float:
        """The relative error the ends of the level's requests may put on their decode rates
        (first to last token), as measured: the largest over the requests."""
        return max(
            (
                2 * self.sim_lag_s
                + t.client.stall_at(r.first_token)
                + t.client.stall_at(r.last_token)
            )
            / (r.last_token - r.first_token)
            for t in self.level.trials
            for r in t.records
            if r.ok
        )

    def assert_valid_but_for_the_machine(self) -> None:
        """Every trial is valid, or voided only for a reason the plugin calls transient: its
        client stalled because another process took the core (the machine, not the server or
        the measurement; the figures of such a trial are still held to the bounds)."""
        for trial in self.level.trials:
            assert set(trial.invalid) <= set(trial.transient), trial.invalid
        assert self.level.verdict in ("pass", "invalid"), (self.level.verdict, self.level.reasons)


def sim_stats(url: str) -> dict[str, Any]:
    with _NO_PROXY.open(url + "/sim/stats", timeout=30) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def sim_truth(url: str, start: float, end: float) -> dict[str, Any]:
    with _NO_PROXY.open(f"{url}/sim/truth?start={start!r}&end={end!r}", timeout=30) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def _running_sim(tmp_path_factory: pytest.TempPathFactory, config: SimConfig) -> Iterator[str]:
    with SimProcess(config, log_dir=tmp_path_factory.mktemp("simlogs")) as sim:
        assert sim.url is not None
        yield sim.url


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a simulator of the test module's own, EP8-shaped and 10x faster: C=1 gives
    ~650 tok/s.  A trial lasts what its window needs on the wall clock whatever the speed, and at
    10 the simulator and the client need a few percent of a core, where at 50 they kept one busy.
    An external server as several sessions (pytester runs) would share one."""
    yield from _running_sim(tmp_path_factory, SimConfig(speed=10.0))


@pytest.fixture(scope="module")
def chunked_sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Like :func:`sim_url` at the main job's pace: 20x (~1,000 tok/s per stream, a 512-token
    request lasts about half a second), 8 tokens per stream event."""
    yield from _running_sim(tmp_path_factory, SimConfig(speed=20.0, stream_interval=8))


@pytest.fixture
def otava() -> None:
    """Apache Otava for a test that runs the change-point detector (support/otava.py)."""
    require_otava()


@pytest.fixture(scope="module")
def sim_measure(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Callable[..., SimMeasurement]:
    """``sim_measure(profile, name, **throughput)``: start a simulator for ``profile``, measure
    one level (the ``@throughput`` arguments, one concurrency) through a :class:`Measurer`,
    read the simulator's counters, stop it.  A simulator per level, so that its counters (how
    late it ever was) describe that level and no heavier one before it."""

    def measure(profile: SimConfig, name: str, **throughput: Any) -> SimMeasurement:
        sim = SimProcess(profile, log_dir=tmp_path_factory.mktemp("simlogs"))
        sim.start()
        session = Measurer()
        try:
            assert sim.url is not None
            endpoint = session.discover(sim.url, api_key=None, model=None)
            workload, targets = parse_throughput((), throughput)
            spec = build_spec(endpoint, name, workload, targets, rootdir=pytestconfig.rootpath)
            (level,) = session.measure(spec).levels
            truths = [
                sim_truth(sim.url, *t.window) if t.window is not None else None
                for t in level.trials
            ]
            return SimMeasurement(level, sim_stats(sim.url), truths)
        finally:
            session.close()
            sim.stop()

    return measure


@pytest.fixture(autouse=True)
def _inner_addopts(monkeypatch: pytest.MonkeyPatch) -> None:
    """:data:`INNER_ADDOPTS` for the sessions a test starts in a subprocess of its own, and a
    wide ``COLUMNS``: tests read the summary's content, one line per message, whatever the
    outer terminal (an xdist worker, a CI log, a tty); the layout tests set their own width."""
    monkeypatch.setenv("PYTEST_ADDOPTS", INNER_ADDOPTS)
    monkeypatch.setenv("COLUMNS", "2000")


@pytest.fixture
def session_attempts() -> int:
    """How often a machine-voided inner session runs (tests/engine asks for more)."""
    return SESSION_ATTEMPTS


@pytest.fixture
def session_bound_s() -> float:
    """How long an in-process inner session may run (tests/engine and tests/sglang allow more)."""
    return SESSION_S


@pytest.fixture
def pytester(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    session_attempts: int,
    session_bound_s: float,
) -> Iterator[pytest.Pytester]:
    """pytest's ``pytester``, whose sessions are run again when the machine voided them
    (:func:`busy_machine.rerun_when_the_machine_voided`): the verdicts they test are the code's.
    Its sessions get :data:`INNER_ADDOPTS` too (``pytester`` clears ``PYTEST_ADDOPTS``), and an
    in-process session is bounded as a subprocess one is (:mod:`support.inprocess`)."""
    monkeypatch.setenv("PYTEST_ADDOPTS", INNER_ADDOPTS)
    monkeypatch.setattr(
        pytester,
        "runpytest_inprocess",
        bounded_inprocess(pytester.runpytest_inprocess, session_bound_s),
    )
    busy = [False]
    for name in ("runpytest", "runpytest_inprocess", "runpytest_subprocess"):
        wrapped = rerun_when_the_machine_voided(
            pytester, getattr(pytester, name), busy, session_attempts
        )
        monkeypatch.setattr(pytester, name, wrapped)
    yield pytester


LONG_FILES = (
    "test_race_run.py",
    "test_verdict_scenarios.py",
    "test_culprit_run.py",
    "test_latency_flow.py",
    "test_capacity.py",
    "test_hostile_streams_c1.py",
    "test_plugin.py",
    "test_sessions.py",
    "test_gate_flow.py",
    "test_accuracy.py",
    "test_deploy_gate_run.py",
    "test_options.py",
    "test_noise_evidence.py",
    "test_managed.py",
    "test_server.py",
    "test_history_capacity.py",
    "test_history_store.py",
)
"""The test files that take longest (20 s or more of one worker, the longest first: measured
with ``--durations=0`` on a quiet 2-core machine), collected before all others.
``pytest -n 3 --dist loadfile`` hands each file to one worker whole, the next file to
whichever worker is free.  By default pytest-xdist orders the files by their number of tests,
most first (``--loadscope-reorder``), which put these, a few long tests each, last: the run
ended with one worker on ``test_culprit_run.py`` or ``test_latency_flow.py`` while the others
sat idle (a simulation of the measured durations with two workers: 859 s against 771 s; 815 s
against 814 s with this order).  Long files first leave the short ones to even out the
workers' ends.  Only the order of files changes, never their tests' order or outcome; a file
missing from the list, or listed and gone, costs time at most."""


def pytest_configure(config: pytest.Config) -> None:
    # the collection order below, not the number of tests a file has, decides which file an
    # xdist worker gets next (the option exists where pytest-xdist is installed)
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    # a stable sort: within a file, and among the files not listed, the order stays
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
