"""Run a test's workload level by level: warm-up, trials, verdicts, stop-on-error.

Plain async code over the load runner; the plugin calls :func:`measure_test` on the
background load loop.  A level that ends in ``error`` stops the sweep: later levels are
reported as ``not-run`` with the reason rather than silently missing.

This module is the level loop (trials, replacements, adaptive top-ups, the level's verdict and
notes) and :func:`measure_test`; what it is asked to do is :mod:`.measure_spec`, a trial's limit
:mod:`.trial_limits`, one trial and the warm-up :mod:`.one_trial`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from time import perf_counter
from typing import Callable, Literal, Sequence

from pytest_kimi.load.trial import LiveTrial, TrialClient
from pytest_kimi.workload.workload_spec import STATIONARY, LevelSpec
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.measure_spec import MeasureSpec, TrialObserver
from pytest_kimi.measure.one_trial import run_trial, warm_up
from pytest_kimi.measure.results import LevelResult, ThroughputResult, judge_level, not_run_level
from pytest_kimi.measure.shapes import fill_up_note, turn_figures
from pytest_kimi.measure.trial_limits import OVER_LIMIT
from pytest_kimi.measure.windows import TrialWindow, trial_window, unix_offset
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import LevelSummary, PromptTokens, WarmUpEntry

MAX_REPLACED_TRIALS = 2
"""Per level: trials voided only by the moment (a client stall) that another trial replaces.
A level whose stalls keep recurring stays invalid; the replaced trials are reported."""


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


def _replaceable(trial: TrialResult) -> bool:
    """Voided only by transient causes: the same trial run again may well be valid."""
    return (
        bool(trial.invalid)
        and trial.requests_failed == 0
        and all(reason in trial.transient for reason in trial.invalid)
    )


def prompt_tokens_summary(trials: Sequence[TrialResult]) -> PromptTokens | None:
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


async def measure_level(
    client: TrialClient,
    spec: MeasureSpec,
    level: LevelSpec,
    progress: ProgressFn | None = None,
) -> LevelResult:
    """One level's trials and verdict, with the contamination check (``spec.watch.guard``) open
    around them.  The guard is opened here (idempotent) so that every path measuring levels
    has it, and closed by whoever runs the levels (:func:`close_guard`), not here: a signal
    that lands while it closes must not cost the level that just finished."""
    if spec.watch.guard is not None:
        await spec.watch.guard.open()
    return await _measure_level(client, spec, level, progress)


async def close_guard(spec: MeasureSpec) -> None:
    """Close the contamination check after the last level (also on error or cancel)."""
    if spec.watch.guard is not None:
        await spec.watch.guard.close()


def _watchers(spec: MeasureSpec) -> list[TrialObserver]:
    """The guard first: it waits for the server to drain before the observer's own readings,
    and its verdict is on the trial before the observer's (a stall check leaves void trials)."""
    return [o for o in (spec.watch.guard, spec.watch.observer) if o is not None]


def _merge_summary(result: LevelResult, summary: LevelSummary) -> None:
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
    if spec.watch.level_probe is not None:
        await spec.watch.level_probe.start_level()
    level_start = perf_counter()
    label = spec.send.workload.label(level)
    watchers = _watchers(spec)
    replaced: list[str] = []
    windows: list[TrialWindow] = []
    previous_s: float | None = None
    while len(trials) < planned:
        stationary = spec.send.workload.protocol_for(level, spec.send.protocol) == STATIONARY
        live = LiveTrial(total=None if stationary else spec.send.workload.requests_for(level))
        for watcher in watchers:
            await watcher.before_trial()
        ticker = None
        if progress is not None:
            ticker = asyncio.ensure_future(
                _ticker(
                    progress, live, label, len(trials) + 1, planned, level_start, spec.send.clock
                )
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
            trial_window(trial, len(windows), kept=keep, clock=spec.send.clock, offset=clock_pair)
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
            samples = [t.tok_s / spec.send.clock for t in trials if t.valid and t.tok_s is not None]
            planned += spec.watch.policy.more_trials(level, samples)
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
                    trial.tok_s / spec.send.clock if trial.tok_s is not None else None,
                    perf_counter() - level_start,
                )
            )
    result = judge_level(
        level,
        spec.send.workload,
        spec.send.targets,
        trials,
        spec.send.prompts_key(level),
        spec.send.clock,
    )
    spec.annotate_level(result, trials)  # range_ratio's draws, max_concurrency's queue
    result.trial_windows = windows
    protocol = spec.send.workload.protocol_for(level, spec.send.protocol)
    result.protocol = protocol if protocol == STATIONARY else None
    result.server_time_s = round((perf_counter() - level_start) * spec.send.clock, 3)
    result.prompt_tokens = prompt_tokens_summary(trials)
    if spec.send.workload.turns > 1:
        result.turns = turn_figures(trials, spec.send.clock)
    if level.rate is not None and (note := fill_up_note(trials, spec.send.clock)) is not None:
        result.fill_up = note
    sizing = spec.send.sizing.get(level.input_tokens)
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
    if spec.watch.level_info is not None:
        extra, notes = spec.watch.level_info(level)
        result.extra.update(extra)
        result.errors.extend(f"note: {n}" for n in notes)
    if spec.watch.level_probe is not None:
        _merge_summary(result, await spec.watch.level_probe.end_level())
    for watcher in watchers:
        _merge_summary(result, _in_server_clock(watcher.level_summary(), spec.send.clock))
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
    result = ThroughputResult(spec.send.nodeid, spec.send.workload, spec.send.targets)
    spec.state.partial = result
    observer = spec.watch.observer
    warm_s = 0.0  # the warm-up's wall time: requests, and warm trials on a fresh server
    try:
        if observer is not None:
            await observer.open()  # before any load: a check that cannot run stops the test here
        warm_start = perf_counter()
        await warm_up(client, spec)  # a dead server shows in the first level's errors
        warm_s += perf_counter() - warm_start
        stop_reason: str | None = None
        for level in spec.send.workload.levels:
            if stop_reason is not None:
                result.levels.append(
                    not_run_level(
                        level,
                        spec.send.workload,
                        spec.send.targets,
                        stop_reason,
                        spec.send.prompts_key(level),
                    )
                )
                continue
            if spec.fresh_server:
                # each level's first use on a fresh server: its own shapes can be cold after
                # the level before it has warmed (real SGLang, C=4 after C=1: 626 -> 698 tok/s)
                warm_start = perf_counter()
                warmed = await _warm_level(client, spec, level)
                result.warm_up = [*(result.warm_up or []), warmed]
                warm_s += perf_counter() - warm_start
            measured = await measure_level(client, spec, level, progress)
            result.levels.append(measured)
            if spec.watch.level_done is not None:
                spec.watch.level_done(measured)
            if (verdict := Verdict.of(measured.verdict)) is not None and verdict.stops_sweep:
                stop_reason = f"not run: {measured.label} ended in error"
    finally:
        result.warmup_server_time_s = round(warm_s * spec.send.clock, 3)
        try:
            if observer is not None:
                await observer.close()
        finally:
            await close_guard(spec)
            _account(result, spec.send.clock)
    return result


async def _warm_level(client: TrialClient, spec: MeasureSpec, level: LevelSpec) -> WarmUpEntry:
    """Trials of ``level`` that count for nothing, until its figures are stationary
    (:mod:`pytest_kimi.measure.warm`)."""
    from pytest_kimi.measure.warm import warm_until_stationary

    warm = await warm_until_stationary(
        lambda index, offset: run_trial(client, spec, level, index, offset),
        spec.send.workload.label(level),
        spec.send.clock,
    )
    return warm.to_dict()


def _in_server_clock(summary: LevelSummary, clock: float) -> LevelSummary:
    """An observer's level summary with its rates in the server's clock, like the level's own
    figures (the observer compares wall-clock rates with wall-clock rates, as it must)."""
    server = summary.get("server")
    if clock == 1.0 or server is None:
        return summary
    for entry in (server, *server["trials"]):
        if (tok_s := entry["tok_s"]) is not None:
            entry["tok_s"] = round(tok_s / clock, 2)
        if (client_tok_s := entry["client_tok_s"]) is not None:
            entry["client_tok_s"] = round(client_tok_s / clock, 2)
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
