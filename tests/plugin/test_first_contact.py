"""First contact, as a new user tries it: a typo in a marker, a server that is not there."""

from __future__ import annotations

import json
import socket

import pytest

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], max_tokens=32)
def test_sweep():
    pass
"""


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_endpoint_still_writes_every_report(pytester: pytest.Pytester) -> None:
    """A CI step that uploads the reports finds them, with the test's error in them."""
    pytester.makepyfile(test_suite=SUITE)
    out = pytester.path / "out"
    port = _closed_port()
    result = pytester.runpytest(
        f"--endpoint=http://127.0.0.1:{port}",
        f"--perf-json={out / 'perf.json'}",
        f"--perf-markdown={out / 'perf.md'}",
        f"--perf-html={out / 'html'}",
        f"--junitxml={out / 'junit.xml'}",
    )
    result.assert_outcomes(errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (test,) = json.loads((out / "perf.json").read_text())["tests"]
    assert test["nodeid"] == "test_suite.py::test_sweep"
    assert test["outcome"] == "error" and test["levels"] == []
    assert f"cannot connect to http://127.0.0.1:{port}" in test["error"]
    assert "Traceback" not in test["error"]
    for path in (out / "perf.md", out / "html" / "index.html"):
        assert "cannot connect to" in path.read_text(), path
    result.stdout.fnmatch_lines(
        [
            "*pytest-kimi throughput*",
            "*test_sweep*[[]error[]]*",
            "*no levels measured*",
            "*cannot connect to*",
        ]
    )


def test_misspelt_marker_argument_names_the_closest_valid_one(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_suite="""
from pytest_kimi import throughput

@throughput(concurrency=1, min_toks=60)
def test_single():
    pass
"""
    )
    # In process on purpose: the marker error ends the session at collection, before the
    # session fixture that would start a simulator, so nothing is spawned (asserted below:
    # the simulator leaves its logs and records under .kimi/ the moment it starts).
    result = pytester.runpytest("--endpoint=sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_single*min_toks (did you mean min_tok_s?)*"])
    assert not (pytester.path / ".kimi").exists(), "a simulator was started"
