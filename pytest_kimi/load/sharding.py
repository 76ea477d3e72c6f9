"""How a trial is split over N load workers, and their records merged back into one.

Stands on its own because it is pure: the arithmetic of shares (concurrency, requests,
warm-up, prompt ids, an open-loop schedule dealt round-robin) and the merge of the parts
touch no process or pipe, so they are read and tested without spawning a worker.
:class:`~pytest_kimi.load.workers.ShardedClient` sends the shards and merges the answers.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, replace
from typing import Literal, Sequence

from pytest_kimi.load.openloop import OpenLoopPlan, deal
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target
from pytest_kimi.load.trial import ShardSummary, TrialPlan, TrialRecords
from pytest_kimi.load.trial_book import _p99, _start_spread, achieved_rate, peak_inflight

Kind = Literal["closed", "open"]


def split_even(total: int, parts: int) -> list[int]:
    """``total`` as evenly as possible over ``parts``, earlier parts taking the remainder."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    q, r = divmod(max(0, total), parts)
    return [q + (k < r) for k in range(parts)]


def split_proportional(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties to earlier parts).

    Why proportional for requests: in a closed loop a worker's throughput is proportional to
    its slots, so a worker with 3 slots and half the requests would still be busy after its
    2-slot sibling finished, and the trial's tail would run at the wrong concurrency.
    """
    wsum = sum(weights)
    if wsum <= 0:
        return [0 for _ in weights]
    exact = [total * w / wsum for w in weights]
    out = [math.floor(x) for x in exact]
    left = total - sum(out)
    order = sorted(range(len(weights)), key=lambda k: (-(exact[k] - out[k]), k))
    for k in order[:left]:
        out[k] += 1
    return out


def interleave(counts: Sequence[int], weights: Sequence[int]) -> list[list[int]]:
    """Global indices ``0..sum(counts)-1`` assigned to parts in the order they would be sent.

    Part ``k`` sends its ``i``-th request around ``(i + 0.5) / weights[k]`` (in units of one
    request duration); sorting all of them by that time gives each its global index.  With
    equal weights this is plain round-robin: part ``k``'s ``i``-th request is ``i * n + k``.
    """
    keyed = [((i + 0.5) / weights[k], k, i) for k in range(len(counts)) for i in range(counts[k])]
    keyed.sort()
    out: list[list[int]] = [[0] * c for c in counts]
    for g, (_, k, i) in enumerate(keyed):
        out[k][i] = g
    return out


@dataclass(slots=True)
class Job:
    """One worker's share of a trial, as sent to it."""

    kind: Kind
    target: Target
    plan: TrialPlan | OpenLoopPlan
    offsets: list[float] | None = None
    """Open loop: this worker's planned sends (seconds after the start)."""
    indices: list[int] | None = None
    """Open loop: the global arrival index of each of them."""


@dataclass(slots=True)
class Shard:
    """A job plus what the parent needs to map the worker's records back."""

    worker: int
    job: Job
    first_slot: int = 0
    table: list[int] | None = None
    """Closed loop with a request count: local request ``i`` is global index ``table[i]``."""
    stride: int = 1
    pos: int = 0
    """Closed loop without a count: local ``i`` is global ``i * stride + pos``."""
    warm_offset: int = 0

    def global_index(self, i: int) -> int:
        if self.job.kind == "open":
            return i
        if self.table is not None:
            return self.table[i]
        return i * self.stride + self.pos


def shard_closed(target: Target, plan: TrialPlan, n: int) -> list[Shard]:
    """Split a closed-loop plan over ``n`` workers (only those with something to do)."""
    bodies = list(plan.bodies)
    nb = len(bodies)
    conc = split_even(plan.concurrency, n)
    slots = [sum(conc[:k]) for k in range(n)]
    active = [k for k in range(n) if conc[k] > 0]
    weights = [conc[k] for k in active]
    reqs: list[int | None]
    tables: list[list[int] | None]
    if plan.requests is not None:
        counts = split_proportional(plan.requests, weights)
        tables = list(interleave(counts, weights))
        reqs = list(counts)
        keep = [j for j, c in enumerate(counts) if c > 0] or [0]
    else:
        reqs = [None] * len(active)
        tables = [None] * len(active)
        keep = list(range(len(active)))
    active = [active[j] for j in keep]
    weights = [weights[j] for j in keep]
    reqs = [reqs[j] for j in keep]
    tables = [tables[j] for j in keep]
    warm = split_proportional(plan.warmup, weights)
    total_w = sum(weights)
    shards: list[Shard] = []
    for pos, k in enumerate(active):
        c = conc[k]
        table = tables[pos]
        if table is not None:
            wbodies = [bodies[g % nb] for g in table] or bodies[:1]
        else:
            stride = len(active)
            # local i must use bodies[(i * stride + pos) % nb]; that repeats every nb requests
            wbodies = [bodies[(i * stride + pos) % nb] for i in range(nb)]
        mf = (
            None
            if plan.max_failures is None
            else max(1, math.ceil(plan.max_failures * c / total_w))
        )
        # unique prompt ids follow the global index: table[i], or i * stride + pos
        # stationary: each process opens its own streams' staggered first requests, and cuts
        # at its share of the token budget (the window ends before the earliest cut)
        first = slots[k], slots[k] + c
        wplan = replace(
            plan,
            concurrency=c,
            bodies=wbodies,
            requests=reqs[pos],
            max_failures=mf,
            warmup=warm[pos],
            id_table=table,
            id_stride=len(active),
            id_offset=pos,
            first_bodies=None if plan.first_bodies is None else plan.first_bodies[slice(*first)],
            first_max_tokens=(
                None if plan.first_max_tokens is None else plan.first_max_tokens[slice(*first)]
            ),
            token_budget=(
                None
                if plan.token_budget is None
                else max(1, math.ceil(plan.token_budget * c / total_w))
            ),
        )
        shards.append(
            Shard(
                worker=k,
                job=Job("closed", target, wplan),
                first_slot=slots[k],
                table=table,
                stride=len(active),
                pos=pos,
                warm_offset=sum(warm[:pos]),
            )
        )
    return shards


def shard_open(target: Target, plan: OpenLoopPlan, n: int) -> list[Shard]:
    """Deal one open-loop schedule over ``n`` workers (only those with arrivals).

    ``max_concurrency``: split over the workers (their caps sum to it, each at least 1, so
    no more workers than slots): each waits for a slot of its own share, so the trial never
    has more in flight than the cap, though an arrival may wait while another worker has one
    free (vLLM's single semaphore would send it)."""
    offsets = plan.arrivals()
    cap = plan.max_concurrency
    if cap is not None:
        n = max(1, min(n, cap))
    caps = split_even(cap, n) if cap is not None else None
    dealt = deal(offsets, n)
    active = [k for k in range(n) if dealt[k][0]] or [0]
    shards = []
    for k in active:
        idx, offs = dealt[k]
        mf = (
            None
            if plan.max_failures is None
            else max(1, math.ceil(plan.max_failures / len(active)))
        )
        wplan = replace(
            plan,
            rate=plan.rate / n,
            requests=len(offs),
            max_failures=mf,
            seed=plan.seed + k,
            max_concurrency=None if caps is None else caps[k],
        )
        shards.append(Shard(worker=k, job=Job("open", target, wplan, offs, idx)))
    return shards


def merge(
    kind: Kind, plan: TrialPlan | OpenLoopPlan, parts: Sequence[tuple[Shard, int, TrialRecords]]
) -> TrialRecords:
    """One :class:`TrialRecords` from the workers' parts (``(shard, pid, records)``)."""
    records: list[RequestRecord] = []
    warm: list[RequestRecord] = []
    summaries: list[ShardSummary] = []
    for shard, pid, tr in parts:
        for r in tr.records:
            r.index = shard.global_index(r.index)
            if kind == "closed":
                r.worker += shard.first_slot
        for r in tr.warmup_records:
            r.index += shard.warm_offset
            r.worker += shard.first_slot
        records.extend(tr.records)
        warm.extend(tr.warmup_records)
        summaries.append(
            ShardSummary(
                shard=shard.worker,
                pid=pid,
                concurrency=tr.concurrency,
                requests=shard.job.plan.requests,
                first_slot=shard.first_slot,
                records=len(tr.records),
                client_cpu_s=tr.client_cpu_s,
                loop_lag_max_s=tr.loop_lag_max_s,
                loop_lag_p99_s=tr.loop_lag_p99_s,
                stopped_early=tr.stopped_early,
            )
        )
    records.sort(key=lambda r: r.index)
    warm.sort(key=lambda r: r.index)
    trs = [tr for _, _, tr in parts]
    started = min(tr.started for tr in trs)
    delays = [r.sent - r.scheduled for r in records if r.sent]
    delay_p99 = _p99(delays)
    out = TrialRecords(
        records=records,
        started=started,
        ended=max(tr.ended for tr in trs),
        concurrency=plan.concurrency if isinstance(plan, TrialPlan) else peak_inflight(records),
        loop_lag_max_s=max(tr.loop_lag_max_s for tr in trs),
        loop_lag_p99_s=max(tr.loop_lag_p99_s for tr in trs),
        send_delay_p99_s=delay_p99,
        start_spread_s=_start_spread(records, started) if kind == "closed" else 0.0,
        client_cpu_s=sum(tr.client_cpu_s for tr in trs),
        stopped_early=next((tr.stopped_early for tr in trs if tr.stopped_early), None),
        warmup_records=warm,
        cut_at=min((tr.cut_at for tr in trs if tr.cut_at is not None), default=None),
        over_limit_s=next((tr.over_limit_s for tr in trs if tr.over_limit_s is not None), None),
        lag_samples=sum(tr.lag_samples for tr in trs),
        lag_times=array("d", [t for tr in trs for t in tr.lag_times]),
        lag_values=array("d", [v for tr in trs for v in tr.lag_values]),
        shards=summaries,
    )
    if isinstance(plan, OpenLoopPlan):
        out.offered_rate = plan.rate
        out.achieved_rate = achieved_rate(records)
        out.schedule_delay_p99_s = delay_p99
    return out
