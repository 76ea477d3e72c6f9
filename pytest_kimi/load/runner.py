"""Load runner: closed loop (keep exactly C streamed requests in flight) and open loop
(send each request at its planned arrival, however many are in flight, or at most
``max_concurrency`` of them), recorded.

Design choices and why:

* One ``aiohttp.ClientSession`` for the client's lifetime with an unlimited connector: the
  connector's own pool limit (100 by default) would silently cap concurrency, and a fresh
  session per trial would pay connection setup inside the measurement.
* Pure asyncio, no threads: C=512+ streams are just C tasks; the only per-stream costs are the
  socket and the SSE parser (see :mod:`.sse`).
* The heap that exists when a trial starts is frozen (``gc.freeze``) while it runs: a full
  collection of a big pytest process (every module, fixture and earlier report) stalls the
  event loop for tens of milliseconds, which shows as late timestamps and as event-loop lag.
  Objects the trial makes are still collected as usual.
* The runner only *measures* client saturation (event-loop lag, send delay, CPU); deciding
  that a trial is invalid because the client was the bottleneck is done downstream.
"""

from __future__ import annotations

import asyncio
import gc
import math
from array import array
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from time import perf_counter, process_time
from typing import Any, AsyncIterator, Protocol, Sequence

import aiohttp

from pytest_kimi.load.conversation import Conversation, Conversations
from pytest_kimi.load.records import UNKNOWN_USAGE, RequestRecord
from pytest_kimi.load.openloop import OpenLoopPlan, check_wall_limit
from pytest_kimi.load.request import Target, silence_timeout, stream_request
from pytest_kimi.load.sse import running_usage

try:  # POSIX only; elsewhere the default limit has to do
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

CUT_POLL_S = 0.01
"""How often a stationary trial checks its token budget: the cut lands within this of the
budget, and the measured window ends at the last whole step before it whatever the lag."""

LAG_INTERVAL_S = 0.005
"""Sleep of the lag monitor: 200 wake-ups/s costs well under 1% of a core yet resolves the
few-millisecond stalls that show a saturated client."""

UNIQUE_ID_WIDTH = 15
"""Bytes of a request's unique id: 15 decimal digits (``10**15 > 2**48`` request numbers).

Why decimal, not hex: the id is part of the prompt, so its token count is part of
``input_tokens``.  Every major tokenizer splits a run of digits the same way whatever the
digits are (Llama 2, Qwen, Gemma: one token per digit; Llama 3, DeepSeek V3, Kimi K2's tiktoken:
groups of three), so every request's prompt has the count the sizing measured on a sample id.
Hex mixes letters and digits, whose splits depend on the digits: on SGLang 0.5.23 with a
byte-level BPE, 64-token prompts came out at 57-64 tokens."""
_ID_MODULUS = 10**UNIQUE_ID_WIDTH
_ID_MULT = 0x9E3779B97F4B
"""Coprime to 10 (odd, not a multiple of 5), so ``n * _ID_MULT mod 10**15`` is a bijection:
distinct numbers, distinct ids."""
TRIAL_ID_BITS = 28
"""A trial's request numbers are ``base + g`` with ``base = serial << TRIAL_ID_BITS``: room for
2**27 requests and as many warm-up requests per trial, and 2**20 trials per measurement."""
WARMUP_IDS = 1 << (TRIAL_ID_BITS - 1)
"""Numbers of a plan's own warm-up requests start here, above any of its trial's requests."""


def unique_id(n: int) -> bytes:
    """The 15 decimal digits that make request number ``n`` unique (``n < 2**48``).

    Scrambled (a multiplication modulo 2**48), not counted: consecutive requests then differ
    from the first digit on, so a prefix cache that shares even a token or two of a prompt's
    start finds nothing to share.
    """
    return b"%015d" % (n * _ID_MULT % _ID_MODULUS)


def split_at_slot(bodies: Sequence[bytes], slot: bytes) -> list[tuple[bytes, bytes]]:
    """Each body as (before, after) its one ``slot``; done once per trial, before the clock.

    A request's body is then ``before + unique_id(n) + after``: one join of bytes per request,
    nothing per chunk.
    """
    if len(slot) != UNIQUE_ID_WIDTH:
        raise ValueError(f"unique_slot must be {UNIQUE_ID_WIDTH} bytes, got {len(slot)}")
    out = []
    for k, body in enumerate(bodies):
        if body.count(slot) != 1:
            raise ValueError(
                f"body {k} holds the unique_slot {slot!r} {body.count(slot)} times, "
                "not once: encode the bodies with the slot in the prompt"
            )
        head, _, tail = body.partition(slot)
        out.append((head, tail))
    return out


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
    """Placeholder of :data:`UNIQUE_ID_WIDTH` bytes that every body holds once (in its prompt):
    the request with global index ``g`` sends it replaced by ``unique_id(unique_base + g)``, so
    no two prompts share a prefix a server could cache.  None: bodies are sent as they are."""
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
    trial (empty for a single :class:`LoadClient`)."""


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


def _tokens_per_read(running: Sequence[RequestRecord], finished: Sequence[int]) -> float:
    """Tokens a read carries, for a stationary trial's budget: from the running usage of a few
    streams in flight (``continuous_usage_stats``; a server may pack several tokens into one
    event), else from the finished streams, else 1."""
    tokens = reads = 0
    for rec in running[:8]:
        usage = rec.chunk_usage  # the parser's running usage per read, where the stream has it
        told = usage[-1] if usage and usage[-1] != UNKNOWN_USAGE else None
        if told is None and rec.last_read:
            told = running_usage(rec.last_read[-512:])
        if told is not None:
            tokens += told
            reads += len(rec.chunk_times)
    if reads:
        return tokens / reads
    return finished[0] / finished[1] if finished[1] else 1.0


def _request_done(
    rec: RequestRecord,
    live: LiveTrial | None,
    state: dict[str, int],
    stop: list[str],
    max_failures: int | None,
) -> bool:
    """Book-keeping when a request ends (closed and open loop alike): live counters, failures.

    Returns True when this request's failure is the one that stops the trial.
    """
    if live is not None:
        live.inflight.pop(rec.index, None)
        live.done += 1
        live.tokens += rec.completion_tokens
        live.blocks += len(rec.chunk_times)
        live.failed += rec.error is not None
    if rec.error is None:
        return False
    state["failures"] += 1
    if max_failures is not None and state["failures"] >= max_failures and not stop:
        stop.append(
            f"max_failures reached: {state['failures']} requests failed (last: {rec.error[:160]})"
        )
        return True
    return False


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    values.sort()
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]


def _start_spread(records: list[RequestRecord], started: float) -> float:
    first: dict[int, float] = {}
    for r in records:
        if r.sent and (r.worker not in first or r.sent < first[r.worker]):
            first[r.worker] = r.sent
    return max(first.values()) - started if first else 0.0


def peak_inflight(records: Sequence[RequestRecord]) -> int:
    """Most requests whose ``[sent, end]`` intervals overlap at one instant.

    An end at the same instant as a send counts as finished first, so a closed-loop slot
    that sends its next request the moment its previous one ends counts once.
    """
    events: list[tuple[float, int]] = []
    for r in records:
        if r.sent:
            events.append((r.sent, 1))
            events.append((max(r.end, r.sent), -1))
    events.sort()
    peak = cur = 0
    for _, d in events:
        cur += d
        if cur > peak:
            peak = cur
    return peak


def achieved_rate(records: Sequence[RequestRecord]) -> float | None:
    """Sends per second between the first and the last send: ``(n - 1) / span``."""
    sends = [r.sent for r in records if r.sent]
    if len(sends) < 2:
        return None
    span = max(sends) - min(sends)
    return (len(sends) - 1) / span if span > 0 else None


async def sleep_until(when: float) -> None:
    """Sleep until ``perf_counter() >= when`` (to ~1 ms: the event loop's timer resolution)."""
    delay = when - perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def raise_nofile_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE toward the hard limit so ``needed`` sockets fit.

    Returns the soft limit now in force (or -1 where unknown).  Each stream holds a socket;
    the common soft default of 1024 would break C=1000 with ``Too many open files``.
    """
    if resource is None:
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft


class _LagMonitor:
    """Sleeps a fixed interval over and over and records how late it wakes up."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples: array[float] = array("d")
        self.times: array[float] = array("d")
        """When each sample was taken: lets the lag be judged inside the steady-state window."""
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        interval = self.interval_s
        append = self.samples.append
        stamp = self.times.append
        sleep = asyncio.sleep
        while True:
            t = perf_counter()
            await sleep(interval)
            now = perf_counter()
            append(now - t - interval)
            stamp(now)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


@dataclass(slots=True)
class _TrialBook:
    """The timing bookkeeping every trial shares, whatever sends its requests: the lag monitor,
    the client's CPU time and the frozen heap around the send loop, then the records sorted and
    the saturation figures computed once the loop is done (nothing of this runs per chunk)."""

    monitor: _LagMonitor
    records: list[RequestRecord] = field(default_factory=list)
    ended: float = 0.0
    cpu_s: float = 0.0

    @classmethod
    @asynccontextmanager
    async def around(cls, lag_interval_s: float) -> AsyncIterator[_TrialBook]:
        book = cls(_LagMonitor(lag_interval_s))
        book.monitor.start()
        cpu0 = process_time()
        try:
            gc.freeze()
            yield book
        finally:
            book.ended = perf_counter()
            gc.unfreeze()
            book.cpu_s = process_time() - cpu0
            await book.monitor.stop()

    def trial(
        self, *, started: float, stopped: str | None, concurrency: int, **extra: Any
    ) -> TrialRecords:
        """The trial's :class:`TrialRecords`; ``extra`` carries the loop-specific fields."""
        records = self.records
        records.sort(key=lambda r: r.index)
        lags = list(self.monitor.samples)
        extra.setdefault(
            "send_delay_p99_s", _p99([r.sent - r.scheduled for r in records if r.sent])
        )
        return TrialRecords(
            records=records,
            started=started,
            ended=self.ended,
            concurrency=concurrency,
            loop_lag_max_s=max(lags, default=0.0),
            loop_lag_p99_s=_p99(lags),
            client_cpu_s=self.cpu_s,
            stopped_early=stopped,
            lag_samples=len(lags),
            lag_times=self.monitor.times,
            lag_values=self.monitor.samples,
            **extra,
        )


class TrialClient(Protocol):
    """What the measurement code needs from a client: :class:`LoadClient` (one event loop)
    and :class:`~pytest_kimi.load.workers.ShardedClient` (N processes) both provide it."""

    async def run_trial(
        self, target: Target, plan: TrialPlan, live: LiveTrial | None = None
    ) -> TrialRecords: ...

    async def run_open_loop(
        self, target: Target, plan: OpenLoopPlan, live: LiveTrial | None = None
    ) -> TrialRecords: ...


class LoadClient:
    """Owns the one HTTP session that sends every request of a test session.

    Use as ``async with LoadClient() as client: await client.run_trial(target, plan)``.  The
    session binds to the loop that enters the context manager.
    """

    def __init__(
        self, *, read_bufsize: int = 2**20, lag_interval_s: float = LAG_INTERVAL_S
    ) -> None:
        self.read_bufsize = read_bufsize
        """Per-response buffer: a client that falls behind reads large blocks, so the
        per-block parsing cost shrinks exactly when it matters."""
        self.lag_interval_s = lag_interval_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            raise RuntimeError("LoadClient is not open: use 'async with LoadClient() as client'")
        return self._session

    async def __aenter__(self) -> LoadClient:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                read_bufsize=self.read_bufsize,
                timeout=aiohttp.ClientTimeout(total=None),
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _closed_loop(
        self,
        target: Target,
        plan: TrialPlan,
        *,
        concurrency: int,
        requests: int | None,
        deadline_after: float | None,
        max_failures: int | None,
        records: list[RequestRecord],
        live: LiveTrial | None = None,
        start_at: float | None = None,
        warmup: bool = False,
    ) -> tuple[float, str | None, float | None, bool]:
        """Run C workers that each take the next index, send, await, repeat.

        Returns (start time, stop reason, cut time, whether the wall-clock limit made the
        cut).  Workers stop taking indices when the count is reached, the deadline has passed,
        or ``max_failures`` requests failed.  With
        ``start_at`` (a ``perf_counter`` instant agreed with other processes) the trial starts
        then, and that instant is its start time.  With a ``plan.token_budget`` (not in a
        warm-up) the streams in flight are cancelled once about that many tokens arrived;
        their records are kept, marked ``cut``, and the cut time is returned; so are they at
        ``plan.wall_limit_s`` after the start (not in a warm-up), whatever the budget.
        """
        session = self.session
        bodies = list(plan.bodies)
        nb = len(bodies)
        slot = plan.unique_slot
        parts = split_at_slot(bodies, slot) if slot is not None else None
        first = None if warmup or plan.first_bodies is None else list(plan.first_bodies)
        first_parts = split_at_slot(first, slot) if first is not None and slot else None
        first_max = plan.first_max_tokens
        budget = None if warmup else plan.token_budget
        base = plan.unique_base + (WARMUP_IDS if warmup else 0)
        table = None if warmup else plan.id_table
        stride, offset = plan.id_stride, plan.id_offset
        timeout = silence_timeout(plan.timeout_s)
        timeout_s = plan.timeout_s
        state = {"next": 0, "failures": 0}
        stop: list[str] = []
        inflight: dict[int, RequestRecord] = {}
        finished = [0, 0]  # tokens and token-carrying reads of finished requests
        talks = None if warmup or plan.turns < 2 else Conversations(plan.turns, target.api, slot)
        if start_at is not None:
            await sleep_until(start_at)
        started = perf_counter() if start_at is None else start_at
        deadline = None if deadline_after is None else started + deadline_after
        limit_at = None if warmup or plan.wall_limit_s is None else started + plan.wall_limit_s
        append = records.append
        if live is not None:
            live.started = started

        async def worker(w: int) -> None:
            opening = first is not None
            talk: Conversation | None = None  # this stream's conversation (turns > 1)
            while not stop:
                # Due now: the worker is free (its previous stream, including the end of the
                # HTTP body, is done).  Not the trial start for the first request: workers
                # start one after another, and that start-up spread is reported separately.
                scheduled = perf_counter()
                i = state["next"]
                if requests is not None and i >= requests:
                    return
                if deadline is not None and scheduled >= deadline:
                    return
                state["next"] = i + 1
                rec = RequestRecord(index=i, worker=w, scheduled=scheduled)
                if live is not None:
                    live.inflight[i] = rec
                g = table[i] if table is not None else i * stride + offset
                uid = None
                if talk is not None:
                    body = talk.body()
                elif opening:
                    assert first is not None
                    opening = False
                    rec.max_tokens = first_max[w] if first_max is not None else 0
                    if first_parts is None:
                        body = first[w]
                    else:
                        head, tail = first_parts[w]
                        body = b"".join((head, unique_id(base + g), tail))
                elif parts is None:
                    body = bodies[i % nb]
                else:
                    head, tail = parts[i % nb]
                    uid = unique_id(base + g)
                    body = b"".join((head, uid, tail))
                if talks is not None:
                    if talk is None:
                        talk = talks.open(i % nb, bodies[i % nb], uid)
                    rec.turn = talk.turn
                    if talk.wants_answer():
                        rec.blocks = []
                inflight[i] = rec
                await stream_request(
                    session,
                    target,
                    body,
                    index=i,
                    worker=w,
                    scheduled=scheduled,
                    timeout_s=timeout_s,
                    timeout=timeout,
                    record=rec,
                )
                del inflight[i]
                rec.last_read = b""
                if talk is not None and not talk.reply(rec):
                    talk = None
                finished[0] += rec.completion_tokens
                finished[1] += len(rec.chunk_times)
                append(rec)
                _request_done(rec, live, state, stop, max_failures)

        n_workers = concurrency if requests is None else max(0, min(concurrency, requests))
        tasks = [asyncio.ensure_future(worker(w)) for w in range(n_workers)]
        cut_at: float | None = None
        watch: asyncio.Future[bool] | None = None
        if budget is not None or limit_at is not None:
            not_before = started + plan.min_duration_s

            async def watcher() -> bool:
                """Returns once the trial must be cut: True at the wall-clock limit, False
                once the token budget is in."""
                if budget is None:
                    assert limit_at is not None
                    await sleep_until(limit_at)
                    return True
                # Polled, not counted per chunk: the hot path stays a timestamp and a count.
                while True:
                    await asyncio.sleep(CUT_POLL_S)
                    now = perf_counter()
                    if limit_at is not None and now >= limit_at:
                        return True
                    if now < not_before:
                        continue
                    running = list(inflight.values())
                    reads = sum(len(r.chunk_times) for r in running)
                    per_read = _tokens_per_read(running, finished)
                    if finished[0] + reads * per_read >= budget:
                        return False

            watch = asyncio.ensure_future(watcher())
        over_limit = False
        done_all: asyncio.Future[Any] | None = None
        try:
            if watch is None:
                await asyncio.gather(*tasks)
            else:
                done_all = asyncio.ensure_future(asyncio.gather(*tasks))
                either: set[asyncio.Future[Any]] = {watch, done_all}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not done_all.done():
                    cut_at = perf_counter()
                    over_limit = watch.done() and not watch.cancelled() and watch.result()
                    for t in tasks:
                        t.cancel()
                await asyncio.gather(done_all, return_exceptions=True)
        finally:
            if watch is not None:
                watch.cancel()
            if done_all is not None:
                # Cancelled from outside (Ctrl-C, SIGTERM): the gather would end with its
                # children's CancelledError, never retrieved, and asyncio would print that
                # traceback ("_GatheringFuture exception was never retrieved") after the
                # clean stop.  Cancelled itself, it cancels the workers and ends quietly.
                done_all.cancel()
            for t in tasks:
                if not t.done():
                    t.cancel()
            if tasks:
                waited = [*tasks, done_all] if done_all is not None else tasks
                await asyncio.gather(*waited, return_exceptions=True)
        if cut_at is not None:
            for rec in inflight.values():
                rec.cut = True
                rec.end = cut_at
                if live is not None:
                    live.inflight.pop(rec.index, None)
                append(rec)
        return started, (stop[0] if stop else None), cut_at, over_limit

    async def run_trial(
        self, target: Target, plan: TrialPlan, live: LiveTrial | None = None
    ) -> TrialRecords:
        """Closed-loop trial: ``plan.concurrency`` requests in flight until the plan ends.

        ``live``, when given, is kept up to date for a progress display.
        """
        warm = await self.warm_up(target, plan)
        return await self.measure_closed(target, plan, live, warm=warm)

    async def warm_up(self, target: Target, plan: TrialPlan) -> list[RequestRecord]:
        """The plan's ``warmup`` requests, sent and awaited; not part of any measurement.

        Separate from :meth:`measure_closed` so that worker processes can all finish their
        warm-up before they agree on one start instant.
        """
        if plan.warmup <= 0:
            return []
        raise_nofile_limit(plan.concurrency + 256)
        warm: list[RequestRecord] = []
        await self._closed_loop(
            target,
            plan,
            concurrency=min(plan.concurrency, plan.warmup),
            requests=plan.warmup,
            deadline_after=None,
            max_failures=None,
            records=warm,
            warmup=True,
        )
        return warm

    async def measure_closed(
        self,
        target: Target,
        plan: TrialPlan,
        live: LiveTrial | None = None,
        *,
        warm: list[RequestRecord] | None = None,
        start_at: float | None = None,
    ) -> TrialRecords:
        """The measured part of a closed-loop trial (``plan.warmup`` is not sent here).

        ``start_at``: a ``perf_counter`` instant to start at (sharded trials); None: now.
        """
        raise_nofile_limit(plan.concurrency + 256)
        if start_at is not None:
            await sleep_until(start_at)
        async with _TrialBook.around(self.lag_interval_s) as book:
            started, stopped, cut_at, over_limit = await self._closed_loop(
                target,
                plan,
                concurrency=plan.concurrency,
                requests=plan.requests,
                deadline_after=plan.duration_s,
                max_failures=plan.max_failures,
                records=book.records,
                live=live,
                start_at=start_at,
            )
        return book.trial(
            started=started,
            stopped=stopped,
            concurrency=plan.concurrency,
            start_spread_s=_start_spread(book.records, started),
            warmup_records=warm or [],
            cut_at=cut_at,
            over_limit_s=plan.wall_limit_s if over_limit else None,
        )

    # ------------------------------------------------------------------------ open loop
    async def run_open_loop(
        self, target: Target, plan: OpenLoopPlan, live: LiveTrial | None = None
    ) -> TrialRecords:
        """Open-loop trial: each request is sent at its planned arrival, with no cap on how
        many are in flight (but ``plan.max_concurrency``); then all of them are awaited.

        ``record.scheduled`` is the planned arrival (under ``max_concurrency``, for an arrival
        that waited, the instant a slot freed: :func:`~pytest_kimi.load.openloop.queue_waits`
        gives the wait), ``record.sent`` the actual send and ``record.worker`` the arrival
        index.  ``TrialRecords.concurrency`` is the peak number
        in flight (:func:`peak_inflight` of the records).  Stops scheduling at the plan's end
        or at ``max_failures``.
        """
        return await self.measure_open(target, plan, live)

    async def measure_open(
        self,
        target: Target,
        plan: OpenLoopPlan,
        live: LiveTrial | None = None,
        *,
        offsets: Sequence[float] | None = None,
        indices: Sequence[int] | None = None,
        start_at: float | None = None,
    ) -> TrialRecords:
        """:meth:`run_open_loop` with an explicit schedule (a shard of a bigger one).

        ``offsets``: planned sends, seconds after the start (default: ``plan.arrivals()``);
        ``indices``: the global arrival index of each (default ``0..n-1``), which picks the
        body and becomes ``record.index``/``record.worker``; ``start_at``: ``perf_counter``
        instant of offset 0 (default: now).
        """
        if offsets is None:
            offsets = plan.arrivals()
        if indices is not None and len(indices) != len(offsets):
            raise ValueError("indices and offsets must have the same length")
        # nothing caps the number in flight (but the plan's max_concurrency): a socket each
        cap = plan.max_concurrency
        raise_nofile_limit((len(offsets) if cap is None else min(cap, len(offsets))) + 256)
        async with _TrialBook.around(self.lag_interval_s) as book:
            started, stopped, cut_at = await self._open_loop(
                target,
                plan,
                offsets,
                indices,
                records=book.records,
                live=live,
                start_at=start_at,
            )
        trial = book.trial(
            started=started,
            stopped=stopped,
            # in flight means between a record's ``sent`` and ``end`` stamps: counted from the
            # records (as the sharded client does), not by a counter around the task, which a
            # request enters before its send is stamped (the task has yet to run) and leaves
            # after its end is (the body's EOF is awaited after [DONE])
            concurrency=peak_inflight(book.records),
            start_spread_s=0.0,
            offered_rate=plan.rate,
            achieved_rate=achieved_rate(book.records),
            cut_at=cut_at,
            over_limit_s=plan.wall_limit_s if cut_at is not None else None,
        )
        trial.schedule_delay_p99_s = trial.send_delay_p99_s
        return trial

    async def _open_loop(
        self,
        target: Target,
        plan: OpenLoopPlan,
        offsets: Sequence[float],
        indices: Sequence[int] | None,
        *,
        records: list[RequestRecord],
        live: LiveTrial | None,
        start_at: float | None,
    ) -> tuple[float, str | None, float | None]:
        """One scheduler loop that sleeps until each arrival and launches one task for it.

        Returns (start time, stop reason, cut time).  Per arrival the scheduler only creates a
        record and a task: arrivals that are already due (a burst, or a loop that fell behind)
        all go out in one pass without yielding in between.  With ``plan.max_concurrency`` it
        first waits, when that many are in flight, until one ends (each request's end wakes
        it), so arrivals leave in order as slots free, each with a slot of its own.  At ``plan.wall_limit_s`` after the
        start no arrival is sent any more and every request in flight is cancelled; their
        records are kept, marked ``cut``, and the cut time is returned (None: no cut).
        """
        loop = asyncio.get_running_loop()
        session = self.session
        bodies = list(plan.bodies)
        nb = len(bodies)
        parts = split_at_slot(bodies, plan.unique_slot) if plan.unique_slot is not None else None
        base = plan.unique_base
        timeout_s = plan.timeout_s
        timeout = silence_timeout(timeout_s)
        max_failures = plan.max_failures
        stop: list[str] = []
        pending: set[asyncio.Task[None]] = set()
        state = {"failures": 0}
        waiter: list[asyncio.Future[None] | None] = [None]
        append = records.append
        flying: dict[int, RequestRecord] = {}
        cut: list[float] = []  # when the wall-clock limit cut the trial
        cap = plan.max_concurrency
        want_slot = [False]  # the scheduler waits for a request to end (max_concurrency)
        freed = [0.0]  # when the scheduler last got a slot it had waited for

        def over_limit() -> None:
            cut.append(perf_counter())
            w = waiter[0]
            if w is not None:
                _wake(w)
            for t in list(pending):
                t.cancel()

        async def one(rec: RequestRecord) -> None:
            i = rec.index  # the global arrival index, also in a worker process
            if parts is None:
                body = bodies[i % nb]
            else:
                head, tail = parts[i % nb]
                body = b"".join((head, unique_id(base + i), tail))
            await stream_request(
                session,
                target,
                body,
                index=i,
                worker=rec.worker,
                scheduled=rec.scheduled,
                timeout_s=timeout_s,
                timeout=timeout,
                record=rec,
            )
            del flying[i]
            append(rec)
            if _request_done(rec, live, state, stop, max_failures) or want_slot[0]:
                w = waiter[0]
                if w is not None:
                    _wake(w)  # a stop: do not sleep until the next arrival; or a slot freed

        started = perf_counter() if start_at is None else start_at
        if live is not None:
            live.started = started
        limit = None
        if plan.wall_limit_s is not None:
            limit = loop.call_later(started + plan.wall_limit_s - perf_counter(), over_limit)
        try:
            for p, off in enumerate(offsets):
                if stop or cut:
                    break
                due = started + off
                delay = due - perf_counter()
                if delay > 0:
                    # asyncio.sleep() without its extra frame, and wakeable by a stop
                    fut: asyncio.Future[None] = loop.create_future()
                    waiter[0] = fut
                    handle = loop.call_later(delay, _wake, fut)
                    try:
                        await fut
                    finally:
                        handle.cancel()
                        waiter[0] = None
                    if stop or cut:
                        break
                if cap is not None and len(flying) >= cap:
                    # every slot taken: wait for a request to end (vLLM's semaphore)
                    while len(flying) >= cap and not (stop or cut):
                        slot: asyncio.Future[None] = loop.create_future()
                        waiter[0] = slot
                        want_slot[0] = True
                        try:
                            await slot
                        finally:
                            waiter[0] = None
                            want_slot[0] = False
                    if stop or cut:
                        break
                    freed[0] = perf_counter()
                if freed[0] > due:
                    # held back behind the cap (this arrival, or the queue ahead of it, which
                    # several ends may free at once): it could leave once the slot freed, so
                    # its send delay is the client's alone and queue_waits() has the wait
                    due = freed[0]
                g = p if indices is None else indices[p]
                rec = RequestRecord(index=g, worker=g, scheduled=due)
                if live is not None:
                    live.inflight[g] = rec
                flying[g] = rec
                task = loop.create_task(one(rec))
                pending.add(task)
                task.add_done_callback(pending.discard)
            while pending:
                # the limit cancels the tasks in flight: their CancelledError is the cut, not
                # this coroutine's (a cancellation from outside still propagates from gather)
                results = await asyncio.gather(*list(pending), return_exceptions=True)
                for res in results:
                    if isinstance(res, BaseException) and not isinstance(
                        res, asyncio.CancelledError
                    ):
                        raise res
        finally:
            if limit is not None:
                limit.cancel()
            for t in list(pending):
                t.cancel()
            if pending:
                await asyncio.gather(*list(pending), return_exceptions=True)
        if not cut:
            return started, (stop[0] if stop else None), None
        for rec in flying.values():
            rec.cut = True
            rec.end = cut[0]
            if live is not None:
                live.inflight.pop(rec.index, None)
            append(rec)
        return started, (stop[0] if stop else None), cut[0]
