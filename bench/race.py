"""Whether the race finds the best deployment, and what it saves over the full grid, by
simulation over a table of deployments of known speed.

Each run races eight deployments (:func:`pytest_kimi.gate.race.run_race`) whose every launch
draws a lognormal speed factor (the launch noise: 1%, 2%) about the deployment's true speed.
The flag-effect table (the issue's write-ups: an operator's EP8 / EP4 / TP8 variants; the
speeds are the bench's, not measurements, chosen so that two lie within 2% of each other and
the rest step away by 7% to 40%):

    deployment           speed   what it is
    ep8-tuned            1.000   EP8, max-running-requests 256, decode graphs to 256: the best
    ep8-tuned-eplb       0.985   the same with --enable-eplb: 1.5% slower, within 2%
    tp8-cuda-graph       0.930   TP8 with decode CUDA graphs
    ep8                  0.900   EP8 with SGLang's defaults
    ep8-chunked-4k       0.850   EP8, chunked-prefill-size 4096
    ep4                  0.800   EP4
    tp8                  0.700   TP8 with SGLang's defaults
    tp8-no-cuda-graph    0.600   TP8, CUDA graphs disabled

A launch's server time is its start plus its warm-up plus its measurement: ``START_S`` (600
s: a Kimi-class checkpoint loads and captures its CUDA graphs in 10-20 minutes) + ``WARM_S``
(60 s) + ``MEASURE_S / speed`` (a fixed workload, 300 s at the best's speed: a slower
deployment takes longer to serve it).  The full grid launches every deployment ``max_rounds``
times (the race's cap per deployment: the same trial counts); the race's launches are its
survivors' (an eliminated deployment's skipped launches are the saving).  ``vs-grid@rounds``
compares with the stricter grid that launches every deployment as often as the race ran
rounds (what a grid would need for the race's finalists' precision).

Per cell (100 seeded runs): ``best-or-tie``: the winner is the true best, or a declared tie
contains it (acceptance: >= 95%); ``winner-best``, ``tie``, ``undecided`` (the budget ended
without a decision); ``best-out``: the true best was eliminated (bounded by alpha);
``bad-winner``: a deployment >= 10% slower than the best was declared the winner (acceptance:
none); the mean rounds and launches; server time against the grid's (acceptance: <= 35%).
The ``null`` rows race eight *equal* deployments: ``any-out`` is the share of races that
eliminated any of them (every elimination there is an error; bounded by alpha), with the
default tolerance (the race ends in a tie) and with a tolerance too small to tie (the race
runs to its budget: every look of the Pocock calibration is exercised); their ``best``
columns read the table's first deployment.

    python bench/race.py [--runs 100] [--seed 1] [--tolerance 0.05] [--alpha 0.05]
                         [--max-rounds 10] [--margin 0]
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
from pytest_kimi.gate import race as racing  # noqa: E402

TABLE: tuple[tuple[str, float], ...] = (
    ("ep8-tuned", 1.000),
    ("ep8-tuned-eplb", 0.985),
    ("tp8-cuda-graph", 0.930),
    ("ep8", 0.900),
    ("ep8-chunked-4k", 0.850),
    ("ep4", 0.800),
    ("tp8", 0.700),
    ("tp8-no-cuda-graph", 0.600),
)
BEST_TOK_S = 1000.0
NOISES = (0.01, 0.02)
START_S = 600.0
WARM_S = 60.0
MEASURE_S = 300.0


def launch_s(speed: float) -> float:
    """Server seconds of one launch of a deployment of relative ``speed``."""
    return START_S + WARM_S + MEASURE_S / speed


@dataclass(slots=True)
class Tally:
    runs: int = 0
    best_or_tie: int = 0
    winner_best: int = 0
    tie: int = 0
    undecided: int = 0
    best_out: int = 0
    bad_winner: int = 0
    any_out: int = 0
    rounds: int = 0
    launches: int = 0
    server_s: float = 0.0
    grid_s: float = 0.0
    grid_rounds_s: float = 0.0

    def row(self, label: str, noise: float) -> str:
        n = max(self.runs, 1)
        return (
            f"{label:<6} {noise:>6.0%} {self.runs:>5} {self.best_or_tie / n:>12.0%} "
            f"{self.winner_best / n:>12.0%} {self.tie / n:>5.0%} {self.undecided / n:>10.0%} "
            f"{self.best_out / n:>9.1%} {self.bad_winner / n:>11.0%} {self.any_out / n:>8.1%} "
            f"{self.rounds / n:>7.2f} {self.launches / n:>9.1f} "
            f"{self.server_s / max(self.grid_s, 1e-9):>8.1%} "
            f"{self.server_s / max(self.grid_rounds_s, 1e-9):>15.1%}"
        )


def one_race(
    table: tuple[tuple[str, float], ...],
    noise: float,
    rng: np.random.Generator,
    options: dict[str, float | int],
    max_rounds: int,
) -> tuple[racing.RaceResult, float, float, float]:
    """One simulated race: its result, its server seconds, the full grid's and the grid's at
    the race's rounds."""
    speed = dict(table)
    spent = 0.0

    def launch(name: str) -> float:
        nonlocal spent
        spent += launch_s(speed[name])
        return BEST_TOK_S * speed[name] * math.exp(rng.normal(0.0, noise))

    names = [n for n, _ in table]
    order = rng.permutation(len(names))  # where the best sits in the race's order is chance
    res = racing.run_race(
        [names[i] for i in order],
        launch,
        max_rounds=max_rounds,
        tolerance=float(options["tolerance"]),
        alpha=float(options["alpha"]),
        margin=float(options["margin"]),
    )

    per_round = sum(launch_s(s) for _, s in table)
    return res, spent, per_round * max_rounds, per_round * res.rounds


def cell(
    table: tuple[tuple[str, float], ...],
    noise: float,
    runs: int,
    rng: np.random.Generator,
    options: dict[str, float | int],
    max_rounds: int,
) -> Tally:
    best_name, best_speed = max(table, key=lambda r: r[1])
    bad = {n for n, s in table if s <= 0.9 * best_speed}
    tally = Tally()
    for _ in range(runs):
        res, spent, grid, grid_rounds = one_race(table, noise, rng, options, max_rounds)
        tally.runs += 1
        tally.winner_best += res.winner == best_name
        tally.tie += res.stop == racing.TIE
        tally.best_or_tie += res.winner == best_name or best_name in res.tie
        tally.undecided += res.stop == racing.BUDGET
        tally.best_out += res.entry(best_name).eliminated_in_round is not None
        tally.bad_winner += res.winner in bad
        tally.any_out += any(e.eliminated_in_round is not None for e in res.ranking)
        tally.rounds += res.rounds
        tally.launches += res.launches
        tally.server_s += spent
        tally.grid_s += grid
        tally.grid_rounds_s += grid_rounds
    return tally


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=racing.DEFAULT_TOLERANCE)
    ap.add_argument("--alpha", type=float, default=racing.DEFAULT_ALPHA)
    ap.add_argument("--max-rounds", type=int, default=racing.DEFAULT_MAX_ROUNDS)
    ap.add_argument("--margin", type=float, default=0.0, help="the elimination's margin")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    options: dict[str, float | int] = {
        "tolerance": args.tolerance,
        "alpha": args.alpha,
        "margin": args.margin,
    }
    n = len(TABLE)
    print(
        f"# {args.runs} seeded runs a cell, seed {args.seed}; {n} deployments, tolerance "
        f"{args.tolerance:.0%}, alpha {args.alpha:.0%}, margin {args.margin:.0%}, at most "
        f"{args.max_rounds} rounds; elimination level per look "
        f"{racing.nominal_alpha(args.alpha, n, args.max_rounds):.4f} (Tukey), tie level "
        f"{paired.nominal_alpha(args.alpha, args.max_rounds):.4f}; "
        f"a launch: {START_S:.0f} s start + {WARM_S:.0f} s warm-up + {MEASURE_S:.0f} s / speed"
    )
    print(
        "cell    noise  runs  best-or-tie  winner-best   tie  undecided  best-out  "
        "bad-winner  any-out  rounds  launches  vs-grid  vs-grid@rounds"
    )
    worst_right, worst_ratio, bad = 1.0, 0.0, 0
    for noise in NOISES:
        t = cell(TABLE, noise, args.runs, rng, options, args.max_rounds)
        print(t.row("race", noise))
        worst_right = min(worst_right, t.best_or_tie / t.runs)
        worst_ratio = max(worst_ratio, t.server_s / t.grid_s)
        bad += t.bad_winner
    equal = tuple((name, 1.0) for name, _ in TABLE)
    null_runs = 2 * args.runs
    t = cell(equal, 0.02, null_runs, rng, options, args.max_rounds)
    print(t.row("null", 0.02))
    strict = dict(options, tolerance=1e-4)
    t = cell(equal, 0.02, null_runs, rng, strict, args.max_rounds)
    print(t.row("null*", 0.02))
    verdict = worst_right >= 0.95 and bad == 0 and worst_ratio <= 0.35
    print(
        f"# acceptance {'holds' if verdict else 'FAILS'}: best-or-tie >= 95% (worst "
        f"{worst_right:.0%}), no winner >= 10% slower ({bad} seen), server time <= 35% of "
        f"the full grid (worst {worst_ratio:.1%}); null* = equal deployments raced to the "
        f"budget (tolerance 0.01%: never a tie).  {time.perf_counter() - started:.0f} s"
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    raise SystemExit(main())
