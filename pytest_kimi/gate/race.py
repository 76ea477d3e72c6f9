"""Which deployment is best: a race of several deployments over launches, decided by the gate's
statistics (F-race / successive elimination), pure over an oracle or driven round by round.

Why a race and not a grid: most of a grid's launches go to deployments that were plainly
slower after their second launch.  A race launches every *surviving* deployment once per round
and drops one as soon as another is faster beyond the noise, so the launches go to the
leaders.  It stops when one deployment is left (the winner), when the survivors are shown
within the tolerance of one another (a declared tie: no winner), or when the budget ends (no
winner: the survivors are *undecided*, ranked by their means).

The model is the deploy gate's (:mod:`pytest_kimi.gate.paired`): launch ``r`` of deployment
``i`` gives ``y = log(figure) = mu_i + e`` (the figure: the objective's value, higher is
better), ``e`` independent with a common variance, *measured*: one-way ANOVA's pooled
within-group variance over the survivors' launches, on ``sum(n_i - 1)`` degrees of freedom.
Each round launches the survivors in :func:`round_order` (rotated every second round, reversed
on odd ones): over each pair of rounds every deployment holds positions ``p`` and ``S - 1 -
p``, so a linear drift adds the same to all of them (the gate's ABBA, for ``S`` deployments).

**Elimination**, after every round from :data:`~pytest_kimi.gate.race_stats.MIN_ROUNDS` on:
``i`` is dropped when some survivor ``j`` beats it beyond the noise, by Tukey's studentized
range over all ordered pairs of survivors, ``W_ij = (ybar_j - ybar_i - E) / (s sqrt((1/n_i
+ 1/n_j) / 2))`` against the ``1 - alpha'`` quantile of the range of ``S`` means on the pooled
``df``; ``E = -log(1 - margin)``, 0 by default ("significantly slower").  Why all pairs and not
each against the observed best: the best is *selected* by the data (the winner's curse), and a
comparison with the observed maximum is not a test of known level.  The largest ``W_ij`` is
the range of the means, so whatever the true means, the chance that any pair whose true gap is
within ``E`` crosses is at most that of the range of ``S`` equal means: Tukey's bound, exact,
one look.  Every pair "``j`` beats the true best" has a true null, so the true best is
eliminated at a look with probability at most ``alpha'``.

**Across rounds** every look is read at Pocock's constant nominal level ``alpha'``
(:func:`pytest_kimi.gate.race_stats.nominal_alpha`): a seeded simulation of ``N`` equal
deployments over the looks ``MIN_ROUNDS..max_rounds`` finds the level at which *any* look
eliminates with probability ``alpha``; the statistic's law is free of the noise's size, so one
simulation per design serves every race.  Why not ``alpha / 2^j`` spending: the hard question
(two leaders a few percent apart) is settled at rounds 4-8, where halving per look would leave
a few per mille.  Beyond the simulated case (survivors shrink as others are eliminated, and the
Tukey quantile is the one for the current ``S``) the bound is measured, not proven:
``bench/race.py`` counts the races that eliminated the true best, and equal deployments raced
to the budget (there every elimination is an error), and tests/unit/gate/test_race.py checks the latter:
at or under ``alpha``.

**Tie**, after a look's eliminations: the survivors are within the tolerance of one another
when every ordered pair's non-inferiority test (the gate's, H0 ``mu_i - mu_j <= log(1 -
tol)``) rejects at the gate's nominal level (:func:`pytest_kimi.gate.paired.nominal_alpha`,
same looks), with the pooled ``s``.  An intersection-union test: the claim needs *every* pair,
so no multiplicity correction is due, and a false tie has probability at most ``alpha``.

**Start failures**: a deployment that does not start is eliminated in that round with its
reason; the failed start counts as a launch, and one left alone by the others' failures is
the winner by default (their reasons say so).  Survivors stay balanced (one launch per round).

**Reports** (:class:`RaceResult`): the ranking (survivors by mean, then the eliminated, the
latest first), each deployment's value (the geometric mean of its figures) with the 90%
interval *of the value* (the pooled noise of the whole race), its ratio to the top with that
ratio's 90% interval (how sure the winner beats each one), who eliminated it at what adjusted
p, and P(best) (a seeded parametric bootstrap over the fitted means and the pooled noise).
``objective``, ``server_s`` and ``grid_server_s`` are the run layer's, which knows the test and
holds the clocks: :meth:`RaceResult.to_dict` takes them.

Pure: the looks' numbers (the null calibration, the quantiles, P(best)) are
:mod:`pytest_kimi.gate.race_stats`', which imports numpy and scipy where a look is computed, as
in the rest of the gate; this module is the race's bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.gate import paired
from pytest_kimi.gate.race_stats import (
    MIN_ROUNDS,
    check_design,
    nominal_alpha,
    p_best,
    range_quantile,
    range_sf,
    t_quantile,
)

__all__ = [
    "BUDGET",
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_ROUNDS",
    "DEFAULT_TOLERANCE",
    "NO_DEPLOYMENT",
    "TIE",
    "WINNER",
    "Race",
    "RaceEntry",
    "RaceResult",
    "RaceState",
    "StartFailure",
    "round_order",
    "run_race",
]

DEFAULT_MAX_ROUNDS = 10
"""Launches of one deployment at most.  At 2% launch noise two deployments 1.5% apart are
shown within a 5% tolerance of each other in about 5 rounds (bench/race.py); the budget bounds
the rest."""
DEFAULT_TOLERANCE = 0.05
"""The gate's tolerance: deployments within 5% of one another tie."""
DEFAULT_ALPHA = 0.05

WINNER = "winner"
"""Stop: one deployment left."""
TIE = "tie"
"""Stop: the survivors are within the tolerance of one another."""
BUDGET = "budget"
"""Stop: ``max_rounds`` or ``max_launches`` reached with several survivors (undecided)."""
NO_DEPLOYMENT = "no-deployment"
"""Stop: no deployment started."""


class StartFailure(Exception):
    """A deployment that did not start (or gave no trustworthy figure): the oracle returns or
    raises it, and the race eliminates the deployment in that round with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def round_order(survivors: Sequence[str], round_index: int) -> list[str]:
    """The launch order of round ``round_index`` (0-based) over ``survivors`` (in the race's
    order): rotated by one place every second round, reversed on odd rounds.

    Over rounds ``2m`` and ``2m + 1`` each deployment is launched at positions ``p`` and
    ``S - 1 - p``: a linear drift adds ``S - 1`` steps to every one of them (the gate's ABBA
    for ``S`` deployments), and the rotation varies who follows whom (a server's aftermath,
    a warm page cache), so no deployment always follows the same one."""
    if round_index < 0:
        raise ValueError(f"round_index must be >= 0, got {round_index}")
    names = list(survivors)
    if not names:
        return []
    k = (round_index // 2) % len(names)
    rotated = names[k:] + names[:k]
    return rotated[::-1] if round_index % 2 else rotated


def _log(name: str, figure: float) -> float:
    if isinstance(figure, bool) or not (isinstance(figure, (int, float)) and 0 < figure < math.inf):
        raise ValueError(f"{name}: a launch figure must be finite and positive, got {figure!r}")
    return math.log(figure)


@dataclass(frozen=True, slots=True)
class RaceEntry:
    """One deployment's standing in the race."""

    name: str
    value: float | None
    """The geometric mean of its launches' figures (the objective's unit); None when it never
    gave a figure."""
    ci90: tuple[float, float] | None
    """90% confidence interval of ``value`` (pooled launch noise over the whole race)."""
    launches: int
    """Launches started, a failed start included."""
    eliminated_in_round: int | None
    """The round (1-based) it was eliminated in; None for a survivor."""
    reason: str | None
    """Why it was eliminated (who beat it, by how much; or why it did not start)."""
    status: str
    """``winner``, ``tie``, ``undecided`` (the budget ended), ``racing`` (mid-race),
    ``eliminated`` or ``failed`` (did not start)."""
    ratio: float | None = None
    """``value`` over the top of the ranking's value (1.0 for the top)."""
    ratio_ci90: tuple[float, float] | None = None
    """90% interval of ``ratio`` (pooled noise): wholly below 1 when the top beats it."""
    p_best: float | None = None
    """P(the fastest) by a parametric bootstrap over the fitted means."""
    beaten_by: str | None = None
    p_value: float | None = None
    """``beaten_by``: the survivor that eliminated it, at this Tukey-adjusted p."""

    def to_dict(self) -> dict[str, Any]:
        def pct(r: float | None) -> float | None:
            return None if r is None else round((r - 1.0) * 100.0, 2)

        return {
            "deployment": self.name,
            "value": None if self.value is None else round(self.value, 4),
            "ci90": None if self.ci90 is None else [round(x, 4) for x in self.ci90],
            "eliminated_in_round": self.eliminated_in_round,
            "status": self.status,
            "launches": self.launches,
            "vs_best_pct": pct(self.ratio),
            "vs_best_ci90_pct": None
            if self.ratio_ci90 is None
            else [pct(x) for x in self.ratio_ci90],
            "p_best": None if self.p_best is None else round(self.p_best, 4),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class RaceResult:
    """The race's answer (final once ``stop`` is set; a snapshot while racing)."""

    ranking: tuple[RaceEntry, ...]
    """Best first: the survivors by value, then the eliminated (latest round first, then by
    value), then those that never gave a figure."""
    winner: str | None
    """The one deployment left; None on a tie, an undecided budget end or mid-race."""
    tie: tuple[str, ...]
    """The survivors declared within the tolerance of one another (empty unless ``stop`` is
    :data:`TIE`)."""
    undecided: tuple[str, ...]
    """The survivors when the budget ended without a decision."""
    rounds: int
    launches: int
    stop: str | None
    """:data:`WINNER`, :data:`TIE`, :data:`BUDGET`, :data:`NO_DEPLOYMENT`; None mid-race."""
    tolerance: float
    alpha: float
    nominal_alpha: float
    """The elimination looks' level (Tukey, per look)."""
    tie_alpha: float
    """The tie looks' level (each pair's one-sided test, per look)."""
    launch_sigma: float | None
    """The pooled sd of one launch's log figure over every launch of the race."""
    df: int

    def entry(self, name: str) -> RaceEntry:
        for e in self.ranking:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_dict(
        self,
        *,
        objective: str | None = None,
        server_s: float | None = None,
        grid_server_s: float | None = None,
    ) -> dict[str, Any]:
        """The JSON report's ``race`` section.  ``objective`` (what was raced: the test and its
        figure), ``server_s`` (the server seconds the race's launches took) and
        ``grid_server_s`` (what the full grid of ``max_rounds`` launches per deployment would
        have taken) are the run layer's, which holds the clocks."""
        return {
            "objective": objective,
            "ranking": [e.to_dict() for e in self.ranking],
            "winner": self.winner,
            "tie": list(self.tie),
            "undecided": list(self.undecided),
            "stop": self.stop,
            "rounds": self.rounds,
            "launches": self.launches,
            "server_s": None if server_s is None else round(server_s, 1),
            "grid_server_s": None if grid_server_s is None else round(grid_server_s, 1),
            "tolerance": self.tolerance,
            "alpha": self.alpha,
            "nominal_alpha": round(self.nominal_alpha, 6),
            "launch_sigma": None if self.launch_sigma is None else round(self.launch_sigma, 6),
        }

    def summary(self) -> str:
        """One line: the answer and what it cost."""
        cost = f"{self.launches} launch(es) in {self.rounds} round(s)"
        if self.stop == WINNER:
            runner = next((e for e in self.ranking[1:] if e.ratio), None)
            gap = (
                f", +{1 / runner.ratio - 1:.1%} over {runner.name}"
                if runner and runner.ratio
                else ""
            )
            return f"race: {self.winner} wins{gap} ({cost})"
        if self.stop == TIE:
            return f"race: tie within {self.tolerance:.0%}: {', '.join(self.tie)} ({cost})"
        if self.stop == NO_DEPLOYMENT:
            return f"race: no deployment started ({cost})"
        state = "undecided" if self.stop == BUDGET else "racing"
        return f"race: {state} between {', '.join(self.undecided)} ({cost})"


@dataclass(frozen=True, slots=True)
class RaceState:
    """Where a race stands between calls (for progress lines)."""

    round: int
    """Rounds started (1-based number of the current or last round)."""
    survivors: tuple[str, ...]
    pending: tuple[str, ...]
    """Deployments of the current round still to launch, in order."""
    launches: int
    done: bool
    stop: str | None


@dataclass(slots=True)
class _Deployment:
    name: str
    logs: list[float]
    launches: int = 0
    eliminated_in_round: int | None = None
    reason: str | None = None
    failed: bool = False
    beaten_by: str | None = None
    p_value: float | None = None

    @property
    def mean(self) -> float:
        return sum(self.logs) / len(self.logs)


class Race:
    """A race as a step function: the caller launches the deployments itself.

    ::

        race = Race(["ep8", "ep8-tuned", "tp8"])
        while order := race.next_round():
            for name in order:
                race.record(name, launch(name))   # a figure, or a StartFailure
        result = race.result()

    ``tolerance``: deployments within it of one another may be declared a tie.  ``margin``:
    the elimination's indifference zone (0: a deployment significantly slower than another is
    dropped; ``tolerance``: only one slower beyond the tolerance, so deployments within it are
    never separated: a tie, or undecided when the budget ends).  ``max_rounds``: launches of one deployment at most;
    ``max_launches``: launches of the whole race at most (a round is started only when every
    survivor can be launched in it).
    """

    def __init__(
        self,
        names: Sequence[str],
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        alpha: float = DEFAULT_ALPHA,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        max_launches: int | None = None,
        margin: float = 0.0,
    ) -> None:
        names = list(names)
        if len(set(names)) != len(names):
            raise ValueError(f"deployment names must be distinct, got {names}")
        check_design(alpha, len(names), max_rounds)
        if not 0.0 < tolerance < 1.0:
            raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if max_launches is not None and max_launches < len(names):
            raise ValueError(
                f"max_launches {max_launches} cannot launch each of the {len(names)} "
                f"deployments once; a race needs {MIN_ROUNDS * len(names)} for its first look"
            )
        self.names = names
        self.tolerance = tolerance
        self.alpha = alpha
        self.max_rounds = max_rounds
        self.max_launches = max_launches
        self.margin = margin
        self._deps = {n: _Deployment(n, []) for n in names}
        self._round = 0
        self._pending: list[str] = []
        self._launches = 0
        self._stop: str | None = None

    # ------------------------------------------------------------ the levels

    @property
    def elimination_alpha(self) -> float:
        """Each look's Tukey level (:func:`~pytest_kimi.gate.race_stats.nominal_alpha` for the
        race's design)."""
        return nominal_alpha(self.alpha, len(self.names), self.max_rounds)

    @property
    def tie_alpha(self) -> float:
        """Each look's level for a pair's non-inferiority test: the deploy gate's."""
        return paired.nominal_alpha(self.alpha, self.max_rounds)

    # ------------------------------------------------------------ stepping

    @property
    def done(self) -> bool:
        return self._stop is not None

    def survivors(self) -> list[str]:
        return [n for n in self.names if self._deps[n].eliminated_in_round is None]

    def next_round(self) -> list[str]:
        """The deployments to launch now, in order: the current round's still-pending ones
        (asking again is harmless), else a new round's; ``[]`` once the race is over (the
        budget is checked here: a round that cannot launch every survivor is not started)."""
        if self._stop is not None:
            return []
        if self._pending:
            return list(self._pending)
        alive = self.survivors()
        if self._round >= self.max_rounds or (
            self.max_launches is not None and self._launches + len(alive) > self.max_launches
        ):
            self._stop = BUDGET
            return []
        self._pending = round_order(alive, self._round)
        self._round += 1
        return list(self._pending)

    def record(self, name: str, outcome: float | StartFailure) -> None:
        """What launching ``name`` in the current round gave: its figure (the objective's
        value, positive) or a :class:`StartFailure` (eliminated in this round with its
        reason).  The round is judged once every deployment of it is recorded."""
        if name not in self._pending:
            raise ValueError(
                f"{name!r} is not waiting to launch in round {self._round} "
                f"(pending: {', '.join(self._pending) or 'none'})"
            )
        dep = self._deps[name]
        if isinstance(outcome, StartFailure):
            dep.failed = True
            dep.eliminated_in_round = self._round
            dep.reason = f"did not start: {outcome.reason}"
        else:
            dep.logs.append(_log(name, outcome))
        dep.launches += 1
        self._launches += 1
        self._pending.remove(name)
        if not self._pending:
            self._judge()

    def state(self) -> RaceState:
        alive, pending = tuple(self.survivors()), tuple(self._pending)
        return RaceState(self._round, alive, pending, self._launches, self.done, self._stop)

    # ------------------------------------------------------------ the looks

    def _judge(self) -> None:
        alive = self.survivors()
        if not alive:
            self._stop = NO_DEPLOYMENT
            return
        if len(alive) == 1:
            self._stop = WINNER
            return
        if self._round < MIN_ROUNDS:
            return
        deps = [self._deps[n] for n in alive]
        s, df = paired.pooled_sd([d.logs for d in deps])
        if df == 0:
            return
        s = max(s, 1e-12)
        self._eliminate(deps, s, df)
        alive = self.survivors()
        if len(alive) == 1:
            self._stop = WINNER
        elif self._tied([self._deps[n] for n in alive], s, df):
            self._stop = TIE

    def _eliminate(self, deps: list[_Deployment], s: float, df: int) -> None:
        """Drop every survivor some other survivor beats beyond the noise (Tukey, all ordered
        pairs, one look): all decided on this look's data before any is dropped."""
        level = self.elimination_alpha
        q = range_quantile(level, len(deps), df)
        shift = -math.log1p(-self.margin)
        beaten: list[tuple[_Deployment, _Deployment, float]] = []
        for i in deps:
            best_w, by = -math.inf, None
            for j in deps:
                if j is i:
                    continue
                se = s * math.sqrt((1.0 / len(i.logs) + 1.0 / len(j.logs)) / 2.0)
                w = (j.mean - i.mean - shift) / se
                if w > best_w:
                    best_w, by = w, j
            if by is not None and best_w > q:
                beaten.append((i, by, best_w))
        t90 = t_quantile(0.95, df)
        for i, j, w in beaten:
            d = i.mean - j.mean
            se = s * math.sqrt(1.0 / len(i.logs) + 1.0 / len(j.logs))
            p = range_sf(w, len(deps), df)
            i.eliminated_in_round = self._round
            i.beaten_by = j.name
            i.p_value = p
            i.reason = (
                f"slower than {j.name}: {math.expm1(d) * 100.0:+.1f}% (90% CI "
                f"{math.expm1(d - t90 * se) * 100.0:+.1f}% .. "
                f"{math.expm1(d + t90 * se) * 100.0:+.1f}%), Tukey-adjusted p {p:.2g} "
                f"<= {level:.3g} over {len(deps)} survivors"
            )

    def _tied(self, deps: list[_Deployment], s: float, df: int) -> bool:
        """Every survivor shown within the tolerance of every other one (intersection-union:
        each ordered pair's one-sided test at the gate's level)."""
        q = t_quantile(1.0 - self.tie_alpha, df)
        m = -math.log1p(-self.tolerance)
        for i in deps:
            for j in deps:
                if i is j:
                    continue
                se = s * math.sqrt(1.0 / len(i.logs) + 1.0 / len(j.logs))
                if (i.mean - j.mean + m) / se <= q:
                    return False
        return True

    # ------------------------------------------------------------ the answer

    def result(self) -> RaceResult:
        """The ranking and the decision (a snapshot while the race runs)."""
        alive = self.survivors()
        stop = self._stop
        survivor_status = {WINNER: WINNER, TIE: TIE, BUDGET: "undecided"}.get(stop or "", "racing")
        everyone = [self._deps[n] for n in self.names]
        s, df = paired.pooled_sd([d.logs for d in everyone])
        sigma = s if df else None

        def key(d: _Deployment) -> tuple[int, int, float, int]:
            value = d.mean if d.logs else -math.inf
            idx = self.names.index(d.name)
            if d.eliminated_in_round is None:
                return (0, 0, -value, idx)
            if not d.logs:
                return (2, 0, 0.0, idx)
            return (1, -d.eliminated_in_round, -value, idx)

        ordered = sorted(everyone, key=key)
        chances = p_best([d.logs for d in ordered], s if df else None)
        top = ordered[0] if ordered and ordered[0].logs else None
        t90 = t_quantile(0.95, df) if df else math.nan
        entries: list[RaceEntry] = []
        for d, pb in zip(ordered, chances):
            if d.eliminated_in_round is None:
                status = survivor_status
            else:
                status = "failed" if d.failed else "eliminated"
            value = ci = ratio = ratio_ci = None
            if d.logs:
                value = math.exp(d.mean)
                if df:
                    half = t90 * s / math.sqrt(len(d.logs))
                    ci = (math.exp(d.mean - half), math.exp(d.mean + half))
                if top is not None:
                    r = d.mean - top.mean
                    ratio = math.exp(r)
                    if df and d is not top:
                        half = t90 * s * math.sqrt(1.0 / len(d.logs) + 1.0 / len(top.logs))
                        ratio_ci = (math.exp(r - half), math.exp(r + half))
            entries.append(
                RaceEntry(
                    name=d.name,
                    value=value,
                    ci90=ci,
                    launches=d.launches,
                    eliminated_in_round=d.eliminated_in_round,
                    reason=d.reason,
                    status=status,
                    ratio=ratio,
                    ratio_ci90=ratio_ci,
                    p_best=pb,
                    beaten_by=d.beaten_by,
                    p_value=d.p_value,
                )
            )
        return RaceResult(
            ranking=tuple(entries),
            winner=alive[0] if stop == WINNER and alive else None,
            tie=tuple(e.name for e in entries if e.status == TIE),
            undecided=tuple(e.name for e in entries if e.status in ("undecided", "racing")),
            rounds=self._round,
            launches=self._launches,
            stop=stop,
            tolerance=self.tolerance,
            alpha=self.alpha,
            nominal_alpha=self.elimination_alpha,
            tie_alpha=self.tie_alpha,
            launch_sigma=sigma,
            df=df,
        )


def run_race(
    names: Sequence[str],
    launch: Callable[[str], float | StartFailure],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_launches: int | None = None,
    margin: float = 0.0,
) -> RaceResult:
    """Race ``names`` to the end over the oracle ``launch(name)``: a fresh launch of the
    deployment, measured, giving its figure (the objective's value, higher is better), or a
    :class:`StartFailure` returned or raised.  The options are :class:`Race`'s."""
    race = Race(
        names,
        tolerance=tolerance,
        alpha=alpha,
        max_rounds=max_rounds,
        max_launches=max_launches,
        margin=margin,
    )
    while order := race.next_round():
        for name in order:
            try:
                outcome = launch(name)
            except StartFailure as exc:
                outcome = exc
            race.record(name, outcome)
    return race.result()
