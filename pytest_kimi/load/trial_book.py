"""The bookkeeping every trial shares, whatever sends its requests: the event-loop lag monitor,
the client's CPU time and the frozen heap around the send loop, the live counters and failure
count as each request ends, and the saturation figures (p99 send delay, start spread, peak in
flight, achieved rate) computed from the records once the loop is done.

On its own because the closed loop, the open loop and the sharded client all use it, and
none of it runs per chunk.

The heap that exists when a trial starts is frozen (``gc.freeze``) while it runs: a full
collection of a big pytest process (every module, fixture and earlier report) stalls the
event loop for tens of milliseconds, which shows as late timestamps and as event-loop lag.
Objects the trial makes are still collected as usual.
"""

from __future__ import annotations

import asyncio
import gc
import math
from array import array
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from time import perf_counter, process_time
from typing import Any, AsyncIterator, Sequence

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import LiveTrial, TrialRecords

try:  # POSIX only; elsewhere the default limit has to do
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

LAG_INTERVAL_S = 0.005
"""Sleep of the lag monitor: 200 wake-ups/s costs well under 1% of a core yet resolves the
few-millisecond stalls that show a saturated client."""


def request_done(
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
class TrialBook:
    """The timing bookkeeping every trial shares, whatever sends its requests: the lag monitor,
    the client's CPU time and the frozen heap around the send loop, then the records sorted and
    the saturation figures computed once the loop is done (nothing of this runs per chunk)."""

    monitor: _LagMonitor
    records: list[RequestRecord] = field(default_factory=list)
    ended: float = 0.0
    cpu_s: float = 0.0

    @classmethod
    @asynccontextmanager
    async def around(cls, lag_interval_s: float) -> AsyncIterator[TrialBook]:
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
