"""How long a stationary trial runs: its settle period and its window, in decode steps.

Why it scales with the request's length: a stationary trial's point is to cost less server
time than whole requests while measuring the same rate.  A fixed box (32 settle steps and a
128-step window, 161 steps a trial) is 8% of a 2048-token request's 2048 steps, but longer
than a 128-token request: there the "cheap" protocol cost about as much as running the
requests whole, or more (issue 21; docs/evidence/gate.md, "Over workload shapes").  So the box
is an eighth of a request, within bounds:

* the window holds at least :data:`MIN_WINDOW_STEPS` steps, and at least
  :data:`READS_PER_WINDOW` of a stream's reads: a server that packs its tokens
  (SGLang's ``--stream-interval``) delivers a stream's tokens ``tokens_per_read`` at a time,
  and the window ends at the last read of the stream cut earliest in its cycle, so up to one
  read's steps of the box are lost at its end;
* at most :data:`MAX_WINDOW_STEPS` steps (a step's jitter has averaged out long before);
* the settle period is a quarter of the window, between :data:`MIN_SETTLE_STEPS` and
  :data:`MAX_SETTLE_STEPS`: C requests arriving at once put the client and the server's
  prefill behind for a few steps, a number that does not grow with the request's length.

Short windows stay accurate because the window's edges use the streams' real token positions
(the running ``usage`` on every chunk), not whole reads; a trial's own noise grows as the
window shrinks (one step's jitter is a larger share of 16 steps than of 128), and the trial
policy adds trials where a level's spread needs them, which ``bench/verdict_cost.py
--matrix`` prices.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_WINDOW_STEPS = 128
"""The window of a long request (1024 tokens and more): the box it had for all lengths."""
MIN_WINDOW_STEPS = 16
"""The shortest window: 16 steps of every stream, a step's jitter still averaged over 16."""
WINDOW_SHARE = 8
"""The window is ``max_tokens / WINDOW_SHARE`` steps between the bounds: a trial costs about
an eighth of a whole request, the settle period and the first tokens besides."""
READS_PER_WINDOW = 2
"""A window holds at least this many reads of a stream (``tokens_per_read`` steps each): it
loses up to one at its end, and the streams' positions between reads are interpolated."""
MAX_SETTLE_STEPS = 32
MIN_SETTLE_STEPS = 4
SETTLE_SHARE = 4
"""Settle steps are a quarter of the window's."""
SETTLE_MIN_S = 0.1
"""...and at least this long on the wall clock (a simulator at speed 20 takes 32 steps in
50 ms, less than a busy client's hiccup)."""
WINDOW_MIN_S = 0.5
"""Wall seconds the longest window lasts at least, and a shorter one in proportion to its
steps (never below :data:`WINDOW_FLOOR_S`): the client's timestamps are good to a millisecond
or so, which is nothing against a real server's 15-170 ms steps (16 steps take 0.24-2.7 s)
but a few percent of a 0.05 s window of a simulator at speed 20."""
WINDOW_FLOOR_S = 0.1
"""The least wall time of any window: a millisecond's error at each edge is 2% of it at most,
against a session noise of 3%; reached only by a fast simulator's short windows."""


@dataclass(frozen=True, slots=True)
class TimeBox:
    """A stationary trial's length in steps of every stream (tokens of one stream)."""

    settle_steps: int
    """Steps after the last stream's first token before the window starts."""
    window_steps: int
    """Steps the window holds."""

    @property
    def steps(self) -> int:
        """Steps a stream runs in the trial: its first token, the settle period, the window."""
        return 1 + self.settle_steps + self.window_steps

    @property
    def window_min_s(self) -> float:
        """Wall seconds the window lasts at least (:data:`WINDOW_MIN_S`)."""
        return max(WINDOW_FLOOR_S, WINDOW_MIN_S * self.window_steps / MAX_WINDOW_STEPS)

    def token_budget(self, concurrency: int) -> int:
        """Tokens the C streams receive in all before the trial's time box ends."""
        return concurrency * self.steps


def time_box(max_tokens: int, tokens_per_read: float = 1.0) -> TimeBox:
    """The time box of a stationary trial whose requests ask for ``max_tokens`` tokens, on a
    server seen to deliver ``tokens_per_read`` tokens per read of a stream (1 unless it packs
    them; the warm-up's streams tell)."""
    window = max(MIN_WINDOW_STEPS, min(MAX_WINDOW_STEPS, max_tokens // WINDOW_SHARE))
    window = max(window, round(READS_PER_WINDOW * max(1.0, tokens_per_read)))
    settle = max(MIN_SETTLE_STEPS, min(MAX_SETTLE_STEPS, window // SETTLE_SHARE))
    return TimeBox(settle_steps=settle, window_steps=window)
