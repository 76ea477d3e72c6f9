"""Load engine: stream requests to an endpoint and turn each into a :class:`RequestRecord`.

Kept free of pytest so it can be driven from benchmarks and scripts as well as the plugin.
"""

from .request import Target, stream_request
from .runner import LoadClient, TrialPlan, TrialRecords
from .sse import StreamParser, parse_blocks

__all__ = [
    "LoadClient",
    "StreamParser",
    "Target",
    "TrialPlan",
    "TrialRecords",
    "parse_blocks",
    "stream_request",
]
