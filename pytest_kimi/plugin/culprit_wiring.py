"""``--perf-culprit``: the pytest side of the culprit search (the search is
:mod:`pytest_kimi.run.culprit_run`).

After the last test, while Ctrl-C still stops the session, the paired deploy comparison is
judged from the records; a decided regression is then explained by launching deployments
between the two profiles.  This module only gathers what the search needs from the session
(the tests' plans, the profiles, the options) and prints its progress past the capture.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pytest

from pytest_kimi.plugin.nodeids import baseline_id
from pytest_kimi.plugin.state import DEPLOYMENTS, PLAN, gate_context, kimi_options
from pytest_kimi.plugin.uncaptured import say

if TYPE_CHECKING:
    from pytest_kimi.run.culprit_run import CulpritReport
    from pytest_kimi.wire import TestEntry


def run_culprit(session: pytest.Session, tests: Sequence[TestEntry]) -> CulpritReport | None:
    """The search for the run's worst decided regression, or None (no option, no regression)."""
    config = session.config
    opts = kimi_options(config)
    deployments = config.stash[DEPLOYMENTS]
    if not opts.perf_culprit or not opts.perf_max_launches or len(deployments) != 2:
        return None
    from functools import partial

    from pytest_kimi.run.conductor import Conditions
    from pytest_kimi.run.culprit_run import launch_and_measure, search_culprit
    from pytest_kimi.run.deploy_gate import judge

    gate = gate_context(config)
    paired = judge(
        tests,
        [d.name for d in deployments],
        max_launches=opts.perf_max_launches,
        tolerance=gate.settings.tolerance,
        alpha=gate.settings.alpha,
        finished=True,
    )
    if paired is None:
        return None
    plans = {baseline_id(item): item.stash[PLAN] for item in session.items if PLAN in item.stash}
    rootdir = Path(config.rootpath)
    conditions = Conditions.of(opts, rootdir)

    def tell(text: str) -> None:
        say(config, f"[kimi culprit] {text}")

    measure = partial(
        launch_and_measure,
        settings=gate.settings,
        conditions=conditions,
        opts=opts,
        rootdir=rootdir,
        store=gate.store(None),
        say=tell,
    )
    return search_culprit(
        paired,
        deployments,
        plans,
        measure,
        max_launches=opts.perf_max_launches,
        say=tell,
    )


def junit_culprit(report: CulpritReport) -> dict[str, str]:
    """The answer as global ``--junitxml`` properties (``kimi_culprit_status``,
    ``kimi_culprit_named``, ``kimi_culprit``: the summary line): the search runs after the
    last test, so no test's properties can carry it."""
    from pytest_kimi.scrub import scrub_text

    section = report.to_dict()
    props = {
        "kimi_culprit_status": str(section["status"]),
        "kimi_culprit_named": ",".join(section.get("named") or []),
    }
    if report.outcome is not None:
        props["kimi_culprit"] = scrub_text(report.outcome.summary())
    return props
