"""What a test's measurement is asked to do (:class:`MeasureSpec`), in three parts: what to
send (:class:`SendSpec`: the target, the workload, its pre-encoded bodies and how each level's
bodies are built from them), what watches it (:class:`Watchers`: the hooks that plug in,
:class:`TrialPolicy`, :class:`TrialObserver`, :class:`LevelProbe`) and what the trials leave
for the next ones (:class:`TrialState`).

Split so that only the state changes under a measurement: the conductor builds the rest once
per test, and a ``@capacity`` probe derives a copy instead of patching fields.  On its own
because the trial limits, one trial and the level loop all read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

from pytest_kimi.load.request import Target
from pytest_kimi.load.request_ids import TRIAL_ID_BITS
from pytest_kimi.workload.workload_spec import (
    DEFAULT_PROTOCOL,
    LevelSpec,
    Targets,
    Workload,
    ratio_key,
)
from pytest_kimi.workload.prompts import length_bounds
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.pace import Pace
from pytest_kimi.measure.results import LevelResult, ThroughputResult
from pytest_kimi.wire import ClientQueue, LengthDraws, LengthRange, LevelExtra, LevelSummary

DEFAULT_TRIALS = 3


class TrialPolicy(Protocol):
    """Decides, after each trial, whether a level needs more (the adaptive gate plugs in here)."""

    def more_trials(self, level: LevelSpec, samples: Sequence[float]) -> int:
        """How many further trials to run now; 0 ends the level."""
        ...


class TrialObserver(Protocol):
    """Watches each trial from outside the client (``--perf-server-metrics`` plugs in here).

    The measurement knows nothing of what is watched: it calls ``open`` once before the
    warm-up (raising there stops the test before any load is sent), ``before_trial`` right
    before each trial (after the warm-up, so warm-up requests are never in a trial's counts),
    ``after_trial`` once the trial is summarised (appending to ``trial.invalid`` voids the
    sample, before the trial policy sees it), ``level_summary`` at the end of each level (merged
    into ``LevelResult.extra``, i.e. the level's JSON; a ``"notes"`` list in it becomes the
    level's notes instead), and ``close`` at the end, also on error.  The contamination check
    (``MeasureSpec.guard``) is one too, opened and closed around each level instead.
    """

    async def open(self) -> None: ...

    async def before_trial(self) -> None: ...

    async def after_trial(self, trial: TrialResult) -> None: ...

    def level_summary(self) -> LevelSummary: ...

    async def close(self) -> None: ...


class LevelProbe(Protocol):
    """Reads the server before a level's first trial and after its last (the prefix-cache
    hit rate plugs in here: :class:`~pytest_kimi.crosscheck.prefix_cache.PrefixCacheProbe`).
    Best effort: it never raises, and ``end_level`` returns the fields to merge into the
    level's JSON (none when the server had nothing to read)."""

    async def start_level(self) -> None: ...

    async def end_level(self) -> LevelSummary: ...


@dataclass(slots=True)
class FixedTrials:
    """Exactly ``trials`` trials per level."""

    trials: int = DEFAULT_TRIALS

    def more_trials(self, level: LevelSpec, samples: Sequence[float]) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class SendSpec:
    """What a test sends: the target, the workload, its pre-encoded bodies and how each level's
    bodies are built from them.  Frozen: built once before any load (``build_send``), read by
    every trial; a ``@capacity`` probe that varies the workload's seed derives a copy."""

    nodeid: str
    target: Target
    workload: Workload
    targets: Targets
    bodies: dict[int | None, list[bytes]]
    """Pre-encoded request bodies per input_tokens (None: the prompt set), at max_tokens 0;
    :meth:`bodies_for` sets the level's max_tokens."""
    prompts_keys: dict[int | None, str]
    unique_slot: bytes | None = None
    """Where each body holds its request's unique id (:data:`~pytest_kimi.workload.prompts.UNIQUE_SLOT`);
    None: bodies are sent as encoded, repeating every pass (prefix-cache hits)."""
    sizing: dict[int | None, str] = field(default_factory=dict)
    """How synthetic prompts of each input_tokens were sized (reports show it)."""
    unique_salt: int = 0
    """Offsets this measurement's trial ranges (from its run token), so another test's
    requests start with other ids as well as another token."""
    protocol: str = DEFAULT_PROTOCOL
    """Closed-loop trial protocol where the marker leaves it open (``--perf-protocol``)."""
    clock: float = 1.0
    """Server seconds per wall second (the simulator's speed; 1.0 for a real server).  Loads
    and figures are in the server's clock: an open-loop rate of 2/s is sent at ``2 * clock``
    per wall second, a duration of 60 s lasts ``60 / clock`` wall seconds, and tok/s and
    latencies are converted back, so targets mean the same on the simulator and on EP8."""
    output_tokens: dict[int | None, list[int]] = field(default_factory=dict)
    """A dataset's own output length of each body (0: the level's ``max_tokens``); a level
    caps them at its ``max_tokens`` (:meth:`lengths_for`).  Empty: every body has the level's."""
    warmup_bodies: int = 2
    """Distinct bodies the warm-up cycles through: one per shared-prefix group, so the groups'
    system prompts are in the server's cache before the first level."""

    def _raws(self, level: LevelSpec) -> list[bytes]:
        """The level's encoded bodies (at ``max_tokens`` 0); under an output range at least
        one per drawn length (a prompt set shorter than the draws is cycled), so body ``k``
        has draw ``k``."""
        raws = self.bodies[level.input_tokens]
        drawn = self.workload.output_lengths(level.max_tokens)
        if drawn is None or len(raws) >= len(drawn):
            return raws
        return [raws[k % len(raws)] for k in range(len(drawn))]

    def lengths_for(self, level: LevelSpec) -> list[int] | None:
        """Each body's ``max_tokens`` at this level; None when all have the level's: a
        dataset's own lengths (capped at the level's), or ``range_ratio``'s draws."""
        drawn = self.workload.output_lengths(level.max_tokens)
        if drawn is not None:
            return [drawn[k % len(drawn)] for k in range(len(self._raws(level)))]
        own = self.output_tokens.get(level.input_tokens)
        if own is None:
            return None
        return [min(n, level.max_tokens) if n else level.max_tokens for n in own]

    def bodies_for(self, level: LevelSpec) -> list[bytes]:
        """The level's bodies, each with its own ``max_tokens`` written in."""
        raws = self._raws(level)
        lengths = self.lengths_for(level) or [level.max_tokens] * len(raws)
        return [
            _running_usage(raw).replace(MAX_TOKENS_SLOT, b'"max_tokens":%d' % n, 1)
            for raw, n in zip(raws, lengths)
        ]

    def length_info(self, level: LevelSpec) -> LevelExtra:
        """``range_ratio``'s draws at this level, for its JSON (``length_range``): the ratio,
        the ranges drawn from, and what the draws came to (empty without a range)."""
        w = self.workload
        if w.range_ratio is None:
            return {}
        out: LengthRange = {"range_ratio": ratio_key(w.range_ratio)}
        in_ratio, out_ratio = w.range_ratio
        if draws := _draws(w.input_lengths(level.input_tokens), level.input_tokens, in_ratio):
            out["input_tokens"] = draws
        if draws := _draws(w.output_lengths(level.max_tokens), level.max_tokens, out_ratio):
            out["max_tokens"] = draws
        return {"length_range": out}

    def stationary_openers(self, level: LevelSpec, offset: int) -> tuple[list[bytes], list[int]]:
        """The first request of each of the level's C streams, and its ``max_tokens``.

        Stream ``w`` opens with ``ceil((w + 0.5) / C * max_tokens)`` tokens: the streams then
        finish their first requests one after another, evenly over a request's length, and
        from there on every decode position is held by one stream -- the batch is in its
        steady mix from the first steps, so any window of it measures the same rate.  Under
        an output range (``range_ratio``) the fraction is of the stream's own body's drawn
        length: each opens part way through a request of the drawn mix.
        """
        c = level.concurrency or 1
        raws = rotated(self._raws(level), offset)
        own = self.lengths_for(level)
        full = rotated(own, offset) if own is not None else [level.max_tokens] * len(raws)
        lengths = [max(1, math.ceil((w + 0.5) / c * full[w % len(full)])) for w in range(c)]
        bodies = [
            _running_usage(raws[w % len(raws)]).replace(MAX_TOKENS_SLOT, b'"max_tokens":%d' % n, 1)
            for w, n in enumerate(lengths)
        ]
        return bodies, lengths

    def prompts_key(self, level: LevelSpec) -> str:
        return self.prompts_keys[level.input_tokens]


LevelInfo = Callable[[LevelSpec], tuple[LevelExtra, list[str]]]
"""Per level: the workload's sections for its JSON and notes for its reports."""


@dataclass(frozen=True, slots=True)
class Watchers:
    """What plugs into a measurement around its trials and levels: the trial policy, the
    observers, the level probe and the level sinks.  Frozen: the conductor builds them once
    per test (:func:`~pytest_kimi.run.measurer.watchers_for`); a ``@capacity`` search derives a
    copy with its stall check around the observer."""

    policy: TrialPolicy = field(default_factory=FixedTrials)
    observer: TrialObserver | None = None
    """Checks each trial against another source (the server's counters); None: none."""
    min_window_s: float = 0.0
    """Wall seconds a stationary window lasts at least whatever its time box, for the
    observer's sake: the server-counter check needs a few of its scrapes inside the window
    (:attr:`~pytest_kimi.crosscheck.server_metrics.ServerMetricsObserver.min_window_s`)."""
    guard: TrialObserver | None = None
    """The contamination check every perf test carries
    (:class:`~pytest_kimi.crosscheck.contamination.ContaminationCheck`), beside ``observer``:
    opened and closed around each level by :func:`~pytest_kimi.measure.trials.measure_level`
    itself, so every path that measures levels (a sweep, a capacity search) has it; None: none."""
    level_info: LevelInfo | None = None
    """Per level: fields for its JSON (a dataset's sample at the level's cap, the shared
    prefix) and notes for its reports (estimated lengths, a sample too small for C)."""
    level_probe: LevelProbe | None = None
    """Reads the server around each level (its prefix-cache hit rate); None: nothing read."""
    level_done: Callable[[LevelResult], None] | None = None
    """Called with each level once it is final, before the next one starts
    (``--perf-requests`` appends its requests there, so an interrupted run keeps the levels it
    finished); a capacity top-up calls it again with the merged level.  It must not raise."""


@dataclass(slots=True)
class TrialState:
    """What a measurement's trials leave for the next ones: the only mutable part of a
    :class:`MeasureSpec`, shared by the copies a ``@capacity`` search derives."""

    trial_serial: int = 0
    """Trials (and warm-ups) started so far: each gets its own range of request numbers, so
    prompts stay unique across trials and levels."""
    pace: Pace | None = None
    """How fast the server answered so far (the warm-up, the trials): sizes each trial's
    wall-clock limit before the level has a trial of its own."""
    partial: ThroughputResult | None = None
    """Set by :func:`~pytest_kimi.measure.trials.measure_test`: the result it fills level by
    level, so an interrupted measurement (Ctrl-C, SIGTERM) can still report the levels it
    finished."""
    queue_waits: dict[tuple[LevelSpec, int], list[float]] = field(default_factory=dict)
    """Under ``max_concurrency``: per (level, trial index) how long each arrival waited for a
    slot, wall seconds (a replaced trial's are overwritten by the trial that replaces it);
    :meth:`MeasureSpec.annotate_level` summarises and drops them."""


@dataclass(frozen=True, slots=True)
class MeasureSpec:
    """Everything :func:`~pytest_kimi.measure.trials.measure_test` needs besides the client:
    what to send (frozen), what watches it (frozen), how many trials a level starts with,
    and the trials' state (the one mutable part)."""

    send: SendSpec
    watch: Watchers = field(default_factory=Watchers)
    trials: int = DEFAULT_TRIALS
    fresh_server: bool = False
    """The first test on a server just started (or first seen): warm it until its figures
    are stationary before the levels (:mod:`pytest_kimi.measure.warm`)."""
    state: TrialState = field(default_factory=TrialState)

    def annotate_level(self, result: LevelResult, trials: Sequence[TrialResult]) -> None:
        """The workload knobs' part of a finished level: ``range_ratio``'s draws
        (``length_range``) and, under ``max_concurrency``, how late the cap let the arrivals
        go (``client_queue``, server seconds, and a note that reports show)."""
        level = result.spec
        result.extra.update(self.send.length_info(level))
        cap = self.send.workload.max_concurrency
        if cap is None or level.rate is None:
            return
        kept = [self.state.queue_waits.pop((level, t.index), []) for t in trials]
        waits = [x * self.send.clock for trial_waits in kept for x in trial_waits]
        for key in [k for k in self.state.queue_waits if k[0] == level]:
            del self.state.queue_waits[key]
        if not waits:
            return
        ranked = sorted(waits)
        queued = [x for x in waits if x > 0]

        def pct(q: float) -> float:
            return ranked[min(len(ranked) - 1, max(0, math.ceil(q / 100 * len(ranked)) - 1))]

        summary: ClientQueue = {
            "max_concurrency": cap,
            "arrivals": len(waits),
            "queued": len(queued),
            "wait_s_mean": round(sum(waits) / len(waits), 5),
            "wait_s_p50": round(pct(50), 5),
            "wait_s_p90": round(pct(90), 5),
            "wait_s_p99": round(pct(99), 5),
            "wait_s_max": round(ranked[-1], 5),
        }
        result.extra["client_queue"] = summary
        achieved = result.figures.achieved_rate
        sent = f"; sent at {achieved:.3g}/s of the offered {level.rate:g}/s" if achieved else ""
        if queued:
            note = (
                f"max_concurrency={cap}: {len(queued)} of {len(waits)} arrivals waited for a "
                f"free slot (p50 {summary['wait_s_p50']:.3g} s, p99 {summary['wait_s_p99']:.3g} "
                f"s, max {summary['wait_s_max']:.3g} s, in the server's seconds){sent}"
            )
        else:
            note = f"max_concurrency={cap}: no arrival waited for a slot{sent}"
        result.errors.append(f"note: {note}")

    def next_unique(self) -> dict[str, Any]:
        """Plan fields for the next trial's unique prompts (none when the spec repeats bodies)."""
        send, state = self.send, self.state
        if send.unique_slot is None:
            return {}
        state.trial_serial += 1
        serial = (state.trial_serial + send.unique_salt) % (1 << (48 - TRIAL_ID_BITS))
        return {"unique_slot": send.unique_slot, "unique_base": serial << TRIAL_ID_BITS}


def _draws(lengths: Sequence[int] | None, value: int | None, ratio: float) -> LengthDraws | None:
    """One length's draws under ``range_ratio`` for the level's JSON (None: not drawn)."""
    if lengths is None or value is None:
        return None
    return {
        "range": list(length_bounds(value, ratio)),
        "draws": len(lengths),
        "mean": round(sum(lengths) / len(lengths), 1),
        "min": min(lengths),
        "max": max(lengths),
    }


MAX_TOKENS_SLOT = b'"max_tokens":0'
"""Bodies are encoded once with this placeholder; a level fills in its own max_tokens."""
_USAGE_OPTION = b'"stream_options":{"include_usage":true}'
_RUNNING_USAGE_OPTION = b'"stream_options":{"include_usage":true,"continuous_usage_stats":true}'


def _running_usage(raw: bytes) -> bytes:
    """Every measured body asks for the usage on every chunk (``continuous_usage_stats``),
    whatever the protocol: each read's running usage is the exact position of its tokens
    (:meth:`~pytest_kimi.load.records.RequestRecord.read_positions`; SGLang packs 1, then
    ``stream_interval``, then the rest, so a mean per event misplaces a window's edges), and
    the streams a stationary time box cuts never get a final usage
    (:func:`~pytest_kimi.measure.metrics.count_cut_tokens`).  A server that ignores the
    option costs nothing: the parser looks for it once, at a stream's first token read."""
    return raw.replace(_USAGE_OPTION, _RUNNING_USAGE_OPTION, 1)


_T = TypeVar("_T")


def rotated(bodies: list[_T], offset: int) -> list[_T]:
    """Bodies (or their lengths) starting at ``offset``: successive trials continue through
    the prompt set."""
    k = offset % len(bodies)
    return bodies[k:] + bodies[:k]
