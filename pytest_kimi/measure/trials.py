"""Run a test's workload level by level: warm-up, trials, verdicts, stop-on-error.

Plain async code over the load runner; the plugin calls :func:`measure_test` on the
background load loop.  A level that ends in ``error`` stops the sweep: later levels are
reported as ``not-run`` with the reason rather than silently missing.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field, replace
from statistics import median
from time import perf_counter
from typing import Any, Callable, Literal, Protocol, Sequence, TypeVar

import numpy as np

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target
from pytest_kimi.load.openloop import OpenLoopPlan, queue_waits
from pytest_kimi.load.runner import TRIAL_ID_BITS, LiveTrial, TrialClient, TrialPlan, TrialRecords
from pytest_kimi.workload.markers import (
    DEFAULT_PROTOCOL,
    STATIONARY,
    LevelSpec,
    Targets,
    Workload,
    ratio_key,
)
from pytest_kimi.workload.prompts import length_bounds
from pytest_kimi.measure.metrics import (
    ClientSignals,
    TrialResult,
    stall_causes,
    summarize_trial,
)
from pytest_kimi.measure.results import LevelResult, ThroughputResult, judge_level, not_run_level
from pytest_kimi.measure.shapes import fill_up_note, turn_figures
from pytest_kimi.measure.time_box import SETTLE_MIN_S, TimeBox, time_box
from pytest_kimi.measure.windows import TrialWindow, trial_window, unix_offset
from pytest_kimi.verdicts import Verdict

WARMUP_MAX_TOKENS = 16
TTFT_ALLOWANCE_S = 0.1
"""Wall seconds allowed for the streams' first tokens before the settle period starts, in the
trial's minimum duration."""
DEFAULT_TRIALS = 3
MAX_REPLACED_TRIALS = 2
"""Per level: trials voided only by the moment (a client stall) that another trial replaces.
A level whose stalls keep recurring stays invalid; the replaced trials are reported."""
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

    def level_summary(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class LevelProbe(Protocol):
    """Reads the server before a level's first trial and after its last (the prefix-cache
    hit rate plugs in here: :class:`~pytest_kimi.crosscheck.prefix_cache.PrefixCacheProbe`).
    Best effort: it never raises, and ``end_level`` returns the fields to merge into the
    level's JSON (none when the server had nothing to read)."""

    async def start_level(self) -> None: ...

    async def end_level(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast this server answered one trial (wall seconds), for the next trials' limits."""

    token_s: float
    """Seconds per output token of one stream (the median request's decode rate)."""
    ttft_s: float
    """The slowest first token."""
    streams: int
    """Requests in flight when these were seen: the batch the times are for."""
    prompt_tokens: float = 0.0
    """Mean prompt tokens of those requests (0: unknown)."""
    tokens_per_read: float = 1.0
    """Median tokens a read of a stream brought after its first (1 unless the server packs its
    tokens: SGLang's ``--stream-interval``), for the next stationary trial's time box."""

    @classmethod
    def of(cls, tr: TrialRecords) -> Pace | None:
        ok = [r for r in tr.records if r.ok and not r.cut]
        rates = [rate for r in ok if (rate := r.decode_tok_s)]
        if not rates:
            # streams whose tokens came in one read (a buffering proxy) have no decode rate;
            # their whole time a token prices a request no faster than it went, so the next
            # trial's limit follows it instead of the request timeout (600 s by default)
            rates = [r.completion_tokens / (r.end - r.sent) for r in ok if r.end > r.sent]
            rates = [x for x in rates if x > 0]
        if not rates:
            return None
        prompts = [r.prompt_tokens for r in ok if r.prompt_tokens > 0]
        return cls(
            token_s=1.0 / median(rates),
            ttft_s=max((t for r in ok if (t := r.ttft) is not None), default=0.0),
            streams=max(1, tr.concurrency),
            prompt_tokens=sum(prompts) / len(prompts) if prompts else 0.0,
            tokens_per_read=_tokens_per_read(ok),
        )

    def request_s(self, level: LevelSpec, streams: float) -> float:
        """A request of ``level`` with ``streams`` in flight: the times seen, scaled linearly
        with the streams (and the first token with the prompt's length too)."""
        scale = max(1.0, streams / self.streams)
        prompt = 1.0
        if level.input_tokens and self.prompt_tokens:
            prompt = max(1.0, level.input_tokens / self.prompt_tokens)
        return scale * (level.max_tokens * self.token_s + self.ttft_s * prompt)


def _tokens_per_read(records: Sequence[RequestRecord]) -> float:
    """Median tokens per read after each stream's first (which SGLang sends alone)."""
    reads = [rec.read_tokens()[1:] for rec in records if len(rec.chunk_times) > 1]
    return float(median(np.concatenate(reads))) if reads else 1.0


@dataclass(slots=True)
class FixedTrials:
    """Exactly ``trials`` trials per level."""

    trials: int = DEFAULT_TRIALS

    def more_trials(self, level: LevelSpec, samples: Sequence[float]) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class Progress:
    """A snapshot for the live display: sent about once a second, and at each trial's end."""

    kind: Literal["tick", "trial", "level"]
    label: str
    """The level's name, e.g. ``C=8`` or ``rate=2/s max_tokens=256``."""
    trial: int
    """1-based trial number within the level."""
    trials: int
    """Trials planned so far (adaptive trials may add more)."""
    done: int
    total: int | None
    failed: int
    tok_s: float | None
    """tick: approximate tok/s so far in this trial; trial: the trial's steady-state figure."""
    elapsed_s: float
    """Wall seconds since the level started (tok/s are in the server's clock)."""


ProgressFn = Callable[[Progress], None]
TICK_S = 1.0


@dataclass(slots=True)
class MeasureSpec:
    """Everything :func:`measure_test` needs besides the client."""

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
    trial_serial: int = 0
    """Trials (and warm-ups) started so far: each gets its own range of request numbers, so
    prompts stay unique across trials and levels."""
    unique_salt: int = 0
    """Offsets this measurement's trial ranges (from its run token), so another test's
    requests start with other ids as well as another token."""
    trials: int = DEFAULT_TRIALS
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
    opened and closed around each level by :func:`measure_level` itself, so every path that
    measures levels (a sweep, a capacity search) has it; None: none."""
    pace: Pace | None = None
    """How fast the server answered so far (the warm-up, the trials): sizes each trial's
    wall-clock limit before the level has a trial of its own."""
    protocol: str = DEFAULT_PROTOCOL
    """Closed-loop trial protocol where the marker leaves it open (``--perf-protocol``)."""
    clock: float = 1.0
    """Server seconds per wall second (the simulator's speed; 1.0 for a real server).  Loads
    and figures are in the server's clock: an open-loop rate of 2/s is sent at ``2 * clock``
    per wall second, a duration of 60 s lasts ``60 / clock`` wall seconds, and tok/s and
    latencies are converted back, so targets mean the same on the simulator and on EP8."""
    partial: ThroughputResult | None = None
    """Set by :func:`measure_test`: the result it fills level by level, so an interrupted
    measurement (Ctrl-C, SIGTERM) can still report the levels it finished."""
    output_tokens: dict[int | None, list[int]] = field(default_factory=dict)
    """A dataset's own output length of each body (0: the level's ``max_tokens``); a level
    caps them at its ``max_tokens`` (:meth:`lengths_for`).  Empty: every body has the level's."""
    queue_waits: dict[tuple[LevelSpec, int], list[float]] = field(default_factory=dict)
    """Under ``max_concurrency``: per (level, trial index) how long each arrival waited for a
    slot, wall seconds (a replaced trial's are overwritten by the trial that replaces it);
    :meth:`annotate_level` summarises and drops them."""
    level_info: Callable[[LevelSpec], tuple[dict[str, Any], list[str]]] | None = None
    """Per level: fields for its JSON (a dataset's sample at the level's cap, the shared
    prefix) and notes for its reports (estimated lengths, a sample too small for C)."""
    level_probe: LevelProbe | None = None
    """Reads the server around each level (its prefix-cache hit rate); None: nothing read."""
    warmup_bodies: int = 2
    """Distinct bodies the warm-up cycles through: one per shared-prefix group, so the groups'
    system prompts are in the server's cache before the first level."""
    level_done: Callable[[LevelResult], None] | None = None
    """Called with each level once it is final, before the next one starts
    (``--perf-requests`` appends its requests there, so an interrupted run keeps the levels it
    finished); a capacity top-up calls it again with the merged level.  It must not raise."""
    fresh_server: bool = False
    """The first test on a server just started (or first seen): warm it until its figures
    are stationary before the levels (:mod:`pytest_kimi.measure.warm`)."""

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

    def length_info(self, level: LevelSpec) -> dict[str, Any]:
        """``range_ratio``'s draws at this level, for its JSON (``length_range``): the ratio,
        the ranges drawn from, and what the draws came to (empty without a range)."""
        w = self.workload
        if w.range_ratio is None:
            return {}
        out: dict[str, Any] = {"range_ratio": ratio_key(w.range_ratio)}
        drawn = {
            "input_tokens": w.input_lengths(level.input_tokens),
            "max_tokens": w.output_lengths(level.max_tokens),
        }
        for (name, lengths), value, ratio in zip(
            drawn.items(), (level.input_tokens, level.max_tokens), w.range_ratio
        ):
            if lengths is None or value is None:
                continue
            out[name] = {
                "range": list(length_bounds(value, ratio)),
                "draws": len(lengths),
                "mean": round(sum(lengths) / len(lengths), 1),
                "min": min(lengths),
                "max": max(lengths),
            }
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
        raws = _rotated(self._raws(level), offset)
        own = self.lengths_for(level)
        full = _rotated(own, offset) if own is not None else [level.max_tokens] * len(raws)
        lengths = [max(1, math.ceil((w + 0.5) / c * full[w % len(full)])) for w in range(c)]
        bodies = [
            _running_usage(raws[w % len(raws)]).replace(MAX_TOKENS_SLOT, b'"max_tokens":%d' % n, 1)
            for w, n in enumerate(lengths)
        ]
        return bodies, lengths

    def annotate_level(self, result: LevelResult, trials: Sequence[TrialResult]) -> None:
        """The workload knobs' part of a finished level: ``range_ratio``'s draws
        (``length_range``) and, under ``max_concurrency``, how late the cap let the arrivals
        go (``client_queue``, server seconds, and a note that reports show)."""
        level = result.spec
        result.extra.update(self.length_info(level))
        cap = self.workload.max_concurrency
        if cap is None or level.rate is None:
            return
        kept = [self.queue_waits.pop((level, t.index), []) for t in trials]
        waits = [x * self.clock for trial_waits in kept for x in trial_waits]
        for key in [k for k in self.queue_waits if k[0] == level]:
            del self.queue_waits[key]
        if not waits:
            return
        ranked = sorted(waits)
        queued = [x for x in waits if x > 0]

        def pct(q: float) -> float:
            return ranked[min(len(ranked) - 1, max(0, math.ceil(q / 100 * len(ranked)) - 1))]

        summary = {
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

    def prompts_key(self, level: LevelSpec) -> str:
        return self.prompts_keys[level.input_tokens]

    def next_unique(self) -> dict[str, Any]:
        """Plan fields for the next trial's unique prompts (none when the spec repeats bodies)."""
        if self.unique_slot is None:
            return {}
        self.trial_serial += 1
        serial = (self.trial_serial + self.unique_salt) % (1 << (48 - TRIAL_ID_BITS))
        return {"unique_slot": self.unique_slot, "unique_base": serial << TRIAL_ID_BITS}


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


def _rotated(bodies: list[_T], offset: int) -> list[_T]:
    """Bodies (or their lengths) starting at ``offset``: successive trials continue through
    the prompt set."""
    k = offset % len(bodies)
    return bodies[k:] + bodies[:k]


def _warmup_bodies(bodies: list[bytes], count: int = 2) -> list[bytes]:
    out = []
    for raw in bodies[:count]:
        body = json.loads(raw)
        body["max_tokens"] = WARMUP_MAX_TOKENS
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


def _signals(tr: TrialRecords) -> ClientSignals:
    wall = max(tr.ended - tr.started, 1e-9)
    return ClientSignals(
        loop_lag_max_s=tr.loop_lag_max_s,
        loop_lag_p99_s=tr.loop_lag_p99_s,
        send_delay_p99_s=tr.send_delay_p99_s,
        # the busiest client process: a sharded client's workers each have a core of their own
        cpu_share=max((sh.client_cpu_s for sh in tr.shards), default=tr.client_cpu_s) / wall,
        lag_times=tr.lag_times,
        lag_values=tr.lag_values,
    )


def _max_failures(workload: Workload, requests: int | None, concurrency: int) -> int:
    """A dead server must not be hammered: stop starting requests past the allowed failures."""
    budget = requests if requests is not None else 10 * concurrency
    return max(1, int(workload.max_error_rate * budget)) + concurrency


def _in_flight(level: LevelSpec, clock: float = 1.0) -> int:
    """Requests in flight to allow for when bounding failures (open loop: ~1 wall second of
    arrivals)."""
    if level.concurrency is not None:
        return level.concurrency
    return max(1, round((level.rate or 1) * clock))


def _replaceable(trial: TrialResult) -> bool:
    """Voided only by transient causes: the same trial run again may well be valid."""
    return (
        bool(trial.invalid)
        and trial.requests_failed == 0
        and all(reason in trial.transient for reason in trial.invalid)
    )


def prompt_tokens_summary(trials: Sequence[TrialResult]) -> dict[str, float | int] | None:
    """Mean and range of the prompt tokens the server's ``usage`` reported for the level's
    successful requests: what was really sent, whatever ``input_tokens`` asked for (None when
    no request carried a usage count)."""
    counts = [
        r.prompt_tokens
        for t in trials
        for r in t.records
        if r.ok and not r.tokens_approx and r.prompt_tokens > 0
    ]
    if not counts:
        return None
    return {
        "mean": round(sum(counts) / len(counts), 1),
        "min": min(counts),
        "max": max(counts),
        "requests": len(counts),
    }


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
        streams were stuck on where the records show it (:func:`stall_causes`): no headers,
        headers but no token, tokens that stopped; else the guess that fits what remains."""
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
_TIMEOUT = "the request timeout"


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
    w = spec.workload
    if previous_s is not None:
        return TrialLimit(previous_s, "the level's fastest trial before")
    stationary = (
        level.concurrency is not None and w.protocol_for(level, spec.protocol) == STATIONARY
    )
    requests = w.requests_for(level)
    duration_s = w.duration_s / spec.clock if w.duration_s is not None else None
    pace = spec.pace
    if level.concurrency is not None:
        c = level.concurrency
        if stationary:
            box = stationary_box(level, pace)
            min_s = box_min_s(box, spec.min_window_s)
            if pace is None:
                return TrialLimit(min_s + w.timeout_s, _TIMEOUT, 1.0)
            # the time box's steps, priced as the tokens of one request of that length
            steps = replace(level, max_tokens=box.steps)
            return TrialLimit(max(min_s, pace.request_s(steps, c)), _PACE)
        per_stream = w.timeout_s if pace is None else pace.request_s(level, c)
        ends = [math.ceil(requests / c) * per_stream] if requests is not None else []
        if duration_s is not None:
            ends.append(duration_s + per_stream)  # in-flight requests finish after it
        if pace is None:
            return TrialLimit(min(ends), _TIMEOUT, 1.0)
        return TrialLimit(min(ends), _PACE)
    rate = (level.rate or 1.0) * spec.clock
    spans = [requests / rate] if requests is not None else []
    if duration_s is not None:
        spans.append(duration_s)
    arrivals = min(spans, default=0.0)
    cap = w.max_concurrency
    # under max_concurrency the arrivals queue for slots: the cap's rounds of requests
    sent = requests if requests is not None else math.ceil(rate * (duration_s or 0.0))
    rounds = math.ceil(max(1, sent) / cap) if cap is not None else 1
    if pace is None:
        return TrialLimit(max(arrivals, (rounds - 1) * w.timeout_s) + w.timeout_s, _TIMEOUT, 1.0)
    # Little's law at the pace seen: the requests in flight while the arrivals run
    flying = max(1.0, rate * pace.request_s(level, 1))
    if cap is not None and flying > cap:
        # the cap holds the rest back: cap in flight, each slot sending rounds in a row
        return TrialLimit(max(arrivals, rounds * pace.request_s(level, cap)), _PACE)
    return TrialLimit(arrivals + pace.request_s(level, flying), _PACE)


async def run_trial(
    client: TrialClient,
    spec: MeasureSpec,
    level: LevelSpec,
    index: int,
    offset: int,
    live: LiveTrial | None = None,
    previous_s: float | None = None,
) -> TrialResult:
    """One trial of ``level``; ``previous_s``: the wall length of the level's fastest trial
    before (it sizes this one's wall-clock limit, :func:`trial_limit`)."""
    w = spec.workload
    requests = w.requests_for(level)
    duration_s = w.duration_s / spec.clock if w.duration_s is not None else None
    bodies = _rotated(spec.bodies_for(level), offset)
    max_failures = _max_failures(w, requests, _in_flight(level, spec.clock))
    limit = trial_limit(spec, level, previous_s)
    limit_s = limit.limit_s
    box = stationary_box(level, spec.pace)  # before the trial: its pace is the trials' before
    if level.concurrency is not None and w.protocol_for(level, spec.protocol) == STATIONARY:
        c = level.concurrency
        first, first_max = spec.stationary_openers(level, offset)
        plan = TrialPlan(
            concurrency=c,
            bodies=bodies,
            timeout_s=w.timeout_s,
            max_failures=_max_failures(w, None, c),
            first_bodies=first,
            first_max_tokens=first_max,
            # the first step's tokens come before every stream is in, and the window starts
            # once the start-up backlog has settled
            token_budget=box.token_budget(c),
            min_duration_s=box_min_s(box, spec.min_window_s),
            wall_limit_s=limit_s,
            **spec.next_unique(),
        )
        tr = await client.run_trial(spec.target, plan, live)
    elif level.concurrency is not None:
        plan = TrialPlan(
            concurrency=level.concurrency,
            bodies=bodies,
            requests=requests,
            duration_s=duration_s,
            timeout_s=w.timeout_s,
            max_failures=max_failures,
            warmup=0,
            turns=w.turns,
            wall_limit_s=limit_s,
            **spec.next_unique(),
        )
        tr = await client.run_trial(spec.target, plan, live)
    else:
        open_plan = OpenLoopPlan(
            rate=(level.rate or 1.0) * spec.clock,
            bodies=bodies,
            requests=requests,
            duration_s=duration_s,
            timeout_s=w.timeout_s,
            max_failures=max_failures,
            seed=w.seed + index,
            burstiness=w.burstiness,
            max_concurrency=w.max_concurrency,
            wall_limit_s=limit_s,
            **spec.next_unique(),
        )
        tr = await client.run_open_loop(spec.target, open_plan, live)
        if open_plan.max_concurrency is not None:
            spec.queue_waits[(level, index)] = queue_waits(
                tr.records, open_plan.arrivals(), tr.started
            )
    lengths = spec.lengths_for(level)
    trial = summarize_trial(
        index,
        level,
        tr,
        client=_signals(tr),
        ignore_eos=w.ignore_eos and lengths is None,
        settle_steps=box.settle_steps,
    )
    if lengths is not None and w.ignore_eos:
        check_own_lengths(trial, _rotated(lengths, offset))
    if (over := limit.reason(tr)) is not None:
        trial.invalid.append(over)
    spec.pace = Pace.of(tr) or spec.pace
    return trial


def check_own_lengths(trial: TrialResult, lengths: Sequence[int]) -> None:
    """The ``ignore_eos`` check where every body has its own ``max_tokens`` (a dataset, or
    ``range_ratio``'s draws): request ``g`` (its global index) sent body ``g % len(lengths)``
    of the trial's rotated list, so it must have returned exactly that many tokens (a
    stationary opener: its record's own ``max_tokens``)."""
    # a stationary stream's first request has its own, shorter max_tokens (on its record)
    short = [
        (r.completion_tokens, want)
        for r in trial.records
        if r.ok
        and not r.cut
        and r.completion_tokens != (want := r.max_tokens or lengths[r.index % len(lengths)])
    ]
    if short:
        got, asked = short[0]
        trial.invalid.append(
            f"{len(short)} request(s) returned a token count other than their own max_tokens "
            f"under ignore_eos (first: {got} for max_tokens={asked}): the server ignores "
            "ignore_eos, or the context length truncates"
        )


async def _ticker(
    progress: ProgressFn,
    live: LiveTrial,
    label: str,
    trial: int,
    trials: int,
    level_start: float,
    clock: float,
) -> None:
    while True:
        await asyncio.sleep(TICK_S)
        now = perf_counter()
        running = now - live.started if live.started else 0.0
        progress(
            Progress(
                "tick",
                label,
                trial,
                trials,
                live.done,
                live.total,
                live.failed,
                live.approx_tokens() / running / clock if running > 0 else None,
                now - level_start,
            )
        )


async def warm_up(client: TrialClient, spec: MeasureSpec) -> list[str]:
    """Short requests that absorb one-time costs (JIT, CUDA graphs) and put each shared-prefix
    group's system prompt in the server's cache; their errors are returned."""
    n = spec.workload.warmup
    if n <= 0:
        return []
    first = next(iter(spec.bodies.values()))
    if spec.warmup_bodies > 2:
        n = max(n, spec.warmup_bodies)  # one request per shared-prefix group at least
    plan = TrialPlan(
        concurrency=min(n, 8),
        bodies=_warmup_bodies(first, spec.warmup_bodies),
        requests=n,
        duration_s=None,
        timeout_s=spec.workload.timeout_s,
        max_failures=n,
        warmup=0,
        # no pace known yet: each of a slot's requests may take up to the request timeout
        wall_limit_s=TrialLimit(
            math.ceil(n / min(n, 8)) * spec.workload.timeout_s, _TIMEOUT, 1
        ).limit_s,
        **spec.next_unique(),
    )
    tr = await client.run_trial(spec.target, plan)
    spec.pace = Pace.of(tr) or spec.pace
    errors = [r.error for r in tr.records if r.error]
    if tr.over_limit_s is not None:
        errors.append(f"the warm-up {OVER_LIMIT} of {tr.over_limit_s:.1f} s")
    return errors


async def measure_level(
    client: TrialClient,
    spec: MeasureSpec,
    level: LevelSpec,
    progress: ProgressFn | None = None,
) -> LevelResult:
    """One level's trials and verdict, with the contamination check (``spec.guard``) open
    around them.  The guard is opened here (idempotent) so that every path measuring levels
    has it, and closed by whoever runs the levels (:func:`close_guard`), not here: a signal
    that lands while it closes must not cost the level that just finished."""
    if spec.guard is not None:
        await spec.guard.open()
    return await _measure_level(client, spec, level, progress)


async def close_guard(spec: MeasureSpec) -> None:
    """Close the contamination check after the last level (also on error or cancel)."""
    if spec.guard is not None:
        await spec.guard.close()


def _watchers(spec: MeasureSpec) -> list[TrialObserver]:
    """The guard first: it waits for the server to drain before the observer's own readings,
    and its verdict is on the trial before the observer's (a stall check leaves void trials)."""
    return [o for o in (spec.guard, spec.observer) if o is not None]


def _merge_summary(result: LevelResult, summary: dict[str, Any]) -> None:
    """An observer's or probe's level summary into the level: its ``notes`` as notes, the
    rest into the level's JSON."""
    notes = summary.pop("notes", None) or []
    result.errors.extend(f"note: {n}" for n in notes if f"note: {n}" not in result.errors)
    result.extra.update(summary)


async def _measure_level(
    client: TrialClient,
    spec: MeasureSpec,
    level: LevelSpec,
    progress: ProgressFn | None = None,
) -> LevelResult:
    trials: list[TrialResult] = []
    planned = spec.trials
    offset = 0
    if spec.level_probe is not None:
        await spec.level_probe.start_level()
    level_start = perf_counter()
    label = spec.workload.label(level)
    watchers = _watchers(spec)
    replaced: list[str] = []
    windows: list[TrialWindow] = []
    previous_s: float | None = None
    while len(trials) < planned:
        stationary = spec.workload.protocol_for(level, spec.protocol) == STATIONARY
        live = LiveTrial(total=None if stationary else spec.workload.requests_for(level))
        for watcher in watchers:
            await watcher.before_trial()
        ticker = None
        if progress is not None:
            ticker = asyncio.ensure_future(
                _ticker(progress, live, label, len(trials) + 1, planned, level_start, spec.clock)
            )
        try:
            trial = await run_trial(client, spec, level, len(trials), offset, live, previous_s)
        finally:
            if ticker is not None:
                ticker.cancel()
        clock_pair = unix_offset()  # at the trial, for its window's start_unix
        for watcher in watchers:
            await watcher.after_trial(trial)
        # the level's fastest trial so far sizes the next one's limit: from the last trial
        # alone, each trial could take up to 4x its predecessor unnoticed, and a top-up of
        # the adaptive policy (ten trials and more) would let the limit grow without bound
        previous_s = trial.wall_s if previous_s is None else min(previous_s, trial.wall_s)
        offset += trial.requests_ok + trial.requests_failed
        keep = not (_replaceable(trial) and len(replaced) < MAX_REPLACED_TRIALS)
        # every trial measured has a window record, a replaced one too (kept=False)
        windows.append(
            trial_window(trial, len(windows), kept=keep, clock=spec.clock, offset=clock_pair)
        )
        if not keep:
            replaced.append(f"trial {len(trials) + len(replaced) + 1} replaced: {trial.invalid[0]}")
            continue
        trials.append(trial)
        if trial.requests_failed and trial.stopped_early:
            break  # the server is failing: more trials would only repeat it
        if any(reason.startswith(OVER_LIMIT) for reason in trial.invalid):
            break  # the server is not progressing: the next trial would hang as long
        if len(trials) == planned:
            # in the figures' clock (the simulator's, at speed != 1), as the baseline's are
            samples = [t.tok_s / spec.clock for t in trials if t.valid and t.tok_s is not None]
            planned += spec.policy.more_trials(level, samples)
        if progress is not None:
            progress(
                Progress(
                    "trial",
                    label,
                    len(trials),
                    planned,
                    live.done,
                    live.total,
                    live.failed,
                    trial.tok_s / spec.clock if trial.tok_s is not None else None,
                    perf_counter() - level_start,
                )
            )
    result = judge_level(
        level, spec.workload, spec.targets, trials, spec.prompts_key(level), spec.clock
    )
    spec.annotate_level(result, trials)  # range_ratio's draws, max_concurrency's queue
    result.trial_windows = windows
    protocol = spec.workload.protocol_for(level, spec.protocol)
    result.protocol = protocol if protocol == STATIONARY else None
    result.server_time_s = round((perf_counter() - level_start) * spec.clock, 3)
    result.prompt_tokens = prompt_tokens_summary(trials)
    if spec.workload.turns > 1:
        result.turns = turn_figures(trials, spec.clock)
    if level.rate is not None and (note := fill_up_note(trials, spec.clock)) is not None:
        result.fill_up = note
    sizing = spec.sizing.get(level.input_tokens)
    if sizing is not None:
        result.input_tokens_sizing = sizing
        if sizing.startswith("estimate"):
            result.errors.append(
                f"note: input_tokens={level.input_tokens} is an {sizing}; "
                "prompt tokens shows what the server counted"
            )
    if replaced:
        result.replaced_trials = list(replaced)
        result.errors.extend(f"note: {r}" for r in replaced)
    if spec.level_info is not None:
        extra, notes = spec.level_info(level)
        result.extra.update(extra)
        result.errors.extend(f"note: {n}" for n in notes)
    if spec.level_probe is not None:
        _merge_summary(result, await spec.level_probe.end_level())
    for watcher in watchers:
        _merge_summary(result, _in_server_clock(watcher.level_summary(), spec.clock))
    if progress is not None:
        f = result.figures
        progress(
            Progress(
                "level",
                label,
                len(trials),
                len(trials),
                f.requests_ok + f.requests_failed,
                None,
                f.requests_failed,
                f.tok_s,
                perf_counter() - level_start,
            )
        )
    return result


async def measure_test(
    client: TrialClient,
    spec: MeasureSpec,
    progress: ProgressFn | None = None,
) -> ThroughputResult:
    """All levels of one test, in order; levels after an ``error`` are ``not-run``."""
    result = ThroughputResult(spec.nodeid, spec.workload, spec.targets)
    spec.partial = result
    observer = spec.observer
    try:
        if observer is not None:
            await observer.open()  # before any load: a check that cannot run stops the test here
        warm_start = perf_counter()
        await warm_up(client, spec)  # a dead server shows in the first level's errors
        if spec.fresh_server and spec.workload.levels:
            from pytest_kimi.measure.warm import warm_until_stationary

            first = spec.workload.levels[0]
            warm = await warm_until_stationary(
                lambda index, offset: run_trial(client, spec, first, index, offset),
                spec.workload.label(first),
                spec.clock,
            )
            result.warm_up = warm.to_dict()
        result.warmup_server_time_s = round((perf_counter() - warm_start) * spec.clock, 3)
        stop_reason: str | None = None
        for level in spec.workload.levels:
            if stop_reason is not None:
                result.levels.append(
                    not_run_level(
                        level, spec.workload, spec.targets, stop_reason, spec.prompts_key(level)
                    )
                )
                continue
            measured = await measure_level(client, spec, level, progress)
            result.levels.append(measured)
            if spec.level_done is not None:
                spec.level_done(measured)
            if (verdict := Verdict.of(measured.verdict)) is not None and verdict.stops_sweep:
                stop_reason = f"not run: {measured.label} ended in error"
    finally:
        try:
            if observer is not None:
                await observer.close()
        finally:
            await close_guard(spec)
            _account(result, spec.clock)
    return result


def _in_server_clock(summary: dict[str, Any], clock: float) -> dict[str, Any]:
    """An observer's level summary with its rates in the server's clock, like the level's own
    figures (the observer compares wall-clock rates with wall-clock rates, as it must)."""
    server = summary.get("server")
    if clock == 1.0 or not isinstance(server, dict):
        return summary
    for entry in (server, *server.get("trials", [])):
        for key in ("tok_s", "client_tok_s"):
            if isinstance(entry.get(key), (int, float)):
                entry[key] = round(entry[key] / clock, 2)
    return summary


def _account(result: ThroughputResult, clock: float) -> None:
    """The price of the measurement, in the server's seconds (warm-up and every level, each
    from its first request to its last; replaced trials included: they held the server too),
    and the clock the figures are in.  Also on an interrupted run: the partial result says
    what it cost."""
    spent = (result.warmup_server_time_s or 0.0) + sum(
        lv.server_time_s or 0.0 for lv in result.levels
    )
    result.server_time_s = round(spent, 3)
    if clock != 1.0:
        result.server_clock = {"kind": "simulator", "speed": clock}
