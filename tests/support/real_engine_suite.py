"""What the real-engine suites (``tests/engine``: vLLM, ``tests/sglang``: SGLang) share.

Why: each lives in its own tox env and is skipped elsewhere with an instruction; each serves
the tiny Llama of ``tests/engine/make_tiny_model.py`` and shares the client's two cores with
a real engine.  Their conftests import these fixtures and call :func:`mark_suite`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support.busy_machine import ENGINE_SESSION_ATTEMPTS

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "engine"))

import make_tiny_model  # noqa: E402  (tests/engine, put on the path above)


def mark_suite(
    items: list[pytest.Item], here: Path, marker: str, installed: bool, skip_reason: str
) -> None:
    """Give every test under ``here`` the suite's ``marker``; skip them where the engine is
    not ``installed``, with ``skip_reason`` (the tox env that has it), never fail them."""
    for item in items:
        if here not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(getattr(pytest.mark, marker))
        if not installed:
            item.add_marker(pytest.mark.skip(reason=skip_reason))


@pytest.fixture
def session_attempts() -> int:
    """More attempts than the simulator's sessions get: see :data:`ENGINE_SESSION_ATTEMPTS`."""
    return ENGINE_SESSION_ATTEMPTS


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama, built (or taken from the user cache) under ``.kimi/models``."""
    return make_tiny_model.ensure(REPO)


# pytester's inline runs put sys.modules back after each run, and the plugin imports its run
# stage (numpy, scipy.stats, aiohttp) only once a perf test is collected, that is inside the
# first inline run: the next one would import numpy's C extensions a second time in this process
# ("cannot load module more than once per process").  So they are imported here, once.
import scipy.stats  # noqa: E402,F401
import pytest_kimi.plugin.fixtures  # noqa: E402,F401
import pytest_kimi.run.conductor  # noqa: E402,F401
import pytest_kimi.run.finish  # noqa: E402,F401
