"""Every trial's window in the JSON (``trial_windows``), and each one's figure recomputable.

A third party holds the JSON alone: for each trial its window's bounds on the client's
monotonic clock, the offset to the wall clock, the tokens counted in it, its tok/s in the
server's clock, and whether it was kept or replaced.  ``tokens / (end - start) / speed`` must
give ``tok_s``; the kept, valid windows' figures must be the level's ``trials_tok_s`` in
order; a replaced trial must be there too.  The logic is pinned with a scripted client (a
stall that gets a trial replaced, a trial without a window, a capacity top-up's merge); a real
session against the simulator (a stationary sweep, an open-loop level, a capacity search)
checks the whole path to the file.
"""

from __future__ import annotations

import asyncio
import json
from array import array
from typing import Any

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.request import Target
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.measure import windows as windows_module
from pytest_kimi.measure.capacity_run import _merged
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import summarize_trial
from pytest_kimi.measure.steady_state import steady_window
from pytest_kimi.measure.results import LevelResult
from pytest_kimi.measure.measure_spec import MeasureSpec, SendSpec
from pytest_kimi.measure.trials import MAX_REPLACED_TRIALS, measure_level
from pytest_kimi.measure.windows import trial_window, unix_offset
from pytest_kimi.workload.workload_spec import LevelSpec, Targets, Workload
from support.records import stream_record

LEVEL = LevelSpec(2, None, 101)


_rec = stream_record


class StallingClient:
    """Two streams of 101 tokens a trial; the first ``stalls`` trials stall at the window's end
    (a transient reason: the level measures another trial instead)."""

    def __init__(self, stalls: int) -> None:
        self.stalls = stalls
        self.calls = 0

    async def run_trial(self, target: Any, plan: Any, live: Any = None) -> TrialRecords:
        self.calls += 1
        recs = [_rec(0, 0.0, 101, 0.01), _rec(1, 0.0, 101, 0.01, index=1)]
        window = steady_window(recs)
        assert window is not None
        stalled = self.calls <= self.stalls
        value = 0.3 if stalled else 0.001
        return TrialRecords(
            records=recs,
            started=0.0,
            ended=1.1,
            concurrency=2,
            client_cpu_s=0.05,
            loop_lag_p99_s=value,
            lag_times=array("d", [window[1] if stalled else 0.5]),
            lag_values=array("d", [value]),
        )


def _spec(clock: float = 1.0, trials: int = 3) -> MeasureSpec:
    send = SendSpec(
        nodeid="t",
        target=Target("http://127.0.0.1:9/v1/chat/completions"),
        workload=Workload(levels=(LEVEL,), warmup=0),
        targets=Targets(),
        bodies={None: [b'{"max_tokens":0}']},
        prompts_keys={None: "k"},
        clock=clock,
    )
    return MeasureSpec(send, trials=trials)


def _measured(stalls: int, clock: float = 1.0, trials: int = 3) -> LevelResult:
    return asyncio.run(measure_level(StallingClient(stalls), _spec(clock, trials), LEVEL))


def test_the_unix_offset_is_the_wall_clock_less_the_monotonic_one_read_as_a_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wall clock is read between two reads of the monotonic one, and set against their
    midpoint: the pair's own duration is the most it can be off."""

    class Clocks:
        monotonic = iter([10.0, 10.2])

        @staticmethod
        def perf_counter() -> float:
            return next(Clocks.monotonic)

        @staticmethod
        def time() -> float:
            return 1000.1

    monkeypatch.setattr(windows_module, "time", Clocks)
    assert unix_offset() == pytest.approx(990.0)


def test_every_trial_measured_has_a_window_the_replaced_one_too() -> None:
    level = _measured(stalls=1, clock=2.0)
    wins = level.trial_windows
    assert [w.trial for w in wins] == [0, 1, 2, 3]
    assert [w.kept for w in wins] == [False, True, True, True]
    assert wins[0].reason is not None and wins[0].reason.startswith("load client stalled")
    assert level.replaced_trials[0].startswith("trial 1 replaced: load client stalled")
    # the kept, valid windows are the level's samples, in order, in the server's clock
    assert [w.tok_s for w in wins if w.valid] == level.figures.trials_tok_s
    for w, trial in zip(wins[1:], level.trials):
        assert w.result is trial
        assert w.tok_s == pytest.approx(trial.tok_s / 2.0)
    for w in wins:
        assert w.start_monotonic is not None and w.end_monotonic is not None
        assert w.tokens / (w.end_monotonic - w.start_monotonic) / 2.0 == pytest.approx(w.tok_s)
        assert w.requests == 2 and w.cut == 0
        assert w.start_unix == pytest.approx(w.start_monotonic + w.unix_offset)
    data = level.to_dict()["trial_windows"]
    assert [d["kept"] for d in data] == [False, True, True, True]
    assert [d["tok_s"] for d in data if d["valid"]] == level.to_dict()["trials_tok_s"]
    assert "result" not in data[0]
    json.dumps(data)  # plain JSON


def test_a_level_whose_stalls_recur_keeps_every_window_and_says_which_counted() -> None:
    level = _measured(stalls=10)
    wins = level.trial_windows
    assert len(wins) == 3 + MAX_REPLACED_TRIALS
    assert [w.kept for w in wins] == [False] * MAX_REPLACED_TRIALS + [True] * 3
    assert not any(w.valid for w in wins) and level.verdict == "invalid"
    assert all(w.tok_s is not None for w in wins)  # each window's figure, voided or not


def test_a_trial_without_a_window_says_so() -> None:
    recs = [_rec(0, 0.0, 11, 0.01), _rec(1, 5.0, 11, 0.01, index=1)]
    tr = TrialRecords(records=recs, started=0.0, ended=10.0, concurrency=2)
    trial = summarize_trial(0, LEVEL, tr, client=ClientSignals(), ignore_eos=True)
    w = trial_window(trial, 0, kept=True, clock=1.0, offset=5.0)
    assert (w.start_monotonic, w.end_monotonic, w.start_unix, w.tok_s) == (None,) * 4
    assert not w.valid and w.reason is not None and "no steady-state window" in w.reason
    assert w.to_dict()["start_unix"] is None and w.to_dict()["requests"] == 2

    failed = [RequestRecord(index=0, worker=0, scheduled=0.0, status=500, error="boom")]
    tr = TrialRecords(records=failed, started=0.0, ended=1.0, concurrency=1)
    trial = summarize_trial(0, LEVEL, tr, client=ClientSignals(), ignore_eos=True)
    w = trial_window(trial, 0, kept=True, clock=1.0, offset=5.0)
    assert w.reason == "no steady-state window: no request of the trial succeeded"


def test_a_capacity_top_up_continues_the_trial_numbers() -> None:
    spec = _spec(trials=2)
    first = asyncio.run(measure_level(StallingClient(1), spec, LEVEL))
    more = asyncio.run(measure_level(StallingClient(0), spec, LEVEL))
    merged = _merged(first, more, spec)
    assert [w.trial for w in merged.trial_windows] == [0, 1, 2, 3, 4]
    assert [w.kept for w in merged.trial_windows] == [False, True, True, True, True]
    assert [w.trial for w in more.trial_windows] == [0, 1]  # the top-up's own left alone
    kept = [w.result for w in merged.trial_windows if w.kept]
    assert kept == merged.trials


# ------------------------------------------------------------------------- a real session

SUITE = """
from pytest_kimi import capacity, throughput

@throughput(concurrency=[1, 4], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass

@throughput(rate=4, requests=16, max_tokens=32, trials=2, warmup=1)
def test_open():
    pass

@capacity(max_e2e_s=5.0, concurrency=(1, 4), max_tokens=32, trials=2, max_levels=2, warmup=1)
def test_capacity():
    pass
"""


def _recomputed(w: dict[str, Any], speed: float) -> float:
    return float(w["tokens"] / (w["end_monotonic"] - w["start_monotonic"]) / speed)


def test_a_reports_windows_let_anyone_recompute_every_trial(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    out = pytester.path / "perf.json"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--endpoint=sim:speed=10,stream_interval=8",
        "--perf-history=off",
        f"--perf-json={out}",
    )
    result.assert_outcomes(passed=3)
    report = json.loads(out.read_text())
    tests = {t["nodeid"].split("::")[-1]: t for t in report["tests"]}
    assert set(tests) == {"test_sweep", "test_open", "test_capacity"}
    checked = 0
    for name, test in tests.items():
        speed = test["server_clock"]["speed"]
        assert speed == 10.0
        start, end = test["measured"]
        assert test["levels"], name
        for lv in test["levels"]:
            wins = lv["trial_windows"]
            where = (name, lv["label"], wins)
            replaced = lv.get("replaced_trials") or []
            assert len(wins) == lv["trials"] + len(replaced), where
            assert [w["trial"] for w in wins] == list(range(len(wins))), where
            assert sum(w["kept"] for w in wins) == lv["trials"], where
            # the level's samples are its kept, valid windows' figures, in order
            assert [w["tok_s"] for w in wins if w["valid"]] == lv["trials_tok_s"], where
            for w in wins:
                assert w["requests"] >= 1, where
                if w["start_monotonic"] is None:
                    continue
                # tok_s is tokens over the window, in the simulator's clock (to its rounding)
                assert abs(_recomputed(w, speed) - w["tok_s"]) <= 0.006, where
                # the wall clock of the window's start lies inside the measurement's span
                assert w["start_unix"] == pytest.approx(
                    w["start_monotonic"] + w["unix_offset"], abs=1e-5
                )
                assert start - 0.01 <= w["start_unix"] <= end + 0.01, (where, start, end)
                assert w["end_monotonic"] > w["start_monotonic"]
                checked += 1
            if lv["protocol"] == "stationary":  # the time box cuts the streams in flight
                assert all(w["cut"] >= 1 for w in wins if w["kept"]), where
            if lv["rate"] is not None:  # open loop: every request runs to its end
                assert all(w["cut"] == 0 for w in wins), where
    assert checked >= 2 * 2 + 2 + 2, checked  # sweep 2x2, open loop 2, capacity >= 1 level
