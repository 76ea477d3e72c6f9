"""A perf test's plan from its markers, and the id its baseline is keyed by.

pytest hands the plugin marker objects and parametrized ids; these functions take their plain
contents (``(args, kwargs)`` pairs, the id's text, our own parameter ids), so the same rules
hold for the plugin, ``kimi-perf`` and scripts, and are tested without a pytest session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_kimi.run.conductor import TestPlan
from pytest_kimi.workload.capacity_marker import parse_capacity
from pytest_kimi.workload.markers import merge_marker_kwargs, parse_throughput
from pytest_kimi.workload.workload_spec import MarkerError

PERF_MARKERS = ("throughput", "capacity")
"""The markers that make a test a perf test: measured, parametrized over deployments."""

Marks = Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]]


@dataclass(frozen=True)
class MarkerProblem:
    """What is wrong with a test's perf marker: which marker (None where the test carries
    both), and the message naming the test and the marker, which is its ``str()``."""

    marker: Literal["throughput", "capacity"] | None
    message: str

    def __str__(self) -> str:
        return self.message


class PlanError(ValueError):
    """A malformed marker; :attr:`problem` says which marker, the message names the test and
    the marker."""

    def __init__(self, problem: MarkerProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem

    def __reduce__(self) -> tuple[type[PlanError], tuple[MarkerProblem]]:
        return type(self), (self.problem,)


def malformed_markers(problems: Sequence[MarkerProblem]) -> str:
    """The collection error for the session's malformed markers, one problem a line: headed
    ``@capacity`` where every one is a capacity marker's, else ``@throughput``."""
    kind = "@capacity" if all(p.marker == "capacity" for p in problems) else "@throughput"
    return f"malformed {kind} marker:\n  " + "\n  ".join(map(str, problems))


def plan_test(
    nodeid: str, throughput: Marks, capacity: Marks, *, allow_large: bool = False
) -> TestPlan | None:
    """The test's plan from its ``@throughput`` or ``@capacity`` markers (closest first), or
    None for a test that carries neither; :class:`PlanError` for a malformed one."""
    if throughput and capacity:
        raise PlanError(
            MarkerProblem(
                None,
                f"{nodeid}: @throughput and @capacity on one test: a test measures fixed "
                "levels or searches its capacity, not both",
            )
        )
    marks = throughput or capacity
    if not marks:
        return None
    name: Literal["throughput", "capacity"] = "capacity" if capacity else "throughput"
    args, kwargs = merge_marker_kwargs(list(marks))
    try:
        if capacity:
            search, workload, targets = parse_capacity(args, kwargs, allow_large=allow_large)
            return TestPlan(workload, targets, search)
        workload, targets = parse_throughput(args, kwargs, allow_large=allow_large)
    except MarkerError as exc:
        raise PlanError(MarkerProblem(name, f"{nodeid}: @{name} {exc}")) from None
    return TestPlan(workload, targets)


def baseline_nodeid(nodeid: str, ours: Sequence[str], group_suffix: str | None = None) -> str:
    """The test's id without xdist's group suffix or the deployment's and session's ids.

    Baselines are keyed by it, so they do not depend on ``-n`` or on which deployments run.
    ``ours``: the ids the plugin parametrized the test with, in the order it adds them
    (``["ep8"]``, ``["s2"]`` or ``["ep8", "s2"]``).
    """
    if group_suffix is not None and nodeid.endswith(group_suffix):
        nodeid = nodeid[: -len(group_suffix)]
    if not ours or not nodeid.endswith("]"):
        return nodeid
    head, _, inner = nodeid[:-1].rpartition("[")
    name = "-".join(ours)
    if inner == name:
        return head
    if inner.endswith("-" + name):
        return f"{head}[{inner[: -len(name) - 1]}]"
    if inner.startswith(name + "-"):
        return f"{head}[{inner[len(name) + 1 :]}]"
    return nodeid
