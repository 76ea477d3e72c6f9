"""Turning a run's figures into baselines: the ``--update-baselines`` flow, and A/B references.

Works on the JSON-shaped test results (the same dicts the reports read), so it runs on the
xdist controller from what the workers sent.  No pytest here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kimi.baseline.model import (
    BaselineError,
    CapacityBaseline,
    LevelBaseline,
    ProvenanceConflict,
    SessionNoise,
    TestBaseline,
    WorkloadKey,
)
from pytest_kimi.baseline.merge import NoisePool
from pytest_kimi.baseline.provenance import Provenance
from pytest_kimi.baseline.store import BaselineStore
from pytest_kimi.verdicts import Verdict
from pytest_kimi.measure.latency import KINDS
from pytest_kimi.measure.results import ThroughputResult, level_key, workload_dict
from pytest_kimi.wire import CapacityEntry, LevelEntry, PooledNoise, TestEntry


def update_baselines(
    root: Path,
    default_profile: str,
    mode: str,
    tests: Sequence[TestEntry],
    endpoints: Mapping[str, Mapping[str, Any]],
    rootdir: Path,
    pool: NoisePool | None = None,
) -> tuple[list[str], list[str]]:
    """Write the baselines of the tests that ran; refuse what must not become a target unless
    forced (:func:`refusal`).  With ``force`` a corrupt baseline file is replaced too, but a
    level whose figure the run itself judged untrustworthy (``invalid``, ``error``,
    ``not-run``) is never recorded: force approves a trade-off, not a broken measurement.
    Each level left out is named, with its verdict and reason, in the refusals.

    ``pool``: a level re-recorded on the same deployment pools its session noise with the
    old recording's (:func:`pytest_kimi.baseline.merge.pool_noise`), unless the run decided
    that level changed (``regression``, ``improved``): a decided change is not noise.

    Returns the summary lines (old -> new per level, git commands) and the refusals.
    """
    written: list[str] = []
    refused: list[str] = []
    force = mode == "force"
    for test in tests:
        why = None if force else refusal(test)
        if why is not None:
            refused.append(why)
            continue
        untrusted = [
            f"{lv.get('label', '?')} {lv.get('verdict')}{_reason(lv.get('reasons'))}"
            for lv in test.get("levels") or []
            if not _trustworthy(lv.get("verdict"))
        ]
        if untrusted:
            refused.append(
                f"{test['nodeid']}: level(s) not recorded even with force: "
                f"{'; '.join(untrusted)}: the run judged the figure untrustworthy"
            )
        capacity = None
        cap = test.get("capacity")
        if isinstance(cap, dict) and not _trustworthy(cap.get("verdict")):
            refused.append(
                f"{test['nodeid']}: not recorded even with force: capacity {cap.get('verdict')}"
                f"{_reason(cap.get('reasons'))}: the search could not be trusted"
            )
            continue
        if isinstance(cap, dict):
            # a @capacity test records its capacity, not the levels its search happened to pick
            try:
                capacity = capacity_record(cap)
            except (KeyError, TypeError, ValueError) as exc:
                refused.append(f"{test['nodeid']}: not recorded: capacity: {exc}")
                continue
        levels = [
            LevelBaseline(
                workload=WorkloadKey.from_dict(level_key(lv, test["workload"])),
                trials_tok_s=tuple(lv["trials_tok_s"]),
                request_tok_s=_summary(p50=lv.get("request_tok_s_p50")),
                ttft_s={
                    **_summary(p50=lv.get("ttft_s_p50"), p95=lv.get("ttft_s_p95")),
                    **latency_record(lv, "ttft_s")[0],
                },
                itl_s=latency_record(lv, "itl_s")[0],
                trials_ttft_s=latency_record(lv, "ttft_s")[1],
                trials_itl_s=latency_record(lv, "itl_s")[1],
                session_noise=_session_noise(lv.get("session_noise")),
            )
            for lv in test["levels"]
            if lv.get("trials_tok_s") and capacity is None and _trustworthy(lv.get("verdict"))
        ]
        if not levels and capacity is None:
            refused.append(f"{test['nodeid']}: not recorded: no level gave a throughput figure")
            continue
        endpoint = endpoints.get(test.get("profile") or "", {})
        provenance = Provenance.collect(
            model=endpoint.get("model"),
            server_info=endpoint.get("server_info"),
            session_ids=[test["session_id"]] if test.get("session_id") else [],
            suite_dir=rootdir,
        )
        store = BaselineStore(root, test.get("baseline_profile") or default_profile)
        new = TestBaseline(
            test=test["nodeid"],
            profile=store.profile,
            provenance=provenance,
            levels=tuple(levels),
            capacity=capacity,
        )
        try:
            summary = store.update(
                new, cwd=rootdir, replace_corrupt=force, pool=_unless_changed(pool, test)
            )
        except (BaselineError, ProvenanceConflict, OSError) as exc:
            refused.append(f"{test['nodeid']}: not recorded: {exc}")
            continue
        written.append(str(summary))
    return written, refused


REASON_CHARS = 200
"""How much of a verdict's first reason a refusal quotes (the full text is in the reports)."""


def refusal(test: TestEntry) -> str | None:
    """Why a test's figures may not become its baseline without ``--update-baselines=force``,
    or None when they may.

    Refused: a level whose verdict is not :attr:`~pytest_kimi.verdicts.Verdict.recordable`
    (``error``, ``invalid``, ``not-run``: no trustworthy samples; ``fail``, ``regression``: the
    run failed on them), a ``@capacity`` test whose own verdict is not (below
    ``min_capacity``, a capacity regression, a search that could not finish), a common shift
    of the levels that is a regression, and a test the run was interrupted in.  Recording any
    of them would make what the gate rejected (or never finished) the next target: a red run
    turned green by an update.  The text names each level with its verdict and reason.
    """
    bad = [
        f"{lv.get('label', '?')} {lv.get('verdict')}{_reason(lv.get('reasons'))}"
        for lv in test.get("levels") or []
        if not _recordable(lv.get("verdict"))
    ]
    capacity = test.get("capacity")
    if isinstance(capacity, dict) and not _recordable(capacity.get("verdict")):
        bad.append(f"capacity {capacity.get('verdict')}{_reason(capacity.get('reasons'))}")
    shift = test.get("shift")
    if isinstance(shift, dict) and not _recordable(shift.get("verdict")):
        bad.append(f"all levels {shift.get('verdict')}{_reason([shift.get('text')])}")
    if test.get("outcome") == "interrupted":
        bad.append("interrupted: only some levels finished")
    if not bad:
        return None
    return (
        f"{test['nodeid']}: not recorded ({'; '.join(bad)}): a run the gate failed, or that "
        "could not be measured, must not become the target; fix the run, or record it anyway "
        "with --update-baselines=force (an approved trade-off: say so in the pull request)"
    )


def _unless_changed(pool: NoisePool | None, test: TestEntry) -> NoisePool | None:
    """``pool`` for the levels the run did not decide changed against their baseline."""
    if pool is None:
        return None
    changed = {
        WorkloadKey.from_dict(level_key(lv, test["workload"]))
        for lv in test.get("levels") or []
        if Verdict.of(lv.get("verdict")) in (Verdict.REGRESSION, Verdict.IMPROVED)
    }

    def pooled(old: LevelBaseline, new: LevelBaseline) -> SessionNoise | None:
        return None if new.workload in changed else pool(old, new)

    return pooled


def _session_noise(raw: PooledNoise | None) -> SessionNoise | None:
    """The noise a multi-session recording measured for the level (absent: None)."""
    if not isinstance(raw, dict):
        return None
    return SessionNoise(sigma=float(raw["sigma"]), df=int(raw["df"]))


def _trustworthy(verdict: Any) -> bool:
    """Is a level's figure sound enough to record at all (with ``force`` too)?  A verdict this
    plugin does not know is not; one it knows is unless the run voided it."""
    known = Verdict.of(verdict)
    return known is not None and known.comparable


def _recordable(verdict: Any) -> bool:
    """A verdict this plugin does not know (or none: a capacity never judged) is not."""
    known = Verdict.of(verdict)
    return known is not None and known.recordable


def _reason(reasons: Any) -> str:
    """``: <first reason>`` (notes left out), or nothing."""
    if not isinstance(reasons, list):
        return ""
    for reason in reasons:
        if isinstance(reason, str) and reason and not reason.startswith("note:"):
            short = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."
            return f": {short}"
    return ""


def capacity_record(capacity: CapacityEntry) -> CapacityBaseline:
    """A report's ``capacity`` object as its baseline record (:class:`CapacityBaseline`)."""
    levels = capacity.get("levels") or []
    return CapacityBaseline(
        workload=WorkloadKey.from_dict(capacity["workload"]),
        low=capacity.get("low"),
        high=capacity.get("high"),
        estimate=capacity.get("estimate"),
        log_se=capacity.get("log_se"),
        log_se_df=capacity.get("log_se_df"),
        slope=capacity.get("slope"),
        held=tuple(lv["load"] for lv in levels if lv.get("held") is True),
        broke=tuple(lv["load"] for lv in levels if lv.get("held") is False),
    )


def latency_record(level: LevelEntry, kind: str) -> tuple[dict[str, float], dict[str, list[float]]]:
    """A report level's latency of ``kind`` (``ttft_s``/``itl_s``) as a baseline stores it: the
    pooled figure per percentile and each trial's, from its ``latency`` section (empty for a
    level without one, such as a report written before the latency gate)."""
    section = level.get("latency")
    figures = section.get("figures") if isinstance(section, dict) else None
    pooled: dict[str, float] = {}
    trials: dict[str, list[float]] = {}
    for name, figure in (figures or {}).items():
        if not (isinstance(figure, dict) and name.startswith(kind + "_")):
            continue
        stat = name[len(kind) + 1 :]
        value = figure.get("value")
        if value is not None and value > 0:
            pooled[stat] = value
        if figure.get("trials"):
            trials[stat] = list(figure["trials"])
    return pooled, trials


def _summary(**values: float | None) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}


def reference_baseline(result: ThroughputResult, provenance: Provenance, name: str) -> TestBaseline:
    """The reference deployment's figures of this run, shaped as a baseline for the others
    (its latency too, so the candidates' latency is gated against the reference's)."""
    common = workload_dict(result.workload)
    levels = []
    for lv in result.levels:
        if not lv.figures.trials_tok_s:
            continue
        data = lv.to_dict()
        (ttft, ttft_trials), (itl, itl_trials) = (latency_record(data, k) for k in KINDS)
        levels.append(
            LevelBaseline(
                workload=WorkloadKey.from_dict(level_key(data, common)),
                trials_tok_s=tuple(lv.figures.trials_tok_s),
                ttft_s=ttft,
                itl_s=itl,
                trials_ttft_s=ttft_trials,
                trials_itl_s=itl_trials,
            )
        )
    return TestBaseline(
        test=result.nodeid, profile=name, provenance=provenance, levels=tuple(levels)
    )
