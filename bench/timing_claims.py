"""Fixed-margin timing claims that only a quiet machine can check.

    python bench/timing_claims.py [--only window,ttft,itl,sends]

The tests hold these figures to bounds derived from what each run measured (the simulator's
own lateness, the client's stalls), so that they pass on a machine that shares its cores; a
bound that grows with the disturbance cannot show how good the figures are when nothing
disturbs them.  This script states the margins outright, as the tests did before:

* ``window``: C=8 whole requests of 2048 tokens against the EP8 simulator at speed 10: the
  median of 3 trials' tok/s within 0.05% of ``true_tok_s(8)`` (a window that dropped the last
  step's other tokens read 0.04% low at 2048 tokens, 0.34% at 256);
* ``ttft``: single requests with 1500-token prompts on a real-time simulator: every TTFT
  within 2% of step + prefill, plus 2.5 ms for the loopback round trip;
* ``itl``: the median inter-token gap within 5% of the batch's step at C=1, 8, 64, 256;
* ``sends``: an open loop of 200 arrivals at 50/s: sends late by under 5 ms at the median and
  20 ms at p99, the achieved rate within 5% of the offered one.

Each line prints the claim, the figure, the margin, and what the run measured of the machine
(the simulator's largest step lateness, the client's longest event-loop stall), so a miss on
a busy machine says why.  Exit status 1 when a claim is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_kimi.load import LoadClient, OpenLoopPlan, Target  # noqa: E402
from pytest_kimi.measure.results import LevelResult  # noqa: E402
from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402
from pytest_kimi.sim.process import SimProcess  # noqa: E402
from pytest_kimi.sim.config import SimConfig  # noqa: E402
from pytest_kimi.workload.markers import parse_throughput  # noqa: E402

PROFILE = SimConfig(speed=10.0)
TTFT_PROFILE = SimConfig(speed=1.0)
HTTP_ROUND_TRIP_S = 0.0025


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/sim/stats", timeout=30) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def _measure(profile: SimConfig, **throughput: Any) -> tuple[LevelResult, dict[str, Any]]:
    """One level on a simulator of its own, and the simulator's counters after it."""
    with SimProcess(profile) as sim:
        assert sim.url is not None
        session = Measurer()
        try:
            endpoint = session.discover(sim.url, api_key=None, model=None)
            workload, targets = parse_throughput((), throughput)
            spec = build_spec(endpoint, "claims", workload, targets, rootdir=Path.cwd())
            (level,) = session.measure(spec).levels
            return level, _stats(sim.url)
        finally:
            session.close()


def _disturbance(level: LevelResult, stats: dict[str, Any]) -> str:
    client = max(t.client.loop_lag_max_s for t in level.trials)
    return f"sim late <= {stats['max_lag_s'] * 1e3:.1f} ms, client stall <= {client * 1e3:.1f} ms"


Result = tuple[str, str, str, bool, str]
"""claim, figure, margin, met, what the machine did."""


def window() -> list[Result]:
    level, stats = _measure(PROFILE, concurrency=8, requests=8, max_tokens=2048, trials=3, warmup=2)
    true = PROFILE.true_tok_s(8)
    trials = [t.tok_s for t in level.trials if t.tok_s is not None]
    err = (statistics.median(trials) / true - 1) * 100 if trials else float("nan")
    return [
        (
            "C=8 x 2048 tok/s, median of 3",
            f"{err:+.3f}%",
            "0.05%",
            abs(err) <= 0.05,
            _disturbance(level, stats),
        )
    ]


def ttft() -> list[Result]:
    level, stats = _measure(
        TTFT_PROFILE,
        concurrency=1,
        requests=4,
        max_tokens=8,
        input_tokens=1500,
        trials=1,
        warmup=1,
    )
    out: list[Result] = []
    for rec in (r for t in level.trials for r in t.records):
        expected = TTFT_PROFILE.expected_ttft_s(rec.prompt_tokens, 1)
        assert rec.ttft is not None
        ok = expected * 0.98 <= rec.ttft <= expected * 1.02 + HTTP_ROUND_TRIP_S
        out.append(
            (
                f"TTFT, {rec.prompt_tokens}-token prompt",
                f"{(rec.ttft - expected) * 1e3:+.2f} ms",
                f"-2% .. +2% + {HTTP_ROUND_TRIP_S * 1e3:g} ms",
                ok,
                _disturbance(level, stats),
            )
        )
    return out


def itl() -> list[Result]:
    out: list[Result] = []
    for c in (1, 8, 64, 256):
        level, stats = _measure(
            PROFILE, concurrency=c, requests=c, max_tokens=256, trials=2, warmup=2
        )
        step = PROFILE.step_time(min(c, PROFILE.max_running_requests))
        f = level.figures
        got = f.itl_s_p50 / f.clock if f.itl_s_p50 is not None else float("nan")
        err = (got / step - 1) * 100
        out.append(
            (f"ITL p50 at C={c}", f"{err:+.2f}%", "5%", abs(err) <= 5, _disturbance(level, stats))
        )
    return out


def sends() -> list[Result]:
    body = json.dumps(
        {
            "model": "kimi-k2.6-sim",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": 8,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    rate = 50.0
    plan = OpenLoopPlan(rate=rate, bodies=[body], requests=200, timeout_s=10, seed=7)

    async def run() -> Any:
        with SimProcess(SimConfig(speed=20)) as sim:
            async with LoadClient() as client:
                return await client.run_open_loop(Target(f"{sim.url}/v1/chat/completions"), plan)

    tr = asyncio.run(run())
    late = sorted(r.sent - r.scheduled for r in tr.records)
    p50, p99 = statistics.median(late), late[min(len(late) - 1, int(0.99 * len(late)))]
    achieved = (tr.achieved_rate or 0.0) / rate - 1
    machine = f"client stall <= {tr.loop_lag_max_s * 1e3:.1f} ms"
    return [
        ("open loop: send lateness p50", f"{p50 * 1e3:.2f} ms", "5 ms", p50 < 0.005, machine),
        ("open loop: send lateness p99", f"{p99 * 1e3:.2f} ms", "20 ms", p99 < 0.02, machine),
        (
            "open loop: achieved rate",
            f"{achieved * 100:+.2f}%",
            "5%",
            abs(achieved) < 0.05,
            machine,
        ),
    ]


CLAIMS: dict[str, Callable[[], list[Result]]] = {
    "window": window,
    "ttft": ttft,
    "itl": itl,
    "sends": sends,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only", default=",".join(CLAIMS), help="comma-separated: " + ", ".join(CLAIMS)
    )
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CLAIMS]
    if unknown:
        ap.error(f"unknown claims {unknown}; known: {', '.join(CLAIMS)}")
    missed = 0
    print(f"{'claim':<36} {'figure':>12} {'margin':>22}  {'':4}  machine")
    for name in names:
        for claim, figure, margin, met, machine in CLAIMS[name]():
            missed += not met
            print(f"{claim:<36} {figure:>12} {margin:>22}  {'ok' if met else 'MISS':4}  {machine}")
    print(f"{missed} claim(s) missed" if missed else "every claim met")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
