"""How close the plugin's figures come to the simulator's known truth.

    python bench/accuracy.py [--speed 10] [--max-tokens 256] [--levels 1,8,64,256]
                             [--stream-interval 1] [--trials 3]
                             [--protocol stationary|whole-requests]

The simulator's step time for b running sequences is exact by construction, so the aggregate
rate at closed-loop concurrency C is ``true_tok_s(C)`` and a running stream decodes at
``request_tok_s(C)`` (both in the simulator's clock, EP8's figures, as the plugin reports them).
For each level this prints the true rate, the measured median of the trials, and the error; the
engine's own rate over exactly the steps each trial's window held (``/sim/truth``: a stationary
window includes requests starting and ending, so its truth is the engine's count, not the
formula) and the error against it; the same for the per-request decode rate; and, for
whole-request trials, the naive ``tokens / wall`` figure hand-made scripts report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_kimi.workload.markers import PROTOCOLS, STATIONARY, parse_throughput  # noqa: E402
from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402
from pytest_kimi.sim.process import SimProcess  # noqa: E402
from pytest_kimi.sim.config import SimConfig  # noqa: E402


def window_truth(url: str, start: float, end: float) -> float:
    """The engine's tok/s (its own clock) over the steps a client window held."""
    with urllib.request.urlopen(f"{url}/sim/truth?start={start!r}&end={end!r}", timeout=10) as r:
        return float(json.load(r)["tok_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--levels", default="1,8,64,256")
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--protocol", choices=PROTOCOLS, default=STATIONARY)
    args = ap.parse_args(argv)
    profile = SimConfig(speed=args.speed, stream_interval=args.stream_interval)
    ep8 = SimConfig(stream_interval=args.stream_interval)  # the same steps in the sim's clock
    levels = [int(x) for x in args.levels.split(",")]
    print(
        f"simulator: EP8 profile, speed={args.speed:g}, stream_interval={args.stream_interval}, "
        f"max_tokens={args.max_tokens}, {args.trials} trials, protocol {args.protocol}; "
        "figures in the simulator's clock"
    )
    print(
        f"{'C':>5} {'true tok/s':>11} {'measured':>10} {'error':>7} {'window truth':>13} "
        f"{'error':>7} {'tokens/wall':>12} {'error':>7} {'true req':>9} {'req p50':>9} "
        f"{'error':>7}"
    )
    worst = worst_window = 0.0
    with SimProcess(profile) as sim:
        assert sim.url is not None
        session = Measurer()
        try:
            endpoint = session.discover(sim.url, api_key=None, model=None)
            for c in levels:
                workload, targets = parse_throughput(
                    (),
                    dict(
                        concurrency=c,
                        max_tokens=args.max_tokens,
                        trials=args.trials,
                        warmup=2,
                        protocol=args.protocol,
                    ),
                )
                spec = build_spec(endpoint, "bench", workload, targets, rootdir=Path.cwd())
                level = session.measure(spec).levels[0]
                f = level.figures
                true = ep8.true_tok_s(c)
                truths = [
                    window_truth(sim.url, *t.window) for t in level.trials if t.window is not None
                ]
                truth = statistics.median(truths) if truths else float("nan")
                naive_mid = float("nan")
                if args.protocol != STATIONARY:
                    naive = [
                        sum(r.completion_tokens for r in t.records)
                        / (max(r.end for r in t.records) - min(r.sent for r in t.records))
                        / args.speed
                        for t in level.trials
                    ]
                    naive_mid = statistics.median(naive)
                true_req = ep8.request_tok_s(c)
                err = (f.tok_s / true - 1) * 100 if f.tok_s else float("nan")
                werr = (f.tok_s / truth - 1) * 100 if f.tok_s else float("nan")
                worst = max(worst, abs(err))
                worst_window = max(worst_window, abs(werr))
                req_err = (
                    (f.request_tok_s_p50 / true_req - 1) * 100
                    if f.request_tok_s_p50
                    else float("nan")
                )
                print(
                    f"{c:>5} {true:>11.1f} {f.tok_s or float('nan'):>10.1f} {err:>+6.2f}% "
                    f"{truth:>13.1f} {werr:>+6.2f}% "
                    f"{naive_mid:>12.1f} {(naive_mid / true - 1) * 100:>+6.2f}% "
                    f"{true_req:>9.1f} {f.request_tok_s_p50 or float('nan'):>9.1f} {req_err:>+6.2f}%"
                    + (
                        ""
                        if level.verdict in ("pass", "no-baseline")
                        else f"  [{level.verdict}: {level.reasons[0]}]"
                    )
                )
        finally:
            session.close()
    print(
        f"worst aggregate error: {worst:.2f}% against the formula, "
        f"{worst_window:.2f}% against the engine's count over the same window"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
