"""Turning a run's figures into baselines: the ``--update-baselines`` flow, and A/B references.

Works on the JSON-shaped test results (the same dicts the reports read), so it runs on the
xdist controller from what the workers sent.  No pytest here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_kimi.baseline.model import (
    BaselineError,
    CapacityBaseline,
    LevelBaseline,
    ProvenanceConflict,
    TestBaseline,
    WorkloadKey,
)
from pytest_kimi.baseline.provenance import Provenance
from pytest_kimi.baseline.store import BaselineStore
from pytest_kimi.verdicts import Verdict
from pytest_kimi.measure.results import ThroughputResult, level_key, workload_dict


def update_baselines(
    root: Path,
    default_profile: str,
    mode: str,
    tests: list[dict[str, Any]],
    endpoints: dict[str, dict[str, Any]],
    rootdir: Path,
) -> tuple[list[str], list[str]]:
    """Write the baselines of the tests that ran; refuse untrustworthy ones unless forced.

    Returns the summary lines (old -> new per level, git commands) and the refusals.
    """
    written: list[str] = []
    refused: list[str] = []
    for test in tests:
        bad = [lv for lv in test["levels"] if not Verdict(lv["verdict"]).recordable]
        if bad and mode != "force":
            why = "; ".join(f"{lv['label']} {lv['verdict']}" for lv in bad)
            refused.append(
                f"{test['nodeid']}: not recorded ({why}); fix the run, or record anyway with "
                "--update-baselines=force"
            )
            continue
        capacity = None
        if isinstance(test.get("capacity"), dict):
            # a @capacity test records its capacity, not the levels its search happened to pick
            verdict = Verdict.of(test["capacity"].get("verdict"))
            if (verdict is None or not verdict.recordable) and mode != "force":
                refused.append(
                    f"{test['nodeid']}: not recorded (capacity {test['capacity'].get('verdict')}); "
                    "fix the run, or record anyway with --update-baselines=force"
                )
                continue
            try:
                capacity = capacity_record(test["capacity"])
            except (KeyError, TypeError, ValueError) as exc:
                refused.append(f"{test['nodeid']}: not recorded: capacity: {exc}")
                continue
        levels = [
            LevelBaseline(
                workload=WorkloadKey.from_dict(level_key(lv, test["workload"])),
                trials_tok_s=lv["trials_tok_s"],
                request_tok_s=_summary(p50=lv.get("request_tok_s_p50")),
                ttft_s=_summary(p50=lv.get("ttft_s_p50"), p95=lv.get("ttft_s_p95")),
            )
            for lv in test["levels"]
            if lv.get("trials_tok_s") and capacity is None
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
            summary = store.update(new, cwd=rootdir)
        except (BaselineError, ProvenanceConflict, OSError) as exc:
            refused.append(f"{test['nodeid']}: not recorded: {exc}")
            continue
        written.append(str(summary))
    return written, refused


def capacity_record(capacity: dict[str, Any]) -> CapacityBaseline:
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


def _summary(**values: float | None) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}


def reference_baseline(result: ThroughputResult, provenance: Provenance, name: str) -> TestBaseline:
    """The reference deployment's figures of this run, shaped as a baseline for the others."""
    levels = [
        LevelBaseline(
            workload=WorkloadKey.from_dict(level_key(lv.to_dict(), workload_dict(result.workload))),
            trials_tok_s=tuple(lv.figures.trials_tok_s),
        )
        for lv in result.levels
        if lv.figures.trials_tok_s
    ]
    return TestBaseline(
        test=result.nodeid, profile=name, provenance=provenance, levels=tuple(levels)
    )
