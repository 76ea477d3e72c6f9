"""Figures from records: the steady-state window, token weighting, and what makes a trial invalid."""

from __future__ import annotations

import math
import random
from array import array

import pytest
from support.records import stream_record

from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.workload.workload_spec import LevelSpec
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import summarize_trial
from pytest_kimi.measure.steady_state import steady_window, tokens_in_steps, tokens_in_window
from pytest_kimi.measure.stream_timing import inter_token_latencies
from pytest_kimi.load.records import RequestRecord


_rec = stream_record


def _trial(records: list[RequestRecord], level: LevelSpec, **signals: float) -> tuple:
    tr = TrialRecords(records=records, started=0.0, ended=10.0, concurrency=level.concurrency or 1)
    return summarize_trial(0, level, tr, client=ClientSignals(**signals), ignore_eos=True)


def test_window_excludes_ramp_up_and_drain() -> None:
    # worker 1 starts 1 s late and worker 0 finishes first: only [1.0, 2.0] has both decoding
    recs = [_rec(0, 0.0, 201, 0.01), _rec(1, 1.0, 201, 0.01)]
    assert steady_window(recs) == pytest.approx((1.0, 2.0))
    assert tokens_in_window(recs, 1.0, 2.0) == pytest.approx(200)  # 100 each, [start, end)


def test_lone_stream_window_equals_its_decode_rate() -> None:
    rec = _rec(0, 0.0, 101, 0.01)
    start, end = steady_window([rec])
    assert tokens_in_steps([rec], start, end) / (end - start) == pytest.approx(rec.decode_tok_s)
    assert rec.decode_tok_s == pytest.approx(100.0)


def test_multi_token_events_are_weighted_by_usage() -> None:
    rec = _rec(0, 0.0, 400, 0.04, per_event=4)  # 100 reads of 4 tokens, 100 tok/s
    assert rec.tokens_per_event == 4
    assert rec.decode_tok_s == pytest.approx(396 / 3.96)
    assert float(inter_token_latencies([rec]).mean()) == pytest.approx(0.01)


def test_wrong_token_count_under_ignore_eos_is_invalid() -> None:
    level = LevelSpec(2, None, 64)
    recs = [_rec(0, 0.0, 64, 0.01, index=0), _rec(1, 0.0, 56, 0.01, index=1)]
    trial = _trial(recs, level)
    assert not trial.valid
    assert (
        "1 request(s) returned [56] tokens instead of max_tokens=64 under ignore_eos"
        in trial.invalid[0]
    )


def test_empty_200_is_invalid_not_a_failure() -> None:
    level = LevelSpec(2, None, 10)
    empty = RequestRecord(index=1, worker=1, scheduled=0, sent=0, status=200, end=0.5)
    trial = _trial([_rec(0, 0.0, 10, 0.01), empty], level)
    assert "1 request(s) answered 200 with no tokens" in trial.invalid
    assert trial.requests_failed == 1 and trial.errors == []


def test_saturated_client_inside_the_window_is_invalid_but_a_ramp_burst_is_not() -> None:
    level = LevelSpec(2, None, 101)
    recs = [_rec(0, 0.0, 101, 0.01), _rec(1, 0.0, 101, 0.01, index=1)]
    burst = dict(
        loop_lag_p99_s=0.05, lag_times=array("d", [-0.1, 0.5]), lag_values=array("d", [0.05, 0.001])
    )
    assert _trial(recs, level, **burst).valid
    busy = dict(
        loop_lag_p99_s=0.05,
        lag_times=array("d", [0.3, 0.5]),
        lag_values=array("d", [0.05, 0.04]),
        cpu_share=0.8,
    )
    trial = _trial(recs, level, **busy)
    assert not trial.valid and "load client saturated" in trial.invalid[0]


def test_stalled_client_is_invalid_only_when_a_stall_touches_the_window_edges() -> None:
    """A client at 5% CPU whose loop waited for a core reads late, but loses no token."""
    level = LevelSpec(2, None, 101)
    recs = [_rec(0, 0.0, 101, 0.01), _rec(1, 0.0, 101, 0.01, index=1)]
    start, end = steady_window(recs)
    mid = dict(
        loop_lag_p99_s=0.3,
        lag_times=array("d", [0.5, 0.6]),
        lag_values=array("d", [0.3, 0.05]),
        cpu_share=0.05,
    )
    trial = _trial(recs, level, **mid)
    assert trial.valid, trial.invalid
    assert any(
        e.startswith("note: load client stalled: its event loop waited up to 300 ms")
        and "tok/s is off by at most 0.00%" in e
        for e in trial.errors
    ), trial.errors
    edge = dict(
        loop_lag_p99_s=0.3,
        lag_times=array("d", [end, 0.6]),
        lag_values=array("d", [0.3, 0.05]),
        cpu_share=0.05,
    )
    trial = _trial(recs, level, **edge)
    assert not trial.valid and trial.invalid[0].startswith("load client stalled")
    assert (
        "could be off by up to 30.0% (more than 2%): give the client a quieter core"
        in trial.invalid[0]
    )


def test_late_sends_are_a_stall_when_the_client_was_idle_and_saturation_when_busy() -> None:
    """A send 50 ms late inside the window starves the server of a request either way; at 5%
    of a core the client waited for a CPU (the machine's moment: another trial may replace it),
    at 80% it ran out of one (the client's limit: shard it)."""
    level = LevelSpec(2, None, 51)
    second = _rec(0, 0.57, 51, 0.01, index=2)
    second.scheduled = 0.51  # worker 0's first stream ended then; it sent 50 ms later
    recs = [_rec(0, 0.0, 51, 0.01), _rec(1, 0.0, 51, 0.02, index=1), second]
    idle = _trial(recs, level, cpu_share=0.05)
    assert not idle.valid
    assert idle.invalid[0].startswith("load client stalled: its sends were late by 50.0 ms")
    assert idle.invalid[0].endswith("give the client a quieter core")
    assert idle.transient == idle.invalid
    busy = _trial(recs, level, cpu_share=0.8)
    assert not busy.valid and busy.invalid[0].startswith("load client saturated")
    assert busy.transient == []


def test_no_window_when_a_worker_ends_before_another_starts() -> None:
    trial = _trial(
        [_rec(0, 0.0, 11, 0.01), _rec(1, 5.0, 11, 0.01, index=1)], LevelSpec(2, None, 11)
    )
    assert trial.tok_s is None and "no steady-state window" in trial.invalid[0]


def test_a_trial_voided_by_a_client_stall_is_replaced_and_reported() -> None:
    """A stall is the moment's fault: the level runs another trial instead of going invalid."""
    import asyncio

    from pytest_kimi.load.request import Target
    from pytest_kimi.workload.workload_spec import Targets, Workload
    from pytest_kimi.measure.measure_spec import MeasureSpec, SendSpec
    from pytest_kimi.measure.trials import MAX_REPLACED_TRIALS, measure_level

    level = LevelSpec(2, None, 101)

    class StallingClient:
        """Two streams of 101 tokens per trial; the first ``stalls`` trials stall at the window's end."""

        def __init__(self, stalls: int) -> None:
            self.stalls = stalls
            self.calls = 0

        async def run_trial(self, target, plan, live=None) -> TrialRecords:
            self.calls += 1
            recs = [_rec(0, 0.0, 101, 0.01), _rec(1, 0.0, 101, 0.01, index=1)]
            lag_at = steady_window(recs)[1] if self.calls <= self.stalls else 0.5
            value = 0.3 if self.calls <= self.stalls else 0.001
            return TrialRecords(
                records=recs,
                started=0.0,
                ended=1.1,
                concurrency=2,
                client_cpu_s=0.05,
                loop_lag_p99_s=value,
                lag_times=array("d", [lag_at]),
                lag_values=array("d", [value]),
            )

    def spec() -> MeasureSpec:
        send = SendSpec(
            nodeid="t",
            target=Target("http://127.0.0.1:9/v1/chat/completions"),
            workload=Workload(levels=(level,), warmup=0),
            targets=Targets(),
            bodies={None: [b'{"max_tokens":0}']},
            prompts_keys={None: "k"},
        )
        return MeasureSpec(send, trials=3)

    client = StallingClient(stalls=1)
    result = asyncio.run(measure_level(client, spec(), level))
    assert result.verdict == "pass" and len(result.trials) == 3 and client.calls == 4
    assert result.replaced_trials[0].startswith("trial 1 replaced: load client stalled")
    assert any(e.startswith("note: trial 1 replaced: load client stalled") for e in result.errors)

    client = StallingClient(stalls=10)  # it keeps happening: the level says so
    result = asyncio.run(measure_level(client, spec(), level))
    assert result.verdict == "invalid" and client.calls == 3 + MAX_REPLACED_TRIALS
    assert result.reasons[0].startswith("load client stalled")


# ------------------------------------------------------------------ window ends on step boundaries


def _stepped(
    ends: list[float],
    streams: int,
    *,
    first: int = 1,
    last: int | None = None,
    read_s: float = 20e-6,
    tail_s: float = 0.0,
    every: int = 1,
    phase: list[int] | None = None,
) -> list[RequestRecord]:
    """C streams fed by one server: step ``k`` ends at ``ends[k]`` and hands every running
    stream a token; the client reads stream ``j`` ``j * read_s`` later (one burst per step).

    ``every``: tokens per event (``stream_interval``), stream ``j`` emitting on the steps where
    ``(k - first - phase[j]) % every == every - 1``; ``tail_s``: extra client time per stream
    spent on a stream's final read (usage, [DONE]), which stretches the last burst.
    """
    last = len(ends) - 1 if last is None else last
    recs = []
    for j in range(streams):
        p = 0 if phase is None else phase[j]
        steps = [
            k for k in range(first, last + 1) if (k - first - p) % every == every - 1 or k == last
        ]
        times = [ends[k] + j * read_s + (j * tail_s if k == last else 0.0) for k in steps]
        counts, prev = [], first - 1
        for k in steps:
            counts.append(k - prev)
            prev = k
        rec = RequestRecord(
            index=j,
            worker=j,
            scheduled=0.0,
            sent=0.0,
            first_token=times[0],
            status=200,
            completion_tokens=last - first + 1,
        )
        rec.chunk_times = array("d", times)
        rec.chunk_events = array(
            "I", [1] * len(times)
        )  # one event per read, as a packed server sends
        rec.end = times[-1]
        recs.append(rec)
    return recs


def test_window_counts_the_last_steps_tokens_of_every_stream() -> None:
    """C=8, 256 tokens from one step: the window holds 255 whole steps (255 * 8 tokens, not the
    254 * 8 + 1 a window ending at the first stream's last token held), stamped alike at both
    ends although the client spends longer on the last burst (usage, [DONE])."""
    step = 0.00233
    ends = [1.0 + k * step for k in range(257)]
    recs = _stepped(ends, 8, tail_s=80e-6)
    start, end = steady_window(recs)
    tokens = tokens_in_steps(recs, start, end)
    assert tokens == 255 * 8
    assert tokens / (end - start) == pytest.approx(8 / step, rel=1e-9)


def test_window_is_whole_steps_with_jittered_steps() -> None:
    rng = random.Random(7)
    durations = [0.004 * math.exp(rng.gauss(-0.045, 0.3)) for _ in range(300)]
    ends = [1.0 + sum(durations[:k]) for k in range(301)]
    recs = _stepped(ends, 16, first=3, last=290)
    start, end = steady_window(recs)
    tokens = tokens_in_steps(recs, start, end)
    assert tokens % 16 == 0
    steps = round(tokens / 16)
    # exactly the span of those steps: burst first reads, both stamped by stream 0
    assert (start, end) == pytest.approx((ends[3], ends[3 + steps]), abs=1e-12)
    assert 3 + steps == 290


def test_window_is_whole_bursts_with_packed_events() -> None:
    """stream_interval=4, every stream on the same steps: the window holds whole bursts."""
    step = 0.002
    ends = [1.0 + k * step for k in range(402)]
    recs = _stepped(ends, 8, last=400, every=4)
    for r in recs:
        assert r.tokens_per_event == pytest.approx(4)
    start, end = steady_window(recs)
    tokens = tokens_in_steps(recs, start, end)
    assert tokens == pytest.approx(99 * 8 * 4)
    assert tokens / (end - start) == pytest.approx(8 / step, rel=1e-9)


def test_window_with_packed_events_on_different_steps_is_within_one_event_per_stream() -> None:
    step = 0.002
    ends = [1.0 + k * step for k in range(402)]
    recs = _stepped(ends, 8, last=400, every=4, phase=[j % 4 for j in range(8)])
    start, end = steady_window(recs)
    rate = tokens_in_steps(recs, start, end) / (end - start)
    assert rate == pytest.approx(8 / step, rel=8 * 4 / (8 * 390))


def test_reads_without_pauses_keep_the_anchor() -> None:
    """A client that read continuously (no step visible) keeps the plain anchors."""
    late = 4 * 0.0004 + 10 * 0.002  # the last stream starts 10 reads after the others
    recs = [_rec(j, late if j == 4 else j * 0.0004, 200 + 10 * j, 0.002, index=j) for j in range(5)]
    start, end = steady_window(recs)
    assert start == pytest.approx(late) and end == pytest.approx(199 * 0.002)
