"""Upper bounds on marker values, checked at collection: ``concurrency=10**7`` took 5.6 GB and died
with ``SystemError``, ``input_tokens=10**9`` 3.2 GB silently, ``trials=10**9`` was accepted and
``rate=float("inf")`` raised ``OverflowError`` at setup.  Now each stops the run at collection
(nothing is sent) with a message naming the test, the value, the bound and the override
(``--perf-allow-large``); non-finite numbers are refused even with the override.
"""

from __future__ import annotations

import pytest

from pytest_kimi.options import OPTIONS
from pytest_kimi.workload import marker_bounds, markers
from pytest_kimi.workload.capacity_marker import parse_capacity
from pytest_kimi.workload.marker_bounds import ALLOW_LARGE_FLAG, BOUNDED_ARGS
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import MarkerError

DEAD = "--endpoint=http://127.0.0.1:9"
"""Nothing listens there: a run that got past collection would fail to connect, not hang."""

OVERRIDE = "*if you mean it, run with --perf-allow-large (or ini kimi_perf_allow_large = true)*"

THROUGHPUT_CASES = [
    ("concurrency=10**7", "concurrency=10000000 is above the bound 65536"),
    ("concurrency=[1, 8, 10**6]", "concurrency=1000000 is above the bound 65536"),
    ("input_tokens=10**9", "input_tokens=1000000000 is above the bound 2097152"),
    ("max_tokens=10**8", "max_tokens=100000000 is above the bound 2097152"),
    ("trials=10**9", "trials=1000000000 is above the bound 1000"),
    ("rate=10**6", "rate=1000000 is above the bound 10000"),
    ("rate=ramp(1, 10**6)", "rate=ramp(1, 1e+06, steps=4) is above the bound 10000"),
    ("requests=10**8", "requests=100000000 is above the bound 1000000"),
    ("requests_per_stream=10**7", "requests_per_stream=10000000 is above the bound 1000000"),
    ("duration_s=1e7", "duration_s=10000000 is above the bound 86400"),
    ("timeout_s=1e7", "timeout_s=10000000 is above the bound 86400"),
    ("turns=10**5", "turns=100000 is above the bound 1000"),
    ("warmup=10**6", "warmup=1000000 is above the bound 10000"),
    (
        "dataset='builtin:sharegpt-small', num_prompts=10**8",
        "num_prompts=100000000 is above the bound 1000000",
    ),
    ("shared_prefix_tokens=10**8", "shared_prefix_tokens=100000000 is above the bound 2097152"),
    (
        "shared_prefix_tokens=16, prefix_groups=10**6",
        "prefix_groups=1000000 is above the bound 65536",
    ),
    (
        "shared_prefix_tokens=2**21, prefix_groups=64",
        "shared_prefix_tokens=2097152 x prefix_groups=64 is 134217728 tokens, above the bound "
        "33554432",
    ),
    (
        "concurrency=4096, requests_per_stream=1000",
        "a trial at C=4096 sends 4096000 requests, above the bound 1000000",
    ),
    ("concurrency=list(range(1, 1002))", "the sweep has 1001 levels, above the bound 1000"),
]

CAPACITY_CASES = [
    ("concurrency=(1, 10**7)", "the top of concurrency=(1, 10000000) is above the bound 65536"),
    ("rate=(1, 10**6)", "the top of rate=(1, 1000000) is above the bound 10000"),
    ("max_levels=10**5", "max_levels=100000 is above the bound 1000"),
    ("input_tokens=10**9", "input_tokens=1000000000 is above the bound 2097152"),
    (
        "concurrency=(1, 8192), requests_per_stream=500",
        "a trial at C=8192 sends 4096000 requests, above the bound 1000000",
    ),
]

NON_FINITE_CASES = [
    ('rate=float("inf")', "rate=inf: expected a finite number > 0"),
    ('rate=[1, float("nan")]', "rate=nan: expected a finite number > 0"),
    ('duration_s=float("inf")', "duration_s=inf: expected a finite number > 0"),
    ('max_ttft_s=float("inf")', "max_ttft_s=inf: expected a finite number > 0"),
    ('min_tok_s=float("inf")', "min_tok_s=inf: expected a finite number > 0"),
    (
        'rate=ramp(1, 4, duration_s=float("inf"))',
        "rate=ramp(1, 4, steps=4, duration_s=inf): duration_s must be a finite number of seconds",
    ),
]


def _marked(pytester: pytest.Pytester, marker: str, args: str) -> None:
    pytester.makepyfile(
        test_big=f"""
        from pytest_kimi import {marker}, ramp

        @{marker}({args}{", max_itl_s=0.05" if marker == "capacity" else ""})
        def test_big():
            pass
        """
    )


@pytest.mark.parametrize("args, expected", THROUGHPUT_CASES + NON_FINITE_CASES)
def test_a_value_above_its_bound_stops_collection(
    pytester: pytest.Pytester, args: str, expected: str
) -> None:
    _marked(pytester, "throughput", args)
    result = pytester.runpytest(DEAD)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_big.py::test_big: @throughput {expected}*"])
    if (args, expected) in THROUGHPUT_CASES:
        result.stderr.fnmatch_lines([OVERRIDE])
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize("args, expected", CAPACITY_CASES)
def test_a_capacity_value_above_its_bound_stops_collection(
    pytester: pytest.Pytester, args: str, expected: str
) -> None:
    _marked(pytester, "capacity", args)
    result = pytester.runpytest(DEAD)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_big.py::test_big: @capacity {expected}*"])
    result.stderr.fnmatch_lines([OVERRIDE])


@pytest.mark.parametrize(
    "marker, args",
    [
        ("throughput", "concurrency=10**5, trials=2000"),
        ("throughput", "input_tokens=3 * 2**20"),
        ("capacity", "concurrency=(1, 10**5)"),
    ],
)
@pytest.mark.parametrize("how", ["flag", "ini", "env"])
def test_the_override_lets_a_large_value_through_collection(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, marker: str, args: str, how: str
) -> None:
    _marked(pytester, marker, args)
    monkeypatch.delenv("KIMI_PERF_ALLOW_LARGE", raising=False)
    refused = pytester.runpytest(DEAD, "--collect-only", "-q")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*is above the bound*" + OVERRIDE])
    extra: list[str] = []
    if how == "flag":
        extra.append(ALLOW_LARGE_FLAG)
    elif how == "ini":
        pytester.makeini("[pytest]\nkimi_perf_allow_large = true\n")
    else:
        monkeypatch.setenv("KIMI_PERF_ALLOW_LARGE", "1")
    result = pytester.runpytest(DEAD, "--collect-only", "-q", *extra)
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.stdout.fnmatch_lines(["*test_big.py::test_big*", "1 test collected*"])


@pytest.mark.parametrize("args, expected", NON_FINITE_CASES)
def test_the_override_never_lets_a_non_finite_number_through(
    pytester: pytest.Pytester, args: str, expected: str
) -> None:
    _marked(pytester, "throughput", args)
    result = pytester.runpytest(DEAD, "--collect-only", ALLOW_LARGE_FLAG)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_big.py::test_big: @throughput {expected}*"])


def test_every_bound_has_a_reason_and_the_override_is_an_option() -> None:
    for name, bound in BOUNDED_ARGS.items():
        assert name in markers.ALLOWED_ARGS
        assert bound.limit > 0 and len(bound.why) > 10, name
    flags = {opt.flag for opt in OPTIONS.values()}
    assert ALLOW_LARGE_FLAG in flags
    allow = OPTIONS["perf_allow_large"]
    assert (allow.ini, allow.env) == ("kimi_perf_allow_large", "KIMI_PERF_ALLOW_LARGE")
    assert allow.ini in marker_bounds.ALLOW_LARGE_HINT


def test_values_at_their_bounds_are_accepted() -> None:
    """The bounds are inclusive and generous: the largest accepted value of each parses."""
    at = {
        "concurrency": 65_536,
        "input_tokens": 2_097_152,
        "max_tokens": 2_097_152,
        "trials": 1_000,
        "timeout_s": 86_400,
        "warmup": 10_000,
    }
    workload, _ = parse_throughput((), at)
    assert workload.levels[0].concurrency == 65_536 and workload.trials == 1_000
    for name, value in at.items():  # and one more is refused
        with pytest.raises(MarkerError, match=f"^{name}={value + 1} is above the bound {value} "):
            parse_throughput((), {**at, name: value + 1})
    parse_throughput((), {"rate": 10_000, "duration_s": 86_400 / 1_000})
    parse_throughput((), {"concurrency": 1_000, "requests_per_stream": 1_000})
    parse_capacity((), {"concurrency": (1, 65_536), "max_itl_s": 0.05, "max_levels": 1_000})


def test_the_parsers_take_the_override() -> None:
    with pytest.raises(MarkerError, match="--perf-allow-large"):
        parse_throughput((), {"concurrency": 10**7})
    workload, _ = parse_throughput((), {"concurrency": 10**7}, allow_large=True)
    assert workload.levels[0].concurrency == 10**7
    spec, _, _ = parse_capacity(
        (), {"concurrency": (1, 10**7), "max_itl_s": 0.05}, allow_large=True
    )
    assert spec.high == 10**7


def test_a_kimi_load_sweep_keeps_to_the_bounds_unless_allowed(pytester: pytest.Pytester) -> None:
    """``kimi_load.sweep`` takes ``@throughput``'s arguments, and so its bounds: refused with
    the flag that lifts them named, and measured with ``--perf-allow-large`` (a request
    timeout above a day costs nothing to allow)."""
    pytester.makepyfile(
        test_sweep="""
        def test_sweep(kimi_load):
            kimi_load.sweep_sync(concurrency=[1], max_tokens=16, trials=1, warmup=0,
                                 timeout_s=100_000)
        """
    )
    refused = pytester.runpytest("--endpoint=sim:speed=20")
    refused.assert_outcomes(failed=1)
    refused.stdout.fnmatch_lines(["*timeout_s*--perf-allow-large*"])
    allowed = pytester.runpytest("--endpoint=sim:speed=20", "--perf-allow-large")
    allowed.assert_outcomes(passed=1)
