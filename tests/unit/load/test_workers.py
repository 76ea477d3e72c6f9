"""ShardedClient: a trial over worker processes gives the records one client would, and the
processes are started once, agree on one clock, and never outlive the client.

Worker start-up costs about a second per client on a slow machine, so the trial checks share
one module-scoped client; the lifecycle checks (close, kill, parent death, Ctrl-C) each need
their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from array import array
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio

from pytest_kimi.load import (
    LiveTrial,
    LoadClient,
    OpenLoopPlan,
    ShardedClient,
    Target,
    TrialPlan,
    TrialRecords,
    WorkerError,
)
from pytest_kimi.load.trial_book import LAG_INTERVAL_S, peak_inflight
from pytest_kimi.load.sharding import (
    interleave,
    shard_closed,
    shard_open,
    split_even,
    split_proportional,
)
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from support.timing import DEADLINE_S, TIMER_SLACK_S, apoll_until, poll_until, send_late_bound_s
from support.paths import REPO

CHAT = "/v1/chat/completions"
ROOT = REPO
T = Target("http://127.0.0.1:9/v1/chat/completions")


def body(max_tokens: int = 8, tag: int = 0) -> bytes:
    return json.dumps(
        {
            "model": "kimi-k2.6-sim",
            "messages": [{"role": "user", "content": f"hi {tag}"}],
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for a reaper that is not us."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_gone(pids: list[int], timeout: float = DEADLINE_S) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


@pytest.fixture(scope="module")
def sim() -> Iterator[Target]:
    with SimProcess(SimConfig(speed=20)) as proc:
        yield Target(f"{proc.url}{CHAT}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sharded() -> AsyncIterator[ShardedClient]:
    async with ShardedClient(2) as client:
        yield client


# ------------------------------------------------------------------------- sharding (offline)
def test_splits() -> None:
    assert split_even(5, 2) == [3, 2] and split_even(1, 2) == [1, 0] and split_even(8, 2) == [4, 4]
    assert split_proportional(10, [3, 2]) == [6, 4] and split_proportional(4, [3, 2]) == [2, 2]
    assert split_proportional(7, [1, 1, 1]) == [3, 2, 2] and split_proportional(0, [2, 2]) == [0, 0]
    assert interleave([4, 4], [4, 4]) == [[0, 2, 4, 6], [1, 3, 5, 7]]  # equal: round-robin
    tables = interleave([6, 4], [3, 2])
    assert sorted(tables[0] + tables[1]) == list(range(10))


def test_shard_closed_keeps_global_indices_and_bodies() -> None:
    bodies = [body(tag=i) for i in range(3)]
    plan = TrialPlan(concurrency=5, bodies=bodies, requests=10, max_failures=5, warmup=4)
    shards = shard_closed(T, plan, 2)
    plans = [s.job.plan for s in shards if isinstance(s.job.plan, TrialPlan)]
    assert [p.concurrency for p in plans] == [3, 2] and [p.requests for p in plans] == [6, 4]
    assert [s.first_slot for s in shards] == [0, 3]
    assert [p.max_failures for p in plans] == [3, 2] and [p.warmup for p in plans] == [2, 2]
    seen = []
    for s in shards:
        for i in range(s.job.plan.requests):  # type: ignore[arg-type]
            g = s.global_index(i)
            seen.append(g)
            assert (
                s.job.plan.bodies[i % len(s.job.plan.bodies)] == bodies[g % 3]
            )  # the body g would get
    assert sorted(seen) == list(range(10))
    # duration only: unique indices, each with its single-client body
    dplan = TrialPlan(concurrency=4, bodies=bodies, duration_s=1.0)
    dsh = shard_closed(T, dplan, 2)
    got = {
        s.global_index(i): s.job.plan.bodies[i % len(s.job.plan.bodies)]
        for s in dsh
        for i in range(50)
    }
    assert len(got) == 100 and all(b == bodies[g % 3] for g, b in got.items())
    # a worker with no slots gets nothing; nothing at all still runs one (empty) shard
    assert len(shard_closed(T, TrialPlan(concurrency=1, bodies=bodies, requests=5), 2)) == 1
    empty = shard_closed(T, TrialPlan(concurrency=4, bodies=bodies, requests=0), 2)
    assert len(empty) == 1 and empty[0].job.plan.requests == 0


def test_shard_open_deals_one_schedule() -> None:
    plan = OpenLoopPlan(rate=40.0, bodies=[body()], requests=9, max_failures=4, seed=3)
    shards = shard_open(T, plan, 2)
    assert [s.job.indices for s in shards] == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]
    offs = sorted(o for s in shards for o in (s.job.offsets or []))
    assert offs == plan.arrivals()
    assert [getattr(s.job.plan, "rate", None) for s in shards] == [20.0, 20.0] and [
        s.job.plan.max_failures for s in shards
    ] == [2, 2]


def test_records_pickle_with_arrays() -> None:
    rec = RequestRecord(
        index=3,
        worker=1,
        scheduled=1.5,
        sent=1.6,
        first_token=1.7,
        end=2.0,
        chunk_times=array("d", [1.7, 1.8]),
        chunk_events=array("I", [1, 2]),
        completion_tokens=3,
        status=200,
        finish_reason="length",
    )
    tr = TrialRecords(records=[rec], started=1.0, ended=2.0, concurrency=1)
    back = pickle.loads(pickle.dumps(tr, protocol=pickle.HIGHEST_PROTOCOL))
    r = back.records[0]
    assert (r.index, r.sent, r.ttft, list(r.chunk_times), list(r.chunk_events), r.ok) == (
        3,
        1.6,
        rec.ttft,
        [1.7, 1.8],
        [1, 2],
        True,
    )


# --------------------------------------------------------------------- trials (shared client)
@pytest.mark.asyncio(loop_scope="module")
async def test_clocks_agree_across_processes(sharded: ShardedClient) -> None:
    samples = await sharded.check_clocks()
    assert [s.worker for s in samples] == [0, 1] and [s.pid for s in samples] == sharded.pids
    # one system-wide clock: each worker's reading falls inside the parent's round trip
    assert all(s.before <= s.worker_t <= s.after for s in samples)
    assert len(set(sharded.pids)) == 2 and os.getpid() not in sharded.pids


@pytest.mark.asyncio(loop_scope="module")
async def test_two_workers_give_one_clients_records(sharded: ShardedClient, sim: Target) -> None:
    plan = TrialPlan(concurrency=8, bodies=[body(24), body(25)], requests=32, timeout_s=20)
    live = LiveTrial(total=32)
    tr = await sharded.run_trial(sim, plan, live)
    async with LoadClient() as single:
        one = await single.run_trial(sim, plan)
    for x in (tr, one):
        assert [r.index for r in x.records] == list(range(32))
        assert sorted({r.worker for r in x.records}) == list(range(8))
        assert all(r.ok for r in x.records), [r.error for r in x.records if r.error][:3]
        assert [r.completion_tokens for r in x.records] == [24 + (i % 2) for i in range(32)]
        assert x.concurrency == 8 and x.stopped_early is None
    assert (live.done, live.failed, live.tokens, live.remote_inflight_tokens) == (
        32,
        0,
        sum(24 + i % 2 for i in range(32)),
        0,
    )
    assert live.started == tr.started
    # concurrency really split: each process held its 4 slots, together 8
    assert [(s.concurrency, s.requests, s.first_slot, s.records) for s in tr.shards] == [
        (4, 16, 0, 16),
        (4, 16, 4, 16),
    ]
    assert [s.pid for s in tr.shards] == sharded.pids
    for s in tr.shards:
        mine = [r for r in tr.records if s.first_slot <= r.worker < s.first_slot + s.concurrency]
        assert peak_inflight(mine) == 4
    assert peak_inflight(tr.records) == 8
    assert tr.started <= min(r.sent for r in tr.records) and tr.ended >= max(
        r.end for r in tr.records
    )
    assert tr.client_cpu_s == pytest.approx(sum(s.client_cpu_s for s in tr.shards))
    assert tr.loop_lag_max_s == max(s.loop_lag_max_s for s in tr.shards)
    # both processes start at the agreed instant; a late first send is a held-up loop
    assert 0 <= tr.start_spread_s <= sum(tr.lag_values) + LAG_INTERVAL_S + TIMER_SLACK_S


@pytest.mark.asyncio(loop_scope="module")
async def test_uneven_split_and_warmup(sharded: ShardedClient, sim: Target) -> None:
    tr = await sharded.run_trial(
        sim, TrialPlan(concurrency=5, bodies=[body(16)], requests=10, warmup=3, timeout_s=20)
    )
    assert [(s.concurrency, s.requests) for s in tr.shards] == [(3, 6), (2, 4)]
    assert [r.index for r in tr.records] == list(range(10)) and all(r.ok for r in tr.records)
    assert sorted({r.worker for r in tr.records}) == [0, 1, 2, 3, 4]
    assert sorted(r.index for r in tr.warmup_records) == [0, 1, 2]
    assert all(
        r.end <= tr.started for r in tr.warmup_records
    )  # warm-up is over before the agreed start


@pytest.mark.asyncio(loop_scope="module")
async def test_open_loop_over_workers(sharded: ShardedClient, sim: Target) -> None:
    plan = OpenLoopPlan(rate=50.0, bodies=[body(8)], requests=100, timeout_s=20, seed=5)
    live = LiveTrial(total=100)
    tr = await sharded.run_open_loop(sim, plan, live)
    assert [r.index for r in tr.records] == list(range(100)) and all(r.ok for r in tr.records)
    assert [r.worker for r in tr.records] == list(range(100))
    # the same schedule one client would send, to the float, shared over two processes
    assert [r.scheduled - tr.started for r in tr.records] == pytest.approx(
        plan.arrivals(), abs=1e-9
    )
    # every arrival left on time, late only by what its process's lag monitor saw (the
    # merged trial keeps the worst process's); so the rate that left is the plan's
    late = [r.sent - r.scheduled for r in tr.records]
    bound = send_late_bound_s(tr.loop_lag_max_s, LAG_INTERVAL_S)
    assert 0 <= min(late) and max(late) <= bound, (max(late), bound)
    sends = sorted(r.sent for r in tr.records)
    assert tr.offered_rate == 50.0 and tr.achieved_rate == pytest.approx(
        (len(sends) - 1) / (sends[-1] - sends[0])
    )
    assert tr.schedule_delay_p99_s is not None and tr.schedule_delay_p99_s <= max(late)
    assert [s.requests for s in tr.shards] == [50, 50] and (live.done, live.failed) == (100, 0)


@pytest.mark.asyncio(loop_scope="module")
async def test_live_updates_during_a_sharded_trial(sharded: ShardedClient, sim: Target) -> None:
    live = LiveTrial(total=None)
    seen: list[tuple[int, int]] = []

    async def sample() -> None:
        while True:
            await asyncio.sleep(0.1)
            seen.append((live.done, live.approx_tokens()))

    sampler = asyncio.ensure_future(sample())
    try:
        tr = await sharded.run_trial(
            sim, TrialPlan(concurrency=4, bodies=[body(64)], duration_s=1.2, timeout_s=20), live
        )
    finally:
        sampler.cancel()
    assert any(0 < d < len(tr.records) for d, _ in seen)
    assert any(t > 0 for _, t in seen)
    assert len({r.index for r in tr.records}) == len(tr.records) > 4


@pytest.mark.asyncio(loop_scope="module")
async def test_dead_server_stops_every_worker(sharded: ShardedClient) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    plan = TrialPlan(concurrency=4, bodies=[body()], requests=10_000, max_failures=6, timeout_s=5)
    t0 = time.perf_counter()
    tr = await sharded.run_trial(Target(f"http://127.0.0.1:{port}{CHAT}"), plan)
    # refused at once: no request waited out its timeout
    assert time.perf_counter() - t0 < plan.timeout_s
    assert tr.stopped_early is not None and "max_failures" in tr.stopped_early
    assert all(s.stopped_early for s in tr.shards) and len(tr.records) < 100


# ------------------------------------------------------------------------------- lifecycle
@pytest.mark.asyncio
async def test_no_process_left_after_close(sim: Target) -> None:
    client = ShardedClient(2)
    async with client:
        pids = client.pids
        assert len(pids) == 2 and all(alive(p) for p in pids)
        await client.run_trial(
            sim, TrialPlan(concurrency=2, bodies=[body(4)], requests=4, timeout_s=20)
        )
    assert not any(alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="not open"):
        await client.run_trial(sim, TrialPlan(concurrency=2, bodies=[body(4)], requests=4))


@pytest.mark.asyncio
async def test_killed_worker_is_a_clear_error(sim: Target) -> None:
    async with ShardedClient(2) as client:
        pids = client.pids
        live = LiveTrial(total=40)
        plan = TrialPlan(concurrency=4, bodies=[body(400)], requests=40, timeout_s=20)
        trial = asyncio.ensure_future(client.run_trial(sim, plan, live))
        await apoll_until(lambda: live.approx_tokens() > 0, "the trial streaming")
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(
            WorkerError, match=rf"load worker 1 \(pid {pids[1]}\) was killed by SIGKILL"
        ):
            await asyncio.wait_for(trial, DEADLINE_S)
        # noticed while the trial ran: not after the surviving worker sent its half
        assert live.done < plan.requests // 2, live.done
        with pytest.raises(WorkerError, match="unusable: load worker 1"):
            await client.run_trial(sim, TrialPlan(concurrency=2, bodies=[body(4)], requests=2))
    assert wait_gone(pids) == []


def _child(script: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True, env=env
    )


CHILD = """
    import asyncio, json, sys
    from pytest_kimi.load import ShardedClient, Target, TrialPlan

    async def main():
        async with ShardedClient(2) as c:
            print(*c.pids, flush=True)
            body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True,
                               "max_tokens": 100000, "ignore_eos": True}).encode()
            await c.run_trial(Target(sys.argv[1]), TrialPlan(concurrency=2, bodies=[body], requests=2))

    asyncio.run(main())
"""


def _received(sim: Target) -> int:
    url = sim.url.split("/v1/")[0] + "/sim/stats"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as r:
        return int(json.load(r)["requests_received"])


def _streaming(sim: Target) -> Callable[[], bool]:
    """Whether two more requests than now have reached the simulator (the child's trial is
    streaming: one per worker)."""
    before = _received(sim)
    return lambda: _received(sim) >= before + 2


def test_workers_die_with_their_parent(sim: Target) -> None:
    """SIGKILL leaves no atexit to run: the workers must notice on their own."""
    streaming = _streaming(sim)
    proc = _child(CHILD.replace("sys.argv[1]", repr(sim.url)))
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    poll_until(streaming, "the child's trial streaming")
    proc.kill()
    proc.wait(10)
    assert wait_gone(pids) == []


def test_ctrl_c_in_the_parent_reaps_the_workers(sim: Target) -> None:
    streaming = _streaming(sim)
    proc = _child(CHILD.replace("sys.argv[1]", repr(sim.url)))
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    poll_until(streaming, "the child's trial streaming")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) != 0  # KeyboardInterrupt
    assert wait_gone(pids) == []
