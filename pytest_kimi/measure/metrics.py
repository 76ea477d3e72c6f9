"""Request records -> trial and level figures: steady-state window, percentiles, validity.

Everything here runs after a trial has ended, so the load engine's hot path never pays for it.

Steady-state window (closed loop, C workers): from the moment *every* worker has received its
first token to the moment the *first* worker receives the last token of its last request.
Inside it exactly C streams are decoding, so token arrivals in the window divided by its
length is the server's aggregate output rate at concurrency C, free of the ramp-up (requests
still in prefill) and of the drain (the tail where fewer than C streams remain) that bias
``tokens / wall``.

Both ends sit on a *step boundary as the client sees it*, so that a step's tokens are either
all in or all out.  A server hands every running stream its token(s) in one decode step, so
reads arrive in *bursts* (one read per stream, microseconds apart) separated by pauses of
about a step.  The first worker's last token is just one read of the final step's burst: the
other streams' reads of that step come a moment later, and ending the window at that read
dropped C - 1 tokens of a step whose time the window already held (-0.34% at C=8 and 256
tokens).  So each end is moved to the *first read of the burst that holds it*, and the window
is half-open, [start, end): it holds every read of the bursts from the one where the last
stream started up to, not including, the one where the first stream ended, and its length is
first read to first read, as many steps as it holds.  First reads, not last ones: a burst's
later reads are late by the client's own work on the earlier ones (a stream's end costs it
more), which differs between the two ends.  A burst ends at a pause of at least half the
median per-token gap of the streams (about a step); an end whose burst shows no such pause
within a few steps (a client too slow to tell the steps apart) stays where it was.

The definition uses only what the client sees, so it holds for servers whose steps it cannot
know, for packed events (``stream_interval``: a burst is then every stream that got an event
in that step), and for jittered or late steps (steps that arrive together form one burst,
which is in or out as a whole).  A lone stream's window is [first read, last read), so its
rate is its per-request decode rate, (tokens - 1) / (last - first).

What each read brought is the record's own count (:meth:`RequestRecord.read_tokens`: the
stream's running usage where the server sends it, else its events' text), never the stream's
mean per event: SGLang sends a first event of one token, then ``stream_interval`` at a time,
the rest with the finish, and a mean put every stream's edges a few tokens off (-3.1% at
interval 8, C=4, 256 tokens).  A closed-loop window counts the tokens its steps generated,
each dated back from the read that brought it (:func:`tokens_in_steps`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from statistics import median
from typing import Iterable, Sequence

import numpy as np

from pytest_kimi.load.runner import LAG_INTERVAL_S, TrialRecords
from pytest_kimi.workload.markers import LevelSpec
from pytest_kimi.load.records import UNKNOWN_USAGE, RequestRecord
from pytest_kimi.load.sse import (
    running_usage,
    usage_above_max_tokens_message,
    usage_below_events_message,
    usage_fell_message,
)
from pytest_kimi.measure.time_box import MAX_SETTLE_STEPS, SETTLE_MIN_S

CLIENT_LAG_LIMIT_S = 0.02
"""Event-loop lag (p99) or send delay (p99) above this may mean the client set the pace.

Lag is also allowed up to the median gap between a stream's reads: at high concurrency a decode
step delivers a burst of reads (one per stream) that the loop works through in one go; as long
as each burst is done before the next arrives the client keeps up, its timestamps are late by
less than one gap, and a window of seconds is unaffected.  A client that cannot drain a burst
in time falls behind for good, which the lag (and its CPU share) then shows."""
CLIENT_CPU_LIMIT = 0.95
"""A client process busy more than this share of a core has no slack left: it is the bottleneck."""
CLIENT_BUSY_CPU = 0.5
"""Below this CPU share a lagging event loop was not busy but descheduled (stalled): another
process or the machine (a VM's host, memory reclaim) took its core.  Seen on vLLM's CPU build
sharing 2 cores with the client: 5% CPU, yet lag p99 near 30 ms and single stalls over a second
(until the launcher niced the server's whole session, not only its process: autogroup)."""
STALL_ERROR_LIMIT = 0.02
"""A stalled (not busy) client reads late, but tokens wait in the socket and are counted when it
wakes.  Only a stall at an edge of the steady-state window moves tokens across it, so the tok/s
figure is off by at most ``(stall at the start + stall at the end) / window``; beyond this share
the trial is invalid."""


BUFFERED_MIN_EVENTS = 16
"""Token events a request needs before its reads can show that it was buffered.  SGLang with
a large ``--stream-interval`` legitimately sends few, fat events (32 tokens at interval 8: 4
events), which a fast server may deliver in two reads; 16 events are 16 decode steps, which an
honest stream spreads over as many reads unless something held them back."""
BUFFERED_MAX_READS = 2
"""A request whose token events all came in this many reads or fewer was buffered: a proxy
that buffers (or compresses: gzip emits when its window fills or the body ends) hands the
whole answer on at once, so every token seems to arrive together and no inter-token latency
exists to measure (the tester's gzip proxy passed at 11,495 tok/s with no ITL)."""
BUFFERED_SHARE = 0.5
"""More than this share of a trial's requests that streamed :data:`BUFFERED_MIN_EVENTS` token
events or more (finished, or cut by the time box) buffered voids the trial: one request lumped
by a hiccup of the machine is no pattern; most of them is the server's path.  Only those that
could show it count: at C=1 a stationary trial has one finished stream and one the time box
cut before its lump arrived, and that one is no evidence either way."""
BUFFERED_STALL_MIN_S = LAG_INTERVAL_S
"""A client stall shorter than this before a lumped read does not excuse it: the lag monitor
sleeps this long at a time and wakes a millisecond or so late on an idle machine (the timer's
resolution), so a lag below it is the monitor's own jitter, not a held-up loop.  The tester's
gzip proxy answered a C=1 request in 0.7 ms, and the monitor's ordinary 0.5 ms passed for a
stall of "half the request": the trial recorded 42709.9 tok/s."""
FLOOD_BYTES_PER_EVENT = 16 * 1024
"""Body bytes per token event above which the server floods the stream.  A token chunk is a
few hundred bytes and a request's role, finish and usage chunks under two kilobytes in all, so
an honest stream of one token event sends under 2 KB for it and a long one a few hundred bytes
an event; 16 KB an event is a stream of events that carry no token (empty deltas, comments),
which the client parses like tokens: its CPU then goes to the flood, and more load workers
would not make the figure the server's."""


@dataclass(slots=True)
class ClientSignals:
    """How hard the load client itself worked during a trial (from the runner)."""

    loop_lag_max_s: float = 0.0
    loop_lag_p99_s: float = 0.0
    send_delay_p99_s: float = 0.0
    cpu_share: float = 0.0
    """Client process CPU seconds per wall second (1.0 = one core busy)."""
    lag_times: array[float] = field(default_factory=lambda: array("d"), repr=False)
    lag_values: array[float] = field(default_factory=lambda: array("d"), repr=False)

    def lag_p99_within(self, start: float, end: float) -> float:
        """Event-loop lag p99 inside the steady-state window.

        Opening C connections at a trial's start keeps the loop busy for a moment; that burst
        lies before the window and does not touch the figure, so it must not void it either.
        """
        if not self.lag_times:
            return self.loop_lag_p99_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        inside = values[(times > start) & (times <= end)]
        return float(np.percentile(inside, 99)) if inside.size else self.loop_lag_p99_s

    def lag_max_within(self, start: float, end: float) -> float:
        """The longest event-loop stall inside the steady-state window."""
        if not self.lag_times:
            return self.loop_lag_max_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        inside = values[(times > start) & (times <= end)]
        return float(inside.max()) if inside.size else self.loop_lag_max_s

    def stall_before(self, instant: float, slack_s: float = 0.01) -> float:
        """How long the loop had been held up when it stamped ``instant``: of each stall that
        covers it (:meth:`stall_at`), the part before the instant only.

        A read that lands while the loop is held is stamped once it runs again; the work the
        read itself brings (parsing a lump of events) holds the loop *after* the stamp, and
        that part is the read's consequence, not what made it late.
        """
        if not self.lag_times:
            return self.loop_lag_max_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        covering = (times - values - slack_s <= instant) & (instant <= times + slack_s)
        if not covering.any():
            return 0.0
        ends, lags = times[covering], values[covering]
        return float(np.clip(np.minimum(instant, ends) - (ends - lags), 0.0, None).max())

    def stall_at(self, instant: float, slack_s: float = 0.01) -> float:
        """The stall that covers ``instant`` (0 when the loop ran then).

        A lag sample ``v`` taken at ``t`` means the loop did not run during ``[t - v, t]``;
        ``slack_s`` (about two monitor sleeps) also catches a stall that ended just before a
        read stamped the instant.  Without samples, the worst stall of the trial is assumed.
        """
        if not self.lag_times:
            return self.loop_lag_max_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        covering = values[(times - values - slack_s <= instant) & (instant <= times + slack_s)]
        return float(covering.max()) if covering.size else 0.0


@dataclass(slots=True)
class TrialResult:
    """One measured load phase at one level: the sample unit of the statistics."""

    index: int
    label: str
    tok_s: float | None
    """Aggregate output tok/s in the steady-state window; None when there is no window."""
    window_s: float
    window_tokens: float
    requests_ok: int
    requests_failed: int
    wall_s: float
    client: ClientSignals
    invalid: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopped_early: str | None = None
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    offered_rate: float | None = None
    """Open loop: the arrival rate asked for, and the one the client achieved."""
    achieved_rate: float | None = None
    completed_rate: float | None = None
    """Open loop: requests/s the server finished inside the window (:func:`completed_rate`)."""
    transient: list[str] = field(default_factory=list)
    """The subset of ``invalid`` caused by the moment, not by the server or the workload (a
    client stall): when every reason is transient, another trial may replace this one."""
    window: tuple[float, float] | None = None
    """[start, end) of the steady-state window on the ``perf_counter`` clock (None: no window),
    so a cross-check (``--perf-server-metrics``) can take its own figure over the same span."""
    client_stall: str | None = None
    """Why the load client's own timing is in this trial's figures (its event loop or its
    sends waited for a CPU), whether that voided the trial or only noted it: its latencies
    are the client's as much as the server's, so none of them is a latency sample
    (:func:`pytest_kimi.measure.latency.latency_void`), even where its tok/s, bounded by the
    stall, still is."""
    running_asked: int | None = None
    """The C whose streams did not all get a first token, where only the server's own
    running-requests gauge can say whether it runs fewer than C at once: a reason of the trial
    then holds :data:`GAUGE_UNREAD`, which ``--perf-server-metrics`` replaces with what the
    gauge showed (:func:`gauge_finding`)."""
    latency_void: str | None = None
    """Set when the level is judged (:func:`pytest_kimi.measure.results.judge_level`): why
    this trial gives no latency figure (a client stall, :attr:`client_stall`, or one that
    moved its latency percentiles); None: its latencies count."""

    @property
    def valid(self) -> bool:
        return not self.invalid and self.tok_s is not None


def steady_window(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """[start, end) of the closed-loop steady state on step boundaries, or None when empty.

    The anchors are the last worker's first token and the first worker's last token; each is
    then moved to the first read of its burst (:func:`burst_start`; module docstring: why).
    """
    first_by_worker: dict[int, float] = {}
    last_by_worker: dict[int, float] = {}
    for rec in records:
        last = rec.last_token
        if rec.first_token is None or last is None:
            continue
        w = rec.worker
        if w not in first_by_worker or rec.first_token < first_by_worker[w]:
            first_by_worker[w] = rec.first_token
        if w not in last_by_worker or last > last_by_worker[w]:
            last_by_worker[w] = last
    if not first_by_worker:
        return None
    start = max(first_by_worker.values())
    end = min(last_by_worker.values())
    if end <= start:
        return None
    step = step_gap(records)
    if step > 0.0:
        times = np.sort(
            np.concatenate(
                [np.frombuffer(r.chunk_times, dtype=np.float64) for r in records if r.chunk_times]
            )
        )
        start = burst_start(times, start, step)
        end = burst_start(times, end, step)
    return (start, end) if end > start else None


def stationary_window(
    records: Sequence[RequestRecord], cut_at: float, settle_steps: int = MAX_SETTLE_STEPS
) -> tuple[float, float] | None:
    """[start, end) of a stationary trial (protocol ``stationary``).

    Start: ``settle_steps`` steps (the trial's :class:`~pytest_kimi.measure.time_box.TimeBox`),
    and at least :data:`~pytest_kimi.measure.time_box.SETTLE_MIN_S`, after every stream has
    its first token.  End: the last
    read of the stream cut earliest in its event cycle, i.e. the latest instant at which every
    stream still running at the cut has a read at or after it.  Inside, C streams are in
    flight all the time (a stream that ends sends its next request at once), so the window's
    rate is the server's at concurrency C with requests starting and ending as in service.
    Tokens are counted by :func:`tokens_between`, so the ends need no step alignment.
    """
    first_by_worker: dict[int, float] = {}
    cut_last: list[float] = []
    for rec in records:
        if rec.cut and rec.chunk_times:
            cut_last.append(rec.chunk_times[-1])
        if rec.first_token is None:
            continue
        w = rec.worker
        if w not in first_by_worker or rec.first_token < first_by_worker[w]:
            first_by_worker[w] = rec.first_token
    if not first_by_worker:
        return None
    start = max(first_by_worker.values()) + max(settle_steps * step_gap(records), SETTLE_MIN_S)
    if cut_last:
        end = min(cut_last)
    else:
        lasts = [r.chunk_times[-1] for r in records if r.chunk_times]
        end = max(lasts) if lasts else start
    end = min(end, cut_at)
    return (start, end) if end > start else None


def tokens_between(records: Iterable[RequestRecord], start: float, end: float) -> float:
    """Tokens the streams received between two instants, each stream's position read off its
    own reads by linear interpolation.

    A server that packs its events (SGLang's ``stream_interval=8``) delivers a stream's tokens
    eight at a time, and streams that started together stay in phase, so counting whole reads
    in a short window is off by up to eight steps' tokens at each end; a stream's tokens,
    though, come at an even pace between its reads, and interpolating gets each boundary
    right to a fraction of a token per stream.  The reads' positions are the stream's own
    (:meth:`RequestRecord.read_positions`: its running usage where the server sends it), so
    SGLang's first event of one token and its short last one are where they are, not a mean
    event apart.  Before its first read a stream has no tokens, after its last it has them all.
    """
    total = 0.0
    for rec in records:
        if not rec.chunk_times:
            continue
        times = np.frombuffer(rec.chunk_times, dtype=np.float64)
        if times[-1] < start or times[0] >= end:
            continue
        tokens = rec.read_positions()
        at = np.interp([start, end], times, tokens, left=0.0, right=float(tokens[-1]))
        total += float(at[1] - at[0])
    return total


def running_usage_fall(rec: RequestRecord) -> str | None:
    """Why the stream's running usage cannot be true, or None: a count of the tokens so far
    (``continuous_usage_stats``) that goes *down* from one read to a later one.

    No server's accounting falls, so such a stream's usage tells nothing, and a stream the
    time box cuts is counted by its last running usage alone: counting down, a stream cut
    early claimed most of its request (the tester's run recorded 296.2 tok/s against a true
    ~185).  Checked after the trial, once a stream (numpy over its reads).
    """
    if len(rec.chunk_usage) < 2:
        return None
    told = np.frombuffer(rec.chunk_usage, dtype=np.uint32)
    known = told[told != UNKNOWN_USAGE].astype(np.int64)
    falls = np.flatnonzero(np.diff(known) < 0)
    if not falls.size:
        return None
    i = int(falls[0])
    return usage_fell_message(int(known[i]), int(known[i + 1]))


def check_running_usage(records: Iterable[RequestRecord]) -> None:
    """Refuse every stream's running usage that falls (:func:`running_usage_fall`), finished
    or cut: ``usage_error`` says so, which voids the trial (:func:`usage_reasons`)."""
    for rec in records:
        if rec.usage_error is None:
            rec.usage_error = running_usage_fall(rec)


def count_cut_tokens(records: Sequence[RequestRecord], max_tokens: int = 0) -> int:
    """Give the streams a time box cut their token counts; returns how many were estimated.

    A cut stream never got its final ``usage``.  Trials ask for ``continuous_usage_stats``
    (SGLang and vLLM put the usage so far on every chunk), so the stream's last read says how
    many tokens it had (:attr:`RequestRecord.chunk_usage`): exact.  A server that ignores the option
    leaves an estimate: the stream's events times the tokens per event of the trial's
    finished streams (events may carry several tokens, ``stream_interval``), counted and
    reported by the caller.  A running usage that cannot be true is not believed (the
    stream is estimated, and ``usage_error`` says why): one below the events streamed, one
    above the request's ``max_tokens`` (the one its body asked for, else ``max_tokens``; 0:
    unknown),
    one that fell on the way (:func:`running_usage_fall`).
    """
    # a mean is what is meant here: a stream without running usage is given the events of
    # the finished ones' pattern, whose first and last events fall where they may
    done = [r.tokens_per_event for r in records if r.ok and not r.cut and r.completion_tokens]
    per_event = median(done) if done else 1.0
    estimated = 0
    for rec in records:
        if not rec.cut or not rec.chunk_events:
            continue
        if rec.usage_error is None:
            rec.usage_error = running_usage_fall(rec)
        told: int | None = None
        if rec.chunk_usage and rec.chunk_usage[-1] != UNKNOWN_USAGE:
            told = rec.chunk_usage[-1]  # the parser read it off the last read already
        else:
            told = running_usage(rec.last_read)
        rec.last_read = b""
        limit = rec.token_limit or rec.max_tokens or max_tokens
        if rec.usage_error is not None:
            told = None  # a usage that fell (or was refused on the way) tells nothing
        elif told is not None and told < rec.events:
            # fewer tokens than events streamed cannot be true (each event carries one or
            # more): not believed, and said (the trial is invalid), like a final usage's
            rec.usage_error = usage_below_events_message(told, rec.events)
            told = None
        elif told is not None and limit and told > limit:
            rec.usage_error = usage_above_max_tokens_message(told, limit)
            told = None
        if told is not None:
            rec.completion_tokens = told
        else:
            rec.completion_tokens = round(rec.events * per_event)
            estimated += 1
    return estimated


def step_gap(records: Iterable[RequestRecord]) -> float:
    """The median time per token of a stream: one server step as the client sees it (0: none).

    Per token, not per read, so a server that packs k tokens per event still gives one step,
    whether or not the streams' events fall on the same steps.
    """
    gaps = inter_token_latencies(records)
    return float(np.median(gaps)) if gaps.size else 0.0


BURST_REACH_STEPS = 4.0
"""How far (in steps) a window end may move to the start of its burst.  More than one step: a
server that fell behind runs overdue steps back to back (the simulator does; SGLang's scheduler
starts the next step at once), so a few steps can arrive as one burst."""


def burst_start(times: np.ndarray, anchor: float, step: float) -> float:
    """The first read of the burst that holds ``anchor`` (``times``: every read, sorted).

    A burst is a run of reads with gaps under ``step / 2``; the previous step's reads came
    about a step earlier.  If no such pause comes within :data:`BURST_REACH_STEPS` steps
    before the anchor, the reads do not show the steps apart (a client that fell behind reads
    continuously) and ``anchor`` is kept.
    """
    i = int(np.searchsorted(times, anchor, side="left"))
    lo = int(np.searchsorted(times, anchor - BURST_REACH_STEPS * step, side="left"))
    before = times[max(lo - 1, 0) : i]
    if lo == 0:  # nothing before the reach: the run of reads starts with the trial
        before = np.concatenate(([-np.inf], before))
    seg = np.concatenate((before, [anchor]))
    pauses = np.flatnonzero(np.diff(seg) >= 0.5 * step)
    return float(seg[pauses[-1] + 1]) if pauses.size else anchor


def tokens_in_window(records: Iterable[RequestRecord], start: float, end: float) -> float:
    """Tokens of the reads that arrived in [start, end), each read weighted by the tokens it
    brought (:meth:`RequestRecord.read_tokens`): an open-loop window's count, whose ends are
    instants of the trial, not steps."""
    total = 0.0
    for rec in records:
        if not rec.chunk_times:
            continue
        times = np.frombuffer(rec.chunk_times, dtype=np.float64)
        inside = (times >= start) & (times < end)
        if inside.any():
            total += float(rec.read_tokens()[inside].sum())
    return total


def tokens_in_steps(records: Sequence[RequestRecord], start: float, end: float) -> float:
    """Tokens generated in a closed-loop window [start, end): the steps from the burst that
    starts it up to, not including, the burst that ends it.

    A read brings the tokens the server generated one a step since the stream's read before
    (:meth:`RequestRecord.read_tokens`), the last of them just before the read; so each
    token is dated back from its read, ``k`` steps for the ``k``-th last (a step: the
    streams' median time per token, :func:`step_gap`), and counted when that falls in the
    window.  Both edges are taken half a step early: a burst's reads, and so the tokens
    dated back from them, spread a little after its first read, and a token of the step
    before the burst is dated a whole step before it.  With one token a read that is the
    reads of the bursts [start, end), as it always was.  A
    packed stream (SGLang's ``stream_interval``: one token first, then ``stream_interval`` at
    a time, the rest with the finish) has reads only every few steps, so counting its reads
    dropped its last event, whose tokens the window's last steps generated (-3.1% at
    interval 8, C=4, 256 tokens); interpolating between reads instead leaned on the first
    read, which the client stamps late while its C streams start (+0.15%).  A read that
    brought several tokens because the client read it late is dated back the same way.
    """
    step = step_gap(records)
    total = 0.0
    for rec in records:
        if not rec.chunk_times:
            continue
        times = np.frombuffer(rec.chunk_times, dtype=np.float64)
        if times[-1] < start:
            continue  # every token dated before its read: all before the window
        tokens = rec.read_tokens()
        total += float(
            (
                _generated_before(times, tokens, end - 0.5 * step, step)
                - _generated_before(times, tokens, start - 0.5 * step, step)
            ).sum()
        )
    return total


def _generated_before(
    times: np.ndarray, tokens: np.ndarray, instant: float, step: float
) -> np.ndarray:
    """Per read, its tokens dated (one a step back from the read) strictly before ``instant``:
    all of a read before it; of a later read, those ``d`` steps back with ``d > (read -
    instant) / step``; without a step, the reads' own times."""
    if step <= 0.0:
        return np.where(times < instant, tokens, 0.0)
    back = np.floor((times - instant) / step)
    return np.where(times < instant, tokens, np.clip(tokens - back - 1.0, 0.0, tokens))


def inter_token_latencies(records: Iterable[RequestRecord]) -> np.ndarray:
    """One gap per token after the first read: a read's gap is shared by the tokens it brought
    (:meth:`RequestRecord.read_tokens`; SGLang's packed events carry 1, then
    ``stream_interval``, then the rest, and each gets its own share)."""
    parts = []
    for rec in records:
        if len(rec.chunk_times) < 2:
            continue
        times = np.frombuffer(rec.chunk_times, dtype=np.float64)
        tokens = rec.read_tokens()[1:]
        counts = np.maximum(np.rint(tokens), 1).astype(np.int64)
        parts.append(np.repeat(np.diff(times) / counts, counts))
    return np.concatenate(parts) if parts else np.empty(0)


def send_delay_p99_within(
    records: Sequence[RequestRecord], window: tuple[float, float] | None
) -> float:
    """How late requests due inside the window left (sent - scheduled); 0 when none was due.

    A burst of C sends at a trial's start is late by construction and lies before the window.
    """
    if window is None:
        return 0.0
    start, end = window
    delays = [r.sent - r.scheduled for r in records if r.sent and start < r.scheduled <= end]
    return float(np.percentile(delays, 99)) if delays else 0.0


def read_gap_p50(records: Iterable[RequestRecord]) -> float:
    """Median time between successive reads of a stream: the rhythm the server delivers in."""
    gaps = [
        np.diff(np.frombuffer(r.chunk_times, dtype=np.float64))
        for r in records
        if len(r.chunk_times) > 1
    ]
    return float(np.median(np.concatenate(gaps))) if gaps else 0.0


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else None


def is_empty_ok_response(rec: RequestRecord) -> bool:
    """A 200 stream that ended normally without a single token: untrustworthy, not an HTTP failure."""
    return (
        rec.status == 200
        and not rec.cut  # cut by the time box before its first token: nothing went wrong
        and rec.completion_tokens == 0
        and not rec.chunk_times
        and (rec.error is None or "no tokens" in rec.error)
    )


def open_loop_window(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """Open loop: from the first completed request (the system has filled to its steady depth)
    to the last arrival (after it, arrivals stop and the system drains)."""
    ends = [r.last_token for r in records if r.last_token is not None]
    if not ends:
        return None
    start = min(ends)
    end = max(r.sent for r in records)
    return (start, end) if end > start else None


def completed_rate(
    records: Sequence[RequestRecord], window: tuple[float, float] | None
) -> float | None:
    """Open loop: the rate at which requests finished inside the window, ``(k - 1) / span``
    over the ``k`` successful ends in it (intervals per second, like the achieved send rate).

    The client sends on schedule whatever the server does, so the send rate matches the
    offered one even past capacity; the completions are what fall behind: a server that
    cannot keep up finishes requests at its own pace while the queue grows.
    """
    if window is None:
        return None
    start, end = window
    ends = sorted(r.end for r in records if r.ok and start <= r.end <= end)
    if len(ends) < 2 or ends[-1] <= ends[0]:
        return None
    return (len(ends) - 1) / (ends[-1] - ends[0])


def buffered_requests(
    records: Sequence[RequestRecord], client: ClientSignals
) -> list[RequestRecord]:
    """The requests, finished or cut by the time box, whose many token events arrived in one
    or two reads (see :data:`BUFFERED_MAX_READS`).

    A lump that came right after the client's own event loop had been held up (the part of a
    stall before one of its reads, :meth:`ClientSignals.stall_before`) for half the request's
    time or more is the client's doing, not the server's, and does not count; a hold-up under
    :data:`BUFFERED_STALL_MIN_S` is the lag monitor's own jitter and excuses nothing.
    """
    out = []
    for r in records:
        reads = len(r.chunk_times)
        if not r.ok or reads == 0 or reads > BUFFERED_MAX_READS:
            continue
        if r.events < BUFFERED_MIN_EVENTS or r.first_token is None:
            continue
        held = max(client.stall_before(t) for t in r.chunk_times)
        if held >= BUFFERED_STALL_MIN_S and held >= 0.5 * (r.chunk_times[-1] - r.sent):
            continue
        out.append(r)
    return out


def buffered_reason(records: Sequence[RequestRecord], client: ClientSignals) -> str | None:
    """The invalid reason of a trial whose streams were buffered, or None.

    Of the successful requests that streamed :data:`BUFFERED_MIN_EVENTS` token events or more
    (finished or cut: only those can show it), more than :data:`BUFFERED_SHARE` lumped.
    """
    could = [r for r in records if r.ok and r.events >= BUFFERED_MIN_EVENTS]
    lumped = buffered_requests(could, client)
    if not could or len(lumped) <= BUFFERED_SHARE * len(could):
        return None
    lo, hi = min(r.events for r in lumped), max(r.events for r in lumped)
    return (
        "buffered: inter-token latency cannot be measured; turn off compression or proxy "
        f"buffering ({len(lumped)} of {len(could)} requests brought their "
        f"{lo if lo == hi else f'{lo}-{hi}'} token events in at most {BUFFERED_MAX_READS} "
        "reads)"
    )


def flood_reason(records: Sequence[RequestRecord]) -> str | None:
    """The invalid reason of a trial whose server flooded its streams, or None: the successful
    streams' bodies hold more than :data:`FLOOD_BYTES_PER_EVENT` bytes per token event."""
    ok = [r for r in records if r.ok]
    body = sum(r.body_bytes for r in ok)
    events = sum(r.events for r in ok)
    if body <= FLOOD_BYTES_PER_EVENT * max(events, 1):
        return None
    return (
        f"event flood: the server sent {body / max(events, 1):,.0f} bytes of stream per token "
        f"event ({body / 2**20:.1f} MB for {events} token events over {len(ok)} request(s)), "
        "where a token chunk is a few hundred bytes: events that carry no token flooded the "
        "streams, and the client's time went to parsing them; fix the server (or the proxy in "
        "front of it)"
    )


def streams_per_process(tr: TrialRecords) -> int:
    """The most streams one client process ran in the trial (a sharded client's busiest
    share; else the trial's concurrency, or an open loop's peak in flight)."""
    return max((sh.concurrency for sh in tr.shards), default=tr.concurrency)


def one_stream_flood(records: Sequence[RequestRecord]) -> str:
    """What a lone stream that saturated its client process delivered, for its reason."""
    ok = [r for r in records if r.ok and r.chunk_times]
    span = sum(max(r.chunk_times[-1] - r.sent, 1e-9) for r in ok)
    events = sum(r.events for r in ok)
    body = sum(r.body_bytes for r in ok)
    if not span or not events:
        return "the server flooded its stream faster than one client process parses it"
    return (
        f"the server flooded its stream faster than one client process parses it "
        f"({events / span:,.0f} token events/s, {body / span / 2**20:.1f} MB/s on one stream)"
    )


STALLED_BODY_MIN_S = 1.0
"""A stream the trial's wall-clock limit cut had stalled when no token had come for this long
(and for many of its own gaps, :func:`stalled_streams`): a decode step is milliseconds to a
few hundred of them."""
STALLED_BODY_GAPS = 10.0


def stalled_streams(
    records: Sequence[RequestRecord], cut_at: float
) -> tuple[list[float], list[float], list[float]]:
    """Of the streams cut at ``cut_at`` (the wall-clock limit), how long each had waited: those
    with no response headers yet (since their send), those with headers but no token (since
    their send), and those with tokens but none since :data:`STALLED_BODY_MIN_S` and
    :data:`STALLED_BODY_GAPS` of their own gaps (since their last token).  Streams still
    streaming are in none."""
    headers: list[float] = []
    no_token: list[float] = []
    silent: list[float] = []
    for r in records:
        if not r.cut:
            continue
        if r.status == 0:
            headers.append(cut_at - r.sent)
        elif not r.chunk_times:
            no_token.append(cut_at - r.sent)
        else:
            times = np.frombuffer(r.chunk_times, dtype=np.float64)
            gap = float(np.median(np.diff(times))) if times.size > 1 else 0.0
            quiet = cut_at - float(times[-1])
            if quiet >= max(STALLED_BODY_MIN_S, STALLED_BODY_GAPS * gap):
                silent.append(quiet)
    return headers, no_token, silent


def stall_causes(records: Sequence[RequestRecord], cut_at: float) -> list[str]:
    """What the streams a wall-clock limit cut were stuck on, each named (empty: they were
    streaming): for the reasons of the trial (:func:`no_window_cause`, and the limit's own)."""
    headers, no_token, silent = stalled_streams(records, cut_at)
    out = []
    if headers:
        out.append(
            f"the server was slow to answer headers: {len(headers)} request(s) had no response "
            f"headers {min(headers):.1f} s or more after they were sent"
        )
    if no_token:
        out.append(
            f"the body stalled: {len(no_token)} stream(s) had their response headers but no "
            f"token {min(no_token):.1f} s or more after they were sent"
        )
    if silent:
        out.append(
            f"the body stalled: {len(silent)} stream(s) had brought no token for "
            f"{min(silent):.1f} s or more"
        )
    return out


GAUGE_UNREAD = (
    "whether the server runs fewer than C at once only its running-requests gauge can say, "
    "and it was not read (--perf-server-metrics reads it)"
)
"""Ends a no-window reason whose cause the client cannot see: the server may have queued the
streams (its max-running-requests) or something between them and it held them back.  Before,
the reason said "the server runs fewer than C at once" as a fact, and sent operators whose
server ran 256 at once (the client had stalled) to the wrong flag."""


def gauge_finding(running: int, gauge: str, concurrency: int) -> str:
    """What the server's own running-requests gauge said during a trial whose streams did
    not all start (it replaces :data:`GAUGE_UNREAD`)."""
    if running < concurrency:
        return (
            f"the server's own {gauge} gauge showed at most {running} running while "
            f"{concurrency} were sent: it runs fewer than C at once (see its "
            "max-running-requests)"
        )
    return (
        f"the server's own {gauge} gauge showed {running} running (all {concurrency}): not a "
        "limit of the server's; the stagger is unexplained (a proxy in between?)"
    )


def client_late(
    tr: TrialRecords, client: ClientSignals | None, requests: Sequence[RequestRecord]
) -> str | None:
    """How the load client was late with ``requests`` (their sends waited, or its event loop
    was held at the trial's cut), said with what was measured; None when it was not."""
    late = max((r.sent - r.scheduled for r in requests if r.sent and r.scheduled), default=0.0)
    unsent = sum(1 for r in requests if not r.sent)
    held = client.stall_at(tr.cut_at) if client is not None and tr.cut_at is not None else 0.0
    parts = []
    if unsent:
        parts.append(f"{unsent} of those requests were never sent")
    if late > CLIENT_LAG_LIMIT_S:
        parts.append(f"their requests went out up to {late * 1e3:.0f} ms late")
    if held > CLIENT_LAG_LIMIT_S:
        parts.append(f"its event loop was held {held * 1e3:.0f} ms at the cut")
    if not parts:
        return None
    cpu = f"{client.cpu_share:.0%} of a core" if client is not None else "its CPU unknown"
    how = "stalled" if client is None or client.cpu_share <= CLIENT_BUSY_CPU else "was late"
    return (
        f"the load client {how} ({', '.join(parts)}; it used {cpu}): the client's doing, not "
        "the server's; give the client a quieter core"
    )


def no_window_cause(
    ok: Sequence[RequestRecord],
    tr: TrialRecords,
    concurrency: int,
    open_loop: bool,
    settle_steps: int = MAX_SETTLE_STEPS,
    client: ClientSignals | None = None,
) -> str:
    """Why a trial with successful requests has no steady-state window, as it happened.

    Before, one sentence per protocol guessed: a stationary trial's was "the server runs fewer
    than C at once", which a C=1 trial whose one stream stalled (or whose lumps filled the
    token budget at once) printed too, and so did a trial whose client had stalled.
    """
    return _no_window(ok, tr, concurrency, open_loop, settle_steps, client)[0]


def _no_window(
    ok: Sequence[RequestRecord],
    tr: TrialRecords,
    concurrency: int,
    open_loop: bool,
    settle_steps: int,
    client: ClientSignals | None,
) -> tuple[str, bool, bool]:
    """:func:`no_window_cause`, whether the cause is the client's (a transient one), and
    whether it ends with :data:`GAUGE_UNREAD` (the server's gauge can tell)."""
    if open_loop:
        return (
            "the first request ended after the last arrival (give more requests per trial)",
            False,
            False,
        )
    started = {r.worker: r.first_token for r in ok if r.first_token is not None}
    if tr.over_limit_s is not None and tr.cut_at is not None:
        causes = stall_causes(ok, tr.cut_at)
        text = "the trial's wall-clock limit cut it before its streams made a window"
        return text + (f": {'; '.join(causes)}" if causes else ""), False, False
    waiting_recs = [r for r in tr.records if r.worker not in started]
    if tr.cut_at is not None:
        waiting = concurrency - len(started)
        if waiting > 0 and concurrency > 1 and started:
            head = (
                f"the trial was cut while {waiting} of {concurrency} streams had no token yet, "
                "though the others were streaming"
            )
            late = client_late(tr, client, waiting_recs)
            if late is not None:
                return f"{head}: {late}", True, False
            firsts: dict[int, float] = {}
            for r in waiting_recs:
                if r.sent and (r.worker not in firsts or r.sent < firsts[r.worker]):
                    firsts[r.worker] = r.sent
            needed = max((t for r in ok if (t := r.ttft) is not None), default=0.0)
            out = [tr.cut_at - t for t in firsts.values()]
            measured = (
                f"their requests had been out {min(out):.3f} s or more, while the others' "
                f"first tokens took up to {needed:.3f} s"
                if out
                else "their requests were not sent"
            )
            return f"{head} ({measured}); {GAUGE_UNREAD}", False, True
        if waiting > 0:
            return (
                f"the trial was cut before any of its {concurrency} stream(s) had a token",
                False,
                False,
            )
        last = max(started.values())
        settle = max(settle_steps * step_gap(ok), SETTLE_MIN_S)
        return (
            f"the token budget filled {tr.cut_at - last:.3f} s after the last stream's first "
            f"token, before its settle period ({settle:.3f} s) was over: the tokens came "
            "faster than the streams' steps (in lumps?)",
            False,
            False,
        )
    if concurrency == 1 or len(started) < 2:
        return (
            "each stream's tokens came at one instant, with no span between its first and "
            "last token to time",
            False,
            False,
        )
    head = (
        f"a worker finished its requests before all {concurrency} streams had their first "
        f"token ({len(started)} had one)"
    )
    late = client_late(tr, client, waiting_recs)
    if late is not None:
        return f"{head}: {late}", True, False
    return (
        f"{head}: give each stream several requests (requests_per_stream=4) so that they "
        f"overlap; {GAUGE_UNREAD}",
        False,
        True,
    )


def slow_headers_message(waited_s: float) -> str:
    return (
        f"the server was slow to answer headers: no response headers {waited_s:.1f} s after "
        "the request was sent, when the trial reached its wall-clock limit (it had not begun "
        "its response)"
    )


def usage_reasons(records: Sequence[RequestRecord]) -> str | None:
    """One invalid reason for the requests whose ``usage`` was not believed, or None."""
    bad = [r.usage_error for r in records if r.usage_error is not None]
    if not bad:
        return None
    distinct = list(dict.fromkeys(bad))
    return (
        f"{len(bad)} request(s) reported usage that cannot be true: "
        + "; ".join(distinct[:3])
        + (f" (and {len(distinct) - 3} more)" if len(distinct) > 3 else "")
        + ": the server's token accounting is broken, so no token figure of it stands; fix "
        "its usage reporting (or the proxy that rewrites it)"
    )


def summarize_trial(
    index: int,
    level: LevelSpec,
    tr: TrialRecords,
    *,
    client: ClientSignals,
    ignore_eos: bool,
    settle_steps: int = MAX_SETTLE_STEPS,
) -> TrialResult:
    """Figures and validity of one trial; never raises on bad data, it says what is wrong.
    ``settle_steps``: a stationary trial's, from its time box."""
    records = tr.records
    max_tokens = level.max_tokens
    if tr.over_limit_s is not None and tr.cut_at is not None:
        for r in records:
            if r.cut and r.status == 0 and r.error is None and r.sent:
                # no response at all: a request that failed, not one the limit interrupted
                r.error = slow_headers_message(tr.cut_at - r.sent)
    empty = [r for r in records if is_empty_ok_response(r)]
    failed = [
        r
        for r in records
        if not r.ok and (not r.cut or r.error is not None) and not is_empty_ok_response(r)
    ]
    ok = [r for r in records if r.ok]
    invalid: list[str] = []
    open_loop = level.concurrency is None
    estimated = 0
    check_running_usage(records)
    if tr.cut_at is not None:
        estimated = count_cut_tokens(records, max_tokens)
        # a refused running usage is said with the usage reasons, not as one that was missing
        estimated -= sum(1 for r in records if r.cut and r.chunk_events and r.usage_error)
        window = stationary_window(ok, tr.cut_at, settle_steps)
    else:
        window = open_loop_window(ok) if open_loop else steady_window(ok)
    window_s = window_tokens = 0.0
    tok_s: float | None = None
    transient: list[str] = []
    client_stall: str | None = None
    running_asked: int | None = None
    if window is None:
        if ok:
            cause, by_client, ask = _no_window(
                ok, tr, level.concurrency or 1, open_loop, settle_steps, client
            )
            invalid.append("no steady-state window: " + cause)
            if by_client:
                transient.append(invalid[-1])
                client_stall = invalid[-1]
            if ask:
                running_asked = level.concurrency
    else:
        window_s = window[1] - window[0]
        count = (
            tokens_between
            if tr.cut_at is not None
            else tokens_in_window
            if open_loop
            else tokens_in_steps
        )
        window_tokens = count(ok, *window)
        tok_s = window_tokens / window_s
    if empty:
        invalid.append(f"{len(empty)} request(s) answered 200 with no tokens")
    if ignore_eos:
        short = [
            r.completion_tokens
            for r in ok
            if not r.cut and r.completion_tokens != (r.max_tokens or max_tokens)
        ]
        if short:
            invalid.append(
                f"{len(short)} request(s) returned {sorted(set(short))[:5]} tokens instead of "
                f"max_tokens={max_tokens} under ignore_eos (server ignores ignore_eos, or the "
                "context length truncates)"
            )
    usage = usage_reasons(records)
    if usage is not None:
        invalid.append(usage)
    # a request whose usage was refused counts its events: said above, not as "no usage"
    approx = sum(1 for r in ok if r.tokens_approx and r.usage_error is None)
    lag = client.lag_p99_within(*window) if window is not None else client.loop_lag_p99_s
    lag_limit = max(CLIENT_LAG_LIMIT_S, read_gap_p50(ok))
    delay = send_delay_p99_within(records, window)
    notes: list[str] = []
    busy = client.cpu_share > CLIENT_BUSY_CPU
    late_sends = delay > CLIENT_LAG_LIMIT_S
    flood = flood_reason(records)
    if flood is not None:
        invalid.append(flood)
    if client.cpu_share > CLIENT_CPU_LIMIT or (busy and (late_sends or lag > lag_limit)):
        figures = (
            f"event-loop lag p99 {lag * 1e3:.1f} ms vs limit {lag_limit * 1e3:.1f} ms, send "
            f"delay p99 {delay * 1e3:.1f} ms, CPU {client.cpu_share:.0%} of a core"
        )
        if flood is not None:
            # the flood is the cause, said above: more client processes would parse more of it
            notes.append(f"note: the load client was saturated by the event flood ({figures})")
        elif streams_per_process(tr) <= 1:
            # one stream a process: more processes cannot split it
            invalid.append(
                f"load client saturated by one stream ({figures}): {one_stream_flood(ok)}, "
                "faster than a model decodes; more --perf-workers cannot split one stream: "
                "fix the server (or the proxy in front of it)"
            )
        else:
            invalid.append(
                f"load client saturated ({figures}): the figure would be the client's limit; "
                "shard the client with --perf-workers"
            )
    elif late_sends:
        # Sends late while the client was mostly idle: it waited for a CPU (descheduled), it
        # did not run out of one.  The server still had fewer requests than asked, so the
        # trial is void, but for the moment only: another trial may replace it.
        invalid.append(
            f"load client stalled: its sends were late by {delay * 1e3:.1f} ms (p99) while it "
            f"used {client.cpu_share:.0%} of a core; another process or the machine took its "
            "core, so the server had fewer requests than asked: give the client a quieter core"
        )
        transient.append(invalid[-1])
        client_stall = invalid[-1]
    elif lag > lag_limit and window is not None:
        stall = client.lag_max_within(*window)
        bound = (client.stall_at(window[0]) + client.stall_at(window[1])) / window_s
        text = (
            f"load client stalled: its event loop waited up to {stall * 1e3:.0f} ms (p99 "
            f"{lag * 1e3:.1f} ms) for a CPU while using {client.cpu_share:.0%} of a core; another "
            "process or the machine took its core"
        )
        if bound > STALL_ERROR_LIMIT:
            invalid.append(
                f"{text}, so tok/s could be off by up to {bound:.1%} (more than "
                f"{STALL_ERROR_LIMIT:.0%}): give the client a quieter core"
            )
            transient.append(invalid[-1])
        else:
            notes.append(
                f"note: {text}; tok/s is off by at most {bound:.2%}, latencies by the stall "
                "(they are left out of the latency figures)"
            )
        client_stall = text
    # a client saturated by several streams a process reads each late, in lumps of its own
    # making; one stream a process has nothing else to be late for
    saturated = any(msg.startswith("load client saturated") for msg in invalid)
    crowded = saturated and streams_per_process(tr) > 1
    buffered = None if crowded else buffered_reason(ok, client)
    if buffered is not None:
        # first: a lumped stream is why its window is short or missing, and the first reason
        # is the one a refused baseline names
        invalid.insert(0, buffered)
    errors: list[str] = []
    for r in failed:
        if r.error and r.error not in errors:
            errors.append(r.error)
        if len(errors) >= 3:
            break
    if approx:
        errors.append(f"note: {approx} request(s) sent no usage; tokens counted from events")
    if estimated:
        errors.append(
            f"note: {estimated} stream(s) cut by the time box carried no running usage "
            "(continuous_usage_stats); their tokens were estimated from their events"
        )
    errors.extend(notes)
    return TrialResult(
        index=index,
        label=level.label,
        tok_s=tok_s,
        window_s=window_s,
        window_tokens=window_tokens,
        requests_ok=len(ok),
        requests_failed=len(failed) + len(empty),
        wall_s=tr.ended - tr.started,
        client=client,
        invalid=invalid,
        errors=errors,
        stopped_early=tr.stopped_early,
        records=records,
        offered_rate=level.rate,
        achieved_rate=getattr(tr, "achieved_rate", None),
        completed_rate=completed_rate(ok, window) if open_loop else None,
        window=window,
        transient=transient,
        client_stall=client_stall,
        running_asked=running_asked,
    )


@dataclass(slots=True)
class LevelFigures:
    """The level's headline figures over all its trials (what the report prints)."""

    tok_s: float | None
    trials_tok_s: list[float]
    spread_pct: float | None
    request_tok_s_p50: float | None
    ttft_s_p50: float | None
    ttft_s_p95: float | None
    itl_s_p50: float | None
    requests_ok: int
    requests_failed: int
    percentile: float = 95.0
    ttft_s_pct: float | None = None
    itl_s_pct: float | None = None
    e2e_s_pct: float | None = None
    """TTFT, inter-token latency and end-to-end latency at ``percentile``."""
    goodput: float | None = None
    """Share of requests meeting every latency ceiling (None when no ceiling is set)."""
    reasoning: ReasoningFigures | None = None
    """Reasoning and content apart; None unless some stream of the level separated them."""
    clock: float = 1.0
    """Server seconds per wall second the figures were converted with (the simulator's speed;
    1.0 for a real server): tok/s are divided by it, latencies multiplied."""
    achieved_rate: float | None = None
    """Open loop: median achieved request rate of the trials, per server second."""
    completed_rate: float | None = None
    """Open loop: median rate of finished requests in the trials' windows, per server second."""


@dataclass(slots=True)
class ReasoningFigures:
    """A reasoning model's two phases, for a level whose streams carried reasoning deltas.

    Why apart from TTFT and tok/s: with a reasoning parser the user waits through the thinking
    before the answer starts, so time to first *content* token (TTFC) is the latency they
    feel, while TTFT (first token of any kind) and tok/s (all output tokens, thinking
    included) stay what the server's batching delivers.  Token figures are means per
    successful request, so levels with different trial counts compare.
    """

    requests: int
    """Successful requests whose stream carried reasoning."""
    reasoning_tokens_mean: float
    content_tokens_mean: float
    """Reasoning and content (answer) tokens per successful request; they sum to all output."""
    ttfc_s_p50: float | None
    ttfc_s_p95: float | None
    ttfc_s_pct: float | None
    """Time to first content token at p50, p95 and the level's percentile (like TTFT)."""
    no_content: int = 0
    """Requests that ended still reasoning (``max_tokens`` hit while thinking): they have no
    TTFC and are left out of its percentiles, so a TTFC next to a non-zero count is optimistic."""


def reasoning_figures(
    ok: Sequence[RequestRecord], percentile_q: float, clock: float = 1.0
) -> ReasoningFigures | None:
    """:class:`ReasoningFigures` of the successful requests, None when none carried reasoning
    (a level without a reasoning parser shows nothing new)."""
    thinking = sum(1 for r in ok if r.reasoning_tokens)
    if not thinking:
        return None
    ttfcs = [x * clock for x in (r.ttfc for r in ok) if x is not None]
    return ReasoningFigures(
        requests=thinking,
        reasoning_tokens_mean=sum(r.reasoning_tokens for r in ok) / len(ok),
        content_tokens_mean=sum(r.content_tokens for r in ok) / len(ok),
        ttfc_s_p50=percentile(ttfcs, 50),
        ttfc_s_p95=percentile(ttfcs, 95),
        ttfc_s_pct=percentile(ttfcs, percentile_q),
        no_content=sum(1 for r in ok if r.first_content is None),
    )


@dataclass(frozen=True, slots=True)
class LatencyLimits:
    """Per-request ceilings that define a *good* request for goodput."""

    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    def any(self) -> bool:
        return any(x is not None for x in (self.ttft_s, self.itl_s, self.e2e_s))

    def met_by(self, rec: RequestRecord) -> bool:
        """TTFT, mean time per output token after the first (1 / decode rate), and end to end."""
        if self.ttft_s is not None and (rec.ttft is None or rec.ttft > self.ttft_s):
            return False
        if self.itl_s is not None:
            rate = rec.decode_tok_s
            if rate is None or 1.0 / rate > self.itl_s:
                return False
        return self.e2e_s is None or rec.e2e <= self.e2e_s


def level_figures(
    trials: Sequence[TrialResult],
    percentile_q: float = 95.0,
    limits: LatencyLimits = LatencyLimits(),
    clock: float = 1.0,
) -> LevelFigures:
    """The level's figures in the server's clock: records and trials are timed on the wall
    clock (the client's saturation checks need it); ``clock`` server seconds pass per wall
    second, so rates are divided by it and latencies (and the latency ceilings, given in
    server seconds) multiplied."""
    samples = [t.tok_s / clock for t in trials if t.valid and t.tok_s is not None]
    # a trial whose load client stalled times the client as much as the server: none of its
    # requests is in the latency figures (:attr:`TrialResult.latency_void`)
    timed = [t for t in trials if t.latency_void is None and t.client_stall is None]
    ok = [r for t in timed for r in t.records if r.ok]
    # streams a time box cut have no end, and a stationary trial's staggered first requests
    # (their own max_tokens) are shorter than the level's: both out of end-to-end latency
    # and goodput
    everyone = [r for t in timed for r in t.records if not r.cut and not r.max_tokens]
    whole = [r for r in ok if not r.cut and not r.max_tokens]
    rates = [x / clock for x in (r.decode_tok_s for r in ok) if x is not None]
    ttfts = [x * clock for x in (r.ttft for r in ok) if x is not None]
    itls = inter_token_latencies(ok) * clock
    mid = median(samples) if samples else None
    spread = (max(samples) - min(samples)) / mid * 100 if mid and len(samples) > 1 else None
    goodput = None
    if limits.any() and everyone:
        wall = LatencyLimits(
            *(None if x is None else x / clock for x in (limits.ttft_s, limits.itl_s, limits.e2e_s))
        )
        goodput = sum(1 for r in everyone if r.ok and wall.met_by(r)) / len(everyone)
    achieved = [t.achieved_rate / clock for t in trials if t.achieved_rate is not None]
    completed = [t.completed_rate / clock for t in trials if t.completed_rate is not None]
    return LevelFigures(
        tok_s=mid,
        trials_tok_s=samples,
        spread_pct=spread,
        request_tok_s_p50=percentile(rates, 50),
        ttft_s_p50=percentile(ttfts, 50),
        ttft_s_p95=percentile(ttfts, 95),
        itl_s_p50=percentile(itls, 50),
        requests_ok=sum(t.requests_ok for t in trials),
        requests_failed=sum(t.requests_failed for t in trials),
        percentile=percentile_q,
        ttft_s_pct=percentile(ttfts, percentile_q),
        itl_s_pct=percentile(itls, percentile_q),
        e2e_s_pct=percentile([r.e2e * clock for r in whole], percentile_q),
        goodput=goodput,
        reasoning=reasoning_figures(ok, percentile_q, clock),
        clock=clock,
        achieved_rate=median(achieved) if achieved else None,
        completed_rate=median(completed) if completed else None,
    )
