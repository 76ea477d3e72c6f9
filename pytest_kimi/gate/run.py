"""One test's measurement judged against what it is compared with: the plugin's per-test job.

Kept free of pytest so the fixture that calls it is only wiring: it resolves the endpoint, the
deployment and the baseline store, calls :func:`measure_gated`, and turns a
:class:`GateProblem` into a test failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimi.baseline import BaselineError, BaselineStore, Provenance, TestBaseline
from pytest_kimi.endpoint.discovery import EndpointInfo
from pytest_kimi.gate.policy import (
    AdaptiveTrials,
    GateSettings,
    IncomparableBaseline,
    apply_gate,
    baseline_samples,
    check_comparable,
)
from pytest_kimi.spec.markers import DEFAULT_PROTOCOL, Targets, Workload
from pytest_kimi.measure.trials import MeasureSpec, ProgressFn
from pytest_kimi.baseline.update import reference_baseline
from pytest_kimi.measure.results import ThroughputResult, spec_key
from pytest_kimi.crosscheck.server_metrics import ServerMetricsError, ServerMetricsObserver
from pytest_kimi.measure.session import PerfSession, build_spec
from pytest_kimi.spec.workload import WorkloadError
from pytest_kimi.verdicts import Verdict


class GateProblem(RuntimeError):
    """The test cannot be measured as asked (bad prompts file, corrupt or incomparable baseline)."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """What one test is judged against: its stored baseline, or a reference deployment's run."""

    store: BaselineStore
    deployment: str | None = None
    reference: str | None = None
    """Same-run A/B: the first deployment's name (None without an A/B)."""
    references: dict[str, TestBaseline] | None = None
    """Same-run A/B: the reference deployment's results so far, by test id (filled here)."""

    @property
    def is_candidate(self) -> bool:
        return self.reference is not None and self.deployment not in (None, self.reference)


class MeasurementInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a measurement; ``result`` holds the levels it finished."""

    def __init__(self, result: ThroughputResult) -> None:
        super().__init__()
        self.result = result


@dataclass(frozen=True, slots=True)
class Prepared:
    """A gated test before any load: where its baseline lives, what to measure, what it is
    judged against, and the provenance of this run."""

    path: Path
    spec: MeasureSpec
    baseline: TestBaseline | None
    current: Provenance
    compared_with: str


def prepare_gated(
    marker: str,
    session: PerfSession,
    endpoint: EndpointInfo,
    nodeid: str,
    workload: Workload,
    targets: Targets,
    comparison: Comparison,
    *,
    rootdir: Path,
    trials: int | None,
    protocol: str,
) -> Prepared:
    """Before any load: the baseline file, the measurement spec and what the test is judged
    against (its baseline, or the reference deployment's run), checked comparable.

    Shared by ``@throughput`` and ``@capacity``: a corrupt or incomparable baseline and a
    workload that cannot be built raise :class:`GateProblem` naming the marker's argument.
    """
    path = comparison.store.path_for(nodeid)
    current = Provenance.collect(
        model=endpoint.model,
        server_info=endpoint.server_info,
        session_ids=[session.session_id],
        suite_dir=rootdir,
    )
    try:
        spec = build_spec(
            endpoint,
            nodeid,
            workload,
            targets,
            rootdir=rootdir,
            trials=trials,
            sizer=session.prompt_sizer,
            protocol=protocol,
        )
        if comparison.is_candidate:
            baseline = (comparison.references or {}).get(nodeid)
            compared_with = f"deployment {comparison.reference} (same run)"
        else:
            baseline = comparison.store.load(nodeid)
            compared_with = str(path)
        check_comparable(baseline, current, compared_with)
    except WorkloadError as exc:
        from pytest_kimi.spec.dataset import DatasetError

        argument = "dataset" if isinstance(exc, DatasetError) else "prompts"
        raise GateProblem(f"{marker} {argument}: {exc}") from None
    except (BaselineError, IncomparableBaseline) as exc:
        raise GateProblem(str(exc)) from None
    return Prepared(path, spec, baseline, current, compared_with)


def measure_gated(
    session: PerfSession,
    endpoint: EndpointInfo,
    nodeid: str,
    workload: Workload,
    targets: Targets,
    settings: GateSettings,
    comparison: Comparison,
    *,
    rootdir: Path,
    trials: int | None,
    server: Any = None,
    progress: ProgressFn | None = None,
    server_metrics: bool = False,
    protocol: str = DEFAULT_PROTOCOL,
) -> ThroughputResult:
    """Measure with adaptive trials, then set verdicts against the baseline or the reference.

    ``server_metrics``: check every trial against the server's own counters
    (``--perf-server-metrics``); a server without them fails the test before any load.
    """
    settings = settings.for_test(targets)  # marker tolerance=/alpha= > the session's options
    prepared = prepare_gated(
        "@throughput",
        session,
        endpoint,
        nodeid,
        workload,
        targets,
        comparison,
        rootdir=rootdir,
        trials=trials,
        protocol=protocol,
    )
    path, spec, baseline = prepared.path, prepared.spec, prepared.baseline
    current, compared_with = prepared.current, prepared.compared_with
    flush_note = flush_cache(server)
    keys = {lv: spec_key(lv, spec.prompts_key(lv), workload) for lv in workload.levels}
    policy = AdaptiveTrials(
        baseline_samples(baseline, keys), settings, len(keys), first_trials=spec.trials
    )
    spec.policy = policy
    if server_metrics:
        spec.observer = ServerMetricsObserver(endpoint.url, endpoint.headers())
    try:
        result = session.measure(spec, progress)
    except ServerMetricsError as exc:
        raise GateProblem(f"--perf-server-metrics: {exc}") from None
    except KeyboardInterrupt:
        if spec.partial is None:
            raise
        partial = spec.partial
        partial.extra.update(
            baseline_file=str(path),
            baseline_profile=comparison.store.profile,
            session_id=session.session_id,
            interrupted="measurement interrupted (Ctrl-C or SIGTERM); "
            "only the levels it finished are reported",
        )
        if comparison.deployment is not None:
            partial.extra["profile"] = comparison.deployment
        note_server_crash(partial, server)
        raise MeasurementInterrupted(partial) from None
    changes = apply_gate(
        result,
        baseline,
        compared_with,
        current,
        settings,
        tolerance=targets.tolerance,
        alpha=targets.alpha,
        alpha_weights=policy.alpha_weights,
    )
    result.extra.update(
        baseline_file=str(path),
        baseline_profile=comparison.store.profile,
        provenance_changes=[str(c) for c in changes],
        session_id=session.session_id,
    )
    if baseline is None:
        result.extra["baseline_note"] = (
            f"no baseline yet: {path} (record it with --update-baselines)"
        )
    if comparison.deployment is not None:
        result.extra["profile"] = comparison.deployment
        for level in result.levels:
            level.extra["profile"] = comparison.deployment
        if comparison.reference is not None:
            result.extra["compared_with"] = compared_with
        if comparison.deployment == comparison.reference and comparison.references is not None:
            comparison.references[nodeid] = reference_baseline(
                result, current, comparison.reference
            )
    if flush_note is not None:
        result.extra["cache_flush"] = flush_note
        for level in result.levels:
            level.errors.append(f"note: {flush_note}")
    note_server_crash(result, server)
    return result


def flush_cache(server: Any) -> str | None:
    """Empty a managed server's prefix cache before a test; a note when that failed.

    Prompts are unique per request anyway (:mod:`pytest_kimi.spec.workload`), so a leftover cache
    can only help through shared template tokens; still, a refused flush (the server busy past
    the wait, a missing admin key) is reported rather than ignored.  An engine without a flush
    endpoint (vLLM) is not a failure.
    """
    if server is None or getattr(getattr(server, "engine", None), "flush_path", None) is None:
        return None
    if server.flush_cache():
        return None
    return f"prefix cache not flushed before this test: {getattr(server, 'flush_error', None) or 'refused'}"


def note_server_crash(result: ThroughputResult, server: Any) -> None:
    """A managed server that died during the measurement: say so, with its last log lines."""
    code = server.crashed() if server is not None else None
    if code is None:
        return
    result.extra["server_exit"] = {
        "returncode": code,
        "log": str(server.log_path),
        "log_tail": server.log_tail(40),
    }
    for level in result.levels:
        if Verdict.of(level.verdict) in (Verdict.ERROR, Verdict.NOT_RUN):
            level.reasons.append(f"the server exited with code {code} (log {server.log_path})")
            break
