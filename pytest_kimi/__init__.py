"""pytest-kimi: LLM-serving throughput targets as pytest regression tests.

``@throughput(min_tok_s=60, concurrency=1)`` measures an OpenAI-compatible endpoint (SGLang,
vLLM, or the built-in simulator) before the test body runs and fails the test when a target
is missed.

The package face is lazy (PEP 562): ``import pytest_kimi.baseline.store`` or ``python -m
pytest_kimi.sim`` must not pay for pytest, aiohttp and numpy when they do not use them (every
load-worker process and simulator child imports this package first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    import pytest

    from pytest_kimi.measure.results import LevelResult, ThroughputResult
    from pytest_kimi.workload.ramp import ramp

    throughput: pytest.MarkDecorator
    capacity: pytest.MarkDecorator

__all__ = ["throughput", "capacity", "ramp", "ThroughputResult", "LevelResult", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "throughput":
        import pytest

        # ``@throughput(concurrency=[1, 8], min_tok_s=60, ...)``: ``pytest.mark.throughput``,
        # made once and kept, so every import gets the same object.
        mark = globals()["throughput"] = pytest.mark.throughput
        return mark
    if name == "capacity":
        import pytest

        # ``@capacity(max_itl_s=0.05, concurrency=(1, 512))``: ``pytest.mark.capacity``, kept
        mark = globals()["capacity"] = pytest.mark.capacity
        return mark
    if name == "ramp":
        # ``@throughput(rate=ramp(1, 16, steps=4))``: open-loop levels from 1 to 16 requests/s
        from pytest_kimi.workload.ramp import ramp

        return ramp
    if name in ("ThroughputResult", "LevelResult"):
        from pytest_kimi.measure import results

        return getattr(results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
