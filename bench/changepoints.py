"""How well the history's change-point detector (pytest_kimi.history.changes) does on synthetic
series: false changes in unchanged series, steps found (and placed at the right run), drifts.

A series is one test level's figure over runs.  Each run's figure is its true level times
``exp(N(0, sigma))``: ``sigma`` is the run-to-run noise of a figure, session noise and trial
noise together (with the gate's default 3% session sigma, one session's factor has sd 2.1%,
and the median of 3 trials at 2% adds about 1.2%: about 2.5% in all).  Scenarios, per sigma:

* ``unchanged``: 20 runs (and 50, 100) of one level: any change named is a false one;
* ``step``: the level drops by X% from run 10 of 20 (runs are 0-based): *found* when some
  change is named, *at the run* when exactly one change is named and it is at run 10;
* ``late step``: a 15% drop in the last k runs of 20: how many runs after a change it takes;
* ``drift``: 2% slower every run over the last 10 runs of 20 (each step would pass the gate):
  found when a slower change is named at one of those runs; ``drift+plateau`` the same over
  runs 10-19 of 30, the level then flat at -18%.

The detector runs exactly as :func:`find_changes` runs it (:func:`detect` on the run figures);
``--stock-merge`` swaps in Otava's own merge step, to show what its neighbour re-test costs.

    python bench/changepoints.py [--sims N] [--seed S] [--sigmas 0.01 0.02 ...]
        [--max-pvalue P] [--min-magnitude M] [--stock-merge]

It needs the detector's library, Apache Otava: ``pip install -e '.[otava]'`` (not in ``test``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimi.history import changes  # noqa: E402  (path set up above for a plain checkout)
from pytest_kimi.history.changes import (  # noqa: E402
    DEFAULT_MAX_PVALUE,
    DEFAULT_MIN_MAGNITUDE,
    detect,
)


def _stock_merge(
    change_points: list, series: list[float], max_pvalue: float, min_magnitude: float
) -> list:
    from otava.analysis import merge

    return list(merge(list(change_points), series, max_pvalue, min_magnitude))


Factors = Callable[[int], np.ndarray]


def _step(at: int, drop: float) -> Callable[[int], np.ndarray]:
    def f(n: int) -> np.ndarray:
        out = np.ones(n)
        out[at:] *= 1.0 - drop
        return out

    return f


def _drift(start: int, runs: int, per_run: float) -> Callable[[int], np.ndarray]:
    def f(n: int) -> np.ndarray:
        out = np.ones(n)
        for i in range(runs):
            out[start + i :] *= 1.0 - per_run
        return out

    return f


def _flat(n: int) -> np.ndarray:
    return np.ones(n)


def run_cell(
    rng: np.random.Generator,
    sims: int,
    n: int,
    sigma: float,
    truth: Callable[[int], np.ndarray],
    found: Callable[[list[tuple[int, float]], np.ndarray], bool],
    p: float,
    m: float,
) -> float:
    hits = 0
    level = truth(n)
    for _ in range(sims):
        values = 1000.0 * level * np.exp(rng.normal(0.0, sigma, n))
        cps = detect(values.tolist(), max_pvalue=p, min_magnitude=m)
        hits += found(cps, values)
    return hits / sims


def any_change(cps: list[tuple[int, float]], _: np.ndarray) -> bool:
    return bool(cps)


def exactly_at(index: int) -> Callable[[list[tuple[int, float]], np.ndarray], bool]:
    return lambda cps, _: [i for i, _p in cps] == [index]


def slower_within(lo: int, hi: int) -> Callable[[list[tuple[int, float]], np.ndarray], bool]:
    """A change named at a run in [lo, hi] whose segment after it is slower than before."""

    def f(cps: list[tuple[int, float]], values: np.ndarray) -> bool:
        bounds = [0] + [i for i, _ in cps] + [len(values)]
        for k, (i, _p) in enumerate(cps):
            before = np.log(values[bounds[k] : i]).mean()
            after = np.log(values[i : bounds[k + 2]]).mean()
            if lo <= i <= hi and after < before:
                return True
        return False

    return f


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sims", type=int, default=1000, help="series per cell (default 1000)")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--sigmas", type=float, nargs="+", default=[0.01, 0.02, 0.03, 0.05])
    ap.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE)
    ap.add_argument("--min-magnitude", type=float, default=DEFAULT_MIN_MAGNITUDE)
    ap.add_argument(
        "--stock-merge",
        action="store_true",
        help="Otava's own merge step (re-tests only the right neighbour of a dropped point)",
    )
    ap.add_argument("--quick", action="store_true", help="the main table only (no step sizes)")
    args = ap.parse_args()
    try:
        import otava.analysis  # noqa: F401
    except ImportError:
        sys.exit("the detector needs Apache Otava: pip install -e '.[otava]'")
    if args.stock_merge:
        changes._merge = _stock_merge  # type: ignore[assignment]
    p, m = args.max_pvalue, args.min_magnitude
    t0 = time.perf_counter()
    print(
        f"detector: Otava split + {'Otava' if args.stock_merge else 'pytest-kimi'} merge, "
        f"max_pvalue {p:g}, min_magnitude {m:g}, window {changes.DEFAULT_WINDOW}; "
        f"{args.sims} series per cell, seed {args.seed}"
    )
    print()
    print(
        "| noise | unchanged 20 runs: false | 50 runs | 100 runs | -15% step: found | "
        "at the run | drift 2%/run, last 10 of 20 | drift then plateau (30) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, sigma in enumerate(args.sigmas):
        rng = np.random.default_rng([args.seed, k])
        row = [
            run_cell(rng, args.sims, 20, sigma, _flat, any_change, p, m),
            run_cell(rng, args.sims, 50, sigma, _flat, any_change, p, m),
            run_cell(rng, args.sims, 100, sigma, _flat, any_change, p, m),
            run_cell(rng, args.sims, 20, sigma, _step(10, 0.15), any_change, p, m),
            run_cell(rng, args.sims, 20, sigma, _step(10, 0.15), exactly_at(10), p, m),
            run_cell(rng, args.sims, 20, sigma, _drift(10, 10, 0.02), slower_within(10, 19), p, m),
            run_cell(rng, args.sims, 30, sigma, _drift(10, 10, 0.02), slower_within(10, 20), p, m),
        ]
        print(f"| {sigma:.0%} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
    if not args.quick:
        print()
        print("Step sizes (20 runs, step at run 10): share of series with a change named")
        print()
        drops = (0.03, 0.05, 0.08, 0.10, 0.15, 0.20)
        print("| noise | " + " | ".join(f"-{d:.0%}" for d in drops) + " |")
        print("|---:|" + "---:|" * len(drops))
        for k, sigma in enumerate(args.sigmas):
            rng = np.random.default_rng([args.seed, 100 + k])
            row = [
                run_cell(rng, args.sims, 20, sigma, _step(10, d), any_change, p, m) for d in drops
            ]
            print(f"| {sigma:.0%} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
        print()
        print("Late steps (-15% in the last k of 20 runs): share found at the right run")
        print()
        lates = (1, 2, 3, 5)
        print("| noise | " + " | ".join(f"k={k}" for k in lates) + " |")
        print("|---:|" + "---:|" * len(lates))
        for k, sigma in enumerate(args.sigmas):
            rng = np.random.default_rng([args.seed, 200 + k])
            row = [
                run_cell(rng, args.sims, 20, sigma, _step(20 - j, 0.15), exactly_at(20 - j), p, m)
                for j in lates
            ]
            print(f"| {sigma:.0%} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
    print()
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
