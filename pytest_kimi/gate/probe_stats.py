"""A culprit-search probe's question, answered in about one launch: does the reference with
this subset of the changes applied run like the reference, or like the candidate?

By the time the culprit search starts, the deploy gate has launched the reference and the
candidate a few times each (2-6 launches) and decided that the candidate regresses.  A probe
does not need to establish a regression against the tolerance from scratch, as the gate's own
comparison (:func:`pytest_kimi.gate.paired.compare_paired`) would, with two launches of the
subset at least: it only has to say which of two *measured* deployments the subset resembles.
That is a classification between two hypotheses, and with a candidate drop several times the
launch noise one launch of the subset settles it.

Model (the gate's, :mod:`pytest_kimi.gate.paired`): launch ``i`` of deployment ``X`` gives
``y_i = log(figure_i) = mu_X + e_i``, independent, with a common variance ``sigma^2``.  The
groups are the reference's launches ``R`` (the gate's, and any the search added), the
candidate's ``C`` (the gate's), the subset's own ``S`` so far (``m`` launches), and optionally
earlier probes' launches, each group with its own mean.  ``sigma`` is the pooled within-group
standard deviation of *all* of them, as in a one-way ANOVA, on ``nu = sum(n_g - 1)`` degrees
of freedom.  Two hypotheses about the subset:

* ``H_ref``: ``mu_S >= mu_R`` (as fast as the reference, or faster): the subset is *clean*;
* ``H_cand``: ``mu_S <= mu_C`` (as slow as the candidate, or slower): it *reproduces*.

Each is tested by an exact pivot, the comparison of the subset's mean with one group's mean
under the pooled variance (Dunnett's many-to-one comparison, one subset at a time):

    T_R = (ybar_S - ybar_R) / (s sqrt(1/m + 1/n_R))      ~ t_nu under mu_S = mu_R
    T_C = (ybar_S - ybar_C) / (s sqrt(1/m + 1/n_C))      ~ t_nu under mu_S = mu_C

(the numerator is normal and independent of the pooled ``s^2``, whatever ``sigma``, ``mu_R``
and ``mu_C`` are, so the law is exact, not a plug-in approximation, even at ``nu = 2``).  At
look ``j`` (the ``j``-th launch of the subset) both are read one-sided at the level
``alpha_j = alpha / 2^j`` (:func:`look_level`), and:

* **reproduces** when ``H_ref`` is rejected (``T_R`` low), ``H_cand`` is not (``T_C`` not
  high), and the estimate lies nearer the candidate than the reference and beyond the
  tolerance (``ybar_S - ybar_R < min(log(1 - tol), (ybar_C - ybar_R) / 2)``);
* **clean** when ``H_cand`` is rejected, ``H_ref`` is not, and the estimate lies nearer the
  reference and within the tolerance;
* **between** when both are rejected: the subset has a part of the effect (a partial effect,
  one of two culprits, an interaction half-applied).  The two-point question has no answer,
  and the probe falls back to the gate's tolerance-based paired comparison;
* otherwise neither is established yet: launch the subset again.

Why the error rates hold.  A probe calls a subset that is as fast as the reference
``reproduces`` only if ``T_R`` crossed its bound at some look: by the union bound over the
looks that chance is at most ``sum_j alpha_j < alpha``, for every ``sigma``, every pair of
means and every stopping rule the search uses (the bound needs no independence between
looks).  Symmetrically, a subset as slow as the candidate is called ``clean`` with
probability below ``alpha``.  The extra conditions (the other test not rejected, the estimate
on the right side of the midpoint and of the tolerance) only remove outcomes, so they keep
the bounds; they make each verdict mean what the tolerance-based gate means by it (a
``regression`` is a drop beyond the tolerance, a ``pass`` a figure within it), and they keep
a partial effect from being classified by whichever hypothesis its one launch happens to fall
nearer.  When the candidate's drop is many launch-noises wide, as in any regression worth
explaining, a clean subset's ``T_C`` is far beyond its bound and the actual error rates are
far below ``alpha`` (``bench/culprit.py`` measures them); the bound is approached only for
drops near the noise, where a probe also takes more launches.

The search runs only after the gate flagged the candidate, and the flag *selects* the gate's
launches: a drop that looked larger than it is (the winner's curse), a reference that looked
faster.  Given the flag, an error rate is at most the exact one over the chance of the flag,
``alpha / P(flag)``: the bound carries over where the gate has power against the candidate's
drop (a drop many launch-noises wide is flagged at the first look nearly always), and loosens
for a drop that the gate only just caught (a drop near the tolerance at a noise near the drop:
``bench/culprit.py`` prints the gate's flag rate beside the probes' errors; the figures are in
docs/evidence/gate.md, "Culprit search").  There the search's own defences carry the weight:
no change is named on one probe (:mod:`pytest_kimi.gate.culprit`).  Only the midpoint of the
two means is untouched by the gate's selection (its launches are balanced, and its decisions
read the difference and the scatter only); a test on it alone would not depend on the flag
but would need about twice the launches (half the gap to cross), so it is not used.

Why one launch usually suffices: with a candidate drop ``D`` and launch noise ``sigma``,
``|T_R|`` of a reproducing subset is about ``D / (sigma sqrt(1 + 1/n_R))``: 6.6 for 15% at 2%
noise and two reference launches, against a first-look bound ``t_{2; 1 - alpha/2}`` of 4.3
(``alpha`` = 5%).  The t law's heavy tails at few degrees of freedom are the price of not
assuming ``sigma``; a probe that needs a second launch adds a degree of freedom, and earlier
probes' launches (``others``) add theirs.

Each verdict comes with the estimate the reports show: the subset against the reference, its
90% confidence interval from the same pooled ``s`` and ``t_nu`` (a ``regression`` is read at
``alpha_j <= alpha / 2 <= 5%``, so its interval lies wholly below 1), and the fraction of the
candidate's drop the subset shows.

A caveat shared with the gate's pool of reference launches: the candidate's and reference's
launches were made before the search, so a drift of the machine over the search is not
balanced out as in the gate's ABBA blocks; the search's confirmations (the named set alone
reproduces, the candidate without it recovers) both rest on such comparisons, so a drift
large against the candidate's drop would show as an undecided search rather than a wrong name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kimi.gate.paired import log_figures, pooled_sd
from pytest_kimi.verdicts import Verdict

if TYPE_CHECKING:
    pass

# numpy and scipy are imported where a probe is read, as in pytest_kimi.gate.paired

__all__ = [
    "BETWEEN",
    "CANDIDATE",
    "OPEN",
    "REFERENCE",
    "ProbeComparison",
    "classify_probe",
    "look_level",
]

REFERENCE = "reference"
"""The subset runs like the reference: clean."""
CANDIDATE = "candidate"
"""The subset runs like the candidate: it reproduces the regression."""
BETWEEN = "between"
"""Significantly unlike both: a partial effect (the tolerance-based comparison decides)."""
OPEN = "open"
"""Neither hypothesis rejected yet: another launch of the subset."""


def look_level(alpha: float, look: int) -> float:
    """The one-sided level of each test at look ``look`` (1-based): ``alpha / 2^look``, so the
    levels of all looks, however many, add up to less than ``alpha`` (half of it at the first
    look, where most probes decide)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if look < 1:
        raise ValueError(f"look must be >= 1, got {look}")
    return alpha * 0.5**look


@dataclass(frozen=True, slots=True)
class ProbeComparison:
    """One look of a probe's two-point test: the subset against the reference and the
    candidate, the pooled launch noise of every launch measured (module docstring).

    Compatible with :class:`~pytest_kimi.gate.paired.PairedComparison` where the reports read
    it (``ratio``, ``ci90``, ``verdict``, ``decided``, ``launches``, ``to_dict``)."""

    ratio: float
    """The subset's geometric mean over its launches / the reference's."""
    ci90: tuple[float, float]
    """The 90% confidence interval of ``ratio`` (pooled variance, ``t_df``)."""
    fraction: float
    """The share of the candidate's (log) drop the subset shows: 0 like the reference, 1 like
    the candidate."""
    candidate_ratio: float
    """The candidate's geometric mean / the reference's, as the pooled launches give it."""
    p_reference: float
    """One-sided p of ``H_ref`` (the subset as fast as the reference): small when slower."""
    p_candidate: float
    """One-sided p of ``H_cand`` (the subset as slow as the candidate): small when faster."""
    nominal_alpha: float
    """The level both p values are read at, at this look (:func:`look_level`)."""
    state: str
    """:data:`CANDIDATE`, :data:`REFERENCE`, :data:`BETWEEN` or :data:`OPEN`."""
    verdict: Verdict
    """``regression`` (like the candidate), ``pass`` (like the reference), ``inconclusive``
    (between, or an open look whose estimate is beyond the tolerance), ``underpowered``."""
    decided: bool
    """True when the subset was classified (``regression`` or ``pass``)."""
    look: int
    """The subset's launches this look rests on."""
    launches: int
    """Launches this comparison rests on: the subset's, the reference's, the candidate's."""
    launch_sigma: float
    """The pooled sd of one launch's log figure, over every group."""
    df: int
    se_log: float
    """The standard error of ``log(ratio)``."""

    def to_dict(self) -> dict[str, Any]:
        def pct(r: float) -> float | None:
            return round((r - 1.0) * 100.0, 2) if math.isfinite(r) else None

        return {
            "change_pct": pct(self.ratio),
            "ci90": [pct(self.ci90[0]), pct(self.ci90[1])],
            "candidate_change_pct": pct(self.candidate_ratio),
            "fraction": round(self.fraction, 4) if math.isfinite(self.fraction) else None,
            "p_reference": round(self.p_reference, 6),
            "p_candidate": round(self.p_candidate, 6),
            "nominal_alpha": round(self.nominal_alpha, 6),
            "state": self.state,
            "verdict": self.verdict.value,
            "decided": self.decided,
            "launches": self.launches,
            "launch_sigma": round(self.launch_sigma, 6),
            "df": self.df,
        }


def classify_probe(
    reference: Sequence[float],
    candidate: Sequence[float],
    subset: Sequence[float],
    *,
    look: int | None = None,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    others: Sequence[Sequence[float]] = (),
) -> ProbeComparison | None:
    """The two-point test of the subset's launch figures ``subset`` (any positive unit, one per
    launch) against the reference's and the candidate's, read at look ``look`` (default: the
    subset's launch count).  ``others``: launches of other deployments (earlier probes), which
    add their scatter to the pooled noise only.

    None when the question has no answer: no launch of the subset or of either deployment, no
    degree of freedom for the noise, or a candidate whose estimated drop lies within the
    tolerance (nothing to tell apart).
    """
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    ys = log_figures("subset", subset)
    ya = log_figures("reference", reference)
    yc = log_figures("candidate", candidate)
    if min(ys.size, ya.size, yc.size) == 0:
        return None
    groups = [ya, ys, yc] + [log_figures("other", g) for g in others if len(g)]
    sigma, df = pooled_sd(groups)
    if df < 1:
        return None
    margin = math.log1p(-tolerance)
    gap = float(yc.mean() - ya.mean())
    if gap >= margin:
        return None
    from scipy import stats as st

    floor = 1e-12
    m, n_a, n_c = ys.size, ya.size, yc.size
    se_r = max(sigma * math.sqrt(1.0 / m + 1.0 / n_a), floor)
    se_c = max(sigma * math.sqrt(1.0 / m + 1.0 / n_c), floor)
    d = float(ys.mean() - ya.mean())
    p_ref = float(st.t.cdf(d / se_r, df))
    p_cand = float(st.t.sf((float(ys.mean()) - float(yc.mean())) / se_c, df))
    level = look_level(alpha, m if look is None else look)
    slow, fast = p_ref <= level, p_cand <= level
    if slow and fast:
        state = BETWEEN
    elif slow and d < min(margin, gap / 2.0):
        state = CANDIDATE
    elif fast and d > max(margin, gap / 2.0):
        state = REFERENCE
    else:
        state = OPEN
    if state == CANDIDATE:
        verdict = Verdict.REGRESSION
    elif state == REFERENCE:
        verdict = Verdict.PASS
    else:
        verdict = Verdict.INCONCLUSIVE if d < margin else Verdict.UNDERPOWERED
    q = float(st.t.ppf(0.95, df))
    return ProbeComparison(
        ratio=math.exp(d),
        ci90=(math.exp(d - q * se_r), math.exp(d + q * se_r)),
        fraction=d / gap,
        candidate_ratio=math.exp(gap),
        p_reference=p_ref,
        p_candidate=p_cand,
        nominal_alpha=level,
        state=state,
        verdict=verdict,
        decided=state in (CANDIDATE, REFERENCE),
        look=m,
        launches=int(m + n_a + n_c),
        launch_sigma=sigma,
        df=df,
        se_log=se_r,
    )
