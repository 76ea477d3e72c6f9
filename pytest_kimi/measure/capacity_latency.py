"""A capacity probe's latencies as the search judges them, and when the client spoiled them.

A ``@capacity`` level is judged on a latency percentile, so whatever the load client adds to
a latency moves the capacity.  At ``sim:speed=10`` that is a lot: a 5 ms wait of the client's
event loop (another process took its core, it worked through a burst of reads) is a 50 ms ITL
in the simulator's clock, and the per-gap ITL p95 of a stationary trial read well above every
one of the simulator's steps (``python bench/capacity.py jitter``; docs/evidence/accuracy.md,
"Capacity under an ITL ceiling").  Three things here keep that out of the capacity, or say it
is there:

**The ITL statistic** (:func:`probe_latencies`).  A request's ITL is its *mean* time per output
token after the first read, ``(last read - first read) / tokens after the first read``: the
TPOT of serving benchmarks, and exactly the ITL ``goodput`` already holds a request to
(:class:`~pytest_kimi.measure.metrics.LatencyLimits`).  The ceiling applies at the percentile
*across requests*.  Why not the per-gap percentile ``@throughput`` reports: a client that
reads late lengthens one gap and shortens the next (the tokens waited in the socket), so the
gaps' tail is the client's timing, while a request's span only moves by a delay at its first
or last read, and the same run's per-request p95 read about the simulator's step.  A server
that really is slower -- larger steps, prefill stalling decode -- lengthens every request's
span, so it still shows; what the mean does not show is a tail of single long steps in under 5% of a
request's gaps, which a p95 of gaps shows only as long as the client's own tail is smaller.
Requests with fewer than :data:`REQUEST_ITL_MIN_GAPS` gaps between reads are left out (a
stationary trial's staggered first requests and the streams its time box cut just after they
started: a mean over two gaps is a gap), unless no request of the level has that many.
``itl="token"`` (:class:`~pytest_kimi.workload.capacity_marker.CapacitySpec`, no marker argument
yet) keeps the per-gap percentile (``bench/capacity.py truth --itl token`` compares the two).

**Stalls** (:func:`stall_reason`, :class:`ProbeStallCheck`).  ``@throughput`` voids a trial
when a client stall (its event loop waited more than ``max(20 ms, the median read gap)`` for a
CPU: the stall :func:`~pytest_kimi.measure.metrics.summarize_trial` defines) could move tok/s by
more than 2%, and lets another trial replace it; a smaller stall is only a note, *latencies by
the stall*.  A probe's figure is a latency, so here the question is whether the stall moved the
judged percentile: the requests whose judged instants (first read for TTFT, first and last read
for ITL, the end for end-to-end) fell in a stall are left out, and when that lowers the trial's
percentile by more than :data:`LATENCY_STALL_LIMIT` the trial is void for the moment
(``transient``), re-measured by the level's usual replacement, and the level's notes say
``trial N replaced: ...``.  A probe is never ``broke`` for a stall; stalls that keep recurring
leave the level invalid and the search says why.

**Jitter** (:func:`jitter`).  The simulator's ITL is one step per token, constant at a load,
so with a client that keeps up the per-gap p95/p50 of a level is about 1, and at ``speed=10``
with one token per event the client's read timing takes it well above (``python
bench/capacity.py jitter``; docs/evidence/accuracy.md, "Capacity under an ITL ceiling").  A
level above :data:`JITTER_RATIO` gets a note
saying the client's timing is in its latency tails (in TTFT and end-to-end latency too, which
have no per-request mean to fall back on).  On a real server the ratio also holds the server's
own step variation (prefill between decode steps), so it is a note, not a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.client_signals import CLIENT_LAG_LIMIT_S
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.stream_timing import inter_token_latencies, read_gap_p50
from pytest_kimi.workload.capacity_marker import ItlStatistic
from pytest_kimi.wire import LevelSummary

REQUEST_ITL_MIN_GAPS = 8
"""Gaps between reads a request needs for its mean ITL to count: one late read moves a mean of
8 gaps by an eighth of its delay, and a full request has 255 (32 with ``stream_interval=8``)."""
LATENCY_STALL_LIMIT = 0.01
"""A trial whose judged percentile falls by more than this share once the requests a client
stall touched are left out is re-measured.  Small against what a probe's side turns on (half
a search step is 2.8% of latency at the simulator's slope near C=41) and large against the
sampling noise of dropping a few requests (per-request ITL p95 moved 0.2% between trials)."""
JITTER_RATIO = 1.2
"""Per-gap ITL p95/p50 above which a level's latency tails are said to carry the client's
timing (module docstring: 1.00-1.13 on the simulator with a client that keeps up, up to 1.73
at speed 10 with one token per event)."""
NAMES = {"ttft_s": "TTFT", "itl_s": "ITL", "e2e_s": "end-to-end latency"}


def _pct(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else None


def read_gaps(rec: RequestRecord) -> int:
    """Gaps between a stream's token-carrying reads."""
    return max(len(rec.chunk_times) - 1, 0)


def request_itl(rec: RequestRecord) -> float | None:
    """A request's mean time per output token after its first read (wall seconds): 1 / its
    decode rate, the ITL goodput holds a request to."""
    rate = rec.decode_tok_s
    return 1.0 / rate if rate else None


def min_gaps_for(records: Sequence[RequestRecord]) -> int:
    """:data:`REQUEST_ITL_MIN_GAPS`, or fewer when no request has that many (short outputs with
    packed events), so a level of short requests still has an ITL."""
    most = max((read_gaps(r) for r in records if r.ok), default=0)
    return max(1, min(REQUEST_ITL_MIN_GAPS, most))


@dataclass(frozen=True, slots=True)
class Samples:
    """One latency's samples (wall seconds) with the instants a client delay would move."""

    values: np.ndarray
    instants: list[tuple[float, ...]] = field(default_factory=list)


def samples(
    records: Sequence[RequestRecord],
    name: str,
    itl: ItlStatistic = "request",
    min_gaps: int | None = None,
) -> Samples:
    """The samples a latency's percentile is taken over, as
    :func:`~pytest_kimi.measure.metrics.level_figures` takes TTFT and end-to-end latency (every
    successful request; whole ones for end-to-end) and ITL by ``itl``."""
    ok = [r for r in records if r.ok]
    values: list[float] = []
    instants: list[tuple[float, ...]] = []
    if name == "ttft_s":
        for r in ok:
            if r.first_token is not None:
                values.append(r.first_token - r.sent)
                instants.append((r.first_token,))
    elif name == "e2e_s":
        for r in ok:
            if not r.cut and not r.max_tokens:
                values.append(r.e2e)
                instants.append((r.end,))
    elif name == "itl_s" and itl == "token":
        for r in ok:
            if len(r.chunk_times) < 2:
                continue
            gaps = inter_token_latencies([r])
            times = np.frombuffer(r.chunk_times, dtype=np.float64)
            # the same counts inter_token_latencies shares each read's gap by
            counts = np.maximum(np.rint(r.read_tokens()[1:]), 1).astype(np.int64)
            ends = np.repeat(times[1:], counts)
            starts = np.repeat(times[:-1], counts)
            values.extend(gaps.tolist())
            instants.extend(zip(starts.tolist(), ends.tolist()))
    elif name == "itl_s":
        need = min_gaps if min_gaps is not None else min_gaps_for(ok)
        for r in ok:
            if read_gaps(r) < need or r.first_token is None:
                continue
            value = request_itl(r)
            if value is not None:
                values.append(value)
                instants.append((r.first_token, r.chunk_times[-1]))
    else:
        raise ValueError(f"unknown latency {name!r}")
    return Samples(np.asarray(values, dtype=np.float64), instants)


def probe_latencies(
    trials: Sequence[TrialResult],
    names: Sequence[str],
    percentile: float,
    clock: float = 1.0,
    itl: ItlStatistic = "request",
) -> dict[str, float | None]:
    """Each latency at the percentile over the trials' requests, in the server's clock."""
    records = [r for t in trials for r in t.records]
    need = min_gaps_for(records)
    out: dict[str, float | None] = {}
    for name in names:
        value = _pct(samples(records, name, itl, need).values, percentile)
        out[name] = None if value is None else value * clock
    return out


# ------------------------------------------------------------------------------------ stalls


def _stalls(trial: TrialResult, limit: float, slack_s: float = 0.01) -> tuple[np.ndarray, float]:
    """``[start, end]`` of every event-loop wait longer than ``limit`` (a lag sample ``v``
    taken at ``t``: the loop did not run in ``[t - v, t]``; ``slack_s`` as
    :meth:`~pytest_kimi.measure.client_signals.ClientSignals.stall_at`), and the longest wait."""
    client = trial.client
    if not client.lag_times:
        return np.empty((0, 2)), 0.0
    times = np.frombuffer(client.lag_times, dtype=np.float64)
    values = np.frombuffer(client.lag_values, dtype=np.float64)
    big = values > limit
    spans = np.column_stack((times[big] - values[big] - slack_s, times[big] + slack_s))
    return spans, float(values[big].max()) if big.any() else 0.0


def _touched(instants: list[tuple[float, ...]], spans: np.ndarray) -> np.ndarray:
    """Which samples have an instant inside a stall."""
    hit = np.zeros(len(instants), dtype=bool)
    if not spans.size or not instants:
        return hit
    for k in range(max(len(i) for i in instants)):
        at = np.array([i[k] if k < len(i) else np.nan for i in instants])
        inside = (at[:, None] >= spans[None, :, 0]) & (at[:, None] <= spans[None, :, 1])
        hit |= inside.any(axis=1)
    return hit


def stall_reason(
    trial: TrialResult,
    ceilings: Mapping[str, float],
    percentile: float,
    clock: float = 1.0,
    itl: ItlStatistic = "request",
    share: float = LATENCY_STALL_LIMIT,
) -> str | None:
    """Why a client stall voids this probe trial (module docstring, *stalls*), or None.
    ``share``: how far the stall may move the percentile (:data:`LATENCY_STALL_LIMIT`)."""
    ok = [r for r in trial.records if r.ok]
    if not ok:
        return None
    limit = max(CLIENT_LAG_LIMIT_S, read_gap_p50(ok))
    spans, worst = _stalls(trial, limit)
    if not spans.size:
        return None
    need = min_gaps_for(ok)
    for name in ceilings:
        got = samples(ok, name, itl, need)
        hit = _touched(got.instants, spans)
        if not hit.any():
            continue
        seen = _pct(got.values, percentile)
        clean = _pct(got.values[~hit], percentile)
        if seen is None or (clean is not None and seen <= clean * (1.0 + share)):
            continue
        moved = (
            f"from {clean * clock:.4g} to {seen * clock:.4g} s "
            f"(+{(seen / clean - 1) * 100:.1f}%, more than {share:.0%})"
            if clean is not None
            else f"to {seen * clock:.4g} s (every request was touched)"
        )
        return (
            f"load client stalled: its event loop waited up to {worst * 1e3:.0f} ms (more than "
            f"{limit * 1e3:.0f} ms) at {int(hit.sum())} request(s)' reads, which raised the "
            f"trial's p{percentile:g} {NAMES[name]} {moved}; the server did not cause it"
        )
    return None


class ProbeStallCheck:
    """A :class:`~pytest_kimi.measure.measure_spec.TrialObserver` around the test's own (or none):
    after each probe trial, a stall that moved its judged latency voids it for the moment, so
    the level measures another in its place (``measure_level``'s replacement of transient
    trials).  Everything else is the inner observer's."""

    def __init__(
        self,
        inner: Any,
        ceilings: Mapping[str, float],
        percentile: float,
        clock: float,
        itl: ItlStatistic,
    ) -> None:
        self.inner = inner
        self.ceilings = dict(ceilings)
        self.percentile = percentile
        self.clock = clock
        self.itl: ItlStatistic = itl

    async def open(self) -> None:
        if self.inner is not None:
            await self.inner.open()

    async def before_trial(self) -> None:
        if self.inner is not None:
            await self.inner.before_trial()

    async def after_trial(self, trial: TrialResult) -> None:
        if self.inner is not None:
            await self.inner.after_trial(trial)
        if trial.invalid and not trial.transient:
            return  # void for good already: a re-measurement would not change that
        why = stall_reason(trial, self.ceilings, self.percentile, self.clock, self.itl)
        if why is not None:
            trial.invalid.append(why)
            trial.transient.append(why)

    def level_summary(self) -> LevelSummary:
        return self.inner.level_summary() if self.inner is not None else {}

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


# ------------------------------------------------------------------------------------ jitter


@dataclass(frozen=True, slots=True)
class Jitter:
    """Per-gap ITL at the percentile over its median, pooled over a level's trials."""

    ratio: float
    p50_s: float
    pct_s: float
    percentile: float

    def warning(self) -> str | None:
        """The level's note when the tail is more than :data:`JITTER_RATIO` of the median."""
        if self.ratio <= JITTER_RATIO:
            return None
        return (
            f"client jitter: per-gap ITL p{self.percentile:g} {self.ratio:.2f}x its median "
            f"({self.pct_s * 1e3:.1f} vs {self.p50_s * 1e3:.1f} ms): the client's read timing, "
            "or uneven server steps, is in this level's latency tails (the simulator's even "
            f"steps stay under {JITTER_RATIO:g}x with a client that keeps up)"
        )


def jitter(trials: Sequence[TrialResult], percentile: float, clock: float = 1.0) -> Jitter | None:
    """The level's per-gap ITL tail against its median (None without gaps)."""
    gaps = inter_token_latencies([r for t in trials for r in t.records if r.ok])
    if gaps.size < 2:
        return None
    p50 = float(np.median(gaps))
    pct = float(np.percentile(gaps, max(percentile, 50.0)))
    if p50 <= 0:
        return None
    return Jitter(pct / p50, p50 * clock, pct * clock, max(percentile, 50.0))
