"""Broken servers: each fault gives a clear failure in bounded time, and measured levels survive."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Iterator

import pytest

SWEEP = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 2, 4], max_tokens=32, trials=2, warmup=0, timeout_s={timeout_s})
def test_sweep():
    pass
"""


def _run(
    pytester: pytest.Pytester, endpoint: str, timeout_s: float = 5.0
) -> tuple[pytest.RunResult, list[dict], float]:
    pytester.makepyfile(test_faulty=SWEEP.format(timeout_s=timeout_s))
    report = pytester.path / "perf.json"
    started = time.monotonic()
    result = pytester.runpytest(f"--endpoint={endpoint}", f"--perf-json={report}")
    elapsed = time.monotonic() - started
    levels = (
        json.loads(report.read_text())["tests"][0]["levels"]
        if report.exists() and json.loads(report.read_text())["tests"]
        else []
    )
    return result, levels, elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down(pytester: pytest.Pytester) -> None:
    result, _, elapsed = _run(pytester, f"http://127.0.0.1:{_free_port()}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*cannot connect to http://127.0.0.1:*is the server up and listening*"]
    )
    assert elapsed < 30


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
    assert elapsed < 30


def test_stall_past_timeout_is_bounded(pytester: pytest.Pytester) -> None:
    result, levels, elapsed = _run(
        pytester, "sim:speed=50,stall_after_tokens=5,stall_s=60", timeout_s=0.5
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*C=1 error:*stalled: no data for 0.5*"])
    assert levels[0]["verdict"] == "error"
    assert elapsed < 30, "a stall must end at timeout_s, not when the server wakes up"


def test_crash_mid_sweep_keeps_the_levels_measured_before(pytester: pytest.Pytester) -> None:
    # C=1 needs 2 trials x 1 request; the server dies when the 4th request arrives (C=2).
    result, levels, elapsed = _run(pytester, "sim:speed=50,crash_after_requests=3")
    result.assert_outcomes(failed=1)
    assert levels[0]["verdict"] in ("pass", "no-baseline") and levels[0]["tok_s"] > 0
    assert levels[1]["verdict"] == "error"
    assert levels[2]["verdict"] == "not-run"
    result.stdout.fnmatch_lines(["*C=2 error:*"])
    assert elapsed < 30


def test_max_error_rate_relaxes_and_completions_api(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_relaxed="""
        from pytest_kimi import throughput

        @throughput(concurrency=4, max_tokens=32, requests=20, trials=2, warmup=0, max_error_rate=0.6)
        def test_relaxed(throughput_result):
            lv = throughput_result.level(4)
            assert lv.figures.requests_failed > 0 and lv.verdict != "error"

        @throughput(concurrency=2, max_tokens=16, trials=2, warmup=0, api="completions")
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
