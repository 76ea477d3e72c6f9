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
comparison is the search's ``candidate`` and whose reference launches seed the shared
reference pool; then :func:`pytest_kimi.gate.culprit.find_culprit` over an oracle that
launches each subset with :func:`pytest_kimi.gate.culprit.measure_probe`, up to half of
``--perf-max-launches`` launches a probe (the gate's blocks), ``--max-launches`` for the whole
search.  The 8% culprit is also run at ``--slow-launches``: 3% beyond the 5% tolerance at 2%
launch noise takes more launches than the default budget gives, in the gate as in a probe.
The changes' order is shuffled per run, so the culprit sits anywhere.

Per cell: how often the gate flagged the candidate, how often the culprit (the pair, for
``pair``) was named exactly, how often any harmless change was named (the acceptance: at most
2%), how often the search stopped undecided, the mean probes (paired comparisons) and mean
extra launches of the search, against ``log2(k) + 2``; then a probe's false-regression rate
when the subset's effect sits exactly at the tolerance, for reference pools of several sizes
(fixed, or kept in pace with the probe's launches): the shared pool must keep ``alpha``.  A probe is a paired comparison of at
least two launches of its subset (:data:`pytest_kimi.gate.paired.MIN_BLOCKS`), so the search's
floor is about ``2 (log2(k) + 1.5)`` launches: ``log2(k) + 2`` is met in probes, not launches.

    python bench/culprit.py [--runs 100] [--seed 1] [--max-launches 64]
                            [--perf-max-launches 12] [--slow-launches 24]
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
from pytest_kimi.gate.culprit import (  # noqa: E402
    NAMED,
    UNDECIDED,
    CulpritOutcome,
    Probe,
    Untestable,
    find_culprit,
    measure_probe,
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


def one_run(
    sc: Scenario,
    noise: float,
    rng: np.random.Generator,
    *,
    gate_launches: int,
    max_launches: int,
    probe_blocks: int,
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

    def oracle(applied: frozenset[int], launches_left: int) -> Probe:
        keys = {sc.keys[i] for i in applied}

        def launch(with_subset: bool) -> float:
            if not with_subset:
                return figure(set())
            if not sc.starts(keys):
                raise Untestable("speculative-algorithm needs its draft model", launches=1)
            return figure(keys)

        return measure_probe(launch, pool, launches_left=launches_left, max_blocks=probe_blocks)

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
        default=24,
        help="--perf-max-launches of the extra 8%% rows (0: none)",
    )
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(
        f"# {args.runs} seeded runs a cell, seed {args.seed}; search budget "
        f"{args.max_launches} launches; a probe: up to launches/2 launches of its subset "
        f"against the shared reference pool (seeded with the gate's reference launches)"
    )
    print(
        "scenario     k  cost  noise  launches  gate-flag  named-right  harmless-named  "
        "undecided  routed  probes  extra-launches  log2(k)+2"
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
                    )
                    tally.add(sc, flagged, out)
                n = tally.runs
                print(
                    f"{kind:<10} {k:>3} {cost:>5.0%} {noise:>6.0%} {launches:>9} "
                    f"{tally.flagged / n:>10.0%} {tally.named_right / n:>12.0%} "
                    f"{tally.harmless_named / n:>15.0%} {tally.undecided / n:>10.0%} "
                    f"{tally.routed / n:>7.0%} {tally.probes / n:>7.2f} "
                    f"{tally.launches / n:>15.2f} {math.log2(k) + 2:>10.1f}"
                )
    sims = 20 * args.runs
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
        "subset was met and routed around; probes: paired comparisons of the search (the "
        "gate's not counted); extra-launches: the server starts they took, reference top-ups "
        f"and failed starts included.  {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
