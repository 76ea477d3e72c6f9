"""What the gate needs for a session: where baselines live, how strictly they are judged, and
the up-front warning when its settings make ``pass`` unreachable.

Resolved once per session from the options (:class:`GateContext`), so every test of the
session, sweep or search, is judged by the same settings and stored in the same place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_kimi.baseline import BaselineStore
from pytest_kimi.gate import two_sample
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.options import KimiOptions
from pytest_kimi.run.noise_source import choose_session_sigma
from pytest_kimi.wire import GateEntry
from pytest_kimi.workload.workload_spec import Targets


@dataclass(frozen=True, slots=True)
class GateContext:
    """Resolved once per session: where baselines live and how strictly they are judged."""

    settings: GateSettings
    root: Path
    profile: str
    """--baseline-profile, else the deployment's name, else 'sim' or 'default'."""
    profile_explicit: bool
    update: str | None
    """None, 'yes' or 'force' (--update-baselines)."""
    allow_large: bool = False
    """--perf-allow-large: lifts the size bound on a baseline file read (never its type checks)."""

    @classmethod
    def from_options(cls, opts: KimiOptions) -> GateContext:
        """The session's gate; its session noise measured where it can be
        (:func:`pytest_kimi.run.noise_source.choose_session_sigma`)."""
        profile = opts.default_profile()
        choice = choose_session_sigma(opts, profile, opts.baseline_dir)
        settings = replace(
            opts.gate_settings(),
            session_sigma=choice.sigma,
            sigma_source=choice.source,
            sigma_vouched=choice.vouched,
            sigma_df=choice.df,
        )
        return cls(
            settings,
            opts.baseline_dir,
            profile,
            opts.baseline_profile is not None,
            opts.update_baselines,
            allow_large=opts.perf_allow_large,
        )

    def report_fields(self) -> GateEntry:
        """The report's ``gate`` object: the settings every verdict was judged by."""
        s = self.settings
        return {
            "tolerance": s.tolerance,
            "alpha": s.alpha,
            "session_sigma": s.session_sigma,
            "session_sigma_source": s.sigma_source,
            "session_sigma_measured": s.sigma_vouched,
            "detectable_drop": s.detectable_drop,
            "max_trials": s.max_trials,
            "strict": s.strict,
        }

    def store(self, deployment: str | None = None) -> BaselineStore:
        """The baseline store of a deployment (by its name), or of the session's profile."""
        name = deployment if deployment is not None and not self.profile_explicit else self.profile
        return BaselineStore(self.root, name, allow_large=self.allow_large)


def _unreachable(floor: float, detectable: str, settings: str, fix: str) -> str:
    """The one text of "no level can pass" (session-wide or for one marker)."""
    return (
        f"{settings}, no number of trials catches a drop smaller than {floor:.1%} with "
        f"{two_sample.DEFAULT_POWER:.0%} probability, but the detectable drop is "
        f"{detectable}; every level without a significant change will be "
        f"underpowered.  {fix.format(raise_to=f'{math.ceil(floor * 1000) / 10:g}%')}"
    )


def session_pass_unreachable(opts: KimiOptions) -> str | None:
    """The up-front warning when no number of trials can make a compared level ``pass``.

    The standard error of a level never falls below the session noise, so a drop smaller than
    :func:`two_sample.smallest_vouchable_drop` cannot be caught with the gate's power however many
    trials run; if ``--perf-detectable-drop`` asks for that, every compared level ends
    ``underpowered`` (or significant) and the trials are spent for nothing.
    """
    floor = opts.gate_settings().pass_floor()
    if floor is None:
        return None
    return _unreachable(
        floor,
        f"{opts.perf_detectable_drop:.1%} ({opts.source('perf_detectable_drop')})",
        f"pytest-kimi: no compared level can pass: with session noise "
        f"{opts.perf_session_sigma:g} ({opts.source('perf_session_sigma')}), tolerance "
        f"{opts.perf_tolerance:.1%} and alpha {opts.perf_alpha:g}",
        "Raise --perf-detectable-drop to {raise_to} or more, or measure the session noise (a "
        "lower --perf-session-sigma), or use a smaller --perf-tolerance.",
    )


def marker_pass_unreachable(nodeid: str, settings: GateSettings, targets: Targets) -> str | None:
    """A marker's own ``tolerance=`` or ``alpha=`` can make ``pass`` unreachable where the
    session's settings do not (with 3% session noise, a 12% tolerance cannot vouch for a 15%
    detectable drop): said at collection, on the test, before any trial is spent on it."""
    if targets.tolerance is None and targets.alpha is None:
        return None
    if settings.pass_floor() is not None:
        return None  # the session-wide warning already says so
    mine = settings.for_test(targets)
    floor = mine.pass_floor()
    if floor is None:
        return None
    return _unreachable(
        floor,
        f"{settings.detectable_drop:.1%}",
        f"{nodeid}: no level of this test can pass: with the marker's tolerance "
        f"{mine.tolerance:.1%} and alpha {mine.alpha:g} and session noise "
        f"{settings.session_sigma:g}",
        "Use a smaller tolerance= (or a larger alpha=) in the marker, or raise "
        "--perf-detectable-drop to {raise_to} or more.",
    )
