"""Request records -> trial and level figures: a trial's summary and a level's headline figures.

Everything here runs after a trial has ended, so the load engine's hot path never pays for it.
:func:`summarize_trial` puts a trial's figure together from the parts beside it: the
steady-state window and its tokens (:mod:`pytest_kimi.measure.steady_state`), the streams'
timing (:mod:`pytest_kimi.measure.stream_timing`), the load client's own signals
(:mod:`pytest_kimi.measure.client_signals`), the server's token counts
(:mod:`pytest_kimi.measure.usage_checks`) and the reasons a trial is void
(:mod:`pytest_kimi.measure.trial_causes`); :func:`level_figures` gives a level's figures over
its trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Sequence

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.measure.client_signals import (
    CLIENT_BUSY_CPU,
    CLIENT_CPU_LIMIT,
    CLIENT_LAG_LIMIT_S,
    STALL_ERROR_LIMIT,
    ClientSignals,
)
from pytest_kimi.measure.steady_state import (
    completed_rate,
    open_loop_window,
    stationary_window,
    steady_window,
    tokens_between,
    tokens_in_steps,
    tokens_in_window,
)
from pytest_kimi.measure.stream_timing import (
    inter_token_latencies,
    percentile,
    read_gap_p50,
    send_delay_p99_within,
)
from pytest_kimi.measure.time_box import MAX_SETTLE_STEPS
from pytest_kimi.measure.trial_causes import (
    _no_window,
    buffered_reason,
    flood_reason,
    one_stream_flood,
    slow_headers_message,
    streams_per_process,
)
from pytest_kimi.measure.usage_checks import check_running_usage, count_cut_tokens, usage_reasons
from pytest_kimi.workload.workload_spec import LevelSpec


@dataclass(slots=True)
class TrialResult:
    """One measured load phase at one level: the sample unit of the statistics."""

    index: int
    label: str
    tok_s: float | None
    """Aggregate output tok/s in the steady-state window; None when there is no window."""
    window_s: float
    window_tokens: float
    requests_ok: int
    requests_failed: int
    wall_s: float
    client: ClientSignals
    invalid: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopped_early: str | None = None
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    offered_rate: float | None = None
    """Open loop: the arrival rate asked for, and the one the client achieved."""
    achieved_rate: float | None = None
    completed_rate: float | None = None
    """Open loop: requests/s the server finished inside the window (:func:`completed_rate`)."""
    transient: list[str] = field(default_factory=list)
    """The subset of ``invalid`` caused by the moment, not by the server or the workload (a
    client stall): when every reason is transient, another trial may replace this one."""
    window: tuple[float, float] | None = None
    """[start, end) of the steady-state window on the ``perf_counter`` clock (None: no window),
    so a cross-check (``--perf-server-metrics``) can take its own figure over the same span."""
    client_stall: str | None = None
    """Why the load client's own timing is in this trial's figures (its event loop or its
    sends waited for a CPU), whether that voided the trial or only noted it: its latencies
    are the client's as much as the server's, so none of them is a latency sample
    (:func:`pytest_kimi.measure.latency.latency_void`), even where its tok/s, bounded by the
    stall, still is."""
    running_asked: int | None = None
    """The C whose streams did not all get a first token, where only the server's own
    running-requests gauge can say whether it runs fewer than C at once: a reason of the trial
    then holds :data:`GAUGE_UNREAD`, which ``--perf-server-metrics`` replaces with what the
    gauge showed (:func:`gauge_finding`)."""
    over_limit_s: float | None = None
    """The wall-clock limit this trial ran past (its streams in flight were cut there); None:
    it ended on its own."""
    latency_void: str | None = None
    """Set when the level is judged (:func:`pytest_kimi.measure.results.judge_level`): why
    this trial gives no latency figure (a client stall, :attr:`client_stall`, or one that
    moved its latency percentiles); None: its latencies count."""

    @property
    def valid(self) -> bool:
        return not self.invalid and self.tok_s is not None


def is_empty_ok_response(rec: RequestRecord) -> bool:
    """A 200 stream that ended normally without a single token: untrustworthy, not an HTTP failure."""
    return (
        rec.status == 200
        and not rec.cut  # cut by the time box before its first token: nothing went wrong
        and rec.completion_tokens == 0
        and not rec.chunk_times
        and (rec.error is None or "no tokens" in rec.error)
    )


def summarize_trial(
    index: int,
    level: LevelSpec,
    tr: TrialRecords,
    *,
    client: ClientSignals,
    ignore_eos: bool,
    settle_steps: int = MAX_SETTLE_STEPS,
) -> TrialResult:
    """Figures and validity of one trial; never raises on bad data, it says what is wrong.
    ``settle_steps``: a stationary trial's, from its time box."""
    records = tr.records
    max_tokens = level.max_tokens
    if tr.over_limit_s is not None and tr.cut_at is not None:
        for r in records:
            if r.cut and r.status == 0 and r.error is None and r.sent:
                # no response at all: a request that failed, not one the limit interrupted
                r.error = slow_headers_message(tr.cut_at - r.sent)
    empty = [r for r in records if is_empty_ok_response(r)]
    failed = [
        r
        for r in records
        if not r.ok and (not r.cut or r.error is not None) and not is_empty_ok_response(r)
    ]
    ok = [r for r in records if r.ok]
    invalid: list[str] = []
    open_loop = level.concurrency is None
    estimated = 0
    check_running_usage(records)
    if tr.cut_at is not None:
        estimated = count_cut_tokens(records, max_tokens)
        # a refused running usage is said with the usage reasons, not as one that was missing
        estimated -= sum(1 for r in records if r.cut and r.chunk_events and r.usage_error)
        window = stationary_window(ok, tr.cut_at, settle_steps)
    else:
        window = open_loop_window(ok) if open_loop else steady_window(ok)
    window_s = window_tokens = 0.0
    tok_s: float | None = None
    transient: list[str] = []
    client_stall: str | None = None
    running_asked: int | None = None
    if window is None:
        if ok:
            cause, by_client, ask = _no_window(
                ok, tr, level.concurrency or 1, open_loop, settle_steps, client
            )
            invalid.append("no steady-state window: " + cause)
            if by_client:
                transient.append(invalid[-1])
                client_stall = invalid[-1]
            if ask:
                running_asked = level.concurrency
    else:
        window_s = window[1] - window[0]
        count = (
            tokens_between
            if tr.cut_at is not None
            else tokens_in_window
            if open_loop
            else tokens_in_steps
        )
        window_tokens = count(ok, *window)
        tok_s = window_tokens / window_s
    if empty:
        invalid.append(f"{len(empty)} request(s) answered 200 with no tokens")
    if ignore_eos:
        short = [
            r.completion_tokens
            for r in ok
            if not r.cut and r.completion_tokens != (r.max_tokens or max_tokens)
        ]
        if short:
            invalid.append(
                f"{len(short)} request(s) returned {sorted(set(short))[:5]} tokens instead of "
                f"max_tokens={max_tokens} under ignore_eos (server ignores ignore_eos, or the "
                "context length truncates)"
            )
    usage = usage_reasons(records)
    if usage is not None:
        invalid.append(usage)
    # a request whose usage was refused counts its events: said above, not as "no usage"
    approx = sum(1 for r in ok if r.tokens_approx and r.usage_error is None)
    lag = client.lag_p99_within(*window) if window is not None else client.loop_lag_p99_s
    lag_limit = max(CLIENT_LAG_LIMIT_S, read_gap_p50(ok))
    delay = send_delay_p99_within(records, window)
    notes: list[str] = []
    busy = client.cpu_share > CLIENT_BUSY_CPU
    late_sends = delay > CLIENT_LAG_LIMIT_S
    flood = flood_reason(records)
    if flood is not None:
        invalid.append(flood)
    if client.cpu_share > CLIENT_CPU_LIMIT or (busy and (late_sends or lag > lag_limit)):
        figures = (
            f"event-loop lag p99 {lag * 1e3:.1f} ms vs limit {lag_limit * 1e3:.1f} ms, send "
            f"delay p99 {delay * 1e3:.1f} ms, CPU {client.cpu_share:.0%} of a core"
        )
        if flood is not None:
            # the flood is the cause, said above: more client processes would parse more of it
            notes.append(f"note: the load client was saturated by the event flood ({figures})")
        elif streams_per_process(tr) <= 1:
            # one stream a process: more processes cannot split it
            invalid.append(
                f"load client saturated by one stream ({figures}): {one_stream_flood(ok)}, "
                "faster than a model decodes; more --perf-workers cannot split one stream: "
                "fix the server (or the proxy in front of it)"
            )
        else:
            invalid.append(
                f"load client saturated ({figures}): the figure would be the client's limit; "
                "shard the client with --perf-workers"
            )
    elif late_sends:
        # Sends late while the client was mostly idle: it waited for a CPU (descheduled), it
        # did not run out of one.  The server still had fewer requests than asked, so the
        # trial is void, but for the moment only: another trial may replace it.
        invalid.append(
            f"load client stalled: its sends were late by {delay * 1e3:.1f} ms (p99) while it "
            f"used {client.cpu_share:.0%} of a core; another process or the machine took its "
            "core, so the server had fewer requests than asked: give the client a quieter core"
        )
        transient.append(invalid[-1])
        client_stall = invalid[-1]
    elif lag > lag_limit and window is not None:
        stall = client.lag_max_within(*window)
        bound = (client.stall_at(window[0]) + client.stall_at(window[1])) / window_s
        text = (
            f"load client stalled: its event loop waited up to {stall * 1e3:.0f} ms (p99 "
            f"{lag * 1e3:.1f} ms) for a CPU while using {client.cpu_share:.0%} of a core; another "
            "process or the machine took its core"
        )
        if bound > STALL_ERROR_LIMIT:
            invalid.append(
                f"{text}, so tok/s could be off by up to {bound:.1%} (more than "
                f"{STALL_ERROR_LIMIT:.0%}): give the client a quieter core"
            )
            transient.append(invalid[-1])
        else:
            notes.append(
                f"note: {text}; tok/s is off by at most {bound:.2%}, latencies by the stall "
                "(they are left out of the latency figures)"
            )
        client_stall = text
    # a client saturated by several streams a process reads each late, in lumps of its own
    # making; one stream a process has nothing else to be late for
    saturated = any(msg.startswith("load client saturated") for msg in invalid)
    crowded = saturated and streams_per_process(tr) > 1
    buffered = None if crowded else buffered_reason(ok, client)
    if buffered is not None:
        # first: a lumped stream is why its window is short or missing, and the first reason
        # is the one a refused baseline names
        invalid.insert(0, buffered)
    errors: list[str] = []
    for r in failed:
        if r.error and r.error not in errors:
            errors.append(r.error)
        if len(errors) >= 3:
            break
    if approx:
        errors.append(f"note: {approx} request(s) sent no usage; tokens counted from events")
    if estimated:
        errors.append(
            f"note: {estimated} stream(s) cut by the time box carried no running usage "
            "(continuous_usage_stats); their tokens were estimated from their events"
        )
    errors.extend(notes)
    return TrialResult(
        index=index,
        label=level.label,
        tok_s=tok_s,
        window_s=window_s,
        window_tokens=window_tokens,
        requests_ok=len(ok),
        requests_failed=len(failed) + len(empty),
        wall_s=tr.ended - tr.started,
        client=client,
        invalid=invalid,
        errors=errors,
        stopped_early=tr.stopped_early,
        over_limit_s=tr.over_limit_s,
        records=records,
        offered_rate=level.rate,
        achieved_rate=getattr(tr, "achieved_rate", None),
        completed_rate=completed_rate(ok, window) if open_loop else None,
        window=window,
        transient=transient,
        client_stall=client_stall,
        running_asked=running_asked,
    )


@dataclass(slots=True)
class LevelFigures:
    """The level's headline figures over all its trials (what the report prints)."""

    tok_s: float | None
    trials_tok_s: list[float]
    spread_pct: float | None
    request_tok_s_p50: float | None
    ttft_s_p50: float | None
    ttft_s_p95: float | None
    itl_s_p50: float | None
    requests_ok: int
    requests_failed: int
    percentile: float = 95.0
    ttft_s_pct: float | None = None
    itl_s_pct: float | None = None
    e2e_s_pct: float | None = None
    """TTFT, inter-token latency and end-to-end latency at ``percentile``."""
    goodput: float | None = None
    """Share of requests meeting every latency ceiling (None when no ceiling is set)."""
    reasoning: ReasoningFigures | None = None
    """Reasoning and content apart; None unless some stream of the level separated them."""
    clock: float = 1.0
    """Server seconds per wall second the figures were converted with (the simulator's speed;
    1.0 for a real server): tok/s are divided by it, latencies multiplied."""
    achieved_rate: float | None = None
    """Open loop: median achieved request rate of the trials, per server second."""
    completed_rate: float | None = None
    """Open loop: median rate of finished requests in the trials' windows, per server second."""


@dataclass(slots=True)
class ReasoningFigures:
    """A reasoning model's two phases, for a level whose streams carried reasoning deltas.

    Why apart from TTFT and tok/s: with a reasoning parser the user waits through the thinking
    before the answer starts, so time to first *content* token (TTFC) is the latency they
    feel, while TTFT (first token of any kind) and tok/s (all output tokens, thinking
    included) stay what the server's batching delivers.  Token figures are means per
    successful request, so levels with different trial counts compare.
    """

    requests: int
    """Successful requests whose stream carried reasoning."""
    reasoning_tokens_mean: float
    content_tokens_mean: float
    """Reasoning and content (answer) tokens per successful request; they sum to all output."""
    ttfc_s_p50: float | None
    ttfc_s_p95: float | None
    ttfc_s_pct: float | None
    """Time to first content token at p50, p95 and the level's percentile (like TTFT)."""
    no_content: int = 0
    """Requests that ended still reasoning (``max_tokens`` hit while thinking): they have no
    TTFC and are left out of its percentiles, so a TTFC next to a non-zero count is optimistic."""


def reasoning_figures(
    ok: Sequence[RequestRecord], percentile_q: float, clock: float = 1.0
) -> ReasoningFigures | None:
    """:class:`ReasoningFigures` of the successful requests, None when none carried reasoning
    (a level without a reasoning parser shows nothing new)."""
    thinking = sum(1 for r in ok if r.reasoning_tokens)
    if not thinking:
        return None
    ttfcs = [x * clock for x in (r.ttfc for r in ok) if x is not None]
    return ReasoningFigures(
        requests=thinking,
        reasoning_tokens_mean=sum(r.reasoning_tokens for r in ok) / len(ok),
        content_tokens_mean=sum(r.content_tokens for r in ok) / len(ok),
        ttfc_s_p50=percentile(ttfcs, 50),
        ttfc_s_p95=percentile(ttfcs, 95),
        ttfc_s_pct=percentile(ttfcs, percentile_q),
        no_content=sum(1 for r in ok if r.first_content is None),
    )


@dataclass(frozen=True, slots=True)
class LatencyLimits:
    """Per-request ceilings that define a *good* request for goodput."""

    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    def any(self) -> bool:
        return any(x is not None for x in (self.ttft_s, self.itl_s, self.e2e_s))

    def met_by(self, rec: RequestRecord) -> bool:
        """TTFT, mean time per output token after the first (1 / decode rate), and end to end."""
        if self.ttft_s is not None and (rec.ttft is None or rec.ttft > self.ttft_s):
            return False
        if self.itl_s is not None:
            rate = rec.decode_tok_s
            if rate is None or 1.0 / rate > self.itl_s:
                return False
        return self.e2e_s is None or rec.e2e <= self.e2e_s


def level_figures(
    trials: Sequence[TrialResult],
    percentile_q: float = 95.0,
    limits: LatencyLimits = LatencyLimits(),
    clock: float = 1.0,
) -> LevelFigures:
    """The level's figures in the server's clock: records and trials are timed on the wall
    clock (the client's saturation checks need it); ``clock`` server seconds pass per wall
    second, so rates are divided by it and latencies (and the latency ceilings, given in
    server seconds) multiplied."""
    samples = [t.tok_s / clock for t in trials if t.valid and t.tok_s is not None]
    # a trial whose load client stalled times the client as much as the server: none of its
    # requests is in the latency figures (:attr:`TrialResult.latency_void`)
    timed = [t for t in trials if t.latency_void is None and t.client_stall is None]
    ok = [r for t in timed for r in t.records if r.ok]
    # streams a time box cut have no end, and a stationary trial's staggered first requests
    # (their own max_tokens) are shorter than the level's: both out of end-to-end latency
    # and goodput
    everyone = [r for t in timed for r in t.records if not r.cut and not r.max_tokens]
    whole = [r for r in ok if not r.cut and not r.max_tokens]
    rates = [x / clock for x in (r.decode_tok_s for r in ok) if x is not None]
    ttfts = [x * clock for x in (r.ttft for r in ok) if x is not None]
    itls = inter_token_latencies(ok) * clock
    mid = median(samples) if samples else None
    spread = (max(samples) - min(samples)) / mid * 100 if mid and len(samples) > 1 else None
    goodput = None
    if limits.any() and everyone:
        wall = LatencyLimits(
            *(None if x is None else x / clock for x in (limits.ttft_s, limits.itl_s, limits.e2e_s))
        )
        goodput = sum(1 for r in everyone if r.ok and wall.met_by(r)) / len(everyone)
    achieved = [t.achieved_rate / clock for t in trials if t.achieved_rate is not None]
    completed = [t.completed_rate / clock for t in trials if t.completed_rate is not None]
    return LevelFigures(
        tok_s=mid,
        trials_tok_s=samples,
        spread_pct=spread,
        request_tok_s_p50=percentile(rates, 50),
        ttft_s_p50=percentile(ttfts, 50),
        ttft_s_p95=percentile(ttfts, 95),
        itl_s_p50=percentile(itls, 50),
        requests_ok=sum(t.requests_ok for t in trials),
        requests_failed=sum(t.requests_failed for t in trials),
        percentile=percentile_q,
        ttft_s_pct=percentile(ttfts, percentile_q),
        itl_s_pct=percentile(itls, percentile_q),
        e2e_s_pct=percentile([r.e2e * clock for r in whole], percentile_q),
        goodput=goodput,
        reasoning=reasoning_figures(ok, percentile_q, clock),
        clock=clock,
        achieved_rate=median(achieved) if achieved else None,
        completed_rate=median(completed) if completed else None,
    )
