"""Property tests for the streaming SSE parser (:mod:`pytest_kimi.load.sse`).

``test_sse.py`` checks the parser against a decode-everything reference on seeded streams.
These let Hypothesis build the streams: events of every kind the parser must tell apart (token
chunks with any unicode text, reasoning chunks in the vLLM / SGLang / DeepSeek shapes,
role-only and empty chunks, keep-alives, ``event:``/``id:`` lines, multi-line data, finish and
usage chunks, server errors, ``[DONE]``, junk after it), any JSON spacing, LF or CRLF, split
into read blocks at any bytes.  What each stream must give is computed from the generated
events themselves (not from a second parser), down to which read block brings which tokens.

The parser keeps no token text, only counts, so there is no text to compare.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_kimi.load.records import Api, RequestRecord
from pytest_kimi.load.sse import StreamParser
from pytest_kimi.load.sse_errors import error_event_message, malformed_message
from pytest_kimi.load.sse_usage import usage_below_events_message, usage_problem

# modest: the seeded loops of test_sse.py run long streams; a busy CI box may be slow to draw
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------------------------ events

_CHARS = st.characters(blacklist_categories=("Cs",))  # any unicode a server can encode
_TRICKY = (
    *('"', "\\", '\\"', '"content":"', '"content": "', '"content":""', '"text":"', "}"),
    *('"reasoning_content":"', '"finish_reason":"stop"', "data: [DONE]", "\n\n", "\r\n"),
    *("\r", "}\n\n", ": ping", "\U0001f680", " 世界", "é", "\u2028", "\u2029", "\x85"),
    *("\x00", "\ufeff", " ", "\t", "[DONE]"),
)
"""Text that looks like SSE framing or the byte patterns the parser counts."""
token_texts = st.one_of(
    st.text(_CHARS, min_size=1, max_size=6),
    st.lists(st.one_of(_CHARS, st.sampled_from(_TRICKY)), min_size=1, max_size=4).map("".join),
)
_COMMENT_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n")
# Any comment text, but not the JSON token shape: a comment (or id:/event: line) alone in its
# event that holds '"content":"' and ends with '}' is counted as a token by the fast path
# (test_token_shaped_non_data_line_is_not_a_token below).
comments = st.one_of(
    st.sampled_from([":", ": ping", ": keep-alive", ":ping"]),
    st.text(_COMMENT_CHARS, max_size=12).map(lambda t: ":" + t),
)


@dataclass(frozen=True)
class Ev:
    """One generated event and what it means."""

    lines: tuple[str, ...]
    """The event's lines, without line endings."""
    token: bool = False
    content: bool = False
    """A token event with answer text (a token event without it is a reasoning event)."""
    usage: dict[str, Any] | None = None
    finish: str | None = None
    done: bool = False
    error: str | None = None
    """The record's error when this event ends the stream."""


@dataclass(frozen=True)
class Json:
    """How a server writes its JSON: compact or spaced, escaped or raw non-ASCII, one line
    or several ``data:`` lines (pretty-printed; SSE joins them with newlines)."""

    spaced: bool
    ascii: bool
    multiline: bool = False
    prefix: str = "data: "

    def lines(self, obj: Any) -> tuple[str, ...]:
        if self.multiline:
            text = json.dumps(obj, indent=1, ensure_ascii=self.ascii)
            return tuple(self.prefix + line for line in text.split("\n"))
        seps = (", ", ": ") if self.spaced else (",", ":")
        return (self.prefix + json.dumps(obj, separators=seps, ensure_ascii=self.ascii),)


@st.composite
def json_styles(draw: st.DrawFn, base: Json) -> Json:
    """The stream's style, now and then another one for one event."""
    if draw(st.integers(0, 9)):
        return base
    return Json(
        spaced=draw(st.booleans()),
        ascii=draw(st.booleans()),
        multiline=draw(st.booleans()),
        prefix=draw(st.sampled_from(["data: ", "data:"])),
    )


completions = st.one_of(
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.integers(0, 5000),
    # what a broken server claims: no count the parser may believe (an integral float is one)
    st.integers(-5000, -1),
    st.floats(0, 5000, allow_nan=False, allow_infinity=False),
    st.integers(0, 5000).map(str),
    st.booleans(),
    st.none(),
)


def _count(value: Any) -> int | None:
    """The token count a ``completion_tokens`` value stands for, None when it is none."""
    if type(value) is float and value == int(value):
        value = int(value)
    return value if type(value) is int and value >= 0 else None


usages = st.builds(
    lambda prompt, completion, reasoning, where: {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + (_count(completion) or 0),
        **(
            {}
            if where == "none"
            else {  # SGLang 0.5.23: both places, details null when zero
                "reasoning_tokens": reasoning,
                "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
            }
            if where == "sglang"
            else {"completion_tokens_details": {"reasoning_tokens": reasoning}}
        ),
    },
    st.integers(0, 5000),
    completions,
    st.integers(0, 5000),
    st.sampled_from(["none", "sglang", "openai"]),
)

_EMPTY_DELTAS: list[dict[str, Any]] = [
    {},
    {"role": "assistant"},
    {"content": ""},
    {"content": None},
    {"role": "assistant", "content": ""},
    {"reasoning_content": None},
    {"reasoning_content": None, "role": "assistant", "content": ""},
    {"content": "", "reasoning_content": ""},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"content":"x"}'}}]},
]


@st.composite
def chunk_events(draw: st.DrawFn, api: Api, base: Json) -> Ev:
    """A ``data:`` chunk with choices: a token, an empty/role-only chunk or a finish chunk."""
    style = draw(json_styles(base))
    kind = draw(st.sampled_from(["token"] * 6 + ["empty", "finish"]))
    nulls = draw(st.integers(0, 3)) == 0  # SGLang: null fields and "usage":null everywhere
    choice: dict[str, Any] = {"index": 0}
    token = content = False
    usage = None
    finish = None
    if kind == "token" or (kind == "finish" and draw(st.booleans())):
        text = draw(token_texts)
        token = True
        if api == "completions":
            choice["text"] = text
            content = True
        else:
            field = draw(st.sampled_from(["content", "content", "reasoning_content", "reasoning"]))
            shape = draw(st.sampled_from(["plain", "role", "sglang", "deepseek", "both"]))
            delta: dict[str, Any] = {field: text}
            if shape == "role":
                delta = {"role": "assistant", field: text}
            elif shape == "sglang":  # 0.5.23's msgspec order: reasoning_content always there
                delta = {"reasoning_content": None, **delta}
                delta.setdefault("content", None)
            elif shape == "deepseek" and field != "content":
                delta = {"content": "", field: text}
            elif shape == "both":  # answer text beside reasoning: a content event
                delta = {"reasoning_content": draw(token_texts), "content": text}
                field = "content"
            content = field == "content"
            choice["delta"] = delta
    elif api == "completions":
        choice["text"] = ""
    else:
        choice["delta"] = dict(draw(st.sampled_from(_EMPTY_DELTAS)))
    choice["logprobs"] = None
    choice["finish_reason"] = None
    if kind == "finish":
        finish = draw(st.sampled_from(["stop", "length", "tool_calls", "abort"]))
        choice["finish_reason"] = finish
        if draw(st.booleans()):
            usage = draw(usages)
    if nulls:
        choice["matched_stop"] = None
    obj: dict[str, Any] = {
        "id": "chatcmpl-" + draw(st.text(_CHARS, max_size=3)),
        "object": "chat.completion.chunk" if api == "chat" else "text_completion",
        "model": "kimi",
        "choices": [choice],
    }
    if usage is not None or nulls:
        obj["usage"] = usage
    return Ev(style.lines(obj), token=token, content=content, usage=usage, finish=finish)


@st.composite
def other_events(draw: st.DrawFn, api: Api, base: Json) -> Ev:
    """Everything else a stream holds before its end: keep-alives, usage-only chunks, field
    lines without data, a token chunk behind ``event:``/``id:``/``retry:`` lines."""
    kind = draw(st.sampled_from(["comment", "usage", "fields", "fields+token"]))
    if kind == "comment":
        return Ev((draw(comments),))
    if kind == "usage":
        usage = draw(usages)
        obj = {"id": "x", "choices": [], "usage": usage}
        return Ev(draw(json_styles(base)).lines(obj), usage=usage)
    fields = tuple(
        draw(
            st.lists(
                st.sampled_from(["event: message", "event:delta", "id: 7", "id:", "retry: 3000"]),
                min_size=1,
                max_size=3,
            )
        )
    )
    if kind == "fields":
        return Ev(fields)
    ev = draw(chunk_events(api, base))
    return Ev(fields + ev.lines, ev.token, ev.content, ev.usage, ev.finish)


def done_event(compact: bool) -> Ev:
    return Ev(("data:[DONE]" if compact else "data: [DONE]",), done=True)


@st.composite
def error_events(draw: st.DrawFn) -> Ev:
    """An event that ends the stream with an error on the record."""
    kind = draw(st.sampled_from(["sglang", "vllm", "not json", "not an object", "junk"]))
    msg = draw(token_texts)
    if kind == "sglang":
        obj: dict[str, Any] = {"error": {"message": msg, "code": draw(st.integers(400, 599))}}
        return Ev(("data: " + json.dumps(obj),), error=error_event_message(obj))
    if kind == "vllm":
        obj = {"object": "error", "message": msg, "type": "BadRequestError", "code": 400}
        return Ev(("data: " + json.dumps(obj),), error=error_event_message(obj))
    if kind == "not json":
        return Ev(("data: {not json",), error=malformed_message(b"{not json"))
    if kind == "not an object":
        return Ev(("data: [1, 2]",), error=malformed_message(b"[1, 2]"))
    line = "<html><body>502 Bad Gateway</body></html>"
    return Ev((line,), error=malformed_message(line.encode()))


# ------------------------------------------------------------------------------------ streams


@dataclass(frozen=True)
class Stream:
    api: Api
    data: bytes
    events: tuple[tuple[Ev, int], ...]
    """Every event with the offset just past its blank line (where the parser can see it
    whole); the last one may be a ``[DONE]`` without a blank line."""
    done_payload_end: int | None
    """Offset just past the first ``data: [DONE]`` payload, if the stream has one."""
    end: int
    """Length of the stream up to and including the ``[DONE]`` event (junk after excluded)."""


@st.composite
def streams(
    draw: st.DrawFn, *, errors: bool = False, done: bool | None = None, junk: bool | None = None
) -> Stream:
    """A response body: events, maybe an error, maybe ``[DONE]`` and junk after it
    (``None``: drawn; ``junk`` only ever comes after a ``[DONE]``)."""
    api: Api = draw(st.sampled_from(["chat", "chat", "completions"]))
    base = Json(
        spaced=draw(st.booleans()),
        ascii=draw(st.booleans()),
        prefix=draw(st.sampled_from(["data: ", "data:"])),
    )
    kinds = st.sampled_from([chunk_events, chunk_events, other_events])
    events_ = [draw(draw(kinds)(api, base)) for _ in range(draw(st.integers(0, 14)))]
    if errors and draw(st.integers(0, 5)) == 0:
        events_.insert(draw(st.integers(0, len(events_))), draw(error_events()))
    has_done = draw(st.booleans()) if done is None else done
    if has_done:
        events_.append(done_event(draw(st.booleans())))
    junk = has_done and (draw(st.booleans()) if junk is None else junk)
    endings = draw(st.sampled_from(["\n", "\r\n", "mixed"]))
    out = bytearray()
    placed: list[tuple[Ev, int]] = []
    done_payload_end = None
    for i, ev in enumerate(events_):
        nl = endings if endings != "mixed" else draw(st.sampled_from(["\n", "\r\n"]))
        body = nl.join(ev.lines).encode()
        if ev.done and done_payload_end is None:
            done_payload_end = len(out) + len(body)
        if ev.done and not junk and i == len(events_) - 1:
            # a final [DONE] may come without its blank line (or any line end)
            out += body + (nl * draw(st.sampled_from([0, 1, 2]))).encode()
        else:
            out += body + (nl * 2).encode()
        placed.append((ev, len(out)))
        if draw(st.integers(0, 9)) == 0 and i < len(events_) - 1:
            out += nl.encode()  # a stray blank line between events
    end = len(out)
    if junk:
        after = [draw(st.one_of(chunk_events(api, base), error_events())) for _ in range(3)]
        for ev in after:
            out += ("\n".join(ev.lines) + "\n\n").encode()
        out += draw(st.binary(max_size=20))
    return Stream(api, bytes(out), tuple(placed), done_payload_end, end)


@st.composite
def split_points(draw: st.DrawFn, n: int) -> list[int]:
    """Where the reads end: a few points anywhere, or every k bytes (1: byte by byte);
    a repeated point makes an empty read."""
    if draw(st.integers(0, 3)) == 0:
        k = draw(st.integers(1, 64))
        return list(range(k, n, k))
    return sorted(draw(st.lists(st.integers(0, n), max_size=12)))


def blocks_of(data: bytes, points: list[int]) -> list[tuple[float, bytes]]:
    """``data`` cut at ``points`` (clipped to it); block ``i`` arrives at time ``i``."""
    pts = [0, *(min(p, len(data)) for p in points), len(data)]
    return [(float(i), data[a:b]) for i, (a, b) in enumerate(zip(pts, pts[1:]))]


@st.composite
def split_streams(draw: st.DrawFn, **kw: Any) -> tuple[Stream, list[int]]:
    stream = draw(streams(**kw))
    return stream, draw(split_points(len(stream.data)))


# ----------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Result:
    """Everything the parser reports about a stream."""

    chunk_times: tuple[float, ...]
    chunk_events: tuple[int, ...]
    first_token: float | None
    first_content: float | None
    events: int
    reasoning_events: int
    completion_tokens: int
    prompt_tokens: int
    tokens_approx: bool
    reasoning_tokens: int
    finish_reason: str | None
    error: str | None
    done: bool
    failed: bool
    usage_error: str | None

    def totals(self) -> Result:
        """The same without what depends on how the bytes were split into reads."""
        return Result((), (), None, None, *(getattr(self, k) for k in _TOTALS))


_TOTALS = tuple(Result.__dataclass_fields__)[4:]


class DecodeEverything(StreamParser):
    """The slow path alone: every event through ``json.loads`` (the mode the parser falls
    back to for streams with several choices per event)."""

    __slots__ = ()

    def __init__(self, record: RequestRecord, api: Api = "chat") -> None:
        super().__init__(record, api)
        self._multi = True


class NoCounting(StreamParser):
    """No byte counting, but the range cutting and halving of the slow path."""

    __slots__ = ()

    def _count_fast(self, buf: bytes, start: int, end: int) -> int | None:
        return None


def parse(
    api: Api, blocks: list[tuple[float, bytes]], cls: type[StreamParser] = StreamParser
) -> tuple[Result, StreamParser]:
    rec = RequestRecord(index=0, worker=0, scheduled=0.0)
    p = cls(rec, api)
    for t, data in blocks:
        p.feed(t, data)
    p.close()
    result = Result(
        tuple(rec.chunk_times),
        tuple(rec.chunk_events),
        rec.first_token,
        rec.first_content,
        p.events,
        p.reasoning_events,
        rec.completion_tokens,
        rec.prompt_tokens,
        rec.tokens_approx,
        rec.reasoning_tokens,
        rec.finish_reason,
        rec.error,
        p.done,
        p.failed,
        rec.usage_error,
    )
    return result, p


def expected(stream: Stream, blocks: list[tuple[float, bytes]], limit: int | None = None) -> Result:
    """What the parser must report, from the generated events: ``blocks`` are the reads of
    ``stream.data[:limit]``."""
    limit = len(stream.data) if limit is None else limit
    starts = []
    pos = 0
    for _, data in blocks:
        starts.append(pos)
        pos += len(data)
    assert pos == limit
    per_block: dict[int, int] = {}
    first_content = None
    usage: dict[str, Any] | None = None
    finish = error = None
    events = reasoning = 0
    done = ended = False
    for ev, end in stream.events:
        if end > limit:  # not seen whole
            break
        if ev.done or ev.error is not None:
            done, error, ended = ev.done, ev.error, True
            break
        if ev.usage is not None and ev.usage["completion_tokens"] is not None:
            usage = ev.usage  # the last one is the server's word, believed or not
        finish = ev.finish if ev.finish is not None else finish
        if ev.token:
            block = bisect_right(starts, end - 1) - 1  # the read that completes the event
            per_block[block] = per_block.get(block, 0) + 1
            events += 1
            if not ev.content:
                reasoning += 1
            elif first_content is None:
                first_content = block
    if not ended and stream.done_payload_end is not None and stream.done_payload_end <= limit:
        done = True  # a final "data: [DONE]" needs no blank line
    told = 0
    usage_error = None
    if usage is not None:
        count = _count(usage["completion_tokens"])
        if count is None:
            usage_error = usage_problem(usage["completion_tokens"])
        elif count < events:
            usage_error = usage_below_events_message(count, events)
        if usage_error is not None:
            usage = None
    if usage is not None:
        completion, prompt = _count(usage["completion_tokens"]) or 0, usage["prompt_tokens"]
        details = usage.get("completion_tokens_details")
        told = details["reasoning_tokens"] if details else usage.get("reasoning_tokens", 0)
    else:
        completion, prompt = events, 0
    reasoning_tokens = 0
    if reasoning:
        per_event = completion / events if completion else 1.0
        reasoning_tokens = told if told > 0 else round(reasoning * per_event)
        if completion:
            reasoning_tokens = min(reasoning_tokens, completion)
        reasoning_tokens = max(reasoning_tokens, 1)
    times = tuple(float(b) for b in sorted(per_block))
    return Result(
        chunk_times=times,
        chunk_events=tuple(per_block[b] for b in sorted(per_block)),
        first_token=times[0] if times else None,
        first_content=None if first_content is None else float(first_content),
        events=events,
        reasoning_events=reasoning,
        completion_tokens=completion,
        prompt_tokens=prompt,
        tokens_approx=usage is None,
        reasoning_tokens=reasoning_tokens,
        finish_reason=finish,
        error=error,
        done=done,
        failed=error is not None,
        usage_error=usage_error,
    )


# ------------------------------------------------------------------------------------- tests


@SETTINGS
@given(split_streams(errors=True))
def test_any_split_gives_what_the_events_say(case: tuple[Stream, list[int]]) -> None:
    """(a) However the bytes are split into reads, the counts, usage, finish reason, error and
    done flag are those of the whole stream read at once, and those the events say; each
    token is counted in the read that completes its event."""
    stream, points = case
    blocks = blocks_of(stream.data, points)
    whole = [(0.0, stream.data)]
    got, _ = parse(stream.api, blocks)
    at_once, _ = parse(stream.api, whole)
    assert got == expected(stream, blocks)
    assert at_once == expected(stream, whole)
    assert got.totals() == at_once.totals()


@SETTINGS
@given(split_streams(errors=True, done=True, junk=True))
def test_nothing_after_done_counts(case: tuple[Stream, list[int]]) -> None:
    """(b) Tokens, usage, finish reasons, errors and garbage after ``[DONE]`` change nothing:
    the record is the one of the stream cut right after ``[DONE]``, read the same way."""
    stream, points = case
    assert len(stream.data) > stream.end
    got, p = parse(stream.api, blocks_of(stream.data, points))
    clean, _ = parse(stream.api, blocks_of(stream.data[: stream.end], points))
    assert got == clean
    assert p.done or p.failed  # failed: an error event came before the [DONE]


@SETTINGS
@given(split_streams(done=True), st.data())
def test_a_stream_cut_before_done_is_never_done(
    case: tuple[Stream, list[int]], data: st.DataObject
) -> None:
    """(c) A connection that drops anywhere before ``data: [DONE]`` is whole is never taken
    for a finished stream (nor for a failed one), and what arrived is counted; once the
    ``[DONE]`` payload is there, with or without its blank line, the stream is done."""
    stream, points = case
    assert stream.done_payload_end is not None
    cut = data.draw(st.integers(0, stream.done_payload_end - 1), label="cut")
    blocks = blocks_of(stream.data[:cut], points)
    got, _ = parse(stream.api, blocks)
    assert not got.done and not got.failed
    assert got == expected(stream, blocks, limit=cut)
    cut = data.draw(st.integers(stream.done_payload_end, len(stream.data)), label="cut after")
    blocks = blocks_of(stream.data[:cut], points)
    got, _ = parse(stream.api, blocks)
    assert got.done
    assert got == expected(stream, blocks, limit=cut)


@SETTINGS
@given(split_streams(errors=True))
def test_fast_and_slow_paths_agree(case: tuple[Stream, list[int]]) -> None:
    """(d) Byte counting, range halving without counting, and decoding every event give the
    same record, read for read."""
    stream, points = case
    blocks = blocks_of(stream.data, points)
    fast, _ = parse(stream.api, blocks)
    halving, q = parse(stream.api, blocks, NoCounting)
    decoding, r = parse(stream.api, blocks, DecodeEverything)
    assert fast == halving == decoding
    assert q.fast_ranges == r.fast_ranges == 0


@SETTINGS
@given(
    st.sampled_from(["content", "reasoning_content", "reasoning", "text"]),
    st.lists(token_texts, min_size=1, max_size=30),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["\n", "\r\n"]),
    st.data(),
)
def test_plain_token_chunks_are_only_counted(
    field: str, texts: list[str], spaced: bool, ascii: bool, nl: str, data: st.DataObject
) -> None:
    """(d, continued) The fast path does run: after the role chunk, a run of ordinary token
    chunks needs no ``json.loads`` at all, whatever the text and however it is split."""
    api: Api = "completions" if field == "text" else "chat"
    style = Json(spaced=spaced, ascii=ascii)
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    events = [style.lines(role)[0]]
    for text in texts:
        choice = {"index": 0, "text": text} if api == "completions" else {"delta": {field: text}}
        events.append(style.lines({"choices": [{**choice, "finish_reason": None}]})[0])
    stream = "".join(e + nl + nl for e in events).encode()
    blocks = blocks_of(stream, data.draw(split_points(len(stream))))
    got, p = parse(api, blocks)
    assert p.decoded == 1 and p.fast_ranges >= 1
    assert got.events == len(texts)
    assert got.reasoning_events == (len(texts) if field.startswith("reasoning") else 0)


@pytest.mark.parametrize("line", [': {"content":"x"}', 'id: {"content":"x"}', 'x: {"text":"x"}'])
def test_token_shaped_non_data_line_is_not_a_token(line: str) -> None:
    """Found by reading the fast path's invariant (each event one line ending in '}' and one
    token pattern): it checked that a range opens with 'data:', not that every event does.
    Generated comments hardly ever take that exact shape (2000 streams with token-shaped
    comment text did not find it), so it is pinned here as an example; fixed by counting
    ``\n\ndata:`` (every event after the first starts a data line)."""
    api: Api = "completions" if '"text"' in line else "chat"
    tok = '{"choices":[{"index":0,"delta":{"content":"a"},"text":"a","finish_reason":null}]}'
    stream = f"data: {tok}\n\ndata: {tok}\n\n{line}\n\ndata: {tok}\n\n".encode()
    slow, _ = parse(api, [(0.0, stream)], DecodeEverything)
    fast, _ = parse(api, [(0.0, stream)])
    assert fast == slow
