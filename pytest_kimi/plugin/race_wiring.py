"""``--perf-race``: the pytest side of the race (the race itself is
:mod:`pytest_kimi.run.race_run`).

The session's perf test, parametrized over the deployments, is the race's first round; after
the last test, while Ctrl-C still stops the session, the later rounds launch the survivors.
This module checks what a race needs from the session (one perf test, one process), gathers
it (the test's plan, the first round's records, the profiles) and prints the race's progress
past the capture.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimi.plugin.nodeids import baseline_id
from pytest_kimi.plugin.state import DEPLOYMENTS, PLAN, gate_context, kimi_options, racing
from pytest_kimi.plugin.uncaptured import say

if TYPE_CHECKING:
    from pytest_kimi.run.race_run import RaceReport
    from pytest_kimi.wire import TestEntry

WINNERS_DIR = Path(".kimi") / "race"
"""Where a grid's winning deployment is written out as a profile of its own (rootdir-relative)."""


def check_race_session(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """Before any launch: a race ranks deployments by one perf test's figure, so exactly one
    must be selected, and a ``capacity`` objective needs a ``@capacity`` test."""
    if not racing(config):
        return
    plans = {baseline_id(item): item.stash[PLAN] for item in items if PLAN in item.stash}
    given = kimi_options(config).source("perf_race")
    if len(plans) != 1:
        names = ", ".join(sorted(plans)[:5]) or "none"
        raise pytest.UsageError(
            f"{given}: a race ranks the deployments by one perf test's objective; "
            f"{len(plans)} perf tests are selected ({names}): select one with -k or its node id"
        )
    from pytest_kimi.gate.race_objective import parse_objective

    objective = parse_objective(kimi_options(config).perf_race_objective)
    (plan,) = plans.values()
    if (objective.kind == "capacity") != (plan.capacity is not None):
        raise pytest.UsageError(
            f"{given} with {kimi_options(config).source('perf_race_objective')} = "
            f"{objective.kind}: the objective capacity is a @capacity test's, the others a "
            f"@throughput test's; {next(iter(plans))} is a {plan.marker} test"
        )


def check_race_process(config: pytest.Config) -> None:
    """The race's later rounds run after the last test, in the process that planned the test:
    an xdist controller has no plans (it collects nothing), so a race runs without ``-n``."""
    if racing(config) and getattr(config.option, "numprocesses", None):
        if not hasattr(config, "workerinput"):
            raise pytest.UsageError(
                f"{kimi_options(config).source('perf_race')} with -n (xdist): the race launches "
                "its later rounds after the last test, in one process; run it without -n"
            )


def run_race(session: pytest.Session, tests: Sequence[TestEntry]) -> RaceReport | None:
    """The race from the session's first round to its end, or None (no race asked)."""
    config = session.config
    if not racing(config):
        return None
    from pytest_kimi.gate.race import StartFailure
    from pytest_kimi.gate.race_objective import parse_objective
    from pytest_kimi.run.conductor import RACE_COMPARISON, Conditions
    from pytest_kimi.run.one_launch import LaunchFailed, launch_once
    from pytest_kimi.run.race_run import race_deployments, write_winner_profile

    opts = kimi_options(config)
    gate = gate_context(config)
    deployments = {d.name: d for d in config.stash[DEPLOYMENTS]}
    plans = {baseline_id(item): item.stash[PLAN] for item in session.items if PLAN in item.stash}
    (nodeid, plan), *_ = plans.items()
    objective = parse_objective(opts.perf_race_objective)
    rootdir = Path(config.rootpath)
    conditions = Conditions.of(opts, rootdir)

    def tell(text: str) -> None:
        say(config, f"[kimi race] {text}")

    def launch(name: str) -> Mapping[str, Any]:
        try:
            result = launch_once(
                deployments[name],
                plan,
                nodeid,
                settings=gate.settings,
                conditions=conditions,
                opts=opts,
                rootdir=rootdir,
                store=gate.store(name),
                judged_by=RACE_COMPARISON,
                say=tell,
            )
        except LaunchFailed as exc:
            raise StartFailure(str(exc)) from None
        return dict(result.to_dict())

    report = race_deployments(
        list(deployments),
        {name: _gpus(d) for name, d in deployments.items()},
        nodeid,
        objective,
        first_round(tests, nodeid, list(deployments)),
        launch,
        tolerance=gate.settings.tolerance,
        alpha=gate.settings.alpha,
        max_rounds=opts.perf_race_rounds,
        say=tell,
    )
    winner = deployments.get(report.winner or "")
    if winner is not None:
        if winner.grid is not None:
            try:
                path = write_winner_profile(winner.grid.profile, rootdir / WINNERS_DIR, winner.name)
                report.winner_profile = str(path.relative_to(rootdir))
            except OSError as exc:
                tell(f"the winner's profile was not written: {exc}")
        elif winner.path is not None:
            report.winner_profile = str(winner.path)
    return report


def first_round(
    tests: Sequence[TestEntry], nodeid: str, names: Sequence[str]
) -> dict[str, Mapping[str, Any] | Any]:
    """Each deployment's session record of the raced test, or a StartFailure with why it has
    none (its server did not start: the skip's reason; an error before measuring)."""
    from pytest_kimi.gate.race import StartFailure

    out: dict[str, Mapping[str, Any] | StartFailure] = {}
    for test in tests:
        name = test.get("profile")
        if test.get("nodeid") != nodeid or not isinstance(name, str) or name not in names:
            continue
        if test.get("levels"):
            out[name] = test
        else:
            why = test.get("error") or test.get("outcome") or "nothing measured"
            out[name] = StartFailure(str(why).removeprefix("race: "))
    return out


def _gpus(profile: Any) -> int | None:
    from pytest_kimi.server.profile import ProfileError
    from pytest_kimi.server.profile_grid import gpus_of

    if profile.grid is not None:
        return int(profile.grid.gpus) if profile.grid.gpus else None
    try:
        return gpus_of(profile)
    except ProfileError:
        return None


def junit_race(report: RaceReport) -> dict[str, str]:
    """The answer as global ``--junitxml`` properties (``kimi_race_stop``,
    ``kimi_race_winner``, ``kimi_race``: the summary line): the race ends after the last test,
    so no test's properties can carry it."""
    from pytest_kimi.scrub import scrub_text

    return {
        "kimi_race_stop": str(report.to_dict()["stop"]),
        "kimi_race_winner": report.winner or "",
        "kimi_race": scrub_text(report.summary()),
    }
