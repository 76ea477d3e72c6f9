"""The session noise a test is judged with: its baseline's own measurement weighed with the
session's figure by degrees of freedom, never a switch at a count of runs.

Pure first (the pooling, the weights, the user's word), then the file (the level's
``session_noise`` round-trips and is validated), then a real recording: ``--perf-sessions 3``
with ``--update-baselines`` stores the noise its starts measured, and the next run is judged
with it, saying so.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_kimi.baseline import yaml_io
from pytest_kimi.baseline.model import (
    BaselineError,
    LevelBaseline,
    SessionNoise,
    TestBaseline,
    WorkloadKey,
)
from pytest_kimi.baseline.provenance import Provenance
from pytest_kimi.gate.noise_evidence import (
    NoiseEvidence,
    combine,
    occasion_noise,
    stored_noise,
    with_stored_noise,
)
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.gate.session_noise import PRIOR_DF

pytest_plugins = ["pytester"]


def _baseline(*noises: SessionNoise | None) -> TestBaseline:
    levels = tuple(
        LevelBaseline(
            workload=WorkloadKey.from_dict({"concurrency": c, "max_tokens": 64}),
            trials_tok_s=(100.0, 101.0, 99.0),
            session_noise=n,
        )
        for c, n in zip((1, 4, 16), noises)
    )
    return TestBaseline(
        test="t.py::test_x", profile="sim", provenance=Provenance(model="m"), levels=levels
    )


def test_sources_pool_as_variances_weighted_by_their_degrees_of_freedom() -> None:
    both = combine([NoiseEvidence(0.03, 2, "a"), NoiseEvidence(0.01, 6, "b")])
    assert both.df == 8
    assert both.sigma == pytest.approx(math.sqrt((2 * 0.03**2 + 6 * 0.01**2) / 8))
    with pytest.raises(ValueError, match="df > 0"):
        combine([NoiseEvidence(0.01, 0, "a")])


def test_the_levels_of_one_recording_are_not_independent_evidence() -> None:
    found = stored_noise(_baseline(SessionNoise(0.01, 2), SessionNoise(0.02, 2), None))
    assert found is not None
    assert found.df == 2  # measured in the same three starts: their df do not add up
    assert found.sigma == pytest.approx(math.sqrt((0.01**2 + 0.02**2) / 2))
    assert stored_noise(_baseline(None, None)) is None and stored_noise(None) is None


def test_more_starts_move_the_assumed_default_further_and_vouch() -> None:
    assumed = GateSettings(sigma_vouched=False)
    assert assumed.sigma_df == PRIOR_DF
    few = with_stored_noise(assumed, _baseline(SessionNoise(0.005, 1)))
    many = with_stored_noise(assumed, _baseline(SessionNoise(0.005, 8)))
    assert 0.005 < many.session_sigma < few.session_sigma < 0.03
    assert few.sigma_vouched and many.sigma_vouched
    assert few.sigma_df == PRIOR_DF + 1 and many.sigma_df == PRIOR_DF + 8
    assert "the baseline's recording (0.0050 from 9 starts) (8 df)" in many.sigma_source


def test_the_users_figure_and_a_baseline_without_a_measurement_are_left_alone() -> None:
    theirs = GateSettings(session_sigma=0.01, sigma_df=math.inf)
    assert with_stored_noise(theirs, _baseline(SessionNoise(0.05, 8))) is theirs
    plain = GateSettings()
    assert with_stored_noise(plain, _baseline(None)) is plain


def test_the_level_s_session_noise_round_trips_and_is_checked() -> None:
    base = _baseline(SessionNoise(0.01234, 3))
    text = yaml_io.dumps(base)
    assert "session_noise: {sigma: 0.01234, df: 3}" in text
    assert yaml_io.loads(text, source=None) == base
    for bad, why in [
        ("{sigma: 0.01, df: 0}", "df must be an integer >= 1, got an integer"),
        ("{sigma: -0.01, df: 2}", "sigma must be a number >= 0"),
        ("{sigma: 0.01, df: 2, n: 3}", "n"),
    ]:
        broken = text.replace("{sigma: 0.01234, df: 3}", bad)
        with pytest.raises(BaselineError, match=why):
            yaml_io.loads(broken, source="t.yaml")


SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[4], max_tokens=64, trials=3)
def test_x():
    pass
"""


def test_a_multi_start_recording_stores_its_noise_and_the_next_run_uses_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    sim = "sim:speed=10,stream_interval=8,noise=0.02"
    rec = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        f"--endpoint={sim},seed=5",
        "--perf-sessions=3",
        "--update-baselines",
    )
    rec.assert_outcomes(passed=3)
    path = pytester.path / "baselines/sim/test_suite/test_x.yaml"
    saved = yaml_io.loads(path.read_text(), source=path)
    (level,) = saved.levels
    assert level.session_noise is not None and level.session_noise.df == 2
    report = pytester.path / "r.json"
    run = pytester.runpytest(
        "-p", "no:cacheprovider", f"--endpoint={sim},seed=9", f"--perf-json={report}"
    )
    run.assert_outcomes(passed=1)
    (test,) = json.loads(report.read_text())["tests"]
    used = test["session_noise"]
    assert "the baseline's recording" in used["source"] and "(2 df)" in used["source"]
    expected = with_stored_noise(replace(GateSettings(), sigma_vouched=False), saved)
    assert used["sigma"] == expected.session_sigma
    run.stdout.fnmatch_lines(["*judged with session noise*the baseline's recording*"])


def _level(trials: tuple[float, ...], noise: SessionNoise | None = None) -> LevelBaseline:
    return LevelBaseline(
        workload=WorkloadKey.from_dict({"concurrency": 4, "max_tokens": 64}),
        trials_tok_s=trials,
        session_noise=noise,
    )


def test_two_occasions_of_one_deployment_are_one_degree_of_freedom_of_session_noise() -> None:
    from pytest_kimi.gate.session_noise import estimate_session_sigma

    old, new = (100.0, 101.0, 99.0), (95.0, 96.0, 94.0)
    pooled = occasion_noise(_level(old), _level(new))
    assert pooled is not None and pooled.df == 1
    assert pooled.sigma == round(estimate_session_sigma([old, new]), 5)
    # with what each recording measured itself: weighed by degrees of freedom
    more = occasion_noise(_level(old, SessionNoise(0.01, 2)), _level(new, SessionNoise(0.02, 3)))
    expect = math.sqrt((estimate_session_sigma([old, new]) ** 2 + 2 * 0.01**2 + 3 * 0.02**2) / 6)
    assert more is not None and more.df == 6 and more.sigma == pytest.approx(expect, abs=1e-5)
    # one trial on each side cannot tell trial noise from session noise
    assert occasion_noise(_level((100.0,)), _level((95.0,))) is None


def _recording(levels: tuple[LevelBaseline, ...], **server_info: object) -> TestBaseline:
    return TestBaseline(
        test="t.py::test_x",
        profile="sim",
        provenance=Provenance(model="m", server_info={"sim": dict(server_info)}),
        levels=levels,
    )


def test_a_re_recording_pools_only_for_the_same_deployment() -> None:
    from pytest_kimi.baseline.merge import merge

    old = _recording((_level((100.0, 101.0, 99.0)),), speed=10, seed=1)
    again = _recording((_level((95.0, 96.0, 94.0)),), speed=10, seed=2)
    (level,) = merge(old, again, pool=occasion_noise).levels
    assert level.session_noise is not None and level.session_noise.df == 1, "a seed is a lottery"
    tuned = _recording((_level((95.0, 96.0, 94.0)),), speed=12, seed=1)
    (level,) = merge(old, tuned, pool=occasion_noise).levels
    assert level.session_noise is None, "a changed deployment starts its noise afresh"
    (level,) = merge(old, again).levels
    assert level.session_noise is None, "no pooling asked for"


def test_a_level_the_run_decided_changed_is_not_pooled(tmp_path: Path) -> None:
    from pytest_kimi.baseline.update import update_baselines

    root = tmp_path
    calls: list[str] = []

    def pool(old: LevelBaseline, new: LevelBaseline) -> SessionNoise | None:
        calls.append(new.workload.label())
        return SessionNoise(0.01, 1)

    def test(verdict: str, trials: list[float]) -> dict[str, object]:
        return {
            "nodeid": "t.py::test_x",
            "workload": {"max_tokens": 64},
            "levels": [
                {"label": "C=4", "concurrency": 4, "verdict": verdict, "trials_tok_s": trials}
            ],
        }

    ok, refused = update_baselines(
        root, "sim", "on", [test("no-baseline", [100.0, 101.0])], {}, root, pool=pool
    )
    assert ok and not refused and not calls, "nothing to pool with on the first recording"
    update_baselines(root, "sim", "on", [test("improved", [120.0, 121.0])], {}, root, pool=pool)
    assert not calls, "a decided change is not noise"
    written, _ = update_baselines(
        root, "sim", "on", [test("pass", [119.0, 121.0])], {}, root, pool=pool
    )
    assert len(calls) == 1 and "session noise 0.0100 on 1 df" in written[0]


def test_re_recording_a_deployment_measures_its_noise(pytester: pytest.Pytester) -> None:
    """No ``--perf-sessions``: each ``--update-baselines`` of the same deployment on another
    occasion adds a degree of freedom to the level's stored noise, and says so."""
    pytester.makepyfile(test_suite=SUITE)
    path = pytester.path / "baselines/sim/test_suite/test_x.yaml"
    for seed, df in ((5, None), (9, 1), (13, 2)):
        rec = pytester.runpytest(
            "-p",
            "no:cacheprovider",
            f"--endpoint=sim:speed=10,stream_interval=8,noise=0.02,seed={seed}",
            "--update-baselines",
        )
        rec.assert_outcomes(passed=1)
        (level,) = yaml_io.loads(path.read_text(), source=path).levels
        if df is None:
            assert level.session_noise is None
        else:
            assert level.session_noise is not None and level.session_noise.df == df
            rec.stdout.fnmatch_lines([f"*C=4 max_tokens=64: * tok/s (*), session noise * {df} df"])
