"""An aiohttp app served on a free port of 127.0.0.1 from a thread of its own, for the tests'
hostile servers: started and stopped around a ``with`` block, its loop apart from the test's.

One copy of the lifecycle (:class:`ThreadedApp`) for every hostile server
(``support/hostile.py``, ``support/hostile_discovery.py``): each says only what it serves.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Self

from aiohttp import web


class ThreadedApp:
    """Lifecycle mixin: the subclass (a dataclass) has ``port``, ``_loop``, ``_thread`` and
    ``_runner`` fields and builds its app in :meth:`_app`; :attr:`thread_name` names it."""

    port: int
    _loop: asyncio.AbstractEventLoop | None
    _thread: threading.Thread | None
    _runner: web.AppRunner | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def thread_name(self) -> str:
        return type(self).__name__

    def _app(self) -> web.Application:
        raise NotImplementedError

    def start(self) -> Self:
        started = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            runner = web.AppRunner(
                self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
            )
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.base_events.Server)
            self.port = server.sockets[0].getsockname()[1]
            self._runner = runner

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(serve())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not started.wait(60) or failure:
            raise RuntimeError(f"{self.thread_name} did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(60)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
