"""What a CI job on the deploy gate decides, by simulation: three ways to judge a deployment.

Each cell simulates a deployment whose launches differ by a lognormal factor (the *session*
or *launch* noise: 0.5%, 1%, 2%, 3%) with 1% trial noise inside a launch, and a true change
(0, -5% at the tolerance, -10%, -15%), judged by the plugin's own functions:

(a) ``stored-fresh``: a stored baseline (10 trials, one launch) on a fresh install: the gate
    *assumes* the default 3% session noise, which cannot vouch for ``pass``
    (:func:`pytest_kimi.gate.policy.unvouched`); the current run follows the adaptive trial
    policy (``bench/stat_power.py``'s replay of :func:`decide_batch`).
(b) ``stored-calibrated``: the same, after ``kimi-perf calibrate`` measured the noise from 5
    launches (:func:`pytest_kimi.gate.stats.estimate_session_sigma`, rounded up to half a
    percent as the history's figure is): that measured figure is the gate's.
(c) ``paired``: the deploy gate, reference and candidate launched in ABBA blocks (3 trials a
    launch) and judged sequentially (:func:`pytest_kimi.gate.paired.run_sequential`) under a
    budget of ``--max-launches``.

Per cell: P(green job) under the README's CI recipe (``--perf-strict``: green only on
``pass`` or ``improved``) and under the default flags (``underpowered`` a warning too),
P(``regression``), P(a ``pass`` word beside an estimate beyond the tolerance) -- which must
be 0 everywhere -- and the mean launches of the judged run (the stored baseline's recording
and (b)'s calibration are paid once, not per run, and said apart).

    python bench/deploy_gate.py [--sims 2000] [--seed 1] [--max-launches 12]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stat_power import Gate, _v2_adaptive  # noqa: E402  (the adaptive replay, shared)

from pytest_kimi.gate import paired  # noqa: E402
from pytest_kimi.gate.policy import GateSettings, unvouched  # noqa: E402
from pytest_kimi.gate.session_noise import gate_sigma  # noqa: E402
from pytest_kimi.gate.session_noise import estimate_session_sigma  # noqa: E402
from pytest_kimi.gate.two_sample import DEFAULT_TOLERANCE  # noqa: E402
from pytest_kimi.verdicts import Verdict  # noqa: E402

NOISES = (0.005, 0.01, 0.02, 0.03)
CHANGES = (0.0, -0.05, -0.10, -0.15)
WITHIN = 0.01
BASELINE_TRIALS = 10
PAIRED_TRIALS = 3
CALIBRATION_LAUNCHES = 5


@dataclass(frozen=True, slots=True)
class CellResult:
    green_strict: float
    green_default: float
    regression: float
    pass_beyond: float
    launches: float
    trials: float


def _summarise(
    verdicts: np.ndarray, estimates: np.ndarray, launches: np.ndarray, trials: np.ndarray
) -> CellResult:
    beyond = estimates < 1.0 - DEFAULT_TOLERANCE
    green_strict = np.isin(verdicts, (Verdict.PASS.value, Verdict.IMPROVED.value))
    green_default = np.array([not Verdict(v).fails() for v in verdicts])
    return CellResult(
        green_strict=float(green_strict.mean()),
        green_default=float(green_default.mean()),
        regression=float((verdicts == Verdict.REGRESSION.value).mean()),
        pass_beyond=float(((verdicts == Verdict.PASS.value) & beyond).mean()),
        launches=float(launches.mean()),
        trials=float(trials.mean()),
    )


def stored(
    rng: np.random.Generator, sims: int, noise: float, change: float, calibrated: bool
) -> CellResult:
    """Cells (a) and (b): one launch against a stored 10-trial baseline."""
    base = np.exp(rng.normal(0.0, WITHIN, (sims, BASELINE_TRIALS)))
    launch = rng.normal(0.0, noise, (sims, 1))
    cur = (1.0 + change) * np.exp(launch + rng.normal(0.0, WITHIN, (sims, 10)))
    if calibrated:
        sigmas = np.empty(sims)
        for i in range(sims):
            cal = np.exp(
                rng.normal(0.0, noise, (CALIBRATION_LAUNCHES, 1))
                + rng.normal(0.0, WITHIN, (CALIBRATION_LAUNCHES, BASELINE_TRIALS))
            )
            est = estimate_session_sigma([list(row) for row in cal])
            sigmas[i] = gate_sigma(est)
        verdicts = np.empty(sims, dtype="<U12")
        trials = np.empty(sims)
        for s in np.unique(sigmas):
            rows = np.flatnonzero(sigmas == s)
            v, t = _v2_adaptive(base[rows], cur[rows], Gate(session_sigma=float(s)))
            verdicts[rows], trials[rows] = v, t
    else:
        verdicts, trials = _v2_adaptive(base, cur, Gate())
        settings = GateSettings(sigma_vouched=False)
        verdicts = np.array([unvouched(Verdict(v), settings).value for v in verdicts])
    n = trials.astype(int)
    est = np.array(
        [math.exp(np.log(cur[i, : n[i]]).mean() - np.log(base[i]).mean()) for i in range(sims)]
    )
    return _summarise(verdicts, est, np.ones(sims), trials)


def paired_cell(
    rng: np.random.Generator, sims: int, noise: float, change: float, max_launches: int
) -> CellResult:
    """Cell (c): the paired sequential experiment; a launch's figure is its trials' mean."""
    blocks = max_launches // 2

    def launches(shift: float) -> np.ndarray:
        trials = rng.normal(0.0, WITHIN, (sims, blocks, PAIRED_TRIALS))
        return np.exp(shift + rng.normal(0.0, noise, (sims, blocks)) + trials.mean(axis=2))

    ref, cand = launches(0.0), launches(math.log1p(change))
    verdicts = np.empty(sims, dtype="<U12")
    est = np.empty(sims)
    used = np.empty(sims)
    for i in range(sims):
        out = paired.run_sequential(ref[i], cand[i], max_blocks=blocks)
        verdicts[i] = out.comparison.verdict.value
        est[i] = out.comparison.ratio
        used[i] = out.comparison.launches
    return _summarise(verdicts, est, used, used * PAIRED_TRIALS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-launches", type=int, default=paired.DEFAULT_MAX_LAUNCHES)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(
        f"# {args.sims} simulated runs a cell, seed {args.seed}; trial noise {WITHIN:.0%}; "
        f"paired budget {args.max_launches} launches, {PAIRED_TRIALS} trials a launch"
    )
    print(
        "scenario            noise  change  green(CI recipe)  green(defaults)  regression  "
        "pass-beyond-tol  launches  trials"
    )
    for scenario in ("stored-fresh", "stored-calibrated", "paired"):
        for noise in NOISES:
            for change in CHANGES:
                if scenario == "paired":
                    r = paired_cell(rng, args.sims, noise, change, args.max_launches)
                else:
                    r = stored(rng, args.sims, noise, change, scenario == "stored-calibrated")
                print(
                    f"{scenario:<18} {noise:>6.1%} {change:>+7.0%} {r.green_strict:>17.1%} "
                    f"{r.green_default:>16.1%} {r.regression:>11.1%} {r.pass_beyond:>16.1%} "
                    f"{r.launches:>9.2f} {r.trials:>7.1f}"
                )
    print(
        f"# (b) pays {CALIBRATION_LAUNCHES} calibration launches once; (a) and (b) one "
        f"recording of {BASELINE_TRIALS} trials.  {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
