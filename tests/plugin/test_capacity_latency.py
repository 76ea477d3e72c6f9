"""A capacity probe's latencies: the per-request ITL, client stalls re-measured, jitter noted.

Unit tests on plain request records (``pytest_kimi/measure/capacity_latency.py``): a client
that reads late moves the per-gap ITL percentile but not each request's mean; a stall at the
reads a probe is judged on voids the trial for the moment, so the level measures another
instead of counting it ``broke``; a per-gap ITL tail far above its median is noted in the
level's reasons and the capacity's.  Then one session against the simulator with uneven steps
(``step_jitter``), whose per-gap ITL tail is wide while each request's mean is the step's:
the note reaches the terminal and the capacity is still the simulator's.  What these
statistics measure on the simulator is ``bench/capacity.py jitter`` and ``truth``
(``docs/evidence/accuracy.md``, *Capacity under an ITL ceiling*).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from array import array
from typing import Any, Sequence

import pytest

from pytest_kimi.gate.capacity_gate import capacity_key, explain_miss, judge_capacity
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.capacity_latency import (
    JITTER_RATIO,
    ProbeStallCheck,
    jitter,
    probe_latencies,
    stall_reason,
)
from pytest_kimi.measure.capacity_levels import SearchSettings
from pytest_kimi.measure.capacity_run import _label_level, outcome_of
from pytest_kimi.measure.capacity_search import CapacitySearch
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, level_figures
from pytest_kimi.measure.results import judge_level
from pytest_kimi.measure.trials import _replaceable
from pytest_kimi.report.capacity_cells import capacity_lines, note_text
from pytest_kimi.baseline import CapacityBaseline, Provenance, TestBaseline, WorkloadKey
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.capacity_marker import parse_capacity

pytest_plugins = ["pytester"]

GAP = 0.005
"""Wall seconds per token: the simulator's 50 ms step at speed 10."""


def record(
    i: int,
    start: float,
    gaps: int = 100,
    late: Sequence[int] = (),
    delay: float = 0.0,
    ttft: float = 0.01,
) -> RequestRecord:
    """A request of ``gaps + 1`` one-token reads ``GAP`` apart, the reads in ``late`` stamped
    ``delay`` late (the client read them late; the tokens had come on time)."""
    times = [start + ttft + k * GAP for k in range(gaps + 1)]
    for k in late:
        times[k] += delay
    rec = RequestRecord(index=i, worker=i, scheduled=start, sent=start)
    rec.first_token = times[0]
    rec.chunk_times = array("d", times)
    rec.chunk_events = array("I", [1] * len(times))
    rec.completion_tokens = len(times)
    rec.end = times[-1] + 0.001
    rec.status = 200
    return rec


def trial(records: list[RequestRecord], client: ClientSignals | None = None) -> TrialResult:
    return TrialResult(
        index=0,
        label="C=40",
        tok_s=1000.0,
        window_s=1.0,
        window_tokens=1000.0,
        requests_ok=len(records),
        requests_failed=0,
        wall_s=1.0,
        client=client or ClientSignals(),
        records=records,
        window=(0.0, 1.0),
    )


def lagging(stalls: Sequence[tuple[float, float]]) -> ClientSignals:
    """Lag samples every 5 ms over two seconds, ``(at, seconds)`` the stalls among them."""
    times = [k * 0.005 for k in range(400)]
    values = [0.0002] * len(times)
    for at, lag in stalls:
        times.append(at)
        values.append(lag)
    order = sorted(range(len(times)), key=times.__getitem__)
    return ClientSignals(
        loop_lag_max_s=max(values),
        lag_times=array("d", [times[k] for k in order]),
        lag_values=array("d", [values[k] for k in order]),
    )


# ------------------------------------------------------------------------------ the statistic


def test_each_requests_mean_itl_ignores_late_reads_that_the_gap_percentile_counts() -> None:
    """Every tenth read stamped 40% of a gap late (the tokens waited in the socket): the per-gap
    p95 reads the delay, each request's mean does not, its first and last reads being on time."""
    late = range(5, 100, 10)
    records = [record(i, 0.001 * i, late=late, delay=0.4 * GAP) for i in range(40)]
    t = trial(records)
    per_request = probe_latencies([t], ["itl_s"], 95, clock=10)["itl_s"]
    per_gap = probe_latencies([t], ["itl_s"], 95, clock=10, itl="token")["itl_s"]
    assert per_request == pytest.approx(GAP * 10, rel=1e-9)
    assert per_gap == pytest.approx(1.4 * GAP * 10, rel=1e-6)
    # the level's own figure is the per-gap one
    assert level_figures([t], 95, clock=10).itl_s_pct == pytest.approx(per_gap)
    tail = jitter([t], 95, clock=10)
    assert tail is not None and tail.ratio == pytest.approx(1.4, rel=1e-6)
    assert tail.warning() is not None and "per-gap ITL p95 1.40x its median" in tail.warning()
    even = jitter([trial([record(i, 0.001 * i) for i in range(40)])], 95)
    assert even is not None and even.ratio == pytest.approx(1.0) and even.warning() is None


def test_requests_with_few_gaps_are_left_out_unless_none_has_more() -> None:
    """A stream cut two reads after it started has a mean of two gaps: here both late, which
    among 20 requests would be the p95; left out, the p95 is the step.  A level of short
    requests only still has an ITL: theirs."""
    long = [record(i, 0.0) for i in range(19)]
    short = record(19, 0.0, gaps=2, late=[2], delay=2 * GAP)
    got = probe_latencies([trial([*long, short])], ["itl_s"], 95)["itl_s"]
    assert got == pytest.approx(GAP)
    only_short = probe_latencies([trial([short])], ["itl_s"], 95)["itl_s"]
    assert only_short == pytest.approx(2 * GAP)


def test_ttft_and_end_to_end_are_the_levels_own_figures() -> None:
    records = [record(i, 0.001 * i, ttft=0.01 + 0.0005 * i) for i in range(30)]
    t = trial(records)
    mine = probe_latencies([t], ["ttft_s", "e2e_s"], 90, clock=10)
    theirs = level_figures([t], 90, clock=10)
    assert mine["ttft_s"] == pytest.approx(theirs.ttft_s_pct)
    assert mine["e2e_s"] == pytest.approx(theirs.e2e_s_pct)


# ------------------------------------------------------------------------------------ stalls

CEILINGS = {"itl_s": 0.05}


def test_a_stall_at_the_reads_a_probe_is_judged_on_voids_its_trial_for_the_moment() -> None:
    """A 60 ms stall over the last reads of four requests in forty (each 100 gaps of 5 ms, so
    +12% each): the trial's request-ITL p95 rises past the ceiling.  The check voids the trial
    as transient, which ``measure_level`` replaces; the reason says how much it moved."""
    end = 0.01 + 100 * GAP  # the last read of a request sent at 0
    stalled = [record(i, 0.0, late=[100], delay=0.06) for i in range(4)]
    fine = [record(i, 0.7) for i in range(4, 40)]
    t = trial([*stalled, *fine], lagging([(end + 0.06, 0.06)]))
    assert probe_latencies([t], ["itl_s"], 95, clock=10)["itl_s"] > CEILINGS["itl_s"]
    why = stall_reason(t, CEILINGS, 95, clock=10)
    assert why is not None and "load client stalled" in why and "60 ms" in why
    assert "4 request(s)" in why and "from 0.05 to 0.056 s (+12.0%" in why, why
    check = ProbeStallCheck(None, CEILINGS, 95, 10, "request")
    asyncio_run(check.after_trial(t))
    assert t.invalid == [why] and t.transient == [why] and _replaceable(t)


def test_stalls_that_miss_the_judged_reads_or_are_short_leave_the_trial_alone() -> None:
    # the same stall in the middle of the requests: their spans, and their means, are unmoved
    mid = 0.01 + 50 * GAP
    records = [record(i, 0.0, late=[50], delay=0.06) for i in range(4)]
    records += [record(i, 0.7) for i in range(4, 40)]
    assert stall_reason(trial(records, lagging([(mid + 0.06, 0.06)])), CEILINGS, 95) is None
    # at their last reads but 15 ms, under the 20 ms a stall takes (jitter, noted elsewhere)
    end = 0.01 + 100 * GAP
    records = [record(i, 0.0, late=[100], delay=0.015) for i in range(4)]
    records += [record(i, 0.7) for i in range(4, 40)]
    assert stall_reason(trial(records, lagging([(end + 0.015, 0.015)])), CEILINGS, 95) is None
    # no lag samples: nothing to place a stall with
    assert stall_reason(trial(records), CEILINGS, 95) is None


def test_a_trial_void_for_good_is_not_made_replaceable() -> None:
    end = 0.01 + 100 * GAP
    records = [record(i, 0.0, late=[100], delay=0.06) for i in range(4)]
    records += [record(i, 0.7) for i in range(4, 40)]
    t = trial(records, lagging([(end + 0.06, 0.06)]))
    t.invalid.append("load client saturated")
    asyncio_run(ProbeStallCheck(None, CEILINGS, 95, 10, "request").after_trial(t))
    assert t.invalid == ["load client saturated"] and not _replaceable(t)


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


# ----------------------------------------------------------------- into the search and reports


def level_of(c: int, records: list[RequestRecord], replaced: Sequence[str] = ()) -> Any:
    spec, workload, targets = parse_capacity(
        (), {"max_itl_s": 0.05, "concurrency": (1, 128), "max_tokens": 100}
    )
    level_spec = dataclasses.replace(workload.levels[0], concurrency=c)
    level = judge_level(level_spec, workload, targets, [trial(records)], "builtin", clock=10)
    level.replaced_trials = list(replaced)
    return spec, workload, level


def test_jitter_and_re_measured_trials_reach_the_level_and_the_capacity() -> None:
    """C=40 held with its per-gap tail 1.4x its median and one trial re-measured; C=44 broke
    with even reads: the jitter note is in C=40's reasons, its cells and the capacity's
    reasons (C=40 is an end of the bracket), the re-measured trial too; C=44 says nothing."""
    late = range(5, 100, 10)
    jittery = [record(i, 0.001 * i, late=late, delay=0.4 * GAP) for i in range(40)]
    slower = [record(i, 0.0) for i in range(44)]
    for r in slower:  # 5.5 ms a token: ITL 55 ms in the simulator's clock
        r.chunk_times = array("d", [r.chunk_times[0] + k * 0.0055 for k in range(101)])
    replaced = ["trial 2 replaced: load client stalled: ..."]
    spec, workload, held = level_of(40, jittery, replaced)
    _, _, broke = level_of(44, slower)
    settings = SearchSettings("concurrency", 1, 128, spec.ceilings)
    search = CapacitySearch(settings)
    judged = {}
    for c, level in ((40, held), (44, broke)):
        judged[c] = search.tell(float(c), outcome_of(level, settings))
        _label_level(level, judged[c], settings)
    assert judged[40].held is True and judged[44].held is False
    assert judged[40].jitter is not None and judged[40].jitter > JITTER_RATIO
    assert judged[44].jitter == pytest.approx(1.0, abs=0.01)
    assert judged[40].replaced == 1 and judged[44].replaced == 0
    assert held.verdict == "held" and any("client jitter" in r for r in held.reasons)
    assert any("re-measured" in r for r in held.reasons)
    assert broke.reasons == ["ITL p95 0.055 s > max_itl_s 0.05 (each request's mean ITL)"]
    row = note_text(judged[40].to_dict())
    assert "client jitter: ITL p95/p50 1.40" in row and "1 trial(s) re-measured" in row
    assert note_text(judged[44].to_dict()) == ""
    estimate = search.estimate()
    verdict = judge_capacity(estimate, spec, None, None, GateSettings())
    notes = [r for r in verdict.reasons if r.startswith("note:")]
    assert any("client jitter at C=40" in r and "averages it out" in r for r in notes), notes
    assert any("1 trial(s) at C=40 were measured again" in r for r in notes), notes
    # the jitter note tells a TTFT ceiling that it is exposed
    with_ttft = dataclasses.replace(spec, ceilings={**spec.ceilings, "ttft_s": 1.0})
    exposed = judge_capacity(estimate, with_ttft, None, None, GateSettings()).reasons
    assert any("TTFT carries it into the capacity" in r for r in exposed), exposed


def test_a_capacity_judged_on_each_requests_itl_is_another_number_than_one_per_gap() -> None:
    spec, workload, _ = parse_capacity((), {"max_itl_s": 0.05, "max_tokens": 100})
    key = capacity_key(spec, workload, "builtin", "stationary")
    assert key["itl"] == "request"
    e2e, e2e_workload, _ = parse_capacity((), {"max_e2e_s": 5.0, "max_tokens": 100})
    assert "itl" not in capacity_key(e2e, e2e_workload, "builtin", "stationary")
    old = {k: v for k, v in key.items() if k != "itl"}
    stored = TestBaseline(
        test="tests/perf/test_slo.py::test_capacity",
        profile="p",
        provenance=Provenance(),
        levels=(),
        capacity=CapacityBaseline(WorkloadKey.from_dict(old), 40.0, 44.0, 41.0, 0.01, 0.5),
    )
    assert "itl (unset) -> request" in explain_miss(stored, key)


# -------------------------------------------------------------------------- a real session

JITTER_TEST = """
from pytest_kimi import capacity

@capacity(max_itl_s=0.05, concurrency=(16, 64), max_tokens=256)
def test_capacity(capacity_result):
    pass
"""


def test_uneven_steps_are_noted_and_the_capacity_is_still_the_simulators(
    pytester: pytest.Pytester,
) -> None:
    """``step_jitter=0.15``: each step's time is log-normal around the profile's (its mean
    kept), so the per-gap ITL p95 is 1.28x its median from the steps alone (1.7-2.2 measured
    with the client's own jitter at speed 10), while a request's mean over its 255 steps stays
    near the step's.  The note is in the terminal, the levels' JSON and the capacity's reasons;
    the boundary is within 10% of the simulator's (41.2: where its mean time per token, the step
    plus its share of the admissions' prefill, passes 50 ms; measured 39.4-40.2, where judging
    the per-gap p95 put even steps' boundary at C=28-31)."""
    pytester.makepyfile(test_jitter=JITTER_TEST)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--perf-json=r.json",
        "--endpoint=sim:speed=10,step_jitter=0.15",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*held: note: client jitter: per-gap ITL p95 *x its median*"])
    result.stdout.fnmatch_lines(["*capacity no-baseline: note: client jitter at C=*"])
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    cap = test["capacity"]
    assert cap["workload"]["itl"] == "request" and cap["stop"] == "converged"
    ends = [lv for lv in cap["levels"] if lv["load"] in (cap["low"], cap["high"])]
    assert all(lv["itl_p95_p50"] > JITTER_RATIO for lv in ends), ends
    sim = SimConfig()
    prompt = statistics.fmean(lv["prompt_tokens"]["mean"] for lv in test["levels"])

    def mean_itl(c: float) -> float:
        return sim.step_time(int(c)) + sim.prefill_time(round(prompt)) * c / 257

    truth = next(c for c in range(1, 200) if mean_itl(c + 1) > 0.05)
    assert 39 <= truth <= 42  # 41 with the built-in prompts
    assert abs(cap["estimate"] / (truth + 0.15) - 1) <= 0.10, (cap, truth)
    assert any("client jitter" in line for line in capacity_lines(test))
