"""``--perf-server-metrics``: the Prometheus parser, the checks on made-up trials, the scraper's
errors against tiny servers, and real sessions against the simulator (agreement, a second
client that makes the counts disagree, a server without ``/metrics``)."""

from __future__ import annotations

import typing
import json
import threading
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import pytest
from aiohttp import web

from pytest_kimi import wire
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.workload.workload_spec import LevelSpec
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, summarize_trial
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.report.markdown import render_markdown
from pytest_kimi.report.terminal import format_test
from pytest_kimi.crosscheck.prefix_cache import PrefixCacheProbe
from pytest_kimi.crosscheck.counter_check import (
    RATE_TOLERANCE,
    check_trial,
    counting_mode,
    level_summary,
)
from pytest_kimi.crosscheck.counter_scraper import CounterNames, MetricsScraper, Scrape
from pytest_kimi.crosscheck.metrics_page import (
    METRICS_MAX_BYTES,
    MetricsTooLarge,
    ServerMetricsError,
)
from pytest_kimi.crosscheck.prometheus_text import parse_metrics, parse_sample

# ------------------------------------------------------------------------------------ parser

VLLM = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="moonshotai/Kimi-K2"} 1200.0
vllm:generation_tokens_total{engine="1",model_name="moonshotai/Kimi-K2"} 34.0
vllm:generation_tokens_created{engine="0",model_name="moonshotai/Kimi-K2"} 1.7e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="moonshotai/Kimi-K2"} 500.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="moonshotai/Kimi-K2"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="moonshotai/Kimi-K2"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="moonshotai/Kimi-K2"} 10.0
vllm:gpu_cache_usage_perc{engine="0"} NaN
"""

SGLANG = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="kimi"} 8.0
sglang:prompt_tokens_total{model_name="kimi"} 7.0
sglang:num_requests_total{model_name="kimi"} 1.0
"""


def test_sample_lines_with_labels_escapes_timestamps_and_special_values() -> None:
    s = parse_sample('m{a="x",b="say \\"hi\\", {ok}\\n",c="back\\\\slash",} 3.5 1712345678000')
    assert s is not None
    assert s.name == "m" and s.value == 3.5
    assert dict(s.labels) == {"a": "x", "b": 'say "hi", {ok}\n', "c": "back\\slash"}
    assert parse_sample("up 1").value == 1.0
    assert parse_sample('x{le="+Inf"} +Inf').value == float("inf")
    assert np.isnan(parse_sample("x NaN").value)
    assert parse_sample("x -Inf").value == float("-inf")
    assert parse_sample('x { a = "1" } 2').value == 2.0
    # (prometheus_client's parser, which decides, reads "x 1 2 3" as value 1 at time 2)
    for bad in (
        "# HELP x y",
        "",
        'x{a="1" 2',
        "x{a=1} 2",
        "x",
        "x one",
        "9x 1",
        'x{a="1"}} 2',
        "xy{",
    ):
        assert parse_sample(bad) is None, bad


def test_families_are_summed_over_label_sets() -> None:
    m = parse_metrics(VLLM)
    assert m.get("vllm:generation_tokens_total") == 1234.0
    assert m.get("vllm:request_success_total") == 10.0
    assert m.get("vllm:prompt_tokens_total") == 500.0
    assert m.bad_lines == 0
    names = CounterNames.find(m, "http://h/metrics")
    assert names == CounterNames(
        "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total"
    )


def test_parsing_only_the_counters_wanted() -> None:
    wanted = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
    m = parse_metrics(VLLM + "vllm:generation_tokens_total_bogus 5\nnot a line\n", wanted)
    assert m.totals == {"vllm:generation_tokens_total": 1234.0, "vllm:prompt_tokens_total": 500.0}
    assert m.bad_lines == 0


def test_both_prefixes_are_recognised() -> None:
    names = CounterNames.find(parse_metrics(SGLANG), "u")
    assert names == CounterNames(
        "sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:num_requests_total"
    )
    only = CounterNames.find(parse_metrics("sglang:generation_tokens_total 5\n"), "u")
    assert only == CounterNames("sglang:generation_tokens_total", None, None)


def test_garbage_lines_are_counted_not_fatal() -> None:
    m = parse_metrics("<html>oops</html>\n" + SGLANG + 'broken{x="1 2\n\x00\x01 junk\n')
    assert m.get("sglang:generation_tokens_total") == 8.0
    assert m.bad_lines == 3


def test_missing_counter_names_what_was_found() -> None:
    text = "# TYPE tgi_request_count counter\ntgi_request_count 3\ntgi_request_generated_tokens_sum 99\n"
    with pytest.raises(ServerMetricsError) as err:
        CounterNames.find(parse_metrics(text), "http://h:1/metrics", text)
    msg = str(err.value)
    assert "http://h:1/metrics has no generation-token counter" in msg
    assert "vllm:generation_tokens_total or sglang:generation_tokens_total" in msg
    assert "tgi_request_generated_tokens_sum" in msg
    page = "<!doctype html><html><body>Welcome to the gateway</body></html>"
    with pytest.raises(ServerMetricsError, match="holds no Prometheus samples .*Welcome"):
        CounterNames.find(parse_metrics(page), "http://h:1/metrics", page)


# ---------------------------------------------------------------------------- checks, made up


def _stream(worker: int, index: int, start: float, tokens: int, dt: float) -> RequestRecord:
    rec = RequestRecord(
        index=index,
        worker=worker,
        scheduled=start - 0.005,
        sent=start - 0.005,
        first_token=start,
        status=200,
        completion_tokens=tokens,
        prompt_tokens=10,
    )
    rec.chunk_times = array("d", [start + i * dt for i in range(tokens)])
    rec.chunk_events = array("I", [1] * tokens)
    rec.end = start + tokens * dt
    return rec


def _closed_loop(
    workers: int = 2, per_worker: int = 3, tokens: int = 200, dt: float = 0.005
) -> TrialResult:
    """``workers`` streams back to back, each ``per_worker`` requests of 1 s: 400 tok/s."""
    records = []
    for w in range(workers):
        t = 0.01 * w
        for _ in range(per_worker):
            records.append(_stream(w, len(records), t, tokens, dt))
            t += tokens * dt + 0.002
    level = LevelSpec(workers, None, tokens)
    tr = TrialRecords(
        records=records, started=0.0, ended=max(r.end for r in records), concurrency=workers
    )
    return summarize_trial(0, level, tr, client=ClientSignals(), ignore_eos=True)


def _received(trial: TrialResult, t: float) -> float:
    return float(sum(sum(1 for x in r.chunk_times if x <= t) for r in trial.records))


def _finished(trial: TrialResult, t: float) -> float:
    return float(sum(r.completion_tokens for r in trial.records if r.last_token <= t))


def _scrapes(
    trial: TrialResult, counter: Any, *, extra_per_s: float = 0.0, every: float = 0.25
) -> tuple:
    end = max(r.end for r in trial.records)
    before = Scrape(t=-0.05, half_rtt_s=0.001, generation=1000.0)
    during = [
        Scrape(
            t=t, half_rtt_s=0.001, generation=1000.0 + counter(trial, t) + extra_per_s * (t + 0.05)
        )
        for t in np.arange(every, end, every)
    ]
    after = Scrape(
        t=end + 0.01,
        half_rtt_s=0.001,
        generation=1000.0 + counter(trial, end + 1) + extra_per_s * (end + 0.06),
    )
    return before, [*during, after], after


def test_a_counter_that_follows_the_tokens_agrees_exactly_and_on_the_rate() -> None:
    trial = _closed_loop()
    before, during, after = _scrapes(trial, _received)
    check, reasons = check_trial(
        trial, before, during, after, metric="vllm:generation_tokens_total"
    )
    assert reasons == []
    assert check.exact is True and check.tokens == check.client_tokens == 1200
    assert check.counting == "per-token"
    assert check.window_samples >= 2
    assert abs(check.deviation_pct) < RATE_TOLERANCE * 100
    assert check.tok_s == pytest.approx(trial.tok_s, rel=0.01)


def test_another_clients_tokens_fail_both_checks() -> None:
    trial = _closed_loop()
    before, during, after = _scrapes(trial, _received, extra_per_s=50.0)  # +12% of 400 tok/s
    check, reasons = check_trial(
        trial, before, during, after, metric="vllm:generation_tokens_total"
    )
    assert check.exact is False and check.tokens > check.client_tokens
    assert reasons[0].startswith(
        f"server counted {check.tokens:,} generation tokens (vllm:generation_tokens_total)"
    )
    assert (
        "the client 1,200: another client is using this server, or the server counts differently"
        in reasons[0]
    )
    assert "of the steady-state window, the client received" in reasons[1] and "(+12." in reasons[1]


def test_a_per_request_counter_gets_the_exact_check_only() -> None:
    trial = _closed_loop()
    before, during, after = _scrapes(trial, _finished)
    assert counting_mode(during, before, trial.records) == "per-request"
    check, reasons = check_trial(
        trial, before, during, after, metric="sglang:generation_tokens_total"
    )
    assert reasons == [] and check.exact is True
    assert check.tok_s is None and check.deviation_pct is None
    assert "counts a request's tokens when the request ends" in check.notes[0]


def test_a_short_window_gets_the_exact_check_only_and_says_so() -> None:
    trial = _closed_loop(per_worker=2, tokens=40)  # a window of ~0.4 s: one sample
    before, during, after = _scrapes(trial, _received)
    check, reasons = check_trial(trial, before, during, after, metric="m")
    assert reasons == [] and check.exact is True and check.tok_s is None
    assert (
        "held 1 counter sample(s) (one every 0.25 s; a rate needs 2): exact check only"
        in check.notes[0]
    )


def test_failed_requests_make_the_count_inexact_not_invalid() -> None:
    trial = _closed_loop()
    trial.records[-1].error = "disconnected"
    before, during, after = _scrapes(trial, _received)
    check, reasons = check_trial(trial, before, during, after, metric="m")
    assert check.exact is None and reasons == []
    assert check.notes[0].startswith("tokens not compared: 1 request(s) failed")


def test_level_summary_keys() -> None:
    trial = _closed_loop()
    before, during, after = _scrapes(trial, _received)
    check, _ = check_trial(trial, before, during, after, metric="m")
    summary = level_summary([check, check], "m")
    assert summary["tokens"] == summary["client_tokens"] == 2400
    assert summary["exact"] is True and summary["counting"] == "per-token"
    assert summary["tok_s"] == pytest.approx(check.tok_s, abs=0.01)
    assert summary["client_tok_s"] == pytest.approx(trial.tok_s, abs=0.01)
    assert summary["max_deviation_pct"] == pytest.approx(abs(check.deviation_pct), abs=1e-3)
    assert summary["prompt_tokens"] is None and summary["client_prompt_tokens"] == 120
    assert len(summary["trials"]) == 2 and summary["trials"][0]["tokens"] == 1200
    json.dumps(summary)
    # the keys the typed wire declares, no more, no fewer (mypy checks the readers against them)
    assert set(summary) == set(typing.get_type_hints(wire.ServerCheckSection))
    assert set(summary["trials"][0]) == set(typing.get_type_hints(wire.ServerCheckTrial))


def test_reports_show_server_columns_only_when_present() -> None:
    level = {"label": "C=4", "concurrency": 4, "tok_s": 1000.0, "verdict": "pass", "reasons": []}
    test = {
        "nodeid": "t.py::t",
        "outcome": "passed",
        "workload": {"api": "chat"},
        "levels": [level],
    }
    columns = ("server tok/s", "server tokens")
    plain = "\n".join(format_test(test)) + render_markdown({"tests": [test]})
    assert not any(c in plain for c in columns)
    level["server"] = {"tokens": 4096, "client_tokens": 4096, "tok_s": 997.5}
    lines = format_test(test)
    assert "server tok/s" in lines[1] and "997.5" in lines[2] and "4096 (exact)" in lines[2]
    md = render_markdown({"tests": [test]})
    assert "| server tok/s | server tokens |" in md and "| 997.5 | 4096 (exact) |" in md
    level["server"] = {"tokens": 4100, "client_tokens": 4096, "tok_s": None}
    assert "4100 (client 4096)" in format_test(test)[2]


# ------------------------------------------------------------------------- scraper, real HTTP


async def _serve_metrics(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.AppRunner:
    """A loopback server whose ``GET /metrics`` is ``handler`` (pages that change, or are big)."""
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def _serve(routes: dict[str, tuple[int, str]]) -> web.AppRunner:
    app = web.Application()
    for path, (status, body) in routes.items():

        async def handler(request: web.Request, s: int = status, b: str = body) -> web.Response:
            return web.Response(status=s, text=b)

        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.asyncio
async def test_scraper_reads_counters_with_timestamps() -> None:
    runner = await _serve({"/metrics": (200, SGLANG)})
    port = runner.addresses[0][1]
    scraper = MetricsScraper(
        f"http://127.0.0.1:{port}/", {"Authorization": "Bearer k", "Content-Type": "x"}
    )
    try:
        names = await scraper.open()
        assert names.generation == "sglang:generation_tokens_total"
        s = await scraper.scrape()
        assert (s.generation, s.prompt, s.requests) == (8.0, 7.0, 1.0)
        assert s.half_rtt_s >= 0 and s.t > 0
        assert scraper.page.headers == {"Authorization": "Bearer k"}
    finally:
        await scraper.close()
        await runner.cleanup()


FRESH_SGLANG = (
    "# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="m"} 0.0\n'
    "# TYPE sglang:num_queue_reqs gauge\n"
    'sglang:num_queue_reqs{model_name="m"} 0.0\n'
)
"""What SGLang 0.5.23 serves before its first request finished: gauges, none of the
per-request counters (tests/data/sglang-0.5.23/metrics.json, ``fresh``)."""


@pytest.mark.asyncio
async def test_a_fresh_sglang_reads_zero_until_its_counters_appear() -> None:
    """The counters are written first when a request finishes: before that they read 0 (a
    fresh managed server is not "a server without counters"); once seen, gone is an error."""
    pages = [FRESH_SGLANG, SGLANG, FRESH_SGLANG]

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=pages.pop(0) if len(pages) > 1 else pages[0])

    runner = await _serve_metrics(handler)
    scraper = MetricsScraper(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        names = await scraper.open()
        assert names.all == (
            "sglang:generation_tokens_total",
            "sglang:prompt_tokens_total",
            "sglang:num_requests_total",
        )
        first = await scraper.scrape()
        assert (first.generation, first.prompt, first.requests) == (8.0, 7.0, 1.0)
        with pytest.raises(ServerMetricsError, match="no longer shows"):
            await scraper.scrape()
    finally:
        await scraper.close()
        await runner.cleanup()
    fresh = MetricsScraper("http://127.0.0.1:1")
    fresh.names = names
    assert fresh._value(parse_metrics(FRESH_SGLANG), names.generation) == 0.0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "routes, expected",
    [
        (
            {},
            "/metrics answered 404: the server exposes no /metrics: launch SGLang with --enable-metrics "
            "(vLLM serves it by default) or drop --perf-server-metrics",
        ),
        (
            {"/metrics": (200, "python_gc_objects_collected_total 5\n")},
            "/metrics has no generation-token counter",
        ),
        ({"/metrics": (500, "boom")}, "/metrics answered HTTP 500 ('boom')"),
    ],
)
async def test_scraper_errors_name_the_url_and_the_fix(routes: dict, expected: str) -> None:
    runner = await _serve(routes)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    scraper = MetricsScraper(url)
    try:
        with pytest.raises(ServerMetricsError) as err:
            await scraper.open()
        assert str(err.value).startswith(url + "/metrics") and expected in str(err.value)
    finally:
        await scraper.close()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_scraper_connection_error_names_the_url() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scraper = MetricsScraper(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(
            ServerMetricsError,
            match=f"cannot read the server's counters at http://127.0.0.1:{port}/metrics",
        ):
            await scraper.open()
    finally:
        await scraper.close()


# ------------------------------------------------------------------ the size cap on a page


async def _serve_big(total: int, *, announce: bool) -> web.AppRunner:
    """A /metrics page of ``total`` bytes of comment lines: announced (Content-Length) or
    streamed in blocks without a length, like a proxy's or a label explosion's."""
    line = b"# padding: a page far larger than any server's metrics\n"
    block = line * (2**16 // len(line))

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        if announce:
            resp.content_length = total
        await resp.prepare(request)
        sent = 0
        try:
            while sent < total:
                chunk = block[: total - sent]
                await resp.write(chunk)
                sent += len(chunk)
            await resp.write_eof()
        except ConnectionError:
            pass  # the reader gave up: what the cap is for
        return resp

    return await _serve_metrics(handler)


@pytest.mark.asyncio
@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "chunked"])
async def test_a_page_over_the_cap_is_refused_with_its_reason(announce: bool) -> None:
    runner = await _serve_big(METRICS_MAX_BYTES + 2**20, announce=announce)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    scraper = MetricsScraper(url)
    probe = PrefixCacheProbe(url)
    try:
        with pytest.raises(MetricsTooLarge) as err:
            await scraper.open()
        assert str(err.value) == (
            f"{url}/metrics sent more than 16 MB, the cap on a metrics page (METRICS_MAX_BYTES; "
            "SGLang's and vLLM's are well under 1 MB): it was not read -- is something other "
            "than the server's Prometheus endpoint answering there?"
        )
        # the prefix-cache probe stops asking, and its level says why there is no hit rate
        await probe.start_level()
        assert await probe.end_level() == {"notes": [f"no prefix-cache hit rate: {err.value}"]}
        assert await probe.end_level() == {}  # said once
    finally:
        await scraper.close()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_a_page_within_the_cap_is_read_whole() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=SGLANG + "# " + "x" * 2**20 + "\n")  # a long comment line

    runner = await _serve_metrics(handler)
    scraper = MetricsScraper(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        await scraper.open()
        assert (await scraper.scrape()).generation == 8.0
    finally:
        await scraper.close()
        await runner.cleanup()


# ------------------------------------------------------------------- real sessions, simulator

AGREE = """
from pytest_kimi import throughput

# three waves of 512-token requests: a steady-state window of about a second, several samples
@throughput(concurrency=4, max_tokens=512, requests=12, trials={trials}, warmup=2)
def test_agree():
    pass
"""


@pytest.mark.parametrize("workers, trials", [(1, 2), (2, 1)], ids=["one-client", "sharded"])
def test_simulator_counts_agree_with_the_client(
    pytester: pytest.Pytester, chunked_sim_url: str, tmp_path: Path, workers: int, trials: int
) -> None:
    pytester.makepyfile(test_agree=AGREE.format(trials=trials))
    out = tmp_path / "perf.json"
    args = [f"--endpoint={chunked_sim_url}", "--perf-server-metrics", f"--perf-json={out}"]
    if workers > 1:  # worker processes stamp reads with the same system-wide perf_counter
        result = pytester.runpytest_subprocess(*args, f"--perf-workers={workers}")
    else:
        result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    tokens = trials * 12 * 512
    result.stdout.fnmatch_lines(
        ["*level*tok/s*server tok/s*server tokens*", f"*C=4*{tokens} (exact)*"]
    )
    (level,) = json.loads(out.read_text())["tests"][0]["levels"]
    server = level["server"]
    assert server["metric"] == "sglang:generation_tokens_total"
    assert server["tokens"] == server["client_tokens"] == tokens
    assert server["exact"] is True and server["counting"] == "per-token"
    # the rate check ran, and every trial's rates agreed within what the plugin allowed it:
    # the 2% tolerance plus that trial's measured scrape round trips and step granularity
    assert server["tok_s"] is not None
    rated = [t for t in server["trials"] if t["deviation_pct"] is not None]
    assert rated and all(abs(t["deviation_pct"]) <= t["allowed_pct"] for t in rated), rated
    assert all(t["allowed_pct"] >= server["tolerance_pct"] for t in rated)
    assert server["max_deviation_pct"] == pytest.approx(
        max(abs(t["deviation_pct"]) for t in rated), abs=1e-3
    )
    assert server["prompt_tokens"] == server["client_prompt_tokens"]
    assert server["requests"] == server["client_requests"] == trials * 12
    assert [t["trial"] for t in server["trials"]] == list(range(trials))
    assert level["verdict"] == "no-baseline"


DISAGREE = """
import json, threading, urllib.request
import pytest
from pytest_kimi import throughput

@pytest.fixture(scope="module", autouse=True)
def second_client(kimi_endpoint):
    # another user of the same server, generating all through the measurement
    stop = threading.Event()
    body = json.dumps({"model": kimi_endpoint.model, "prompt": "hi", "max_tokens": 64,
                       "ignore_eos": True}).encode()

    def hammer():
        while not stop.is_set():
            req = urllib.request.Request(kimi_endpoint.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(30)

@throughput(concurrency=2, max_tokens=64, requests=4, trials=1, warmup=0)
def test_shared():
    raise AssertionError("the body must not run when the measurement is invalid")
"""


def test_a_second_client_makes_the_level_invalid(
    pytester: pytest.Pytester, chunked_sim_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_shared=DISAGREE)
    monkeypatch.setenv("COLUMNS", "250")  # content, not layout: one line per reason
    out = tmp_path / "perf.json"
    result = pytester.runpytest(
        f"--endpoint={chunked_sim_url}", "--perf-server-metrics", f"--perf-json={out}"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*throughput measurement invalid:*",
            "*C=2 invalid: server counted * generation tokens (sglang:generation_tokens_total) during the "
            "trial, the client 256: another client is using this server, or the server counts differently*",
        ]
    )
    assert "the body must not run" not in result.stdout.str()
    (level,) = json.loads(out.read_text())["tests"][0]["levels"]
    assert level["verdict"] == "invalid" and level["trials_tok_s"] == []
    assert (
        level["server"]["exact"] is False
        and level["server"]["tokens"] > level["server"]["client_tokens"] == 256
    )


class _NoMetrics(BaseHTTPRequestHandler):
    """An OpenAI-compatible front that lists a model and has no /metrics (SGLang without
    --enable-metrics); it counts generation requests, which must never arrive."""

    posts = 0

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
        else:
            body = b'{"error": "Not Found"}'
            self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        type(self).posts += 1
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_without_metrics_fails_before_any_load(pytester: pytest.Pytester) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        pytester.makeini("[pytest]\nkimi_perf_server_metrics = true\n")  # the ini key works too
        pytester.makepyfile(
            """
            from pytest_kimi import throughput

            @throughput(concurrency=1, max_tokens=16, trials=1)
            def test_x():
                pass
            """
        )
        result = pytester.runpytest(f"--endpoint={url}")
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(
            [
                f"*--perf-server-metrics: {url}/metrics answered 404: the server exposes no /metrics: launch "
                "SGLang with --enable-metrics (vLLM serves it by default) or drop --perf-server-metrics*"
            ]
        )
        assert _NoMetrics.posts == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _packed_stream(
    index: int, sent: float, tokens: int, per_event: int, dt: float
) -> RequestRecord:
    """A stream whose server generates a token every ``dt`` and sends ``per_event`` at a time."""
    rec = RequestRecord(
        index=index, worker=0, scheduled=sent, sent=sent, status=200, completion_tokens=tokens
    )
    events = [sent + dt * (k + 1) * per_event for k in range(tokens // per_event)]
    rec.chunk_times = array("d", events)
    rec.chunk_events = array("I", [1] * len(events))  # one event carrying per_event tokens
    rec.first_token = events[0]
    rec.end = events[-1]
    return rec


def test_tokens_generated_before_a_streams_first_event_are_within_the_allowance() -> None:
    """A server that packs 8 tokens per event is up to 7 tokens ahead of the client for every
    stream in flight, including one that has not sent its first event yet: a span between two
    such moments differs from the client's by those tokens, and that is not another client."""
    dt, per_event, tokens = 0.01, 8, 64
    records = [
        _packed_stream(i, i * (tokens * dt + 0.002), tokens, per_event, dt) for i in range(6)
    ]
    tr = TrialRecords(records=records, started=0.0, ended=records[-1].end, concurrency=1)
    trial = summarize_trial(
        0, LevelSpec(1, None, tokens), tr, client=ClientSignals(), ignore_eos=True
    )
    generated = np.sort([r.sent + dt * (i + 1) for r in records for i in range(tokens)])

    def scrape(t: float) -> Scrape:
        return Scrape(
            t=t, half_rtt_s=0.001, generation=float(np.searchsorted(generated, t, "right"))
        )

    t1 = records[1].sent + 0.0005  # request 1 just sent: the client has every token so far
    t2 = records[3].sent + 7.5 * dt  # request 3 generated 7 tokens and sent none
    assert trial.window is not None and trial.window[0] < t1 < t2 <= trial.window[1]
    before, after = scrape(-0.01), scrape(records[-1].end + 0.01)
    mid = scrape(records[2].sent + 0.3)  # a stream mid-way tells how the counter counts
    check, reasons = check_trial(
        trial, before, [scrape(t1), mid, scrape(t2), after], after, metric="m"
    )
    assert check.exact is True and check.counting == "per-token" and check.window_samples == 3
    assert check.deviation_pct is not None and check.deviation_pct > RATE_TOLERANCE * 100 + 3
    assert reasons == [] and abs(check.deviation_pct) <= check.allowed_pct
    # Another client's 30 % more tokens over the same span still shows.
    busy = [
        Scrape(t=s.t, half_rtt_s=s.half_rtt_s, generation=s.generation + 30.0 * (s.t - t1))
        for s in (scrape(t1), mid, scrape(t2))
    ]
    _, reasons = check_trial(trial, before, [*busy, after], after, metric="m")
    assert reasons and "another client is using this server" in reasons[-1]
    assert check_trial(trial, before, [*busy, after], after, metric="m")[0].counter_behind is None
    # A counter 30 % behind what the client already received cannot be another client: the
    # trial is void for it, but replaceable (the reason is the check's counter_behind).
    first, last = scrape(t1), scrape(t2)
    short = 0.3 * (last.generation - first.generation)
    late = Scrape(t=last.t, half_rtt_s=last.half_rtt_s, generation=last.generation - short)
    assert late.generation >= mid.generation, "the counter still only rises"
    lagging, reasons = check_trial(trial, before, [first, mid, late, after], after, metric="m")
    assert lagging.deviation_pct is not None and lagging.deviation_pct < -lagging.allowed_pct
    assert reasons == [lagging.counter_behind] and "counter lagged" in reasons[0]
    # A client stall widens the allowance by what an end of the span can miss during it.
    trial.client = ClientSignals(lag_times=array("d", [t1 + 0.01]), lag_values=array("d", [0.05]))
    stalled, _ = check_trial(trial, before, [scrape(t1), mid, scrape(t2), after], after, metric="m")
    assert stalled.allowed_pct == pytest.approx(check.allowed_pct + 2 * 0.05 / (t2 - t1) * 100)
