"""The deploy gate's experiment: reference and candidate launched in ABBA blocks, judged
sequentially, stopped as soon as the data decide (or the launch budget ends).

Why launches and not trials: a *launch* (a fresh server process) draws its own speed factor
(placement, clocks, JIT and autotuning state), the same for every trial it serves.  Trials of
one launch cannot show that factor; only more launches can.  Judged against a stored baseline
the factor must be *assumed* (the gate's ``session_sigma``); here it is *measured*, by the
scatter of the launches themselves, and the comparison needs no assumption at all.

Model, per level: launch ``i`` of deployment X gives ``y_i = log(figure_i) = mu_X + s_i``,
``s_i`` the launch's factor (its trials' scatter included), independent with a common
variance.  The candidate's shift ``d = mean(y_B) - mean(y_A)`` has the pooled two-sample
standard error with ``n_A + n_B - 2`` degrees of freedom.  The ABBA order (A B, B A, A B, ...)
makes a linear drift over the run fall on both deployments alike, so it cancels in ``d`` after
every second block (:func:`block_order`).

Sequential stopping with a controlled false-alarm rate: after every block from
:data:`MIN_BLOCKS` on, the one-sided t tests against the tolerance (regression: H0 ``ratio >=
1 - tol``; non-inferiority, which lets the gate say ``pass``: H0 ``ratio <= 1 - tol``;
improved: H0 ``ratio <= 1 + tol``) are read at a *nominal* level ``alpha'`` below ``alpha``,
chosen so that the chance of *any* look rejecting a true H0 is ``alpha`` (Pocock's constant
nominal level, found for the t statistic by simulation: under H0 the sequence of t statistics
does not depend on the noise's size, so one seeded simulation per design serves every
deployment; :func:`nominal_alpha`).  A level's verdict is frozen at its first decisive look.
Without one when the budget ends, the level is ``inconclusive`` when its estimate lies beyond
the tolerance and ``underpowered`` otherwise: the experiment could not vouch for it.

Every comparison also says the smallest drop it could have caught
(:attr:`PairedComparison.min_detectable_drop`: flagged with probability ``power`` at the
nominal level, from the measured noise) and the launches it rests on.

Pure functions over plain numbers: the culprit search and the race reuse the same comparison
as their oracle, and ``bench/deploy_gate.py`` measures its power and false alarms.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import PairedComparisonEntry

if TYPE_CHECKING:
    import numpy as np

# numpy and scipy are imported where a comparison is computed: the plugin reads this module's
# constants while it configures a session that may never measure

MIN_BLOCKS = 2
"""The first look: two launches of each deployment, the fewest that measure a launch's noise
on both sides (one degree of freedom each)."""

DEFAULT_MAX_LAUNCHES = 12
"""``--perf-max-launches``' default: six ABBA blocks.  At 2% launch noise a 10% drop is decided
in about 6 launches (bench/deploy_gate.py); the budget bounds the rest."""

NULL_SIMS = 40_000
"""Simulated paths behind :func:`nominal_alpha` (seeded: the nominal level, hence every
verdict, is a function of the data).  Its Monte Carlo error on a 5% crossing rate is 0.0011."""

_SEED = 20261205


def block_order(block: int) -> tuple[int, int]:
    """Which deployment launches first in ``block`` (0-based): ``(0, 1)`` = reference first.

    A B, B A, A B, ...: over each two blocks a linear drift adds ``0 + 3`` to one deployment
    and ``1 + 2`` to the other, so it cancels in the shift (plain alternation A B A B would put
    the candidate one step of drift behind at every block)."""
    if block < 0:
        raise ValueError(f"block must be >= 0, got {block}")
    return (0, 1) if block % 2 == 0 else (1, 0)


def _check(alpha: float, max_blocks: int) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if max_blocks < MIN_BLOCKS:
        raise ValueError(
            f"the launch budget allows {max_blocks} blocks of two launches; "
            f"at least {MIN_BLOCKS} are needed to measure a launch's noise "
            f"(--perf-max-launches {2 * MIN_BLOCKS} or more)"
        )


@functools.lru_cache(maxsize=64)
def nominal_alpha(alpha: float, max_blocks: int) -> float:
    """The level each look is read at so that any of the looks at blocks
    ``MIN_BLOCKS..max_blocks`` rejects a true H0 with probability ``alpha`` (module docstring).

    With a single look this is ``alpha`` itself.  The null paths are normal launches at the
    margin; the t statistic's law is free of their scale, so the answer holds for any noise.
    """
    _check(alpha, max_blocks)
    if max_blocks == MIN_BLOCKS:
        return alpha
    import numpy as np
    from scipy import stats as st

    rng = np.random.default_rng(_SEED)
    n = max_blocks
    a = rng.standard_normal((NULL_SIMS, n))
    b = rng.standard_normal((NULL_SIMS, n))
    min_p = np.ones(NULL_SIMS)
    for k in range(MIN_BLOCKS, n + 1):
        ya, yb = a[:, :k], b[:, :k]
        d = yb.mean(axis=1) - ya.mean(axis=1)
        ss = ((ya - ya.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) + (
            (yb - yb.mean(axis=1, keepdims=True)) ** 2
        ).sum(axis=1)
        df = 2 * k - 2
        se = np.sqrt(ss / df * (2.0 / k))
        p = st.t.cdf(d / se, df)
        np.minimum(min_p, p, out=min_p)
    return float(np.quantile(min_p, alpha))


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """One level's paired comparison after some blocks: the candidate against the reference."""

    ratio: float
    """exp(d): the candidate's geometric mean over its launches / the reference's."""
    ci90: tuple[float, float]
    """The repeated confidence interval at the nominal level (two-sided ``1 - 2 alpha'``,
    90% with one look): it lies wholly below ``1 - tol`` exactly when the verdict is
    ``regression``, at every look."""
    p_regression: float
    """The one-sided p of the regression test at this look (compare with ``nominal_alpha``)."""
    p_pass: float
    """The one-sided p of the non-inferiority test (H0: ratio <= 1 - tol)."""
    p_improved: float
    nominal_alpha: float
    verdict: Verdict
    decided: bool
    """True when a boundary was crossed (regression, pass or improved): stop launching."""
    launches: int
    """Launches this comparison rests on (both deployments)."""
    launch_sigma: float
    """The measured sd of one launch's log figure (pooled over both deployments): the
    session noise of this deployment pair, measured, not assumed."""
    df: int
    se_log: float
    min_detectable_drop: float
    """The true drop the regression test flags with probability ``power`` at this look."""

    def to_dict(self) -> PairedComparisonEntry:
        def pct(r: float) -> float | None:
            return round((r - 1.0) * 100.0, 2) if math.isfinite(r) else None

        return {
            "change_pct": pct(self.ratio),
            "ci90": [pct(self.ci90[0]), pct(self.ci90[1])],
            "p_value": round(self.p_regression, 6),
            "p_pass": round(self.p_pass, 6),
            "p_improved": round(self.p_improved, 6),
            "nominal_alpha": round(self.nominal_alpha, 6),
            "verdict": self.verdict.value,
            "decided": self.decided,
            "launches": self.launches,
            "launch_sigma": round(self.launch_sigma, 6),
            "df": self.df,
            "min_detectable_drop_pct": round(self.min_detectable_drop * 100.0, 2)
            if math.isfinite(self.min_detectable_drop)
            else None,
        }


def compare_paired(
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    max_blocks: int,
    tolerance: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.95,
) -> PairedComparison:
    """Judge the candidate's launch figures (tok/s, one per launch, any positive unit) against
    the reference's at this look.

    An undecided look says ``inconclusive`` (estimate beyond the tolerance) or
    ``underpowered`` with ``decided=False``: the word the level keeps if the budget ends here.
    """
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    if not 0.5 <= power < 1.0:
        raise ValueError(f"power must be in [0.5, 1), got {power}")
    ya = log_figures("reference", reference)
    yb = log_figures("candidate", candidate)
    if min(ya.size, yb.size) < MIN_BLOCKS:
        raise ValueError(
            f"{ya.size} reference and {yb.size} candidate launches: "
            f"each side needs {MIN_BLOCKS} to measure a launch's noise"
        )
    from scipy import stats as st

    a_nom = nominal_alpha(alpha, max_blocks)
    sigma, df = pooled_sd([ya, yb])
    se = max(sigma * math.sqrt(1.0 / ya.size + 1.0 / yb.size), 1e-12)
    d = float(yb.mean() - ya.mean())
    m = math.log1p(-tolerance)
    up = math.log1p(tolerance)
    t = st.t
    p_reg = float(t.cdf((d - m) / se, df))
    p_pass = float(t.sf((d - m) / se, df))
    p_imp = float(t.sf((d - up) / se, df))
    q = float(t.ppf(1.0 - a_nom, df))
    ci = (math.exp(d - q * se), math.exp(d + q * se))
    mdd = look_mdd(se, df, a_nom, tolerance=tolerance, power=power)
    if p_reg <= a_nom:
        verdict, decided = Verdict.REGRESSION, True
    elif p_imp <= a_nom:
        verdict, decided = Verdict.IMPROVED, True
    elif p_pass <= a_nom:
        verdict, decided = Verdict.PASS, True
    else:
        decided = False
        verdict = Verdict.INCONCLUSIVE if d < m else Verdict.UNDERPOWERED
    return PairedComparison(
        ratio=math.exp(d),
        ci90=ci,
        p_regression=p_reg,
        p_pass=p_pass,
        p_improved=p_imp,
        nominal_alpha=a_nom,
        verdict=verdict,
        decided=decided,
        launches=int(ya.size + yb.size),
        launch_sigma=sigma,
        df=df,
        se_log=se,
        min_detectable_drop=mdd,
    )


def look_mdd(se: float, df: int, a_nom: float, *, tolerance: float, power: float) -> float:
    """The true drop a look with standard error ``se`` (log scale, ``df`` degrees of freedom)
    flags as a regression at the nominal level ``a_nom`` with probability ``power``: the
    comparison's :attr:`PairedComparison.min_detectable_drop`, and what ``kimi-perf calibrate``
    asks of a design before any launch."""
    from scipy import stats as st

    q = float(st.t.ppf(1.0 - a_nom, df) + st.t.ppf(power, df))
    return -math.expm1(math.log1p(-tolerance) - q * se)


def pooled_sd(groups: Sequence[Sequence[float] | np.ndarray]) -> tuple[float, int]:
    """The pooled within-group sd of log figures (one-way ANOVA's) and its degrees of freedom;
    ``(nan, 0)`` when no group has two.  The one launch-noise estimate of the paired
    comparison, the culprit probes and the race."""
    import numpy as np

    arrays = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    df = sum(a.size - 1 for a in arrays)
    if df < 1:
        return math.nan, 0
    ss = sum(float(((a - a.mean()) ** 2).sum()) for a in arrays)
    return math.sqrt(ss / df), df


def log_figures(name: str, values: Sequence[float]) -> np.ndarray:
    """Launch figures as logs, refused (naming ``name``) unless finite and positive."""
    import numpy as np

    arr = np.asarray(list(values), dtype=np.float64)
    if arr.ndim != 1 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} launch figures must be finite and positive, got {list(values)}")
    return np.log(arr)


@dataclass(frozen=True, slots=True)
class SequentialOutcome:
    """A whole paired experiment on one level: the look that decided it (or the last one)."""

    comparison: PairedComparison
    blocks: int
    looks: list[PairedComparison]


def run_sequential(
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    max_blocks: int,
    tolerance: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.95,
) -> SequentialOutcome:
    """Replay an experiment's launches block by block and stop at the first decisive look.

    ``reference[i]`` and ``candidate[i]`` are block ``i``'s two launches; the experiment would
    have launched no further than the decisive block, so a caller that measures lazily (the run
    layer, the bench) gets the same verdict and launch count as this replay.
    """
    blocks = min(len(reference), len(candidate), max_blocks)
    looks: list[PairedComparison] = []
    for k in range(MIN_BLOCKS, blocks + 1):
        c = compare_paired(
            reference[:k],
            candidate[:k],
            max_blocks=max_blocks,
            tolerance=tolerance,
            alpha=alpha,
            power=power,
        )
        looks.append(c)
        if c.decided:
            return SequentialOutcome(c, k, looks)
    if not looks:
        raise ValueError(f"{blocks} blocks measured: at least {MIN_BLOCKS} are needed")
    return SequentialOutcome(looks[-1], blocks, looks)


__all__ = [
    "DEFAULT_MAX_LAUNCHES",
    "MIN_BLOCKS",
    "PairedComparison",
    "SequentialOutcome",
    "block_order",
    "compare_paired",
    "look_mdd",
    "nominal_alpha",
    "run_sequential",
]
