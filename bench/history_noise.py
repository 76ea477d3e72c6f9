"""Coverage of the history's session-noise interval (pytest_kimi.history.noise) on synthetic
histories built the way the store hands them over.

A history is K runs of a deployment; each run is a server start whose factor
``exp(N(0, tau))`` every level of the run shares, and each level's 3 trials get their own
``exp(N(0, within))`` (within = 1%).  The truth the estimate aims at is the gate's
``session_sigma = sqrt(2) * tau``.  Scenarios:

* ``one build``: every run the same build;
* ``deploy``: from the middle run the deployment is 15% slower and its provenance says so
  (``sim.slowdown``): two builds;
* ``unrecorded``: the same 15% step with nothing in the provenance (a driver update): only
  the change point splits the builds;
* ``naive``: the ``deploy`` histories with every run taken as one build, for contrast.

For each: how often the per-level (first level) and the pooled 90% intervals cover the
truth, and the median estimate.  The runs' seeds, ports and commits differ every run, as in a
real history, and must not split builds.

    python bench/history_noise.py [--sims N] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimi.history.model import LevelSeries, Point, RunInfo  # noqa: E402
from pytest_kimi.history.noise import estimate_noise  # noqa: E402

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)
LEVELS = {"C=1": 65.0, "C=16": 700.0, "C=64": 1300.0}


def synth(
    rng: np.random.Generator,
    runs: int,
    levels: int,
    tau: float,
    within: float,
    scenario: str,
) -> list[LevelSeries]:
    names = list(LEVELS)[:levels]
    points: dict[str, list[Point]] = {n: [] for n in names}
    for i in range(runs):
        after = scenario in ("deploy", "unrecorded", "naive") and i >= runs // 2
        slowdown = 1.15 if after and scenario != "unrecorded" else 1.0
        if scenario == "naive":
            slowdown = 1.0  # the provenance hides the deploy: every run one build
        prov = {
            "model": "m",
            "server_info.port": 1000 + i,
            "server_info.sim.seed": i,
            "server_info.sim.slowdown": slowdown,
        }
        run = RunInfo(id=i + 1, time=T0 + timedelta(hours=i), commit=f"c{i}", provenance=prov)
        factor = (1 / 1.15 if after else 1.0) * math.exp(rng.normal(0.0, tau))
        for n in names:
            xs = tuple(
                float(LEVELS[n] * factor * math.exp(rng.normal(0.0, within))) for _ in range(3)
            )
            points[n].append(Point(run=run, tok_s=statistics.median(xs), trials=xs))
    return [LevelSeries("t", n, {"level": n}, "sim", tuple(points[n])) for n in names]


def cell(
    rng: np.random.Generator, sims: int, runs: int, levels: int, tau: float, scenario: str
) -> tuple[float, float, float, float]:
    truth = math.sqrt(2) * tau
    one = pool = 0
    estimates = []
    widths = []
    for _ in range(sims):
        series = synth(rng, runs, levels, tau, 0.01, scenario)
        # naive: no change points either (every run one build, the step included)
        report = estimate_noise(series, changes=[] if scenario == "naive" else None)
        first = report.series[0].estimate
        one += first.low <= truth <= first.high
        assert report.pooled is not None
        pool += report.pooled.low <= truth <= report.pooled.high
        estimates.append(report.pooled.sigma)
        widths.append(report.pooled.high / max(report.pooled.low, 1e-9))
    return one / sims, pool / sims, float(np.median(estimates)), float(np.median(widths))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sims", type=int, default=500, help="histories per cell (default 500)")
    ap.add_argument("--seed", type=int, default=20261202)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(
        f"90% intervals; {args.sims} histories per cell, seed {args.seed}; within-run 1%, 3 trials"
    )
    print()
    print(
        "| scenario | runs | levels | tau (truth sqrt2*tau) | per-level covers | pooled covers "
        "| median pooled estimate | median high/low |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    k = 0
    for scenario in ("one build", "deploy", "unrecorded", "naive"):
        for runs in (4, 6, 10, 20) if scenario == "one build" else (10, 20):
            for tau in (0.02, 0.05) if scenario == "one build" else (0.02,):
                levels = 3
                k += 1
                rng = np.random.default_rng([args.seed, k])
                one, pool, est, width = cell(rng, args.sims, runs, levels, tau, scenario)
                print(
                    f"| {scenario} | {runs} | {levels} | {tau:g} ({math.sqrt(2) * tau:.4f}) | "
                    f"{one:.3f} | {pool:.3f} | {est:.4f} | {width:.1f} |"
                )
    print()
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
