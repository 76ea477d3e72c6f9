"""The plugin's figures against the simulator's known truth.

The simulator's step time for b running sequences is exact by construction, so its steady-state
aggregate rate at closed-loop concurrency C is ``true_tok_s(C)``, a running stream decodes at
``request_tok_s(C)``, and an idle server answers the first token after one step plus prefill.
The measured figures must match within 2% (TTFT within a small absolute allowance for the
loopback round trip).
"""

from __future__ import annotations

import pytest

from pytest_kimi.endpoint.discovery import EndpointInfo
from pytest_kimi.spec.markers import parse_throughput
from pytest_kimi.measure.session import PerfSession, build_spec
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.profile import SimProfile

PROFILE = SimProfile(speed=10.0)
"""EP8 shape at 10x: 650 tok/s at C=1 up to ~15,000 tok/s at C=256."""


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    sim = SimProcess(PROFILE, log_dir=tmp_path_factory.mktemp("simlogs"))
    sim.start()
    session = PerfSession()
    try:
        endpoint: EndpointInfo = session.discover(sim.url, api_key=None, model=None)
        levels = {}
        for concurrency in (1, 8, 64, 256):
            # One request per worker: every trial is a single clean round, the purest steady state.
            workload, targets = parse_throughput(
                (),
                dict(
                    concurrency=concurrency,
                    requests=concurrency,
                    max_tokens=256,
                    trials=2,
                    warmup=2,
                ),
            )
            spec = build_spec(
                endpoint, "accuracy", workload, targets, rootdir=pytestconfig.rootpath
            )
            levels[concurrency] = session.measure(spec).level(concurrency)
        yield levels
    finally:
        session.close()
        sim.stop()


@pytest.mark.parametrize("concurrency", [1, 8, 64, 256])
def test_aggregate_tok_s_within_2_percent(measured, concurrency: int) -> None:
    level = measured[concurrency]
    assert level.verdict == "pass", level.reasons
    expected = PROFILE.true_tok_s(concurrency)
    got = level.figures.tok_s
    assert got == pytest.approx(expected, rel=0.02), (got, expected, level.figures.trials_tok_s)


@pytest.fixture(scope="module")
def c8_long(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    """C=8 over 2048 steps per trial: the window's edges are exact, but on a busy machine the
    simulator itself can deliver a boundary step a few milliseconds late; over ~4.8 s that is
    well under the 0.05% asserted, where over 256 steps (0.6 s) it would not be."""
    sim = SimProcess(PROFILE, log_dir=tmp_path_factory.mktemp("simlogs"))
    sim.start()
    session = PerfSession()
    try:
        endpoint = session.discover(sim.url, api_key=None, model=None)
        workload, targets = parse_throughput(
            (), dict(concurrency=8, requests=8, max_tokens=2048, trials=3, warmup=2)
        )
        spec = build_spec(endpoint, "accuracy-c8", workload, targets, rootdir=pytestconfig.rootpath)
        yield session.measure(spec).level(8)
    finally:
        session.close()
        sim.stop()


def test_c8_tok_s_matches_the_truth_to_0_05_percent(c8_long) -> None:
    """The window holds whole steps: no bias left.  A window that ended on the first stream's
    last token dropped C - 1 tokens of the final step, reading 0.34% low at C=8 and 256 tokens
    ((C - 1) / (C * steps)); at 2048 tokens that bias would still be -0.04%, so the bound below
    is met only by a median that is unbiased to a few hundredths of a percent."""
    level = c8_long
    assert level.verdict == "pass", level.reasons
    expected = PROFILE.true_tok_s(8)
    got = level.figures.tok_s
    assert got == pytest.approx(expected, rel=0.0005), (
        got,
        expected,
        [f"{(t / expected - 1) * 100:+.3f}%" for t in level.figures.trials_tok_s],
    )


@pytest.mark.parametrize("concurrency", [1, 8, 64, 256])
def test_request_tok_s_within_2_percent(measured, concurrency: int) -> None:
    level = measured[concurrency]
    expected = PROFILE.request_tok_s(concurrency)
    assert level.figures.request_tok_s_p50 == pytest.approx(expected, rel=0.02)


@pytest.fixture(scope="module")
def ttft_records(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    """Single requests with long prompts on a real-time simulator: TTFT is step + prefill."""
    sim = SimProcess(TTFT_PROFILE, log_dir=tmp_path_factory.mktemp("simlogs"))
    sim.start()
    session = PerfSession()
    try:
        endpoint = session.discover(sim.url, api_key=None, model=None)
        workload, targets = parse_throughput(
            (), dict(concurrency=1, requests=4, max_tokens=8, input_tokens=1500, trials=1, warmup=1)
        )
        spec = build_spec(endpoint, "ttft", workload, targets, rootdir=pytestconfig.rootpath)
        level = session.measure(spec).level(1)
        yield [r for t in level.trials for r in t.records]
    finally:
        session.close()
        sim.stop()


TTFT_PROFILE = SimProfile(speed=1.0)
HTTP_ROUND_TRIP_S = 0.0025
"""Upper bound of what one loopback request/response through two Python HTTP stacks adds."""


def test_ttft_on_an_idle_server_matches_step_plus_prefill(ttft_records) -> None:
    assert len(ttft_records) == 4
    for rec in ttft_records:
        expected = TTFT_PROFILE.expected_ttft_s(rec.prompt_tokens, 1)
        assert expected > 0.04, "prefill of a long prompt dominates"
        assert expected * 0.98 <= rec.ttft <= expected * 1.02 + HTTP_ROUND_TRIP_S, (
            rec.ttft,
            expected,
        )


def test_token_counts_and_itl(measured) -> None:
    for level in measured.values():
        for trial in level.trials:
            assert trial.valid, trial.invalid
            for rec in trial.records:
                assert rec.ok and rec.completion_tokens == 256 and not rec.tokens_approx
        step = PROFILE.step_time(min(level.concurrency, PROFILE.max_running_requests))
        assert level.figures.itl_s_p50 == pytest.approx(step, rel=0.05)
