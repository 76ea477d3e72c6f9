"""``--perf-server-metrics``: the client's figures checked against the server's own counters.

Why: a load tester's figures are only as good as its clock and its counting.  SGLang (with
``--enable-metrics``) and vLLM count the tokens they generate in a Prometheus counter at
``GET /metrics``; if the client and the server disagree about how many tokens a trial produced,
or how fast, the figure is not to be trusted: another client was using the server, the server
counts differently, or the client mis-timed what it saw.

Two checks per trial, each a reason in the trial's ``invalid`` list when it fails (so the level
becomes ``invalid`` and adaptive trials ignore the sample):

- **exact**: the counter's rise over the trial must *equal* the client's token count (the sum of
  ``usage.completion_tokens`` over the trial's requests).  Nothing else runs on a benchmark
  server, so there is no noise to allow for: any difference is a finding.  Counters update
  asynchronously (vLLM records a step's stats after sending its outputs), so the scrape after
  the trial *settles* first (:func:`settle_after`).
- **rate**: the counter's slope inside the trial's steady-state window must agree with the
  client's steady-state tok/s within :data:`RATE_TOLERANCE` (plus the timing uncertainty of the
  two scrapes used).  A sampler scrapes every :data:`SAMPLE_INTERVAL_S` while the trial runs.

SGLang increments its counter once per *finished* request, not per generated token; such a
counter has no meaningful slope inside a window that requests straddle.  Which kind a server
has is read from the samples themselves (:func:`counting_mode`), and a per-request counter gets
the exact check only, which the figures say.

Nothing here imports pytest: the plugin attaches a :class:`ServerMetricsObserver` to the
measurement (``MeasureSpec.observer``) and the reports read :meth:`level_summary`'s dict.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from statistics import median
from time import perf_counter
from typing import Any, Sequence

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from pytest_kimi.endpoint.bounded import BodyTooLarge, read_body_capped
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.trial_causes import GAUGE_UNREAD, gauge_finding
from pytest_kimi.load.records import RequestRecord

GENERATION_COUNTERS = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")
"""The generated-token counter under each engine's prefix, in the order they are looked for."""
PROMPT_COUNTERS = {"vllm:": "vllm:prompt_tokens_total", "sglang:": "sglang:prompt_tokens_total"}
REQUEST_COUNTERS = {"vllm:": "vllm:request_success_total", "sglang:": "sglang:num_requests_total"}
"""Read and reported when present (not checked: servers differ in what they count as a request)."""
RUNNING_GAUGES = ("sglang:num_running_reqs", "vllm:num_requests_running")
"""The requests the server runs at once, under each engine's prefix: read with every scrape,
so a trial whose streams did not all start says whether the server ran fewer than C
(:func:`pytest_kimi.measure.trial_causes.gauge_finding`) instead of guessing."""
LAZY_COUNTERS = frozenset(
    {"sglang:generation_tokens_total", PROMPT_COUNTERS["sglang:"], REQUEST_COUNTERS["sglang:"]}
)
"""Counters SGLang 0.5.23 writes first when a request finishes (``observe_one_finished_request``
in ``metrics_collector.py``; its multiprocess registry lists a counter only once a sample was
written): a fresh server's page has its gauges but none of these.  Until first seen they read
as 0; one that was seen and is gone is an error."""

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
SETTLE_INTERVAL_S = 0.05
"""Re-scrape interval while the counter settles after (and before) a trial."""
SETTLE_TIMEOUT_S = 1.0
"""Longest wait for the counter to settle; it is then taken as it is."""
SETTLE_QUIET_S = 0.2
"""A counter unchanged this long after the trial is settled even when it disagrees."""
SCRAPE_TIMEOUT_S = 10.0
METRICS_MAX_BYTES = 16 * 2**20
"""Largest ``/metrics`` page read (after decompression).  SGLang's and vLLM's pages are tens to
hundreds of kilobytes (vLLM's histograms per label set are the bulk); 16 MB is far above any
of them, while a page past it (a proxy's stream, a label-cardinality explosion: a tester's
200 MB page was read whole) would hold the load client's event loop and its memory for
nothing.  Every reader of the page (these checks, the prefix-cache probe, the contamination
check) stops there and says so."""

NO_METRICS_HINT = (
    "the server exposes no /metrics: launch SGLang with --enable-metrics (vLLM serves it by "
    "default) or drop --perf-server-metrics"
)


class ServerMetricsError(RuntimeError):
    """The server's counters cannot be read; the message names the URL and what to do."""


class MetricsTooLarge(ServerMetricsError):
    """The page is larger than :data:`METRICS_MAX_BYTES`: it was not read to its end."""


async def read_capped(
    resp: aiohttp.ClientResponse, url: str, limit: int = METRICS_MAX_BYTES
) -> str:
    """The response's body as text (UTF-8, the exposition format's encoding; bad bytes
    replaced), read in blocks and given up on as soon as it passes ``limit`` bytes: a size the
    server announces is refused before a byte is read, one it does not is counted as it comes
    (:func:`pytest_kimi.endpoint.bounded.read_body_capped`, which discovery reads with too)."""
    try:
        body = await read_body_capped(resp, limit)
    except BodyTooLarge:
        raise MetricsTooLarge(
            f"{url} sent more than {limit / 2**20:g} MB, the cap on a metrics page "
            f"(METRICS_MAX_BYTES; SGLang's and vLLM's are well under 1 MB): it was not read -- "
            "is something other than the server's Prometheus endpoint answering there?"
        ) from None
    return body.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------ parsing
#
# The text exposition format is parsed by prometheus_client's parser (the reference
# implementation, escapes, special values and timestamps included).  Two things it does not do
# are done here: it stops at the first malformed line, while a scrape must keep every good
# sample of a page with one bad line (a proxy's HTML error page, a truncated read), so a page
# that fails whole is parsed again line by line; and it parses every line, while the scrapes
# during a trial run on the load client's loop and vLLM's page has hundreds of histogram
# lines nobody needs, so lines are filtered by name prefix first.


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of the text exposition format: ``name{labels} value [timestamp]``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(slots=True)
class MetricTotals:
    """Each sample name's value summed over all its label sets (engines, models, reasons)."""

    totals: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    bad_lines: int = 0
    """Lines that were neither comments nor samples: counted, never fatal."""

    def get(self, name: str) -> float | None:
        return self.totals.get(name)


def _parse(text: str) -> list[Sample]:
    """Every sample of ``text`` (no comment lines); ValueError when any line is malformed."""
    return [
        Sample(s.name, tuple(sorted(s.labels.items())), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def parse_sample(line: str) -> Sample | None:
    """One sample line, or None for a blank line, a comment or a malformed line.

    ``+Inf``, ``-Inf`` and ``NaN`` are values like any other; an optional timestamp is ignored
    (a counter's value is what it is when scraped).
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    try:
        samples = _parse(line + "\n")
    except ValueError:
        return None
    return samples[0] if len(samples) == 1 else None


def parse_metrics(text: str, names: Sequence[str] | None = None) -> MetricTotals:
    """Sum every sample name over its label sets: enough for counters, and never raises.

    vLLM labels its counters per engine (``{engine="0",model_name="..."}``) and per finish
    reason; the server's total is the sum.  Comments (``# HELP``, ``# TYPE``, ``# EOF``) and
    lines that do not parse are skipped; the latter are counted in ``bad_lines``.

    ``names``: parse only lines that start with one of these (the scrapes during a trial run on
    the load client's loop, and vLLM's page has hundreds of histogram lines nobody needs).
    """
    out = MetricTotals()
    wanted = tuple(names) if names is not None else None
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # no TYPE lines: sample names stay exactly as written (``*_total``)
        if wanted is None or stripped.startswith(wanted):
            lines.append(stripped)
    try:
        samples = _parse("\n".join(lines) + "\n") if lines else []
    except ValueError:
        samples = []
        for line in lines:
            sample = parse_sample(line)
            if sample is None:
                out.bad_lines += 1
            else:
                samples.append(sample)
    for sample in samples:
        if wanted is not None and sample.name not in wanted:
            continue
        out.samples += 1
        out.totals[sample.name] = out.totals.get(sample.name, 0.0) + sample.value
    return out


@dataclass(frozen=True, slots=True)
class CounterNames:
    """Which counters this server has, found once from the first scrape."""

    generation: str
    prompt: str | None = None
    requests: str | None = None

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(n for n in (self.generation, self.prompt, self.requests) if n is not None)

    @classmethod
    def find(cls, metrics: MetricTotals, url: str, text: str = "") -> CounterNames:
        """The generation-token counter under either prefix, or an error naming what was found."""
        for name in GENERATION_COUNTERS:
            if name in metrics.totals:
                prefix = name.split(":", 1)[0] + ":"
                prompt = PROMPT_COUNTERS[prefix]
                requests = REQUEST_COUNTERS[prefix]
                return cls(
                    name,
                    prompt if prompt in metrics.totals else None,
                    requests if requests in metrics.totals else None,
                )
        if any(n.startswith("sglang:") for n in metrics.totals):
            # SGLang before its first finished request: the counters come with it
            return cls(
                "sglang:generation_tokens_total",
                PROMPT_COUNTERS["sglang:"],
                REQUEST_COUNTERS["sglang:"],
            )
        wanted = " or ".join(GENERATION_COUNTERS)
        if not metrics.totals:
            head = " ".join(text.split())[:80]
            raise ServerMetricsError(
                f"{url} answered 200 but holds no Prometheus samples (it starts {head!r}): is this "
                f"the server's metrics endpoint? --perf-server-metrics needs {wanted}"
            )
        names = sorted(metrics.totals)
        tokenish = [n for n in names if "token" in n]
        shown = (tokenish or names)[:8]
        more = len(tokenish or names) - len(shown)
        raise ServerMetricsError(
            f"{url} has no generation-token counter ({wanted}); it has {len(names)} metric(s), "
            f"among them {', '.join(shown)}"
            + (f" and {more} more" if more > 0 else "")
            + ": --perf-server-metrics knows SGLang's and vLLM's counters only (vLLM drops them "
            "under --disable-log-stats)"
        )


# ------------------------------------------------------------------------------------ scraping


async def get_metrics_page(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    timeout_s: float,
    no_metrics_hint: str = NO_METRICS_HINT,
) -> str:
    """``GET url`` (a ``/metrics`` page) as text, capped at :data:`METRICS_MAX_BYTES`; raises
    :class:`ServerMetricsError` naming the URL and what went wrong (``no_metrics_hint``: what a
    404 means to the caller)."""
    try:
        async with session.get(url, headers=headers) as resp:
            status = resp.status
            text = await read_capped(resp, url)
    except asyncio.TimeoutError:
        raise ServerMetricsError(f"{url} did not answer within {timeout_s:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ServerMetricsError(
            f"cannot read the server's counters at {url} ({exc.__class__.__name__}: {exc})"
        ) from None
    if status == 404:
        raise ServerMetricsError(f"{url} answered 404: {no_metrics_hint}")
    if status != 200:
        raise ServerMetricsError(
            f"{url} answered HTTP {status} ({' '.join(text.split())[:120]!r}): the "
            "server's counters cannot be read"
        )
    return text


async def stop_sampler(task: asyncio.Future[None] | None) -> None:
    """Cancel a check's background scrape loop and wait until it is gone (its scrapes end
    with the trial: one still in flight must not land in the next trial's samples)."""
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class MetricsPage:
    """``GET /metrics`` with a small ``aiohttp`` session of its own, the page capped at
    :data:`METRICS_MAX_BYTES`: the one way every cross-check reads the server's counters.

    A session of its own (at most 2 connections) so that a read never waits for, or takes, a
    connection of the load client's pool; of the request headers only ``Authorization`` is
    sent (a key-protected server guards ``/metrics`` too; nothing else of the load's headers
    concerns it).
    """

    def __init__(
        self, base_url: str, headers: dict[str, str] | None, timeout_s: float, hint: str
    ) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.headers = {k: v for k, v in (headers or {}).items() if k.lower() == "authorization"}
        self.timeout_s = timeout_s
        self.hint = hint
        """What a 404 means to the caller (the error's fix)."""
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=2),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self) -> str:
        """The page as text; raises :class:`ServerMetricsError` naming the URL and what went
        wrong (:class:`MetricsTooLarge` past the cap)."""
        if self._session is None:
            raise RuntimeError(f"{type(self).__name__} for {self.url} is not open")
        return await get_metrics_page(
            self._session, self.url, self.headers, self.timeout_s, self.hint
        )


@dataclass(frozen=True, slots=True)
class Scrape:
    """The counters at one instant of the client's ``perf_counter`` clock."""

    t: float
    """Midpoint of request and response: the server read its counters somewhere between."""
    half_rtt_s: float
    """Half the round trip: how far from ``t`` the true reading instant can be."""
    generation: float
    prompt: float | None = None
    requests: float | None = None
    running: float | None = None
    """The server's running-requests gauge (:data:`RUNNING_GAUGES`); None where it has none."""
    running_gauge: str | None = None


class MetricsScraper:
    """GET ``/metrics`` on the loop the load runs on, with a small session of its own.

    Through a :class:`MetricsPage` (its own small session).  Timestamps are ``time.perf_counter()``,
    the clock every request record uses (one system-wide monotonic clock, also for the worker
    processes of ``--perf-workers``).
    """

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self.page = MetricsPage(base_url, headers, timeout_s, NO_METRICS_HINT)
        self.url = self.page.url
        self.names: CounterNames | None = None
        self._seen: set[str] = set()
        """Counters some scrape showed: a :data:`LAZY_COUNTERS` one is 0 only before that."""

    async def open(self) -> CounterNames:
        """Open the session and find the counters: raises :class:`ServerMetricsError` when the
        server has none, so a test fails before any load is sent."""
        await self.page.open()
        text = await self.page.get()
        metrics = parse_metrics(text)
        self.names = CounterNames.find(metrics, self.url, text)
        return self.names

    async def close(self) -> None:
        await self.page.close()

    async def scrape(self) -> Scrape:
        """The counters now; raises :class:`ServerMetricsError` (naming the URL) on failure."""
        if self.names is None:
            raise RuntimeError("MetricsScraper.open() finds the counters first")
        sent = perf_counter()
        text = await self.page.get()
        got = perf_counter()
        metrics = parse_metrics(text, self.names.all + RUNNING_GAUGES)
        value = self._value(metrics, self.names.generation)
        if value is None:
            raise ServerMetricsError(f"{self.url} no longer shows {self.names.generation}")
        if not math.isfinite(value):
            raise ServerMetricsError(f"{self.url} shows {self.names.generation} = {value}")
        return Scrape(
            t=(sent + got) / 2,
            half_rtt_s=(got - sent) / 2,
            generation=value,
            prompt=self._value(metrics, self.names.prompt) if self.names.prompt else None,
            requests=self._value(metrics, self.names.requests) if self.names.requests else None,
            running=next((metrics.totals[n] for n in RUNNING_GAUGES if n in metrics.totals), None),
            running_gauge=next((n for n in RUNNING_GAUGES if n in metrics.totals), None),
        )

    def _value(self, metrics: MetricTotals, name: str) -> float | None:
        """A counter's total; 0 for a :data:`LAZY_COUNTERS` one not written yet."""
        value = metrics.get(name)
        if value is not None:
            self._seen.add(name)
        elif name in LAZY_COUNTERS and name not in self._seen:
            return 0.0
        return value


async def settle_before(scraper: MetricsScraper) -> Scrape:
    """The counters before a trial, once they stop moving (the warm-up's or the previous
    trial's last tokens may still be on their way into them); at most :data:`SETTLE_TIMEOUT_S`."""
    prev = await scraper.scrape()
    deadline = prev.t + SETTLE_TIMEOUT_S
    while True:
        await asyncio.sleep(SETTLE_INTERVAL_S)
        cur = await scraper.scrape()
        if cur.generation == prev.generation or cur.t >= deadline:
            return cur
        prev = cur


async def settle_after(
    scraper: MetricsScraper, before: Scrape, expected: int | None
) -> list[Scrape]:
    """Scrapes after a trial until the counter's rise reaches ``expected`` (the client's count),
    or stays unchanged for :data:`SETTLE_QUIET_S`, or :data:`SETTLE_TIMEOUT_S` has passed.

    Why: engines update counters asynchronously; vLLM records an engine step's stats after it
    has sent the step's outputs, so a scrape right after the last token can miss that step.
    The last scrape returned is the one the exact check uses.
    """
    cur = await scraper.scrape()
    out = [cur]
    deadline = cur.t + SETTLE_TIMEOUT_S
    quiet_since = cur.t
    while not (expected is not None and _rise(before, cur) == expected) and cur.t < deadline:
        await asyncio.sleep(SETTLE_INTERVAL_S)
        nxt = await scraper.scrape()
        out.append(nxt)
        if nxt.generation != cur.generation:
            quiet_since = nxt.t
        cur = nxt
        if cur.t - quiet_since >= SETTLE_QUIET_S:
            break
    return out


def _rise(before: Scrape, after: Scrape) -> int:
    return round(after.generation - before.generation)


# ------------------------------------------------------------------------------------ checking


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

    def to_dict(self) -> dict[str, Any]:
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
    tokens = _rise(before, after)
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


def level_summary(checks: Sequence[TrialCheck], metric: str) -> dict[str, Any]:
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


# ------------------------------------------------------------------------------------ observer


def _answer_running(trial: TrialResult, samples: Sequence[Scrape]) -> None:
    """A trial whose streams did not all start (:attr:`TrialResult.running_asked`) gets what
    the server's running-requests gauge showed while it ran, in place of
    :data:`~pytest_kimi.measure.trial_causes.GAUGE_UNREAD`; nothing changes where no scrape during
    the trial had the gauge."""
    asked = trial.running_asked
    sent = [r.sent for r in trial.records if r.sent]
    if asked is None or not sent:
        return
    start, end = min(sent), max(max(r.end for r in trial.records), min(sent))
    seen = [
        s for s in samples if s.running is not None and start <= s.t - s.half_rtt_s and s.t <= end
    ]
    if not seen:
        finding = (
            "no reading of the server's running-requests gauge fell inside the trial, so "
            "whether it runs fewer than C at once is not known"
            if not samples or any(s.running is not None for s in samples)
            else f"the server's /metrics has none of {', '.join(RUNNING_GAUGES)}, so whether "
            "it runs fewer than C at once is not known"
        )
    else:
        top = max(seen, key=lambda s: s.running or 0.0)
        finding = gauge_finding(round(top.running or 0.0), top.running_gauge or "running", asked)
    trial.invalid[:] = [m.replace(GAUGE_UNREAD, finding) for m in trial.invalid]


class ServerMetricsObserver:
    """The measurement's :class:`~pytest_kimi.measure.measure_spec.TrialObserver` for ``--perf-server-metrics``.

    ``open`` (before the warm-up) finds the counters or fails the test; ``before_trial``
    scrapes once the counters are still and starts the sampler; ``after_trial`` stops it,
    settles, checks, and appends any disagreement to ``trial.invalid``; ``level_summary``
    returns the level's ``{"server": {...}}`` and starts afresh for the next level.
    """

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str] | None = None,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        rate_tolerance: float = RATE_TOLERANCE,
    ) -> None:
        self.scraper = MetricsScraper(base_url, headers)
        self.interval_s = interval_s
        self.rate_tolerance = rate_tolerance
        self._before: Scrape | None = None
        self._samples: list[Scrape] = []
        self._sample_errors: list[str] = []
        self._sampler: asyncio.Task[None] | None = None
        self._checks: list[TrialCheck] = []

    @property
    def metric(self) -> str:
        return self.scraper.names.generation if self.scraper.names else GENERATION_COUNTERS[0]

    @property
    def min_window_s(self) -> float:
        """Wall seconds a steady-state window must last to hold the scrapes a rate needs
        (:data:`MIN_WINDOW_SAMPLES`, one more for the phase of the first): a short stationary
        box is lengthened to it while this check runs."""
        return (MIN_WINDOW_SAMPLES + 1) * self.interval_s

    async def open(self) -> None:
        await self.scraper.open()

    async def close(self) -> None:
        await self._stop_sampler()
        await self.scraper.close()

    async def before_trial(self) -> None:
        await self._stop_sampler()
        self._samples = []
        self._sample_errors = []
        self._before = None
        try:
            self._before = await settle_before(self.scraper)
        except ServerMetricsError as exc:
            self._sample_errors.append(str(exc))
            return
        self._sampler = asyncio.ensure_future(self._sample_loop(self._before.t))

    async def _sample_loop(self, start: float) -> None:
        k = 1
        while True:
            due = start + k * self.interval_s
            await asyncio.sleep(max(0.0, due - perf_counter()))
            k = max(k + 1, int((perf_counter() - start) / self.interval_s) + 1)
            try:
                self._samples.append(await self.scraper.scrape())
            except ServerMetricsError as exc:
                if len(self._sample_errors) < 3:
                    self._sample_errors.append(str(exc))

    async def _stop_sampler(self) -> None:
        task, self._sampler = self._sampler, None
        await stop_sampler(task)

    async def after_trial(self, trial: TrialResult) -> None:
        await self._stop_sampler()
        before = self._before
        if before is None:
            trial.invalid.append(
                "could not read the server's counters before the trial: "
                + (self._sample_errors[0] if self._sample_errors else "no scrape")
            )
            return
        exact_count = all(r.ok and not r.tokens_approx for r in trial.records)
        expected = sum(r.completion_tokens for r in trial.records) if exact_count else None
        t0 = perf_counter()
        try:
            settled = await settle_after(self.scraper, before, expected)
        except ServerMetricsError as exc:
            trial.invalid.append(f"could not read the server's counters after the trial: {exc}")
            return
        during = sorted([*self._samples, *settled], key=lambda s: s.t)
        check, reasons = check_trial(
            trial,
            before,
            during,
            settled[-1],
            metric=self.metric,
            settle_s=perf_counter() - t0,
            interval_s=self.interval_s,
            rate_tolerance=self.rate_tolerance,
        )
        if self._sample_errors:
            check.notes.append(
                f"{len(self._sample_errors)} scrape(s) failed: {self._sample_errors[0]}"
            )
        _answer_running(trial, self._samples)
        trial.invalid.extend(reasons)
        if check.counter_behind is not None:
            trial.transient.append(check.counter_behind)
        self._checks.append(check)

    def level_summary(self) -> dict[str, Any]:
        checks, self._checks = self._checks, []
        if not checks:
            return {}
        return {"server": level_summary(checks, self.metric)}
