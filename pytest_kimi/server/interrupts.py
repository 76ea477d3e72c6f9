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

Once the tests are over (:meth:`Interrupts.finishing`, called as the reports are about to be
written), a signal stops nothing any more: the results are what they are, the reports say so,
and a KeyboardInterrupt raised in the middle of writing them, of stopping a managed server or of
printing the terminal summary only cost a report, a graceful stop or a 40-frame traceback with
exit status 130 under reports that said PASSED.  So a first signal then is noted in one line and
the run ends as it was going to, with the exit status its reports agree with; a second still
stops at once, exiting with that same status once the reports are written
(:meth:`Interrupts.settle`), with 128 + the signal before.

"Second" means a second *decision* to stop, not a second delivery: signals that arrive within
:data:`TOGETHER_S` of the first are one.  GNU ``timeout`` (without ``--foreground``) sends its
signal to pytest and then to pytest's whole process group, so pytest gets it twice within
microseconds, as from any supervisor that signals both a process and its group.  Taken as two,
the run exited at once without the reports the first signal promised.

No pytest here: the plugin installs it in ``pytest_configure`` and restores the previous
handlers in ``pytest_unconfigure``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from pytest_kimi.server import supervised

__all__ = ["TOGETHER_S", "Interrupts"]

TOGETHER_S = 0.5
"""Signals within this long of the first are the same stop, not a second one.

One program's double delivery (``timeout``: the child, then its group; a terminal: every
process of the group) comes within microseconds, and the main thread runs the handler for
both back to back (milliseconds even on a busy machine, where it may run late, but late for
both alike); a person who means "stop now" presses Ctrl-C again after reading the first
notice, seconds later, and a CI runner's SIGINT then SIGTERM (GitHub Actions: 7.5 s apart)
stays a second signal.  Measured from the first signal, not the latest, so a stream of
signals cannot postpone the hard stop for ever."""


class Interrupts:
    """Install with :meth:`install` (main thread only), undo with :meth:`restore`."""

    def __init__(self, kill_wait_s: float = 5.0, say: Callable[[str], None] | None = None) -> None:
        self.kill_wait_s = kill_wait_s
        self.say = say or _to_stderr
        """Where the one-line notices go (the plugin passes its terminal writer)."""
        self.count = 0
        """Signals taken as a decision to stop (echoes within :data:`TOGETHER_S` not counted)."""
        self.echoes = 0
        """Signals that arrived together with the first and were taken as the same one."""
        self.first: int | None = None
        self._first_at = 0.0
        self.together_s = TOGETHER_S
        self.late = False
        """The tests are over (:meth:`finishing`): a first signal is noted, not raised."""
        self.exit_code: int | None = None
        """The exit status the written reports agree with (:meth:`settle`): what a hard stop
        exits with from then on, unless a signal cut the tests short."""
        self.cut_tests = False
        """A first signal raised KeyboardInterrupt in the tests: the run was stopped by a
        signal, and a hard stop says so (128 + the signal) whatever the reports got to say."""
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

    def finishing(self) -> None:
        """The tests are over and the reports are about to be written: from now on a first
        signal is noted in one line instead of raising KeyboardInterrupt (which could only cut
        the reports, a server's graceful stop or the summary short, with a traceback); a
        second one still stops at once."""
        self.late = True

    def settle(self, exit_code: int) -> None:
        """The reports are written and say what ``exit_code`` says: a hard stop from now on
        exits with it, so the exit status never contradicts the reports."""
        self.late = True
        self.exit_code = exit_code

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.count and now - self._first_at < self.together_s:
            # the same stop delivered again (timeout's signal to the group, or a second
            # signal sent with the first): the first's KeyboardInterrupt is on its way
            self.echoes += 1
            return
        if not self.count:
            # time and signal first: a handler call nested in this one (a signal arriving
            # while this runs) must see the stop under way
            self._first_at = now
            self.first = signum
            self.count = 1
            if self.late:
                self._say(
                    f"pytest-kimi: {_name(signum)} after the tests ended: finishing the reports "
                    "and the summary, the exit status is the reports'; send it again to stop "
                    "at once"
                )
                return
            if signum == signal.SIGTERM:
                self._say(
                    "pytest-kimi: SIGTERM: stopping like Ctrl-C (measurements stop, "
                    "servers are shut down, reports are written); send it again to stop "
                    f"at once (signals within {self.together_s:g} s of this one are this one)"
                )
            self.cut_tests = True
            raise KeyboardInterrupt
        self.count += 1
        self.hard_stop(signum)

    def hard_stop(self, signum: int) -> None:
        """SIGKILL every supervised server of this process, then exit: with the status the
        written reports agree with (:meth:`settle`) when the tests had ended before the first
        signal, else 128 + ``signum`` (a run a signal stopped exits like one)."""
        agreed_code = None if self.cut_tests else self.exit_code
        code = agreed_code if agreed_code is not None else 128 + signum
        agreed = "" if agreed_code is None else f" with the reports' exit status {code}"
        self._say(
            f"pytest-kimi: {_name(signum)} again: killing the servers and exiting now{agreed}"
        )
        try:
            supervised.kill_all(self.kill_wait_s)
        finally:
            try:
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
            os._exit(code)

    def _say(self, text: str) -> None:
        try:
            self.say(text)
        except Exception:  # noqa: BLE001 - a notice must never stop the stop
            _to_stderr(text)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _to_stderr(text: str) -> None:
    try:
        sys.stderr.write(f"\n{text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
