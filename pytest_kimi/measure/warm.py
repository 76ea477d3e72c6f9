"""Warm a fresh server until its figures are stationary, before anything is measured on it.

A server straight after its launch is slow for a while: first-use costs the plugin's short
warm-up requests do not cover (JIT-compiled kernels on first shapes, autotuning, allocator
growth; on the CPU engine, caches and page faults).  Real SGLang 0.5.23 read C=1 trials of
83.7, 127.1 and 140.4 tok/s after a start, against ~170-184 in the runs after it: a run right
after a launch, which is every run of a deploy gate, was biased low by up to 27% at its median.

So the first test measured on a server (the caller knows which are fresh) first runs trials
of its first level that count for nothing, until the data say the rise is over: the best
figure so far has not risen by more than :data:`WARM_RISE` over the last :data:`STILL_TRIALS`
trials.  A warming server keeps setting new highs; a steady one sets a new high ever more
rarely (the k-th of k steady trials is the highest with chance 1/k), so the rule stops it after
a few trials whatever its trial noise.  Comparing with the best so far, not with the trial
before, keeps one noisy dip from ending the warm-up of a server still rising (vLLM's CPU
engine read 293 then 148 tok/s: a rule on the last two trials called that stationary).  At
least :data:`MIN_WARM_TRIALS`, at most :data:`MAX_WARM_TRIALS`: the bound; a server whose
figures keep rising is said to be so in the report, and measured.  Warm trials that give no
figure :data:`VOID_IN_A_ROW` times in a row end the warm-up too: more of them cannot show a
rise; and one that ran past its wall-clock limit ends it at once: a server that hangs holds
each such trial for its whole limit (eight of them would be eight limits before the first
measured trial).  The level's own trials then say why.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.wire import WarmUpEntry

WARM_RISE = 0.005
"""A new high of the log tok/s above the best before it by more than this (half a percent)
means the server may still be warming."""
STILL_TRIALS = 2
"""Trials in a row without such a new high that end the warm-up: one could be a dip."""
MIN_WARM_TRIALS = 1 + STILL_TRIALS
"""A first trial to set the best, and the trials that show it no longer rises."""
MAX_WARM_TRIALS = 8
"""The bound: a server still rising after eight trials is reported as such and measured."""
VOID_IN_A_ROW = 2
"""Warm trials in a row without a figure that end the warm-up (one could be a stalled client)."""
WARM_INDEX = 1_000_000
"""Trial indices of the warm trials (seeds of open-loop arrivals), apart from the measured."""


@dataclass(slots=True)
class WarmUp:
    """The warm trials of a fresh server: what they read and whether they settled."""

    level: str
    tok_s: list[float] = field(default_factory=list)
    """The valid warm trials' tok/s, in order."""
    void: int = 0
    """Warm trials that gave no figure (invalid: a stalled client, an error)."""
    stationary: bool = False
    no_figure: bool = False
    """Ended by :data:`VOID_IN_A_ROW` trials in a row without a figure, or by one that ran
    past its wall-clock limit."""
    over_limit: bool = False
    """Ended by a trial that ran past its wall-clock limit."""

    def text(self) -> str:
        figures = " -> ".join(f"{x:.1f}" for x in self.tok_s) or "no figure"
        n = len(self.tok_s) + self.void
        if self.stationary:
            state = f"stationary after {n} trial(s)"
        elif self.no_figure:
            why = (
                "the last ran past its wall-clock limit"
                if self.over_limit
                else f"the last {VOID_IN_A_ROW} gave no figure"
            )
            state = (
                f"stopped after {n} trial(s): {why}, so warming cannot show a rise; the first "
                "measured trials may read low"
            )
        else:
            state = (
                f"still rising after {n} trial(s) (the bound): the first measured trials may "
                "read low"
            )
        void = f", {self.void} void" if self.void else ""
        return f"warm-up on a fresh server: {self.level} {figures} tok/s, {state}{void}"

    def to_dict(self) -> WarmUpEntry:
        return {
            "level": self.level,
            "tok_s": [round(x, 2) for x in self.tok_s],
            "void": self.void,
            "stationary": self.stationary,
            "text": self.text(),
        }


def settled(figures: list[float], rise: float = WARM_RISE) -> bool:
    """Whether the figures show the rise is over: at least :data:`MIN_WARM_TRIALS`, and none
    of the last :data:`STILL_TRIALS` above the best before it by more than ``rise`` (on the
    log scale)."""
    if len(figures) < MIN_WARM_TRIALS:
        return False
    for i in range(len(figures) - STILL_TRIALS, len(figures)):
        if math.log(figures[i] / max(figures[:i])) > rise:
            return False
    return True


async def warm_until_stationary(
    run: Callable[[int, int], Awaitable[TrialResult]], label: str, clock: float = 1.0
) -> WarmUp:
    """Trials that count for nothing (``run(index, offset)``: one trial of the level named
    ``label``, in the server's ``clock``), until :func:`settled` or the bound."""
    warm = WarmUp(label)
    void_run = 0
    for i in range(MAX_WARM_TRIALS):
        trial = await run(WARM_INDEX + i, i)
        if trial.valid and trial.tok_s and trial.tok_s > 0:
            warm.tok_s.append(trial.tok_s / clock)
            void_run = 0
        else:
            warm.void += 1
            void_run += 1
        if settled(warm.tok_s):
            warm.stationary = True
            break
        if void_run and (void_run >= VOID_IN_A_ROW or trial.over_limit_s is not None):
            warm.no_figure = True
            warm.over_limit = trial.over_limit_s is not None
            break
    return warm


__all__ = [
    "MAX_WARM_TRIALS",
    "MIN_WARM_TRIALS",
    "STILL_TRIALS",
    "VOID_IN_A_ROW",
    "WARM_RISE",
    "WarmUp",
    "settled",
    "warm_until_stationary",
]
