"""The measuring side of a pytest session, without pytest: one loop, one client, one endpoint.

:class:`Measurer` owns the background loop and the single :class:`LoadClient` that every
test shares; :class:`KimiLoad` is what ``async def`` tests get as ``kimi_load``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable, ContextManager, Sequence, TypeVar

from pytest_kimi.endpoint.discovery import EndpointInfo, discover
from pytest_kimi.load.request import Target
from pytest_kimi.load.runner import LoadClient
from pytest_kimi.load.workers import ShardedClient
from pytest_kimi.load.loop_thread import LoopThread
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import DEFAULT_PROTOCOL, LevelSpec, Targets, Workload
from pytest_kimi.measure.measure_spec import (
    DEFAULT_TRIALS,
    FixedTrials,
    LevelInfo,
    MeasureSpec,
    SendSpec,
    TrialObserver,
    TrialPolicy,
    Watchers,
)
from pytest_kimi.measure.trials import ProgressFn, measure_test
from pytest_kimi.measure.results import LevelResult, ThroughputResult
from pytest_kimi.workload.prompts import (
    API_PATHS,
    UNIQUE_SLOT,
    PromptSizer,
    PromptSource,
    WorkloadError,
    encode_bodies,
    lead,
    resolve_prompts,
)
from pytest_kimi.workload.dataset import DatasetSample, TextTokenizer, prepare_dataset
from pytest_kimi.workload.prefix import SharedPrefixes, SystemTokenizer, shared_prefixes
from pytest_kimi.crosscheck.contamination import ContaminationCheck
from pytest_kimi.crosscheck.prefix_cache import PrefixCacheProbe
from pytest_kimi.wire import LevelExtra


T = TypeVar("T")


class Measurer:
    """Background loop + shared load client bound to one endpoint."""

    def __init__(self, workers: int = 1) -> None:
        self._loop = LoopThread()
        self._workers = workers
        self._client: LoadClient | ShardedClient | None = None
        self.session_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        """Names the measuring session in baselines (trials of one session share its noise)."""
        self.prompt_sizer = PromptSizer()
        """Sizes synthetic prompts with the server's tokenizer once per run and length."""
        self._servers_seen: set[str] = set()

    def first_on(self, server: str) -> bool:
        """Whether nothing was measured on ``server`` (its URL and process) yet in this
        session: its first test warms it until stationary (:mod:`pytest_kimi.measure.warm`)."""
        fresh = server not in self._servers_seen
        self._servers_seen.add(server)
        return fresh

    def discover(self, base_url: str, *, api_key: str | None, model: str | None) -> EndpointInfo:
        return self._loop.run(discover(base_url, api_key=api_key, model=model))

    async def _client_instance(self) -> LoadClient | ShardedClient:
        """Created on the load loop's thread, which lives for the whole session (the worker
        processes of a sharded client are tied to the thread that started them)."""
        if self._client is None:
            client = ShardedClient(self._workers) if self._workers > 1 else LoadClient()
            await client.__aenter__()
            self._client = client
        return self._client

    async def _measure(self, spec: MeasureSpec, progress: ProgressFn | None) -> ThroughputResult:
        client = await self._client_instance()
        return await measure_test(client, spec, progress)

    def measure(self, spec: MeasureSpec, progress: ProgressFn | None = None) -> ThroughputResult:
        return self._loop.run(self._measure(spec, progress))

    async def measure_async(
        self, spec: MeasureSpec, progress: ProgressFn | None = None
    ) -> ThroughputResult:
        return await self._loop.run_async(self._measure(spec, progress))

    def run_job(self, job: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``job(client)`` on the load loop with the session's client: a measurement that
        is not a fixed sweep (a ``@capacity`` search chooses its next level from the last)."""

        async def _job() -> T:
            return await job(await self._client_instance())

        return self._loop.run(_job())

    def close(self) -> None:
        async def _close() -> None:
            if self._client is not None:
                await self._client.__aexit__(None, None, None)
                self._client = None

        try:
            self._loop.run(_close())
        finally:
            self._loop.close()


def build_spec(
    endpoint: EndpointInfo,
    nodeid: str,
    workload: Workload,
    targets: Targets,
    *,
    rootdir: Path,
    trials: int | None = None,
    policy: TrialPolicy | None = None,
    sizer: PromptSizer | None = None,
    unique_prompts: bool = True,
    protocol: str = DEFAULT_PROTOCOL,
    allow_large: bool = False,
) -> MeasureSpec:
    """A whole measurement spec with the standard watchers (``kimi_load``, the benchmarks):
    :func:`build_send`, then :func:`watchers_for`.  The conductor builds its own from the
    same two, with the session's observer and sinks."""
    send, level_info = build_send(
        endpoint,
        nodeid,
        workload,
        targets,
        rootdir=rootdir,
        sizer=sizer,
        unique_prompts=unique_prompts,
        protocol=protocol,
        allow_large=allow_large,
    )
    return MeasureSpec(
        send,
        watchers_for(endpoint, level_info, policy=policy),
        trials=first_trials(send.workload, trials),
    )


def first_trials(workload: Workload, trials: int | None) -> int:
    """Trials a level starts with: the marker's ``trials=``, else ``--perf-trials``, else 3."""
    return workload.trials or trials or DEFAULT_TRIALS


def watchers_for(
    endpoint: EndpointInfo,
    level_info: LevelInfo | None,
    *,
    policy: TrialPolicy | None = None,
    observer: TrialObserver | None = None,
    min_window_s: float = 0.0,
    level_done: Callable[[LevelResult], None] | None = None,
) -> Watchers:
    """What watches every perf test's measurement: the contamination check and the
    prefix-cache probe always, the workload's level info, and what the caller adds (the
    adaptive trial policy, ``--perf-server-metrics``' observer, ``--perf-requests``' sink)."""
    return Watchers(
        policy=policy or FixedTrials(),
        observer=observer,
        min_window_s=min_window_s,
        # on for every perf test: zombies of cut streams and another client's load void trials
        guard=ContaminationCheck(endpoint.url, endpoint.headers()),
        level_info=level_info,
        level_probe=PrefixCacheProbe(endpoint.url, endpoint.headers()),
        level_done=level_done,
    )


def build_send(
    endpoint: EndpointInfo,
    nodeid: str,
    workload: Workload,
    targets: Targets,
    *,
    rootdir: Path,
    sizer: PromptSizer | None = None,
    unique_prompts: bool = True,
    protocol: str = DEFAULT_PROTOCOL,
    allow_large: bool = False,
) -> tuple[SendSpec, LevelInfo | None]:
    """Resolve prompts and pre-encode bodies: all the work that must not happen under the clock.

    ``sizer``: sizes synthetic prompts with the server's tokenizer (a session passes its own,
    so a run asks once per length; default: a fresh one).  ``unique_prompts=False`` sends the
    prompts as they are, so every pass over them repeats (a server's prefix cache then serves
    them): the old behaviour, for tests that compare the two; the marker has no such switch.
    """
    sizer = sizer if sizer is not None else PromptSizer()
    run_token = uuid.uuid4().hex[:8] if unique_prompts else None
    lead_text = lead(run_token) if run_token is not None else ""
    bodies: dict[int | None, list[bytes]] = {}
    keys: dict[int | None, str] = {}
    sizing: dict[int | None, str] = {}

    def size(tokens: int, lengths: Sequence[int] | None = None) -> tuple[tuple[str, ...], str]:
        return sizer.synthetic(
            tokens,
            base_url=endpoint.url,
            headers=endpoint.headers(),
            model=endpoint.model,
            api=workload.api,
            lead_text=lead_text,
            lengths=lengths,  # range_ratio=: one prompt per drawn input length
        )

    sample = _dataset(endpoint, workload, rootdir, sizer, allow_large)
    if sample is not None:
        workload = replace(workload, num_prompts=len(sample.entries))
        _check_sample_size(workload, sample)
    prefixes = _prefixes(endpoint, workload, sizer)
    output_tokens: dict[int | None, list[int]] = {}
    for input_tokens in dict.fromkeys(lv.input_tokens for lv in workload.levels):
        if sample is not None:
            source = PromptSource(sample.prompts, sample.key)
        else:
            source = resolve_prompts(
                workload.prompts,
                input_tokens,
                rootdir,
                size=size,
                lengths=workload.input_lengths(input_tokens),
                allow_large=allow_large,  # --perf-allow-large: a prompts file's size bounds
            )
        bodies[input_tokens] = encode_bodies(
            source,
            model=endpoint.model,
            api=workload.api,
            max_tokens=0,
            ignore_eos=workload.ignore_eos,
            unique=run_token,
            prefixes=prefixes.texts if prefixes is not None else None,
        )
        keys[input_tokens] = source.key
        if source.sizing is not None:
            sizing[input_tokens] = source.sizing
        if sample is not None:
            own = sample.output_tokens
            output_tokens[input_tokens] = [
                own[k % len(own)] for k in range(len(bodies[input_tokens]))
            ]
    target = Target(
        url=endpoint.url + API_PATHS[workload.api], headers=endpoint.headers(), api=workload.api
    )
    send = SendSpec(
        nodeid=nodeid,
        target=target,
        workload=workload,
        targets=targets,
        bodies=bodies,
        prompts_keys=keys,
        clock=endpoint.clock,
        protocol=protocol,
        unique_slot=UNIQUE_SLOT.encode() if unique_prompts else None,
        unique_salt=int(run_token, 16) if run_token is not None else 0,
        sizing=sizing,
        output_tokens=output_tokens,
        warmup_bodies=max(2, workload.prefix_groups or 0),
    )
    return send, _level_info(workload, sample, prefixes)


def _dataset(
    endpoint: EndpointInfo,
    workload: Workload,
    rootdir: Path,
    sizer: PromptSizer,
    allow_large: bool = False,
) -> DatasetSample | None:
    """The marker's ``dataset=``, sampled and with its output lengths counted by the server's
    tokenizer (once per dataset and endpoint for the session: ``sizer.memo``)."""
    if workload.dataset is None:
        return None
    key = ("text-tokenizer", endpoint.url, endpoint.model)
    tokenizer = sizer.memo.get(key)
    if not isinstance(tokenizer, TextTokenizer):
        tokenizer = sizer.memo[key] = TextTokenizer(
            endpoint.url, endpoint.headers(), endpoint.model
        )
    return prepare_dataset(
        workload.dataset,
        rootdir=rootdir,
        num_prompts=workload.num_prompts,
        seed=workload.seed,
        tokenizer=tokenizer,
        memo=sizer.memo,
        endpoint_key=(endpoint.url, endpoint.model),
        allow_large=allow_large,
    )


def _check_sample_size(workload: Workload, sample: DatasetSample) -> None:
    """A dataset trial replays the sample once: it must fill every in-flight slot."""
    for level in workload.levels:
        requests = workload.requests_for(level)
        if level.concurrency is not None and requests is not None and requests < level.concurrency:
            raise WorkloadError(
                f"dataset {sample.dataset.path.name}: a trial replays its {requests} sampled "
                f"entries once, fewer than concurrency {level.concurrency}: give num_prompts "
                f"(several per stream), or requests="
            )


def _prefixes(
    endpoint: EndpointInfo, workload: Workload, sizer: PromptSizer
) -> SharedPrefixes | None:
    """The groups' system prompts, sized with the server's tokenizer once per run."""
    if workload.shared_prefix_tokens is None:
        return None
    key = ("system-tokenizer", endpoint.url, endpoint.model, workload.api)
    tokenizer = sizer.memo.get(key)
    if not isinstance(tokenizer, SystemTokenizer):
        tokenizer = sizer.memo[key] = SystemTokenizer(
            endpoint.url, endpoint.headers(), endpoint.model, workload.api
        )
    return shared_prefixes(
        workload.shared_prefix_tokens,
        workload.prefix_groups or 1,
        tokenizer=tokenizer,
        memo=sizer.memo,
        endpoint_key=(endpoint.url, endpoint.model),
        api=workload.api,
    )


SAMPLE_PER_STREAM = 4
"""Requests per stream below which a dataset level notes that its window is short: a trial's
window ends when the first stream has run out of the sample's requests."""


def _level_info(
    workload: Workload, sample: DatasetSample | None, prefixes: SharedPrefixes | None
) -> LevelInfo | None:
    """What every level's JSON says about its dataset sample (at the level's cap: the mean
    output length it asked for) and its shared prefix, and the notes its reports carry."""
    if sample is None and prefixes is None:
        return None

    def info(level: LevelSpec) -> tuple[LevelExtra, list[str]]:
        out: LevelExtra = {}
        notes: list[str] = []
        if sample is not None:
            out["dataset"] = sample.summary(level.max_tokens)
            out["output_tokens_mean"] = out["dataset"]["output_tokens_mean"]
            notes += sample.notes
            requests = workload.requests_for(level)
            c = level.concurrency
            if c is not None and requests is not None and requests < SAMPLE_PER_STREAM * c:
                notes.append(
                    f"the dataset sample gives each of the {c} streams about {requests / c:.1f} "
                    "requests a trial, and the window ends when the first stream runs out: give "
                    f"num_prompts >= {SAMPLE_PER_STREAM * c} for a window over most of the trial"
                )
        if prefixes is not None:
            out["shared_prefix"] = prefixes.summary()
            if prefixes.note:
                notes.append(prefixes.note)
        return out, notes

    return info


class KimiLoad:
    """The load engine bound to the session's endpoint, for tests that drive it themselves.

    ``await kimi_load.sweep(concurrency=[1, 8], max_tokens=256)`` takes the same arguments as
    ``@throughput`` and returns a :class:`ThroughputResult`; it judges targets but fails nothing:
    the test asserts what it wants.
    """

    def __init__(
        self,
        session: Measurer,
        endpoint: EndpointInfo,
        nodeid: str,
        rootdir: Path,
        trials: int | None,
        protocol: str = DEFAULT_PROTOCOL,
        *,
        allow_large: bool = False,
        hold: Callable[[], ContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        """``allow_large``: ``--perf-allow-large`` (the marker bounds are lifted as for
        ``@throughput``); ``hold``: what a sweep holds while it measures (the plugin passes
        its one-measurement-per-endpoint lock, so a sweep never measures beside another run's
        test on the same server)."""
        self._session = session
        self.endpoint = endpoint
        self._nodeid = nodeid
        self._rootdir = rootdir
        self._trials = trials
        self._protocol = protocol
        self._allow_large = allow_large
        self._hold = hold

    def _spec(self, kwargs: dict[str, Any]) -> MeasureSpec:
        workload, targets = parse_throughput((), kwargs, allow_large=self._allow_large)
        return build_spec(
            self.endpoint,
            self._nodeid,
            workload,
            targets,
            rootdir=self._rootdir,
            trials=self._trials,
            sizer=self._session.prompt_sizer,
            protocol=self._protocol,
            allow_large=self._allow_large,
        )

    async def sweep(self, **kwargs: Any) -> ThroughputResult:
        spec = self._spec(kwargs)  # a bad argument is said before any wait for the lock
        with self._hold():
            return await self._session.measure_async(spec)

    def sweep_sync(self, **kwargs: Any) -> ThroughputResult:
        """The same from a plain ``def`` test."""
        spec = self._spec(kwargs)
        with self._hold():
            return self._session.measure(spec)
