"""``--perf-max-launches``: a deploy change judged by a paired, sequential experiment.

First the pure part (:mod:`pytest_kimi.run.deploy_gate` over made-up test records): blocks are
paired, an untrustworthy launch loses its block with a note, a test is decided when every level
is (or one is red), an undecided level is final only when no block is still to come.  Then real
sessions: two fake-SGLang profiles serving the simulator, whose every launch draws its own speed
factor (``FAKE_SGLANG_LAUNCH_NOISE``, 2%) from known seeds, so the launches scatter as a real
deployment's do and the verdicts below are those of the drawn factors, not of luck.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.gate.paired import run_sequential
from pytest_kimi.run.deploy_gate import decided_block, judge, launch_figures
from pytest_kimi.sim.config import SimConfig

from support.paths import REPO
from support.timing import SESSION_S

pytest_plugins = ["pytester"]

FAKE = REPO / "tests" / "fake_sglang"
FAILING = frozenset({"regression", "inconclusive", "error", "invalid", "not-run"})


def _test(profile: str, block: int, tok_s: float | None, verdict: str = "no-baseline") -> Any:
    level: dict[str, Any] = {"label": "C=4", "concurrency": 4, "verdict": verdict}
    if tok_s is not None:
        level["tok_s"] = tok_s
    return {
        "nodeid": "t.py::test_x",
        "profile": profile,
        "perf_session": block,
        "levels": [level],
    }


def _records(ref: list[float], cand: list[float]) -> list[dict[str, Any]]:
    out = []
    for k, (a, b) in enumerate(zip(ref, cand)):
        out += [_test("a", k, a), _test("b", k, b)]
    return out


# ------------------------------------------------------------------------------ pure


def test_the_run_layer_replays_the_sequential_comparison() -> None:
    ref = [100.0, 101.5, 99.2, 100.4, 100.9, 99.6]
    cand = [88.0, 90.1, 87.5, 89.9, 88.4, 89.0]
    gate = judge(_records(ref, cand), ["a", "b"], max_launches=12, tolerance=0.05, alpha=0.05)
    assert gate is not None
    (level,) = gate.levels
    expected = run_sequential(ref, cand, max_blocks=6)
    assert level.verdict == expected.comparison.verdict.value == "regression"
    assert level.decided_at == expected.blocks - 1
    assert decided_block(gate, "t.py::test_x", FAILING) == level.decided_at
    assert level.to_dict()["launches"] == 2 * expected.blocks


def test_an_untrustworthy_launch_loses_its_block_with_a_note() -> None:
    records = _records([100.0, 101.0, 99.0], [100.5, 100.0, 99.5])
    records[3] = _test("b", 1, 80.0, verdict="invalid")
    cells, notes = launch_figures(records, "a", "b")
    (cell,) = cells
    assert cell.blocks() == [0, 2]
    assert len(notes) == 1 and "invalid" in notes[0] and "block 2" in notes[0]


def test_an_undecided_level_is_final_only_when_no_block_is_to_come() -> None:
    # far from both boundaries after two blocks: undecided
    records = _records([100.0, 104.0], [97.0, 93.0])
    running = judge(records, ["a", "b"], max_launches=12, tolerance=0.05, alpha=0.05)
    assert running is not None
    (level,) = running.levels
    assert not level.decided and level.budget_left
    assert running.failing(FAILING) == []
    assert decided_block(running, "t.py::test_x", FAILING) is None
    over = judge(records, ["a", "b"], max_launches=12, tolerance=0.05, alpha=0.05, finished=True)
    assert over is not None
    (final,) = over.levels
    assert final.verdict in ("inconclusive", "underpowered") and not final.budget_left
    if final.verdict == "inconclusive":
        assert over.failing(FAILING) == [final]


def test_one_block_is_no_look() -> None:
    gate = judge(
        _records([100.0], [90.0]),
        ["a", "b"],
        max_launches=12,
        tolerance=0.05,
        alpha=0.05,
        finished=True,
    )
    assert gate is not None
    (level,) = gate.levels
    assert level.outcome is None and level.verdict == "not-run"
    assert "2 needed" in level.text()


# ------------------------------------------------------------------------------ real launches

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[4], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass
"""

SEEDS = {"ref": 500, "cand": 600}
"""Seed bases whose 2% launch factors decide clearly in three blocks both ways (the replay in
:func:`_expected` checks that from the factors themselves)."""


def _profile(
    pytester: pytest.Pytester,
    name: str,
    model: str,
    seed: int,
    slowdown: float,
    max_running: int = 256,
) -> Path:
    env = {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.3",
        "FAKE_SGLANG_SPEED": "10",
        "FAKE_SGLANG_SLOWDOWN": str(slowdown),
        "FAKE_SGLANG_LAUNCH_NOISE": "0.02",
        "FAKE_SGLANG_SEED_FILE": str(pytester.path / f"{name}.launches"),
        "FAKE_SGLANG_SEED_BASE": str(seed),
    }
    env_yaml = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items())
    path = pytester.path / f"{name}.yaml"
    path.write_text(
        f"args:\n  model-path: {model}\n  tp-size: 8\n"
        f"  ep-size: 8\n  max-running-requests: {max_running}\nenv:\n{env_yaml}\n"
        "startup_timeout_s: 60\nstop_timeout_s: 3\n"
    )
    return path


def _expected(slowdown: float) -> tuple[str, int]:
    """The verdict and the blocks the drawn factors alone give (tok/s is 1 / step time)."""
    ref = [1 / SimConfig(noise=0.02, seed=SEEDS["ref"] + k).noise_factor for k in range(6)]
    cand = [
        1 / (slowdown * SimConfig(noise=0.02, seed=SEEDS["cand"] + k).noise_factor)
        for k in range(6)
    ]
    outcome = run_sequential(ref, cand, max_blocks=6)
    return outcome.comparison.verdict.value, outcome.blocks


def _run(
    pytester: pytest.Pytester, slowdown: float, *extra: str, max_running: int = 256
) -> tuple[Any, dict[str, Any]]:
    pytester.makepyfile(test_suite=SUITE)
    model = f"/models/kimi-test-{uuid.uuid4().hex[:12]}"
    a = _profile(pytester, "ep8", model, SEEDS["ref"], 1.0)
    b = _profile(pytester, "ep8-new", model, SEEDS["cand"], slowdown, max_running)
    report = pytester.path / "perf.json"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        f"--server-profile={a}",
        f"--server-profile={b}",
        "--perf-max-launches=12",
        f"--perf-json={report}",
        "-v",
        *extra,
        timeout=SESSION_S * 3,
    )
    return result, json.loads(report.read_text())


def test_an_unchanged_deploy_is_decided_green_and_stops_launching(
    pytester: pytest.Pytester,
) -> None:
    verdict, blocks = _expected(1.0)
    assert (verdict, blocks) == ("pass", 3), "the seeds no longer give the scenario"
    # the README's CI recipe for a deploy change: strict, and nothing unmeasured
    result, data = _run(
        pytester, 1.0, "--perf-strict", "--perf-require-baseline", "--perf-require-measurement"
    )
    assert result.ret == 0, result.stdout.str()[-3000:]
    (level,) = data["deploy_gate"]["levels"]
    assert (level["verdict"], level["decided"]) == ("pass", True)
    launches = level["launches"]  # 6 from the factors; a busy machine may need a block more
    assert launches in (4, 6, 8)
    result.assert_outcomes(passed=launches, skipped=12 - launches)
    result.stdout.fnmatch_lines(
        ["*pytest-kimi deploy gate*", f"*test_sweep C=4: pass: *decided after {launches} launches*"]
    )
    assert level["comparison"]["min_detectable_drop_pct"] > 0
    abba = [("ep8", 0), ("ep8-new", 0), ("ep8-new", 1), ("ep8", 1), ("ep8", 2), ("ep8-new", 2)]
    abba += [("ep8-new", 3), ("ep8", 3)]
    order = [(t["profile"], t["perf_session"]) for t in data["tests"]]
    assert order == abba[:launches], "ABBA launches, none after the decision"
    assert len({t["perf_server"]["pid"] for t in data["tests"]}) == launches, "fresh launches"


def test_a_slower_deploy_is_a_regression_where_it_was_decided(pytester: pytest.Pytester) -> None:
    """15% slower at 2% launch noise: the drawn factors decide it in three blocks; a busy
    machine's measurement may move the decisive look by a block, never the verdict."""
    verdict, blocks = _expected(1.15)
    assert (verdict, blocks) == ("regression", 3), "the seeds no longer give the scenario"
    result, data = _run(pytester, 1.15)
    assert result.ret == 1
    (level,) = data["deploy_gate"]["levels"]
    assert level["verdict"] == "regression" and level["comparison"]["change_pct"] < -5
    launches = level["launches"]
    result.assert_outcomes(passed=launches - 1, failed=1, skipped=12 - launches)
    result.stdout.fnmatch_lines(
        [
            "*deploy comparison against ep8, completed by this launch:*",
            "*the deploy gate fails the run: 1 level(s) not vouched for:*",
        ]
    )
    # the change is named (the fake serves the simulator, whose slowdown is the slower deploy)
    assert data["deploy_gate"]["changes"] == {"ep8-new": ["sim.slowdown: 1.0 -> 1.15"]}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--perf-max-launches=2"], "*the first look needs 2 launches of each deployment*"),
        (["--perf-max-launches=8", "--update-baselines"], "*records no baseline*"),
        (["--perf-max-launches=8", "--perf-sessions=2"], "*drop --perf-sessions*"),
    ],
)
def test_a_paired_run_that_cannot_run_is_refused(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    a = _profile(pytester, "ep8", "/models/m", 1, 1.0)
    b = _profile(pytester, "ep8-new", "/models/m", 2, 1.0)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--server-profile={a}", f"--server-profile={b}", *args
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_one_deployment_is_no_paired_comparison(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    a = _profile(pytester, "ep8", "/models/m", 1, 1.0)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", f"--server-profile={a}", "--perf-max-launches=8"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*needs exactly two --server-profile*got 1*"])


def test_a_deploy_that_runs_fewer_requests_at_once_is_a_regression_naming_the_flag(
    pytester: pytest.Pytester,
) -> None:
    """The candidate serves at most 2 requests at once, the test asks for 4: about half the
    throughput, decided at the first look, with the changed flag in the section."""
    result, data = _run(pytester, 1.0, max_running=2)
    assert result.ret == 1
    result.assert_outcomes(passed=3, failed=1, skipped=8)
    gate = data["deploy_gate"]
    (level,) = gate["levels"]
    assert level["verdict"] == "regression" and level["launches"] == 4
    assert level["comparison"]["change_pct"] < -30
    assert any("max_running_requests" in c and "256" in c for c in gate["changes"]["ep8-new"])
    result.stdout.fnmatch_lines(["*changed on ep8-new:*max_running_requests*256*2*"])
