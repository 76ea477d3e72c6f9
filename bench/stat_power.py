"""Power simulation of the throughput gate (pytest_kimi.gate.stats) under realistic serving noise.

Each simulated comparison draws a baseline session and a current session:

* within-session noise: every trial's tok/s gets an independent lognormal factor (sd 2%);
* session-to-session noise: the current session as a whole differs from the baseline session
  by one lognormal factor (sd 3%), shared by all its trials -- invisible in either sample's
  scatter, which is exactly what makes naive tests raise false alarms;
* a true drop: the current deployment is ``(1 - drop)`` times as fast.

For each true drop and trial scheme the table shows the share of comparisons whose verdict is
``regression``.  Fixed schemes use the same number of trials on both sides; the adaptive scheme
follows the plugin's protocol (:func:`pytest_kimi.gate.stats.decide` at looks 3 and 10) against a
baseline of ``--baseline-trials`` trials (default 10: a baseline recorded with no baseline to
compare against runs the whole schedule).

    python bench/stat_power.py [--sims N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimi.gate.stats import (  # noqa: E402  (path set up above for a plain checkout)
    DEFAULT_ALPHA,
    DEFAULT_FUTILITY,
    DEFAULT_MAX_TRIALS,
    DEFAULT_MIN_TRIALS,
    DEFAULT_SESSION_SIGMA,
    DEFAULT_TOLERANCE,
    Verdict,
    compare_batch,
    decide_batch,
    look_schedule,
)

DROPS: tuple[float, ...] = (0.0, 0.02, 0.05, 0.08, 0.10, 0.15, 0.20, 0.30)
FIXED: tuple[int, ...] = (3, 5, 10)


@dataclass(frozen=True, slots=True)
class Noise:
    """The noise the simulated serving stack has (the truth, not what the gate assumes)."""

    session_sigma: float = 0.03
    within_sigma: float = 0.02
    tok_s: float = 1000.0


@dataclass(frozen=True, slots=True)
class Gate:
    """The gate's settings (what the plugin would pass to pytest_kimi.gate.stats)."""

    tolerance: float = DEFAULT_TOLERANCE
    alpha: float = DEFAULT_ALPHA
    session_sigma: float = DEFAULT_SESSION_SIGMA
    min_trials: int = DEFAULT_MIN_TRIALS
    max_trials: int = DEFAULT_MAX_TRIALS
    futility: float = DEFAULT_FUTILITY


@dataclass(slots=True)
class Cell:
    """Outcome of ``sims`` comparisons at one true drop under one scheme."""

    sims: int
    verdicts: dict[str, float] = field(default_factory=dict)
    """Share of each verdict."""
    mean_trials: float = 0.0
    """Mean current trials per level."""

    @property
    def flagged(self) -> float:
        return self.verdicts.get(Verdict.REGRESSION.value, 0.0)


def draw(
    rng: np.random.Generator, sims: int, n_b: int, n_c: int, drop: float, noise: Noise
) -> tuple[np.ndarray, np.ndarray]:
    """Baseline (sims, n_b) and current (sims, n_c) tok/s with session and trial noise."""
    base = noise.tok_s * np.exp(rng.normal(0.0, noise.within_sigma, (sims, n_b)))
    session = rng.normal(0.0, noise.session_sigma, (sims, 1))
    cur = (
        noise.tok_s
        * (1.0 - drop)
        * np.exp(session + rng.normal(0.0, noise.within_sigma, (sims, n_c)))
    )
    return base, cur


def _shares(verdicts: np.ndarray) -> dict[str, float]:
    values, counts = np.unique(verdicts, return_counts=True)
    return {str(v): c / verdicts.size for v, c in zip(values, counts)}


def run_fixed(
    rng: np.random.Generator, sims: int, n: int, drop: float, noise: Noise, gate: Gate
) -> Cell:
    """``n`` trials on both sides, one look at the full alpha."""
    base, cur = draw(rng, sims, n, n, drop, noise)
    res = compare_batch(
        base, cur, tolerance=gate.tolerance, alpha=gate.alpha, session_sigma=gate.session_sigma
    )
    return Cell(sims=sims, verdicts=_shares(res.verdict), mean_trials=float(n))


def run_adaptive(
    rng: np.random.Generator, sims: int, n_baseline: int, drop: float, noise: Noise, gate: Gate
) -> Cell:
    """The plugin's protocol: decide() at each look, final verdict at the look it stopped."""
    looks = look_schedule(gate.min_trials, gate.max_trials)
    base, cur = draw(rng, sims, n_baseline, looks[-1], drop, noise)
    verdicts = np.empty(sims, dtype="<U12")
    trials = np.zeros(sims)
    active = np.arange(sims)
    for look, n in enumerate(looks):
        b, c = base[active], cur[active, :n]
        dec = decide_batch(
            b,
            c,
            look=look,
            tolerance=gate.tolerance,
            alpha=gate.alpha,
            session_sigma=gate.session_sigma,
            min_trials=gate.min_trials,
            max_trials=gate.max_trials,
            futility=gate.futility,
        )
        done = active[dec.stop]
        if done.size:
            res = compare_batch(
                base[done],
                cur[done, :n],
                tolerance=gate.tolerance,
                alpha=gate.alpha,
                session_sigma=gate.session_sigma,
                alpha_weight=dec.alpha_weight,
            )
            verdicts[done] = res.verdict
            trials[done] = n
        active = active[~dec.stop]
        if not active.size:
            break
    return Cell(sims=sims, verdicts=_shares(verdicts), mean_trials=float(trials.mean()))


def run_table(
    sims: int,
    seed: int,
    *,
    noise: Noise = Noise(),
    gate: Gate = Gate(),
    n_baseline: int | None = None,
    drops: tuple[float, ...] = DROPS,
) -> dict[tuple[float, str], Cell]:
    """All cells; each cell has its own child generator so cells are reproducible alone."""
    n_base = gate.max_trials if n_baseline is None else n_baseline
    schemes = [f"fixed {n}" for n in FIXED] + ["adaptive"]
    seeds = np.random.SeedSequence(seed).spawn(len(drops) * len(schemes))
    out: dict[tuple[float, str], Cell] = {}
    for i, drop in enumerate(drops):
        for j, scheme in enumerate(schemes):
            rng = np.random.default_rng(seeds[i * len(schemes) + j])
            if scheme == "adaptive":
                out[drop, scheme] = run_adaptive(rng, sims, n_base, drop, noise, gate)
            else:
                out[drop, scheme] = run_fixed(rng, sims, int(scheme.split()[1]), drop, noise, gate)
    return out


def format_report(
    table: dict[tuple[float, str], Cell],
    sims: int,
    seed: int,
    noise: Noise,
    gate: Gate,
    n_baseline: int,
) -> str:
    schemes = sorted({s for _, s in table}, key=lambda s: (s == "adaptive", len(s), s))
    drops = sorted({d for d, _ in table})
    looks = look_schedule(gate.min_trials, gate.max_trials)
    lines = [
        f"noise: session {noise.session_sigma:.0%}, within-session {noise.within_sigma:.0%}; "
        f"gate: tolerance {gate.tolerance:.0%}, alpha {gate.alpha}, session_sigma "
        f"{gate.session_sigma}, looks {looks}, futility {gate.futility}; "
        f"{sims} sims per cell, seed {seed}; adaptive baseline {n_baseline} trials",
        "",
        "share flagged as regression:",
        "",
        "| true drop | " + " | ".join(schemes) + " |",
        "|---:|" + "---:|" * len(schemes),
    ]
    for d in drops:
        lines.append(
            f"| {d:.0%} | " + " | ".join(f"{table[d, s].flagged:.3f}" for s in schemes) + " |"
        )
    lines += ["", "adaptive scheme, mean current trials per level (fixed 10 uses 10):", ""]
    lines += ["| true drop | mean trials | verdicts |", "|---:|---:|---|"]
    for d in drops:
        cell = table[d, "adaptive"]
        mix = ", ".join(
            f"{v} {s:.2f}" for v, s in sorted(cell.verdicts.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"| {d:.0%} | {cell.mean_trials:.2f} | {mix} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=10000, help="comparisons per cell")
    parser.add_argument("--seed", type=int, default=20240917)
    parser.add_argument(
        "--baseline-trials",
        type=int,
        default=None,
        help="baseline trials for the adaptive scheme (default max_trials)",
    )
    parser.add_argument("--true-session-sigma", type=float, default=Noise().session_sigma)
    parser.add_argument("--within-sigma", type=float, default=Noise().within_sigma)
    parser.add_argument("--gate-session-sigma", type=float, default=DEFAULT_SESSION_SIGMA)
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument("--futility", type=float, default=DEFAULT_FUTILITY)
    args = parser.parse_args(argv)
    noise = Noise(session_sigma=args.true_session_sigma, within_sigma=args.within_sigma)
    gate = Gate(
        tolerance=args.tolerance, session_sigma=args.gate_session_sigma, futility=args.futility
    )
    n_base = gate.max_trials if args.baseline_trials is None else args.baseline_trials
    t0 = time.perf_counter()
    table = run_table(args.sims, args.seed, noise=noise, gate=gate, n_baseline=n_base)
    print(format_report(table, args.sims, args.seed, noise, gate, n_base))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
