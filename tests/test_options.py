"""Options: where each value may come from, and what a committed ini must not be able to do."""

from __future__ import annotations

import sys

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


PRECEDENCE = """
import sys

import pytest
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=64, warmup=1)
def test_default(throughput_result):
    assert [len(lv.trials) for lv in throughput_result.levels] == [{expected}]

@throughput(concurrency=1, max_tokens=64, warmup=1, trials=2)
def test_marker_wins(throughput_result):
    assert [len(lv.trials) for lv in throughput_result.levels] == [2]
"""


@pytest.mark.parametrize(
    "cli, env, ini, expected",
    [
        (None, None, "5", 5),
        (None, "4", "5", 4),
        ("3", "4", "5", 3),
    ],
)
def test_trials_precedence_marker_cli_env_ini(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    cli: str | None,
    env: str | None,
    ini: str,
    expected: int,
) -> None:
    """marker > command line > environment > ini, for one option end to end."""
    pytester.makepyfile(test_suite=PRECEDENCE.format(expected=expected))
    pytester.makeini(f"[pytest]\nkimi_perf_trials = {ini}\n")
    if env is not None:
        monkeypatch.setenv("KIMI_PERF_TRIALS", env)
    else:
        monkeypatch.delenv("KIMI_PERF_TRIALS", raising=False)
    args = ["--endpoint=sim:speed=20"] + ([f"--perf-trials={cli}"] if cli else [])
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=2)


def test_bad_value_names_its_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("KIMI_PERF_TRIALS", "lots")
    result = pytester.runpytest("--endpoint=sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*env KIMI_PERF_TRIALS: bad value 'lots'*"])


def test_relative_paths_resolve_against_the_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One base for command line, environment and ini: the same file wherever pytest starts."""
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\nkimi_perf_markdown = reports/perf.md\n")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = pytester.run(
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        f"--rootdir={pytester.path}",
        f"-c={pytester.path / 'tox.ini'}",
        "--endpoint=sim:speed=20",
        "--perf-json=reports/perf.json",
        str(pytester.path / "test_suite.py"),
    )
    assert result.ret == 0, result.outlines[-20:]
    assert (pytester.path / "reports" / "perf.json").is_file()
    assert (pytester.path / "reports" / "perf.md").is_file()
    assert not (sub / "reports").exists()
