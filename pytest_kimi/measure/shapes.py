"""Figures of the workload shapes beyond a level's headline: conversations and open-loop steps.

* Multi-turn levels (``turns=``): a conversation's turn ``k`` re-sends turns ``1..k-1`` and
  their answers, so its prompt grows turn by turn, and with it the prefill a server does
  (minus what its prefix cache holds).  The level's headline figures mix all turns;
  :func:`turn_figures` tells them apart: the prompt tokens the server's ``usage`` reported per
  turn (what was really sent) and the median time to first token per turn (in the server's
  clock, like every latency), from the records'
  :attr:`~pytest_kimi.load.records.RequestRecord.turn`.
* Open-loop levels (``rate=``, the steps of a ramp): their window starts at the first
  completed request, when the server has had one request's time to fill up.  While it is
  still filling (its queue and its batch grow towards the steady depth, and with them every
  request's time), requests finish more slowly than they arrive even below capacity, so a
  step much shorter than its requests reads as saturated.  :func:`fill_up_note` says so.

Both run once per level, after its trials.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Sequence

from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.wire import TurnEntry

FILL_UP_FACTOR = 2.0
"""An open-loop window shorter than this many request times (p50, first send to end) is
mostly fill-up: the steady state needs about one request time after the first completion
to set in, so a window of two leaves at least half of it steady."""


def turn_figures(trials: Sequence[TrialResult], clock: float = 1.0) -> list[TurnEntry]:
    """One entry per turn that had a successful request: ``turn``, ``requests``,
    ``prompt_tokens_mean`` (None where no request carried a usage count) and ``ttft_s_p50``."""
    by_turn: dict[int, list[Any]] = {}
    for t in trials:
        for r in t.records:
            if r.ok and r.turn > 0 and not r.cut:
                by_turn.setdefault(r.turn, []).append(r)
    out: list[TurnEntry] = []
    for turn in sorted(by_turn):
        records = by_turn[turn]
        prompts = [r.prompt_tokens for r in records if not r.tokens_approx and r.prompt_tokens]
        ttfts = [x * clock for x in (r.ttft for r in records) if x is not None]
        out.append(
            {
                "turn": turn,
                "requests": len(records),
                "prompt_tokens_mean": round(sum(prompts) / len(prompts), 1) if prompts else None,
                "ttft_s_p50": round(median(ttfts), 5) if ttfts else None,
            }
        )
    return out


def fill_up_note(trials: Sequence[TrialResult], clock: float = 1.0) -> str | None:
    """A note when an open-loop level's windows are short against its requests (None: they
    are long enough, or there is nothing to judge); the level's JSON ``fill_up``.  Seconds in
    the server's clock."""
    windows = [t.window_s for t in trials if t.window is not None and t.window_s > 0]
    times = [r.e2e for t in trials for r in t.records if r.ok and r.sent and r.end > r.sent]
    if not windows or not times:
        return None
    window, request = median(windows) * clock, median(times) * clock
    if window >= FILL_UP_FACTOR * request:
        return None
    return (
        f"the window ({window:.3g} s) is under {FILL_UP_FACTOR:g}x a request's time "
        f"({request:.3g} s, p50): the figures and the completed rate include the server "
        "filling up, not only its steady state; send longer (duration_s=, or "
        "ramp(..., duration_s=...))"
    )
