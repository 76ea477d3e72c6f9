"""Every request's prompt is unique within a run: the runner fills each body's slot per request.

A tiny in-process server records the 12-character id at the start of every prompt it gets, so
the tests read back exactly what left the client: one id per request, the ids the plan's
numbering promises (global index, also across worker processes and open-loop shards), and no
id twice across warm-ups, trials and levels of a measurement.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from pytest_kimi.endpoint.discovery import EndpointInfo
from pytest_kimi.load import LoadClient, OpenLoopPlan, ShardedClient, Target, TrialPlan
from pytest_kimi.load.request_ids import UNIQUE_ID_WIDTH, WARMUP_IDS, split_at_slot, unique_id
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.run.measurer import Measurer, build_spec
from pytest_kimi.workload.prompts import UNIQUE_SLOT, PromptSource, WorkloadError, encode_bodies

SEEN = web.AppKey("seen", list)
SLOT = UNIQUE_SLOT.encode()


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _handler(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    content = body["messages"][0]["content"] if "messages" in body else body["prompt"]
    request.app[SEEN].append(content)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = int(body.get("max_tokens", 2))
    for _ in range(n):
        await resp.write(
            _event({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})
        )
    await resp.write(_event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/v1/chat/completions", _handler)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield str(srv.make_url("")), app[SEEN]
    finally:
        await srv.close()


def _bodies(n: int = 3) -> list[bytes]:
    source = PromptSource(tuple(f"prompt {k}" for k in range(n)), "list")
    return encode_bodies(
        source, model="m", api="chat", max_tokens=2, ignore_eos=True, unique="run12345"
    )


def _ids(seen: list[str]) -> list[str]:
    return [content[:UNIQUE_ID_WIDTH] for content in seen]


def test_unique_id_is_a_fixed_width_bijection() -> None:
    ids = {unique_id(n) for n in range(100_000)}
    assert len(ids) == 100_000 and {len(i) for i in ids} == {UNIQUE_ID_WIDTH}
    # neighbours differ from the first digit: nothing for a prefix cache to share
    assert all(unique_id(n)[:1] != unique_id(n + 1)[:1] for n in range(1000))


def test_bodies_hold_the_slot_once_at_the_start_of_the_content() -> None:
    for raw in _bodies():
        assert raw.count(SLOT) == 1
        content = json.loads(raw)["messages"][0]["content"]
        assert content.startswith(UNIQUE_SLOT + "-run12345 ")
    plain = encode_bodies(
        PromptSource(("p",), "list"), model="m", api="chat", max_tokens=2, ignore_eos=True
    )
    assert SLOT not in plain[0]  # the old behaviour: bodies as given
    with pytest.raises(WorkloadError, match="remove it from the prompt"):
        encode_bodies(
            PromptSource((UNIQUE_SLOT,), "list"),
            model="m",
            api="chat",
            max_tokens=2,
            ignore_eos=True,
            unique="run12345",
        )
    with pytest.raises(ValueError, match="holds the unique_slot .* 0 times"):
        split_at_slot([b'{"a":1}'], SLOT)


@pytest.mark.asyncio
async def test_closed_loop_fills_one_id_per_request(server: tuple[str, list[str]]) -> None:
    url, seen = server
    base = 7 << 28
    async with LoadClient() as client:
        plan = TrialPlan(
            concurrency=4,
            bodies=_bodies(),
            requests=20,
            warmup=3,
            timeout_s=10,
            unique_slot=SLOT,
            unique_base=base,
        )
        tr = await client.run_trial(Target(url + "/v1/chat/completions"), plan)
    assert all(r.ok for r in tr.records) and len(tr.records) == 20
    ids = _ids(seen)
    assert len(ids) == 23 and len(set(ids)) == 23
    assert sorted(ids[3:]) == sorted(unique_id(base + g).decode() for g in range(20))
    assert sorted(ids[:3]) == sorted(unique_id(base + WARMUP_IDS + g).decode() for g in range(3))
    # the rest of each body is what was encoded: prompt k for request g % 3
    assert {s[UNIQUE_ID_WIDTH:] for s in seen} == {f"-run12345 prompt {k}" for k in range(3)}


@pytest.mark.asyncio
async def test_open_loop_fills_the_arrival_index(server: tuple[str, list[str]]) -> None:
    url, seen = server
    async with LoadClient() as client:
        plan = OpenLoopPlan(
            rate=200, bodies=_bodies(), requests=15, timeout_s=10, unique_slot=SLOT, unique_base=5
        )
        await client.run_open_loop(Target(url + "/v1/chat/completions"), plan)
    assert sorted(_ids(seen)) == sorted(unique_id(5 + g).decode() for g in range(15))


@pytest.mark.asyncio
async def test_worker_processes_keep_ids_global(server: tuple[str, list[str]]) -> None:
    """Sharded over processes, the ids are those one client would have sent."""
    url, seen = server
    target = Target(url + "/v1/chat/completions")
    async with ShardedClient(2) as client:
        await client.run_trial(
            target,
            TrialPlan(
                concurrency=5,
                bodies=_bodies(),
                requests=13,
                warmup=4,
                timeout_s=10,
                unique_slot=SLOT,
                unique_base=1 << 28,
            ),
        )
        ids = _ids(seen)
        trial = {unique_id((1 << 28) + g).decode() for g in range(13)}
        assert len(ids) == 17 and len(set(ids)) == 17 and trial <= set(ids)
        assert all(
            i in trial or i in {unique_id((1 << 28) + WARMUP_IDS + g).decode() for g in range(8)}
            for i in ids
        )
        seen.clear()
        await client.run_trial(
            target,
            TrialPlan(
                concurrency=3,
                bodies=_bodies(),
                duration_s=0.3,
                timeout_s=10,
                unique_slot=SLOT,
                unique_base=2 << 28,
            ),
        )
        ids = _ids(seen)
        assert len(ids) >= 3 and len(set(ids)) == len(ids)
        seen.clear()
        await client.run_open_loop(
            target,
            OpenLoopPlan(
                rate=300,
                bodies=_bodies(),
                requests=11,
                timeout_s=10,
                unique_slot=SLOT,
                unique_base=3 << 28,
            ),
        )
        assert sorted(_ids(seen)) == sorted(unique_id((3 << 28) + g).decode() for g in range(11))


def test_a_measurement_never_repeats_a_prompt(tmp_path: Path) -> None:
    """Warm-up, trials and levels of one test, and two tests of one run: all ids distinct."""

    async def start() -> tuple[TestServer, list[str]]:
        app = web.Application()
        app[SEEN] = []
        app.router.add_post("/v1/chat/completions", _handler)
        srv = TestServer(app, host="127.0.0.1")
        await srv.start_server()
        return srv, app[SEEN]

    loop = asyncio.new_event_loop()
    srv, seen = loop.run_until_complete(start())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    session = Measurer()
    try:
        endpoint = EndpointInfo(url=str(srv.make_url("")).rstrip("/"), model="m")
        workload, targets = parse_throughput(
            (),
            dict(
                concurrency=[2, 3], max_tokens=2, requests=6, trials=2, warmup=2, prompts=["a", "b"]
            ),
        )
        leads = []
        for _ in range(2):
            spec = build_spec(
                endpoint, "t", workload, targets, rootdir=tmp_path, sizer=session.prompt_sizer
            )
            result = session.measure(spec)
            assert all(lv.verdict in ("pass", "invalid") for lv in result.levels)
            ids = _ids(seen)
            assert len(ids) == 2 + 2 * 2 * 6 and len(set(ids)) == len(ids)
            leads += [content[:22] for content in seen]  # id and run token
            seen.clear()
        assert len(set(leads)) == len(leads)
        # the old behaviour, on request: the two prompts repeat
        seen.clear()
        spec = build_spec(endpoint, "t", workload, targets, rootdir=tmp_path, unique_prompts=False)
        session.measure(spec)
        assert set(seen) == {"a", "b"}
    finally:
        session.close()
        asyncio.run_coroutine_threadsafe(srv.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
