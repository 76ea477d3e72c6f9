"""How long a trial may run: its wall-clock limit (:class:`TrialLimit`, :func:`trial_limit`)
from the level's fastest trial before, the server's pace so far or the request timeout, and a
stationary trial's time box (:func:`stationary_box`, :func:`box_min_s`).

On its own because it is pure arithmetic over the spec and the pace seen, with its own
constants and reasoning; one trial and the warm-up apply it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.workload.workload_spec import STATIONARY, LevelSpec
from pytest_kimi.measure.trial_causes import stall_causes
from pytest_kimi.measure.measure_spec import MeasureSpec
from pytest_kimi.measure.pace import Pace
from pytest_kimi.measure.time_box import SETTLE_MIN_S, TimeBox, time_box

TTFT_ALLOWANCE_S = 0.1
"""Wall seconds allowed for the streams' first tokens before the settle period starts, in the
trial's minimum duration."""
TRIAL_LIMIT_FACTOR = 4.0
"""A trial's wall-clock limit, in its expected durations (:func:`trial_limit`): the same
load on the same server varies by far less, and the estimate before a level's first trial
scales the pace seen so far linearly with the streams (a server's step grows slower than
that), so only a trial that is not progressing (a stream that sends bytes but no tokens, a
usage that never fills the stationary budget) reaches it."""
TRIAL_LIMIT_SLACK_S = 5.0
"""Wall seconds added to every trial's limit: a short trial's expectation is a fraction of a
second, and a busy machine's scheduling must not reach it."""
OVER_LIMIT = "ran past its wall-clock limit"
"""Begins the reason of a trial cut at its limit (the level stops there: the next trial would
hang as long)."""


@dataclass(frozen=True, slots=True)
class TrialLimit:
    """A trial's wall-clock limit and where it comes from (its reason names both)."""

    expected_s: float
    """How long the trial should take, wall seconds."""
    source: str
    """What says so: the level's fastest trial before, the server's pace so far, the request
    timeout."""
    factor: float = TRIAL_LIMIT_FACTOR
    """1 where the expectation is the request timeout: a bound already, not an estimate."""

    @property
    def limit_s(self) -> float:
        return self.factor * self.expected_s + TRIAL_LIMIT_SLACK_S

    def reason(self, tr: TrialRecords) -> str | None:
        """Why a trial cut at this limit is void (None: it was not cut there), with what its
        streams were stuck on where the records show it
        (:func:`~pytest_kimi.measure.trial_causes.stall_causes`): no headers, headers but no
        token, tokens that stopped; else the guess that fits what remains."""
        if tr.over_limit_s is None:
            return None
        cut = sum(1 for r in tr.records if r.cut)
        scaled = f"{self.factor:g}x " if self.factor != 1 else ""
        causes = stall_causes(tr.records, tr.cut_at) if tr.cut_at is not None else []
        why = (
            "; ".join(causes)
            if causes
            else "its streams were still streaming: a stream that sends bytes but no tokens, "
            "or a usage that never fills the stationary budget?"
        )
        return (
            f"{OVER_LIMIT} of {tr.over_limit_s:.1f} s ({scaled}the {self.expected_s:.1f} s "
            f"expected from {self.source}, plus {TRIAL_LIMIT_SLACK_S:g} s): its {cut} "
            "stream(s) in flight were cut; the server did not finish the trial's work in time "
            f"({why})"
        )


_PACE = "the server's pace so far"
TIMEOUT_SOURCE = "the request timeout"


def stationary_box(level: LevelSpec, pace: Pace | None) -> TimeBox:
    """The time box of a stationary trial of ``level`` (:mod:`pytest_kimi.measure.time_box`):
    scaled to its requests' length, and long enough for a few of a stream's reads where the
    server was seen to pack its tokens (the warm-up's or the last trial's pace)."""
    return time_box(level.max_tokens, pace.tokens_per_read if pace is not None else 1.0)


def box_min_s(box: TimeBox, min_window_s: float = 0.0) -> float:
    """Wall seconds a stationary trial lasts at least: its streams' first tokens, the settle
    period's floor and the window's (or ``min_window_s``, an observer's need, if longer)."""
    return TTFT_ALLOWANCE_S + SETTLE_MIN_S + max(box.window_min_s, min_window_s)


def trial_limit(spec: MeasureSpec, level: LevelSpec, previous_s: float | None = None) -> TrialLimit:
    """How long a trial of ``level`` should take (wall seconds), and so its limit: the level's
    fastest trial before when it had one (every trial of a level, the adaptive policy's
    top-ups too, is held to the same bound); else its plan at the pace seen so far
    (stationary: the time box's steps and the first tokens; whole requests: a stream's requests
    one after the other; open loop: the arrivals and the last one's request); else the request
    timeout."""
    w = spec.send.workload
    if previous_s is not None:
        return TrialLimit(previous_s, "the level's fastest trial before")
    stationary = (
        level.concurrency is not None and w.protocol_for(level, spec.send.protocol) == STATIONARY
    )
    requests = w.requests_for(level)
    duration_s = w.duration_s / spec.send.clock if w.duration_s is not None else None
    pace = spec.state.pace
    if level.concurrency is not None:
        c = level.concurrency
        if stationary:
            box = stationary_box(level, pace)
            min_s = box_min_s(box, spec.watch.min_window_s)
            if pace is None:
                return TrialLimit(min_s + w.timeout_s, TIMEOUT_SOURCE, 1.0)
            # the time box's steps, priced as the tokens of one request of that length
            steps = replace(level, max_tokens=box.steps)
            return TrialLimit(max(min_s, pace.request_s(steps, c)), _PACE)
        per_stream = w.timeout_s if pace is None else pace.request_s(level, c)
        ends = [math.ceil(requests / c) * per_stream] if requests is not None else []
        if duration_s is not None:
            ends.append(duration_s + per_stream)  # in-flight requests finish after it
        if pace is None:
            return TrialLimit(min(ends), TIMEOUT_SOURCE, 1.0)
        return TrialLimit(min(ends), _PACE)
    rate = (level.rate or 1.0) * spec.send.clock
    spans = [requests / rate] if requests is not None else []
    if duration_s is not None:
        spans.append(duration_s)
    arrivals = min(spans, default=0.0)
    cap = w.max_concurrency
    # under max_concurrency the arrivals queue for slots: the cap's rounds of requests
    sent = requests if requests is not None else math.ceil(rate * (duration_s or 0.0))
    rounds = math.ceil(max(1, sent) / cap) if cap is not None else 1
    if pace is None:
        return TrialLimit(
            max(arrivals, (rounds - 1) * w.timeout_s) + w.timeout_s, TIMEOUT_SOURCE, 1.0
        )
    # Little's law at the pace seen: the requests in flight while the arrivals run
    flying = max(1.0, rate * pace.request_s(level, 1))
    if cap is not None and flying > cap:
        # the cap holds the rest back: cap in flight, each slot sending rounds in a row
        return TrialLimit(max(arrivals, rounds * pace.request_s(level, cap)), _PACE)
    return TrialLimit(arrivals + pace.request_s(level, flying), _PACE)
