"""The adaptive trial policy while recording: top up invalid trials, but always end."""

from __future__ import annotations

from pytest_kimi.gate.policy import AdaptiveTrials, GateSettings
from pytest_kimi.spec.markers import LevelSpec


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
