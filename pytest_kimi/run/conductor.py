"""The one path a perf test takes: prepare, measure, judge, annotate.

Before this module, ``@throughput`` and ``@capacity`` ran through two copies of this path
(``measure_gated`` and ``measure_capacity_gated``), and the copies had drifted: an interrupted
capacity test in an A/B lost its deployment's name, and the cache-flush note never reached a
capacity's levels.  Now :func:`conduct` is the path and a :class:`TestPlan` says which of two
*jobs* runs in its middle: a fixed sweep (:class:`SweepJob`) or a capacity search
(:class:`CapacityJob`).  A job only measures and judges; everything around it -- the baseline
and what the test is compared with, the prefix-cache flush, the server-counter check, an
interrupt, the A/B reference, a server crash, the report fields -- happens here once, for both.

No pytest here: the plugin resolves the endpoint and the deployment, calls :func:`conduct` and
turns a :class:`GateProblem` into a test failure; ``bench/`` scripts call it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from pytest_kimi.baseline import (
    BaselineError,
    BaselineStore,
    Provenance,
    TestBaseline,
    WorkloadKey,
    provenance_diff,
)
from pytest_kimi.baseline.update import reference_baseline
from pytest_kimi.crosscheck.metrics_page import ServerMetricsError
from pytest_kimi.crosscheck.server_metrics import ServerMetricsObserver
from pytest_kimi.endpoint.discovery import EndpointInfo
from pytest_kimi.options import KimiOptions
from pytest_kimi.gate.capacity_gate import (
    capacity_dict,
    capacity_key,
    explain_miss,
    judge_capacity,
    record_of,
)
from pytest_kimi.gate.latency_gate import (
    DEFAULT_LATENCY_TOLERANCE,
    apply_latency_gate,
    latency_tolerance,
)
from pytest_kimi.gate.noise_evidence import with_stored_noise
from pytest_kimi.gate.policy import (
    AdaptiveTrials,
    GateSettings,
    IncomparableBaseline,
    apply_gate,
    baseline_samples,
    check_comparable,
)
from pytest_kimi.measure.capacity_levels import SearchSettings
from pytest_kimi.measure.capacity_run import run_capacity
from pytest_kimi.measure.results import LevelResult, ServerExit, ThroughputResult, spec_key
from pytest_kimi.measure.measure_spec import (
    FixedTrials,
    LevelInfo,
    MeasureSpec,
    SendSpec,
    TrialPolicy,
)
from pytest_kimi.measure.trials import ProgressFn
from pytest_kimi.run.measurer import (
    Measurer,
    build_send,
    first_trials,
    watchers_for,
)
from pytest_kimi.workload.capacity_marker import CapacitySpec
from pytest_kimi.workload.workload_spec import DEFAULT_PROTOCOL, Targets, Workload
from pytest_kimi.workload.prompts import WorkloadError
from pytest_kimi.verdicts import Verdict

INTERRUPTED = (
    "measurement interrupted (Ctrl-C or SIGTERM); only the levels it finished are reported"
)
CORRUPT_FIX = (
    "fix the file by hand, restore it with `git checkout -- {path}`, or rewrite it from this "
    "run with --update-baselines=force"
)
"""How a corrupt baseline file stops being one: said under the error that names it."""


class GateProblem(RuntimeError):
    """The test cannot be measured as asked (bad prompts file, corrupt or incomparable baseline,
    a server without the counters ``--perf-server-metrics`` needs): it fails before any load."""


class MeasurementInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a measurement; ``result`` holds the levels it finished,
    annotated like a finished test's (baseline file, deployment, session)."""

    def __init__(self, result: ThroughputResult) -> None:
        super().__init__()
        self.result = result


@dataclass(frozen=True, slots=True)
class TestPlan:
    """What one perf test measures: its marker's workload and targets, and for ``@capacity``
    the search (``workload`` then holds its one level shape)."""

    __test__ = False  # not a pytest test class, whatever its name

    workload: Workload
    targets: Targets
    capacity: CapacitySpec | None = None

    @property
    def marker(self) -> str:
        return "@capacity" if self.capacity is not None else "@throughput"

    def job(self) -> Job:
        return SweepJob() if self.capacity is None else CapacityJob(self.capacity)


PAIRED_COMPARISON = "the paired deploy comparison (its section of the summary)"
"""What a launch of a paired experiment is compared with: not one baseline, all the launches."""
RACE_COMPARISON = "the race (its section of the summary)"
"""What a raced launch is compared with: every launch of every deployment, not a baseline."""


@dataclass(frozen=True, slots=True)
class JudgedAgainst:
    """What one test is judged against: its stored baseline, or a reference deployment's run."""

    store: BaselineStore
    deployment: str | None = None
    reference: str | None = None
    """Same-run A/B: the first deployment's name (None without an A/B)."""
    references: dict[str, TestBaseline] | None = None
    """Same-run A/B: the reference deployment's results so far, by test id (filled here)."""
    paired: bool = False
    """``--perf-max-launches``: every launch is measured, not judged on its own; the paired
    deploy comparison judges the launches together (:mod:`pytest_kimi.run.deploy_gate`); so
    does the race (:mod:`pytest_kimi.run.race_run`)."""
    judged_by: str = PAIRED_COMPARISON
    """``paired``: the experiment that judges the launches (the result's ``compared_with``)."""

    @property
    def is_candidate(self) -> bool:
        return self.reference is not None and self.deployment not in (None, self.reference)

    @property
    def is_reference(self) -> bool:
        return self.reference is not None and self.deployment == self.reference


@dataclass(frozen=True, slots=True)
class Conditions:
    """How the session measures every test (its options, resolved once by the caller)."""

    rootdir: Path
    trials: int | None = None
    protocol: str = DEFAULT_PROTOCOL
    server_metrics: bool = False
    """``--perf-server-metrics``: check every trial against the server's own counters."""
    latency_tolerance: float = DEFAULT_LATENCY_TOLERANCE
    """``--perf-latency-tolerance``: how much slower TTFT and ITL may be than the baseline's."""
    replace_corrupt: bool = False
    """``--update-baselines=force``: a corrupt baseline file is measured as none, so that the
    update at the end can replace it (without force it fails the test before any load)."""
    level_done: Callable[[LevelResult], None] | None = None
    """Called with each level once it is final (``--perf-requests``: ``MeasureSpec.level_done``)."""
    allow_large: bool = False
    """``--perf-allow-large``: lifts the size bounds on dataset and prompts files."""

    @classmethod
    def of(cls, opts: KimiOptions, rootdir: Path, **more: Any) -> Conditions:
        """The session's conditions from its options (``more``: the per-test fields), one
        place for every caller: the perf tests' fixture, the culprit search, the race."""
        return cls(
            rootdir=rootdir,
            trials=opts.perf_trials,
            protocol=opts.perf_protocol,
            server_metrics=opts.perf_server_metrics,
            latency_tolerance=opts.perf_latency_tolerance,
            allow_large=opts.perf_allow_large,
            **more,
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    """A test before any load: where its baseline lives, what to measure, what it is judged
    against, and the provenance of this run."""

    path: Path
    send: SendSpec
    """What the test sends (its bodies encoded before any load)."""
    level_info: LevelInfo | None
    trials: int
    """Trials each level starts with."""
    baseline: TestBaseline | None
    current: Provenance
    compared_with: str
    latency_tolerance: float = DEFAULT_LATENCY_TOLERANCE
    """The session's latency tolerance (a marker's ``latency_tolerance=`` overrides it)."""
    corrupt: str | None = None
    """What is wrong with a corrupt baseline file measured as none (``replace_corrupt``)."""


@dataclass(frozen=True, slots=True)
class Judged:
    """What a job's judgement hands back to the path: the provenance changes to report and,
    for the reference deployment of an A/B, the baseline its candidates are judged against."""

    provenance_changes: list[str]
    reference: TestBaseline | None


class Job(Protocol):
    """The middle of the path: what differs between a sweep and a capacity search."""

    def policy(self, prepared: Prepared, settings: GateSettings) -> TrialPolicy:
        """How many trials each level gets (a sweep's adapt to its baseline's spread)."""
        ...

    def measure(
        self,
        measurer: Measurer,
        spec: MeasureSpec,
        settings: GateSettings,
        progress: ProgressFn | None,
    ) -> ThroughputResult: ...

    def judge(
        self,
        result: ThroughputResult,
        prepared: Prepared,
        settings: GateSettings,
        targets: Targets,
        name: str | None,
    ) -> Judged: ...


def conduct(
    plan: TestPlan,
    nodeid: str,
    measurer: Measurer,
    endpoint: EndpointInfo,
    settings: GateSettings,
    comparison: JudgedAgainst,
    conditions: Conditions,
    *,
    server: Any = None,
    progress: ProgressFn | None = None,
) -> ThroughputResult:
    """Measure one test and judge it: the whole path, for both markers.

    Raises :class:`GateProblem` before any load when the test cannot be measured as asked,
    and :class:`MeasurementInterrupted` (carrying the finished levels) on Ctrl-C or SIGTERM.
    ``server`` is a managed deployment (its cache is flushed first, a crash is reported).
    """
    settings = settings.for_test(plan.targets)  # marker tolerance=/alpha= > the session's
    prepared = prepare(plan, nodeid, measurer, endpoint, comparison, conditions)
    # the noise its baseline's recording measured, weighed with the session's
    session_settings, settings = settings, with_stored_noise(settings, prepared.baseline)
    pid = getattr(server, "pid", None) or endpoint.server_pid
    # a fresh server is warmed until stationary, unless the marker asks for no warm-up at all
    # or the server is the simulator, whose first steps are as fast as its last unless it
    # simulates first-use costs (cold_steps): its stationarity is known, not measured
    fresh = measurer.first_on(f"{endpoint.url} pid {pid}")
    sim = (endpoint.server_info or {}).get("sim")
    stationary = isinstance(sim, dict) and not sim.get("cold_steps")
    flush_note = flush_cache(server)
    observer = (
        ServerMetricsObserver(endpoint.url, endpoint.headers())
        if conditions.server_metrics
        else None
    )
    job = plan.job()
    spec = MeasureSpec(  # built once: only its trial state changes under the measurement
        prepared.send,
        watchers_for(
            endpoint,
            prepared.level_info,
            policy=job.policy(prepared, settings),
            observer=observer,
            min_window_s=observer.min_window_s if observer is not None else 0.0,
            level_done=conditions.level_done,
        ),
        trials=prepared.trials,
        fresh_server=fresh and prepared.send.workload.warmup > 0 and not stationary,
    )
    try:
        result = job.measure(measurer, spec, settings, progress)
    except ServerMetricsError as exc:
        raise GateProblem(f"--perf-server-metrics: {exc}") from None
    except KeyboardInterrupt:
        partial = spec.state.partial
        if partial is None:
            raise
        if isinstance(job, SweepJob) and partial.levels:
            # the finished levels get the verdicts the gate gives them (a level without a
            # baseline is no-baseline, not the pass of its targets); an unfinished search has
            # no capacity to judge, its levels keep held/broke
            job.judge(partial, prepared, settings, plan.targets, None)
            _note_missing_baseline(partial, prepared, comparison)
        _annotate(partial, measurer, prepared, comparison, flush_note, server)
        partial.interrupted = INTERRUPTED
        raise MeasurementInterrupted(partial) from None
    judged = job.judge(
        result,
        prepared,
        settings,
        plan.targets,
        comparison.reference if comparison.is_reference else None,
    )
    _annotate(result, measurer, prepared, comparison, flush_note, server)
    if settings is not session_settings:
        result.session_noise = {"sigma": settings.session_sigma, "source": settings.sigma_source}
    result.provenance_changes = judged.provenance_changes
    _note_missing_baseline(result, prepared, comparison)
    if comparison.reference is not None or comparison.paired:
        result.compared_with = prepared.compared_with
    if judged.reference is not None and comparison.references is not None:
        comparison.references[nodeid] = judged.reference
    return result


def _note_missing_baseline(
    result: ThroughputResult, prepared: Prepared, comparison: JudgedAgainst
) -> None:
    """Where the baseline would be and how to record it (a candidate of an A/B has none)."""
    if prepared.baseline is not None or comparison.is_candidate or comparison.paired:
        return
    if prepared.corrupt is not None:
        result.baseline_note = (
            f"corrupt baseline {prepared.path} ({prepared.corrupt}): measured as without one; "
            "--update-baselines=force replaces it"
        )
    else:
        result.baseline_note = (
            f"no baseline yet: {prepared.path} (record it with --update-baselines)"
        )


def prepare(
    plan: TestPlan,
    nodeid: str,
    measurer: Measurer,
    endpoint: EndpointInfo,
    comparison: JudgedAgainst,
    conditions: Conditions,
) -> Prepared:
    """Before any load: the baseline file, the measurement spec and what the test is judged
    against (its baseline, or the reference deployment's run), checked comparable.

    A corrupt or incomparable baseline and a workload that cannot be built raise
    :class:`GateProblem` naming the marker's argument (a corrupt file with how to fix it; with
    ``replace_corrupt`` it is measured as none instead).
    """
    path = comparison.store.path_for(nodeid)
    corrupt: str | None = None
    current = Provenance.collect(
        model=endpoint.model,
        server_info=endpoint.server_info,
        session_ids=[measurer.session_id],
        suite_dir=conditions.rootdir,
    )
    try:
        send, level_info = build_send(
            endpoint,
            nodeid,
            plan.workload,
            plan.targets,
            rootdir=conditions.rootdir,
            sizer=measurer.prompt_sizer,
            protocol=conditions.protocol,
            allow_large=conditions.allow_large,
        )
        if comparison.paired:
            baseline, compared_with = None, comparison.judged_by
        elif comparison.is_candidate:
            baseline = (comparison.references or {}).get(nodeid)
            compared_with = f"deployment {comparison.reference} (same run)"
        else:
            compared_with = str(path)
            try:
                baseline = comparison.store.load(nodeid)
            except BaselineError as exc:
                if not conditions.replace_corrupt:
                    raise
                baseline, corrupt = None, exc.problem
        check_comparable(baseline, current, compared_with)
    except WorkloadError as exc:
        from pytest_kimi.workload.dataset import DatasetError

        argument = "dataset" if isinstance(exc, DatasetError) else "prompts"
        raise GateProblem(f"{plan.marker} {argument}: {exc}") from None
    except BaselineError as exc:
        root = conditions.rootdir
        shown = exc.path.relative_to(root) if exc.path.is_relative_to(root) else exc.path
        raise GateProblem(f"{exc}\n{CORRUPT_FIX.format(path=shown)}") from None
    except IncomparableBaseline as exc:
        raise GateProblem(str(exc)) from None
    return Prepared(
        path,
        send,
        level_info,
        first_trials(send.workload, conditions.trials),
        baseline,
        current,
        compared_with,
        latency_tolerance=conditions.latency_tolerance,
        corrupt=corrupt,
    )


def _annotate(
    result: ThroughputResult,
    measurer: Measurer,
    prepared: Prepared,
    comparison: JudgedAgainst,
    flush_note: str | None,
    server: Any,
) -> None:
    """The fields every test's result carries, finished or interrupted, sweep or search."""
    result.baseline_file = str(prepared.path)
    result.baseline_profile = comparison.store.profile
    result.session_id = measurer.session_id
    if comparison.deployment is not None:
        result.deployment = comparison.deployment
        for level in result.levels:
            level.deployment = comparison.deployment
    if flush_note is not None:
        result.cache_flush = flush_note
        for level in result.levels:
            if f"note: {flush_note}" not in level.errors:
                level.errors.append(f"note: {flush_note}")
    note_server_crash(result, server)


class SweepJob:
    """``@throughput``: fixed levels with adaptive trials, each compared with its baseline."""

    def __init__(self) -> None:
        self._policy: AdaptiveTrials | None = None

    def policy(self, prepared: Prepared, settings: GateSettings) -> TrialPolicy:
        """Adaptive trials: as many as the level's spread and its baseline's need."""
        send = prepared.send
        keys = {
            lv: spec_key(
                lv,
                send.prompts_key(lv),
                send.workload,
                send.workload.protocol_for(lv, send.protocol),
            )
            for lv in send.workload.levels
        }
        self._policy = AdaptiveTrials(
            baseline_samples(prepared.baseline, keys),
            settings,
            len(keys),
            first_trials=prepared.trials,
        )
        return self._policy

    def measure(
        self,
        measurer: Measurer,
        spec: MeasureSpec,
        settings: GateSettings,
        progress: ProgressFn | None,
    ) -> ThroughputResult:
        return measurer.measure(spec, progress)

    def judge(
        self,
        result: ThroughputResult,
        prepared: Prepared,
        settings: GateSettings,
        targets: Targets,
        name: str | None,
    ) -> Judged:
        changes = apply_gate(
            result,
            prepared.baseline,
            prepared.compared_with,
            prepared.current,
            settings,
            tolerance=targets.tolerance,
            alpha=targets.alpha,
            alpha_weights=self._policy.alpha_weights if self._policy is not None else None,
            designs=self._policy.designs if self._policy is not None else None,
        )
        apply_latency_gate(  # TTFT and ITL against the baseline's: their own tolerance
            result,
            prepared.baseline,
            tolerance=latency_tolerance(targets, prepared.latency_tolerance),
            alpha=settings.alpha,  # the marker's alpha= is in it already (for_test)
            session_sigma=settings.session_sigma,
        )
        reference = reference_baseline(result, prepared.current, name) if name is not None else None
        return Judged([str(c) for c in changes], reference)


class CapacityJob:
    """``@capacity``: a search for the highest load that holds every ceiling, judged against
    ``min_capacity`` and the baseline's capacity (:mod:`pytest_kimi.gate.capacity_gate`)."""

    def __init__(self, capacity: CapacitySpec) -> None:
        self.capacity = capacity
        self._run: Any = None
        self._key: dict[str, Any] = {}

    def policy(self, prepared: Prepared, settings: GateSettings) -> TrialPolicy:
        """The search sets each probe's trials itself (its top-ups add more)."""
        return FixedTrials(prepared.trials)

    def measure(
        self,
        measurer: Measurer,
        spec: MeasureSpec,
        settings: GateSettings,
        progress: ProgressFn | None,
    ) -> ThroughputResult:
        send, capacity = spec.send, self.capacity
        template = send.workload.levels[0]
        level_protocol = send.workload.protocol_for(template, send.protocol)
        self._key = capacity_key(
            capacity, send.workload, send.prompts_key(template), level_protocol
        )
        search = SearchSettings(
            metric=capacity.metric,
            low=capacity.low,
            high=capacity.high,
            ceilings=capacity.ceilings,
            percentile=capacity.percentile,
            resolution=capacity.resolution,
            max_levels=capacity.max_levels,
            first_trials=spec.trials,
            max_trials=max(settings.max_trials, spec.trials),
            must_probe=capacity.min_capacity,
            itl=capacity.itl,
        )
        self._run = measurer.run_job(lambda client: run_capacity(client, spec, search, progress))
        result: ThroughputResult = self._run.result
        return result

    def judge(
        self,
        result: ThroughputResult,
        prepared: Prepared,
        settings: GateSettings,
        targets: Targets,
        name: str | None,
    ) -> Judged:
        estimate, key, stored = self._run.estimate, self._key, prepared.baseline
        record = record_of(estimate, key) if estimate.problem is None and estimate.levels else None
        stored_capacity = None
        note = None
        if stored is not None:
            if stored.capacity is not None and stored.capacity.workload == WorkloadKey.from_dict(
                key
            ):
                stored_capacity = stored.capacity
            else:
                note = explain_miss(stored, key)
        judged = judge_capacity(
            estimate, self.capacity, record, stored_capacity, settings, result.levels
        )
        if note is not None and judged.verdict == Verdict.NO_BASELINE:
            judged.reasons.append(note)
        result.capacity = capacity_dict(estimate, self.capacity, key, judged)
        changes = (
            [str(c) for c in provenance_diff(stored.provenance, prepared.current)]
            if stored is not None
            else []
        )
        reference = None
        if name is not None and record is not None:
            reference = TestBaseline(
                test=result.nodeid,
                profile=name,
                provenance=prepared.current,
                levels=(),
                capacity=record,
            )
        return Judged(changes, reference)


def flush_cache(server: Any) -> str | None:
    """Empty a managed server's prefix cache before a test; a note when that failed.

    Prompts are unique per request anyway (:mod:`pytest_kimi.workload.prompts`), so a leftover cache
    can only help through shared template tokens; still, a refused flush (the server busy past
    the wait, a missing admin key) is reported rather than ignored.  An engine without a flush
    endpoint (vLLM) is not a failure.
    """
    if server is None or getattr(getattr(server, "engine", None), "flush_path", None) is None:
        return None
    if server.flush_cache():
        return None
    why = getattr(server, "flush_error", None) or "refused"
    return f"prefix cache not flushed before this test: {why}"


def note_server_crash(result: ThroughputResult, server: Any) -> None:
    """A managed server that died during the measurement: say so, with its last log lines."""
    code = server.crashed() if server is not None else None
    if code is None:
        return
    result.server_exit = ServerExit(code, str(server.log_path), server.log_tail(40))
    for level in result.levels:
        if Verdict.of(level.verdict) in (Verdict.ERROR, Verdict.NOT_RUN):
            level.reasons.append(f"the server exited with code {code} (log {server.log_path})")
            break
