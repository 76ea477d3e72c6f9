"""SIGTERM handled like Ctrl-C; a second signal stops at once but still reaps the servers.

Python's default SIGTERM ends the process on the spot: no teardown, no report, and (without
the supervisor) the server keeps the GPUs.  ``timeout``, a CI runner cancelling a job and a
container stop all send SIGTERM.  So while :class:`Interrupts` is installed:

* the **first** SIGTERM or SIGINT raises KeyboardInterrupt in the main thread, exactly what
  Ctrl-C does: the measurement in progress is cancelled (``loop_thread.LoopThread.run``),
  the test runner finishes its session (reports are written, the exit status is
  "interrupted"), and every server is stopped the graceful way;
* a **second** one kills every supervised server group at once (SIGKILL through its
  supervisor), waits a few seconds for them to be gone, and exits with 128 + the signal.

No pytest here: the plugin installs it in ``pytest_configure`` and restores the previous
handlers in ``pytest_unconfigure``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from pytest_kimi.server import supervisor

__all__ = ["Interrupts"]


class Interrupts:
    """Install with :meth:`install` (main thread only), undo with :meth:`restore`."""

    def __init__(self, kill_wait_s: float = 5.0, say: Callable[[str], None] | None = None) -> None:
        self.kill_wait_s = kill_wait_s
        self.say = say or _to_stderr
        """Where the one-line notices go (the plugin passes its terminal writer)."""
        self.count = 0
        self.first: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> bool:
        """Take over SIGTERM (when it has its default action) and SIGINT (when it raises
        KeyboardInterrupt, Python's default); False when not in the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig, ours_if in (
            (signal.SIGTERM, signal.SIG_DFL),
            (signal.SIGINT, signal.default_int_handler),
        ):
            current = signal.getsignal(sig)
            if current is ours_if:
                self._previous[sig] = current
                signal.signal(sig, self._handle)
        return bool(self._previous)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.first = signum
            if signum == signal.SIGTERM:
                self._say(
                    "pytest-kimi: SIGTERM: stopping like Ctrl-C (measurements stop, "
                    "servers are shut down, reports are written); send it again to "
                    "stop at once"
                )
            raise KeyboardInterrupt
        self.hard_stop(signum)

    def hard_stop(self, signum: int) -> None:
        """SIGKILL every supervised server of this process, then exit."""
        self._say(
            f"pytest-kimi: {signal.Signals(signum).name} again: killing the servers and exiting now"
        )
        try:
            supervisor.kill_all(self.kill_wait_s)
        finally:
            try:
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
            os._exit(128 + signum)

    def _say(self, text: str) -> None:
        try:
            self.say(text)
        except Exception:  # noqa: BLE001 - a notice must never stop the stop
            _to_stderr(text)


def _to_stderr(text: str) -> None:
    try:
        sys.stderr.write(f"\n{text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
