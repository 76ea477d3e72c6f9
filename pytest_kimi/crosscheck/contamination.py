"""Contamination: requests on the server that this run did not send, or no longer wants.

Why: a trial's figure is the server's rate for the load the client offers, and only that load.
Two things put other requests into the server's batch without the client seeing them:

- **zombies**: the stationary protocol ends every trial by cutting the streams in flight; a
  server (or a proxy in front of it) that keeps decoding a request whose client disconnected
  carries them into the next trial, which shares its batch with them (a tester's scattered
  trials passed: docs/evidence/engines.md, "Observed on real servers");
- **foreign load**: another client on the same server (a second run got a false regression).

The server's own gauges say how many requests it holds: SGLang's ``sglang:num_running_reqs`` +
``sglang:num_queue_reqs``, vLLM's ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``
(the simulator serves SGLang's).  Before each trial the check reads them and waits, bounded
(:data:`DRAIN_FACTOR` requests' lengths), for them to drain to what the client has in flight:
nothing, between trials.  During the trial a few scrapes (:data:`SAMPLES_PER_TRIAL`) are set
against the client's own requests in flight at that instant, counted afterwards from the
records' send and end stamps.  A trial that starts on a server still busy, or during which the
server holds more than the client sent, is void (non-transient: another trial would meet the
same server), and the reason says which it was: zombies while the count is within the requests
the client closed before they ended, foreign load beyond them, with nothing closed, or once
another client was found (its count moves, and what was cut cannot be told apart from it).

Some servers publish their gauges late (SGLang when it logs: every 40 decode steps while busy
and, on some releases, up to 30 s after it went idle).  So a count is taken for load only while
something moves (the count itself, or the generated-token counter): one that stays put for
:data:`QUIET_S` with nothing generated is a stale gauge.  The trial is then not voided and its
in-trial comparison is skipped; the level says so.  That fails open (a server holding a constant
zombie count that counts tokens per finished request would pass there), never voids a trial
that a gauge's lag alone stained.

A server without the gauges (no ``/metrics``, none of those names, a page over the size cap)
cannot be checked: each level says so once in its notes.  Nothing here imports pytest: every
perf test's measurement carries a :class:`ContaminationCheck` (``MeasureSpec.guard``), beside
any ``--perf-server-metrics`` observer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from statistics import median
from time import perf_counter
from typing import Sequence

from pytest_kimi.crosscheck.counter_scraper import GENERATION_COUNTERS
from pytest_kimi.crosscheck.metrics_page import MetricsPage, ServerMetricsError, stop_sampler
from pytest_kimi.crosscheck.prometheus_text import parse_metrics
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.wire import ContaminationSection, LevelSummary

GAUGES: tuple[tuple[str, str], ...] = (
    ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ("vllm:num_requests_running", "vllm:num_requests_waiting"),
)
"""(running, queued) request gauges of each engine, in the order looked for."""

DRAIN_FACTOR = 2.0
"""The wait before a trial for the server to drain, in requests' lengths (as the trial before
showed them).  A cut stream has at most a whole request left, decoded in a batch no bigger
than the trial's; twice that covers the server's jitter and a busy client machine, so a server
that still holds them then is not draining them."""
DRAIN_MIN_S = 1.0
"""The shortest drain wait, and the wait before the first trial (no request length known yet):
an abort reaches the gauges within a scheduler step or a publish, and the warm-up's requests
ended whole."""
DRAIN_POLL_S = 0.05
"""Re-read interval while waiting for the server to drain: a small GET each."""
DRAIN_NOTE_S = 0.5
"""A drain that took longer than this is the server finishing requests (zombies, another
client's), not the moment an abort takes: the level notes it."""
QUIET_S = 1.0
"""A count that neither changes nor comes with generated tokens for this long is a gauge
published late, not load: a server that decodes moves its token counter every step (vLLM, the
simulator) and its count as requests end."""
SAMPLES_PER_TRIAL = 4
"""Scrapes during a trial (spread over the length of the one before): a few GETs per trial,
never one per chunk, on the load client's loop."""
FIRST_SAMPLE_S = 0.25
"""Scrape interval during a test's first trial (no trial length known yet)."""
SAMPLE_MIN_S = 0.1
SAMPLE_MAX_S = 5.0
GAUGE_LAG_STEPS = 50
"""How far behind the client's own count the server's may be, in decode steps: SGLang
publishes its gauges every 40 decode steps (``decode_log_interval``).  A scrape is set against
the most the client had in flight over that span before it, so a gauge's lag is not load."""
GAUGE_LAG_MIN_S = 0.25
READ_TIMEOUT_S = 5.0

ZOMBIES = (
    "zombies: the server still ran {n} requests the client had cut (it does not abort "
    "requests whose client disconnected; put no proxy in between, or use "
    "--perf-protocol=whole-requests)"
)
FOREIGN = (
    "foreign load: the server ran {n} requests this run did not send (another client on this "
    "server?)"
)
NO_GAUGES_HINT = (
    "the server exposes no /metrics (SGLang serves it with --enable-metrics, vLLM by default)"
)


class GaugesMissing(ServerMetricsError):
    """The metrics page has none of the running/queued gauges this check knows."""


@dataclass(frozen=True, slots=True)
class Reading:
    """The gauges at one scrape, on the client's ``perf_counter`` clock."""

    sent: float
    got: float
    held: int
    """Requests the server holds: running + queued."""
    generated: float | None
    """The generated-token counter, where the page has one (None: it has not)."""


class GaugeReader:
    """The gauges at ``GET /metrics`` (a :class:`MetricsPage`: never a load connection, the
    page capped like every metrics read); finds which gauges the server has at the first read."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.page = MetricsPage(base_url, headers, timeout_s, NO_GAUGES_HINT)
        self.url = self.page.url
        self.gauges: tuple[str, str] | None = None

    async def open(self) -> None:
        await self.page.open()

    async def close(self) -> None:
        await self.page.close()

    async def read(self) -> Reading:
        """The gauges now; raises :class:`ServerMetricsError` naming the URL on failure."""
        sent = perf_counter()
        text = await self.page.get()
        got = perf_counter()
        names = [n for pair in GAUGES for n in pair] + list(GENERATION_COUNTERS)
        totals = parse_metrics(text, names)
        if self.gauges is None:
            self.gauges = next((pair for pair in GAUGES if pair[0] in totals.totals), None)
            if self.gauges is None:
                raise GaugesMissing(
                    f"{self.url} has none of {', '.join(pair[0] for pair in GAUGES)}"
                )
        running = totals.get(self.gauges[0])
        if running is None:
            raise GaugesMissing(f"{self.url} no longer shows {self.gauges[0]}")
        held = running + (totals.get(self.gauges[1]) or 0.0)
        generated = next((totals.get(n) for n in GENERATION_COUNTERS if n in totals.totals), None)
        return Reading(sent, got, max(0, round(held)), generated)


@dataclass(slots=True)
class _LevelLog:
    """What one level's trials met, for its JSON and notes."""

    checked: int = 0
    void: int = 0
    drained: list[tuple[int, float, bool]] = field(default_factory=list)
    """(requests held, seconds to drain, whether the client had closed requests before)."""
    undrained: list[float] = field(default_factory=list)
    """Seconds waited in vain before the trials voided for it."""
    stale: list[int] = field(default_factory=list)
    """Counts taken for a late gauge: the trials whose in-trial comparison was skipped."""


class ContaminationCheck:
    """The :class:`~pytest_kimi.measure.measure_spec.TrialObserver` that voids a trial run beside
    requests this run did not send or had cut (module docstring).  Best effort: it never raises;
    a server it cannot read is noted."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str] | None = None,
        *,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.reader = GaugeReader(base_url, headers, timeout_s)
        self.unavailable: str | None = None
        """Why the check is not possible on this server (None: it is, so far)."""
        self._closed_early = 0
        """Requests the client closed before they ended (cut, timed out) and has not yet seen
        drained: what the server may still hold as zombies."""
        self._foreign = 0
        """Requests of another client the server held when last found (0: none): what a
        count beyond them is not, however many streams the client has cut since."""
        self._request_s: float | None = None
        """A request's length as the last trial showed it (wall seconds)."""
        self._trial_s: float | None = None
        self._reason: str | None = None
        self._trusted = False
        """The gauges drained before this trial: its in-trial scrapes can be compared."""
        self._samples: list[Reading] = []
        self._sampler: asyncio.Task[None] | None = None
        self._level = _LevelLog()

    async def open(self) -> None:
        await self.reader.open()

    async def close(self) -> None:
        await self._stop_sampler()
        await self.reader.close()

    # ------------------------------------------------------------------ before the trial

    def drain_bound_s(self) -> float:
        """How long to wait for the server to drain (:data:`DRAIN_FACTOR`)."""
        if self._request_s is None:
            return DRAIN_MIN_S
        return max(DRAIN_MIN_S, DRAIN_FACTOR * self._request_s)

    async def before_trial(self) -> None:
        await self._stop_sampler()
        self._samples = []
        self._reason = None
        self._trusted = False
        if self.unavailable is not None:
            return
        try:
            await self.reader.open()
            reading = await self.reader.read()
            if reading.held > 0:
                await self._drain(reading)
            else:
                self._trusted = True
                self._closed_early = self._foreign = 0
        except ServerMetricsError as exc:
            self.unavailable = str(exc)
            return
        self._sampler = asyncio.ensure_future(self._sample_loop())

    async def _drain(self, first: Reading) -> None:
        bound = self.drain_bound_s()
        last = moved_at = first
        while last.held > 0 and last.got - first.got < bound:
            await asyncio.sleep(DRAIN_POLL_S)
            now = await self.reader.read()
            if now.held != last.held or _rose(last.generated, now.generated):
                moved_at = now
            last = now
            if last.held > 0 and last.got - moved_at.got >= QUIET_S:
                # nothing moved: a gauge published late, not requests being decoded
                self._level.stale.append(last.held)
                return
        waited = last.got - first.sent
        if last.held == 0:
            self._trusted = True
            if waited >= DRAIN_NOTE_S:
                zombies = self._closed_early > 0 and self._foreign == 0
                self._level.drained.append((first.held, waited, zombies))
            self._closed_early = self._foreign = 0
            return
        self._reason = self._classify(last.held, self._closed_early) + (
            f"; found before the trial, still there after the wait for the server to drain "
            f"({DRAIN_FACTOR:g}x a request's length, at least {DRAIN_MIN_S:g} s)"
        )
        self._level.undrained.append(round(waited, 3))
        self._closed_early = min(self._closed_early, last.held)

    def _classify(self, excess: int, closed: int) -> str:
        """Zombies as far as the requests the client closed early explain the count; foreign
        load beyond them.  Once another client's requests were found, all of the count is
        theirs: that client's count moves from one reading to the next (its streams end and
        start again), so what the trial cut cannot be told apart from it, and the reason names
        only what is certain (a trial with a known other client is void either way)."""
        zombies = min(closed, excess) if self._foreign == 0 else 0
        foreign = excess - zombies
        self._foreign = foreign
        if foreign <= 0:
            return ZOMBIES.format(n=zombies)
        text = FOREIGN.format(n=foreign)
        if zombies:
            text += f", and {ZOMBIES.format(n=zombies)}"
        return text

    # ------------------------------------------------------------------ during the trial

    async def _sample_loop(self) -> None:
        interval = (
            FIRST_SAMPLE_S
            if self._trial_s is None
            else min(SAMPLE_MAX_S, max(SAMPLE_MIN_S, self._trial_s / SAMPLES_PER_TRIAL))
        )
        while True:
            await asyncio.sleep(interval)
            try:
                self._samples.append(await self.reader.read())
            except ServerMetricsError:
                return  # the trial is then judged on the scrapes it got

    async def _stop_sampler(self) -> None:
        task, self._sampler = self._sampler, None
        await stop_sampler(task)

    async def after_trial(self, trial: TrialResult) -> None:
        await self._stop_sampler()
        records = trial.records
        if self.unavailable is None:
            self._level.checked += 1
        if self._reason is not None:
            trial.invalid.append(self._reason)
            self._level.void += 1
        elif self._trusted:
            found = excess_in_flight(records, self._samples)
            if found is not None:
                excess, closed = found
                trial.invalid.append(self._classify(excess, closed) + "; seen while the trial ran")
                self._level.void += 1
        self._closed_early += sum(1 for r in records if _closed_by_client(r))
        self._request_s = request_length_s(records) or self._request_s
        sent = [r.sent for r in records if r.sent]
        if sent:
            self._trial_s = max(r.end for r in records) - min(sent)

    # ------------------------------------------------------------------ the level

    def level_summary(self) -> LevelSummary:
        """``{"contamination": {...}, "notes": [...]}`` for the level (notes: its reports)."""
        log, self._level = self._level, _LevelLog()
        notes: list[str] = []
        if self.unavailable is not None:
            notes.append(
                f"contamination check not possible: {self.unavailable} (zombies of cut streams "
                "or another client's load on the server would go unnoticed)"
            )
            return {"contamination": {"checked": False, "why": self.unavailable}, "notes": notes}
        zombies = [(n, s) for n, s, closed in log.drained if closed]
        others = [(n, s) for n, s, closed in log.drained if not closed]
        if zombies:
            notes.append(
                f"zombies: the server kept decoding up to {max(n for n, _ in zombies)} requests "
                f"the client had cut, for up to {max(s for _, s in zombies):.1f} s (it does not "
                f"abort requests whose client disconnected); {len(zombies)} trial(s) waited for "
                "them to drain: put no proxy in between, or use --perf-protocol=whole-requests"
            )
        if others:
            notes.append(
                f"the server held up to {max(n for n, _ in others)} requests this run did not "
                f"send before {len(others)} trial(s) (another client on this server?); they "
                f"waited up to {max(s for _, s in others):.1f} s for them to end"
            )
        if log.stale:
            notes.append(
                f"the server's request gauges read up to {max(log.stale)} with nothing moving "
                f"while this run had nothing in flight ({len(log.stale)} trial(s)): taken for "
                "gauges published late, not load; those trials were not compared during the run"
            )
        entry: ContaminationSection = {
            "checked": True,
            "gauges": list(self.reader.gauges or ()),
            "trials": log.checked,
            "void": log.void,
        }
        if log.drained:
            entry["drain_waits_s"] = [round(s, 3) for _, s, _ in log.drained]
        if log.undrained:
            entry["undrained_waits_s"] = log.undrained
        if log.stale:
            entry["stale_gauges"] = len(log.stale)
        return {"contamination": entry, "notes": notes}


NOTE_STARTS = (
    "contamination check not possible",
    "zombies:",
    "the server held up to",
    "the server's request gauges",
)
"""How this check's level notes begin: the terminal summary shows them (the other sinks show
every note)."""


def _rose(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and after > before


def _closed_by_client(r: RequestRecord) -> bool:
    """The client closed the request before it ended (cut, or an error mid-stream such as a
    timeout): the server may still be running it."""
    return bool(r.sent) and (r.cut or (r.error is not None and r.status in (0, 200)))


def request_length_s(records: Sequence[RequestRecord]) -> float | None:
    """A whole request's length on this server, as a trial's records show it (wall seconds):
    its longest whole request, or (a stationary trial may finish none of full length) the
    per-token time times the longest request asked for, plus the slowest first token."""
    whole = [r.e2e for r in records if r.ok and not r.cut]
    rates = [rate for r in records if r.ok and (rate := r.decode_tok_s)]
    if not whole and not rates:
        return None
    longest = max(whole, default=0.0)
    if rates:
        # a stream's first request asks for at least half the level's max_tokens
        tokens = max(
            max((r.completion_tokens for r in records), default=0),
            2 * max((r.max_tokens for r in records), default=0),
        )
        ttft = max((t for r in records if (t := r.ttft) is not None), default=0.0)
        longest = max(longest, tokens / median(rates) + ttft)
    return longest


def _step_s(records: Sequence[RequestRecord]) -> float:
    """A decode step's wall time as the trial's streams read it (their median read gap)."""
    gaps = [
        (r.chunk_times[-1] - r.chunk_times[0]) / (len(r.chunk_times) - 1)
        for r in records
        if len(r.chunk_times) > 1
    ]
    return median(gaps) if gaps else 0.0


def excess_in_flight(
    records: Sequence[RequestRecord], samples: Sequence[Reading]
) -> tuple[int, int] | None:
    """The largest count by which a scrape taken while the trial ran exceeded the most
    requests the client had in flight over the gauge's lag before it (:data:`GAUGE_LAG_STEPS`),
    with the requests the client had closed early by then; None when none exceeded it."""
    spans = sorted((r.sent, max(r.end, r.sent)) for r in records if r.sent)
    if not spans or not samples:
        return None
    start = spans[0][0]
    end = max(e for _, e in spans)
    lag = max(GAUGE_LAG_MIN_S, GAUGE_LAG_STEPS * _step_s(records))
    worst: tuple[int, int] | None = None
    for s in samples:
        if s.sent < start or s.got > end:
            continue  # before the first send or after the last end: nothing to compare
        client = _most_in_flight(spans, s.sent - lag, s.got)
        excess = s.held - client
        if excess > 0 and (worst is None or excess > worst[0]):
            closed = sum(1 for r in records if _closed_by_client(r) and r.end < s.sent)
            worst = (excess, closed)
    return worst


def _most_in_flight(spans: Sequence[tuple[float, float]], lo: float, hi: float) -> int:
    """The most ``[sent, end]`` spans open at one instant of ``[lo, hi]``."""
    events = [(max(a, lo), 1) for a, b in spans if a <= hi and b >= lo]
    events += [(b, -1) for a, b in spans if a <= hi and lo <= b <= hi]
    events.sort(key=lambda e: (e[0], -e[1]))
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return most
