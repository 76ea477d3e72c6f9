"""How late does a process that only sleeps wake up while a server runs beside it?

The load client's stall check (``measure/metrics.py``) reads a late-waking event loop at a low
CPU share as "another process took the core".  This script is that signal without the
client: an asyncio loop that sleeps 5 ms at a time and prints, each second, the worst
oversleep.  Run it in a shell of its own (another session) while a managed server is under
load, for example during ``tox -e engine``::

    python bench/wakeup_lag.py 60

Measured with vLLM's CPU build (profile ``servers/vllm-cpu-tiny-no-batching.yaml``, nice 10,
C=8) on 2 cores: up to 2,072 ms late while only the server's processes were niced; at most
7 ms once its session's autogroup was niced too (``echo 19 > /proc/PID/autogroup``, what
``server/procgroup.nice_session`` now does).
"""

from __future__ import annotations

import argparse
import asyncio
import time

SLEEP_S = 0.005


async def watch(duration_s: float) -> float:
    """Print the worst oversleep of each second; return the worst of the whole run."""
    end = time.perf_counter() + duration_s
    worst_run = worst = 0.0
    tick = time.perf_counter()
    while time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(SLEEP_S)
        lag = time.perf_counter() - t - SLEEP_S
        worst = max(worst, lag)
        if time.perf_counter() - tick >= 1.0:
            print(f"{time.strftime('%H:%M:%S')} worst wake-up lag {worst * 1e3:.0f} ms", flush=True)
            worst_run = max(worst_run, worst)
            worst, tick = 0.0, time.perf_counter()
    return max(worst_run, worst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("duration_s", type=float, nargs="?", default=30.0)
    args = parser.parse_args()
    worst = asyncio.run(watch(args.duration_s))
    print(f"worst over {args.duration_s:g} s: {worst * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
