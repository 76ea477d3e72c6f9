"""A load client past one core: :class:`ShardedClient` runs a trial over N worker processes.

Why processes: one :class:`~pytest_kimi.load.runner.LoadClient` is one event loop on one
core, and it saturates at a few hundred thousand streamed tokens/s (``docs/benchmarks.md``).
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
"""

from __future__ import annotations

from array import array

import asyncio
import atexit
import ctypes
import ctypes.util
import math
import os
import signal
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from time import perf_counter
from typing import Any, Collection, Literal, Sequence

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.openloop import OpenLoopPlan, deal
from pytest_kimi.load.request import Target
from pytest_kimi.load.runner import LoadClient
from pytest_kimi.load.trial import LiveTrial, ShardSummary, TrialPlan, TrialRecords
from pytest_kimi.load.trial_book import _p99, _start_spread, achieved_rate, peak_inflight

START_MARGIN_S = 0.05
"""Lead time of the agreed start: enough for every worker to receive ``go`` and wake up.
A worker that still starts late shows it in ``start_spread_s``."""
LIVE_INTERVAL_S = 0.25
"""Period of a worker's live snapshot: a progress display ticks about once a second."""
READY_TIMEOUT_S = 120.0
"""How long a freshly spawned worker may take to import and say hello (slow CI machines)."""
ANSWER_TIMEOUT_S = 10.0
"""How long a worker may take to answer a cancel or an exit before it is killed."""

Kind = Literal["closed", "open"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""Directory holding ``pytest_kimi``: put first on the workers' PYTHONPATH so they import
the very code the parent runs, installed or not."""


class WorkerError(RuntimeError):
    """A load worker process died, raised, or stopped answering."""


# ------------------------------------------------------------------------------ sharding
def split_even(total: int, parts: int) -> list[int]:
    """``total`` as evenly as possible over ``parts``, earlier parts taking the remainder."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    q, r = divmod(max(0, total), parts)
    return [q + (k < r) for k in range(parts)]


def split_proportional(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties to earlier parts).

    Why proportional for requests: in a closed loop a worker's throughput is proportional to
    its slots, so a worker with 3 slots and half the requests would still be busy after its
    2-slot sibling finished, and the trial's tail would run at the wrong concurrency.
    """
    wsum = sum(weights)
    if wsum <= 0:
        return [0 for _ in weights]
    exact = [total * w / wsum for w in weights]
    out = [math.floor(x) for x in exact]
    left = total - sum(out)
    order = sorted(range(len(weights)), key=lambda k: (-(exact[k] - out[k]), k))
    for k in order[:left]:
        out[k] += 1
    return out


def interleave(counts: Sequence[int], weights: Sequence[int]) -> list[list[int]]:
    """Global indices ``0..sum(counts)-1`` assigned to parts in the order they would be sent.

    Part ``k`` sends its ``i``-th request around ``(i + 0.5) / weights[k]`` (in units of one
    request duration); sorting all of them by that time gives each its global index.  With
    equal weights this is plain round-robin: part ``k``'s ``i``-th request is ``i * n + k``.
    """
    keyed = [((i + 0.5) / weights[k], k, i) for k in range(len(counts)) for i in range(counts[k])]
    keyed.sort()
    out: list[list[int]] = [[0] * c for c in counts]
    for g, (_, k, i) in enumerate(keyed):
        out[k][i] = g
    return out


@dataclass(slots=True)
class Job:
    """One worker's share of a trial, as sent to it."""

    kind: Kind
    target: Target
    plan: TrialPlan | OpenLoopPlan
    offsets: list[float] | None = None
    """Open loop: this worker's planned sends (seconds after the start)."""
    indices: list[int] | None = None
    """Open loop: the global arrival index of each of them."""


@dataclass(slots=True)
class Shard:
    """A job plus what the parent needs to map the worker's records back."""

    worker: int
    job: Job
    first_slot: int = 0
    table: list[int] | None = None
    """Closed loop with a request count: local request ``i`` is global index ``table[i]``."""
    stride: int = 1
    pos: int = 0
    """Closed loop without a count: local ``i`` is global ``i * stride + pos``."""
    warm_offset: int = 0

    def global_index(self, i: int) -> int:
        if self.job.kind == "open":
            return i
        if self.table is not None:
            return self.table[i]
        return i * self.stride + self.pos


def shard_closed(target: Target, plan: TrialPlan, n: int) -> list[Shard]:
    """Split a closed-loop plan over ``n`` workers (only those with something to do)."""
    bodies = list(plan.bodies)
    nb = len(bodies)
    conc = split_even(plan.concurrency, n)
    slots = [sum(conc[:k]) for k in range(n)]
    active = [k for k in range(n) if conc[k] > 0]
    weights = [conc[k] for k in active]
    reqs: list[int | None]
    tables: list[list[int] | None]
    if plan.requests is not None:
        counts = split_proportional(plan.requests, weights)
        tables = list(interleave(counts, weights))
        reqs = list(counts)
        keep = [j for j, c in enumerate(counts) if c > 0] or [0]
    else:
        reqs = [None] * len(active)
        tables = [None] * len(active)
        keep = list(range(len(active)))
    active = [active[j] for j in keep]
    weights = [weights[j] for j in keep]
    reqs = [reqs[j] for j in keep]
    tables = [tables[j] for j in keep]
    warm = split_proportional(plan.warmup, weights)
    total_w = sum(weights)
    shards: list[Shard] = []
    for pos, k in enumerate(active):
        c = conc[k]
        table = tables[pos]
        if table is not None:
            wbodies = [bodies[g % nb] for g in table] or bodies[:1]
        else:
            stride = len(active)
            # local i must use bodies[(i * stride + pos) % nb]; that repeats every nb requests
            wbodies = [bodies[(i * stride + pos) % nb] for i in range(nb)]
        mf = (
            None
            if plan.max_failures is None
            else max(1, math.ceil(plan.max_failures * c / total_w))
        )
        # unique prompt ids follow the global index: table[i], or i * stride + pos
        # stationary: each process opens its own streams' staggered first requests, and cuts
        # at its share of the token budget (the window ends before the earliest cut)
        first = slots[k], slots[k] + c
        wplan = replace(
            plan,
            concurrency=c,
            bodies=wbodies,
            requests=reqs[pos],
            max_failures=mf,
            warmup=warm[pos],
            id_table=table,
            id_stride=len(active),
            id_offset=pos,
            first_bodies=None if plan.first_bodies is None else plan.first_bodies[slice(*first)],
            first_max_tokens=(
                None if plan.first_max_tokens is None else plan.first_max_tokens[slice(*first)]
            ),
            token_budget=(
                None
                if plan.token_budget is None
                else max(1, math.ceil(plan.token_budget * c / total_w))
            ),
        )
        shards.append(
            Shard(
                worker=k,
                job=Job("closed", target, wplan),
                first_slot=slots[k],
                table=table,
                stride=len(active),
                pos=pos,
                warm_offset=sum(warm[:pos]),
            )
        )
    return shards


def shard_open(target: Target, plan: OpenLoopPlan, n: int) -> list[Shard]:
    """Deal one open-loop schedule over ``n`` workers (only those with arrivals).

    ``max_concurrency``: split over the workers (their caps sum to it, each at least 1, so
    no more workers than slots): each waits for a slot of its own share, so the trial never
    has more in flight than the cap, though an arrival may wait while another worker has one
    free (vLLM's single semaphore would send it)."""
    offsets = plan.arrivals()
    cap = plan.max_concurrency
    if cap is not None:
        n = max(1, min(n, cap))
    caps = split_even(cap, n) if cap is not None else None
    dealt = deal(offsets, n)
    active = [k for k in range(n) if dealt[k][0]] or [0]
    shards = []
    for k in active:
        idx, offs = dealt[k]
        mf = (
            None
            if plan.max_failures is None
            else max(1, math.ceil(plan.max_failures / len(active)))
        )
        wplan = replace(
            plan,
            rate=plan.rate / n,
            requests=len(offs),
            max_failures=mf,
            seed=plan.seed + k,
            max_concurrency=None if caps is None else caps[k],
        )
        shards.append(Shard(worker=k, job=Job("open", target, wplan, offs, idx)))
    return shards


def merge(
    kind: Kind, plan: TrialPlan | OpenLoopPlan, parts: Sequence[tuple[Shard, int, TrialRecords]]
) -> TrialRecords:
    """One :class:`TrialRecords` from the workers' parts (``(shard, pid, records)``)."""
    records: list[RequestRecord] = []
    warm: list[RequestRecord] = []
    summaries: list[ShardSummary] = []
    for shard, pid, tr in parts:
        for r in tr.records:
            r.index = shard.global_index(r.index)
            if kind == "closed":
                r.worker += shard.first_slot
        for r in tr.warmup_records:
            r.index += shard.warm_offset
            r.worker += shard.first_slot
        records.extend(tr.records)
        warm.extend(tr.warmup_records)
        summaries.append(
            ShardSummary(
                shard=shard.worker,
                pid=pid,
                concurrency=tr.concurrency,
                requests=shard.job.plan.requests,
                first_slot=shard.first_slot,
                records=len(tr.records),
                client_cpu_s=tr.client_cpu_s,
                loop_lag_max_s=tr.loop_lag_max_s,
                loop_lag_p99_s=tr.loop_lag_p99_s,
                stopped_early=tr.stopped_early,
            )
        )
    records.sort(key=lambda r: r.index)
    warm.sort(key=lambda r: r.index)
    trs = [tr for _, _, tr in parts]
    started = min(tr.started for tr in trs)
    delays = [r.sent - r.scheduled for r in records if r.sent]
    delay_p99 = _p99(delays)
    out = TrialRecords(
        records=records,
        started=started,
        ended=max(tr.ended for tr in trs),
        concurrency=plan.concurrency if isinstance(plan, TrialPlan) else peak_inflight(records),
        loop_lag_max_s=max(tr.loop_lag_max_s for tr in trs),
        loop_lag_p99_s=max(tr.loop_lag_p99_s for tr in trs),
        send_delay_p99_s=delay_p99,
        start_spread_s=_start_spread(records, started) if kind == "closed" else 0.0,
        client_cpu_s=sum(tr.client_cpu_s for tr in trs),
        stopped_early=next((tr.stopped_early for tr in trs if tr.stopped_early), None),
        warmup_records=warm,
        cut_at=min((tr.cut_at for tr in trs if tr.cut_at is not None), default=None),
        over_limit_s=next((tr.over_limit_s for tr in trs if tr.over_limit_s is not None), None),
        lag_samples=sum(tr.lag_samples for tr in trs),
        lag_times=array("d", [t for tr in trs for t in tr.lag_times]),
        lag_values=array("d", [v for tr in trs for v in tr.lag_values]),
        shards=summaries,
    )
    if isinstance(plan, OpenLoopPlan):
        out.offered_rate = plan.rate
        out.achieved_rate = achieved_rate(records)
        out.schedule_delay_p99_s = delay_p99
    return out


# ------------------------------------------------------------------------- worker side
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


# ------------------------------------------------------------------------- parent side
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
        code = "from pytest_kimi.load.workers import worker_entry; worker_entry()"
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
