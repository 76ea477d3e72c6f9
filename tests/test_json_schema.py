"""The JSON report's documented schema (docs/json-report.md) against the typed results that
produce it: every key a test or level object can carry is documented, and the JSON is what
the dataclasses say (no field reaches it except through them)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from pytest_kimi.measure.metrics import LevelFigures, ReasoningFigures
from pytest_kimi.measure.results import (
    BaselineComparison,
    LevelResult,
    ServerExit,
    ThroughputResult,
)
from pytest_kimi.measure.windows import TrialWindow
from pytest_kimi.report.json_report import SCHEMA_VERSION, build_report
from pytest_kimi.report.record import TestRecord
from pytest_kimi.workload.workload_spec import LevelSpec, Targets, Workload

DOC = Path(__file__).resolve().parent.parent / "docs" / "json-report.md"
PLUGGABLE = {"dataset", "output_tokens_mean", "shared_prefix", "prefix_cache_hit_rate", "server"}


def _documented() -> set[str]:
    return set(re.findall(r"`([a-z_0-9]+)`", DOC.read_text(encoding="utf-8")))


def _every_field(cls: type, **given: Any) -> Any:
    """An instance with every optional field set to a value of its kind (so to_dict emits it)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif "str" in str(f.type):
            values[f.name] = "x"
        elif "float" in str(f.type) and "tuple" in str(f.type):
            values[f.name] = (1.0, 2.0)
        elif "int" in str(f.type) or "float" in str(f.type):
            values[f.name] = 1
        elif "list" in str(f.type):
            values[f.name] = ["x"]
        elif "dict" in str(f.type):
            values[f.name] = {"k": 1}
    return cls(**values)


def _level() -> LevelResult:
    reasoning = ReasoningFigures(
        **{f.name: 1 for f in dataclasses.fields(ReasoningFigures)}  # type: ignore[arg-type]
    )
    figures = LevelFigures(
        tok_s=1.0,
        trials_tok_s=[1.0],
        spread_pct=1.0,
        request_tok_s_p50=1.0,
        ttft_s_p50=1.0,
        ttft_s_p95=1.0,
        itl_s_p50=1.0,
        requests_ok=1,
        requests_failed=0,
        reasoning=reasoning,
    )
    return _every_field(
        LevelResult,
        spec=LevelSpec(concurrency=None, rate=2.0, max_tokens=64),
        label="rate=2/s",
        prompts_key="builtin:diverse",
        trials=[],
        figures=figures,
        verdict="pass",
        comparison=_every_field(BaselineComparison, found=True),
        extra={},
        turns=[{"turn": 1}],
        trial_windows=[
            TrialWindow(
                trial=0,
                kept=True,
                valid=True,
                start_monotonic=1.0,
                end_monotonic=2.0,
                unix_offset=1e9,
                tokens=10.0,
                tok_s=10.0,
                requests=2,
                cut=1,
            )
        ],
    )


def _test() -> ThroughputResult:
    level = _level()
    return _every_field(
        ThroughputResult,
        nodeid="t.py::t",
        workload=Workload(levels=(level.spec,)),
        targets=Targets(),
        levels=[level],
        server_exit=ServerExit(1, "log", "tail"),
        measured=(1.0, 2.0),
    )


def test_every_field_a_test_or_level_carries_is_documented() -> None:
    result = _test()
    record = TestRecord(result.nodeid, "passed", result.workload, result, error="why")
    data = json.loads(json.dumps(build_report(None, [record.to_json()])))
    documented = _documented()
    assert not set(data) - documented
    (test,) = data["tests"]
    assert not set(test) - documented, "document these in docs/json-report.md"
    (level,) = test["levels"]
    assert not set(level) - documented, "document these in docs/json-report.md"
    (window,) = level["trial_windows"]
    assert not set(window) - documented, "document the trial windows' keys there too"
    assert PLUGGABLE <= documented  # the sections stages contribute through LevelResult.extra
    # every typed field reached the JSON (none is set and then dropped by to_dict)
    typed = {f.name for f in dataclasses.fields(ThroughputResult)} - {"workload", "targets"}
    assert typed - {"deployment"} <= set(test) and test["profile"] == "x"


def test_the_doc_names_the_schema_version_the_code_writes() -> None:
    assert f"schema {SCHEMA_VERSION}" in DOC.read_text(encoding="utf-8").splitlines()[0]
    assert build_report(None, [])["schema"] == SCHEMA_VERSION


def test_a_level_without_a_baseline_reads_null_comparison_fields() -> None:
    level = dataclasses.replace(_level(), comparison=BaselineComparison(found=False))
    data = level.to_dict()
    assert [data[k] for k in ("baseline_tok_s", "change_pct", "ci90", "p_value")] == [None] * 4
    assert "baseline_trials" not in data
