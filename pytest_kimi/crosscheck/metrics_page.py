"""Reading a server's ``/metrics`` page: one capped GET, and the errors every reader raises.

Apart because it is the one way every cross-check (the token check, the prefix-cache probe,
the contamination check) reaches the server's counters: the size cap, the session of its own
and the error messages that name the URL and the fix live here once.
"""

from __future__ import annotations

import asyncio

import aiohttp

from pytest_kimi.endpoint.bounded import BodyTooLarge, read_body_capped

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
