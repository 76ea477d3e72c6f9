"""The JSON report's shape (docs/reference/json-report.md) as ``TypedDict`` s: the typed wire.

One module above 700 lines on purpose: it is the one schema that docs/reference/json-report.md
documents and ``tests/unit/core/test_json_schema.py`` checks key by key, and it is read as one (an
object's keys beside the objects that hold it); it is declarations only, and splitting it would
split the report's shape over files that no reader or check follows apart.

The measurement's typed results become JSON once (``ThroughputResult.to_dict``,
``TestRecord.to_json``, ``build_report``); every reader after that (the report sinks, the
history rows, ``kimi-perf``, the baseline update, the deploy gate, ``--perf-sessions``, the
public fixtures) reads these types, so ``mypy --strict`` checks each key it reads and each
value's type.  A base module: it imports nothing of the package, so every stage may use it.

Each object is split in two where it has optional keys: a base class of the keys always
present, and a ``total=False`` subclass of the keys present only where they apply (docs:
"a field that does not apply is absent").  Python 3.10 has no ``NotRequired``; the split is its
spelling.  A key the doc says is ``null`` when it does not apply is present, typed ``X | None``.

A saved report read back (``kimi-perf``, the history) is parsed JSON: the types say what the
plugin writes, and the readers that take reports from elsewhere still check what they read.
``tests/unit/core/test_json_schema.py`` holds these keys against the doc's tables and the producers.
"""

from __future__ import annotations

from typing import Any, TypedDict

# ---------------------------------------------------------------------------------- a level


class TrialWindowEntry(TypedDict):
    """One trial's steady-state window (``trial_windows``: docs "A level's trial windows")."""

    trial: int
    kept: bool
    valid: bool
    start_monotonic: float | None
    end_monotonic: float | None
    start_unix: float | None
    unix_offset: float
    tokens: float
    tok_s: float | None
    requests: int
    cut: int
    reason: str | None


class LatencyFigureEntry(TypedDict):
    """One latency statistic of a level's ``latency`` section (``ttft_s_p95``)."""

    value: float | None
    trials: list[float]
    target: float | None
    baseline: float | None
    baseline_trials: list[float]
    change_pct: float | None
    ci90: list[float | None] | None
    p_value: float | None
    p_adjusted: float | None
    min_detectable_pct: float | None
    verdict: str | None
    note: str | None


class LatencyEntry(TypedDict):
    """A ``@throughput`` level's ``latency`` section (docs "A level's latency")."""

    percentile: float
    tolerance_pct: float | None
    compared: bool
    note: str | None
    figures: dict[str, LatencyFigureEntry]


class ClientSummary(TypedDict, total=False):
    """The load client's worst figures over a level's trials (empty for a level not run)."""

    loop_lag_max_ms: float
    send_delay_p99_ms: float
    cpu_share: float


class PeerCounts(TypedDict):
    """What a level's peer figures rest on (``peer_counts``)."""

    ttft: int
    itl: int
    tpot: int
    e2e: int
    window_tokens: float
    window_requests: float


class PeerEntry(TypedDict):
    """A level's peer figures (docs "Peer figures"): every key present, null when not run."""

    ttft_s_mean: float | None
    ttft_s_std: float | None
    ttft_s_min: float | None
    ttft_s_p50: float | None
    ttft_s_p90: float | None
    ttft_s_p95: float | None
    ttft_s_p99: float | None
    ttft_s_max: float | None
    itl_s_mean: float | None
    itl_s_std: float | None
    itl_s_min: float | None
    itl_s_p50: float | None
    itl_s_p90: float | None
    itl_s_p95: float | None
    itl_s_p99: float | None
    itl_s_max: float | None
    tpot_s_mean: float | None
    tpot_s_std: float | None
    tpot_s_min: float | None
    tpot_s_p50: float | None
    tpot_s_p90: float | None
    tpot_s_p95: float | None
    tpot_s_p99: float | None
    tpot_s_max: float | None
    e2e_s_mean: float | None
    e2e_s_std: float | None
    e2e_s_min: float | None
    e2e_s_p50: float | None
    e2e_s_p90: float | None
    e2e_s_p95: float | None
    e2e_s_p99: float | None
    e2e_s_max: float | None
    requests_per_s: float | None
    input_tok_s: float | None
    total_tok_s: float | None
    peer_counts: PeerCounts | None


class LevelCore(TypedDict):
    """What every level carries, measured or not (``LevelResult.to_dict``)."""

    label: str
    concurrency: int | None
    rate: float | None
    max_tokens: int
    input_tokens: int | None
    prompts: str
    protocol: str | None
    tok_s: float | None
    trials_tok_s: list[float]
    spread_pct: float | None
    request_tok_s_p50: float | None
    ttft_s_p50: float | None
    ttft_s_p95: float | None
    itl_s_p50: float | None
    percentile: float
    ttft_s_pct: float | None
    itl_s_pct: float | None
    e2e_s_pct: float | None
    goodput: float | None
    requests_ok: int
    requests_failed: int
    target_tok_s: float | None
    verdict: str
    reasons: list[str]
    errors: list[str]
    trials: int
    trial_windows: list[TrialWindowEntry]
    client: ClientSummary


class ReasoningEntry(TypedDict, total=False):
    """A level whose streams separated reasoning from content (absent otherwise)."""

    reasoning_requests: int
    reasoning_tokens_mean: float | None
    content_tokens_mean: float | None
    ttfc_s_p50: float | None
    ttfc_s_p95: float | None
    ttfc_s_pct: float | None
    reasoning_no_content: int


class OpenLoopEntry(TypedDict, total=False):
    """An open-loop level's rates: asked, sent, finished in the window."""

    offered_rate: float
    achieved_rate: float | None
    completed_rate: float | None


class PromptTokens(TypedDict):
    """The prompt lengths the server counted over a level's successful requests."""

    mean: float
    min: int
    max: int
    requests: int


class TurnEntry(TypedDict):
    """One turn of a multi-turn level."""

    turn: int
    requests: int
    prompt_tokens_mean: float | None
    ttft_s_p50: float | None


class CapacityLevelEntry(TypedDict):
    """One load of a ``@capacity`` search, judged: a level's ``capacity_level`` and an entry of
    the capacity's ``levels``."""

    load: float
    order: int
    held: bool | None
    trials: int
    margin_pct: float | None
    sure: float | None
    binding: str | None
    latencies: dict[str, float | None]
    note: str | None
    warnings: list[str]
    itl_p95_p50: float | None
    replaced: int


class MeasuredEntry(TypedDict, total=False):
    """What the measurement adds to a level where it applies (``LevelResult``'s optional
    fields, absent when unset)."""

    server_time_s: float
    prompt_tokens: PromptTokens
    turns: list[TurnEntry]
    fill_up: str
    input_tokens_sizing: str
    replaced_trials: list[str]
    capacity_level: CapacityLevelEntry
    profile: str


class ComparisonEntry(TypedDict, total=False):
    """A level against its baseline (``BaselineComparison.to_dict``).  Without a baseline only
    the first four keys, each null; with one, all of them."""

    baseline_tok_s: float | None
    change_pct: float | None
    ci90: list[float | None] | None
    p_value: float | None
    baseline_trials: int | None
    baseline_trials_tok_s: list[float]
    p_adjusted: float | None
    min_detectable_drop_pct: float | None
    tolerance_pct: float | None


class LengthDraws(TypedDict):
    """One length's draws under ``range_ratio`` (``input_tokens`` or ``max_tokens``)."""

    range: list[int]
    draws: int
    mean: float
    min: int
    max: int


class LengthRange(TypedDict, total=False):
    """``length_range``: the ratio and the draws per length."""

    range_ratio: float | dict[str, float] | None
    input_tokens: LengthDraws
    max_tokens: LengthDraws


class ClientQueue(TypedDict):
    """``client_queue``: an open loop under ``max_concurrency``, the waits for a free slot."""

    max_concurrency: int
    arrivals: int
    queued: int
    wait_s_mean: float
    wait_s_p50: float
    wait_s_p90: float
    wait_s_p99: float
    wait_s_max: float


class DatasetSection(TypedDict):
    """``dataset``: a dataset workload's sample at the level's cap."""

    name: str
    file: str
    sha256: str
    format: str
    entries: int
    skipped: int
    sampled: int
    seed: int
    output_tokens: str
    estimated: bool
    output_tokens_mean: float
    output_tokens_min: int
    output_tokens_max: int
    capped: int
    input_check: str | None


class SharedPrefixSection(TypedDict):
    """``shared_prefix``: the shared system prompts of a level."""

    tokens: int
    groups: int
    sizing: str
    estimated: bool


class _PrefixCacheRequired(TypedDict):
    hit_rate: float
    prompt_tokens: int
    cached_tokens: int
    metrics: list[str]


class PrefixCacheSection(_PrefixCacheRequired, total=False):
    """``prefix_cache``: prompt tokens looked up and served from the cache over the level."""

    cached_metric_absent: bool


class ServerCheckTrial(TypedDict):
    """One trial of ``server.trials``: the server's counters against the client's."""

    trial: int
    tokens: int
    client_tokens: int
    exact: bool | None
    tok_s: float | None
    client_tok_s: float | None
    client_span_tok_s: float | None
    deviation_pct: float | None
    allowed_pct: float | None
    window_samples: int
    counting: str
    settle_s: float
    prompt_tokens: int | None
    client_prompt_tokens: int
    requests: int | None
    client_requests: int
    notes: list[str]


class ServerCheckSection(TypedDict):
    """``server``: ``--perf-server-metrics``' summary of a level (docs/guide/server-metrics.md)."""

    metric: str
    tokens: int
    client_tokens: int
    exact: bool | None
    tok_s: float | None
    client_tok_s: float | None
    max_deviation_pct: float | None
    tolerance_pct: float
    counting: str
    prompt_tokens: int | None
    client_prompt_tokens: int
    requests: int | None
    client_requests: int
    trials: list[ServerCheckTrial]


class _ContaminationRequired(TypedDict):
    checked: bool


class ContaminationSection(_ContaminationRequired, total=False):
    """``contamination``: what the contamination check met over a level
    (docs/guide/server-metrics.md); ``why`` alone where it could not check."""

    why: str
    gauges: list[str]
    trials: int
    void: int
    drain_waits_s: list[float]
    undrained_waits_s: list[float]
    stale_gauges: int


class LevelExtra(TypedDict, total=False):
    """The sections pluggable stages contribute under their own keys (``LevelResult.extra``):
    the workload's, the prefix-cache probe's, the server-counter check's, the contamination
    check's."""

    dataset: DatasetSection
    output_tokens_mean: float
    shared_prefix: SharedPrefixSection
    length_range: LengthRange
    client_queue: ClientQueue
    prefix_cache_hit_rate: float
    prefix_cache: PrefixCacheSection
    server: ServerCheckSection
    contamination: ContaminationSection


class LevelSummary(LevelExtra, total=False):
    """What a watcher or probe hands a level at its end (``TrialObserver.level_summary``,
    ``LevelProbe.end_level``): its sections, and ``notes`` for the level's reports (merged
    into the level's notes, never into its JSON)."""

    notes: list[str]


class PooledNoise(TypedDict):
    """The session noise several sessions measured for a level: ``sigma`` and its ``df``."""

    sigma: float
    df: int


class LevelTail(LevelExtra, total=False):
    """The rest of a level: its latency section (a ``@throughput`` level's) beside the
    stages' sections."""

    latency: LatencyEntry
    session_noise: PooledNoise
    """Not in a report: what ``--perf-sessions`` gives a pooled level for the baseline update
    (``run.server_starts.attach_session_noise``)."""


class LevelEntry(
    LevelCore,
    PeerEntry,
    ReasoningEntry,
    OpenLoopEntry,
    MeasuredEntry,
    ComparisonEntry,
    LevelTail,
    total=False,
):
    """A level's object (docs "A level"): the parts above, in this order."""


# ------------------------------------------------------------------------------------ a test


class WorkloadCore(TypedDict):
    api: str
    ignore_eos: bool


class WorkloadEntry(WorkloadCore, total=False):
    """What every level of a test shares (``workload_dict``); each knob only where set."""

    turns: int
    shared_prefix_tokens: int
    prefix_groups: int
    range_ratio: float
    range_ratio_input: float
    range_ratio_output: float
    seed: int
    burstiness: float
    max_concurrency: int


class WarmUpEntry(TypedDict):
    """One level warmed on a fresh server (a test's ``warm_up``)."""

    level: str
    tok_s: list[float]
    void: int
    stationary: bool
    text: str


class TestSessionNoise(TypedDict):
    """The session noise a test was judged with where it is not the session's."""

    sigma: float
    source: str


class ServerClock(TypedDict):
    """The clock a test's figures are in, where it is the simulator's."""

    kind: str
    speed: float


class ServerExitEntry(TypedDict):
    """A managed server that died during the measurement."""

    returncode: int
    log: str
    log_tail: str


class _PerfServerRequired(TypedDict):
    pid: int | None


class PerfServer(_PerfServerRequired, total=False):
    """Which server start measured a test (``--perf-sessions``): its pid, the simulator's seed."""

    seed: int


class _ShiftRequired(TypedDict):
    change_pct: float | None
    ci90: list[float | None]
    p_value: float | None
    p_improved: float | None
    verdict: str
    levels: int
    min_detectable_drop_pct: float | None


class ShiftEntry(_ShiftRequired, total=False):
    """A test's common shift over its compared levels (``shift``)."""

    text: str


class CapacityComparisonEntry(TypedDict):
    """A capacity against its baseline capacity: every key null where there was none."""

    baseline: float | None
    baseline_low: float | None
    baseline_high: float | None
    baseline_estimate: float | None
    change_pct: float | None
    change_ci90: list[float] | None
    p_value: float | None
    tolerance_pct: float


class CapacityEntry(CapacityComparisonEntry):
    """A ``@capacity`` test's ``capacity`` (``gate.capacity_gate.capacity_dict``; docs/
    workloads.md "Reports"); what the ``capacity_result`` fixture gives a test."""

    metric: str
    value: float | None
    low: float | None
    high: float | None
    estimate: float | None
    ci90: list[float] | None
    log_se: float | None
    log_se_df: int | None
    slope: float | None
    step: float
    resolution: float
    range: list[float]
    percentile: float
    ceilings: dict[str, float]
    min_capacity: float | None
    stop: str
    levels: list[CapacityLevelEntry]
    non_monotonic: list[float]
    workload: dict[str, Any]
    """The capacity's baseline key: the levels' workload, metric, ceilings, percentile."""
    verdict: str
    reasons: list[str]


class EndpointEntry(TypedDict, total=False):
    """The endpoint measured: URL (no credentials), model, server info (allow-listed)."""

    url: str
    model: str | None
    server_info: dict[str, Any]


class TestCore(TypedDict):
    """What every test carries, measured or not."""

    nodeid: str
    workload: WorkloadEntry
    levels: list[LevelEntry]


class TestEntry(TestCore, total=False):
    """A test's object (docs "A test"): ``ThroughputResult.to_dict``, with its outcome (and
    its error) added by ``TestRecord.to_json``."""

    outcome: str
    error: str
    server_time_s: float
    warmup_server_time_s: float
    warm_up: list[WarmUpEntry]
    session_noise: TestSessionNoise
    server_clock: ServerClock
    capacity: CapacityEntry
    shift: ShiftEntry
    baseline_file: str
    baseline_profile: str
    session_id: str
    baseline_note: str
    profile: str
    compared_with: str
    cache_flush: str
    server_exit: ServerExitEntry
    interrupted: str
    measured: list[float]
    perf_session: int
    perf_server: PerfServer
    provenance_changes: list[str]
    endpoint: dict[str, Any]
    """Not in a report: the endpoint a worker measured (as the plugin holds it), which the
    reporter files per deployment and drops from the test's object (the report has one
    ``endpoint``)."""
    perf_sessions: list[int]
    """Not in a report: the sessions a pooled test (``--perf-sessions``) holds, for the
    baseline update (``run.server_starts.pool_sessions``)."""


class StoredTest(TestEntry, total=False):
    """A test as the history's run page has it (``HistoryStore.run_details``): its report
    object with the series it belongs to."""

    test: str
    """The node id without the deployment's and the session's parameter ids."""
    deployment: str | None
    session: int | None


# ------------------------------------------------------------------------------- the report


class NoiseEstimateEntry(TypedDict):
    """A session-noise estimate with its interval (``gate.session_noise.NoiseEstimate``)."""

    sigma: float
    low: float
    high: float
    confidence: float
    sessions: int
    trials: int
    levels: int
    within_sd: float
    df_between: int
    df_within: float


class _NoiseLevelRequired(TypedDict):
    profile: str | None
    nodeid: str
    label: str
    sessions: list[int]
    session_tok_s: list[float]


class NoiseLevelEntry(_NoiseLevelRequired, total=False):
    """One level of one deployment in the ``session_noise`` section."""

    estimate: NoiseEstimateEntry


class SessionServer(PerfServer):
    """Which server start ran a session of a deployment."""

    perf_session: int


class _NoiseDeploymentRequired(TypedDict):
    profile: str | None
    sessions: list[int]
    servers: list[SessionServer]


class NoiseDeploymentEntry(_NoiseDeploymentRequired, total=False):
    """One deployment's levels pooled, in the ``session_noise`` section."""

    estimate: NoiseEstimateEntry
    pooled_sessions: list[int]


class NoiseRecommendation(TypedDict):
    perf_session_sigma: float
    current: float | None
    text: str


class _SessionNoiseRequired(TypedDict):
    confidence: float
    deployments: list[NoiseDeploymentEntry]
    levels: list[NoiseLevelEntry]
    notes: list[str]


class SessionNoiseSection(_SessionNoiseRequired, total=False):
    """The report's ``session_noise`` (``--perf-sessions``: ``run.server_starts``)."""

    pooled: NoiseEstimateEntry
    recommendation: NoiseRecommendation


class GateEntry(TypedDict):
    """The report's ``gate``: the settings every verdict was judged by."""

    tolerance: float
    alpha: float
    session_sigma: float
    session_sigma_source: str
    session_sigma_measured: bool
    detectable_drop: float
    max_trials: int
    strict: bool


class PairedComparisonEntry(TypedDict):
    """The paired deploy comparison of one level at its last look (``gate.paired``)."""

    change_pct: float | None
    ci90: list[float | None]
    p_value: float
    p_pass: float
    p_improved: float
    nominal_alpha: float
    verdict: str
    decided: bool
    launches: int
    launch_sigma: float
    df: int
    min_detectable_drop_pct: float | None


class _DeployLevelRequired(TypedDict):
    candidate: str
    nodeid: str
    label: str
    verdict: str
    decided: bool
    blocks: list[int]
    launches: int
    reference_tok_s: list[float]
    candidate_tok_s: list[float]
    text: str


class DeployLevelEntry(_DeployLevelRequired, total=False):
    """One level of one candidate in the ``deploy_gate`` section."""

    comparison: PairedComparisonEntry
    looks: int


class DeployGateEntry(TypedDict):
    """The report's ``deploy_gate`` (``--perf-max-launches``: ``run.deploy_gate``)."""

    reference: str
    max_launches: int
    tolerance: float
    alpha: float
    levels: list[DeployLevelEntry]
    notes: list[str]
    changes: dict[str, list[str]]


class ReportCore(TypedDict):
    schema: int
    plugin_version: str
    status: str
    endpoint: EndpointEntry
    tests: list[TestEntry]


class RaceObjectiveEntry(TypedDict):
    """``race.objective``: what the race ranked by (``gate.race_objective.Objective``)."""

    kind: str
    text: str
    test: str
    level: str | None
    min_request_tok_s: float | None


class RaceRankingEntry(TypedDict):
    """One deployment of ``race.ranking`` (``gate.race.RaceEntry.to_dict`` and the run's)."""

    deployment: str
    value: float | None
    ci90: list[float] | None
    eliminated_in_round: int | None
    status: str
    launches: int
    vs_best_pct: float | None
    vs_best_ci90_pct: list[float | None] | None
    p_best: float | None
    reason: str | None
    gpus: int | None
    launch_values: list[float | None]


class RaceFrontierPoint(TypedDict):
    """One level of a deployment on the throughput-interactivity plane, over its launches."""

    label: str
    concurrency: int | None
    tok_s_per_user: float
    tok_s_per_gpu: float
    tok_s_per_gpu_ci90: list[float] | None
    launches: int


class RaceFrontier(TypedDict):
    deployment: str
    gpus: int | None
    points: list[RaceFrontierPoint]


class RaceSection(TypedDict, total=False):
    """``--perf-race``: which deployment is best (``run.race_run.RaceReport.to_dict``)."""

    objective: RaceObjectiveEntry
    ranking: list[RaceRankingEntry]
    winner: str | None
    tie: list[str]
    undecided: list[str]
    stop: str
    rounds: int
    launches: int
    max_rounds: int
    server_s: float
    grid_server_s: float | None
    tolerance: float
    alpha: float
    nominal_alpha: float
    launch_sigma: float | None
    winner_profile: str | None
    frontier: list[RaceFrontier]
    problem: str


class Report(ReportCore, total=False):
    """The ``--perf-json`` report (docs "Top level"), as every report sink reads it."""

    interrupted: str
    gate: GateEntry
    session_noise: SessionNoiseSection
    deploy_gate: DeployGateEntry
    culprit: dict[str, Any]
    """``--perf-culprit``: the search for the change behind the deploy gate's regression
    (``run.culprit_run.CulpritReport.to_dict``)."""
    race: RaceSection
    """``--perf-race``: which deployment is best (docs "The race")."""
    title: str
    """``kimi-perf compare``'s report: its title, in place of the default."""
    notes: list[str]
    """``kimi-perf compare``'s report: the lines under its headline."""


# pytest collects classes named ``Test*`` that a test module imports; these are not tests
# (set through setattr: a TypedDict class has no attributes mypy knows of)
for _typed in (TestCore, TestEntry, TestSessionNoise, StoredTest):
    setattr(_typed, "__test__", False)  # noqa: B010
