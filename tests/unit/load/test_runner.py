"""Load runner and request layer against a tiny in-process aiohttp SSE server.

The server's behaviour is chosen per request by a ``mode`` field in the JSON body, so each
failure the client must survive (down, 500, stall, disconnect, garbage) is one line of setup.
Server and client share one event loop, which a :class:`~timing.LoopLag` watches: a time a
test measures is bounded by its nominal value plus how long that loop was held up (busy, or
without a CPU on a shared machine), never by a fixed allowance.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from pytest_kimi.load import LoadClient, Target, TrialPlan, stream_request
from pytest_kimi.load.request import EOF_GRACE_S
from pytest_kimi.load.trial_book import LAG_INTERVAL_S, raise_nofile_limit
from support.timing import DEADLINE_S, TIMER_SLACK_S, LoopLag, send_late_bound_s

SECRET = "sk-test-SECRET-0123456789"


def chunk(
    text: str | None, finish: str | None = None, usage: dict[str, int] | None = None
) -> bytes:
    obj: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    obj["choices"] = (
        []
        if text is None and finish is None
        else [
            {
                "index": 0,
                "delta": {"content": text} if text is not None else {},
                "finish_reason": finish,
            }
        ]
    )
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Stats:
    inflight: int = 0
    max_inflight: int = 0
    at_arrival: list[int] = field(default_factory=list)
    requests: int = 0
    auth: list[str] = field(default_factory=list)
    peers: set[Any] = field(default_factory=set)
    barrier: asyncio.Event = field(default_factory=asyncio.Event)


STATS = web.AppKey("stats", Stats)


async def handler(request: web.Request) -> web.StreamResponse:
    stats = request.app[STATS]
    body = await request.json()
    mode = body.get("mode", "ok")
    n = int(body.get("max_tokens", 4))
    delay = float(body.get("delay", 0.0))
    stats.requests += 1
    stats.inflight += 1
    stats.max_inflight = max(stats.max_inflight, stats.inflight)
    stats.at_arrival.append(stats.inflight)
    stats.auth.append(request.headers.get("Authorization", ""))
    assert request.transport is not None
    stats.peers.add(request.transport.get_extra_info("peername"))
    try:
        if mode == "500":
            return web.Response(status=500, text="internal boom " + "y" * 500)
        if mode == "401_echo":
            return web.Response(
                status=401, text=f"invalid key {request.headers.get('Authorization')}"
            )
        if body.get("barrier"):
            # hold every request until `barrier` are in flight at once (proves concurrency)
            if stats.inflight >= body["barrier"]:
                stats.barrier.set()
            await asyncio.wait_for(stats.barrier.wait(), DEADLINE_S)
        if mode == "stall_headers":
            await asyncio.sleep(30)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if body.get("first_delay"):
            await asyncio.sleep(float(body["first_delay"]))
        for i in range(n):
            if mode == "malformed" and i == 2:
                await resp.write(b"data: <<garbage>>\n\n")
            elif mode == "error_event" and i == 2:
                await resp.write(
                    b'data: {"error": {"message": "out of KV cache", "code": 503}}\n\n'
                )
            if mode == "disconnect" and i == 3:
                assert request.transport is not None
                request.transport.close()
                return resp
            if mode == "stall" and i == 1:
                await asyncio.sleep(30)
            if mode == "stall_late" and i == 4:
                await asyncio.sleep(30)
            # empty_text: tokens whose text the server holds back (a byte-level model's partial
            # UTF-8), streamed as empty deltas: vLLM does this with a tiny random model
            await resp.write(chunk("" if mode == "empty_text" else f" t{i}"))
            if delay:
                await asyncio.sleep(delay)
        await resp.write(chunk("", finish="length"))
        if mode != "nousage":
            await resp.write(
                chunk(
                    None, usage={"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
                )
            )
        if mode != "nodone":
            await resp.write(b"data: [DONE]\n\n")
        if mode == "linger":
            await asyncio.sleep(30)  # never ends the HTTP body after [DONE]
        if body.get("eof_delay"):  # like uvicorn: the final zero-length chunk comes separately
            await asyncio.sleep(float(body["eof_delay"]))
        await resp.write_eof()
        return resp
    finally:
        stats.inflight -= 1


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[str, Stats]]:
    app = web.Application()
    app[STATS] = stats = Stats()
    app.router.add_post("/v1/chat/completions", handler)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}/v1/chat/completions", stats
    finally:
        await srv.close()


@pytest_asyncio.fixture
async def client() -> AsyncIterator[LoadClient]:
    async with LoadClient() as c:
        yield c


@pytest_asyncio.fixture
async def lag() -> AsyncIterator[LoopLag]:
    """Watches the test's event loop (the server's and the client's) for the whole test."""
    async with LoopLag() as watch:
        yield watch


def stall_caught_within_s(timeout_s: float, lag: LoopLag) -> float:
    """How long after a stream falls silent the client may notice: the body watchdog looks
    every ``timeout_s / 4`` and fails the read once silence reaches ``timeout_s`` (within
    1.25x, six wake-ups), plus whatever held the loop up meanwhile."""
    return 1.25 * timeout_s + 6 * TIMER_SLACK_S + lag.total_slack_s()


def body(**kw: Any) -> bytes:
    return json.dumps({"model": "m", "stream": True, **kw}).encode()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ------------------------------------------------------------------------------ request layer
@pytest.mark.asyncio
async def test_ok_stream_fields(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(max_tokens=6, first_delay=0.05, delay=0.005),
        index=3,
        worker=1,
        scheduled=time.perf_counter(),
        timeout_s=5,
    )
    assert rec.ok, rec.error
    assert (rec.index, rec.worker, rec.status) == (3, 1, 200)
    assert (
        rec.events == 6
        and rec.completion_tokens == 6
        and rec.prompt_tokens == 5
        and not rec.tokens_approx
    )
    assert rec.finish_reason == "length"
    # the server holds the first token 50 ms: never sooner, later only by the loop's hold-ups
    assert rec.ttft is not None and 0.05 <= rec.ttft <= 0.05 + lag.total_slack_s()
    assert (
        rec.first_token == rec.chunk_times[0]
        and rec.sent <= rec.first_token <= rec.chunk_times[-1] <= rec.end
    )
    assert len(rec.chunk_times) >= 3  # paced tokens arrive in separate blocks


@pytest.mark.asyncio
async def test_no_usage_means_approx_tokens(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="nousage", max_tokens=7),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    assert rec.ok and rec.tokens_approx and rec.completion_tokens == 7


@pytest.mark.asyncio
async def test_http_500(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    rec = await stream_request(
        client.session, Target(url), body(mode="500"), index=0, worker=0, scheduled=0, timeout_s=5
    )
    assert rec.status == 500 and not rec.ok
    assert (
        rec.error is not None
        and rec.error.startswith("HTTP 500: internal boom")
        and len(rec.error) <= 220
    )
    assert rec.end >= rec.sent > 0


@pytest.mark.asyncio
async def test_stall_mid_stream_is_bounded(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    url, _ = server
    t0 = time.perf_counter()
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="stall"),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=0.3,
    )
    took = time.perf_counter() - t0
    assert rec.error == "stalled: no data for 0.3s" and rec.status == 200 and rec.events == 1
    assert 0.3 <= took <= stall_caught_within_s(0.3, lag)


@pytest.mark.asyncio
async def test_stall_after_steady_tokens(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    """Silence after several separate reads: caught by the body watchdog, within 1.25x."""
    url, _ = server
    t0 = time.perf_counter()
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="stall_late", max_tokens=8, delay=0.05),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=0.4,
    )
    silent = time.perf_counter() - rec.chunk_times[-1]
    took = time.perf_counter() - t0
    assert rec.error == "stalled: no data for 0.4s" and rec.events == 4
    # three 50 ms gaps, then silence caught no sooner than 0.4 s and within the watchdog's 1.25x
    assert 0.4 <= silent <= stall_caught_within_s(0.4, lag)
    assert took <= 3 * 0.05 + stall_caught_within_s(0.4, lag)


@pytest.mark.asyncio
async def test_stall_before_headers(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    url, _ = server
    t0 = time.perf_counter()
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="stall_headers"),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=0.3,
    )
    assert (
        rec.error is not None
        and rec.error.startswith("stalled: no data for 0.3s")
        and rec.status == 0
    )
    assert time.perf_counter() - t0 <= stall_caught_within_s(0.3, lag)


@pytest.mark.asyncio
async def test_slow_but_steady_stream_is_not_a_stall(
    server: tuple[str, Stats], client: LoadClient
) -> None:
    """timeout_s bounds silence, not total time."""
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(max_tokens=8, delay=0.1),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=0.3,
    )
    assert rec.ok, rec.error
    assert rec.end - rec.sent > 0.6


@pytest.mark.asyncio
async def test_done_without_end_of_body_is_ok(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    """A server that never finishes the HTTP body after [DONE] costs at most the grace time."""
    url, _ = server
    t0 = time.perf_counter()
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="linger"),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    took = time.perf_counter() - t0
    assert rec.ok, rec.error
    # done at [DONE], which follows the last token at once; then one grace for the body's end
    assert rec.end - rec.chunk_times[-1] <= lag.total_slack_s()
    assert took <= EOF_GRACE_S + lag.total_slack_s()


@pytest.mark.asyncio
async def test_disconnect_mid_stream(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="disconnect", max_tokens=8),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    assert rec.error == "stream ended without [DONE] after 3 tokens"
    assert rec.events == 3 and rec.tokens_approx


@pytest.mark.asyncio
async def test_eof_without_done(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="nodone", max_tokens=4),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    assert rec.error == "stream ended without [DONE] after 4 tokens"


@pytest.mark.asyncio
async def test_malformed_and_error_events(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="malformed", max_tokens=6),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    assert rec.error == "malformed SSE event: <<garbage>>" and rec.events == 2
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="error_event", max_tokens=6),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    assert rec.error == "server error event: out of KV cache (503)"


@pytest.mark.asyncio
async def test_zero_tokens_is_an_error(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    rec = await stream_request(
        client.session, Target(url), body(max_tokens=0), index=0, worker=0, scheduled=0, timeout_s=5
    )
    assert rec.status == 200 and rec.error == "200 response with no tokens"


@pytest.mark.asyncio
async def test_tokens_without_text_are_not_an_error(
    server: tuple[str, Stats], client: LoadClient
) -> None:
    """The server generated tokens (its usage says so) whose text was empty: not a failed
    request, only one without a first token, so it adds tokens but no TTFT."""
    url, _ = server
    rec = await stream_request(
        client.session,
        Target(url),
        body(mode="empty_text", max_tokens=4),
        index=0,
        worker=0,
        scheduled=0,
        timeout_s=5,
    )
    assert rec.ok and rec.error is None and rec.events == 0
    assert rec.completion_tokens == 4 and rec.first_token is None and rec.ttft is None


@pytest.mark.asyncio
async def test_server_down(client: LoadClient) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/chat/completions"
    target = Target(url, headers={"Authorization": f"Bearer {SECRET}"})
    plan = TrialPlan(concurrency=8, bodies=[body()], requests=10_000, timeout_s=5, max_failures=20)
    t0 = time.perf_counter()
    tr = await client.run_trial(target, plan)
    # refused at once: no request waited out its timeout
    assert time.perf_counter() - t0 < plan.timeout_s
    assert 20 <= len(tr.records) < 20 + 8  # stopped; at most one extra per worker
    assert tr.stopped_early is not None and tr.stopped_early.startswith("max_failures reached")
    err = tr.records[0].error
    assert (
        err is not None and url in err and "server looks down" in err and tr.records[0].status == 0
    )
    assert all(SECRET not in (r.error or "") for r in tr.records)
    assert SECRET not in tr.stopped_early and SECRET not in repr(target)


@pytest.mark.asyncio
async def test_api_key_sent_but_never_in_errors(
    server: tuple[str, Stats], client: LoadClient
) -> None:
    url, stats = server
    target = Target(url, headers={"Authorization": f"Bearer {SECRET}"})
    rec = await stream_request(
        client.session, target, body(mode="401_echo"), index=0, worker=0, scheduled=0, timeout_s=5
    )
    assert stats.auth[-1] == f"Bearer {SECRET}"
    assert (
        rec.status == 401
        and rec.error is not None
        and SECRET not in rec.error
        and "***" in rec.error
    )
    assert SECRET not in repr(target)


# ------------------------------------------------------------------------------------ runner
@pytest.mark.asyncio
async def test_closed_loop_keeps_c_in_flight(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    url, stats = server
    C = 16
    plan = TrialPlan(
        concurrency=C,
        bodies=[body(max_tokens=5, delay=0.02, eof_delay=0.005), body(max_tokens=4, delay=0.02)],
        requests=96,
        timeout_s=5,
        warmup=5,
    )
    tr = await client.run_trial(Target(url), plan)
    assert len(tr.records) == 96 and [r.index for r in tr.records] == list(range(96))
    assert all(r.ok for r in tr.records), {r.error for r in tr.records}
    assert len(tr.warmup_records) == 5 and stats.requests == 101
    # bodies cycled in order: even indices got 3 tokens, odd ones 2
    assert [r.completion_tokens for r in tr.records[:4]] == [5, 4, 5, 4]
    assert stats.max_inflight == C
    assert len(stats.peers) <= C + 1  # connections are reused, not one per request
    # each worker runs its requests strictly one after another, and sends the next as soon
    # as the last is done: after the end of its body (5 ms after [DONE] for even indices),
    # late only by what held the loop up
    by_worker: dict[int, list[Any]] = {}
    for r in tr.records:
        by_worker.setdefault(r.worker, []).append(r)
    assert sorted(by_worker) == list(range(C))
    turnaround = 0.005 + lag.total_slack_s()
    for rs in by_worker.values():
        rs.sort(key=lambda r: r.sent)
        for a, b in zip(rs, rs[1:]):
            assert a.end <= b.scheduled <= b.sent
            assert b.sent - a.end <= turnaround, (b.sent - a.end, turnaround)
    assert tr.started <= min(r.sent for r in tr.records) and tr.ended >= max(
        r.end for r in tr.records
    )
    assert tr.loop_lag_max_s >= tr.loop_lag_p99_s >= 0 and tr.lag_samples > 0
    assert tr.client_cpu_s > 0 and tr.stopped_early is None
    # closed loop: a free worker sends at once (late only as the trial's own lag monitor saw
    # its loop held up); the staggered start is reported on its own
    assert 0 <= tr.send_delay_p99_s <= send_late_bound_s(tr.loop_lag_max_s, LAG_INTERVAL_S)
    assert 0 <= tr.start_spread_s <= lag.total_slack_s()


@pytest.mark.asyncio
async def test_c512(server: tuple[str, Stats], client: LoadClient) -> None:
    url, stats = server
    raise_nofile_limit(4096)
    plan = TrialPlan(
        concurrency=512, bodies=[body(max_tokens=2, barrier=512)], requests=1024, timeout_s=20
    )
    tr = await client.run_trial(Target(url), plan)
    assert len(tr.records) == 1024
    assert all(r.ok for r in tr.records), {r.error for r in tr.records}
    assert stats.max_inflight == 512
    assert len({r.worker for r in tr.records}) == 512


@pytest.mark.asyncio
async def test_duration_stops_new_requests(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    url, _ = server
    t0 = time.perf_counter()
    tr = await client.run_trial(
        Target(url),
        TrialPlan(
            concurrency=4, bodies=[body(max_tokens=2, delay=0.02)], duration_s=0.3, timeout_s=5
        ),
    )
    took = time.perf_counter() - t0
    assert 8 <= len(tr.records) and all(r.ok for r in tr.records)
    # no send once 0.3 s are over (one due just before may be late by what held the loop up);
    # then only the requests in flight are waited for
    assert max(r.sent for r in tr.records) <= tr.started + 0.3 + lag.slack_s()
    longest = max(r.end - r.sent for r in tr.records)
    assert 0.3 <= took <= 0.3 + longest + EOF_GRACE_S + lag.total_slack_s()


@pytest.mark.asyncio
async def test_failures_stop_the_trial(server: tuple[str, Stats], client: LoadClient) -> None:
    url, _ = server
    tr = await client.run_trial(
        Target(url),
        TrialPlan(
            concurrency=2, bodies=[body(mode="500")], requests=1000, timeout_s=5, max_failures=5
        ),
    )
    assert 5 <= len(tr.records) <= 6 and all(r.status == 500 for r in tr.records)
    assert tr.stopped_early is not None and "HTTP 500" in tr.stopped_early


@pytest.mark.asyncio
async def test_stalls_in_a_trial_are_bounded(
    server: tuple[str, Stats], client: LoadClient, lag: LoopLag
) -> None:
    url, _ = server
    t0 = time.perf_counter()
    tr = await client.run_trial(
        Target(url),
        TrialPlan(concurrency=4, bodies=[body(mode="stall")], requests=8, timeout_s=0.25),
    )
    # two rounds of four stalled streams, each caught within the watchdog's bound (the
    # server would hold them 30 s)
    assert time.perf_counter() - t0 <= 2 * stall_caught_within_s(0.25, lag)
    assert len(tr.records) == 8 and all(r.error == "stalled: no data for 0.25s" for r in tr.records)


def test_plan_validation() -> None:
    with pytest.raises(ValueError):
        TrialPlan(concurrency=1, bodies=[b"{}"])
    with pytest.raises(ValueError):
        TrialPlan(concurrency=0, bodies=[b"{}"], requests=1)
    with pytest.raises(ValueError):
        TrialPlan(concurrency=1, bodies=[], requests=1)


@pytest.mark.asyncio
async def test_client_requires_context(server: tuple[str, Stats]) -> None:
    c = LoadClient()
    with pytest.raises(RuntimeError):
        await c.run_trial(Target(server[0]), TrialPlan(concurrency=1, bodies=[body()], requests=1))
