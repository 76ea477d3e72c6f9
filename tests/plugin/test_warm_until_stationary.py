"""A fresh server is warmed until its figures are stationary before anything is measured.

The simulator's ``cold_steps`` knob gives a server first-use costs (its first steps slower,
the excess falling to none): without the warm-up the first level read the cold server; with it
the level reads what the same server reads warm.  The rule itself is pure and tested first.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kimi.measure.warm import (
    MAX_WARM_TRIALS,
    VOID_IN_A_ROW,
    WARM_RISE,
    settled,
    warm_until_stationary,
)

pytest_plugins = ["pytester"]

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[4, 2], max_tokens=64, trials=2)
def test_a():
    pass

@throughput(concurrency=[4], max_tokens=64, trials=2)
def test_b():
    pass
"""


def test_the_rule_stops_when_the_rise_is_over() -> None:
    assert not settled([100.0])
    assert not settled([100.0, 120.0, 130.0])  # still rising
    assert not settled([100.0, 120.0, 120.1])  # the last new high is one trial old
    assert settled([100.0, 120.0, 120.1, 119.0])  # two trials without a new high
    assert settled([100.0, 99.0, 98.0])  # falls: steady (noise goes both ways)
    assert not settled([100.0, 100.0 * (1 + 2 * WARM_RISE), 100.0])
    # one noisy dip does not end the warm-up of a server still rising (vLLM: 293 -> 148)
    assert not settled([293.0, 148.0, 310.0])
    assert not settled([83.7, 60.0, 127.1, 140.4])


def _warm(figures: list[float | str | None]) -> tuple[Any, int]:
    """The warm-up over trials reading ``figures`` (None: a void trial; ``"limit"``: a void
    trial that ran past its wall-clock limit), and how many ran."""
    ran: list[int] = []

    async def run(index: int, offset: int) -> Any:
        figure = figures[len(ran)]
        ran.append(index)
        # what the rule reads of a trial (metrics.TrialResult): its validity and its figure
        if figure == "limit":
            return SimpleNamespace(valid=False, tok_s=None, over_limit_s=9.0)
        return SimpleNamespace(valid=figure is not None, tok_s=figure, over_limit_s=None)

    return asyncio.run(warm_until_stationary(run, "C=1")), len(ran)


def test_trials_that_give_no_figure_end_the_warm_up_at_once() -> None:
    """A server that hangs gives no warm figure; each such trial lasts its whole wall-clock
    limit, so the warm-up stops after two in a row, not after the bound."""
    warm, ran = _warm([None] * MAX_WARM_TRIALS)
    assert ran == VOID_IN_A_ROW and warm.no_figure and not warm.stationary
    assert "the last 2 gave no figure" in warm.text()
    # one void trial (a stalled client) between figures does not end it
    warm, ran = _warm([100.0, None, 120.0, 120.1, 119.0, 119.5, 119.2, 119.0])
    assert warm.stationary and not warm.no_figure and ran == 5 and warm.void == 1
    # a rise, then two void trials: stopped, the figures kept
    warm, ran = _warm([100.0, 120.0, None, None, 130.0, 130.0, 130.0, 130.0])
    assert ran == 4 and warm.no_figure and warm.tok_s == [100.0, 120.0]
    # a trial that ran past its wall-clock limit ends it at once: another would cost a limit
    warm, ran = _warm([100.0, "limit", 120.0, 120.0, 120.0, 120.0, 120.0, 120.0])
    assert ran == 2 and warm.no_figure and warm.over_limit and warm.tok_s == [100.0]
    assert "the last ran past its wall-clock limit" in warm.text()


def _run(pytester: pytest.Pytester, endpoint: str) -> dict[str, Any]:
    pytester.makepyfile(test_suite=SUITE)
    report = pytester.path / "r.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--endpoint={endpoint}", f"--perf-json={report}"
    )
    result.assert_outcomes(passed=2)
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def _flat(figures: list[float]) -> bool:
    """The trials agree within 3%: a plateau, whatever the trial noise kept the rule seeing."""
    return len(figures) >= 2 and max(figures) <= 1.03 * min(figures)


def test_a_cold_server_is_measured_warm(pytester: pytest.Pytester) -> None:
    warm = _run(pytester, "sim:speed=10,stream_interval=8")
    cold = _run(pytester, "sim:speed=10,stream_interval=8,cold_steps=400,cold_slowdown=2")
    first, second = cold["tests"]
    steady = warm["tests"][0]["levels"][0]["tok_s"]
    up, then = first["warm_up"]
    assert up["level"] == "C=4"
    # stationary, or (on a loaded machine, whose trials scatter by ~1%) noise kept setting new
    # highs past the 0.5% rule until the bound: either way the cold rise is behind it
    assert up["stationary"] or _flat(up["tok_s"][-3:]), up
    assert up["tok_s"][0] < 0.8 * steady, "the first warm trial read the cold server"
    assert up["tok_s"][-1] == pytest.approx(steady, rel=0.03)
    # each level is warmed before it is measured, the second too (its own shapes)
    assert then["level"] == "C=2" and (then["stationary"] or _flat(then["tok_s"][-3:])), then
    # what is measured is the warm server's figure, not the cold one's
    assert first["levels"][0]["tok_s"] == pytest.approx(steady, rel=0.03)
    assert first["levels"][1]["tok_s"] == pytest.approx(
        warm["tests"][0]["levels"][1]["tok_s"], rel=0.03
    )
    assert "warm_up" not in second, "only the first test on a server warms it"
    # the simulator without first-use costs is stationary by construction: not warmed
    assert "warm_up" not in warm["tests"][0]


def test_a_server_still_rising_at_the_bound_is_said_to_be(pytester: pytest.Pytester) -> None:
    cold = _run(pytester, "sim:speed=10,stream_interval=8,cold_steps=1500,cold_slowdown=3")
    up = cold["tests"][0]["warm_up"][0]
    assert not up["stationary"] and len(up["tok_s"]) + up["void"] == MAX_WARM_TRIALS
    assert "still rising" in up["text"] and "may read low" in up["text"]
