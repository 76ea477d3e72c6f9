"""``--perf-max-launches``: the deploy comparison as a paired, sequential experiment.

With two ``--server-profile`` s (the reference first) every perf test runs once per launch, the
launches in ABBA blocks (A B, B A, A B, ...: :func:`pytest_kimi.run.server_starts.run_order`).
After each block the candidate's per-launch figures are judged against the reference's by
:func:`pytest_kimi.gate.paired.run_sequential`: launch noise measured from the launches
themselves, a stopping rule whose false-alarm rate is ``alpha`` over all its looks.  A test
whose levels are decided launches no further (:func:`decided_block`); the verdicts come from
the test records alone (:func:`judge`), so the controller of an xdist run, a saved report and
the worker that decides to stop all compute the same answer.

One launch gives one figure per level: the level's ``tok_s`` (the median of its trials).
Trials inside a launch share its speed factor and cannot show it; only launches can, which is
why the launch, not the trial, is the experiment's unit.  A level whose launch was not
trustworthy (``invalid``, ``error``) loses that block, with a note.

Pure functions over the per-test dicts (the shape of ``--perf-json``'s ``tests``); the
culprit search and the race reuse :func:`judge_pair` on their own pairs of deployments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from pytest_kimi.gate.paired import MIN_BLOCKS, SequentialOutcome, run_sequential
from pytest_kimi.measure.results import PERF_SESSION
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import DeployGateEntry, DeployLevelEntry, TestEntry

DEFAULT_POWER = 0.95
"""The power the minimum detectable drop is stated at: a drop of that size is caught this often."""


@dataclass(frozen=True, slots=True)
class LaunchFigures:
    """One level of one test: its figure per block, on each side (block index -> tok/s)."""

    nodeid: str
    label: str
    reference: dict[int, float] = field(default_factory=dict)
    candidate: dict[int, float] = field(default_factory=dict)

    def blocks(self) -> list[int]:
        """The blocks measured on both sides, in order: the experiment's pairs."""
        return sorted(set(self.reference) & set(self.candidate))


@dataclass(frozen=True, slots=True)
class PairedLevel:
    """The paired verdict of one level of one test, candidate against reference."""

    candidate: str
    nodeid: str
    label: str
    blocks: list[int]
    """The blocks (``--perf-sessions`` indices) the verdict rests on."""
    reference_tok_s: list[float]
    candidate_tok_s: list[float]
    outcome: SequentialOutcome | None
    """None while fewer than :data:`MIN_BLOCKS` blocks were measured on both sides."""
    budget_left: bool
    """More blocks could still run (the launch budget is not spent): an undecided verdict is
    not final yet."""

    @property
    def decided(self) -> bool:
        return self.outcome is not None and self.outcome.comparison.decided

    @property
    def verdict(self) -> str:
        """The level's word: the decisive look's, the last look's when the budget ended
        undecided (``inconclusive`` or ``underpowered``), ``not-run`` before any look."""
        if self.outcome is None:
            return Verdict.NOT_RUN.value
        return self.outcome.comparison.verdict.value

    @property
    def decided_at(self) -> int | None:
        """The block index (0-based, as ``perf_session``) of the decisive look, or None."""
        if not self.decided or self.outcome is None:
            return None
        return self.blocks[self.outcome.blocks - 1]

    def text(self) -> str:
        """One line: the change, its interval, the launches and the smallest drop it could
        have caught, and whether the experiment decided."""
        if self.outcome is None:
            return (
                f"{self.verdict}: {len(self.blocks)} block(s) measured on both deployments, "
                f"{MIN_BLOCKS} needed for a look"
            )
        c = self.outcome.comparison
        low, high = ((x - 1.0) * 100.0 for x in c.ci90)
        mdd = (
            f"{c.min_detectable_drop * 100.0:.1f}%"
            if math.isfinite(c.min_detectable_drop)
            else "n/a"
        )
        state = (
            f"decided after {c.launches} launches"
            if c.decided
            else (
                f"undecided after {c.launches} launches"
                + ("" if not self.budget_left else ", more to come")
            )
        )
        return (
            f"{self.verdict}: {(c.ratio - 1.0) * 100.0:+.1f}% (CI {low:+.1f}% .. {high:+.1f}%, "
            f"p={c.p_regression:.4f} at the nominal {c.nominal_alpha:.4f}), launch noise "
            f"{c.launch_sigma * 100.0:.2f}%, could catch a drop of {mdd}; {state}"
        )

    def to_dict(self) -> DeployLevelEntry:
        out: DeployLevelEntry = {
            "candidate": self.candidate,
            "nodeid": self.nodeid,
            "label": self.label,
            "verdict": self.verdict,
            "decided": self.decided,
            "blocks": self.blocks,
            "launches": 2 * len(self.blocks),
            "reference_tok_s": [round(x, 2) for x in self.reference_tok_s],
            "candidate_tok_s": [round(x, 2) for x in self.candidate_tok_s],
            "text": self.text(),
        }
        if self.outcome is not None:
            out["comparison"] = self.outcome.comparison.to_dict()
            out["launches"] = self.outcome.comparison.launches
            out["looks"] = len(self.outcome.looks)
        return out


@dataclass(slots=True)
class DeployGate:
    """The paired comparison of a run: every candidate's levels against the reference's."""

    reference: str
    max_launches: int
    tolerance: float
    alpha: float
    levels: list[PairedLevel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    changes: dict[str, list[str]] = field(default_factory=dict)
    """Per candidate, what differs in the server's reported configuration from the
    reference's (:func:`deploy_changes`): the change the verdicts are about."""

    def failing(self, failing: frozenset[str]) -> list[PairedLevel]:
        """The levels whose paired verdict is in ``failing`` (verdict values): the run fails
        on them.  A level still undecided with budget left is not failing yet."""
        return [
            lv for lv in self.levels if lv.verdict in failing and (lv.decided or not lv.budget_left)
        ]

    def to_dict(self) -> DeployGateEntry:
        return {
            "reference": self.reference,
            "max_launches": self.max_launches,
            "tolerance": self.tolerance,
            "alpha": self.alpha,
            "levels": [lv.to_dict() for lv in self.levels],
            "notes": list(self.notes),
            "changes": {k: list(v) for k, v in self.changes.items()},
        }


def launch_figures(
    tests: Iterable[TestEntry], reference: str, candidate: str
) -> tuple[list[LaunchFigures], list[str]]:
    """Every level's figure per block on the two deployments, and a note for each launch's
    level left out (not trustworthy: no figure to pair)."""
    cells: dict[tuple[str, str], LaunchFigures] = {}
    notes: list[str] = []
    for test in tests:
        profile = test.get("profile")
        session = test.get(PERF_SESSION)
        if profile not in (reference, candidate) or not isinstance(session, int):
            continue
        if test.get("capacity") is not None:
            continue  # a capacity's figure is its boundary, judged by its own gate
        nodeid = str(test.get("nodeid"))
        for level in test.get("levels") or []:
            label = str(level.get("label") or f"C={level.get('concurrency')}")
            cell = cells.setdefault((nodeid, label), LaunchFigures(nodeid, label))
            side = cell.reference if profile == reference else cell.candidate
            verdict = Verdict.of(level.get("verdict"))
            tok_s = level.get("tok_s")
            if (
                verdict in (Verdict.INVALID, Verdict.ERROR, Verdict.NOT_RUN)
                or not isinstance(tok_s, (int, float))
                or not tok_s > 0
            ):
                notes.append(
                    f"{nodeid} {label} on {profile}, launch block {session + 1}: left out "
                    f"({level.get('verdict')}: no trustworthy figure), its block unpaired"
                )
                continue
            side[session] = float(tok_s)
    return list(cells.values()), notes


def judge_pair(
    figures: LaunchFigures,
    candidate: str,
    *,
    max_blocks: int,
    tolerance: float,
    alpha: float,
    power: float = DEFAULT_POWER,
    finished: bool = False,
) -> PairedLevel:
    """One level's sequential verdict from its paired blocks (replayed look by look);
    ``finished``: the run is over, so no block is still to come."""
    blocks = figures.blocks()
    ref = [figures.reference[b] for b in blocks]
    cand = [figures.candidate[b] for b in blocks]
    outcome = None
    if len(blocks) >= MIN_BLOCKS:
        outcome = run_sequential(
            ref, cand, max_blocks=max_blocks, tolerance=tolerance, alpha=alpha, power=power
        )
    return PairedLevel(
        candidate=candidate,
        nodeid=figures.nodeid,
        label=figures.label,
        blocks=blocks,
        reference_tok_s=ref,
        candidate_tok_s=cand,
        outcome=outcome,
        budget_left=not finished and len(blocks) < max_blocks,
    )


def judge(
    tests: Sequence[TestEntry],
    deployments: Sequence[str],
    *,
    max_launches: int,
    tolerance: float,
    alpha: float,
    power: float = DEFAULT_POWER,
    finished: bool = False,
) -> DeployGate | None:
    """The run's paired deploy comparison (None without two deployments): each deployment
    after the first against the first, level by level; ``finished``: the run is over (an
    undecided level is then final)."""
    if len(deployments) < 2:
        return None
    reference = deployments[0]
    gate = DeployGate(reference, max_launches, tolerance, alpha)
    max_blocks = max_launches // 2
    for candidate in deployments[1:]:
        cells, notes = launch_figures(tests, reference, candidate)
        gate.notes.extend(n for n in notes if n not in gate.notes)
        for cell in cells:
            gate.levels.append(
                judge_pair(
                    cell,
                    candidate,
                    max_blocks=max_blocks,
                    tolerance=tolerance,
                    alpha=alpha,
                    power=power,
                    finished=finished,
                )
            )
    return gate


def deploy_changes(
    endpoints: Mapping[str, Mapping[str, Any]], reference: str, candidate: str
) -> list[str]:
    """What the candidate's server reports differently from the reference's (model and the
    provenance allow-list of ``server_info``: ``max_running_requests: 256 -> 2``), as the
    baselines' provenance diff says it; empty when either endpoint is unknown."""
    from pytest_kimi.baseline.provenance import Provenance, deployment_diff

    ref, cand = endpoints.get(reference), endpoints.get(candidate)
    if not ref or not cand:
        return []

    def of(ep: Mapping[str, Any]) -> Provenance:
        info = ep.get("server_info")
        return Provenance(model=ep.get("model"), server_info=dict(info) if info else {})

    return [str(c) for c in deployment_diff(of(ref), of(cand))]


def decided_block(gate: DeployGate, nodeid: str, failing: frozenset[str]) -> int | None:
    """The block after which ``nodeid`` needs no more launches, or None: every level of it
    decided (on every candidate), or one decided with a failing verdict (the deploy is red
    whatever the others say)."""
    mine = [lv for lv in gate.levels if lv.nodeid == nodeid]
    if not mine:
        return None
    red = [lv.decided_at for lv in mine if lv.decided_at is not None and lv.verdict in failing]
    if red:
        return min(b for b in red if b is not None)
    if all(lv.decided for lv in mine):
        return max(lv.decided_at or 0 for lv in mine)
    return None


__all__ = [
    "DEFAULT_POWER",
    "DeployGate",
    "LaunchFigures",
    "PairedLevel",
    "decided_block",
    "deploy_changes",
    "judge",
    "judge_pair",
    "launch_figures",
]
