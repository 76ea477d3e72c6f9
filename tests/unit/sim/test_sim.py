"""Tests of the built-in SGLang simulator: timing model, HTTP surface, faults, process control.

The simulator is the ground truth for the plugin's accuracy tests, so these tests check
that what it *says* (``true_tok_s``) is what it *does* (its own token counters), and that
its wire format parses the way a client of a real SGLang server expects.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from pytest_kimi.sim import (
    SimConfigError,
    SimProcess,
    SimProcessError,
    SimConfig,
    SimServer,
    count_prompt_tokens,
    parse_sim_spec,
    start_server,
)
from pytest_kimi.sim.__main__ import build_parser, profile_from_args
from pytest_kimi.sim.sse_framing import VOCAB
from pytest_kimi.sim.engine import SeqState, SimEngine
from support.timing import TIMER_SLACK_S, LoopLag, apoll_until

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


# ---------------------------------------------------------------------- helpers


def chat_body(
    max_tokens: int = 8,
    *,
    stream: bool = True,
    usage: bool = True,
    ignore_eos: bool = True,
    content: str = "What is 2+2?",
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "kimi-k2.6-sim",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": ignore_eos,
    }
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    return body


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    """The payloads of all ``data:`` lines, in order."""
    raw = await resp.read()
    text = raw.decode("utf-8")
    assert text.endswith("\n\n")
    events = [block for block in text.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


async def sse_lines_timed(resp: aiohttp.ClientResponse) -> list[tuple[float, bytes]]:
    out: list[tuple[float, bytes]] = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            out.append((time.perf_counter(), line.rstrip(b"\n")))
    return out


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest_asyncio.fixture
async def fast_sim() -> AsyncIterator[SimServer]:
    server = await start_server(SimConfig(speed=50.0))
    try:
        yield server
    finally:
        await server.close()


# ---------------------------------------------------------------------- profile math


def test_default_profile_matches_deployment_shape() -> None:
    p = SimConfig()
    assert p.step_time(1) == pytest.approx(0.0135 + 0.001862)
    assert p.true_tok_s(1) == pytest.approx(65.1, abs=0.2)
    assert p.true_tok_s(256) == pytest.approx(1500, rel=0.01)
    # beyond max_running_requests the batch stays full: same aggregate, same per-request rate
    assert p.true_tok_s(512) == p.true_tok_s(256)
    assert p.request_tok_s(8) == pytest.approx(1 / p.step_time(8))
    assert p.true_tok_s(8) == pytest.approx(8 * p.request_tok_s(8))
    # sublinear: aggregate grows with batch, per-request rate falls
    rates = [p.true_tok_s(c) for c in (1, 8, 64, 256)]
    assert rates == sorted(rates)
    assert p.request_tok_s(64) < p.request_tok_s(1)


def test_speed_slowdown_and_ttft() -> None:
    base, fast, slow = SimConfig(), SimConfig(speed=20), SimConfig(slowdown=1.15)
    assert fast.true_tok_s(64) == pytest.approx(20 * base.true_tok_s(64))
    assert slow.true_tok_s(64) == pytest.approx(base.true_tok_s(64) / 1.15)
    assert base.expected_ttft_s(100) == pytest.approx(base.step_time(1) + 100 * 2e-5)
    assert base.expected_ttft_s(100, c=8) == pytest.approx(
        base.step_time(7) + base.step_time(8) + 100 * 2e-5
    )
    assert fast.prefill_time(1000) == pytest.approx(1000 * 2e-5 / 20)
    # closed-loop refinement: below the ideal, approaching it for long requests
    assert base.closed_loop_tok_s(8, 32) < base.true_tok_s(8)
    assert base.closed_loop_tok_s(8, 100_000) == pytest.approx(base.true_tok_s(8), rel=1e-3)
    assert base.closed_loop_tok_s(1, 100, 0) == pytest.approx(base.true_tok_s(1))


def test_noise_factor_is_deterministic_per_seed() -> None:
    assert SimConfig().noise_factor == 1.0
    a, b, c = (
        SimConfig(noise=0.05, seed=1),
        SimConfig(noise=0.05, seed=1),
        SimConfig(noise=0.05, seed=2),
    )
    assert a.noise_factor == b.noise_factor != c.noise_factor
    assert a.noise_factor == pytest.approx(1.0, abs=0.3)
    assert a.true_tok_s(8, include_noise=True) == pytest.approx(a.true_tok_s(8) / a.noise_factor)


# ---------------------------------------------------------------------- validation


def test_from_options_converts_and_validates() -> None:
    p = SimConfig.from_options(
        {
            "speed": "20",
            "slowdown": "1.15",
            "no-usage": "yes",
            "stall_after_tokens": "none",
            "max_running_requests": "64",
        },
        "ini kimi_sim",
    )
    assert (p.speed, p.slowdown, p.no_usage, p.stall_after_tokens, p.max_running_requests) == (
        20.0,
        1.15,
        True,
        None,
        64,
    )

    with pytest.raises(SimConfigError) as err:
        SimConfig.from_options({"sped": "2"}, "ini kimi_sim")
    msg = str(err.value)
    assert "ini kimi_sim" in msg and "'sped'" in msg and "speed" in msg and "slowdown" in msg

    with pytest.raises(SimConfigError) as err:
        SimConfig.from_options({"error_rate": "1.5"}, "marker on test_x")
    msg = str(err.value)
    assert "marker on test_x" in msg and "'error_rate'" in msg and "'1.5'" in msg
    assert "[0, 1]" in msg

    for key, value in [
        ("speed", "0"),
        ("speed", "fast"),
        ("max_running_requests", "2.5"),
        ("no_usage", "maybe"),
        ("noise", "nan"),
        ("server_args", "[1]"),
        ("model", " "),
        ("seed", "-1"),
    ]:
        with pytest.raises(SimConfigError, match=rf"src: .*{key}"):
            SimConfig.from_options({key: value}, "src")
    with pytest.raises(SimConfigError, match="both 0"):
        SimConfig.from_options({"step_base_s": "0", "step_per_seq_s": "0"}, "src")
    with pytest.raises(SimConfigError, match="SimConfig: .*'speed'"):
        SimConfig(speed=-1.0)
    assert isinstance(SimConfigError("x"), ValueError)


def test_parse_sim_spec() -> None:
    assert parse_sim_spec("sim", "cli") == SimConfig()
    assert parse_sim_spec(" sim: ", "cli") == SimConfig()
    p = parse_sim_spec(
        'sim:speed=20,slowdown=1.15,no_usage,server_args={"tp_size":16,"ep_size":16}',
        "--kimi-endpoint",
    )
    assert p.speed == 20 and p.slowdown == 1.15 and p.no_usage
    assert p.server_args == {"tp_size": 16, "ep_size": 16}
    with pytest.raises(SimConfigError, match="--kimi-endpoint: 'vllm:x' is not a simulator"):
        parse_sim_spec("vllm:x", "--kimi-endpoint")
    with pytest.raises(SimConfigError, match="given twice"):
        parse_sim_spec("sim:speed=2,speed=3", "src")
    with pytest.raises(SimConfigError, match="'speed' needs a value"):
        parse_sim_spec("sim:speed", "src")
    with pytest.raises(SimConfigError, match="unknown sim option 'warp'"):
        parse_sim_spec("sim:warp=9", "src")


def test_cli_args_round_trip() -> None:
    p = SimConfig(
        speed=20.0,
        slowdown=1.15,
        noise=0.02,
        stall_after_tokens=3,
        stall_s=0.5,
        model="-odd-name",
        api_key="secret",
        no_usage=True,
        seed=7,
        server_args={"tp_size": 16},
    )
    args = p.to_cli_args()
    assert "--no-usage" in args and "--speed=20.0" in args
    assert profile_from_args(build_parser().parse_args(args)) == p
    assert not any("secret" in a for a in p.to_cli_args(include_secrets=False))
    assert SimConfig().to_cli_args() == []


def test_prompt_token_count() -> None:
    assert count_prompt_tokens("") == 1
    assert count_prompt_tokens("abcd") == 1
    assert count_prompt_tokens("abcde") == 2
    assert count_prompt_tokens("日本") == 2  # 6 UTF-8 bytes


# ---------------------------------------------------------------------- wire format


@pytest.mark.asyncio
async def test_chat_stream_format(fast_sim: SimServer, http: aiohttp.ClientSession) -> None:
    n = len(VOCAB) + 2
    async with http.post(fast_sim.url + CHAT, json=chat_body(n)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        payloads = await read_sse(resp)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    # SGLang 0.5.23: a role chunk of its own (no token), one chunk a token, the finish chunk,
    # the usage-only chunk (serving_chat.py, _generate_chat_stream)
    role, tokens, finish, usage = chunks[0], chunks[1 : n + 1], chunks[n + 1], chunks[n + 2]
    assert len(chunks) == n + 3
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    # as 0.5.23 encodes them (sse_utils.py, tests/data/sglang-0.5.23/streams.json): the
    # delta's reasoning_content always, no tool_calls, no usage key where there is none
    assert role["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
    }
    assert "usage" not in role
    for c in tokens:
        assert c["object"] == "chat.completion.chunk" and c["model"] == "kimi-k2.6-sim"
        assert isinstance(c["created"], int) and "usage" not in c
        (choice,) = c["choices"]
        assert choice["index"] == 0 and choice["finish_reason"] is None
        assert choice["logprobs"] is None and choice["matched_stop"] is None
        delta = choice["delta"]
        assert "role" not in delta
        assert delta["content"] and delta["reasoning_content"] is None
        assert "tool_calls" not in delta
    text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
    for special in ("é", "日本", "🚀", '"', "\\", "\n"):
        assert special in text
    assert finish["choices"][0]["finish_reason"] == "length" and "usage" not in finish
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": n + 3,
        "completion_tokens": n,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


@pytest.mark.asyncio
async def test_completions_stream_and_non_stream(
    fast_sim: SimServer, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "x" * 40, "max_tokens": 5, "stream": True, "ignore_eos": True}
    async with http.post(fast_sim.url + COMPLETIONS, json=body) as resp:
        payloads = await read_sse(resp)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    # 5 tokens, the finish on the last one's chunk as 0.5.23's serving_completions.py puts
    # it; no usage chunk when not asked
    assert len(chunks) == 5
    assert all(c["object"] == "text_completion" for c in chunks)
    assert all(c["choices"][0]["text"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)

    body.update(stream=False)
    async with http.post(fast_sim.url + COMPLETIONS, json=body) as resp:
        assert resp.status == 200
        data = await resp.json()
    assert data["object"] == "text_completion"
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["choices"][0]["text"] and streamed

    async with http.post(fast_sim.url + CHAT, json=chat_body(4, stream=False)) as resp:
        data = await resp.json()
    assert data["object"] == "chat.completion"
    message = data["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    assert data["usage"]["completion_tokens"] == 4


@pytest.mark.asyncio
async def test_default_max_tokens_and_eos(fast_sim: SimServer, http: aiohttp.ClientSession) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    async with http.post(fast_sim.url + CHAT, json=body) as resp:
        assert (await resp.json())["usage"]["completion_tokens"] == 16

    lengths: list[int] = []
    reasons: set[str] = set()
    for _ in range(12):
        async with http.post(
            fast_sim.url + CHAT, json=chat_body(400, stream=False, ignore_eos=False)
        ) as resp:
            data = await resp.json()
        lengths.append(data["usage"]["completion_tokens"])
        reasons.add(data["choices"][0]["finish_reason"])
    assert len(set(lengths)) > 3, lengths
    assert sum(lengths) / len(lengths) < 200
    assert "stop" in reasons


@pytest.mark.asyncio
async def test_side_endpoints(http: aiohttp.ClientSession) -> None:
    profile = SimConfig(speed=50.0, model="my-model", server_args={"tp_size": 16, "x": 1})
    async with await start_server(profile) as sim:
        async with http.get(sim.url + "/v1/models") as resp:
            models = await resp.json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "my-model"
        assert models["data"][0]["owned_by"] == "sglang"
        for path in ("/get_server_info", "/server_info"):
            async with http.get(sim.url + path) as resp:
                info = await resp.json()
            assert info["tp_size"] == 16 and info["x"] == 1 and info["ep_size"] == 8
            assert info["max_running_requests"] == 256 and "version" in info
            assert info["sim"]["model"] == "my-model" and info["port"] == sim.port
        async with http.post(sim.url + "/flush_cache") as resp:
            assert resp.status == 200
        async with http.get(sim.url + "/nope") as resp:
            assert resp.status == 404
            assert (await resp.json())["code"] == 404
        async with http.post(sim.url + CHAT, data=b"{not json") as resp:
            assert resp.status == 400
            assert "JSON" in (await resp.json())["message"]
        async with http.post(sim.url + CHAT, json={"messages": []}) as resp:
            assert resp.status == 400
            assert "messages" in (await resp.json())["message"]
        async with http.post(sim.url + CHAT, json={**chat_body(), "max_tokens": 0}) as resp:
            assert resp.status == 400
            assert "max_tokens" in (await resp.json())["message"]


@pytest.mark.asyncio
async def test_metrics_and_stats(fast_sim: SimServer, http: aiohttp.ClientSession) -> None:
    for n in (3, 4):
        async with http.post(fast_sim.url + CHAT, json=chat_body(n)) as resp:
            await resp.read()
    async with http.get(fast_sim.url + "/health_generate") as resp:
        assert resp.status == 200
    async with http.get(fast_sim.url + "/metrics") as resp:
        text = await resp.text()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    assert values["sglang:generation_tokens_total"] == 3 + 4 + 1
    assert values["sglang:prompt_tokens_total"] == 3 + 3 + 1
    assert values["sglang:num_requests_total"] == 3
    assert values["sglang:num_running_reqs"] == 0
    assert "# TYPE sglang:generation_tokens_total counter" in text
    async with http.get(fast_sim.url + "/sim/stats") as resp:
        stats = await resp.json()
    assert stats["generated_tokens"] == 8 and stats["requests_finished"] == 3
    assert stats["requests_failed"] == 0 and stats["steps"] >= 4


# ---------------------------------------------------------------------- faults


@pytest.mark.asyncio
async def test_slow_start_and_api_key(http: aiohttp.ClientSession) -> None:
    async with await start_server(SimConfig(speed=50.0, slow_start_s=0.4, api_key="k3y")) as sim:
        auth = {"Authorization": "Bearer k3y"}
        for path in ("/health", "/health_generate"):
            async with http.get(sim.url + path) as resp:
                assert resp.status == 503
        async with http.post(sim.url + CHAT, json=chat_body(), headers=auth) as resp:
            assert resp.status == 503

        async def health() -> bool:
            async with http.get(sim.url + "/health") as resp:
                return resp.status == 200  # health probes need no key

        await apoll_until(health, "healthy once the slow start is over")
        async with http.get(sim.url + "/v1/models") as resp:
            assert resp.status == 401
            assert await resp.json() == {"error": "Unauthorized"}
        async with http.post(
            sim.url + CHAT, json=chat_body(), headers={"Authorization": "Bearer wrong"}
        ) as resp:
            assert resp.status == 401
        async with http.post(sim.url + CHAT, json=chat_body(2), headers=auth) as resp:
            assert resp.status == 200
            assert (await read_sse(resp))[-1] == "[DONE]"


@pytest.mark.asyncio
async def test_error_rate_is_deterministic(http: aiohttp.ClientSession) -> None:
    patterns = []
    for _ in range(2):
        async with await start_server(SimConfig(speed=50.0, error_rate=0.5, seed=3)) as sim:
            statuses = []
            for _ in range(20):
                async with http.post(sim.url + CHAT, json=chat_body(1)) as resp:
                    statuses.append(resp.status)
                    if resp.status == 500:
                        err = await resp.json()
                        assert err["code"] == 500 and "error_rate" in err["message"]
                    else:
                        await resp.read()
            assert sim.engine.errors_injected == statuses.count(500)
            patterns.append(statuses)
    assert patterns[0] == patterns[1]
    assert 3 <= patterns[0].count(500) <= 17


@pytest.mark.asyncio
async def test_stall(http: aiohttp.ClientSession) -> None:
    """One stall of 0.3 s between token 3 and token 4, the other tokens a step apart; a read
    (server and client share this loop) is late by at most what held the loop up."""
    profile = SimConfig(speed=50.0, stall_after_tokens=3, stall_s=0.3)
    async with await start_server(profile) as sim:
        async with LoopLag() as lag:
            async with http.post(sim.url + CHAT, json=chat_body(6, usage=False)) as resp:
                lines = await sse_lines_timed(resp)
    times = [t for t, _ in lines[1:7]]  # after the role chunk, which comes with token 1
    gaps = [b - a for a, b in zip(times, times[1:])]
    late = lag.slack_s()
    assert gaps[2] >= 0.3 - late, (gaps, late)  # between token 3 and token 4
    assert max(gaps[:2] + gaps[3:]) <= profile.step_time(1) + late, (gaps, late)
    assert lines[-1][1] == b"data: [DONE]"


@pytest.mark.asyncio
async def test_disconnect_and_malformed(http: aiohttp.ClientSession) -> None:
    # 200 tokens at speed 10 take ~0.3 s: on a busy machine the handler wakes after the drop
    # long before the sequence could finish on its own (20 tokens at speed 50 did not)
    profile = SimConfig(speed=10.0, disconnect_after_tokens=5, malformed_after_tokens=2)
    async with await start_server(profile) as sim:
        lines: list[bytes] = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post(sim.url + CHAT, json=chat_body(200)) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        lines.append(line[6:].rstrip(b"\n"))
        assert b"[DONE]" not in lines
        parsed, broken = [], []
        for payload in lines:
            try:
                parsed.append(json.loads(payload))
            except json.JSONDecodeError:
                broken.append(payload)
        assert len(parsed) == 6 and len(broken) == 1  # the role chunk and 5 tokens
        assert lines.index(broken[0]) == 3  # after the role chunk and two good tokens
        await apoll_until(lambda: sim.engine.stats().requests_failed, "the drop counted")
        stats = sim.engine.stats()
        assert stats.requests_failed == 1 and stats.running == 0


@pytest.mark.asyncio
async def test_no_usage_and_client_abort(http: aiohttp.ClientSession) -> None:
    async with await start_server(SimConfig(speed=50.0, no_usage=True)) as sim:
        async with http.post(sim.url + CHAT, json=chat_body(3)) as resp:
            chunks = [json.loads(p) for p in (await read_sse(resp))[:-1]]
        assert all("usage" not in c for c in chunks) and len(chunks) == 5  # role, 3, finish
        async with http.post(sim.url + CHAT, json=chat_body(3, stream=False)) as resp:
            assert (await resp.json())["usage"] is None
        # a client that hangs up releases its batch slot
        resp = await http.post(sim.url + CHAT, json=chat_body(100_000))
        await resp.content.readline()
        assert sim.engine.num_running == 1
        resp.close()
        await apoll_until(lambda: sim.engine.num_running == 0, "the slot released")
        assert sim.engine.requests_failed == 1


@pytest.mark.asyncio
async def test_a_server_that_does_not_abort_keeps_decoding_what_its_client_cut(
    http: aiohttp.ClientSession,
) -> None:
    """``abort_on_disconnect=false``: the zombies the contamination check is for."""
    async with await start_server(SimConfig(speed=50.0, abort_on_disconnect=False)) as sim:
        resp = await http.post(sim.url + CHAT, json=chat_body(400))
        await resp.content.readline()
        resp.close()  # the client is gone ...
        await apoll_until(lambda: sim.engine.generated_tokens >= 40, "decoding went on")
        assert (
            sim.engine.num_running == 1 and sim.engine.requests_failed == 0
        )  # ... not the request
        await apoll_until(lambda: sim.engine.num_running == 0, "the zombie finished")
        assert sim.engine.generated_tokens == 400  # to its end, as a real zombie does


@pytest.mark.asyncio
async def test_keepalive_after_tokens_streams_comments_and_never_ends(
    http: aiohttp.ClientSession,
) -> None:
    async with await start_server(SimConfig(speed=50.0, keepalive_after_tokens=3)) as sim:
        tokens = comments = 0
        async with http.post(sim.url + CHAT, json=chat_body(8)) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    tokens += 1
                elif line.startswith(b": keep-alive"):
                    comments += 1
                    if comments == 3:
                        break  # bytes keep coming, tokens do not: the client must give up
        # the role chunk and 3 tokens: the 8-token request never finished its stream
        assert (tokens, comments) == (4, 3)


# ---------------------------------------------------------------------- rate truth


async def _window_rate(sim: SimServer, warmup_s: float, window_s: float) -> float:
    """The engine's own rate over a window that begins ``warmup_s`` from now (both sleeps
    set a measurement's length; they wait for nothing)."""
    await asyncio.sleep(warmup_s)
    a = sim.engine.stats()
    await asyncio.sleep(window_s)
    b = sim.engine.stats()
    return (b.generated_tokens - a.generated_tokens) / (b.now - a.now)


def _rate_slack(sim: SimServer, window_s: float) -> float:
    """How far a window's rate may be off the schedule: at each end the engine may be behind
    it, by at most its largest lateness (its own count), before it catches up."""
    return 2 * sim.engine.stats().max_lag_s / window_s


@pytest.mark.asyncio
async def test_engine_rate_matches_true_tok_s(http: aiohttp.ClientSession) -> None:
    """speed=10, C=8 long streams: the engine's own counters vs. the closed-form rate."""
    profile = SimConfig(speed=10.0)
    async with await start_server(profile) as sim:

        async def client() -> None:
            async with http.post(sim.url + CHAT, json=chat_body(100_000)) as resp:
                async for _ in resp.content.iter_any():
                    pass

        tasks = [asyncio.create_task(client()) for _ in range(8)]
        try:
            await apoll_until(lambda: sim.engine.num_running == 8, "all 8 streams running")
            rate = await _window_rate(sim, 0.2, 1.2)
            assert sim.engine.num_running == 8
            assert sim.engine.stats().schedule_resets == 0
            slack = _rate_slack(sim, 1.2)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    expected = profile.true_tok_s(8)
    print(f"engine {rate:.1f} tok/s vs true {expected:.1f} ({rate / expected - 1:+.2%})")
    assert rate == pytest.approx(expected, rel=0.03 + slack)


@pytest.mark.asyncio
async def test_queue_beyond_max_running(http: aiohttp.ClientSession) -> None:
    """More clients than slots: FIFO queue, batch stays at max_running_requests."""
    profile = SimConfig(speed=10.0, max_running_requests=4)
    async with await start_server(profile) as sim:
        # 150 tokens at ~1.9 ms per step: the first four finish after ~0.29 s and the
        # queued four take over; the window spans that hand-over.
        bodies = [chat_body(150, stream=False) for _ in range(8)]
        tasks = [asyncio.create_task(http.post(sim.url + CHAT, json=b)) for b in bodies]
        engine = sim.engine
        await apoll_until(
            lambda: engine.num_running == 4 and engine.num_waiting == 4, "4 running, 4 queued"
        )
        a = engine.stats()
        # the queued four take over as the first four finish: the window spans the hand-over
        await apoll_until(lambda: engine.num_waiting == 0, "the queue taken in")
        b = engine.stats()
        assert b.running == 4, "the queued four run in the freed slots"
        rate = (b.generated_tokens - a.generated_tokens) / (b.now - a.now)
        slack = _rate_slack(sim, b.now - a.now)
        responses = await asyncio.gather(*tasks)
        for r in responses:
            assert r.status == 200
            r.release()
    assert rate == pytest.approx(profile.true_tok_s(8), rel=0.06 + slack)
    assert sim.engine.requests_finished == 8


@pytest.mark.asyncio
async def test_engine_ttft_and_fifo_admission() -> None:
    profile = SimConfig(max_running_requests=2)
    engine = SimEngine(profile)
    await engine.start()
    try:
        seq = engine.submit(400, 2)
        await seq.wait_progress(0)
        assert seq.first_token_at is not None
        ttft = seq.first_token_at - seq.submitted_at
        # never early (the timer wakes at most 0.5 ms ahead); late only by the step's own
        # lateness, which the engine measures (a busy machine keeps its loop from running)
        late = engine.stats().max_lag_s + TIMER_SLACK_S
        expected = profile.expected_ttft_s(400)
        assert expected - 0.001 <= ttft <= expected + late, (ttft, expected, late)
        await seq.wait_done()
        assert seq.state is SeqState.FINISHED and seq.generated == 2

        fast = SimEngine(SimConfig(max_running_requests=2, speed=20.0))
        await fast.start()
        try:
            seqs = [fast.submit(10, 5) for _ in range(3)]
            await asyncio.gather(*(s.wait_done() for s in seqs))
            first, second, third = seqs
            assert third.first_token_at is not None and first.finished_at is not None
            assert third.first_token_at > first.finished_at  # waited for a free slot
            assert fast.stats().prompt_tokens == 30 and fast.stats().generated_tokens == 15
        finally:
            await fast.stop()
    finally:
        await engine.stop()
    assert not engine.is_running


# ---------------------------------------------------------------------- process control


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _get(url: str) -> int:
    async def go() -> int:
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as resp:
                return resp.status

    return asyncio.run(go())


def test_sim_process_start_stop(tmp_path: Any) -> None:
    log = tmp_path / "sim.log"
    with SimProcess(SimConfig(speed=20.0, api_key="abc"), log_path=log) as sim:
        assert sim.url is not None and sim.url.startswith("http://127.0.0.1:")
        assert sim.pid is not None and not _gone(sim.pid)
        assert _get(sim.url + "/health") == 200
        assert _get(sim.url + "/v1/models") == 401  # key reached the child via env
        assert not any("abc" in a for a in sim.command())
        pid = sim.pid
        # an open, endless stream must not hold up the shutdown
        body = json.dumps(chat_body(1_000_000)).encode()
        stream = socket.create_connection(("127.0.0.1", sim.port))
        stream.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer abc\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert stream.recv(4096).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
    stream.close()
    # a stream that held up the shutdown would have the staged stop wait out its grace
    assert time.monotonic() - t0 < sim.grace_s
    assert _gone(pid)
    assert sim.returncode == 0  # clean exit on SIGTERM
    assert sim.stop() == 0  # idempotent


def test_sim_process_kills_unresponsive_child(tmp_path: Any) -> None:
    sim = SimProcess(SimConfig(), grace_s=0.3, log_dir=tmp_path / "logs").start()
    log = sim.log_path
    assert log is not None and log.parent == tmp_path / "logs"
    assert sim.pid is not None
    os.kill(sim.pid, signal.SIGSTOP)  # cannot act on SIGTERM: only SIGKILL ends it
    t0 = time.monotonic()
    sim.stop()
    assert time.monotonic() - t0 >= sim.grace_s, "SIGKILL before the grace was over"
    assert _gone(sim.pid)
    assert sim.returncode == -signal.SIGKILL
    assert log is not None and not log.exists()  # empty temp log removed


def test_sim_process_fails_fast_with_log_tail(tmp_path: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sim = SimProcess(SimConfig(), port=port, log_path=tmp_path / "sim.log")
        t0 = time.monotonic()
        with pytest.raises(SimProcessError) as err:
            sim.start()
    # the exit is reported when it happens, not when the wait for readiness runs out
    assert time.monotonic() - t0 < sim.ready_timeout_s
    msg = str(err.value)
    assert "exit code 1" in msg and "cannot listen" in msg
    assert sim.pid is not None and _gone(sim.pid)


def test_cli_refuses_other_hosts() -> None:
    from pytest_kimi.sim.__main__ import main

    assert main(["--host", "0.0.0.0"]) == 2
    assert main(["--speed", "-1"]) == 2


# ---------------------------------------------------------------------- /tokenize, /flush_cache, prefix cache


@pytest.mark.asyncio
async def test_tokenize_counts_what_usage_reports(
    http: aiohttp.ClientSession, fast_sim: SimServer
) -> None:
    """SGLang's shape (``prompt`` or ``messages`` in; ``tokens``, ``count``, ``max_model_len``
    out), and the count is the one a generation request's usage then reports."""
    text = "Request 3: naïve café " * 17
    for path in ("/tokenize", "/v1/tokenize"):
        async with http.post(
            fast_sim.url + path,
            json={"model": "m", "messages": [{"role": "user", "content": text}]},
        ) as resp:
            assert resp.status == 200
            chat = await resp.json()
        assert set(chat) == {"tokens", "count", "max_model_len"}
        assert chat["count"] == len(chat["tokens"]) == count_prompt_tokens(text)
    async with http.post(fast_sim.url + "/tokenize", json={"prompt": [text, "ab"]}) as resp:
        batch = await resp.json()
    assert batch["count"] == [count_prompt_tokens(text), 1]
    async with http.post(fast_sim.url + CHAT, json=chat_body(2, content=text)) as resp:
        events = await read_sse(resp)
    usage = next(
        json.loads(e)["usage"] for e in events if e != "[DONE]" and json.loads(e).get("usage")
    )
    assert usage["prompt_tokens"] == chat["count"]
    async with http.post(fast_sim.url + "/tokenize", json={"prompt": 5}) as resp:
        assert resp.status == 400 and "prompt" in (await resp.json())["message"]


@pytest.mark.asyncio
async def test_tokenize_can_be_turned_off(http: aiohttp.ClientSession) -> None:
    async with await start_server(SimConfig(no_tokenize=True)) as sim:
        async with http.post(sim.url + "/tokenize", json={"prompt": "x"}) as resp:
            assert resp.status == 404


@pytest.mark.asyncio
async def test_flush_cache_only_when_idle_and_waits_with_timeout(
    http: aiohttp.ClientSession,
) -> None:
    """SGLang 0.5.23: 400 while a request runs or waits; ``?timeout=S`` waits up to S seconds
    for the scheduler to become idle, then flushes."""
    profile = SimConfig(speed=1.0)  # a step is ~15 ms: 20 tokens keep it busy for ~0.3 s
    async with await start_server(profile) as sim:
        engine = sim.engine
        task = asyncio.ensure_future(http.post(sim.url + CHAT, json=chat_body(20)))
        await apoll_until(
            lambda: engine.num_running or engine.num_waiting, "the request taken in", every_s=0.002
        )
        assert engine.num_running == 1
        async with http.post(sim.url + "/flush_cache") as resp:
            assert resp.status == 400
            assert "1 running" in await resp.text()
        async with http.post(sim.url + "/flush_cache?timeout=0.001") as resp:
            assert resp.status == 400 and "timed out" in await resp.text()
        flushes = engine.cache_flushes
        async with http.post(sim.url + "/flush_cache?timeout=30") as resp:
            assert resp.status == 200, await resp.text()
        assert engine.idle and engine.cache_flushes == flushes + 1
        (await task).release()
        async with http.get(sim.url + "/flush_cache?timeout=-1") as resp:
            assert resp.status == 422


@pytest.mark.asyncio
async def test_flush_cache_takes_the_admin_key(http: aiohttp.ClientSession) -> None:
    """``ADMIN_OPTIONAL``: the admin key when set (the API key is then refused), else the API key."""
    async with await start_server(
        SimConfig(speed=50.0, api_key="user-k", admin_api_key="admin-k")
    ) as sim:

        async def flush(key: str) -> int:
            async with http.post(
                sim.url + "/flush_cache", headers={"Authorization": f"Bearer {key}"}
            ) as resp:
                return resp.status

        assert await flush("user-k") == 401
        assert await flush("admin-k") == 200
        async with http.post(
            sim.url + CHAT, json=chat_body(1), headers={"Authorization": "Bearer admin-k"}
        ) as resp:
            assert resp.status == 401  # generation takes the API key only
        async with http.get(
            sim.url + "/server_info", headers={"Authorization": "Bearer user-k"}
        ) as resp:
            info = await resp.json()
        assert info["admin_api_key"] == "***" and info["sim"]["admin_api_key"] == "***"
    async with await start_server(SimConfig(speed=50.0, api_key="user-k")) as sim:
        async with http.post(
            sim.url + "/flush_cache", headers={"Authorization": "Bearer user-k"}
        ) as resp:
            assert resp.status == 200


@pytest.mark.asyncio
async def test_prefix_cache_serves_a_repeated_prompt() -> None:
    """A repeated prompt's whole pages (16 tokens), at most ``len - 1``, come from the cache;
    a prompt that differs in its first page gets nothing; flush and the knob empty it."""
    from pytest_kimi.sim.engine import RADIX_PAGE_TOKENS, prefix_pages

    prompt = ("z" * 8 + "shared prompt text ") * 40
    tokens = count_prompt_tokens(prompt)
    other = "other start " + prompt[12:]
    for disabled in (False, True):
        engine = SimEngine(SimConfig(speed=50.0, disable_radix_cache=disabled))
        await engine.start()
        try:

            async def run(text: str, engine: SimEngine = engine) -> int:
                seq = engine.submit(
                    count_prompt_tokens(text), 1, prefix_keys=prefix_pages(text.encode())
                )
                await seq.wait_done()
                return seq.cached_tokens

            assert await run(prompt) == 0
            hit = await run(prompt)
            assert await run(other) == 0
            expected = (
                0 if disabled else min(tokens // RADIX_PAGE_TOKENS * RADIX_PAGE_TOKENS, tokens - 1)
            )
            assert hit == expected and engine.stats().cached_prompt_tokens == expected
            assert engine.flush_cache() and await run(prompt) == 0
        finally:
            await engine.stop()
