"""The workload knobs peers have: ``range_ratio=`` (vLLM's ``--random-range-ratio``),
``burstiness=`` (``--burstiness``) and ``max_concurrency=`` with ``rate=``
(``--max-concurrency``): their draws, their marker validation, their baseline keys, the bodies
they put on the wire, and one plugin session each against the simulator.

The arrival schedule and the cap themselves are checked in ``test_openloop.py``; here they are
checked through the marker and the measurement.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_kimi.measure.results import spec_key, workload_dict
from pytest_kimi.measure.measure_spec import MeasureSpec, SendSpec
from pytest_kimi.load.request import Target
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.capacity_marker import parse_capacity
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import MarkerError, Workload
from pytest_kimi.workload.prompts import (
    RANGE_DRAWS,
    draw_lengths,
    encode_bodies,
    length_bounds,
    resolve_prompts,
)

pytest_plugins = ["pytester"]


# ------------------------------------------------------------------------------ the draws
@pytest.mark.parametrize(
    "value, ratio, bounds",
    [
        (512, 0.5, (256, 768)),
        (100, 0.25, (75, 125)),
        (7, 0.3, (4, 10)),  # floor(4.9), ceil(9.1)
        (1, 0.9, (1, 2)),  # never below 1 token
        (64, 0.0, (64, 64)),
    ],
)
def test_bounds_are_vllms(value: int, ratio: float, bounds: tuple[int, int]) -> None:
    """vLLM 0.32 ``get_sampling_params``: ``[floor(L (1 - r)), ceil(L (1 + r))]``, low >= 1."""
    assert length_bounds(value, ratio) == bounds


def test_a_ratio_of_one_or_more_is_refused_as_vllm_refuses_it() -> None:
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="0 <= r < 1"):
            length_bounds(100, bad)


def test_draws_are_uniform_over_the_range_and_their_mean_is_the_level() -> None:
    """100,000 draws: every one in range, both ends reached, the mean within 5 standard errors
    of L (the discrete uniform's variance is ((high - low + 1)**2 - 1) / 12), and each end's
    share within 5 binomial standard errors of 1 / (high - low + 1)."""
    value, ratio, n = 512, 0.5, 100_000
    low, high = length_bounds(value, ratio)
    drawn = draw_lengths(value, ratio, n, seed=3)
    assert min(drawn) == low and max(drawn) == high
    width = high - low + 1
    se = math.sqrt((width**2 - 1) / 12 / n)
    assert abs(statistics.fmean(drawn) - (low + high) / 2) <= 5 * se
    assert abs((low + high) / 2 - value) <= 0.5
    p = 1 / width
    for end in (low, high):
        share = drawn.count(end) / n
        assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / n), (end, share)


def test_draws_are_the_same_in_every_run_of_a_seed() -> None:
    one = draw_lengths(256, 0.4, 64, seed=7, what="input")
    assert one == draw_lengths(256, 0.4, 64, seed=7, what="input")
    assert one != draw_lengths(256, 0.4, 64, seed=8, what="input")
    assert one != draw_lengths(256, 0.4, 64, seed=7, what="output")  # a stream of its own
    # pinned: the draws do not depend on the process (string seeds, not hash())
    assert draw_lengths(100, 0.5, 5, seed=0) == draw_lengths(100, 0.5, 5, seed=0)
    assert len(draw_lengths(100, 0.5)) == RANGE_DRAWS


def test_the_workload_draws_per_level_and_seed() -> None:
    workload, _ = parse_throughput(
        (), {"concurrency": 2, "max_tokens": [64, 128], "input_tokens": 200, "range_ratio": 0.5}
    )
    outs = workload.output_lengths(64)
    assert outs is not None and len(outs) == RANGE_DRAWS
    assert all(32 <= n <= 96 for n in outs)
    assert outs == workload.output_lengths(64)  # the rerun sends what the baseline run sent
    longer = workload.output_lengths(128)
    assert longer is not None and all(64 <= n <= 192 for n in longer)
    ins = workload.input_lengths(200)
    assert ins is not None and all(100 <= n <= 300 for n in ins)
    reseeded, _ = parse_throughput(
        (), {"concurrency": 2, "max_tokens": 64, "range_ratio": 0.5, "seed": 1}
    )
    assert reseeded.output_lengths(64) != outs
    plain, _ = parse_throughput((), {"concurrency": 2, "max_tokens": 64})
    assert plain.output_lengths(64) is None and plain.input_lengths(None) is None


# ------------------------------------------------------------------------- marker validation
MARKER_ERRORS = [
    ({"range_ratio": 1.0}, r"range_ratio=1\.0: expected a number 0 <= r < 1"),
    ({"range_ratio": -0.2}, r"range_ratio=-0\.2: expected a number 0 <= r < 1"),
    ({"range_ratio": True}, r"range_ratio=True: expected"),
    ({"range_ratio": "0.5"}, r"range_ratio='0\.5': expected"),
    ({"range_ratio": math.nan}, r"range_ratio=nan: expected"),
    ({"range_ratio": {"output": 0.5}}, r"a dict needs exactly the keys 'input' and 'output'"),
    (
        {"range_ratio": {"input": 0.5, "output": 1.2}},
        r"range_ratio\['output'\]=1\.2: expected",
    ),
    (
        {"range_ratio": {"input": 0.5, "output": 0.5}},
        r"draws input lengths around input_tokens=, which is not given",
    ),
    (
        {"range_ratio": 0.5, "dataset": "builtin:sharegpt-small"},
        r"dataset= and range_ratio= are exclusive",
    ),
    ({"range_ratio": 0.5, "turns": 2}, r"turns=2 and range_ratio= are exclusive"),
    (
        {"range_ratio": 0.9, "max_tokens": 2_000_000},
        r"max_tokens=2000000 with range_ratio=0\.9 \(up to 3800000\) is above the bound 2097152",
    ),
    ({"burstiness": 0}, r"burstiness=0: expected a finite number > 0"),
    ({"rate": 2, "burstiness": -1}, r"burstiness=-1: expected a finite number > 0"),
    ({"rate": 2, "burstiness": math.inf}, r"burstiness=inf: expected a finite number > 0"),
    ({"burstiness": 0.5}, r"burstiness=0\.5 shapes the gaps between open-loop arrivals"),
    ({"max_concurrency": 0}, r"max_concurrency=0: expected an integer >= 1"),
    ({"rate": 2, "max_concurrency": 2.5}, r"max_concurrency=2\.5: expected an integer >= 1"),
    ({"concurrency": 8, "max_concurrency": 4}, r"max_concurrency=4 caps the requests in flight"),
    ({"rate": 2, "max_concurrency": 10**6}, r"max_concurrency=1000000 is above the bound 65536"),
]


@pytest.mark.parametrize("kwargs, message", MARKER_ERRORS)
def test_marker_errors_name_the_argument_and_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(MarkerError, match=message):
        parse_throughput((), kwargs)


def test_the_knobs_parse_and_their_defaults_are_the_old_workload() -> None:
    workload, _ = parse_throughput(
        (),
        {
            "rate": [2, 4],
            "burstiness": 0.5,
            "max_concurrency": 8,
            "range_ratio": {"input": 0.1, "output": 0.3},
            "input_tokens": 300,
        },
    )
    assert (workload.burstiness, workload.max_concurrency) == (0.5, 8)
    assert workload.range_ratio == (0.1, 0.3)
    # a single ratio without input_tokens draws the outputs (the prompts keep their lengths)
    out_only, _ = parse_throughput((), {"concurrency": 2, "range_ratio": 0.4})
    assert out_only.range_ratio == (0.4, 0.4) and out_only.input_lengths(None) is None
    defaults, _ = parse_throughput(
        (), {"rate": 2, "burstiness": 1.0, "range_ratio": 0, "max_concurrency": None}
    )
    assert defaults == parse_throughput((), {"rate": 2})[0]


def test_capacity_takes_the_ranges_and_burstiness_but_not_a_cap() -> None:
    spec, workload, _ = parse_capacity(
        (), {"rate": (1, 8), "max_ttft_s": 1.0, "range_ratio": 0.5, "burstiness": 2}
    )
    assert spec.metric == "rate" and workload.range_ratio == (0.5, 0.5)
    assert workload.burstiness == 2
    with pytest.raises(MarkerError, match="max_concurrency= is a cap on the requests in flight"):
        parse_capacity((), {"rate": (1, 8), "max_ttft_s": 1.0, "max_concurrency": 4})
    with pytest.raises(MarkerError, match=r"burstiness=2 shapes the gaps"):
        parse_capacity((), {"concurrency": (1, 8), "max_ttft_s": 1.0, "burstiness": 2})


# ----------------------------------------------------------------------------- baseline keys
def test_baseline_keys_carry_the_knobs_and_old_keys_still_match() -> None:
    plain, _ = parse_throughput((), {"rate": 2, "max_tokens": 64})
    old = {"api": "chat", "ignore_eos": True}
    assert workload_dict(plain) == old  # a baseline recorded before the knobs matches
    ranged, _ = parse_throughput((), {"rate": 2, "max_tokens": 64, "range_ratio": 0.5})
    assert workload_dict(ranged) == {**old, "range_ratio": 0.5, "seed": 0}
    split, _ = parse_throughput(
        (), {"rate": 2, "input_tokens": 100, "range_ratio": {"input": 0.2, "output": 0.5}}
    )
    assert workload_dict(split) == {
        **old,
        "range_ratio_input": 0.2,
        "range_ratio_output": 0.5,
        "seed": 0,
    }
    bursty, _ = parse_throughput((), {"rate": 2, "burstiness": 0.25, "max_concurrency": 4})
    assert workload_dict(bursty) == {**old, "burstiness": 0.25, "max_concurrency": 4}
    keys = {
        json.dumps(spec_key(w.levels[0], "builtin:diverse", w), sort_keys=True)
        for w in (plain, ranged, bursty)
    }
    assert len(keys) == 3  # none is compared with another's baseline


# ---------------------------------------------------------------------- bodies on the wire
def _spec(workload: Workload, tmp_path: Path, input_tokens: int | None = None) -> MeasureSpec:
    source = resolve_prompts(
        workload.prompts, input_tokens, tmp_path, lengths=workload.input_lengths(input_tokens)
    )
    bodies = encode_bodies(
        source, model="m", api="chat", max_tokens=0, ignore_eos=True, unique="0123abcd"
    )
    send = SendSpec(
        nodeid="t",
        target=Target("http://127.0.0.1:1/v1/chat/completions"),
        workload=workload,
        targets=parse_throughput((), {})[1],
        bodies={input_tokens: bodies},
        prompts_keys={input_tokens: source.key},
    )
    return MeasureSpec(send)


@pytest.mark.parametrize("protocol", ["stationary", "whole-requests"])
def test_each_body_carries_its_own_drawn_max_tokens(tmp_path: Path, protocol: str) -> None:
    workload, _ = parse_throughput(
        (), {"concurrency": 4, "max_tokens": 64, "range_ratio": 0.5, "protocol": protocol}
    )
    spec = _spec(workload, tmp_path)
    (level,) = workload.levels
    bodies = spec.send.bodies_for(level)
    drawn = workload.output_lengths(64)
    assert drawn is not None and len(bodies) == RANGE_DRAWS  # five prompts, cycled
    assert [json.loads(b)["max_tokens"] for b in bodies] == list(drawn)
    assert spec.send.lengths_for(level) == list(drawn)
    assert [json.loads(b)["messages"][0]["content"].split(" ", 1)[1] for b in bodies[:6]] == [
        *workload_prompts(),
        workload_prompts()[0],
    ]


def workload_prompts() -> list[str]:
    from pytest_kimi.workload.prompts import BUILTIN_PROMPTS

    return list(BUILTIN_PROMPTS["diverse"])


def test_stationary_openers_are_staggered_over_their_own_draws(tmp_path: Path) -> None:
    workload, _ = parse_throughput((), {"concurrency": 8, "max_tokens": 100, "range_ratio": 0.5})
    spec = _spec(workload, tmp_path)
    (level,) = workload.levels
    drawn = workload.output_lengths(100)
    assert drawn is not None
    for offset in (0, 3):
        first, lengths = spec.send.stationary_openers(level, offset)
        own = drawn[offset:] + drawn[:offset]
        assert lengths == [math.ceil((w + 0.5) / 8 * own[w]) for w in range(8)]
        assert [json.loads(b)["max_tokens"] for b in first] == lengths


def test_ranged_inputs_are_one_prompt_per_drawn_length(tmp_path: Path) -> None:
    workload, _ = parse_throughput(
        (), {"concurrency": 2, "max_tokens": 32, "input_tokens": 400, "range_ratio": 0.5}
    )
    spec = _spec(workload, tmp_path, 400)
    (level,) = workload.levels
    bodies = spec.send.bodies_for(level)
    ins = workload.input_lengths(400)
    assert ins is not None and len(bodies) == RANGE_DRAWS
    words = [len(json.loads(b)["messages"][0]["content"].split()) for b in bodies]
    # the estimate (no tokenizer here): 1.3 tokens per word, so words follow the draws
    # "Request <v>:" then the words, after the lead (one word)
    assert words == [2 + max(1, round(n / 1.3)) for n in ins]
    info = spec.send.length_info(level)["length_range"]
    assert info["range_ratio"] == 0.5
    assert info["input_tokens"]["range"] == [200, 600] and info["max_tokens"]["range"] == [16, 48]
    assert info["input_tokens"]["mean"] == round(statistics.fmean(ins), 1)


# ------------------------------------------------------------------ against the simulator
FAST = SimConfig(speed=20)


@pytest.mark.parametrize(
    "load",
    [
        {"concurrency": 4},
        {"concurrency": 4, "protocol": "whole-requests", "requests_per_stream": 3},
        {"rate": 4, "requests": 30},
    ],
    ids=["stationary", "whole-requests", "open-loop"],
)
def test_every_request_gets_its_drawn_lengths(
    sim_measure: Callable[..., Any], load: dict[str, Any]
) -> None:
    """Through the whole pipeline: each request returned exactly its body's drawn max_tokens
    (the measurement's own ignore_eos check: a mismatch would void the trial), those lengths
    spread over the range, and its prompt tokens (the server's count) over the input range."""
    kwargs = {"max_tokens": 48, "input_tokens": 96, "range_ratio": 0.5, "trials": 2, **load}
    measured = sim_measure(FAST, "ranged", **kwargs)
    measured.assert_valid_but_for_the_machine()
    level = measured.level
    workload, _ = parse_throughput((), kwargs)
    drawn = set(workload.output_lengths(48) or ())
    whole = [r for t in level.trials for r in t.records if r.ok and not r.cut and not r.max_tokens]
    assert whole and {r.completion_tokens for r in whole} <= drawn
    assert len({r.completion_tokens for r in whole}) >= min(len(whole), 8) // 2
    assert all(24 <= r.completion_tokens <= 72 for r in whole)
    prompts = [r.prompt_tokens for t in level.trials for r in t.records if r.prompt_tokens > 0]
    low, high = length_bounds(96, 0.5)
    assert low - 3 <= min(prompts) and max(prompts) <= high + 3  # sized to +-3 tokens
    assert max(prompts) - min(prompts) > (high - low) / 4
    info = level.extra["length_range"]
    assert info["max_tokens"]["range"] == [24, 72] and info["input_tokens"]["range"] == [48, 144]


def _run(pytester: pytest.Pytester, source: str, *args: str) -> tuple[Any, dict[str, Any]]:
    pytester.makepyfile(test_perf=source)
    run = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--endpoint=sim:speed=20",
        "--perf-json=r.json",
        *args,
    )
    report: dict[str, Any] = json.loads(Path("r.json").read_text())
    return run, report


RANGED = """
from pytest_kimi import throughput

@throughput(concurrency=4, max_tokens=48, input_tokens=96, range_ratio=0.5, trials=2)
def test_ranged():
    pass
"""


def test_a_ranged_session_records_and_finds_its_baseline(pytester: pytest.Pytester) -> None:
    """range_ratio= through the plugin: the JSON says the ranges, the baseline is keyed by the
    ratio and the seed, and the rerun (the same draws) finds it."""
    run, report = _run(pytester, RANGED, "--update-baselines", "--perf-max-trials=2")
    run.assert_outcomes(passed=1)
    (test,) = report["tests"]
    assert test["workload"]["range_ratio"] == 0.5 and test["workload"]["seed"] == 0
    (level,) = test["levels"]
    assert level["length_range"]["max_tokens"]["range"] == [24, 72]
    assert level["length_range"]["input_tokens"]["range"] == [48, 144]
    assert 48 - 3 <= level["prompt_tokens"]["min"] < level["prompt_tokens"]["max"] <= 144 + 3
    baseline = next(Path("baselines").rglob("test_ranged.yaml")).read_text()
    assert "range_ratio: 0.5" in baseline and "seed: 0" in baseline
    again, rerun = _run(pytester, RANGED, "--perf-max-trials=2")
    (level,) = rerun["tests"][0]["levels"]
    assert level["baseline_tok_s"] is not None, level["verdict"]  # the same key: compared
    assert level["length_range"] == test["levels"][0]["length_range"]


BURSTY = """
from pytest_kimi import throughput

@throughput(rate=20, burstiness=0.25, max_tokens=16, requests=40, trials=2)
def test_bursty():
    pass
"""


def test_a_bursty_session_keys_its_baseline_by_the_burstiness(
    pytester: pytest.Pytester,
) -> None:
    run, report = _run(pytester, BURSTY, "--update-baselines", "--perf-max-trials=2")
    run.assert_outcomes(passed=1)
    (test,) = report["tests"]
    assert test["workload"]["burstiness"] == 0.25
    (level,) = test["levels"]
    assert level["offered_rate"] == 20 and level["requests_ok"] == 80
    baseline = next(Path("baselines").rglob("test_bursty.yaml")).read_text()
    assert "burstiness: 0.25" in baseline


CAPPED = """
from pytest_kimi import throughput

@throughput(rate=50, max_concurrency=2, max_tokens=32, requests=30, trials=2)
def test_capped():
    pass
"""


def test_a_capped_session_says_how_late_the_cap_let_arrivals_go(
    pytester: pytest.Pytester,
) -> None:
    """At 50/s of 32-token requests the server finishes about 2 per request time: most
    arrivals wait for one of the 2 slots, the level says how long (server seconds), and the
    achieved rate is the cap's, well below the offered."""
    run, report = _run(pytester, CAPPED, "--perf-markdown=r.md")
    run.assert_outcomes(passed=1)
    (test,) = report["tests"]
    assert test["workload"]["max_concurrency"] == 2
    (level,) = test["levels"]
    queue = level["client_queue"]
    assert queue["max_concurrency"] == 2 and queue["arrivals"] == 60
    assert queue["queued"] >= 60 - 2 * 2 - 2
    assert 0 < queue["wait_s_p50"] <= queue["wait_s_p99"] <= queue["wait_s_max"]
    assert level["achieved_rate"] < 50 / 2
    assert any(e.startswith("note: max_concurrency=2: ") for e in level["errors"])
    assert "max_concurrency=2: " in Path("r.md").read_text()  # the report says so too
    run.stdout.fnmatch_lines(["*rate=50/s*50/*"])  # offered/sent/done: the cap's rate sent
    run.stdout.fnmatch_lines(["*note: rate=50/s*: max_concurrency=2: * arrivals waited*"])
