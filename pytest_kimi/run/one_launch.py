"""One launch of an experiment after the tests: start a profile, measure a test's plan through
the conductor every perf test takes, stop it.

Why one home: the culprit search (:mod:`pytest_kimi.run.culprit_run`) and the race
(:mod:`pytest_kimi.run.race_run`) both launch deployments after the last test, each launch
fresh, warmed until stationary and measured as the session's launches were (judged by nothing
but the experiment: ``JudgedAgainst(paired=True)``).  A server it starts is stopped in a
``finally``, whatever happens; a start that fails, an endpoint that cannot be measured or a
plan the gate refuses is :class:`LaunchFailed` with the reason, for the experiment to record.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pytest_kimi.server.profile import ServerProfile

if TYPE_CHECKING:  # the conductor is imported where a launch measures
    from pytest_kimi.measure.results import ThroughputResult
    from pytest_kimi.run.conductor import TestPlan

Say = Callable[[str], None]


class LaunchFailed(Exception):
    """The launch gave no measurement: the profile did not start, its endpoint could not be
    measured, or the gate refused the plan.  The message names the deployment."""


def launch_once(
    profile: ServerProfile,
    plan: TestPlan,
    nodeid: str,
    *,
    settings: Any,
    conditions: Any,
    opts: Any,
    rootdir: Path,
    store: Any,
    judged_by: str | None = None,
    say: Say | None = None,
) -> ThroughputResult:
    """Start ``profile``, measure ``plan`` on it, stop it: the test's result (its levels'
    verdicts say whether each figure can be trusted; the caller decides what to do with an
    untrustworthy one).  ``judged_by`` names the experiment in the result's
    ``compared_with``."""
    from pytest_kimi.endpoint.discovery import EndpointError
    from pytest_kimi.run.conductor import PAIRED_COMPARISON, GateProblem, JudgedAgainst, conduct
    from pytest_kimi.run.measurer import Measurer
    from pytest_kimi.run.setup import open_endpoint
    from pytest_kimi.server import ServerStartError, open_server

    server = open_server(profile, rootdir / ".kimi" / "logs")
    measurer = Measurer(workers=opts.perf_workers)
    try:
        try:
            server.launch(progress=(lambda m: say(f"[kimi {profile.name}] {m}")) if say else None)
        except ServerStartError as exc:
            raise LaunchFailed(f"{profile.name} did not start: {exc}") from None
        try:
            endpoint = open_endpoint(opts, measurer, server, rootdir=rootdir)
        except EndpointError as exc:
            raise LaunchFailed(f"{profile.name}: {exc}") from None
        try:
            return conduct(
                plan,
                nodeid,
                measurer,
                endpoint.info,
                settings,
                JudgedAgainst(
                    store=store,
                    deployment=profile.name,
                    paired=True,
                    judged_by=judged_by or PAIRED_COMPARISON,
                ),
                conditions,
                server=server,
            )
        except GateProblem as exc:
            raise LaunchFailed(f"{profile.name}: {exc}") from None
        finally:
            endpoint.close()
    finally:
        try:
            measurer.close()
        finally:
            server.stop()


__all__ = ["LaunchFailed", "launch_once"]
