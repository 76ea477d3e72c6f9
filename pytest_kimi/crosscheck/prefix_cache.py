"""The server's prefix-cache hit rate over a level, from its own Prometheus counters.

Why: a workload with shared prefixes (``shared_prefix_tokens=``) is only the workload it claims
when the server's cache really serves the shared part; a cache that is off, too small, or keyed
differently than assumed turns the run into an unshared one with a flattering name.  And a
workload meant to have *no* sharing (every prompt unique) should show a rate near zero.  So
every level reads the server's prefix-cache counters before its first trial and after its last,
and reports the share of prompt tokens the cache served.

The counters (token counts, summed over their label sets):

* vLLM (V1 engine): ``vllm:prefix_cache_queries_total`` (prompt tokens looked up) and
  ``vllm:prefix_cache_hits_total`` (tokens found), ``vllm/v1/metrics/loggers.py``; older
  releases name them ``vllm:gpu_prefix_cache_queries_total``/``..._hits_total``.
* SGLang 0.5 (``--enable-metrics``): ``sglang:prompt_tokens_total`` and
  ``sglang:cached_tokens_total`` (labelled by ``cache_source``: device, host, storage), both
  counted when a request finishes (``sglang/srt/observability/metrics_collector.py``,
  ``observe_one_finished_request``).  The cached counter is incremented only for a request
  that hit the cache, and SGLang's multiprocess Prometheus registry shows a metric only
  once a process wrote a sample of it: until the first hit the page has no
  ``sglang:cached_tokens_total`` at all, not even ``# TYPE``.  So a page with SGLang's
  prompt-token counter and without the cached one has served 0 tokens from the cache: the
  hit rate is 0% (the entry says ``cached_metric_absent``), which is the answer a run with
  ``--disable-radix-cache`` exists to get.  A fresh server (no request finished
  yet) has neither counter, only its gauges: a page with ``sglang:`` samples and no
  prompt-token counter reads as 0 and 0.

A server without either pair (no ``/metrics``, SGLang without ``--enable-metrics``) gets no
hit rate: the level's JSON then has no ``prefix_cache_hit_rate`` key, never a made-up zero.
Reading is best effort: one GET before and after a level, a short timeout, a page capped at
:data:`~pytest_kimi.crosscheck.metrics_page.METRICS_MAX_BYTES`, and the first failure turns
the probe off for the test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


from pytest_kimi.crosscheck.metrics_page import (
    MetricsPage,
    MetricsTooLarge,
    ServerMetricsError,
)
from pytest_kimi.crosscheck.prometheus_text import parse_metrics
from pytest_kimi.wire import LevelSummary, PrefixCacheSection

PREFIX_CACHE_COUNTERS: tuple[tuple[str, str], ...] = (
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
    ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
)
"""(prompt tokens looked up, prompt tokens served from the cache), in the order looked for."""
LAZY_HITS = frozenset({"sglang:cached_tokens_total"})
"""Hit counters that do not exist until the first hit: their absence beside the queries
counter means zero hits (SGLang); any other missing hit counter means no reading."""
READ_TIMEOUT_S = 5.0
NO_CACHE_HINT = (
    "the server exposes no /metrics, so no prefix-cache hit rate (SGLang: launch it with "
    "--enable-metrics)"
)


@dataclass(frozen=True, slots=True)
class CacheCounters:
    """The two counters at one instant."""

    queries_metric: str
    hits_metric: str
    queries: float
    hits: float
    hits_absent: bool = False
    """The hit counter was not on the page (a :data:`LAZY_HITS` one, read as 0)."""


def _declared(text: str, name: str) -> bool:
    return re.search(rf"^# (?:TYPE|HELP) {re.escape(name)}\s", text, re.M) is not None


def read_cache_counters(text: str) -> CacheCounters | None:
    """The first pair of :data:`PREFIX_CACHE_COUNTERS` the page has, or None."""
    names = [n for pair in PREFIX_CACHE_COUNTERS for n in pair]
    totals = parse_metrics(text, names)
    for queries, hits in PREFIX_CACHE_COUNTERS:
        q = totals.get(queries)
        if q is None:
            continue
        h = totals.get(hits)
        absent = False
        if h is None:
            if not _declared(text, hits):
                if hits not in LAZY_HITS:
                    continue
                absent = True
            h = 0.0
        return CacheCounters(queries, hits, q, h, hits_absent=absent)
    if re.search(r"^sglang:", text, re.M):
        # SGLang before its first finished request writes neither (both come with it)
        queries, hits = PREFIX_CACHE_COUNTERS[-1]
        return CacheCounters(queries, hits, 0.0, 0.0, hits_absent=True)
    return None


def hit_rate(
    before: CacheCounters | None, after: CacheCounters | None
) -> PrefixCacheSection | None:
    """The level's ``prefix_cache`` entry: prompt tokens looked up and served over the level,
    and their ratio; None without two readings of the same pair, or when no prompt token was
    counted between them."""
    if before is None or after is None or before.queries_metric != after.queries_metric:
        return None
    queries = after.queries - before.queries
    hits = after.hits - before.hits
    if queries <= 0 or hits < 0:
        return None
    entry: PrefixCacheSection = {
        "hit_rate": round(hits / queries, 4),
        "prompt_tokens": round(queries),
        "cached_tokens": round(hits),
        "metrics": [after.hits_metric, after.queries_metric],
    }
    if after.hits_absent:
        # not a guess: SGLang creates this counter at the first cache hit
        entry["cached_metric_absent"] = True
    return entry


class PrefixCacheProbe:
    """Reads the prefix-cache counters at ``GET /metrics`` on the load loop.

    A short-lived :class:`MetricsPage` per reading (two a level) keeps it off the load client's
    connection pool; after the first failure or a page without the counters it stops asking.
    """

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._args = (base_url, headers, timeout_s, NO_CACHE_HINT)
        self.url = MetricsPage(*self._args).url
        self.unavailable: str | None = None
        """Why there is no hit rate (None: none missing so far)."""
        self._untold: str | None = None
        """A failure the level's notes must carry (a page over the size cap): said once."""
        self._before: CacheCounters | None = None

    async def start_level(self) -> None:
        """The counters before a level's first trial (after the warm-up's requests)."""
        self._before = await self.read()

    async def end_level(self) -> LevelSummary:
        """``prefix_cache_hit_rate`` and ``prefix_cache`` for the level's JSON, or nothing;
        ``notes`` (for the level's reports) when the page was over the size cap."""
        before, self._before = self._before, None
        entry = hit_rate(before, await self.read()) if before is not None else None
        out: LevelSummary = {}
        if entry is not None:
            out = {"prefix_cache_hit_rate": entry["hit_rate"], "prefix_cache": entry}
        if self._untold is not None:
            out["notes"] = [f"no prefix-cache hit rate: {self._untold}"]
            self._untold = None
        return out

    async def read(self) -> CacheCounters | None:
        if self.unavailable is not None:
            return None
        page = MetricsPage(*self._args)
        try:
            await page.open()
            text = await page.get()
        except MetricsTooLarge as exc:
            self.unavailable = self._untold = str(exc)
            return None
        except ServerMetricsError as exc:
            self.unavailable = str(exc)
            return None
        finally:
            await page.close()
        counters = read_cache_counters(text)
        if counters is None:
            self.unavailable = f"{self.url} has no prefix-cache counters"
        return counters
