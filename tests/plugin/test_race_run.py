"""``--perf-race``: real sessions over the fake SGLang whose flag effects are a documented
table (``tests/fake_sglang/sglang/launch_server.py``: ``--enable-eplb`` slows every step 1.8
times, ``--enable-torch-compile`` 1.15, ``--enable-mixed-chunk`` 1.02; ``--log-level`` does
nothing), every launch drawing its own 1% speed factor from a counter the profiles share, so
the launches scatter as a real deployment's do.  The race's statistics are tested on synthetic
oracles in ``tests/unit/gate/test_race.py``; here the plugin runs the session as the first round,
launches the later rounds, and reports the answer in every sink.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.paths import REPO
from support.timing import SESSION_S

pytest_plugins = ["pytester"]

FAKE = REPO / "tests" / "fake_sglang"

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[2, 4], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass
"""


def _env(pytester: pytest.Pytester) -> dict[str, str]:
    return {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.2",
        "FAKE_SGLANG_SPEED": "10",
        "FAKE_SGLANG_LAUNCH_NOISE": "0.01",
        "FAKE_SGLANG_SEED_FILE": str(pytester.path / "launches"),
        "FAKE_SGLANG_SEED_BASE": "900",
    }


def _profile(pytester: pytest.Pytester, name: str, model: str, **args: Any) -> Path:
    """A fake-SGLang profile file (``args`` over a shared base; a list value is a grid axis)."""
    extra = args.pop("extra", {})
    data = {
        "name": name,
        "args": {"model-path": model, "tp-size": 8, "ep-size": 8, **args},
        "env": _env(pytester),
        "startup_timeout_s": 60,
        "stop_timeout_s": 3,
        **extra,
    }
    path = pytester.path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _race(
    pytester: pytest.Pytester, profiles: list[Path], *extra: str
) -> tuple[Any, dict[str, Any]]:
    pytester.makepyfile(test_suite=SUITE)
    report = pytester.path / "perf.json"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        *(f"--server-profile={p}" for p in profiles),
        "--perf-race",
        *extra,
        f"--perf-json={report}",
        f"--perf-markdown={pytester.path / 'perf.md'}",
        f"--junitxml={pytester.path / 'junit.xml'}",
        f"--perf-html={pytester.path / 'html'}",
        timeout=SESSION_S * 6,
    )
    assert report.exists(), result.stdout.str()[-3000:]
    return result, json.loads(report.read_text())


def _model() -> str:
    return f"/models/kimi-test-{uuid.uuid4().hex[:12]}"


def test_a_clear_winner_is_named_and_the_slow_ones_eliminated(pytester: pytest.Pytester) -> None:
    model = _model()
    profiles = [
        _profile(pytester, "eplb", model, **{"enable-eplb": True}),
        _profile(pytester, "plain", model),
        _profile(pytester, "compiled", model, **{"enable-torch-compile": True}),
    ]
    result, data = _race(pytester, profiles)
    race = data["race"]
    print(json.dumps(race, indent=1))
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert race["stop"] == "winner" and race["winner"] == "plain", race
    ranking = {e["deployment"]: e for e in race["ranking"]}
    assert [e["deployment"] for e in race["ranking"]][0] == "plain"
    for slow in ("eplb", "compiled"):
        entry = ranking[slow]
        assert entry["status"] == "eliminated" and entry["eliminated_in_round"] >= 2
        assert entry["vs_best_ci90_pct"][1] < 0, entry  # the interval says slower, wholly
        assert "plain" in entry["reason"]
    # round 1 is the session's: each deployment's first figure is its test's peak tok/s
    tests = {t["profile"]: t for t in data["tests"]}
    for name, entry in ranking.items():
        peak = max(lv["tok_s"] for lv in tests[name]["levels"])
        assert entry["launch_values"][0] == pytest.approx(peak, rel=1e-3)
        assert len(entry["launch_values"]) == entry["launches"]
    assert race["launches"] == sum(e["launches"] for e in race["ranking"])
    assert 0 < race["server_s"] < race["grid_server_s"]
    assert race["winner_profile"] == str(profiles[1])
    # the frontier: each deployment's levels, per GPU (8: tp-size 8), pooled over its launches
    frontier = {f["deployment"]: f for f in race["frontier"]}
    point = frontier["plain"]["points"][0]
    assert frontier["plain"]["gpus"] == 8 and point["launches"] == ranking["plain"]["launches"]
    assert (
        point["tok_s_per_gpu_ci90"][0] <= point["tok_s_per_gpu"] <= point["tok_s_per_gpu_ci90"][1]
    )
    result.stdout.fnmatch_lines(["*pytest-kimi race*", "*plain*"])
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="kimi_race_winner" value="plain"' in junit
    assert "plain" in (pytester.path / "perf.md").read_text()


def test_a_grid_profile_expands_and_a_failed_start_is_eliminated_with_its_reason(
    pytester: pytest.Pytester,
) -> None:
    """One profile whose args hold lists: four deployments named by what differs, one
    excluded combination; the fake refuses ep-size > tp-size (as SGLang 0.5 does), so that
    deployment never starts and leaves the race with the reason."""
    model = _model()
    grid = _profile(
        pytester,
        "kimi",
        model,
        **{
            "tp-size": [4, 8],
            "ep-size": [8, 4],
            "enable-eplb": [False, True],
            "extra": {"exclude": [{"tp-size": 4, "ep-size": 4}], "gpus": 8},
        },
    )
    result, data = _race(pytester, [grid], "--perf-race-rounds=3")
    race = data["race"]
    print(json.dumps(race, indent=1))
    names = {e["deployment"] for e in race["ranking"]}
    assert names == {
        "kimi-tp4-ep8-no-enable-eplb",
        "kimi-tp4-ep8-enable-eplb",
        "kimi-tp8-ep8-no-enable-eplb",
        "kimi-tp8-ep8-enable-eplb",
        "kimi-tp8-ep4-no-enable-eplb",
        "kimi-tp8-ep4-enable-eplb",
    }, names
    ranking = {e["deployment"]: e for e in race["ranking"]}
    for name in ("kimi-tp4-ep8-no-enable-eplb", "kimi-tp4-ep8-enable-eplb"):
        failed = ranking[name]
        assert failed["status"] == "failed" and failed["eliminated_in_round"] == 1
        assert failed["launches"] == 1 and "did not start" in failed["reason"], failed
        assert failed["launch_values"] == [None] and failed["value"] is None
    for name in ("kimi-tp8-ep8-enable-eplb", "kimi-tp8-ep4-enable-eplb"):
        assert ranking[name]["status"] == "eliminated", ranking[name]
    # the two equal deployments (EP size makes no difference to the fake) tie within 5%
    assert race["stop"] == "tie" and race["winner"] is None
    assert sorted(race["tie"]) == ["kimi-tp8-ep4-no-enable-eplb", "kimi-tp8-ep8-no-enable-eplb"]
    assert race["winner_profile"] is None
    assert all(e["gpus"] == 8 for e in race["ranking"])
    # a failed start is the race's to report: the session skipped it, and stays green
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines(["*tie within 5%, no winner*"])


def test_the_winner_is_recorded_and_written_out(pytester: pytest.Pytester) -> None:
    """``--update-baselines`` with a race records the winner's baselines only, under its own
    name; a grid's winner is written out as a profile of its own, which runs as it is."""
    model = _model()
    grid = _profile(pytester, "kimi", model, **{"enable-torch-compile": [True, False]})
    result, data = _race(pytester, [grid], "--update-baselines")
    race = data["race"]
    assert race["winner"] == "kimi-no-enable-torch-compile", race
    assert result.ret == 0, result.stdout.str()[-3000:]
    recorded = sorted(p.parent.parent.name for p in (pytester.path / "baselines").rglob("*.yaml"))
    assert recorded == ["kimi-no-enable-torch-compile"]
    written = pytester.path / race["winner_profile"]
    assert race["winner_profile"] == ".kimi/race/kimi-no-enable-torch-compile.yaml"
    profile = yaml.safe_load(written.read_text())
    assert profile["name"] == "kimi-no-enable-torch-compile"
    assert profile["args"]["enable-torch-compile"] is False
    # the written profile is the deployment: a plain run of it is judged by the new baseline
    report = pytester.path / "again.json"
    again = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        f"--server-profile={written}",
        f"--perf-json={report}",
    )
    assert again.ret == 0, again.stdout.str()[-3000:]
    (test,) = json.loads(report.read_text())["tests"]
    assert "baselines/kimi-no-enable-torch-compile/" in test["baseline_file"]
    assert all(lv["baseline_tok_s"] for lv in test["levels"])


def test_the_budget_ends_an_undecided_race(pytester: pytest.Pytester) -> None:
    """Two equal deployments and a tolerance too small to tie them: neither is eliminated,
    no tie can be shown, and the race stops at its round budget, undecided."""
    model = _model()
    profiles = [
        _profile(pytester, "a", model),
        _profile(pytester, "b", model, **{"log-level": "debug"}),
    ]
    result, data = _race(pytester, profiles, "--perf-race-rounds=2", "--perf-tolerance=0.001")
    race = data["race"]
    assert race["stop"] == "budget" and race["winner"] is None, race
    assert sorted(race["undecided"]) == ["a", "b"] and race["rounds"] == 2
    assert race["launches"] == 4 and race["max_rounds"] == 2
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*undecided*"])


@pytest.mark.parametrize(
    ("extra", "suite", "message"),
    [
        ((), "two", "*a race ranks the deployments by one perf test's objective; 2 perf tests*"),
        (("-n", "2"), "one", "*--perf-race with -n (xdist)*run it without -n*"),
        (("--perf-race-objective=capacity",), "one", "*the objective capacity is a @capacity*"),
        (("--perf-race-objective=fast",), "one", "*expected tok_s, tok_s_per_gpu*got 'fast'*"),
        (("--perf-max-launches=12",), "one", "*a race and a paired deploy comparison*"),
    ],
)
def test_a_race_that_cannot_run_is_a_usage_error(
    pytester: pytest.Pytester, extra: tuple[str, ...], suite: str, message: str
) -> None:
    two = SUITE + "\n\n@throughput(concurrency=1, max_tokens=8)\ndef test_other():\n    pass\n"
    pytester.makepyfile(test_suite=two if suite == "two" else SUITE)
    model = _model()
    profiles = [_profile(pytester, "a", model), _profile(pytester, "b", model)]
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        *(f"--server-profile={p}" for p in profiles),
        "--perf-race",
        *extra,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines([message])
    assert not list(pytester.path.glob(".kimi/logs/*")), "nothing was launched"


def test_one_deployment_is_no_race(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    profile = _profile(pytester, "a", _model())
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--server-profile={profile}", "--perf-race"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*a race needs two or more deployments*got 1*"])


def test_a_grid_profile_outside_a_race_says_how_to_race_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    grid = _profile(pytester, "kimi", _model(), **{"tp-size": [4, 8]})
    result = pytester.runpytest("-p", "no:cacheprovider", f"--server-profile={grid}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expands to its deployments only with --perf-race*"])
