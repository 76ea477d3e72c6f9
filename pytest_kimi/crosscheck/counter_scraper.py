"""The server's generated-token counters: which ones it has, and a timed reading of them.

Apart because it knows SGLang's and vLLM's counter names and turns a page into a
:class:`Scrape` stamped on the client's clock; what to do with the readings (settling them,
checking the client against them) is the business of the modules that use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from time import perf_counter

from pytest_kimi.crosscheck.metrics_page import NO_METRICS_HINT, MetricsPage, ServerMetricsError
from pytest_kimi.crosscheck.prometheus_text import MetricTotals, parse_metrics

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

SCRAPE_TIMEOUT_S = 10.0


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


def generation_rise(before: Scrape, after: Scrape) -> int:
    return round(after.generation - before.generation)
