"""One trial as data: what it sends (:class:`TrialPlan`), what it brings back
(:class:`TrialRecords`, :class:`ShardSummary`), what a progress display reads while it runs
(:class:`LiveTrial`), and what the measurement needs of any client (:class:`TrialClient`).

On its own because every sender (:mod:`.runner`'s one event loop, :mod:`.workers`' processes)
and every reader (:mod:`pytest_kimi.measure`) shares these shapes, while only the senders need
aiohttp.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from pytest_kimi.load.openloop import OpenLoopPlan, check_wall_limit
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target


@dataclass(slots=True)
class TrialPlan:
    """What one closed-loop trial sends.  At least one of ``requests`` / ``duration_s``."""

    concurrency: int
    bodies: Sequence[bytes]
    """Pre-encoded request bodies; request ``i`` uses ``bodies[i % len(bodies)]``."""
    requests: int | None = None
    """Total requests of the trial (not counting warm-up)."""
    duration_s: float | None = None
    """No new request is started after this many seconds; in-flight ones finish."""
    timeout_s: float = 600.0
    """Longest silence allowed per request (connect, headers, between reads)."""
    max_failures: int | None = None
    """Stop starting requests once this many failed: a dead server must not be spun on."""
    warmup: int = 0
    """Requests sent and awaited before the trial starts; not part of the records."""
    unique_slot: bytes | None = None
    """Placeholder of :data:`~pytest_kimi.load.request_ids.UNIQUE_ID_WIDTH` bytes that every
    body holds once (in its prompt): the request with global index ``g`` sends it replaced by
    ``unique_id(unique_base + g)``, so no two prompts share a prefix a server could cache.
    None: bodies are sent as they are."""
    unique_base: int = 0
    """Request number of global index 0; each trial of a measurement has its own range."""
    id_table: Sequence[int] | None = None
    """Global index of local request ``i`` when a worker process runs a share of the trial
    (``id_table[i]``, or ``i * id_stride + id_offset`` without a table): numbers stay unique
    over all shards."""
    id_stride: int = 1
    id_offset: int = 0
    first_bodies: Sequence[bytes] | None = None
    """Stationary protocol: the first request of stream ``w`` sends ``first_bodies[w]`` (a
    shorter, staggered ``max_tokens``, so the streams are spread over the positions of a
    request from the start instead of all starting and ending together)."""
    first_max_tokens: Sequence[int] | None = None
    """The ``max_tokens`` of each of ``first_bodies`` (recorded on the request)."""
    min_duration_s: float = 0.0
    """With ``token_budget``: never cut before this many wall seconds (a fast simulator's
    steps are too short for a window of few of them to be timed well)."""
    token_budget: int | None = None
    """Stationary protocol: cut the trial (cancel every stream in flight, keeping what it
    received) once about this many tokens have arrived: the trial's time box, in tokens so
    that it holds the same number of steps whatever the server's speed."""
    turns: int = 1
    """Multi-turn conversations: each stream sends its next request as the next turn of its
    own conversation (the history, the answer it streamed, a follow-up) for this many turns,
    then opens a new one (:mod:`pytest_kimi.load.conversation`).  1: independent requests."""
    wall_limit_s: float | None = None
    """Wall seconds after the trial's start past which it is cut like a time box (every stream
    in flight cancelled, what it received kept, marked ``cut``) and reported over its limit
    (:attr:`TrialRecords.over_limit_s`): a stream that sends bytes but never tokens, or a usage
    that never fills ``token_budget``, must not hold the run forever.  None: no limit (the
    plan's own warm-up requests never have one)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.turns < 1:
            raise ValueError("turns must be >= 1")
        if self.turns > 1 and self.first_bodies is not None:
            raise ValueError("a conversation's turns are whole requests: no first_bodies")
        if not self.bodies:
            raise ValueError("bodies must not be empty")
        if self.first_bodies is not None and len(self.first_bodies) < self.concurrency:
            raise ValueError("first_bodies needs one body per stream")
        if self.requests is None and self.duration_s is None and self.token_budget is None:
            raise ValueError("a TrialPlan needs requests, duration_s or token_budget")
        if self.requests is not None and self.requests < 0:
            raise ValueError("requests must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        check_wall_limit(self.wall_limit_s)


@dataclass(slots=True)
class TrialRecords:
    """Raw outcome of one trial plus the signals that tell whether the client kept up."""

    records: list[RequestRecord]
    """Counted requests, sorted by index."""
    started: float
    ended: float
    concurrency: int
    loop_lag_max_s: float = 0.0
    """Worst overshoot of the monitor's fixed sleep: how long the loop was too busy to run a
    ready callback.  Idle baseline is ~0.1-1 ms (epoll's millisecond timeout)."""
    loop_lag_p99_s: float = 0.0
    send_delay_p99_s: float = 0.0
    """p99 of ``sent - scheduled``: how long a free worker took to get its request out.  In a
    closed loop this is near zero by construction (the worker sends in the same step in which
    it becomes free); event-loop lag is the saturation signal there."""
    start_spread_s: float = 0.0
    """From the trial start to the last worker's first send: C requests cannot leave one loop
    at the same instant (~0.5 ms each on a slow core with a new connection)."""
    client_cpu_s: float = 0.0
    """``time.process_time()`` delta over the trial: the whole process, not only the client."""
    stopped_early: str | None = None
    """Why the trial stopped starting requests before its plan said so (None: it did not)."""
    warmup_records: list[RequestRecord] = field(default_factory=list)
    cut_at: float | None = None
    """When the trial cut its streams in flight: the token budget (stationary protocol) or the
    wall-clock limit (:attr:`over_limit_s`); None: it ran to its end."""
    over_limit_s: float | None = None
    """The plan's ``wall_limit_s`` when the trial ran past it and was cut there; None: it
    ended within its limit (or had none)."""
    lag_samples: int = 0
    lag_times: array[float] = field(default_factory=lambda: array("d"))
    lag_values: array[float] = field(default_factory=lambda: array("d"))
    """The raw lag samples and when they were taken (ramp-up bursts fall outside the window)."""
    offered_rate: float | None = None
    """Open loop: the arrival rate asked for (requests/s).  None for a closed loop."""
    achieved_rate: float | None = None
    """Open loop: ``(sent - 1) / (last send - first send)``, the rate that actually left the
    client (intervals per second, so it does not depend on where the trial clock started)."""
    schedule_delay_p99_s: float | None = None
    """Open loop: p99 of ``sent - scheduled``, the client's own lateness against its plan.  A
    late client offers less than ``offered_rate`` and flattens bursts: the figures would
    then describe a gentler load than the one asked for."""
    shards: list[ShardSummary] = field(default_factory=list)
    """Per-process breakdown when a :class:`~pytest_kimi.load.workers.ShardedClient` ran the
    trial (empty for a single :class:`~pytest_kimi.load.runner.LoadClient`)."""


@dataclass(slots=True)
class ShardSummary:
    """What one worker process of a sharded trial did, for saturation checks per process.

    The merged :class:`TrialRecords` takes the worst lag over processes, so a single
    overloaded core is not averaged away; this keeps the per-process detail for reports.
    """

    shard: int
    """Worker process number (0-based)."""
    pid: int
    concurrency: int
    """Closed loop: slots this process ran; open loop: its peak in flight."""
    requests: int | None
    """Requests (closed loop) or arrivals (open loop) it was planned to send."""
    first_slot: int
    """Closed loop: its slots are ``record.worker`` in ``[first_slot, first_slot + concurrency)``."""
    records: int
    client_cpu_s: float
    loop_lag_max_s: float
    loop_lag_p99_s: float
    stopped_early: str | None = None


@dataclass(slots=True, eq=False)
class LiveTrial:
    """Counters a progress display reads while a trial runs.

    Updated once per request (start and end), never per chunk; tokens of requests still
    streaming are estimated from their read blocks only when someone asks.
    """

    total: int | None
    started: float = 0.0
    done: int = 0
    failed: int = 0
    tokens: int = 0
    inflight: dict[int, RequestRecord] = field(default_factory=dict)
    remote_inflight_tokens: int = 0
    """Token-carrying blocks of requests streaming in worker processes (ShardedClient): their
    records live in another process, so the workers report this count periodically."""

    blocks: int = 0
    """Token-carrying reads of finished requests: with ``tokens`` it tells how many tokens a
    read carries (a server may pack several per event), to scale the in-flight estimate."""

    def approx_tokens(self) -> int:
        """Tokens of finished requests plus an estimate for the ones in flight."""
        per_block = self.tokens / self.blocks if self.blocks else 1.0
        inflight = sum(len(r.chunk_times) for r in list(self.inflight.values()))
        return int(self.tokens + self.remote_inflight_tokens + inflight * per_block)


class TrialClient(Protocol):
    """What the measurement code needs from a client:
    :class:`~pytest_kimi.load.runner.LoadClient` (one event loop) and
    :class:`~pytest_kimi.load.workers.ShardedClient` (N processes) both provide it."""

    async def run_trial(
        self, target: Target, plan: TrialPlan, live: LiveTrial | None = None
    ) -> TrialRecords: ...

    async def run_open_loop(
        self, target: Target, plan: OpenLoopPlan, live: LiveTrial | None = None
    ) -> TrialRecords: ...
