"""A trial's wall-clock limit: a stream that sends bytes but no tokens ends in bounded time.

Before the limit, a server whose streams went on with keep-alive comments held a stationary
trial forever: the silence timeout never fired and the token budget never filled.  Now the
runner cuts the trial at its limit (the streams in flight kept as cut records), the trial is
void with a reason that names the limit, and the level stops there.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_kimi.load.openloop import OpenLoopPlan
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target
from pytest_kimi.load.runner import LoadClient
from pytest_kimi.load.trial import TrialPlan, TrialRecords
from pytest_kimi.load.workers import ShardedClient
from pytest_kimi.measure.measure_spec import MeasureSpec, SendSpec
from pytest_kimi.measure.pace import Pace
from pytest_kimi.measure.trial_limits import (
    OVER_LIMIT,
    TRIAL_LIMIT_FACTOR,
    TRIAL_LIMIT_SLACK_S,
    trial_limit,
)
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.workload.markers import parse_throughput

pytest_plugins = ["pytester"]

HANG = """
from pytest_kimi import throughput

# 256 tokens: a stationary box of 41 steps a stream (1 + 8 settling + a 32-step window), and
# whole requests of 256, more than the 20 tokens a stream gets; short, because the limit this
# waits for is 4x the expected trial plus 5 s
@throughput(concurrency=2, max_tokens=256, trials=3, warmup=2)
def test_hang():
    pass
"""


@pytest.mark.parametrize("protocol", ["stationary", "whole-requests"])
def test_a_stream_of_keepalives_ends_at_the_trials_limit(
    pytester: pytest.Pytester, tmp_path: Path, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_hang=HANG)
    monkeypatch.setenv("COLUMNS", "250")  # content, not layout: one line per reason
    out = tmp_path / "perf.json"
    result = pytester.runpytest(
        # every stream turns to keep-alive comments after 20 tokens (the warm-up's 16 pass)
        "--endpoint=sim:speed=10,keepalive_after_tokens=20",
        f"--perf-protocol={protocol}",
        f"--perf-json={out}",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*throughput measurement invalid:*",
            f"*C=2 invalid: {OVER_LIMIT} of * s ({TRIAL_LIMIT_FACTOR:g}x the * s expected from "
            f"the server's pace so far, plus {TRIAL_LIMIT_SLACK_S:g} s): its 2 stream(s) in "
            "flight were cut; the server did not finish the trial's work in time*",
        ]
    )
    (level,) = json.loads(out.read_text())["tests"][0]["levels"]
    assert level["verdict"] == "invalid"
    assert level["trials"] == 1  # the level stopped there: the next trial would hang as long


# ------------------------------------------------------------------ the runner cuts, keeps


@pytest.fixture(scope="module")
def hanging_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(
        SimConfig(speed=10, keepalive_after_tokens=4), log_dir=tmp_path_factory.mktemp("sim")
    ) as proc:
        yield proc


def _body(max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": "kimi-k2.6-sim",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": True,
        },
        separators=(",", ":"),
    ).encode()


def _target(sim: SimProcess) -> Target:
    return Target(url=sim.url + "/v1/chat/completions", headers={}, api="chat")


def _check_cut(tr: TrialRecords, limit_s: float, requests: int) -> None:
    assert tr.over_limit_s == limit_s
    assert tr.cut_at is not None and tr.cut_at - tr.started >= limit_s
    assert len(tr.records) == requests
    for r in tr.records:  # what each stream received survived the cut
        # (cut_at: the earliest cut; a sharded trial's processes cut each at its own limit)
        assert r.cut and r.ok and r.end >= tr.cut_at
        assert r.events == 4 and r.first_token is not None


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-client", "sharded"])
def test_a_closed_loop_is_cut_at_its_wall_limit(hanging_sim: SimProcess, workers: int) -> None:
    plan = TrialPlan(
        concurrency=2, bodies=[_body(64)], requests=4, timeout_s=60.0, wall_limit_s=1.0
    )

    async def go() -> TrialRecords:
        client = ShardedClient(workers) if workers > 1 else LoadClient()
        async with client:
            return await client.run_trial(_target(hanging_sim), plan)

    _check_cut(_run(go()), 1.0, requests=2)  # one request per stream went out, none ended


def test_an_open_loop_is_cut_at_its_wall_limit(hanging_sim: SimProcess) -> None:
    # all three arrivals are due at once (a high rate): three streams in flight at the limit
    plan = OpenLoopPlan(
        rate=1000.0, bodies=[_body(64)], requests=3, timeout_s=60.0, wall_limit_s=1.0
    )

    async def go() -> TrialRecords:
        async with LoadClient() as client:
            return await client.run_open_loop(_target(hanging_sim), plan)

    _check_cut(_run(go()), 1.0, requests=3)


def test_a_stationary_budget_that_never_fills_is_cut_at_the_limit(hanging_sim: SimProcess) -> None:
    plan = TrialPlan(
        concurrency=2, bodies=[_body(64)], token_budget=10_000, timeout_s=60.0, wall_limit_s=1.0
    )

    async def go() -> TrialRecords:
        async with LoadClient() as client:
            return await client.run_trial(_target(hanging_sim), plan)

    _check_cut(_run(go()), 1.0, requests=2)


@pytest.mark.parametrize("limit", [0.0, -1.0, float("inf"), float("nan")])
def test_a_limit_must_be_positive_seconds(limit: float) -> None:
    with pytest.raises(ValueError, match="wall_limit_s must be a positive number of seconds"):
        TrialPlan(concurrency=1, bodies=[b"{}"], requests=1, wall_limit_s=limit)
    with pytest.raises(ValueError, match="wall_limit_s must be a positive number of seconds"):
        OpenLoopPlan(rate=1.0, bodies=[b"{}"], requests=1, wall_limit_s=limit)


# ------------------------------------------------------------------ where the limit comes from


def _spec(**marker: Any) -> MeasureSpec:
    workload, targets = parse_throughput((), {"max_tokens": 100, "timeout_s": 30, **marker})
    send = SendSpec(
        nodeid="t",
        target=Target(url="http://127.0.0.1:1/v1/chat/completions", headers={}, api="chat"),
        workload=workload,
        targets=targets,
        bodies={None: [b"{}"]},
        prompts_keys={None: "k"},
    )
    return MeasureSpec(send)


def test_the_limit_follows_the_levels_trial_before_the_pace_or_the_timeout() -> None:
    spec = _spec(concurrency=[8], protocol="whole-requests", requests=16)
    level = spec.send.workload.levels[0]
    # nothing seen yet: a stream's two requests may each take the request timeout
    first = trial_limit(spec, level)
    assert (first.expected_s, first.factor) == (60.0, 1.0)
    assert first.limit_s == 60.0 + TRIAL_LIMIT_SLACK_S
    # at the pace of a warm-up with 2 streams (10 ms a token, 0.2 s to the first) the 8
    # streams' requests are priced 4x slower: linear in the batch, more than a server's step grows
    spec.state.pace = Pace(token_s=0.01, ttft_s=0.2, streams=2)
    paced = trial_limit(spec, level)
    assert paced.expected_s == pytest.approx(2 * 4 * (100 * 0.01 + 0.2))
    assert paced.limit_s == pytest.approx(
        TRIAL_LIMIT_FACTOR * paced.expected_s + TRIAL_LIMIT_SLACK_S
    )
    # the level's own trial before says it best
    assert trial_limit(spec, level, previous_s=3.0).expected_s == 3.0
    # stationary: the time box's steps (and never under its minimum duration)
    box = trial_limit(_spec(concurrency=[2]), _spec(concurrency=[2]).send.workload.levels[0])
    assert box.source == "the request timeout" and box.expected_s > 30.0


def test_the_pace_is_read_from_whole_requests() -> None:
    def rec(i: int, sent: float, tokens: int) -> RequestRecord:
        r = RequestRecord(index=i, worker=i, scheduled=sent, sent=sent, status=200)
        r.first_token = sent + 0.1
        for k in range(tokens):
            r.chunk_times.append(sent + 0.1 + 0.01 * k)
            r.chunk_events.append(1)
        r.end = r.chunk_times[-1]
        r.completion_tokens = tokens
        return r

    tr = TrialRecords(
        records=[rec(0, 10.0, 11), rec(1, 10.0, 11)], started=10.0, ended=11.0, concurrency=2
    )
    pace = Pace.of(tr)
    assert pace is not None
    assert pace.token_s == pytest.approx(0.01) and pace.ttft_s == pytest.approx(0.1)
    assert pace.streams == 2
    cut = TrialRecords(records=[], started=0.0, ended=1.0, concurrency=2)
    assert Pace.of(cut) is None
