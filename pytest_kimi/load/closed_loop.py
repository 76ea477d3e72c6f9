"""The closed loop: C workers that each take the next request, send it, await its stream and
repeat, with the stationary protocol's staggered openers, its token-budget cut, multi-turn
conversations and the wall-clock limit.

On its own because it is the send loop of every closed-loop trial, in one event loop or in
each worker process of a sharded one; :class:`~pytest_kimi.load.runner.LoadClient` wraps it
with the warm-up and the trial's bookkeeping.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any, Sequence

import aiohttp

from pytest_kimi.load.conversation import Conversation, Conversations
from pytest_kimi.load.records import UNKNOWN_USAGE, RequestRecord
from pytest_kimi.load.request import Target, silence_timeout, stream_request
from pytest_kimi.load.request_ids import WARMUP_IDS, split_at_slot, unique_id
from pytest_kimi.load.sse_usage import running_usage
from pytest_kimi.load.trial import LiveTrial, TrialPlan
from pytest_kimi.load.trial_book import request_done, sleep_until

CUT_POLL_S = 0.01
"""How often a stationary trial checks its token budget: the cut lands within this of the
budget, and the measured window ends at the last whole step before it whatever the lag."""


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


async def closed_loop(
    session: aiohttp.ClientSession,
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
            request_done(rec, live, state, stop, max_failures)

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
