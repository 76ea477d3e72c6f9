"""Change points: the runs after which a test level's throughput moved, and what moved with it.

The gate compares one run with a reviewed baseline, so it sees a slow change late or never: a
drift of 2% per run passes each run against the one before (every step is well inside a 5%
tolerance), against a fixed baseline only once it has added up to about the detectable drop,
against a baseline updated along the way never, and has cost 18% after ten runs.  The history holds every run, so a change-point detector can see the
series as a whole.  This module runs Apache Otava's (``apache-otava``) detector over each
:class:`~pytest_kimi.history.model.LevelSeries` and says, per change: the first run after it,
the throughput before and after, the step with its uncertainty, and the provenance fields
that changed across it (the first place to look for a cause).

The detector (Otava, the algorithm of Hunter, Fleming et al. 2023, doi:10.1145/3578244.3583719)
----------------------------------------------------------------------------------------------
1. *Split*: e-divisive means (Matteson and James 2014) in sliding windows of ``window`` runs
   proposes candidate change points, each kept while a two-sided Student t-test between the
   segments it separates has ``p <= 10 * max_pvalue`` (the "weak" change points).
2. *Merge*: the weakest candidate (largest p, or once all are significant the smallest
   relative step) is dropped while its ``p >= max_pvalue`` or its step is ``<= min_magnitude``;
   after each drop the two candidates beside it are tested again on their widened segments.

One correction: Otava 0.8.0's merge (and upstream's at the time of writing) re-tests the
candidate *right* of the dropped one and the one after that, never the one on its left, which
keeps a stale p-value from the narrower segment and can then drop a real change: a drift that
the split cut into three weak steps lost all three.  :func:`_merge` is Otava's merge with both
neighbours re-tested, as the Hunter paper describes it; the split, the significance test and
the candidate statistics are Otava's own.  It finds such drifts far more often than Otava's
merge (``python bench/changepoints.py --stock-merge`` against the default; the figures are in
docs/evidence/gate.md, "Change points in the history").

Input: one figure per run
-------------------------
A run's figure is its level's ``tok_s`` (the median of its trials, as the gate reports it);
with ``--perf-sessions`` a run has several points (one per fresh deployment session) and its
figure is their geometric mean.  A ``@capacity`` test's series (``kind`` ``capacity``) gives
its capacity's interpolated boundary (``estimate``), the quantity its gate compares: the
capacity itself moves in steps of the search's grid, the boundary smoothly.  A run whose
capacity is only a bound (the top of the range held, or the bottom broke) has no boundary and
is left out, as a run without a figure is; the loads a search probed are no series at all.  Runs without a valid figure, or whose level was ``invalid``
(a stalled client), ``error`` or ``not-run``, are left out, not filled.  The
detector works on tok/s itself: its statistics (distances, t-test, relative step) do not
depend on the unit, and at a few percent of noise a log scale changes nothing measurable.

Defaults, and the measurement behind them (``python bench/changepoints.py``)
---------------------------------------------------------------------------
Synthetic series, each run's figure ``exp(N(0, sigma))`` around its true level; ``sigma`` is
the run-to-run noise of a figure (3% session sigma -> one session's factor 2.1%, plus the
median of 3 trials: about 2.5%).  The rates measured are in docs/evidence/gate.md, "Change
points in the history".

* ``max_pvalue = 1e-4``, ten times stricter than Otava's own default.  The t-test's p-value
  is taken after the detector chose the best split, so its nominal rate does not hold per
  series, and a history is read many series at a time (a suite of levels): at ``0.001`` too
  many looks would show some false change.  What it must find it still finds at ``1e-4``: a
  large step, and a drift whose every step is inside the gate's tolerance.  The price is paid
  on moderate steps at 3% noise, a step in only the last run, and everything at 5% noise;
  ``--max-pvalue 0.001`` buys those back for a small suite.
* ``min_magnitude = 0.03``: a change must move the level by more than 3% (Otava's relative
  step, the larger of ``after/before - 1`` and ``before/after - 1``).  It removes the false
  changes of a quiet deployment and the real but idle ones of a near-noiseless simulator,
  while staying below the gate's 5% tolerance, so the history names the moderate steps the
  gate lets pass.

Uncertainty of a step
---------------------
``ci_pct`` is a 90% Welch interval of the ratio of the geometric means of the two segments
the change separates (runs on the log scale, each segment's own run-to-run spread, Welch
degrees of freedom), in percent; ``pvalue`` is Otava's t-test p-value of the same split.  The
trials of each run are *not* used: the run-to-run spread of the figures already holds the
trial noise, and it also holds the session noise (server starts differ by a factor), which
the trials cannot see; a within-run interval would be too narrow by exactly the part that
matters.  A segment of one run borrows the other segment's spread (as the gate does for a
single trial); with one run on each side there is no interval.

Pure: no pytest, no database; Otava (and numpy, scipy) are imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pytest_kimi.baseline.model import ABSENT
from pytest_kimi.baseline.provenance import (
    SERVER_INFO_IGNORE,
    FieldChange,
    Provenance,
    flat_changes,
    is_ignored,
    named_once,
)
from pytest_kimi.verdicts import Verdict
from pytest_kimi.history.model import LevelSeries, Point, RunInfo

__all__ = [
    "CI_LEVEL",
    "DEFAULT_MAX_PVALUE",
    "DEFAULT_MIN_MAGNITUDE",
    "DEFAULT_WINDOW",
    "HISTORY_IGNORE",
    "MIN_RUNS",
    "VOLATILE_PROVENANCE",
    "Change",
    "ChangePointsUnavailable",
    "RunFigure",
    "comparable_provenance",
    "detect",
    "find_changes",
    "provenance_changes",
    "run_figures",
    "trusted",
]

DEFAULT_MAX_PVALUE = 1e-4
"""Otava's significance threshold (a tenth of its own default; measured in the module
docstring)."""
DEFAULT_MIN_MAGNITUDE = 0.03
"""Smallest relative step named a change (3%; measured in the module docstring)."""
DEFAULT_WINDOW = 50
"""Otava's sliding window, in runs (its own default): longer series are split in windows of
this many runs, half overlapping, so the cost stays linear and an old regime does not mask a
recent change."""
MIN_RUNS = 3
"""Fewer runs than this hold no change point: two runs are one comparison, the gate's job."""
CI_LEVEL = 0.90
"""Two-sided confidence of ``Change.ci_pct``: the level of the gate's own intervals."""

HISTORY_IGNORE: tuple[str, ...] = (*SERVER_INFO_IGNORE, "sim.seed")
"""``server_info`` entries that never make two runs different builds: the provenance diff's
volatile entries (hosts, ports, pids, SGLang's per-launch ``random_seed``...) and the
simulator's ``seed``, which like ``random_seed`` draws a launch's luck (its session noise
factor, jitter, errors), not its configuration."""

VOLATILE_PROVENANCE: frozenset[str] = Provenance.VOLATILE | frozenset(
    {"commit", "branch", "ci_url", "time"}
)
"""Top-level provenance fields that change without the measured setup changing: the suite's
commit and the recording's time and host (:attr:`Provenance.VOLATILE`), and the run's CI
metadata should a store flatten it into the provenance."""


# ---------------------------------------------------------------------------- provenance


def comparable_provenance(
    flat: Mapping[str, Any], *, ignore: Sequence[str] = HISTORY_IGNORE
) -> dict[str, Any]:
    """A run's flattened provenance (``server_info.tp_size``: 8) without the fields that
    change between launches of one setup, keyed as the diff names them (``model``,
    ``plugin_version``, ``tp_size``); two runs of one build give equal dicts."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        head, dot, rest = key.partition(".")
        if head in VOLATILE_PROVENANCE:
            continue
        if head == "server_info" and dot:
            if not rest or is_ignored(rest, ignore):
                continue
            out[rest] = value
        else:
            out[key] = value
    return out


def provenance_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], *, ignore: Sequence[str] = HISTORY_IGNORE
) -> tuple[FieldChange, ...]:
    """What differs between two runs' flattened provenance, as the baseline diff says it.

    The same rules as :func:`pytest_kimi.baseline.provenance.provenance_diff` (its ignore
    patterns and value comparison; a flag changed both as launched and as resolved is named
    once, as resolved), applied to the history's flattened form: ``model`` and
    ``plugin_version`` first, then the rest in key order.
    """
    a, b = comparable_provenance(old, ignore=ignore), comparable_provenance(new, ignore=ignore)
    first = [k for k in ("model", "plugin_version") if k in a or k in b]
    rest = sorted((set(a) | set(b)) - set(first))
    return tuple(named_once(flat_changes(a, b, first + rest)))


def _field_dict(change: FieldChange) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        return None if value is ABSENT else value

    return {"field": change.field, "old": plain(change.old), "new": plain(change.new)}


# --------------------------------------------------------------------------- run figures


@dataclass(frozen=True, slots=True)
class RunFigure:
    """One run's figure for one level: what the detector sees as one observation."""

    run: RunInfo
    tok_s: float
    """The level's tok/s (a capacity series: its boundary); with ``--perf-sessions`` the
    geometric mean of the sessions'."""
    trials: tuple[float, ...] = ()
    """Every valid trial of the run at this level (all sessions together)."""
    sessions: int = 1
    """Points (deployment sessions) the figure combines."""


def _valid(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0.0


def trusted(point: Point) -> bool:
    """Whether a point's figures may enter an analysis: its verdict is not one whose samples
    cannot be trusted (``invalid``: a stalled client, wrong token counts; ``error``;
    ``not-run``), the same rule that keeps such levels out of baselines and comparisons.  An
    unknown or missing verdict is trusted (a newer plugin's word, a made-up series)."""
    verdict = Verdict.of(point.verdict)
    return verdict is None or verdict.comparable


def run_figures(series: LevelSeries) -> list[RunFigure]:
    """The series' runs in order, one figure each; points without a valid figure, or with a
    verdict that says it cannot be trusted (:func:`trusted`), left out."""
    order: list[int] = []
    by_run: dict[int, list[Any]] = {}
    for point in series.points:
        if not _valid(point.figure) or not trusted(point):
            continue
        if point.run.id not in by_run:
            order.append(point.run.id)
            by_run[point.run.id] = []
        by_run[point.run.id].append(point)
    out = []
    for run_id in order:
        points = by_run[run_id]
        logs = [math.log(p.figure) for p in points]
        trials = tuple(t for p in points for t in p.trials if _valid(t))
        out.append(
            RunFigure(
                run=points[0].run,
                tok_s=math.exp(sum(logs) / len(logs)),
                trials=trials,
                sessions=len(points),
            )
        )
    return out


# ------------------------------------------------------------------------------ detector


class ChangePointsUnavailable(RuntimeError):
    """Apache Otava is not installed (it is the ``otava`` extra, not a core dependency)."""


def _otava() -> Any:
    """``otava.analysis``, imported on first use: a session that only records runs never
    pays for it, and an install without the extra gets a message that says what to install."""
    try:
        from otava import analysis
    except ImportError as exc:
        raise ChangePointsUnavailable(
            f"change points need Apache Otava ({exc.name or 'otava'} is not installed): "
            "pip install 'pytest-kimi[otava]'"
        ) from None
    return analysis


def _check(max_pvalue: float, min_magnitude: float, window: int) -> None:
    if not 0.0 < max_pvalue < 1.0:
        raise ValueError(f"max_pvalue must be in (0, 1), got {max_pvalue!r}")
    if not (min_magnitude >= 0.0 and math.isfinite(min_magnitude)):
        raise ValueError(f"min_magnitude must be a finite fraction >= 0, got {min_magnitude!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an integer >= 2, got {window!r}")


def _merge(
    change_points: list[Any], series: list[float], max_pvalue: float, min_magnitude: float
) -> list[Any]:
    """Otava's merge step (``otava.analysis.merge``) with both neighbours of a dropped change
    point re-tested (see the module docstring); the rule that picks what to drop is Otava's."""
    tester = _otava().TTestSignificanceTester(max_pvalue)
    points = list(change_points)
    while points:
        weakest = max(points, key=lambda c: c.stats.pvalue)
        if weakest.stats.pvalue < max_pvalue:
            weakest = min(points, key=lambda c: c.stats.change_magnitude())
            if weakest.stats.change_magnitude() > min_magnitude:
                return points
        at = next(i for i, c in enumerate(points) if c.index == weakest.index)
        del points[at]
        intervals = tester.get_intervals(points)
        for i in (at - 1, at):  # the left and the right neighbour of the dropped point
            if 0 <= i < len(points):
                points[i] = tester.change_point(points[i].to_candidate(), series, intervals)
    return points


def detect(
    values: Sequence[float],
    *,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    min_magnitude: float = DEFAULT_MIN_MAGNITUDE,
    window: int = DEFAULT_WINDOW,
) -> list[tuple[int, float]]:
    """Change points of one series of figures: ``(index, pvalue)`` for each, in order, where
    ``index`` is the position of the first figure after the change (``0 < index < len``).

    Raises :class:`ChangePointsUnavailable` without Otava, ``ValueError`` for a parameter out
    of range."""
    _check(max_pvalue, min_magnitude, window)
    series = [float(v) for v in values]  # a list: Otava's windows slice a list, not an array
    if len(series) < MIN_RUNS:
        return []
    split = _otava().split
    # Otava's first-pass threshold for the weak change points (compute_change_points)
    first = (
        max_pvalue * 10
        if max_pvalue < 0.05
        else (max_pvalue * 2 if max_pvalue < 0.5 else max_pvalue)
    )
    weak = split(series, window, first)
    final = _merge(weak, series, max_pvalue, min_magnitude)
    return [(int(c.index), float(c.stats.pvalue)) for c in sorted(final, key=lambda c: c.index)]


# ------------------------------------------------------------------------------- changes


@dataclass(frozen=True, slots=True)
class Change:
    """A change point in one test level's series: the first run after it and what it moved.

    ``before_tok_s``/``after_tok_s`` are the geometric means of the figures of the runs
    between this change and its neighbours (the previous change or the start, the next
    change or the end); ``change_pct`` is their ratio less one, in percent.  In a capacity
    series (``kind`` ``capacity``) the figures are the capacity's boundary, in ``unit``
    (``streams`` or ``req/s``), not tok/s.
    """

    test: str
    level: str
    deployment: str | None
    run: int
    """Id of the first run after the change (its figure is the first of the new level)."""
    time: datetime
    """When that run finished."""
    commit: str | None
    """The suite's commit of that run."""
    previous_run: int
    """Id of the last run before the change."""
    previous_time: datetime
    previous_commit: str | None
    before_tok_s: float
    after_tok_s: float
    change_pct: float
    ci_pct: tuple[float, float] | None
    """The step's 90% interval in percent (Welch, from the segments' run-to-run spreads; see
    the module docstring); None with a single run on each side."""
    pvalue: float
    """Otava's t-test p-value of the split at this change, after the merge."""
    before_runs: int
    after_runs: int
    before_sd_pct: float | None
    """Run-to-run spread (log sd, in percent) of the runs before; None for a single run."""
    after_sd_pct: float | None
    provenance_changes: tuple[FieldChange, ...] = ()
    """Fields that differ between the last run before and the first run after (volatile
    fields, ports and seeds left out: :data:`HISTORY_IGNORE`)."""
    index: int = 0
    """Position of ``run`` among the series' runs that have a figure (0-based)."""
    series: str = ""
    """The series' :attr:`~pytest_kimi.history.model.LevelSeries.ident`."""
    ci_level: float = CI_LEVEL
    key: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The level's baseline key (its workload), as the series has it."""
    kind: str = "throughput"
    """The series' kind: ``throughput`` or ``capacity``."""
    unit: str = "tok/s"
    """The unit of ``before_tok_s`` and ``after_tok_s`` (the series')."""

    @property
    def direction(self) -> str:
        if self.kind == "capacity":
            return "lower" if self.change_pct < 0 else "higher"
        return "slower" if self.change_pct < 0 else "faster"

    def describe(self) -> list[str]:
        """The change as a few readable lines (``kimi-perf history changes``)."""
        when = self.time.strftime("%Y-%m-%d %H:%M UTC")
        head = f"{self.series or self.test + ' ' + self.level}: {self.change_pct:+.1f}% "
        head += f"({self.direction}) from run {self.run}, {when}"
        if self.commit:
            head += f", commit {self.commit}"
        lines = [head]
        ci = (
            f"{self.ci_level:.0%} CI {self.ci_pct[0]:+.1f}% to {self.ci_pct[1]:+.1f}%"
            if self.ci_pct is not None
            else "no interval: one run on each side"
        )
        lines.append(
            f"  {_tok(self.before_tok_s)} -> {_tok(self.after_tok_s)} {self.unit} "
            f"({self.before_runs} run{'s' if self.before_runs != 1 else ''} before, "
            f"{self.after_runs} after; {ci}; p {self.pvalue:.2g})"
        )
        prev = f"  last run before: {self.previous_run}"
        if self.previous_commit and self.previous_commit != self.commit:
            prev += f", commit {self.previous_commit}"
        lines.append(prev)
        if self.provenance_changes:
            lines.append("  changed: " + "; ".join(str(c) for c in self.provenance_changes))
        else:
            lines.append("  changed: nothing in the provenance (code, data or machine?)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: times in ISO 8601, the interval a list, provenance changes as
        ``{"field", "old", "new"}`` (an absent side is null) plus their text."""
        return {
            "test": self.test,
            "level": self.level,
            "deployment": self.deployment,
            "series": self.series,
            "kind": self.kind,
            "unit": self.unit,
            "key": dict(self.key),
            "run": self.run,
            "time": self.time.isoformat(),
            "commit": self.commit,
            "previous_run": self.previous_run,
            "previous_time": self.previous_time.isoformat(),
            "previous_commit": self.previous_commit,
            "before_tok_s": round(self.before_tok_s, 6),
            "after_tok_s": round(self.after_tok_s, 6),
            "change_pct": round(self.change_pct, 4),
            "ci_pct": None if self.ci_pct is None else [round(x, 4) for x in self.ci_pct],
            "ci_level": self.ci_level,
            "pvalue": self.pvalue,
            "before_runs": self.before_runs,
            "after_runs": self.after_runs,
            "before_sd_pct": _round(self.before_sd_pct),
            "after_sd_pct": _round(self.after_sd_pct),
            "index": self.index,
            "direction": self.direction,
            "provenance_changes": [_field_dict(c) for c in self.provenance_changes],
            "changed": [str(c) for c in self.provenance_changes],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _tok(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _log_stats(values: Sequence[float]) -> tuple[float, float | None, int]:
    """Mean and sample variance of the logs (variance None for one value), and the count."""
    logs = [math.log(v) for v in values]
    n = len(logs)
    mean = sum(logs) / n
    var = sum((x - mean) ** 2 for x in logs) / (n - 1) if n > 1 else None
    return mean, var, n


def step_interval(
    before: Sequence[float], after: Sequence[float], level: float = CI_LEVEL
) -> tuple[float, float] | None:
    """The ``level`` Welch interval of ``geomean(after) / geomean(before) - 1``, in percent.

    A side with one figure borrows the other side's variance and degrees of freedom; one
    figure on each side gives None (nothing to say how far a single run scatters).
    """
    from scipy import stats as st

    mb, vb, nb = _log_stats(before)
    ma, va, na = _log_stats(after)
    d = ma - mb
    if vb is not None and va is not None:
        wb, wa = vb / nb, va / na
        se2 = wb + wa
        denom = wb**2 / (nb - 1) + wa**2 / (na - 1)
        df = se2**2 / denom if denom > 0 else float(nb + na - 2)
    elif vb is not None or va is not None:
        var, k = (vb, nb) if vb is not None else (va, na)
        assert var is not None
        se2 = var * (1.0 / nb + 1.0 / na)
        df = float(k - 1)
    else:
        return None
    half = float(st.t.ppf(0.5 + level / 2.0, df)) * math.sqrt(se2)
    return ((math.exp(d - half) - 1.0) * 100.0, (math.exp(d + half) - 1.0) * 100.0)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _sd_pct(values: Sequence[float]) -> float | None:
    _, var, _ = _log_stats(values)
    return None if var is None else math.sqrt(var) * 100.0


def changes_in(
    series: LevelSeries,
    *,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    min_magnitude: float = DEFAULT_MIN_MAGNITUDE,
    window: int = DEFAULT_WINDOW,
    ignore: Sequence[str] = HISTORY_IGNORE,
) -> list[Change]:
    """The change points of one series, oldest first."""
    figures = run_figures(series)
    values = [f.tok_s for f in figures]
    found = detect(values, max_pvalue=max_pvalue, min_magnitude=min_magnitude, window=window)
    bounds = [0] + [i for i, _ in found] + [len(values)]
    out = []
    for k, (index, pvalue) in enumerate(found):
        before, after = values[bounds[k] : index], values[index : bounds[k + 2]]
        first, last = figures[index], figures[index - 1]
        b, a = _geomean(before), _geomean(after)
        out.append(
            Change(
                test=series.test,
                level=series.level,
                deployment=series.deployment,
                run=first.run.id,
                time=first.run.time,
                commit=first.run.commit,
                previous_run=last.run.id,
                previous_time=last.run.time,
                previous_commit=last.run.commit,
                before_tok_s=b,
                after_tok_s=a,
                change_pct=(a / b - 1.0) * 100.0,
                ci_pct=step_interval(before, after),
                pvalue=pvalue,
                before_runs=len(before),
                after_runs=len(after),
                before_sd_pct=_sd_pct(before),
                after_sd_pct=_sd_pct(after),
                provenance_changes=provenance_changes(
                    last.run.provenance, first.run.provenance, ignore=ignore
                ),
                index=index,
                series=series.ident,
                key=dict(series.key),
                kind=series.kind,
                unit=series.unit,
            )
        )
    return out


def find_changes(
    series: Sequence[LevelSeries],
    *,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    min_magnitude: float = DEFAULT_MIN_MAGNITUDE,
    window: int = DEFAULT_WINDOW,
    ignore: Sequence[str] = HISTORY_IGNORE,
) -> list[Change]:
    """Every change point of every series: series in the order given, each oldest first.

    ``max_pvalue``: Otava's significance threshold; ``min_magnitude``: the smallest relative
    step named (0.03 = 3%); ``window``: Otava's window in runs.  The defaults and the rates
    they give (a -15% step found in every series at 1-3% noise, a 2%-per-run drift in 99%, an
    unchanged series of 20 runs named a change in 0.1-0.2%) are measured in the module
    docstring.  Raises ``ValueError``
    for a parameter out of range.
    """
    _check(max_pvalue, min_magnitude, window)
    out: list[Change] = []
    for s in series:
        out.extend(
            changes_in(
                s, max_pvalue=max_pvalue, min_magnitude=min_magnitude, window=window, ignore=ignore
            )
        )
    return out
