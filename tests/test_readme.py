"""The README's example is a real test file: it must collect, and its markers must validate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_starts_with_the_two_commands() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert blocks[0].strip().startswith("pip install -e '.[test]' && pytest -m perf --endpoint=sim")
    assert blocks[1].strip() == "pytest"
    ci = (README.parent / ".ci" / "run").read_text()
    assert blocks[0].strip() in ci and "\npytest\n" in ci


def test_readme_example_collects_as_perf_tests(pytester: pytest.Pytester) -> None:
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest(
        "-m", "perf", "--collect-only", "-q", "--endpoint=http://127.0.0.1:9"
    )
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*::test_single_stream", "*::test_peak"])


def test_readme_example_runs_against_the_simulator(pytester: pytest.Pytester) -> None:
    """Not only collected: measured against the simulator and judged, as a reader would run it."""
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest_subprocess(
        "-m",
        "perf",
        "--endpoint=sim:speed=20,stream_interval=8",
        "--perf-trials=1",
        timeout=600,
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_single_stream*[[]passed[]]*", "*test_peak*[[]passed[]]*"])
