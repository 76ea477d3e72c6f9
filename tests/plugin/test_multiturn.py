"""Multi-turn conversations (``turns=``): each stream continues its own chat, history re-sent.

Three layers: the conversation bookkeeping on its own (answers taken from raw SSE blocks,
bodies spliced from bytes); the load runner against a tiny in-process server that records what
it was sent and answers with text that needs escaping; and real pytest sessions against the
simulator, whose prefill grows with the prompt, so the per-turn report shows the prompt and
the time to first token growing turn by turn.  Nothing here holds a time to a fixed bound: the
TTFT check compares turns of one level whose designed gap is hundreds of milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Callable

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from pytest_kimi.load import LoadClient, Target, TrialPlan
from pytest_kimi.load.conversation import (
    FOLLOW_UPS,
    TRANSCRIPT_ASSISTANT,
    TRANSCRIPT_USER,
    ConversationError,
    Conversations,
    answer_bytes,
    messages_of,
    split_body,
)
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.workers import ShardedClient
from pytest_kimi.measure.results import spec_key, workload_dict
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import WHOLE_REQUESTS, MarkerError
from pytest_kimi.workload.prompts import UNIQUE_SLOT, PromptSource, encode_bodies
from support.timing import SESSION_S

pytest_plugins = ["pytester"]

SLOT = UNIQUE_SLOT.encode()


def event(obj: dict[str, Any], spaced: bool = False) -> bytes:
    sep = (", ", ": ") if spaced else (",", ":")
    return b"data: " + json.dumps(obj, separators=sep).encode() + b"\n\n"


def delta(**fields: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields}]}


def bodies(api: str = "chat", prompts: tuple[str, ...] = ("Hi there.",)) -> list[bytes]:
    return encode_bodies(
        PromptSource(prompts, "list:1"),
        model="m",
        api=api,  # type: ignore[arg-type]
        max_tokens=7,
        ignore_eos=True,
        unique="0123abcd",
    )


# ----------------------------------------------------------------------- answers from blocks


def test_answer_is_the_content_deltas_escaped_and_in_order() -> None:
    stream = b"".join(
        [
            event(delta(role="assistant", content="")),
            event(delta(reasoning_content='think "hard"')),  # never sent back
            event(delta(content='He said "hi"', reasoning_content=None)),
            event(delta(content=" caf\u00e9 \u2713\n"), spaced=True),
            event(delta(content="\\end")),
            event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
            event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
            b"data: [DONE]\n\n",
        ]
    )
    # read blocks split anywhere, even inside an escape: the answer is taken from their join
    blocks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    got = answer_bytes(blocks, "chat")
    assert json.loads(b'"' + got + b'"') == 'He said "hi" caf\u00e9 \u2713\n\\end'
    completions = event({"choices": [{"text": "a\tb"}]}) + event({"choices": [{"text": "c"}]})
    assert json.loads(b'"' + answer_bytes([completions], "completions") + b'"') == "a\tbc"


# ----------------------------------------------------------------------- bodies from bytes


def _answer(text: str) -> RequestRecord:
    rec = RequestRecord(index=0, worker=0, scheduled=0.0, status=200)
    rec.blocks = [event(delta(content=text)), b"data: [DONE]\n\n"]
    return rec


def test_chat_turns_resend_the_history_with_answers_and_follow_ups() -> None:
    body = bodies()[0]
    book = Conversations(3, "chat", SLOT)
    talk = book.open(0, body, b"feedfacecafe")
    assert messages_of(talk.body()) == messages_of(body.replace(SLOT, b"feedfacecafe"))
    assert talk.wants_answer() and talk.reply(_answer('first "answer"'))
    second = json.loads(talk.body())
    assert talk.turn == 2 and second["messages"][1:] == [
        {"role": "assistant", "content": 'first "answer"'},
        {"role": "user", "content": FOLLOW_UPS[0]},
    ]
    # everything but the messages is the prompt body's, as encoded
    original = json.loads(body)
    assert {k: v for k, v in second.items() if k != "messages"} == {
        k: v for k, v in original.items() if k != "messages"
    }
    last = _answer("second")
    assert talk.reply(last) and last.blocks is None  # the blocks are released once read
    third = messages_of(talk.body())
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[3:] == [
        {"role": "assistant", "content": "second"},
        {"role": "user", "content": FOLLOW_UPS[1]},
    ]
    assert third[0]["content"].startswith("feedfacecafe-0123abcd ")  # the opening's own id
    assert not talk.wants_answer() and not talk.reply(_answer("third"))  # the last turn


def test_system_prompts_stay_first_and_failed_turns_end_the_conversation() -> None:
    body = json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "shared prefix"},
                {"role": "user", "content": UNIQUE_SLOT + " q"},
            ],
            "max_tokens": 5,
            "stream": True,
        }
    ).encode()
    talk = Conversations(4, "chat", SLOT).open(0, body, b"000000000001")
    assert talk.reply(_answer("a"))
    roles = [m["role"] for m in messages_of(talk.body())]
    assert roles == ["system", "user", "assistant", "user"]
    failed = _answer("b")
    failed.error = "HTTP 500"
    assert not talk.reply(failed) and failed.blocks is None


def test_completions_grow_one_plain_text_transcript() -> None:
    body = bodies("completions")[0]
    talk = Conversations(3, "completions", SLOT).open(0, body, b"abcdefabcdef")
    first = json.loads(talk.body())["prompt"]
    rec = RequestRecord(index=0, worker=0, scheduled=0.0, status=200)
    rec.blocks = [event({"choices": [{"text": " An answer."}]}), b"data: [DONE]\n\n"]
    assert talk.reply(rec)
    assert json.loads(talk.body())["prompt"] == (
        first + " An answer." + TRANSCRIPT_USER + FOLLOW_UPS[0] + TRANSCRIPT_ASSISTANT
    )


def test_a_body_without_a_conversation_is_refused() -> None:
    with pytest.raises(ConversationError, match="messages"):
        split_body(b'{"model":"m","prompt":"x"}', "chat", None)
    with pytest.raises(ConversationError, match="prompt"):
        split_body(b'{"model":"m","messages":[]}', "completions", None)


# ----------------------------------------------------------------------- the marker


def test_turns_run_whole_conversations_and_key_the_baseline() -> None:
    workload, _ = parse_throughput((), {"concurrency": [1, 4], "turns": 3})
    c4 = workload.levels[1]
    assert workload.turns == 3 and workload.protocol_for(c4) == WHOLE_REQUESTS
    assert workload.requests_for(c4) == 12  # one conversation of 3 turns per stream
    two, _ = parse_throughput((), {"concurrency": 4, "turns": 3, "requests_per_stream": 6})
    assert two.requests_for(two.levels[0]) == 24
    assert workload_dict(workload)["turns"] == 3
    assert spec_key(c4, "builtin:diverse", workload)["turns"] == 3
    plain, _ = parse_throughput((), {"concurrency": 4, "turns": 1})
    assert "turns" not in spec_key(plain.levels[0], "builtin:diverse", plain)  # keys as before


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rate": 2, "turns": 2}, "turns=2 applies to concurrency levels"),
        ({"turns": 2, "protocol": "stationary"}, "drop protocol='stationary'"),
        ({"turns": 3, "requests_per_stream": 4}, "give a multiple of 3"),
        ({"turns": 0}, "turns=0: expected an integer >= 1"),
        ({"turn": 3}, "turn (did you mean turns?)"),
        ({"turns": 2, "dataset": "builtin:sharegpt-small"}, "exclusive"),
    ],
)
def test_bad_turns_name_the_argument_and_the_fix(kwargs: dict[str, Any], words: str) -> None:
    kwargs = {"concurrency": 2, **kwargs} if "rate" not in kwargs else kwargs
    with pytest.raises(MarkerError) as err:
        parse_throughput((), kwargs)
    assert words in str(err.value)


# ----------------------------------------------------------------------- the runner


SENT = web.AppKey("sent", list)


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[SENT].append(body)
    n = len(body["messages"])
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    parts = [
        event(delta(role="assistant", content="")),
        event(delta(reasoning_content="hmm")),
        event(delta(content=f'Answer to {n} "msgs"')),
        event(delta(content=" \u00e9\n")),
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        event({"choices": [], "usage": {"prompt_tokens": 10 * n, "completion_tokens": 3}}),
        b"data: [DONE]\n\n",
    ]
    for part in parts:  # separate writes: the client sees several read blocks
        await resp.write(part)
    await resp.write_eof()
    return resp


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    app = web.Application()
    app[SENT] = sent = []
    app.router.add_post("/v1/chat/completions", _chat)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}/v1/chat/completions", sent
    finally:
        await srv.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("workers", [1, 2])
async def test_each_stream_continues_its_own_conversation(
    server: tuple[str, list[dict[str, Any]]], workers: int
) -> None:
    """One client, and one sharded over two processes (``--perf-workers``): every stream's
    conversation stays its own, whichever process runs it."""
    url, sent = server
    plan = TrialPlan(
        concurrency=2,
        bodies=bodies(prompts=("First prompt.", "Second prompt.")),
        requests=8,
        turns=3,
        unique_slot=SLOT,
    )
    client: LoadClient | ShardedClient = ShardedClient(workers) if workers > 1 else LoadClient()
    async with client:
        tr = await client.run_trial(Target(url), plan)
    assert all(r.ok for r in tr.records) and len(tr.records) == 8
    assert all(r.blocks is None for r in tr.records)  # nothing kept past its request
    by_worker: dict[int, list[RequestRecord]] = {}
    for r in sorted(tr.records, key=lambda r: r.sent):
        by_worker.setdefault(r.worker, []).append(r)
    for records in by_worker.values():
        turns = [r.turn for r in records]
        assert turns[:3] == [1, 2, 3] and turns[3:] in ([1], [1, 2], [], [1, 2, 3])
        assert [r.prompt_tokens for r in records[:3]] == [10, 30, 50]  # the server saw them grow
    conversations = [b["messages"] for b in sent if len(b["messages"]) == 5]
    assert len(conversations) == 2
    for messages in conversations:
        assert messages[1] == {"role": "assistant", "content": 'Answer to 1 "msgs" \u00e9\n'}
        assert messages[2] == {"role": "user", "content": FOLLOW_UPS[0]}
        assert messages[3] == {"role": "assistant", "content": 'Answer to 3 "msgs" \u00e9\n'}
        assert messages[4] == {"role": "user", "content": FOLLOW_UPS[1]}
    firsts = {m[0]["content"] for m in conversations}
    assert len(firsts) == 2  # two streams, two conversations, each with its own unique id
    assert not any(UNIQUE_SLOT in text for text in firsts)


def test_turns_need_whole_requests_in_a_plan() -> None:
    with pytest.raises(ValueError, match="turns must be >= 1"):
        TrialPlan(concurrency=1, bodies=[b"{}"], requests=1, turns=0)
    with pytest.raises(ValueError, match="no first_bodies"):
        TrialPlan(concurrency=1, bodies=[b"{}"], first_bodies=[b"{}"], token_budget=9, turns=2)


# ----------------------------------------------------------------------- the simulator


def test_turn_ttft_grows_with_the_history_the_simulator_prefills(
    sim_measure: Callable[..., Any],
) -> None:
    """Without a prefix cache every turn prefills the whole conversation so far: a prompt
    token costs 50 ms of the server's clock here, so turn 3 (~200 tokens) waits seconds
    longer than turn 1 (~25), in the server's clock; the level's figures come per turn."""
    measured = sim_measure(
        SimConfig(speed=10, prefill_per_token_s=0.05, disable_radix_cache=True),
        "multiturn-ttft",
        concurrency=2,
        max_tokens=32,
        turns=3,
        trials=1,
        warmup=0,
    )
    level = measured.level
    assert level.verdict in ("pass", "invalid"), level.reasons
    turns = level.turns
    assert [t["turn"] for t in turns] == [1, 2, 3] and all(t["requests"] == 2 for t in turns)
    prompts = [t["prompt_tokens_mean"] for t in turns]
    ttfts = [t["ttft_s_p50"] for t in turns]
    assert prompts[0] < prompts[1] < prompts[2], prompts
    # per turn ~90 more prompt tokens, 2 streams: ~9 s more prefill in the server's clock
    assert ttfts[0] < ttfts[2] and ttfts[2] - ttfts[0] > 5, ttfts


def test_the_history_is_a_prefix_the_servers_cache_finds(
    sim_measure: Callable[..., Any],
) -> None:
    """Turn 2 re-sends turn 1 byte for byte before its answer and follow-up, so a prefix
    cache serves it (the simulator's radix cache, pages of 16 tokens); independent requests
    share nothing (every prompt opens with its own unique id)."""
    cached = {}
    for turns in (1, 2):
        measured = sim_measure(
            SimConfig(speed=20),
            f"multiturn-cache-{turns}",
            concurrency=2,
            max_tokens=16,
            turns=turns,
            requests_per_stream=2,
            trials=1,
            warmup=0,
        )
        assert measured.level.figures.requests_ok == 4
        cached[turns] = measured.sim_stats["cached_prompt_tokens"]
    assert cached[1] == 0 and cached[2] > 0, cached


def test_multiturn_session_reports_prompt_and_ttft_per_turn(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        """
        from pytest_kimi import throughput

        @throughput(concurrency=2, max_tokens=32, turns=3, trials=2, warmup=1)
        def test_chat(throughput_result):
            (level,) = throughput_result.levels
            assert {r.turn for t in level.trials for r in t.records} == {1, 2, 3}

        @throughput(concurrency=2, max_tokens=16, turns=2, api="completions", trials=2, warmup=1)
        def test_transcript():
            pass
        """
    )
    report = tmp_path / "perf.json"
    result = pytester.runpytest_subprocess(
        "--endpoint=sim:speed=50,stream_interval=8", f"--perf-json={report}", timeout=SESSION_S
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*C=2 by turn: turn 1: * prompt tok, TTFT p50 * s; turn 2: *"])
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(report.read_text())["tests"]}
    chat = tests["test_chat"]
    assert chat["workload"]["turns"] == 3
    (level,) = chat["levels"]
    assert level["protocol"] is None  # whole-requests, as the key records it
    assert level["requests_ok"] == 2 * 3 * 2 and level["requests_failed"] == 0
    means = [t["prompt_tokens_mean"] for t in level["turns"]]
    assert len(means) == 3 and means[0] < means[1] < means[2], means
    transcript = tests["test_transcript"]["levels"][0]["turns"]
    assert transcript[0]["prompt_tokens_mean"] < transcript[1]["prompt_tokens_mean"]
