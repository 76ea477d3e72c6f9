"""``--perf-sessions``: fresh server starts, their ABBA order, and the session noise they measure.

The statistics first (pure, in process): the interval's point estimate is the gate's
method-of-moments one, its edge cases are exact, and its coverage over synthetic sessions is
near the nominal 90% (``bench/session_noise.py`` measures it over more seeds and designs).
Then real sessions in subprocesses: the simulator restarted with a new seed per session, so
its drawn noise factors are known and the estimate can be held against their exact value;
two server profiles in A B B A order; xdist; baselines recorded from several sessions; and
the usage errors, which name where the value came from.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kimi.gate.session_noise import (
    NoiseEstimate,
    estimate_session_sigma,
    estimate_with_interval,
    pooled,
    recommend,
)
from pytest_kimi.run.server_starts import pool_sessions, run_order, session_noise
from pytest_kimi.options import KimiOptions
from pytest_kimi.plugin import KIMI_OPTIONS
from pytest_kimi.sim.config import SimConfig

from support.timing import SESSION_S
from support.paths import REPO

pytest_plugins = ["pytester"]

FAKE = REPO / "tests" / "fake_sglang"


@pytest.fixture(autouse=True)
def _no_kimi_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's or CI's own KIMI_* variables must not leak into these sessions."""
    for name in list(os.environ):
        if name.startswith("KIMI_"):
            monkeypatch.delenv(name)


def _sessions(
    rng: np.random.Generator, k: int, n: int, tau: float, w: float, mu: float = 5.0
) -> list[list[float]]:
    """``k`` sessions of ``n`` trials: one log-normal factor (sd ``tau``) per session, one
    (sd ``w``) per trial."""
    return [list(np.exp(mu + rng.normal(0, tau) + rng.normal(0, w, n))) for _ in range(k)]


# ------------------------------------------------------------------------------ the statistics


def test_the_point_estimate_is_the_gates_method_of_moments() -> None:
    rng = np.random.default_rng(7)
    for k, n in [(2, 3), (4, 3), (6, 10), (3, 2)]:
        data = _sessions(rng, k, n, 0.05, 0.02)
        est = estimate_with_interval(data)
        assert est.sigma == pytest.approx(estimate_session_sigma(data), rel=1e-12)
        assert est.low <= est.sigma <= est.high
        assert (est.sessions, est.trials, est.df_between) == (k, k * n, k - 1)


def test_without_trial_noise_the_interval_is_the_chi_square_one() -> None:
    """``W = 0``: the MLS interval reduces to the exact chi-square interval on the scatter of
    the session means (Ting et al.'s construction is exact at both ends of its range)."""
    from scipy import stats as st

    means = [100.0, 104.0, 97.0, 101.0]
    data = [[m, m, m] for m in means]
    est = estimate_with_interval(data, confidence=0.9)
    a = statistics.variance(math.log(m) for m in means)
    assert est.sigma == pytest.approx(math.sqrt(2 * a))
    assert est.low == pytest.approx(math.sqrt(2 * 3 * a / st.chi2.ppf(0.95, 3)))
    assert est.high == pytest.approx(math.sqrt(2 * 3 * a / st.chi2.ppf(0.05, 3)))


def test_the_lower_end_is_zero_where_the_f_test_stops_rejecting() -> None:
    """No session noise to see: the estimate is 0 and the interval still bounds it above."""
    data = [[100.0, 102.0, 98.0], [101.0, 99.0, 100.5], [99.5, 100.5, 101.5]]
    est = estimate_with_interval(data)
    assert est.sigma == 0.0 and est.low == 0.0 and est.high > 0.0


def test_too_little_data_is_refused() -> None:
    with pytest.raises(ValueError, match="two sessions"):
        estimate_with_interval([[100.0, 101.0]])
    with pytest.raises(ValueError, match="two or more trials"):
        estimate_with_interval([[100.0], [101.0]])
    with pytest.raises(ValueError, match="session 1"):
        estimate_with_interval([[100.0, 101.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="confidence"):
        estimate_with_interval([[100.0, 101.0], [100.0, 99.0]], confidence=1.0)


def test_pooled_of_one_level_is_the_level() -> None:
    data = _sessions(np.random.default_rng(3), 4, 3, 0.05, 0.02)
    assert pooled([[data]]) == estimate_with_interval(data)


def test_pooled_levels_of_one_start_share_its_factor() -> None:
    """Levels of one server start are averaged, not counted as independent: the between term
    keeps k - 1 degrees of freedom, so 5 levels do not narrow the interval 5-fold."""
    rng = np.random.default_rng(11)
    factors = rng.normal(0, 0.05, 4)
    levels = [
        [list(np.exp(level + f + rng.normal(0, 0.01, 3))) for f in factors] for level in range(5)
    ]
    est = pooled([levels])
    assert (est.sessions, est.levels, est.df_between) == (4, 5, 3)
    one = estimate_with_interval(levels[0])
    assert est.high / est.sigma == pytest.approx(one.high / one.sigma, rel=0.1)


def _coverage(
    sims: int, k: int, n: int, tau: float, w: float, levels: int = 1, seed: int = 1
) -> float:
    rng = np.random.default_rng(seed)
    truth = math.sqrt(2) * tau
    hits = 0
    for _ in range(sims):
        factors = rng.normal(0, tau, k)
        data = [
            [list(np.exp(3 * level + f + rng.normal(0, w, n))) for f in factors]
            for level in range(levels)
        ]
        hits += pooled([data]).contains(truth)
    return hits / sims


@pytest.mark.parametrize(
    ("k", "n", "tau", "w", "levels"),
    [(4, 3, 0.05, 0.02, 1), (3, 3, 0.03, 0.03, 1), (4, 3, 0.05, 0.02, 3), (8, 3, 0.02, 0.02, 2)],
)
def test_the_interval_covers_the_truth_at_its_nominal_rate(
    k: int, n: int, tau: float, w: float, levels: int
) -> None:
    """1000 synthetic runs per design (fixed seed): coverage within 3 binomial standard errors
    of 90% (0.9 +- 0.028)."""
    assert _coverage(1000, k, n, tau, w, levels) == pytest.approx(0.9, abs=0.028)


def test_recommend_rounds_up_and_says_how_rough() -> None:
    est = NoiseEstimate(sigma=0.0612, low=0.035, high=0.18, sessions=4)
    advice = recommend(est, current=0.03)
    assert advice.value == pytest.approx(0.065)
    assert "--perf-session-sigma 0.065" in advice.text
    assert "4 sessions make a rough figure" in advice.text and "0.180" in advice.text
    assert "below the interval" in advice.text
    many = NoiseEstimate(sigma=0.02, low=0.012, high=0.035, sessions=12)
    assert recommend(many).value == pytest.approx(0.02)
    assert "rough" not in recommend(many, current=0.05).text
    assert "above the interval" in recommend(many, current=0.05).text
    assert recommend(NoiseEstimate(sigma=0.0, low=0.0, high=0.01, sessions=6)).value == 0.0


def test_run_order_is_abba() -> None:
    assert run_order(2, 4) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)]
    assert run_order(0, 3) == [(0, 0), (0, 1), (0, 2)]
    assert run_order(3, 2) == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]


# --------------------------------------------------------------------- the report dicts (pure)


def _test(
    nodeid: str, k: int, trials: list[float], verdict: str = "pass", profile: str | None = None
) -> dict[str, Any]:
    level = {
        "label": "C=4",
        "concurrency": 4,
        "max_tokens": 64,
        "prompts": "builtin:diverse",
        "protocol": "stationary",
        "trials_tok_s": trials,
        "verdict": verdict,
        "request_tok_s_p50": 50.0 + k,
    }
    out: dict[str, Any] = {
        "nodeid": nodeid,
        "workload": {"api": "chat", "ignore_eos": True},
        "levels": [level],
        "perf_session": k,
        "perf_server": {"pid": 100 + k},
    }
    if profile is not None:
        out["profile"] = profile
    return out


def test_no_sessions_no_section() -> None:
    plain = _test("t.py::t", 0, [100.0, 101.0])
    del plain["perf_session"]
    assert session_noise([plain]) is None
    assert pool_sessions([plain]) == [plain]


def test_section_per_level_pooled_and_untrustworthy_levels_left_out() -> None:
    tests = [
        _test("t.py::a", 0, [100.0, 101.0, 100.5]),
        _test("t.py::b", 0, [50.0, 50.5, 50.2]),
        _test("t.py::a", 1, [110.0, 111.0, 109.0]),
        _test("t.py::b", 1, [55.0, 55.5, 54.8]),
        _test("t.py::a", 2, [95.0, 96.0, 95.5]),
        _test("t.py::b", 2, [1.0], verdict="invalid"),
    ]
    section = session_noise(tests, current_sigma=0.03)
    assert section is not None
    (a, b) = section["levels"]
    assert a["sessions"] == [0, 1, 2] and b["sessions"] == [0, 1]
    assert any("t.py::b C=4 s3: left out (invalid" in note for note in section["notes"])
    (dep,) = section["deployments"]
    # sessions count first: all three, with the one level measured in each
    assert dep["pooled_sessions"] == [0, 1, 2] and dep["estimate"]["levels"] == 1
    assert [s["pid"] for s in dep["servers"]] == [100, 101, 102]
    assert section["recommendation"]["current"] == 0.03
    assert section["recommendation"]["perf_session_sigma"] >= section["pooled"]["sigma"]


def test_baselines_pool_every_sessions_trials() -> None:
    tests = [
        _test("t.py::a", 0, [100.0, 101.0], profile="A"),
        _test("t.py::a", 0, [90.0, 91.0], profile="B"),
        _test("t.py::a", 1, [92.0, 93.0], profile="B"),
        _test("t.py::a", 1, [102.0, 103.0], verdict="invalid", profile="A"),
    ]
    a, b = pool_sessions(tests)
    assert (a["profile"], b["profile"]) == ("A", "B")
    assert a["levels"][0]["trials_tok_s"] == [100.0, 101.0, 102.0, 103.0]
    assert a["levels"][0]["verdict"] == "invalid", "a bad session still refuses the record"
    assert b["levels"][0]["trials_tok_s"] == [90.0, 91.0, 92.0, 93.0]
    assert b["levels"][0]["request_tok_s_p50"] == 50.5
    assert b["perf_sessions"] == [0, 1] and "perf_session" not in b


# ----------------------------------------------------------------------------- usage errors


def _options(pytester: pytest.Pytester, *args: str) -> KimiOptions:
    return pytester.parseconfigure(*args).stash[KIMI_OPTIONS]


@pytest.mark.parametrize("value", ["0", "-1", "x"])
@pytest.mark.parametrize("where", ["cli", "env", "ini"])
def test_bad_values_name_their_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str, where: str
) -> None:
    args: list[str] = []
    if where == "cli":
        args, source = [f"--perf-sessions={value}"], "--perf-sessions"
    elif where == "env":
        monkeypatch.setenv("KIMI_PERF_SESSIONS", value)
        source = "env KIMI_PERF_SESSIONS"
    else:
        pytester.makeini(f"[pytest]\nkimi_perf_sessions = {value}\n")
        source = "ini kimi_perf_sessions"
    pattern = f"^{re.escape(source)}: bad value '{re.escape(value)}': expected a positive integer"
    with pytest.raises(pytest.UsageError, match=pattern):
        _options(pytester, *args)


def test_an_external_endpoint_cannot_be_restarted(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite="def test_x(): pass")
    monkeypatch.setenv("KIMI_PERF_SESSIONS", "2")
    result = pytester.runpytest("--endpoint=http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*env KIMI_PERF_SESSIONS = 2: --endpoint names a server that someone else runs, "
            "which the plugin cannot restart between sessions; give a --server-profile*"
        ]
    )


def test_a_url_only_profile_cannot_be_restarted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite="def test_x(): pass")
    profile = pytester.path / "remote.yaml"
    profile.write_text("url: http://127.0.0.1:9\n")
    result = pytester.runpytest(f"--server-profile={profile}", "--perf-sessions=3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-sessions = 3: server profile remote has only url:*"])


def test_one_session_changes_nothing(pytester: pytest.Pytester) -> None:
    """The default: no parametrization, no ``perf_session`` (the ids and the reports as before)."""
    assert _options(pytester).perf_sessions == 1
    pytester.makepyfile(
        test_suite="""
        from pytest_kimi import throughput

        @throughput(concurrency=[1], max_tokens=16, trials=1)
        def test_x():
            pass
        """
    )
    result = pytester.runpytest("--collect-only", "-q", "--endpoint=sim", "--perf-sessions=1")
    result.stdout.fnmatch_lines(["test_suite.py::test_x"])


# ----------------------------------------------------------------------- real sessions (sim)

SIM_SEED = 19
"""The spec's seed: sessions run with 19, 20, 21, 22, whose noise factors at ``noise=0.05``
(1/f: 1.023 0.978 1.062 0.946) scatter like the knob says, sqrt(2 var log f) = 0.072 against
sqrt(2) x 0.05 = 0.071, so the interval is held against both without luck entering."""

SIM_SUITE = """
from pytest_kimi import throughput

# whole requests: the window is pure decode, so its tok/s is exactly C / step (the simulator's
# truth, noise factor included); 256 tokens keep a stalled core's few ms under a percent
@throughput(concurrency=[4], max_tokens=256, trials=3, protocol="whole-requests")
def test_decode():
    pass

@throughput(concurrency=[4], max_tokens=64, trials=3)
def test_stationary():
    pass

def test_plain():
    pass
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # content, not layout: a wide COLUMNS keeps each line of the summary whole
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "2000")
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=SESSION_S)


def test_each_session_is_a_fresh_simulator_and_the_noise_is_measured(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_suite=SIM_SUITE)
    report = pytester.path / "perf.json"
    markdown = pytester.path / "perf.md"
    result = _run(
        pytester,
        f"--endpoint=sim:speed=10,stream_interval=8,noise=0.05,seed={SIM_SEED}",
        "--perf-sessions=4",
        f"--perf-json={report}",
        f"--perf-markdown={markdown}",
        "-v",
    )
    result.assert_outcomes(passed=2 * 4 + 1)  # the plain test once, not once per session
    result.stdout.fnmatch_lines(
        [f"*[[]kimi sim s{k + 1}[]] started (pid *, seed {SIM_SEED + k})*" for k in range(4)]
    )
    result.stdout.fnmatch_lines(
        ["*pytest-kimi session noise*", "recommended: --perf-session-sigma*"]
    )
    data = json.loads(report.read_text())
    tests = data["tests"]
    assert [t["perf_session"] for t in tests] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {t["nodeid"] for t in tests} == {
        "test_suite.py::test_decode",
        "test_suite.py::test_stationary",
    }, "baselines do not depend on the session id"
    servers = [t["perf_server"] for t in tests]
    assert [s["seed"] for s in servers] == [SIM_SEED + k // 2 for k in range(8)]
    pids = [s["pid"] for s in servers]
    assert pids[0::2] == pids[1::2] and len(set(pids)) == 4, "one start per session"

    # every session measured its own start: the decode level is the simulator's truth there
    base = SimConfig(speed=10, stream_interval=8, noise=0.05)
    truths = [
        SimConfig(speed=10, stream_interval=8, noise=0.05, seed=SIM_SEED + k).true_tok_s(
            4, include_noise=True
        )
        / base.speed
        for k in range(4)
    ]
    decode = [t["levels"][0]["tok_s"] for t in tests if t["nodeid"].endswith("test_decode")]
    for measured, truth in zip(decode, truths):
        assert measured == pytest.approx(truth, rel=0.03), (decode, truths)

    noise = data["session_noise"]
    (dep,) = noise["deployments"]
    assert [s["seed"] for s in dep["servers"]] == [SIM_SEED + k for k in range(4)]
    est = NoiseEstimate.from_dict(noise["pooled"])
    assert (est.sessions, est.levels) == (4, 2)
    factors = [math.log(SimConfig(noise=0.05, seed=SIM_SEED + k).noise_factor) for k in range(4)]
    exact = math.sqrt(2 * statistics.variance(factors))
    assert est.contains(exact) and est.contains(math.sqrt(2) * 0.05), (est, exact)
    # The estimate differs from the drawn factors' own value only by what trial noise explains:
    # the session means carry within_sd / sqrt(6) each, which moves sqrt(2 var) by about
    # within_sd / 3 (one standard deviation); three of them, and half a percent for rounding.
    assert abs(est.sigma - exact) <= 0.005 + est.within_sd, (est, exact)
    assert "### Session noise" in markdown.read_text()
    assert "**Recommended:** --perf-session-sigma" in markdown.read_text()


def test_sessions_under_xdist_stay_on_one_worker(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_suite="""
        from pytest_kimi import throughput

        @throughput(concurrency=[2], max_tokens=64, trials=2)
        def test_a():
            pass

        @throughput(concurrency=[4], max_tokens=64, trials=2)
        def test_b():
            pass

        def test_plain_1():
            pass

        def test_plain_2():
            pass
        """
    )
    report = pytester.path / "perf.json"
    result = _run(
        pytester,
        "-n",
        "2",
        "-v",
        "--endpoint=sim:speed=10,stream_interval=8,noise=0.05",
        "--perf-sessions=2",
        f"--perf-json={report}",
    )
    result.assert_outcomes(passed=2 * 2 + 2)
    workers = {
        m.group(1)
        for m in re.finditer(r"\[(gw\d)\] .*PASSED test_suite.py::test_[ab]", result.stdout.str())
    }
    assert len(workers) == 1, result.stdout.str()
    data = json.loads(report.read_text())
    tests = data["tests"]
    assert [(t["nodeid"][-6:], t["perf_session"]) for t in tests] == [
        ("test_a", 0),
        ("test_b", 0),
        ("test_a", 1),
        ("test_b", 1),
    ]
    pids = [t["perf_server"]["pid"] for t in tests]
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert data["session_noise"]["pooled"]["sessions"] == 2, "estimated on the controller"


def test_baselines_recorded_from_sessions_pool_their_trials(pytester: pytest.Pytester) -> None:
    """Also: a plain test that uses the endpoint first does not pin every session to its start
    (the session fixtures are parametrized indirectly, so both share one fixture)."""
    pytester.makepyfile(
        test_suite="""
        from pytest_kimi import throughput

        def test_0_plain(kimi_load):
            pass

        @throughput(concurrency=[2], max_tokens=64, trials=2)
        def test_x():
            pass
        """
    )
    report = pytester.path / "perf.json"
    result = _run(
        pytester,
        "--endpoint=sim:speed=10,stream_interval=8",
        "--perf-sessions=2",
        "--perf-max-trials=2",  # the marker's 2: a recording runs max trials in each session
        "--update-baselines",
        f"--perf-json={report}",
    )
    result.assert_outcomes(passed=3)
    pids = [t["perf_server"]["pid"] for t in json.loads(report.read_text())["tests"]]
    assert len(set(pids)) == 2, pids
    import yaml

    saved = yaml.safe_load((pytester.path / "baselines/sim/test_suite/test_x.yaml").read_text())
    (level,) = saved["levels"]
    assert len(level["trials_tok_s"]) == 2 * 2, "both sessions' trials (a new baseline: max trials)"
    result.stdout.fnmatch_lines(["*test_suite.py::test_x [[]sim[]]*(new file)*"])


# -------------------------------------------------------------- real sessions (two profiles)


def _profile(pytester: pytest.Pytester, name: str, model: str) -> Path:
    """A fake SGLang deployment (tests/fake_sglang serves the simulator) of ``model``."""
    env = {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.3",
        "FAKE_SGLANG_SPEED": "10",
    }
    env_yaml = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items())
    path = pytester.path / f"{name}.yaml"
    path.write_text(
        f"args:\n  model-path: {model}\n  tp-size: 8\n"
        f"  ep-size: 8\n  max-running-requests: 256\nenv:\n{env_yaml}\n"
        "startup_timeout_s: 60\nstop_timeout_s: 3\n"
    )
    return path


def test_two_profiles_run_their_sessions_in_abba_order(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_suite="""
        from pytest_kimi import throughput

        def test_0_plain(kimi_endpoint):  # skipped (no endpoint outside the profiles' tests)
            pass

        @throughput(concurrency=[4], max_tokens=64, trials=2, warmup=1)
        def test_sweep():
            pass
        """
    )
    model = f"/models/kimi-test-{uuid.uuid4().hex[:12]}"  # one model: an A/B compares them
    a, b = _profile(pytester, "ep8-a", model), _profile(pytester, "ep8-b", model)
    report = pytester.path / "perf.json"
    result = _run(
        pytester,
        f"--server-profile={a}",
        f"--server-profile={b}",
        "--perf-sessions=2",
        f"--perf-json={report}",
        "-v",
    )
    result.assert_outcomes(passed=4, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*[[]kimi ep8-a s1[]] launching*",
            "*test_sweep[[]ep8-a-s1[]] PASSED*",
            "*[[]kimi ep8-b s1[]] launching*",
            "*test_sweep[[]ep8-b-s1[]] PASSED*",
            "*[[]kimi ep8-b s2[]] launching*",
            "*test_sweep[[]ep8-b-s2[]] PASSED*",
            "*[[]kimi ep8-a s2[]] launching*",
            "*test_sweep[[]ep8-a-s2[]] PASSED*",
        ]
    )
    data = json.loads(report.read_text())
    tests = data["tests"]
    assert [(t["profile"], t["perf_session"]) for t in tests] == [
        ("ep8-a", 0),
        ("ep8-b", 0),
        ("ep8-b", 1),
        ("ep8-a", 1),
    ]
    assert {t["nodeid"] for t in tests} == {"test_suite.py::test_sweep"}
    assert len({t["perf_server"]["pid"] for t in tests}) == 4, "a fresh launch per session"
    assert [t.get("compared_with") for t in tests[1:3]] == [
        "deployment ep8-a (same run)",
        "deployment ep8-a (same run)",
    ]
    deployments = data["session_noise"]["deployments"]
    assert [d["profile"] for d in deployments] == ["ep8-a", "ep8-b"]
    assert all(d["estimate"]["sessions"] == 2 for d in deployments)
