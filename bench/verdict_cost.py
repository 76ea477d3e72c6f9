"""What a perf verdict costs a deployment: server time per scenario, trial protocol and level.

    python bench/verdict_cost.py [--protocol stationary|whole-requests|both] [--speed S]
                                 [--sessions N] [--noise 0.0212] [--sims 2000]

Runs the example suite (``tests/perf/``: one stream at 512 tokens, then C=1..256 at 2048
tokens) through the plugin itself -- ``pytest -m perf --endpoint=sim:...`` in a subprocess, with
a baseline directory of its own -- against the simulator shaped like the seeds' EP8 deployment,
in three scenarios:

1. **record**: ``--update-baselines`` (every level runs ``--perf-max-trials`` trials);
2. **unchanged**: the same deployment in another session (another server start, so another
   session-noise factor: the simulator's ``noise`` knob);
3. **slower**: a server 15% slower (``slowdown=1/0.85``), also in another session.

For each it reports, per level, the server time the measurement used **in the simulator's own
clock** (so the figure is EP8 seconds, whatever the speed), the trials it ran and the verdicts;
``--sessions N`` repeats the two comparison scenarios over N sessions.  The figure is the
plugin's own accounting (``server_time_s`` in its JSON: every level from its first request to its
last, warm-up included); the simulator's busy time (``/sim/stats`` ``busy_s``) is shown beside it.

Then, because N real sessions are few for a false-alarm rate, ``--sims`` simulated sessions per
level: the within-session spread each level showed in the runs above, a lognormal session
factor of ``--session-sigma`` (the gate's model: the sd of the log ratio of two sessions), and
the plugin's trial policy and gate (:mod:`pytest_kimi.gate.stats`, defaults) -- giving the
false-alarm rate (no change), the power (a 15% drop), and the expected trials, hence expected
server time, of a verdict under each protocol.

``--matrix`` (issue 21) prices verdicts over workload shapes instead of the example suite:
one-level tests at 128 and 2048 tokens, a C=1/8/32 sweep at 256 tokens, five-level sweeps
(C=1..256) at 128 and 2048 tokens, C=256 at 512 and C=16/64 at 1024.  Each shape is recorded
once per protocol through the plugin (``--update-baselines``: 10 trials per level), which gives
each level's within-session spread and the EP8 seconds of one of its trials; then ``--sims``
simulated comparisons per scenario -- unchanged, at the tolerance (5% slower), 10% and 15%
slower -- with a session noise of 3% and of 1% (the gate told the truth, as a measured
``--perf-session-sigma`` does), through the plugin's trial policy (the undecided extension
included) and :func:`family_verdicts.compare_family` with its designs.  It prints, per shape and noise,
the share of tests flagged (any level or the common shift a ``regression``), the least share
of ``pass`` over a test's levels, the share where every level passed, and the EP8 seconds per
verdict of each protocol and their ratio.

Speeds: the whole-requests protocol is timed by whole requests, so any speed gives the same
EP8 seconds (default 20); a stationary trial is held to at least its wall-clock floors (the
client's clock must resolve its window: :mod:`pytest_kimi.measure.time_box`), which at high
speed inflates its EP8 seconds, so it runs at a speed where EP8's own steps are longer than
that floor (default 4 for the example suite, whose boxes are 128 steps; 1 for the matrix,
whose shortest are 16).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kimi.gate import family_verdicts, trial_decision, two_sample  # noqa: E402
from pytest_kimi.logscale import MIN_LOG_SD  # noqa: E402
from pytest_kimi.sim.process import SimProcess  # noqa: E402
from pytest_kimi.sim.config import SimConfig  # noqa: E402
from pytest_kimi.verdicts import Verdict  # noqa: E402

SLOWER = 1 / 0.85
"""Step-time multiplier of the slower server: tok/s times 0.85, a 15% drop."""
DEFAULT_SPEEDS = {"stationary": 4.0, "whole-requests": 20.0}
MATRIX_SPEEDS = {"stationary": 1.0, "whole-requests": 20.0}
"""The matrix's: its short shapes' time boxes (16 steps of 15-20 ms at 128 tokens) are shorter
than a stationary trial's wall-clock floors at any speed above 1, which would price the floors,
not the box, in EP8 seconds; at speed 1 the simulator's steps are EP8's own."""


@dataclass(slots=True)
class LevelRun:
    test: str
    label: str
    server_s: float
    trials: int
    verdict: str
    tok_s: list[float]


@dataclass(slots=True)
class Run:
    scenario: str
    protocol: str
    session: int
    wall_s: float
    busy_s: float | None
    warmup_s: float
    levels: list[LevelRun] = field(default_factory=list)

    @property
    def server_s(self) -> float:
        return self.warmup_s + sum(lv.server_s for lv in self.levels)


def run_suite(
    protocol: str,
    scenario: str,
    session: int,
    *,
    speed: float,
    noise: float,
    baselines: Path,
    work: Path,
) -> Run:
    """One pytest session of the example suite against a simulator started here (so its own
    busy time can be read); returns what the plugin's JSON report says."""
    profile = SimConfig(
        speed=speed,
        stream_interval=8,
        noise=noise,
        seed=session + 1,
        slowdown=SLOWER if scenario == "slower" else 1.0,
    )
    out = work / f"{protocol}-{scenario}-{session}.json"
    with SimProcess(profile) as sim:
        assert sim.url is not None
        busy0 = _busy(sim.url)
        args = [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "tests" / "perf"),
            "-m",
            "perf",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--endpoint={sim.url}",
            f"--perf-protocol={protocol}",
            f"--baseline-dir={baselines}",
            "--baseline-profile=ep8",
            f"--perf-json={out}",
        ]
        if scenario == "record":
            args.append("--update-baselines=force")
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=7200)
        wall = time.perf_counter() - t0
        busy = _busy(sim.url) - busy0
    if not out.exists():
        raise SystemExit(f"no report from {' '.join(args)}:\n{proc.stdout[-3000:]}{proc.stderr}")
    report = json.loads(out.read_text())
    run = Run(scenario, protocol, session, wall, busy, 0.0)
    for test in report["tests"]:
        run.warmup_s += test.get("warmup_server_time_s") or 0.0
        name = test["nodeid"].rsplit("::", 1)[-1]
        for lv in test.get("levels", []):
            run.levels.append(
                LevelRun(
                    name,
                    lv["label"],
                    lv.get("server_time_s") or 0.0,
                    lv.get("trials", 0),
                    lv.get("verdict", "?"),
                    list(lv.get("trials_tok_s") or []),
                )
            )
    return run


def _busy(url: str) -> float:
    """The simulator's stepping time so far, in its own clock (``/sim/stats`` ``busy_s``)."""
    with urllib.request.urlopen(url + "/sim/stats", timeout=10) as resp:
        return float(json.load(resp)["busy_s"])


def print_run(run: Run) -> None:
    print(
        f"\n{run.protocol} / {run.scenario} (session {run.session}): "
        f"{run.server_s:.0f} EP8 s in all (warm-up {run.warmup_s:.0f} s; the simulator stepped "
        f"{run.busy_s or 0:.0f} s of it), wall {run.wall_s:.0f} s"
    )
    print(f"  {'test':<24} {'level':<6} {'EP8 s':>8} {'trials':>6} {'tok/s':>9}  verdict")
    for lv in run.levels:
        med = statistics.median(lv.tok_s) if lv.tok_s else float("nan")
        print(
            f"  {lv.test:<24} {lv.label:<6} {lv.server_s:>8.1f} {lv.trials:>6} {med:>9.1f}  "
            f"{lv.verdict}"
        )


# ------------------------------------------------------------------- simulated sessions


@dataclass(slots=True)
class LevelModel:
    """One level as the simulation needs it: its noise and what a trial costs."""

    test: str
    label: str
    within_sigma: float
    """Log sd of a trial's tok/s within a session (from the runs)."""
    trial_s: float
    """EP8 seconds one trial costs (level time / trials, measured)."""
    fixed_s: float = 0.0


def level_models(runs: list[Run]) -> list[LevelModel]:
    """Within-session spread and per-trial price of each level, pooled over the runs."""
    models: dict[tuple[str, str], LevelModel] = {}
    logs: dict[tuple[str, str], list[float]] = {}
    cost: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        for lv in run.levels:
            key = (lv.test, lv.label)
            if len(lv.tok_s) >= 2:
                x = np.log(np.asarray(lv.tok_s))
                logs.setdefault(key, []).append(float(np.var(x, ddof=1)))
            if lv.trials:
                cost.setdefault(key, []).append(lv.server_s / lv.trials)
            models.setdefault(key, LevelModel(lv.test, lv.label, 0.0, 0.0))
    for key, m in models.items():
        v = logs.get(key) or [0.0]
        m.within_sigma = max(math.sqrt(statistics.fmean(v)), MIN_LOG_SD)
        m.trial_s = statistics.median(cost.get(key) or [0.0])
    return list(models.values())


def simulate(
    models: list[LevelModel],
    *,
    drop: float,
    sims: int,
    session_sigma: float,
    baseline_trials: int,
    rng: np.random.Generator,
) -> tuple[dict[str, float], float, float]:
    """Verdict shares per test-level under the plugin's policy, mean trials and EP8 seconds.

    Every simulated comparison draws a baseline session (``baseline_trials`` trials, as a
    recording runs) and a current one whose log mean differs by a session factor and
    ``log(1 - drop)``; the current side runs the adaptive policy (:func:`trial_decision.decide`) and is
    judged by :func:`family_verdicts.compare_test` over the levels of its test (closed testing).
    """
    counts: dict[str, int] = {}
    trials_total = 0
    seconds_total = 0.0
    by_test: dict[str, list[LevelModel]] = {}
    for m in models:
        by_test.setdefault(m.test, []).append(m)
    for _ in range(sims):
        for levels in by_test.values():
            pairs = []
            for m in levels:
                base = np.exp(rng.normal(0.0, m.within_sigma, baseline_trials))
                shift = rng.normal(0.0, session_sigma) + math.log1p(-drop)
                sd = m.within_sigma

                def draw(k: int, shift: float = shift, sd: float = sd) -> list[float]:
                    return [float(x) for x in np.exp(shift + rng.normal(0.0, sd, k))]

                cur = draw(two_sample.DEFAULT_MIN_TRIALS)
                look = 0
                while True:
                    d = trial_decision.decide(list(base), cur, look=look, n_levels=len(levels))
                    if d.stop or len(cur) >= two_sample.DEFAULT_MAX_TRIALS:
                        break
                    cur += draw(d.next_trials)
                    look += 1
                trials_total += len(cur)
                seconds_total += len(cur) * m.trial_s
                pairs.append((list(base), cur))
            for cmp in family_verdicts.compare_test(pairs):
                counts[str(cmp.verdict)] = counts.get(str(cmp.verdict), 0) + 1
    n = sum(counts.values())
    shares = {k: v / n for k, v in sorted(counts.items())}
    return shares, trials_total / n, seconds_total / sims


# ------------------------------------------------------------------- the matrix (issue 21)

MATRIX: dict[str, tuple[list[int], int]] = {
    "one_128": ([1], 128),
    "one_2048": ([1], 2048),
    "sweep3_256": ([1, 8, 32], 256),
    "sweep5_128": ([1, 4, 16, 64, 256], 128),
    "sweep5_2048": ([1, 4, 16, 64, 256], 2048),
    "c256_512": ([256], 512),
    "pair_1024": ([16, 64], 1024),
}
"""Test name -> (concurrency levels, max_tokens): the workload shapes of ``--matrix``."""

SCENARIOS = {"unchanged": 0.0, "at tolerance": 0.05, "10% slower": 0.10, "15% slower": 0.15}


def matrix_suite() -> str:
    lines = ["from pytest_kimi import throughput", ""]
    for name, (levels, tokens) in MATRIX.items():
        conc = levels[0] if len(levels) == 1 else levels
        lines += [
            f"@throughput(concurrency={conc!r}, max_tokens={tokens}, prompts='diverse')",
            f"def test_{name}():",
            "    pass",
            "",
        ]
    return "\n".join(lines)


@dataclass(slots=True)
class Shape:
    """One test of the matrix under one protocol, as measured by its recording."""

    name: str
    levels: list[LevelModel]
    warmup_s: float


def record_matrix(protocol: str, *, speed: float, work: Path) -> list[Shape]:
    """Record every matrix test once (10 trials per level) and read its spreads and prices."""
    suite = work / f"matrix-{protocol}"
    suite.mkdir()
    (suite / "test_matrix.py").write_text(matrix_suite())
    out = suite / "report.json"
    with SimProcess(SimConfig(speed=speed, stream_interval=8)) as sim:
        assert sim.url is not None
        args = [
            sys.executable,
            "-m",
            "pytest",
            str(suite),
            "-p",
            "no:cacheprovider",
            "-q",
            f"--endpoint={sim.url}",
            f"--perf-protocol={protocol}",
            f"--baseline-dir={suite / 'baselines'}",
            "--baseline-profile=ep8",
            "--perf-history=off",
            f"--perf-json={out}",
            "--update-baselines=force",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=suite, capture_output=True, text=True, timeout=7200)
        wall = time.perf_counter() - t0
    if not out.exists():
        raise SystemExit(f"no report from {' '.join(args)}:\n{proc.stdout[-3000:]}{proc.stderr}")
    print(f"  {protocol}: recorded the matrix in {wall:.0f} s wall at speed {speed:g}")
    shapes = []
    for test in json.loads(out.read_text())["tests"]:
        name = test["nodeid"].rsplit("::test_", 1)[-1]
        models = []
        for lv in test.get("levels", []):
            tok = list(lv.get("trials_tok_s") or [])
            x = np.log(np.asarray(tok)) if len(tok) >= 2 else np.zeros(2)
            models.append(
                LevelModel(
                    name,
                    lv["label"],
                    max(float(np.std(x, ddof=1)), MIN_LOG_SD),
                    (lv.get("server_time_s") or 0.0) / max(lv.get("trials") or 1, 1),
                )
            )
        shapes.append(Shape(name, models, test.get("warmup_server_time_s") or 0.0))
    return shapes


@dataclass(slots=True)
class Cell:
    failed: float
    """Share of tests with a regression (a level or the common shift): the test fails."""
    flagged: float
    """Share of tests that did not say ``pass`` (or ``improved``) at every level: failed, or
    warned (``inconclusive``, ``underpowered``)."""
    min_level_pass: float
    """The least share of ``pass`` over the test's levels."""
    all_pass: float
    inconclusive: float
    """Share of levels that ended ``inconclusive``."""
    mean_trials: float
    seconds: float
    """EP8 seconds per verdict (the test once, warm-up included)."""


def simulate_shape(
    shape: Shape,
    *,
    drop: float,
    sims: int,
    sigma: float,
    baseline_trials: int,
    rng: np.random.Generator,
) -> Cell:
    """``sims`` comparisons of one test: shared session factors, the plugin's policy (with
    the undecided extension and its :class:`family_verdicts.Design`) and :func:`family_verdicts.compare_family`."""
    levels = shape.levels
    failed = flagged = all_pass = 0
    level_pass = np.zeros(len(levels))
    inconclusive = trials = 0
    seconds = 0.0
    for _ in range(sims):
        s_base, s_cur = rng.normal(0.0, sigma / math.sqrt(2), 2)
        pairs, designs = [], []
        for m in levels:
            base = list(np.exp(s_base + rng.normal(0.0, m.within_sigma, baseline_trials)))
            shift = s_cur + math.log1p(-drop)

            def draw(k: int, shift: float = shift, sd: float = m.within_sigma) -> list[float]:
                return [float(x) for x in np.exp(shift + rng.normal(0.0, sd, k))]

            cur = draw(two_sample.DEFAULT_MIN_TRIALS)
            design = None
            while True:
                d = trial_decision.decide(base, cur, session_sigma=sigma)
                if design is None and d.reason is not trial_decision.StopReason.CONTINUE:
                    can = d.reason in (
                        trial_decision.StopReason.POWERED,
                        trial_decision.StopReason.UNDECIDED,
                    )
                    n = len(cur)
                    design = family_verdicts.Design(n, two_sample.DEFAULT_MAX_TRIALS if can else n)
                if d.stop or len(cur) >= two_sample.DEFAULT_MAX_TRIALS:
                    break
                cur += draw(d.next_trials)
            trials += len(cur)
            seconds += len(cur) * m.trial_s
            pairs.append((base, cur))
            designs.append(design)
        fam = family_verdicts.compare_family(pairs, session_sigma=sigma, designs=designs)
        verdicts = [c.verdict for c in fam.levels]
        shift_reg = fam.shift is not None and fam.shift.verdict is Verdict.REGRESSION
        failed += shift_reg or Verdict.REGRESSION in verdicts
        flagged += shift_reg or any(v not in (Verdict.PASS, Verdict.IMPROVED) for v in verdicts)
        all_pass += all(v is Verdict.PASS for v in verdicts)
        level_pass += np.array([v is Verdict.PASS for v in verdicts])
        inconclusive += sum(v is Verdict.INCONCLUSIVE for v in verdicts)
    n_levels = sims * len(levels)
    return Cell(
        failed / sims,
        flagged / sims,
        float(level_pass.min()) / sims,
        all_pass / sims,
        inconclusive / n_levels,
        trials / n_levels,
        seconds / sims + shape.warmup_s,
    )


def run_matrix(args: argparse.Namespace) -> int:
    from pytest_kimi.gate import family

    family.MC_DRAWS = args.mc_draws
    rng = np.random.default_rng(args.seed)
    protocols = ("whole-requests", "stationary")
    with tempfile.TemporaryDirectory(prefix="verdict-matrix-") as tmp:
        work = Path(tmp)
        shapes = {
            p: {s.name: s for s in record_matrix(p, speed=MATRIX_SPEEDS[p], work=work)}
            for p in protocols
        }
    print(
        f"\n{args.sims} simulated comparisons per cell; gate defaults (tolerance 5%, alpha 0.05, "
        "detectable drop 15%), session sigma told the truth; baseline of 10 trials; EP8 s per "
        "verdict = the test once, warm-up included"
    )
    header = (
        "| test | levels | sigma | scenario | failed | flagged | least level pass | all pass | "
        "inconclusive | trials/level | EP8 s stationary | EP8 s whole-requests | ratio |"
    )
    print("\n" + header)
    print("|" + "---|" * 13)
    for name, (conc, tokens) in MATRIX.items():
        for sigma in (0.03, 0.01):
            for scenario, drop in SCENARIOS.items():
                cells = {
                    p: simulate_shape(
                        shapes[p][name],
                        drop=drop,
                        # the protocol of before is priced, not judged: fewer comparisons
                        sims=args.sims if p == "stationary" else max(50, args.sims // 4),
                        sigma=sigma,
                        baseline_trials=two_sample.DEFAULT_MAX_TRIALS,
                        rng=rng,
                    )
                    for p in protocols
                }
                new, old = cells["stationary"], cells["whole-requests"]
                label = f"C={'/'.join(map(str, conc))} x {tokens}"
                print(
                    f"| {name} | {label} | {sigma:g} | {scenario} | {new.failed:.1%} | "
                    f"{new.flagged:.1%} | "
                    f"{new.min_level_pass:.1%} | {new.all_pass:.1%} | {new.inconclusive:.1%} | "
                    f"{new.mean_trials:.2f} | {new.seconds:.0f} | {old.seconds:.0f} | "
                    f"{new.seconds / old.seconds:.2f} |",
                    flush=True,
                )
    return 0


def run_margin(args: argparse.Namespace) -> int:
    """False alarms at a true drop of exactly the tolerance, with more comparisons than a
    matrix cell: synthetic levels (1% and 0.3% within-session spread, one and three levels)."""
    from pytest_kimi.gate import family

    family.MC_DRAWS = args.mc_draws
    rng = np.random.default_rng(args.seed)
    for n_levels, within in ((1, 0.01), (3, 0.01), (1, 0.003)):
        shape = Shape(
            "margin", [LevelModel("margin", f"C={i}", within, 1.0) for i in range(n_levels)], 0.0
        )
        for sigma in (0.03, 0.01):
            cell = simulate_shape(
                shape, drop=0.05, sims=args.sims, sigma=sigma, baseline_trials=10, rng=rng
            )
            se = math.sqrt(cell.failed * (1 - cell.failed) / args.sims)
            print(
                f"{n_levels} level(s), within {within:g}, session sigma {sigma:g}: "
                f"failed {cell.failed:.1%} +- {se:.1%} of {args.sims}",
                flush=True,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--protocol", choices=("stationary", "whole-requests", "both"), default="both")
    ap.add_argument(
        "--speed", type=float, default=None, help="simulator speed (default: per protocol)"
    )
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument(
        "--noise",
        type=float,
        default=round(two_sample.DEFAULT_SESSION_SIGMA / math.sqrt(2), 4),
        help="per-server-start log sd of the simulator (two starts differ by sqrt(2) times it)",
    )
    ap.add_argument("--session-sigma", type=float, default=two_sample.DEFAULT_SESSION_SIGMA)
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--matrix", action="store_true", help="the workload-shape matrix (issue 21)")
    ap.add_argument(
        "--mc-draws",
        type=int,
        default=5000,
        help="simulated sessions of the family's null per comparison (the plugin uses 20000)",
    )
    ap.add_argument(
        "--margin", action="store_true", help="false alarms at the tolerance, synthetic levels"
    )
    args = ap.parse_args(argv)
    if args.matrix:
        return run_matrix(args)
    if args.margin:
        return run_margin(args)
    protocols = ["whole-requests", "stationary"] if args.protocol == "both" else [args.protocol]
    rng = np.random.default_rng(args.seed)
    summary = []
    with tempfile.TemporaryDirectory(prefix="verdict-cost-") as tmp:
        work = Path(tmp)
        for protocol in protocols:
            speed = args.speed or DEFAULT_SPEEDS[protocol]
            baselines = work / f"baselines-{protocol}"
            print(f"\n=== protocol {protocol}: simulator speed {speed:g}, noise {args.noise:g} ===")
            runs = [
                run_suite(
                    protocol,
                    "record",
                    0,
                    speed=speed,
                    noise=args.noise,
                    baselines=baselines,
                    work=work,
                )
            ]
            print_run(runs[0])
            for session in range(1, args.sessions + 1):
                for scenario in ("unchanged", "slower"):
                    run = run_suite(
                        protocol,
                        scenario,
                        session,
                        speed=speed,
                        noise=args.noise,
                        baselines=baselines,
                        work=work,
                    )
                    print_run(run)
                    runs.append(run)
            models = level_models(runs)
            base_trials = max(lv.trials for lv in runs[0].levels)
            warm = statistics.median(r.warmup_s for r in runs)
            print(
                f"\n{protocol}: {args.sims} simulated sessions per scenario (session sigma "
                f"{args.session_sigma:g}, within-session sigma per level from the runs, "
                f"baseline of {base_trials} trials)"
            )
            row = {"protocol": protocol, "record_s": runs[0].server_s}
            for drop, name in ((0.0, "unchanged"), (0.15, "15% slower")):
                shares, mean_trials, seconds = simulate(
                    models,
                    drop=drop,
                    sims=args.sims,
                    session_sigma=args.session_sigma,
                    baseline_trials=base_trials,
                    rng=rng,
                )
                seconds += warm
                text = ", ".join(f"{k} {v:.1%}" for k, v in shares.items())
                print(
                    f"  {name:<11} verdicts per level: {text}; {mean_trials:.2f} trials per "
                    f"level; {seconds:.0f} EP8 s per run of the suite"
                )
                row[name] = (shares, mean_trials, seconds)
            measured = [r.server_s for r in runs if r.scenario == "unchanged"]
            row["unchanged_measured_s"] = statistics.fmean(measured) if measured else float("nan")
            summary.append(row)
    if len(summary) == 2:
        old, new = summary
        print("\n=== the price of a verdict against a baseline, EP8 seconds ===")
        for name in ("unchanged", "15% slower"):
            a, b = old[name][2], new[name][2]
            print(
                f"  {name:<11} {old['protocol']} {a:>7.0f}   {new['protocol']} {b:>7.0f}   {b / a:.1%}"
            )
        a, b = old["record_s"], new["record_s"]
        print(
            f"  {'record':<11} {old['protocol']} {a:>7.0f}   {new['protocol']} {b:>7.0f}   {b / a:.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
