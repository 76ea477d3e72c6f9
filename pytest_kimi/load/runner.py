"""Load runner: closed loop (keep exactly C streamed requests in flight) and open loop
(send each request at its planned arrival, however many are in flight, or at most
``max_concurrency`` of them), recorded.

Design choices and why:

* One ``aiohttp.ClientSession`` for the client's lifetime with an unlimited connector: the
  connector's own pool limit (100 by default) would silently cap concurrency, and a fresh
  session per trial would pay connection setup inside the measurement.
* Pure asyncio, no threads: C=512+ streams are just C tasks; the only per-stream costs are the
  socket and the SSE parser (see :mod:`.sse`).
* The heap that exists when a trial starts is frozen while it runs (:mod:`.trial_book`).
* The runner only *measures* client saturation (event-loop lag, send delay, CPU); deciding
  that a trial is invalid because the client was the bottleneck is done downstream.

This module is the client that owns the HTTP session, and the open loop's scheduler; a trial's
data is in :mod:`.trial`, the request ids in :mod:`.request_ids`, the closed loop's send loop in
:mod:`.closed_loop`, the bookkeeping both loops share in :mod:`.trial_book`.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Sequence

import aiohttp

from pytest_kimi.load.closed_loop import closed_loop
from pytest_kimi.load.openloop import OpenLoopPlan
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target, silence_timeout, stream_request
from pytest_kimi.load.request_ids import split_at_slot, unique_id
from pytest_kimi.load.trial import LiveTrial, TrialPlan, TrialRecords
from pytest_kimi.load.trial_book import (
    LAG_INTERVAL_S,
    TrialBook,
    _start_spread,
    achieved_rate,
    peak_inflight,
    raise_nofile_limit,
    request_done,
    sleep_until,
)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


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
        await closed_loop(
            self.session,
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
        async with TrialBook.around(self.lag_interval_s) as book:
            started, stopped, cut_at, over_limit = await closed_loop(
                self.session,
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
        async with TrialBook.around(self.lag_interval_s) as book:
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
            if request_done(rec, live, state, stop, max_failures) or want_slot[0]:
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
