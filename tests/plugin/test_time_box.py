"""The stationary time box scales with the request's length (issue 21: at 128 tokens a fixed
161-step box cost more server time than running the requests whole)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.measure.time_box import (
    MAX_SETTLE_STEPS,
    MAX_WINDOW_STEPS,
    MIN_WINDOW_STEPS,
    WINDOW_FLOOR_S,
    WINDOW_MIN_S,
    time_box,
)

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    "max_tokens, settle, window",
    [
        (16, 4, 16),
        (128, 4, 16),
        (256, 8, 32),
        (512, 16, 64),
        (1024, 32, 128),
        (8192, 32, 128),
    ],
)
def test_the_box_is_an_eighth_of_a_request_within_bounds(
    max_tokens: int, settle: int, window: int
) -> None:
    box = time_box(max_tokens)
    assert (box.settle_steps, box.window_steps) == (settle, window)
    assert box.steps == 1 + settle + window
    assert box.token_budget(8) == 8 * box.steps
    # a short box costs at most a fifth of a request of 128 tokens or more
    if max_tokens >= 128:
        assert box.steps <= 0.2 * max_tokens or window == MAX_WINDOW_STEPS


def test_a_packing_server_gets_a_window_of_two_reads_at_least() -> None:
    """SGLang at --stream-interval 16 sends a stream's tokens 16 at a time: a 16-step window
    would hold one read or none once its end loses up to one."""
    assert time_box(128, tokens_per_read=16).window_steps == 32
    assert time_box(128, tokens_per_read=8).window_steps == MIN_WINDOW_STEPS
    assert time_box(4096, tokens_per_read=16).window_steps == MAX_WINDOW_STEPS
    assert time_box(128, tokens_per_read=0.5).window_steps == MIN_WINDOW_STEPS  # never below 1


def test_the_wall_floor_falls_with_the_window() -> None:
    assert time_box(2048).window_min_s == WINDOW_MIN_S
    assert time_box(512).window_min_s == pytest.approx(WINDOW_MIN_S / 2)
    assert time_box(128).window_min_s == WINDOW_FLOOR_S
    assert time_box(2048).settle_steps == MAX_SETTLE_STEPS


SHORT = """
from pytest_kimi import throughput

@throughput(concurrency=4, max_tokens={max_tokens}, trials=2, warmup=2)
def test_short():
    pass
"""


def _windows(pytester: pytest.Pytester, tmp_path: Path, max_tokens: int) -> dict:
    pytester.makepyfile(test_short=SHORT.format(max_tokens=max_tokens))
    out = tmp_path / f"perf{max_tokens}.json"
    # speed 1: EP8's own steps (15-20 ms at C=4), so the box's steps, not the wall floors, rule
    result = pytester.runpytest("--endpoint=sim:speed=1", f"--perf-json={out}")
    result.assert_outcomes(passed=1)
    (level,) = json.loads(out.read_text())["tests"][0]["levels"]
    return level


def test_a_short_request_gets_a_short_trial(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """At 128 tokens each stationary trial's window holds about 16 steps of every stream (it
    held 128 whatever the length): its tokens are C x 16 give or take the end's read, and the
    level's server time is well under three whole requests'."""
    level = _windows(pytester, tmp_path, 128)
    for w in level["trial_windows"]:
        if w["kept"] and w["valid"]:
            steps = w["tokens"] / 4
            assert 8 <= steps <= 20, w
    # two trials of a 21-step box, plus the first tokens: far below 2 x 128 steps of ~17 ms
    assert level["server_time_s"] < 2 * 128 * 0.02, level["server_time_s"]
