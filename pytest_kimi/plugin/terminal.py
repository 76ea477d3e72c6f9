"""Lines on the terminal past pytest's output capture: the one way the plugin writes them.

A fixture's setup is captured (fd capture would swallow a server's launch progress or a
measurement's live lines), so each write suspends capture around it, as pytest's live logging
does.  Every text is scrubbed of secrets before it is shown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from pytest_kimi.report.progress import ProgressPrinter
from pytest_kimi.scrub import scrub_text


def _uncaptured(config: pytest.Config, write: Callable[[Any], None]) -> bool:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return False
    capman = config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        write(reporter)
    return True


def say(config: pytest.Config, text: str, **markup: bool) -> bool:
    """Write ``text`` on a line of its own; False where there is no terminal."""

    def write(reporter: Any) -> None:
        reporter.ensure_newline()
        reporter.write_line(scrub_text(text), **markup)

    return _uncaptured(config, write)


def progress_printer(config: pytest.Config, label: str) -> ProgressPrinter | None:
    """Live lines of a measurement: updating in place on a TTY, plain lines in CI logs."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.get_verbosity() < -1:
        return None

    def line(text: str) -> None:
        say(config, text)

    def rewrite(text: str) -> None:
        _uncaptured(config, lambda r: r.rewrite(scrub_text(text), erase=True))

    line(f"[kimi] measuring {label}")
    return ProgressPrinter(line, rewrite if reporter.isatty else None, prefix="[kimi] ")
