"""Load engine: stream requests to an endpoint and turn each into a :class:`RequestRecord`.

Kept free of pytest so it can be driven from benchmarks and scripts as well as the plugin.
"""

from pytest_kimi.load.openloop import OpenLoopPlan, poisson_arrivals
from pytest_kimi.load.request import Target, stream_request
from pytest_kimi.load.runner import (
    LiveTrial,
    LoadClient,
    ShardSummary,
    TrialClient,
    TrialPlan,
    TrialRecords,
)
from pytest_kimi.load.sse import StreamParser, parse_blocks
from pytest_kimi.load.workers import ShardedClient, WorkerError

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
