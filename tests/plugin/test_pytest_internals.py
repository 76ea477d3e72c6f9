"""The plugin's dependencies on what pytest and its plugins do not promise, each held to it.

``plugin/xdist.py`` renames perf tests' node ids (``item._id``, ``_pytest.nodeid.NodeId``) so
that xdist's ``--dist loadgroup`` groups them under pytest 9.2; ``plugin/hooks.py`` declares
pytest-asyncio's ``asyncio_default_fixture_loop_scope`` again with a default.  When pytest or
pytest-asyncio change what these rely on, these tests fail and say what to look at, instead of
perf tests silently spreading over workers or users seeing a deprecation warning again.
"""

from __future__ import annotations

import pytest


def test_node_ids_are_still_the_structured_id_the_xdist_grouping_sets() -> None:
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9.2: xdist's own suffix works, the plugin does nothing
        pytest.skip("pytest before 9.2 reads the id xdist sets")
    parsed = NodeId.parse("test_a.py::test_x[ep8]@kimi-perf")
    assert str(parsed) == "test_a.py::test_x[ep8]@kimi-perf", (
        "pytest changed NodeId: plugin/xdist.py name_the_perf_group must follow"
    )


def test_the_grouping_rename_reaches_the_item_id(pytester: pytest.Pytester) -> None:
    """``item._id`` is what ``item.nodeid`` reads: a rename there is what xdist groups by."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:
        pytest.skip("pytest before 9.2")
    pytester.makepyfile("def test_x(): pass")
    items, _ = pytester.inline_genitems()
    (item,) = items
    assert hasattr(item, "_id"), "pytest no longer keeps a node's id in _id: see plugin/xdist.py"
    item._id = NodeId.parse(item.nodeid + "@kimi-perf")
    assert item.nodeid.endswith("@kimi-perf"), "item.nodeid no longer reads _id: plugin/xdist.py"


def test_a_users_suite_prints_no_pytest_asyncio_loop_scope_warning(
    pytester: pytest.Pytester,
) -> None:
    """A user's suite with no pytest-asyncio configuration: no deprecation warning, and an
    ``async def`` test with an async fixture runs (the plugin gave the loop scope a default)."""
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(
        """
        import pytest_asyncio

        @pytest_asyncio.fixture
        async def value():
            return 3

        async def test_async(value):
            assert value == 3
        """
    )
    result = pytester.runpytest_subprocess("-W", "error::pytest.PytestDeprecationWarning")
    result.assert_outcomes(passed=1)
    assert "asyncio_default_fixture_loop_scope" not in result.stdout.str().replace(
        "asyncio_default_fixture_loop_scope=function", ""
    )


def test_the_users_own_loop_scope_still_wins(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = module\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*asyncio_default_fixture_loop_scope=module*"])
