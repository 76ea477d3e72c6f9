"""Where a trial's steady state begins and ends, and the tokens the streams received inside it.

Everything here runs after a trial has ended, so the load engine's hot path never pays for it.
Why a module of its own: the window is the one definition a trial's tok/s rests on (closed
loop, stationary and open loop), and it reads only the request records and the time box.

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
dropped C - 1 tokens of a step whose time the window already held (docs/evidence/accuracy.md,
"The window's edges").  So each end is moved to the *first read of the burst that holds
it*, and the window is half-open, [start, end): it holds every read of the bursts from the one
where the last stream started up to, not including, the one where the first stream ended, and
its length is first read to first read, as many steps as it holds.  First reads, not last
ones: a burst's later reads are late by the client's own work on the earlier ones (a stream's
end costs it more), which differs between the two ends.  A burst ends at a pause of at least half the
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
the rest with the finish, and a mean put every stream's edges a few tokens off (same
section).  A closed-loop window counts the tokens its steps generated, each dated back from the
read that brought it (:func:`tokens_in_steps`).

"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.stream_timing import step_gap
from pytest_kimi.measure.time_box import MAX_SETTLE_STEPS, SETTLE_MIN_S


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
