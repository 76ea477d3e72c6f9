"""An in-process pytest session (``pytester.runpytest``) that cannot hang the suite.

Most of the suite's inner sessions run in the test's own process: a subprocess session pays
the interpreter's start and the plugin's imports (numpy, aiohttp, SQLAlchemy) before it
measures anything, and the suite runs a few hundred sessions (compare a file's time in
``pytest --durations=0`` with its sessions in process and in subprocesses).  A subprocess could
be given a timeout; an in-process session
is given the same bound here: past it, every thread's stack is printed and the session is
interrupted as a Ctrl-C would (the plugin reaps what it started), so a session that hangs
fails its test with the stacks instead of holding the suite.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import sys
import threading
from typing import Any, Callable

import pytest

from support.timing import SESSION_S


def bounded_inprocess(
    run: Callable[..., pytest.RunResult], default_s: float = SESSION_S
) -> Callable[..., pytest.RunResult]:
    """``run`` (``pytester.runpytest_inprocess``), interrupted after ``timeout`` seconds
    (``default_s`` when the call gives none: :data:`SESSION_S`, the bound a subprocess session
    gets, or the real-engine suites' longer one)."""

    @functools.wraps(run)
    def session(*args: Any, timeout: float = default_s, **kwargs: Any) -> pytest.RunResult:
        fired = threading.Event()

        def interrupt() -> None:
            fired.set()
            sys.stderr.write(f"\n[tests] in-process session still running after {timeout} s:\n")
            faulthandler.dump_traceback(all_threads=True)
            # a real signal, not _thread.interrupt_main(): it wakes a main thread blocked in a
            # lock or a select, where the plugin's own SIGINT handling then ends the session
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

        timer = threading.Timer(timeout, interrupt)
        timer.daemon = True
        timer.start()
        try:
            # an interrupted session returns its result (exit code 2) instead of raising
            # KeyboardInterrupt into this test's session
            result = run(*args, **{"no_reraise_ctrlc": True, **kwargs})
        finally:
            timer.cancel()
        if fired.is_set():
            pytest.fail(
                f"the in-process session did not end within {timeout} s (pid {os.getpid()})"
            )
        return result

    return session
