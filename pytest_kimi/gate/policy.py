"""The regression gate: a test's levels against its stored baseline, beyond noise.

Glue between the measurement (``measure``), the statistics (``stats``) and the baseline store
(``baseline``): adaptive trials while measuring, then Holm-adjusted verdicts per level, notes
for the verdicts that pass, and the provenance diff that explains a regression.  No pytest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from pytest_kimi.gate import family_verdicts, trial_decision, two_sample
from pytest_kimi.gate.session_noise import PRIOR_DF
from pytest_kimi.verdicts import Verdict
from pytest_kimi.wire import ShiftEntry
from pytest_kimi.baseline import (
    FieldChange,
    Provenance,
    TestBaseline,
    incomparable,
    provenance_diff,
)
from pytest_kimi.workload.workload_spec import LevelSpec, Targets
from pytest_kimi.measure.results import (
    BaselineComparison,
    LevelResult,
    ThroughputResult,
    level_key,
    workload_dict,
)


class IncomparableBaseline(RuntimeError):
    """The stored baseline measured something else (another model): refused, with the fix."""


@dataclass(frozen=True, slots=True)
class GateSettings:
    """How strictly a test's levels are judged.

    In a pytest session these come from the options (``KimiOptions.gate_settings``), which own
    the defaults; the defaults here serve pytest-free callers and are the same
    :mod:`~pytest_kimi.gate.stats` constants, so they cannot diverge (tests/plugin/test_options.py
    checks that they agree).  A marker's ``tolerance=`` / ``alpha=`` override the session's for
    its test: :meth:`for_test`.
    """

    tolerance: float = two_sample.DEFAULT_TOLERANCE
    alpha: float = two_sample.DEFAULT_ALPHA
    session_sigma: float = two_sample.DEFAULT_SESSION_SIGMA
    max_trials: int = two_sample.DEFAULT_MAX_TRIALS
    require_baseline: bool = False
    strict: bool = False
    updating: bool = False
    """Recording baselines: every level runs ``max_trials`` so the stored samples are good."""
    detectable_drop: float = two_sample.DEFAULT_DETECTABLE_DROP
    """The true drop a level must be able to catch (with ``two_sample.DEFAULT_POWER``) to ``pass``."""
    sigma_source: str = "the default"
    """Where ``session_sigma`` came from (:mod:`pytest_kimi.run.noise_source`): every report
    says it beside the figure."""
    sigma_vouched: bool = True
    """Was ``session_sigma`` measured (the history, a calibration) or given by the user?  An
    *assumed* default cannot vouch for ``pass``: whether a 10% drop shows as -4% or -14% in
    one run depends on the true noise between sessions, which nothing has measured, so such
    a level says ``underpowered`` (:func:`unvouched`).  Pytest-free callers that pass their
    own figure keep True."""
    sigma_df: float = PRIOR_DF
    """The degrees of freedom ``session_sigma`` rests on, which weigh it against a baseline's
    own measurement (:func:`pytest_kimi.gate.noise_evidence.with_stored_noise`): the history's
    sessions less one, :data:`~pytest_kimi.gate.session_noise.PRIOR_DF` for the assumed
    default, infinite for the user's own figure (their word is not combined)."""

    def for_test(self, targets: Targets) -> GateSettings:
        """These settings with the marker's ``tolerance=`` and ``alpha=`` where it gives them
        (marker > command line > environment > ini), for the adaptive trials and the verdicts
        alike."""
        if targets.tolerance is None and targets.alpha is None:
            return self
        return replace(
            self,
            tolerance=self.tolerance if targets.tolerance is None else targets.tolerance,
            alpha=self.alpha if targets.alpha is None else targets.alpha,
        )

    def pass_floor(self) -> float | None:
        """When no number of trials can make a compared level ``pass`` under these settings:
        the smallest drop they can vouch for (:func:`two_sample.smallest_vouchable_drop`), which
        then exceeds ``detectable_drop``; None when ``pass`` is reachable."""
        floor = two_sample.smallest_vouchable_drop(
            self.tolerance, self.alpha, self.session_sigma, two_sample.DEFAULT_POWER
        )
        return floor if floor > self.detectable_drop else None

    def failing_verdicts(self) -> frozenset[str]:
        """The verdict values that fail a test under these flags (reports mark them)."""
        return Verdict.failing(strict=self.strict, require_baseline=self.require_baseline)


def result_level_key(result: ThroughputResult, level: LevelResult) -> dict[str, Any]:
    return level_key(level.to_dict(), workload_dict(result.workload))


@dataclass(slots=True)
class AdaptiveTrials:
    """Trial policy: after the first trials, ask :func:`trial_decision.decide` whether the level is
    powered (a drop of ``detectable_drop`` would be caught), and run the top-up it asks for.

    The top-ups follow the variances only, never the estimated ratio: no alpha is spent on looks.
    Levels without a baseline run the fixed number of trials (all ``max_trials`` when recording,
    since a baseline with more samples makes every later comparison stronger).
    """

    baseline_samples: dict[LevelSpec, list[float]]
    settings: GateSettings
    n_levels: int
    first_trials: int
    looks: dict[LevelSpec, int] = field(default_factory=dict)
    alpha_weights: dict[LevelSpec, float] = field(default_factory=dict)
    """Always 1.0 (no alpha is spent on looks); kept for :func:`apply_gate`'s callers."""
    planned: dict[LevelSpec, int] = field(default_factory=dict)
    """Trials planned so far per level (bounds the top-up when trials give no figure)."""
    designs: dict[LevelSpec, family_verdicts.Design] = field(default_factory=dict)
    """Per level, the look that read the estimate (``undecided`` extends to max_trials): the
    final test accounts for it (:mod:`pytest_kimi.gate.family`)."""

    def more_trials(self, level: LevelSpec, samples: Sequence[float]) -> int:
        s = self.settings
        if s.updating:
            # Top up to max_trials valid samples, but never past twice that many trials, and
            # not at all when no trial gave a figure: a failing server (every request an
            # error) would otherwise be asked for ten more trials forever.
            run = self.planned.get(level, self.first_trials)
            extra = (
                max(0, min(s.max_trials - len(samples), 2 * s.max_trials - run)) if samples else 0
            )
            self.planned[level] = run + extra
            return extra
        base = self.baseline_samples.get(level)
        if not base or not samples:
            return 0
        look = self.looks.get(level, 0)
        decision = trial_decision.decide(
            base,
            samples,
            look=look,
            tolerance=s.tolerance,
            alpha=s.alpha,
            session_sigma=s.session_sigma,
            min_trials=min(self.first_trials, s.max_trials),
            max_trials=s.max_trials,
            n_levels=self.n_levels,
            detectable_drop=s.detectable_drop,
        )
        self.looks[level] = look + 1
        self.alpha_weights[level] = decision.alpha_weight
        if level not in self.designs and decision.reason is not trial_decision.StopReason.CONTINUE:
            # the first stop of the variance rule is the look at the estimate: an undecided
            # level could be extended there, a futile or capped one could not
            extendable = decision.reason in (
                trial_decision.StopReason.POWERED,
                trial_decision.StopReason.UNDECIDED,
            )
            self.designs[level] = family_verdicts.Design(
                len(samples), s.max_trials if extendable else len(samples)
            )
        if decision.stop or len(samples) >= s.max_trials:
            return 0
        # decide() sees only the figures: trials that give none (invalid, errors) would make
        # it ask again and again, so never plan past twice max_trials trials.
        run = self.planned.get(level, self.first_trials)
        extra = max(0, min(decision.next_trials, 2 * s.max_trials - run))
        self.planned[level] = run + extra
        return extra


def baseline_samples(
    baseline: TestBaseline | None, keys: dict[LevelSpec, dict[str, Any]]
) -> dict[LevelSpec, list[float]]:
    if baseline is None:
        return {}
    out = {}
    for spec, key in keys.items():
        level = baseline.level_for(key)
        if level is not None:
            out[spec] = list(level.trials_tok_s)
    return out


def check_comparable(baseline: TestBaseline | None, current: Provenance, path: str) -> None:
    if baseline is None:
        return
    why = incomparable(baseline.provenance, current)
    if why:
        raise IncomparableBaseline(
            f"{path}: {why}; record a baseline for this setup with --update-baselines, or choose "
            "another --baseline-profile"
        )


def apply_gate(
    result: ThroughputResult,
    baseline: TestBaseline | None,
    baseline_path: str,
    current: Provenance,
    settings: GateSettings,
    tolerance: float | None = None,
    alpha: float | None = None,
    alpha_weights: dict[LevelSpec, float] | None = None,
    designs: dict[LevelSpec, family_verdicts.Design] | None = None,
) -> list[FieldChange]:
    """Compare every measured level with its baseline; set verdicts, notes and report fields.

    Returns the provenance changes since the baseline (empty when there is none).
    """
    tol = settings.tolerance if tolerance is None else tolerance
    alp = settings.alpha if alpha is None else alpha
    changes = provenance_diff(baseline.provenance, current) if baseline is not None else []
    eligible: list[tuple[LevelResult, list[float], list[float]]] = []
    for level in result.levels:
        if not Verdict(level.verdict).comparable or not level.figures.trials_tok_s:
            continue
        key = result_level_key(result, level)
        stored = baseline.level_for(key) if baseline is not None else None
        if stored is None:
            level.comparison = BaselineComparison(found=False)
            if level.verdict == Verdict.PASS:
                level.verdict = Verdict.NO_BASELINE.value
                if baseline is not None:  # a missing file is said once, for the whole test
                    level.reasons.append(baseline.explain_miss(key))
            continue
        eligible.append((level, list(stored.trials_tok_s), list(level.figures.trials_tok_s)))
    if not eligible:
        return changes
    weights = alpha_weights or {}
    plans = designs or {}
    family = family_verdicts.compare_family(
        [(b, c) for _, b, c in eligible],
        tolerance=tol,
        alpha=alp,
        session_sigma=settings.session_sigma,
        alpha_weights=[weights.get(lv.spec, 1.0) for lv, _, _ in eligible],
        detectable_drop=settings.detectable_drop,
        designs=[plans.get(lv.spec) for lv, _, _ in eligible],
    )
    for (level, base, _), cmp in zip(eligible, family.levels):
        stopped = trial_decision.trials_stopped(
            cmp.n_current,
            plans.get(level.spec),
            settings.max_trials,
            p_raw=cmp.p_regression_raw,
            p_final=cmp.p_regression,
            alpha=alp,
        )
        level.comparison, note = compared_level(
            cmp, base, tolerance=tol, alpha=alp, changes=changes, stopped=stopped
        )
        verdict = unvouched(cmp.verdict, settings)
        level.verdict = merge_verdicts(level.verdict, verdict)
        if note:
            level.reasons.append(note)
        if verdict is not cmp.verdict:
            level.reasons.append(UNVOUCHED_NOTE.format(sigma=settings.session_sigma))
    if family.shift is not None:
        shift = family.shift
        vouched = unvouched(shift.verdict, settings)
        if vouched is not shift.verdict:
            shift = replace(shift, verdict=vouched)
        result.shift = shift_record(shift, tol, changes)
    return changes


def shift_record(
    shift: family_verdicts.ShiftComparison, tolerance: float, changes: Sequence[object] = ()
) -> ShiftEntry:
    """The test's common shift as its JSON object (``shift``), with the sentence the reports
    print: the levels as one hypothesis (:mod:`pytest_kimi.gate.family`)."""
    out = shift.to_dict()
    lo, hi = shift.ci90
    text = (
        f"common shift of {shift.levels} levels {(shift.ratio - 1) * 100:+.1f}% "
        f"(90% CI {_pct_text(lo)} .. {_pct_text(hi)}), p={shift.p_regression:.3g} against "
        f"the tolerance -{tolerance * 100:g}%: {shift.verdict.value}"
    )
    if shift.verdict is Verdict.REGRESSION:
        changed = "; ".join(str(c) for c in changes)
        text += " (the levels as a whole dropped beyond the tolerance)" + (
            f"; changed: {changed}" if changed else ""
        )
    out["text"] = text
    return out


def compared_level(
    cmp: two_sample.LevelComparison,
    base: Sequence[float],
    *,
    tolerance: float,
    alpha: float,
    changes: Sequence[object] = (),
    stopped: str | None = None,
) -> tuple[BaselineComparison, str | None]:
    """The comparison and the note of a level compared with its baseline.

    One function for the live gate and ``kimi-perf compare`` so that a level reads the same
    (rounding, wording) whichever produced it.  ``base`` are the baseline's trial figures;
    ``changes`` what changed since the baseline (said with a regression, where it is the
    likely cause).  The verdict is not among the fields: the gate merges it with the level's
    absolute verdict (:func:`merge_verdicts`), the offline comparison has none to merge.
    Returns the fields and the note (None for ``pass``).
    """
    lo, hi = cmp.ci90
    fields = BaselineComparison(
        found=True,
        baseline_tok_s=round(cmp.baseline_median, 2),
        baseline_trials=len(base),
        baseline_trials_tok_s=tuple(base),
        change_pct=round((cmp.ratio - 1) * 100, 2),
        ci90=(_pct(lo), _pct(hi)),
        p_value=_finite(cmp.p_regression_raw),
        p_adjusted=_finite(cmp.p_regression),
        min_detectable_drop_pct=_finite(cmp.min_detectable_drop * 100),
        tolerance_pct=round(tolerance * 100, 2),
    )
    change = f"{(cmp.ratio - 1) * 100:+.1f}% (90% CI {_pct_text(lo)} .. {_pct_text(hi)})"
    p_text = f"p={cmp.p_regression_raw:.3g}"
    if not math.isclose(cmp.p_regression, cmp.p_regression_raw, rel_tol=1e-3):
        # the decision's p: the test's levels and the trial policy's look accounted for
        p_text += f" (decided at {cmp.p_regression:.3g}, adjusted for the test's levels)"
    changed = "; ".join(str(c) for c in changes)
    note = {
        Verdict.REGRESSION: f"regression {change}, {p_text} vs baseline "
        f"{cmp.baseline_median:.1f} tok/s" + (f"; changed: {changed}" if changed else ""),
        Verdict.INCONCLUSIVE: f"inconclusive {change}: the estimate lies beyond the tolerance "
        f"-{tolerance * 100:g}% but the drop is not significant ({p_text}, alpha {alpha:g}) "
        f"after {cmp.n_current} trials" + (f" ({stopped})" if stopped else "") + ": "
        "a drop beyond the tolerance fails the test; measure the session noise (kimi-perf "
        "calibrate, --perf-sessions 5) or judge the change paired (two --server-profile)",
        Verdict.IMPROVED: f"improved {change}: update the baseline (--update-baselines) so the slack "
        "cannot hide a later regression",
        Verdict.UNDERPOWERED: f"underpowered: a drop of {cmp.min_detectable_drop * 100:.1f}% "
        f"would be caught with {_power_pct(cmp.power)} probability, more than the detectable "
        f"drop {_drop_pct(cmp.detectable_drop)} (more trials: --perf-max-trials, lower noise, "
        "or --perf-detectable-drop)",
    }.get(cmp.verdict)
    return fields, note


UNVOUCHED_NOTE = (
    "not pass: the session noise {sigma:g} is assumed, not measured, so no single run can "
    "vouch that nothing beyond the tolerance happened; measure it once (kimi-perf calibrate, "
    "--perf-sessions 5, or the history) or judge a deploy change in a paired run "
    "(two --server-profile)"
)


def unvouched(verdict: Verdict, settings: GateSettings) -> Verdict:
    """``pass`` becomes ``underpowered`` where the session noise was only assumed
    (:attr:`GateSettings.sigma_vouched`); every other verdict stands."""
    if verdict is Verdict.PASS and not settings.sigma_vouched:
        return Verdict.UNDERPOWERED
    return verdict


def merge_verdicts(absolute: str, compared: Verdict) -> str:
    """A level's verdict once its baseline comparison is in (both as values).

    A level that met its targets takes the comparison's verdict; one that missed them stays
    ``fail`` whatever the comparison says, since the absolute verdict is the stronger claim
    (a regression of a failing level is still reported, in its note).
    """
    if absolute == Verdict.PASS:
        return compared.value
    return absolute


def _power_pct(power: float) -> str:
    return f"{(two_sample.DEFAULT_POWER if math.isnan(power) else power) * 100:g}%"


def _drop_pct(drop: float) -> str:
    return f"{(two_sample.DEFAULT_DETECTABLE_DROP if math.isnan(drop) else drop) * 100:g}%"


def _pct(ratio: float) -> float | None:
    return round((ratio - 1) * 100, 2) if math.isfinite(ratio) else None


def _pct_text(ratio: float) -> str:
    pct = _pct(ratio)
    return "?" if pct is None else f"{pct:+.1f}%"


def _finite(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None
