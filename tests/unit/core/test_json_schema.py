"""The JSON report's documented schema (docs/reference/json-report.md) against the typed results that
produce it: every key a test or level object can carry is documented, and the JSON is what
the dataclasses say (no field reaches it except through them)."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from typing import Any

from pytest_kimi import wire

from pytest_kimi.measure.metrics import LevelFigures, ReasoningFigures
from pytest_kimi.measure.peer_figures import LATENCIES, RATES, STATS, empty_peer_dict
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
from support.paths import REPO

DOC = REPO / "docs" / "reference" / "json-report.md"
PLUGGABLE = {
    "dataset",
    "output_tokens_mean",
    "shared_prefix",
    "prefix_cache_hit_rate",
    "prefix_cache",
    "server",
    "contamination",
}
"""The sections stages contribute to a level (``LevelResult.extra``), documented in prose."""


def _documented() -> set[str]:
    return set(re.findall(r"`([a-z_0-9]+)`", DOC.read_text(encoding="utf-8")))


def _every_field(cls: type, **given: Any) -> Any:
    """An instance with every optional field set to a value of its kind (so to_dict emits it)."""
    values: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif any(typing.is_typeddict(t) for t in typing.get_args(hints[f.name])):
            values[f.name] = {"k": 1}  # a section typed by pytest_kimi.wire
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
    assert not set(test) - documented, "document these in docs/reference/json-report.md"
    (level,) = test["levels"]
    assert not set(level) - documented, "document these in docs/reference/json-report.md"
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


# ------------------------------------------------------------------- the typed wire vs the doc

INTERNAL_TEST_KEYS = {"endpoint", "perf_sessions"}
"""``TestEntry`` keys never in a report: the endpoint a worker's record carries until the
reporter files it (the report has one ``endpoint``), and the sessions a ``--perf-sessions``
pooled test holds for the baseline update."""
INTERNAL_LEVEL_KEYS = {"session_noise"}
"""``LevelEntry`` keys never in a report: the noise a pooled level carries to the baseline."""
COMPARE_ONLY_KEYS = {"title", "notes"}
"""``Report`` keys only ``kimi-perf compare``'s report has (``render_markdown`` shows them)."""


def _keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


def _tables(heading: str) -> list[set[str]]:
    """The field names of each table under ``heading`` (up to the next ``## ``): the
    backticked names in the first column of every row."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading) + 1
    tables: list[set[str]] = []
    previous = ""
    for line in lines[start:]:
        if line.startswith("## "):
            break
        if line.startswith("|") and not previous.startswith("|"):
            tables.append(set())
        cell = line.split("|")[1] if line.startswith("|") else ""
        if line.startswith("|") and not set(cell.strip()) <= {"-", ":"} and "`" in cell:
            tables[-1] |= set(re.findall(r"`([a-z_0-9]+)`", cell))
        previous = line
    return tables


def test_the_typed_wire_has_every_documented_field_and_no_other() -> None:
    """docs/reference/json-report.md's tables and :mod:`pytest_kimi.wire` name the same keys: the top
    level, a test, a level (and the sections stages contribute, documented in prose), a trial
    window, a level's latency and each of its figures; the exceptions are named above."""
    (top,) = _tables("## Top level")
    assert top == _keys(wire.Report) - COMPARE_ONLY_KEYS
    (test,) = _tables("## A test")
    assert test == _keys(wire.TestEntry) - INTERNAL_TEST_KEYS
    (level,) = _tables("## A level")
    assert level | PLUGGABLE == _keys(wire.LevelEntry) - INTERNAL_LEVEL_KEYS
    assert PLUGGABLE <= _keys(wire.LevelExtra)
    (window,) = _tables("## A level's trial windows")
    assert window == _keys(wire.TrialWindowEntry)
    section, figure = _tables("## A level's latency")
    assert section == _keys(wire.LatencyEntry)
    assert figure == _keys(wire.LatencyFigureEntry)


def test_the_race_section_is_documented_as_the_wire_types_say() -> None:
    """docs/reference/json-report.md "The race": the section, a ranking entry and a frontier point name
    the keys of their ``TypedDict``s (what a race writes is checked against the same types in
    tests/unit/gate/test_race_objective.py)."""
    section, entry, point = _tables("## The race")
    assert section == _keys(wire.RaceSection)
    assert entry == _keys(wire.RaceRankingEntry)
    assert point == _keys(wire.RaceFrontierPoint)


def test_what_the_producers_write_is_what_the_wire_types_say() -> None:
    """Every key the typed results put in the JSON is a key of its ``TypedDict`` (mypy checks
    the producers' literal keys; this checks the ones made at run time: the peer figures and
    the stages' sections), and the peer figures' keys are exactly :class:`wire.PeerEntry`'s."""
    result = _test()
    record = TestRecord(result.nodeid, "passed", result.workload, result, error="why")
    report = json.loads(json.dumps(build_report(None, [record.to_json()])))
    assert set(report) <= _keys(wire.Report)
    (test,) = report["tests"]
    assert set(test) <= _keys(wire.TestEntry)
    (level,) = test["levels"]
    assert set(level) <= _keys(wire.LevelEntry)
    assert set(level["trial_windows"][0]) == _keys(wire.TrialWindowEntry)
    peer = {f"{n}_{s}" for n in LATENCIES for s in STATS} | set(RATES) | {"peer_counts"}
    assert peer == _keys(wire.PeerEntry) == set(empty_peer_dict())
    assert _keys(wire.PeerEntry) <= set(_level().to_dict())
    assert set(_level().to_dict()["peer_counts"] or {}) <= _keys(wire.PeerCounts)
