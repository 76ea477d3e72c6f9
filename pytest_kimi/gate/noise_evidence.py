"""The session noise a test is judged with, combined from every source as evidence weighs.

Three sources can say how far two server starts of a deployment differ: the session's choice
(the user's ``--perf-session-sigma``, the history's measurement, or the assumed default), and
the baseline's own recording when it ran several starts (``--perf-sessions N`` with
``--update-baselines``: each level stores its ``session_noise`` with the degrees of freedom it
rests on, :class:`pytest_kimi.baseline.model.SessionNoise`).  They are pooled as variances
weighted by their degrees of freedom, the way two independent sample variances of one quantity
are, so a recording of two starts (one degree of freedom) moves the assumed default only a
little and one of six starts most of the way: no switch at a count of runs.  The default counts
as :data:`PRIOR_DF` degrees of freedom; a value the user gave is their word and is not
combined.  A figure with measured evidence in it vouches for ``pass``
(:attr:`pytest_kimi.gate.policy.GateSettings.sigma_vouched`); the power rule then decides how
much a thinly measured noise allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from pytest_kimi.baseline.model import LevelBaseline, SessionNoise, TestBaseline
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.gate.session_noise import PRIOR_DF, estimate_session_sigma, gate_sigma


@dataclass(frozen=True, slots=True)
class NoiseEvidence:
    """One source's session noise and the degrees of freedom it rests on."""

    sigma: float
    df: float
    what: str


def combine(evidence: Sequence[NoiseEvidence]) -> NoiseEvidence:
    """The df-weighted pooled variance of the sources (all must have ``df > 0``)."""
    if not evidence:
        raise ValueError("no evidence to combine")
    if any(not e.df > 0 or not math.isfinite(e.df) for e in evidence):
        raise ValueError(f"every source needs finite df > 0, got {[e.df for e in evidence]}")
    df = sum(e.df for e in evidence)
    var = sum(e.df * e.sigma**2 for e in evidence) / df
    return NoiseEvidence(math.sqrt(var), df, " and ".join(e.what for e in evidence))


def stored_noise(baseline: TestBaseline | None) -> NoiseEvidence | None:
    """The baseline recording's own measurement, its levels pooled: the mean of their
    variances, with the largest df among them (the levels were measured in the same starts,
    so their scatters are not independent evidence and their df do not add up)."""
    if baseline is None:
        return None
    found: list[SessionNoise] = [lv.session_noise for lv in baseline.levels if lv.session_noise]
    if not found:
        return None
    var = sum(n.sigma**2 for n in found) / len(found)
    df = max(n.df for n in found)
    return NoiseEvidence(
        math.sqrt(var),
        float(df),
        f"the baseline's recording ({math.sqrt(var):.4f} from {df + 1} starts)",
    )


def with_stored_noise(settings: GateSettings, baseline: TestBaseline | None) -> GateSettings:
    """The settings a test is judged with: the session's noise combined with what its
    baseline's recording measured (module docstring); unchanged without a stored measurement
    or where the user gave the figure."""
    stored = stored_noise(baseline)
    if stored is None or math.isinf(settings.sigma_df):
        return settings
    own = NoiseEvidence(settings.session_sigma, settings.sigma_df, settings.sigma_source)
    both = combine([stored, own])
    value = gate_sigma(both.sigma)
    return replace(
        settings,
        session_sigma=value,
        sigma_df=both.df,
        sigma_vouched=True,
        sigma_source=(
            f"{value:g} (estimate {both.sigma:.4f} on {both.df:g} df, rounded up to half a "
            f"percent): {stored.what} ({stored.df:g} df) with {settings.sigma_source} "
            f"({settings.sigma_df:g} df)"
        ),
    )


def occasion_noise(old: LevelBaseline, new: LevelBaseline) -> SessionNoise | None:
    """A level re-recorded on the same deployment: the session noise both recordings vouch for.

    Two recordings of one deployment on two occasions are two of its sessions: how far their
    trials' means lie apart, beyond what their trial noise explains, is one degree of freedom
    of session noise (:func:`~pytest_kimi.gate.session_noise.estimate_session_sigma`, the
    estimator ``--perf-sessions`` uses), pooled with what each recording measured itself.  So
    an external endpoint, whose server the plugin cannot restart, gains a measured noise each
    time its baseline is re-recorded, and a managed one adds its occasions to its launches.
    The caller decides that the two are the same deployment (same provenance, no change the
    gate decided); None when neither recording has two trials to tell trial noise from it.
    """
    if max(len(old.trials_tok_s), len(new.trials_tok_s)) < 2:
        return None
    sigma = estimate_session_sigma([old.trials_tok_s, new.trials_tok_s])
    evidence = [NoiseEvidence(sigma, 1.0, "two occasions")]
    evidence += [
        NoiseEvidence(n.sigma, float(n.df), "a recording's starts")
        for n in (old.session_noise, new.session_noise)
        if n is not None
    ]
    both = combine(evidence)
    return SessionNoise(sigma=both.sigma, df=int(round(both.df)))


__all__ = [
    "NoiseEvidence",
    "PRIOR_DF",
    "combine",
    "occasion_noise",
    "stored_noise",
    "with_stored_noise",
]
