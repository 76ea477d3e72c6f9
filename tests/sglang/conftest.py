"""SGLang tests: the plugin against real SGLang 0.5.23, its CPU engine serving the tiny Llama.

They need SGLang 0.5.23 installed CPU-only, which neither the plugin's install nor
``tox -e engine`` pulls in (its own pins want CUDA torch): ``tox -e sglang`` makes that
environment (``tests/sglang/requirements.txt``, the stand-ins of ``tests/sglang/standin``) and
runs them.  Anywhere else they are skipped with that instruction, never failed.  The model is
the one ``tests/engine/make_tiny_model.py`` makes (imported from there, not copied), named to
the profile through ``KIMI_TINY_MODEL``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

from support.real_engine_suite import (  # noqa: E402,F401
    mark_suite,
    session_attempts,
    session_bound_s,
    tiny_model,
)

# pytester's inline runs put sys.modules back after each run, so a module first imported inside
# one is imported afresh by the next; SQLAlchemy does not survive that in one process (storing
# the run's history then fails with "'InternalTraversal' object is not callable"), so the
# history's modules are imported here, once, before any inline run
import alembic.command  # noqa: E402,F401
import pytest_kimi.history.store  # noqa: E402,F401

SGLANG_VERSION = "0.5.23"
SKIP_REASON = (
    f"real SGLang {SGLANG_VERSION} (CPU engine) is not installed in this environment; "
    "`tox -e sglang` creates one (tests/sglang/requirements.txt, then pip install --no-deps "
    f"sglang=={SGLANG_VERSION}) and runs these tests"
)
PROFILE = REPO / "servers" / "sglang-cpu-tiny.yaml"


def sglang_installed() -> bool:
    """Cheap check (importing sglang takes ~10 s): the real package, at the version these
    tests were written against, is on the path.  ``tests/fake_sglang`` is also called
    ``sglang`` but has no distribution metadata."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None or "fake_sglang" in spec.origin:
        return False
    try:
        return importlib.metadata.version("sglang") == SGLANG_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sglang: needs real SGLang 0.5.23's CPU engine; `tox -e sglang` runs them"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_suite(items, HERE, "sglang", sglang_installed(), SKIP_REASON)


@pytest.fixture(scope="session")
def sglang_profile(tiny_model: Path) -> Path:  # noqa: F811 (the fixture)
    """The repository's SGLang CPU profile (it reads ``KIMI_TINY_MODEL``)."""
    return PROFILE


@pytest.fixture(scope="session")
def tiny_model_path(tiny_model: Path) -> Path:  # noqa: F811 (the fixture)
    """The tiny Llama (``tiny_model``), as an absolute path."""
    return tiny_model.resolve()


@pytest.fixture
def sglang_project(pytester: pytest.Pytester, sglang_profile: Path) -> pytest.Pytester:
    """A pytester project with the profile copied in, so baselines land in its tmp dir."""
    shutil.copy(sglang_profile, pytester.path / sglang_profile.name)
    return pytester
