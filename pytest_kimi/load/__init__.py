"""Load engine: stream requests to an endpoint and turn each into a :class:`RequestRecord`.

Kept free of pytest so it can be driven from benchmarks and scripts as well as the plugin.
The package face is lazy (PEP 562): ``pytest_kimi.load.records`` (plain records and the
``Api`` type, which ``workload/`` uses) must not pull in aiohttp and numpy.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kimi.load.openloop import OpenLoopPlan, poisson_arrivals
    from pytest_kimi.load.request import Target, stream_request
    from pytest_kimi.load.runner import LoadClient
    from pytest_kimi.load.trial import (
        LiveTrial,
        ShardSummary,
        TrialClient,
        TrialPlan,
        TrialRecords,
    )
    from pytest_kimi.load.sse import StreamParser, parse_blocks
    from pytest_kimi.load.workers import ShardedClient, WorkerError

_WHERE = {
    "OpenLoopPlan": "openloop",
    "poisson_arrivals": "openloop",
    "Target": "request",
    "stream_request": "request",
    "LiveTrial": "trial",
    "LoadClient": "runner",
    "ShardSummary": "trial",
    "TrialClient": "trial",
    "TrialPlan": "trial",
    "TrialRecords": "trial",
    "StreamParser": "sse",
    "parse_blocks": "sse",
    "ShardedClient": "workers",
    "WorkerError": "workers",
}

__all__ = [
    "LiveTrial",
    "LoadClient",
    "OpenLoopPlan",
    "ShardSummary",
    "ShardedClient",
    "StreamParser",
    "Target",
    "TrialClient",
    "TrialPlan",
    "TrialRecords",
    "WorkerError",
    "parse_blocks",
    "poisson_arrivals",
    "stream_request",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
