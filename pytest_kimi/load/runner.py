"""Closed-loop load runner: keep exactly C streamed requests in flight and record them.

Design choices and why:

* One ``aiohttp.ClientSession`` for the client's lifetime with an unlimited connector: the
  connector's own pool limit (100 by default) would silently cap concurrency, and a fresh
  session per trial would pay connection setup inside the measurement.
* Pure asyncio, no threads: C=512+ streams are just C tasks; the only per-stream costs are the
  socket and the SSE parser (see :mod:`.sse`).
* The runner only *measures* client saturation (event-loop lag, send delay, CPU); deciding
  that a trial is invalid because the client was the bottleneck is done downstream.
"""

from __future__ import annotations

import asyncio
import math
from array import array
from dataclasses import dataclass, field
from time import perf_counter, process_time
from typing import Sequence

import aiohttp

from ..records import RequestRecord
from .request import Target, silence_timeout, stream_request

try:  # POSIX only; elsewhere the default limit has to do
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

LAG_INTERVAL_S = 0.005
"""Sleep of the lag monitor: 200 wake-ups/s costs well under 1% of a core yet resolves the
few-millisecond stalls that show a saturated client."""


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

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not self.bodies:
            raise ValueError("bodies must not be empty")
        if self.requests is None and self.duration_s is None:
            raise ValueError("a TrialPlan needs requests or duration_s (or both)")
        if self.requests is not None and self.requests < 0:
            raise ValueError("requests must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")


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
    lag_samples: int = 0


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

    def approx_tokens(self) -> int:
        """Tokens of finished requests plus token-carrying blocks of the ones in flight."""
        return self.tokens + sum(len(r.chunk_times) for r in list(self.inflight.values()))


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
        self.samples: array = array("d")
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        interval = self.interval_s
        append = self.samples.append
        sleep = asyncio.sleep
        while True:
            t = perf_counter()
            await sleep(interval)
            append(perf_counter() - t - interval)

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


class LoadClient:
    """Owns the one HTTP session that sends every request of a test session.

    Use as ``async with LoadClient() as client: await client.run_trial(target, plan)``.  The
    session binds to the loop that enters the context manager.
    """

    def __init__(self, *, read_bufsize: int = 2**20, lag_interval_s: float = LAG_INTERVAL_S) -> None:
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
    ) -> tuple[float, str | None]:
        """Run C workers that each take the next index, send, await, repeat.

        Returns (start time, stop reason).  Workers stop taking indices when the count is
        reached, the deadline has passed, or ``max_failures`` requests failed.
        """
        session = self.session
        bodies = list(plan.bodies)
        nb = len(bodies)
        timeout = silence_timeout(plan.timeout_s)
        timeout_s = plan.timeout_s
        state = {"next": 0, "failures": 0}
        stop: list[str] = []
        started = perf_counter()
        deadline = None if deadline_after is None else started + deadline_after
        append = records.append
        if live is not None:
            live.started = started

        async def worker(w: int) -> None:
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
                await stream_request(
                    session, target, bodies[i % nb],
                    index=i, worker=w, scheduled=scheduled, timeout_s=timeout_s, timeout=timeout,
                    record=rec,
                )
                append(rec)
                if live is not None:
                    del live.inflight[i]
                    live.done += 1
                    live.tokens += rec.completion_tokens
                    live.failed += rec.error is not None
                if rec.error is not None:
                    state["failures"] += 1
                    if max_failures is not None and state["failures"] >= max_failures and not stop:
                        stop.append(
                            f"max_failures reached: {state['failures']} requests failed "
                            f"(last: {rec.error[:160]})"
                        )

        n_workers = concurrency if requests is None else max(0, min(concurrency, requests))
        tasks = [asyncio.ensure_future(worker(w)) for w in range(n_workers)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        return started, (stop[0] if stop else None)

    async def run_trial(self, target: Target, plan: TrialPlan, live: LiveTrial | None = None) -> TrialRecords:
        """Closed-loop trial: ``plan.concurrency`` requests in flight until the plan ends.

        ``live``, when given, is kept up to date for a progress display.
        """
        raise_nofile_limit(plan.concurrency + 256)
        warm: list[RequestRecord] = []
        if plan.warmup > 0:
            await self._closed_loop(
                target, plan,
                concurrency=min(plan.concurrency, plan.warmup), requests=plan.warmup,
                deadline_after=None, max_failures=None, records=warm,
            )
        records: list[RequestRecord] = []
        monitor = _LagMonitor(self.lag_interval_s)
        monitor.start()
        cpu0 = process_time()
        try:
            started, stopped = await self._closed_loop(
                target, plan,
                concurrency=plan.concurrency, requests=plan.requests,
                deadline_after=plan.duration_s, max_failures=plan.max_failures, records=records,
                live=live,
            )
        finally:
            ended = perf_counter()
            cpu = process_time() - cpu0
            await monitor.stop()
        records.sort(key=lambda r: r.index)
        lags = list(monitor.samples)
        return TrialRecords(
            records=records,
            started=started,
            ended=ended,
            concurrency=plan.concurrency,
            loop_lag_max_s=max(lags, default=0.0),
            loop_lag_p99_s=_p99(lags),
            send_delay_p99_s=_p99([r.sent - r.scheduled for r in records if r.sent]),
            start_spread_s=_start_spread(records, started),
            client_cpu_s=cpu,
            stopped_early=stopped,
            warmup_records=warm,
            lag_samples=len(lags),
        )
