"""Why a trial is void, as it happened: buffered or flooded streams, stalls, no window, a late client.

Why a module of its own: each reason names the cause the records show (the server's, a
proxy's or the load client's), with what was measured, so that an operator is sent to the
right fix; the trial's summary (:func:`pytest_kimi.measure.metrics.summarize_trial`) only
decides which of them apply.  Before, one sentence per protocol guessed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.load.trial_book import LAG_INTERVAL_S
from pytest_kimi.measure.client_signals import CLIENT_BUSY_CPU, CLIENT_LAG_LIMIT_S, ClientSignals
from pytest_kimi.measure.stream_timing import step_gap
from pytest_kimi.measure.time_box import MAX_SETTLE_STEPS, SETTLE_MIN_S

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


def _held_before_lump(ok: Sequence[RequestRecord], client: ClientSignals | None) -> float | None:
    """How long the client's event loop had been held when it read a stream's one lump, where
    that stall covers at least half the stream's time from its send (so the tokens may have
    streamed while nobody read them); None where no stream's lump is so explained."""
    if client is None:
        return None
    held = []
    for r in ok:
        if r.first_token is None or not r.sent:
            continue
        stall = client.stall_before(r.first_token)
        if stall > CLIENT_LAG_LIMIT_S and stall >= 0.5 * (r.first_token - r.sent):
            held.append(stall)
    return max(held) if held else None


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
        held = _held_before_lump(ok, client)
        if held is not None:
            # the tokens waited in the client's socket while its loop could not run: the
            # client's doing, void for the moment; a server that buffers does it again
            return (
                "each stream's tokens came at one instant, read after the load client's event "
                f"loop had been held {held * 1e3:.0f} ms (most of the stream's time): the "
                "client's doing, not the server's; give the client a quieter core",
                True,
                False,
            )
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
