"""The culprit search (:mod:`pytest_kimi.gate.culprit`) over synthetic oracles.

Two kinds of oracle: an *exact* one (fixed launch figures scaled by the subset's true effect,
so every probe decides at its first look and the search's logic is seen alone) and a *noisy*
one (seeded lognormal launch noise through :func:`measure_probe`, the schedule the run layer
uses), whose verdicts are those of the drawn figures.  Every outcome: a single culprit, an
interacting pair, untestable subsets routed around, a coupled culprit, two culprits, the budget
spent, nothing to explain; and the claims: a named set was tested alone and the candidate
without it was tested, a harmless change is never named.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from pytest_kimi.gate.culprit import (
    CLEAN,
    NAMED,
    NOTHING_TO_EXPLAIN,
    REPRODUCES,
    UNDECIDED,
    UNSETTLED,
    UNTESTABLE,
    CulpritOutcome,
    Probe,
    Untestable,
    find_culprit,
    measure_probe,
)
from pytest_kimi.gate.paired import compare_paired
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


class NoisyOracle:
    """Each launch draws exp(N(0, noise)); subsets measured by :func:`measure_probe` against a
    reference pool shared by every probe."""

    def __init__(self, model: Model, noise: float, seed: int, max_blocks: int = 6) -> None:
        self.model = model
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.max_blocks = max_blocks
        self.pool: list[float] = []
        self.calls: list[frozenset[int]] = []

    def figure(self, applied: frozenset[int]) -> float:
        return 100.0 * self.model.ratio(applied) * math.exp(self.rng.normal(0.0, self.noise))

    def candidate(self) -> Probe:
        everything = frozenset(range(self.model.k))
        ref = [self.figure(frozenset()) for _ in range(4)]
        cand = [self.figure(everything) for _ in range(4)]
        self.pool.extend(ref)
        return Probe(compare_paired(ref, cand, max_blocks=6), 0)

    def __call__(self, applied: frozenset[int], launches_left: int) -> Probe:
        self.calls.append(applied)

        def launch(with_subset: bool) -> float:
            if not with_subset:
                return self.figure(frozenset())
            if not self.model.starts(applied):
                raise Untestable("does not start", launches=1)
            return self.figure(applied)

        return measure_probe(
            launch, self.pool, launches_left=launches_left, max_blocks=self.max_blocks
        )


def search(
    model: Model,
    oracle: Callable[[frozenset[int], int], Probe] | None = None,
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
    assert len(oracle.calls) == len(set(oracle.calls))


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


def test_a_harmless_change_is_never_named_under_launch_noise() -> None:
    """40 seeded searches at 2% launch noise, a 15% culprit among 8: no harmless change is ever
    named, and the culprit almost always is (the seeds fix the count)."""
    named_right = 0
    for seed in range(40):
        culprit = seed % 8
        model = Model(8, drops={culprit: 0.15})
        oracle = NoisyOracle(model, noise=0.02, seed=seed)
        out = search(model, oracle, max_launches=64, candidate=oracle.candidate())
        if out.status == NAMED:
            assert out.named == (culprit,), f"seed {seed}: named {out.named_keys}"
            assert_claims_tested(out)
            named_right += 1
        assert out.launches <= 64
    assert named_right >= 36


@pytest.mark.parametrize(
    ("model", "named"),
    [
        (Model(8, together={frozenset({2, 7}): 0.15}), (2, 7)),
        (Model(8, drops={4: 0.15}, requires={1: 6}), (4,)),
        (Model(16, drops={11: 0.15}), (11,)),
    ],
    ids=["pair", "untestable", "one-in-16"],
)
def test_noisy_searches_name_the_right_set(model: Model, named: tuple[int, ...]) -> None:
    oracle = NoisyOracle(model, noise=0.01, seed=3)
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
    assert any(line.startswith("c1  -15.0% (CI") and "regression" in line for line in lines)
    assert out.summary().startswith("culprit: c1 (")


def test_max_launches_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_launches"):
        find_culprit(["a"], ExactOracle(Model(1)), max_launches=-1)
