"""The perf suite a Kimi K2.6 operator keeps for an 8-GPU EP8 deployment.

Targets come from the seeds' hand-made benchmarks of SGLang EP8 (tuned: max-running-requests
256, num-continuous-decode-steps 8): about 65 tok/s for a single stream and about 1500 tok/s
aggregate near C=256.  The floors leave room for noise but not for a deploy change like the
one that turned on EPLB and dropped the peak to 862 tok/s.

Run against a deployment:  pytest -m perf --endpoint=http://HOST:30001
Run against the simulator: pytest -m perf --endpoint=sim:speed=10,stream_interval=8
"""

from pytest_kimi import ThroughputResult, throughput


@throughput(concurrency=1, max_tokens=512, prompts="diverse", requests=5, min_tok_s=60)
def test_single_stream() -> None:
    """One user at a time, five diverse prompts, fixed 512-token answers (ignore_eos)."""


@throughput(
    concurrency=[1, 4, 16, 64, 256],
    max_tokens=2048,
    prompts="diverse",
    min_tok_s={256: 1400},
)
def test_concurrency_sweep(throughput_result: ThroughputResult) -> None:
    """Aggregate throughput must keep growing with load and peak above 1400 tok/s."""
    rates = [lv.figures.tok_s for lv in throughput_result.levels]
    assert all(r is not None for r in rates)
    assert rates == sorted(rates), f"aggregate tok/s fell while load grew: {rates}"
    assert max(rates) >= 1400
