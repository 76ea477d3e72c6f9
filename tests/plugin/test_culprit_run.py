"""``--perf-culprit``: after the deploy gate decides a regression, the change that does it is
named, each step a paired comparison of the reference with some changes applied.

Real sessions over the fake SGLang, whose flag effects are a documented table
(``tests/fake_sglang/sglang/launch_server.py``: ``--enable-torch-compile`` slows every step
1.15 times; ``--log-level``, ``--schedule-policy`` and an unknown env variable do nothing),
every launch drawing its own 1% speed factor from a counter both profiles share, so the
launches scatter as a real deployment's do.  The search itself is tested on synthetic oracles
in ``tests/unit/gate/test_culprit_search.py``; here the run layer launches the deployments between the
profiles, measures the failing level and reports the answer in every sink.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.paths import REPO
from support.timing import SESSION_S

pytest_plugins = ["pytester"]

FAKE = REPO / "tests" / "fake_sglang"

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[4], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass
"""


def _profile(pytester: pytest.Pytester, name: str, model: str, **changes: Any) -> Path:
    """A fake-SGLang profile: the shared base, plus ``changes`` (args; ``env`` a dict)."""
    env = {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.2",
        "FAKE_SGLANG_SPEED": "10",
        "FAKE_SGLANG_LAUNCH_NOISE": "0.01",
        "FAKE_SGLANG_SEED_FILE": str(pytester.path / "launches"),
        "FAKE_SGLANG_SEED_BASE": "700",
        **changes.pop("env", {}),
    }
    args = {"model-path": model, "tp-size": 8, "ep-size": 8, **changes}
    lines = ["args:"] + [f"  {k}: {json.dumps(v)}" for k, v in args.items()]
    lines += ["env:"] + [f"  {k}: {json.dumps(v)}" for k, v in env.items()]
    lines += ["startup_timeout_s: 60", "stop_timeout_s: 3"]
    path = pytester.path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(pytester: pytest.Pytester, *extra: str, **changes: Any) -> tuple[Any, dict[str, Any]]:
    pytester.makepyfile(test_suite=SUITE)
    model = f"/models/kimi-test-{uuid.uuid4().hex[:12]}"
    a = _profile(pytester, "ep8", model)
    b = _profile(pytester, "ep8-new", model, **changes)
    report = pytester.path / "perf.json"
    markdown = pytester.path / "perf.md"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        f"--server-profile={a}",
        f"--server-profile={b}",
        *(extra or ("--perf-max-launches=12",)),
        "--perf-culprit",
        f"--perf-json={report}",
        f"--perf-markdown={markdown}",
        f"--junitxml={pytester.path / 'junit.xml'}",
        f"--perf-html={pytester.path / 'html'}",
        timeout=SESSION_S * 6,
    )
    return result, json.loads(report.read_text())


def test_the_slowing_flag_is_named_among_harmless_changes(pytester: pytest.Pytester) -> None:
    result, data = _run(
        pytester,
        **{
            "log-level": "debug",
            "enable-torch-compile": True,
            "schedule-policy": "lpm",
            "env": {"FAKE_SGLANG_HARMLESS": "1"},
        },
    )
    assert result.ret == 1, "the deploy gate's regression still fails the run"
    (level,) = data["deploy_gate"]["levels"]
    assert level["verdict"] == "regression"
    culprit = data["culprit"]
    print(json.dumps(culprit, indent=1))
    assert culprit["status"] == "named", culprit
    assert culprit["named"] == ["enable-torch-compile"]
    assert sorted(culprit["changes"]) == sorted(
        ["log-level", "enable-torch-compile", "schedule-policy", "env:FAKE_SGLANG_HARMLESS"]
    )
    # every claim is a tested step: the named change alone reproduces, the candidate without it
    # recovers, each with its interval and launches
    steps = {tuple(s["applied"]): s for s in culprit["steps"]}
    alone = steps[("enable-torch-compile",)]
    # a classified probe says so (like the candidate: reproduces), never `regression` at the
    # tolerance from the two measured ends alone
    assert alone["outcome"] == "reproduces" and alone["ci90"][1] < -5
    assert alone["verdict"] in ("reproduces", "regression")
    without = [s for s in culprit["steps"] if s["purpose"] == "without"]
    assert without and all(s["outcome"] == "clean" for s in without)
    assert all(s["verdict"] in ("clean", "pass", "improved") for s in without)
    assert 0 < culprit["launches"] <= 12 and culprit["server_s"] > 0
    result.stdout.fnmatch_lines(
        ["*pytest-kimi culprit*", "*named: enable-torch-compile (*comparison(s), * launch(es)*"]
    )
    md = (pytester.path / "perf.md").read_text()
    assert "Which change did it" in md and "named: enable-torch-compile" in md
    html = (pytester.path / "html" / "index.html").read_text()
    assert 'id="culprit"' in html and "named: enable-torch-compile" in html
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="kimi_culprit_named" value="enable-torch-compile"' in junit


def test_no_regression_leaves_nothing_to_explain(pytester: pytest.Pytester) -> None:
    result, data = _run(pytester, **{"log-level": "debug"})
    (level,) = data["deploy_gate"]["levels"]
    assert level["verdict"] != "regression"
    culprit = data["culprit"]
    assert culprit["status"] == "nothing-to-explain" and culprit["launches"] == 0, culprit
    assert not culprit["steps"] and not culprit["named"]
    result.stdout.fnmatch_lines(
        ["*pytest-kimi culprit*", "*ep8-new against ep8: nothing to explain: the deploy gate*"]
    )


def test_a_spent_budget_leaves_the_best_hypothesis(pytester: pytest.Pytester) -> None:
    """Four launches for the gate, four for the search: sixteen changes need at least four
    splits and two confirmations, so the search stops undecided and says what it narrowed
    the culprit to, never naming an untested one."""
    harmless = {f"FAKE_SGLANG_HARMLESS_{i}": "1" for i in range(14)}
    result, data = _run(
        pytester,
        "--perf-max-launches=4",
        **{"log-level": "debug", "enable-torch-compile": True, "env": harmless},
    )
    culprit = data["culprit"]
    assert len(culprit["changes"]) == 16
    assert culprit["status"] == "undecided" and not culprit["named"], culprit
    assert "enable-torch-compile" in culprit["hypothesis"]
    assert culprit["launches"] <= 4
    result.stdout.fnmatch_lines(["*undecided, best hypothesis: *enable-torch-compile*"])


def test_an_interacting_pair_is_named_together(pytester: pytest.Pytester) -> None:
    """Two flags that slow the fake only together (the table: two-batch with single-batch
    overlap), among two harmless ones: delta debugging names both, each tested."""
    result, data = _run(
        pytester,
        "--perf-max-launches=32",
        **{
            "enable-two-batch-overlap": True,
            "log-level": "debug",
            "enable-single-batch-overlap": True,
            "schedule-policy": "lpm",
        },
    )
    culprit = data["culprit"]
    print(json.dumps(culprit, indent=1))
    assert culprit["status"] == "named", culprit
    assert sorted(culprit["named"]) == ["enable-single-batch-overlap", "enable-two-batch-overlap"]


def test_an_untestable_subset_is_routed_around(pytester: pytest.Pytester) -> None:
    """``tp-size 4`` without ``ep-size 4`` does not start (the fake places experts as SGLang
    0.5 does: EP 8 over TP 4 divides by zero): the search meets a subset that cannot launch,
    reports it as untestable with the reason, tests another partition and still names the
    slowing flag, never one of the coupled pair."""
    result, data = _run(
        pytester,
        "--perf-max-launches=16",
        **{
            "tp-size": 4,
            "ep-size": 4,
            "enable-torch-compile": True,
        },
    )
    culprit = data["culprit"]
    print(json.dumps(culprit, indent=1))
    assert culprit["status"] == "named", culprit
    assert culprit["named"] == ["enable-torch-compile"]
    untestable = [s for s in culprit["steps"] if s["verdict"] == "untestable"]
    assert untestable and all(s["untestable"] for s in untestable), culprit["steps"]
    assert all("ep-size" not in s["applied"] for s in untestable)


def test_the_search_needs_the_paired_comparison(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--endpoint=sim", "--perf-culprit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-culprit*--perf-max-launches*"])
