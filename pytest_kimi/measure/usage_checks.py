"""Whether a server's token counts can be true: running usage that falls, cut streams' counts.

Why a module of its own: a trial's tokens come from the server's own ``usage``, and a count
that cannot be true (falling on the way, below the events streamed, above ``max_tokens``) must
be refused before any window counts it; these checks read only the records and the parser's
messages (:mod:`pytest_kimi.load.sse_usage`), and the trial's summary says what they found
(:func:`usage_reasons`).
"""

from __future__ import annotations

from statistics import median
from typing import Iterable, Sequence

import numpy as np

from pytest_kimi.load.records import UNKNOWN_USAGE, RequestRecord
from pytest_kimi.load.sse_usage import (
    running_usage,
    usage_above_max_tokens_message,
    usage_below_events_message,
    usage_fell_message,
)


def running_usage_fall(rec: RequestRecord) -> str | None:
    """Why the stream's running usage cannot be true, or None: a count of the tokens so far
    (``continuous_usage_stats``) that goes *down* from one read to a later one.

    No server's accounting falls, so such a stream's usage tells nothing, and a stream the
    time box cuts is counted by its last running usage alone: counting down, a stream cut
    early claimed most of its request (the tester's run recorded 296.2 tok/s against a true
    ~185).  Checked after the trial, once a stream (numpy over its reads).
    """
    if len(rec.chunk_usage) < 2:
        return None
    told = np.frombuffer(rec.chunk_usage, dtype=np.uint32)
    known = told[told != UNKNOWN_USAGE].astype(np.int64)
    falls = np.flatnonzero(np.diff(known) < 0)
    if not falls.size:
        return None
    i = int(falls[0])
    return usage_fell_message(int(known[i]), int(known[i + 1]))


def check_running_usage(records: Iterable[RequestRecord]) -> None:
    """Refuse every stream's running usage that falls (:func:`running_usage_fall`), finished
    or cut: ``usage_error`` says so, which voids the trial (:func:`usage_reasons`)."""
    for rec in records:
        if rec.usage_error is None:
            rec.usage_error = running_usage_fall(rec)


def count_cut_tokens(records: Sequence[RequestRecord], max_tokens: int = 0) -> int:
    """Give the streams a time box cut their token counts; returns how many were estimated.

    A cut stream never got its final ``usage``.  Trials ask for ``continuous_usage_stats``
    (SGLang and vLLM put the usage so far on every chunk), so the stream's last read says how
    many tokens it had (:attr:`RequestRecord.chunk_usage`): exact.  A server that ignores the option
    leaves an estimate: the stream's events times the tokens per event of the trial's
    finished streams (events may carry several tokens, ``stream_interval``), counted and
    reported by the caller.  A running usage that cannot be true is not believed (the
    stream is estimated, and ``usage_error`` says why): one below the events streamed, one
    above the request's ``max_tokens`` (the one its body asked for, else ``max_tokens``; 0:
    unknown),
    one that fell on the way (:func:`running_usage_fall`).
    """
    # a mean is what is meant here: a stream without running usage is given the events of
    # the finished ones' pattern, whose first and last events fall where they may
    done = [r.tokens_per_event for r in records if r.ok and not r.cut and r.completion_tokens]
    per_event = median(done) if done else 1.0
    estimated = 0
    for rec in records:
        if not rec.cut or not rec.chunk_events:
            continue
        if rec.usage_error is None:
            rec.usage_error = running_usage_fall(rec)
        told: int | None = None
        if rec.chunk_usage and rec.chunk_usage[-1] != UNKNOWN_USAGE:
            told = rec.chunk_usage[-1]  # the parser read it off the last read already
        else:
            told = running_usage(rec.last_read)
        rec.last_read = b""
        limit = rec.token_limit or rec.max_tokens or max_tokens
        if rec.usage_error is not None:
            told = None  # a usage that fell (or was refused on the way) tells nothing
        elif told is not None and told < rec.events:
            # fewer tokens than events streamed cannot be true (each event carries one or
            # more): not believed, and said (the trial is invalid), like a final usage's
            rec.usage_error = usage_below_events_message(told, rec.events)
            told = None
        elif told is not None and limit and told > limit:
            rec.usage_error = usage_above_max_tokens_message(told, limit)
            told = None
        if told is not None:
            rec.completion_tokens = told
        else:
            rec.completion_tokens = round(rec.events * per_event)
            estimated += 1
    return estimated


def usage_reasons(records: Sequence[RequestRecord]) -> str | None:
    """One invalid reason for the requests whose ``usage`` was not believed, or None."""
    bad = [r.usage_error for r in records if r.usage_error is not None]
    if not bad:
        return None
    distinct = list(dict.fromkeys(bad))
    return (
        f"{len(bad)} request(s) reported usage that cannot be true: "
        + "; ".join(distinct[:3])
        + (f" (and {len(distinct) - 3} more)" if len(distinct) > 3 else "")
        + ": the server's token accounting is broken, so no token figure of it stands; fix "
        "its usage reporting (or the proxy that rewrites it)"
    )
