"""Every entry point's ``--help`` prints clean text, not only exit code 0.

argparse formats help strings with ``%``: a bare ``%`` in a help text either crashes
``--help`` or, worse, prints the parser's internal dict in the middle of a sentence
(``15{'option_strings': ...}lower``).  The checks below run each entry point as a user would
(a subprocess) and read what it printed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kimi.cli import build_parser
from pytest_kimi.sim.config import KNOB_HELP
from support.paths import REPO

ROOT = REPO
GARBLING = ("{'option_strings'", "%%", "%(", "<argparse.")
"""What escaped-format accidents leave in argparse output."""


def _run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (args, proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip(), (args, "printed nothing")
    return proc.stdout


def _assert_clean(text: str, what: str) -> None:
    for bad in GARBLING:
        assert bad not in text, f"{what}: {bad!r} in its help:\n" + _around(text, bad)


def _around(text: str, needle: str) -> str:
    at = text.find(needle)
    return text[max(0, at - 300) : at + 300]


def _flat(text: str) -> str:
    """Help text with argparse's line wrapping undone (it may break after a hyphen)."""
    return re.sub(r"\s+", " ", re.sub(r"-[ \t]*\n\s*", "-", text))


def test_pytest_help_with_the_plugin() -> None:
    out = _run("-m", "pytest", "--help")
    _assert_clean(out, "pytest --help")
    assert "pytest-kimi" in out and "--perf-json" in out, "the plugin's options are missing"


def test_pytest_help_survives_bad_plugin_settings(tmp_path: Path) -> None:
    """A machine-wide KIMI_* variable or a project's ini with a bad value must not break
    ``pytest --help`` for every project there: the values are checked by a real run."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nkimi_perf_trials = three\n")
    bad = {"KIMI_PERF_ALPHA": "x", "KIMI_PERF_HISTORY": "bogus://", "KIMI_PERF_SESSIONS": "0"}
    out = _run("-m", "pytest", "--help", cwd=tmp_path, env=bad)
    assert "--perf-history" in out
    run = subprocess.run(
        [sys.executable, "-m", "pytest"],
        cwd=tmp_path,
        env={**os.environ, **bad},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stderr[-2000:]


def test_pytest_markers_with_the_plugin() -> None:
    out = _run("-m", "pytest", "--markers")
    _assert_clean(out, "pytest --markers")
    assert "@pytest.mark.throughput(" in out and "input_tokens" in out


def test_knob_help_has_no_format_characters() -> None:
    """KNOB_HELP goes to argparse as it is, and into docs: no ``%`` at all."""
    bad = {name: text for name, text in KNOB_HELP.items() if "%" in text}
    assert not bad, f"'%' in simulator knob help (argparse formats it): {bad}"


def test_simulator_help_shows_every_knob_verbatim() -> None:
    out = _run("-m", "pytest_kimi.sim", "--help")
    _assert_clean(out, "python -m pytest_kimi.sim --help")
    flat = _flat(out)
    for name, text in KNOB_HELP.items():
        flag = "--" + name.replace("_", "-")
        assert flag in out, f"{flag} missing from the simulator's help"
        assert _flat(text) in flat, f"help of {flag} is not printed as written: {text!r}"


def _subcommands() -> list[str]:
    parser = build_parser()
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    raise AssertionError("kimi-perf has no subcommands")


def test_kimi_perf_help_lists_every_subcommand() -> None:
    out = _run("-m", "pytest_kimi.cli", "--help")
    _assert_clean(out, "kimi-perf --help")
    for name in _subcommands():
        assert name in out


@pytest.mark.parametrize("command", _subcommands())
def test_kimi_perf_subcommand_help(command: str) -> None:
    out = _run("-m", "pytest_kimi.cli", command, "--help")
    _assert_clean(out, f"kimi-perf {command} --help")
    assert "usage:" in out
    if command == "sim":
        assert "--stream-interval" in out  # the simulator's own flags, not the stub's
        return
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    for action in sub._actions:
        for flag in action.option_strings:
            assert flag in out, f"kimi-perf {command} --help lacks {flag}"
        if action.help and action.help is not argparse.SUPPRESS and "%(" not in action.help:
            shown = action.help.replace("%%", "%")  # argparse %-formats help: %% prints %
            assert _flat(shown) in _flat(out), f"kimi-perf {command}: {action.help!r} garbled"
