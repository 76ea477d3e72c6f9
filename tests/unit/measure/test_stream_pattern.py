"""SGLang's real stream pattern, end to end: the simulator sends it, the parser records where
every read's tokens fall, and the figures come out right for any ``stream_interval``.

SGLang 0.5.23 streams a request's first token at once, then an event whenever at least
``--stream-interval`` tokens are unsent, the rest with the finish (``OutputStreamer.accept``
in ``scheduler_components/output_streamer.py``): events of 1, 8, 8, ..., 7 tokens at interval
8 and 256 tokens.  A client that gives every event ``completion_tokens / events`` tokens puts
the window's edges a few tokens off in every stream and read -3.1% at C=4; the parser now
takes each read's position from the running usage (``continuous_usage_stats``, asked for in
every protocol), or apportions the tokens by the text each read brought.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from pytest_kimi.load.records import UNKNOWN_USAGE, RequestRecord, event_overhead
from pytest_kimi.load.sse import parse_blocks
from pytest_kimi.measure.steady_state import steady_window, tokens_in_steps, tokens_in_window
from pytest_kimi.measure.stream_timing import inter_token_latencies
from pytest_kimi.measure.usage_checks import count_cut_tokens
from pytest_kimi.sim import SimConfig, start_server
from pytest_kimi.sim.sse_framing import VOCAB, _Encoder
from support.busy_machine import SESSION_ATTEMPTS

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def sglang_counts(tokens: int, interval: int) -> list[int]:
    """The tokens of each event SGLang 0.5.23 sends: 1, then ``interval`` at a time, the rest
    (at most ``interval``) with the finish."""
    if interval == 1:
        return [1] * tokens
    counts = [1]
    sent = 1
    while tokens - sent > interval:
        counts.append(interval)
        sent += interval
    if tokens > sent:
        counts.append(tokens - sent)
    return counts


def test_sglang_counts_helper() -> None:
    assert sglang_counts(20, 8) == [1, 8, 8, 3]
    assert sglang_counts(17, 8) == [1, 8, 8]  # the last event, with the finish, is full
    assert sglang_counts(256, 8) == [1] + [8] * 31 + [7]
    assert sum(sglang_counts(256, 16)) == 256 and sglang_counts(3, 1) == [1, 1, 1]


# ---------------------------------------------------------------------- the simulator


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _body(kind: str, tokens: int, options: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "kimi-k2.6-sim",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }
    if options is not None:
        body["stream_options"] = options
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "What is 2+2?"}]
    else:
        body["prompt"] = "What is 2+2?"
    return body


async def _events(
    http: aiohttp.ClientSession, url: str, kind: str, tokens: int, options: dict[str, Any] | None
) -> list[Any]:
    path = CHAT if kind == "chat" else COMPLETIONS
    async with http.post(url + path, json=_body(kind, tokens, options)) as resp:
        assert resp.status == 200
        text = (await resp.read()).decode()
    payloads = [e[len("data: ") :] for e in text.split("\n\n") if e]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def _text(event: dict[str, Any]) -> str:
    (choice,) = event["choices"]
    delta = choice.get("delta")
    return (delta.get("content") or "") if isinstance(delta, dict) else choice["text"]


def _words(text: str, first: int) -> int:
    """How many of the simulator's tokens, from its ``first``-th word of the vocabulary on,
    spell ``text`` exactly (the words of a response follow the vocabulary in order)."""
    n, built = 0, ""
    while len(built) < len(text):
        built += VOCAB[(first + n) % len(VOCAB)]
        n += 1
    assert built == text, (text, built)
    return n


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("interval", [2, 8, 16])
async def test_the_simulator_streams_as_sglang_does(
    http: aiohttp.ClientSession, kind: str, interval: int
) -> None:
    """First token at once, then ``interval`` tokens an event, the rest with the finish; the
    usage so far on every token chunk, none on the finish chunk, the final usage-only chunk
    after it (``serving_chat.py`` / ``serving_completions.py``).  The events' ends fall on
    SGLang's emission points however late the writer runs, so the counts are exact."""
    n = 3 * interval
    async with await start_server(SimConfig(speed=20.0, stream_interval=interval)) as sim:
        options = {"include_usage": True, "continuous_usage_stats": True}
        events = await _events(http, sim.url, kind, n, options)
    if kind == "chat":
        role, events = events[0], events[1:]
        assert role["choices"][0]["delta"]["role"] == "assistant"
        assert role["choices"][0]["delta"]["content"] == "" and "usage" not in role
    if kind == "chat":
        *tokens, finish, usage = events
        assert "usage" not in finish and finish["choices"][0]["finish_reason"] == "length"
    else:  # completions: the finish rides on the last token's chunk (serving_completions.py)
        *tokens, usage = events
        finish = tokens[-1]
        assert finish["usage"]["completion_tokens"] == n
        assert finish["choices"][0]["finish_reason"] == "length"
        assert [e["choices"][0]["finish_reason"] for e in tokens[:-1]] == [None] * 3
    texts = [_text(e) for e in tokens]
    assert all(texts)
    first = VOCAB.index(texts[0])  # the response starts at the vocabulary's offset
    counts, at = [], first
    for text in texts:
        counts.append(_words(text, at))
        at += counts[-1]
    assert counts == sglang_counts(n, interval) == [1, interval, interval, interval - 1]
    running = [e["usage"]["completion_tokens"] for e in tokens]
    assert running == list(np.cumsum(counts))
    assert {e["usage"]["prompt_tokens"] for e in tokens} == {usage["usage"]["prompt_tokens"]}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n


@pytest.mark.asyncio
async def test_running_usage_does_not_need_include_usage(http: aiohttp.ClientSession) -> None:
    """SGLang 0.5.23 reads ``continuous_usage_stats`` on its own (``should_include_usage``):
    the token chunks carry the usage so far, and without ``include_usage`` no usage-only chunk
    follows the finish.  ``no_usage`` silences both."""
    async with await start_server(SimConfig(speed=20.0, stream_interval=4)) as sim:
        events = await _events(http, sim.url, "chat", 9, {"continuous_usage_stats": True})
        assert [e["usage"]["completion_tokens"] for e in events[1:-1]] == [1, 5, 9]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        plain = await _events(http, sim.url, "chat", 9, None)
        assert all("usage" not in e for e in plain) and len(plain) == len(events)
    async with await start_server(SimConfig(speed=20.0, no_usage=True)) as sim:
        events = await _events(
            http, sim.url, "chat", 3, {"include_usage": True, "continuous_usage_stats": True}
        )
        assert all("usage" not in e for e in events)


def test_merged_events_are_the_same_however_the_writes_fall() -> None:
    """The writer only stops on SGLang's emission points (1, 1 + interval, ...), so a late
    writer that sends several events in one write sends the same events."""
    enc = _Encoder("chat", "m", 3, thinking=5)
    whole = enc.merged(0, 40, 8, running=7)
    assert (
        enc.merged(0, 1, 8, running=7)
        + enc.merged(1, 17, 8, running=7)
        + enc.merged(17, 40, 8, running=7)
        == whole
    )
    events = [json.loads(e[6:]) for e in whole.decode().split("\n\n") if e]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = [e["usage"]["completion_tokens"] for e in events[1:]]
    # 5 reasoning tokens: the step that ends the thinking yields a reasoning chunk and a
    # content chunk, both with that output's usage, as SGLang's serving_chat does
    assert usage == [1, 9, 9, 17, 25, 33, 40]
    assert [e["usage"]["reasoning_tokens"] for e in events[1:]] == [1, 5, 5, 5, 5, 5, 5]


# ---------------------------------------------------------------------- the parser


def _sglang_blocks(
    counts: list[int], *, running: bool, kind: str = "chat", words: bool = True
) -> list[tuple[float, bytes]]:
    """One read a stream event, as a client on time reads SGLang: the role chunk with the
    first token, the last event with the finish, the final usage and ``[DONE]``.  ``words``:
    the simulator's words (their lengths vary); else every token is ``"ab"``."""
    enc = _Encoder(kind, "kimi-k2.6-sim", 0)
    prompt = 11 if running else None
    blocks: list[bytes] = []
    at = 0
    for c in counts:
        if words and (at or c == 1):
            data = enc.merged(at, at + c, c, running=prompt)  # one event of c words
        elif words:  # merged's first event is one token (SGLang's): a first read of c words
            data = enc.role_event + _event(enc, enc.text(c), kind, prompt, c)
        else:
            data = (enc.role_event if at == 0 else b"") + _event(
                enc, "ab" * c, kind, prompt, at + c
            )
        at += c
        blocks.append(data)
    blocks[-1] = enc.finish("length", blocks[-1]) + enc.usage(11, at) + b"data: [DONE]\n\n"
    return [(1.0 + 0.01 * i, b) for i, b in enumerate(blocks)]


def _event(enc: _Encoder, text: str, kind: str, prompt: int | None, upto: int) -> bytes:
    head = enc._head + b'"choices":[{"index":0,'
    body = json.dumps(text, ensure_ascii=False).encode()
    if kind == "chat":  # 0.5.23's chat chunk: no usage key where there is none
        ev = (
            head
            + b'"delta":{"reasoning_content":null,"content":'
            + body
            + b'},"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
        )
        if prompt is None:
            return ev
        return ev[: -len(b"}\n\n")] + b"," + enc.running_usage(prompt, upto)
    ev = head + b'"text":' + body + b',"logprobs":null,"finish_reason":null,'
    ev += b'"matched_stop":null}],"usage":null}\n\n'
    if prompt is None:
        return ev
    return ev[: -len(b'"usage":null}\n\n')] + enc.running_usage(prompt, upto)


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_the_parser_takes_each_reads_position_from_the_running_usage(kind: str) -> None:
    counts = sglang_counts(40, 8)
    rec = parse_blocks(_sglang_blocks(counts, running=True, kind=kind), kind)  # type: ignore[arg-type]
    assert rec.error is None and rec.completion_tokens == 40
    assert list(rec.chunk_usage) == list(np.cumsum(counts))
    assert len(rec.chunk_bytes) == 0 and rec.sample_read == b""  # nothing else recorded
    assert rec.position_source == "usage"
    assert list(rec.read_tokens()) == counts
    assert rec.tokens_per_event == 40 / 6  # the mean, which put SGLang's edges a few tokens off


def test_running_usage_in_the_spaced_json_style_and_a_lone_first_read() -> None:
    events = [
        '{"choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": 1}}',
        '{"choices": [{"delta": {"content": "bcdef"}}], "usage": {"prompt_tokens": 3, '
        '"completion_tokens":    6, "total_tokens": 9}}',
        '{"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": null}',
        '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}}',
    ]
    blocks = [(0.0, f"data: {events[0]}\n\n".encode())]
    blocks.append(
        (0.5, "".join(f"data: {e}\n\n" for e in events[1:]).encode() + b"data: [DONE]\n\n")
    )
    rec = parse_blocks(blocks)
    assert list(rec.chunk_usage) == [1, 6] and list(rec.read_tokens()) == [1, 5]
    assert rec.decode_tok_s == pytest.approx(5 / 0.5)


def test_a_stream_without_running_usage_at_its_first_token_is_never_searched_again() -> None:
    """Decided once, at the first token read: a server that does not send running usage pays
    one search per stream, not one per read (and a later usage does not change the mode)."""
    blocks = _sglang_blocks(sglang_counts(40, 8), running=False)
    later = _sglang_blocks(sglang_counts(40, 8), running=True)
    rec = parse_blocks(blocks[:1] + later[1:])
    assert len(rec.chunk_usage) == 0 and len(rec.chunk_bytes) == len(rec.chunk_times) == 6
    assert rec.sample_read  # the second read, for the envelope
    assert rec.position_source == "bytes"


def test_running_usage_that_cannot_be_true_is_not_used() -> None:
    counts = sglang_counts(40, 8)
    blocks = _sglang_blocks(counts, running=True)
    t, data = blocks[2]
    blocks[2] = (t, data.replace(b'"completion_tokens":17', b'"completion_tokens":null', 1))
    rec = parse_blocks(blocks)
    assert rec.chunk_usage[2] == UNKNOWN_USAGE and rec.position_source == "uniform"
    falling = _sglang_blocks(counts, running=True)
    t, data = falling[2]
    falling[2] = (t, data.replace(b'"completion_tokens":17', b'"completion_tokens":3', 1))
    rec = parse_blocks(falling)
    assert list(rec.chunk_usage)[:3] == [1, 9, 3]  # below the events so far: not believed
    assert rec.position_source == "uniform"
    assert rec.read_tokens() == pytest.approx([40 / 6] * 6)


def test_bytes_apportion_sglangs_pattern_exactly_when_tokens_are_alike() -> None:
    """No running usage: each read's text beyond its events' envelopes, calibrated on one
    decoded ordinary event, shares out the tokens beyond one an event; exact when every
    token has the same length, the role, finish and usage chunks left out."""
    counts = sglang_counts(256, 8)
    for kind in ("chat", "completions"):
        rec = parse_blocks(_sglang_blocks(counts, running=False, kind=kind, words=False), kind)  # type: ignore[arg-type]
        assert rec.position_source == "bytes"
        assert rec.read_tokens() == pytest.approx(counts, abs=1e-9)


def test_bytes_apportion_the_simulators_words_to_within_a_few_tokens() -> None:
    """The simulator's words run from 1 to 13 bytes on the wire, so a read of 8 is given 8
    give or take what its words differ from the mean; the one-token first read and the short
    last one stay apart from the full ones, which is what the uniform split got wrong."""
    counts = sglang_counts(256, 8)
    rec = parse_blocks(_sglang_blocks(counts, running=False))
    assert rec.position_source == "bytes"
    got = rec.read_tokens()
    assert got[0] == pytest.approx(1.0, abs=0.5)
    assert np.abs(got - counts).max() <= 4.0
    drift = np.abs(np.cumsum(got) - np.cumsum(counts)).max()
    assert drift <= 6.0, drift  # the words repeat every 24 tokens: errors do not add up
    uniform = np.cumsum([256 / len(counts)] * len(counts))
    assert drift < np.abs(uniform - np.cumsum(counts)).max()


def test_one_token_an_event_needs_no_apportioning_and_a_lone_read_is_whole() -> None:
    rec = parse_blocks(_sglang_blocks([1] * 12, running=False))
    assert rec.position_source == "events" and list(rec.read_tokens()) == [1.0] * 12
    lone = parse_blocks(_sglang_blocks([12], running=False))
    assert list(lone.read_positions()) == [12.0]


def test_uniform_is_the_last_resort() -> None:
    rec = parse_blocks(_sglang_blocks(sglang_counts(40, 8), running=False))
    rec.sample_read = b'data: {"choices":[]}\n\n'  # no ordinary event to calibrate on
    assert rec.position_source == "uniform"


def test_event_overhead_counts_the_text_as_it_is_on_the_wire() -> None:
    """``\\u00e9`` escapes (a server with ``ensure_ascii``) are text bytes, not envelope."""
    for text in ('caf\\u00e9 \\"x\\"', "café", "a"):
        raw = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (
            text.encode()
        )
        assert event_overhead(raw) == len(raw) - len(text.encode())
    assert event_overhead(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n') is None


# ---------------------------------------------------------------------- the figures


def _streams(
    streams: int, tokens: int, interval: int, step: float, starts: list[int]
) -> list[RequestRecord]:
    """C streams of one server, stream ``j``'s first token at step ``starts[j]``, one token a
    step, sent in SGLang's pattern; read 20 us apart within a step; running usage on each."""
    recs = []
    for j in range(streams):
        counts = sglang_counts(tokens, interval)
        upto = np.cumsum(counts)
        steps = starts[j] + upto - 1  # the step that generated each event's last token
        times = 1.0 + steps * step + j * 20e-6
        rec = RequestRecord(
            index=j, worker=j, scheduled=0.0, sent=0.5, status=200, completion_tokens=tokens
        )
        rec.first_token = float(times[0])
        rec.chunk_times = array("d", times)
        rec.chunk_events = array("I", [1] * len(counts))
        rec.chunk_usage = array("I", [int(u) for u in upto])
        rec.end = float(times[-1])
        recs.append(rec)
    return recs


@pytest.mark.parametrize("interval", [1, 2, 8, 16])
@pytest.mark.parametrize("starts", [[0, 0, 0, 0], [0, 0, 1, 3]])
def test_a_closed_loop_window_counts_sglangs_packing_exactly(
    interval: int, starts: list[int]
) -> None:
    """Every stream gets a token a step, so C tokens a step is the truth.  Counting reads in
    the window dropped the finishing streams' last events (-2.4% at interval 8, -5% at 16);
    dating each token back from its read gets every step's tokens, in phase or not."""
    step = 0.002
    recs = _streams(4, 256, interval, step, starts)
    start, end = steady_window(recs)
    tokens = tokens_in_steps(recs, start, end)
    steps = round((end - start) / step)
    assert tokens == 4 * steps  # every token of the window's steps, none of the others
    # the window's ends are first reads of bursts; when streams out of phase leave a burst
    # with one read, that read's place in the burst (20 us a stream) is all that is off
    rate = tokens / (end - start)
    assert rate == pytest.approx(4 / step, rel=1e-9 + 3 * 20e-6 / (end - start))
    if interval >= 8 and starts[0] == starts[-1]:
        assert tokens_in_window(recs, start, end) / (end - start) < 0.98 * 4 / step


def test_per_request_figures_use_each_reads_tokens() -> None:
    """SGLang's first read holds one token: the decode rate excludes one, not a mean event's
    worth, and every token after it is a step apart."""
    step = 0.002
    (rec,) = _streams(1, 256, 8, step, [0])
    assert rec.decode_tok_s == pytest.approx(1 / step)
    assert inter_token_latencies([rec]) == pytest.approx(np.full(255, step))
    mean_event = rec.tokens_per_event  # 256 / 33
    assert (256 - mean_event) / (rec.last_token - rec.first_token) < 0.98 / step


def test_a_cut_stream_takes_its_count_from_its_last_running_usage() -> None:
    (rec,) = _streams(1, 256, 8, 0.002, [0])
    rec.chunk_times = rec.chunk_times[:10]
    rec.chunk_events = rec.chunk_events[:10]
    rec.chunk_usage = rec.chunk_usage[:10]
    rec.cut = True
    assert count_cut_tokens([rec]) == 0  # none estimated
    assert rec.completion_tokens == 73 and list(rec.read_tokens()) == [1.0] + [8.0] * 9


# ---------------------------------------------------------------------- against the truth

ACCURACY_SPEED = 5.0
"""The simulator's clock for the accuracy checks: a C=4 window of 256-token requests is then
about a wall second (255 steps of 19 ms / 5), so a millisecond the client stamps an edge late
is 0.1% -- the bound itself, before what the run measures of the machine is added."""
ACCURACY_REL = 0.001
"""Within 0.1% of the engine's own count (issue 23's acceptance), plus each trial's measured
slack.  The token count is the engine's (the steps the window holds, every stream's tokens
placed by its running usage); what is left is when the window's two edge reads were stamped:
late by the client's stall then (its lag monitor's word) and by the simulator's lateness at
the steps around the edges (``edge_lag_s`` of ``/sim/truth``), both measured by the run and
both well under a millisecond on an idle machine."""


@pytest.mark.parametrize("protocol", ["stationary", "whole-requests"])
@pytest.mark.parametrize("interval", [1, 2, 8, 16])
def test_tok_s_matches_the_engines_count_for_every_stream_interval(
    sim_measure: Any, protocol: str, interval: int
) -> None:
    """C=4, 256 tokens: the acceptance case.  Before, the plugin read -3.1% (whole requests)
    and -1.4% (stationary) at interval 8 and -6.7% / -3.1% at 16 against SGLang's pattern.

    A step the simulator ran late by half a step or more ran back to back with the next, and
    a read the client stamped that late may sit in the burst of the step next to its own: a
    window's edge can then move by a step, whose tokens are allowed (``grain``) only then."""
    profile = SimConfig(speed=ACCURACY_SPEED, stream_interval=interval)
    # A delay of the client's read shorter than its lag monitor's sampling (LAG_INTERVAL_S,
    # 5 ms) is unseen, so no bound allows it; on a loaded machine one such delay at a window's
    # edge was seen to move a trial's tok/s by 0.3% against 0.24% allowed.  Such a level is
    # measured again (a fresh simulator): a delay the machine made does not come back at the
    # same edge, an error the plugin makes fails every attempt.
    for attempt in range(1, SESSION_ATTEMPTS + 1):
        m = sim_measure(
            profile,
            f"pattern-{protocol}-{interval}",
            concurrency=4,
            max_tokens=256,
            trials=2,
            warmup=2,
            protocol=protocol,
        )
        misses = _pattern_misses(m, profile, protocol)
        if not misses:
            return
        print(f"attempt {attempt}: {misses}")
    raise AssertionError(misses)


def _pattern_misses(m: Any, profile: SimConfig, protocol: str) -> list[str]:
    """What of ``m`` lies beyond its bounds: each trial's window tokens (whole requests) and
    tok/s against the engine's own count; the invariants are asserted here."""
    m.assert_valid_but_for_the_machine()
    step_s = profile.step_time(4)
    errors: list[str] = []
    misses: list[str] = []
    for trial, truth in zip(m.level.trials, m.truths):
        assert trial.tok_s is not None and truth is not None, trial.invalid
        assert trial.window is not None
        ok = [r for r in trial.records if r.ok]
        # every protocol asked for the usage on every chunk, and every stream carried it
        assert {r.position_source for r in ok} == {"usage"}
        late_s = truth["edge_lag_s"] + max(trial.client.stall_at(t) for t in trial.window)
        moved = late_s >= 0.5 * step_s
        if protocol == "whole-requests" and not moved:
            # the engine's steps' own tokens, up to one step at an edge: the lag monitor
            # samples every LAG_INTERVAL_S and cannot see a shorter delay of the edge read,
            # which can still put it in the next step's burst (seen once in CI under load:
            # 1015 against 1016); the rate check below holds the figure to 0.1% either way
            if abs(trial.window_tokens - truth["tokens"]) > 4:
                misses.append(
                    f"the engine's steps' own tokens: {trial.window_tokens} vs {truth['tokens']}"
                )
        if protocol == "stationary":
            # a stationary window's ends are anywhere in a step: the engine's tokens between
            # the two instants, each step's spread over its duration, as the client's own
            # count interpolates between reads (whole steps would put a handover step, a
            # stream between two requests, in or out whole: 1 token of ~600)
            true_tok_s = truth["between_tokens"] / trial.window_s
            grain = 0.0
        else:
            true_tok_s = truth["wall_tok_s"]
            grain = 4 / trial.window_tokens if moved else 0.0
        allowed = ACCURACY_REL + 2 * late_s / trial.window_s + grain
        error = trial.tok_s / true_tok_s - 1
        errors.append(f"{error * 100:+.3f}% (allowed {allowed * 100:.3f}%)")
        if abs(error) > allowed:
            misses.append(f"tok/s vs the engine's: {errors}")
    return misses
