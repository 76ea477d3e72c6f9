"""A perf test's id as its baseline is keyed: pytest's id less the plugin's own parameters."""

from __future__ import annotations

import pytest

GROUP_SUFFIX = "@kimi-perf"
"""xdist's ``--dist loadgroup`` suffix of a perf test's id (see plugin/xdist.py)."""


def baseline_id(item: pytest.Item) -> str:
    """The test's id without xdist's group suffix or the deployment's and session's ids, so
    baselines do not depend on ``-n`` or on which deployments run."""
    from pytest_kimi.measure.results import session_id
    from pytest_kimi.run.plan import baseline_nodeid

    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    # our ids, in the order pytest_generate_tests adds them: "ep8", "s2" or "ep8-s2"
    ours = [params["kimi_deployment"].name] if params.get("kimi_deployment") is not None else []
    if isinstance(params.get("kimi_perf_session"), int):
        ours.append(session_id(params["kimi_perf_session"]))
    return baseline_nodeid(item.nodeid, ours, GROUP_SUFFIX)
