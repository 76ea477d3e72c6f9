"""Open-loop rate ramps (``rate=ramp(start, stop, steps=N)``): steps as open-loop levels, and
the report's offered / sent / completed request rates per step.

The ramp itself and its validation are checked offline; a real pytest session then runs a ramp
against a simulator that can hold only two requests at once, so the last steps are past its
capacity by design: the client sends at the offered rate, the server completes at its own.
The saturation checks compare rates within one run with a designed margin (completed is about
half of offered at the top step), never a time with a fixed bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.steady_state import completed_rate
from pytest_kimi.measure.results import level_key, spec_key, workload_dict
from pytest_kimi.report.terminal import format_table
from pytest_kimi.report.workload_cells import RATES_HEADER, rates_cell
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import MarkerError
from pytest_kimi.workload.ramp import Ramp, ramp

pytest_plugins = ["pytester"]


# ------------------------------------------------------------------------------ the ramp


def test_steps_span_both_ends_linearly_or_geometrically() -> None:
    assert ramp(1, 16, steps=4).rates == (1.0, 6.0, 11.0, 16.0)
    assert ramp(1, 16, steps=5, spacing="geometric").rates == (1.0, 2.0, 4.0, 8.0, 16.0)
    assert ramp(1, 2, steps=4).rates == (1.0, 1.333, 1.667, 2.0)  # 4 significant digits
    assert ramp(8, 2, steps=3).rates == (8.0, 5.0, 2.0)  # a step-down is a ramp too
    assert ramp(1, 16).steps == 4 and ramp(1, 16, duration_s=60).step_s == 15.0
    assert repr(ramp(0.5, 4, steps=3, duration_s=30, spacing="geometric")) == (
        "ramp(0.5, 4, steps=3, duration_s=30, spacing='geometric')"
    )


def test_the_package_face_offers_ramp() -> None:
    from pytest_kimi import ramp as exported

    assert exported is ramp and isinstance(exported(1, 2), Ramp)


def test_each_step_is_an_open_loop_level_keyed_like_rate_levels() -> None:
    workload, targets = parse_throughput(
        (), {"rate": ramp(1, 16, steps=4), "max_tokens": [32, 64], "min_tok_s": {16: 100}}
    )
    assert [(lv.rate, lv.max_tokens) for lv in workload.levels] == [
        (r, m) for r in (1.0, 6.0, 11.0, 16.0) for m in (32, 64)
    ]
    assert workload.ramp == ramp(1, 16, steps=4) and workload.duration_s is None
    assert targets.floor_for(workload.levels[-1]) == 100
    plain, _ = parse_throughput((), {"rate": [1, 6, 11, 16], "max_tokens": [32, 64]})
    for step, level in zip(workload.levels, plain.levels):
        assert spec_key(step, "builtin:diverse", workload) == spec_key(
            level, "builtin:diverse", plain
        )
    assert "ramp" not in workload_dict(workload)


def test_a_ramp_duration_is_shared_by_its_steps() -> None:
    workload, _ = parse_throughput((), {"rate": ramp(2, 8, steps=4, duration_s=40)})
    assert workload.duration_s == 10.0
    assert all(workload.requests_for(lv) is None for lv in workload.levels)  # sized by time
    sized, _ = parse_throughput((), {"rate": ramp(2, 8, steps=4), "requests": 50})
    assert all(sized.requests_for(lv) == 50 for lv in sized.levels)


@pytest.mark.parametrize(
    ("rate", "extra", "words"),
    [
        (ramp(0, 16), {}, "start=0: expected a rate > 0"),
        (ramp(1, float("inf")), {}, "stop=inf: expected a rate > 0"),
        (ramp(4, 4), {}, "a ramp needs two different ends (one rate is rate=4)"),
        (ramp(1, 16, steps=1), {}, "steps=1: expected an integer from 2 to 100"),
        (ramp(1, 16, steps=2.5), {}, "steps=2.5: expected an integer"),  # type: ignore[arg-type]
        (ramp(1, 16, spacing="log"), {}, "spacing='log': expected one of 'linear', 'geometric'"),
        (ramp(1, 16, duration_s=0), {}, "duration_s=0: expected a number of seconds > 0"),
        (ramp(1, 1.0001, steps=9), {}, "not distinct at 4 significant digits"),
        ({"start": 1, "stop": 16, "steps": 4}, {}, "a ramp is written rate=ramp(start, stop"),
        (ramp(1, 16, duration_s=60), {"duration_s": 10}, "drop duration_s=, or the ramp's"),
        (ramp(1, 16, duration_s=60), {"requests": 10}, "drop requests=, or the ramp's"),
        (ramp(1, 16), {"concurrency": 4}, "concurrency and rate are exclusive"),
    ],
)
def test_bad_ramps_name_the_argument_and_the_fix(
    rate: Any, extra: dict[str, Any], words: str
) -> None:
    with pytest.raises(MarkerError) as err:
        parse_throughput((), {"rate": rate, **extra})
    assert words in str(err.value)


# ---------------------------------------------------------------------- completed rate


def _done(sent: float, end: float, ok: bool = True) -> RequestRecord:
    rec = RequestRecord(index=0, worker=0, scheduled=sent, sent=sent, end=end)
    rec.status = 200 if ok else 500
    return rec


def test_completed_rate_counts_successful_ends_inside_the_window() -> None:
    records = [_done(i, i + 3.0) for i in range(10)]  # one end per second, from 3 to 12
    records.append(_done(4.5, 6.5, ok=False))  # a failure is not a completion
    assert completed_rate(records, (3.0, 9.0)) == pytest.approx(1.0)  # ends 3..9: 6 intervals
    assert completed_rate(records, (3.0, 3.5)) is None  # one end: no rate
    assert completed_rate(records, None) is None


# ------------------------------------------------------------------------------ reports


def test_the_table_shows_offered_sent_and_done_beside_tok_s() -> None:
    levels = [
        {"label": "rate=1/s", "rate": 1.0, "offered_rate": 1.0, "achieved_rate": 0.998,
         "completed_rate": 0.981, "tok_s": 28.6, "verdict": "pass"},
        {"label": "rate=8/s", "rate": 8.0, "offered_rate": 8.0, "achieved_rate": 7.949,
         "completed_rate": 3.771, "tok_s": 119.8, "verdict": "pass"},
    ]  # fmt: skip
    header, first, last = format_table(levels)[:3]
    assert header.split()[:4] == ["level", "tok/s", *RATES_HEADER.split()]
    assert "1/0.998/0.981" in first and "8/7.95/3.77" in last
    assert rates_cell({"label": "C=8", "concurrency": 8}) == "-"


# ------------------------------------------------------------------------------ a session


def test_ramp_session_shows_the_server_falling_behind(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Two requests at once, 32 tokens each, about 17 ms a step: the simulator completes
    about 3.7 requests per second of its clock.  The ramp's top step offers 8."""
    pytester.makepyfile(
        """
        from pytest_kimi import ramp, throughput

        # one trial a step: what the steps offered and completed is the point, not their noise
        @throughput(rate=ramp(1, 8, steps=3, duration_s=30), max_tokens=32, trials=1, warmup=1)
        def test_ramp(throughput_result):
            assert [lv.spec.rate for lv in throughput_result.levels] == [1.0, 4.5, 8.0]
            assert throughput_result.level(rate=8).figures.completed_rate is not None
        """
    )
    report = tmp_path / "perf.json"
    result = pytester.runpytest(
        "--endpoint=sim:speed=20,max_running_requests=2",
        f"--perf-json={report}",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*level*tok/s*{RATES_HEADER}*", "*rate=8/s*8/*/*"])
    (test,) = json.loads(report.read_text())["tests"]
    levels = test["levels"]
    assert [lv["label"] for lv in levels] == ["rate=1/s", "rate=4.5/s", "rate=8/s"]
    for lv in levels:
        assert lv["offered_rate"] == lv["rate"] and lv["verdict"] in ("no-baseline", "pass")
        assert lv["achieved_rate"] > 0 and lv["completed_rate"] > 0
        key = level_key(lv, test["workload"])
        assert key["rate"] == lv["rate"] and "ramp" not in key  # keyed like rate levels
    first, top = levels[0], levels[-1]
    # past capacity the server finishes requests at its own pace, well below the offer,
    # while the idle first step finishes about as many as it is offered
    assert top["completed_rate"] < 0.75 * top["offered_rate"], top
    assert top["completed_rate"] < top["achieved_rate"], top
    ratio = [lv["completed_rate"] / lv["offered_rate"] for lv in (first, top)]
    assert ratio[1] < ratio[0], ratio


def test_a_short_window_says_the_server_was_still_filling_up() -> None:
    from pytest_kimi.measure.client_signals import ClientSignals
    from pytest_kimi.measure.metrics import TrialResult
    from pytest_kimi.measure.shapes import fill_up_note
    from pytest_kimi.report.workload_cells import shape_lines

    def trial(window_s: float, request_s: float) -> TrialResult:
        records = [_done(float(i), i + request_s) for i in range(5)]
        return TrialResult(
            index=0, label="rate=1/s", tok_s=1.0, window_s=window_s, window_tokens=1.0,
            requests_ok=5, requests_failed=0, wall_s=1.0, client=ClientSignals(),
            records=records, window=(0.0, window_s),
        )  # fmt: skip

    assert fill_up_note([trial(30.0, 10.0)]) is None  # three request times: steady enough
    note = fill_up_note([trial(15.0, 10.0)], clock=2.0)  # in the server's clock
    assert note is not None and note.startswith(
        "the window (30 s) is under 2x a request's time (20 s, p50)"
    )
    assert fill_up_note([trial(0.0, 10.0)]) is None  # no window: nothing to judge
    assert shape_lines([{"label": "rate=1/s", "rate": 1.0, "fill_up": note}]) == [
        f"rate=1/s note: {note}"
    ]
