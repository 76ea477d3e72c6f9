"""The race's objective (what one launch's figure is) and its report section, without a
server: the figure read from a launch's test record, a launch that gives none, the frontier's
points pooled over launches, and the ``race`` section's keys against its wire types."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_kimi import wire
from pytest_kimi.gate.race import StartFailure
from pytest_kimi.gate.race_objective import (
    NoFigure,
    frontier_points,
    parse_objective,
    pool_frontier,
)
from pytest_kimi.run.race_run import race_deployments


def _level(c: int, tok_s: float, per_user: float, verdict: str = "no-baseline") -> dict[str, Any]:
    return {
        "label": f"C={c}",
        "concurrency": c,
        "tok_s": tok_s,
        "request_tok_s_p50": per_user,
        "verdict": verdict,
        "reasons": [] if verdict == "no-baseline" else ["load client stalled"],
    }


def _test(*levels: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"nodeid": "t.py::test_x", "levels": list(levels), "server_time_s": 10.0, **extra}


SWEEP = _test(_level(1, 70.0, 70.0), _level(8, 480.0, 62.0), _level(64, 1600.0, 30.0))


@pytest.mark.parametrize(
    ("text", "gpus", "expected"),
    [
        ("tok_s", 8, 1600.0),  # the peak over the levels
        ("tok_s:C=8", 8, 480.0),
        ("tok_s_per_gpu", 8, 200.0),
        ("tok_s_per_gpu:C=8", 4, 120.0),
        ("frontier:55", 8, 60.0),  # C=8 is the highest load whose users see >= 55 tok/s
        ("frontier:25", 8, 200.0),
    ],
)
def test_a_launch_figure_is_the_objective_read_from_its_levels(
    text: str, gpus: int, expected: float
) -> None:
    assert parse_objective(text).value(SWEEP, gpus) == pytest.approx(expected)


def test_a_launch_without_a_trusted_figure_gives_none_and_says_why() -> None:
    broken = _test(_level(1, 70.0, 70.0), _level(8, 480.0, 62.0, verdict="invalid"))
    with pytest.raises(NoFigure, match="C=8 invalid: load client stalled"):
        parse_objective("tok_s").value(broken, 8)
    with pytest.raises(NoFigure, match="no level kept per-request p50 >= 90"):
        parse_objective("frontier:90").value(SWEEP, 8)
    with pytest.raises(NoFigure, match="no level C=2"):
        parse_objective("tok_s:C=2").value(SWEEP, 8)
    with pytest.raises(NoFigure, match="GPU count is unknown"):
        parse_objective("tok_s_per_gpu").value(SWEEP, None)
    with pytest.raises(NoFigure, match="measured no capacity"):
        parse_objective("capacity").value(SWEEP, 8)
    capacity = _test(capacity={"verdict": "no-baseline", "value": 48.0, "reasons": []})
    assert parse_objective("capacity").value(capacity, 8) == 48.0


@pytest.mark.parametrize(
    "text", ["", "fast", "frontier", "frontier:-1", "frontier:x", "capacity:2"]
)
def test_a_malformed_objective_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="expected tok_s, tok_s_per_gpu"):
        parse_objective(text)


def test_the_frontier_pools_each_level_over_the_launches() -> None:
    launches = [frontier_points(SWEEP, 8), frontier_points(_test(_level(8, 520.0, 64.0)), 8)]
    by_label = {p["label"]: p for p in pool_frontier(launches)}
    c8 = by_label["C=8"]
    assert c8["launches"] == 2 and c8["tok_s_per_gpu"] == pytest.approx(62.5)
    assert c8["tok_s_per_user"] == pytest.approx(63.0)
    lo, hi = c8["tok_s_per_gpu_ci90"]
    assert lo < 62.5 < hi
    assert by_label["C=64"]["tok_s_per_gpu_ci90"] is None  # one launch: no interval
    # sorted by the per-user rate: the frontier's x axis
    assert [p["label"] for p in pool_frontier(launches)] == ["C=64", "C=8", "C=1"]


def _race_section() -> dict[str, Any]:
    speeds = {"a": 1.0, "b": 0.7, "c": None}
    count = {"n": 0}

    def launch(name: str) -> dict[str, Any]:
        count["n"] += 1
        speed = speeds[name]
        if speed is None:
            raise StartFailure(f"{name} did not start: exit 1")
        wobble = 1.0 + 0.002 * (count["n"] % 3)
        return _test(_level(8, 800.0 * speed * wobble, 60.0))

    first = {"a": launch("a"), "b": launch("b"), "c": StartFailure("c did not start: exit 1")}
    report = race_deployments(
        ["a", "b", "c"],
        {"a": 8, "b": 8, "c": 8},
        "t.py::test_x",
        parse_objective("tok_s"),
        first,
        launch,
        tolerance=0.05,
        alpha=0.05,
        max_rounds=4,
    )
    return dict(report.to_dict())


def test_a_race_over_records_names_the_winner_and_the_costs() -> None:
    section = _race_section()
    assert section["winner"] == "a" and section["stop"] == "winner"
    ranking = {e["deployment"]: e for e in section["ranking"]}
    assert ranking["c"]["status"] == "failed" and ranking["c"]["launch_values"] == [None]
    assert ranking["b"]["status"] == "eliminated"
    # every launch of a and b cost 10 s; c never gave a cost: the grid extrapolates it
    assert section["server_s"] == 10.0 * (ranking["a"]["launches"] + ranking["b"]["launches"])
    assert section["grid_server_s"] == 4 * 10.0 * 3


def _keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


def test_the_race_section_is_what_the_wire_says() -> None:
    """The keys a race writes are its ``TypedDict``s' (the doc's tables are checked against
    the same types in tests/unit/core/test_json_schema.py)."""
    section = _race_section()
    assert set(section) <= _keys(wire.RaceSection)
    assert set(section) >= _keys(wire.RaceSection) - {"problem"}
    for entry in section["ranking"]:
        assert set(entry) == _keys(wire.RaceRankingEntry)
    for frontier in section["frontier"]:
        assert set(frontier) == _keys(wire.RaceFrontier)
        for point in frontier["points"]:
            assert set(point) == _keys(wire.RaceFrontierPoint)
    assert set(section["objective"]) == _keys(wire.RaceObjectiveEntry)
