"""The capacity gate: a ``@capacity`` test's capacity against its baseline, beyond noise.

A capacity is judged like a throughput figure -- a drop beyond the tolerance that noise cannot
explain is a ``regression`` -- but its noise has two sources of its own, and the statistics
(``docs/guide/workloads.md``, *Capacity under an SLO*) say how each enters:

* **Trial noise** of the two levels that bracket the boundary.  The boundary estimate ``u =
  ln(estimate)`` is interpolated from their margins; its standard error ``log_se`` comes from
  their trials (:mod:`pytest_kimi.measure.capacity_search`).
* **Session noise**: a fresh server start shifts every latency by a common factor (sd
  ``--perf-session-sigma`` on the log scale, the same factor a throughput level sees).  A
  latency shift ``delta`` moves the boundary by ``delta / slope``, where ``slope`` is how fast
  the binding latency's margin falls per unit of ``ln(load)`` near the boundary (an
  elasticity: 0.5 means 10% more load gives 5% more latency), so it adds
  ``(session_sigma / slope)**2`` to the variance.  Where latency barely rises with load, a small
  latency shift moves the capacity a lot, and the gate says so by being wide.

With ``d = u_current - u_baseline`` and ``se**2 = log_se_current**2 + log_se_baseline**2 +
(session_sigma / slope)**2`` (``slope`` the smaller of the two sides': a slope too steep would
make session noise look smaller than it is), and the Welch-Satterthwaite degrees of freedom of
that sum (each ``log_se`` has ``log_se_df``, the session term is known), the capacity is

* ``regression``: ``P = T_df((d - ln(1 - tolerance)) / se) <= alpha``, the one-sided t test
  that the capacity fell by more than the tolerance;
* ``improved``: the mirror test above ``ln(1 + tolerance)``;
* ``pass`` otherwise.

A capacity outside its searched range is a bound, not a point: the top held (``>= low``) or
the bottom broke (``< high``).  A bound is compared only in the direction it can speak for:
a current capacity known only to be at least ``low`` is never a regression, one known only to
be below ``high`` never an improvement, and likewise for the baseline.

``min_capacity`` is an absolute floor, judged on the measured capacity (the highest load that
held; the search measures the floor itself when its bracket straddles it): ``fail`` below it,
and also ``fail`` when even the bottom of the range broke.  No pytest here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from pytest_kimi.baseline import (
    CapacityBaseline,
    TestBaseline,
    WorkloadKey,
)
from pytest_kimi.baseline.model import round_load
from pytest_kimi.gate.policy import UNVOUCHED_NOTE, GateSettings, unvouched
from pytest_kimi.gate.two_sample import DEFAULT_DETECTABLE_DROP, DEFAULT_POWER
from pytest_kimi.measure.capacity_latency import JITTER_RATIO, NAMES
from pytest_kimi.measure.capacity_search import CapacityEstimate
from pytest_kimi.measure.results import spec_key
from pytest_kimi.workload.capacity_marker import CapacitySpec
from pytest_kimi.workload.workload_spec import Workload
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import CapacityComparisonEntry, CapacityEntry

MIN_SLOPE = 0.02
"""Floor of the slope the session term divides by: a latency flat in load (slope near 0)
would make any capacity change look like noise; below 2% per unit ln(load) the gate treats it
as 2% (a session shift of 3% then moves the capacity by 150%: nothing is a regression)."""
DEFAULT_SLOPE = 1.0
"""The slope assumed where a side measured too little to estimate one (one level)."""
DEFAULT_DF = 2
"""Degrees of freedom assumed for a ``log_se`` recorded without them (3 trials a level)."""

Kind = Literal["point", "at_least", "at_most"]


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: ``ln`` of its capacity and what kind of number it is."""

    u: float
    kind: Kind
    log_se: float
    df: int | None
    """Degrees of freedom of ``log_se`` (None: no trial scatter behind it)."""
    slope: float | None


def side_of(record: CapacityBaseline) -> Side:
    """The estimate when the bracket has both ends; else the end it has, as a bound."""
    if record.estimate is not None:
        return Side(
            math.log(record.estimate),
            "point",
            record.log_se or 0.0,
            record.log_se_df if record.log_se_df is not None else DEFAULT_DF,
            record.slope,
        )
    if record.high is None and record.low is not None:
        return Side(math.log(record.low), "at_least", 0.0, None, record.slope)
    assert record.high is not None
    return Side(math.log(record.high), "at_most", 0.0, None, record.slope)


@dataclass(frozen=True, slots=True)
class CapacityComparison:
    verdict: Verdict
    ratio: float
    """exp(d): the current capacity (or its bound) over the baseline's."""
    ci90: tuple[float, float]
    p_regression: float
    p_improved: float
    se: float
    df: float
    """Welch-Satterthwaite degrees of freedom of ``se`` (inf when the session term is all)."""
    min_detectable_drop: float = math.nan
    """The drop this comparison would have flagged with the gate's power."""


def compare_capacity(
    current: CapacityBaseline,
    baseline: CapacityBaseline,
    *,
    tolerance: float,
    alpha: float,
    session_sigma: float,
    detectable_drop: float = DEFAULT_DETECTABLE_DROP,
    power: float = DEFAULT_POWER,
) -> CapacityComparison:
    """The gate's verdict on a capacity (module docstring), by the levels' rules: ``pass``
    only with the estimate inside the tolerance and the power to have caught a drop of
    ``detectable_drop``; an estimate beyond the tolerance that is not significant is
    ``inconclusive`` (a capacity 16% below its baseline read ``pass`` before)."""
    from scipy import stats

    cur, base = side_of(current), side_of(baseline)
    slopes = [s for s in (cur.slope, base.slope) if s is not None]
    slope = max(min(slopes) if slopes else DEFAULT_SLOPE, MIN_SLOPE)
    parts = [(cur.log_se**2, cur.df), (base.log_se**2, base.df)]
    se2 = max(sum(v for v, _ in parts) + (session_sigma / slope) ** 2, 1e-12)
    estimated = sum(v**2 / df for v, df in parts if df and v > 0)
    df = se2**2 / estimated if estimated > 0 else math.inf
    se = math.sqrt(se2)
    d = cur.u - base.u
    t = stats.t(df) if math.isfinite(df) else stats.norm()
    p_reg = float(t.cdf((d - math.log1p(-tolerance)) / se))
    p_imp = float(t.sf((d - math.log1p(tolerance)) / se))
    q = float(t.ppf(0.95))
    can_drop = cur.kind != "at_least" and base.kind != "at_most"
    can_rise = cur.kind != "at_most" and base.kind != "at_least"
    mdd = -math.expm1(math.log1p(-tolerance) - (float(t.ppf(1 - alpha)) + float(t.ppf(power))) * se)
    verdict = Verdict.PASS
    if mdd > detectable_drop:
        verdict = Verdict.UNDERPOWERED
    if d < math.log1p(-tolerance):
        # beyond the tolerance: a drop not significant says so; a bound that cannot speak for
        # a drop ("at least 16" against 41.5) cannot vouch for one either
        verdict = Verdict.INCONCLUSIVE if can_drop else Verdict.UNDERPOWERED
    if can_rise and p_imp <= alpha:
        verdict = Verdict.IMPROVED
    if can_drop and p_reg <= alpha:
        verdict = Verdict.REGRESSION
    return CapacityComparison(
        verdict=verdict,
        ratio=math.exp(d),
        ci90=(math.exp(d - q * se), math.exp(d + q * se)),
        p_regression=p_reg if can_drop else 1.0,
        p_improved=p_imp if can_rise else 1.0,
        se=se,
        df=df,
        min_detectable_drop=mdd,
    )


# ------------------------------------------------------------------------------ keys and records


def capacity_key(
    capacity: CapacitySpec,
    workload: Workload,
    prompts_key: str,
    protocol: str | None,
) -> dict[str, Any]:
    """What a capacity is a capacity *of*: the workload of its levels (as a level's baseline
    key, without the load), the metric searched, the ceilings and their percentile, and for an
    ITL ceiling the statistic it is judged on (``itl: request``, each request's mean ITL: a
    capacity recorded on the per-gap percentile is another number, and its baseline is
    reported as recorded for another workload rather than compared)."""
    template = workload.levels[0]
    key = {
        k: v
        for k, v in spec_key(template, prompts_key, workload).items()
        if k not in ("concurrency", "rate")
    }
    key["metric"] = capacity.metric
    key["percentile"] = capacity.percentile
    for name, limit in capacity.ceilings.items():
        key[f"max_{name}"] = limit
    if "itl_s" in capacity.ceilings:
        key["itl"] = capacity.itl
    if capacity.metric == "concurrency" and protocol is not None:
        key["protocol"] = protocol
    return key


def record_of(estimate: CapacityEstimate, key: Mapping[str, Any]) -> CapacityBaseline:
    """The estimate as it is stored (and compared): rounded as the baseline file rounds it."""
    return CapacityBaseline(
        workload=WorkloadKey.from_dict(key),
        low=estimate.low,
        high=estimate.high,
        estimate=estimate.estimate,
        log_se=estimate.log_se,
        log_se_df=estimate.log_se_df,
        slope=estimate.slope,
        held=tuple(lv.load for lv in estimate.levels if lv.held),
        broke=tuple(lv.load for lv in estimate.levels if lv.held is False),
    )


def explain_miss(baseline: TestBaseline, key: Mapping[str, Any]) -> str:
    """Why a baseline file gives no capacity to compare with: none recorded, or another one."""
    if baseline.capacity is None:
        return f"no baseline capacity for {baseline.test}: its file holds throughput levels only"
    want = WorkloadKey.from_dict(key)
    have = baseline.capacity.workload
    names = sorted(set(want.keys()) | set(have.keys()))
    diffs = [
        f"{k} {have.get(k, '(unset)')} -> {want.get(k, '(unset)')}"
        for k in names
        if WorkloadKey(((k, have.get(k)),)) != WorkloadKey(((k, want.get(k)),))
    ]
    return (
        f"no baseline capacity for this workload: the baseline's was recorded with "
        f"{'; '.join(diffs)} (a capacity under another SLO or workload is another number: "
        "record it with --update-baselines)"
    )


# ------------------------------------------------------------------------------------- verdict


@dataclass(slots=True)
class CapacityVerdict:
    """The capacity's verdict with its reasons and the comparison fields of the report."""

    verdict: str
    reasons: list[str]
    fields: CapacityComparisonEntry


def judge_capacity(
    estimate: CapacityEstimate,
    capacity: CapacitySpec,
    current: CapacityBaseline | None,
    baseline: CapacityBaseline | None,
    settings: GateSettings,
    levels: Sequence[Any] = (),
) -> CapacityVerdict:
    """Absolute checks first (a search that could not finish, ``min_capacity``, a bottom that
    broke), then the baseline comparison; an absolute failure is the stronger claim."""
    label = capacity.label
    reasons: list[str] = []
    fields: CapacityComparisonEntry = {
        "baseline": None,
        "baseline_low": None,
        "baseline_high": None,
        "baseline_estimate": None,
        "change_pct": None,
        "change_ci90": None,
        "p_value": None,
        "tolerance_pct": round(settings.tolerance * 100, 2),
    }
    if estimate.problem is not None:
        kinds = {Verdict.of(lv.verdict) for lv in levels}
        verdict = Verdict.ERROR if Verdict.ERROR in kinds else Verdict.INVALID
        return CapacityVerdict(verdict.value, [f"the search stopped: {estimate.problem}"], fields)
    absolute: Verdict | None = None
    if estimate.low is None:
        absolute = Verdict.FAIL
        reasons.append(
            f"no load in the range held: {label(estimate.high)} already broke a ceiling, so the "
            f"capacity is below it"
        )
    elif capacity.min_capacity is not None and estimate.low < capacity.min_capacity:
        absolute = Verdict.FAIL
        reasons.append(
            f"capacity {label(estimate.low)} < min_capacity {label(capacity.min_capacity)}"
        )
    if estimate.stop == "max-levels":
        reasons.append(
            f"note: the search stopped after {len(estimate.levels)} levels (max_levels) with the "
            f"bracket [{label(estimate.low)}, {label(estimate.high)}], wider than its step"
        )
    reasons.extend(_level_warnings(estimate, label, capacity.ceilings, capacity.itl))
    if estimate.non_monotonic:
        reasons.append(
            "note: "
            + ", ".join(label(x) for x in estimate.non_monotonic)
            + f" held above {label(estimate.high)}, which broke (noise near the boundary, or "
            "latency not monotonic in load); the capacity stays below the lowest break"
        )
    compared: Verdict = Verdict.NO_BASELINE
    if baseline is not None and current is not None:
        cmp = compare_capacity(
            current,
            baseline,
            tolerance=settings.tolerance,
            alpha=settings.alpha,
            session_sigma=settings.session_sigma,
            detectable_drop=settings.detectable_drop,
        )
        compared = unvouched(cmp.verdict, settings)
        if compared is not cmp.verdict:
            reasons.append(UNVOUCHED_NOTE.format(sigma=settings.session_sigma))
        fields.update(
            {
                "baseline": round_load(baseline.value) if baseline.value is not None else None,
                "baseline_low": baseline.low,
                "baseline_high": baseline.high,
                "baseline_estimate": baseline.estimate,
                "change_pct": round((cmp.ratio - 1) * 100, 2),
                "change_ci90": [round((x - 1) * 100, 2) for x in cmp.ci90],
                "p_value": round(cmp.p_regression, 6),
            }
        )
        change = (
            f"{(cmp.ratio - 1) * 100:+.1f}% (90% CI {(cmp.ci90[0] - 1) * 100:+.1f}% .. "
            f"{(cmp.ci90[1] - 1) * 100:+.1f}%)"
        )
        if compared is Verdict.REGRESSION:
            reasons.append(
                f"regression {change}, p={cmp.p_regression:.3g} vs baseline capacity "
                f"{baseline.text()} (tolerance {settings.tolerance:.0%})"
            )
        elif compared is Verdict.INCONCLUSIVE:
            reasons.append(
                f"inconclusive {change}, p={cmp.p_regression:.3g} vs baseline capacity "
                f"{baseline.text()}: the estimate lies beyond the tolerance "
                f"-{settings.tolerance:.0%} without a significant drop; the gate cannot say pass "
                "(measure the session noise: kimi-perf calibrate, or rerun)"
            )
        elif compared is Verdict.UNDERPOWERED:
            reasons.append(
                f"underpowered {change} vs baseline capacity {baseline.text()}: this comparison "
                f"could have missed a drop of {cmp.min_detectable_drop:.0%} (it must catch "
                f"{settings.detectable_drop:.0%} to say pass)"
            )
        elif compared is Verdict.IMPROVED:
            reasons.append(
                f"improved {change} vs baseline capacity {baseline.text()}: update the baseline "
                "(--update-baselines) so the slack cannot hide a later regression"
            )
    verdict = absolute if absolute is not None else compared
    return CapacityVerdict(verdict.value, reasons, fields)


def _level_warnings(
    estimate: CapacityEstimate, label: Any, ceilings: Mapping[str, float], itl: str
) -> list[str]:
    """The levels' warnings, once each kind, as notes of the capacity: client jitter at the
    bracket's ends is what a reader of the capacity needs to see (its tails are the client's),
    and re-measured trials say the search paid for a stall rather than counting it."""
    ends = {estimate.low, estimate.high}
    out = []
    at_ends = [
        lv
        for lv in estimate.levels
        if lv.load in ends and lv.jitter is not None and lv.jitter > JITTER_RATIO
    ]
    if at_ends:
        shown = ", ".join(label(lv.load) for lv in sorted(at_ends, key=lambda lv: lv.load))
        exposed = [NAMES[n] for n in ceilings if n != "itl_s" or itl == "token"]
        out.append(
            f"note: client jitter at {shown}, the bracket's ends (per-gap ITL p95/p50 above "
            f"{JITTER_RATIO:g}x): the client's read timing is in their latency tails"
            + (
                f"; {' and '.join(exposed)} carr{'y' if len(exposed) > 1 else 'ies'} it into "
                "the capacity (give the client a quieter core, or a slower simulator)"
                if exposed
                else "; each request's mean ITL, which the capacity is judged on, averages it out"
            )
        )
    remeasured = [lv for lv in estimate.levels if lv.replaced]
    if remeasured:
        out.append(
            f"note: {sum(lv.replaced for lv in remeasured)} trial(s) at "
            f"{', '.join(label(lv.load) for lv in remeasured)} were measured again: a client "
            "stall had voided them (counted neither held nor broke)"
        )
    return out


def capacity_dict(
    estimate: CapacityEstimate,
    capacity: CapacitySpec,
    key: Mapping[str, Any],
    judged: CapacityVerdict,
) -> CapacityEntry:
    """The report's ``capacity`` object (docs/reference/json-report.md)."""
    out: CapacityEntry = {
        "metric": estimate.metric,
        "value": round_load(estimate.value) if estimate.value is not None else None,
        "low": round_load(estimate.low) if estimate.low is not None else None,
        "high": round_load(estimate.high) if estimate.high is not None else None,
        "estimate": None if estimate.estimate is None else round(estimate.estimate, 4),
        "ci90": None if estimate.ci90 is None else [round(x, 4) for x in estimate.ci90],
        "log_se": None if estimate.log_se is None else round(estimate.log_se, 5),
        "log_se_df": estimate.log_se_df,
        "slope": None if estimate.slope is None else round(estimate.slope, 4),
        "step": round_load(estimate.step),
        "resolution": capacity.resolution,
        "range": [round_load(capacity.low), round_load(capacity.high)],
        "percentile": capacity.percentile,
        "ceilings": dict(capacity.ceilings),
        "min_capacity": capacity.min_capacity,
        "stop": estimate.stop,
        "levels": [lv.to_dict() for lv in estimate.levels],
        "non_monotonic": [round_load(x) for x in estimate.non_monotonic],
        "workload": dict(key),
        **judged.fields,
        "verdict": judged.verdict,
        "reasons": judged.reasons,
    }
    return out


def capacity_failure(capacity: CapacityEntry | None, failing: frozenset[str]) -> str | None:
    """The failing test's headline for its capacity (None when the capacity does not fail)."""
    if not isinstance(capacity, Mapping) or capacity.get("verdict") not in failing:
        return None
    known = Verdict.of(capacity.get("verdict"))
    return f"capacity {known.headline if known is not None else capacity.get('verdict')}"
