"""Power simulation of the throughput gate (pytest_kimi.gate.stats) under realistic serving noise.

Each simulated comparison draws a baseline session and a current session:

* within-session noise: every trial's tok/s gets an independent lognormal factor (sd 2%);
* session-to-session noise: the current session as a whole differs from the baseline session
  by one lognormal factor (sd 3%), shared by all its trials -- invisible in either sample's
  scatter, which is exactly what makes naive tests raise false alarms;
* a true drop: the current deployment is ``(1 - drop)`` times as fast.

For each true drop and trial scheme the table shows the share of each verdict and the mean
number of current trials per level.  Fixed schemes use the same number of trials on both
sides; the adaptive scheme follows the plugin's protocol against a baseline of
``--baseline-trials`` trials (default 10: a baseline recorded with no baseline to compare
against runs the whole schedule).

``--protocol v2`` (default) is the gate of pytest_kimi.gate.stats: variance-driven trials
(:func:`decide_batch` until powered, futile or at max_trials), then one test, and ``pass``
only when a drop of ``detectable_drop`` would have been caught with probability ``power``.
``--protocol v1`` re-implements the gate before it (kept here so that before/after stays
reproducible): looks at 3 and 10 trials with alpha split 10%/90%, early stop on a clear
regression, a clear pass (equivalence-style test: ratio significantly above 1 - tol) or
futility, verdicts regression > improved > pass > underpowered (min detectable drop at power
0.80 from ratio 1 above the tolerance) > inconclusive.

The last lines reproduce the figure of the issue "A gate that can say pass with its own
defaults": 300 comparisons of 10 vs 10 trials with 2% trial noise and no change.

    python bench/stat_power.py [--protocol v1|v2] [--sims N] [--seed S] [--drops 0.05 ...]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# noqa E402 below: the path is set up above for a plain checkout
from pytest_kimi.gate.trial_decision import decide_batch  # noqa: E402
from pytest_kimi.gate.two_sample import (  # noqa: E402
    DEFAULT_ALPHA,
    DEFAULT_DETECTABLE_DROP,
    DEFAULT_MAX_TRIALS,
    DEFAULT_MIN_TRIALS,
    DEFAULT_POWER,
    DEFAULT_SESSION_SIGMA,
    DEFAULT_TOLERANCE,
    compare_batch,
    smallest_vouchable_drop,
)
from pytest_kimi.logscale import MIN_LOG_SD  # noqa: E402
from pytest_kimi.verdicts import Verdict  # noqa: E402

DROPS: tuple[float, ...] = (0.0, 0.02, 0.05, 0.08, 0.10, 0.15, 0.20, 0.30)
FIXED: tuple[int, ...] = (3, 5, 10)
PROTOCOLS: tuple[str, ...] = ("v2", "v1")
COLUMNS: dict[str, tuple[str, ...]] = {
    "v2": ("pass", "regression", "improved", "inconclusive", "underpowered"),
    "v1": ("pass", "regression", "improved", "underpowered", "inconclusive"),
}

# The gate before v2 (protocol v1), for the before/after comparison.
V1_POWER = 0.80
V1_FUTILITY = 0.10
V1_LOOK_WEIGHTS = (0.1, 0.9)


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
    power: float = DEFAULT_POWER
    detectable_drop: float = DEFAULT_DETECTABLE_DROP
    design: bool = True
    """Judge an extended level by the null of the procedure (stats.Design); False tests the
    extended data as if its trial count were fixed (``--no-design``: what that would cost)."""

    def kwargs(self) -> dict[str, float]:
        return dict(
            tolerance=self.tolerance,
            alpha=self.alpha,
            session_sigma=self.session_sigma,
            power=self.power,
            detectable_drop=self.detectable_drop,
        )


@dataclass(slots=True)
class Cell:
    """Outcome of ``sims`` comparisons at one true drop under one scheme."""

    sims: int
    verdicts: dict[str, float] = field(default_factory=dict)
    """Share of each verdict."""
    mean_trials: float = 0.0
    """Mean current trials per level."""

    def share(self, verdict: str) -> float:
        return self.verdicts.get(verdict, 0.0)

    @property
    def flagged(self) -> float:
        return self.share(Verdict.REGRESSION.value)


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


# --------------------------------------------------------------------------- protocol v2


def _v2_adaptive(base: np.ndarray, cur: np.ndarray, gate: Gate) -> tuple[np.ndarray, np.ndarray]:
    """decide_batch until every row stops; rows asking for the same count move together."""
    sims = base.shape[0]
    verdicts = np.empty(sims, dtype="<U12")
    trials = np.zeros(sims)
    # the design of each row: its trials at the variance rule's first stop (the look at the
    # estimate) and what an undecided row is extended to (stats.Design)
    interim = np.zeros(sims, dtype=np.int64)
    extend = np.zeros(sims, dtype=np.int64)
    pending: dict[int, np.ndarray] = {min(gate.min_trials, gate.max_trials): np.arange(sims)}
    while pending:
        n = min(pending)
        rows = pending.pop(n)
        dec = decide_batch(
            base[rows],
            cur[rows, :n],
            min_trials=gate.min_trials,
            max_trials=gate.max_trials,
            **gate.kwargs(),
        )
        first = (interim[rows] == 0) & (dec.reason != "continue")
        looked = rows[first]
        interim[looked] = n
        can = np.isin(dec.reason[first], ("powered", "undecided"))
        extend[looked] = np.where(can, gate.max_trials, n)
        done = rows[dec.stop]
        if done.size:
            design = (
                {
                    "interim_trials": np.where(interim[done] > 0, interim[done], n),
                    "extend_to": np.where(interim[done] > 0, extend[done], n),
                }
                if gate.design
                else {}
            )
            verdicts[done] = compare_batch(
                base[done], cur[done, :n], **design, **gate.kwargs()
            ).verdict
            trials[done] = n
        for k in np.unique(dec.next_trials[~dec.stop]):
            more = rows[~dec.stop & (dec.next_trials == k)]
            pending[n + int(k)] = np.concatenate([pending.get(n + int(k), more[:0]), more])
    return verdicts, trials


# --------------------------------------------------------------------------- protocol v1


def _v1_verdicts(base: np.ndarray, cur: np.ndarray, gate: Gate, weight: float) -> np.ndarray:
    """The v1 verdicts at the look whose alpha share is ``weight`` (single level)."""
    res = compare_batch(base, cur, tolerance=gate.tolerance, session_sigma=gate.session_sigma)
    d, se, df = np.log(res.ratio), res.se_log, res.df
    m_lo, m_hi = math.log1p(-gate.tolerance), math.log1p(gate.tolerance)
    p_reg = np.minimum(1.0, st.t.cdf((d - m_lo) / se, df) / weight)
    p_pass = np.minimum(1.0, st.t.sf((d - m_lo) / se, df) / weight)
    p_imp = np.minimum(1.0, st.t.sf((d - m_hi) / se, df) / weight)
    k = st.t.ppf(1.0 - gate.alpha * weight, df) + st.t.ppf(V1_POWER, df)
    mdd = -np.expm1(-k * se)
    out = np.full(d.shape, Verdict.INCONCLUSIVE.value, dtype="<U12")
    out[mdd > gate.tolerance] = Verdict.UNDERPOWERED.value
    out[p_pass <= gate.alpha] = Verdict.PASS.value
    out[p_imp <= gate.alpha] = Verdict.IMPROVED.value
    out[p_reg <= gate.alpha] = Verdict.REGRESSION.value
    return out


def _v1_stops_early(base: np.ndarray, cur: np.ndarray, gate: Gate) -> np.ndarray:
    """v1's early look: clear regression, clear pass, or futility (conditional power of
    either at the final look < 10% under the current trend)."""
    w0, w1 = V1_LOOK_WEIGHTS
    n_b, n_c, n_f = base.shape[1], cur.shape[1], gate.max_trials
    res = compare_batch(base, cur, tolerance=gate.tolerance, session_sigma=gate.session_sigma)
    d, se, df = np.log(res.ratio), res.se_log, res.df
    m = math.log1p(-gate.tolerance)
    t_lo = (d - m) / se
    clear = (st.t.cdf(t_lo, df) <= gate.alpha * w0) | (st.t.sf(t_lo, df) <= gate.alpha * w0)
    var_b = np.maximum(np.log(base).var(axis=1, ddof=1), MIN_LOG_SD**2)
    var_c = np.maximum(np.log(cur).var(axis=1, ddof=1), MIN_LOG_SD**2)
    wb = var_b / n_b
    se_fin2 = gate.session_sigma**2 + wb + var_c / n_f
    df_fin = se_fin2**2 / (wb**2 / (n_b - 1) + (var_c / n_f) ** 2 / (n_f - 1))
    se_fin = np.sqrt(se_fin2)
    tau = np.sqrt(var_c * (n_f - n_c)) / n_f
    c = st.t.ppf(1.0 - gate.alpha * w1, df_fin)
    cp_reg = st.norm.cdf((m - c * se_fin - d) / tau)
    cp_pass = st.norm.cdf((d - m - c * se_fin) / tau)
    return np.asarray(clear | (np.maximum(cp_reg, cp_pass) < V1_FUTILITY))


def _v1_adaptive(base: np.ndarray, cur: np.ndarray, gate: Gate) -> tuple[np.ndarray, np.ndarray]:
    n0, n1 = gate.min_trials, gate.max_trials
    stop = _v1_stops_early(base, cur[:, :n0], gate)
    verdicts = np.empty(base.shape[0], dtype="<U12")
    trials = np.where(stop, n0, n1).astype(float)
    if stop.any():
        verdicts[stop] = _v1_verdicts(base[stop], cur[stop, :n0], gate, V1_LOOK_WEIGHTS[0])
    if (~stop).any():
        verdicts[~stop] = _v1_verdicts(base[~stop], cur[~stop, :n1], gate, V1_LOOK_WEIGHTS[1])
    return verdicts, trials


# --------------------------------------------------------------------------- schemes


def run_fixed(
    rng: np.random.Generator,
    sims: int,
    n: int,
    drop: float,
    noise: Noise,
    gate: Gate,
    protocol: str = "v2",
) -> Cell:
    """``n`` trials on both sides, one test at the full alpha."""
    base, cur = draw(rng, sims, n, n, drop, noise)
    if protocol == "v1":
        verdicts = _v1_verdicts(base, cur, gate, 1.0)
    else:
        verdicts = compare_batch(base, cur, **gate.kwargs()).verdict
    return Cell(sims=sims, verdicts=_shares(verdicts), mean_trials=float(n))


def run_adaptive(
    rng: np.random.Generator,
    sims: int,
    n_baseline: int,
    drop: float,
    noise: Noise,
    gate: Gate,
    protocol: str = "v2",
) -> Cell:
    """The plugin's protocol against a baseline of ``n_baseline`` trials."""
    base, cur = draw(rng, sims, n_baseline, gate.max_trials, drop, noise)
    run = _v1_adaptive if protocol == "v1" else _v2_adaptive
    verdicts, trials = run(base, cur, gate)
    return Cell(sims=sims, verdicts=_shares(verdicts), mean_trials=float(trials.mean()))


def run_table(
    sims: int,
    seed: int,
    *,
    noise: Noise = Noise(),
    gate: Gate = Gate(),
    n_baseline: int | None = None,
    drops: tuple[float, ...] = DROPS,
    protocol: str = "v2",
) -> dict[tuple[float, str], Cell]:
    """All cells; each cell has its own child generator so cells are reproducible alone."""
    n_base = gate.max_trials if n_baseline is None else n_baseline
    schemes = ["adaptive"] + [f"fixed {n}" for n in FIXED]
    seeds = np.random.SeedSequence(seed).spawn(len(drops) * len(schemes))
    out: dict[tuple[float, str], Cell] = {}
    for i, drop in enumerate(drops):
        for j, scheme in enumerate(schemes):
            rng = np.random.default_rng(seeds[i * len(schemes) + j])
            if scheme == "adaptive":
                out[drop, scheme] = run_adaptive(rng, sims, n_base, drop, noise, gate, protocol)
            else:
                n = int(scheme.split()[1])
                out[drop, scheme] = run_fixed(rng, sims, n, drop, noise, gate, protocol)
    return out


def issue_figure(seed: int, protocol: str, comparisons: int = 300) -> dict[str, int]:
    """The issue's figure: 10 vs 10 trials of 2% noise, no change, ``comparisons`` times."""
    rng = np.random.default_rng([seed, 300])  # the same draws for both protocols
    noise = Noise(session_sigma=0.0, within_sigma=0.02)
    cell = run_fixed(rng, comparisons, 10, 0.0, noise, Gate(), protocol)
    return {v: round(s * comparisons) for v, s in sorted(cell.verdicts.items())}


def format_report(
    table: dict[tuple[float, str], Cell],
    sims: int,
    seed: int,
    noise: Noise,
    gate: Gate,
    n_baseline: int,
    protocol: str = "v2",
) -> str:
    schemes = sorted({s for _, s in table}, key=lambda s: (s != "adaptive", len(s), s))
    drops = sorted({d for d, _ in table})
    cols = COLUMNS[protocol]
    if protocol == "v1":
        setting = (
            f"power {V1_POWER} at the tolerance, looks ({gate.min_trials}, {gate.max_trials}) "
            f"alpha split {V1_LOOK_WEIGHTS}, futility {V1_FUTILITY}"
        )
    else:
        floor = smallest_vouchable_drop(gate.tolerance, gate.alpha, gate.session_sigma, gate.power)
        setting = (
            f"detectable_drop {gate.detectable_drop:.0%}, power {gate.power} "
            f"(session floor {floor:.1%}), trials {gate.min_trials}..{gate.max_trials} "
            "variance-driven"
        )
    lines = [
        f"protocol {protocol}; noise: session {noise.session_sigma:.0%}, within-session "
        f"{noise.within_sigma:.0%}; gate: tolerance {gate.tolerance:.0%}, alpha {gate.alpha}, "
        f"session_sigma {gate.session_sigma}, {setting}; {sims} sims per cell, seed {seed}; "
        f"adaptive baseline {n_baseline} trials",
        "",
        "| true drop | scheme | " + " | ".join(cols) + " | mean trials |",
        "|---:|---|" + "---:|" * (len(cols) + 1),
    ]
    for d in drops:
        for s in schemes:
            cell = table[d, s]
            shares = " | ".join(f"{cell.share(c):.3f}" for c in cols)
            lines.append(f"| {d:.0%} | {s} | {shares} | {cell.mean_trials:.2f} |")
    other = {v for c in table.values() for v in c.verdicts} - set(cols)
    if other:
        lines.append(f"(also: {sorted(other)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=PROTOCOLS, default="v2")
    parser.add_argument("--sims", type=int, default=10000, help="comparisons per cell")
    parser.add_argument("--seed", type=int, default=20240917)
    parser.add_argument("--drops", type=float, nargs="+", default=list(DROPS))
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
    parser.add_argument("--detectable-drop", type=float, default=DEFAULT_DETECTABLE_DROP)
    parser.add_argument("--power", type=float, default=DEFAULT_POWER)
    parser.add_argument(
        "--no-design",
        action="store_true",
        help="test an extended (undecided) level as if its trial count were fixed",
    )
    args = parser.parse_args(argv)
    noise = Noise(session_sigma=args.true_session_sigma, within_sigma=args.within_sigma)
    gate = Gate(
        tolerance=args.tolerance,
        session_sigma=args.gate_session_sigma,
        detectable_drop=args.detectable_drop,
        power=args.power,
        design=not args.no_design,
    )
    n_base = gate.max_trials if args.baseline_trials is None else args.baseline_trials
    t0 = time.perf_counter()
    table = run_table(
        args.sims,
        args.seed,
        noise=noise,
        gate=gate,
        n_baseline=n_base,
        drops=tuple(args.drops),
        protocol=args.protocol,
    )
    print(format_report(table, args.sims, args.seed, noise, gate, n_base, args.protocol))
    print(
        f"\nissue figure (10 vs 10 trials, 2% trial noise, no change, 300 comparisons, "
        f"default gate): {args.protocol} {issue_figure(args.seed, args.protocol)}"
    )
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
