"""How close the plugin's figures come to the simulator's known truth.

    python bench/accuracy.py [--speed 10] [--max-tokens 256] [--levels 1,8,64,256]
                             [--stream-interval 1[,2,8,16]] [--trials 3]
                             [--protocol stationary|whole-requests|both]

The simulator's step time for b running sequences is exact by construction, so the aggregate
rate at closed-loop concurrency C is ``true_tok_s(C)`` and a running stream decodes at
``request_tok_s(C)`` (both in the simulator's clock, EP8's figures, as the plugin reports them).
For each level this prints the true rate, the measured median of the trials, and the error; the
engine's own rate over exactly the steps each trial's window held (``/sim/truth``: a stationary
window includes requests starting and ending, so its truth is the engine's count, not the
formula) and the error against it; the same for the per-request decode rate; and, for
whole-request trials, the naive ``tokens / wall`` figure hand-made scripts report.

The window truth of a whole-request trial is the engine's whole steps between the window's
edges (they sit on step boundaries); of a stationary trial, whose edges are anywhere in a
step, the engine's tokens between the two instants with each step's spread over its duration
(``between_tokens``).  The simulator streams as SGLang 0.5.23 does (``--stream-interval N``:
the first token at once, then N at a time, the rest with the finish), so a list of intervals
checks the plugin on each pattern; ``worst`` is over every trial, not only the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_kimi.workload.markers import parse_throughput  # noqa: E402
from pytest_kimi.workload.workload_spec import PROTOCOLS, STATIONARY  # noqa: E402
from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402
from pytest_kimi.sim.process import SimProcess  # noqa: E402
from pytest_kimi.sim.config import SimConfig  # noqa: E402


def window_truth(url: str, start: float, end: float, stationary: bool) -> float:
    """The engine's tok/s (its own clock) over the window a client trial measured."""
    with urllib.request.urlopen(f"{url}/sim/truth?start={start!r}&end={end!r}", timeout=10) as r:
        truth = json.load(r)
    return float(truth["between_tok_s"] if stationary else truth["tok_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--levels", default="1,8,64,256")
    ap.add_argument("--stream-interval", default="1", help="one or a comma-separated list")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--protocol", choices=(*PROTOCOLS, "both"), default=STATIONARY)
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    intervals = [int(x) for x in args.stream_interval.split(",")]
    protocols = list(PROTOCOLS) if args.protocol == "both" else [args.protocol]
    print(
        f"simulator: EP8 profile, speed={args.speed:g}, max_tokens={args.max_tokens}, "
        f"{args.trials} trials; figures in the simulator's clock; errors of the trials' "
        "median (worst trial in brackets)"
    )
    print(
        f"{'protocol':>14} {'SI':>3} {'C':>5} {'true tok/s':>11} {'measured':>10} {'error':>7} "
        f"{'window truth':>13} {'error':>7} {'(worst)':>9} {'tokens/wall':>12} {'error':>7} "
        f"{'true req':>9} {'req p50':>9} {'error':>7}"
    )
    worst = worst_window = 0.0
    for interval in intervals:
        profile = SimConfig(speed=args.speed, stream_interval=interval)
        ep8 = SimConfig(stream_interval=interval)  # the same steps in the sim's clock
        with SimProcess(profile) as sim:
            assert sim.url is not None
            session = Measurer()
            try:
                endpoint = session.discover(sim.url, api_key=None, model=None)
                for protocol in protocols:
                    for c in levels:
                        w, ww = _level(session, endpoint, sim.url, ep8, args, protocol, c, interval)
                        worst, worst_window = max(worst, w), max(worst_window, ww)
            finally:
                session.close()
    print(
        f"worst aggregate error: {worst:.2f}% against the formula, "
        f"{worst_window:.3f}% against the engine's count over the same window (any trial)"
    )
    return 0


def _level(
    session: Measurer,
    endpoint: object,
    url: str,
    ep8: SimConfig,
    args: argparse.Namespace,
    protocol: str,
    c: int,
    interval: int,
) -> tuple[float, float]:
    """Measure one level and print its row; returns its errors against the formula and (the
    worst trial) against the window truth, in percent."""
    workload, targets = parse_throughput(
        (),
        dict(
            concurrency=c,
            max_tokens=args.max_tokens,
            trials=args.trials,
            warmup=2,
            protocol=protocol,
        ),
    )
    spec = build_spec(endpoint, "bench", workload, targets, rootdir=Path.cwd())  # type: ignore[arg-type]
    level = session.measure(spec).levels[0]
    f = level.figures
    true = ep8.true_tok_s(c)
    stationary = protocol == STATIONARY
    pairs = [
        (t.tok_s / args.speed, window_truth(url, *t.window, stationary))
        for t in level.trials
        if t.window is not None and t.tok_s is not None
    ]
    truth = statistics.median(p[1] for p in pairs) if pairs else float("nan")
    trial_errors = [(m / tr - 1) * 100 for m, tr in pairs]
    worst_trial = max(trial_errors, key=abs) if trial_errors else float("nan")
    naive_mid = float("nan")
    if not stationary:
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
    req_err = (f.request_tok_s_p50 / true_req - 1) * 100 if f.request_tok_s_p50 else float("nan")
    print(
        f"{protocol:>14} {interval:>3} {c:>5} {true:>11.1f} {f.tok_s or float('nan'):>10.1f} "
        f"{err:>+6.2f}% {truth:>13.1f} {werr:>+6.2f}% ({worst_trial:>+6.2f}%) "
        f"{naive_mid:>12.1f} {(naive_mid / true - 1) * 100:>+6.2f}% "
        f"{true_req:>9.1f} {f.request_tok_s_p50 or float('nan'):>9.1f} {req_err:>+6.2f}%"
        + (
            ""
            if level.verdict in ("pass", "no-baseline")
            else f"  [{level.verdict}: {level.reasons[0]}]"
        ),
        flush=True,
    )
    return abs(err), abs(worst_trial)


if __name__ == "__main__":
    raise SystemExit(main())
