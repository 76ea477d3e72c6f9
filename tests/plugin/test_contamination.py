"""Contamination: zombies of cut streams and another client's load, from the server's gauges.

Real sessions against the simulator (one that keeps decoding what its client cut, one shared
with a second client), and the check against tiny ``/metrics`` servers whose gauges the test
sets: a count that does not drain, one that never moves (a gauge published late), none at all.
"""

from __future__ import annotations

import typing
import json
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import pytest
from aiohttp import web

from pytest_kimi import wire
from pytest_kimi.crosscheck.contamination import (
    DRAIN_MIN_S,
    ContaminationCheck,
    GaugeReader,
    Reading,
    excess_in_flight,
)
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult

pytest_plugins = ["pytester"]


# ------------------------------------------------------------------- real sessions, simulator

ZOMBIE = """
from pytest_kimi import throughput

# the stationary protocol cuts 16 streams at the end of every trial
@throughput(concurrency=16, max_tokens=256, trials=3, warmup=2)
def test_zombie():
    pass
"""


def test_zombies_of_cut_streams_are_waited_for_and_named(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A server that does not abort what its client cut: before the check, trials 2 and 3 shared
    their batch with trial 1's 16 cut streams and read 421 and 420 tok/s after trial 1's 521
    (``421 ±11.9%``, no-baseline, recordable); now each trial waits for them to drain, the
    trials agree, and the level names the zombies and the fix."""
    pytester.makepyfile(test_zombie=ZOMBIE)
    out = tmp_path / "perf.json"
    result = pytester.runpytest(
        "--endpoint=sim:speed=10,stream_interval=8,abort_on_disconnect=false",
        f"--perf-json={out}",
    )
    result.assert_outcomes(passed=1)
    (level,) = json.loads(out.read_text())["tests"][0]["levels"]
    assert level["verdict"] == "no-baseline"
    notes = [e for e in level["errors"] if e.startswith("note: zombies:")]
    assert len(notes) == 1, level["errors"]
    assert "requests the client had cut" in notes[0]
    assert "put no proxy in between, or use --perf-protocol=whole-requests" in notes[0]
    result.stdout.fnmatch_lines(["*note: C=16: zombies: the server kept decoding*"])
    entry = level["contamination"]
    assert entry["checked"] is True and entry["void"] == 0
    assert entry["gauges"] == ["sglang:num_running_reqs", "sglang:num_queue_reqs"]
    assert len(entry["drain_waits_s"]) >= 1  # the trials after a cut waited
    rates = level["trials_tok_s"]
    assert len(rates) == 3 and min(rates) / max(rates) > 0.9, rates  # was 0.81


SHARED = """
import json, re, threading, time, urllib.request
import pytest
from pytest_kimi import throughput

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

@pytest.fixture(scope="module", autouse=True)
def second_client(kimi_endpoint):
    # another user of the same server: three streams back to back all through the measurement
    stop = threading.Event()
    body = json.dumps({"model": kimi_endpoint.model, "prompt": "hi", "max_tokens": 64,
                       "ignore_eos": True}).encode()

    def hammer():
        while not stop.is_set():
            req = urllib.request.Request(kimi_endpoint.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            NO_PROXY.open(req, timeout=30).read()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the server has them before the test starts
        page = NO_PROXY.open(kimi_endpoint.url + "/metrics", timeout=30).read().decode()
        if float(re.search(r"^sglang:num_running_reqs\\S* (\\S+)", page, re.M).group(1)) >= 2:
            break
        time.sleep(0.02)
    yield
    stop.set()
    for t in threads:
        t.join(30)

@throughput(concurrency=2, max_tokens=64, trials=2, warmup=1)
def test_shared():
    raise AssertionError("the body must not run when the measurement is invalid")
"""


def test_a_second_client_is_named_in_the_levels_reasons(
    pytester: pytest.Pytester, chunked_sim_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients on one server: before the check the level passed on a figure the other
    client's requests shared (two such runs each read a false regression); now it is invalid,
    and says why, without --perf-server-metrics."""
    pytester.makepyfile(test_shared=SHARED)
    out = tmp_path / "perf.json"
    monkeypatch.setenv("COLUMNS", "250")  # content, not layout: one line per reason
    result = pytester.runpytest(f"--endpoint={chunked_sim_url}", f"--perf-json={out}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*throughput measurement invalid:*",
            "*C=2 invalid: foreign load: the server ran * requests this run did not send "
            "(another client on this server?)*",
        ]
    )
    assert "the body must not run" not in result.stdout.str()
    (level,) = json.loads(out.read_text())["tests"][0]["levels"]
    assert level["verdict"] == "invalid" and level["trials_tok_s"] == []
    assert level["contamination"]["void"] == 2
    assert not any("zombies" in r for r in level["reasons"])  # nothing of it was cut


# ------------------------------------------------------------- the check, tiny metrics servers


@dataclass
class Gauges:
    """What the tiny server's page says; ``moving``: its token counter rises at every read."""

    running: int | None = 0
    queued: int = 0
    moving: bool = False
    generated: float = 0.0
    status: int = 200


async def _serve(gauges: Gauges) -> tuple[web.AppRunner, str]:
    async def metrics(request: web.Request) -> web.Response:
        if gauges.status != 200:
            return web.Response(status=gauges.status, text="no such page")
        if gauges.moving:
            gauges.generated += 8
        lines = [f'sglang:generation_tokens_total{{model_name="m"}} {gauges.generated}']
        if gauges.running is not None:
            lines += [
                "# TYPE sglang:num_running_reqs gauge",
                f'sglang:num_running_reqs{{model_name="m"}} {gauges.running}',
                f'sglang:num_queue_reqs{{model_name="m"}} {gauges.queued}',
            ]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _record(i: int, sent: float, end: float, *, cut: bool = False) -> RequestRecord:
    return RequestRecord(index=i, worker=i, scheduled=sent, sent=sent, end=end, status=200, cut=cut)


def _trial(records: list[RequestRecord]) -> TrialResult:
    return TrialResult(
        index=0,
        label="C=4",
        tok_s=100.0,
        window_s=1.0,
        window_tokens=100.0,
        requests_ok=len(records),
        requests_failed=0,
        wall_s=1.0,
        client=ClientSignals(),
        records=records,
    )


async def _cut_trial(check: ContaminationCheck, cut: int) -> TrialResult:
    """A trial on an idle server whose ``cut`` streams the time box cut at its end."""
    await check.before_trial()
    t0 = perf_counter()
    trial = _trial([_record(i, t0, t0 + 0.05, cut=True) for i in range(cut)])
    await check.after_trial(trial)
    return trial


@pytest.mark.asyncio
async def test_cut_streams_that_do_not_drain_void_the_next_trial_as_zombies() -> None:
    gauges = Gauges()
    runner, url = await _serve(gauges)
    check = ContaminationCheck(url)
    try:
        await check.open()
        first = await _cut_trial(check, cut=4)
        assert first.invalid == []
        gauges.running, gauges.moving = 4, True  # still decoding the four it was cut from
        started = perf_counter()
        await check.before_trial()
        assert perf_counter() - started >= DRAIN_MIN_S  # it waited for them first
        second = _trial([])
        await check.after_trial(second)
        assert second.invalid == [
            "zombies: the server still ran 4 requests the client had cut (it does not abort "
            "requests whose client disconnected; put no proxy in between, or use "
            "--perf-protocol=whole-requests); found before the trial, still there after the "
            "wait for the server to drain (2x a request's length, at least 1 s)"
        ]
        assert second.transient == []  # another trial would meet the same server
        summary = check.level_summary()
        assert summary["contamination"]["void"] == 1
        assert len(summary["contamination"]["undrained_waits_s"]) == 1
        # every key it wrote is one the typed wire declares
        assert set(summary["contamination"]) <= set(
            typing.get_type_hints(wire.ContaminationSection)
        )
    finally:
        await check.close()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_load_beyond_what_was_cut_is_foreign() -> None:
    gauges = Gauges(running=3, queued=2, moving=True)  # another client, from the start
    runner, url = await _serve(gauges)
    check = ContaminationCheck(url)
    try:
        await check.open()
        first = await _cut_trial(check, cut=2)
        assert first.invalid == [
            "foreign load: the server ran 5 requests this run did not send (another client on "
            "this server?); found before the trial, still there after the wait for the server "
            "to drain (2x a request's length, at least 1 s)"
        ]
        gauges.running = 5  # 7 held: the other client's 5 and the 2 the trial cut
        second = _trial([])
        await check.before_trial()
        await check.after_trial(second)
        # the other client is still there: its count moves (5, then maybe 7), so the 2 the
        # trial cut cannot be told apart from it, and zombies are not claimed
        assert second.invalid[0].startswith(
            "foreign load: the server ran 7 requests this run did not send (another client on "
            "this server?); found before the trial"
        ), second.invalid
    finally:
        await check.close()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_a_gauge_that_never_moves_is_stale_not_load() -> None:
    """SGLang publishes its gauges when it logs: a count left over with nothing generated
    must not void a good trial (nor hold it for the whole drain wait)."""
    gauges = Gauges(running=6, moving=False)
    runner, url = await _serve(gauges)
    check = ContaminationCheck(url)
    try:
        await check.open()
        trial = await _cut_trial(check, cut=6)
        assert trial.invalid == []
        summary = check.level_summary()
        (note,) = summary["notes"]
        assert note.startswith("the server's request gauges read up to 6 with nothing moving")
        assert "taken for gauges published late, not load" in note
        assert summary["contamination"]["stale_gauges"] == 1
    finally:
        await check.close()
        await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "gauges, why",
    [
        (
            Gauges(status=404),
            "/metrics answered 404: the server exposes no /metrics (SGLang serves it with "
            "--enable-metrics, vLLM by default)",
        ),
        (
            Gauges(running=None),
            "/metrics has none of sglang:num_running_reqs, vllm:num_requests_running",
        ),
    ],
    ids=["no-metrics", "no-gauges"],
)
async def test_a_server_without_gauges_is_noted_once_per_level(gauges: Gauges, why: str) -> None:
    runner, url = await _serve(gauges)
    check = ContaminationCheck(url)
    try:
        await check.open()
        for _ in range(2):
            trial = await _cut_trial(check, cut=1)
            assert trial.invalid == []
        summary = check.level_summary()
        (note,) = summary["notes"]
        assert note == (
            f"contamination check not possible: {url}{why} (zombies of cut streams or another "
            "client's load on the server would go unnoticed)"
        )
        assert summary["contamination"] == {"checked": False, "why": f"{url}{why}"}
    finally:
        await check.close()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_vllm_gauges_are_summed_over_engines() -> None:
    page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        'vllm:generation_tokens_total{engine="0",model_name="m"} 77.0\n'
    )

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    reader = GaugeReader(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        await reader.open()
        reading = await reader.read()
        assert (reading.held, reading.generated) == (4, 77.0)
        assert reader.gauges == ("vllm:num_requests_running", "vllm:num_requests_waiting")
    finally:
        await reader.close()
        await runner.cleanup()


def _reading(t: float, held: int) -> Reading:
    return Reading(sent=100.0 + t, got=100.001 + t, held=held, generated=None)


def test_scrapes_during_the_trial_are_set_against_the_clients_own_requests() -> None:
    # two streams over [0, 10] s; a third request of the client's ended at 4.9 s (the
    # perf_counter clock, offset: a record's 0 means "never sent")
    records = [_record(0, 100.0, 110.0), _record(1, 100.0, 110.0), _record(2, 101.0, 104.9)]
    assert excess_in_flight(records, [_reading(3.0, 3), _reading(6.0, 2)]) is None
    # a gauge that lags the client's end by a moment is not load
    assert excess_in_flight(records, [_reading(5.0, 3)]) is None
    # more than the client had at any instant of the gauge's lag: another client's
    assert excess_in_flight(records, [_reading(6.0, 2), _reading(7.0, 5)]) == (3, 0)
    # scrapes before the first send or after the last end say nothing of the trial
    assert excess_in_flight(records, [_reading(-1.0, 9), _reading(11.0, 9)]) is None
    # a request the client closed early (timed out) before the scrape may still be running
    records[2].error = "timeout"
    assert excess_in_flight(records, [_reading(7.0, 3)]) == (1, 1)
