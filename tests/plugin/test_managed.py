"""Managed deployments through the plugin: launch, measure, crash, time out, Ctrl-C, A/B.

A fake ``sglang.launch_server`` (tests/fake_sglang) accepts SGLang's flags, logs like SGLang and
serves the simulator; its mode and speed come from the profile's ``env``.  Every session here
launches and reaps servers, so each runs in a subprocess of its own: in process, the
launcher's registries (live groups, exit hooks) would be this process's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.timing import SESSION_S, poll_until, read_until
from support.paths import REPO

FAKE = REPO / "tests" / "fake_sglang"

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], max_tokens=64, trials={trials}, warmup=1)
def test_sweep():
    pass
"""


def _profile(
    pytester: pytest.Pytester,
    name: str,
    *,
    mode: str = "ok",
    timeout_s: float = 60,
    extra_env: dict[str, str] | None = None,
    extra_args: str = "",
    marker: str | None = None,
) -> tuple[Path, str]:
    """A profile whose model path is unique, so its processes can be found by command line."""
    marker = marker or f"/models/kimi-test-{uuid.uuid4().hex[:12]}"
    env = {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_MODE": mode,
        "FAKE_SGLANG_STARTUP_S": "0.3",
        **(extra_env or {}),
    }
    env_yaml = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items())
    path = pytester.path / f"{name}.yaml"
    path.write_text(
        f"args:\n  model-path: {marker}\n  tp-size: 8\n  ep-size: 8\n  max-running-requests: 256\n"
        f"{extra_args}env:\n{env_yaml}\nstartup_timeout_s: {timeout_s}\nstop_timeout_s: 3\n"
    )
    return path, marker


def _alive(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _assert_reaped(marker: str) -> None:
    poll_until(lambda: not _alive(marker), f"every process of {marker} gone")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-m", "perf", *args, timeout=SESSION_S)


def test_launched_measured_and_torn_down(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE.format(trials=2).replace("[1, 4]", "1"))
    profile, marker = _profile(pytester, "ep8-fake")
    report = pytester.path / "perf.json"
    result = _run(pytester, f"--server-profile={profile}", f"--perf-json={report}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*[[]kimi ep8-fake[]]*"])
    data = json.loads(report.read_text())
    assert data["endpoint"]["server_info"]["tp_size"] == 8
    assert data["endpoint"]["server_info"]["model_path"] == marker
    (test,) = data["tests"]
    assert test["nodeid"] == "test_suite.py::test_sweep", (
        "baselines do not depend on the deployment id"
    )
    assert test["baseline_profile"] == "ep8-fake"
    assert all(lv["profile"] == "ep8-fake" and lv["tok_s"] > 0 for lv in test["levels"])
    _assert_reaped(marker)


def test_crash_at_start_is_reported_with_its_traceback_quickly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE.format(trials=2))
    timeout_s = 60
    profile, marker = _profile(pytester, "tp2ep4", mode="crash-at-start", timeout_s=timeout_s)
    started = time.monotonic()
    result = _run(pytester, f"--server-profile={profile}")
    elapsed = time.monotonic() - started
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*server profile tp2ep4*did not start*", "*ZeroDivisionError*"])
    assert elapsed < timeout_s, "the crash is reported when it happens, not at the timeout"
    _assert_reaped(marker)


def test_never_ready_is_reported_at_the_timeout(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE.format(trials=2))
    profile, marker = _profile(pytester, "stuck", mode="never-ready", timeout_s=3)
    started = time.monotonic()
    result = _run(pytester, f"--server-profile={profile}")
    elapsed = time.monotonic() - started
    result.assert_outcomes(errors=1)
    # the configured timeout ended it (not a crash, not the 2400 s default), and not before
    result.stdout.fnmatch_lines(["*server profile stuck*did not start*", "*not ready after 3 s*"])
    assert elapsed >= 3
    _assert_reaped(marker)


def test_crash_mid_sweep_keeps_measured_levels(pytester: pytest.Pytester) -> None:
    whole = SUITE.format(trials=2).replace("warmup=1)", 'warmup=1, protocol="whole-requests")')
    pytester.makepyfile(test_suite=whole)
    # whole requests, so that they can be counted: readiness probe + warm-up + C=1 (2 trials
    # x 2 requests) = 6 requests, then it dies
    profile, marker = _profile(
        pytester, "flaky", mode="crash-mid-sweep", extra_env={"FAKE_SGLANG_CRASH_AFTER": "7"}
    )
    report = pytester.path / "perf.json"
    result = _run(pytester, f"--server-profile={profile}", f"--perf-json={report}")
    result.assert_outcomes(failed=1)
    levels = json.loads(report.read_text())["tests"][0]["levels"]
    assert levels[0]["tok_s"] > 0 and levels[0]["verdict"] == "no-baseline"
    assert levels[1]["verdict"] == "error"
    result.stdout.fnmatch_lines(["*the server exited with code 1*"])
    _assert_reaped(marker)


def test_ctrl_c_during_a_sweep_leaves_no_process(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_suite="""
        from pytest_kimi import throughput

        @throughput(concurrency=[1, 2, 4, 8], max_tokens=4096, trials=5, warmup=0)
        def test_long():
            pass
        """
    )
    profile, marker = _profile(pytester, "long", extra_env={"FAKE_SGLANG_SPEED": "1"})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "perf",
            f"--server-profile={profile}",
            "-p",
            "no:cacheprovider",
        ],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        poll_until(lambda: _alive(marker), "the server started")
        # ready, and measuring (a C=1 request of 4096 tokens takes a minute): the session
        # says so before its first trial
        head = read_until(proc, "[kimi] measuring ")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=SESSION_S)
        out = head + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in out, out[-2000:]
    # a clean stop: the cancelled streams' CancelledError is never printed after it
    assert "Traceback" not in out and "CancelledError" not in out, out[-3000:]
    _assert_reaped(marker)


def test_same_run_ab_flags_the_slowed_deployment(pytester: pytest.Pytester) -> None:
    # one level (the comparison is level by level), the one with the most tokens a window
    pytester.makepyfile(test_suite=SUITE.format(trials=5).replace("[1, 4]", "4"))
    # speed 10 (not the fake's 20): a few percent of a core, so on a shared machine the
    # trials measure the server and not the CPU they got
    quiet = {"FAKE_SGLANG_SPEED": "10"}
    ref, ref_marker = _profile(pytester, "ep8-tuned", extra_env=quiet)
    slow, slow_marker = _profile(
        pytester,
        "ep8-eplb",
        extra_env={**quiet, "FAKE_SGLANG_SLOWDOWN": "1.15"},
        extra_args="  enable-eplb: true\n",
        marker=ref_marker,
    )
    report = pytester.path / "perf.json"
    result = _run(
        pytester,
        f"--server-profile={ref}",
        f"--server-profile={slow}",
        f"--perf-json={report}",
        "-v",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_sweep[[]ep8-tuned[]] PASSED*", "*test_sweep[[]ep8-eplb[]] FAILED*"]
    )
    result.stdout.fnmatch_lines(
        [
            "*regression -*%*",
            "*changed vs deployment ep8-tuned (same run):*enable_eplb: false -> true*",
        ]
    )
    tests = {t["profile"]: t for t in json.loads(report.read_text())["tests"]}
    assert set(tests) == {"ep8-tuned", "ep8-eplb"}
    slow = [lv["verdict"] for lv in tests["ep8-eplb"]["levels"]]
    assert "regression" in slow and "pass" not in slow, slow
    # every step 1.15x longer: -13% at every level, inside the level's 90% interval widened to
    # twice its width (the interval is the run's own measure of its noise)
    expected = (1 / 1.15 - 1) * 100
    for lv in tests["ep8-eplb"]["levels"]:
        lo, hi = lv["ci90"]
        assert lo - (hi - lo) / 2 <= expected <= hi + (hi - lo) / 2, lv
    _assert_reaped(ref_marker)
    _assert_reaped(slow_marker)
