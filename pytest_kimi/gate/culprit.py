"""Which change did it: a culprit search over a deployment diff, as pure functions over an oracle.

When the deploy gate says a candidate deployment regresses, its diff to the reference is a list
of atomic changes (server arguments, environment variables, the engine, the model:
:mod:`pytest_kimi.server.profile_diff`), grouped where they cannot be applied apart.  The
search names the smallest set of those groups that reproduces the regression, every claim
backed by a comparison with its estimate and 90% CI, in few launches, and never names a
change whose effect it did not test.

The oracle, ``compare(applied, launches_left) -> Probe``, launches the reference with the
groups ``applied`` and judges it (:func:`measure_probe` is that schedule, pure over a
``launch`` callable); what a probe's verdict makes of a subset (it *reproduces*, is *clean*,
*undecided* or *untestable*), the steps and the answer are the records of
:mod:`pytest_kimi.gate.culprit_records`.

The statistics of a probe (:func:`measure_probe`).  By the time the search starts, the deploy
gate has launched the reference and the candidate a few times each and measured their launch
noise; a probe's question is then not "is this subset a regression beyond the tolerance?",
which takes two launches of the subset at least, but "does it run like the reference or like
the candidate?", which one launch usually settles.  Given the candidate's launch figures, each
launch of the subset is read by a two-point test (:mod:`pytest_kimi.gate.probe_stats`): the
subset's mean against the reference's and against the candidate's, with the pooled launch
noise of every launch measured (one-way ANOVA's pooled variance, Dunnett's many-to-one
comparisons), each an exact t pivot under its hypothesis, read one-sided at ``alpha / 2^j`` at
the subset's ``j``-th launch.  So a subset as fast as the reference is called ``regression``
with probability below ``alpha`` whatever the noise, the means and the stopping, and a subset
as slow as the candidate is called ``pass`` with probability below ``alpha`` (union bound
over the looks); given the gate's flag, which selects its launches, below ``alpha /
P(flag)``.  With a candidate drop many launch-noises wide, as a regression worth explaining
is, the gate flags it nearly always and the actual rates are far lower (``bench/culprit.py``
measures them: docs/evidence/gate.md, "Culprit search").  A subset
that lands significantly between the two (a partial effect: one of two culprits, an
interaction half applied), or that the two-point test cannot place, goes on to the deploy
gate's tolerance-based paired comparison (:func:`pytest_kimi.gate.paired.compare_paired`,
from its second launch), whose false-regression rate at the tolerance is ``alpha``.  Without
the candidate's figures a probe is that paired comparison alone.  The search itself only
reads verdicts.

The search (:func:`find_culprit`):

1. **Binary splitting, optimistic.**  With one culprit among ``k`` groups, test half of the
   suspects; the half that reproduces holds it, and a clean half clears itself, so the other
   half is *inferred* to hold it without a launch.  ``ceil(log2 k)`` probes name a suspect.
2. **Confirmation.**  The suspect applied alone must reproduce (tested: an inferred step is
   never a claim), and the candidate without it must recover (clean).  Both probes are
   needed for a name; one of them is often a probe the splitting already made.  About
   ``log2(k) + 1.5`` probes for one culprit in all, hence about as many launches.
3. **Delta debugging when that fails.**  If the suspect alone does not reproduce, the
   regression needs several changes together (an interaction), or a probe erred: Zeller's
   ``dd`` with both halves tested at each split; when neither half reproduces alone, it finds
   the part of one half needed with the other applied, then the part of the other needed
   with that, each step tested.  Before the second half is searched, the part found in the
   first is tested alone: if it reproduces already, nothing of the second half is needed or
   named.
4. **No name on the strength of one probe.**  Under launch noise a probe errs now and then
   (at most ``alpha``), and one wrong verdict must not be enough to name a harmless change.
   The single-culprit name rests on two probes (alone, without).  The claims the other paths
   rest on are re-tested by probes made for them (:meth:`_Search.confirm`: the cached verdict
   and a fresh one, a third when they disagree): the set delta debugging found, applied alone
   (when it is clean, the lead was false: the search runs once more with that corrected);
   each of its groups needed (the set without it does not reproduce: 1-minimality); and,
   before a second culprit is sought, the first set alone and the candidate without it.
5. **Untestable subsets are routed around.**  A split whose tested half does not start tests
   the other half, then other partitions of the suspects (rotations, interleaving); the
   untestable subsets are reported as couplings.  Suspects that no partition can separate are
   named together, as a set whose application was tested, with the coupling noted.
6. **More than one culprit.**  When the candidate without the named set still regresses (and
   still does when re-tested), the rest of the changes is searched the same way and the union
   is confirmed.
7. **Budget.**  Every probe gets the launches left (``--perf-max-launches``); when they are
   spent, or a probe cannot decide, the outcome is ``undecided`` with the best hypothesis so
   far: the suspects the tested steps narrowed the culprit to.

Probes are cached: a subset is launched again only for a re-test (point 4), and a step the
optimistic splitting made serves the confirmation and the delta debugging alike.

The search is one state machine (``_Search``), kept with the probe that measures its subsets
(:func:`measure_probe`): they change together.  The records it produces live apart
(:mod:`pytest_kimi.gate.culprit_records`), as do the statistics it needs
(:mod:`pytest_kimi.gate.probe_stats`, :mod:`pytest_kimi.gate.paired`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pytest_kimi.gate.culprit_records import (
    CLEAN,
    NAMED,
    NOTHING_TO_EXPLAIN,
    REPRODUCES,
    UNDECIDED,
    UNSETTLED,
    UNTESTABLE,
    CulpritOutcome,
    Oracle,
    Probe,
    Step,
    Untestable,
)
from pytest_kimi.gate.paired import (
    DEFAULT_MAX_LAUNCHES,
    MIN_BLOCKS,
    PairedComparison,
    block_order,
    compare_paired,
)
from pytest_kimi.gate.probe_stats import ProbeComparison, classify_probe
from pytest_kimi.verdicts import Verdict

__all__ = ["find_culprit", "measure_probe"]


def find_culprit(
    changes: Sequence[str | Sequence[str]],
    compare: Oracle,
    *,
    max_launches: int,
    candidate: Probe | None = None,
) -> CulpritOutcome:
    """Search the groups ``changes`` (each a key, or the keys of a group applied together) for
    the smallest set that reproduces the candidate's regression (module docstring).

    ``candidate``: the deploy gate's comparison of the whole candidate (all groups applied);
    without it the search measures the candidate first.  Only a ``regression`` there is
    explained; ``pass``, ``improved`` and ``underpowered`` (an estimate within the tolerance)
    leave nothing to explain, and ``inconclusive`` is ``undecided``: the drop itself is not
    established.  ``max_launches``: the launches the search may start in all.
    """
    if max_launches < 0:
        raise ValueError(f"max_launches must be >= 0, got {max_launches}")
    groups = tuple((c,) if isinstance(c, str) else tuple(c) for c in changes)
    return _Search(groups, compare, max_launches, candidate).run()


def measure_probe(
    launch: Callable[[bool], float],
    reference: list[float],
    *,
    launches_left: int,
    keep_pace: bool = True,
    max_blocks: int = DEFAULT_MAX_LAUNCHES // 2,
    tolerance: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.95,
    candidate: Sequence[float] | None = None,
    others: list[list[float]] | None = None,
) -> Probe:
    """One probe's launches and verdict: the applied deployment launched until its
    comparison with the reference decides.

    ``launch(applied)`` starts the deployment with the subset applied (True) or the reference
    (False), measures the level and returns its figure (tok/s); it raises :class:`Untestable`
    when the applied deployment does not start.  ``reference`` is the reference's figures so
    far (the deploy gate's, then the search's): it is *shared* by every probe, and grows only
    where the paired comparison needs it (below).

    ``candidate``: the candidate's launch figures from the deploy gate (the run layer's
    ``PairedLevel.candidate_tok_s``).  Given, every launch of the subset is first read by the
    two-point test (:func:`pytest_kimi.gate.probe_stats.classify_probe`: like the reference,
    like the candidate, or between), which usually decides at the first launch; a subset it
    cannot place (a partial effect, or noise too large for the launches so far) goes on to the
    tolerance-based comparison below from its second launch, the first of the two to decide
    wins.  ``others``: a list the caller keeps across probes; each probe's launches are
    appended to it, and their scatter joins the pooled launch noise of the later probes'
    two-point tests (more degrees of freedom; the means of other subsets play no part).
    Without ``candidate`` a probe is the tolerance-based comparison alone.

    The tolerance-based comparison: from :data:`~pytest_kimi.gate.paired.MIN_BLOCKS` applied
    launches on, up to ``max_blocks``, each look is read by
    :func:`~pytest_kimi.gate.paired.compare_paired` at the balanced design's nominal level
    against the reference's launches; with ``keep_pace`` the reference gets a launch whenever
    it has fewer than the subset is about to have, so that its false-regression rate at the
    tolerance stays at or under ``alpha`` (without ``keep_pace`` it is a fixed pool, topped up
    to :data:`~pytest_kimi.gate.paired.MIN_BLOCKS` only).  A caller that wants every probe
    paired with its own reference launches (ABBA per probe, immune to a drift over the search)
    passes a fresh ``reference`` list and no ``candidate``.  The reference launch that keeps
    pace goes first or second by :func:`~pytest_kimi.gate.paired.block_order`, as the gate's
    ABBA blocks do.

    Stops at the first decisive look, at ``max_blocks`` launches of the subset or when
    ``launches_left`` would be overrun.  Error rates (``bench/culprit.py`` measures them): a
    subset as fast as the reference is called ``regression`` with probability below
    ``alpha`` by the two-point test plus the paired comparison's rate at no drop (``alpha`` at
    the tolerance's margin, far less at none); a subset as slow as the candidate is called
    ``pass`` with probability below ``alpha`` plus the paired comparison's (nil unless the
    candidate's drop is within reach of the tolerance).
    """
    applied: list[float] = []
    launches = 0
    last: PairedComparison | ProbeComparison | None = None
    pooled = others if others is not None else []
    two_point = candidate is not None and len(candidate) > 0
    try:
        while len(applied) < max_blocks:
            paired_next = len(applied) + 1 >= MIN_BLOCKS or not two_point
            need_reference = paired_next and len(reference) < (
                len(applied) + 1 if keep_pace else MIN_BLOCKS
            )
            if launches + 1 + int(need_reference) > launches_left:
                break
            first, _ = block_order(len(applied))
            if need_reference and first == 0:
                reference.append(launch(False))
                launches += 1
            try:
                applied.append(launch(True))
            except Untestable as exc:
                return Probe(None, launches + exc.launches, exc.reason)
            launches += 1
            if need_reference and first == 1:
                reference.append(launch(False))
                launches += 1
            if two_point and candidate is not None:
                two = classify_probe(
                    reference,
                    candidate,
                    applied,
                    alpha=alpha,
                    tolerance=tolerance,
                    others=pooled,
                )
                if two is not None:
                    last = two
                    if two.decided:
                        break
            if len(applied) >= MIN_BLOCKS and len(reference) >= MIN_BLOCKS:
                look = compare_paired(
                    reference,
                    applied,
                    max_blocks=max_blocks,
                    tolerance=tolerance,
                    alpha=alpha,
                    power=power,
                )
                last = look
                if look.decided:
                    break
    finally:
        if others is not None and applied:
            others.append(list(applied))
    return Probe(last, launches)


# ---------------------------------------------------------------------- the search


_LEADS = 2
"""Searches of one set of suspects: a set delta debugging found that is clean when re-tested
was a false lead (a probe that erred), and the search runs once more with that corrected."""


class _Exhausted(Exception):
    """No launch left for the next probe."""


class _Stuck(Exception):
    """A step could not be decided (its probes undecided): stop with these suspects."""

    def __init__(self, suspects: frozenset[int], why: str) -> None:
        super().__init__(why)
        self.suspects = suspects
        self.why = why


@dataclass(frozen=True, slots=True)
class _Split:
    kind: str
    """``in`` (``part`` reproduces, tested), ``inferred`` (the other part is clean, so
    ``part`` holds a lone culprit), ``between`` (both parts clean: an interaction), ``stuck``
    (no partition decided)."""
    part: frozenset[int]
    other: frozenset[int] = frozenset()
    undecided: bool = False


class _Search:
    def __init__(
        self,
        groups: tuple[tuple[str, ...], ...],
        compare: Oracle,
        max_launches: int,
        candidate: Probe | None,
    ) -> None:
        self.groups = groups
        self.all = frozenset(range(len(groups)))
        self.compare = compare
        self.max_launches = max_launches
        self.cache: dict[frozenset[int], Probe] = {}
        self.steps: list[Step] = []
        self.launches = 0
        self.probes = 0
        self.notes: list[str] = []
        self.named: frozenset[int] = frozenset()
        self.suspects: frozenset[int] = self.all
        if candidate is not None:
            self._record(self.all, "candidate", candidate)

    # ------------------------------------------------------------ bookkeeping

    def label(self, groups: frozenset[int]) -> str:
        return "+".join(k for g in sorted(groups) for k in self.groups[g]) or "(nothing)"

    def _record(self, applied: frozenset[int], purpose: str, probe: Probe) -> None:
        keys = tuple(k for g in sorted(applied) for k in self.groups[g])
        self.cache[applied] = probe
        self.steps.append(Step(applied, keys, purpose, probe))

    def test(self, applied: frozenset[int], purpose: str, *, again: bool = False) -> Probe:
        """The probe of ``applied`` (cached: never launched twice, unless ``again`` asks for
        an independent re-test, which then replaces the cached probe)."""
        if not applied:
            raise AssertionError("the empty subset is the reference itself")
        hit = self.cache.get(applied)
        if hit is not None and not again:
            return hit
        left = self.max_launches - self.launches
        if left <= 0:
            raise _Exhausted
        self.probes += 1
        try:
            probe = self.compare(applied, left)
        except Untestable as exc:
            probe = Probe.failed(exc.reason, exc.launches)
        self.launches += probe.launches
        self._record(applied, purpose, probe)
        if probe.untestable is not None:
            self.notes.append(
                f"{self.label(applied)} applied to the reference did not start "
                f"({probe.untestable}): untestable, routed around"
            )
        elif probe.comparison is None:
            raise _Exhausted  # the oracle could not afford a single look
        return probe

    def outcome(self, status: str, *notes: str) -> CulpritOutcome:
        named = self.named if status == NAMED else frozenset()
        hypothesis = frozenset() if status == NOTHING_TO_EXPLAIN else self.suspects
        return CulpritOutcome(
            status=status,
            changes=self.groups,
            named=tuple(sorted(named)),
            hypothesis=tuple(sorted(hypothesis)),
            steps=tuple(self.steps),
            launches=self.launches,
            probes=self.probes,
            notes=tuple(self.notes) + notes,
        )

    # ------------------------------------------------------------ the search

    def run(self) -> CulpritOutcome:
        try:
            whole = self.test(self.all, "candidate") if self.all else None
        except _Exhausted:
            return self.outcome(UNDECIDED, "no launch left to measure the candidate")
        if whole is None:
            if _regressed(self.cache.get(self.all)):
                return self.outcome(
                    UNDECIDED,
                    "the profiles differ in no server argument, variable, engine or model: "
                    "the regression lies outside them (the machine, the data)",
                )
            self.suspects = frozenset()
            return self.outcome(NOTHING_TO_EXPLAIN, "the profiles do not differ")
        state = whole.outcome
        if state == UNTESTABLE:
            return self.outcome(UNDECIDED, "the candidate itself did not start")
        if state == CLEAN or (
            state == UNSETTLED
            and whole.comparison is not None
            and whole.comparison.verdict is Verdict.UNDERPOWERED
        ):
            self.suspects = frozenset()
            return self.outcome(NOTHING_TO_EXPLAIN)
        if state == UNSETTLED:
            return self.outcome(
                UNDECIDED,
                "the candidate's drop is beyond the tolerance but not established "
                "(inconclusive): more launches of the deploy gate first",
            )
        try:
            return self.explain()
        except _Exhausted:
            return self.outcome(UNDECIDED, "the launch budget is spent")
        except _Stuck as stuck:
            self.suspects = self.named | stuck.suspects
            return self.outcome(UNDECIDED, stuck.why)

    def explain(self) -> CulpritOutcome:
        """Name culprits until the candidate without them recovers."""
        remaining = self.all
        while True:
            found = self.locate(remaining)
            self.named |= found
            self.suspects = self.named
            if self.named != found:
                alone = self.test(self.named, "alone")
                if alone.outcome != REPRODUCES:
                    return self.outcome(
                        UNDECIDED,
                        f"{self.label(self.named)} applied alone: {alone.outcome}, though each "
                        f"part reproduces the regression",
                    )
            rest = self.all - self.named
            if not rest:
                return self.outcome(NAMED)  # without them the candidate is the reference
            without = self.test(rest, "without")
            if without.outcome == CLEAN:
                return self.outcome(NAMED)
            if without.outcome == UNTESTABLE:
                return self.outcome(
                    UNDECIDED,
                    f"the candidate without {self.label(self.named)} did not start, so its "
                    f"recovery is not established: declare what {self.label(self.named)} "
                    f"cannot be applied without as one group",
                )
            if without.outcome != REPRODUCES:
                return self.outcome(
                    UNDECIDED,
                    f"the candidate without {self.label(self.named)}: {without.outcome}; its "
                    f"recovery is not established",
                )
            # one probe said ``found`` reproduces alone, one that the candidate without it
            # still regresses: a second culprit, or a false lead; probes made for these
            # claims tell them apart before the rest is searched
            again = self.confirm(found, "alone")
            if again == CLEAN:
                self.named -= found
                self.notes.append(
                    f"{self.label(found)} applied alone is clean when re-tested, and the "
                    f"candidate without it still regresses: a false lead, dropped"
                )
                remaining = rest
                self.suspects = self.named | rest
                continue
            if again != REPRODUCES:
                raise _Stuck(
                    self.named | rest, f"{self.label(found)} applied alone, re-tested: {again}"
                )
            still = self.confirm(rest, "without")
            if still == CLEAN:
                self.notes.append(
                    f"the candidate without {self.label(self.named)} recovers when re-tested"
                )
                return self.outcome(NAMED)
            if still != REPRODUCES:
                return self.outcome(
                    UNDECIDED,
                    f"the candidate without {self.label(self.named)}, re-tested: {still}; its "
                    f"recovery is not established",
                )
            self.notes.append(
                f"the candidate without {self.label(self.named)} still regresses: "
                f"another culprit among {self.label(rest)}"
            )
            remaining = rest
            self.suspects = self.named | rest

    def locate(self, suspects: frozenset[int]) -> frozenset[int]:
        """A small set of ``suspects`` that reproduces applied alone (tested); the suspects
        applied alone are known to reproduce."""
        self.suspects = self.named | suspects
        for attempt in range(_LEADS):
            guess = self.bisect(suspects)
            alone = self.test(guess, "alone")
            if alone.outcome == REPRODUCES:
                return guess
            if alone.outcome == UNSETTLED:
                raise _Stuck(guess, f"{self.label(guess)} applied alone: not decided")
            if alone.outcome == UNTESTABLE:
                self.notes.append(
                    f"{self.label(guess)} does not start alone: delta debugging for what it needs"
                )
            else:
                self.notes.append(
                    f"{self.label(guess)} applied alone: {alone.outcome}; the regression "
                    f"needs several changes together: delta debugging"
                )
            found = self.dd(suspects, frozenset())
            # the set delta debugging found rests on the probe that made it a suspect: a
            # probe made for this claim confirms it
            check = self.confirm(found, "alone")
            if check == REPRODUCES:
                return self.minimal(found)
            if check != CLEAN or attempt == _LEADS - 1:
                raise _Stuck(suspects, f"{self.label(found)} applied alone: {check}, not confirmed")
            self.notes.append(
                f"{self.label(found)} applied alone is clean when re-tested: a false lead, "
                f"searched again"
            )
        raise AssertionError("unreachable")

    def confirm(self, applied: frozenset[int], purpose: str) -> str:
        """The outcome of ``applied`` on a probe made for the claim at hand: a cached outcome
        is re-tested, and when the two disagree a third probe decides (two of three); a
        subset not yet probed is probed once, and one that did not start is not re-launched.
        The cache keeps the deciding probe."""
        cached = self.cache.get(applied)
        if cached is None or cached.outcome == UNTESTABLE:
            return self.test(applied, purpose).outcome
        second = self.test(applied, purpose, again=True).outcome
        if second == cached.outcome or second not in (CLEAN, REPRODUCES):
            return second
        return self.test(applied, purpose, again=True).outcome

    def minimal(self, found: frozenset[int]) -> frozenset[int]:
        """``found`` (it reproduces) without the groups it does not need: each group is needed
        when ``found`` without it does not reproduce, on a probe made for this check
        (:meth:`confirm`: an interaction is never claimed on the strength of one probe that
        said a part is clean)."""
        changed = True
        while changed and len(found) > 1:
            changed = False
            for g in sorted(found):
                part = found - {g}
                outcome = self.confirm(part, "dd")
                if outcome == REPRODUCES:
                    self.notes.append(
                        f"{self.label(part)} reproduces without {self.label(frozenset({g}))}: "
                        f"{self.label(frozenset({g}))} is not needed"
                    )
                    found, changed = part, True
                    break
                if outcome == UNSETTLED:
                    raise _Stuck(found, f"{self.label(part)}: not decided")
        return found

    def bisect(self, suspects: frozenset[int]) -> frozenset[int]:
        """Optimistic binary splitting: a lone culprit's group (or a coupled set)."""
        while len(suspects) > 1:
            self.suspects = self.named | suspects
            split = self.split(suspects, frozenset(), optimistic=True)
            if split.kind == "stuck":
                if split.undecided:
                    raise _Stuck(suspects, f"no split of {self.label(suspects)} decided")
                self.notes.append(
                    f"{self.label(suspects)} cannot be tested apart (every split of it is "
                    f"untestable): tested together"
                )
                return suspects
            suspects = split.part
        return suspects

    def dd(self, suspects: frozenset[int], context: frozenset[int]) -> frozenset[int]:
        """Zeller's dd: a part of ``suspects`` that reproduces with ``context`` applied
        (``suspects | context`` reproduces; ``context`` alone is taken as clean)."""
        if len(suspects) == 1:
            return suspects
        self.suspects = self.named | suspects | context
        split = self.split(suspects, context, optimistic=False)
        if split.kind == "in":
            return self.dd(split.part, context)
        if split.kind == "between":
            first = self.dd(split.part, split.other | context)
            alone = self.test(first | context, "dd")
            if alone.outcome == REPRODUCES:
                return first  # the other part was not needed
            if alone.outcome == UNSETTLED:
                raise _Stuck(
                    first | split.other | context,
                    f"{self.label(first | context)}: not decided",
                )
            return first | self.dd(split.other, first | context)
        if split.undecided:
            raise _Stuck(suspects | context, f"no split of {self.label(suspects)} decided")
        self.notes.append(
            f"{self.label(suspects)} cannot be tested apart (every split of it is untestable): "
            f"named together"
        )
        return suspects

    def split(
        self, suspects: frozenset[int], context: frozenset[int], *, optimistic: bool
    ) -> _Split:
        """Test halves of ``suspects`` (with ``context`` applied) until one partition decides
        where the culprit lies; a half that does not start sends the test to the other half,
        then to another partition."""
        undecided = False
        for first, second in _partitions(suspects):
            a = self.test(first | context, "split" if optimistic else "dd").outcome
            if a == REPRODUCES:
                return _Split("in", first)
            if a == CLEAN and optimistic:
                return _Split("inferred", second)
            b = self.test(second | context, "split" if optimistic else "dd").outcome
            if b == REPRODUCES:
                return _Split("in", second)
            if a == CLEAN and b == CLEAN:
                return _Split("between", first, second)
            if b == CLEAN and optimistic:
                return _Split("inferred", first)
            undecided = undecided or UNSETTLED in (a, b)
        return _Split("stuck", suspects, undecided=undecided)


def _regressed(probe: Probe | None) -> bool:
    return probe is not None and probe.outcome == REPRODUCES


def _partitions(suspects: frozenset[int]) -> Iterator[tuple[frozenset[int], frozenset[int]]]:
    """Ways to halve ``suspects``, the plain halves first: then each rotation of the order and
    the interleaving, so that two changes that cannot start apart share a half in one of
    them."""
    order = sorted(suspects)
    half = len(order) // 2
    seen: set[frozenset[frozenset[int]]] = set()
    candidates = [order[j:] + order[:j] for j in range(len(order))]
    candidates.append(order[::2] + order[1::2])
    for arranged in candidates:
        first, second = frozenset(arranged[:half]), frozenset(arranged[half:])
        key = frozenset((first, second))
        if key in seen:
            continue
        seen.add(key)
        yield first, second
