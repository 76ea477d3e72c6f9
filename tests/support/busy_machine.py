"""Inner pytest sessions that the machine, not the code, voided are run again.

The plugin's own tests drive sessions whose trials last a fraction of a wall second (the
simulator runs 50x faster than EP8), so on a CI machine whose two cores are shared, a client
stall of 30 ms at a window edge can void a level a test needed, whatever the code does.  The
plugin says so in words (:data:`MACHINE_VOIDED`); only such a session is run again.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

MACHINE_VOIDED = "give the client a quieter core"
"""The end of the plugin's one verdict about the machine rather than the code: a level voided
because the load client's event loop waited for a CPU at an edge of its window long enough to
move tok/s by more than 2% (``measure.metrics``; its ``transient`` reasons)."""

INNER_ADDOPTS = "-p no:hypothesispytest"
"""What every pytest session a test starts (``pytester``'s, or ``python -m pytest`` in a
subprocess) is given through ``PYTEST_ADDOPTS`` (tests/conftest.py): no Hypothesis plugin.  Its
terminal summary imports all of Hypothesis in every session, 0.7 s of CPU, a third of what a
subprocess session costs to start on a 2-core machine; no inner session has a Hypothesis test."""

SESSION_ATTEMPTS = 3
"""How often an inner session voided by the machine is run (from the same files) before its
result stands."""

ENGINE_SESSION_ATTEMPTS = 5
"""The same for sessions against a real engine (tests/engine): their trials are a few seconds
of a server that shares the client's two cores, and a CI machine whose host takes those cores
for a minute (stalls of 1-2 s were seen) voids several attempts in a row."""


def rerun_when_the_machine_voided(
    pytester: pytest.Pytester,
    run: Callable[..., pytest.RunResult],
    busy: list[bool],
    attempts: int = SESSION_ATTEMPTS,
) -> Callable[..., pytest.RunResult]:
    """``run`` (a ``runpytest*``), again while the session it ran failed with a level voided by
    the machine (:data:`MACHINE_VOIDED` in its output), each time from a copy of the directory
    taken before the first attempt (baselines, history and reports as the test left them); any
    other failure is returned at once.  ``busy`` is shared by the wrapped methods: ``runpytest``
    calls ``runpytest_inprocess``, and only the outer call repeats."""

    @functools.wraps(run)
    def attempt(*args: Any, **kwargs: Any) -> pytest.RunResult:
        if busy[0]:
            return run(*args, **kwargs)
        busy[0] = True
        before = Path(str(pytester.path) + ".before-run")
        try:
            for n in range(1, attempts + 1):
                shutil.rmtree(before, ignore_errors=True)
                shutil.copytree(pytester.path, before, symlinks=True)
                result = run(*args, **kwargs)
                voided = result.ret != 0 and any(
                    MACHINE_VOIDED in line for line in (*result.outlines, *result.errlines)
                )
                if not voided or n == attempts:
                    return result
                print(f"[tests] attempt {n} voided by the machine (a client stall); again")
                for child in pytester.path.iterdir():  # the directory stays: it is the cwd
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
                shutil.copytree(before, pytester.path, symlinks=True, dirs_exist_ok=True)
            raise AssertionError("unreachable")
        finally:
            shutil.rmtree(before, ignore_errors=True)
            busy[0] = False

    return attempt
