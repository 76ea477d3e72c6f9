"""Deployments of real SGLang 0.5.23 (CPU engine, tiny local Llama) compared by the plugin.

Why: the same-run A/B, the paired deploy gate with its culprit search (issue 34) and the race
(issue 37) were built against the fakes; here each launches managed profiles of the real
engine (``--max-running-requests`` 8 against 2, about a quarter of the throughput at C=8) and
must reach the verdict that difference calls for.

Why a module of their own: their verdicts rest on the launches' noise, and no other server may
share the two cores meanwhile.  An idle SGLang CPU server does not sleep: its scheduler polls
for work, a whole core's worth (``ps -o time`` of an idle server's ``sglang::scheduler`` grows
as fast as the clock), so the module-scoped ``keyed`` server of ``test_real_server_checks.py``
would take one of the two cores from every launch here.  Here, every server is one the plugin
launched for the test and stops after it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import cpu_server
from support.real_engine_suite import first_run_after_a_launch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(cpu_server.sglang_python() is None, reason=cpu_server.SKIP_REASON)


AB_SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=8, max_tokens=64, requests_per_stream=4, warmup=2)
def test_ab():
    pass
"""
AB_GATE = (
    "--perf-tolerance=0.3",
    "--perf-session-sigma=0.1",
    "--perf-detectable-drop=0.6",
    "--perf-max-trials=6",
)


def _profile(max_running_requests: int, model: Path) -> dict[str, Any]:
    """The CPU profile (A1's ``servers/sglang-cpu-tiny.yaml`` where it exists, else the same
    flags written here) with ``max-running-requests`` set."""
    import yaml

    shipped = REPO / "servers" / "sglang-cpu-tiny.yaml"
    if shipped.exists():
        data: dict[str, Any] = yaml.safe_load(shipped.read_text())
    else:
        args: dict[str, Any] = {}
        words = list(cpu_server.LAUNCH_FLAGS)
        while words:
            flag = words.pop(0)[2:]
            args[flag] = words.pop(0) if words and not words[0].startswith("--") else True
        data = {
            "engine": "sglang",
            "args": args,
            "env": {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
            "nice": 10,
            "startup_timeout_s": cpu_server.READY_TIMEOUT_S,
            "stop_grace_s": 10,
            "stop_timeout_s": 10,
        }
    data["args"]["model-path"] = str(model)
    data["args"]["max-running-requests"] = max_running_requests
    python = os.environ.get("KIMI_SGLANG_PYTHON")
    if python:
        data["command"] = [python, "-m", "sglang.launch_server"]
    return data


def test_same_run_ab_names_the_changed_flag(
    pytester: pytest.Pytester, tiny_model_path: Path
) -> None:
    """Two managed profiles in one session, ``--max-running-requests 8`` then ``2``, at C=8:
    the second is judged against the first (same run), its drop flagged with the one flag
    that changed named."""
    import yaml

    for name, n in (("sglang-tiny-mrr8", 8), ("sglang-tiny-mrr2", 2)):
        (pytester.path / f"{name}.yaml").write_text(yaml.safe_dump(_profile(n, tiny_model_path)))
    pytester.makepyfile(test_suite=AB_SUITE)
    path = pytester.path / "ab.json"
    result = pytester.runpytest(
        "-m",
        "perf",
        "--server-profile=sglang-tiny-mrr8.yaml",
        "--server-profile=sglang-tiny-mrr2.yaml",
        *AB_GATE,
        "-v",
        f"--perf-json={path}",
    )
    out = result.stdout.str()
    report = {t.get("profile"): t for t in json.loads(path.read_text())["tests"]}
    (reference,) = report["sglang-tiny-mrr8"]["levels"]
    (changed,) = report["sglang-tiny-mrr2"]["levels"]
    figures = {"reference": reference["tok_s"], "changed": changed["tok_s"]}
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*changed vs deployment sglang-tiny-mrr8 (same run):*max_running_requests*"]
    )
    assert changed["verdict"] == "regression", (figures, changed["verdict"], out[-3000:])
    assert reference["verdict"] not in ("regression", "fail", "invalid", "error"), reference


# ------------------------------------------------------ the deploy gate, paired (issue 34)

PAIRED_SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=8, max_tokens=64, requests_per_stream=4, warmup=2, trials=3)
def test_ab():
    pass
"""


def _paired(
    pytester: pytest.Pytester,
    tiny_model_path: Path,
    profiles: dict[str, int],
    launches: int,
    *extra: str,
    changes: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """A paired deploy comparison of managed profiles (name: ``max-running-requests``), the
    first the reference, at most ``launches`` launches; ``changes``: more arguments (and an
    ``env`` dict) for the last profile."""
    import yaml

    for i, (name, n) in enumerate(profiles.items()):
        data = _profile(n, tiny_model_path)
        if changes and i == len(profiles) - 1:
            more = dict(changes)
            data["env"] = {**data.get("env", {}), **more.pop("env", {})}
            data["args"].update(more)
        (pytester.path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    pytester.makepyfile(test_suite=PAIRED_SUITE)
    path = pytester.path / "paired.json"
    result = pytester.runpytest(
        "-m",
        "perf",
        *(f"--server-profile={name}.yaml" for name in profiles),
        f"--perf-max-launches={launches}",
        "-v",
        f"--perf-json={path}",
        *extra,
    )
    return result, json.loads(path.read_text())


def test_paired_aa_of_one_deployment_is_not_a_regression(
    pytester: pytest.Pytester, tiny_model_path: Path
) -> None:
    """The same flags twice: fresh launches in ABBA blocks, each warmed until stationary; the
    comparison measures the launches' own noise and does not call a regression."""
    result, report = _paired(pytester, tiny_model_path, {"tiny-a": 8, "tiny-a2": 8}, 4)
    gate = report["deploy_gate"]
    (level,) = gate["levels"]
    print(json.dumps(level, indent=1))
    assert level["verdict"] != "regression", level
    assert gate["changes"] == {"tiny-a2": []}, gate["changes"]
    warm = [t.get("warm_up") for t in report["tests"]]
    assert all(w is not None for w in warm), "every launch is a fresh server, warmed"
    assert result.ret in (0, 1)  # undecided after 4 launches is inconclusive or underpowered


def test_paired_ab_of_a_slower_deploy_is_a_regression_and_its_culprit_is_named(
    pytester: pytest.Pytester, tiny_model_path: Path
) -> None:
    """``--max-running-requests 2`` against 8 at C=8 (about a quarter of the throughput), hidden
    among three harmless changes (``--log-level``, ``--schedule-policy``, an env variable
    SGLang never reads): the paired comparison decides a ``regression`` with the flag named in
    its list of changes, and ``--perf-culprit`` names it alone, each step a paired comparison
    of fresh launches of the real engine.

    At a 30% tolerance, as the vLLM counterpart (``tests/engine``) is judged: fresh launches of
    the real engine on two shared cores differ by several percent (the session prints it as
    "launch noise" on the gate's line), so 8 launches cannot vouch that the harmless subset is
    within the default 5% of the reference (the culprit's lines print each step's 90% CI),
    while a drop of about 60% stays far beyond 30%."""
    result, report = _paired(
        pytester,
        tiny_model_path,
        {"tiny-mrr8": 8, "tiny-mrr2": 2},
        8,
        "--perf-culprit",
        "--perf-tolerance=0.3",
        changes={
            "log-level": "warning",
            "schedule-policy": "lpm",
            "env": {"KIMI_HARMLESS_SETTING": "1"},
        },
    )
    gate = report["deploy_gate"]
    (level,) = gate["levels"]
    print(json.dumps(level, indent=1))
    assert level["verdict"] == "regression", level
    assert any("max_running_requests" in c for c in gate["changes"]["tiny-mrr2"]), gate
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*changed on tiny-mrr2:*max_running_requests*"])
    culprit = report["culprit"]
    print(json.dumps(culprit, indent=1))
    assert sorted(culprit["changes"]) == sorted(
        ["max-running-requests", "log-level", "schedule-policy", "env:KIMI_HARMLESS_SETTING"]
    )
    assert culprit["status"] == "named" and culprit["named"] == ["max-running-requests"], culprit
    result.stdout.fnmatch_lines(["*pytest-kimi culprit*", "*named: max-running-requests (*"])


def test_the_first_run_after_a_launch_agrees_with_the_later_ones(
    pytester: pytest.Pytester, tiny_model_path: Path
) -> None:
    """SGLang: :func:`support.real_engine_suite.first_run_after_a_launch`."""
    import yaml

    (pytester.path / "tiny.yaml").write_text(yaml.safe_dump(_profile(8, tiny_model_path)))
    first_run_after_a_launch(pytester, "tiny.yaml")


# ------------------------------------------------------------------ the race (issue 37)


def test_a_race_of_three_real_deployments_eliminates_the_clearly_worse_one(
    pytester: pytest.Pytester, tiny_model_path: Path
) -> None:
    """Three managed profiles of the real CPU engine, ``--max-running-requests`` 8, 8 with a
    harmless ``--log-level``, and 2 (about a quarter of the throughput at C=8): the session is
    round 1, the race launches round 2 itself, and the clearly worse deployment leaves the
    race with the deployment that beat it named, and one of the two equal ones leads."""
    import yaml

    profiles = {"race-mrr8": (8, {}), "race-mrr8-quiet": (8, {"log-level": "warning"})}
    profiles["race-mrr2"] = (2, {})
    for name, (n, more) in profiles.items():
        data = _profile(n, tiny_model_path)
        data["args"].update(more)
        data["name"] = name
        (pytester.path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    pytester.makepyfile(test_suite=PAIRED_SUITE)
    path = pytester.path / "race.json"
    result = pytester.runpytest(
        "-m",
        "perf",
        *(f"--server-profile={name}.yaml" for name in profiles),
        "--perf-race",
        "--perf-race-rounds=2",
        f"--perf-json={path}",
    )
    race = json.loads(path.read_text())["race"]
    print(json.dumps(race, indent=1))
    ranking = {e["deployment"]: e for e in race["ranking"]}
    worse = ranking["race-mrr2"]
    assert worse["status"] == "eliminated" and worse["eliminated_in_round"] == 2, worse
    assert worse["vs_best_ci90_pct"][1] < -30, worse
    assert "race-mrr8" in worse["reason"], worse
    assert race["ranking"][0]["deployment"] in ("race-mrr8", "race-mrr8-quiet"), race
    # two rounds of three is the full grid at this budget: the saving is the rounds not run
    assert race["launches"] == 6 and race["server_s"] <= race["grid_server_s"]
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*pytest-kimi race*"])
