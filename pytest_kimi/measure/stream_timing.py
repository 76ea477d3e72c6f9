"""A stream's timing as the client saw it: the server's step, the gaps between tokens, percentiles.

Why a module of its own: these few readings of a request's read times are the bottom every
other figure stands on (the steady-state window's step boundaries, the client's saturation
checks, the level's latency figures, the capacity search's latency), and they need nothing
but the records.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from pytest_kimi.load.records import RequestRecord


def step_gap(records: Iterable[RequestRecord]) -> float:
    """The median time per token of a stream: one server step as the client sees it (0: none).

    Per token, not per read, so a server that packs k tokens per event still gives one step,
    whether or not the streams' events fall on the same steps.
    """
    gaps = inter_token_latencies(records)
    return float(np.median(gaps)) if gaps.size else 0.0


def inter_token_latencies(records: Iterable[RequestRecord]) -> np.ndarray:
    """One gap per token after the first read: a read's gap is shared by the tokens it brought
    (:meth:`RequestRecord.read_tokens`; SGLang's packed events carry 1, then
    ``stream_interval``, then the rest, and each gets its own share)."""
    parts = []
    for rec in records:
        if len(rec.chunk_times) < 2:
            continue
        times = np.frombuffer(rec.chunk_times, dtype=np.float64)
        tokens = rec.read_tokens()[1:]
        counts = np.maximum(np.rint(tokens), 1).astype(np.int64)
        parts.append(np.repeat(np.diff(times) / counts, counts))
    return np.concatenate(parts) if parts else np.empty(0)


def send_delay_p99_within(
    records: Sequence[RequestRecord], window: tuple[float, float] | None
) -> float:
    """How late requests due inside the window left (sent - scheduled); 0 when none was due.

    A burst of C sends at a trial's start is late by construction and lies before the window.
    """
    if window is None:
        return 0.0
    start, end = window
    delays = [r.sent - r.scheduled for r in records if r.sent and start < r.scheduled <= end]
    return float(np.percentile(delays, 99)) if delays else 0.0


def read_gap_p50(records: Iterable[RequestRecord]) -> float:
    """Median time between successive reads of a stream: the rhythm the server delivers in."""
    gaps = [
        np.diff(np.frombuffer(r.chunk_times, dtype=np.float64))
        for r in records
        if len(r.chunk_times) > 1
    ]
    return float(np.median(np.concatenate(gaps))) if gaps else 0.0


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else None
