"""The race's null calibration and quantiles: the numbers each look is read against.

Why a module of its own: these are the race's statistics, apart from its bookkeeping
(:mod:`pytest_kimi.gate.race`: who is launched, recorded, eliminated, ranked).  Each is a pure
function of the design (deployments, looks, degrees of freedom) or of the figures, seeded where
it simulates, so it is checked and reused (``bench/race.py``, tests/unit/gate/test_race.py) without a
race; numpy and scipy are imported here only, where a look is computed, as in the rest of the
gate.

* :func:`nominal_alpha`: Pocock's constant nominal level of each elimination look, by a seeded
  simulation of equal deployments over the looks ``MIN_ROUNDS..max_rounds`` (the race's module
  docstring, "Across rounds");
* :func:`range_quantile`, :func:`range_sf`: Tukey's studentized range of the survivors' means
  (two means: the two-sided t, exactly), the elimination's threshold and its adjusted p;
* :func:`t_quantile`: the t quantiles of the ties and the 90% intervals;
* :func:`p_best`: P(the fastest), a seeded parametric bootstrap over the fitted means.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BOOTSTRAP_DRAWS",
    "MIN_ROUNDS",
    "NULL_SIMS",
    "check_design",
    "nominal_alpha",
    "p_best",
    "range_quantile",
    "range_sf",
    "t_quantile",
]

MIN_ROUNDS = 2
"""The first look: two launches of every survivor, the fewest that measure a launch's noise."""
NULL_SIMS = 40_000
"""Simulated null races behind :func:`nominal_alpha` (seeded: every verdict is a function of
the data)."""
BOOTSTRAP_DRAWS = 4000
"""Draws of P(best) (seeded); its Monte Carlo error is at most 0.008."""

_SEED = 20261207


def check_design(alpha: float, groups: int, max_rounds: int) -> None:
    """Refuse a race's design that no look can be read for (ValueError)."""
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if groups < 2:
        raise ValueError(f"a race needs at least 2 deployments, got {groups}")
    if max_rounds < MIN_ROUNDS:
        raise ValueError(
            f"max_rounds must be >= {MIN_ROUNDS} (two launches of each deployment measure "
            f"the launch noise), got {max_rounds}"
        )


@functools.lru_cache(maxsize=64)
def nominal_alpha(alpha: float, groups: int, max_rounds: int) -> float:
    """The level of each look's elimination such that any look at rounds ``MIN_ROUNDS ..
    max_rounds`` eliminates one of ``groups`` equal deployments with probability ``alpha``
    (Pocock's constant nominal level, :mod:`pytest_kimi.gate.race`'s docstring; ``alpha``
    itself for a single look).

    Each simulated look's range statistic is turned into its null p-value by its own simulated
    law (its rank among the races: no quadrature), and ``alpha'`` is the ``alpha`` quantile
    of each race's smallest p-value."""
    check_design(alpha, groups, max_rounds)
    if max_rounds == MIN_ROUNDS:
        return alpha
    import numpy as np

    rng = np.random.default_rng(_SEED)
    sums = np.zeros((NULL_SIMS, groups))
    squares = np.zeros((NULL_SIMS, groups))
    looks: list[np.ndarray] = []
    for k in range(1, max_rounds + 1):
        y = rng.standard_normal((NULL_SIMS, groups))
        sums += y
        squares += y * y
        if k < MIN_ROUNDS:
            continue
        means = sums / k
        ss = (squares - k * means**2).sum(axis=1)
        s = np.sqrt(np.maximum(ss, 1e-300) / (groups * (k - 1)))
        looks.append((means.max(axis=1) - means.min(axis=1)) / (s / math.sqrt(k)))
    w = np.stack(looks, axis=1)
    order = np.argsort(-w, axis=0, kind="stable")
    ranks = np.empty_like(order)
    cols = np.arange(w.shape[1])
    ranks[order, cols] = np.arange(1, NULL_SIMS + 1)[:, None]
    min_p = (ranks / NULL_SIMS).min(axis=1)
    return float(np.quantile(min_p, alpha))


@functools.lru_cache(maxsize=1024)
def range_quantile(level: float, groups: int, df: int) -> float:
    """The ``1 - level`` quantile of the studentized range of ``groups`` means on ``df``
    degrees of freedom (two means: sqrt(2) times the two-sided t quantile, exactly)."""
    from scipy import stats as st

    if groups == 2:
        return math.sqrt(2.0) * float(st.t.ppf(1.0 - level / 2.0, df))
    return float(st.studentized_range.ppf(1.0 - level, groups, df))


def range_sf(w: float, groups: int, df: int) -> float:
    """The Tukey-adjusted p of a pair whose studentized difference is ``w``."""
    from scipy import stats as st

    if groups == 2:
        return float(2.0 * st.t.sf(w / math.sqrt(2.0), df))
    return float(st.studentized_range.sf(w, groups, df))


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t on ``df`` degrees of freedom."""
    from scipy import stats as st

    return float(st.t.ppf(p, df))


def p_best(logs: Sequence[Sequence[float]], s: float | None) -> list[float | None]:
    """P(fastest) per deployment, from each one's log figures ``logs``: the share of seeded
    draws of the log-means (each normal about its estimate with the pooled noise ``s``'s
    standard error) in which it is the largest.  None for all when the noise is not measured
    yet (``s`` None); 0 for a deployment without a figure."""
    measured = [i for i, d in enumerate(logs) if d]
    if s is None or not measured:
        return [None] * len(logs)
    import numpy as np

    rng = np.random.default_rng(_SEED)
    means = np.array([sum(logs[i]) / len(logs[i]) for i in measured])
    se = np.array([max(s, 1e-12) / math.sqrt(len(logs[i])) for i in measured])
    draws = means + se * rng.standard_normal((BOOTSTRAP_DRAWS, len(measured)))
    wins = np.bincount(draws.argmax(axis=1), minlength=len(measured)) / BOOTSTRAP_DRAWS
    out: list[float | None] = [0.0] * len(logs)
    for k, i in enumerate(measured):
        out[i] = float(wins[k])
    return out
