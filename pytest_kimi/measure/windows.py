"""Each trial's window as a third party can check it: bounds, clock, tokens, requests.

A level's figure is a median of its trials' aggregate tok/s, and a trial's figure is the tokens
the streams received inside its steady-state window over the window's length.  A report that
gives only the median is a claim; one that gives every trial's window (its bounds on the
client's monotonic clock, that clock's offset to the wall clock, the tokens counted in it)
lets anyone recompute each trial's figure and hold it against their own source: a server's
log, its Prometheus counters over the same span (``CLOCK_MONOTONIC`` is shared by every
process of a Linux machine, so a server beside the client can read the same instants), or
the per-request lines of ``--perf-requests``.

Every trial measured has a window record, including the ones voided for a transient reason
and measured again (``kept`` false): what the client sent to the server is all accounted for,
not only what the statistics used.  No pytest here; the level's JSON carries them
(:meth:`pytest_kimi.measure.results.LevelResult.to_dict`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.wire import TrialWindowEntry


def unix_offset() -> float:
    """``time.time() - time.perf_counter()`` now: add it to a ``perf_counter`` instant to get
    its Unix time.

    The two clocks are read as a pair, the wall clock between two reads of the monotonic one,
    so the offset is good to the pair's own duration (a microsecond or so).  Taken once per
    trial: an NTP slew moves the wall clock by parts per million, nothing over a trial, but a
    step of the clock between trials is then seen in the next trial's offset, not hidden.
    """
    before = time.perf_counter()
    wall = time.time()
    after = time.perf_counter()
    return wall - (before + after) / 2


@dataclass(frozen=True, slots=True)
class TrialWindow:
    """One trial's steady-state window, as the JSON's ``trial_windows`` entry gives it."""

    trial: int
    """0-based, in the order the level's trials were measured, replaced ones included: the
    ``trial`` of the trial's lines in ``--perf-requests``."""
    kept: bool
    """False: voided for a transient reason (a client stall) and measured again; its figure
    is not one of the level's samples (``replaced_trials`` says why)."""
    valid: bool
    """Kept and valid: its ``tok_s`` is one of the level's ``trials_tok_s`` (in order)."""
    start_monotonic: float | None
    """[start, end) of the window on ``time.perf_counter()`` (``CLOCK_MONOTONIC`` on Linux),
    wall seconds; None when the trial had no window."""
    end_monotonic: float | None
    unix_offset: float
    """Add to a ``perf_counter`` instant of this trial for its Unix time."""
    tokens: float
    """Output tokens the streams received inside the window (fractional: a stream's position
    at an edge is interpolated between its reads)."""
    tok_s: float | None
    """``tokens / (end - start)`` divided by ``clock``: in the server's clock, as the level's
    ``tok_s`` and ``trials_tok_s`` are (the simulator's speed; 1 for a real server)."""
    requests: int
    """Requests the trial sent (every one has a line in ``--perf-requests``)."""
    cut: int
    """Streams the trial's time box ended on purpose (stationary protocol)."""
    reason: str | None = None
    """Why the trial does not count (its first invalid reason); None for a valid one."""
    result: TrialResult | None = field(default=None, repr=False, compare=False)
    """The trial itself, for the sinks that need its requests (``--perf-requests``); the JSON
    does not carry it."""

    @property
    def start_unix(self) -> float | None:
        """The window's start on the wall clock (Unix seconds)."""
        if self.start_monotonic is None:
            return None
        return self.start_monotonic + self.unix_offset

    def to_dict(self) -> TrialWindowEntry:
        """The JSON entry.  Bounds unrounded (a rounded end would move ``tok_s`` on a short
        window); ``tok_s`` rounded as ``trials_tok_s`` is, so the two compare equal."""
        start_unix = self.start_unix
        return {
            "trial": self.trial,
            "kept": self.kept,
            "valid": self.valid,
            "start_monotonic": self.start_monotonic,
            "end_monotonic": self.end_monotonic,
            "start_unix": None if start_unix is None else round(start_unix, 6),
            "unix_offset": self.unix_offset,
            "tokens": round(self.tokens, 3),
            "tok_s": None if self.tok_s is None else round(self.tok_s, 2),
            "requests": self.requests,
            "cut": self.cut,
            "reason": self.reason,
        }


def trial_window(
    trial: TrialResult, number: int, *, kept: bool, clock: float, offset: float
) -> TrialWindow:
    """The window record of ``trial``, the level's ``number``-th trial measured; ``clock``:
    server seconds per wall second (tok/s are divided by it, as the level's figures are)."""
    start, end = trial.window if trial.window is not None else (None, None)
    return TrialWindow(
        trial=number,
        kept=kept,
        valid=kept and trial.valid,
        start_monotonic=start,
        end_monotonic=end,
        unix_offset=offset,
        tokens=trial.window_tokens,
        tok_s=None if trial.tok_s is None else trial.tok_s / clock,
        requests=len(trial.records),
        cut=sum(1 for r in trial.records if r.cut),
        reason=_reason(trial),
        result=trial,
    )


def _reason(trial: TrialResult) -> str | None:
    if trial.invalid:
        return trial.invalid[0]
    if trial.tok_s is None:
        return "no steady-state window: no request of the trial succeeded"
    return None
