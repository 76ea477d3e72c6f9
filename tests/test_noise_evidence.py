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
    rec = pytester.runpytest_subprocess(
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
    run = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--endpoint={sim},seed=9", f"--perf-json={report}"
    )
    run.assert_outcomes(passed=1)
    (test,) = json.loads(report.read_text())["tests"]
    used = test["session_noise"]
    assert "the baseline's recording" in used["source"] and "(2 df)" in used["source"]
    expected = with_stored_noise(replace(GateSettings(), sigma_vouched=False), saved)
    assert used["sigma"] == expected.session_sigma
    run.stdout.fnmatch_lines(["*judged with session noise*the baseline's recording*"])
