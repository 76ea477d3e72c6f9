"""The plugin side of a capacity search: :func:`run_capacity` drives the pure search
(:mod:`pytest_kimi.measure.capacity_search`) with the plugin's own level measurement, and
turns each measured level into what the search sees (:func:`outcome_of`) and back into a
labelled level of the test's results.

Apart from the search so that the search stays a pure core, with no trials, records or
client, that tests and ``bench/capacity.py`` drive with a synthetic latency model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

from pytest_kimi.measure.capacity_levels import CapacityLevel, LevelOutcome, SearchSettings
from pytest_kimi.measure.capacity_search import CapacityEstimate, CapacitySearch

if TYPE_CHECKING:
    from pytest_kimi.measure.measure_spec import MeasureSpec


def outcome_of(level: Any, settings: SearchSettings) -> LevelOutcome:
    """A measured :class:`~pytest_kimi.measure.results.LevelResult` as the search sees it.

    The pooled latencies are the ceilings' latencies over all the level's requests
    (:func:`~pytest_kimi.measure.capacity_latency.probe_latencies`: TTFT and end-to-end as the
    level's own figures, ITL per request); each trial's percentiles are computed the same way
    from that trial's records alone.  A level that failed requests or cannot be trusted is a
    *problem*, except one whose only fault is that the server never had every stream running
    at once: that load is beyond what the server runs, so it is *beyond* (broken), not
    unjudgeable.  Client jitter in the level's ITL tail and trials re-measured for a client
    stall become the outcome's warnings.
    """
    from pytest_kimi.measure.capacity_latency import jitter, probe_latencies
    from pytest_kimi.verdicts import Verdict

    clock, names, q = level.figures.clock, list(settings.ceilings), settings.percentile
    pooled = probe_latencies(level.trials, names, q, clock, settings.itl)
    per_trial = [
        probe_latencies([trial], names, q, clock, settings.itl)
        for trial in level.trials
        if any(r.ok for r in trial.records)
    ]
    tail = jitter(level.trials, q, clock)
    warnings = [w for w in [tail.warning() if tail is not None else None] if w is not None]
    replaced = len(level.replaced_trials)
    if replaced:
        warnings.append(
            f"{replaced} trial(s) re-measured, not counted: " + "; ".join(level.replaced_trials)
        )
    extra: dict[str, Any] = {
        "warnings": warnings,
        "jitter": tail.ratio if tail is not None else None,
        "replaced": replaced,
    }
    verdict = Verdict.of(level.verdict)
    if verdict in (Verdict.ERROR, Verdict.NOT_RUN):
        return LevelOutcome(pooled, per_trial, problem="; ".join(level.reasons) or "error", **extra)
    if verdict is Verdict.INVALID:
        invalid = [t for t in level.trials if t.invalid]
        if invalid and all(
            t.window is None and t.requests_ok > 0 and len(t.invalid) == 1 and not t.transient
            for t in invalid
        ):
            return LevelOutcome(
                pooled,
                per_trial,
                beyond="the server never ran every stream at once (more than its running "
                "limit): beyond its capacity",
                **extra,
            )
        return LevelOutcome(
            pooled, per_trial, problem="; ".join(level.reasons) or "invalid", **extra
        )
    return LevelOutcome(pooled, per_trial, **extra)


@dataclass(slots=True)
class CapacityRun:
    """What :func:`run_capacity` measured: the levels (as a test's results) and the estimate."""

    result: Any
    """The :class:`~pytest_kimi.measure.results.ThroughputResult` holding the levels."""
    estimate: CapacityEstimate


async def run_capacity(
    client: Any,
    spec: MeasureSpec,
    settings: SearchSettings,
    progress: Any = None,
) -> CapacityRun:
    """Drive a search with the plugin's own level measurement.

    ``spec`` is the test's :class:`~pytest_kimi.measure.measure_spec.MeasureSpec`, whose workload holds
    one level (lengths and prompts: the template); each probe measures that level at the
    probe's load with :func:`~pytest_kimi.measure.trials.measure_level`, the protocol the test
    runs with (stationary by default), after one warm-up.  A top-up measures the extra trials
    and re-judges the level on all its trials.  The levels are left on ``spec.state.partial``
    as they finish, so an interrupted search still reports them.  Each probe measures with a
    copy of ``spec`` (its trials, its workload's seed) that shares the spec's trial state.
    Each trial passes :class:`~pytest_kimi.measure.capacity_latency.ProbeStallCheck` (around
    the test's own observer): a trial whose judged latency a client stall inflated is measured
    again.
    """
    from pytest_kimi.measure.capacity_latency import ProbeStallCheck
    from pytest_kimi.measure.results import ThroughputResult
    from pytest_kimi.measure.one_trial import warm_up
    from pytest_kimi.measure.trials import _account, close_guard, measure_level

    send = spec.send
    template = send.workload.levels[0]
    result = ThroughputResult(send.nodeid, send.workload, send.targets)
    spec.state.partial = result
    search = CapacitySearch(settings)
    measured: dict[float, Any] = {}
    observer = ProbeStallCheck(
        spec.watch.observer, settings.ceilings, settings.percentile, send.clock, settings.itl
    )
    spec = dataclasses.replace(spec, watch=dataclasses.replace(spec.watch, observer=observer))
    try:
        await observer.open()
        warm_start = perf_counter()
        await warm_up(client, spec)
        result.warmup_server_time_s = round((perf_counter() - warm_start) * send.clock, 3)
        while (probe := search.next_probe()) is not None:
            level_spec = dataclasses.replace(
                template,
                concurrency=int(probe.load) if settings.metric == "concurrency" else None,
                rate=probe.load if settings.metric == "rate" else None,
            )
            previous = measured.get(probe.load) if probe.top_up else None
            done = len(previous.trials) if previous is not None else 0
            # top-ups continue the trial numbering (open-loop arrivals are seeded by it)
            workload = dataclasses.replace(send.workload, seed=send.workload.seed + done)
            probe_spec = dataclasses.replace(
                spec, send=dataclasses.replace(send, workload=workload), trials=probe.trials
            )
            level = await measure_level(client, probe_spec, level_spec, progress)
            if previous is not None:
                level = _merged(previous, level, spec)
            measured[probe.load] = level
            judged = search.tell(probe.load, outcome_of(level, settings))
            _label_level(level, judged, settings)
            result.levels = sorted(measured.values(), key=lambda lv: lv.spec.load)
            if spec.watch.level_done is not None:
                spec.watch.level_done(level)
        estimate = search.estimate()
    finally:
        try:
            await observer.close()
        finally:
            await close_guard(spec)
            _account(result, send.clock)
    return CapacityRun(result, estimate)


def _merged(first: Any, more: Any, spec: MeasureSpec) -> Any:
    """One level from two measurements of the same load: re-judged on all the trials."""
    from pytest_kimi.measure.results import judge_level
    from pytest_kimi.measure.trials import prompt_tokens_summary

    for i, trial in enumerate(more.trials):
        trial.index = len(first.trials) + i
    trials = [*first.trials, *more.trials]
    level = judge_level(
        first.spec,
        spec.send.workload,
        spec.send.targets,
        trials,
        first.prompts_key,
        spec.send.clock,
    )
    level.protocol = first.protocol
    level.extra = first.extra.copy()
    level.extra.update(more.extra)
    for name in ("turns", "fill_up", "input_tokens_sizing"):
        setattr(level, name, getattr(more, name) or getattr(first, name))
    level.server_time_s = round((first.server_time_s or 0.0) + (more.server_time_s or 0.0), 3)
    level.prompt_tokens = prompt_tokens_summary(trials)
    level.replaced_trials = [*first.replaced_trials, *more.replaced_trials]
    level.trial_windows = [
        *first.trial_windows,
        *(
            dataclasses.replace(w, trial=len(first.trial_windows) + i)
            for i, w in enumerate(more.trial_windows)
        ),
    ]
    notes = [e for e in [*first.errors, *more.errors] if e.startswith("note:")]
    level.errors.extend(n for n in dict.fromkeys(notes) if n not in level.errors)
    return level


def _label_level(level: Any, judged: CapacityLevel, settings: SearchSettings) -> None:
    """A search level's verdict says what the search learned there: ``held`` or ``broke``
    (a missed ceiling is the point of the search, not a failure); others keep theirs.  Its
    reasons are the ceilings the search judged it on (a ``@throughput`` reason would quote the
    per-gap ITL, which is not what broke it), then the warnings as notes."""
    from pytest_kimi.measure.capacity_latency import NAMES
    from pytest_kimi.verdicts import Verdict

    notes = [f"note: {w}" for w in judged.warnings]
    if judged.held is True:
        level.verdict = Verdict.HELD.value
        level.reasons = notes
    elif judged.held is False:
        level.verdict = Verdict.BROKE.value
        missed = [
            f"{NAMES[name]} p{settings.percentile:g} {value:.4g} s > max_{name} {limit:g}"
            + (
                " (each request's mean ITL)"
                if name == "itl_s" and settings.itl == "request"
                else ""
            )
            for name, limit in settings.ceilings.items()
            if (value := judged.latencies.get(name)) is not None and value > limit
        ]
        level.reasons = [*missed, *([judged.note] if judged.note else []), *notes]
    else:
        level.reasons = [*level.reasons, *(n for n in notes if n not in level.reasons)]
    level.capacity_level = judged.to_dict()
