"""``--perf-culprit``: when the deploy gate says the candidate regresses, which change did it.

The paired deploy comparison (:mod:`pytest_kimi.run.deploy_gate`) ends with a level decided
``regression``.  Its two profiles differ in a list of atomic changes
(:func:`pytest_kimi.server.profile_diff.atomic_changes`); the search
(:func:`pytest_kimi.gate.culprit.find_culprit`) asks for deployments *between* them, the
reference with a subset of the changes applied (:func:`~pytest_kimi.server.profile_diff.derive`),
each launched fresh, warmed until stationary and measured on the failing level only, then
judged against the reference's launches by the gate's own paired comparison
(:func:`pytest_kimi.gate.culprit.measure_probe`).  The gate's reference launches start the
reference pool, and the gate's comparison of the whole candidate is the search's first step,
so nothing the gate measured is measured again.

This module is the oracle's body: launch a profile, measure one level through the same
conductor every perf test takes, stop it.  It runs after the tests (the plugin calls it at the
end of the session, before the reports are written, while Ctrl-C still stops it); a server it
starts is stopped in a ``finally``, whatever happens.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_kimi.gate.culprit import find_culprit, measure_probe
from pytest_kimi.gate.culprit_records import (
    NOTHING_TO_EXPLAIN,
    UNDECIDED,
    CulpritOutcome,
    Probe,
    Untestable,
)
from pytest_kimi.run.deploy_gate import DeployGate, PairedLevel
from pytest_kimi.server.profile import ServerProfile
from pytest_kimi.verdicts import Verdict

if TYPE_CHECKING:  # the conductor is imported where a launch measures
    from pytest_kimi.run.conductor import TestPlan

Say = Callable[[str], None]


@dataclass(slots=True)
class CulpritReport:
    """The search and what it rests on, for every sink (the report's ``culprit`` section)."""

    nodeid: str
    label: str
    reference: str
    candidate: str
    outcome: CulpritOutcome | None
    """None when the search could not run (``problem`` says why)."""
    server_s: float = 0.0
    """Wall seconds the search's launches held a server (start, warm-up, level, stop)."""
    problem: str | None = None
    explained: bool = True
    """False when the deploy gate decided no regression: nothing to explain, no launch."""

    @property
    def status(self) -> str:
        if not self.explained:
            return NOTHING_TO_EXPLAIN
        return self.outcome.status if self.outcome is not None else UNDECIDED

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "test": self.nodeid,
            "level": self.label,
            "reference": self.reference,
            "candidate": self.candidate,
        }
        if self.outcome is not None:
            out.update(self.outcome.to_dict())
        else:
            out.update(
                status=self.status, changes=[], named=[], hypothesis=[], steps=[], launches=0
            )
        out["server_s"] = round(self.server_s, 1)
        if self.problem is not None:
            out["problem"] = self.problem
        return out


def culprit_level(gate: DeployGate) -> PairedLevel | None:
    """The level the search explains: the decided regression with the largest drop (one
    level is enough to find what slows a deployment, and each probe then costs one level)."""
    failing = [
        lv
        for lv in gate.levels
        if lv.decided and lv.verdict == Verdict.REGRESSION.value and lv.outcome is not None
    ]
    if not failing:
        return None
    return min(failing, key=lambda lv: lv.outcome.comparison.ratio if lv.outcome else 1.0)


def one_level(plan: TestPlan, label: str) -> TestPlan:
    """``plan`` with only the level ``label`` (as the report names it) left to measure."""
    workload = plan.workload
    levels = tuple(lv for lv in workload.levels if workload.label(lv) == label)
    if not levels:
        raise ValueError(f"{label}: not a level of this test ({plan.marker})")
    return dataclasses.replace(plan, workload=dataclasses.replace(workload, levels=levels))


def search_culprit(
    gate: DeployGate,
    profiles: Sequence[ServerProfile],
    plans: Mapping[str, TestPlan],
    measure: Callable[[ServerProfile, TestPlan, str], float],
    *,
    max_launches: int,
    groups: Sequence[Sequence[str]] = (),
    say: Say | None = None,
) -> CulpritReport:
    """Explain the gate's worst decided regression (a report that says there is nothing to
    explain when the gate decided none).

    ``measure(profile, plan, nodeid)`` launches ``profile``, measures the plan's one level and
    returns its tok/s, raising :class:`~pytest_kimi.gate.culprit_records.Untestable` when the
    deployment does not start or gives no trustworthy figure (:func:`launch_and_measure`).
    """
    from pytest_kimi.server.profile_diff import atomic_changes, derive

    level = culprit_level(gate)
    if level is None or level.outcome is None:
        verdicts = ", ".join(sorted({lv.verdict for lv in gate.levels})) or "no level"
        return CulpritReport(
            "-",
            "-",
            profiles[0].name,
            profiles[-1].name,
            None,
            problem=f"the deploy gate decided no regression ({verdicts})",
            explained=False,
        )
    reference, candidate = profiles[0], next(p for p in profiles if p.name == level.candidate)
    report = CulpritReport(level.nodeid, level.label, reference.name, candidate.name, None)
    try:
        changes = atomic_changes(reference, candidate, groups)
        plan = one_level(plans[level.nodeid], level.label)
    except (ValueError, KeyError) as exc:
        report.problem = f"no search: {exc}"
        return report
    pool = list(level.reference_tok_s)  # the gate's reference launches start the pool
    others: list[list[float]] = []  # every probe's launches: the pooled launch noise
    start = time.monotonic()

    def compare(applied: frozenset[int], launches_left: int) -> Probe:
        chosen = [changes[i] for i in sorted(applied)]
        profile = derive(reference, candidate, chosen)
        if say is not None:
            keys = ", ".join(k for g in chosen for k in g.keys) or "nothing"
            say(f"culprit: the reference with {keys} applied ({launches_left} launch(es) left)")

        def launch(with_subset: bool) -> float:
            return measure(profile if with_subset else reference, plan, level.nodeid)

        return measure_probe(
            launch,
            pool,
            launches_left=launches_left,
            candidate=list(level.candidate_tok_s),
            others=others,
            max_blocks=max(gate.max_launches // 2, 2),
            tolerance=gate.tolerance,
            alpha=gate.alpha,
        )

    whole = Probe(level.outcome.comparison, level.outcome.comparison.launches)
    try:
        report.outcome = find_culprit(
            [g.keys for g in changes], compare, max_launches=max_launches, candidate=whole
        )
    finally:
        report.server_s = time.monotonic() - start
    return report


def launch_and_measure(
    profile: ServerProfile,
    plan: TestPlan,
    nodeid: str,
    *,
    settings: Any,
    conditions: Any,
    opts: Any,
    rootdir: Path,
    store: Any,
    say: Say | None = None,
) -> float:
    """One launch of the search: start ``profile``, measure ``plan`` (one level) through the
    conductor as the deploy gate's launches were (fresh, warmed until stationary, judged by
    nothing but the paired comparison), stop it; its level's tok/s.  A start that fails, or a
    level the run cannot trust, is :class:`~pytest_kimi.gate.culprit_records.Untestable`."""
    from pytest_kimi.run.one_launch import LaunchFailed, launch_once

    try:
        result = launch_once(
            profile,
            plan,
            nodeid,
            settings=settings,
            conditions=conditions,
            opts=opts,
            rootdir=rootdir,
            store=store,
            say=say,
        )
    except LaunchFailed as exc:
        raise Untestable(str(exc)) from None
    (level,) = result.levels
    known = Verdict.of(level.verdict)
    tok_s = level.figures.tok_s
    if known is None or not known.comparable or not tok_s or tok_s <= 0:
        raise Untestable(f"{profile.name}: {level.label} {level.verdict}: no trustworthy figure")
    if say is not None:
        say(f"[kimi {profile.name}] {level.label}: {tok_s:.1f} tok/s")
    return float(tok_s)


__all__ = [
    "CulpritReport",
    "culprit_level",
    "launch_and_measure",
    "one_level",
    "search_culprit",
]
