"""Constants of the log-scale statistics that more than one stage computes.

Throughput and latency figures are judged on a log scale (a drop of 10% is the same evidence at
50 tok/s as at 5000), and two stages compute such statistics independently: the gate's
comparison with a baseline (:mod:`pytest_kimi.gate.stats`) and the capacity search's decision
and interval (:mod:`pytest_kimi.measure.capacity_search`).  Their shared constants live here, below
both in the package's layers (``.importlinter``), so the two cannot drift apart.  No pytest, no
numpy, nothing of the package.
"""

from __future__ import annotations

__all__ = ["MIN_LOG_SD", "Z90"]

MIN_LOG_SD = 1e-4
"""Floor of a within-session (or within-level) standard deviation of log figures (0.01%).

Identical samples (a noiseless simulator) would otherwise give a zero standard error, a
division by zero and a certainty no measurement has; the floor is far below any real timer or
token-count resolution, so it never masks real noise.  Used by the gate's per-level variance
and by the capacity search's trial scatter."""

Z90 = 1.6448536269514722
"""The standard normal quantile of a two-sided 90% interval (``scipy.stats.norm.ppf(0.95)``),
written out so its users need no scipy.  Used by the capacity search's 90% interval on the
capacity."""
