"""Plain records that flow through the pipeline: one streamed request as the client saw it.

The load engine produces :class:`RequestRecord` objects and nothing else; every figure
(steady-state tok/s, TTFT, ITL, decode rate) is computed from them after a trial ends, so the
per-chunk hot path only appends a timestamp, a count and one more int (the read's running
usage, or its bytes).  Where each read's tokens fall is resolved once after the trial
(:meth:`RequestRecord.read_positions`), so that SGLang's packed events (1 token, then
``--stream-interval`` at a time, the rest with the finish) are counted where they are.
Timestamps are ``time.perf_counter()`` seconds on the client's clock.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:  # numpy is imported where positions are resolved, after a trial: the load
    import numpy as np  # engine's import stays light (tests/unit/core/test_imports.py)

Api = Literal["chat", "completions"]
"""Which OpenAI API a request uses (``/v1/chat/completions`` or ``/v1/completions``): the one
definition, for the marker, the request bodies and the stream parser alike."""


@dataclass(slots=True)
class RequestRecord:
    """One request of a trial, from scheduling to the end of its stream."""

    index: int
    """Position of the request in its trial (0-based, in send order)."""
    worker: int
    """Closed-loop worker (or open-loop slot) that sent it."""
    scheduled: float
    """When the request was due to be sent (closed loop: when its worker became free)."""
    sent: float = 0.0
    """Just before the HTTP request was written."""
    first_token: float | None = None
    """Arrival of the first read block that held a non-empty content or reasoning token."""
    end: float = 0.0
    """When the stream ended: ``[DONE]``, connection close, error or timeout."""
    chunk_times: array[float] = field(default_factory=lambda: array("d"))
    """Arrival time of every read block that held at least one token event."""
    chunk_events: array[int] = field(default_factory=lambda: array("I"))
    """How many token events (content/reasoning deltas) each of those blocks held."""
    chunk_usage: array[int] = field(default_factory=lambda: array("I"))
    """The stream's completion tokens so far at each token read (its last running usage),
    when the server sends the usage on every chunk (``continuous_usage_stats``): the exact
    position of every read.  Empty for a stream without it (decided at its first token read);
    :data:`UNKNOWN_USAGE` for a read in which none could be read."""
    chunk_bytes: array[int] = field(default_factory=lambda: array("I"))
    """Without running usage: the bytes of each token read's complete events, less those of
    the events that carry no token (role, finish and usage chunks, comments, ``[DONE]``).
    Less each event's envelope (:func:`event_overhead`) that is the text the read brought,
    which apportions the stream's tokens over its reads (:meth:`read_positions`)."""
    sample_read: bytes = b""
    """The complete events of the stream's second token read (only without running usage):
    an ordinary token chunk of the stream, decoded after the trial to measure its envelope."""
    _positions: Any = field(default=None, repr=False, compare=False)
    """:meth:`read_positions`' result and what it was computed from."""
    completion_tokens: int = 0
    """From the server's ``usage``; counted from events when ``tokens_approx``."""
    prompt_tokens: int = 0
    tokens_approx: bool = False
    """True when the server sent no ``usage`` and the token count is the number of events."""
    status: int = 0
    """HTTP status; 0 when no response arrived (connection refused, timeout before headers)."""
    body_bytes: int = 0
    """Bytes of the response body the client read (decompressed), read off the body's reader
    once the stream ends, never per read: what a flood of events that carry no token costs the
    client, against the token events it brought (:data:`~pytest_kimi.measure.trial_causes.
    FLOOD_BYTES_PER_EVENT`)."""
    error: str | None = None
    """First error seen for this request (HTTP error body, error event, timeout, disconnect)."""
    finish_reason: str | None = None
    reasoning_tokens: int = 0
    """Tokens the stream carried as reasoning (``delta.reasoning_content`` / ``delta.reasoning``)
    before or beside the answer: the server's ``usage`` count when it reports one, else the
    reasoning events scaled like :attr:`tokens_per_event`.  0 when the stream did not separate
    reasoning from content (no reasoning parser, or ``separate_reasoning: false``), even if
    ``usage`` counts some."""
    first_content: float | None = None
    """Arrival of the first read block holding a content (answer) token: the same as
    ``first_token`` unless the stream opened with reasoning; None when no content came."""
    usage_error: str | None = None
    """Why the server's ``usage`` was not believed (its ``completion_tokens`` negative,
    fractional, not a number, below the token events streamed, a running count that fell, or a
    cut stream's above its ``max_tokens``), naming the value; the
    token count is then the events' (``tokens_approx``).  Not an error of the request (its
    stream was fine) but of the server's accounting, so it voids the trial instead
    (:func:`pytest_kimi.measure.metrics.summarize_trial`)."""
    max_tokens: int = 0
    """The request's own ``max_tokens`` where it differs from its level's (the staggered first
    request of each stream in a stationary trial); 0: the level's."""
    token_limit: int = 0
    """The ``max_tokens`` the request's body asked for, as sent (a ranged workload draws one
    per request, so the level's is not it); 0: none.  A cut stream's running usage above it
    cannot be true (:func:`pytest_kimi.measure.usage_checks.count_cut_tokens`)."""
    last_read: bytes = b""
    """The last token-carrying read block while the stream runs (one reference per read, no
    copy): a stream the time box cuts never gets its final ``usage``, but with
    ``continuous_usage_stats`` its last chunk says how many tokens it had.  Cleared once the
    stream ends normally."""
    cut: bool = False
    """The trial's time box ended the stream on purpose (stationary protocol): not an error;
    its tokens up to the cut count, its length and end-to-end latency do not."""
    turn: int = 0
    """Multi-turn workloads (``turns=``): which turn of its stream's conversation the request
    was (1, 2, ...); 0 for a request that is not part of a conversation."""
    blocks: list[bytes] | None = None
    """Every raw read block of the stream, kept only while a conversation needs the answer
    (one reference per read, no copy); the runner takes the answer from them once the stream
    has ended and releases them (:mod:`pytest_kimi.load.conversation`).  None otherwise."""

    @property
    def ok(self) -> bool:
        """A 200 stream with no error: completed, or cut by the trial's time box once its
        response had begun (a stream cut before its headers has status 0: not ok, but
        ``cut``, so it is not counted as failed either)."""
        return self.error is None and self.status == 200

    @property
    def events(self) -> int:
        """Number of token events received."""
        return int(sum(self.chunk_events))

    @property
    def ttft(self) -> float | None:
        """Time to first token, from send to the first block carrying a token."""
        if self.first_token is None:
            return None
        return self.first_token - self.sent

    @property
    def ttfc(self) -> float | None:
        """Time to first content token: what a user waits for the answer after the thinking."""
        if self.first_content is None:
            return None
        return self.first_content - self.sent

    @property
    def content_tokens(self) -> int:
        """Output tokens that were not reasoning (all of them for a stream without reasoning)."""
        return max(self.completion_tokens - self.reasoning_tokens, 0)

    @property
    def last_token(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def tokens_per_event(self) -> float:
        """The stream's mean tokens per event: 1 unless the server packs them
        (``stream_interval``).  A mean only: SGLang sends its first token alone and the rest
        of a stream ``stream_interval`` at a time, so where a read's own count matters use
        :meth:`read_positions`."""
        events = self.events
        return self.completion_tokens / events if events and self.completion_tokens else 1.0

    def read_positions(self) -> np.ndarray:
        """The stream's completion tokens up to and including each token read (float64, one a
        read, the last one ``completion_tokens``): what every window edge and gap is read off.

        Resolved once after the trial (cached; again if the token count changes, as a cut
        stream's does), from the best the stream offers (:attr:`position_source`):

        * ``usage``: the running usage of each read (``continuous_usage_stats``), exact for
          any stream pattern -- believed only if it never falls, never counts fewer tokens
          than the events so far (each carries one at least) and ends at most at the total;
        * ``events``: as many tokens as events (each event then carries exactly one);
        * ``bytes``: the tokens beyond one an event shared out by the text each read
          brought (:func:`apportion_by_bytes`);
        * ``uniform``: ``completion_tokens / events`` for every event, the last resort.
        """
        key = (self.completion_tokens, len(self.chunk_times))
        cached = self._positions
        if cached is None or cached[0] != key:
            cached = (key, *_resolve_positions(self))
            self._positions = cached
        positions: np.ndarray = cached[1]
        return positions

    @property
    def position_source(self) -> str:
        """How :meth:`read_positions` placed the tokens: ``usage``, ``events``, ``bytes`` or
        ``uniform`` (``none`` for a stream without token reads)."""
        self.read_positions()
        return str(self._positions[2])

    def read_tokens(self) -> np.ndarray:
        """Tokens each token read brought (float64; see :meth:`read_positions`)."""
        import numpy as np

        pos = self.read_positions()
        return np.diff(pos, prepend=0.0) if pos.size else pos

    @property
    def decode_tok_s(self) -> float | None:
        """Per-request decode rate: tokens after the first read / (last token - first token).

        With one token per event that is (tokens - 1) / (last - first); whatever the first
        read carried (one token, as SGLang sends it, or several) is excluded the same way.
        """
        last = self.last_token
        if self.first_token is None or last is None or last <= self.first_token:
            return None
        first_read = float(self.read_positions()[0])
        return float((self.completion_tokens - first_read) / (last - self.first_token))

    @property
    def e2e(self) -> float:
        return self.end - self.sent


UNKNOWN_USAGE = 0xFFFFFFFF
"""A read of :attr:`RequestRecord.chunk_usage` whose running usage could not be read."""


def _resolve_positions(rec: RequestRecord) -> tuple[np.ndarray, str]:
    """:meth:`RequestRecord.read_positions` and its source, computed."""
    import numpy as np

    reads = len(rec.chunk_times)
    if not reads or not rec.chunk_events:
        return np.zeros(reads), "none"
    events = np.frombuffer(rec.chunk_events, dtype=np.uint32).astype(np.float64)
    upto = np.cumsum(events)
    streamed = float(upto[-1])
    total = float(rec.completion_tokens) if rec.completion_tokens > 0 else streamed
    if len(rec.chunk_usage) == reads:
        told = np.frombuffer(rec.chunk_usage, dtype=np.uint32).astype(np.float64)
        if (
            not (told == UNKNOWN_USAGE).any()
            and not (np.diff(told) < 0).any()
            and not (told < upto).any()
            and told[-1] <= total
        ):
            told[-1] = total  # a last chunk's usage that lags the final one: the rest came last
            return told, "usage"
    if total == streamed:
        return upto, "events"
    if total > streamed and len(rec.chunk_bytes) == reads and rec.sample_read:
        overhead = event_overhead(rec.sample_read)
        if overhead is not None:
            tokens = apportion_by_bytes(
                events, np.frombuffer(rec.chunk_bytes, dtype=np.uint32), overhead, total
            )
            if tokens is not None:
                pos = np.cumsum(tokens)
                pos[-1] = total
                return pos, "bytes"
    return upto * (total / streamed), "uniform"


def apportion_by_bytes(
    events: np.ndarray, read_bytes: np.ndarray, overhead: int, total: float
) -> np.ndarray | None:
    """Tokens per read for a stream with no running usage, from the text each read brought.

    Why bytes: a read's events cost the same envelope each (id, model, field names: the
    stream's constant ``overhead`` bytes, :func:`event_overhead`), so what a read has beyond
    its events' envelopes is its tokens' text, and text grows with tokens.  Why not text in
    proportion alone: every event carries one token at least, which is known exactly, so
    only the tokens beyond one an event (``total - events``) are shared out, in proportion
    to each read's text beyond what its events' first tokens take at the stream's mean
    bytes per token.  Exact when every token has the same length; a token's length varies
    (a word, a space, a CJK character), so a read's share is off by a token or two, but not
    the pattern: SGLang's first event of one token and the short last one are told from
    the full ``stream_interval`` events in between, which a uniform split blurs (-3.1% at
    interval 8, C=4, 256 tokens).  None when the bytes tell nothing (no text beyond the
    envelopes: another framing than the sample's).
    """
    import numpy as np

    text = np.maximum(read_bytes.astype(np.float64) - events * overhead, 0.0)
    per_token = float(text.sum()) / total
    if per_token <= 0.0:
        return None
    beyond = np.maximum(text - per_token * events, 0.0)
    spare = total - float(events.sum())
    weight = float(beyond.sum())
    if weight <= 0.0:
        return None
    tokens: np.ndarray = events + spare * beyond / weight
    return tokens


_TEXT_FIELDS = ("content", "reasoning_content", "reasoning")
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
"""The JSON string scanner: where a string value ends on the wire, escapes and all."""


def event_overhead(sample: bytes) -> int | None:
    """The envelope of an ordinary token chunk: its bytes (``data: `` to the blank line)
    less its text's, measured on the first event of ``sample`` that decodes to one choice
    with text and no ``finish_reason``; None when none does.

    The text's bytes are counted as they are on the wire (escapes included) with
    ``json.decoder.scanstring`` from the field's opening quote, so whatever the server's
    escaping (``\\u00e9`` or raw UTF-8) the envelope is what remains.  Run after the trial,
    once a stream.
    """
    for raw in sample.split(b"\n\n"):
        if not raw.startswith(b"data:"):
            continue
        try:
            obj = json.loads(raw[5:])
        except ValueError:
            continue
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            continue
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            continue
        delta = choice.get("delta")
        fields = _TEXT_FIELDS if isinstance(delta, dict) else ("text",)
        holder = delta if isinstance(delta, dict) else choice
        name = next((f for f in fields if isinstance(holder.get(f), str) and holder[f]), None)
        if name is None:
            continue
        wire = raw.decode("utf-8", "replace")
        key = wire.find(f'"{name}":')
        quote = wire.find('"', key + len(name) + 3) if key >= 0 else -1
        if quote < 0:
            continue
        try:
            _, after = _scanstring(wire, quote + 1)
        except ValueError:
            continue
        text_bytes = len(wire[quote + 1 : after - 1].encode("utf-8"))
        return len(raw) + 2 - text_bytes
    return None
