"""Waiting and timing helpers for tests that must hold on a busy machine.

CI shares two cores with other work, so a test never sleeps a fixed time hoping that something
has happened by then (it polls for it, with a generous deadline), and never holds a measured
time to a fixed bound: it bounds it by what it measured alongside, here the event loop's lag.
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import time
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")

DEADLINE_S = 60.0
"""How long a poll waits before it fails: far beyond what any condition needs on a busy
machine, so that only a condition that never comes true reaches it."""

SESSION_S = 300.0
"""How long a whole pytest session run in a subprocess may take before the test gives up on it
(a session against the simulator takes seconds; this only stops one that hangs)."""

ENGINE_SESSION_S = 2400.0
"""The bound of a whole session in the real-engine suites (``tests/engine``, ``tests/sglang``):
their sessions launch real servers, each allowed its profile's startup timeout (180 s for
SGLang's, 300 s for vLLM's), up to eight launches a session (the paired gate with its culprit
search), each warmed and measured on two shared cores.  Like :data:`SESSION_S`, it only stops
a session that hangs."""

POLL_S = 0.02


def poll_until(
    what: Callable[[], T], label: str, timeout_s: float = DEADLINE_S, every_s: float = POLL_S
) -> T:
    """Call ``what`` until it returns something truthy, and return that; fail naming ``label``
    when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{label}: not so after {timeout_s:g} s (last: {got!r})")
        time.sleep(every_s)


async def apoll_until(
    what: Callable[[], T | Awaitable[T]],
    label: str,
    timeout_s: float = DEADLINE_S,
    every_s: float = POLL_S,
) -> T:
    """:func:`poll_until` inside an event loop (``what`` may be a coroutine function)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if asyncio.iscoroutine(got) or isinstance(got, asyncio.Future):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"{label}: not so after {timeout_s:g} s (last: {got!r})")
        await asyncio.sleep(every_s)


TIMER_SLACK_S = 0.002
"""What a wake-up of the event loop adds on an idle machine: epoll rounds its timeout up to a
whole millisecond, and a woken task runs one loop iteration later."""


class LoopLag:
    """Watches the running event loop while the ``async with`` body runs: how long it could not
    run a callback that was due (busy, or the process had no CPU), as the lag monitor of the
    load client does.  A time measured in the same loop is then bounded by its nominal value
    plus :attr:`total_s` plus :meth:`slack_s`, whatever the machine was doing meanwhile."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.max_s = 0.0
        """The longest single overshoot of the watcher's sleep."""
        self.total_s = 0.0
        """All overshoots together: the time the loop was held up in all."""
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            over = loop.time() - t0 - self.interval_s
            if over > 0:
                self.total_s += over
                self.max_s = max(self.max_s, over)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.ensure_future(self._watch())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    def slack_s(self) -> float:
        """The most one wait in this loop can be late: the longest hold-up, one watcher
        interval (a hold-up that began while the watcher slept shows shorter by up to that),
        and the timer's own slack."""
        return self.max_s + self.interval_s + TIMER_SLACK_S

    def total_slack_s(self) -> float:
        """The most a stretch of several waits in this loop can be late, all hold-ups counted."""
        return self.total_s + self.interval_s + TIMER_SLACK_S


def send_late_bound_s(loop_lag_max_s: float, lag_interval_s: float) -> float:
    """The most a request may leave after it was due, from the load client's own lag monitor
    (``loop_lag_max_s``, sampled every ``lag_interval_s``): a late send is a loop that was held
    up when the send was due, and a hold-up shows in the monitor shortened by at most one of
    its intervals."""
    return loop_lag_max_s + lag_interval_s + TIMER_SLACK_S


def read_until(proc: subprocess.Popen[str], text: str, timeout_s: float = SESSION_S) -> str:
    """What ``proc`` printed up to and including ``text`` (select-paced reads: a deadline
    that can fire while the process prints nothing); fails with the output's tail when
    ``proc`` ends or ``timeout_s`` passes first.  ``proc.stdout`` must be a pipe."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in got:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, got.decode(errors="replace")[-2000:]
        if select.select([fd], [], [], min(left, 1.0))[0]:
            got += os.read(fd, 65536)
    return got.decode(errors="replace")
