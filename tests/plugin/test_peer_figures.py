"""The figures peers report (TTFT/ITL/TPOT/E2E at mean, std, p50-p99; requests/s, input and
total tok/s): which requests count in each, over which span the rates are taken, the clock,
and how the reports show them (the terminal within its width).

Hand-made records with known answers first; then one session against the simulator whose
JSON must be self-consistent under both closed-loop protocols."""

from __future__ import annotations

import json
import math
from array import array
from typing import Any, Sequence

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.peer_figures import LATENCIES, STATS, peer_figures, tpot
from pytest_kimi.measure.results import judge_level, not_run_level
from pytest_kimi.report.markdown import cell, text
from pytest_kimi.report.peer_cells import (
    TERMINAL_COLUMNS,
    peer_html,
    peer_lines,
    peer_markdown,
    terminal_width,
)
from pytest_kimi.report.terminal import format_test
from pytest_kimi.workload.workload_spec import LevelSpec, Targets, Workload

pytest_plugins = ["pytester"]


def _rec(
    times: Sequence[float],
    *,
    tokens: int | None = None,
    end: float | None = None,
    cut: bool = False,
    status: int = 200,
    error: str | None = None,
    max_tokens: int = 0,
    prompt: int = 0,
    worker: int = 0,
) -> RequestRecord:
    """A stream sent at 0 with one token per read at ``times``."""
    rec = RequestRecord(index=worker, worker=worker, scheduled=0.0, sent=0.0, status=status)
    rec.chunk_times = array("d", times)
    rec.chunk_events = array("I", [1] * len(times))
    rec.first_token = times[0] if times else None
    rec.completion_tokens = len(times) if tokens is None else tokens
    rec.end = end if end is not None else (times[-1] if times else 0.0)
    rec.cut, rec.error, rec.max_tokens, rec.prompt_tokens = cut, error, max_tokens, prompt
    return rec


def _trial(
    records: list[RequestRecord],
    window: tuple[float, float] | None = (0.0, 1.0),
    tok_s: float | None = 1.0,
    invalid: Sequence[str] = (),
) -> TrialResult:
    return TrialResult(
        index=0,
        label="C=1",
        tok_s=tok_s,
        window_s=0.0 if window is None else window[1] - window[0],
        window_tokens=0.0,
        requests_ok=sum(r.ok for r in records),
        requests_failed=sum(not r.ok and not r.cut for r in records),
        wall_s=1.0,
        client=ClientSignals(),
        invalid=list(invalid),
        records=records,
        window=window,
    )


def _latency_records() -> list[RequestRecord]:
    return [
        _rec([0.1, 0.2, 0.3, 0.4], end=0.45),  # whole: TTFT 0.1, TPOT 0.35 / 3, E2E 0.45
        _rec([0.2], end=0.25),  # one token: TTFT and E2E, no TPOT, no gap
        _rec([0.3, 0.5], cut=True, end=0.6),  # cut: TTFT and a gap, no TPOT, no E2E
        _rec([0.01, 0.02], status=500, error="HTTP 500"),  # failed: in nothing
        _rec([0.1, 0.15, 0.2], max_tokens=3),  # staggered opener: TPOT 0.05, not E2E
    ]


def test_each_latency_counts_the_requests_its_definition_names() -> None:
    peer = peer_figures([_trial(_latency_records())], tok_s=None, max_tokens=4)
    ttft = peer.ttft_s
    assert ttft.count == 4  # not the failed one
    assert ttft.mean == pytest.approx(0.175)
    assert ttft.std == pytest.approx(math.sqrt(0.0275 / 4))  # population sd, as np.std
    assert ttft.p50 == pytest.approx(0.15)
    assert ttft.p99 == pytest.approx(0.2 + 0.97 * 0.1)  # linear between the two largest
    assert ttft.p90 is not None and ttft.p95 is not None
    assert ttft.min == 0.1 and ttft.max == 0.3
    assert ttft.p50 <= ttft.p90 <= ttft.p95 <= ttft.p99
    assert peer.tpot_s.count == 2  # the whole request and the opener: finished, >= 2 tokens
    assert peer.tpot_s.mean == pytest.approx((0.35 / 3 + 0.05) / 2)
    assert peer.e2e_s.count == 2  # the level's own length, finished: not cut, not the opener
    assert peer.e2e_s.mean == pytest.approx(0.35)
    assert peer.itl_s.count == 6  # 3 + the cut stream's 1 + the opener's 2 gaps
    assert peer.itl_s.mean == pytest.approx((0.3 + 0.2 + 0.1) / 6)
    assert peer.requests_per_s is None and peer.total_tok_s is None  # no tok/s: no rates


def test_tpot_is_vllms_definition_and_none_where_it_has_no_meaning() -> None:
    whole = _rec([0.1, 0.2, 0.3, 0.4], end=0.45)
    assert tpot(whole) == pytest.approx((0.45 - 0.1) / 3)
    assert tpot(_rec([0.2], end=0.25)) is None  # one token
    assert tpot(_rec([0.1, 0.2], cut=True)) is None  # no end
    assert tpot(_rec([0.1, 0.2], status=500, error="x")) is None
    packed = _rec([0.1, 0.5], tokens=17, end=0.5)  # 16 tokens after the first read's event
    assert tpot(packed) == pytest.approx(0.4 / 16)  # usage's tokens, not the events


def test_latencies_are_multiplied_by_the_clock_and_rates_follow_tok_s() -> None:
    records = _latency_records()
    wall = peer_figures([_trial(records)], tok_s=10.0, max_tokens=4)
    sim = peer_figures([_trial(records)], tok_s=1.0, clock=10.0, max_tokens=4)
    for name in LATENCIES:
        for stat in STATS:
            a, b = wall.latency(name).stat(stat), sim.latency(name).stat(stat)
            assert b == pytest.approx(10 * a), (name, stat)
    assert wall.requests_per_s is not None and sim.requests_per_s is not None
    assert sim.requests_per_s == pytest.approx(wall.requests_per_s / 10)
    # through the level: tok/s and requests/s divided by the clock, latencies multiplied
    spec, workload = LevelSpec(concurrency=1, rate=None, max_tokens=4), Workload(levels=())
    slow = judge_level(spec, workload, Targets(), [_trial(records, tok_s=20.0)], "p", 1.0)
    fast = judge_level(spec, workload, Targets(), [_trial(records, tok_s=20.0)], "p", 10.0)
    a, b = slow.to_dict(), fast.to_dict()
    assert b["tok_s"] == pytest.approx(a["tok_s"] / 10)
    assert b["requests_per_s"] == pytest.approx(a["requests_per_s"] / 10, rel=1e-3)
    assert b["total_tok_s"] == pytest.approx(a["total_tok_s"] / 10, rel=1e-3)
    assert b["ttft_s_p99"] == pytest.approx(a["ttft_s_p99"] * 10, rel=1e-3)
    assert b["tpot_s_mean"] == pytest.approx(a["tpot_s_mean"] * 10, rel=1e-3)


def test_rates_count_each_request_by_its_share_of_tokens_inside_the_window() -> None:
    inside = _rec([0.05 * k for k in range(1, 11)], prompt=100)  # 10 tokens, all inside
    straddles = _rec([0.6 + 0.1 * k for k in range(10)], prompt=200)  # 5 of its 10 inside
    # cut after 8 of the 20 tokens asked for; its running usage gave no prompt tokens
    cut = _rec([0.1 * k for k in range(1, 9)], cut=True, end=0.85, worker=1)
    # a stationary opener of 4 tokens: a part of a 20-token request of the workload
    opener = _rec([0.2, 0.3, 0.4, 0.5], max_tokens=4, prompt=100, worker=2)
    failed = _rec([0.1, 0.2], status=500, error="HTTP 500", prompt=999)
    voided = _trial([_rec([0.1, 0.2], prompt=5000)], invalid=["load client stalled"])
    trials = [_trial([inside, straddles, cut, opener, failed], tok_s=27.0), voided]
    peer = peer_figures(trials, tok_s=27.0, max_tokens=20, ignore_eos=True)
    assert peer.window_tokens == pytest.approx(10 + 5 + 8 + 4)
    # 1 + 0.5 + 8/20 + 4/20 (under ignore_eos a whole request runs to max_tokens)
    assert peer.window_requests == pytest.approx(2.1)
    assert peer.requests_per_s == pytest.approx(27.0 * 2.1 / 27)
    # prompts of the request-equivalents: the cut one with its trial's median prompt (100)
    assert peer.input_tok_s == pytest.approx(100 + 0.5 * 200 + 0.4 * 100 + 0.2 * 100)
    assert peer.total_tok_s == pytest.approx(peer.input_tok_s + 27.0)
    # without ignore_eos a whole request's length is its trial's median whole one (10)
    free = peer_figures(trials, tok_s=27.0, max_tokens=20, ignore_eos=False)
    assert free.window_requests == pytest.approx(1 + 0.5 + 0.8 + 0.4)


def test_a_trial_without_a_window_gives_no_rate() -> None:
    peer = peer_figures([_trial(_latency_records(), window=None)], tok_s=5.0, max_tokens=4)
    assert peer.requests_per_s is None and peer.input_tok_s is None
    assert peer.ttft_s.count == 4  # latencies do not need a window


def test_the_json_has_every_key_and_keeps_the_old_ones() -> None:
    spec, workload = LevelSpec(concurrency=1, rate=None, max_tokens=4), Workload(levels=())
    level = judge_level(spec, workload, Targets(), [_trial(_latency_records())], "p", 1.0)
    data = level.to_dict()
    for name in LATENCIES:
        for stat in STATS:
            assert f"{name}_{stat}" in data
    for key in ("requests_per_s", "input_tok_s", "total_tok_s", "peer_counts"):
        assert key in data
    # the keys that were there before keep their values (the same definitions)
    assert data["ttft_s_p50"] == pytest.approx(level.figures.ttft_s_p50, abs=1e-5)
    assert data["ttft_s_p50"] == pytest.approx(level.peer.ttft_s.p50, abs=1e-5)  # type: ignore[union-attr]
    assert data["itl_s_p50"] == pytest.approx(level.peer.itl_s.p50, abs=1e-6)  # type: ignore[union-attr]
    assert data["peer_counts"]["ttft"] == 4 and data["peer_counts"]["tpot"] == 2
    skipped = not_run_level(spec, workload, Targets(), "skipped", "p").to_dict()
    assert skipped["ttft_s_p99"] is None and skipped["requests_per_s"] is None
    assert skipped["peer_counts"] is None


# ---------------------------------------------------------------------- the reports


_SHAPE = {"mean": 1.0, "std": 0.1, "min": 0.5, "p50": 1.0, "p90": 1.1, "p95": 1.2, "p99": 1.3}


def _level_dict(label: str = "C=8") -> dict[str, Any]:
    out: dict[str, Any] = {"label": label, "tok_s": 812.5, "peer_counts": {"ttft": 8}}
    for i, name in enumerate(LATENCIES):
        for stat in STATS:
            out[f"{name}_{stat}"] = 0.0123 * (i + 1) * _SHAPE.get(stat, 1.5)
    out.update(requests_per_s=3.17, input_tok_s=412.0, total_tok_s=1224.5)
    return out


@pytest.mark.parametrize("width", [60, 80, 120, 250])
def test_the_terminal_table_keeps_to_the_width_and_drops_the_least_important(width: int) -> None:
    test = {"nodeid": "t.py::t", "levels": [_level_dict(), _level_dict("rate=2/s")]}
    lines = peer_lines(test, width)
    assert lines and all(len("  " + line) <= width for line in lines)  # format_test indents 2
    header = lines[1]
    kept = [c for c in TERMINAL_COLUMNS if c.header in header]
    dropped = [c for c in TERMINAL_COLUMNS if c.header not in header]
    # whatever went is less important than everything kept
    assert not dropped or min(c.rank for c in dropped) > max(c.rank for c in kept)
    if width >= 80:
        for name in ("TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "req/s"):
            assert name in header
    if width >= 250:
        assert not dropped
    assert "12.3" in lines[2] and "rate=2/s" in lines[3]  # TTFT p50 in ms
    whole = format_test({**test, "workload": {}}, width)
    assert any("peer figures" in line for line in whole)


def test_the_terminal_width_is_pytests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "97")
    assert terminal_width() == 97
    monkeypatch.setenv("COLUMNS", "12")  # pytest's writer takes under 40 as broken: 80
    assert terminal_width() == 80


def test_markdown_and_html_show_the_compact_table() -> None:
    test = {"levels": [_level_dict()]}
    md = "\n".join(peer_markdown(test, cell, text))
    assert "TTFT ms p50/p90/p99 (mean)" in md and "E2E s p50/p90/p99 (mean)" in md
    assert "| C=8 | 12.3/13.53/15.99 (12.3) |" in md  # p50/p90/p99 (mean), in ms
    assert "3.17" in md and "1224" in md
    page = peer_html(test)
    assert "<table" in page and "ITL ms p50/p90/p99 (mean)" in page
    old = {"levels": [{"label": "C=1", "tok_s": 1.0}]}  # a report saved before these figures
    assert peer_markdown(old, cell, text) == [] and peer_html(old) == "" and not peer_lines(old)


# ---------------------------------------------------------------------- end to end

PERF_TEST = """
from pytest_kimi import throughput

@throughput(concurrency=4, max_tokens=64, trials=2)
def test_stationary():
    pass

@throughput(concurrency=4, max_tokens=64, trials=2, protocol="whole-requests", requests_per_stream=3)
def test_whole():
    pass
"""


def _check_level(lv: dict[str, Any], whole: bool) -> None:
    for name in LATENCIES:
        values = [lv[f"{name}_{q}"] for q in ("min", "p50", "p90", "p95", "p99", "max")]
        assert None not in values, name
        assert values == sorted(values), name
        assert values[0] <= lv[f"{name}_mean"] <= values[-1], name
        assert 0 <= lv[f"{name}_std"] <= values[-1] - values[0], name
        assert lv["peer_counts"][name.removesuffix("_s")] > 0
    assert lv["ttft_s_mean"] <= lv["e2e_s_mean"]
    assert lv["total_tok_s"] == pytest.approx(lv["input_tok_s"] + lv["tok_s"], abs=0.02)
    counts = lv["peer_counts"]
    # every request-equivalent counts at the workload's length, max_tokens=64 under
    # ignore_eos (the staggered openers and cut streams as parts of such requests), so
    # requests/s is tok_s / 64 to the keys' rounding, under both protocols
    assert lv["requests_per_s"] == pytest.approx(lv["tok_s"] / 64, rel=1e-3)
    assert lv["requests_per_s"] == pytest.approx(
        lv["tok_s"] * counts["window_requests"] / counts["window_tokens"], rel=2e-3
    )
    # and it is the server's completion rate: each of the C streams sends its next request
    # as the last one ends, so by Little's law requests/s x mean E2E = C.  The two sides are
    # taken over different spans (the windows; every whole request's life) and differ by
    # the client's turn-around between requests and, with whole requests, by the first
    # TTFT left out of the window (a request's TTFT / E2E, about 2% here): 10% holds that
    assert lv["requests_per_s"] * lv["e2e_s_mean"] == pytest.approx(4, rel=0.1)
    # the old keys are the new ones' p50/p95
    assert lv["ttft_s_p50"] <= lv["ttft_s_p95"] <= lv["ttft_s_p99"]
    if whole:
        # every request finished with 64 tokens: each one is in TTFT, TPOT and E2E, and the
        # mean of (e2e - ttft) / 63 is the means' difference over 63 (to the keys' rounding)
        assert counts["ttft"] == counts["tpot"] == counts["e2e"] == lv["requests_ok"]
        assert lv["tpot_s_mean"] == pytest.approx(
            (lv["e2e_s_mean"] - lv["ttft_s_mean"]) / 63, rel=1e-3
        )
    else:
        # cut streams have a TTFT but no end; staggered openers a TPOT but not the E2E
        assert counts["ttft"] > counts["e2e"] and counts["tpot"] > counts["e2e"]


@pytest.mark.parametrize("columns", [80, 200])
def test_a_session_reports_consistent_peer_figures_within_the_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    pytester.makepyfile(test_perf=PERF_TEST)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--endpoint=sim:speed=10",
        "--perf-json=r.json",
        "--perf-markdown=r.md",
        *(["-k", "stationary"] if columns != 80 else []),
    )
    result.assert_outcomes(passed=1 if columns != 80 else 2)
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    for test in tests:
        for lv in test["levels"]:
            _check_level(lv, whole=test["nodeid"].endswith("test_whole"))
    out = result.stdout.lines
    at = [i for i, line in enumerate(out) if line.strip().startswith("peer figures")]
    assert len(at) == len(tests)
    for i in at:
        table = out[i : i + 3]  # title, header, the level
        assert all(len(line) <= columns for line in table), table
        assert "TTFT p50 ms" in table[1] and "req/s" in table[1]
        assert ("total tok/s" in table[1]) == (columns == 200)  # dropped at 80, not at 200
    assert "p50/p90/p99 (mean)" in (pytester.path / "r.md").read_text()
