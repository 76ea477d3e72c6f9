"""pytest-xdist: perf tests share one endpoint, so they run one at a time, on one worker.

Parallel workers would measure each other's load.  With ``-n N`` the controller switches xdist
to ``--dist loadgroup`` and every perf test gets the same ``xdist_group``, so they all run, one
after another, on one worker; a lock file holds even where that grouping does not, and the
endpoint lock (:mod:`pytest_kimi.run.endpoint_lock`) holds between runs, xdist or not.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.plugin.nodeids import GROUP_SUFFIX
from pytest_kimi.plugin.state import PLAN, STATE, is_worker, kimi_options
from pytest_kimi.plugin.uncaptured import say

PERF_GROUP = GROUP_SUFFIX.removeprefix("@")


def group_perf_tests(config: pytest.Config) -> None:
    """Controller and workers: ``--dist load`` (or none) becomes ``loadgroup``.

    Workers are told through ``workerinput`` (see :func:`pytest_configure_node`) since they
    parse the original command line, where the distribution mode is still ``load``.
    """
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") in (
        "load",
        "no",
    ):
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker that perf tests are grouped."""
    node.workerinput["kimi_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


def worker_groups(config: pytest.Config) -> bool:
    """On a worker of a grouped run; xdist reads ``config.option.loadgroup`` right after the
    plugin's collection hook, when it names the groups' tests."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not workerinput.get("kimi_loadgroup"):
        return False
    config.option.loadgroup = True
    return True


def name_the_perf_group(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, give perf tests the ``@kimi-perf`` suffix ``--dist loadgroup`` groups by.

    xdist's worker sets ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is the
    structured ``_id``), so without this every perf test is a group of its own and the tests of
    one session spread over the workers, each launching a server of its own for it: two
    deployments up at once, and sessions that are not one start each.  Older pytest: xdist's
    own suffix is in place and this does nothing.

    This is the plugin's one use of pytest internals (``_pytest.nodeid.NodeId`` and
    ``item._id``); ``tests/test_xdist_internals.py`` fails loudly when pytest changes them.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not workerinput.get("kimi_loadgroup"):
        return
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9.2
    except ImportError:
        return
    for item in items:
        if item.stash.get(PLAN, None) is not None and not item.nodeid.endswith(GROUP_SUFFIX):
            item._id = NodeId.parse(item.nodeid + GROUP_SUFFIX)


@contextlib.contextmanager
def one_measurement_at_a_time(config: pytest.Config, endpoint_url: str) -> Iterator[None]:
    """One measurement at a time per endpoint, and under xdist one per rootdir as well.

    The endpoint lock (:mod:`pytest_kimi.run.endpoint_lock`) holds across every pytest-kimi
    process of this user on this machine, xdist or not: a second run against the same server
    waits (saying so once, naming the first) for at most ``--perf-lock-timeout`` and then raises
    :class:`~pytest_kimi.run.endpoint_lock.EndpointBusy`.  Under xdist the workers also take
    turns through a lock file in ``<rootdir>/.kimi/`` (taken first, so the two never wait on
    each other crosswise): each worker's simulator is an endpoint of its own, and measuring
    them at once would have them compete for this machine's cores.  Grouping perf tests on one
    worker (``--dist loadgroup``) is the first line; this holds even where it does not.  The
    measured interval (from the moment the locks are held) is recorded so a report shows that
    runs did not overlap.
    """
    from pytest_kimi.run import endpoint_lock

    opts = kimi_options(config)
    with contextlib.ExitStack() as held:
        if is_worker(config):
            # filelock, not fcntl: the plugin must import wherever pytest runs (Windows too).
            from filelock import FileLock

            path = Path(config.rootpath) / ".kimi" / "measure.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(FileLock(str(path)))
        held.enter_context(
            endpoint_lock.measuring(
                endpoint_url,
                timeout_s=opts.perf_lock_timeout,
                on_wait=lambda text: _say_waiting(config, text),
            )
        )
        started = time.time()
        yield
    config.stash[STATE].intervals.append((started, time.time()))


def _say_waiting(config: pytest.Config, text: str) -> None:
    """The wait's one line: on the terminal (the controller's, under xdist a worker has none:
    there it goes to the worker's stderr, which xdist shows when the worker crashes)."""
    if not say(config, f"[kimi] {text}"):
        print(f"[kimi] {text}", file=sys.stderr, flush=True)
