"""What the real-engine suites (``tests/engine``: vLLM, ``tests/sglang``: SGLang) share.

Why: each lives in its own tox env and is skipped elsewhere with an instruction; each serves
the tiny Llama of ``tests/engine/make_tiny_model.py`` and shares the client's two cores with
a real engine.  Their conftests import these fixtures and call :func:`mark_suite`.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from support.busy_machine import ENGINE_SESSION_ATTEMPTS
from support.timing import ENGINE_SESSION_S

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


@pytest.fixture
def session_bound_s() -> float:
    """A longer bound than the simulator's sessions get: see :data:`ENGINE_SESSION_S`."""
    return ENGINE_SESSION_S


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


FIRST_RUN_MARKER = "@throughput(concurrency=[1, 4], max_tokens=128, trials=5, warmup=1)"


def first_run_after_a_launch(pytester: pytest.Pytester, profile: str) -> None:
    """One launch of ``profile``, the same test three times: the first (warmed until
    stationary) does not read below the later two beyond their own noise.

    The bias a cold first run has is downward (SGLang: up to 27% at the median before the
    warm-up); the noise here is the later runs' own: each level's lowest later median, less
    three standard errors of the trials' log medians (at least 5%).  Anchored on a later run,
    not on their mean: on a shared 2-core machine another job can halve a level's figure for
    one run (SGLang C=4 read 618, 261 and 385 tok/s in three runs on one server while the
    machine was busy), so the first run is held only against what the same server gave later.
    """
    pytester.makepyfile(
        test_suite="\n".join(
            ["from pytest_kimi import throughput", ""]
            + [
                f"{FIRST_RUN_MARKER}\ndef test_{name}():\n    pass\n"
                for name in ("first", "second", "third")
            ]
        )
    )
    path = pytester.path / "thrice.json"
    pytester.runpytest("-m", "perf", f"--server-profile={profile}", f"--perf-json={path}")
    first, *later = json.loads(path.read_text())["tests"]
    assert first.get("warm_up"), "the first test on a launch is warmed"
    assert all(t.get("warm_up") is None for t in later), "only the first"
    print(*(w["text"] for w in first["warm_up"]), sep="\n")
    for i, level in enumerate(first["levels"]):
        runs = [level] + [t["levels"][i] for t in later]
        logs = [[math.log(x) for x in lv["trials_tok_s"]] for lv in runs]
        # the standard error of a log median: 1.2533 sd / sqrt(n) (normal trials)
        se = max(1.2533 * statistics.stdev(x) / math.sqrt(len(x)) for x in logs)
        medians = [statistics.median(x) for x in logs]
        shortfall = min(medians[1:]) - medians[0]
        figures = [lv["tok_s"] for lv in runs]
        print(level["label"], figures, f"se {se:.4f}", f"shortfall {shortfall:+.4f}")
        assert shortfall <= max(3 * se, 0.05), (level["label"], figures, se)
