"""Reasoning streams (``--reasoning-parser kimi_k2``): thinking and answer counted apart.

SGLang with a reasoning parser streams the thinking as ``delta.reasoning_content`` and then the
answer as ``delta.content``.  The plugin reports both token counts and both first-token times
(TTFT: any token; TTFC: first content token), while throughput keeps counting every output
token.  The simulator's ``reasoning_tokens=N`` knob makes the first N tokens of each chat
response reasoning; its step model says how long that phase lasts, which bounds TTFC - TTFT,
give or take how late the simulator and the client were, which the run measures (CI shares two
cores with other work).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
import numpy as np
import pytest

from pytest_kimi.load.sse import parse_blocks
from pytest_kimi.workload.workload_spec import LevelSpec
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, level_figures
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.report.html import render_html
from pytest_kimi.report.markdown import render_markdown
from pytest_kimi.report.terminal import format_table
from pytest_kimi.measure.results import LevelResult
from pytest_kimi.sim.app import start_server
from pytest_kimi.sim.config import SimConfigError, SimConfig, parse_sim_spec

REASONING_KEYS = {
    "reasoning_requests",
    "reasoning_tokens_mean",
    "content_tokens_mean",
    "ttfc_s_p50",
    "ttfc_s_p95",
    "ttfc_s_pct",
    "reasoning_no_content",
}


# ------------------------------------------------------------------ figures from records
def _record(
    sent: float, first: float, first_content: float | None, tokens: int, reasoning: int
) -> RequestRecord:
    rec = RequestRecord(
        index=0,
        worker=0,
        scheduled=sent,
        sent=sent,
        first_token=first,
        end=first + 1.0,
        completion_tokens=tokens,
        status=200,
        reasoning_tokens=reasoning,
        first_content=first_content,
    )
    rec.chunk_times.extend([first, first + 1.0])
    rec.chunk_events.extend([1, tokens - 1])
    return rec


def _level(records: list[RequestRecord]) -> LevelResult:
    trial = TrialResult(
        index=0,
        label="C=1",
        tok_s=100.0,
        window_s=1.0,
        window_tokens=100.0,
        requests_ok=len(records),
        requests_failed=0,
        wall_s=1.0,
        client=ClientSignals(),
        records=records,
    )
    figures = level_figures([trial], 90.0)
    return LevelResult(
        spec=LevelSpec(concurrency=1, rate=None, max_tokens=10),
        label="C=1",
        prompts_key="k",
        trials=[trial],
        figures=figures,
        verdict="pass",
    )


def test_level_without_reasoning_shows_nothing_new() -> None:
    lv = _level([_record(0.0, 0.1, 0.1, 10, 0), _record(1.0, 1.2, 1.2, 10, 0)])
    assert lv.figures.reasoning is None
    out = lv.to_dict()
    assert not REASONING_KEYS & set(out)
    assert not any("TTFC" in line or "reason" in line for line in format_table([out]))
    report = {"tests": [{"nodeid": "t", "outcome": "passed", "levels": [out]}]}
    assert "TTFC" not in render_markdown(report) and "TTFC" not in render_html(report)


def test_reasoning_figures_from_records() -> None:
    """Means over successful requests; TTFC percentiles over the requests that reached their
    answer, the one that ended while thinking counted apart."""
    recs = [
        _record(0.0, 0.1, 0.5, 10, 6),  # TTFC 0.5
        _record(1.0, 1.1, 1.3, 10, 4),  # TTFC 0.3
        _record(2.0, 2.1, 2.1, 10, 0),  # thinking off for this one: TTFC == TTFT
        _record(3.0, 3.1, None, 10, 10),  # max_tokens reached while thinking
    ]
    r = level_figures(
        [
            TrialResult(
                index=0,
                label="C=1",
                tok_s=1.0,
                window_s=1.0,
                window_tokens=1.0,
                requests_ok=4,
                requests_failed=0,
                wall_s=1.0,
                client=ClientSignals(),
                records=recs,
            )
        ],
        90.0,
    ).reasoning
    assert r is not None
    assert (r.requests, r.reasoning_tokens_mean, r.content_tokens_mean, r.no_content) == (
        3,
        5.0,
        5.0,
        1,
    )
    assert r.ttfc_s_p50 == pytest.approx(0.3)
    assert r.ttfc_s_pct == pytest.approx(0.46)  # numpy's linear p90 of 0.1, 0.3, 0.5
    out = _level(recs).to_dict()
    assert out["reasoning_tokens_mean"] == 5.0 and out["reasoning_no_content"] == 1
    assert REASONING_KEYS <= set(out)


# ------------------------------------------------------------------ the simulator's knob
def test_sim_knob_and_expected_ttfc() -> None:
    p = parse_sim_spec("sim:speed=10,reasoning_tokens=96", "test")
    assert p.reasoning_tokens == 96 and p.to_cli_args() == ["--speed=10.0", "--reasoning-tokens=96"]
    assert p.expected_ttfc_s(100) == pytest.approx(p.expected_ttft_s(100) + 96 * p.step_time(1))
    assert SimConfig().expected_ttfc_s(100) == SimConfig().expected_ttft_s(100)
    with pytest.raises(SimConfigError, match="reasoning_tokens"):
        parse_sim_spec("sim:reasoning_tokens=-1", "test")


async def _post(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            return await resp.read()


def _chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "why?"}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def test_sim_streams_reasoning_like_sglang_and_honours_per_request_fields() -> None:
    """reasoning_content chunks first (SGLang 0.5.23 shape), then content; usage counts them;
    ``separate_reasoning: false`` streams them as content (usage still counts them, the
    stream no longer separates them); ``thinking: false`` has none; packed events split at
    the end of the thinking; the non-streamed message carries both fields."""

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with await start_server(SimConfig(speed=50, reasoning_tokens=5)) as srv:
            out["plain"] = await _post(srv.url, _chat(12))
            out["joined"] = await _post(srv.url, _chat(12, separate_reasoning=False))
            out["off"] = await _post(srv.url, _chat(12, chat_template_kwargs={"thinking": False}))
            out["short"] = await _post(srv.url, _chat(3))
            out["whole"] = json.loads(await _post(srv.url, _chat(12, stream=False)))
        async with await start_server(
            SimConfig(speed=50, reasoning_tokens=5, stream_interval=4)
        ) as srv:
            out["packed"] = await _post(srv.url, _chat(12))
        return out

    got = asyncio.run(run())
    events = [e for e in got["plain"].split(b"\n\n") if e]
    assert b'"delta":{"reasoning_content":"' in events[1] and b'"content"' not in events[1]
    assert sum(b'"delta":{"reasoning_content":"' in e for e in events) == 5
    assert b'"completion_tokens_details":{"reasoning_tokens":5}' in events[-2]
    rec = parse_blocks([(0.0, got["plain"])])
    assert (rec.completion_tokens, rec.reasoning_tokens, rec.content_tokens) == (12, 5, 7)
    rec = parse_blocks([(0.0, got["joined"])])
    assert (
        b'"reasoning_tokens":5' in got["joined"]
        and rec.reasoning_tokens == 0
        and rec.content_tokens == 12
    )
    rec = parse_blocks([(0.0, got["off"])])
    # 0.5.23's usage always has reasoning_tokens (0 here), never completion_tokens_details
    assert b'"reasoning_tokens":0,"completion_tokens_details":null' in got["off"]
    assert b'"reasoning_tokens":0,"completion_tokens_details":{' not in got["off"]
    assert rec.reasoning_tokens == 0 and rec.content_tokens == 12
    rec = parse_blocks([(0.0, got["short"])])
    assert (rec.reasoning_tokens, rec.content_tokens, rec.first_content) == (3, 0, None)
    rec = parse_blocks([(0.0, got["packed"])])
    assert (rec.completion_tokens, rec.reasoning_tokens, rec.content_tokens) == (12, 5, 7)
    assert rec.events < 12  # several tokens per event, split where the thinking ends
    msg = got["whole"]["choices"][0]["message"]
    assert len(msg["reasoning_content"]) > 0 and len(msg["content"]) > 0
    assert got["whole"]["usage"]["reasoning_tokens"] == 5


# ------------------------------------------------------------------ measured against the sim
REASONING = 96
MAX_TOKENS = 256
PROFILE = SimConfig(speed=10.0, reasoning_tokens=REASONING)
"""EP8 shape at 10x: a step over one stream is 1.54 ms, so the thinking lasts ~148 ms at C=1."""


@pytest.fixture(scope="module")
def measured(sim_measure):
    return {
        c: sim_measure(
            PROFILE,
            "reasoning",
            concurrency=c,
            requests=c * 2,
            max_tokens=MAX_TOKENS,
            trials=2,
            warmup=1,
        )
        for c in (1, 8)
    }


@pytest.mark.parametrize("concurrency", [1, 8])
def test_counts_are_exact(measured, concurrency: int) -> None:
    level = measured[concurrency].level
    for trial in level.trials:
        for rec in trial.records:
            assert rec.ok and not rec.tokens_approx
            assert (rec.completion_tokens, rec.reasoning_tokens, rec.content_tokens) == (
                MAX_TOKENS,
                REASONING,
                MAX_TOKENS - REASONING,
            )
    r = level.figures.reasoning
    assert r is not None and r.requests == level.figures.requests_ok and r.no_content == 0
    assert (r.reasoning_tokens_mean, r.content_tokens_mean) == (REASONING, MAX_TOKENS - REASONING)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_ttfc_follows_ttft_by_the_thinking_phase(measured, concurrency: int) -> None:
    """The first content token is token REASONING + 1, stamped at the read that brought it,
    REASONING decode steps after the first token.  At C=1 the server is idle when
    each request arrives, so its schedule starts then and the first content token cannot leave
    before TTFT's step and prefill plus REASONING steps (the sim's timer wakes at most 0.5 ms
    early).  The gap between the two reads is one step per reasoning token, each between the
    step of one stream and that of the full batch (plus the prefill of any request admitted
    meanwhile); either read may be late by the simulator's lateness (its own count) and the
    client's longest stall, which the run measured."""
    m = measured[concurrency]
    level = m.level
    records = [r for t in level.trials for r in t.records]
    fastest = PROFILE.step_time(1)
    slowest = PROFILE.step_time(min(concurrency, PROFILE.max_running_requests))
    admitted = sum(PROFILE.prefill_time(r.prompt_tokens) for r in records)
    late = m.sim_lag_s + m.client_lag_s
    for rec in records:
        assert rec.ttft is not None and rec.ttfc is not None and rec.ttfc >= rec.ttft
        # stamped at the read that brought token REASONING + 1 (a late read may bring more)
        times = np.frombuffer(rec.chunk_times, dtype=np.float64)
        events = np.frombuffer(rec.chunk_events, dtype=np.uint32)
        (at,) = np.flatnonzero(times == rec.first_content)
        before = int(events[:at].sum())
        assert before <= REASONING < before + int(events[at]), (before, int(events[at]))
        if concurrency == 1:
            assert rec.ttfc >= PROFILE.expected_ttfc_s(rec.prompt_tokens, 1) - 0.001, (
                rec.ttfc,
                rec.ttft,
            )
    gap = median(r.ttfc - r.ttft for r in records)
    assert REASONING * fastest - late <= gap <= REASONING * slowest + admitted + late, (gap, late)
    f = level.figures
    assert (
        f.reasoning is not None and f.ttft_s_p50 is not None and f.reasoning.ttfc_s_p50 is not None
    )
    # the figures are in the simulator's clock
    assert (f.reasoning.ttfc_s_p50 - f.ttft_s_p50) / f.clock >= REASONING * fastest - late


@pytest.mark.parametrize("concurrency", [1, 8])
def test_throughput_counts_reasoning_tokens(measured, concurrency: int) -> None:
    """tok/s is every output token: content alone would be 160/256 = 62% of the sim's rate."""
    level = measured[concurrency].level
    expected = PROFILE.true_tok_s(concurrency)
    assert level.figures.tok_s * level.figures.clock == pytest.approx(expected, rel=0.2), (
        level.figures.trials_tok_s,
        expected,
    )


# ------------------------------------------------------------------ through the plugin
def test_plugin_reports_both_counts_and_both_latencies(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # the report's figures are in the simulator's clock: the same steps at speed 1
    profile = SimConfig(reasoning_tokens=48)
    pytester.makepyfile(
        """
        from pytest_kimi import throughput

        # whole requests: every one thinks its 48 tokens (a stationary trial's staggered
        # first requests and cut streams would think less)
        @throughput(
            concurrency=[1, 2], max_tokens=64, trials=2, warmup=1, protocol="whole-requests"
        )
        def test_thinking(throughput_result):
            for level in throughput_result.levels:
                for trial in level.trials:
                    assert all(r.reasoning_tokens == 48 for r in trial.records)
        """
    )
    report = tmp_path / "perf.json"
    md = tmp_path / "perf.md"
    result = pytester.runpytest_subprocess(
        "--endpoint=sim:speed=10,reasoning_tokens=48",
        f"--perf-json={report}",
        f"--perf-markdown={md}",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*TTFT p50/p95 s*reason/content tok*TTFC p50/p95 s*", "*C=1*48/16*"]
    )
    data = json.loads(report.read_text())
    for lv in data["tests"][0]["levels"]:
        assert lv["verdict"] in ("pass", "no-baseline"), lv["reasons"]
        assert lv["reasoning_tokens_mean"] == 48 and lv["content_tokens_mean"] == 16
        assert lv["reasoning_requests"] == lv["requests_ok"] and lv["reasoning_no_content"] == 0
        phase = 48 * profile.step_time(1)  # 0.74 s: the thinking at one step per token
        assert lv["ttfc_s_p50"] - lv["ttft_s_p50"] >= 0.5 * phase
        assert lv["ttfc_s_pct"] >= lv["ttfc_s_p50"] and lv["ttft_s_pct"] < lv["ttfc_s_pct"]
        # every output token counts: content alone would be 16/64 = 25% of the sim's rate
        assert lv["tok_s"] == pytest.approx(profile.true_tok_s(lv["concurrency"]), rel=0.3)
    assert "reasoning/content tok" in md.read_text() and "TTFT/TTFC p95 s" in md.read_text()
    assert "TTFC" in render_html(data)


def test_junit_properties_carry_reasoning_only_when_present() -> None:
    from pytest_kimi.report.junit import junit_properties

    plain = {"label": "C=1", "tok_s": 10.0, "verdict": "pass"}
    thinking = {
        **plain,
        "label": "C=2",
        "ttfc_s_p95": 0.5,
        "reasoning_tokens_mean": 24.0,
        "content_tokens_mean": 40.0,
    }
    props = dict(junit_properties({"levels": [plain, thinking]}))
    assert not any(k.startswith("kimi.C1.") and ("ttfc" in k or "reasoning" in k) for k in props)
    assert (props["kimi.C2.ttfc_s_p95"], props["kimi.C2.reasoning_tokens_mean"]) == (0.5, 24.0)
