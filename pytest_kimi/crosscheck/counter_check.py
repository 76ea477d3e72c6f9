"""The pure check of one trial: the client's token count and rate against the server's counter.

Apart because it does no I/O: given the scrapes and the trial's records it says whether the
two agree (the exact and the rate check), so it is tested on made-up scrapes; and
:func:`level_summary` shapes the level's ``server`` entry of the JSON report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Sequence

import numpy as np

from pytest_kimi.crosscheck.counter_scraper import Scrape, generation_rise
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.wire import ServerCheckSection, ServerCheckTrial

RATE_TOLERANCE = 0.02
"""Largest relative difference allowed between the server's and the client's steady-state
tok/s.  Both measure one rate over one window; what separates them is the server's bookkeeping
lag (one engine step, milliseconds) and the counter's step granularity (one token per running
sequence), each well under 1% of a window of a second or more.  2% leaves room for those and
still catches a client that falls behind the stream or mis-stamps its reads.  The timing
uncertainty of the two scrapes (half their round trips) is added on top, since the server read
its counter at an unknown instant inside each request."""

SAMPLE_INTERVAL_S = 0.25
"""Counter samples while a trial runs: one small GET each, cheap for the server and the client."""
MIN_WINDOW_SAMPLES = 2
"""Samples that must lie inside the steady-state window for a rate; fewer: exact check only."""


def _arrivals(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(times, cumulative tokens) of every read block: the client's tokens received so far."""
    times, weights = [], []
    for rec in records:
        if not rec.chunk_times:
            continue
        times.append(np.frombuffer(rec.chunk_times, dtype=np.float64))
        weights.append(rec.read_tokens())  # each read's own tokens (SGLang packs 1, N, ..., rest)
    if not times:
        return np.empty(0), np.empty(0)
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return t[order], np.cumsum(np.concatenate(weights)[order])


def _cumulative_at(times: np.ndarray, cum: np.ndarray, at: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(times, at, side="right")
    padded = np.concatenate([[0.0], cum])
    return padded[idx]


def _active_streams(records: Sequence[RequestRecord], at: float) -> float:
    """Tokens the server may have counted at ``at`` that the client has not read yet: one
    event's worth (its tokens per event) for every stream in flight then.

    In flight means from the send to the stream's end, not only between its first and last
    token: a server that packs tokens into events (``stream_interval``) generates a whole
    event's tokens before the first one is sent, and a stream the time box cuts may hold
    tokens generated after its last read."""
    return float(
        sum(
            rec.tokens_per_event
            for rec in records
            if rec.sent <= at and (rec.end <= 0.0 or at <= rec.end)
        )
    )


def counting_mode(
    samples: Sequence[Scrape], before: Scrape, records: Sequence[RequestRecord]
) -> str:
    """``per-token`` (vLLM: the counter rises with every engine step), ``per-request`` (SGLang:
    it rises by a request's tokens when the request ends), or ``unknown`` (no sample was taken
    while a stream was mid-way, so the two cannot be told apart).

    Each sample taken during the trial is compared with the client's tokens received by then
    and with the tokens of the requests finished by then; whichever the counter follows more
    closely is how the server counts.  Another client's tokens make the counter follow neither,
    but arrivals (the larger of the two) more closely: the rate check then runs, and fails.
    """
    if not samples:
        return "unknown"
    at = np.array([s.t for s in samples])
    rise = np.array([s.generation - before.generation for s in samples])
    a_times, a_cum = _arrivals(records)
    received = _cumulative_at(a_times, a_cum, at) if a_times.size else np.zeros(len(at))
    ends = [
        (r.last_token if r.last_token is not None else r.end, r.completion_tokens) for r in records
    ]
    ends.sort()
    e_times = np.array([e for e, _ in ends], dtype=np.float64)
    e_cum = np.cumsum(np.array([n for _, n in ends], dtype=np.float64))
    finished = _cumulative_at(e_times, e_cum, at) if e_times.size else np.zeros(len(at))
    telling = received - finished > 0.5
    if not telling.any():
        return "unknown"
    off_tokens = float(np.abs(rise - received)[telling].sum())
    off_requests = float(np.abs(rise - finished)[telling].sum())
    return "per-token" if off_tokens <= off_requests else "per-request"


@dataclass(slots=True)
class TrialCheck:
    """What the server's counters said about one trial, and whether they agreed."""

    trial: int
    tokens: int
    """The generation counter's rise from before the trial to after it settled."""
    client_tokens: int
    exact: bool | None
    """None: the client's count is not exact (failed requests, no usage), so not compared."""
    tok_s: float | None
    """The counter's slope inside the steady-state window; None when there is none to take."""
    client_tok_s: float | None
    """The client's steady-state figure for the trial (over the whole window)."""
    deviation_pct: float | None
    """Server rate vs the client's rate over the same span between two counter samples."""
    allowed_pct: float | None
    window_samples: int
    counting: str
    settle_s: float
    prompt_tokens: int | None = None
    client_prompt_tokens: int = 0
    requests: int | None = None
    client_requests: int = 0
    notes: list[str] = field(default_factory=list)
    client_span_tok_s: float | None = None
    """The client's rate over the span the server's rate was taken on."""
    counter_behind: str | None = None
    """The rate reason when the server's counter rose *less* than the client received over
    the span: neither another client (which adds tokens) nor a client that fell behind (which
    reads fewer) does that, only a counter updated late over a short span (vLLM counts a step
    after it streamed it); the trial is void but may be replaced."""

    def to_dict(self) -> ServerCheckTrial:
        return {
            "trial": self.trial,
            "tokens": self.tokens,
            "client_tokens": self.client_tokens,
            "exact": self.exact,
            "tok_s": _round(self.tok_s, 2),
            "client_tok_s": _round(self.client_tok_s, 2),
            "client_span_tok_s": _round(self.client_span_tok_s, 2),
            "deviation_pct": _round(self.deviation_pct, 3),
            "allowed_pct": _round(self.allowed_pct, 3),
            "window_samples": self.window_samples,
            "counting": self.counting,
            "settle_s": round(self.settle_s, 3),
            "prompt_tokens": self.prompt_tokens,
            "client_prompt_tokens": self.client_prompt_tokens,
            "requests": self.requests,
            "client_requests": self.client_requests,
            "notes": list(self.notes),
        }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _delta(before: float | None, after: float | None) -> int | None:
    return None if before is None or after is None else round(after - before)


def check_trial(
    trial: TrialResult,
    before: Scrape,
    during: Sequence[Scrape],
    after: Scrape,
    *,
    metric: str,
    settle_s: float = 0.0,
    interval_s: float = SAMPLE_INTERVAL_S,
    rate_tolerance: float = RATE_TOLERANCE,
) -> tuple[TrialCheck, list[str]]:
    """The exact and the rate check of one trial: its figures and the reasons it is invalid.

    ``during``: the sampler's scrapes (and the settling ones), in time order; ``after``: the
    settled scrape the exact check uses.  Pure: no I/O, so it is tested on made-up scrapes.
    """
    records = trial.records
    client_tokens = sum(r.completion_tokens for r in records)
    tokens = generation_rise(before, after)
    reasons: list[str] = []
    notes: list[str] = []
    inexact = sum(1 for r in records if not r.ok or r.tokens_approx)
    cut = sum(1 for r in records if r.cut)
    exact: bool | None
    if cut:
        # A stationary trial cancels its streams in flight: the server may have generated
        # tokens after the last read of each (vLLM counts them), or count none of an aborted
        # request (SGLang counts at the end): no exact total to hold the client to.  The rate
        # over a span of the window still compares, below.
        exact = None
        notes.append(
            f"tokens not compared: the time box cut {cut} stream(s), whose last tokens the "
            "server may count and the client never read; rate check only"
        )
    elif inexact:
        exact = None
        notes.append(
            f"tokens not compared: {inexact} request(s) failed or sent no usage, so the client's "
            "count is not exact"
        )
    else:
        exact = tokens == client_tokens
        if not exact:
            why = "another client is using this server, or the server counts differently"
            if tokens < 0:
                why = "the counter went backwards: did the server restart?"
            elif tokens == 0:
                why = "the counter did not move: does the server record stats (vLLM: no --disable-log-stats)?"
            reasons.append(
                f"server counted {tokens:,} generation tokens ({metric}) during the trial, the "
                f"client {client_tokens:,}: {why}"
            )
    counting = counting_mode(during, before, records)
    window = trial.window
    inside = [s for s in during if window is not None and window[0] < s.t <= window[1]]
    tok_s = deviation = allowed = client_span = None
    behind: str | None = None
    if window is None or trial.tok_s is None:
        notes.append("no steady-state window: exact check only")
    elif len(inside) < MIN_WINDOW_SAMPLES:
        notes.append(
            f"steady-state window of {window[1] - window[0]:.2f} s held {len(inside)} counter "
            f"sample(s) (one every {interval_s:g} s; a rate needs {MIN_WINDOW_SAMPLES}): exact "
            "check only"
        )
    elif counting != "per-token":
        notes.append(
            "the server counts a request's tokens when the request ends (SGLang does): its "
            "counter has no rate inside the window, exact check only"
            if counting == "per-request"
            else "counting mode unknown: exact check only"
        )
    else:
        first, last = inside[0], inside[-1]
        span = last.t - first.t
        tok_s = (last.generation - first.generation) / span
        # The client's rate over the very same span (its own steady figure spans the whole
        # window, whose rate can differ from a sub-span's by far more than 2 % on a busy
        # machine): the two then count the same tokens, read by two observers.
        a_times, a_cum = _arrivals(records)
        got = _cumulative_at(a_times, a_cum, np.array([first.t, last.t]))
        span_tokens = float(got[1] - got[0])
        client_span = span_tokens / span
        deviation = (tok_s - client_span) / client_span * 100 if client_span > 0 else math.inf
        # Allowed: the tolerance, plus where inside each scrape the server read its counter
        # (half a round trip each), plus one event's tokens per stream in flight at each end
        # of the span (the counter moves a token per step, the arrivals an event at a time).
        # And the client's own stalls: a read the event loop reached late is stamped late, so
        # an end of the span can miss what arrived during the longest stall the lag monitor
        # saw in the window (on a busy machine, tens of milliseconds: several percent of a
        # quarter-second span, which is why the sampler keeps the span as long as it can).
        step_tokens = _active_streams(records, first.t) + _active_streams(records, last.t)
        stall_s = trial.client.lag_max_within(window[0], window[1])
        allowed = (
            rate_tolerance
            + (first.half_rtt_s + last.half_rtt_s + 2 * stall_s) / span
            + step_tokens / max(span_tokens, 1.0)
        ) * 100
        if abs(deviation) > allowed:
            said = (
                f"server generated {tok_s:,.1f} tok/s by its counter ({metric}) over "
                f"{span:.2f} s of the steady-state window, the client received "
                f"{client_span:,.1f} tok/s over the same span ({deviation:+.1f}%, allowed "
                f"±{allowed:.1f}%): "
            )
            if deviation > 0:
                reasons.append(
                    said + "another client is using this server, or the client did not "
                    "keep up with the stream"
                )
            else:
                behind = said + (
                    "the server's counter lagged the tokens it had already streamed (no other "
                    "client or slow reader makes it lower); another trial may replace this one"
                )
                reasons.append(behind)
    check = TrialCheck(
        trial=trial.index,
        tokens=tokens,
        client_tokens=client_tokens,
        exact=exact,
        tok_s=tok_s,
        client_tok_s=trial.tok_s,
        deviation_pct=deviation,
        allowed_pct=allowed,
        window_samples=len(inside),
        counting=counting,
        settle_s=settle_s,
        prompt_tokens=_delta(before.prompt, after.prompt),
        client_prompt_tokens=sum(r.prompt_tokens for r in records),
        requests=_delta(before.requests, after.requests),
        client_requests=sum(1 for r in records if r.ok),
        notes=notes,
        client_span_tok_s=client_span,
        counter_behind=behind if exact is not False else None,
    )
    return check, reasons


def level_summary(checks: Sequence[TrialCheck], metric: str) -> ServerCheckSection:
    """The level's ``server`` entry of the JSON report.  Stable keys:

    ``tokens``/``client_tokens`` (sums over the trials), ``tok_s`` (median of the trials'
    server rates, null when no trial had one), ``client_tok_s`` (the client's median over the
    same trials; over all its trials when none had a server rate), ``max_deviation_pct`` (the
    largest |rate difference| in percent, null without rates), ``exact`` (every compared trial
    matched; null when none was compared), and ``trials`` (one small dict per trial).
    """
    rates = [c.tok_s for c in checks if c.tok_s is not None]
    paired = [c.client_tok_s for c in checks if c.tok_s is not None and c.client_tok_s is not None]
    client_all = [c.client_tok_s for c in checks if c.client_tok_s is not None]
    client_rates = paired or client_all
    deviations = [abs(c.deviation_pct) for c in checks if c.deviation_pct is not None]
    compared = [c.exact for c in checks if c.exact is not None]
    modes = [c.counting for c in checks if c.counting != "unknown"]
    prompts = [c.prompt_tokens for c in checks]
    requests = [c.requests for c in checks]
    return {
        "metric": metric,
        "tokens": sum(c.tokens for c in checks),
        "client_tokens": sum(c.client_tokens for c in checks),
        "exact": all(compared) if compared else None,
        "tok_s": _round(median(rates), 2) if rates else None,
        "client_tok_s": _round(median(client_rates), 2) if client_rates else None,
        "max_deviation_pct": _round(max(deviations), 3) if deviations else None,
        "tolerance_pct": RATE_TOLERANCE * 100,
        "counting": max(set(modes), key=modes.count) if modes else "unknown",
        "prompt_tokens": sum(p for p in prompts if p is not None)
        if prompts and None not in prompts
        else None,
        "client_prompt_tokens": sum(c.client_prompt_tokens for c in checks),
        "requests": sum(r for r in requests if r is not None)
        if requests and None not in requests
        else None,
        "client_requests": sum(c.client_requests for c in checks),
        "trials": [c.to_dict() for c in checks],
    }
