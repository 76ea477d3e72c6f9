"""A load client past one core: :class:`ShardedClient` runs a trial over N worker processes.

Why processes: one :class:`~pytest_kimi.load.runner.LoadClient` is one event loop on one
core, and it saturates at a few hundred thousand streamed tokens/s
(``docs/evidence/client.md``).
Threads would share the GIL, so the only way past one core is more interpreters.

How a trial runs (the parent is whatever loop enters ``async with ShardedClient(n)``):

1. The trial is *sharded*: closed-loop concurrency C is split as evenly as possible (C=5
   over 2 -> 3 + 2; a worker with 0 slots gets nothing), requests in proportion to each
   worker's slots, and every request keeps a globally unique index and the body that index
   would have had with one client.  An open-loop schedule is computed once in the parent and
   dealt round-robin (arrival ``j`` -> worker ``j % n``), so the union is exactly the arrival
   process a single client would send for that plan and seed.
2. Every worker prepares (and runs its share of the warm-up), says ``ready``; the parent then
   sends one ``start_at = perf_counter() + margin`` to all.  ``time.perf_counter`` is
   ``CLOCK_MONOTONIC`` on Linux (``mach_absolute_time`` on macOS, QPC on Windows): one clock
   for every process of the machine, so one instant means the same in all workers.  The
   client checks that assumption when it starts (:meth:`ShardedClient.check_clocks`).
3. Workers send small ``live`` snapshots every ``live_interval_s`` while the trial runs (only
   when the caller passed a ``LiveTrial``) and their whole :class:`TrialRecords` at the end
   (records pickle with their timestamp arrays; ~12 bytes per read block).
4. The parent merges: records sorted by global index, ``worker`` made unique (closed loop:
   worker k's slot j becomes ``first_slot(k) + j``, so slots are ``0..C-1``; open loop: the
   arrival index, as with one client), started = min, ended = max, loop lag = worst worker,
   CPU = sum, ``stopped_early`` = first worker's reason.  ``shards`` keeps the per-process
   detail.

Worker processes are started once per client and live until :meth:`ShardedClient.aclose`.
Each is a fresh interpreter (``python -c`` via ``subprocess``: fork+exec, i.e. the ``spawn``
semantics; plain ``fork`` would copy the parent's threads' locks mid-use) talking pickles
over a socketpair wrapped in :class:`multiprocessing.connection.Connection`.  Not
``multiprocessing.Process(spawn)`` itself: that re-runs the parent's ``__main__`` script in
every child, which breaks any script without an ``if __name__ == "__main__"`` guard.
Workers are reaped by :meth:`ShardedClient.aclose`, by an ``atexit`` hook, and on Linux by
``PR_SET_PDEATHSIG`` when the parent dies; they ignore SIGINT (the parent decides what
Ctrl-C means and cancels them) and also exit when their command pipe reads EOF.  A worker
that dies makes the current and every later call raise :class:`WorkerError` naming it, its
pid and its exit status.

This module is the parent's side; the split and the merge (1, 4) are
:mod:`pytest_kimi.load.sharding`, the worker's side :mod:`pytest_kimi.load.worker_process`.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from time import perf_counter
from typing import Any, Collection, Sequence

from pytest_kimi.load.openloop import OpenLoopPlan
from pytest_kimi.load.request import Target
from pytest_kimi.load.sharding import Kind, Shard, merge, shard_closed, shard_open
from pytest_kimi.load.trial import LiveTrial, TrialPlan, TrialRecords

START_MARGIN_S = 0.05
"""Lead time of the agreed start: enough for every worker to receive ``go`` and wake up.
A worker that still starts late shows it in ``start_spread_s``."""
LIVE_INTERVAL_S = 0.25
"""Period of a worker's live snapshot: a progress display ticks about once a second."""
READY_TIMEOUT_S = 120.0
"""How long a freshly spawned worker may take to import and say hello (slow CI machines)."""
ANSWER_TIMEOUT_S = 10.0
"""How long a worker may take to answer a cancel or an exit before it is killed."""

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""Directory holding ``pytest_kimi``: put first on the workers' PYTHONPATH so they import
the very code the parent runs, installed or not."""


class WorkerError(RuntimeError):
    """A load worker process died, raised, or stopped answering."""


@dataclass(slots=True)
class ClockSample:
    """One clock comparison: the worker read ``worker_t`` between ``before`` and ``after``."""

    worker: int
    pid: int
    before: float
    worker_t: float
    after: float

    @property
    def agrees(self) -> bool:
        return self.before <= self.worker_t <= self.after


class _Worker:
    """The parent's handle on one worker process: its pipe, its inbox, its state."""

    def __init__(self, k: int, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        self.k = k
        self.proc = proc
        self.conn = conn
        self.pid: int = proc.pid
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.busy = False
        """Between ``prepare`` and its one terminal message."""
        self.dead = False
        self.loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_reader(self.conn.fileno(), self._readable)

    def detach(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.remove_reader(self.conn.fileno())
            except (ValueError, OSError, RuntimeError):
                pass
        self.loop = None

    def _readable(self) -> None:
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.detach()
            self.dead = True
            self.inbox.put_nowait(("dead",))
            return
        except Exception as exc:  # noqa: BLE001 - an unpicklable answer is a bug, not a hang
            msg = ("error", f"cannot read the worker's message: {type(exc).__name__}: {exc}")
        self.inbox.put_nowait(msg)

    def send(self, msg: tuple[Any, ...]) -> None:
        if self.dead:
            return
        try:
            self.conn.send(msg)
        except (OSError, EOFError):
            self.dead = True

    def name(self) -> str:
        return f"load worker {self.k} (pid {self.pid})"

    async def death(self) -> str:
        """Why the process is gone, waiting briefly for its exit status."""
        for _ in range(100):
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.01)
        code = self.proc.returncode
        if code is None:
            how = "closed its pipe but is still running"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"{self.name()} {how}"

    async def expect(self, op: str, live: _LiveMerge | None = None) -> tuple[Any, ...]:
        """The next message ``op``; live snapshots are folded in on the way."""
        while True:
            msg = await self.inbox.get()
            kind = msg[0]
            if kind == op:
                if op in ("result", "cancelled"):
                    self.busy = False
                return msg
            if kind == "live":
                if live is not None:
                    live.update(self.k, msg)
                continue
            if kind == "dead":
                self.inbox.put_nowait(msg)  # stays dead for every later caller
                raise WorkerError(await self.death())
            if kind == "error":
                self.busy = False
                raise WorkerError(f"{self.name()} failed:\n{msg[1]}")
            if kind in ("result", "cancelled"):
                self.busy = False  # a late answer to a cancelled trial: skip it
            # anything else (ready after a cancel, stray pong) is stale: skip

    async def settle(self) -> None:
        """Consume messages until the current trial's one terminal answer (or death)."""
        while self.busy and not self.dead:
            msg = await self.inbox.get()
            if msg[0] in ("result", "cancelled", "error"):
                self.busy = False
            elif msg[0] == "dead":
                self.inbox.put_nowait(msg)
                return


class _LiveMerge:
    """Sums the workers' latest live snapshots into the caller's :class:`LiveTrial`."""

    def __init__(self, live: LiveTrial) -> None:
        self.live = live
        self.snaps: dict[int, tuple[int, int, int, int]] = {}

    def update(self, k: int, msg: tuple[Any, ...]) -> None:
        self.snaps[k] = (msg[1], msg[2], msg[3], msg[4])
        snaps = self.snaps.values()
        self.live.done = sum(s[0] for s in snaps)
        self.live.failed = sum(s[1] for s in snaps)
        self.live.tokens = sum(s[2] for s in snaps)
        self.live.remote_inflight_tokens = sum(s[3] for s in snaps)


class ShardedClient:
    """N load-worker processes behind :class:`LoadClient`'s interface.

    Use as ``async with ShardedClient(2) as client: await client.run_trial(target, plan)``
    (or ``run_open_loop``).  Processes start on entry and stay until exit; the client binds
    to the event loop that enters it.  ``cpus``: optional CPU sets, worker ``k`` pinned to
    ``cpus[k % len(cpus)]``.  One trial at a time.

    ``live``: the parent's ``LiveTrial`` gets ``started`` at the agreed start, ``done``,
    ``failed``, ``tokens`` and ``remote_inflight_tokens`` (``approx_tokens()`` includes it)
    from the workers' snapshots every ``live_interval_s``, and exact totals from the records
    at the end; ``inflight`` stays empty (the records in flight live in the workers).
    """

    def __init__(
        self,
        workers: int,
        *,
        cpus: Sequence[Collection[int]] | None = None,
        start_margin_s: float = START_MARGIN_S,
        live_interval_s: float = LIVE_INTERVAL_S,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.cpus = list(cpus) if cpus else None
        self.start_margin_s = start_margin_s
        self.live_interval_s = live_interval_s
        self.ready_timeout_s = ready_timeout_s
        self.clock_samples: list[ClockSample] = []
        self._w: list[_Worker] = []
        self._lock: asyncio.Lock | None = None
        self._broken: str | None = None

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._w]

    # ---------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> ShardedClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Spawn the workers, wait for each to say hello, and check the shared clock."""
        if self._w:
            return
        loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        atexit.register(self.close_now)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(_PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        code = "from pytest_kimi.load.worker_process import worker_entry; worker_entry()"
        try:
            for k in range(self.workers):
                mine, theirs = socket.socketpair()
                cpus = (
                    ",".join(str(c) for c in sorted(self.cpus[k % len(self.cpus)]))
                    if self.cpus
                    else ""
                )
                try:
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            code,
                            str(theirs.fileno()),
                            str(k),
                            cpus,
                            str(os.getpid()),
                        ],
                        pass_fds=(theirs.fileno(),),
                        stdin=subprocess.DEVNULL,
                        env=env,
                        close_fds=True,
                    )
                finally:
                    theirs.close()  # only the worker holds its end: its death reads as EOF here
                w = _Worker(k, proc, Connection(mine.detach()))
                w.attach(loop)
                self._w.append(w)
            for w in self._w:
                try:
                    await asyncio.wait_for(w.expect("hello"), self.ready_timeout_s)
                except asyncio.TimeoutError:
                    raise WorkerError(
                        f"{w.name()} did not start within {self.ready_timeout_s:g} s"
                    ) from None
            await self.check_clocks()
        except BaseException:
            await self.aclose()
            raise

    async def check_clocks(self) -> list[ClockSample]:
        """Compare each worker's ``perf_counter`` with the parent's; raise if one disagrees.

        A worker's reading must fall between the parent's readings just before the ping and
        just after the pong: that holds only if all processes read one clock.
        """
        samples = []
        for w in self._w:
            before = perf_counter()
            w.send(("ping",))
            msg = await asyncio.wait_for(w.expect("pong"), ANSWER_TIMEOUT_S)
            samples.append(ClockSample(w.k, w.pid, before, msg[1], perf_counter()))
        self.clock_samples = samples
        bad = [s for s in samples if not s.agrees]
        if bad:
            s = bad[0]
            raise WorkerError(
                f"load worker {s.worker} reads perf_counter() = {s.worker_t:.6f} outside the parent's "
                f"[{s.before:.6f}, {s.after:.6f}]: processes do not share one monotonic clock here, "
                "so a sharded trial cannot agree on a start instant"
            )
        return samples

    async def aclose(self) -> None:
        """Ask every worker to exit, then terminate/kill stragglers and reap them all."""
        workers, self._w = self._w, []
        for w in workers:
            w.send(("exit",))
        deadline = perf_counter() + ANSWER_TIMEOUT_S / 2
        while perf_counter() < deadline and any(w.proc.poll() is None for w in workers):
            await asyncio.sleep(0.01)
        for w in workers:
            w.detach()
        _reap(workers)
        try:
            atexit.unregister(self.close_now)
        except Exception:  # noqa: BLE001
            pass

    def close_now(self) -> None:
        """Blocking close for ``atexit`` and signal paths: no event loop needed."""
        workers, self._w = self._w, []
        for w in workers:
            w.send(("exit",))
        for w in workers:
            try:
                w.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        _reap(workers)

    # ---------------------------------------------------------------- trials
    async def run_trial(
        self, target: Target, plan: TrialPlan, live: LiveTrial | None = None
    ) -> TrialRecords:
        """Closed-loop trial over the workers; same contract as :meth:`LoadClient.run_trial`."""
        return await self._run("closed", plan, shard_closed(target, plan, self.workers), live)

    async def run_open_loop(
        self, target: Target, plan: OpenLoopPlan, live: LiveTrial | None = None
    ) -> TrialRecords:
        """Open-loop trial over the workers; same contract as :meth:`LoadClient.run_open_loop`."""
        return await self._run("open", plan, shard_open(target, plan, self.workers), live)

    def _usable(self) -> None:
        if self._broken is not None:
            raise WorkerError(f"ShardedClient is unusable: {self._broken}")
        if not self._w or self._lock is None:
            raise RuntimeError(
                "ShardedClient is not open: use 'async with ShardedClient(n) as client'"
            )

    async def _run(
        self,
        kind: Kind,
        plan: TrialPlan | OpenLoopPlan,
        shards: list[Shard],
        live: LiveTrial | None,
    ) -> TrialRecords:
        self._usable()
        assert self._lock is not None
        async with self._lock:
            merge_live = _LiveMerge(live) if live is not None else None
            ws = [self._w[s.worker] for s in shards]
            tasks: list[asyncio.Task[tuple[Any, ...]]] = []
            try:
                for w, s in zip(ws, shards):
                    w.busy = True
                    w.send(("prepare", s.job))
                await _all([w.expect("ready") for w in ws])
                start_at = perf_counter() + self.start_margin_s
                if live is not None:
                    live.started = start_at
                for w in ws:
                    w.send(("go", start_at, self.live_interval_s if live is not None else 0.0))
                tasks = [asyncio.ensure_future(w.expect("result", merge_live)) for w in ws]
                answers = await _all(tasks)
            except BaseException as exc:
                await self._abort(ws)
                if isinstance(exc, WorkerError) and any(w.dead for w in ws):
                    # a worker that raised is still in step and usable; a dead one is not
                    self._broken = self._broken or str(exc).splitlines()[0]
                raise
        merged = merge(kind, plan, [(s, w.pid, msg[1]) for s, w, msg in zip(shards, ws, answers)])
        if live is not None:
            live.done = len(merged.records)
            live.failed = sum(r.error is not None for r in merged.records)
            live.tokens = sum(r.completion_tokens for r in merged.records)
            live.remote_inflight_tokens = 0
        return merged

    async def _abort(self, ws: list[_Worker]) -> None:
        """Stop the workers' current trial and consume their answers, so that the next trial
        starts from a clean protocol state; a worker that does not answer is killed."""
        for w in ws:
            if w.busy:
                w.send(("cancel",))
        for w in ws:
            if not w.busy or w.dead:
                continue
            try:
                await asyncio.wait_for(w.settle(), ANSWER_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._broken = self._broken or f"{w.name()} did not stop its trial"
                if w.proc.poll() is None:
                    w.proc.kill()


async def _all(aws: Sequence[Any]) -> list[Any]:
    """Await all; on the first failure cancel the rest and raise it (gather does not cancel)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _reap(workers: Sequence[_Worker]) -> None:
    """Terminate, then kill, whatever is still running, and wait for every pid."""
    for w in workers:
        for stop in (w.proc.terminate, w.proc.kill):
            if w.proc.poll() is not None:
                break
            try:
                stop()
                w.proc.wait(2.0)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            w.conn.close()
        except OSError:
            pass
