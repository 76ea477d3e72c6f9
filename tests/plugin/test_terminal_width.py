"""The terminal summary fits ``COLUMNS`` (100 in a CI log without it).

At ``COLUMNS=100``, 39 of 142 lines of an ordinary run were wider than 100 columns (the widest
348), and a CI log wraps them into noise: the level table was 150 columns, reasons and paths
ran on.  Now a table that does not fit loses its columns that say nothing, then is stacked in
blocks (the level's label in each, the gate's columns first), and every other line is wrapped
under its own indent.  The session test runs the example perf suite (``tests/perf``) against
the simulator as its docstring says to, and measures every line it printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from pytest_kimi.report.terminal import (
    NON_TTY_WIDTH,
    fit_line,
    format_table,
    format_test,
    summary_width,
)
from support.busy_machine import INNER_ADDOPTS
from support.timing import SESSION_S
from support.paths import TESTS

EXAMPLE_SUITE = TESTS / "perf" / "test_kimi_k26_ep8.py"


def _level(label: str, **extra: Any) -> dict[str, Any]:
    level: dict[str, Any] = {
        "label": label,
        "concurrency": 1,
        "tok_s": 1498.23,
        "spread_pct": 0.04,
        "request_tok_s_p50": 5.8,
        "ttft_s_p50": 0.755,
        "ttft_s_p95": 1.206,
        "itl_s_p50": 0.17051,
        "prompt_tokens": {"mean": 21, "min": 10, "max": 28},
        "requests_ok": 831,
        "requests_failed": 0,
        "target_tok_s": 1400,
        "baseline_tok_s": None,
        "trials": 3,
        "server_time_s": 87.5,
        "verdict": "no-baseline",
        "server": {"tok_s": 1497.0, "tokens": 123456, "client_tokens": 123400},
        "reasoning_tokens_mean": 412,
        "content_tokens_mean": 88,
        "ttfc_s_p50": 0.9,
        "ttfc_s_p95": 1.4,
    }
    level.update(extra)
    return level


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_a_wide_table_is_stacked_within_the_width_and_loses_no_figure(width: int) -> None:
    levels = [
        _level("C=1", reasons=["a reason long enough to need wrapping " * 6]),
        _level("C=256", baseline_tok_s=1500.0, change_pct=-0.1, ci90=[-1.2, 1.0], p_value=0.4),
    ]
    full = format_table(levels)  # no width: one row per level, every column
    lines = format_table(levels, width=width)
    assert len(full[0]) > 120 and all(len(line) <= width for line in lines), lines
    headers = [line for line in lines if line.lstrip().startswith("level")]
    assert len(headers) > 1  # stacked
    # every column of the full table is in one block; the gate's in the first
    for name in ("tok/s", "verdict", "target", "server tokens", "TTFC p50/p95 s", "server s"):
        assert sum(name in h.split("  ") or f" {name}" in h for h in headers) >= 1, name
    assert "verdict" in headers[0] and "tok/s" in headers[0]
    # each block: its header and a row per level, labelled; then the reason, wrapped under
    # its level
    first_reason = next(i for i, line in enumerate(lines) if "C=1 no-baseline: a reason" in line)
    table, reason = lines[:first_reason], lines[first_reason:]
    assert len(table) == 3 * len(headers)
    for at in range(0, len(table), 3):
        assert table[at + 1].lstrip().startswith("C=1 ")
        assert table[at + 2].lstrip().startswith("C=256 ")
    assert len(reason) > 1 and all(line.startswith("      ") for line in reason[1:])
    # columns read together stay together
    together = next(h for h in headers if "TTFT p50/p95 s" in h)
    assert "reason/content tok" in together and "TTFC p50/p95 s" in together


def test_a_table_that_fits_keeps_its_columns_and_one_that_does_not_drops_empty_ones() -> None:
    level = {"label": "C=1", "concurrency": 1, "tok_s": 65.0, "verdict": "no-baseline"}
    assert format_table([level], width=200) == format_table([level])  # fits: as it was
    narrow = format_table([level], width=60)
    assert all(len(line) <= 60 for line in narrow)
    header = narrow[0].split()
    assert "baseline" not in header and "p" not in header  # all "-": nothing to say
    assert header[:2] == ["level", "tok/s"] and header[-1] == "verdict"  # never dropped


def test_a_long_line_wraps_under_its_indent_and_a_long_word_is_split() -> None:
    line = "  no baseline yet: /" + "x" * 150 + ".yaml (record it with --update-baselines)"
    lines = fit_line(line, 100)
    assert len(lines) > 1 and all(len(part) <= 100 for part in lines)
    assert lines[0].startswith("  no baseline yet: /") and lines[1].startswith("      ")
    assert "".join(part.strip() for part in lines).replace(" ", "") == line.replace(" ", "")


def test_a_shell_command_to_copy_is_never_wrapped() -> None:
    """Wrapped, a pasted ``git add ... && git commit -m '...'`` would run half of itself."""
    command = "  $ git add -- baselines/sim/t.yaml && git commit -m '" + "word " * 30 + "'"
    assert fit_line(command, 100) == [command]


def test_a_whole_test_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    test = {
        "nodeid": "tests/perf/test_kimi_k26_ep8.py::test_concurrency_sweep",
        "outcome": "passed",
        "workload": {"api": "chat"},
        "levels": [_level("C=1"), _level("C=256")],
        "baseline_note": "no baseline yet: /" + "long/" * 30 + "x.yaml (record it)",
    }
    monkeypatch.delenv("COLUMNS", raising=False)
    assert summary_width(isatty=False) == NON_TTY_WIDTH == 100
    assert all(len(line) <= 100 for line in format_test(test))
    monkeypatch.setenv("COLUMNS", "72")
    assert summary_width(isatty=False) == 72
    assert all(len(line) <= 72 for line in format_test(test))


def _header_end(lines: list[str]) -> int:
    """The index of the ``collected N items`` line: what comes before it is pytest's session
    header (platform, rootdir, plugins, and each plugin's own line, such as pytest-asyncio's
    125-column ``asyncio: mode=...``), which no option of this plugin shapes."""
    return next(i for i, line in enumerate(lines) if line.startswith("collected "))


def test_the_example_suite_fits_100_columns(pytester: pytest.Pytester) -> None:
    """``pytest -m perf --endpoint=sim:speed=10,stream_interval=8`` on the example suite,
    ``COLUMNS=100``: no line of its output from the collection on is wider than 100.

    The simulator runs at speed 50, not the README's 10: the figures and latencies are in its
    clock, so the lines are the same; the example's whole requests (five of 512 tokens at
    C=1) and its C=256 trials are paced by the simulator, 32 s of wall time at 10 against
    15 s at 50.  A machine too busy for that pace voids levels, whose reasons must fit too."""
    where = pytester.path
    (where / EXAMPLE_SUITE.name).write_text(EXAMPLE_SUITE.read_text())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-m",
            "perf",
            "--endpoint=sim:speed=50,stream_interval=8",
            "--perf-history=off",
        ],
        cwd=where,
        env={**os.environ, "PYTEST_ADDOPTS": INNER_ADDOPTS, "COLUMNS": "100"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=SESSION_S,
        check=False,
    )
    lines = done.stdout.split("\n")
    # the run's summary was printed (whatever the outcome on a busy machine: a failure's
    # message must fit too), so the check below is not vacuous
    out = done.stdout
    assert "pytest-kimi throughput" in out, out[-3000:]
    for name in ("test_single_stream", "test_concurrency_sweep"):
        assert f"::{name} [" in out, out[-3000:]
    assert "C=256" in out and "verdict" in out
    wide = [line for line in lines[_header_end(lines) :] if len(line) > 100]
    assert not wide, "\n".join(wide)
