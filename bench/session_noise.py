"""Coverage of the session-noise interval (pytest_kimi.gate.session_noise) over synthetic runs.

Each simulated run draws ``k`` sessions (server starts) of one deployment with ``L`` levels
and ``n`` trials per level and session, on the log scale::

    log tok/s = level effect + s_i + e_ijl,   s_i ~ N(0, tau) per session (shared by its levels),
                                               e ~ N(0, w) per trial

and asks whether the 90% interval holds the truth ``session_sigma = sqrt(2) * tau``.  Three
intervals per design:

* ``MLS`` -- what the plugin reports (:func:`pooled`; modified large-sample interval of Ting
  et al. 1990 on the between-session variance less the trial-noise part, levels averaged per
  session);
* ``chi2`` -- the textbook chi-square interval on the scatter of the session means, shifted by
  the estimated trial-noise part (what "a chi-square interval on the between-session variance
  of session means" gives when the subtraction is ignored in the interval);
* ``indep`` -- MLS, but every level counted as an independent set of sessions (what pooling
  the levels' estimates as if they were independent would claim).

The table shows coverage (share of runs whose interval holds the truth), the share missing on
each side, and the median interval, for designs from 2 to 10 sessions, trial noise below and
above the session noise, no session noise at all, and several levels.  Binomial standard
error of a coverage near 0.9 at the default 4000 runs: 0.005.

    python bench/session_noise.py [--sims N] [--seed S] [--confidence C]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimi.gate.session_noise import pooled  # noqa: E402


@dataclass(frozen=True)
class Design:
    k: int
    """sessions"""
    n: int
    """trials per level and session"""
    tau: float
    """sd of one session's log factor"""
    w: float
    """sd of one trial's log noise"""
    levels: int = 1

    def label(self) -> str:
        return (
            f"k={self.k} n={self.n} L={self.levels} tau={self.tau:.0%} w={self.w:.0%} "
            f"(sigma {math.sqrt(2) * self.tau:.3f})"
        )


DESIGNS = [
    Design(2, 3, 0.05, 0.02),
    Design(3, 3, 0.05, 0.02),
    Design(4, 3, 0.05, 0.02),
    Design(4, 3, 0.02, 0.02),
    Design(4, 3, 0.01, 0.03),
    Design(4, 3, 0.0, 0.02),
    Design(4, 10, 0.03, 0.02),
    Design(6, 3, 0.03, 0.02),
    Design(10, 3, 0.03, 0.02),
    Design(4, 3, 0.05, 0.02, levels=3),
    Design(4, 3, 0.02, 0.03, levels=5),
    Design(5, 3, 0.1, 0.05, levels=2),
]


def chi2_interval(sessions: list[list[np.ndarray]], confidence: float) -> tuple[float, float]:
    """Chi-square on the session scores' scatter, the trial-noise part subtracted as if known."""
    logs = [[np.log(t) for t in level] for level in sessions]
    k = len(logs[0])
    scores = np.mean([[x.mean() for x in level] for level in logs], axis=0)
    a = float(scores.var(ddof=1))
    within = 0.0
    for level in logs:
        dof = sum(x.size - 1 for x in level)
        var = sum(float(((x - x.mean()) ** 2).sum()) for x in level) / dof
        within += var * float(np.mean([1.0 / x.size for x in level]))
    within /= len(logs) ** 2
    alpha = (1 - confidence) / 2
    lo = (k - 1) * a / st.chi2.ppf(1 - alpha, k - 1) - within
    hi = (k - 1) * a / st.chi2.ppf(alpha, k - 1) - within
    return math.sqrt(2 * max(lo, 0.0)), math.sqrt(2 * max(hi, 0.0))


def simulate(
    design: Design, sims: int, rng: np.random.Generator, confidence: float
) -> dict[str, list[float]]:
    truth = math.sqrt(2) * design.tau
    out: dict[str, list[float]] = {}
    for _ in range(sims):
        factors = rng.normal(0, design.tau, design.k)
        data = [
            [np.exp(5 + 0.7 * lv + f + rng.normal(0, design.w, design.n)) for f in factors]
            for lv in range(design.levels)
        ]
        lists = [[list(x) for x in level] for level in data]
        mls = pooled([lists], confidence)
        indep = pooled([[level] for level in lists], confidence)
        intervals = {
            "MLS": (mls.low, mls.high),
            "chi2": chi2_interval(data, confidence),
            "indep": (indep.low, indep.high),
        }
        for name, (lo, hi) in intervals.items():
            rows = out.setdefault(name, [])
            rows.append(0.0 if lo > truth else (1.0 if hi >= truth else 2.0))
            out.setdefault(name + "_width", []).append(hi - lo)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=20240917)
    ap.add_argument("--confidence", type=float, default=0.9)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    print(
        f"{args.confidence:.0%} intervals for session_sigma; {args.sims} runs per design, "
        f"seed {args.seed}; cover = interval holds sqrt(2)*tau, truth below/above = it lies "
        "below/above the interval"
    )
    print()
    print("| design | interval | cover | truth below | truth above | median width |")
    print("|---|---|---:|---:|---:|---:|")
    for design in DESIGNS:
        res = simulate(design, args.sims, rng, args.confidence)
        for name in ("MLS", "chi2", "indep"):
            if name == "indep" and design.levels == 1:
                continue
            hits = np.array(res[name])
            print(
                f"| {design.label()} | {name} | {np.mean(hits == 1.0):.3f} | "
                f"{np.mean(hits == 0.0):.3f} | {np.mean(hits == 2.0):.3f} | "
                f"{np.median(res[name + '_width']):.3f} |"
            )
    print()
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
