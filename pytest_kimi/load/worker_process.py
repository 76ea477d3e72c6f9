"""The load worker's side: what runs inside each child interpreter of a ShardedClient.

Stands on its own because it is the child's program, not the parent's: started by
``python -c "...worker_entry()"``, it serves the parent's commands over its pipe with one
:class:`~pytest_kimi.load.runner.LoadClient`, and imports none of the parent's process
handling (:mod:`pytest_kimi.load.workers` has the protocol and the parent side).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from time import perf_counter
from typing import Any

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.runner import LoadClient
from pytest_kimi.load.sharding import Job
from pytest_kimi.load.trial import LiveTrial, TrialPlan


def worker_entry() -> None:
    """Entry point of a worker process (``python -c``): ``argv = [fd, index, cpus, parent_pid]``.

    Serves commands from the connection on ``fd`` until told to exit or until the parent
    goes away.
    """
    fd, k, cpus_arg, parent = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent(parent)
    if cpus_arg and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus_arg.split(",")})
        except OSError:
            pass
    conn = Connection(fd)
    try:
        asyncio.run(_serve(k, conn))
    finally:
        conn.close()


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel SIGKILL us when the parent dies (even by SIGKILL, when no
    ``atexit`` runs).  The pipe's EOF covers the rest, a little later."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _send(conn: Connection, msg: tuple[Any, ...]) -> None:
    try:
        conn.send(msg)
    except (OSError, EOFError):
        pass  # the parent is gone; the reader sees EOF and the worker exits


async def _serve(k: int, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    fd = conn.fileno()

    def readable() -> None:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            loop.remove_reader(fd)
            inbox.put_nowait(("exit",))
            return
        inbox.put_nowait(msg)

    loop.add_reader(fd, readable)
    task: asyncio.Task[None] | None = None
    go: asyncio.Future[tuple[float, float]] | None = None
    try:
        async with LoadClient() as client:
            _send(conn, ("hello", os.getpid(), perf_counter()))
            while True:
                msg = await inbox.get()
                op = msg[0]
                if op == "ping":
                    _send(conn, ("pong", perf_counter()))
                elif op == "prepare":
                    go = loop.create_future()
                    task = loop.create_task(_trial(client, conn, msg[1], go))
                elif op == "go":
                    if go is not None and not go.done():
                        go.set_result((msg[1], msg[2]))
                elif op == "cancel":
                    if task is not None and not task.done():
                        task.cancel()
                elif op == "exit":
                    break
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        try:
            loop.remove_reader(fd)
        except (ValueError, OSError):
            pass


async def _report(conn: Connection, live: LiveTrial, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        _send(
            conn,
            (
                "live",
                live.done,
                live.failed,
                live.tokens,
                sum(len(r.chunk_times) for r in list(live.inflight.values())),
            ),
        )


async def _trial(
    client: LoadClient, conn: Connection, job: Job, go: asyncio.Future[tuple[float, float]]
) -> None:
    """Prepare, wait for the agreed start, run, send back exactly one terminal message."""
    try:
        warm: list[RequestRecord] = []
        plan = job.plan
        if isinstance(plan, TrialPlan) and plan.warmup > 0:
            warm = await client.warm_up(job.target, plan)
        _send(conn, ("ready",))
        start_at, live_interval = await go
        live = LiveTrial(total=None) if live_interval > 0 else None
        reporter = (
            asyncio.ensure_future(_report(conn, live, live_interval)) if live is not None else None
        )
        try:
            if isinstance(plan, TrialPlan):
                tr = await client.measure_closed(
                    job.target, plan, live, warm=warm, start_at=start_at
                )
            else:
                tr = await client.measure_open(
                    job.target,
                    plan,
                    live,
                    offsets=job.offsets,
                    indices=job.indices,
                    start_at=start_at,
                )
        finally:
            if reporter is not None:
                reporter.cancel()
        _send(conn, ("result", tr))
    except asyncio.CancelledError:
        _send(conn, ("cancelled",))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it there
        _send(conn, ("error", traceback.format_exc()))
