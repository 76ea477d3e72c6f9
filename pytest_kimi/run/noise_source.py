"""Which session noise the gate uses, and where it came from: measured, not assumed.

The gate adds ``session_sigma`` (the log sd of the ratio of two server starts) to every
comparison.  Assumed at 0.03 it cost a deployment whose starts differ by 0.5% most of its
power: a sweep 10% slower read ``pass``, and ``regression`` with the noise that ``kimi-perf
history noise`` measured on the same deployment (docs/evidence/gate.md, "The gate's error
rates, simulated").  So, in order:

1. ``--perf-session-sigma`` (or its env / ini setting) where the user gave one: their word;
2. the history (``--perf-history``): the sessions of runs of this deployment whose
   provenance did not change (:func:`pytest_kimi.history.noise.estimate_noise`, no change
   point detection: a step the provenance did not record widens the estimate, it never
   narrows it), pooled over its levels, when they are at least
   :data:`~pytest_kimi.gate.session_noise.FEW_SESSIONS` server starts -- a run with
   ``--perf-sessions N`` stores N of them, so one such run calibrates the next;
3. the default, said as such, with what is missing.

The figure used is the estimate rounded *up* to half a percent and never below that step
(:func:`~pytest_kimi.gate.session_noise.recommend`).  The history is read only when the
session can compare something (a baseline file of the profile exists and baselines are not
being recorded), so a session without baselines never opens a database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.gate import two_sample
from pytest_kimi.gate.session_noise import FEW_SESSIONS, PRIOR_DF, gate_sigma
from pytest_kimi.options import KimiOptions


@dataclass(frozen=True, slots=True)
class SigmaChoice:
    """The ``session_sigma`` a session's gate uses and the sentence that says why."""

    sigma: float
    source: str
    measured: bool = False
    user_given: bool = False
    df: float = PRIOR_DF
    """The degrees of freedom the figure rests on (:attr:`GateSettings.sigma_df`)."""

    @property
    def vouched(self) -> bool:
        """Measured, or the user's own word: may the gate say ``pass`` with it
        (:attr:`pytest_kimi.gate.policy.GateSettings.sigma_vouched`)?"""
        return self.measured or self.user_given


def choose_session_sigma(opts: KimiOptions, profile: str, baseline_root: Path) -> SigmaChoice:
    """The session noise for this session's gate (module docstring)."""
    where = opts.source("perf_session_sigma")
    if where != "default":
        return SigmaChoice(
            opts.perf_session_sigma,
            f"--perf-session-sigma ({where})",
            user_given=True,
            df=math.inf,
        )
    default = f"the default {two_sample.DEFAULT_SESSION_SIGMA:g}"
    if opts.perf_history is None:
        return SigmaChoice(
            opts.perf_session_sigma, f"{default}: nothing measured (--perf-history off)"
        )
    # an --update-baselines run compares with the baselines it replaces: it judges with the
    # same noise as the gating run before it (it said "the default: no baseline" before)
    if not _has_baselines(baseline_root, profile):
        return SigmaChoice(opts.perf_session_sigma, f"{default}: no baseline to compare with")
    try:
        estimate = _history_estimate(opts.perf_history, profile)
    except Exception as exc:  # a history that cannot be read costs the measurement, not the run
        return SigmaChoice(
            opts.perf_session_sigma,
            f"{default}: the history could not be read ({type(exc).__name__})",
        )
    if estimate is None:
        return SigmaChoice(
            opts.perf_session_sigma,
            f"{default}: the history holds no two sessions of one unchanged build of "
            f"{profile!r} yet (run --perf-sessions {FEW_SESSIONS} once to measure it)",
        )
    sigma, sessions, text = estimate
    if sessions < FEW_SESSIONS:
        return SigmaChoice(
            opts.perf_session_sigma,
            f"{default}: the history holds {sessions} sessions of unchanged builds of "
            f"{profile!r}, {FEW_SESSIONS} are needed (run --perf-sessions {FEW_SESSIONS} once)",
        )
    return SigmaChoice(
        sigma, f"measured in the history: {text}", measured=True, df=float(sessions - 1)
    )


def _has_baselines(root: Path, profile: str) -> bool:
    folder = root / profile
    try:
        return folder.is_dir() and any(folder.rglob("*.yaml"))
    except OSError:
        return False


def _history_estimate(url: str, profile: str) -> tuple[float, int, str] | None:
    """(sigma to use, sessions, text) from the history's unchanged builds of ``profile``."""
    from pytest_kimi.history.noise import estimate_noise
    from pytest_kimi.history.store import open_history
    from pytest_kimi.history.urls import sqlite_path

    path = sqlite_path(url)
    if path is not None and (path == "" or not Path(path).is_file()):
        return None  # no history yet: never create a database just to read it
    with open_history(url) as store:
        series = [s for s in store.series() if s.deployment == profile]
    if not series:
        return None
    report = estimate_noise(series, changes=[])
    if report.pooled is None:
        return None
    e = report.pooled
    value = gate_sigma(e.sigma)
    text = (
        f"{value:g} (estimate {e.sigma:.4f}, {e.confidence:.0%} interval {e.low:.4f}.."
        f"{e.high:.4f}, from {e.sessions} sessions of unchanged builds of {profile!r}, "
        "rounded up to half a percent)"
    )
    return value, e.sessions, text


__all__ = ["SigmaChoice", "choose_session_sigma"]
