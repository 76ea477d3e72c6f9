"""The plugin's figures against the simulator's known truth.

The simulator's step time for b running sequences is exact by construction, so its steady-state
aggregate rate at closed-loop concurrency C is ``true_tok_s(C)``, a running stream decodes at
``request_tok_s(C)``, and an idle server answers the first token after one step plus prefill.
The measured figures must match within 2% (TTFT within a small absolute allowance for the
loopback round trip).
"""

from __future__ import annotations

import pytest

from pytest_kimi.endpoint import EndpointInfo
from pytest_kimi.markers import parse_throughput
from pytest_kimi.session import PerfSession, build_spec
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
                (), dict(concurrency=concurrency, requests=concurrency, max_tokens=256, trials=3, warmup=2)
            )
            spec = build_spec(endpoint, "accuracy", workload, targets, rootdir=pytestconfig.rootpath)
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


@pytest.mark.parametrize("concurrency", [1, 8, 64, 256])
def test_request_tok_s_within_2_percent(measured, concurrency: int) -> None:
    level = measured[concurrency]
    expected = PROFILE.request_tok_s(concurrency)
    assert level.figures.request_tok_s_p50 == pytest.approx(expected, rel=0.02)


def test_ttft_on_an_idle_server_matches_step_plus_prefill(measured) -> None:
    level = measured[1]
    records = [r for t in level.trials for r in t.records]
    for rec in records:
        expected = PROFILE.expected_ttft_s(rec.prompt_tokens, 1)
        # a loopback round trip plus the event loop's millisecond timer granularity
        assert rec.ttft == pytest.approx(expected, rel=0.02, abs=0.0015), (rec.ttft, expected)


def test_token_counts_and_itl(measured) -> None:
    for level in measured.values():
        for trial in level.trials:
            assert trial.valid, trial.invalid
            for rec in trial.records:
                assert rec.ok and rec.completion_tokens == 256 and not rec.tokens_approx
        step = PROFILE.step_time(min(level.concurrency, PROFILE.max_running_requests))
        assert level.figures.itl_s_p50 == pytest.approx(step, rel=0.05)
