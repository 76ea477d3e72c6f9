"""Level and test results, their verdicts, and the one JSON shape every report reads.

A level gets its absolute verdict here (``pass``, ``fail``, ``invalid``, ``error``,
``not-run``: see :class:`pytest_kimi.verdicts.Verdict`); the gate then compares it with
its baseline.  ``LevelResult.verdict`` holds the plain string value, as the JSON does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Final

from pytest_kimi.workload.workload_spec import LevelSpec, Targets, Workload
from pytest_kimi.measure.latency import LevelLatency, mark_latency_void, voided_note
from pytest_kimi.measure.windows import TrialWindow
from pytest_kimi.measure.peer_figures import PeerFigures, empty_peer_dict, peer_figures
from pytest_kimi.measure.metrics import (
    LatencyLimits,
    LevelFigures,
    ReasoningFigures,
    TrialResult,
    level_figures,
)
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import (
    CapacityEntry,
    CapacityLevelEntry,
    ClientSummary,
    ComparisonEntry,
    LevelCore,
    LevelEntry,
    LevelExtra,
    LevelTail,
    MeasuredEntry,
    OpenLoopEntry,
    PerfServer,
    PromptTokens,
    ReasoningEntry,
    ServerClock,
    ServerExitEntry,
    ShiftEntry,
    TestEntry,
    TestSessionNoise,
    TurnEntry,
    WarmUpEntry,
    WorkloadEntry,
)


@dataclass(frozen=True, slots=True)
class BaselineComparison:
    """A level against its baseline (the gate's, or ``kimi-perf compare``'s), as reported.

    ``found=False``: the level had nothing to compare with; its JSON then carries the four
    headline keys as null, as it always has, so a reader need not test for their presence.
    """

    found: bool
    baseline_tok_s: float | None = None
    baseline_trials: int | None = None
    baseline_trials_tok_s: tuple[float, ...] = ()
    change_pct: float | None = None
    ci90: tuple[float | None, float | None] | None = None
    """The 90% interval of the change, in percent (an end is None where it is unbounded)."""
    p_value: float | None = None
    """One-sided p of a drop beyond the tolerance, for this level alone: it agrees with
    ``ci90`` (p <= alpha exactly where the interval's upper end lies below the tolerance)."""
    p_adjusted: float | None = None
    """The p the verdict was decided by: adjusted for the test's levels (closed testing over
    their common shifts, :mod:`pytest_kimi.gate.family`) and for the trial policy's look."""
    min_detectable_drop_pct: float | None = None
    tolerance_pct: float | None = None

    def to_dict(self) -> ComparisonEntry:
        if not self.found:
            return {"baseline_tok_s": None, "change_pct": None, "ci90": None, "p_value": None}
        return {
            "baseline_tok_s": self.baseline_tok_s,
            "baseline_trials": self.baseline_trials,
            "baseline_trials_tok_s": list(self.baseline_trials_tok_s),
            "change_pct": self.change_pct,
            "ci90": None if self.ci90 is None else list(self.ci90),
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "min_detectable_drop_pct": self.min_detectable_drop_pct,
            "tolerance_pct": self.tolerance_pct,
        }


@dataclass(slots=True)
class LevelResult:
    spec: LevelSpec
    label: str
    """How reports name the level: ``C=8``, ``rate=2/s``, plus swept lengths."""
    prompts_key: str
    trials: list[TrialResult]
    figures: LevelFigures
    verdict: str
    reasons: list[str] = field(default_factory=list)
    target_tok_s: float | None = None
    errors: list[str] = field(default_factory=list)
    protocol: str | None = None
    """The closed-loop trial protocol it was measured with (``stationary``); None for
    ``whole-requests`` and open loop, whose baselines have always been keyed without one."""
    # -- the measurement (measure/trials.py, measure/capacity_run.py)
    server_time_s: float | None = None
    """What the level cost, in the server's seconds: first request to last, every trial."""
    prompt_tokens: PromptTokens | None = None
    """What the server counted as the prompts' lengths (mean, min, max)."""
    turns: list[TurnEntry] | None = None
    """A multi-turn level's prompt tokens and TTFT per turn."""
    fill_up: str | None = None
    """An open-loop level whose window is short against a request's length."""
    input_tokens_sizing: str | None = None
    """How ``input_tokens`` were sized: the server's tokenizer, or an estimate."""
    replaced_trials: list[str] = field(default_factory=list)
    """Trials voided for a transient reason (a stalled client) and measured again."""
    capacity_level: CapacityLevelEntry | None = None
    """A ``@capacity`` search's point: whether every ceiling held, by what margin."""
    trial_windows: list[TrialWindow] = field(default_factory=list)
    """Every trial measured, replaced ones included, in order: its window's bounds, clock
    offset, tokens and tok/s (:mod:`pytest_kimi.measure.windows`), so each figure can be
    recomputed and reconciled (JSON ``trial_windows``)."""
    peer: PeerFigures | None = None
    """The figures peers report (TTFT/ITL/TPOT/E2E at mean, std, p50-p99, requests/s, input
    and total tok/s: :mod:`pytest_kimi.measure.peer_figures`); set by :func:`judge_level`.
    None (its keys null) for a level not run."""
    # -- judged (gate/policy.py) and annotated (run/conductor.py)
    comparison: BaselineComparison | None = None
    latency: LevelLatency | None = None
    """TTFT and ITL at p50 and pNN per trial, against the baseline's (gate/latency_gate.py)."""
    deployment: str | None = None
    """The server profile measured (JSON ``profile``)."""
    extra: LevelExtra = field(default_factory=lambda: LevelExtra())
    """Sections pluggable stages contribute, each under its own keys: the workload's
    (``dataset``, ``shared_prefix``, ``output_tokens_mean``), the prefix-cache probe's
    (``prefix_cache_hit_rate``) and the server-counter check's (``server``)."""

    @property
    def concurrency(self) -> int | None:
        return self.spec.concurrency

    @property
    def max_tokens(self) -> int:
        return self.spec.max_tokens

    def to_dict(self) -> LevelEntry:
        f = self.figures
        core: LevelCore = {
            "label": self.label,
            "concurrency": self.spec.concurrency,
            "rate": self.spec.rate,
            "max_tokens": self.spec.max_tokens,
            "input_tokens": self.spec.input_tokens,
            "prompts": self.prompts_key,
            "protocol": self.protocol,
            "tok_s": _round(f.tok_s, 2),
            "trials_tok_s": [round(x, 2) for x in f.trials_tok_s],
            "spread_pct": _round(f.spread_pct, 2),
            "request_tok_s_p50": _round(f.request_tok_s_p50, 2),
            "ttft_s_p50": _round(f.ttft_s_p50, 5),
            "ttft_s_p95": _round(f.ttft_s_p95, 5),
            "itl_s_p50": _round(f.itl_s_p50, 6),
            "percentile": f.percentile,
            "ttft_s_pct": _round(f.ttft_s_pct, 5),
            "itl_s_pct": _round(f.itl_s_pct, 6),
            "e2e_s_pct": _round(f.e2e_s_pct, 4),
            "goodput": _round(f.goodput, 4),
            "requests_ok": f.requests_ok,
            "requests_failed": f.requests_failed,
            "target_tok_s": self.target_tok_s,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "errors": list(self.errors),
            "trials": len(self.trials),
            "trial_windows": [w.to_dict() for w in self.trial_windows],
            "client": _client_summary(self.trials),
        }
        peer = empty_peer_dict() if self.peer is None else self.peer.to_dict()
        reasoning: ReasoningEntry = {} if f.reasoning is None else reasoning_dict(f.reasoning)
        open_loop: OpenLoopEntry = {}
        if self.spec.rate is not None:
            # the load asked for, the rate the client sent at, and the rate the server
            # finished requests at in the window: a step of a ramp past the server's capacity
            # shows completed well below offered (docs/guide/workloads.md, "Rate ramps")
            open_loop = {
                "offered_rate": self.spec.rate,
                "achieved_rate": _round(f.achieved_rate, 3),
                "completed_rate": _round(f.completed_rate, 3),
            }
        measured: MeasuredEntry = {}
        if self.server_time_s is not None:
            measured["server_time_s"] = self.server_time_s
        if self.prompt_tokens is not None:
            measured["prompt_tokens"] = self.prompt_tokens
        if self.turns is not None:
            measured["turns"] = self.turns
        if self.fill_up is not None:
            measured["fill_up"] = self.fill_up
        if self.input_tokens_sizing is not None:
            measured["input_tokens_sizing"] = self.input_tokens_sizing
        if self.replaced_trials:
            measured["replaced_trials"] = list(self.replaced_trials)
        if self.capacity_level is not None:
            measured["capacity_level"] = self.capacity_level
        if self.deployment is not None:
            measured["profile"] = self.deployment
        comparison: ComparisonEntry = {} if self.comparison is None else self.comparison.to_dict()
        tail: LevelTail = {} if self.latency is None else {"latency": self.latency.to_dict()}
        out: LevelEntry = {
            **core,
            # the peers' figures; the ones the level had before (ttft_s_p50, ttft_s_p95,
            # itl_s_p50) keep their own values (the same definition: equal)
            **peer,
            "ttft_s_p50": core["ttft_s_p50"],
            "ttft_s_p95": core["ttft_s_p95"],
            "itl_s_p50": core["itl_s_p50"],
            **reasoning,
            **open_loop,
            **measured,
            **comparison,
            **tail,
            # the sections pluggable stages contributed, under their own keys
            **self.extra,
        }
        return out


@dataclass(slots=True)
class ServerExit:
    """A managed server that died during the measurement: its exit code and last log lines."""

    returncode: int
    log: str
    log_tail: str

    def to_dict(self) -> ServerExitEntry:
        return {"returncode": self.returncode, "log": self.log, "log_tail": self.log_tail}


@dataclass(slots=True)
class ThroughputResult:
    """All levels of one test and what each stage added to it; what ``throughput_result``
    gives a test body, and what every report is produced from (:meth:`to_dict`).

    The fields after ``levels`` were once an untyped ``extra`` dict filled by string keys from
    four modules; each is now a field with its writer named, so ``mypy --strict`` checks every
    reader and the JSON keys are produced in one place.
    """

    nodeid: str
    workload: Workload
    targets: Targets
    levels: list[LevelResult] = field(default_factory=list)
    # -- the measurement (measure/trials.py, measure/capacity_run.py)
    server_time_s: float | None = None
    """The measurement's cost in the server's seconds: warm-up and every level."""
    warmup_server_time_s: float | None = None
    server_clock: ServerClock | None = None
    """The simulator's clock (``kind``, ``speed``) where figures are in its seconds."""
    # -- what it was judged against (run/conductor.py)
    baseline_file: str | None = None
    baseline_profile: str | None = None
    baseline_note: str | None = None
    """Set when the test has no baseline yet: where it would be and how to record it."""
    provenance_changes: list[str] | None = None
    """What changed in the server's config since the baseline (set once judged)."""
    session_id: str | None = None
    """The measuring run's id, as baselines record it."""
    deployment: str | None = None
    """The server profile measured (JSON ``profile``); None without ``--server-profile``."""
    compared_with: str | None = None
    """Same-run A/B: what a deployment was compared with (the reference, or its baseline)."""
    capacity: CapacityEntry | None = None
    shift: ShiftEntry | None = None
    """The common shift of the test's compared levels (two or more): ``change_pct``,
    ``ci90``, ``p_value``, ``verdict``, ``levels``, ``text`` (:func:`gate.policy.shift_record`).
    A ``regression`` here fails the test even where no single level is significant."""
    """A ``@capacity`` test's capacity: the report's ``capacity`` object (report/capacity_cells.py)."""
    cache_flush: str | None = None
    """Why a managed server's prefix cache was not flushed before the test."""
    server_exit: ServerExit | None = None
    interrupted: str | None = None
    """Set on a measurement stopped by Ctrl-C or SIGTERM: only its finished levels are here."""
    # -- where and when it ran (the plugin: run/ knows nothing of pytest's ids and stash)
    measured: tuple[float, float] | None = None
    """Wall-clock (start, end) of the measurement: a report shows runs did not overlap."""
    perf_session: int | None = None
    """``--perf-sessions``: the server start (0-based) that measured it."""
    perf_server: PerfServer | None = None
    """``--perf-sessions``: which start that was (``pid``; the simulator's ``seed``)."""
    session_noise: TestSessionNoise | None = None
    """The session noise this test was judged with where it is not the session's: ``sigma``
    and ``source`` (its baseline's recording measured one: ``gate/noise_evidence.py``)."""
    warm_up: list[WarmUpEntry] | None = None
    """The first test on a fresh server: each level's warm trials until stationary, in level
    order (:class:`pytest_kimi.measure.warm.WarmUp`)."""

    def level(
        self,
        concurrency: int | None = None,
        *,
        rate: float | None = None,
        max_tokens: int | None = None,
        input_tokens: int | None = None,
    ) -> LevelResult:
        """The level with these values (only the ones given are matched)."""
        for lv in self.levels:
            sp = lv.spec
            if (
                (concurrency is None or sp.concurrency == concurrency)
                and (rate is None or sp.rate == rate)
                and (max_tokens is None or sp.max_tokens == max_tokens)
                and (input_tokens is None or sp.input_tokens == input_tokens)
            ):
                return lv
        raise KeyError(
            f"no level with concurrency={concurrency} rate={rate} max_tokens={max_tokens} "
            f"input_tokens={input_tokens}; levels: {[lv.label for lv in self.levels]}"
        )

    def failing_levels(self, failing: frozenset[str] | None = None) -> list[LevelResult]:
        """The levels whose verdict is in ``failing`` (verdict values; by default those that
        fail whatever the flags, ``Verdict.failing()``)."""
        failing = Verdict.failing() if failing is None else failing
        return [lv for lv in self.levels if lv.verdict in failing]

    def shift_failure(self, failing: frozenset[str] | None = None) -> str | None:
        """The failure the common shift of the levels makes (None without one): a
        significant drop, an estimate beyond the tolerance (``inconclusive``), or, where
        ``failing`` holds it (``--perf-strict``), a shift that could not vouch."""
        failing = Verdict.failing() if failing is None else failing
        verdict = None if self.shift is None else self.shift.get("verdict")
        if verdict not in failing:
            return None
        if verdict == Verdict.REGRESSION.value:
            return "regression beyond noise across the levels"
        return f"{verdict} across the levels ({self.shift.get('text') if self.shift else ''})"

    def to_dict(self) -> TestEntry:
        """The test's object in ``--perf-json`` (docs/reference/json-report.md): fields left unset are
        absent, as they always were."""
        out: TestEntry = {
            "nodeid": self.nodeid,
            "workload": workload_dict(self.workload),
            "levels": [lv.to_dict() for lv in self.levels],
        }
        if self.server_time_s is not None:
            out["server_time_s"] = self.server_time_s
        if self.warmup_server_time_s is not None:
            out["warmup_server_time_s"] = self.warmup_server_time_s
        if self.warm_up is not None:
            out["warm_up"] = self.warm_up
        if self.session_noise is not None:
            out["session_noise"] = self.session_noise
        if self.server_clock is not None:
            out["server_clock"] = self.server_clock
        if self.capacity is not None:
            out["capacity"] = self.capacity
        if self.shift is not None:
            out["shift"] = self.shift
        if self.baseline_file is not None:
            out["baseline_file"] = self.baseline_file
        if self.baseline_profile is not None:
            out["baseline_profile"] = self.baseline_profile
        if self.session_id is not None:
            out["session_id"] = self.session_id
        if self.baseline_note is not None:
            out["baseline_note"] = self.baseline_note
        if self.deployment is not None:
            out["profile"] = self.deployment
        if self.compared_with is not None:
            out["compared_with"] = self.compared_with
        if self.cache_flush is not None:
            out["cache_flush"] = self.cache_flush
        if self.server_exit is not None:
            out["server_exit"] = self.server_exit.to_dict()
        if self.interrupted is not None:
            out["interrupted"] = self.interrupted
        if self.measured is not None:
            out["measured"] = [round(x, 3) for x in self.measured]
        if self.perf_session is not None:
            out[PERF_SESSION] = self.perf_session
        if self.perf_server is not None:
            out[PERF_SERVER] = self.perf_server
        if self.provenance_changes is not None:
            out["provenance_changes"] = self.provenance_changes
        return out


PERF_SESSION: Final = "perf_session"
"""Key of a test's JSON object: the ``--perf-sessions`` start (0-based) it ran in; present only
with ``--perf-sessions`` > 1.  The history store reads it: do not rename."""

PERF_SERVER: Final = "perf_server"
"""Key of a test's JSON object: which server start measured it (``pid``; ``seed`` for the
simulator)."""


def session_id(index: int) -> str:
    """The test id suffix of a ``--perf-sessions`` start: ``s1`` for index 0."""
    return f"s{index + 1}"


def workload_dict(workload: Workload) -> WorkloadEntry:
    """What is common to every level of the test (the levels carry their own lengths and load)."""
    out: WorkloadEntry = {"api": workload.api, "ignore_eos": workload.ignore_eos}
    if workload.turns > 1:
        out["turns"] = workload.turns  # a conversation's turns re-send its history: keyed
    if workload.shared_prefix_tokens is not None:
        # shared system prompts change what is prefilled: keyed (a dataset is keyed by its
        # ``prompts``: content hash, sample size, seed)
        out["shared_prefix_tokens"] = workload.shared_prefix_tokens
        out["prefix_groups"] = workload.prefix_groups or 1
    # the load knobs of docs/guide/workloads.md, each keyed only where it is set (an old baseline
    # has none of them and still matches a test without them)
    if workload.range_ratio is not None:
        # the drawn lengths are the workload: the ratio and the seed that drew them; key fields
        # are scalars: ``range_ratio`` where input and output share it, else one for each
        low, high = workload.range_ratio
        if low == high:
            out["range_ratio"] = low
        else:
            out["range_ratio_input"], out["range_ratio_output"] = low, high
        out["seed"] = workload.seed
    if workload.burstiness != 1.0:
        out["burstiness"] = workload.burstiness  # 1: Poisson, the schedule before the knob
    if workload.max_concurrency is not None:
        out["max_concurrency"] = workload.max_concurrency
    return out


def spec_key(
    level: LevelSpec, prompts_key: str, workload: Workload, protocol: str | None = None
) -> dict[str, Any]:
    """The baseline key of a level before it is measured (for adaptive trials).

    ``protocol``: the level's trial protocol (``Workload.protocol_for``), part of the key the
    measured level will have; without it a stationary baseline is never found before the
    level is measured, and the trial policy runs the fixed pilot only."""
    fields = {
        "concurrency": level.concurrency,
        "rate": level.rate,
        "max_tokens": level.max_tokens,
        "input_tokens": level.input_tokens,
        "prompts": prompts_key,
        "protocol": protocol,
    }
    return level_key(fields, workload_dict(workload))


def level_key(level: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """A level's baseline key from report dicts: everything that defines the load it measured.

    Keys left None (no rate in a closed-loop level, no input_tokens with a prompt set) are absent.
    """
    key = {**workload}
    for name in ("concurrency", "rate", "max_tokens", "input_tokens", "prompts", "protocol"):
        if level.get(name) is not None:
            key[name] = level[name]
    return {k: v for k, v in key.items() if v is not None}


def reasoning_dict(r: ReasoningFigures) -> ReasoningEntry:
    """The JSON keys of a level whose streams separated reasoning from content (absent
    otherwise, so a report without reasoning reads as before).  ``tok_s`` beside them still
    counts every output token, thinking included."""
    return {
        "reasoning_requests": r.requests,
        "reasoning_tokens_mean": _round(r.reasoning_tokens_mean, 2),
        "content_tokens_mean": _round(r.content_tokens_mean, 2),
        "ttfc_s_p50": _round(r.ttfc_s_p50, 5),
        "ttfc_s_p95": _round(r.ttfc_s_p95, 5),
        "ttfc_s_pct": _round(r.ttfc_s_pct, 5),
        "reasoning_no_content": r.no_content,
    }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _client_summary(trials: list[TrialResult]) -> ClientSummary:
    if not trials:
        return {}
    return {
        "loop_lag_max_ms": round(max(t.client.loop_lag_max_s for t in trials) * 1e3, 2),
        "send_delay_p99_ms": round(max(t.client.send_delay_p99_s for t in trials) * 1e3, 2),
        "cpu_share": round(max(t.client.cpu_share for t in trials), 3),
    }


def judge_level(
    level: LevelSpec,
    workload: Workload,
    targets: Targets,
    trials: list[TrialResult],
    prompts_key: str,
    clock: float = 1.0,
) -> LevelResult:
    """Figures and verdict of one level, with every reason a non-pass verdict has; ``clock``:
    server seconds per wall second (:func:`~pytest_kimi.measure.metrics.level_figures`)."""
    # a trial whose load client stalled gives no latency (its tok/s may still count): left
    # out of the level's latency figures, the ceilings' and the latency gate's alike
    mark_latency_void(trials, targets.percentile, clock)
    figures = level_figures(trials, targets.percentile, latency_limits(targets), clock)
    voided = [why for t in trials if (why := t.latency_void) is not None]
    floor = targets.floor_for(level)
    errors: list[str] = []
    for t in trials:
        for e in t.errors:
            if e not in errors and len(errors) < 5:
                errors.append(e)
    if voided:
        errors.append("note: " + voided_note(voided, len(trials)))
    total = figures.requests_ok + figures.requests_failed
    failed_share = figures.requests_failed / total if total else 1.0
    reasons: list[str] = []
    verdict = Verdict.PASS.value
    hard_errors = [e for e in errors if not e.startswith("note:")]
    if total == 0 or figures.requests_ok == 0 or failed_share > workload.max_error_rate:
        verdict = Verdict.ERROR.value
        reasons.append(
            f"{figures.requests_failed} of {total} requests failed "
            f"(max_error_rate={workload.max_error_rate:g})"
            + (f": {hard_errors[0]}" if hard_errors else "")
        )
        stopped = [t.stopped_early for t in trials if t.stopped_early]
        if stopped:
            reasons.append(stopped[0])
    else:
        invalid = [msg for t in trials for msg in t.invalid]
        if invalid or figures.tok_s is None:
            verdict = Verdict.INVALID.value
            reasons.extend(dict.fromkeys(invalid or ["no trial gave a throughput figure"]))
        else:
            if floor is not None and figures.tok_s < floor:
                reasons.append(f"aggregate {figures.tok_s:.1f} tok/s < min_tok_s {floor:g}")
            rate = figures.request_tok_s_p50
            if targets.min_request_tok_s is not None and (
                rate is None or rate < targets.min_request_tok_s
            ):
                reasons.append(
                    f"per-request p50 {rate or 0:.1f} tok/s < min_request_tok_s "
                    f"{targets.min_request_tok_s:g}"
                )
            q = f"p{targets.percentile:g}"
            unjudged: list[str] = []
            for name, value, limit in (
                ("TTFT", figures.ttft_s_pct, targets.max_ttft_s),
                ("ITL", figures.itl_s_pct, targets.max_itl_s),
                ("end-to-end latency", figures.e2e_s_pct, targets.max_e2e_s),
            ):
                key = {"TTFT": "max_ttft_s", "ITL": "max_itl_s"}.get(name, "max_e2e_s")
                if limit is not None and value is None and voided:
                    unjudged.append(
                        f"{name} {q} not judged against {key} {limit:g}: every trial's "
                        f"latencies were left out, the load client's and not the server's "
                        f"({voided[0]})"
                    )
                elif limit is not None and (value is None or value > limit):
                    reasons.append(f"{name} {q} {value or 0:.4g} s > {key} {limit:g}")
            if targets.min_goodput is not None and (figures.goodput or 0) < targets.min_goodput:
                reasons.append(
                    f"goodput {100 * (figures.goodput or 0):.1f}% < min_goodput "
                    f"{100 * targets.min_goodput:g}% (requests meeting every latency ceiling)"
                )
            if reasons:
                verdict = Verdict.FAIL.value
            elif unjudged:
                verdict = Verdict.INVALID.value
            reasons.extend(unjudged)
    return LevelResult(
        spec=level,
        label=workload.label(level),
        prompts_key=prompts_key,
        trials=trials,
        figures=figures,
        verdict=verdict,
        reasons=reasons,
        target_tok_s=floor,
        errors=errors,
        peer=peer_figures(
            trials,
            figures.tok_s,
            clock,
            max_tokens=level.max_tokens,
            ignore_eos=workload.ignore_eos,
        ),
    )


def latency_limits(targets: Targets) -> LatencyLimits:
    return LatencyLimits(targets.max_ttft_s, targets.max_itl_s, targets.max_e2e_s)


def not_run_level(
    level: LevelSpec, workload: Workload, targets: Targets, reason: str, prompts_key: str
) -> LevelResult:
    return LevelResult(
        spec=level,
        label=workload.label(level),
        prompts_key=prompts_key,
        trials=[],
        figures=level_figures([]),
        verdict=Verdict.NOT_RUN.value,
        reasons=[reason],
        target_tok_s=targets.floor_for(level),
    )
