"""Waiting for the server's counters to settle before and after a trial.

Apart because it is the one timing-dependent loop of the token check: engines update their
counters asynchronously, so the readings the exact check compares are taken only once the
counter has stopped moving (or a bounded wait has passed).
"""

from __future__ import annotations

import asyncio

from pytest_kimi.crosscheck.counter_scraper import MetricsScraper, Scrape, generation_rise

SETTLE_INTERVAL_S = 0.05
"""Re-scrape interval while the counter settles after (and before) a trial."""
SETTLE_TIMEOUT_S = 1.0
"""Longest wait for the counter to settle; it is then taken as it is."""
SETTLE_QUIET_S = 0.2
"""A counter unchanged this long after the trial is settled even when it disagrees."""


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
    while (
        not (expected is not None and generation_rise(before, cur) == expected) and cur.t < deadline
    ):
        await asyncio.sleep(SETTLE_INTERVAL_S)
        nxt = await scraper.scrape()
        out.append(nxt)
        if nxt.generation != cur.generation:
            quiet_since = nxt.t
        cur = nxt
        if cur.t - quiet_since >= SETTLE_QUIET_S:
            break
    return out
