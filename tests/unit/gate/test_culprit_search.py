"""The culprit search (:mod:`pytest_kimi.gate.culprit`) over synthetic oracles.

Three kinds of oracle: an *exact* one (fixed launch figures scaled by the subset's true
effect, so every probe decides at its first look and the search's logic is seen alone), a
*lying* one (exact, but a chosen probe's first answer is wrong: the search's defences against
one wrong verdict) and a *noisy* one (seeded lognormal launch noise through
:func:`measure_probe`, the schedule the run layer uses: the two-point test against the gate's
candidate launches, or the tolerance-based paired comparison alone), whose verdicts are those
of the drawn figures.  Every outcome: a single culprit, an interacting pair, untestable subsets
routed around, a coupled culprit, two culprits, the budget spent, nothing to explain; and the
claims: a named set was tested alone and the candidate without it was tested, a harmless change
is never named.  Then the probe's statistics (:mod:`pytest_kimi.gate.probe_stats`): one launch
decides, a partial effect falls back to the paired comparison, the error rates hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from pytest_kimi.gate.culprit import find_culprit, measure_probe
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
from pytest_kimi.gate.paired import PairedComparison, compare_paired
from pytest_kimi.gate.probe_stats import (
    BETWEEN,
    CANDIDATE,
    OPEN,
    REFERENCE,
    ProbeComparison,
    classify_probe,
    look_level,
)
from pytest_kimi.verdicts import Verdict

REF = (100.0, 100.6, 99.5, 100.3)
APPLIED = (100.2, 99.7, 100.4, 99.9)
"""Launch figures of a quiet pair of deployments (0.4% scatter): any effect of 3% beyond the
5% tolerance, or within 3% of none, is decided at the first look."""


def exact_probe(ratio: float, launches: int = 2) -> Probe:
    applied = [x * ratio for x in APPLIED]
    return Probe(compare_paired(REF, applied, max_blocks=6), launches)


@dataclass
class Model:
    """True effects of a deploy change's groups: independent drops, drops of a set applied
    together, and couplings (``requires[a] = b``: ``a`` without ``b`` does not start)."""

    k: int
    drops: dict[int, float] = field(default_factory=dict)
    together: dict[frozenset[int], float] = field(default_factory=dict)
    requires: dict[int, int] = field(default_factory=dict)

    def ratio(self, applied: frozenset[int]) -> float:
        log = sum(math.log1p(-d) for g, d in self.drops.items() if g in applied)
        log += sum(math.log1p(-d) for s, d in self.together.items() if s <= applied)
        return math.exp(log)

    def starts(self, applied: frozenset[int]) -> bool:
        return all(b in applied for a, b in self.requires.items() if a in applied)

    def names(self) -> list[str]:
        return [f"c{i}" for i in range(self.k)]


class ExactOracle:
    def __init__(self, model: Model, launches: int = 2) -> None:
        self.model = model
        self.launches = launches
        self.calls: list[frozenset[int]] = []

    def __call__(self, applied: frozenset[int], launches_left: int) -> Probe:
        self.calls.append(applied)
        if launches_left < self.launches:
            return Probe(None, 0)  # cannot afford a look
        if not self.model.starts(applied):
            raise Untestable("a flag that needs another one", launches=1)
        return exact_probe(self.model.ratio(applied), self.launches)


class LyingOracle(ExactOracle):
    """Exact, except that the first probe of each subset in ``lies`` shows that ratio."""

    def __init__(self, model: Model, lies: dict[frozenset[int], float]) -> None:
        super().__init__(model)
        self.lies = dict(lies)

    def __call__(self, applied: frozenset[int], launches_left: int) -> Probe:
        if applied in self.lies:
            self.calls.append(applied)
            return exact_probe(self.lies.pop(applied), self.launches)
        return super().__call__(applied, launches_left)


class NoisyOracle:
    """Each launch draws exp(N(0, noise)); subsets measured by :func:`measure_probe` against a
    reference pool shared by every probe, and (``two_point``, the default) read first by the
    two-point test against the candidate's launches of :meth:`candidate`."""

    def __init__(
        self,
        model: Model,
        noise: float,
        seed: int,
        max_blocks: int = 6,
        *,
        two_point: bool = True,
    ) -> None:
        self.model = model
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.max_blocks = max_blocks
        self.two_point = two_point
        self.pool: list[float] = []
        self.cand: list[float] = []
        self.others: list[list[float]] = []
        self.calls: list[frozenset[int]] = []

    def figure(self, applied: frozenset[int]) -> float:
        return 100.0 * self.model.ratio(applied) * math.exp(self.rng.normal(0.0, self.noise))

    def candidate(self, launches: int = 4) -> Probe:
        """The deploy gate's comparison: ``launches`` of each deployment (one look)."""
        everything = frozenset(range(self.model.k))
        ref = [self.figure(frozenset()) for _ in range(launches)]
        cand = [self.figure(everything) for _ in range(launches)]
        self.pool.extend(ref)
        self.cand.extend(cand)
        return Probe(compare_paired(ref, cand, max_blocks=launches), 0)

    def __call__(self, applied: frozenset[int], launches_left: int) -> Probe:
        self.calls.append(applied)

        def launch(with_subset: bool) -> float:
            if not with_subset:
                return self.figure(frozenset())
            if not self.model.starts(applied):
                raise Untestable("does not start", launches=1)
            return self.figure(applied)

        return measure_probe(
            launch,
            self.pool,
            launches_left=launches_left,
            max_blocks=self.max_blocks,
            candidate=self.cand if self.two_point else None,
            others=self.others if self.two_point else None,
        )


def search(
    model: Model,
    oracle: Oracle | None = None,
    *,
    max_launches: int = 200,
    candidate: Probe | None = None,
) -> CulpritOutcome:
    compare = oracle if oracle is not None else ExactOracle(model)
    if candidate is None:
        candidate = exact_probe(model.ratio(frozenset(range(model.k))), 0)
    return find_culprit(model.names(), compare, max_launches=max_launches, candidate=candidate)


def assert_claims_tested(out: CulpritOutcome) -> None:
    """A name rests on two probes: the named set alone reproduced, the candidate without it
    recovered (unless nothing is left without it: the reference itself)."""
    named = frozenset(out.named)
    everything = frozenset(range(len(out.changes)))
    outcomes = {s.applied: s.outcome for s in out.steps}
    assert outcomes.get(named) == REPRODUCES
    if everything - named:
        assert outcomes.get(everything - named) == CLEAN


# ------------------------------------------------------------------------ one culprit


@pytest.mark.parametrize("culprit", range(8))
def test_a_single_culprit_is_named_in_log2k_plus_two_probes(culprit: int) -> None:
    model = Model(8, drops={culprit: 0.15})
    oracle = ExactOracle(model)
    out = search(model, oracle)
    assert out.status == NAMED
    assert out.named == (culprit,)
    assert out.named_keys == [f"c{culprit}"]
    assert_claims_tested(out)
    assert out.probes <= math.log2(8) + 2
    assert len(oracle.calls) == len(set(oracle.calls)), "a subset was launched twice"
    assert out.launches == 2 * out.probes


def test_a_change_coupled_by_declaration_is_named_as_its_group() -> None:
    model = Model(3, drops={1: 0.15})
    out = find_culprit(
        ["log-level", ("speculative-algorithm", "speculative-draft-model-path"), "env:A"],
        ExactOracle(model),
        max_launches=50,
        candidate=exact_probe(0.85, 0),
    )
    assert out.status == NAMED
    assert out.named_keys == ["speculative-algorithm", "speculative-draft-model-path"]
    assert out.to_dict()["changes"] == [
        "log-level",
        "speculative-algorithm",
        "speculative-draft-model-path",
        "env:A",
    ]


def test_one_change_needs_no_probe() -> None:
    out = search(Model(1, drops={0: 0.15}))
    assert out.status == NAMED and out.named == (0,)
    assert out.probes == 0 and out.launches == 0


def test_the_candidate_is_measured_when_not_given() -> None:
    model = Model(4, drops={2: 0.15})
    oracle = ExactOracle(model)
    out = find_culprit(model.names(), oracle, max_launches=50)
    assert oracle.calls[0] == frozenset(range(4))
    assert out.status == NAMED and out.named == (2,)
    assert out.steps[0].purpose == "candidate"


# ------------------------------------------------------------------------ interactions


def test_an_interacting_pair_is_named_by_delta_debugging() -> None:
    model = Model(8, together={frozenset({1, 6}): 0.15})
    oracle = ExactOracle(model)
    out = search(model, oracle)
    assert out.status == NAMED
    assert out.named == (1, 6)
    assert_claims_tested(out)
    assert any("delta debugging" in n for n in out.notes)
    # a subset is launched again only to re-test a claim: the pair alone (it rested on a
    # probe delta debugging made) and each part alone, clean (1-minimality)
    repeated = sorted((a for a in set(oracle.calls) if oracle.calls.count(a) > 1), key=sorted)
    assert repeated == [frozenset({1}), frozenset({1, 6}), frozenset({6})]
    assert all(oracle.calls.count(a) == 2 for a in repeated)
    assert out.probes == len(oracle.calls)


@pytest.mark.parametrize(("a", "b"), [(0, 1), (0, 7), (3, 4), (2, 5)])
def test_a_pair_is_found_wherever_it_sits(a: int, b: int) -> None:
    out = search(Model(8, together={frozenset({a, b}): 0.15}))
    assert out.status == NAMED and out.named == (a, b)


def test_two_independent_culprits_are_both_named() -> None:
    model = Model(8, drops={1: 0.15, 5: 0.15})
    out = search(model)
    assert out.status == NAMED
    assert out.named == (1, 5)
    assert_claims_tested(out)
    assert any("still regresses" in n for n in out.notes)


# ------------------------------------------------------------------------ untestable


def test_an_untestable_subset_is_routed_around_and_reported() -> None:
    # c2 without c5 does not start; the culprit is c3
    model = Model(8, drops={3: 0.15}, requires={2: 5})
    out = search(model)
    assert out.status == NAMED and out.named == (3,)
    assert_claims_tested(out)
    untestable = [s for s in out.steps if s.outcome == UNTESTABLE]
    assert untestable, "the search never met the coupling"
    assert all(2 in s.applied and 5 not in s.applied for s in untestable)
    assert any("did not start" in n and "routed around" in n for n in out.notes)
    assert out.steps[-1].purpose == "without"
    d = next(s for s in out.steps if s.outcome == UNTESTABLE).to_dict()
    assert d["verdict"] == "untestable" and d["untestable"] and d["change_pct"] is None


def test_a_culprit_that_cannot_start_alone_is_named_with_what_it_needs() -> None:
    model = Model(8, drops={2: 0.15}, requires={2: 5})
    out = search(model)
    assert out.status == NAMED
    assert out.named == (2, 5)
    assert_claims_tested(out)
    assert any("cannot be tested apart" in n for n in out.notes)
    assert any("c2 does not start alone" in n for n in out.notes)


def test_a_culprit_others_cannot_start_without_is_not_named() -> None:
    # c2 needs c5, and c5 is the culprit: the candidate without c5 cannot start, so its
    # recovery cannot be shown and c5 is only the best hypothesis
    model = Model(8, drops={5: 0.15}, requires={2: 5})
    out = search(model)
    assert out.status == UNDECIDED
    assert out.named == () and out.hypothesis == (5,)
    assert out.steps[-1].purpose == "without" and out.steps[-1].outcome == UNTESTABLE
    assert "declare what c5 cannot be applied without as one group" in out.notes[-1]


def test_a_failed_start_counts_its_launch() -> None:
    model = Model(4, drops={3: 0.15}, requires={0: 2})
    out = search(model)
    failed = [s for s in out.steps if s.outcome == UNTESTABLE]
    assert failed and all(s.launches == 1 for s in failed)
    assert out.launches == sum(s.launches for s in out.steps)


# ------------------------------------------------------------------------ no name


def test_no_regression_leaves_nothing_to_explain() -> None:
    model = Model(6)
    oracle = ExactOracle(model)
    out = search(model, oracle)
    assert out.status == NOTHING_TO_EXPLAIN
    assert out.named == () and out.hypothesis == ()
    assert oracle.calls == [] and out.launches == 0
    assert "nothing to explain" in out.summary()


def test_an_underpowered_candidate_leaves_nothing_to_explain() -> None:
    candidate = Probe(compare_paired([100.0, 108.0, 93.0], [99.0, 106.0, 94.0], max_blocks=6), 0)
    assert candidate.comparison is not None
    assert candidate.comparison.verdict is Verdict.UNDERPOWERED
    out = search(Model(4), candidate=candidate)
    assert out.status == NOTHING_TO_EXPLAIN


def test_an_inconclusive_candidate_is_undecided() -> None:
    candidate = Probe(compare_paired([100.0, 112.0, 90.0], [86.0, 98.0, 80.0], max_blocks=6), 0)
    assert candidate.comparison is not None
    assert candidate.comparison.verdict is Verdict.INCONCLUSIVE
    out = search(Model(4, drops={0: 0.12}), candidate=candidate)
    assert out.status == UNDECIDED
    assert any("inconclusive" in n for n in out.notes)


def test_the_budget_spent_leaves_the_best_hypothesis() -> None:
    model = Model(8, drops={6: 0.15})
    oracle = ExactOracle(model)
    out = search(model, oracle, max_launches=4)
    assert out.status == UNDECIDED
    assert out.named == ()
    assert 6 in out.hypothesis and len(out.hypothesis) == 2  # two probes halved 8 to 2
    assert out.launches <= 4
    assert any("budget" in n for n in out.notes)
    assert out.summary() == "culprit: undecided, best hypothesis c6, c7 (2 probe(s), 4 launch(es))"


def test_a_budget_too_small_for_a_look_is_undecided() -> None:
    model = Model(8, drops={6: 0.15})
    out = search(model, ExactOracle(model), max_launches=1)
    assert out.status == UNDECIDED and out.launches == 0
    assert out.hypothesis == tuple(range(8))


def test_an_undecided_probe_stops_the_search_undecided() -> None:
    model = Model(4, drops={0: 0.15})

    def oracle(applied: frozenset[int], launches_left: int) -> Probe:
        noisy = [100.0, 110.0, 91.0, 104.0]  # too scattered for any verdict
        return Probe(compare_paired(noisy, [x * 0.98 for x in noisy[::-1]], max_blocks=6), 4)

    out = find_culprit(model.names(), oracle, max_launches=100, candidate=exact_probe(0.85, 0))
    assert out.status == UNDECIDED
    assert out.named == ()
    assert all(s.outcome == UNSETTLED for s in out.steps[1:])


# ------------------------------------------------------------------------ under noise


@pytest.mark.parametrize("two_point", [True, False], ids=["two-point", "paired-only"])
def test_a_harmless_change_is_never_named_under_launch_noise(two_point: bool) -> None:
    """40 seeded searches at 2% launch noise, a 15% culprit among 8: no harmless change is ever
    named, and the culprit almost always is (the seeds fix the count)."""
    named_right = 0
    for seed in range(40):
        culprit = seed % 8
        model = Model(8, drops={culprit: 0.15})
        oracle = NoisyOracle(model, noise=0.02, seed=seed, two_point=two_point)
        out = search(model, oracle, max_launches=64, candidate=oracle.candidate())
        if out.status == NAMED:
            assert out.named == (culprit,), f"seed {seed}: named {out.named_keys}"
            assert_claims_tested(out)
            named_right += 1
        assert out.launches <= 64
    assert named_right >= 36


def test_a_harmless_change_is_never_named_near_the_noise() -> None:
    """An 8% culprit at 2% launch noise, where a one-launch probe errs now and then (about 1%
    of probes, bench/culprit.py): over 60 seeded searches the errors cost launches, never a
    harmless name."""
    named_right = searched = 0
    for seed in range(60):
        culprit = (3 * seed) % 8
        model = Model(8, drops={culprit: 0.08})
        oracle = NoisyOracle(model, noise=0.02, seed=1000 + seed, max_blocks=12)
        out = search(model, oracle, max_launches=64, candidate=oracle.candidate(6))
        searched += bool(oracle.calls)
        named = set(out.named) if out.status == NAMED else set()
        assert named <= {culprit}, f"seed {seed}: named {out.named_keys}"
        named_right += named == {culprit}
    assert searched >= 30 and named_right >= searched - 2, (searched, named_right)


def test_a_single_culprit_costs_about_one_launch_a_probe() -> None:
    """The two-point test: at 1% launch noise a 15% culprit among 8 is named in at most
    log2(8) + 2 launches on average (a probe of the paired comparison alone takes two or
    more)."""
    launches = []
    for seed in range(30):
        culprit = (5 * seed) % 8
        model = Model(8, drops={culprit: 0.15})
        oracle = NoisyOracle(model, noise=0.01, seed=2000 + seed)
        out = search(model, oracle, max_launches=64, candidate=oracle.candidate())
        assert out.status == NAMED and out.named == (culprit,)
        assert_claims_tested(out)
        assert all(isinstance(s.probe.comparison, ProbeComparison) for s in out.steps[1:])
        launches.append(out.launches)
    assert sum(launches) / len(launches) <= math.log2(8) + 2


# ------------------------------------------------------------------------ one wrong probe


def test_one_false_reproduction_of_a_harmless_half_is_corrected() -> None:
    # the first probe of c0..c3 wrongly reproduces: the bisection follows it into harmless
    # changes, delta debugging finds them all "needed", and the re-test exposes the false lead
    model = Model(8, drops={5: 0.15})
    oracle = LyingOracle(model, {frozenset({0, 1, 2, 3}): 0.85})
    out = search(model, oracle)
    assert out.status == NAMED and out.named == (5,)
    assert_claims_tested(out)
    assert any("false lead" in n for n in out.notes)


def test_one_false_clean_of_the_culprit_alone_names_no_partner() -> None:
    # the culprit's first probe alone wrongly says clean: delta debugging pairs it with a
    # harmless change, and 1-minimality (the culprit re-tested alone) drops the partner
    model = Model(8, drops={5: 0.15})
    oracle = LyingOracle(model, {frozenset({5}): 1.0})
    out = search(model, oracle)
    assert out.status == NAMED and out.named == (5,)
    assert_claims_tested(out)
    assert [s.outcome for s in out.steps if s.applied == frozenset({5})][-2:] == [
        REPRODUCES,
        REPRODUCES,
    ]


def test_one_false_reproduction_of_the_rest_is_re_tested() -> None:
    # the candidate without the culprit wrongly still regresses: before a second culprit is
    # sought, the culprit alone and the candidate without it are re-tested (two of three)
    model = Model(8, drops={5: 0.15})
    rest = frozenset(range(8)) - {5}
    oracle = LyingOracle(model, {rest: 0.85})
    out = search(model, oracle)
    assert out.status == NAMED and out.named == (5,)
    assert [s.outcome for s in out.steps if s.applied == rest] == [REPRODUCES, CLEAN, CLEAN]
    assert any("recovers when re-tested" in n for n in out.notes)


@pytest.mark.parametrize(
    ("model", "named"),
    [
        (Model(8, together={frozenset({2, 7}): 0.15}), (2, 7)),
        (Model(8, drops={4: 0.15}, requires={1: 6}), (4,)),
        (Model(16, drops={11: 0.15}), (11,)),
    ],
    ids=["pair", "untestable", "one-in-16"],
)
@pytest.mark.parametrize("two_point", [True, False], ids=["two-point", "paired-only"])
def test_noisy_searches_name_the_right_set(
    model: Model, named: tuple[int, ...], two_point: bool
) -> None:
    oracle = NoisyOracle(model, noise=0.01, seed=3, two_point=two_point)
    out = search(model, oracle, max_launches=96, candidate=oracle.candidate())
    assert out.status == NAMED and out.named == named
    assert_claims_tested(out)


def test_a_noise_only_candidate_is_never_searched() -> None:
    for seed in range(10):
        model = Model(8)
        oracle = NoisyOracle(model, noise=0.02, seed=100 + seed)
        out = search(model, oracle, candidate=oracle.candidate())
        assert out.status != NAMED
        assert oracle.calls == []


# ------------------------------------------------------------------------ measure_probe


class Launcher:
    def __init__(self, reference: list[float], applied: list[float]) -> None:
        self.reference = list(reference)
        self.applied = list(applied)
        self.order: list[str] = []

    def __call__(self, with_subset: bool) -> float:
        self.order.append("B" if with_subset else "A")
        return (self.applied if with_subset else self.reference).pop(0)


def test_a_probe_stops_at_its_first_decisive_look() -> None:
    launcher = Launcher(list(REF), [85.1, 84.8, 85.3, 84.9])
    pool: list[float] = []
    probe = measure_probe(launcher, pool, launches_left=20)
    assert probe.outcome == REPRODUCES
    assert probe.launches == 4 and probe.comparison is not None
    assert probe.comparison.launches == 4
    assert launcher.order == ["A", "B", "B", "A"]  # ABBA: a drift falls on both alike
    assert pool == list(REF[:2]), "the reference launches join the shared pool"


def test_a_shared_pool_serves_the_next_probe_without_reference_launches() -> None:
    pool = list(REF)
    launcher = Launcher([], [100.1, 99.8])
    probe = measure_probe(launcher, pool, launches_left=20)
    assert probe.outcome == CLEAN
    assert launcher.order == ["B", "B"] and probe.launches == 2
    assert pool == list(REF)


def test_a_fixed_pool_is_not_topped_up() -> None:
    pool = [100.0, 100.5]
    figures = [100.0, 93.0, 107.0, 95.0, 104.0, 97.0]  # scattered: never decided
    launcher = Launcher([], figures)
    probe = measure_probe(launcher, pool, launches_left=50, keep_pace=False, max_blocks=6)
    assert launcher.order == ["B"] * 6
    assert pool == [100.0, 100.5]
    assert probe.outcome == UNSETTLED and probe.launches == 6


def test_a_probe_that_does_not_start_is_untestable() -> None:
    def launch(with_subset: bool) -> float:
        if with_subset:
            raise Untestable("exit 1 while placing experts", launches=1)
        return 100.0

    pool: list[float] = []
    probe = measure_probe(launch, pool, launches_left=10)
    assert probe.outcome == UNTESTABLE
    assert probe.untestable == "exit 1 while placing experts"
    assert probe.launches == 2  # the reference that kept pace, and the failed start


def test_a_probe_never_overruns_the_launches_left() -> None:
    launcher = Launcher([100.0] * 10, [90.0, 95.0, 100.0, 105.0, 90.0, 95.0])
    probe = measure_probe(launcher, [], launches_left=3)
    assert probe.launches <= 3
    assert probe.comparison is None and probe.outcome == UNSETTLED
    probe = measure_probe(Launcher([], [1.0]), [], launches_left=1)
    assert probe.launches == 0


# ------------------------------------------------------------------------ the two-point test

GATE_REF = [100.0, 101.2, 99.1, 100.4]
GATE_CAND = [85.3, 84.6, 85.9, 84.8]
"""The deploy gate's launches of a 15% drop at about 0.8% launch noise."""


def test_one_launch_like_the_candidate_reproduces() -> None:
    launcher = Launcher([], [85.2])
    pool = list(GATE_REF)
    probe = measure_probe(launcher, pool, launches_left=20, candidate=GATE_CAND)
    assert probe.outcome == REPRODUCES and probe.launches == 1
    assert launcher.order == ["B"] and pool == GATE_REF, "no reference launch"
    c = probe.comparison
    assert isinstance(c, ProbeComparison)
    assert c.state == CANDIDATE and c.verdict is Verdict.REGRESSION and c.decided
    assert c.ratio == pytest.approx(85.2 / math.exp(np.log(GATE_REF).mean()))
    assert c.ci90[0] < c.ratio < c.ci90[1] < 1.0
    assert c.fraction == pytest.approx(1.0, abs=0.1)
    assert c.df == 6 and c.look == 1 and c.launches == 9
    assert c.nominal_alpha == look_level(0.05, 1) == 0.025
    step = Step(frozenset({0}), ("c0",), "split", probe).to_dict()
    # classified, not judged at the tolerance: the report's word is the class
    assert step["verdict"] == REPRODUCES and step["outcome"] == REPRODUCES
    assert step["change_pct"] == pytest.approx(-14.95, abs=0.01)
    low, high = step["ci90"]
    assert low < step["change_pct"] < high < 0
    assert c.to_dict()["state"] == CANDIDATE


def test_one_launch_like_the_reference_is_clean() -> None:
    probe = measure_probe(
        Launcher([], [100.3]), list(GATE_REF), launches_left=20, candidate=GATE_CAND
    )
    assert probe.outcome == CLEAN and probe.launches == 1
    assert isinstance(probe.comparison, ProbeComparison)
    assert probe.comparison.state == REFERENCE and probe.comparison.verdict is Verdict.PASS


def test_a_partial_effect_falls_back_to_the_paired_comparison() -> None:
    """Half the candidate's drop, measured precisely: unlike the reference and unlike the
    candidate (``between``), so the tolerance-based comparison decides, from the subset's
    second launch: -7.5% is a regression beyond the 5% tolerance."""
    half = [92.4, 92.6, 92.3, 92.5]
    first = classify_probe(GATE_REF, GATE_CAND, half[:1])
    assert first is not None and first.state == BETWEEN and not first.decided
    launcher = Launcher([], half)
    probe = measure_probe(launcher, list(GATE_REF), launches_left=20, candidate=GATE_CAND)
    assert isinstance(probe.comparison, PairedComparison)
    assert probe.outcome == REPRODUCES and probe.launches == 2
    assert probe.comparison.verdict is Verdict.REGRESSION


def test_a_small_partial_effect_falls_back_to_a_pass() -> None:
    """2% of a 15% drop: beyond the reference's noise, far from the candidate, within the
    tolerance: the paired comparison says pass."""
    small = [98.0, 98.2, 97.9, 98.1]
    probe = measure_probe(
        Launcher([], small), list(GATE_REF), launches_left=20, candidate=GATE_CAND
    )
    assert isinstance(probe.comparison, PairedComparison)
    assert probe.outcome == CLEAN and probe.comparison.verdict is Verdict.PASS


def test_an_undecided_look_launches_the_subset_again() -> None:
    # a scattered gate (df 2) and a launch between the two: open, then decided
    ref, cand = [100.0, 104.0], [88.0, 84.0]
    first = classify_probe(ref, cand, [93.0])
    assert first is not None and first.state == OPEN and first.verdict is Verdict.INCONCLUSIVE
    launcher = Launcher([101.0, 103.0], [93.0, 86.0, 85.0, 86.5])
    probe = measure_probe(launcher, list(ref), launches_left=20, candidate=cand)
    assert probe.launches >= 2 and probe.outcome != CLEAN


def test_the_two_point_test_needs_a_drop_beyond_the_tolerance() -> None:
    assert classify_probe(GATE_REF, [x * 0.97 for x in GATE_REF], [97.0]) is None
    assert classify_probe([100.0], [85.0], [85.0]) is None  # no degree of freedom
    assert classify_probe([100.0], [85.0], [85.0], others=[[90.0, 91.0]]) is not None
    assert classify_probe([], GATE_CAND, [85.0]) is None


def test_other_probes_add_their_degrees_of_freedom() -> None:
    plain = classify_probe(GATE_REF, GATE_CAND, [85.0])
    pooled = classify_probe(GATE_REF, GATE_CAND, [85.0], others=[[93.0, 93.5], [99.0, 99.8]])
    assert plain is not None and pooled is not None
    assert pooled.df == plain.df + 2
    others: list[list[float]] = []
    measure_probe(
        Launcher([], [85.1]), list(GATE_REF), launches_left=9, candidate=GATE_CAND, others=others
    )
    measure_probe(
        Launcher([], [100.2]), list(GATE_REF), launches_left=9, candidate=GATE_CAND, others=others
    )
    assert others == [[85.1], [100.2]]


def test_the_look_levels_add_up_to_less_than_alpha() -> None:
    assert sum(look_level(0.05, j) for j in range(1, 40)) < 0.05
    with pytest.raises(ValueError, match="look"):
        look_level(0.05, 0)


@pytest.mark.parametrize("separation", [0.5, 2.0, 8.0])
def test_the_two_point_test_is_exact(separation: float) -> None:
    """Seeded: one launch of a subset as fast as the reference called ``reproduces``, and one
    of a subset as slow as the candidate called ``clean``, against two launches of each
    deployment (df 2), the candidate ``separation`` launch-noises below the reference.  The t
    pivots are exact, so both rates stay under the first look's level (2.5%) at any
    separation; far apart, they vanish."""
    rng = np.random.default_rng(7)
    sigma = 0.06 / separation
    drop = math.log(0.94)
    n = 3000
    false_reproduce = false_clean = 0
    for _ in range(n):
        ref = list(100.0 * np.exp(rng.normal(0.0, sigma, 2)))
        cand = list(100.0 * np.exp(drop + rng.normal(0.0, sigma, 2)))
        as_ref = classify_probe(ref, cand, [100.0 * math.exp(rng.normal(0.0, sigma))])
        as_cand = classify_probe(ref, cand, [100.0 * math.exp(drop + rng.normal(0.0, sigma))])
        false_reproduce += as_ref is not None and as_ref.state == CANDIDATE
        false_clean += as_cand is not None and as_cand.state == REFERENCE
    rates = (false_reproduce / n, false_clean / n)
    assert max(rates) <= look_level(0.05, 1), rates
    if separation >= 8.0:
        assert false_reproduce == false_clean == 0


def test_the_error_rates_given_the_gates_flag() -> None:
    """The search runs only after the gate flagged, and the flag selects its launches (a drop
    that looked larger than it is); an error rate given the flag is at most the exact one over
    P(flag), so the bound carries over where the gate has power: a 15% drop at 2% launch
    noise, two launches each (the gate's first look), flags nearly always, and the probes of
    ``measure_probe`` (every look, the paired fallback included) err in none of 600 runs."""
    rng = np.random.default_rng(11)
    drop = math.log(0.85)
    flagged = errors = 0
    for _ in range(600):
        ref = list(100.0 * np.exp(rng.normal(0.0, 0.02, 2)))
        cand = list(100.0 * np.exp(drop + rng.normal(0.0, 0.02, 2)))
        if compare_paired(ref, cand, max_blocks=2).verdict is not Verdict.REGRESSION:
            continue
        flagged += 1
        for effect, wrong in ((0.0, REPRODUCES), (drop, CLEAN)):
            launcher = Launcher([], list(100.0 * np.exp(effect + rng.normal(0.0, 0.02, 6))))
            probe = measure_probe(
                launcher, list(ref), launches_left=6, keep_pace=False, candidate=cand
            )
            errors += probe.outcome == wrong
    assert flagged >= 500, flagged
    assert errors == 0


# ------------------------------------------------------------------------ reports


def test_the_json_section_and_the_table() -> None:
    model = Model(4, drops={1: 0.15})
    out = search(model)
    d = out.to_dict()
    assert d["status"] == "named"
    assert d["named"] == ["c1"] and d["hypothesis"] == ["c1"]
    assert d["changes"] == ["c0", "c1", "c2", "c3"]
    assert d["launches"] == out.launches
    first = d["steps"][0]
    assert first["purpose"] == "candidate" and first["verdict"] == "regression"
    assert first["applied"] == ["c0", "c1", "c2", "c3"]
    assert first["change_pct"] == pytest.approx(-15.0, abs=0.5)
    assert out.steps[0].ratio == pytest.approx(0.85, abs=0.005)
    ci = out.steps[0].ci90
    assert ci is not None and ci[0] < 0.85 < ci[1]
    assert d["probes"] == out.probes == len(out.steps) - 1
    low, high = first["ci90"]
    assert low < first["change_pct"] < high
    assert {s["purpose"] for s in d["steps"]} >= {"candidate", "split", "without"}
    lines = [s.text() for s in out.steps]
    assert any(
        line.startswith("c1  -15.0% (CI") and ("regression" in line or "reproduces" in line)
        for line in lines
    )
    assert out.summary().startswith("culprit: c1 (")


def test_max_launches_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_launches"):
        find_culprit(["a"], ExactOracle(Model(1)), max_launches=-1)
