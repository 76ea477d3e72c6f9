"""What the warm-up rule costs on a steady server, and whether it sees a warming one.

``pytest_kimi.measure.warm.settled`` ends a fresh server's warm-up when the best figure so far
has not risen for two trials.  On a steady server (every trial an independent draw) it should
stop after a few trials whatever the trial noise; on a warming one (the simulator's
``cold_steps`` shape: a rise that flattens out) only once the rise is over.  Seeded; no server.

    python bench/warm_rule.py [--runs 20000] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random
from typing import Callable

from pytest_kimi.measure.warm import MAX_WARM_TRIALS, settled


def previous_rule(figures: list[float]) -> bool:
    """The rule before this one, for comparison: the last trial not above the one before it by
    more than half a percent, from two trials (at most six)."""
    return len(figures) >= 2 and math.log(figures[-1] / figures[-2]) <= 0.005


def warm(
    draw: random.Random,
    noise: float,
    rise: tuple[float, ...],
    rule: Callable[[list[float]], bool] = settled,
    bound: int = MAX_WARM_TRIALS,
) -> list[float]:
    """One warm-up: trial ``i`` reads ``rise[i]`` of the steady figure (all of it after the
    rise) with lognormal noise, until ``rule`` or ``bound``."""
    figures: list[float] = []
    for i in range(bound):
        factor = rise[i] if i < len(rise) else 1.0
        figures.append(factor * math.exp(draw.gauss(0.0, noise)))
        if rule(figures):
            break
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ns = ap.parse_args()
    draw = random.Random(ns.seed)
    # the cold simulator's warm trials, relative to its steady 205.9 tok/s (docs/guide/measurement.md)
    cold = (113.5 / 205.9, 129.1 / 205.9, 158.0 / 205.9, 204.0 / 205.9)
    print(
        "server   trial noise | this rule: warm trials, bound reached, stopped in the rise "
        "| previous rule: warm trials, stopped in the rise"
    )
    for name, rise in (("steady", ()), ("warming", cold)):
        for noise in (0.001, 0.01, 0.03, 0.1):
            runs = [warm(draw, noise, rise) for _ in range(ns.runs)]
            old = [warm(draw, noise, rise, previous_rule, 6) for _ in range(ns.runs)]
            n = sum(len(r) for r in runs) / ns.runs
            bound = sum(not settled(r) for r in runs) / ns.runs
            early = sum(len(r) < len(rise) for r in runs) / ns.runs
            n_old = sum(len(r) for r in old) / ns.runs
            early_old = sum(len(r) < len(rise) for r in old) / ns.runs
            print(
                f"{name:8} {noise:11.1%} | {n:11.2f} {bound:14.2%} {early:19.2%} "
                f"| {n_old:26.2f} {early_old:19.2%}"
            )


if __name__ == "__main__":
    main()
