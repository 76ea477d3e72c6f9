"""Capacity under an SLO: does the search find the simulator's true boundary, and is its gate
as strict as it says?

    python bench/capacity.py truth [--speed 2] [--max-tokens 128] [--max-e2e-s 6.6]
                                   [--max-itl-s S] [--percentile 95] [--concurrency 4,128]
                                   [--runs 3] [--stream-interval 8] [--interpolate/--bisect]
                                   [--itl request|token]
    python bench/capacity.py jitter [--speed 10] [--stream-interval 1] [--levels 1,12,41,48]
    python bench/capacity.py gate  [--sims 2000] [--seed 1] [--drops 0,0.05,0.1,0.15,0.2]
    python bench/capacity.py search [--sims 200] [--seed 1]
    python bench/capacity.py estimate [--sims 500] [--seed 1]

``truth`` runs the plugin's own search (``run_capacity``: the level measurement of
``@throughput``, warm-up, protocol, adaptive top-ups) against a simulator and compares the
capacity with the one its latency model implies.  With an end-to-end ceiling a trial sends C
whole requests at once, every request's latency is ``SimConfig.expected_e2e_s(max_tokens, C)``
exactly (in the simulator's clock), and the *true capacity* is the largest C whose latency is
within the ceiling; the check is that the found capacity is within one search step of it.  With
an ITL ceiling (stationary trials) the truth is the simulator's mean time per token at C: the
decode step ``step_time(C)`` plus its prefill of the requests it admits (``C / (max_tokens + 1)``
a step, each the prompt's ``prefill_time``), which is what each request's mean ITL measures
(``--itl request``, the default).  ``--itl token`` judges the per-gap percentile instead, which
carries the client's own read timing (``docs/guide/workloads.md``, *ITL ceilings and the client*).
From the second run on, each run's capacity is compared with the first's by the capacity gate
(default tolerance, alpha and session sigma): an unchanged rerun, so it must pass.

``jitter`` measures stationary levels and prints, per trial, the per-gap ITL p50, p95 and their
ratio, each request's mean ITL at p95, the client's event-loop lag and the simulator's step: the
measurement behind ``JITTER_RATIO`` (``pytest_kimi/measure/capacity_latency.py``).

``search`` counts the levels and trials the search spends on a synthetic latency model (the
simulator's step curve with 1% trial noise) against plain doubling-then-bisection, over a range
of ceilings.

``estimate`` checks the boundary's uncertainty on that model: the scatter of ``ln(estimate)``
over many searches against the ``log_se`` the searches report, and the fitted slope against the
true one (and against the slope of the bracket's two ends alone, which noise makes too steep).

``gate`` simulates the capacity gate (``pytest_kimi/gate/capacity_gate.py``): a baseline session and
a current one, each a search over the same latency curve with its own session factor (log sd
3%, the default ``--perf-session-sigma``) and per-trial noise; the current curve's capacity is
lower by ``drop``.  It prints the share of verdicts per drop: the false-alarm rate at exactly
the tolerance (5%) must stay at or below alpha (5%).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_kimi.baseline import WorkloadKey  # noqa: E402
from pytest_kimi.gate.capacity_gate import compare_capacity, record_of  # noqa: E402
from pytest_kimi.gate.policy import GateSettings  # noqa: E402
from pytest_kimi.measure.capacity_latency import jitter, samples  # noqa: E402
from pytest_kimi.measure.stream_timing import inter_token_latencies  # noqa: E402
from pytest_kimi.measure.trials import measure_level  # noqa: E402
from pytest_kimi.measure.capacity_levels import LevelOutcome, SearchSettings  # noqa: E402
from pytest_kimi.measure.capacity_run import run_capacity  # noqa: E402
from pytest_kimi.measure.capacity_search import CapacityEstimate, search_offline  # noqa: E402
from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402
from pytest_kimi.sim.process import SimProcess  # noqa: E402
from pytest_kimi.sim.config import SimConfig  # noqa: E402
from pytest_kimi.workload.capacity_marker import parse_capacity  # noqa: E402

EP8 = SimConfig()


def true_capacity(latency: Any, ceiling: float, top: int = 4096) -> int:
    """The largest C whose latency is within the ceiling (0 when even C=1 is not)."""
    c = 0
    while c < top and latency(c + 1) <= ceiling:
        c += 1
    return c


# ------------------------------------------------------------------------------------- truth


def cmd_truth(args: argparse.Namespace) -> int:
    lo, hi = (int(x) for x in args.concurrency.split(","))
    marker: dict[str, Any] = {
        "concurrency": (lo, hi),
        "max_tokens": args.max_tokens,
        "percentile": args.percentile,
        "trials": args.trials,
    }
    if args.max_e2e_s is not None:
        marker["max_e2e_s"] = args.max_e2e_s
    if args.max_itl_s is not None:
        marker["max_itl_s"] = args.max_itl_s
    spec_c, workload, targets = parse_capacity((), marker)
    profile = SimConfig(speed=args.speed, stream_interval=args.stream_interval)
    print(
        f"simulator: EP8 profile, speed={args.speed:g}, stream_interval={args.stream_interval}; "
        f"@capacity({', '.join(f'{k}={v!r}' for k, v in marker.items())}); "
        f"{'interpolating search' if args.interpolate else 'doubling + bisection'}; "
        f"ITL judged per {'request (mean)' if args.itl == 'request' else 'gap'}; "
        "latencies in the simulator's clock"
    )
    worst = 0.0
    within = 0
    gate = GateSettings()
    key = WorkloadKey.from_dict({"metric": "concurrency", **spec_c.ceilings}).to_dict()
    first = None
    found_all: list[float] = []
    with SimProcess(profile) as sim:
        assert sim.url is not None
        session = Measurer()
        try:
            endpoint = session.discover(sim.url, api_key=None, model=None)
            for run in range(args.runs):
                spec = build_spec(endpoint, "bench", workload, targets, rootdir=Path.cwd())
                settings = SearchSettings(
                    metric="concurrency",
                    low=spec_c.low,
                    high=spec_c.high,
                    ceilings=spec_c.ceilings,
                    percentile=spec_c.percentile,
                    resolution=spec_c.resolution,
                    first_trials=spec.trials,
                    interpolate=args.interpolate,
                    itl=args.itl,
                )
                started = time.monotonic()
                out = session.run_job(
                    lambda client, spec=spec, settings=settings: run_capacity(
                        client, spec, settings
                    )
                )
                wall = time.monotonic() - started
                est = out.estimate
                prompt = statistics.fmean(
                    (lv.prompt_tokens or {}).get("mean", 0) for lv in out.result.levels
                )
                truth = _truth(args, int(round(prompt)))
                found = est.value or 0
                off = abs(found - truth)
                ok = off <= est.step
                within += ok
                worst = max(worst, off / max(truth, 1))
                levels = ", ".join(
                    f"{int(lv.load)}{'+' if lv.held else '-'}{lv.trials}" for lv in est.levels
                )
                print(
                    f"run {run + 1}: capacity C={_shown(est)} (bracket {est.low}..{est.high}, "
                    f"boundary {_f(est.estimate)}, 90% CI {_ci(est)}); true C={truth}; "
                    f"off by {off:g} (step {est.step:g}): {'within' if ok else 'OUTSIDE'}; "
                    f"{len(est.levels)} levels, {sum(lv.trials for lv in est.levels)} trials, "
                    f"{wall:.0f} s wall [{levels}]"
                )
                _print_levels(args, est, int(round(prompt)))
                found_all.append(found)
                record = record_of(est, key) if est.low is not None else None
                if first is None:
                    first = record
                elif record is not None:
                    cmp = compare_capacity(
                        record,
                        first,
                        tolerance=gate.tolerance,
                        alpha=gate.alpha,
                        session_sigma=gate.session_sigma,
                    )
                    print(
                        f"    vs run 1 (the capacity gate, tolerance {gate.tolerance:.0%}): "
                        f"{(cmp.ratio - 1) * 100:+.1f}% (90% CI {(cmp.ci90[0] - 1) * 100:+.1f}% .. "
                        f"{(cmp.ci90[1] - 1) * 100:+.1f}%), p={cmp.p_regression:.3g}: "
                        f"{cmp.verdict.value}"
                    )
        finally:
            session.close()
    print(
        f"{within}/{args.runs} runs within one search step of the true capacity; worst "
        f"{worst:.1%} off; capacities {', '.join(f'{x:g}' for x in found_all)}"
    )
    return 0 if within == args.runs else 1


def _model_latency(args: argparse.Namespace, prompt: int) -> Any:
    if args.max_e2e_s is not None:
        return lambda c: EP8.expected_e2e_s(args.max_tokens, c, prompt)
    if args.itl == "token":
        return lambda c: EP8.step_time(c)
    # a request's mean time per token: the step plus its share of the admissions' prefill
    return lambda c: EP8.step_time(c) + EP8.prefill_time(prompt) * c / (args.max_tokens + 1)


def _truth(args: argparse.Namespace, prompt: int) -> int:
    ceiling = args.max_e2e_s if args.max_e2e_s is not None else args.max_itl_s
    return true_capacity(_model_latency(args, prompt), ceiling)


def _print_levels(args: argparse.Namespace, est: CapacityEstimate, prompt: int) -> None:
    model = _model_latency(args, prompt)
    name = "e2e_s" if args.max_e2e_s is not None else "itl_s"
    for lv in sorted(est.levels, key=lambda x: x.load):
        got = lv.latencies.get(name)
        true = model(int(lv.load))
        err = f"{(got / true - 1) * 100:+.1f}%" if got else "-"
        print(
            f"    C={int(lv.load):>4} {'held ' if lv.held else 'broke'} {name} p{args.percentile:g} "
            f"{_f(got)} s (model {true:.4g} s, {err}), {lv.trials} trials, sure {_f(lv.sure)}, "
            f"per-gap ITL p95/p50 {_f(lv.jitter)}"
            + (f", {lv.replaced} trial(s) re-measured" if lv.replaced else "")
        )


def _shown(est: CapacityEstimate) -> str:
    return "-" if est.value is None else f"{est.value:g}"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _ci(est: CapacityEstimate) -> str:
    return "-" if est.ci90 is None else f"{est.ci90[0]:.4g}..{est.ci90[1]:.4g}"


# ------------------------------------------------------------------------------------ jitter


def cmd_jitter(args: argparse.Namespace) -> int:
    """Per trial: the per-gap ITL tail against each request's mean, and the client's lag."""
    levels = [int(x) for x in args.levels.split(",")]
    marker = {"concurrency": (1, 128), "max_tokens": args.max_tokens, "max_itl_s": 0.05}
    _, workload, targets = parse_capacity((), marker)
    profile = SimConfig(speed=args.speed, stream_interval=args.stream_interval)
    print(
        f"simulator: EP8 profile, speed={args.speed:g}, stream_interval={args.stream_interval}; "
        f"stationary trials of max_tokens={args.max_tokens}; ms in the simulator's clock"
    )
    ratios: list[float] = []
    with SimProcess(profile) as sim:
        assert sim.url is not None
        session = Measurer()
        try:
            endpoint = session.discover(sim.url, api_key=None, model=None)
            for c in levels:
                spec = build_spec(endpoint, "bench", workload, targets, rootdir=Path.cwd())
                level = dataclasses.replace(workload.levels[0], concurrency=c)
                res = session.run_job(
                    lambda client, spec=spec, level=level: measure_level(client, spec, level)
                )
                for t in res.trials:
                    ok = [r for r in t.records if r.ok]
                    gaps = inter_token_latencies(ok) * args.speed * 1e3
                    per = samples(ok, "itl_s").values * args.speed * 1e3
                    p50, p95 = statistics.median(gaps), float(np.percentile(gaps, 95))
                    print(
                        f"C={c:>4} trial {t.index + 1}: per-gap ITL p50 {p50:.2f} p95 {p95:.2f} "
                        f"ratio {p95 / p50:.3f} | request mean ITL p95 "
                        f"{float(np.percentile(per, 95)):.2f} ({per.size} requests) | step "
                        f"{profile.step_time(c) * args.speed * 1e3:.2f} | lag p99 "
                        f"{t.client.loop_lag_p99_s * 1e3:.1f} ms, max "
                        f"{t.client.loop_lag_max_s * 1e3:.1f} ms (wall), CPU {t.client.cpu_share:.0%}"
                    )
                pooled = jitter(res.trials, 95.0)
                if pooled is not None:
                    ratios.append(pooled.ratio)
                    print(f"  C={c}: pooled per-gap ITL p95/p50 {pooled.ratio:.3f}")
        finally:
            session.close()
    print(f"pooled ratios {min(ratios):.3f}..{max(ratios):.3f}")
    return 0


# ------------------------------------------------------------------------------ synthetic model


def curve(c: float) -> float:
    """The simulator's decode step in its own clock (EP8), for real-valued load."""
    return (EP8.step_base_s + EP8.step_per_seq_s * c**EP8.step_exponent) * EP8.slowdown


def synthetic(
    rng: random.Random, *, factor: float = 1.0, squeeze: float = 1.0, trial_sd: float = 0.01
) -> Any:
    """``measure(load, trials)`` over ``factor * curve(load / squeeze)`` with lognormal trial
    noise: ``squeeze`` < 1 lowers the capacity by exactly that factor."""

    def measure(load: float, trials: int) -> LevelOutcome:
        per = [
            factor * curve(load / squeeze) * math.exp(rng.gauss(0.0, trial_sd))
            for _ in range(trials)
        ]
        return LevelOutcome({"itl_s": statistics.fmean(per)}, [{"itl_s": v} for v in per])

    return measure


def cmd_search(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    ceilings = [0.02, 0.03, 0.05, 0.08, 0.12, 0.2]
    print(
        f"synthetic: ITL = the simulator's step curve, trial noise {args.trial_sd:.0%}, range "
        f"C=1..512, resolution 10%; {args.sims} searches per ceiling and strategy"
    )
    print(
        f"{'ceiling s':>9} {'true C':>7} | {'interpolating: levels':>21} {'trials':>7} "
        f"{'within':>7} | {'bisection: levels':>17} {'trials':>7} {'within':>7}"
    )
    for ceiling in ceilings:
        truth = true_capacity(curve, ceiling)
        row = [f"{ceiling:>9g} {truth:>7}"]
        for interpolate in (True, False):
            levels, trials, ok = [], [], 0
            for _ in range(args.sims):
                settings = SearchSettings(
                    "concurrency",
                    1,
                    512,
                    {"itl_s": ceiling},
                    interpolate=interpolate,
                    max_levels=30,  # no cap: what each strategy needs to converge
                )
                est = search_offline(settings, synthetic(rng, trial_sd=args.trial_sd))
                levels.append(len(est.levels))
                trials.append(sum(lv.trials for lv in est.levels))
                ok += est.value is not None and abs(est.value - truth) <= est.step
            width = 21 if interpolate else 17
            row.append(
                f"{statistics.fmean(levels):>{width}.2f} {statistics.fmean(trials):>7.1f} "
                f"{ok / args.sims:>7.1%}"
            )
        print(" | ".join(row))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """Is ``log_se`` the estimate's real scatter, and is the fitted slope the true one?"""
    rng = random.Random(args.seed)
    settings = SearchSettings("concurrency", 1, 512, {"itl_s": 0.05})
    c = true_capacity(curve, 0.05)
    true_slope = (
        0.8 * EP8.step_per_seq_s * 41.25**0.8 / (EP8.step_base_s + EP8.step_per_seq_s * 41.25**0.8)
    )
    print(
        f"synthetic: ITL = the simulator's step curve, ceiling 0.05 s (true C={c}, boundary "
        f"41.25, slope {true_slope:.3f}); {args.sims} searches per row"
    )
    print(
        f"{'trial sd':>8} {'sd ln(estimate)':>16} {'rms log_se':>11} {'fitted slope':>13} "
        f"{'(sd)':>6} {'two-end slope':>14} {'(sd)':>6}"
    )
    for sd in (0.01, 0.02, 0.03):
        us, ses, fitted, ends = [], [], [], []
        for _ in range(args.sims):
            est = search_offline(settings, synthetic(rng, trial_sd=sd))
            assert est.estimate is not None and est.log_se is not None and est.slope is not None
            assert est.low is not None and est.high is not None
            us.append(math.log(est.estimate))
            ses.append(est.log_se)
            fitted.append(est.slope)
            by = {lv.load: lv.margin for lv in est.levels}
            m_low, m_high = by[est.low], by[est.high]
            assert m_low is not None and m_high is not None
            ends.append((m_low - m_high) / math.log(est.high / est.low))
        print(
            f"{sd:>8.0%} {statistics.stdev(us):>16.4f} "
            f"{math.sqrt(statistics.fmean(x * x for x in ses)):>11.4f} "
            f"{statistics.fmean(fitted):>13.3f} {statistics.stdev(fitted):>6.3f} "
            f"{statistics.fmean(ends):>14.3f} {statistics.stdev(ends):>6.3f}"
        )
    return 0


# ------------------------------------------------------------------------------------- the gate


def cmd_gate(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    drops = [float(x) for x in args.drops.split(",")]
    key = WorkloadKey.from_dict({"metric": "concurrency", "max_itl_s": args.ceiling})
    settings = SearchSettings("concurrency", 1, 512, {"itl_s": args.ceiling})
    print(
        f"synthetic gate: ITL = the simulator's step curve, ceiling {args.ceiling:g} s (true "
        f"C={true_capacity(curve, args.ceiling)}); session noise {args.session_sd:.0%} (gate "
        f"session_sigma {args.gate_sigma:g}), trial noise {args.trial_sd:.0%}; tolerance "
        f"{args.tolerance:.0%}, alpha {args.alpha:g}; {args.sims} baseline/current pairs per drop"
    )
    print(f"{'drop':>6} {'pass':>7} {'regression':>11} {'improved':>9} {'mean levels':>12}")
    for drop in drops:
        counts = {"pass": 0, "regression": 0, "improved": 0}
        levels = []
        for _ in range(args.sims):
            records = []
            for squeeze in (1.0, 1.0 - drop):
                factor = math.exp(rng.gauss(0.0, args.session_sd / math.sqrt(2.0)))
                est = search_offline(
                    settings,
                    synthetic(rng, factor=factor, squeeze=squeeze, trial_sd=args.trial_sd),
                )
                levels.append(len(est.levels))
                records.append(record_of(est, key.to_dict()))
            cmp = compare_capacity(
                records[1],
                records[0],
                tolerance=args.tolerance,
                alpha=args.alpha,
                session_sigma=args.gate_sigma,
            )
            counts[cmp.verdict.value] += 1
        n = args.sims
        print(
            f"{drop:>6.0%} {counts['pass'] / n:>7.3f} {counts['regression'] / n:>11.3f} "
            f"{counts['improved'] / n:>9.3f} {statistics.fmean(levels):>12.2f}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("truth", help="the search against the simulator's true boundary")
    t.add_argument("--speed", type=float, default=2.0)
    t.add_argument("--stream-interval", type=int, default=8)
    t.add_argument("--max-tokens", type=int, default=128)
    t.add_argument("--max-e2e-s", type=float, default=None)
    t.add_argument("--max-itl-s", type=float, default=None)
    t.add_argument("--percentile", type=float, default=95.0)
    t.add_argument("--concurrency", default="4,128")
    t.add_argument("--trials", type=int, default=3)
    t.add_argument("--runs", type=int, default=3)
    t.add_argument("--bisect", dest="interpolate", action="store_false")
    t.add_argument("--itl", choices=("request", "token"), default="request")
    j = sub.add_parser("jitter", help="per-gap ITL p95/p50 against each request's mean ITL")
    j.add_argument("--speed", type=float, default=10.0)
    j.add_argument("--stream-interval", type=int, default=1)
    j.add_argument("--max-tokens", type=int, default=256)
    j.add_argument("--levels", default="1,12,41,48")
    s = sub.add_parser("search", help="levels spent: interpolating search vs bisection")
    s.add_argument("--sims", type=int, default=200)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--trial-sd", type=float, default=0.01)
    e = sub.add_parser("estimate", help="log_se and the slope against their true values")
    e.add_argument("--sims", type=int, default=500)
    e.add_argument("--seed", type=int, default=1)
    g = sub.add_parser("gate", help="false alarms and power of the capacity gate")
    g.add_argument("--sims", type=int, default=2000)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--drops", default="0,0.05,0.1,0.15,0.2,0.3")
    g.add_argument("--ceiling", type=float, default=0.05)
    g.add_argument("--session-sd", type=float, default=0.03)
    g.add_argument("--gate-sigma", type=float, default=0.03)
    g.add_argument("--trial-sd", type=float, default=0.01)
    g.add_argument("--tolerance", type=float, default=0.05)
    g.add_argument("--alpha", type=float, default=0.05)
    args = ap.parse_args(argv)
    if args.cmd == "truth":
        if (args.max_e2e_s is None) == (args.max_itl_s is None):
            ap.error("truth: give one of --max-e2e-s and --max-itl-s")
        return cmd_truth(args)
    if args.cmd == "search":
        return cmd_search(args)
    if args.cmd == "jitter":
        return cmd_jitter(args)
    if args.cmd == "estimate":
        return cmd_estimate(args)
    return cmd_gate(args)


if __name__ == "__main__":
    raise SystemExit(main())
