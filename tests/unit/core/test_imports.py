"""The pytest-free core really is pytest-free: checked in a fresh interpreter's sys.modules.

Parsing import lines is not enough: ``import pytest_kimi.baseline.store`` runs the package's
``__init__`` first, and whatever that imports is paid by every worker and simulator child.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pytest", "aiohttp", "numpy", "scipy", "_pytest")


def _loaded_after(statement: str) -> set[str]:
    code = (
        f"import sys\n{statement}\nimport json\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize(
    "statement, allowed",
    [
        ("import pytest_kimi", ()),
        ("import pytest_kimi.baseline", ()),
        ("import pytest_kimi.baseline.model", ()),
        ("import pytest_kimi.baseline.paths", ()),
        ("import pytest_kimi.baseline.provenance", ()),
        ("import pytest_kimi.baseline.yaml_io", ()),
        ("import pytest_kimi.baseline.merge", ()),
        ("import pytest_kimi.baseline.review", ()),
        ("import pytest_kimi.baseline.store", ()),
        # the update flow reads measure.results, which brings the load engine (pytest-free still)
        ("import pytest_kimi.baseline.update", ("aiohttp", "numpy")),
        ("import pytest_kimi.yamlstrict", ()),
        ("import pytest_kimi.workload.markers", ()),
        ("import pytest_kimi.load.records", ()),
        ("import pytest_kimi.scrub", ()),
        ("import pytest_kimi.endpoint.serverinfo", ()),
        ("import pytest_kimi.server", ()),
        ("import pytest_kimi.gate.stats", ("numpy", "scipy")),
        ("import pytest_kimi.sim.process", ()),
        ("import pytest_kimi.sim.app", ("aiohttp",)),
        ("import pytest_kimi.history", ()),
        ("import pytest_kimi.history.model", ()),
        ("import pytest_kimi.history.urls", ()),
        ("import pytest_kimi.history.rows", ()),
        ("import pytest_kimi.history.store", ()),
    ],
)
def test_core_modules_import_no_heavy_dependency(statement: str, allowed: tuple[str, ...]) -> None:
    loaded = _loaded_after(statement)
    assert not (loaded & set(HEAVY)) - set(allowed), sorted(loaded & set(HEAVY))


DATABASE = ("sqlalchemy", "alembic", "psycopg", "mako")


@pytest.mark.parametrize(
    "statement",
    [
        "import pytest_kimi.history",
        "import pytest_kimi.history.model",
        "import pytest_kimi.history.urls",
        "import pytest_kimi.options",  # every session reads --perf-history
        "import pytest_kimi.plugin",  # and opens the history only when it measured something
    ],
)
def test_history_faces_import_no_database_library(statement: str) -> None:
    """Most sessions never open the history (nothing measured): they do not pay for it."""
    loaded = _loaded_after(statement)
    assert not loaded & set(DATABASE), sorted(loaded & set(DATABASE))


def test_package_face_still_offers_the_marker_and_results() -> None:
    import pytest_kimi

    assert pytest_kimi.throughput == pytest.mark.throughput
    assert pytest_kimi.throughput is pytest_kimi.throughput
    from pytest_kimi import LevelResult, ThroughputResult, throughput  # noqa: F401

    with pytest.raises(AttributeError):
        pytest_kimi.no_such_name  # noqa: B018
