"""One trial of a level (:func:`run_trial`): its plan (stationary, whole requests or open
loop), its wall-clock limit, the client's run and the summary with its checks; and the test's
warm-up requests (:func:`warm_up`), a one-off trial of short requests.

On its own because the level loop (:mod:`.trials`), the warm-up until stationary
(:mod:`.warm`, through a callable) and the capacity search all run trials this way.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

from pytest_kimi.load.openloop import OpenLoopPlan, queue_waits
from pytest_kimi.load.trial import LiveTrial, TrialClient, TrialPlan, TrialRecords
from pytest_kimi.workload.workload_spec import STATIONARY, LevelSpec, Workload
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, summarize_trial
from pytest_kimi.measure.measure_spec import MeasureSpec, rotated
from pytest_kimi.measure.pace import Pace
from pytest_kimi.measure.trial_limits import (
    OVER_LIMIT,
    TIMEOUT_SOURCE,
    TrialLimit,
    box_min_s,
    stationary_box,
    trial_limit,
)

WARMUP_MAX_TOKENS = 16


def _warmup_bodies(bodies: list[bytes], count: int = 2) -> list[bytes]:
    out = []
    for raw in bodies[:count]:
        body = json.loads(raw)
        body["max_tokens"] = WARMUP_MAX_TOKENS
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


def _signals(tr: TrialRecords) -> ClientSignals:
    wall = max(tr.ended - tr.started, 1e-9)
    return ClientSignals(
        loop_lag_max_s=tr.loop_lag_max_s,
        loop_lag_p99_s=tr.loop_lag_p99_s,
        send_delay_p99_s=tr.send_delay_p99_s,
        # the busiest client process: a sharded client's workers each have a core of their own
        cpu_share=max((sh.client_cpu_s for sh in tr.shards), default=tr.client_cpu_s) / wall,
        lag_times=tr.lag_times,
        lag_values=tr.lag_values,
    )


def _max_failures(workload: Workload, requests: int | None, concurrency: int) -> int:
    """A dead server must not be hammered: stop starting requests past the allowed failures."""
    budget = requests if requests is not None else 10 * concurrency
    return max(1, int(workload.max_error_rate * budget)) + concurrency


def _in_flight(level: LevelSpec, clock: float = 1.0) -> int:
    """Requests in flight to allow for when bounding failures (open loop: ~1 wall second of
    arrivals)."""
    if level.concurrency is not None:
        return level.concurrency
    return max(1, round((level.rate or 1) * clock))


async def run_trial(
    client: TrialClient,
    spec: MeasureSpec,
    level: LevelSpec,
    index: int,
    offset: int,
    live: LiveTrial | None = None,
    previous_s: float | None = None,
) -> TrialResult:
    """One trial of ``level``; ``previous_s``: the wall length of the level's fastest trial
    before (it sizes this one's wall-clock limit,
    :func:`~pytest_kimi.measure.trial_limits.trial_limit`)."""
    w = spec.send.workload
    requests = w.requests_for(level)
    duration_s = w.duration_s / spec.send.clock if w.duration_s is not None else None
    bodies = rotated(spec.send.bodies_for(level), offset)
    max_failures = _max_failures(w, requests, _in_flight(level, spec.send.clock))
    limit = trial_limit(spec, level, previous_s)
    limit_s = limit.limit_s
    box = stationary_box(level, spec.state.pace)  # before the trial: its pace is the trials' before
    if level.concurrency is not None and w.protocol_for(level, spec.send.protocol) == STATIONARY:
        c = level.concurrency
        first, first_max = spec.send.stationary_openers(level, offset)
        plan = TrialPlan(
            concurrency=c,
            bodies=bodies,
            timeout_s=w.timeout_s,
            max_failures=_max_failures(w, None, c),
            first_bodies=first,
            first_max_tokens=first_max,
            # the first step's tokens come before every stream is in, and the window starts
            # once the start-up backlog has settled
            token_budget=box.token_budget(c),
            min_duration_s=box_min_s(box, spec.watch.min_window_s),
            wall_limit_s=limit_s,
            **spec.next_unique(),
        )
        tr = await client.run_trial(spec.send.target, plan, live)
    elif level.concurrency is not None:
        plan = TrialPlan(
            concurrency=level.concurrency,
            bodies=bodies,
            requests=requests,
            duration_s=duration_s,
            timeout_s=w.timeout_s,
            max_failures=max_failures,
            warmup=0,
            turns=w.turns,
            wall_limit_s=limit_s,
            **spec.next_unique(),
        )
        tr = await client.run_trial(spec.send.target, plan, live)
    else:
        open_plan = OpenLoopPlan(
            rate=(level.rate or 1.0) * spec.send.clock,
            bodies=bodies,
            requests=requests,
            duration_s=duration_s,
            timeout_s=w.timeout_s,
            max_failures=max_failures,
            seed=w.seed + index,
            burstiness=w.burstiness,
            max_concurrency=w.max_concurrency,
            wall_limit_s=limit_s,
            **spec.next_unique(),
        )
        tr = await client.run_open_loop(spec.send.target, open_plan, live)
        if open_plan.max_concurrency is not None:
            spec.state.queue_waits[(level, index)] = queue_waits(
                tr.records, open_plan.arrivals(), tr.started
            )
    lengths = spec.send.lengths_for(level)
    trial = summarize_trial(
        index,
        level,
        tr,
        client=_signals(tr),
        ignore_eos=w.ignore_eos and lengths is None,
        settle_steps=box.settle_steps,
    )
    if lengths is not None and w.ignore_eos:
        check_own_lengths(trial, rotated(lengths, offset))
    if (over := limit.reason(tr)) is not None:
        trial.invalid.append(over)
    spec.state.pace = Pace.of(tr) or spec.state.pace
    return trial


def check_own_lengths(trial: TrialResult, lengths: Sequence[int]) -> None:
    """The ``ignore_eos`` check where every body has its own ``max_tokens`` (a dataset, or
    ``range_ratio``'s draws): request ``g`` (its global index) sent body ``g % len(lengths)``
    of the trial's rotated list, so it must have returned exactly that many tokens (a
    stationary opener: its record's own ``max_tokens``)."""
    # a stationary stream's first request has its own, shorter max_tokens (on its record)
    short = [
        (r.completion_tokens, want)
        for r in trial.records
        if r.ok
        and not r.cut
        and r.completion_tokens != (want := r.max_tokens or lengths[r.index % len(lengths)])
    ]
    if short:
        got, asked = short[0]
        trial.invalid.append(
            f"{len(short)} request(s) returned a token count other than their own max_tokens "
            f"under ignore_eos (first: {got} for max_tokens={asked}): the server ignores "
            "ignore_eos, or the context length truncates"
        )


async def warm_up(client: TrialClient, spec: MeasureSpec) -> list[str]:
    """Short requests that absorb one-time costs (JIT, CUDA graphs) and put each shared-prefix
    group's system prompt in the server's cache; their errors are returned."""
    n = spec.send.workload.warmup
    if n <= 0:
        return []
    first = next(iter(spec.send.bodies.values()))
    if spec.send.warmup_bodies > 2:
        n = max(n, spec.send.warmup_bodies)  # one request per shared-prefix group at least
    plan = TrialPlan(
        concurrency=min(n, 8),
        bodies=_warmup_bodies(first, spec.send.warmup_bodies),
        requests=n,
        duration_s=None,
        timeout_s=spec.send.workload.timeout_s,
        max_failures=n,
        warmup=0,
        # no pace known yet: each of a slot's requests may take up to the request timeout
        wall_limit_s=TrialLimit(
            math.ceil(n / min(n, 8)) * spec.send.workload.timeout_s, TIMEOUT_SOURCE, 1
        ).limit_s,
        **spec.next_unique(),
    )
    tr = await client.run_trial(spec.send.target, plan)
    spec.state.pace = Pace.of(tr) or spec.state.pace
    errors = [r.error for r in tr.records if r.error]
    if tr.over_limit_s is not None:
        errors.append(f"the warm-up {OVER_LIMIT} of {tr.over_limit_s:.1f} s")
    return errors
