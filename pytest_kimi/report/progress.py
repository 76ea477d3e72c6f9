"""Live progress of a sweep: one updating line per level on a terminal, plain lines in CI logs.

A 15-minute sweep must never look hung, and a CI log must not fill with carriage returns, so
the same events are rendered two ways.  Writing is left to a callable (pytest's terminal
reporter in the plugin); this module only decides what to say and when.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pytest_kimi.measure.trials import Progress

PLAIN_HEARTBEAT_S = 30.0
"""Without a terminal, a tick is printed at most this often; trial and level ends always."""


def format_progress(p: Progress) -> str:
    total = "?" if p.total is None else str(p.total)
    if p.kind == "level":
        rate = "-" if p.tok_s is None else f"{p.tok_s:,.1f}"
        return (
            f"{p.label}: {rate} tok/s (median of {p.trials} trials), {p.done} requests, "
            f"{p.failed} failed, {p.elapsed_s:.1f} s"
        )
    rate = "-" if p.tok_s is None else f"{'~' if p.kind == 'tick' else ''}{p.tok_s:,.1f}"
    # a stationary trial is a time box, not a number of requests: just the count so far
    done = f"{p.done} requests" if p.total is None else f"{p.done}/{total} requests"
    return (
        f"{p.label} trial {p.trial}/{p.trials}: {done}, "
        f"{rate} tok/s, {p.failed} errors, {p.elapsed_s:.1f} s"
    )


@dataclass
class ProgressPrinter:
    """Turns progress events into terminal output.

    ``rewrite(line)`` replaces the current line (a TTY); ``line(text)`` prints a whole line.
    """

    line: Callable[[str], None]
    rewrite: Callable[[str], None] | None
    prefix: str = ""
    _last_plain: float = field(default=-PLAIN_HEARTBEAT_S, repr=False)

    def __call__(self, p: Progress) -> None:
        text = self.prefix + format_progress(p)
        if self.rewrite is not None:
            if p.kind == "level":
                self.rewrite(text)
                self.line("")
            else:
                self.rewrite(text)
            return
        if p.kind == "tick" and p.elapsed_s - self._last_plain < PLAIN_HEARTBEAT_S:
            return
        self._last_plain = p.elapsed_s if p.kind == "tick" else self._last_plain
        self.line(text)
