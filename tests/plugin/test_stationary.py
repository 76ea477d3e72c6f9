"""The stationary trial protocol, the simulator's clock and the price of a measurement.

Logic only: what a stationary trial sends and keeps (staggered first requests, a token budget
that cuts the streams in flight, cut streams counted from their running usage), how its window
and tokens are computed, how the protocol keys baselines, and that every report states the
figures' clock and the server time used.  How close the figures come to the simulator's truth
is measured in ``tests/unit/measure/test_accuracy.py`` and ``bench/accuracy.py``; what a verdict costs in
``bench/verdict_cost.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from array import array
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target
from pytest_kimi.load.runner import LoadClient
from pytest_kimi.load.trial import TrialPlan
from pytest_kimi.load.workers import ShardedClient
from pytest_kimi.measure.steady_state import stationary_window, tokens_between
from pytest_kimi.measure.usage_checks import count_cut_tokens
from pytest_kimi.run.measurer import Measurer, build_spec
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import STATIONARY, WHOLE_REQUESTS, LevelSpec, MarkerError

pytest_plugins = ["pytester"]

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def body(max_tokens: int, *, running_usage: bool = True) -> bytes:
    options: dict[str, Any] = {"include_usage": True}
    if running_usage:
        options["continuous_usage_stats"] = True
    return json.dumps(
        {
            "model": "kimi-k2.6-sim",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": options,
            "ignore_eos": True,
        },
        separators=(",", ":"),
    ).encode()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(
        SimConfig(speed=10, stream_interval=8), log_dir=tmp_path_factory.mktemp("sim")
    ) as proc:
        yield proc


def get_json(url: str) -> Any:
    with _NO_PROXY.open(url, timeout=30) as resp:
        return json.load(resp)


# ---------------------------------------------------------------------- the marker


def test_protocol_is_chosen_per_level() -> None:
    closed = LevelSpec(concurrency=8, rate=None, max_tokens=64)
    opened = LevelSpec(concurrency=None, rate=2.0, max_tokens=64)
    plain, _ = parse_throughput((), {"concurrency": 8})
    assert plain.protocol_for(closed) == STATIONARY
    assert plain.protocol_for(closed, WHOLE_REQUESTS) == WHOLE_REQUESTS  # --perf-protocol
    assert plain.protocol_for(opened) is None  # open loop has its own window
    for sized in ({"requests": 16}, {"requests_per_stream": 2}, {"duration_s": 5}):
        workload, _ = parse_throughput((), {"concurrency": 8, **sized})
        assert workload.protocol_for(closed) == WHOLE_REQUESTS, sized
    forced, _ = parse_throughput((), {"concurrency": 8, "protocol": "whole-requests"})
    assert forced.protocol_for(closed, STATIONARY) == WHOLE_REQUESTS
    for judged in ({"max_e2e_s": 9}, {"max_ttft_s": 1, "min_goodput": 0.5}):
        workload, _ = parse_throughput((), {"concurrency": 8, **judged})
        assert workload.protocol_for(closed) == WHOLE_REQUESTS, judged  # whole requests


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"protocol": "stationary", "requests": 8}, "drop it, or use protocol='whole-requests'"),
        ({"protocol": "stationary", "max_e2e_s": 9}, "judges whole requests"),
        ({"protocol": "steady"}, "expected one of 'stationary', 'whole-requests'"),
    ],
)
def test_bad_protocol_arguments_name_the_fix(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(MarkerError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_throughput((), {"concurrency": 8, **kwargs})


# ---------------------------------------------------------------------- the simulator


def test_running_usage_rides_on_every_token_chunk(sim: SimProcess) -> None:
    """``continuous_usage_stats``: each write's token chunk carries the usage so far, as SGLang
    and vLLM send it, so a stream cut short still says how many tokens it had."""
    assert sim.url is not None
    seen: list[int] = []
    for running in (True, False):
        req = urllib.request.Request(
            sim.url + "/v1/chat/completions",
            data=body(40, running_usage=running),
            headers={"Content-Type": "application/json"},
        )
        with _NO_PROXY.open(req, timeout=30) as resp:
            events = [
                json.loads(line[6:])
                for line in resp.read().decode().split("\n\n")
                if line.startswith("data: {")
            ]
        tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
        counts = [e["usage"]["completion_tokens"] for e in tokens if e.get("usage")]
        if running:
            # the last token chunk of each write carries it (a busy writer may pack two)
            assert counts and counts == sorted(counts) and counts[-1] == 40
            assert tokens[-1].get("usage")
            seen = counts
        else:
            assert counts == []  # only the final usage-only chunk
    assert seen


def test_truth_endpoint_counts_the_steps_of_a_window(sim: SimProcess) -> None:
    assert sim.url is not None
    for bad in ("", "?start=1", "?start=2&end=1", "?start=x&end=2"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _NO_PROXY.open(sim.url + "/sim/truth" + bad, timeout=30)
        assert err.value.code == 400
    before = get_json(sim.url + "/sim/stats")
    empty = get_json(f"{sim.url}/sim/truth?start=0&end=1e-9")
    assert empty["tokens"] == 0 and empty["steps"] == 0
    everything = get_json(f"{sim.url}/sim/truth?start=0&end=1e12")
    assert everything["tokens"] <= before["generated_tokens"]
    assert everything["speed"] == 10
    assert before["busy_s"] >= 0.0


# ---------------------------------------------------------------------- the runner


async def _stationary_trial(url: str, workers: int) -> Any:
    target = Target(url=url + "/v1/chat/completions", headers={}, api="chat")
    c, budget = 8, 8 * 40
    plan = TrialPlan(
        concurrency=c,
        bodies=[body(400)],
        first_bodies=[body(10 * (w + 1)) for w in range(c)],
        first_max_tokens=[10 * (w + 1) for w in range(c)],
        token_budget=budget,
    )
    client: LoadClient | ShardedClient = ShardedClient(workers) if workers > 1 else LoadClient()
    async with client:
        return await client.run_trial(target, plan), budget


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stationary_trial_cuts_its_streams_at_the_budget(sim: SimProcess, workers: int) -> None:
    assert sim.url is not None
    tr, budget = asyncio.run(_stationary_trial(sim.url, workers))
    assert tr.cut_at is not None and tr.stopped_early is None
    cut = [r for r in tr.records if r.cut]
    done = [r for r in tr.records if not r.cut]
    assert len(cut) == 8  # one stream in flight per slot when the budget ran out
    assert all(r.error is None and r.end == pytest.approx(tr.cut_at, abs=1.0) for r in cut)
    # each stream opened with its own staggered request, in worker order
    first = {r.worker: r for r in sorted(tr.records, key=lambda r: r.index) if r.max_tokens}
    assert sorted(first) == list(range(8))
    assert all(first[w].max_tokens == 10 * (w + 1) for w in first)
    # a finished request ran to its max_tokens; the next one of its stream started at once
    assert all(r.completion_tokens == (r.max_tokens or 400) for r in done if r.ok)
    assert done, "the shortest first requests finish inside a 40-step budget"
    # the cut streams never got their final usage: their counts come from the running usage
    assert count_cut_tokens(tr.records) == 0
    counted = sum(r.completion_tokens for r in tr.records)
    assert counted >= budget  # cut after the budget was reached, not before
    assert all(0 < r.completion_tokens < (r.max_tokens or 400) for r in cut if r.chunk_times)


# ---------------------------------------------------------------------- the window


def _record(
    worker: int, times: list[float], events: list[int], tokens: int, *, cut: bool = False
) -> RequestRecord:
    rec = RequestRecord(index=worker, worker=worker, scheduled=0.0, sent=0.0, status=200)
    rec.chunk_times = array("d", times)
    rec.chunk_events = array("I", events)
    rec.first_token = times[0]
    rec.completion_tokens = tokens
    rec.cut = cut
    rec.end = times[-1]
    return rec


def test_tokens_between_interpolates_each_stream_between_its_reads() -> None:
    """Packed events (8 tokens each) arrive every 8 steps; a window boundary between two reads
    counts the tokens generated up to it, not all or nothing of the next read."""
    steps = [0.08 * k for k in range(1, 11)]  # a read every 8 steps of 10 ms: 80 tokens
    rec = _record(0, steps, [8] * 10, 80)
    assert tokens_between([rec], 0.08, 0.80) == pytest.approx(72)
    assert tokens_between([rec], 0.12, 0.52) == pytest.approx(40)  # half-way between reads
    assert tokens_between([rec], 0.0, 0.04) == pytest.approx(0)  # before its first read
    assert tokens_between([rec], 0.80, 2.0) == pytest.approx(0)  # after its last one


def test_count_cut_tokens_reads_the_last_running_usage_or_says_it_estimated() -> None:
    done = _record(0, [0.1, 0.2], [2, 2], 32)  # 8 tokens per event
    told = _record(1, [0.1, 0.2, 0.3], [1, 1, 1], 0, cut=True)
    told.last_read = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":21}}\n\n'
    silent = _record(2, [0.1, 0.2], [1, 1], 0, cut=True)
    assert count_cut_tokens([done, told, silent]) == 1
    assert told.completion_tokens == 21 and told.last_read == b""
    assert silent.completion_tokens == 16  # 2 events x the finished streams' 8 per event


def test_the_stationary_window_ends_before_the_earliest_cut_stream_went_quiet() -> None:
    a = _record(0, [0.01 * k for k in range(1, 101)], [1] * 100, 100, cut=True)
    b = _record(1, [0.01 * k for k in range(2, 96)], [1] * 94, 94, cut=True)
    start, end = stationary_window([a, b], cut_at=1.005)
    assert end == pytest.approx(0.95)  # b's last read: after it b's position is unknown
    # the last stream's first token, then 32 steps of 10 ms (more than the 0.1 s floor)
    assert start == pytest.approx(0.02 + 32 * 0.01)
    quick = [
        _record(w, [0.001 * k for k in range(1 + w, 501)], [1] * (500 - w), 500 - w, cut=True)
        for w in range(2)
    ]
    start, _ = stationary_window(quick, cut_at=0.6)
    assert start == pytest.approx(0.002 + 0.1)  # 32 steps of 1 ms: the wall floor holds


# ---------------------------------------------------------------------- end to end


def _measure(sim: SimProcess, protocol: str) -> Any:
    assert sim.url is not None
    session = Measurer()
    try:
        endpoint = session.discover(sim.url, api_key=None, model=None)
        workload, targets = parse_throughput(
            (), {"concurrency": 4, "max_tokens": 256, "trials": 2, "protocol": protocol}
        )
        spec = build_spec(endpoint, "t", workload, targets, rootdir=Path.cwd())
        return session.measure(spec)
    finally:
        session.close()


def test_figures_are_in_the_simulators_clock_and_the_price_is_stated(sim: SimProcess) -> None:
    """At speed 10 the wall-clock rate is ten times EP8's; the reported one is EP8's (the
    simulator's own clock), so a target means the same on the simulator and on the server."""
    result = _measure(sim, STATIONARY)
    (level,) = result.levels
    ep8 = SimConfig(stream_interval=8)
    wall = [t.tok_s for t in level.trials if t.tok_s is not None]
    assert wall and level.figures.trials_tok_s == pytest.approx([x / 10 for x in wall])
    # the window's truth lies within a few percent of the formula whatever the machine's load;
    # ten times it (the wall clock's figure) cannot
    assert level.figures.tok_s == pytest.approx(ep8.true_tok_s(4), rel=0.25)
    assert level.figures.itl_s_p50 == pytest.approx(ep8.step_time(4), rel=0.5)
    assert result.server_clock == {"kind": "simulator", "speed": 10.0}
    spent = level.server_time_s
    assert spent is not None
    assert spent >= sum(t.wall_s for t in level.trials) * 10 * 0.999
    assert result.server_time_s == pytest.approx(spent + result.warmup_server_time_s, abs=0.01)
    data = level.to_dict()
    assert data["protocol"] == STATIONARY
    whole = _measure(sim, WHOLE_REQUESTS).levels[0].to_dict()
    assert whole["protocol"] is None  # keyed as baselines recorded before 0.2 are
    assert math.isfinite(whole["tok_s"])


PERF_TEST = """
from pytest_kimi import throughput

@throughput(concurrency=4, max_tokens=128, trials=2)
def test_sweep():
    pass
"""


def test_reports_state_clock_and_price_and_protocols_never_mix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=PERF_TEST)
    args = ["-p", "no:cacheprovider", "--endpoint=sim:speed=10,stream_interval=8"]
    record = pytester.runpytest(
        *args,
        "--update-baselines",
        "--perf-max-trials=2",  # a baseline of the marker's trials: its protocol is the point
        "--perf-json=r.json",
        "--perf-markdown=r.md",
    )
    record.assert_outcomes(passed=1)
    record.stdout.fnmatch_lines(["*server time * s in the simulator's clock (wall x 10)*"])
    report = json.loads((pytester.path / "r.json").read_text())
    (test,) = report["tests"]
    assert test["server_time_s"] > 0 and test["server_clock"]["speed"] == 10
    assert all(lv["protocol"] == STATIONARY and lv["server_time_s"] > 0 for lv in test["levels"])
    assert "server time" in (pytester.path / "r.md").read_text()
    baseline = next((pytester.path / "baselines").rglob("test_sweep.yaml")).read_text()
    assert "protocol: stationary" in baseline
    again = pytester.runpytest(*args, "--perf-json=a.json", "--perf-server-metrics")
    again.assert_outcomes(passed=1)
    for lv in json.loads((pytester.path / "a.json").read_text())["tests"][0]["levels"]:
        server = lv["server"]  # counters beside a stationary trial: the rate check only
        assert server["exact"] is None and server["tok_s"] is not None
        # the rate check: each trial's counter slope against the client's rate over the same
        # span, within the bound the check derived from that trial's own scrapes and stalls (a
        # fixed 10% against the level's median read 253.8 vs 202.8 once with a core kept busy)
        checked = [t for t in server["trials"] if t["deviation_pct"] is not None]
        assert checked and all(abs(t["deviation_pct"]) <= t["allowed_pct"] for t in checked)
        assert any("the time box cut" in n for t in server["trials"] for n in t["notes"])
    verdicts = [
        lv["verdict"]
        for lv in json.loads((pytester.path / "a.json").read_text())["tests"][0]["levels"]
    ]
    assert "no-baseline" not in verdicts  # the same protocol finds its baseline
    other = pytester.runpytest(*args, "--perf-protocol=whole-requests", "--perf-json=o.json")
    other.assert_outcomes(passed=1)
    levels = json.loads((pytester.path / "o.json").read_text())["tests"][0]["levels"]
    assert [lv["verdict"] for lv in levels] == ["no-baseline"]
    assert any(
        "never compared with a run under another" in r for lv in levels for r in lv["reasons"]
    )
