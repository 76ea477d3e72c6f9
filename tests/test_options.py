"""Options: where each value may come from, and what a committed ini must not be able to do."""

from __future__ import annotations

import pytest

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=64, trials=2, warmup=1)
def test_one():
    pass
"""


def test_update_baselines_cannot_come_from_an_ini_file(pytester: pytest.Pytester) -> None:
    """A committed ``kimi_update_baselines`` would rewrite baselines on every CI run."""
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\nkimi_update_baselines = yes\n")
    result = pytester.runpytest_subprocess("--endpoint=sim:speed=20", "-W", "default")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*Unknown config option: kimi_update_baselines*"])
    assert not (pytester.path / "baselines").exists()
    assert "kimi_update_baselines" not in "\n".join(pytester.runpytest("--help").outlines)


def test_update_baselines_from_the_command_line_still_records(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("--endpoint=sim:speed=20", "--update-baselines=force")
    result.assert_outcomes(passed=1)
    assert list((pytester.path / "baselines").rglob("test_one.yaml"))
