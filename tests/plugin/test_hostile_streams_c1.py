"""Hostile servers at every level, C=1 included: no wrong baseline, and every stream fault named.

The second pass of the hostile-server guards (issue 35).  Every case runs a real
``pytest -m perf --endpoint=http://127.0.0.1:PORT`` session against
:class:`support.hostile.HostileServer`, most of them with ``--update-baselines``, in the
marker's default protocol (stationary: a time box cuts the streams in flight) and with the
default warm-up (so the client has a pace to size each trial's wall-clock limit from).
Before these guards:

* at C=1 a gzip-buffered stream whose whole answer came in under a millisecond was recorded
  (42709.9 tok/s with ``--update-baselines``): the lag monitor's ordinary half millisecond of
  jitter passed for a client stall of "half the request", which excused every lump;
* a running usage that counted *down* was recorded (296.2 tok/s against a true ~185): a stream
  the time box cut early is counted by its last running usage, which claimed most of a request;
* a server slow to send its headers ended in "0 of 0 requests failed", a stalled body at C=1 in
  "the server runs fewer than C at once", an event flood in "shard the client with
  --perf-workers": none of them what happened.

Below the sessions, the rules themselves, without a server.
"""

from __future__ import annotations

import json
import re
from array import array
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.load.sse_usage import usage_fell_message
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, summarize_trial
from pytest_kimi.measure.trial_causes import (
    BUFFERED_MIN_EVENTS,
    BUFFERED_STALL_MIN_S,
    FLOOD_BYTES_PER_EVENT,
)
from pytest_kimi.measure.usage_checks import count_cut_tokens
from pytest_kimi.measure.measure_spec import MeasureSpec, SendSpec, Watchers
from pytest_kimi.measure.pace import Pace
from pytest_kimi.measure.trial_limits import TRIAL_LIMIT_FACTOR, TRIAL_LIMIT_SLACK_S, TrialLimit
from pytest_kimi.measure.trials import measure_level
from pytest_kimi.load.openloop import OpenLoopPlan
from pytest_kimi.load.request import Target
from pytest_kimi.load.trial import LiveTrial, TrialPlan
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import LevelSpec
from support.hostile import FAST_FIRST, HostileServer
from support.timing import poll_until


def _session_file(concurrency: int, max_tokens: int) -> str:
    return f"""
from pytest_kimi import throughput

@throughput(concurrency={concurrency}, max_tokens={max_tokens}, timeout_s=60)
def test_hostile():
    pass
"""


@pytest.fixture
def hostile() -> Iterator[Callable[[str], HostileServer]]:
    """``hostile(mode)``: a started :class:`HostileServer`, stopped after the test."""
    servers: list[HostileServer] = []

    def start(mode: str) -> HostileServer:
        server = HostileServer(mode).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _run(
    pytester: pytest.Pytester, url: str, *, concurrency: int = 1, max_tokens: int = 32
) -> tuple[pytest.RunResult, dict[str, Any]]:
    """Run the session with ``--update-baselines`` against ``url``: its result and its level."""
    pytester.makepyfile(test_hostile=_session_file(concurrency, max_tokens))
    report = pytester.path / "perf.json"
    result = pytester.runpytest(
        "-m",
        "perf",
        f"--endpoint={url}",
        f"--perf-json={report}",
        "--update-baselines",
    )
    assert report.exists(), result.stdout.str()[-3000:]
    (test,) = json.loads(report.read_text())["tests"]
    (level,) = test["levels"]
    return result, level


def _recorded(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / "baselines").rglob("*.yaml"))


def _refused(pytester: pytest.Pytester, result: pytest.RunResult, level: dict[str, Any]) -> str:
    """The level was not recorded, the session failed, and the reasons (joined) are returned."""
    assert result.ret != 0
    assert _recorded(pytester) == [], "a hostile level must never become a baseline"
    assert level["verdict"] in ("invalid", "error"), level["verdict"]
    result.stdout.fnmatch_lines(["*test_hostile.py::test_hostile: not recorded (C=*"])
    return " | ".join(level["reasons"])


@pytest.mark.parametrize("mode", ["gzip_fast", "gzip_buffered"])
def test_a_buffered_stream_at_c1_is_never_recorded(
    pytester: pytest.Pytester, hostile: Callable[[str], HostileServer], mode: str
) -> None:
    """Before: ``gzip_fast`` at C=1 recorded ~46,000 tok/s with rc 0 (the tester's 42709.9);
    ``gzip_buffered`` was refused, but first for "the server runs fewer than C at once".
    After: both are refused as buffered, and that is the first reason (the one the refusal
    names)."""
    server = hostile(mode)
    result, level = _run(pytester, server.url, max_tokens=256 if mode == "gzip_buffered" else 32)
    reasons = _refused(pytester, result, level)
    assert level["reasons"][0].startswith("buffered: inter-token latency cannot be measured"), (
        reasons
    )
    assert "fewer than C" not in reasons
    result.stdout.fnmatch_lines(["*not recorded (C=1 invalid: buffered: *"])


def test_a_running_usage_that_counts_down_is_never_recorded(
    pytester: pytest.Pytester, hostile: Callable[[str], HostileServer]
) -> None:
    """Before: recorded at 2.7x the true rate (each cut stream claimed ``max_tokens`` less its
    events).  After: the level is invalid, naming the fall."""
    server = hostile("usage_down")
    result, level = _run(pytester, server.url, max_tokens=256)
    reasons = _refused(pytester, result, level)
    assert level["verdict"] == "invalid"
    assert (
        "reported usage that cannot be true: usage.completion_tokens went down within the "
        "stream, from " in reasons
    ), reasons


def test_slow_headers_are_named_and_the_trial_ends_at_its_limit(
    pytester: pytest.Pytester, hostile: Callable[[str], HostileServer]
) -> None:
    """Before: ``0 of 0 requests failed (max_error_rate=0)``.  After: the request the trial's
    wall-clock limit cut before its headers is a failed request, named for what it was."""
    server = hostile("slow_headers")
    result, level = _run(pytester, server.url)
    reasons = _refused(pytester, result, level)
    assert level["verdict"] == "error"
    assert re.search(
        r"^1 of 1 requests failed \(max_error_rate=0\): the server was slow to answer headers: "
        r"no response headers [\d.]+ s after the request was sent, when the trial reached its "
        r"wall-clock limit",
        reasons,
    ), reasons
    assert "0 of 0" not in reasons
    assert level["trials"] == 1  # the level stopped at the limit
    # the trial ended at its limit: the client hung up on the slow request (the server would
    # otherwise have held it for STALL_CAP_S and answered it)
    slow = len(server.generations()) - FAST_FIRST
    poll_until(lambda: server.hangups == slow >= 1, "the client hung up each slow request")


def test_a_stalled_body_at_c1_is_named_and_the_trial_ends_at_its_limit(
    pytester: pytest.Pytester, hostile: Callable[[str], HostileServer]
) -> None:
    """Before: "the trial was cut before every stream had its first token: the server runs
    fewer than C at once" at C=1.  After: the body stalled, in the window's reason and the
    limit's."""
    server = hostile("slow_body")
    result, level = _run(pytester, server.url)
    reasons = _refused(pytester, result, level)
    assert level["verdict"] == "invalid"
    assert "fewer than C" not in reasons
    window, limit = level["reasons"]
    assert window.startswith(
        "no steady-state window: the trial's wall-clock limit cut it before its streams made "
        "a window: the body stalled: 1 stream(s) had their response headers but no token "
    ), window
    assert re.match(
        rf"ran past its wall-clock limit of [\d.]+ s \({TRIAL_LIMIT_FACTOR:g}x the [\d.]+ s "
        rf"expected from the server's pace so far, plus {TRIAL_LIMIT_SLACK_S:g} s\): its 1 "
        r"stream\(s\) in flight were cut; the server did not finish the trial's work in time "
        r"\(the body stalled: 1 stream\(s\) had their response headers but no token",
        limit,
    ), limit
    slow = len(server.generations()) - FAST_FIRST
    poll_until(lambda: server.hangups == slow >= 1, "the client hung up each stalled stream")


@pytest.mark.parametrize("concurrency", [1, 2])
def test_an_event_flood_is_named_not_blamed_on_the_client(
    pytester: pytest.Pytester, hostile: Callable[[str], HostileServer], concurrency: int
) -> None:
    """Before: "load client saturated ... shard the client with --perf-workers" (and at C=1
    no number of workers can split a stream).  After: the flood, measured in bytes a token
    event, whether or not the client's CPU ran out."""
    server = hostile("event_flood")
    result, level = _run(pytester, server.url, concurrency=concurrency)
    reasons = _refused(pytester, result, level)
    assert level["verdict"] == "invalid"
    found = re.search(
        r"event flood: the server sent ([\d,]+) bytes of stream per token event", reasons
    )
    assert found, reasons
    assert int(found[1].replace(",", "")) > FLOOD_BYTES_PER_EVENT
    assert "--perf-workers" not in reasons and "shard the client" not in reasons


# ------------------------------------------------------------------ the rules, without a server


def _lump(start: float, events: int, *, ttft: float, reads: int = 1) -> RequestRecord:
    """A finished request whose ``events`` token events came in ``reads`` reads, 0.1 ms apart,
    ``ttft`` after its send."""
    rec = RequestRecord(index=0, worker=0, scheduled=start - ttft, sent=start - ttft, status=200)
    rec.first_token = start
    per = [events // reads] * reads
    per[-1] += events - sum(per)
    rec.chunk_times = array("d", [start + 0.0001 * i for i in range(reads)])
    rec.chunk_events = array("I", per)
    rec.completion_tokens = events
    rec.end = rec.chunk_times[-1]
    return rec


def _summary(
    records: list[RequestRecord],
    *,
    concurrency: int = 1,
    cut_at: float | None = None,
    over_limit_s: float | None = None,
    **signals: Any,
) -> TrialResult:
    for i, r in enumerate(records):
        r.index = i
    tokens = max((r.completion_tokens for r in records), default=32) or 32
    level = LevelSpec(concurrency, None, tokens)
    tr = TrialRecords(
        records=records,
        started=0.0,
        ended=20.0,
        concurrency=concurrency,
        cut_at=cut_at,
        over_limit_s=over_limit_s,
    )
    return summarize_trial(0, level, tr, client=ClientSignals(**signals), ignore_eos=False)


def test_the_monitors_jitter_or_a_lumps_own_parsing_excuses_no_lump() -> None:
    """The tester's C=1 gzip case: answers in 0.7 ms whose lag samples (0.5 ms, the monitor's
    ordinary lateness; or a stall that began at the read, the lump's own parsing) covered each
    first read.  Before, either excused every request ("the client's stall"); now only a
    stall before the read, of :data:`BUFFERED_STALL_MIN_S` or more, does."""
    events = 2 * BUFFERED_MIN_EVENTS
    starts = [1.0 + 0.01 * i for i in range(4)]

    def lumps(ttft: float) -> list[RequestRecord]:
        return [_lump(t, events, ttft=ttft) for t in starts]

    jitter = {
        "lag_times": array("d", starts),
        "lag_values": array("d", [BUFFERED_STALL_MIN_S / 10] * 4),
    }
    trial = _summary(lumps(0.0007), **jitter)
    assert trial.invalid and trial.invalid[0].startswith("buffered:"), trial.invalid
    # a 30 ms stall that began at the read (the parse of the lump held the loop after it)
    after = {
        "lag_times": array("d", [t + 0.03 for t in starts]),
        "lag_values": array("d", [0.03] * 4),
    }
    signals = ClientSignals(**after)
    assert signals.stall_at(starts[0]) == pytest.approx(0.03)
    assert signals.stall_before(starts[0]) == 0.0
    assert _summary(lumps(0.05), **after).invalid[0].startswith("buffered:")
    # a 30 ms stall that ended at the read: the client's doing, as before
    before = {"lag_times": array("d", starts), "lag_values": array("d", [0.03] * 4)}
    assert ClientSignals(**before).stall_before(starts[0]) == pytest.approx(0.03)
    assert not any(m.startswith("buffered:") for m in _summary(lumps(0.05), **before).invalid)


def test_a_c1_stationary_trial_of_lumps_is_buffered_whatever_the_cut_stream_shows() -> None:
    """At C=1 the time box cuts the stream after the lump that filled its budget, before the
    next lump: the cut stream has no read and is no evidence (before it halved the share); a
    cut stream that did bring a lump counts like a finished one."""
    events = 4 * BUFFERED_MIN_EVENTS
    done = _lump(1.0, events, ttft=0.05)
    waiting = RequestRecord(index=1, worker=0, scheduled=1.0, sent=1.0, status=200, cut=True)
    trial = _summary([done, waiting], cut_at=1.01)
    assert trial.invalid[0] == (
        "buffered: inter-token latency cannot be measured; turn off compression or proxy "
        f"buffering (1 of 1 requests brought their {events} token events in at most 2 reads)"
    )
    assert not any("fewer than C" in m for m in trial.invalid), trial.invalid
    lumped_cut = _lump(1.2, events, ttft=0.05)
    lumped_cut.cut = True
    honest = _lump(1.0, events, ttft=0.05, reads=events)
    trial = _summary([honest, lumped_cut, _lump(1.3, events, ttft=0.05)], cut_at=1.4)
    assert trial.invalid[0].startswith("buffered:") and "(2 of 3 requests" in trial.invalid[0]


def _running(usages: list[int], *, cut: bool, start: float = 1.0) -> RequestRecord:
    """A stream of one token event a read, with ``usages`` as its running usage."""
    rec = _lump(start, len(usages), ttft=0.05, reads=len(usages))
    rec.chunk_times = array("d", [start + 0.01 * i for i in range(len(usages))])
    rec.chunk_usage = array("I", usages)
    rec.end = rec.chunk_times[-1]
    rec.cut = cut
    if cut:
        rec.completion_tokens = 0
    return rec


def test_a_running_usage_that_falls_is_refused_on_cut_and_finished_streams() -> None:
    falling = list(range(256, 246, -1))  # 10 reads counting down from 256
    cut = _running(falling, cut=True)
    assert count_cut_tokens([cut], max_tokens=256) == 1  # estimated from its events
    assert cut.usage_error == usage_fell_message(256, 255)
    assert cut.completion_tokens == 10
    finished = _running([1, 2, 3, 2, 5], cut=False)
    cut2 = _running(falling, cut=True, start=1.0)
    honest = _running(list(range(1, 11)), cut=False, start=1.0)
    trial = _summary([finished, cut2, honest], cut_at=2.0)
    (usage,) = [m for m in trial.invalid if "usage that cannot be true" in m]
    assert usage.startswith(
        "2 request(s) reported usage that cannot be true: "
        + usage_fell_message(3, 2)
        + "; "
        + usage_fell_message(256, 255)
    ), usage
    assert honest.usage_error is None
    # a refused running usage is said as such, not as one the cut stream did not carry
    assert not any("carried no running usage" in e for e in trial.errors), trial.errors


def test_a_cut_streams_running_usage_above_max_tokens_is_refused() -> None:
    rec = _running([40, 41, 42], cut=True)
    assert count_cut_tokens([rec], max_tokens=32) == 1
    assert rec.usage_error == "usage.completion_tokens=42 is above the request's max_tokens=32"
    assert rec.completion_tokens == 3


def test_the_wall_limit_names_what_its_cut_streams_were_stuck_on() -> None:
    """Each cut stream by what it had: no headers (a failed request: the server was slow to
    answer), headers but no token, tokens that stopped (the body stalled); streams that were
    still streaming keep the old guess."""
    limit = TrialLimit(1.0, "the server's pace so far")
    headers = RequestRecord(index=0, worker=0, scheduled=0.0, sent=0.5, cut=True)
    no_token = RequestRecord(index=1, worker=1, scheduled=0.0, sent=0.5, status=200, cut=True)
    silent = _running([1, 2, 3], cut=True, start=1.0)
    silent.index, silent.worker = 2, 2
    tr = TrialRecords(
        records=[headers, no_token, silent],
        started=0.0,
        ended=9.0,
        concurrency=3,
        cut_at=9.0,
        over_limit_s=9.0,
    )
    reason = limit.reason(tr)
    assert reason is not None
    assert reason.endswith(
        "its 3 stream(s) in flight were cut; the server did not finish the trial's work in "
        "time (the server was slow to answer headers: 1 request(s) had no response headers "
        "8.5 s or more after they were sent; the body stalled: 1 stream(s) had their response "
        "headers but no token 8.5 s or more after they were sent; the body stalled: 1 "
        "stream(s) had brought no token for 8.0 s or more)"
    ), reason
    trial = summarize_trial(0, LevelSpec(3, None, 32), tr, client=ClientSignals(), ignore_eos=False)
    assert trial.requests_failed == 1 and headers.error is not None
    assert headers.error.startswith("the server was slow to answer headers: no response headers")
    streaming = _running([1, 2, 3], cut=True, start=8.95)
    tr.records = [streaming]
    assert "(its streams were still streaming:" in (limit.reason(tr) or "")


def test_a_saturated_client_is_told_apart_from_a_flood_and_from_one_stream() -> None:
    """Only a client that ran several streams a process is told to shard; a lone stream that
    saturated it was the server's flood; a flood of bytes is said as such whatever the CPU."""
    busy = {"cpu_share": 0.99, "loop_lag_p99_s": 0.05}

    def streams() -> list[RequestRecord]:
        return [_running(list(range(1, 41)), cut=False, start=1.0 + 0.001 * i) for i in range(2)]

    one = _summary(streams()[:1], concurrency=1, **busy)
    (saturated,) = [m for m in one.invalid if m.startswith("load client saturated")]
    assert "by one stream" in saturated and "cannot split one stream" in saturated
    assert "shard the client" not in saturated
    two = _summary(streams(), concurrency=2, **busy)
    assert any(m.endswith("shard the client with --perf-workers") for m in two.invalid)
    flooded = streams()
    for r in flooded:
        r.body_bytes = 2 * FLOOD_BYTES_PER_EVENT * r.events
    flood = _summary(flooded, concurrency=2, **busy)
    assert flood.invalid[-1].startswith("event flood: the server sent 32,768 bytes"), flood.invalid
    assert not any("--perf-workers" in m for m in flood.invalid)
    assert any(
        e.startswith("note: the load client was saturated by the event flood") for e in flood.errors
    )
    honest = streams()
    for r in honest:
        r.body_bytes = 300 * r.events + 1500
    assert not any(m.startswith("event flood") for m in _summary(honest, concurrency=2).invalid)


class _GrowingServer:
    """A client whose every trial takes ``walls[i]`` wall seconds (on its own clock, no
    waiting) and records the wall-clock limit each trial's plan was given."""

    def __init__(self, walls: list[float]) -> None:
        self.walls = list(walls)
        self.limits: list[float | None] = []

    async def run_trial(
        self, target: Target, plan: TrialPlan, live: LiveTrial | None = None
    ) -> TrialRecords:
        self.limits.append(plan.wall_limit_s)
        wall = self.walls[len(self.limits) - 1]
        return TrialRecords(records=[], started=100.0, ended=100.0 + wall, concurrency=1)

    async def run_open_loop(
        self, target: Target, plan: OpenLoopPlan, live: LiveTrial | None = None
    ) -> TrialRecords:
        raise AssertionError("closed loop only")


class _AlwaysMore:
    """An adaptive policy that asks for one more trial each time, up to ``upto``."""

    def __init__(self, upto: int) -> None:
        self.upto = upto
        self.asked = 0

    def more_trials(self, level: LevelSpec, samples: Any) -> int:
        self.asked += 1
        return 1 if self.asked < self.upto else 0


@pytest.mark.asyncio
async def test_every_trial_of_the_adaptive_loop_is_held_to_the_levels_bound() -> None:
    """Before: each trial's limit was 4x the trial before, plus 5 s, so trials of a server
    that slowed 3x a trial ran 1, 3, 9, 27 s unchecked, the next allowed 113 s (the tester's
    run was killed at 116 s).  Now the level's fastest trial sizes every later limit."""
    workload, targets = parse_throughput(
        (), {"concurrency": 1, "max_tokens": 16, "protocol": "whole-requests", "trials": 1}
    )
    send = SendSpec(
        nodeid="t",
        target=Target(url="http://127.0.0.1:1/v1/chat/completions"),
        workload=workload,
        targets=targets,
        bodies={None: [b'{"max_tokens":0}']},
        prompts_keys={None: "k"},
    )
    spec = MeasureSpec(send, Watchers(policy=_AlwaysMore(6)), trials=1)
    walls = [1.0, 3.0, 9.0, 27.0, 0.5, 2.0]
    client = _GrowingServer(walls)
    await measure_level(client, spec, workload.levels[0])
    assert len(client.limits) == len(walls)
    bound = TRIAL_LIMIT_FACTOR * 1.0 + TRIAL_LIMIT_SLACK_S
    assert client.limits[1:5] == [bound] * 4
    assert client.limits[5] == TRIAL_LIMIT_FACTOR * 0.5 + TRIAL_LIMIT_SLACK_S


def test_the_pace_of_buffered_streams_is_their_whole_time() -> None:
    """A stream whose tokens came in one read has no decode rate; before, no pace came of it
    and the next trial's limit was the request timeout (600 s by default)."""
    recs = [_lump(1.0 + i, 32, ttft=0.064) for i in range(3)]
    pace = Pace.of(TrialRecords(records=recs, started=0.0, ended=4.0, concurrency=1))
    assert pace is not None
    assert pace.token_s == pytest.approx(0.064 / 32)
