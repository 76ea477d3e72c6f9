"""The conductor (pytest_kimi/run/conductor.py) without pytest's plugin: one path for both
markers, so what it does around a measurement holds for a sweep and a search alike.

These run the real path against a simulator of their own (at speed 20, a few seconds each); an
interrupt is injected right after the job's measurement returns, where Ctrl-C would stop it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, TypeVar

import pytest

from pytest_kimi.baseline import BaselineStore
from pytest_kimi.endpoint.discovery import EndpointInfo
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.measure.results import ThroughputResult
from pytest_kimi.measure.measure_spec import MeasureSpec
from pytest_kimi.measure.trials import ProgressFn
from pytest_kimi.run.conductor import (
    INTERRUPTED,
    JudgedAgainst,
    Conditions,
    MeasurementInterrupted,
    TestPlan,
    conduct,
)
from pytest_kimi.run.measurer import Measurer
from pytest_kimi.run.plan import PlanError, malformed_markers, plan_test
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig

T = TypeVar("T")

SWEEP = {"concurrency": [1, 2], "max_tokens": 24, "trials": 1, "protocol": "whole-requests"}
SEARCH = {
    "max_e2e_s": 1000.0,  # every load holds: the search climbs to the top of its range
    "concurrency": (1, 2),
    "max_tokens": 24,
    "trials": 1,
    "protocol": "whole-requests",
}


class InterruptedMeasurer(Measurer):
    """A measurer whose job is 'interrupted' the moment its measurement returns: the partial
    result then holds every level, as after a Ctrl-C between two levels."""

    interrupt = True

    def measure(self, spec: MeasureSpec, progress: ProgressFn | None = None) -> ThroughputResult:
        result = super().measure(spec, progress)
        if self.interrupt:
            raise KeyboardInterrupt
        return result

    def run_job(self, job: Callable[[Any], Awaitable[T]]) -> T:
        out = super().run_job(job)
        if self.interrupt:
            raise KeyboardInterrupt
        return out


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process = SimProcess(SimConfig(speed=20), log_dir=tmp_path_factory.mktemp("simlogs"))
    process.start()
    try:
        assert process.url is not None
        yield process.url
    finally:
        process.stop()


@pytest.fixture
def measurer() -> Iterator[InterruptedMeasurer]:
    m = InterruptedMeasurer()
    try:
        yield m
    finally:
        m.close()


def _plan(marker: str, kwargs: dict[str, Any]) -> TestPlan:
    plan = plan_test(
        "test_x.py::test_x",
        [((), kwargs)] if marker == "throughput" else [],
        [((), kwargs)] if marker == "capacity" else [],
    )
    assert plan is not None
    return plan


def _conduct(
    plan: TestPlan, measurer: Measurer, url: str, tmp_path: Path, server: Any = None
) -> ThroughputResult:
    endpoint: EndpointInfo = measurer.discover(url, api_key=None, model=None)
    return conduct(
        plan,
        "test_x.py::test_x",
        measurer,
        endpoint,
        GateSettings(),
        JudgedAgainst(
            store=BaselineStore(tmp_path / "baselines", "ep4"),
            deployment="ep4",
            reference="ep8",
            references={},
        ),
        Conditions(rootdir=tmp_path),
        server=server,
    )


@pytest.mark.parametrize("marker", ["throughput", "capacity"])
def test_an_interrupted_test_in_an_ab_keeps_its_deployment_name(
    marker: str, sim: str, measurer: InterruptedMeasurer, tmp_path: Path
) -> None:
    """Both markers' partial results carry the deployment (JSON ``profile``) on the test and
    on every finished level, the baseline file and the interrupt note: a capacity test used to
    lose its deployment's name (its own copy of the path forgot it)."""
    plan = _plan(marker, SWEEP if marker == "throughput" else SEARCH)
    with pytest.raises(MeasurementInterrupted) as caught:
        _conduct(plan, measurer, sim, tmp_path)
    partial = caught.value.result
    data = partial.to_dict()
    assert data["profile"] == "ep4"
    assert data["interrupted"] == INTERRUPTED
    assert data["baseline_file"] == str(tmp_path / "baselines" / "ep4" / "test_x" / "test_x.yaml")
    assert data["levels"], "the levels it finished are reported"
    assert {lv["profile"] for lv in data["levels"]} == {"ep4"}
    assert "provenance_changes" not in data  # never judged


class RefusingServer:
    """A managed server whose prefix-cache flush is refused (the engine has a flush path)."""

    class engine:
        flush_path = "/flush_cache"

    flush_error = "HTTP 503 (server busy)"
    log_path = Path("/nonexistent.log")

    def flush_cache(self) -> bool:
        return False

    def crashed(self) -> int | None:
        return None


@pytest.mark.parametrize("marker", ["throughput", "capacity"])
def test_a_refused_cache_flush_is_noted_on_every_level_of_either_marker(
    marker: str, sim: str, measurer: InterruptedMeasurer, tmp_path: Path
) -> None:
    """The note reached a sweep's levels only: a capacity's copy of the path set it on the test
    and not on the levels the reports print."""
    measurer.interrupt = False
    plan = _plan(marker, SWEEP if marker == "throughput" else SEARCH)
    result = _conduct(plan, measurer, sim, tmp_path, server=RefusingServer())
    note = "prefix cache not flushed before this test: HTTP 503 (server busy)"
    assert result.cache_flush == note
    assert result.levels and all(f"note: {note}" in lv.errors for lv in result.levels)
    data = result.to_dict()
    assert data["profile"] == "ep4"
    assert data["compared_with"] == "deployment ep8 (same run)"
    assert data["provenance_changes"] == []
    # a candidate is compared with the reference's run, not a file: no "record it" note
    assert "baseline_note" not in data


def test_a_plan_names_the_test_and_the_marker_when_malformed() -> None:
    with pytest.raises(PlanError, match=r"test_x.py::test_x: @capacity unknown argument") as bad:
        plan_test("test_x.py::test_x", [], [((), {"max_itl": 0.05})])
    capacity = bad.value.problem
    assert capacity.marker == "capacity" and str(capacity) == str(bad.value)
    with pytest.raises(PlanError, match="not both") as both:
        plan_test("test_x.py::test_x", [((), {})], [((), {"max_itl_s": 0.05})])
    assert both.value.problem.marker is None
    with pytest.raises(PlanError) as throughput:
        plan_test("test_x.py::test_y", [((), {"concurrency": 0})], [])
    assert throughput.value.problem.marker == "throughput"
    assert plan_test("test_x.py::test_x", [], []) is None
    # the headline is the markers' kind, carried as data, not read back from the text
    assert malformed_markers([capacity]) == f"malformed @capacity marker:\n  {capacity}"
    mixed = malformed_markers([capacity, throughput.value.problem])
    assert mixed.startswith("malformed @throughput marker:\n  ")
    assert malformed_markers([both.value.problem]).startswith("malformed @throughput marker:")
    assert pickle.loads(pickle.dumps(bad.value)).problem == capacity
