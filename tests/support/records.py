"""Hand-made request records for tests of the figures: streams whose reads come at a known
pace, so every window, rate and latency has an answer worked out by hand."""

from __future__ import annotations

from array import array

from pytest_kimi.load.records import RequestRecord


def stream_record(
    worker: int,
    start: float,
    n: int,
    step: float,
    *,
    per_event: int = 1,
    index: int = 0,
    tokens: int | None = None,
) -> RequestRecord:
    """A stream of ``n`` tokens whose i-th read arrives at ``start + i * step`` with one event
    each (``n // per_event`` events), a 200 that ended one step after its last read."""
    events = n // per_event
    rec = RequestRecord(
        index=index,
        worker=worker,
        scheduled=start - 0.01,
        sent=start - 0.01,
        first_token=start,
        status=200,
        completion_tokens=tokens if tokens is not None else n,
    )
    rec.chunk_times = array("d", [start + i * step for i in range(events)])
    rec.chunk_events = array("I", [1] * events)
    rec.end = start + events * step
    return rec
