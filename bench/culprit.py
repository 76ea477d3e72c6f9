"""What the culprit search costs and how often it is right, by simulation over a flag-effect table.

Each run simulates a deploy change of ``k`` atomic changes (4, 8, 16) applied to a reference
serving 100 tok/s, whose every launch draws a lognormal speed factor (the launch noise: 1%,
2%).  The effects follow the fake SGLang's documented behaviour (``tests/fake_sglang``:
``--enable-eplb`` slows decode; the other flags cost nothing) and the issue's scenarios:

* ``single``: one culprit (``enable-eplb``) costing 15% or 8%, hidden among harmless changes
  (``log-level``, ``stream-interval``, ``schedule-policy``, env vars, ...);
* ``pair``: two changes harmless alone that cost 15% together (``max-running-requests`` with
  ``chunked-prefill-size``), no single culprit;
* ``untestable``: one 15% culprit, and a coupling the profile did not declare: applying
  ``speculative-algorithm`` without ``speculative-draft-model-path`` does not start (a failed
  start costs one launch).

Each run follows the plugin's path: the deploy gate's paired ABBA experiment of reference
and candidate (:func:`pytest_kimi.gate.paired.run_sequential`, ``--perf-max-launches``), whose
comparison is the search's ``candidate`` and whose reference and candidate launches are the
pools every probe is read against; then :func:`pytest_kimi.gate.culprit.find_culprit` over an
oracle that launches each subset with :func:`pytest_kimi.gate.culprit.measure_probe`: the
two-point test (:mod:`pytest_kimi.gate.probe_stats`: like the reference or like the
candidate?), which usually decides at the subset's first launch, the tolerance-based paired
comparison for a subset it cannot place; up to half of ``--perf-max-launches`` launches a
probe (the gate's blocks), ``--max-launches`` for the whole search.  ``--paired-only`` runs
the probes as the tolerance-based comparison alone (the design before the two-point test:
two launches of the subset at least).  The 8% culprit is also run at ``--slow-launches``: 3%
beyond the 5% tolerance at 2% launch noise takes more launches than the default budget gives
the deploy gate.  The changes' order is shuffled per run, so the culprit sits anywhere.

Per cell: how often the gate flagged the candidate, how often the culprit (the pair, for
``pair``) was named exactly, how often any harmless change was named (the acceptance: at most
2%), how often the search stopped undecided, the mean probes (comparisons) and mean extra
launches of the search, against ``log2(k) + 2``, and ``probe-err``: the share of the search's
decided probes whose verdict contradicts the subset's true effect (a subset that holds the
culprit, or the pair, called clean; one that does not, called reproducing; errors the
search's confirmations must absorb).

Then a probe alone, seeded with the gate's launches of a run the gate flagged (so the pools
carry the gate's selection, as in the search; the gate's flag rate is printed: the bound
given the flag is ``alpha / P(flag)``): how often the two-point probe calls a
subset as fast as the reference ``reproduces`` (its bound: ``alpha`` = 5%), how often it
calls a subset as slow as the candidate ``clean`` (bound 5%), and what a subset with half the
candidate's drop (a partial effect) is called, with the launches each takes; then the
tolerance-based comparison's false-regression rate when the subset's effect sits exactly at
the tolerance, for reference pools of several sizes (fixed, or kept in pace with the probe's
launches): the shared pool must keep ``alpha``.

    python bench/culprit.py [--runs 100] [--seed 1] [--max-launches 64]
                            [--perf-max-launches 12] [--slow-launches 32] [--paired-only]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimi.gate import paired  # noqa: E402
from pytest_kimi.gate.culprit import find_culprit, measure_probe  # noqa: E402
from pytest_kimi.gate.culprit_records import (  # noqa: E402
    CLEAN,
    NAMED,
    REPRODUCES,
    UNDECIDED,
    CulpritOutcome,
    Probe,
    Untestable,
)

NOISES = (0.01, 0.02)
KS = (4, 8, 16)
REFERENCE_TOK_S = 100.0

CULPRIT = "enable-eplb"
PAIR = ("max-running-requests", "chunked-prefill-size")
COUPLED = ("speculative-algorithm", "speculative-draft-model-path")
"""Applying the first without the second does not start."""
HARMLESS = (
    "log-level",
    "stream-interval",
    "schedule-policy",
    "env:SGLANG_LOG_LEVEL",
    "random-seed",
    "env:HF_HUB_OFFLINE",
    "watchdog-timeout",
    "decode-log-interval",
    "env:NCCL_DEBUG",
    "show-time-cost",
    "enable-metrics",
    "file-storage-path",
    "env:TORCHINDUCTOR_CACHE_DIR",
    "skip-server-warmup",
    "served-model-name",
    "log-requests",
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One deploy change: its keys (in the profile's order) and what they do."""

    keys: tuple[str, ...]
    cost: float
    """The culprit's (or the pair's) drop, e.g. 0.15."""
    culprits: frozenset[str]
    """What a right answer names."""
    together: bool
    """The culprits cost only when applied together (an interaction)."""

    def log_effect(self, applied: set[str]) -> float:
        hit = self.culprits & applied
        if self.together:
            return math.log1p(-self.cost) if hit == self.culprits else 0.0
        return math.log1p(-self.cost) * len(hit)

    def starts(self, applied: set[str]) -> bool:
        return not (COUPLED[0] in applied and COUPLED[1] not in applied)


def scenario(kind: str, k: int, cost: float, rng: np.random.Generator) -> Scenario:
    if kind == "single":
        special: tuple[str, ...] = (CULPRIT,)
        culprits, together = frozenset(special), False
    elif kind == "pair":
        special, culprits, together = PAIR, frozenset(PAIR), True
    elif kind == "untestable":
        special = (CULPRIT, *COUPLED)
        culprits, together = frozenset((CULPRIT,)), False
    else:
        raise ValueError(kind)
    keys = list(special) + list(HARMLESS[: k - len(special)])
    rng.shuffle(keys)
    return Scenario(tuple(keys), cost, culprits, together)


@dataclass(slots=True)
class Tally:
    runs: int = 0
    flagged: int = 0
    named_right: int = 0
    harmless_named: int = 0
    undecided: int = 0
    routed: int = 0
    probes: int = 0
    launches: int = 0
    decided: int = 0
    wrong: int = 0

    def add(self, sc: Scenario, gate_flagged: bool, out: CulpritOutcome) -> None:
        self.runs += 1
        self.flagged += gate_flagged
        named = set(out.named_keys) if out.status == NAMED else set()
        self.named_right += named == set(sc.culprits)
        self.harmless_named += bool(named - sc.culprits)
        self.undecided += out.status == UNDECIDED
        self.routed += any(s.probe.untestable is not None for s in out.steps)
        self.probes += out.probes
        self.launches += out.launches
        for step in out.steps:
            if step.purpose == "candidate" or step.outcome not in (REPRODUCES, CLEAN):
                continue
            keys = set(step.keys)
            truly = (sc.culprits <= keys) if sc.together else bool(sc.culprits & keys)
            self.decided += 1
            self.wrong += truly != (step.outcome == REPRODUCES)


def one_run(
    sc: Scenario,
    noise: float,
    rng: np.random.Generator,
    *,
    gate_launches: int,
    max_launches: int,
    probe_blocks: int,
    two_point: bool = True,
) -> tuple[bool, CulpritOutcome]:
    """The deploy gate on the whole change, then the search: one simulated CI job."""

    def figure(applied: set[str]) -> float:
        return REFERENCE_TOK_S * math.exp(sc.log_effect(applied) + rng.normal(0.0, noise))

    everything = set(sc.keys)
    blocks = gate_launches // 2
    ref = [figure(set()) for _ in range(blocks)]
    cand = [figure(everything) for _ in range(blocks)]
    gate = paired.run_sequential(ref, cand, max_blocks=blocks)
    pool = ref[: gate.blocks]  # the launches the gate made; the rest were never launched
    cand_pool = cand[: gate.blocks] if two_point else None
    others: list[list[float]] = []

    def oracle(applied: frozenset[int], launches_left: int) -> Probe:
        keys = {sc.keys[i] for i in applied}

        def launch(with_subset: bool) -> float:
            if not with_subset:
                return figure(set())
            if not sc.starts(keys):
                raise Untestable("speculative-algorithm needs its draft model", launches=1)
            return figure(keys)

        return measure_probe(
            launch,
            pool,
            launches_left=launches_left,
            max_blocks=probe_blocks,
            candidate=cand_pool,
            others=others if two_point else None,
        )

    out = find_culprit(
        sc.keys,
        oracle,
        max_launches=max_launches,
        candidate=Probe(gate.comparison, 0),
    )
    return gate.comparison.verdict.value == "regression", out


def null_rate(rng: np.random.Generator, sims: int, pool_size: int, keep_pace: bool) -> float:
    """P(a probe says ``regression``) when the subset's true effect sits exactly at the
    tolerance: the false-alarm rate of a probe read against a shared reference pool (``alpha``
    is 5%)."""
    hits = 0
    margin = math.log1p(-0.05)
    for _ in range(sims):
        pool = list(np.exp(rng.normal(0.0, 0.02, pool_size)))

        def launch(with_subset: bool) -> float:
            return math.exp((margin if with_subset else 0.0) + rng.normal(0.0, 0.02))

        probe = measure_probe(launch, pool, launches_left=100, keep_pace=keep_pace)
        hits += probe.outcome == "reproduces"
    return hits / sims


@dataclass(slots=True)
class ProbeRates:
    """One probe's verdicts for three true effects, over probes seeded by flagged gate runs."""

    sims: int = 0
    runs: int = 0
    """Gate runs, flagged or not (the flag rate: P(flag) in the bound alpha / P(flag))."""
    ref_reproduces: int = 0
    ref_launches: int = 0
    cand_clean: int = 0
    cand_launches: int = 0
    half_reproduces: int = 0
    half_clean: int = 0
    half_paired: int = 0
    half_launches: int = 0

    def line(self, cost: float, noise: float, launches: int) -> str:
        n = max(self.sims, 1)
        return (
            f"#   {cost:.0%} at {noise:.0%} noise, gate {launches} launches (flags "
            f"{self.sims / max(self.runs, 1):.0%}; {self.sims} probes each): as the "
            f"reference -> reproduces {self.ref_reproduces / n:.2%} "
            f"({self.ref_launches / n:.2f} launches); as the candidate -> clean "
            f"{self.cand_clean / n:.2%} ({self.cand_launches / n:.2f}); half the drop -> "
            f"reproduces {self.half_reproduces / n:.0%}, clean {self.half_clean / n:.0%}, "
            f"by the paired fallback {self.half_paired / n:.0%} ({self.half_launches / n:.2f})"
        )


def probe_rates(
    rng: np.random.Generator, sims: int, cost: float, noise: float, gate_launches: int
) -> ProbeRates:
    """The two-point probe's classification errors: ``sims`` gate runs that flagged the
    candidate, each followed by one probe of a subset as fast as the reference, one as slow
    as the candidate and one with half its drop, against the gate's pools."""
    out = ProbeRates()
    drop = math.log1p(-cost)
    blocks = gate_launches // 2
    while out.sims < sims:
        ref = list(REFERENCE_TOK_S * np.exp(rng.normal(0.0, noise, blocks)))
        cand = list(REFERENCE_TOK_S * np.exp(drop + rng.normal(0.0, noise, blocks)))
        gate = paired.run_sequential(ref, cand, max_blocks=blocks)
        out.runs += 1
        if gate.comparison.verdict.value != "regression":
            continue
        out.sims += 1
        for effect in (0.0, drop, drop / 2.0):
            pool = ref[: gate.blocks]

            def launch(with_subset: bool, effect: float = effect) -> float:
                shift = effect if with_subset else 0.0
                return REFERENCE_TOK_S * math.exp(shift + rng.normal(0.0, noise))

            probe = measure_probe(
                launch, pool, launches_left=100, max_blocks=blocks, candidate=cand[: gate.blocks]
            )
            if effect == 0.0:
                out.ref_reproduces += probe.outcome == REPRODUCES
                out.ref_launches += probe.launches
            elif effect == drop:
                out.cand_clean += probe.outcome == CLEAN
                out.cand_launches += probe.launches
            else:
                out.half_reproduces += probe.outcome == REPRODUCES
                out.half_clean += probe.outcome == CLEAN
                out.half_paired += isinstance(probe.comparison, paired.PairedComparison)
                out.half_launches += probe.launches
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-launches", type=int, default=64, help="the search's own budget")
    ap.add_argument(
        "--perf-max-launches",
        type=int,
        default=paired.DEFAULT_MAX_LAUNCHES,
        help="the deploy gate's launches; a probe may make half as many of its subset",
    )
    ap.add_argument(
        "--slow-launches",
        type=int,
        default=32,
        help="--perf-max-launches of the extra 8%% rows (0: none): the gate's budget that "
        "lets it flag an 8%% drop at 2%% launch noise (it stops as soon as it decides)",
    )
    ap.add_argument(
        "--paired-only",
        action="store_true",
        help="probes by the tolerance-based paired comparison alone (no two-point test)",
    )
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(
        f"# {args.runs} seeded runs a cell, seed {args.seed}; search budget "
        f"{args.max_launches} launches; a probe: up to launches/2 launches of its subset "
        f"against the shared reference pool (seeded with the gate's reference launches), "
        + (
            "by the tolerance-based paired comparison alone"
            if args.paired_only
            else "read first by the two-point test against the gate's candidate launches"
        )
    )
    print(
        "scenario     k  cost  noise  launches  gate-flag  named-right  harmless-named  "
        "undecided  routed  probes  extra-launches  log2(k)+2  probe-err"
    )
    base = args.perf_max_launches
    cells: list[tuple[str, float, int]] = [
        ("single", 0.15, base),
        ("single", 0.08, base),
    ]
    if args.slow_launches:
        cells.append(("single", 0.08, args.slow_launches))
    cells += [("pair", 0.15, base), ("untestable", 0.15, base)]
    for kind, cost, launches in cells:
        for k in KS:
            for noise in NOISES:
                tally = Tally()
                for _ in range(args.runs):
                    sc = scenario(kind, k, cost, rng)
                    flagged, out = one_run(
                        sc,
                        noise,
                        rng,
                        gate_launches=launches,
                        max_launches=args.max_launches,
                        probe_blocks=launches // 2,
                        two_point=not args.paired_only,
                    )
                    tally.add(sc, flagged, out)
                n = tally.runs
                print(
                    f"{kind:<10} {k:>3} {cost:>5.0%} {noise:>6.0%} {launches:>9} "
                    f"{tally.flagged / n:>10.0%} {tally.named_right / n:>12.0%} "
                    f"{tally.harmless_named / n:>15.0%} {tally.undecided / n:>10.0%} "
                    f"{tally.routed / n:>7.0%} {tally.probes / n:>7.2f} "
                    f"{tally.launches / n:>15.2f} {math.log2(k) + 2:>10.1f} "
                    f"{tally.wrong / max(tally.decided, 1):>10.1%}"
                )
    sims = 20 * args.runs
    if not args.paired_only:
        print("# a two-point probe against the pools of a gate run that flagged the candidate:")
        for cost, noise, launches in (
            (0.15, 0.01, base),
            (0.15, 0.02, base),
            (0.08, 0.01, base),
            (0.08, 0.02, base),
            (0.08, 0.02, args.slow_launches or base),
            (0.06, 0.02, args.slow_launches or base),
        ):
            print(probe_rates(rng, sims, cost, noise, launches).line(cost, noise, launches))
    rates = [
        f"pool {n}{' kept in pace' if pace else ''}: {null_rate(rng, sims, n, pace):.1%}"
        for n, pace in ((0, True), (2, True), (2, False), (4, False), (6, False), (12, False))
    ]
    print(
        f"# a probe's false regressions at the tolerance ({sims} probes each): " + "; ".join(rates)
    )
    print(
        "# launches: the gate's --perf-max-launches (a probe's cap is half); gate-flag: the "
        "deploy gate said regression (else the search has nothing to explain or stops "
        "undecided); named-right: exactly the culprit (the pair) named; routed: an untestable "
        "subset was met and routed around; probes: comparisons of the search (the "
        "gate's not counted); extra-launches: the server starts they took, reference top-ups "
        "and failed starts included; probe-err: the search's decided probes whose verdict "
        f"contradicts the subset's true effect.  {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
