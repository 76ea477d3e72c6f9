"""Open-loop load: Poisson and gamma schedules (``burstiness``), sends on time with no cap or
at most ``max_concurrency`` in flight, stops on failures, live counters.

The schedule math is checked offline on large samples; the sending is checked against the
simulator in its own process (speed 20), so the client's timing is not disturbed by a server
on the same event loop.  How late a send may be is not a fixed figure: it is bounded by the
client's own lag monitor (a send is late only while the loop was held up), so the bounds hold
on a machine that shares its cores with other work.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import statistics
import time
import urllib.request
from collections.abc import Iterator

import pytest

from pytest_kimi.load import (
    LiveTrial,
    LoadClient,
    OpenLoopPlan,
    Target,
    TrialPlan,
    poisson_arrivals,
)
from pytest_kimi.load.openloop import deal, gamma_arrivals, queue_waits
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.load.trial_book import LAG_INTERVAL_S, peak_inflight
from pytest_kimi.load.sharding import shard_open
from pytest_kimi.load.workers import ShardedClient
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from support.timing import send_late_bound_s

CHAT = "/v1/chat/completions"


def body(max_tokens: int = 8) -> bytes:
    return json.dumps(
        {
            "model": "kimi-k2.6-sim",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with SimProcess(SimConfig(speed=20)) as proc:
        assert proc.url is not None
        yield proc.url + CHAT


def gaps(xs: list[float]) -> list[float]:
    return [b - a for a, b in zip(xs, xs[1:])]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


def late_bound_s(tr: TrialRecords) -> float:
    """The most any send of ``tr`` may be late: what its lag monitor saw."""
    return send_late_bound_s(tr.loop_lag_max_s, LAG_INTERVAL_S)


# ------------------------------------------------------------------------- schedule (offline)
def test_exact_rate_schedule_is_poisson_shaped() -> None:
    rate = 50.0
    offs = poisson_arrivals(rate, requests=20_000, seed=1)
    assert len(offs) == 20_000 and offs[0] == 0.0 and offs == sorted(offs)
    g = gaps(offs)
    assert statistics.fmean(g) == pytest.approx(1 / rate, rel=1e-9)  # pinned by exact_rate
    assert 0.97 < cv(g) < 1.03  # exponential: cv 1
    # memorylessness shows as P(gap < mean) = 1 - 1/e
    below = sum(x < 1 / rate for x in g) / len(g)
    assert below == pytest.approx(1 - math.exp(-1), abs=0.015)


def test_plain_poisson_and_seeds() -> None:
    a = poisson_arrivals(50.0, requests=20_000, seed=3, exact_rate=False)
    assert statistics.fmean(gaps(a)) == pytest.approx(1 / 50, rel=0.03)
    assert 0.97 < cv(gaps(a)) < 1.03
    assert poisson_arrivals(50.0, requests=100, seed=3) == poisson_arrivals(
        50.0, requests=100, seed=3
    )
    assert poisson_arrivals(50.0, requests=100, seed=3) != poisson_arrivals(
        50.0, requests=100, seed=4
    )


def test_duration_and_count_limits() -> None:
    offs = poisson_arrivals(40.0, duration_s=2.0, seed=0)
    assert len(offs) == 80 and offs[-1] == pytest.approx(79 / 40) and offs[-1] < 2.0
    plain = poisson_arrivals(40.0, duration_s=2.0, seed=0, exact_rate=False)
    assert plain and max(plain) < 2.0
    both = poisson_arrivals(10.0, requests=1000, duration_s=1.0, seed=0)
    assert 0 < len(both) < 1000 and max(both) < 1.0
    assert poisson_arrivals(10.0, requests=0) == [] and poisson_arrivals(10.0, requests=1) == [0.0]
    with pytest.raises(ValueError, match="arrivals planned"):
        poisson_arrivals(1e6, duration_s=1e6)


def test_the_poisson_schedule_is_what_it_was_before_burstiness() -> None:
    """Shape 1 (the default) draws exactly the exponential gaps the schedule always drew: the
    same seed gives the same instants as before the knob (values from the code before it)."""
    assert poisson_arrivals(50.0, requests=5, seed=0) == [
        0.0,
        0.03608807342039999,
        0.06360360462755238,
        0.07418817992325115,
        0.08,
    ]
    assert gamma_arrivals(40.0, duration_s=0.1, seed=3, exact_rate=False) == [
        0.0,
        0.006794057580841709,
        0.02643818965358599,
        0.037987297101566314,
        0.06114077623592696,
        0.08570957401316681,
        0.08740393737754056,
        0.08773532383365643,
    ]
    plan = OpenLoopPlan(rate=30.0, bodies=[b"{}"], requests=200, seed=5)
    assert plan.burstiness == 1.0 and plan.max_concurrency is None
    assert plan.arrivals() == poisson_arrivals(30.0, requests=200, seed=5)


def _cv_sigma(shape: float, n: int) -> float:
    """One standard error of the sample cv of ``n`` gamma(shape) gaps, relative to the cv:
    the sample sd's (its variance has variance ``sigma**4 (2 + 6 / shape) / n``: the gamma's
    excess kurtosis is ``6 / shape``) and the mean's (``cv**2 / n``) added, ignoring their
    positive covariance, which only makes the ratio steadier."""
    return math.sqrt((1 + 3 / shape) / (2 * n) + 1 / (shape * n))


@pytest.mark.parametrize("shape", [0.25, 0.5, 2.0, 8.0])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(shape: float) -> None:
    """vLLM's ``get_request``: gaps ~ gamma(shape=burstiness, scale=1 / (rate * burstiness)).
    The bounds are 5 standard errors of the sample (20,000 gaps), from the gamma's moments."""
    rate, n = 40.0, 20_000
    plain = gaps(gamma_arrivals(rate, burstiness=shape, requests=n + 1, seed=11, exact_rate=False))
    mean_se = (1 / rate) / math.sqrt(shape * n)
    assert abs(statistics.fmean(plain) - 1 / rate) <= 5 * mean_se
    want = 1 / math.sqrt(shape)
    assert abs(cv(plain) / want - 1) <= 5 * _cv_sigma(shape, n), (cv(plain), want)
    # exact_rate pins the mean (the schedule spans (n - 1) / rate, as vLLM rescales it) and
    # keeps the shape
    pinned = gaps(gamma_arrivals(rate, burstiness=shape, requests=n + 1, seed=11))
    assert statistics.fmean(pinned) == pytest.approx(1 / rate, rel=1e-9)
    assert abs(cv(pinned) / want - 1) <= 5 * _cv_sigma(shape, n)
    # a duration without a count: gaps of the same law until it runs out
    timed = gamma_arrivals(rate, burstiness=shape, duration_s=n / rate, seed=2, exact_rate=False)
    assert max(timed) < n / rate
    assert abs(len(timed) - n) <= 5 * math.sqrt(n / shape)  # a renewal count's spread


def test_gamma_schedules_are_seeded() -> None:
    one = gamma_arrivals(10.0, burstiness=0.3, requests=100, seed=4)
    assert one == gamma_arrivals(10.0, burstiness=0.3, requests=100, seed=4)
    assert one != gamma_arrivals(10.0, burstiness=0.3, requests=100, seed=5)
    assert one != gamma_arrivals(10.0, burstiness=0.31, requests=100, seed=4)
    assert one[0] == 0.0 and one == sorted(one)


def test_burstiness_and_cap_validation() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="burstiness"):
            OpenLoopPlan(rate=1.0, bodies=[b"{}"], requests=1, burstiness=bad)
        with pytest.raises(ValueError, match="burstiness"):
            gamma_arrivals(1.0, burstiness=bad, requests=3)
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenLoopPlan(rate=1.0, bodies=[b"{}"], requests=1, max_concurrency=0)


def test_a_capped_schedule_is_dealt_so_the_caps_sum_to_it() -> None:
    """Sharded: each worker gets a share of the cap (at least 1, so no more workers than
    slots), so the processes together never exceed it."""
    target = Target("http://127.0.0.1:1/x")

    def caps(cap: int | None, workers: int) -> list[int | None]:
        plan = OpenLoopPlan(rate=10.0, bodies=[b"{}"], requests=20, max_concurrency=cap)
        shards = shard_open(target, plan, workers)
        assert sorted(i for s in shards for i in s.job.indices or []) == list(range(20))
        return [s.job.plan.max_concurrency for s in shards]  # type: ignore[union-attr]

    assert caps(5, 3) == [2, 2, 1]
    assert caps(2, 4) == [1, 1]
    assert caps(None, 3) == [None, None, None]


def test_deal_round_robin() -> None:
    offs = poisson_arrivals(10.0, requests=7)
    parts = deal(offs, 3)
    assert [p[0] for p in parts] == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(o for p in parts for o in p[1]) == offs


def test_plan_validation() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="rate"):
            OpenLoopPlan(rate=bad, bodies=[b"{}"], requests=1)
    with pytest.raises(ValueError, match="requests or duration_s"):
        OpenLoopPlan(rate=1.0, bodies=[b"{}"])
    with pytest.raises(ValueError, match="bodies"):
        OpenLoopPlan(rate=1.0, bodies=[], requests=1)
    with pytest.raises(ValueError, match="timeout_s"):
        OpenLoopPlan(rate=1.0, bodies=[b"{}"], requests=1, timeout_s=0)


# ----------------------------------------------------------------------- against the simulator
@pytest.mark.asyncio
async def test_rate_schedule_delay_and_records(sim: str) -> None:
    # 2 s (seed 7: cv 1.01); the bounds below are the lateness the lag monitor measured, so
    # they hold on a shared machine however long the schedule
    rate, n = 50.0, 100
    plan = OpenLoopPlan(rate=rate, bodies=[body(8), body(9)], requests=n, timeout_s=10, seed=7)
    async with LoadClient() as client:
        tr = await client.run_open_loop(Target(sim), plan)
    recs = tr.records
    assert [r.index for r in recs] == list(range(n)) and all(r.worker == r.index for r in recs)
    assert all(r.ok for r in recs), [r.error for r in recs if r.error][:3]
    assert [r.completion_tokens for r in recs] == [8 + (i % 2) for i in range(n)]  # body i % 2
    # scheduled = the plan, to the float: Poisson-shaped (cv near 1) at exactly the rate
    planned = plan.arrivals()
    assert [r.scheduled - tr.started for r in recs] == pytest.approx(planned, abs=1e-9)
    assert statistics.fmean(gaps(planned)) == pytest.approx(1 / rate)
    assert 0.75 < cv(gaps(planned)) < 1.25
    assert tr.offered_rate == rate
    # lateness: ~1 ms on an idle machine (the loop's timer resolution); any more is a stall
    # of the whole loop (the machine), which the lag monitor sees too, not the scheduler
    delays = [r.sent - r.scheduled for r in recs]
    bound = late_bound_s(tr)
    assert 0 <= min(delays) and max(delays) <= bound, (max(delays), bound, tr.loop_lag_p99_s)
    assert tr.schedule_delay_p99_s is not None
    assert min(delays) <= tr.schedule_delay_p99_s <= max(delays)
    # so the sends keep the plan's shape, and the rate that left is the plan's give or take
    # the lateness of the first and the last send
    sends = sorted(r.sent for r in recs)
    assert tr.achieved_rate == pytest.approx((n - 1) / (sends[-1] - sends[0]))
    assert abs((sends[-1] - sends[0]) - planned[-1]) <= bound
    assert tr.concurrency == peak_inflight(recs) >= 1
    assert tr.lag_samples > 0 and tr.client_cpu_s > 0 and tr.stopped_early is None
    assert tr.ended >= max(r.end for r in recs) >= tr.started + planned[-1]


@pytest.mark.asyncio
async def test_no_cap_on_in_flight_when_the_server_is_slow() -> None:
    """A server that runs 2 sequences at a time and is offered more: the open loop keeps
    sending, so requests pile up in flight far past what a closed loop at C=2 would hold."""
    with SimProcess(SimConfig(speed=20, max_running_requests=2)) as proc:
        target = Target(f"{proc.url}{CHAT}")
        async with LoadClient() as client:
            opened = await client.run_open_loop(
                target, OpenLoopPlan(rate=100.0, bodies=[body(48)], requests=40, timeout_s=20)
            )
            closed = await client.run_trial(
                target, TrialPlan(concurrency=2, bodies=[body(48)], requests=8, timeout_s=20)
            )
    assert all(r.ok for r in opened.records)
    assert peak_inflight(closed.records) <= 2
    assert opened.concurrency >= 10, opened.concurrency
    # ...and yet every request left on time (late only by what the loop's lag explains):
    # the client is not what queued them
    assert max(r.sent - r.scheduled for r in opened.records) <= late_bound_s(opened)
    ttfts = [r.ttft for r in opened.records if r.ttft is not None]
    assert max(ttfts) > 5 * min(ttfts)  # queueing shows up as TTFT, as it should


def _running(base: str) -> int:
    """Requests the simulator holds now (running and waiting: its ``/sim/stats``)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base + "/sim/stats", timeout=10) as resp:
        stats = json.load(resp)
    return int(stats["running"]) + int(stats["waiting"])


@pytest.mark.asyncio
@pytest.mark.parametrize("workers", [1, 2])
async def test_max_concurrency_caps_what_is_in_flight(workers: int) -> None:
    """Offered 200/s of 48-token requests, capped at 3: never more than 3 in flight, by the
    records' own send and end stamps and by the server's count sampled while it runs; the
    arrivals queue for slots, the queue waits say for how long, and the achieved rate is the
    rate the cap let through, far below the offered one.  Each send is late only by what the
    client's lag explains: ``scheduled`` is when its slot freed.  Sharded over two processes
    the caps (2 + 1) hold the same total."""
    cap, n = 3, 30
    with SimProcess(SimConfig(speed=20)) as proc:
        assert proc.url is not None
        base = proc.url
        plan = OpenLoopPlan(
            rate=200.0, bodies=[body(48)], requests=n, timeout_s=20, max_concurrency=cap
        )
        seen: list[int] = []

        async def sample() -> None:
            while True:
                seen.append(await asyncio.to_thread(_running, base))
                await asyncio.sleep(0.01)

        client = ShardedClient(workers) if workers > 1 else LoadClient()
        async with client:
            sampler = asyncio.ensure_future(sample())
            try:
                tr = await client.run_open_loop(Target(base + CHAT), plan)
            finally:
                sampler.cancel()
    recs = tr.records
    assert len(recs) == n and all(r.ok for r in recs), [r.error for r in recs if r.error][:3]
    assert peak_inflight(recs) <= cap and tr.concurrency <= cap
    assert seen and max(seen) <= cap, seen
    waits = queue_waits(recs, plan.arrivals(), tr.started)
    assert len(waits) == n and sum(1 for w in waits if w > 0) >= n - cap - workers
    # the cap, not the schedule, sets the pace: about cap requests per request time
    e2e = statistics.median(r.e2e for r in recs)
    assert tr.achieved_rate is not None and tr.offered_rate == 200.0
    assert tr.achieved_rate < 200.0 / 2 and tr.achieved_rate <= 2 * cap / e2e
    for r in recs:
        assert r.sent - r.scheduled <= late_bound_s(tr)


@pytest.mark.asyncio
async def test_a_cap_above_the_load_changes_nothing(sim: str) -> None:
    """Offered 20/s of short requests with a cap of 50: no arrival ever finds the slots
    taken, so every request leaves at its planned instant and no one waited."""
    plan = OpenLoopPlan(rate=20.0, bodies=[body(4)], requests=20, timeout_s=10, max_concurrency=50)
    async with LoadClient() as client:
        tr = await client.run_open_loop(Target(sim), plan)
    assert [r.scheduled - tr.started for r in tr.records] == pytest.approx(
        plan.arrivals(), abs=1e-9
    )
    assert queue_waits(tr.records, plan.arrivals(), tr.started) == [0.0] * 20


def _dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}{CHAT}"


@pytest.mark.asyncio
async def test_max_failures_stops_a_dead_server_quickly() -> None:
    """No send after the fifth failure (allowing a send already due while the loop was held
    up), and then only the requests in flight to wait for: 5 of 10,000 planned, not 50 s."""
    plan = OpenLoopPlan(rate=200.0, bodies=[body()], requests=10_000, timeout_s=5, max_failures=5)
    async with LoadClient() as client:
        tr = await client.run_open_loop(Target(_dead_url()), plan)
    assert tr.stopped_early is not None and tr.stopped_early.startswith("max_failures reached: 5")
    assert "server looks down" in tr.stopped_early
    assert all(not r.ok for r in tr.records) and 5 <= len(tr.records) < 10_000
    fifth = sorted(r.end for r in tr.records)[4]
    assert max(r.sent for r in tr.records) <= fifth + late_bound_s(tr)
    assert tr.ended <= fifth + max(r.end - r.sent for r in tr.records) + late_bound_s(tr)


@pytest.mark.asyncio
async def test_stop_wakes_a_sleeping_scheduler() -> None:
    """At 0.01 req/s the next arrival is minutes away; a stop must not wait for it."""
    plan = OpenLoopPlan(rate=0.01, bodies=[body()], requests=100, timeout_s=5, max_failures=1)
    second = plan.arrivals()[1]
    assert second > 60
    t0 = time.perf_counter()
    async with LoadClient() as client:
        tr = await client.run_open_loop(Target(_dead_url()), plan)
    assert len(tr.records) == 1 and tr.stopped_early is not None
    assert time.perf_counter() - t0 < second, "the scheduler slept until the next arrival"


@pytest.mark.asyncio
async def test_live_counters(sim: str) -> None:
    n = 60
    live = LiveTrial(total=n)
    seen: list[tuple[int, int, int]] = []

    async def sample() -> None:
        while True:
            await asyncio.sleep(0.05)
            seen.append((live.done, len(live.inflight), live.approx_tokens()))

    async with LoadClient() as client:
        sampler = asyncio.ensure_future(sample())
        try:
            tr = await client.run_open_loop(
                Target(sim),
                OpenLoopPlan(rate=100.0, bodies=[body(16)], requests=n, timeout_s=10),
                live,
            )
        finally:
            sampler.cancel()
    assert live.started == tr.started
    assert (live.done, live.failed, live.inflight) == (n, 0, {})
    assert live.tokens == sum(r.completion_tokens for r in tr.records) == 16 * n
    assert any(0 < d < n for d, _, _ in seen)  # updated during the trial, not only at the end
    assert any(k > 0 for _, k, _ in seen)
    assert [t for _, _, t in seen] == sorted(t for _, _, t in seen)


@pytest.mark.asyncio
async def test_duration_only_plan(sim: str) -> None:
    plan = OpenLoopPlan(rate=50.0, bodies=[body(4)], duration_s=0.5, timeout_s=10)
    async with LoadClient() as client:
        tr = await client.run_open_loop(Target(sim), plan)
    assert len(tr.records) == 25 and all(r.ok for r in tr.records)
    assert max(r.scheduled for r in tr.records) - tr.started < 0.5
