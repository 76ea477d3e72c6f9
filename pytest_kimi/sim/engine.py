"""Continuous-batching engine of the simulator: pure asyncio, no HTTP.

One module above 700 lines on purpose: the step loop, the sequences it advances and the
queue it admits from share one schedule and its invariants (a step's tokens, its due time,
the counters the truth endpoint reports); split, each part would reach into the others'
state on every step of the hot loop.

One background task runs decode steps on an *absolute-deadline* schedule: step ``k+1`` is
due at the due time of step ``k`` plus its duration, never at "now plus duration".  Timer
wake-ups in asyncio are late by up to a millisecond (epoll timeouts are whole
milliseconds), and a relative schedule would add that lateness to every step and bias the
rate low; with absolute deadlines a late step is followed by an early (immediate) one and
the average rate is exactly the profile's.  When nothing runs the task waits on a future,
so an idle server burns no CPU, and the schedule restarts from "now" on the next arrival.

Per-token cost matters (at speed=10 and 256 streams the engine hands out ~15,000 tokens/s
on a shared 2-core machine), so a step only bumps an integer per sequence and resolves the
sequence's waiter future if its consumer is waiting.  Consumers read however many tokens
accumulated since they last looked, so a consumer that falls behind catches up in one
write instead of one wake-up per token.  When the loop is behind schedule the engine runs
the overdue steps back to back without yielding, which turns that into a self-regulating
batching: an overloaded server writes more tokens per send until it has caught up.

Prefix cache (SGLang's radix cache, on by default there): a bounded set of prompt prefixes,
matched in pages of :data:`RADIX_PAGE_TOKENS` tokens (a token being 4 bytes of prompt, as the
simulator counts them).  An admitted sequence's cached tokens cost nothing in its prefill
step; at least one token is always computed (SGLang limits a match to ``len - 1``:
``sglang/srt/managers/schedule_batch.py``, ``Req._compute_max_prefix_len``).  Prefixes enter
the cache when their prefill step starts, so sequences admitted in the same step do not hit
each other, and the least recently used pages leave it past :data:`RADIX_MAX_PAGES`.  The
profile's ``disable_radix_cache`` turns it off (SGLang's ``--disable-radix-cache``).
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_right
import math
import random
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum

from pytest_kimi.sim.config import SimConfig

__all__ = [
    "SeqState",
    "Sequence",
    "EngineStats",
    "SimEngine",
    "EngineNotRunning",
    "prefix_pages",
    "RADIX_PAGE_TOKENS",
    "RADIX_MAX_PAGES",
]

RADIX_PAGE_TOKENS = 16
"""Granularity of a prefix match, in tokens (4 prompt bytes each)."""
RADIX_MAX_PAGES = 65_536
"""Pages the cache holds (about a million tokens) before the least recently used leave."""
_PAGE_BYTES = 4 * RADIX_PAGE_TOKENS


def prefix_pages(data: bytes) -> tuple[int, ...]:
    """One key per whole page of a prompt, each naming the prompt *up to* that page.

    Chained hashes: page ``k``'s key depends on every byte before it, so two prompts share
    key ``k`` only when they share their first ``k + 1`` pages (up to a hash collision, which a
    simulator can afford).  Computed by the request handler, not in the step loop.
    """
    data += b"\0" * (-len(data) % 4)  # a last partial token is a token, as it is counted
    keys = []
    h = 0
    for at in range(0, len(data) - _PAGE_BYTES + 1, _PAGE_BYTES):
        h = hash((h, data[at : at + _PAGE_BYTES]))
        keys.append(h)
    return tuple(keys)


class EngineNotRunning(RuntimeError):
    """A request was submitted while the engine task is not running."""


class SeqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PARKED = "parked"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class Sequence:
    """One generation request as the engine sees it.

    ``generated`` only ever grows; consumers remember how many tokens they already
    forwarded and call :meth:`wait_progress` with that count.
    """

    rid: int
    prompt_tokens: int
    max_tokens: int
    target: int
    """Tokens this sequence will produce: ``max_tokens``, or less when it hits an "EOS"."""
    finish_reason: str
    """``"length"`` or ``"stop"``, known in advance since the length is predetermined."""
    stall_at: int | None = None
    stall_s: float = 0.0
    prefix_keys: tuple[int, ...] = ()
    """:func:`prefix_pages` of the prompt (empty: nothing to match or cache)."""
    cached_tokens: int = 0
    """Prompt tokens the prefix cache served at admission (they cost no prefill)."""
    generated: int = 0
    state: SeqState = SeqState.WAITING
    checkpoint: int = 0
    """Next token count at which the step loop must look closer (finish or stall)."""
    submitted_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    _waiter: asyncio.Future[None] | None = field(default=None, repr=False)
    _done_fut: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.state is SeqState.FINISHED or self.state is SeqState.ABORTED

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def wait_progress(self, seen: int) -> None:
        """Return once more than ``seen`` tokens exist or the sequence has ended."""
        if self.generated > seen or self.done:
            return
        w = self._waiter
        if w is None or w.done():
            w = asyncio.get_running_loop().create_future()
            self._waiter = w
        await w

    async def wait_done(self) -> None:
        """Return when the sequence finished or was aborted (one wake-up, not per token)."""
        if self.done:
            return
        if self._done_fut is None:
            self._done_fut = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._done_fut)

    def _set_done(self) -> None:
        f = self._done_fut
        if f is not None and not f.done():
            f.set_result(None)
        self._wake()


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counter snapshot; differences of two snapshots give exact server-side rates."""

    now: float
    """Engine clock (``loop.time()``, monotonic seconds) when the snapshot was taken."""
    uptime_s: float
    generated_tokens: int
    prompt_tokens: int
    requests_received: int
    requests_started: int
    requests_finished: int
    requests_failed: int
    """Sequences aborted (client gone, injected disconnect, shutdown) plus injected 500s."""
    errors_injected: int
    steps: int
    running: int
    waiting: int
    parked: int
    late_steps: int
    """Steps whose due time had already passed when the previous one ended."""
    max_lag_s: float
    """Largest lateness of a step's delivery behind its due time (timer slack included)."""
    schedule_resets: int
    """Times the engine was over 1 s behind and dropped the debt: the rate was not kept."""
    noise_factor: float
    cached_prompt_tokens: int = 0
    """Prompt tokens served from the prefix cache (included in ``prompt_tokens``)."""
    cache_flushes: int = 0
    busy_s: float = 0.0
    """Model time the engine spent stepping, in the simulator's own clock (wall seconds times
    ``speed``): what the load cost a deployment that steps as fast as the profile says."""


class SimEngine:
    """Runs the batching loop for one :class:`SimConfig`.

    Create it anywhere, :meth:`start` it inside the event loop that will serve requests,
    :meth:`submit` sequences and consume their tokens, :meth:`stop` it at shutdown.
    """

    def __init__(self, profile: SimConfig) -> None:
        self.profile = profile
        self.noise_factor = profile.noise_factor
        self._jitter_rng = random.Random(f"{profile.seed}/jitter")
        self._eos_rng = random.Random(f"{profile.seed}/eos")
        self._error_rng = random.Random(f"{profile.seed}/errors")
        # Step durations per batch size, noise included; the hot loop indexes this list
        # instead of computing a power per step.
        self._step_s = [
            profile.step_time(b) * self.noise_factor
            for b in range(profile.max_running_requests + 1)
        ]
        self._prefill_s = profile.prefill_time(1) * self.noise_factor
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._resumed: list[Sequence] = []
        self._parked: set[Sequence] = set()
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: _PreciseTimer | None = None
        self._next_rid = 0
        self.started_at = 0.0
        self._radix: OrderedDict[int, None] | None = (
            None if profile.disable_radix_cache else OrderedDict()
        )
        # counters
        self.generated_tokens = 0
        self.finished_generated_tokens = 0
        """Generated tokens of finished requests only: what SGLang's counter shows."""
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.cache_flushes = 0
        self.flush_pending = False
        """A ``/flush_cache`` is waiting for the scheduler to become idle (one at a time)."""
        self.requests_received = 0
        self.requests_started = 0
        self.requests_finished = 0
        self.requests_failed = 0
        self.errors_injected = 0
        self.steps = 0
        self.busy_wall_s = 0.0
        """Sum of the scheduled step durations (wall seconds)."""
        self.step_ends: array[float] = array("d")
        self.step_tokens: array[int] = array("I")
        """When each step delivered (engine clock, the same CLOCK_MONOTONIC as the client's
        ``perf_counter``) and how many tokens: the truth for any window a client measured."""
        self.step_lags: array[float] = array("d")
        """How late each step ended behind its schedule (0 when on time): a step late by half a
        step or more ran back to back with the next one, whose tokens a client then reads in
        one burst (:meth:`edge_lag`)."""
        self.late_steps = 0
        self.max_lag_s = 0.0
        self.schedule_resets = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the step task in the running loop (idempotent)."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.started_at = self._loop.time()
        self._timer = _PreciseTimer(self._loop)
        self._task = self._loop.create_task(self._run(), name="pytest-kimi-sim-engine")

    async def stop(self) -> None:
        """Cancel the step task and abort everything still queued or running."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.close()
        pending = [*self._waiting, *self._running, *self._resumed, *self._parked]
        self._waiting.clear()
        self._running.clear()
        self._resumed.clear()
        self._parked.clear()
        for seq in pending:
            self._end(seq, SeqState.ABORTED)

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def time(self) -> float:
        """The engine clock (the loop's monotonic time)."""
        loop = self._loop or asyncio.get_running_loop()
        return loop.time()

    def uptime_s(self) -> float:
        return self.time() - self.started_at

    # ------------------------------------------------------------------ requests

    def inject_error(self) -> bool:
        """Decide (deterministically from the seed, in arrival order) whether the next
        generation request is failed with HTTP 500; counts it when so."""
        rate = self.profile.error_rate
        if rate <= 0.0:
            return False
        if self._error_rng.random() < rate:
            self.errors_injected += 1
            self.requests_failed += 1
            return True
        return False

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        ignore_eos: bool = True,
        faults: bool = True,
        prefix_keys: tuple[int, ...] = (),
    ) -> Sequence:
        """Queue a sequence; it is admitted at the next step boundary in FIFO order.

        With ``ignore_eos=False`` the answer ends at a pseudo-random length drawn from the
        seed (mean ``eos_mean_tokens``), like a model that stops when it is done talking;
        if that length reaches ``max_tokens`` it ends by length as usual.  ``faults=False``
        exempts internal requests (``/health_generate``) from the stall knob.
        ``prefix_keys``: the prompt's :func:`prefix_pages`, for the prefix cache.
        """
        if not self.is_running or self._loop is None:
            raise EngineNotRunning("the simulator engine is not running")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        target, reason = max_tokens, "length"
        if not ignore_eos:
            mean = self.profile.eos_mean_tokens
            eos_len = (
                1 + int(self._eos_rng.expovariate(1.0 / max(mean - 1.0, 1e-9))) if mean > 1.0 else 1
            )
            if eos_len < max_tokens:
                target, reason = eos_len, "stop"
        stall_at = self.profile.stall_after_tokens if faults else None
        if stall_at is not None and (stall_at >= target or self.profile.stall_s <= 0.0):
            stall_at = None
        seq = Sequence(
            rid=self._next_rid,
            prompt_tokens=max(int(prompt_tokens), 0),
            max_tokens=max_tokens,
            target=target,
            finish_reason=reason,
            stall_at=stall_at,
            stall_s=self.profile.stall_s,
            prefix_keys=prefix_keys,
            submitted_at=self._loop.time(),
        )
        seq.checkpoint = target if stall_at is None else stall_at
        self._next_rid += 1
        self.requests_received += 1
        self._waiting.append(seq)
        self._kick()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away (frees its slot at once)."""
        if seq.done:
            return
        if seq.state is SeqState.WAITING:
            try:
                self._waiting.remove(seq)
            except ValueError:
                pass
        elif seq.state is SeqState.RUNNING:
            try:
                self._running.remove(seq)
            except ValueError:
                pass
            try:
                self._resumed.remove(seq)
            except ValueError:
                pass
        elif seq.state is SeqState.PARKED:
            self._parked.discard(seq)
        self._end(seq, SeqState.ABORTED)
        self._kick()

    def stats(self) -> EngineStats:
        now = self.time()
        return EngineStats(
            now=now,
            uptime_s=now - self.started_at,
            generated_tokens=self.generated_tokens,
            prompt_tokens=self.prompt_tokens,
            requests_received=self.requests_received,
            requests_started=self.requests_started,
            requests_finished=self.requests_finished,
            requests_failed=self.requests_failed,
            errors_injected=self.errors_injected,
            steps=self.steps,
            running=len(self._running) + len(self._resumed),
            waiting=len(self._waiting),
            parked=len(self._parked),
            late_steps=self.late_steps,
            max_lag_s=self.max_lag_s,
            schedule_resets=self.schedule_resets,
            noise_factor=self.noise_factor,
            cached_prompt_tokens=self.cached_prompt_tokens,
            cache_flushes=self.cache_flushes,
            busy_s=self.busy_wall_s * self.profile.speed,
        )

    def truth(self, start: float, end: float) -> tuple[int, int, float]:
        """The steps a client window ``[start, end)`` holds, as the engine timed them.

        A client reads a step's tokens a moment after the engine delivers them, so the window's
        first read belongs to the last step delivered at or before ``start``, and likewise for
        ``end``.  Returns the tokens of the steps from the first up to (not including) the one
        at ``end``, their number, and the engine's time between those two steps: tokens / time
        is the true rate of exactly the steps the client counted."""
        lo = max(bisect_right(self.step_ends, start) - 1, 0)
        hi = max(bisect_right(self.step_ends, end) - 1, lo)
        span = self.step_ends[hi] - self.step_ends[lo] if hi > lo else 0.0
        return int(sum(self.step_tokens[lo:hi])), hi - lo, span

    def tokens_between(self, start: float, end: float) -> float:
        """The tokens the engine generated between two instants, each step's tokens spread
        over its duration (the engine delivers them at its end): the truth of a window whose
        ends are not on steps (a stationary trial's), like the client's own
        :func:`~pytest_kimi.measure.steady_state.tokens_between` of its reads.  :meth:`truth`
        takes whole steps instead, which is right for a window on step boundaries but puts a
        handover step (a stream between two requests: one token fewer) in or out whole."""
        ends = self.step_ends
        tokens = self.step_tokens

        def generated(at: float) -> float:
            k = bisect_right(ends, at)  # the steps ended at or before ``at``
            done = float(sum(tokens[:k]))
            if k == 0 or k == len(ends):
                return done
            return done + tokens[k] * (at - ends[k - 1]) / (ends[k] - ends[k - 1])

        return generated(end) - generated(start)

    def edge_lag(self, start: float, end: float) -> float:
        """The latest of the steps around the two ends of a client window ``[start, end)``
        (each end's step and its neighbours) ended behind schedule: how far the window's edge
        reads may sit from the steps :meth:`truth` puts them on, and 0 when those steps were
        on time (a check's bound then needs no allowance for the simulator at all)."""
        lags = self.step_lags
        worst = 0.0
        for at in (start, end):
            k = bisect_right(self.step_ends, at) - 1
            for j in range(max(k - 1, 0), min(k + 2, len(lags))):
                worst = max(worst, lags[j])
        return worst

    @property
    def num_running(self) -> int:
        return len(self._running) + len(self._resumed) + len(self._parked)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing running, parked or waiting (SGLang's scheduler ``is_fully_idle``)."""
        return self.num_running == 0 and self.num_waiting == 0

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) unless idle, as SGLang's scheduler does
        (``sglang/srt/managers/scheduler.py``, ``Scheduler.flush_cache``)."""
        if not self.idle:
            return False
        if self._radix is not None:
            self._radix.clear()
        self.cache_flushes += 1
        return True

    def _match(self, seq: Sequence) -> int:
        """Prompt tokens of ``seq`` the cache holds (whole pages, at most ``len - 1``)."""
        radix = self._radix
        if radix is None or not seq.prefix_keys:
            return 0
        pages = 0
        for key in seq.prefix_keys:
            if key not in radix:
                break
            radix.move_to_end(key)
            pages += 1
        return min(pages * RADIX_PAGE_TOKENS, max(seq.prompt_tokens - 1, 0))

    def _insert(self, seq: Sequence) -> None:
        radix = self._radix
        if radix is None:
            return
        for key in seq.prefix_keys:
            radix[key] = None
            radix.move_to_end(key)
        while len(radix) > RADIX_MAX_PAGES:
            radix.popitem(last=False)

    # ------------------------------------------------------------------ internals

    def _end(self, seq: Sequence, state: SeqState) -> None:
        seq.state = state
        if self._loop is not None:
            seq.finished_at = self._loop.time()
        if state is SeqState.FINISHED:
            self.requests_finished += 1
            self.finished_generated_tokens += seq.generated
        else:
            self.requests_failed += 1
        seq._set_done()

    def _kick(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def _unpark(self, seq: Sequence) -> None:
        if seq.state is not SeqState.PARKED:
            return
        self._parked.discard(seq)
        seq.state = SeqState.RUNNING
        self._resumed.append(seq)
        self._kick()

    def _step_duration(self, b: int, prefill_tokens: int) -> float:
        dur = self._step_s[b] + self._prefill_s * prefill_tokens
        cold = self.profile.cold_steps
        if cold and self.steps < cold:
            # first-use costs: the excess falls linearly over the first cold steps
            dur *= 1.0 + (self.profile.cold_slowdown - 1.0) * (1.0 - self.steps / cold)
        sigma = self.profile.step_jitter
        if sigma > 0.0:
            # Mean-one log-normal: jitter widens the spread but leaves the rate alone.
            dur *= math.exp(self._jitter_rng.gauss(-0.5 * sigma * sigma, sigma))
        return dur

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        limit = self.profile.max_running_requests
        due = loop.time()
        burst = 0
        while True:
            if not self._running and not self._resumed and not self._waiting_admissible():
                # Idle (or everything parked / queue blocked by parked slots): sleep until
                # a submit, abort or unpark; restart the schedule from the wake-up time.
                self._wake = loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
                # The step starts when the request arrived, not when this task got to run
                # (the submitting handler still had work before it yielded).
                due = loop.time()
                if self._waiting and self._waiting[0].submitted_at < due:
                    due = self._waiting[0].submitted_at
                continue

            # ---- step start: admissions happen only here, like a real scheduler
            running = self._running
            if self._resumed:
                running.extend(self._resumed)
                self._resumed.clear()
            prefill = 0
            prompt = 0
            waiting = self._waiting
            admitted: list[Sequence] | None = None
            while waiting and len(running) + len(self._parked) < limit:
                seq = waiting.popleft()
                seq.state = SeqState.RUNNING
                running.append(seq)
                if seq.prefix_keys:
                    seq.cached_tokens = self._match(seq)
                    if admitted is None:
                        admitted = []
                    admitted.append(seq)
                prompt += seq.prompt_tokens
                prefill += seq.prompt_tokens - seq.cached_tokens
                self.requests_started += 1
            if admitted is not None:  # after matching: same-step admissions do not hit each other
                for seq in admitted:
                    self._insert(seq)
            self.prompt_tokens += prompt
            self.cached_prompt_tokens += prompt - prefill
            b = len(running)
            if b == 0:
                continue
            step = self._step_duration(b, prefill)
            self.busy_wall_s += step
            due += step
            delay = due - loop.time()
            if delay > 0.0:
                burst = 0
                timer = self._timer
                assert timer is not None
                await timer.sleep_until(due)
                timer.observe(loop.time() - due)
            else:
                # Behind schedule: run this step at once *without yielding*, so consumers
                # wake once for all overdue tokens and write them in one go.  That is what
                # lets an overloaded server catch up instead of paying one wake-up and one
                # send per token per step; the burst is capped so arrivals still get in.
                self.late_steps += 1
                if -delay > _MAX_DEBT_S:
                    # A debt this large means the process was suspended or starved, not
                    # jittered; repaying it would flood the clients.  Forget it and count
                    # it, so a truth check can assert that it never happened.
                    self.schedule_resets += 1
                    due = loop.time()
                burst += 1
                if burst >= _MAX_BURST_STEPS:
                    burst = 0
                    await asyncio.sleep(0)
            lag = loop.time() - due
            if lag > self.max_lag_s:
                self.max_lag_s = lag

            # ---- step end: one token to every sequence still running
            self.steps += 1
            running = self._running  # aborts during the sleep removed entries
            delivered = len(running)
            keep: list[Sequence] | None = None
            now = loop.time()
            for i, seq in enumerate(running):
                g = seq.generated + 1
                seq.generated = g
                if g == 1:
                    seq.first_token_at = now
                if g >= seq.checkpoint:
                    if keep is None:
                        keep = running[:i]
                    if g >= seq.target:
                        self._end(seq, SeqState.FINISHED)
                    else:
                        self._park(seq, loop)
                    continue
                if keep is not None:
                    keep.append(seq)
                w = seq._waiter
                if w is not None:
                    seq._waiter = None
                    if not w.done():
                        w.set_result(None)
            if keep is not None:
                self._running = keep
            self.generated_tokens += delivered
            self.step_ends.append(now)
            self.step_tokens.append(delivered)
            self.step_lags.append(lag if lag > 0.0 else 0.0)

    def _waiting_admissible(self) -> bool:
        return bool(self._waiting) and len(self._parked) < self.profile.max_running_requests

    def _park(self, seq: Sequence, loop: asyncio.AbstractEventLoop) -> None:
        """Stall fault: keep the slot but hand out no tokens for ``stall_s`` seconds."""
        seq.state = SeqState.PARKED
        seq.checkpoint = seq.target
        self._parked.add(seq)
        seq._wake()
        loop.call_later(seq.stall_s, self._unpark, seq)


_MAX_BURST_STEPS = 64
"""Most overdue steps run back to back before the engine yields to the event loop."""

_MAX_DEBT_S = 1.0
"""Schedule lag beyond which the engine restarts its schedule instead of catching up."""


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _PreciseTimer:
    """Sub-millisecond wake-ups for the step loop, from a helper thread.

    asyncio's own timers sleep in ``epoll_wait``, whose timeout is rounded *up* to whole
    milliseconds: with steps of 1-2 ms (speed=10, small batches) every wake-up would be
    up to a millisecond late, inflating time to first token by that much and, through the
    catch-up that keeps the average, pulling the median inter-token gap below the step
    time.  A thread blocked in ``time.sleep`` (nanosecond clock, ~50 us slack) and a
    ``call_soon_threadsafe`` wake-up land within a few tenths of a millisecond, and that
    remaining latency is learnt (:meth:`observe`) and subtracted from the sleep, so that
    wake-ups land on the due time on average.  ``loop.time()`` is ``time.monotonic()``,
    so both sides share one clock.
    """

    MAX_LEAD_S = 0.0005
    """Most the timer wakes ahead of the due time (bounded so CPU contention, which also
    shows up as lateness, cannot make it deliver early when the machine is idle)."""
    GAIN = 0.05

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cv = threading.Condition()
        self._pending: tuple[float, asyncio.Future[None]] | None = None
        self._closed = False
        self.lead_s = 0.0
        self._thread = threading.Thread(target=self._run, name="pytest-kimi-sim-timer", daemon=True)
        self._thread.start()

    def sleep_until(self, due: float) -> asyncio.Future[None]:
        """A future resolved in the loop at monotonic time ``due`` (one at a time)."""
        fut = self._loop.create_future()
        with self._cv:
            self._pending = (due, fut)
            self._cv.notify()
        return fut

    def observe(self, lateness_s: float) -> None:
        """Feed back how late (positive) or early a wake-up was handled in the loop."""
        lead = self.lead_s + self.GAIN * lateness_s
        self.lead_s = min(max(lead, 0.0), self.MAX_LEAD_S)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                assert self._pending is not None
                due, fut = self._pending
                self._pending = None
            delay = due - self.lead_s - time.monotonic()
            if delay > 0.0:
                time.sleep(delay)
            try:
                self._loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # loop closed under us: nothing left to wake
                return
