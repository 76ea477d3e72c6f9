"""pytest-kimi: LLM-serving throughput targets as pytest regression tests.

``@throughput(min_tok_s=60, concurrency=1)`` measures an OpenAI-compatible endpoint (SGLang,
vLLM, or the built-in simulator) before the test body runs and fails the test when a target
is missed.
"""

from __future__ import annotations

import pytest

from .results import LevelResult, ThroughputResult

__version__ = "0.1.0"

throughput = pytest.mark.throughput
"""``@throughput(concurrency=[1, 8], min_tok_s=60, ...)``: the same object as ``pytest.mark.throughput``."""

__all__ = ["throughput", "ThroughputResult", "LevelResult", "__version__"]
