"""How hard the load client itself worked during a trial, and where that makes it the pace-setter.

Why a module of its own: the client's own readings (event-loop lag, send delay, CPU share)
and the limits beyond which they void a trial are asked by the trial's summary
(:func:`pytest_kimi.measure.metrics.summarize_trial`) and by the reasons it gives
(:mod:`pytest_kimi.measure.trial_causes`), and say nothing about the server.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

CLIENT_LAG_LIMIT_S = 0.02
"""Event-loop lag (p99) or send delay (p99) above this may mean the client set the pace.

Lag is also allowed up to the median gap between a stream's reads: at high concurrency a decode
step delivers a burst of reads (one per stream) that the loop works through in one go; as long
as each burst is done before the next arrives the client keeps up, its timestamps are late by
less than one gap, and a window of seconds is unaffected.  A client that cannot drain a burst
in time falls behind for good, which the lag (and its CPU share) then shows."""


CLIENT_CPU_LIMIT = 0.95
"""A client process busy more than this share of a core has no slack left: it is the bottleneck."""


CLIENT_BUSY_CPU = 0.5
"""Below this CPU share a lagging event loop was not busy but descheduled (stalled): another
process or the machine (a VM's host, memory reclaim) took its core.  Seen on vLLM's CPU build
sharing 2 cores with the client: 5% CPU, yet lag p99 near 30 ms and single stalls over a second
(until the launcher niced the server's whole session, not only its process: autogroup)."""


STALL_ERROR_LIMIT = 0.02
"""A stalled (not busy) client reads late, but tokens wait in the socket and are counted when it
wakes.  Only a stall at an edge of the steady-state window moves tokens across it, so the tok/s
figure is off by at most ``(stall at the start + stall at the end) / window``; beyond this share
the trial is invalid."""


@dataclass(slots=True)
class ClientSignals:
    """How hard the load client itself worked during a trial (from the runner)."""

    loop_lag_max_s: float = 0.0
    loop_lag_p99_s: float = 0.0
    send_delay_p99_s: float = 0.0
    cpu_share: float = 0.0
    """Client process CPU seconds per wall second (1.0 = one core busy)."""
    lag_times: array[float] = field(default_factory=lambda: array("d"), repr=False)
    lag_values: array[float] = field(default_factory=lambda: array("d"), repr=False)

    def lag_p99_within(self, start: float, end: float) -> float:
        """Event-loop lag p99 inside the steady-state window.

        Opening C connections at a trial's start keeps the loop busy for a moment; that burst
        lies before the window and does not touch the figure, so it must not void it either.
        """
        if not self.lag_times:
            return self.loop_lag_p99_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        inside = values[(times > start) & (times <= end)]
        return float(np.percentile(inside, 99)) if inside.size else self.loop_lag_p99_s

    def lag_max_within(self, start: float, end: float) -> float:
        """The longest event-loop stall inside the steady-state window."""
        if not self.lag_times:
            return self.loop_lag_max_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        inside = values[(times > start) & (times <= end)]
        return float(inside.max()) if inside.size else self.loop_lag_max_s

    def stall_before(self, instant: float, slack_s: float = 0.01) -> float:
        """How long the loop had been held up when it stamped ``instant``: of each stall that
        covers it (:meth:`stall_at`), the part before the instant only.

        A read that lands while the loop is held is stamped once it runs again; the work the
        read itself brings (parsing a lump of events) holds the loop *after* the stamp, and
        that part is the read's consequence, not what made it late.
        """
        if not self.lag_times:
            return self.loop_lag_max_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        covering = (times - values - slack_s <= instant) & (instant <= times + slack_s)
        if not covering.any():
            return 0.0
        ends, lags = times[covering], values[covering]
        return float(np.clip(np.minimum(instant, ends) - (ends - lags), 0.0, None).max())

    def stall_at(self, instant: float, slack_s: float = 0.01) -> float:
        """The stall that covers ``instant`` (0 when the loop ran then).

        A lag sample ``v`` taken at ``t`` means the loop did not run during ``[t - v, t]``;
        ``slack_s`` (about two monitor sleeps) also catches a stall that ended just before a
        read stamped the instant.  Without samples, the worst stall of the trial is assumed.
        """
        if not self.lag_times:
            return self.loop_lag_max_s
        times = np.frombuffer(self.lag_times, dtype=np.float64)
        values = np.frombuffer(self.lag_values, dtype=np.float64)
        covering = values[(times - values - slack_s <= instant) & (instant <= times + slack_s)]
        return float(covering.max()) if covering.size else 0.0
