"""Reasons that say the true cause (issue 34): a stalled load client is never read as a slow
server (its trials give no latency figure, and "fewer than C at once" only when the server's
own gauge shows it), a trial's pNN is a pNN (enough values of its own, else none and a note),
and an ``inconclusive`` level says why its trials stopped.  Synthetic trials, no server."""

from __future__ import annotations

from array import array

import pytest

from pytest_kimi.crosscheck.counter_scraper import Scrape
from pytest_kimi.crosscheck.server_metrics import _answer_running
from pytest_kimi.gate import family_verdicts, trial_decision
from pytest_kimi.gate.latency_gate import apply_latency_gate
from pytest_kimi.gate.policy import compared_level
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.measure.latency import min_values, per_trial_latencies
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, summarize_trial
from pytest_kimi.measure.trial_causes import GAUGE_UNREAD, no_window_cause
from pytest_kimi.measure.results import ThroughputResult, judge_level
from pytest_kimi.workload.workload_spec import LevelSpec, Targets, Workload

LEVEL = LevelSpec(concurrency=1, rate=None, max_tokens=32)
WORKLOAD = Workload(levels=(LEVEL,))


def _record(
    index: int, start: float, ttft: float, itl: float = 0.01, worker: int = 0
) -> RequestRecord:
    rec = RequestRecord(
        index=index, worker=worker, scheduled=start, sent=start, status=200, completion_tokens=32
    )
    rec.first_token = start + ttft
    rec.chunk_times = array("d", [start + ttft + i * itl for i in range(32)])
    rec.chunk_events = array("I", [1] * 32)
    rec.end = rec.chunk_times[-1]
    return rec


def _trial(
    index: int, ttft: float, requests: int, client: ClientSignals | None = None
) -> TrialResult:
    records = [
        _record(i, i * 10.0, ttft * (0.9 + 0.2 * i / max(requests - 1, 1))) for i in range(requests)
    ]
    return TrialResult(
        index=index,
        label="C=1",
        tok_s=100.0,
        window_s=1.0,
        window_tokens=100.0,
        requests_ok=requests,
        requests_failed=0,
        wall_s=10.0 * requests,
        client=client or ClientSignals(),
        records=records,
    )


# ------------------------------------------------------------------ a stalled client's latency


def _stalled_client(trial: TrialResult) -> ClientSignals:
    """Lag samples every 5 ms over the trial, one 150 ms stall ending at each request's first
    token: every TTFT the client stamped was held up by its own event loop."""
    times = array("d")
    values = array("d")
    stalls = {round(r.first_token or 0.0, 4) for r in trial.records}
    t = 0.0
    end = max(r.end for r in trial.records)
    while t < end:
        times.append(t)
        values.append(0.001)
        t += 0.005
    for at in sorted(stalls):
        times.append(at + 0.001)
        values.append(0.15)
    order = sorted(range(len(times)), key=lambda i: times[i])
    return ClientSignals(
        loop_lag_max_s=0.15,
        cpu_share=0.05,
        lag_times=array("d", [times[i] for i in order]),
        lag_values=array("d", [values[i] for i in order]),
    )


def test_a_trial_whose_client_stalled_gives_no_latency_sample() -> None:
    clean = [_trial(i, 0.05, 20) for i in range(3)]
    stalled = _trial(3, 0.05, 20)
    stalled.client = _stalled_client(stalled)
    level = judge_level(LEVEL, WORKLOAD, Targets(), [*clean, stalled], "builtin:diverse")
    assert stalled.valid, "its tok/s still counts"
    assert stalled.latency_void is not None and "load client stalled" in stalled.latency_void
    assert all(t.latency_void is None for t in clean)
    got = per_trial_latencies(level.trials, 95.0)
    assert len(got.values["ttft_s"]["p50"]) == 3 and len(got.voided) == 1
    assert any("latencies of 1 of 4 trial(s) left out" in e for e in level.errors)


def test_a_noted_client_stall_voids_the_latency_of_a_valid_trial() -> None:
    trial = _trial(0, 0.05, 20)
    trial.client_stall = "load client stalled: its event loop waited up to 40 ms"
    got = per_trial_latencies([trial], 95.0)
    assert trial.valid and got.voided == [trial.client_stall]
    assert got.values["ttft_s"]["p50"] == []


def test_a_ceiling_with_every_trial_voided_is_not_judged_and_says_why() -> None:
    trials = [_trial(i, 0.05, 20) for i in range(3)]
    for t in trials:
        t.client = _stalled_client(t)
    level = judge_level(LEVEL, WORKLOAD, Targets(max_ttft_s=0.01), trials, "builtin:diverse")
    assert level.verdict == "invalid", level.reasons
    assert any(
        "TTFT p95 not judged against max_ttft_s" in r and "load client stalled" in r
        for r in level.reasons
    ), level.reasons
    assert level.figures.ttft_s_pct is None


def test_the_latency_comparison_says_trials_were_left_out() -> None:
    base_trials = [_trial(i, 0.05, 20) for i in range(4)]
    recorded = ThroughputResult(
        "t.py::t",
        WORKLOAD,
        Targets(),
        levels=[judge_level(LEVEL, WORKLOAD, Targets(), base_trials, "builtin:diverse")],
    )
    apply_latency_gate(recorded, None)
    from pytest_kimi.baseline.provenance import Provenance
    from pytest_kimi.baseline.update import reference_baseline

    baseline = reference_baseline(recorded, Provenance(model="m"), "sim")
    current = [_trial(i, 0.05, 20) for i in range(3)]
    stalled = _trial(3, 0.05 * 3.66, 20)  # the +266% a stalled client read
    stalled.client = _stalled_client(stalled)
    result = ThroughputResult(
        "t.py::t",
        WORKLOAD,
        Targets(),
        levels=[judge_level(LEVEL, WORKLOAD, Targets(), [*current, stalled], "builtin:diverse")],
    )
    apply_latency_gate(result, baseline)
    (level,) = result.levels
    assert level.latency is not None and level.latency.note is not None
    assert "left out, the load client's and not the server's" in level.latency.note
    assert not any(r.startswith("latency regression") for r in level.reasons), level.reasons


# ------------------------------------------------------------------ a trial's pNN is a pNN


def test_min_values_of_a_percentile() -> None:
    assert min_values(50) == 1
    assert min_values(95) == 20
    assert min_values(99) == 100
    assert min_values(90) == 10


def test_a_trial_with_too_few_requests_gives_no_p95_and_says_why() -> None:
    trials = [_trial(i, 0.05, 3) for i in range(3)]  # C=1: a few requests a trial
    got = per_trial_latencies(trials, 95.0)
    assert len(got.values["ttft_s"]["p50"]) == 3
    assert got.values["ttft_s"]["p95"] == [], "a p95 of 3 values would be their largest"
    assert got.few["ttft_s"]["p95"] == [3, 3, 3]
    result = ThroughputResult(
        "t.py::t",
        WORKLOAD,
        Targets(),
        levels=[judge_level(LEVEL, WORKLOAD, Targets(), trials, "builtin:diverse")],
    )
    apply_latency_gate(result, None)
    latency = result.levels[0].latency
    assert latency is not None
    fig = latency.figure("ttft_s", "p95")
    assert fig is not None and fig.trials == ()
    assert fig.note is not None and "needs 20 values a trial" in fig.note
    assert fig.to_dict()["note"] == fig.note
    p50 = latency.figure("ttft_s", "p50")
    assert p50 is not None and len(p50.trials) == 3 and p50.note is None


def test_enough_requests_give_a_p95_above_the_p50() -> None:
    got = per_trial_latencies([_trial(0, 0.05, 20)], 95.0)
    (p50,) = got.values["ttft_s"]["p50"]
    (p95,) = got.values["ttft_s"]["p95"]
    assert p95 > p50


# ------------------------------------------------------------------ fewer than C at once


def _cut_trial(late_s: float) -> TrialRecords:
    """C=4, stationary: two streams streaming, two with no token at the cut; the waiting
    streams' requests went out ``late_s`` after they were due (at 100 s)."""
    records = [_record(i, 100.0, 0.05, worker=i) for i in range(2)]
    for w in (2, 3):
        r = RequestRecord(index=w, worker=w, scheduled=100.0, sent=100.0 + late_s, status=200)
        r.cut = True
        r.end = 101.0
        records.append(r)
    for r in records[:2]:
        r.cut = True
    return TrialRecords(records=records, started=100.0, ended=101.0, concurrency=4, cut_at=101.0)


def test_unstarted_streams_do_not_claim_the_server_runs_fewer_than_c() -> None:
    tr = _cut_trial(0.0)
    ok = [r for r in tr.records if r.ok]
    cause = no_window_cause(ok, tr, 4, False, client=ClientSignals())
    assert "2 of 4 streams had no token yet" in cause
    assert GAUGE_UNREAD in cause and "see its max-running-requests" not in cause
    level = LevelSpec(concurrency=4, rate=None, max_tokens=32)
    trial = summarize_trial(0, level, tr, client=ClientSignals(), ignore_eos=True)
    assert trial.running_asked == 4 and not trial.transient


def test_a_late_client_is_named_as_the_cause() -> None:
    tr = _cut_trial(0.5)
    level = LevelSpec(concurrency=4, rate=None, max_tokens=32)
    trial = summarize_trial(0, level, tr, client=ClientSignals(cpu_share=0.05), ignore_eos=True)
    (reason,) = [m for m in trial.invalid if m.startswith("no steady-state window")]
    assert "the load client stalled" in reason and "500 ms late" in reason
    assert "fewer than C" not in reason
    assert reason in trial.transient and trial.client_stall == reason
    assert trial.running_asked is None


@pytest.mark.parametrize(
    ("running", "says"),
    [(2.0, "it runs fewer than C at once (see its max-running-requests)"), (4.0, "not a limit")],
)
def test_the_server_gauge_decides_fewer_than_c(running: float, says: str) -> None:
    tr = _cut_trial(0.0)
    level = LevelSpec(concurrency=4, rate=None, max_tokens=32)
    trial = summarize_trial(0, level, tr, client=ClientSignals(), ignore_eos=True)
    scrape = Scrape(
        t=100.5,
        half_rtt_s=0.001,
        generation=0.0,
        running=running,
        running_gauge="sglang:num_running_reqs",
    )
    _answer_running(trial, [scrape])
    (reason,) = [m for m in trial.invalid if m.startswith("no steady-state window")]
    assert GAUGE_UNREAD not in reason
    assert "sglang:num_running_reqs" in reason and says in reason


# ------------------------------------------------------------------ why trials stopped


def _stopped(n: int, design: family_verdicts.Design | None, cap: int = 10) -> str:
    return trial_decision.trials_stopped(n, design, cap, p_raw=0.0469, p_final=0.0537, alpha=0.05)


def test_trials_stopped_says_the_true_cause() -> None:
    assert "cap of 10 trials (--perf-max-trials) was reached" in _stopped(
        10, family_verdicts.Design(3, 10)
    )
    at_look = _stopped(3, family_verdicts.Design(3, 10))
    assert "significant on its own (p=0.0469" in at_look and "decided at 0.0537" in at_look
    assert "--perf-max-trials" not in at_look
    futile = _stopped(3, family_verdicts.Design(3, 3))
    assert "futility" in futile and "--perf-max-trials" not in futile
    assert "fixed number" in _stopped(3, None)


def test_an_inconclusive_note_carries_why_its_trials_stopped() -> None:
    base = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.0]
    cur = [91.0, 90.0, 92.0]
    cmp = family_verdicts.compare_level(base, cur, tolerance=0.05, session_sigma=0.03)
    assert cmp.verdict.value == "inconclusive"
    stopped = _stopped(3, family_verdicts.Design(3, 3))
    _, note = compared_level(cmp, base, tolerance=0.05, alpha=0.05, stopped=stopped)
    assert note is not None and f"after 3 trials ({stopped})" in note
    assert "raise --perf-max-trials" not in note


# ------------------------------------------------------- a C=1 stream read in one lump


def _lumped(stall_s: float) -> TrialRecords:
    """One C=1 stream of 32 tokens sent at 100.0 whose every token the client read at one
    instant, 1.0 s later; the client's loop had been held ``stall_s`` just before that read."""
    rec = RequestRecord(index=0, worker=0, scheduled=100.0, sent=100.0, status=200)
    rec.completion_tokens = 32
    rec.first_token = 101.0
    rec.chunk_times = array("d", [101.0] * 32)
    rec.chunk_events = array("I", [1] * 32)
    rec.end = 101.0
    return TrialRecords(records=[rec], started=100.0, ended=101.0, concurrency=1)


def _held(stall_s: float) -> ClientSignals:
    times = array("d", [100.0 + 0.005 * i for i in range(int(1.0 / 0.005) - 1)])
    values = array("d", [0.001] * len(times))
    if stall_s:  # one sample at the read says the loop did not run during the stall before it
        times, values = array("d", [t for t in times if t < 101.0 - stall_s]), array("d")
        values.extend([0.001] * len(times))
        times.append(101.0 + 0.001)
        values.append(stall_s)
    return ClientSignals(loop_lag_max_s=stall_s, cpu_share=0.05, lag_times=times, lag_values=values)


def test_a_lump_read_after_the_client_was_held_is_the_clients_doing() -> None:
    """A C=1 stream whose tokens all came at one instant: a server that buffers its stream
    (a hostile guard: the trial is invalid), unless the client's own loop was held for most
    of the stream's time just before it read them, when the tokens waited in its socket: then
    the trial is void for the moment (transient) and another replaces it."""
    level = LevelSpec(concurrency=1, rate=None, max_tokens=32)
    held = summarize_trial(0, level, _lumped(0.9), client=_held(0.9), ignore_eos=True)
    (reason,) = [m for m in held.invalid if m.startswith("no steady-state window")]
    assert "event loop had been held 899 ms" in reason and reason in held.transient
    for stall in (0.0, 0.2):  # no stall, or one far shorter than the stream: the server's
        trial = summarize_trial(0, level, _lumped(stall), client=_held(stall), ignore_eos=True)
        (reason,) = [m for m in trial.invalid if m.startswith("no steady-state window")]
        assert "came at one instant, with no span" in reason and not trial.transient
