"""The adaptive trial policy: while recording, top up invalid trials but always end; against
a baseline, run the variance-driven top-up of :func:`trial_decision.decide`, bounded."""

from __future__ import annotations

from pytest_kimi.gate import family_verdicts, trial_decision
from pytest_kimi.verdicts import Verdict
from pytest_kimi.gate.policy import AdaptiveTrials, GateSettings
from pytest_kimi.workload.workload_spec import LevelSpec


def _policy(max_trials: int = 10) -> tuple[AdaptiveTrials, LevelSpec]:
    level = LevelSpec(concurrency=1, rate=None, max_tokens=32)
    settings = GateSettings(max_trials=max_trials, updating=True)
    return AdaptiveTrials({}, settings, n_levels=1, first_trials=3), level


def _run(policy: AdaptiveTrials, level: LevelSpec, valid: list[bool]) -> int:
    """Drive the policy as measure_level does; returns how many trials ran."""
    planned, trials, samples = 3, 0, []
    while trials < planned:
        if valid[min(trials, len(valid) - 1)]:
            samples.append(100.0)
        trials += 1
        if trials == planned:
            planned += policy.more_trials(level, samples)
    return trials


def test_recording_runs_max_trials_when_all_are_valid() -> None:
    policy, level = _policy()
    assert _run(policy, level, [True]) == 10


def test_recording_tops_up_a_few_invalid_trials() -> None:
    policy, level = _policy()
    assert _run(policy, level, [True, False, True, True, False, True]) == 12


def test_recording_stops_when_no_trial_gives_a_figure() -> None:
    """Regression: a server failing every request made --update-baselines loop forever."""
    policy, level = _policy()
    assert _run(policy, level, [False]) == 3


def test_recording_never_runs_more_than_twice_max_trials() -> None:
    policy, level = _policy()
    assert _run(policy, level, [True, False, False, False]) == 20


# --------------------------------------------------------------------------- compared levels

BASE10 = [1000.0, 1030.0, 975.0, 1012.0, 990.0, 1021.0, 968.0, 1004.0, 985.0, 1015.0]


def _compared(max_trials: int = 10) -> tuple[AdaptiveTrials, LevelSpec]:
    level = LevelSpec(concurrency=1, rate=None, max_tokens=32)
    settings = GateSettings(max_trials=max_trials)
    return AdaptiveTrials({level: BASE10}, settings, n_levels=1, first_trials=3), level


def _run_compared(policy: AdaptiveTrials, level: LevelSpec, figures: list[float | None]) -> int:
    """Like _run, with the trials' figures (None: the trial gave none); returns trials run."""
    planned, trials, samples = 3, 0, []
    while trials < planned:
        figure = figures[min(trials, len(figures) - 1)]
        if figure is not None:
            samples.append(figure)
        trials += 1
        if trials == planned:
            planned += policy.more_trials(level, samples)
    return trials


def test_an_unchanged_quiet_level_stops_after_the_first_trials() -> None:
    """Nothing changed and the scatter is the baseline's: powered at 3, no top-up (v1 ran
    up to 10 trials exactly here)."""
    policy, level = _compared()
    assert _run_compared(policy, level, [1003.0, 985.0, 1018.0]) == 3
    assert policy.alpha_weights[level] == 1.0


def test_a_noisy_level_gets_the_top_up_decide_asks_for() -> None:
    policy, level = _compared()
    noisy = [1000.0, 1040.0, 960.0]
    want = trial_decision.decide(BASE10, noisy).next_trials
    assert 0 < want < 7
    assert policy.more_trials(level, noisy) == want


def test_the_top_up_does_not_depend_on_the_ratio() -> None:
    noisy = [1000.0, 1040.0, 960.0]
    asked = set()
    for factor in (0.7, 1.0, 1.2):
        policy, level = _compared()
        asked.add(policy.more_trials(level, [x * factor for x in noisy]))
    assert len(asked) == 1


def test_compared_trials_that_give_no_figure_are_bounded() -> None:
    """decide() sees only figures: trials that give none must not make it ask forever."""
    policy, level = _compared()
    assert _run_compared(policy, level, [1000.0, 1010.0, None]) <= 20


def test_the_underpowered_note_says_what_could_not_be_vouched_for() -> None:
    from pytest_kimi.gate.policy import compared_level

    cmp = family_verdicts.compare_level(BASE10, [1000.0, 1400.0, 700.0])
    assert cmp.verdict is Verdict.UNDERPOWERED
    _, note = compared_level(cmp, BASE10, tolerance=0.05, alpha=0.05)
    assert note is not None and note.startswith(
        f"underpowered: a drop of {cmp.min_detectable_drop * 100:.1f}% would be caught with 95% "
        "probability, more than the detectable drop 15% (more trials: --perf-max-trials"
    )
    assert "--perf-detectable-drop" in note
