"""``--perf-sessions``: perf tests run server start by server start, in ABBA order."""

from __future__ import annotations

import pytest

from pytest_kimi.plugin.nodeids import baseline_id
from pytest_kimi.plugin.state import DEPLOYMENTS, perf_sessions
from pytest_kimi.plugin.xdist import name_the_perf_group
from pytest_kimi.run.server_starts import run_order
from pytest_kimi.server import ServerProfile


class SessionOrder:
    """Registered only for ``--perf-sessions`` N > 1.

    pytest's own ordering groups the items of a session-scoped parameter together, but picks
    the order of the groups itself; this hook runs after it (trylast) and lays the perf tests
    out start by start as :func:`run_order` says (A1 B1 B2 A2 ...), the tests in the same order
    in every start, as one block where the first perf test was.  Since each start's tests are
    contiguous, pytest tears its server down (the parameter changes) before the next one
    launches: one server up at a time.  Under xdist every worker computes the same order and
    the perf tests are one group on one worker, run in it.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = session_ordered(
            items, self.config.stash[DEPLOYMENTS], perf_sessions(self.config)
        )
        name_the_perf_group(self.config, items)


def session_ordered(
    items: list[pytest.Item], deployments: list[ServerProfile], sessions: int
) -> list[pytest.Item]:
    names = [d.name for d in deployments]
    rank = {start: i for i, start in enumerate(run_order(len(names), sessions))}
    perf: list[tuple[int, int, pytest.Item]] = []
    first_seen: dict[str, int] = {}
    rest: list[pytest.Item] = []
    at: int | None = None
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not isinstance(params.get("kimi_perf_session"), int):
            rest.append(item)
            continue
        at = len(rest) if at is None else at
        deployment = params.get("kimi_deployment")
        d = names.index(deployment.name) if deployment is not None else 0
        test = first_seen.setdefault(baseline_id(item), len(first_seen))
        perf.append((rank[(d, params["kimi_perf_session"])], test, item))
    if at is None:
        return items
    perf.sort(key=lambda entry: entry[:2])
    return [*rest[:at], *(item for _, _, item in perf), *rest[at:]]
