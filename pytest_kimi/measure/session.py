"""The measuring side of a pytest session, without pytest: one loop, one client, one endpoint.

:class:`PerfSession` owns the background loop and the single :class:`LoadClient` that every
test shares; :class:`KimiLoad` is what ``async def`` tests get as ``kimi_load``.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from pytest_kimi.endpoint.discovery import EndpointInfo, discover
from pytest_kimi.load.request import Target
from pytest_kimi.load.runner import LoadClient
from pytest_kimi.load.workers import ShardedClient
from pytest_kimi.load.loop_thread import LoopThread
from pytest_kimi.spec.markers import DEFAULT_PROTOCOL, Targets, Workload, parse_throughput
from pytest_kimi.measure.trials import (
    DEFAULT_TRIALS,
    FixedTrials,
    MeasureSpec,
    ProgressFn,
    TrialPolicy,
    measure_test,
)
from pytest_kimi.measure.results import ThroughputResult
from pytest_kimi.spec.workload import (
    API_PATHS,
    UNIQUE_SLOT,
    PromptSizer,
    encode_bodies,
    lead,
    resolve_prompts,
)


class PerfSession:
    """Background loop + shared load client bound to one endpoint."""

    def __init__(self, workers: int = 1) -> None:
        self._loop = LoopThread()
        self._workers = workers
        self._client: LoadClient | ShardedClient | None = None
        self.session_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        """Names the measuring session in baselines (trials of one session share its noise)."""
        self.prompt_sizer = PromptSizer()
        """Sizes synthetic prompts with the server's tokenizer once per run and length."""

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
) -> MeasureSpec:
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

    def size(tokens: int) -> tuple[tuple[str, ...], str]:
        return sizer.synthetic(
            tokens,
            base_url=endpoint.url,
            headers=endpoint.headers(),
            model=endpoint.model,
            api=workload.api,
            lead_text=lead_text,
        )

    for input_tokens in dict.fromkeys(lv.input_tokens for lv in workload.levels):
        source = resolve_prompts(workload.prompts, input_tokens, rootdir, size=size)
        bodies[input_tokens] = encode_bodies(
            source,
            model=endpoint.model,
            api=workload.api,
            max_tokens=0,
            ignore_eos=workload.ignore_eos,
            unique=run_token,
        )
        keys[input_tokens] = source.key
        if source.sizing is not None:
            sizing[input_tokens] = source.sizing
    target = Target(
        url=endpoint.url + API_PATHS[workload.api], headers=endpoint.headers(), api=workload.api
    )
    return MeasureSpec(
        nodeid=nodeid,
        target=target,
        workload=workload,
        targets=targets,
        bodies=bodies,
        prompts_keys=keys,
        trials=workload.trials or trials or DEFAULT_TRIALS,
        policy=policy or FixedTrials(),
        clock=endpoint.clock,
        protocol=protocol,
        unique_slot=UNIQUE_SLOT.encode() if unique_prompts else None,
        unique_salt=int(run_token, 16) if run_token is not None else 0,
        sizing=sizing,
    )


class KimiLoad:
    """The load engine bound to the session's endpoint, for tests that drive it themselves.

    ``await kimi_load.sweep(concurrency=[1, 8], max_tokens=256)`` takes the same arguments as
    ``@throughput`` and returns a :class:`ThroughputResult`; it judges targets but fails nothing:
    the test asserts what it wants.
    """

    def __init__(
        self,
        session: PerfSession,
        endpoint: EndpointInfo,
        nodeid: str,
        rootdir: Path,
        trials: int | None,
        protocol: str = DEFAULT_PROTOCOL,
    ) -> None:
        self._session = session
        self.endpoint = endpoint
        self._nodeid = nodeid
        self._rootdir = rootdir
        self._trials = trials
        self._protocol = protocol

    def _spec(self, kwargs: dict[str, Any]) -> MeasureSpec:
        workload, targets = parse_throughput((), kwargs)
        return build_spec(
            self.endpoint,
            self._nodeid,
            workload,
            targets,
            rootdir=self._rootdir,
            trials=self._trials,
            sizer=self._session.prompt_sizer,
            protocol=self._protocol,
        )

    async def sweep(self, **kwargs: Any) -> ThroughputResult:
        return await self._session.measure_async(self._spec(kwargs))

    def sweep_sync(self, **kwargs: Any) -> ThroughputResult:
        """The same from a plain ``def`` test."""
        return self._session.measure(self._spec(kwargs))
