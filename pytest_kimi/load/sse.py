"""Buffered parser for OpenAI-style SSE token streams (the client's hot path).

Why this exists instead of "split lines, ``json.loads`` every chunk": at the token rates a
batched server streams (hundreds of thousands of tok/s across all requests), decoding every
~250-byte chunk costs more CPU than everything else the client does, and a client that runs
out of CPU reports *its own* limit as the server's.  So the parser works per read block, not
per event:

* Complete events of a block are classified with a handful of ``bytes.count``/``find`` scans
  (C loops over the whole block).  This is sound because in valid JSON a literal ``"`` inside
  a string value is always escaped and a raw newline never occurs, so byte patterns such as
  ``"content":"`` or ``\\n`` can only come from the JSON structure / SSE framing, never from
  token text.
* Only events the counts cannot vouch for (finish chunk, usage, ``[DONE]``, errors,
  keep-alives, garbage...) are decoded with ``json.loads``: a range that fails the counts is
  cut before its finish chunk or halved, and the parts retried, down to a few hundred bytes.
  The first event of a stream (the role chunk, as a rule) is always decoded.  A plain stream
  costs two or three ``json.loads`` in all, however it is split into reads.
* Per block the parser appends one timestamp and one count to the record, and one more int:
  the running usage the block ends with when the stream carries it (decided once, at its
  first token read: one ``rfind`` of ``"completion_tokens":``, after which the key is looked
  for where it was in the block before, an O(1) test, and its digits parsed with one
  ``find`` and ``int``), else the bytes of its complete events.  Everything else (token
  totals, usage fallback) is settled once in :meth:`StreamParser.close`, and where each
  read's tokens fall after the trial (:meth:`RequestRecord.read_positions`).

Event semantics (shared with the JSON-decoding reference used in the tests):

* A token event is a ``data:`` event whose first-level ``choices[*]`` carry a non-empty
  string ``delta.content`` / ``delta.reasoning_content`` / ``delta.reasoning`` (chat) or
  ``text`` (completions).  Role-only or empty-content chunks are not tokens.
* A token event is a *reasoning* event when no choice carries a non-empty ``content`` (it has
  only reasoning text); otherwise it is a *content* event.  SGLang with a reasoning parser
  never puts both in one chunk: per decode step it yields a ``reasoning_content`` chunk, then
  a separate ``content`` chunk (``_generate_stream_content`` in SGLang 0.5.23's
  ``sglang/srt/entrypoints/openai/serving_chat.py``; chunks built by ``build_sse_content`` in
  ``sse_utils.py``, whose delta always carries ``"reasoning_content"``, ``null`` on content
  chunks).  Reasoning events are counted by the same byte patterns as tokens (the fast path
  already tells the fields apart), so they cost nothing extra on the hot path; the block
  that brings the first content event stamps ``first_content`` once.
* ``usage`` may count reasoning tokens: SGLang 0.5.23 sends ``usage.reasoning_tokens`` and,
  when non-zero, ``usage.completion_tokens_details.reasoning_tokens`` (OpenAI's place;
  ``UsageInfo`` in ``protocol.py``, filled by ``usage_processor.py``).  That count is used
  when the stream had reasoning events; otherwise the events are scaled like all tokens.
* ``data: [DONE]`` ends the stream; an error event (``{"error": ...}`` or
  ``{"object": "error", ...}``), or a ``data:`` payload that is not a JSON object, ends it with
  an error on the record.  Nothing after the end is looked at.
* ``usage`` (last one wins) and ``finish_reason`` (last non-null wins) are taken from decoded
  events.  Usage riding on an ordinary token chunk *without* a finish_reason (SGLang's and
  vLLM's ``continuous_usage_stats``) is not decoded: its ``completion_tokens`` is read off
  the block's bytes as the read's position (``RequestRecord.chunk_usage``); the final usage is
  always in the finish chunk or the trailing ``choices: []`` chunk, which are decoded.
* Events must be separated by a blank line (``\\n\\n`` or ``\\r\\n\\r\\n``); an incomplete event
  at EOF is discarded (per the SSE spec) except a bare ``data: [DONE]``.
* Bounds (what the parser refuses, each an error on the record that ends the stream at once):
  more token events than the request's ``max_tokens`` (a server that ignores the limit would,
  with ``ignore_eos``, stream forever; events never outnumber tokens), a ``usage`` above it, and
  an event larger than :data:`MAX_EVENT_BYTES`.  The pending tail of an event split over reads
  is kept as a list of parts and joined only when a read can complete it, so a huge line costs
  linear time.  A ``usage.completion_tokens`` that is no count (negative, fractional, a string,
  a bool) or below the token events streamed is not believed: the record counts its events and
  says why in ``usage_error`` (the trial is invalid, :mod:`pytest_kimi.measure.metrics`).  So is
  a running usage that falls from one read to a later one, which the trial checks once the
  stream is over (:func:`pytest_kimi.measure.usage_checks.running_usage_fall`), never per read.
* Events carrying several choices (``n > 1`` packed into one chunk) would break the counting;
  they are detected on the first event (always decoded) or any later decoded one, and the
  stream is decoded event by event from then on.  (vLLM/OpenAI send one choice per chunk even
  with ``n > 1``; that is counted normally.)

Beside the parser: its byte patterns (:mod:`pytest_kimi.load.sse_patterns`), its error
texts (:mod:`pytest_kimi.load.sse_errors`), and the token counts off the hot path
(:mod:`pytest_kimi.load.sse_usage`).
"""

from __future__ import annotations

import json
import re

from pytest_kimi.load.records import UNKNOWN_USAGE, Api, RequestRecord
from pytest_kimi.load.sse_errors import (
    error_event_message,
    is_error_object,
    malformed_message,
    past_max_tokens_message,
)
from pytest_kimi.load.sse_patterns import (
    _CHAT_FIELDS,
    _COMPLETION_FIELDS,
    _STYLES,
    _finish_envelope_extra,
)
from pytest_kimi.load.sse_usage import (
    reasoning_tokens,
    usage_below_events_message,
    usage_problem,
    usage_reasoning_tokens,
)

try:  # numpy (a scipy dependency) counts newlines ~4x faster than bytes.count on big ranges
    from numpy import count_nonzero as _np_count_nonzero
    from numpy import frombuffer as _np_frombuffer
    from numpy import uint8 as _np_uint8
except ImportError:  # pragma: no cover - pure-Python fallback
    _np_frombuffer = None  # type: ignore[assignment]

_KNOWN_FIELDS = (b"data", b"event", b"id", b"retry")
_DECODE_BELOW = 768
"""Ranges of unclassifiable events smaller than this are decoded whole instead of halved."""
_NUMPY_ABOVE = 4096
"""Ranges at least this long count newlines with numpy (its per-call overhead is ~3 us)."""
MAX_EVENT_BYTES = 2**20
"""The largest SSE event the parser takes (1 MB).  A token chunk is a few hundred bytes, a
finish or usage chunk under a kilobyte, so an event this large is no token stream (a file
served by mistake, a hostile server); without a cap one line without an end holds memory
without bound.  Larger than any event a real server sends by three orders of magnitude."""
_NO_LIMIT = 1 << 62
"""The token-event limit of a request whose ``max_tokens`` is not known."""
_USAGE_KEY = b'"completion_tokens":'
"""In valid JSON a ``"`` inside a string is escaped, so this can only be the usage's key
(``"completion_tokens_details":`` does not match it)."""
_USAGE_KEY_LEN = len(_USAGE_KEY)
_LOOK_BACK = 8192
"""How far back from a stream's first token read's end the parser looks for running usage: a
token chunk with its usage is a few hundred bytes."""
_SAMPLE_BYTES = 4096
"""The head of the second token read kept to calibrate a stream's event envelope: one
ordinary event (a few hundred bytes) or more, not a whole block a late client read."""
_USAGE_VALUE = re.compile(rb"[ \t]*(\d{1,9})(?![\d.eE])")
"""A count, at most 9 digits (it fits ``array('I')``); anything else (``null``, a fraction,
a string) is no count, and the read gets :data:`UNKNOWN_USAGE`: its stream's positions are
then apportioned instead (:meth:`RequestRecord.read_positions`)."""


def event_too_large_message(size: int) -> str:
    return (
        f"SSE event larger than {MAX_EVENT_BYTES // 2**20} MB: {size:,} bytes arrived without "
        "the blank line that ends an event (a token chunk is a few hundred bytes), so this is "
        "no token stream: check what answers at --endpoint (a proxy, a file server, another "
        "service)"
    )


class StreamParser:
    """Incremental parser feeding one :class:`RequestRecord`.

    Call :meth:`feed` with every read block and its arrival time, then :meth:`close` once at
    the end of the stream.  ``done`` / ``failed`` tell the reader it can stop reading.
    """

    __slots__ = (
        "record",
        "api",
        "done",
        "failed",
        "events",
        "usage_seen",
        "fast_ranges",
        "decoded",
        "reasoning_events",
        "_usage_reasoning",
        "_await_content",
        "_fields",
        "_styles",
        "_pat",
        "_pending",
        "_parts",
        "_pending_size",
        "_limit",
        "_crlf",
        "_first",
        "_multi",
        "_times",
        "_times_append",
        "_counts_append",
        "_keep",
        "_running",
        "_back",
        "_term",
        "_usage_append",
        "_bytes_append",
        "_skip",
        "_sample_due",
    )

    def __init__(self, record: RequestRecord, api: Api = "chat", max_tokens: int = 0) -> None:
        """``max_tokens``: the request's (0: unknown); more token events than that end the
        stream with an error."""
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', not {api!r}")
        self.record = record
        self.api = api
        self.done = False
        """``data: [DONE]`` seen."""
        self.failed = False
        """An error event or malformed data ended the stream (``record.error`` says why)."""
        self.events = 0
        """Token events so far."""
        self.usage_seen = False
        self.fast_ranges = 0
        """Ranges of events classified by byte counting alone (for profiling / tests)."""
        self.decoded = 0
        """Events that needed ``json.loads``."""
        self.reasoning_events = 0
        """Token events that carried only reasoning text (a subset of ``events``)."""
        self._usage_reasoning = 0
        self._await_content = True
        self._fields = _CHAT_FIELDS if api == "chat" else _COMPLETION_FIELDS
        self._styles = _STYLES[api]
        self._pat = self._styles[0]
        self._pending = b""
        """The incomplete event at the end of the reads so far (its first part while
        ``_parts`` holds it)."""
        self._parts: list[bytes] | None = None
        """An incomplete event that took more than two reads, in the parts it came in: joined
        only when a read can end it, so that a huge event costs linear time, not quadratic."""
        self._pending_size = 0
        """Bytes in ``_parts``."""
        self._limit = max_tokens if max_tokens > 0 else _NO_LIMIT
        self._crlf = False
        self._first = True
        self._multi = False
        self._times = record.chunk_times
        self._times_append = record.chunk_times.append
        self._counts_append = record.chunk_events.append
        """Bound once: the hot path appends to the record's arrays without looking them up."""
        self._keep = record.blocks
        """The record's list of raw blocks when a conversation needs the answer; else None."""
        self._running = False
        """The stream carries running usage (``continuous_usage_stats``): decided once, at
        the first token read, and each token read's count is then taken from it."""
        self._back = 0
        """Where the last running usage key was, counted back from the read's end."""
        self._term = b","
        """What follows the count: SGLang and vLLM put ``prompt_tokens_details`` after it; a
        server whose usage ends with it has ``}`` (learnt by :meth:`_usage_slow`)."""
        self._usage_append = record.chunk_usage.append
        self._bytes_append = record.chunk_bytes.append
        self._skip = 0
        """Bytes of the events the slow path found to carry no token in the current read:
        left out of its :attr:`RequestRecord.chunk_bytes`."""
        self._sample_due = False

    @property
    def finished(self) -> bool:
        """Nothing more will be taken from the stream."""
        return self.done or self.failed

    # ------------------------------------------------------------------ hot path
    def feed(self, t: float, data: bytes) -> None:
        """Take one read block that arrived at ``t`` (``time.perf_counter()``)."""
        if self.done or self.failed:
            return
        if self._keep is not None:
            self._keep.append(data)  # a reference; the answer is read once the stream ends
        pending = self._pending
        if not pending:
            buf = data
        elif self._parts is None:
            buf = pending + data  # the usual case: an event split over two reads
        elif b"\n\n" in data or self._completes(data):
            parts = self._parts
            parts.append(data)
            buf = b"".join(parts)
            self._parts = None
        else:
            self._hold(data)  # linear: the parts are joined once, when the event can end
            return
        if self._crlf or b"\r" in data:
            # Normalise CRLF once per block; a trailing lone "\r" stays in the pending tail
            # and pairs with the "\n" of the next read.
            self._crlf = True
            buf = buf.replace(b"\r\n", b"\n")
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._pending = buf
            if pending:  # a second read without the event's end: hold parts from now on
                self._parts = [buf]
                self._pending_size = len(buf)
                if len(buf) > MAX_EVENT_BYTES:
                    self._too_large(len(buf))
            return
        end = cut + 2
        self._pending = buf[end:]
        if len(buf) > MAX_EVENT_BYTES and not self._events_fit(buf, end):
            return  # one length test per block; the scan only for blocks over the cap
        start = 0
        n = 0
        if self._first:
            # The first event is almost always the role chunk ("content":"" plus role): one
            # json.loads for it is cheaper than the extra scans it would force on a whole
            # (possibly large) first block, and it settles the JSON style early.
            self._first = False
            start = buf.find(b"\n\n", 0, end) + 2
            n = self._decode_events(buf, 0, start)
            if self.done or self.failed:
                start = end
        if start < end:
            k = self._count_fast(buf, start, end)
            if k is None:
                k = self._split(buf, start, end)
            else:
                self.fast_ranges += 1
            n += k
        if n:
            rec = self.record
            if not self._times:
                rec.first_token = t
                # decided once: a stream without running usage never pays for looking again
                # (in the last events only: a client that fell behind reads megabytes)
                self._running = buf.rfind(_USAGE_KEY, max(end - _LOOK_BACK, 0), end) >= 0
                self._sample_due = not self._running
            rec.last_read = buf
            self._times_append(t)
            self._counts_append(n)
            if self._running:
                # the usage so far rides at the end of each chunk, as far from the read's end
                # as in the read before (until its digits grow): one O(1) test finds it there,
                # else one reverse scan; a short parse reads it (no json.loads)
                i = end - self._back
                if i < 0 or not buf.startswith(_USAGE_KEY, i):
                    i = buf.rfind(_USAGE_KEY, 0, end)
                    self._back = end - i if i >= 0 else end + 1
                if i < 0:  # this read carries no usage (never parse bytes that are not it)
                    self._usage_append(UNKNOWN_USAGE)
                else:
                    j = i + _USAGE_KEY_LEN
                    try:  # zero-cost unless it raises: a sign, a fraction, null, 2**32 or more
                        self._usage_append(int(buf[j : buf.find(self._term, j, j + 12)]))
                    except (ValueError, OverflowError):
                        self._usage_append(self._usage_slow(buf, j))
            else:
                self._bytes_append(end - self._skip)
                if self._sample_due and len(self._times) > 1:
                    # one event of an ordinary read, whose envelope calibrates the bytes of
                    # all (RequestRecord.read_positions); a copy of one read, once a stream
                    self._sample_due = False
                    rec.sample_read = buf[: min(end, _SAMPLE_BYTES)]
            self.events += n
            if self.events > self._limit:
                self._fail(past_max_tokens_message(self.events, self._limit))
            if self._await_content and self.events > self.reasoning_events:
                self._await_content = False  # one bool test per block from here on
                rec.first_content = t
        if self._skip:
            self._skip = 0

    def _usage_slow(self, buf: bytes, j: int) -> int:
        """The count at ``buf[j:]`` when the quick parse failed: the regex decides, and a
        count followed by something else than the expected byte teaches the parser that byte
        (vLLM without details: ``}``), so the next reads take the quick parse again."""
        m = _USAGE_VALUE.match(buf, j)
        if m is None:
            return UNKNOWN_USAGE
        nxt = buf[m.end() : m.end() + 1]
        if nxt in (b",", b"}"):
            self._term = nxt
        return int(m[1])

    # ---------------------------------------------------------------- bounds
    def _completes(self, data: bytes) -> bool:
        """Whether ``data`` can hold the end of the event held in parts (a blank line), given
        that the parts hold none and ``data`` holds no ``\\n\\n``: in CRLF form, or split
        between the parts' tail and its first bytes.  A false "yes" costs one join; a "no"
        must be right."""
        if not self._crlf and b"\r" in data:
            self._crlf = True  # a held part may be the only one with a "\r" in it
        if self._crlf and b"\n\r\n" in data:
            return True
        head = data[:3]
        if b"\n" not in head:
            return False  # a split boundary ends with a "\n" among data's first 3 bytes
        assert self._parts is not None
        tail = b"".join(self._parts[-3:])[-3:]  # a boundary is at most 4 bytes
        return b"\n\n" in (tail + head).replace(b"\r\n", b"\n")

    def _hold(self, part: bytes) -> None:
        """Add ``part`` to the event held in parts; fail past the size cap."""
        assert self._parts is not None
        self._parts.append(part)
        self._pending_size += len(part)
        if self._pending_size > MAX_EVENT_BYTES:
            self._too_large(self._pending_size)

    def _too_large(self, size: int) -> None:
        self._pending = b""
        self._parts = None
        self._fail(event_too_large_message(size))

    def _events_fit(self, buf: bytes, end: int) -> bool:
        """Every event of ``buf[:end]``, and the incomplete one after it, is at most
        :data:`MAX_EVENT_BYTES` (else fail).

        Only asked for blocks larger than the cap (a client that fell behind reads them):
        each step finds the last boundary within a cap's reach, so a block costs about
        ``end / MAX_EVENT_BYTES`` short reverse scans.
        """
        if len(buf) - end > MAX_EVENT_BYTES:
            self._too_large(len(buf) - end)
            return False
        p = 0
        while p < end:
            q = buf.rfind(b"\n\n", p, min(p + MAX_EVENT_BYTES, end))
            if q < 0:
                nxt = buf.find(b"\n\n", p, end)
                self._fail(event_too_large_message((nxt if nxt >= 0 else end) + 2 - p))
                return False
            p = q + 2
        return True

    def _process(self, buf: bytes, start: int, end: int) -> int:
        """Token events in the complete events ``buf[start:end]``."""
        n = self._count_fast(buf, start, end)
        if n is not None:
            self.fast_ranges += 1
            return n
        return self._split(buf, start, end)

    def _split(self, buf: bytes, start: int, end: int) -> int:
        """Token events of a range the byte counts could not classify.

        The range is halved at an event boundary and each half retried, so that one unusual
        event (the finish chunk at the end of a 1 MB block read by a client that fell behind)
        costs a few extra scans plus one small decode, not a ``json.loads`` of every event.
        """
        if end - start > _DECODE_BELOW and not self._multi:
            # The usual culprit is the finish chunk near the end of the stream: cut right
            # before it (one scan of the ordinary part) instead of halving (two scans).
            f = buf.find(self._pat.finish, start, end)
            k = buf.rfind(b"\n\n", start, f) if f >= 0 else -1
            if k >= start:
                cut = k + 2
                left = self._process(buf, start, cut)
                if self.done or self.failed:
                    return left
                return left + self._split(buf, cut, end)
            mid = buf.rfind(b"\n\n", start, (start + end) >> 1)
            if mid >= start:
                left = self._process(buf, start, mid + 2)
                if self.done or self.failed:
                    return left
                return left + self._process(buf, mid + 2, end)
        return self._decode_events(buf, start, end)

    def _count_fast(self, buf: bytes, start: int, end: int) -> int | None:
        """Token events in ``buf[:end]`` if byte counts prove every event is a plain token
        chunk (or a harmless empty one); ``None`` when the events must be decoded.

        Invariant used: each ordinary event is exactly ``data: {...}\\n\\n`` (two newlines), so
        ``newlines == 2 * events``; any other event (comment, ``[DONE]``, usage-only, error,
        garbage, multi-line) breaks ``pattern count == events`` and goes to the slow path.
        """
        if (
            self._multi
            or buf.endswith(b"[DONE]\n\n", start, end)
            or not buf.startswith(b"data:", start)
        ):
            return None  # O(1) guards: the stream's end, and ranges that open with a non-data line
        p = self._pat
        if buf.find(b"\n", start, end) == end - 2:
            # one single-line event, the read of a client on time: its one newline pair is
            # the range's end, so the counts below reduce to one byte test
            if buf[end - 3] != 0x7D:
                return None  # it does not end as a JSON object does (truncated, garbage)
            events = 1
        else:
            if end - start >= _NUMPY_ABOVE and _np_frombuffer is not None:
                events = int(
                    _np_count_nonzero(_np_frombuffer(buf, _np_uint8, end - start, start) == 10)
                )
            else:
                events = buf.count(b"\n", start, end)
            if events & 1 or buf[end - 3] != 0x7D:
                return None  # the last event does not end as a JSON object does (garbage)
            events >>= 1
            # every boundary is "}\n\ndata:": with the last event's "}\n\n" that is all the
            # newlines, so every event is one line, a JSON object's end and a data field (an
            # event that is a comment, id:, event: or truncated breaks the count)
            if buf.count(b"}\n\ndata:", start, end) != events - 1:
                return None
        c = buf.count(p.first, start, end)
        if c == events and events:
            if buf.find(p.finish, start, end) >= 0:
                return None
            if buf.find(p.first_empty, start, end) < 0:
                return events
        elif not events:
            return None
        elif buf.find(p.finish, start, end) >= 0:
            return None
        # General case: several delta fields (reasoning streams) and/or empty ones.  Decidable
        # only if every field that occurs occurs once in *every* event; fields that are empty
        # everywhere are inert; at most one field may vary.
        # An event where no field occurs at all (usage-only, [DONE], comment, error) is
        # never "ordinary", so some field must occur in every event.
        # The one field with text says what the events are: index 0 is ``content`` / ``text``,
        # any other a reasoning field, so reasoning events are known without another scan.
        varying = -1
        field = 0
        present = False
        for i, (pat, empty) in enumerate(p.kinds):
            k = c if i == 0 else buf.count(pat, start, end)
            if k == 0:
                continue
            if k != events:
                return None
            present = True
            e = buf.count(empty, start, end)
            if e == events:
                continue
            if varying >= 0:
                return None
            varying = e
            field = i
        if not present:
            return None
        if varying < 0:
            return 0
        if field:
            self.reasoning_events += events - varying
        return events - varying

    # ----------------------------------------------------------------- slow path
    def _decode_events(self, buf: bytes, start: int, end: int) -> int:
        """Decode every event of ``buf[start:end]`` with ``json.loads``; returns token events."""
        tokens = 0
        for raw in buf[start:end].split(b"\n\n"):
            if not raw:
                continue
            data_lines: list[bytes] = []
            for line in raw.split(b"\n"):
                if not line or line[0] == 0x3A:  # ":" comment / keep-alive
                    continue
                name, sep, value = line.partition(b":")
                if name == b"data":
                    data_lines.append(value[1:] if value[:1] == b" " else value)
                elif name not in _KNOWN_FIELDS:
                    self._fail(malformed_message(line))
                    return tokens
            if not data_lines:
                self._skip += len(raw) + 2
                continue
            payload = data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines)
            if payload.strip() == b"[DONE]":
                self.done = True
                self._skip += len(raw) + 2
                return tokens
            tok = self._handle_payload(payload)
            if tok < 0:
                return tokens
            if not tok:
                self._skip += len(raw) + 2  # no text: none of its bytes are a token's
            else:
                # a token event that carries the finish (SGLang's and vLLM's completions):
                # its envelope is longer than an ordinary one's by the finish's values (0
                # for any other: the decoded path is the first event and the last few)
                self._skip += _finish_envelope_extra(payload)
            tokens += tok
        return tokens

    def _handle_payload(self, payload: bytes) -> int:
        """Interpret one decoded-needed payload: 1 if token event, 0 if not, -1 if it ended
        the stream with an error."""
        self.decoded += 1
        try:
            obj = json.loads(payload)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            self._fail(malformed_message(payload))
            return -1
        if is_error_object(obj):
            self._fail(error_event_message(obj))
            return -1
        choices = obj.get("choices")
        token = 0
        content = False
        if isinstance(choices, list) and choices:
            if len(choices) > 1:
                # Several choices per event break "one pattern per event"; such streams
                # (n > 1 in one chunk) are decoded event by event from here on.
                self._multi = True
            if b'"choices": ' in payload:
                self._pat = self._styles[1]
            elif b'"choices":' in payload:
                self._pat = self._styles[0]
            for ch in choices:
                if not isinstance(ch, dict):
                    continue
                if self.api == "chat":
                    delta = ch.get("delta")
                    if isinstance(delta, dict):
                        for f in self._fields:
                            v = delta.get(f)
                            if isinstance(v, str) and v:
                                token = 1
                                content = content or f == "content"
                                break
                else:
                    v = ch.get("text")
                    if isinstance(v, str) and v:
                        token = 1
                        content = True
                fr = ch.get("finish_reason")
                if fr is not None:
                    self.record.finish_reason = str(fr)
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            value = usage["completion_tokens"]
            problem = usage_problem(value)
            if problem is not None:
                # not believed, not ignored: the tokens are counted from the events, and the
                # record says why (which voids the trial); a later usage may still be believed
                self.usage_seen = False
                self.record.usage_error = problem
                self.record.prompt_tokens = 0
                self._usage_reasoning = 0
            elif int(value) > self._limit:
                self._fail(
                    f"usage says {int(value)} completion tokens, more than max_tokens="
                    f"{self._limit}: the server ignores max_tokens; fix the server, or the "
                    "proxy in front of it"
                )
                return -1
            else:
                self.usage_seen = True
                self.record.usage_error = None
                self.record.completion_tokens = int(value)
                pt = usage.get("prompt_tokens")
                self.record.prompt_tokens = (
                    pt if isinstance(pt, int) and not isinstance(pt, bool) and pt >= 0 else 0
                )
                self._usage_reasoning = usage_reasoning_tokens(usage)
        if token and not content:
            self.reasoning_events += 1
        return token

    def _fail(self, message: str) -> None:
        self.failed = True
        if self.record.error is None:
            self.record.error = message

    # ------------------------------------------------------------------- the end
    def close(self) -> None:
        """End of stream: settle token counts.  Safe to call more than once."""
        if not (self.done or self.failed) and self._pending:
            held = self._pending
            if self._parts is not None:  # a final "data: [DONE]" is a few bytes
                held = b"".join(self._parts) if self._pending_size <= 64 else b""
            tail = held.replace(b"\r", b"").strip()
            if tail in (b"data: [DONE]", b"data:[DONE]"):
                self.done = True
        self._pending = b""
        self._parts = None
        rec = self.record
        if self.usage_seen and rec.completion_tokens < self.events:
            # every token event carries at least one token: fewer tokens than events is false
            rec.usage_error = usage_below_events_message(rec.completion_tokens, self.events)
            rec.prompt_tokens = 0  # a usage not believed tells nothing
            self._usage_reasoning = 0
            self.usage_seen = False
        if not self.usage_seen:
            rec.completion_tokens = self.events
            rec.tokens_approx = True
        else:
            rec.tokens_approx = False
        if self.reasoning_events:
            rec.reasoning_tokens = reasoning_tokens(
                self.reasoning_events,
                self._usage_reasoning,
                rec.completion_tokens,
                rec.tokens_per_event,
            )


def parse_blocks(blocks: list[tuple[float, bytes]], api: Api = "chat") -> RequestRecord:
    """Parse a whole recorded stream (convenience for tests and offline use)."""
    rec = RequestRecord(index=0, worker=0, scheduled=0.0)
    p = StreamParser(rec, api)
    for t, data in blocks:
        p.feed(t, data)
    p.close()
    return rec
