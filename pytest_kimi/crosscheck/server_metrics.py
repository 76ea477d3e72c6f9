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
  the trial *settles* first
  (:func:`~pytest_kimi.crosscheck.counter_settle.settle_after`).
- **rate**: the counter's slope inside the trial's steady-state window must agree with the
  client's steady-state tok/s within
  :data:`~pytest_kimi.crosscheck.counter_check.RATE_TOLERANCE` (plus the timing uncertainty of
  the two scrapes used).  A sampler scrapes every
  :data:`~pytest_kimi.crosscheck.counter_check.SAMPLE_INTERVAL_S` while the trial runs.

SGLang increments its counter once per *finished* request, not per generated token; such a
counter has no meaningful slope inside a window that requests straddle.  Which kind a server
has is read from the samples themselves
(:func:`~pytest_kimi.crosscheck.counter_check.counting_mode`), and a per-request counter gets
the exact check only, which the figures say.

Nothing here imports pytest: the plugin attaches a :class:`ServerMetricsObserver` to the
measurement (``MeasureSpec.observer``) and the reports read :meth:`level_summary`'s dict.

This module is the wiring: the observer that scrapes around each trial.  Its parts stand in
sibling modules: ``prometheus_text`` (parsing a page), ``metrics_page`` (reading it, capped),
``counter_scraper`` (the counters and a timed reading), ``counter_settle`` (waiting for them
to settle) and ``counter_check`` (the pure check of a trial, and the level's summary).
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Sequence

from pytest_kimi.crosscheck.counter_check import (
    MIN_WINDOW_SAMPLES,
    RATE_TOLERANCE,
    SAMPLE_INTERVAL_S,
    TrialCheck,
    check_trial,
    level_summary,
)
from pytest_kimi.crosscheck.counter_scraper import (
    GENERATION_COUNTERS,
    RUNNING_GAUGES,
    MetricsScraper,
    Scrape,
)
from pytest_kimi.crosscheck.counter_settle import settle_after, settle_before
from pytest_kimi.crosscheck.metrics_page import (
    METRICS_MAX_BYTES,
    ServerMetricsError,
    stop_sampler,
)
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.trial_causes import GAUGE_UNREAD, gauge_finding
from pytest_kimi.wire import LevelSummary

__all__ = ["METRICS_MAX_BYTES", "RATE_TOLERANCE", "ServerMetricsObserver"]
"""The documented names (docs/guide/server-metrics.md) stay importable from here."""


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

    def level_summary(self) -> LevelSummary:
        checks, self._checks = self._checks, []
        if not checks:
            return {}
        return {"server": level_summary(checks, self.metric)}
