"""Plain records that flow through the pipeline: one streamed request as the client saw it.

The load engine produces :class:`RequestRecord` objects and nothing else; every figure
(steady-state tok/s, TTFT, ITL, decode rate) is computed from them after a trial ends, so the
per-chunk hot path only appends a timestamp and a count.  Timestamps are ``time.perf_counter()``
seconds on the client's clock.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Literal

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
    completion_tokens: int = 0
    """From the server's ``usage``; counted from events when ``tokens_approx``."""
    prompt_tokens: int = 0
    tokens_approx: bool = False
    """True when the server sent no ``usage`` and the token count is the number of events."""
    status: int = 0
    """HTTP status; 0 when no response arrived (connection refused, timeout before headers)."""
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
    fractional, not a number, or below the token events streamed), naming the value; the
    token count is then the events' (``tokens_approx``).  Not an error of the request (its
    stream was fine) but of the server's accounting, so it voids the trial instead
    (:func:`pytest_kimi.measure.metrics.summarize_trial`)."""
    max_tokens: int = 0
    """The request's own ``max_tokens`` where it differs from its level's (the staggered first
    request of each stream in a stationary trial); 0: the level's."""
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
        """Tokens one stream event carries: 1 unless the server packs them (``stream_interval``)."""
        events = self.events
        return self.completion_tokens / events if events and self.completion_tokens else 1.0

    @property
    def decode_tok_s(self) -> float | None:
        """Per-request decode rate: tokens after the first read / (last token - first token).

        With one token per event that is (tokens - 1) / (last - first); a server that packs
        several tokens per event has the first read's tokens excluded the same way.
        """
        last = self.last_token
        if self.first_token is None or last is None or last <= self.first_token:
            return None
        first_read = self.chunk_events[0] * self.tokens_per_event
        return float((self.completion_tokens - first_read) / (last - self.first_token))

    @property
    def e2e(self) -> float:
        return self.end - self.sent
