"""``--perf-race``: which of several deployments is best for one test's objective.

The session's tests are the race's first round: each deployment (a ``--server-profile``, or
one of a grid profile's deployments, :mod:`pytest_kimi.server.profile_grid`) was launched
once, warmed until stationary and measured by the raced test, judged by nothing but the race.
After the last test this module runs the rest: each round launches the surviving
deployments afresh, in the order the race gives (:func:`pytest_kimi.gate.race.round_order`:
rotated, so no deployment always follows the same neighbour), measures the test on each
through the conductor (:func:`pytest_kimi.run.one_launch.launch_once`) and records the
objective's figure (:mod:`pytest_kimi.gate.race_objective`); the race
(:class:`pytest_kimi.gate.race.Race`) eliminates those significantly worse than the best, and
stops on one winner, a tie within the tolerance, or the budget.

A deployment that does not start, or whose launch gives no figure the plugin trusts, is
eliminated in that round with the reason: a race is over deployments an operator might run,
and one that cannot be measured is not a candidate.

Server time: each launch's warm-up and measurement seconds (the test record's
``warmup_server_time_s`` + ``server_time_s``); starts are left out on both sides of the
comparison with the full grid (every deployment launched ``max_rounds`` times at its mean
launch cost), which they would only make costlier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pytest_kimi.gate.race import NO_DEPLOYMENT, Race, RaceResult, StartFailure
from pytest_kimi.gate.race_objective import (
    FrontierPoint,
    NoFigure,
    Objective,
    frontier_points,
    pool_frontier,
)

if TYPE_CHECKING:
    from pytest_kimi.wire import RaceSection

Say = Callable[[str], None]
Launch = Callable[[str], Mapping[str, Any]]
"""``launch(name)``: a fresh launch of the deployment measured by the raced test; its test
record (the report's test object).  Raises :class:`LaunchFailed`-like errors as
:class:`~pytest_kimi.gate.race.StartFailure`."""


@dataclass(slots=True)
class DeploymentRecord:
    """What the race saw of one deployment, beyond its figures."""

    name: str
    gpus: int | None
    values: list[float | None] = field(default_factory=list)
    """The objective per launch (None: no figure, the reason is the race's)."""
    server_s: list[float] = field(default_factory=list)
    frontier: list[list[FrontierPoint]] = field(default_factory=list)


@dataclass(slots=True)
class RaceReport:
    """The race and what it rests on, for every sink (the report's ``race`` section)."""

    nodeid: str
    objective: Objective
    result: RaceResult | None
    """None when the race could not run (``problem`` says why)."""
    records: dict[str, DeploymentRecord]
    max_rounds: int
    problem: str | None = None
    winner_profile: str | None = None
    """Where the winner's profile is (its own file, or the grid deployment written out)."""

    @property
    def server_s(self) -> float:
        return sum(sum(r.server_s) for r in self.records.values())

    @property
    def grid_server_s(self) -> float | None:
        """Every deployment launched ``max_rounds`` times at its mean launch cost (None when
        one never gave a cost: a failed start costs the grid too, but nobody knows what)."""
        costs = [sum(r.server_s) / len(r.server_s) for r in self.records.values() if r.server_s]
        if not costs:
            return None
        return self.max_rounds * sum(costs) * len(self.records) / len(costs)

    @property
    def winner(self) -> str | None:
        return None if self.result is None else self.result.winner

    def summary(self) -> str:
        if self.result is None:
            return f"race: not run: {self.problem}"
        line = self.result.summary()
        grid = self.grid_server_s
        if grid:
            line += f"; server time {self.server_s / grid:.0%} of the full grid's"
        return line

    def to_dict(self) -> RaceSection:
        """The report's ``race`` section (docs/reference/json-report.md)."""
        if self.result is not None:
            out = self.result.to_dict(server_s=self.server_s, grid_server_s=self.grid_server_s)
        else:
            out = {
                "ranking": [],
                "winner": None,
                "tie": [],
                "undecided": [],
                "stop": NO_DEPLOYMENT,
                "rounds": 0,
                "launches": 0,
                "server_s": 0.0,
                "grid_server_s": None,
            }
        out["objective"] = self.objective.to_dict(self.nodeid)
        for entry in out["ranking"]:
            record = self.records.get(entry["deployment"])
            entry["gpus"] = None if record is None else record.gpus
            entry["launch_values"] = (
                []
                if record is None
                else [None if v is None else round(v, 4) for v in record.values]
            )
        out["max_rounds"] = self.max_rounds
        out["winner_profile"] = self.winner_profile
        out["frontier"] = [
            {"deployment": r.name, "gpus": r.gpus, "points": pool_frontier(r.frontier)}
            for r in self.records.values()
            if r.frontier
        ]
        if self.problem is not None:
            out["problem"] = self.problem
        return cast("RaceSection", out)


def launch_cost(test: Mapping[str, Any]) -> float:
    """A launch's server seconds as the race counts them: warm-up and measurement."""
    return float(test.get("warmup_server_time_s") or 0.0) + float(test.get("server_time_s") or 0.0)


def race_deployments(
    names: Sequence[str],
    gpus: Mapping[str, int | None],
    nodeid: str,
    objective: Objective,
    first_round: Mapping[str, Mapping[str, Any] | StartFailure],
    launch: Launch,
    *,
    tolerance: float,
    alpha: float,
    max_rounds: int,
    max_launches: int | None = None,
    say: Say | None = None,
) -> RaceReport:
    """Race ``names`` on ``objective``: round 1 from ``first_round`` (each deployment's test
    record from the session, or why it gave none), the later rounds from ``launch``."""
    records = {n: DeploymentRecord(n, gpus.get(n)) for n in names}
    report = RaceReport(nodeid, objective, None, records, max_rounds)
    try:
        race = Race(
            names,
            tolerance=tolerance,
            alpha=alpha,
            max_rounds=max_rounds,
            max_launches=max_launches,
        )
    except ValueError as exc:
        report.problem = str(exc)
        return report

    def record(name: str, outcome: Mapping[str, Any] | StartFailure) -> None:
        rec = records[name]
        if isinstance(outcome, StartFailure):
            rec.values.append(None)
            race.record(name, outcome)
            if say is not None:
                say(f"{name}: {outcome.reason}")
            return
        rec.server_s.append(launch_cost(outcome))
        try:
            value = objective.value(outcome, rec.gpus)
        except NoFigure as exc:
            rec.values.append(None)
            race.record(name, StartFailure(f"{name} gave no figure: {exc}"))
            if say is not None:
                say(f"{name}: no figure: {exc}")
            return
        rec.values.append(value)
        rec.frontier.append(frontier_points(outcome, rec.gpus))
        race.record(name, value)
        if say is not None:
            say(f"{name}: {value:,.2f}")

    first = race.next_round()
    for name in first:
        record(
            name, first_round.get(name) or StartFailure(f"{name}: the session measured no figure")
        )
    while order := race.next_round():
        state = race.state()
        if say is not None:
            say(f"round {state.round}: launching {', '.join(order)}")
        for name in order:
            try:
                outcome: Mapping[str, Any] | StartFailure = launch(name)
            except StartFailure as exc:
                outcome = exc
            record(name, outcome)
    report.result = race.result()
    return report


def write_winner_profile(mapping: Mapping[str, Any], directory: Path, name: str) -> Path:
    """The winning grid deployment as a profile of its own (``--server-profile`` takes it as
    it is), written atomically under ``directory``."""
    import yaml

    from pytest_kimi.files import write_atomic

    path = directory / f"{name}.yaml"
    write_atomic(
        path,
        "# the winner of a pytest-kimi race, written out from its grid profile\n"
        + yaml.safe_dump(dict(mapping), sort_keys=False, allow_unicode=True),
    )
    return path


__all__ = [
    "DeploymentRecord",
    "RaceReport",
    "launch_cost",
    "race_deployments",
    "write_winner_profile",
]
