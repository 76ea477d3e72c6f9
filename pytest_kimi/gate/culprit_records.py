"""The culprit search's records: what a probe found, each step, the answer, and their words.

Why a module of its own: these are the records the search (:mod:`pytest_kimi.gate.culprit`)
produces and the run and report layers read (:mod:`pytest_kimi.run.culprit_run`, and the
JSON report's ``culprit`` section, :meth:`CulpritOutcome.to_dict`), apart from the search's
logic: a reader of an outcome needs its fields and words, not the state machine that made it.

The oracle, ``compare(applied, launches_left) -> Probe`` (:class:`Oracle`), launches the
reference with the groups ``applied`` and judges it.  A subset *reproduces*
(:data:`REPRODUCES`) when its verdict is ``regression``, is *clean* (:data:`CLEAN`) on
``pass`` or ``improved``, is *undecided* (:data:`UNSETTLED`) otherwise, and is *untestable*
(:data:`UNTESTABLE`) when its deployment did not start (:class:`Untestable`, like ``git
bisect skip``).  Each probe the search made is a :class:`Step`; the search's answer is a
:class:`CulpritOutcome`, :data:`NAMED`, :data:`UNDECIDED` or :data:`NOTHING_TO_EXPLAIN`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_kimi.gate.paired import PairedComparison
from pytest_kimi.gate.probe_stats import ProbeComparison
from pytest_kimi.verdicts import Verdict

__all__ = [
    "CLEAN",
    "NAMED",
    "NOTHING_TO_EXPLAIN",
    "REPRODUCES",
    "UNDECIDED",
    "UNSETTLED",
    "UNTESTABLE",
    "CulpritOutcome",
    "Oracle",
    "Probe",
    "Step",
    "Untestable",
]

NAMED = "named"
UNDECIDED = "undecided"
NOTHING_TO_EXPLAIN = "nothing-to-explain"

REPRODUCES = "reproduces"
CLEAN = "clean"
UNSETTLED = "undecided"
UNTESTABLE = "untestable"


class Untestable(Exception):
    """The deployment with a subset applied did not start (or gave no trustworthy figure):
    the oracle raises this, or returns :meth:`Probe.failed`."""

    def __init__(self, reason: str, launches: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.launches = launches
        """Launches the failed attempt cost (a start that failed is a start)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """What the oracle found for one subset: its paired comparison with the reference."""

    comparison: PairedComparison | ProbeComparison | None = None
    """The look that decided (or the last one): the gate's tolerance-based paired comparison,
    or the two-point test's (:mod:`pytest_kimi.gate.probe_stats`); None when untestable or
    never looked at."""
    launches: int = 0
    """Launches this probe started, a failed start included, reused reference launches not."""
    untestable: str | None = None
    """Why the deployment could not be measured (it did not start), else None."""

    @classmethod
    def failed(cls, reason: str, launches: int = 1) -> Probe:
        return cls(None, launches, reason)

    @property
    def outcome(self) -> str:
        """:data:`REPRODUCES`, :data:`CLEAN`, :data:`UNSETTLED` or :data:`UNTESTABLE`."""
        if self.untestable is not None:
            return UNTESTABLE
        if self.comparison is None:
            return UNSETTLED
        verdict = self.comparison.verdict
        if verdict is Verdict.REGRESSION:
            return REPRODUCES
        if verdict in (Verdict.PASS, Verdict.IMPROVED):
            return CLEAN
        return UNSETTLED


class Oracle(Protocol):
    """``compare(applied, launches_left)``: the reference with the groups ``applied`` (indices
    into the search's changes), judged against the reference, in at most ``launches_left``
    launches; raises :class:`Untestable` (or returns :meth:`Probe.failed`) when it does not
    start."""

    def __call__(self, applied: frozenset[int], launches_left: int) -> Probe: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One probe of the search, as every report shows it."""

    applied: frozenset[int]
    keys: tuple[str, ...]
    """The applied changes as the profile writes them (``enable-eplb``, ``env:NAME``)."""
    purpose: str
    """``candidate`` (the deploy gate's own comparison), ``split``, ``dd``, ``alone`` (the
    named set applied alone: confirmation) or ``without`` (the candidate without it)."""
    probe: Probe

    @property
    def outcome(self) -> str:
        return self.probe.outcome

    @property
    def verdict(self) -> str:
        """The word the reports print: the paired comparison's verdict at the tolerance
        (``regression``, ``pass``, ...), but for a subset the two-point test *classified*, its
        class (``reproduces``: like the candidate; ``clean``: like the reference).  A class is
        a claim against the two measured ends, not against the tolerance: one launch of a
        clean subset may carry an interval wider than the tolerance, and ``pass`` beside it
        would claim what the data do not vouch for."""
        c = self.probe.comparison
        if self.probe.untestable is not None:
            return UNTESTABLE
        if c is None:
            return Verdict.NOT_RUN.value
        if isinstance(c, ProbeComparison) and c.decided:
            return self.outcome
        return c.verdict.value

    @property
    def launches(self) -> int:
        return self.probe.launches

    @property
    def ratio(self) -> float | None:
        """The subset's figure over the reference's (geometric means), None when unmeasured."""
        return None if self.probe.comparison is None else self.probe.comparison.ratio

    @property
    def ci90(self) -> tuple[float, float] | None:
        return None if self.probe.comparison is None else self.probe.comparison.ci90

    def change_pct(self) -> float | None:
        c = self.probe.comparison
        return None if c is None else round((c.ratio - 1.0) * 100.0, 2)

    def ci90_pct(self) -> list[float] | None:
        c = self.probe.comparison
        return None if c is None else [round((x - 1.0) * 100.0, 2) for x in c.ci90]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "applied": list(self.keys),
            "purpose": self.purpose,
            "change_pct": self.change_pct(),
            "ci90": self.ci90_pct(),
            "verdict": self.verdict,
            "outcome": self.outcome,
            "launches": self.launches,
        }
        if self.probe.untestable is not None:
            out["untestable"] = self.probe.untestable
        return out

    def text(self) -> str:
        """``enable-eplb+env:A  -14.8% (CI -16.0% .. -13.5%)  regression  [split, 2 launches]``"""
        subset = "+".join(self.keys) or "(reference)"
        ci = self.ci90_pct()
        if self.probe.untestable is not None:
            effect = f"did not start: {self.probe.untestable}"
        elif ci is None:
            effect = "not measured"
        else:
            effect = f"{self.change_pct():+.1f}% (CI {ci[0]:+.1f}% .. {ci[1]:+.1f}%)"
        return f"{subset}  {effect}  {self.verdict}  [{self.purpose}, {self.launches} launches]"


@dataclass(frozen=True, slots=True)
class CulpritOutcome:
    """The search's answer."""

    status: str
    """:data:`NAMED`, :data:`UNDECIDED` or :data:`NOTHING_TO_EXPLAIN`."""
    changes: tuple[tuple[str, ...], ...]
    """Every group's keys, in the search's order (its indices)."""
    named: tuple[int, ...]
    """The groups named (confirmed: applied alone they reproduce, and the candidate without
    them recovers); empty unless ``status`` is ``named``."""
    hypothesis: tuple[int, ...]
    """The best hypothesis: the named groups, or the suspects the search had narrowed the
    culprit to when it stopped undecided (empty when there is nothing to explain)."""
    steps: tuple[Step, ...]
    launches: int
    """Launches the search started (its probes'); the candidate's own comparison, passed in
    from the deploy gate, not counted."""
    probes: int = 0
    """Comparisons the search asked the oracle for (the candidate's, passed in, not counted;
    a subset is probed again only to re-test a claim, each time counted)."""
    notes: tuple[str, ...] = ()

    def keys(self, groups: Sequence[int]) -> list[str]:
        return [key for g in groups for key in self.changes[g]]

    @property
    def named_keys(self) -> list[str]:
        return self.keys(self.named)

    @property
    def hypothesis_keys(self) -> list[str]:
        return self.keys(self.hypothesis)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report's ``culprit`` section (``server_s`` is the run layer's to add)."""
        return {
            "status": self.status,
            "changes": [key for group in self.changes for key in group],
            "groups": [list(group) for group in self.changes],
            "named": self.named_keys,
            "hypothesis": self.hypothesis_keys,
            "steps": [s.to_dict() for s in self.steps],
            "launches": self.launches,
            "probes": self.probes,
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        """One line: what was named (or why not), and what it cost."""
        cost = f"{self.probes} probe(s), {self.launches} launch(es)"
        if self.status == NAMED:
            return f"culprit: {' + '.join(self.named_keys)} ({cost})"
        if self.status == NOTHING_TO_EXPLAIN:
            return f"culprit: nothing to explain ({cost})"
        hint = ", ".join(self.hypothesis_keys) or "none"
        return f"culprit: undecided, best hypothesis {hint} ({cost})"
