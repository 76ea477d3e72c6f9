"""A dedicated event loop in a background thread, for the whole pytest session.

Why a thread of its own: the load client must keep one ``aiohttp.ClientSession`` (one
connection pool) across every test of the session, and must never share its loop with the
code under test; a ``async def`` test running on pytest-asyncio's loop submits its sweeps here
and awaits the result.  While a measurement runs, pytest's main thread only waits, so the
client has the interpreter to itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

SETTLE_S = 5.0
"""How long an interrupted :meth:`LoopThread.run` waits for its coroutine to stop: its
``finally`` blocks cancel streams and close connections, which takes milliseconds."""


class LoopThread:
    """Runs coroutines on a private loop; ``run`` blocks, ``submit`` returns a future."""

    def __init__(self, name: str = "pytest-kimi-load") -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run to completion; Ctrl-C in the main thread cancels the coroutine, waits until it
        has stopped (at most :data:`SETTLE_S`), then re-raises.

        The wait is what makes a partial result final: cancelling the thread-safe future
        returns at once, while the coroutine still runs on this loop until the cancellation
        reaches its next ``await``.  Without it the caller read a sweep's partial result while
        a level that had just printed its figures was still being appended, and reported it
        as never measured (and requests went on being sent while the reports were written).
        """
        started = threading.Event()
        settled = threading.Event()

        async def settling() -> T:
            started.set()
            try:
                return await coro
            finally:
                settled.set()

        fut = self.submit(settling())
        try:
            return fut.result()
        except KeyboardInterrupt:
            fut.cancel()

            def never_started() -> None:
                # queued after the cancellation: a coroutine not started by now never will be
                # (its task is cancelled before its first step), so there is nothing to wait for
                if not started.is_set():
                    coro.close()
                    settled.set()

            self._loop.call_soon_threadsafe(never_started)
            settled.wait(SETTLE_S)
            raise

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await from another loop (pytest-asyncio tests): the work still runs on this loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def _drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.submit(_drain()).result(timeout=10)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
