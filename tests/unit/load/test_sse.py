"""The byte-counting SSE parser must agree with a plain parser that json-decodes every event.

The reference below is deliberately written differently from :mod:`pytest_kimi.load.sse`
(line by line, decoding everything) so that agreement over many generated streams, split at
every byte, is evidence that the fast path's counting shortcuts are sound.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_kimi.load.sse import MAX_EVENT_BYTES, StreamParser, parse_blocks
from pytest_kimi.load.sse_errors import error_event_message, malformed_message
from pytest_kimi.load.sse_usage import usage_below_events_message, usage_problem
from pytest_kimi.load.records import RequestRecord


# --------------------------------------------------------------------------- reference parser
@dataclass
class RefResult:
    chunk_times: list[float] = field(default_factory=list)
    chunk_events: list[int] = field(default_factory=list)
    first_token: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    tokens_approx: bool = False
    error: str | None = None
    finish_reason: str | None = None
    done: bool = False
    reasoning_tokens: int = 0
    first_content: float | None = None
    usage_error: str | None = None


def _ref_interpret(
    payload: bytes, api: str, res: RefResult, usage: list[Any], reasoning: list[int]
) -> int:
    """1 token event, 0 other, -1 stream ended with an error; ``reasoning[0]`` counts the
    token events without any answer text (reasoning only)."""
    try:
        obj = json.loads(payload)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        res.error = res.error or malformed_message(payload)
        return -1
    if obj.get("error") is not None or obj.get("object") == "error":
        res.error = res.error or error_event_message(obj)
        return -1
    token = 0
    answer = False
    for ch in obj.get("choices") or []:
        if not isinstance(ch, dict):
            continue
        if api == "chat":
            delta = ch.get("delta") or {}
            texts = (
                [delta.get(k) for k in ("content", "reasoning_content", "reasoning")]
                if isinstance(delta, dict)
                else []
            )
        else:
            texts = [ch.get("text")]
        if any(isinstance(x, str) and x != "" for x in texts):
            token = 1
            if isinstance(texts[0], str) and texts[0] != "":
                answer = True
        if ch.get("finish_reason") is not None:
            res.finish_reason = str(ch["finish_reason"])
    u = obj.get("usage")
    if isinstance(u, dict) and u.get("completion_tokens") is not None:
        # the last usage is the server's word; one whose count is no count is not believed
        value = u["completion_tokens"]
        if type(value) is int and value >= 0 or type(value) is float and value == int(value) >= 0:
            usage[:] = [u]
            res.usage_error = None
        else:
            usage[:] = []
            res.usage_error = usage_problem(value)
    if token and not answer:
        reasoning[0] += 1
    return token


def reference_parse(blocks: list[tuple[float, bytes]], api: str = "chat") -> RefResult:
    """Plain SSE parser: lines, blank-line dispatch, ``json.loads`` on every data event."""
    res = RefResult()
    usage: list[Any] = []
    reasoning = [0]
    full = b""
    pos = 0  # next unparsed byte of `full`
    ev_start = 0  # first byte after the last blank line
    data: list[bytes] = []
    ended = False
    for t, block in blocks:
        if ended:
            break
        full += block
        tokens = 0
        reasoning_before = reasoning[0]
        while not ended:
            nl = full.find(b"\n", pos)
            if nl < 0:
                break
            line, pos = full[pos:nl], nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line == b"":
                ev_start = pos
                if data:
                    payload = b"\n".join(data)
                    data = []
                    if payload.strip() == b"[DONE]":
                        res.done = ended = True
                        break
                    r = _ref_interpret(payload, api, res, usage, reasoning)
                    if r < 0:
                        ended = True
                        break
                    tokens += r
                continue
            if line.startswith(b":"):
                continue
            if b":" in line:
                name, value = line.split(b":", 1)
            else:
                name, value = line, b""
            if name == b"data":
                data.append(value[1:] if value.startswith(b" ") else value)
            elif name not in (b"event", b"id", b"retry"):
                res.error = res.error or malformed_message(line)
                ended = True
        if tokens:
            if res.first_token is None:
                res.first_token = t
            res.chunk_times.append(t)
            res.chunk_events.append(tokens)
            if res.first_content is None and tokens > reasoning[0] - reasoning_before:
                res.first_content = t
    if not ended:
        tail = full[ev_start:].replace(b"\r", b"").strip()
        if tail in (b"data: [DONE]", b"data:[DONE]"):
            res.done = True
    events = sum(res.chunk_events)
    if usage and usage[0]["completion_tokens"] < events:
        res.usage_error = usage_below_events_message(int(usage[0]["completion_tokens"]), events)
        usage = []
    if usage:
        res.completion_tokens = int(usage[0]["completion_tokens"])
        pt = usage[0].get("prompt_tokens")
        res.prompt_tokens = pt if type(pt) is int and pt >= 0 else 0
    else:
        res.completion_tokens = sum(res.chunk_events)
        res.tokens_approx = True
    if reasoning[0]:
        # the server's count (OpenAI's place first, then SGLang's top-level key), else the
        # reasoning events times the request's tokens per event
        told = 0
        if usage:
            details = usage[0].get("completion_tokens_details") or {}
            for cand in (
                details.get("reasoning_tokens") if isinstance(details, dict) else None,
                usage[0].get("reasoning_tokens"),
            ):
                if type(cand) is int:
                    told = cand
                    break
        events = sum(res.chunk_events)
        per_event = res.completion_tokens / events if res.completion_tokens else 1.0
        n = told if told > 0 else int(round(reasoning[0] * per_event))
        res.reasoning_tokens = max(1, min(n, res.completion_tokens) if res.completion_tokens else n)
    return res


def fast_parse(
    blocks: list[tuple[float, bytes]], api: str = "chat"
) -> tuple[RefResult, StreamParser]:
    rec = RequestRecord(index=0, worker=0, scheduled=0.0)
    p = StreamParser(rec, api)  # type: ignore[arg-type]
    for t, b in blocks:
        p.feed(t, b)
    p.close()
    out = RefResult(
        chunk_times=list(rec.chunk_times),
        chunk_events=list(rec.chunk_events),
        first_token=rec.first_token,
        completion_tokens=rec.completion_tokens,
        prompt_tokens=rec.prompt_tokens,
        tokens_approx=rec.tokens_approx,
        error=rec.error,
        finish_reason=rec.finish_reason,
        done=p.done,
        reasoning_tokens=rec.reasoning_tokens,
        first_content=rec.first_content,
        usage_error=rec.usage_error,
    )
    return out, p


# --------------------------------------------------------------------------- stream generator
WORDS = [
    " the",
    " a",
    "Hello",
    ",",
    ".",
    " 世界",
    " 🚀",
    "é",
    "\n",
    ' "quoted"',
    '"content":"',
    "data: [DONE]\n\n",
    "\\",
    ' {"x": 1}',
    " ø",
    "\t",
    " token",
    " ",
    "Ω",
    " 𝔘𝔫𝔦",
    '"finish_reason":"stop"',
    ": ping",
    "\r\n",
]


def _dumps(obj: Any, spaced: bool) -> str:
    return json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Style:
    name: str
    api: str = "chat"
    role_chunk: bool = True
    role_every_chunk: bool = False
    reasoning_key: str | None = None  # reasoning tokens before content tokens
    null_fields: bool = False  # sglang-style "reasoning_content":null,"tool_calls":null
    usage: str = "last"  # "last" (choices: []), "finish" (in finish chunk), "none"
    finish_with_token: bool = False  # last token rides in the finish chunk (TGI)
    spaced: bool = False
    crlf: bool = False
    empty_content_with_reasoning: bool = False  # DeepSeek: "content":"","reasoning_content":"x"
    msgspec: bool = False
    """SGLang 0.5.23 (``sse_utils.build_sse_content``): the delta always has
    ``"reasoning_content"`` (null on content chunks), ``role``/``content`` only when set."""
    usage_reasoning: bool = False  # usage counts reasoning tokens, as SGLang's UsageInfo does


STYLES = [
    Style("vllm"),
    Style("sglang", null_fields=True),
    Style("llamacpp", usage="finish", role_chunk=False),
    Style("tgi", role_every_chunk=True, finish_with_token=True, usage="none"),
    Style("reasoning_content", reasoning_key="reasoning_content", null_fields=True),
    Style("reasoning_vllm_new", reasoning_key="reasoning"),
    Style("deepseek", reasoning_key="reasoning_content", empty_content_with_reasoning=True),
    Style(
        "sglang_0523_reasoning",
        reasoning_key="reasoning_content",
        msgspec=True,
        usage_reasoning=True,
    ),
    Style("spaced", spaced=True),
    Style("crlf", crlf=True),
    Style("completions", api="completions", role_chunk=False),
    Style(
        "completions_usage_finish", api="completions", role_chunk=False, usage="finish", spaced=True
    ),
]


def gen_stream(style: Style, rng: random.Random, n_tokens: int, *, extras: bool = True) -> bytes:
    """One server response body in ``style`` with optional comments, empty deltas, errors."""
    head = {
        "id": "chatcmpl-" + "%08x" % rng.getrandbits(32),
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
    }
    if style.api == "completions":
        head["object"] = "text_completion"
    events: list[str] = []

    def choice(
        delta: dict[str, Any] | None = None, text: str | None = None, finish: str | None = None
    ) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0}
        if style.api == "chat":
            c["delta"] = delta if delta is not None else {}
        else:
            c["text"] = text if text is not None else ""
        c["logprobs"] = None
        c["finish_reason"] = finish
        if style.null_fields:
            c["matched_stop"] = None
        return c

    def chunk(ch: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> str:
        obj = dict(head)
        obj["choices"] = [ch] if ch is not None else []
        if usage is not None or style.null_fields:
            obj["usage"] = usage
        return "data: " + _dumps(obj, style.spaced)

    def delta(key: str, value: str | None) -> dict[str, Any]:
        if style.msgspec:
            d = {"reasoning_content": value if key == "reasoning_content" else None}
            if key != "reasoning_content":
                d[key] = value
            return d
        d: dict[str, Any] = {}
        if style.role_every_chunk:
            d["role"] = "assistant"
        d[key] = value
        if style.null_fields:
            d.setdefault("content", None)
            d.setdefault("reasoning_content", None)
            d["tool_calls"] = None
        if style.empty_content_with_reasoning and key != "content":
            d["content"] = ""
        return d

    if style.role_chunk and style.api == "chat":
        d = (
            {"reasoning_content": None, "role": "assistant", "content": ""}
            if style.msgspec
            else {"role": "assistant", "content": ""}
        )
        if style.null_fields:
            d.update(reasoning_content=None, tool_calls=None)
        events.append(chunk(choice(d)))
    n_reason = n_tokens // 3 if style.reasoning_key else 0
    last_token_in_finish = style.finish_with_token and n_tokens > 0
    body_tokens = n_tokens - 1 if last_token_in_finish else n_tokens
    for i in range(body_tokens):
        w = rng.choice(WORDS)
        if extras and rng.random() < 0.04:
            events.append(rng.choice([": ping", ": keep-alive", ":"]))
        if extras and rng.random() < 0.04 and style.api == "chat":
            events.append(chunk(choice(delta("content", ""))))  # empty delta: not a token
        if extras and rng.random() < 0.03:
            events.append(
                "event: message\nid: %d\n" % i
                + chunk(choice(delta("content", w) if style.api == "chat" else None, text=w))
            )
            continue
        if style.api == "completions":
            events.append(chunk(choice(text=w)))
        elif i < n_reason:
            events.append(chunk(choice(delta(style.reasoning_key or "content", w))))
        else:
            events.append(chunk(choice(delta("content", w))))
    usage: dict[str, Any] = {
        "prompt_tokens": 17,
        "total_tokens": 17 + n_tokens,
        "completion_tokens": n_tokens,
    }
    if style.usage_reasoning:
        usage["reasoning_tokens"] = n_reason
        usage["completion_tokens_details"] = {"reasoning_tokens": n_reason} if n_reason else None
    fin_usage = usage if style.usage == "finish" else None
    if last_token_in_finish:
        fin = choice(delta("content", "!"), text="!", finish="length")
    else:
        fin = choice(
            delta("content", "") if style.usage != "finish" else {}, text="", finish="stop"
        )
    events.append(chunk(fin, fin_usage))
    if style.usage == "last":
        events.append(chunk(None, usage))
    events.append("data: [DONE]")
    sep = "\r\n" if style.crlf else "\n"
    text = "".join(e.replace("\n", sep) + sep + sep for e in events)
    return text.encode()


def split_at(stream: bytes, points: list[int]) -> list[tuple[float, bytes]]:
    pts = [0, *sorted(set(p for p in points if 0 < p < len(stream))), len(stream)]
    return [(float(i), stream[a:b]) for i, (a, b) in enumerate(zip(pts, pts[1:]))]


def random_blocks(stream: bytes, rng: random.Random, mean: int) -> list[tuple[float, bytes]]:
    pts, pos = [], 0
    while pos < len(stream):
        pos += max(1, int(rng.expovariate(1 / mean)))
        pts.append(pos)
    return split_at(stream, pts)


def assert_same(blocks: list[tuple[float, bytes]], api: str = "chat") -> StreamParser:
    ref = reference_parse(blocks, api)
    got, parser = fast_parse(blocks, api)
    assert got == ref, f"fast {got}\nref  {ref}"
    return parser


# ----------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("style", STYLES, ids=lambda s: s.name)
def test_every_split_point(style: Style) -> None:
    """Two blocks, split at every byte: events split anywhere, also inside UTF-8 chars."""
    rng = random.Random(len(style.name))
    stream = gen_stream(style, rng, 8)
    # every byte for the main server shapes; every 5th for the variants (keeps the run short)
    step = (
        1
        if style.name
        in ("vllm", "crlf", "reasoning_content", "sglang_0523_reasoning", "completions")
        else 5
    )
    for cut in range(0, len(stream) + 1, step):
        assert_same(split_at(stream, [cut]), style.api)


@pytest.mark.parametrize("style", STYLES, ids=lambda s: s.name)
def test_random_blocks(style: Style) -> None:
    rng = random.Random(7 + len(style.name))
    for _ in range(25):
        stream = gen_stream(style, rng, rng.randint(0, 80))
        mean = rng.choice([1, 7, 60, 400, 3000, 100000])
        p = assert_same(random_blocks(stream, rng, mean), style.api)
        assert p.done


@pytest.mark.parametrize("style", STYLES, ids=lambda s: s.name)
def test_three_way_splits(style: Style) -> None:
    rng = random.Random(99)
    stream = gen_stream(style, rng, 6)
    n = len(stream)
    for a in range(0, n, 29):
        for b in range(a, n, 71):
            assert_same(split_at(stream, [a, b]), style.api)


@pytest.mark.parametrize("mean", [4000, 10**7])
def test_fast_path_is_taken_on_plain_token_blocks(mean: int) -> None:
    """Only the few unusual events (role, finish, usage, [DONE]) are json-decoded, also when
    the whole stream arrives as one huge block (a client that fell behind)."""
    rng = random.Random(1)
    for style in STYLES:
        stream = gen_stream(style, rng, 400, extras=False)
        p = assert_same(random_blocks(stream, rng, mean), style.api)
        assert p.decoded <= 20, (style.name, p.decoded, p.fast_ranges)


def test_token_counts_and_usage() -> None:
    for style in STYLES:
        stream = gen_stream(style, random.Random(3), 50, extras=False)
        rec = parse_blocks([(1.0, stream)], style.api)  # type: ignore[arg-type]
        assert rec.events == 50, style.name
        assert rec.first_token == 1.0
        if style.usage == "none":
            assert rec.tokens_approx and rec.completion_tokens == 50
        else:
            assert not rec.tokens_approx and rec.completion_tokens == 50 and rec.prompt_tokens == 17
        assert rec.finish_reason in ("stop", "length")
        assert rec.error is None


def _events(*payloads: str, sep: str = "\n") -> bytes:
    return "".join(p + sep + sep for p in payloads).encode()


TOK = 'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}'


@pytest.mark.parametrize(
    "bad, expect",
    [
        (
            'data: {"error": {"message": "KV cache exhausted", "code": 503}}',
            "server error event: KV cache exhausted (503)",
        ),
        (
            'data: {"object":"error","message":"too long","type":"BadRequestError","code":400}',
            "server error event: too long (400)",
        ),
        ("data: this is not json", "malformed SSE event: this is not json"),
        ('data: {"choices":[{"delta":{},"finish_reason":"stop"', 'malformed SSE event: {"choices'),
        ("<html><body>502 Bad Gateway</body></html>", "malformed SSE event: <html>"),
        ("data: [1, 2]", "malformed SSE event: [1, 2]"),
        ("garbage line\n" + TOK % "z", "malformed SSE event: garbage line"),
    ],
)
def test_error_events_mid_stream(bad: str, expect: str) -> None:
    stream = _events(TOK % "a", TOK % "b", bad, TOK % "c", "data: [DONE]")
    for cut in range(len(stream) + 1):
        p = assert_same(split_at(stream, [cut]))
        assert p.failed and not p.done
        assert p.record.error is not None and p.record.error.startswith(expect)
        assert p.record.events == 2


def test_malformed_message_is_bounded() -> None:
    rec = parse_blocks([(0.0, b"data: " + b"x" * 500 + b"\n\n")])
    assert rec.error == "malformed SSE event: " + "x" * 80


def test_split_inside_multibyte_utf8() -> None:
    stream = _events(TOK % "🚀世界", TOK % "é", "data: [DONE]")
    for cut in range(len(stream) + 1):
        for cut2 in range(cut, len(stream) + 1, 3):
            assert_same(split_at(stream, [cut, cut2]))
    assert (
        parse_blocks([(0.0, stream[:i]) if i == 9 else (1.0, stream[9:]) for i in (9, 10)]).events
        == 2
    )


def test_escaped_quotes_cannot_fake_tokens() -> None:
    tricky = json.dumps('"content":"x", "finish_reason":"stop" data: [DONE]\n\n "text":"')
    stream = _events(
        'data: {"choices":[{"delta":{"content":%s},"finish_reason":null}]}' % tricky,
        TOK % '\\"',
        "data: [DONE]",
    )
    assert b'\\"content\\":\\"' in stream
    p = assert_same([(0.0, stream)])
    assert p.record.events == 2 and p.record.finish_reason is None and p.done


def test_role_only_and_empty_chunks_are_not_tokens() -> None:
    stream = _events(
        'data: {"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}',
        'data: {"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
        'data: {"choices":[{"delta":{"content":null},"finish_reason":null}]}',
        'data: {"choices":[{"delta":{},"finish_reason":null}]}',
        "data: [DONE]",
    )
    p = assert_same([(0.0, stream)])
    assert p.done and p.record.events == 0 and p.record.first_token is None


def test_crlf_split_between_cr_and_lf() -> None:
    stream = _events(TOK % "a", TOK % "b", "data: [DONE]", sep="\r\n")
    for cut in range(len(stream) + 1):
        p = assert_same(split_at(stream, [cut]))
        assert p.done and p.record.events == 2


def test_keepalive_only_blocks_and_done_without_blank_line() -> None:
    blocks = [
        (0.0, b": ping\n\n"),
        (1.0, _events(TOK % "a")),
        (2.0, b":\n\n: keep-alive\n\n"),
        (3.0, b"data: [DONE]\n"),
    ]
    p = assert_same(blocks)
    assert p.done and list(p.record.chunk_times) == [1.0]


def test_truncated_token_shaped_event_is_malformed() -> None:
    """An event that carries the token pattern but does not end as a JSON object (a truncated
    write) fails the fast path's ``}\n\n`` count and is decoded, hence reported."""
    rec = parse_blocks(
        [(0.0, _events(TOK % "a", 'data: {"choices":[{"delta":{"content":"x"', TOK % "b"))]
    )
    assert rec.error is not None and "malformed SSE event" in rec.error


def test_truncated_stream_is_not_done() -> None:
    stream = _events(TOK % "a", TOK % "b")
    p = assert_same([(0.0, stream + b'data: {"choices":[{"del')])
    assert not p.done and not p.failed and p.record.events == 2 and p.record.tokens_approx


def test_nothing_after_done_is_counted() -> None:
    stream = _events(TOK % "a", "data: [DONE]", TOK % "b")
    p = assert_same([(0.0, stream[:30]), (1.0, stream[30:])])
    assert p.record.events == 1


def test_multi_choice_events_count_once() -> None:
    two = 'data: {"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}'
    p = assert_same([(0.0, _events(two, two, TOK % "c", "data: [DONE]"))])
    assert p.record.events == 3
    p = assert_same([(0.0, _events(TOK % "c", two, "data: [DONE]"))])
    assert p.record.events == 2 and p.done
    usage = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":5}}'
    p = assert_same([(0.0, _events(two)), (1.0, _events(two, TOK % "c", usage))])
    assert p.record.events == 3 and p.record.completion_tokens == 5


def test_block_timestamps() -> None:
    a, b = _events(TOK % "a", TOK % "b"), _events(TOK % "c", "data: [DONE]")
    rec = parse_blocks([(5.0, a[:10]), (6.0, a[10:] + b[:5]), (7.0, b[5:])])
    assert (
        list(rec.chunk_times) == [6.0, 7.0]
        and list(rec.chunk_events) == [2, 1]
        and rec.first_token == 6.0
    )


def test_bad_api_rejected() -> None:
    with pytest.raises(ValueError):
        StreamParser(RequestRecord(index=0, worker=0, scheduled=0.0), "embeddings")  # type: ignore[arg-type]


def _soup_event(rng: random.Random, api: str, spaced: bool) -> str:
    """One random event of any kind the parser may meet (excluding documented limits:
    token-shaped invalid JSON, usage on plain token chunks, multi-choice chunks mid-stream)."""
    w = rng.choice(WORDS)

    def ch(**kw: Any) -> str:
        c: dict[str, Any] = {"index": 0}
        if api == "chat":
            c["delta"] = kw.pop("delta", {})
        else:
            c["text"] = kw.pop("text", "")
        c["finish_reason"] = kw.pop("finish", None)
        obj: dict[str, Any] = {"id": "x", "choices": [c]}
        obj.update(kw)
        return "data: " + _dumps(obj, spaced)

    kinds = [
        lambda: ch(delta={"content": w}, text=w),
        lambda: ch(delta={"reasoning_content": w, "content": None}),
        lambda: ch(delta={"reasoning": w}),
        lambda: ch(delta={"content": "", "reasoning_content": w}),
        lambda: ch(delta={"content": w, "reasoning_content": w}),
        lambda: ch(delta={"content": ""}, text=""),
        lambda: ch(delta={"content": None}),
        lambda: ch(delta={"role": "assistant"}),
        lambda: ch(delta={"role": "assistant", "content": w}),
        lambda: ch(delta={}),
        lambda: ch(delta={"content": w}, text=w, finish="length"),
        lambda: ch(
            delta={"content": ""},
            text="",
            finish="stop",
            usage={"prompt_tokens": 3, "completion_tokens": 9},
        ),
        lambda: (
            "data: "
            + _dumps(
                {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}},
                spaced,
            )
        ),
        lambda: ": ping",
        lambda: ":",
        lambda: "event: delta\n" + ch(delta={"content": w}, text=w),
        lambda: "id: 7\n" + ch(delta={"content": w}, text=w),
        lambda: 'data: {"error": {"message": "boom", "code": 500}}',
        lambda: "data: not-json",
        lambda: "junk line",
        lambda: "data: [DONE]",
        lambda: ch(delta={"content": w}, text=w) + "\n",  # extra blank line
    ]
    weights = [40, 6, 6, 4, 3, 4, 3, 2, 3, 2, 2, 1, 1, 3, 1, 2, 2, 0.5, 0.5, 0.5, 0.7, 2]
    return rng.choices(kinds, weights)[0]()


def test_random_event_soup() -> None:
    """Adversarial mixtures in random order, random JSON style, random CRLF and splits."""
    rng = random.Random(2024)
    for _ in range(200):
        api = rng.choice(["chat", "chat", "completions"])
        spaced = rng.random() < 0.2
        events = [
            _soup_event(rng, api, spaced if rng.random() < 0.95 else not spaced)
            for _ in range(rng.randint(1, 60))
        ]
        if rng.random() < 0.7:
            events.append("data: [DONE]")
        sep = "\r\n" if rng.random() < 0.2 else "\n"
        stream = "".join(e.replace("\n", sep) + sep + sep for e in events).encode()
        mean = rng.choice([5, 50, 500, 5000, 10**6])
        assert_same(random_blocks(stream, rng, mean), api)


# ------------------------------------------------------------------ reasoning streams
REASONING_STYLES = [s for s in STYLES if s.reasoning_key]


def _one_event_per_block(stream: bytes) -> list[tuple[float, bytes]]:
    """Each event its own read, stamped with its position: block times count events."""
    sep = b"\r\n\r\n" if b"\r\n" in stream else b"\n\n"
    parts = stream.split(sep)[:-1]
    return [(float(i), p + sep) for i, p in enumerate(parts)]


@pytest.mark.parametrize("style", STYLES, ids=lambda s: s.name)
def test_reasoning_and_content_counts(style: Style) -> None:
    """Reasoning styles: the first n // 3 tokens are reasoning, and the first content token
    comes exactly that many events after the first token; other styles report no reasoning
    and the first content token is the first token."""
    n = 48
    stream = gen_stream(style, random.Random(5), n, extras=False)
    rec = parse_blocks(_one_event_per_block(stream), style.api)  # type: ignore[arg-type]
    n_reason = n // 3 if style.reasoning_key else 0
    assert rec.reasoning_tokens == n_reason, style.name
    assert rec.content_tokens == n - n_reason
    assert rec.first_token is not None and rec.first_content is not None
    assert rec.first_content - rec.first_token == n_reason
    whole = parse_blocks([(3.0, stream)], style.api)  # type: ignore[arg-type]
    assert whole.reasoning_tokens == n_reason and whole.first_content == whole.first_token == 3.0


def _sglang_event(kind: str, text: str = "", finish: str | None = None) -> str:
    """One chunk exactly as SGLang 0.5.23's msgspec encoder writes it (compact, field order of
    ``StreamDelta``: reasoning_content, role, content)."""
    if kind == "reasoning":
        delta = {"reasoning_content": text}
    elif kind == "content":
        delta = {"reasoning_content": None, "content": text}
    elif kind == "role":
        delta = {"reasoning_content": None, "role": "assistant", "content": ""}
    else:
        delta = {"reasoning_content": None}
    obj = {
        "id": "c0ffee",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "kimi-k2",
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
        ],
    }
    return "data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _sglang_stream(
    n_reason: int, n_content: int, *, usage_reasoning: int | None, per_event: int = 1
) -> bytes:
    body = [_sglang_event("role")]
    body += [_sglang_event("reasoning", " hm" * per_event)] * n_reason
    body += [_sglang_event("content", " ok" * per_event)] * n_content
    body.append(_sglang_event("finish", finish="length"))
    total = (n_reason + n_content) * per_event
    usage: dict[str, Any] = {
        "prompt_tokens": 9,
        "total_tokens": 9 + total,
        "completion_tokens": total,
        "prompt_tokens_details": None,
    }
    if usage_reasoning is not None:
        usage["reasoning_tokens"] = usage_reasoning
        usage["completion_tokens_details"] = (
            {"reasoning_tokens": usage_reasoning} if usage_reasoning else None
        )
    body.append(
        "data: "
        + json.dumps(
            {
                "id": "c0ffee",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "kimi-k2",
                "choices": [],
                "usage": usage,
            },
            separators=(",", ":"),
        )
    )
    body.append("data: [DONE]")
    return _events(*body)


def test_sglang_reasoning_stream_split_everywhere() -> None:
    """The SGLang 0.5.23 shape, split at every byte and three ways: both counts and both
    first-token times agree with the decode-everything reference, and are the known ones."""
    stream = _sglang_stream(3, 2, usage_reasoning=4)  # usage counts the end-of-thinking token too
    for cut in range(len(stream) + 1):
        p = assert_same(split_at(stream, [cut]))
        assert p.done and p.record.reasoning_tokens == 4 and p.record.content_tokens == 1
    n = len(stream)
    for a in range(0, n, 17):
        for b in range(a, n, 41):
            assert_same(split_at(stream, [a, b]))
    rec = parse_blocks(_one_event_per_block(stream))
    assert (rec.first_token, rec.first_content, rec.events) == (1.0, 4.0, 5)


def test_reasoning_tokens_without_usage_count_or_packed_events() -> None:
    """No reasoning count in usage: events scaled by tokens per event (a server that packs
    4 tokens per event, like SGLang's --stream-interval 4); no usage at all: events."""
    packed = _sglang_stream(5, 3, usage_reasoning=None, per_event=4)
    rec = parse_blocks([(0.0, packed)])
    assert (rec.completion_tokens, rec.reasoning_tokens, rec.content_tokens) == (32, 20, 12)
    zero = _sglang_stream(5, 3, usage_reasoning=0, per_event=4)
    assert parse_blocks([(0.0, zero)]).reasoning_tokens == 20
    no_usage = b"".join(
        e + b"\n\n" for e in packed.split(b"\n\n") if b'"choices":[]' not in e and e
    )
    rec = parse_blocks([(0.0, no_usage)])
    assert rec.tokens_approx and (rec.completion_tokens, rec.reasoning_tokens) == (8, 5)


def test_usage_reasoning_without_separated_stream_is_not_reported() -> None:
    """separate_reasoning=false: SGLang streams the thinking as content but still counts it in
    usage; the stream did not separate them, so nothing is reported."""
    stream = _sglang_stream(0, 6, usage_reasoning=4)
    rec = parse_blocks([(0.0, stream[:400]), (1.0, stream[400:])])
    assert (
        rec.reasoning_tokens == 0
        and rec.content_tokens == 6
        and rec.first_content == rec.first_token
    )


def test_mixed_and_packed_reasoning_events() -> None:
    """An event with both texts counts as content (the answer has begun); several reasoning
    and content events packed into one read count exactly; the read that brings the first
    content event is the first content time."""
    both = 'data: {"choices":[{"index":0,"delta":{"reasoning_content":"r","content":"c"},"finish_reason":null}]}'
    reason = (
        'data: {"choices":[{"index":0,"delta":{"reasoning_content":"r"},"finish_reason":null}]}'
    )
    reason_vllm = 'data: {"choices":[{"index":0,"delta":{"reasoning":"r"},"finish_reason":null}]}'
    blocks = [
        (1.0, _events(reason, reason, reason_vllm)),
        (2.0, _events(reason, reason_vllm)[:30]),
        (3.0, _events(reason, reason_vllm)[30:] + _events(both, TOK % "a")),
        (4.0, _events(TOK % "b", "data: [DONE]")),
    ]
    p = assert_same(blocks)
    rec = p.record
    assert (rec.events, rec.reasoning_tokens, rec.content_tokens) == (8, 5, 3)
    assert (rec.first_token, rec.first_content) == (1.0, 3.0)
    assert p.reasoning_events == 5


def test_reasoning_only_stream_has_no_first_content() -> None:
    """max_tokens reached while still thinking: all tokens are reasoning, no content time."""
    rec = parse_blocks([(0.0, _sglang_stream(6, 0, usage_reasoning=6))])
    assert (rec.reasoning_tokens, rec.content_tokens, rec.first_content, rec.ttfc) == (
        6,
        0,
        None,
        None,
    )


def test_reasoning_ranges_stay_on_the_fast_path() -> None:
    """Pure reasoning and pure content reads are classified by byte counts; only the reads
    that hold the switch from reasoning to content (once per stream) are cut and decoded."""
    stream = _sglang_stream(600, 200, usage_reasoning=None)
    for mean in (300, 4000, 10**7):
        p = assert_same(random_blocks(stream, random.Random(mean), mean))
        assert p.record.reasoning_tokens == 600
        assert p.decoded <= 12, (mean, p.decoded, p.fast_ranges)


# ------------------------------------------------------------------------------- bounds
ROLE = 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
FINISH = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'


def _usage(value: str) -> str:
    return 'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%s}}' % value


def _parse(blocks: list[bytes], max_tokens: int = 0) -> StreamParser:
    rec = RequestRecord(index=0, worker=0, scheduled=0.0)
    p = StreamParser(rec, "chat", max_tokens)
    for i, b in enumerate(blocks):
        p.feed(float(i), b)
    p.close()
    return p


def test_a_stream_past_max_tokens_fails_at_the_first_event_too_many() -> None:
    """Token events never outnumber tokens, so event ``max_tokens + 1`` proves the server
    ignores the limit: the stream fails there (the reader stops), whatever comes after."""
    tokens = [_events(TOK % i) for i in range(8)]
    p = _parse([_events(ROLE), *tokens, _events("data: [DONE]")], max_tokens=5)
    assert p.failed and not p.done
    assert p.record.error is not None
    assert p.record.error.startswith("stream passed max_tokens=5: 6 token events arrived")
    assert p.events == 6  # nothing was taken after the event that broke the limit
    # in one block: the same
    p = _parse([_events(ROLE, *(TOK % i for i in range(8)))], max_tokens=5)
    assert p.failed and p.record.error and "max_tokens=5: 8 token events" in p.record.error
    # exactly max_tokens is fine, and unknown limits are no limit
    whole = [_events(ROLE), *tokens[:5], _events(FINISH, _usage("5"), "data: [DONE]")]
    assert _parse(whole, max_tokens=5).done
    assert _parse([_events(ROLE), *tokens, _events("data: [DONE]")]).done


def test_a_usage_above_max_tokens_fails_the_stream() -> None:
    blocks = [_events(ROLE, TOK % "a", FINISH, _usage("9"), "data: [DONE]")]
    p = _parse(blocks, max_tokens=5)
    assert p.failed and p.record.error is not None
    assert p.record.error.startswith("usage says 9 completion tokens, more than max_tokens=5")


@pytest.mark.parametrize(
    "value, problem",
    [
        ("-3", "usage.completion_tokens=-3 is negative"),
        ("3.5", "usage.completion_tokens=3.5 is fractional"),
        ('"12"', 'usage.completion_tokens="12" is not a number'),
        ("true", "usage.completion_tokens is a bool (true), not a count"),
        ("[3]", "usage.completion_tokens=[3] is not a number"),
        ("1", "usage.completion_tokens=1 is below the 3 token events streamed"),
    ],
)
def test_usage_that_is_no_count_is_not_believed(value: str, problem: str) -> None:
    """The stream is fine (done, no error) but its usage is refused, named, and the tokens
    are counted from the events instead (so no figure is negative or fractional)."""
    stream = _events(ROLE, TOK % "a", TOK % "b", TOK % "c", FINISH, _usage(value), "data: [DONE]")
    p = assert_same([(0.0, stream)])
    rec = p.record
    assert p.done and rec.error is None
    assert rec.usage_error == problem
    assert (rec.completion_tokens, rec.tokens_approx, rec.prompt_tokens) == (3, True, 0)
    assert usage_problem(json.loads(value)) == (None if value == "1" else problem)


def test_usage_that_is_a_count_is_believed() -> None:
    for value, count in (("3", 3), ("7", 7), ("3.0", 3)):
        stream = _events(ROLE, TOK % "a", TOK % "b", TOK % "c", FINISH, _usage(value))
        rec = assert_same([(0.0, stream + _events("data: [DONE]"))]).record
        assert rec.usage_error is None and rec.completion_tokens == count
        assert not rec.tokens_approx


def test_an_event_over_the_cap_fails_in_any_reads() -> None:
    """One SSE event larger than 1 MB is no token stream: the stream fails once the event
    passes the cap, whether it came in small reads, one read, or within a block of events."""
    huge = b'data: {"pad":"' + b"x" * MAX_EVENT_BYTES + b'"}\n\n'
    head = _events(ROLE, TOK % "a")
    for blocks in (
        [head, *(huge[i : i + 4096] for i in range(0, len(huge), 4096))],  # small reads
        [head, huge[:-2], huge[-2:]],  # one big read, then its end
        [head + huge + _events(TOK % "b")],  # whole, amid ordinary events
        [head + _events(TOK % "b") * 8000 + huge],  # a big block, the huge event last
    ):
        p = _parse(blocks)
        assert p.failed and not p.done, [len(b) for b in blocks]
        assert p.record.error is not None
        assert p.record.error.startswith("SSE event larger than 1 MB: "), p.record.error


def test_events_up_to_the_cap_pass() -> None:
    """Nothing honest is refused: a block of ordinary events larger than the cap (a client
    that fell behind), and one event just under the cap split over many reads."""
    many = _events(*(TOK % i for i in range(30000)))
    assert len(many) > 2 * MAX_EVENT_BYTES
    p = _parse([_events(ROLE), many, _events("data: [DONE]")])
    assert p.done and p.events == 30000 and p.record.error is None
    text = "y" * (MAX_EVENT_BYTES - 100)
    big = _events(TOK % text)
    assert len(big) <= MAX_EVENT_BYTES
    p = _parse([_events(ROLE), *(big[i : i + 1000] for i in range(0, len(big), 1000))])
    assert p.events == 1 and p.record.error is None


@pytest.mark.parametrize("sep", ["\n", "\r\n"])
def test_a_long_event_in_many_reads_is_held_in_parts_not_rejoined(sep: str) -> None:
    """Linear, measured by memory rather than time: an event 0.9 MB long arriving in 4 KB
    reads is kept as its reads (joined once, at its end), so the parser never holds a second
    copy of it.  Re-joining the pending bytes on every read (the quadratic way) needs the old
    copy and the new one at once: twice the event."""
    text = "z" * (9 * MAX_EVENT_BYTES // 10)
    event = _events(TOK % text, sep=sep)
    reads = [event[i : i + 4096] for i in range(0, len(event), 4096)]
    rec = RequestRecord(index=0, worker=0, scheduled=0.0)
    p = StreamParser(rec, "chat")
    p.feed(0.0, _events(ROLE, sep=sep))
    tracemalloc.start()
    try:
        for i, b in enumerate(reads[:-1]):
            p.feed(float(i), b)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    p.feed(1.0, reads[-1])
    assert p.events == 1 and rec.error is None
    assert peak < 1.3 * len(event), (peak, len(event))
