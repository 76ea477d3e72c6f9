"""Lines on the terminal past pytest's output capture: the one way the plugin writes them.

A fixture's setup is captured (fd capture would swallow a server's launch progress or a
measurement's live lines), so each write suspends capture around it, as pytest's live logging
does.  Every text is scrubbed of secrets and made printable (a server's string quoted in a
notice cannot move the cursor or forge a line) before it is shown, one line per line it meant.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimi.printable import printable
from pytest_kimi.scrub import scrub_text

if TYPE_CHECKING:
    from pytest_kimi.report.progress import ProgressPrinter


def shown(text: str) -> str:
    """``text`` as the terminal gets it: scrubbed, every control character but the newline
    escaped (a CR, an ESC or a BS never acts), and the lines after its first indented, so that
    a server's text in a notice (a log line) can never start a line of its own that reads as
    the plugin's, such as ``[kimi] C=1: 99999.0 tok/s``."""
    first, *rest = printable(scrub_text(text), None, lines=True).replace("\t", "    ").split("\n")
    return "\n".join([first, *("  " + line for line in rest)])


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
        reporter.write_line(shown(text), **markup)

    return _uncaptured(config, write)


def progress_printer(config: pytest.Config, label: str) -> ProgressPrinter | None:
    """Live lines of a measurement: updating in place on a TTY, plain lines in CI logs."""
    from pytest_kimi.report.progress import ProgressPrinter

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.get_verbosity() < -1:
        return None

    def line(text: str) -> None:
        say(config, text)

    def rewrite(text: str) -> None:
        _uncaptured(config, lambda r: r.rewrite(printable(scrub_text(text), None), erase=True))

    line(f"[kimi] measuring {label}")
    return ProgressPrinter(line, rewrite if reporter.isatty else None, prefix="[kimi] ")
