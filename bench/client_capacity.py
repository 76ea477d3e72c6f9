"""How many streamed tokens/s can the load client ingest before *it* becomes the bottleneck?

Why: a throughput test is only meaningful if the client can take tokens faster than the server
produces them.  This script runs the client against ``bench/firehose.py`` (a server that is
never the bottleneck), each pinned to its own core where possible, and compares:

* ``pytest-kimi``  - our ``LoadClient`` (byte-counting SSE parser, block reads);
* ``json-every``   - a plain aiohttp client that reads lines and ``json.loads`` every chunk;
* ``count-limit``  - ``readany()`` blocks, only counts ``data: `` (no timing detail): the
  practical upper bound for a plain aiohttp client;
* ``drain-limit``  - the same with our ``drain()`` block read instead of ``readany()``: the
  upper bound for our client (what is left is aiohttp's HTTP parsing and the socket);
* ``vllm-bench``   - vLLM's benchmark client, when ``vllm.benchmarks`` is importable.

Modes:
  python bench/client_capacity.py                 # table at C=1, 64, 512
  python bench/client_capacity.py --framing batch # many SSE events per HTTP chunk
  python bench/client_capacity.py --usage running # the usage so far on every chunk (SGLang's
                                                  # continuous_usage_stats, which trials ask for)
  python bench/client_capacity.py --ramp          # paced ramp: tok/s before loop lag > 5 ms
  python bench/client_capacity.py --profile OUT   # our client at C=64 under py-spy (if installed)
  python bench/client_capacity.py --workers 1,2   # aggregate tok/s of ShardedClient vs worker processes
  python bench/client_capacity.py --open-rates 100,500,1000  # open loop: does each request leave on time?
  python bench/client_capacity.py --parser        # ns per read of the SSE parser alone, no sockets
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import statistics
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimi.load import LoadClient, OpenLoopPlan, ShardedClient, Target, TrialPlan  # noqa: E402
from pytest_kimi.load.request import drain  # noqa: E402
from pytest_kimi.load.trial_book import _LagMonitor, _p99, raise_nofile_limit  # noqa: E402

LAG_LIMIT_S = 0.005
ALL_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
"""CPUs this script may use, read before ``pin()`` narrows the process to one."""


@dataclass
class Result:
    client: str
    concurrency: int
    tokens: int
    wall_s: float
    cpu_s: float
    lag_max_s: float
    lag_p99_s: float
    errors: int
    blocks: int = 0
    """Read blocks that carried tokens (our client only): reads/s matter as much as tok/s."""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


# ----------------------------------------------------------------------------- server
class Firehose:
    """bench/firehose.py in a child process, pinned to ``cpu`` when given."""

    def __init__(self, cpu: int | None, tick_s: float = 0.01) -> None:
        cmd = [
            sys.executable,
            str(ROOT / "bench" / "firehose.py"),
            "--port",
            "0",
            "--tick",
            str(tick_s),
        ]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"firehose did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


FRAMING = "event"
USAGE = "final"
"""``final``: usage only at the end; ``running``: ``continuous_usage_stats``, the usage so far
on every token chunk, as the plugin's trials ask for it (the parser then reads each read's
count off it: the per-chunk path it adds)."""


def body(tokens: int, rate: float = 0.0) -> bytes:
    options: dict[str, bool] = {"include_usage": True}
    if USAGE == "running":
        options["continuous_usage_stats"] = True
    req = {
        "model": "default",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": tokens,
        "stream_options": options,
        "x_rate": rate,
        "x_framing": FRAMING,
    }
    return json.dumps(req, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------- clients
async def run_ours(url: str, c: int, requests: int, tokens: int, rate: float = 0.0) -> Result:
    async with LoadClient() as client:
        tr = await client.run_trial(
            Target(url),
            TrialPlan(concurrency=c, bodies=[body(tokens, rate)], requests=requests, timeout_s=30),
        )
    errors = [r.error for r in tr.records if r.error]
    if errors:
        print(f"  [pytest-kimi] {len(errors)} errors, first: {errors[0]}", file=sys.stderr)
    toks = sum(r.completion_tokens for r in tr.records if r.ok)
    blocks = sum(len(r.chunk_times) for r in tr.records)
    wall = tr.ended - tr.started
    if rate > 0:  # paced: measure over the streaming window, not connection setup/teardown
        firsts = [r.first_token for r in tr.records if r.first_token is not None]
        lasts = [r.last_token for r in tr.records if r.last_token is not None]
        if firsts and lasts:
            wall = max(lasts) - min(firsts)
    return Result(
        "pytest-kimi",
        c,
        toks,
        wall,
        tr.client_cpu_s * wall / max(tr.ended - tr.started, 1e-9),
        tr.loop_lag_max_s,
        tr.loop_lag_p99_s,
        len(errors),
        blocks,
    )


Reader = Callable[[aiohttp.ClientResponse], Awaitable[int]]


async def read_json_every(resp: aiohttp.ClientResponse) -> int:
    """What most benchmark clients do: a line at a time, json.loads every data line."""
    n = 0
    async for line in resp.content:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        obj = json.loads(payload)
        for ch in obj.get("choices") or ():
            if (ch.get("delta") or {}).get("content"):
                n += 1
    return n


async def read_count_limit(resp: aiohttp.ClientResponse) -> int:
    """The practical limit: block reads and one byte count per block, nothing else."""
    n = 0
    read = resp.content.readany
    while True:
        data = await read()
        if not data:
            break
        n += data.count(b"data: ")
    return n - 4  # role chunk, finish chunk, usage chunk and [DONE] are not tokens


async def read_drain_limit(resp: aiohttp.ClientResponse) -> int:
    """count-limit, but reading with our drain() (all buffered HTTP chunks at once)."""
    n = 0
    content = resp.content
    while True:
        data = await drain(content)
        if not data:
            break
        n += data.count(b"data: ")
    return n - 4


async def _timed_workers(
    worker: Callable[[], Awaitable[None]], c: int
) -> tuple[float, float, list[float]]:
    """Run ``c`` copies of ``worker`` under the lag monitor: (wall s, CPU s, lag samples)."""
    mon = _LagMonitor(0.005)
    mon.start()
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await mon.stop()
    return wall, cpu, list(mon.samples)


async def run_simple(
    name: str, reader: Reader, url: str, c: int, requests: int, tokens: int, rate: float = 0.0
) -> Result:
    conn = aiohttp.TCPConnector(limit=0)
    payload = body(tokens, rate)
    total = 0
    errors = 0
    nxt = 0
    async with aiohttp.ClientSession(
        connector=conn, read_bufsize=2**20, headers={"Content-Type": "application/json"}
    ) as s:

        async def worker() -> None:
            nonlocal total, errors, nxt
            while nxt < requests:
                nxt += 1
                try:
                    async with s.post(url, data=payload) as resp:
                        n = await reader(resp)  # not `total += await ...`: that loses updates
                    total += n
                except Exception:  # noqa: BLE001 - counted, this is a bench
                    errors += 1

        wall, cpu, lags = await _timed_workers(worker, c)
    return Result(name, c, max(total, 0), wall, cpu, max(lags, default=0.0), _p99(lags), errors)


async def run_vllm(
    url: str, c: int, requests: int, tokens: int, rate: float = 0.0
) -> Result | None:
    """vLLM's own benchmark client: its request function and its session settings.

    ``vllm bench serve`` drives ``async_request_openai_completions`` (backend ``openai``/
    ``vllm``) from a closed loop bounded by ``--max-concurrency`` over one aiohttp session
    whose connector is capped at that concurrency; this does the same, so the figure is
    that of its per-chunk work (an incremental UTF-8 decode, a string split per event and a
    ``json.loads`` per chunk), not of a different harness around it.
    """
    try:
        from vllm.benchmarks.lib.endpoint_request_func import (
            RequestFuncInput,
            async_request_openai_completions,
        )
    except Exception:  # noqa: BLE001 - not installed here (it lives in the engine env)
        return None
    extra = {"x_rate": rate, "x_framing": FRAMING} if rate > 0 else {"x_framing": FRAMING}
    req = RequestFuncInput(
        prompt="hi",
        api_url=url,
        prompt_len=1,
        output_len=tokens,
        model="default",
        ignore_eos=True,
        extra_body=extra,
    )
    conn = aiohttp.TCPConnector(
        limit=c,
        limit_per_host=c,
        ttl_dns_cache=300,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
        ssl=False,
    )
    total = errors = nxt = 0
    async with aiohttp.ClientSession(
        connector=conn, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    ) as session:

        async def worker() -> None:
            nonlocal total, errors, nxt
            while nxt < requests:
                nxt += 1
                out = await async_request_openai_completions(req, session)
                if out.success:
                    total += out.output_tokens or 0
                else:
                    errors += 1

        wall, cpu, lags = await _timed_workers(worker, c)
    return Result("vllm-bench", c, total, wall, cpu, max(lags, default=0.0), _p99(lags), errors)


CLIENTS: dict[str, Callable[..., Awaitable[Result | None]]] = {
    "pytest-kimi": run_ours,
    "json-every": lambda *a, **k: run_simple("json-every", read_json_every, *a, **k),
    "count-limit": lambda *a, **k: run_simple("count-limit", read_count_limit, *a, **k),
    "drain-limit": lambda *a, **k: run_simple("drain-limit", read_drain_limit, *a, **k),
    "vllm-bench": run_vllm,
}


def run_one(
    name: str, url: str, c: int, requests: int, tokens: int, rate: float = 0.0
) -> Result | None:
    """Each measurement on a fresh event loop."""
    return asyncio.run(CLIENTS[name](url, c, requests, tokens, rate))


# ------------------------------------------------------------------------------ modes
def pin(args: argparse.Namespace) -> tuple[int | None, int | None, str]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or args.no_pin:
        return None, None, f"not pinned ({len(cpus) or '?'} CPU(s) available)"
    client_cpu, server_cpu = cpus[0], cpus[1]
    os.sched_setaffinity(0, {client_cpu})
    return client_cpu, server_cpu, f"client on CPU {client_cpu}, firehose on CPU {server_cpu}"


def fmt_row(r: Result) -> str:
    return (
        f"| {r.client:<12} | {r.concurrency:>4} | {r.tokens:>9,} | {r.tok_s:>11,.0f} | {100 * r.cpu_share:>5.0f}% "
        f"| {1e3 * r.lag_max_s:>7.1f} | {1e3 * r.lag_p99_s:>7.1f} | {r.errors:>3} |"
    )


HEADER = (
    "| client       |    C |    tokens |  tok/s in   |   CPU  | lag max ms | lag p99 ms | err |\n"
    "|--------------|-----:|----------:|------------:|-------:|--------:|--------:|----:|"
)


def table_mode(args: argparse.Namespace, url: str) -> None:
    levels = [(1, 16, 8192), (64, 256, 2048), (512, 1024, 1024)]
    if args.quick:
        levels = [(1, 4, 2048), (64, 64, 1024), (512, 512, 128)]
    print(HEADER)
    for c, requests, tokens in levels:
        for name in args.clients:
            scale = (
                4 if name == "json-every" and not args.quick else 1
            )  # keep the slow client's run short
            r = run_one(name, url, c, max(c, requests // scale), tokens)
            if r is None:
                print(
                    f"| {name:<12} | {c:>4} | skipped: vllm is not installed here (tox -e engine has it) |"
                )
                continue
            print(fmt_row(r), flush=True)


async def _ramp_step(client: LoadClient, url: str, c: int, offered: float, step_s: float) -> bool:
    per_stream = offered / c
    tokens = max(8, int(per_stream * step_s))
    # warm connections first: connection setup is not what this step measures
    await client.run_trial(
        Target(url), TrialPlan(concurrency=c, bodies=[body(8)], requests=c, timeout_s=30)
    )
    tr = await client.run_trial(
        Target(url),
        TrialPlan(concurrency=c, bodies=[body(tokens, per_stream)], requests=c, timeout_s=30),
    )
    ok_recs = [r for r in tr.records if r.ok]
    toks = sum(r.completion_tokens for r in ok_recs)
    firsts = [r.first_token for r in ok_recs if r.first_token is not None]
    lasts = [r.last_token for r in ok_recs if r.last_token is not None]
    window = (max(lasts) - min(firsts)) if firsts and lasts else tr.ended - tr.started
    got = toks / window if window > 0 else 0.0
    reads = sum(len(r.chunk_times) for r in ok_recs) / window if window > 0 else 0.0
    cpu = tr.client_cpu_s / max(tr.ended - tr.started, 1e-9)
    ok = (
        tr.loop_lag_p99_s <= LAG_LIMIT_S
        and got >= 0.9 * offered
        and len(ok_recs) == len(tr.records)
    )
    print(
        f"| {offered:>13,.0f} | {got:>14,.0f} | {reads:>7,.0f} | {100 * cpu:>3.0f}% | {1e3 * tr.loop_lag_max_s:>10.1f} "
        f"| {1e3 * tr.loop_lag_p99_s:>10.1f} | {'yes' if ok else 'NO'} |",
        flush=True,
    )
    return ok


async def idle_lag(seconds: float = 2.0) -> tuple[float, float]:
    """Lag of an idle event loop (max, p99): the machine's noise floor for the 5 ms criterion."""
    mon = _LagMonitor(0.005)
    mon.start()
    await asyncio.sleep(seconds)
    await mon.stop()
    lags = list(mon.samples)
    return max(lags, default=0.0), _p99(lags)


async def _ramp(args: argparse.Namespace, url: str) -> float:
    c = args.ramp_concurrency
    best = 0.0
    offered = args.ramp_start
    mx, p99 = await idle_lag()
    print(
        f"idle loop lag on this machine now: max {1e3 * mx:.1f} ms, p99 {1e3 * p99:.1f} ms"
        + ("  (noisy: other processes are competing for the client's core)" if p99 > 0.002 else "")
    )
    print("| offered tok/s | ingested tok/s | reads/s | CPU | lag max ms | lag p99 ms | ok |")
    print("|--------------:|---------------:|--------:|----:|-----------:|-----------:|----|")
    async with LoadClient() as client:
        while offered <= args.ramp_max:
            # a failed step is retried once: on a shared machine one preemption of the client
            # by another process is enough to push lag p99 past 5 ms
            if not (
                await _ramp_step(client, url, c, offered, args.step_s)
                or await _ramp_step(client, url, c, offered, args.step_s)
            ):
                break
            best = offered
            offered *= args.ramp_factor
    return best


def ramp_mode(args: argparse.Namespace, url: str) -> None:
    """Offer paced load in steps; capacity = highest step ingested with loop-lag p99 <= 5 ms."""
    print(
        f"ramp at C={args.ramp_concurrency}, {args.step_s:g}s per step, firehose paced per stream "
        f"({1e3 * args.tick:g} ms ticks: every stream gets its tokens of a tick in one write, like a decode step)"
    )
    best = asyncio.run(_ramp(args, url))
    print(
        f"\ncapacity before loop lag p99 > {LAG_LIMIT_S * 1e3:g} ms: ~{best:,.0f} tok/s at C={args.ramp_concurrency}"
    )


# ----------------------------------------------------------------------- workers curve
def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all processes of the machine have used so far (Linux /proc/stat)."""
    try:
        f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class ShardedResult:
    workers: int
    layout: str
    tokens: int
    wall_s: float
    client_cores: float
    per_worker: list[float]
    server_cores: float
    other_cores: float
    """Everything else the machine ran meanwhile (other jobs): what the workers competed with."""
    lag_max_s: float
    errors: int

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def worker_cpus(
    n: int, layout: str, client_cpu: int | None, server_cpu: int | None
) -> list[set[int]] | None:
    """CPU set per worker.  ``spread``: client cores first, the firehose's core last (so on a
    2-core machine worker 1 shares the firehose's core); ``client-core``: every worker on the
    client's one core (sharding overhead with no extra CPU); ``none``: not pinned."""
    if layout == "none" or client_cpu is None:
        return None
    if layout == "client-core":
        return [{client_cpu}]
    order = [c for c in ALL_CPUS if c != server_cpu] + (
        [server_cpu] if server_cpu is not None else []
    )
    return [{order[k % len(order)]} for k in range(n)]


def window_tokens(records: list, t0: float, t1: float) -> int:
    """Token events whose read block arrived in ``[t0, t1)``, over all records."""
    n = 0
    for r in records:
        times = r.chunk_times
        a, b = bisect.bisect_left(times, t0), bisect.bisect_left(times, t1)
        if b > a:
            n += sum(r.chunk_events[a:b])
    return n


async def _run_sharded(
    url: str,
    n: int,
    cpus: list[set[int]] | None,
    c: int,
    duration_s: float,
    tokens: int,
    repeat: int,
    server_pid: int | None,
    layout: str,
) -> list[ShardedResult]:
    """Duration trials measured over a steady window (the first 20% and the tail after the
    deadline are left out): with a fixed request count per worker, a worker on a busier core
    would finish last and the idle tail of the others would be billed to the aggregate."""
    out = []
    async with ShardedClient(n, cpus=cpus) as client:
        # warm: every slot opens its connection outside the measurement
        await client.run_trial(
            Target(url), TrialPlan(concurrency=c, bodies=[body(8)], requests=c, timeout_s=30)
        )
        for _ in range(repeat):
            s0 = proc_cpu_s(server_pid) if server_pid else 0.0
            m0 = machine_busy_s()
            tr = await client.run_trial(
                Target(url),
                TrialPlan(
                    concurrency=c, bodies=[body(tokens)], duration_s=duration_s, timeout_s=30
                ),
            )
            m1 = machine_busy_s()
            s1 = proc_cpu_s(server_pid) if server_pid else 0.0
            t0, t1 = tr.started + 0.2 * duration_s, tr.started + duration_s
            errors = sum(not r.ok for r in tr.records)
            wall = tr.ended - tr.started
            # CPU figures are over the whole trial (including the tail), so shares use its wall
            out.append(
                ShardedResult(
                    n,
                    layout,
                    window_tokens(tr.records, t0, t1),
                    t1 - t0,
                    tr.client_cpu_s / wall,
                    [x.client_cpu_s / wall for x in tr.shards],
                    (s1 - s0) / wall,
                    max(0.0, (m1 - m0 - tr.client_cpu_s - (s1 - s0)) / wall),
                    tr.loop_lag_max_s,
                    errors,
                )
            )
    return out


def workers_mode(
    args: argparse.Namespace,
    url: str,
    fh: Firehose | None,
    client_cpu: int | None,
    server_cpu: int | None,
) -> None:
    """Aggregate ingest of ShardedClient at 1, 2, ... worker processes, same total C."""
    counts = [int(x) for x in args.workers.split(",")]
    c, duration, tokens = args.workers_concurrency, args.workers_duration, args.workers_tokens
    if args.quick:
        duration = duration / 2
    print(
        f"closed loop C={c} split over the workers, {duration:g} s trials of {tokens}-token streams, tok/s over "
        f"the steady window (20%..100% of the duration); {args.repeat} trials per row (median, range; CPU and lag "
        f"of the best trial); {len(ALL_CPUS)} CPU(s): {ALL_CPUS}"
    )
    print(
        "| workers | worker CPUs | tokens | tok/s in (median) | range | client CPU, cores (per worker) | tok/s per client core | firehose CPU | other jobs' CPU | lag max ms | err |"
    )
    print("|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    base = None
    for n in counts:
        for layout in args.workers_layout:
            cpus = worker_cpus(n, layout, client_cpu, server_cpu)
            rs = asyncio.run(
                _run_sharded(
                    url,
                    n,
                    cpus,
                    c,
                    duration,
                    tokens,
                    args.repeat,
                    fh.proc.pid if fh else None,
                    layout,
                )
            )
            med = statistics.median(r.tok_s for r in rs)
            per_core = statistics.median(r.tok_s / r.client_cores for r in rs if r.client_cores > 0)
            best = max(rs, key=lambda r: r.tok_s)
            where = (
                "unpinned" if cpus is None else "+".join(str(sorted(x)[0]) for x in (cpus * n)[:n])
            )
            base = base or med
            print(
                f"| {n} | {where} ({layout}) | {best.tokens:,} | {med:,.0f} ({med / base:.2f}x) | "
                f"{min(r.tok_s for r in rs):,.0f}-{best.tok_s:,.0f} | {best.client_cores:.2f} "
                f"({'+'.join(f'{x:.2f}' for x in best.per_worker)}) | {per_core:,.0f} | "
                f"{best.server_cores:.2f} | {best.other_cores:.2f} | {1e3 * best.lag_max_s:.1f} | {sum(r.errors for r in rs)} |",
                flush=True,
            )


# -------------------------------------------------------------------- open-loop accuracy
async def _open_rates(url: str, rates: list[float], seconds: float, tokens: int) -> None:
    async with LoadClient() as client:
        await client.run_trial(
            Target(url), TrialPlan(concurrency=8, bodies=[body(8)], requests=8, timeout_s=30)
        )
        for rate in rates:
            plan = OpenLoopPlan(
                rate=rate, bodies=[body(tokens)], requests=max(2, int(rate * seconds)), timeout_s=30
            )
            tr = await client.run_open_loop(Target(url), plan)
            delays = sorted(r.sent - r.scheduled for r in tr.records)
            wall = tr.ended - tr.started
            print(
                f"| {rate:>7,.0f} | {tr.achieved_rate or 0:>10,.1f} | {1e3 * statistics.median(delays):>6.2f} "
                f"| {1e3 * (tr.schedule_delay_p99_s or 0):>6.2f} | {1e3 * delays[-1]:>6.1f} | {tr.concurrency:>5} "
                f"| {100 * tr.client_cpu_s / wall:>4.0f}% | {1e3 * tr.loop_lag_p99_s:>6.1f} | {sum(not r.ok for r in tr.records):>3} |",
                flush=True,
            )


def open_rates_mode(args: argparse.Namespace, url: str) -> None:
    """Open loop at each rate: achieved rate and the client's lateness against its schedule."""
    rates = [float(x) for x in args.open_rates.split(",")]
    print(
        f"open loop, {args.open_seconds:g} s of Poisson arrivals per rate, {args.open_tokens}-token streams"
    )
    print(
        "| req/s asked | achieved | delay p50 ms | p99 ms | max ms | peak in flight | client CPU | lag p99 ms | err |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    asyncio.run(_open_rates(url, rates, args.open_seconds, args.open_tokens))


CATEGORIES = [
    # (label, substring of a frame; the first match walking from the leaf upwards wins)
    ("SSE parser (pytest_kimi/load/sse*.py)", "pytest_kimi/load/sse"),
    ("block read: take() (pytest_kimi/load/request.py)", "take (pytest_kimi/load/request.py"),
    ("aiohttp request setup + connection", "_BaseRequestContextManager.__aenter__"),
    ("aiohttp HTTP parse + StreamReader feed (per HTTP chunk)", "ResponseHandler.data_received"),
    ("aiohttp response release", "__aexit__"),
    ("asyncio socket reads", "_read_ready"),
    ("runner / lag monitor / other", ""),
]


def summarize_profile(raw: Path) -> str:
    """Group py-spy's raw (collapsed) stacks into where the client's busy time goes."""
    totals = dict.fromkeys((label for label, _ in CATEGORIES), 0)
    busy = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "run_until_complete" not in stack:
            continue
        frames = stack.split(";")
        if "select (selectors.py" in frames[-1]:
            continue  # idle in epoll
        busy += int(n)
        for label, key in CATEGORIES:
            if any(key in f for f in reversed(frames)):
                totals[label] += int(n)
                break
    rows = [f"| {label} | {100 * v / max(busy, 1):.0f}% |" for label, v in totals.items()]
    return "| where | share of busy samples |\n|---|---:|\n" + "\n".join(rows)


def parser_mode(args: argparse.Namespace) -> None:
    """The parser's own cost per read block (``StreamParser.feed`` and ``close``), without
    sockets, aiohttp or an event loop: SGLang-shaped chunks from the firehose, with the usage
    only at the end or on every chunk, one or eight events a read.  The minimum over
    ``--repeat`` runs of 20 streams of 1024 tokens: what other processes on the machine add
    is never negative, so the minimum is the figure to compare between two trees."""
    import firehose as fh

    from pytest_kimi.load.records import RequestRecord
    from pytest_kimi.load.sse import StreamParser

    n = 1024
    role = fh._sse(
        fh._chunk_obj(
            {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}
        )
    )
    finish = fh._sse(
        fh._chunk_obj(
            {"role": None, "content": "", "reasoning_content": None, "tool_calls": None}, "length"
        )
    )
    usage = (
        b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"default",'
        b'"choices":[],"usage":{"prompt_tokens":32,"total_tokens":%d,"completion_tokens":%d}}'
        b"\n\n" % (32 + n, n)
    )
    print("| usage   | events a read | ns a read (min) | ns a token |")
    print("|---------|--------------:|----------------:|-----------:|")
    for running in (False, True):
        events = fh.running(n)[0] if running else [fh.EVENTS[i % len(fh.EVENTS)] for i in range(n)]
        for per in (1, 8):
            blocks = [role + b"".join(events[:per])]
            blocks += [b"".join(events[i : i + per]) for i in range(per, n, per)]
            blocks[-1] += finish + usage + b"data: [DONE]\n\n"
            best = float("inf")
            for _ in range(args.repeat * 5):
                t0 = time.perf_counter_ns()
                for _ in range(20):
                    rec = RequestRecord(index=0, worker=0, scheduled=0.0)
                    p = StreamParser(rec, "chat", 0)
                    for k, b in enumerate(blocks):
                        p.feed(k * 1e-3, b)
                    p.close()
                best = min(best, (time.perf_counter_ns() - t0) / 20 / len(blocks))
                assert rec.completion_tokens == n and rec.error is None
            print(
                f"| {'running' if running else 'final':<7} | {per:>13} | {best:>15,.0f} "
                f"| {best / per:>10,.0f} |",
                flush=True,
            )


def profile_mode(args: argparse.Namespace, url: str) -> None:
    spy = shutil.which("py-spy")
    if spy is None:
        print("py-spy not installed: pip install py-spy (kept out of the project's dependencies)")
        return
    out = Path(args.profile)
    cmd = [
        spy,
        "record",
        "--nonblocking",
        "--format",
        "raw",
        "-r",
        "250",
        "-o",
        str(out),
        "--",
        sys.executable,
        __file__,
        "--url",
        url,
        "--framing",
        args.framing,
        "--levels-only",
        str(args.profile_concurrency),
    ]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    print(f"py-spy raw profile in {out}, C={args.profile_concurrency}, framing={args.framing}\n")
    print(summarize_profile(out))


def main() -> None:
    ap = argparse.ArgumentParser(description="client ingest capacity against bench/firehose.py")
    ap.add_argument(
        "--clients",
        nargs="+",
        default=["pytest-kimi", "json-every", "count-limit", "drain-limit", "vllm-bench"],
        choices=list(CLIENTS),
    )
    ap.add_argument(
        "--framing",
        choices=["event", "batch"],
        default="event",
        help="firehose framing: one HTTP chunk per SSE event (uvicorn-like) or per 64-event batch",
    )
    ap.add_argument(
        "--usage",
        choices=["final", "running"],
        default="final",
        help="running: the usage so far on every chunk (continuous_usage_stats)",
    )
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--url", help="use a running firehose instead of starting one")
    ap.add_argument("--ramp", action="store_true")
    ap.add_argument("--ramp-concurrency", type=int, default=64)
    ap.add_argument(
        "--tick",
        type=float,
        default=0.01,
        help="firehose pacing tick (s): each paced stream gets one write per tick, like a decode step",
    )
    ap.add_argument("--ramp-start", type=float, default=10_000)
    ap.add_argument("--ramp-factor", type=float, default=1.4)
    ap.add_argument("--ramp-max", type=float, default=3_000_000)
    ap.add_argument("--step-s", type=float, default=3.0)
    ap.add_argument("--profile", metavar="OUT", help="py-spy raw (collapsed) profile of our client")
    ap.add_argument("--profile-concurrency", type=int, default=64)
    ap.add_argument("--levels-only", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--workers",
        metavar="N,N,...",
        help="ShardedClient curve: aggregate tok/s at these worker counts",
    )
    ap.add_argument(
        "--workers-layout",
        nargs="+",
        choices=["spread", "client-core", "none"],
        default=["spread"],
        help="worker pinning (see worker_cpus); several = one row each",
    )
    ap.add_argument("--workers-concurrency", type=int, default=64)
    ap.add_argument(
        "--workers-duration", type=float, default=3.0, help="seconds per --workers trial"
    )
    ap.add_argument("--workers-tokens", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3, help="trials per --workers row")
    ap.add_argument(
        "--open-rates", metavar="R,R,...", help="open-loop accuracy at these request rates"
    )
    ap.add_argument("--open-seconds", type=float, default=3.0)
    ap.add_argument("--open-tokens", type=int, default=64)
    ap.add_argument(
        "--parser", action="store_true", help="ns per read of the SSE parser alone (no sockets)"
    )
    args = ap.parse_args()
    if args.parser:
        sys.path.insert(0, str(ROOT / "bench"))
        pin(args)
        parser_mode(args)
        return
    global FRAMING, USAGE
    FRAMING = args.framing
    USAGE = args.usage
    raise_nofile_limit(8192)
    client_cpu, server_cpu, note = pin(args)
    fh = None if args.url else Firehose(server_cpu, args.tick)
    url = args.url or (fh.url if fh else "")
    try:
        if args.levels_only:
            r = run_one("pytest-kimi", url, args.levels_only, max(16, 4 * args.levels_only), 2048)
            print(HEADER + "\n" + fmt_row(r) if r else "")
            return
        print(
            f"# {note}; python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}; "
            f"framing={FRAMING}, usage={USAGE}"
        )
        if args.workers:
            workers_mode(args, url, fh, client_cpu, server_cpu)
        elif args.open_rates:
            open_rates_mode(args, url)
        elif args.profile:
            profile_mode(args, url)
        elif args.ramp:
            ramp_mode(args, url)
        else:
            table_mode(args, url)
    finally:
        if fh is not None:
            fh.close()


if __name__ == "__main__":
    main()
