"""Broken servers: each fault gives a clear failure in bounded time, and measured levels survive.

"Bounded" is said against the time the fault would take if the plugin waited it out: the
per-request timeout (``timeout_s``), or the stall of the server.  Every session runs in
process, bounded by the suite's session timeout (tests/support/inprocess.py).
"""

from __future__ import annotations

import inspect
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Iterator

import pytest

from pytest_kimi.endpoint.discovery import discover

SWEEP = """
from pytest_kimi import throughput

@throughput(
    concurrency=[1, 2, 4], max_tokens=32, trials=2, warmup=0, timeout_s={timeout_s},
    protocol="whole-requests",  # one request per stream and trial: the crash counts on it
)
def test_sweep():
    pass
"""


TIMEOUT_S = 5.0
"""The sweep's per-request timeout: no fault below may cost it."""


def _run(
    pytester: pytest.Pytester, endpoint: str, timeout_s: float = TIMEOUT_S
) -> tuple[pytest.RunResult, list[dict], float]:
    """Run the sweep; the levels of its report and how long its measurement took (from the
    report: the session's start-up is not the plugin's doing)."""
    pytester.makepyfile(test_faulty=SWEEP.format(timeout_s=timeout_s))
    report = pytester.path / "perf.json"
    args = (f"--endpoint={endpoint}", f"--perf-json={report}")
    result = pytester.runpytest(*args)
    tests = json.loads(report.read_text())["tests"] if report.exists() else []
    levels = tests[0]["levels"] if tests else []
    spans = [t["measured"] for t in tests if "measured" in t]
    elapsed = spans[0][1] - spans[0][0] if spans else math.nan
    return result, levels, elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down(pytester: pytest.Pytester) -> None:
    started = time.monotonic()
    result, _, _ = _run(pytester, f"http://127.0.0.1:{_free_port()}")
    elapsed = time.monotonic() - started
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*cannot connect to http://127.0.0.1:*is the server up and listening*"]
    )
    # refused at once, not after waiting out discovery's timeout
    assert elapsed < inspect.signature(discover).parameters["timeout_s"].default


class _Garbage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"<html>welcome to nginx</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def garbage_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_server_answering_garbage(pytester: pytest.Pytester, garbage_url: str) -> None:
    result, _, _ = _run(pytester, garbage_url)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*/v1/models answered 200 but not JSON*is this an OpenAI-compatible server*"]
    )


@pytest.mark.parametrize(
    "knobs, message",
    [
        ("error_rate=1", "*HTTP 500*"),
        ("disconnect_after_tokens=5", "*stream ended without [[]DONE[]]*"),
        ("malformed_after_tokens=5", "*malformed SSE event*"),
    ],
)
def test_every_request_failing(pytester: pytest.Pytester, knobs: str, message: str) -> None:
    result, levels, elapsed = _run(pytester, f"sim:speed=50,{knobs}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*throughput requests failed:*", f"*C=1 error: * requests failed*{message}"]
    )
    assert [lv["verdict"] for lv in levels] == ["error", "not-run", "not-run"]
    assert levels[1]["reasons"] == ["not run: C=1 ended in error"]
    assert elapsed < TIMEOUT_S, "every request failed at once: none may wait out its timeout"


def test_stall_past_timeout_is_bounded(pytester: pytest.Pytester) -> None:
    stall_s = 60
    result, levels, elapsed = _run(
        pytester, f"sim:speed=50,stall_after_tokens=5,stall_s={stall_s}", timeout_s=0.5
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*C=1 error:*stalled: no data for 0.5*"])
    assert levels[0]["verdict"] == "error"
    assert elapsed < stall_s, "a stall must end at timeout_s, not when the server wakes up"


def test_crash_mid_sweep_keeps_the_levels_measured_before(pytester: pytest.Pytester) -> None:
    # C=1 needs 2 trials x 1 request; the server dies when the 4th request arrives (C=2).
    # At speed 10, not 50: C=1's stream of 32 tokens lasts ~50 ms, so a simulator held off its
    # core for a few ms on a busy machine (it then catches its steps up at once) does not
    # deliver the whole stream in one lump, which the client rightly calls buffered.
    result, levels, elapsed = _run(pytester, "sim:speed=10,crash_after_requests=3")
    result.assert_outcomes(failed=1)
    assert levels[0]["verdict"] in ("pass", "no-baseline") and levels[0]["tok_s"] > 0
    assert levels[1]["verdict"] == "error"
    assert levels[2]["verdict"] == "not-run"
    result.stdout.fnmatch_lines(["*C=2 error:*"])
    assert elapsed < TIMEOUT_S, "a dead server refuses at once: no request waits out its timeout"


def test_max_error_rate_relaxes_and_completions_api(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_relaxed="""
        from pytest_kimi import throughput

        @throughput(concurrency=4, max_tokens=32, requests=20, trials=2, warmup=0, max_error_rate=0.6)
        def test_relaxed(throughput_result):
            lv = throughput_result.level(4)
            assert lv.figures.requests_failed > 0 and lv.verdict != "error"

        @throughput(concurrency=2, max_tokens=16, trials=2, warmup=0, api="completions",
                    requests_per_stream=4)
        def test_completions(throughput_result):
            assert all(r.completion_tokens == 16 for t in throughput_result.level(2).trials for r in t.records)
        """
    )
    result = pytester.runpytest("--endpoint=sim:speed=50,error_rate=0.25")
    result.assert_outcomes(passed=1, failed=1)  # completions at 25% errors with max_error_rate 0
    result.stdout.fnmatch_lines(
        ["*test_completions*", "*C=2 error: * requests failed (max_error_rate=0)*HTTP 500*"]
    )
    result = pytester.runpytest("--endpoint=sim:speed=50", "-k", "completions")
    result.assert_outcomes(passed=1)
