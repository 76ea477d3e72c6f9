"""``kimi-perf calibrate``: what a deployment's measured noise lets the gate vouch for.

An A/A experiment (one deployment started N times, ``--perf-sessions N``) measures per level
the session noise (:class:`~pytest_kimi.gate.session_noise.NoiseEstimate`: the log sd of the
ratio of two starts, with its interval) and the trial noise inside a start.  From them, before
any deploy change is judged:

* **a stored baseline** (one run of ``trials`` trials against a recording of as many): the
  smallest drop it catches with probability ``power`` (its minimum detectable drop), whether
  ``pass`` is reachable at all (:func:`pytest_kimi.gate.stats.smallest_vouchable_drop` at or
  below ``detectable_drop``), and how far one run moves from session noise alone;
* **the paired comparison** (``--perf-max-launches``): the launches it needs before its
  minimum detectable drop is within ``detectable_drop`` at the design's nominal level
  (:func:`pytest_kimi.gate.paired.nominal_alpha`), or None beyond the budget.

The noise used is the estimate rounded up as the gate would use it
(:func:`~pytest_kimi.gate.session_noise.gate_sigma`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_kimi.gate import two_sample
from pytest_kimi.gate.paired import MIN_BLOCKS, look_mdd, nominal_alpha
from pytest_kimi.gate.session_noise import NoiseEstimate, gate_sigma


@dataclass(frozen=True, slots=True)
class Calibration:
    """What one level's (or the pooled) measured noise allows."""

    where: str
    estimate: NoiseEstimate
    sigma: float
    """The session noise the gate would use: the estimate rounded up."""
    stored_mdd: float
    """One run of ``trials`` trials against a stored baseline of as many: the drop caught with
    probability ``power``."""
    vouchable_drop: float
    """The smallest ``detectable_drop`` any number of trials can vouch for at ``sigma``."""
    one_run_spread: float
    """90% of single runs against a stored baseline fall within this relative change of an
    unchanged deployment, from session noise alone."""
    paired_launches: int | None
    """Launches (both deployments) after which the paired comparison's minimum detectable
    drop is within ``detectable_drop``; None: not within ``max_launches``."""
    tolerance: float
    detectable_drop: float
    max_launches: int

    def warnings(self) -> list[str]:
        """What the configured tolerance and detectable drop cannot do with this noise."""
        out: list[str] = []
        if self.one_run_spread > self.tolerance:
            out.append(
                f"one run against a stored baseline moves by up to ±{self.one_run_spread:.1%} "
                f"(90%) from session noise alone, more than the tolerance {self.tolerance:.0%}: "
                "a stored baseline cannot tell a change of the tolerance's size from noise"
            )
        if self.vouchable_drop > self.detectable_drop:
            out.append(
                f"pass is unreachable against a stored baseline: no number of trials vouches "
                f"for less than a {self.vouchable_drop:.1%} drop at this noise, above "
                f"--perf-detectable-drop {self.detectable_drop:.0%}; judge deploy changes "
                "paired (--perf-max-launches), or raise --perf-detectable-drop"
            )
        if self.paired_launches is None:
            out.append(
                f"the paired comparison cannot vouch for a {self.detectable_drop:.0%} drop "
                f"within {self.max_launches} launches: raise --perf-max-launches"
            )
        return out

    def text(self) -> str:
        """What ``kimi-perf calibrate`` prints for it: the noise, what a stored baseline and
        the paired comparison can vouch for, and the warnings."""
        e = self.estimate
        paired = f"{self.paired_launches} launches" if self.paired_launches else "beyond the budget"
        lines = [
            f"{self.where}: session noise {e.sigma:.4f} ({e.confidence:.0%} interval "
            f"{e.low:.4f}..{e.high:.4f}, {e.sessions} sessions; trial noise {e.within_sd:.4f}) "
            f"-> gate sigma {self.sigma:g}",
            f"  stored baseline: catches a {self.stored_mdd:.1%} drop, vouches down to "
            f"{self.vouchable_drop:.1%}, one run moves ±{self.one_run_spread:.1%}",
            f"  paired: vouches for a {self.detectable_drop:.0%} drop after {paired}",
        ]
        lines += [f"  warning: {w}" for w in self.warnings()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "estimate": self.estimate.to_dict(),
            "sigma": self.sigma,
            "stored_mdd": round(self.stored_mdd, 4),
            "vouchable_drop": round(self.vouchable_drop, 4),
            "one_run_spread": round(self.one_run_spread, 4),
            "paired_launches": self.paired_launches,
            "warnings": self.warnings(),
        }


def stored_mdd(
    sigma: float, within_sd: float, trials: int, *, tolerance: float, alpha: float, power: float
) -> float:
    """The minimum detectable drop of one run of ``trials`` trials against a stored baseline
    of as many: the gate's session floor (:func:`two_sample.smallest_vouchable_drop`, normal
    quantiles) at the run's whole standard error, session and trial noise together."""
    se = math.sqrt(sigma**2 + 2.0 * within_sd**2 / max(trials, 1))
    return two_sample.smallest_vouchable_drop(tolerance, alpha, se, power)


def paired_launches_needed(
    launch_sd: float,
    *,
    tolerance: float,
    alpha: float,
    power: float,
    detectable_drop: float,
    max_launches: int,
) -> int | None:
    """The fewest launches (both deployments, whole ABBA blocks) whose look has a minimum
    detectable drop (:func:`pytest_kimi.gate.paired.look_mdd`) within ``detectable_drop``,
    with ``launch_sd`` the sd of one launch's log figure; None when ``max_launches`` do not
    reach it."""
    max_blocks = max_launches // 2
    if max_blocks < MIN_BLOCKS:
        return None
    a_nom = nominal_alpha(alpha, max_blocks)
    for k in range(MIN_BLOCKS, max_blocks + 1):
        se = launch_sd * math.sqrt(2.0 / k)
        if look_mdd(se, 2 * k - 2, a_nom, tolerance=tolerance, power=power) <= detectable_drop:
            return 2 * k
    return None


def calibrate(
    where: str,
    estimate: NoiseEstimate,
    *,
    trials: int = two_sample.DEFAULT_MAX_TRIALS,
    trials_per_launch: int = 3,
    tolerance: float = two_sample.DEFAULT_TOLERANCE,
    alpha: float = two_sample.DEFAULT_ALPHA,
    power: float = two_sample.DEFAULT_POWER,
    detectable_drop: float = two_sample.DEFAULT_DETECTABLE_DROP,
    max_launches: int = 12,
) -> Calibration:
    """What ``estimate`` allows (module docstring).  ``trials``: of a run against a stored
    baseline; ``trials_per_launch``: of a launch in the paired comparison."""
    from scipy import stats as st

    sigma = gate_sigma(estimate.sigma)
    launch_sd = math.sqrt(sigma**2 / 2.0 + estimate.within_sd**2 / max(trials_per_launch, 1))
    spread = float(-math.expm1(-float(st.norm.ppf(0.95)) * sigma))
    return Calibration(
        where=where,
        estimate=estimate,
        sigma=sigma,
        stored_mdd=stored_mdd(
            sigma, estimate.within_sd, trials, tolerance=tolerance, alpha=alpha, power=power
        ),
        vouchable_drop=two_sample.smallest_vouchable_drop(tolerance, alpha, sigma, power),
        one_run_spread=spread,
        paired_launches=paired_launches_needed(
            launch_sd,
            tolerance=tolerance,
            alpha=alpha,
            power=power,
            detectable_drop=detectable_drop,
            max_launches=max_launches,
        ),
        tolerance=tolerance,
        detectable_drop=detectable_drop,
        max_launches=max_launches,
    )


__all__ = ["Calibration", "calibrate", "paired_launches_needed", "stored_mdd"]
