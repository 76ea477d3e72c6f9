"""``--perf-max-launches``: a decided test launches no further, and fails where it failed.

Registered only for a paired deploy comparison.  Before a perf test's next launch the
experiment so far is judged (:func:`pytest_kimi.run.deploy_gate.judge`, from the records this
process has: under xdist every perf test runs on one worker) and a test whose verdict is
decided is skipped there: a launch all of whose tests are decided is never started, since its
server fixture is set up only by a test that runs.  The launch whose figures complete a
failing verdict (a decided ``regression``, or ``inconclusive`` when the budget is spent) fails,
so the test that regressed is red in pytest's own outcome, JUnit XML included.
"""

from __future__ import annotations

import pytest

from pytest_kimi.plugin.nodeids import baseline_id
from typing import TYPE_CHECKING, Any, Sequence

from pytest_kimi.plugin.state import DEPLOYMENTS, GATE, PLAN, RESULT, STATE, kimi_options

if TYPE_CHECKING:
    from pytest_kimi.run.deploy_gate import DeployGate
    from pytest_kimi.wire import TestEntry


class PairedLaunches:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        params = getattr(getattr(item, "callspec", None), "params", {})
        block = params.get("kimi_perf_session")
        if not isinstance(block, int) or item.stash.get(PLAN, None) is None:
            return
        from pytest_kimi.run.deploy_gate import decided_block

        gate = self._judge(self.config.stash[STATE].tests)
        if gate is None:
            return
        failing = self.config.stash[GATE].settings.failing_verdicts()
        decided = decided_block(gate, baseline_id(item), failing)
        if decided is not None and block > decided:
            pytest.skip(
                f"the deploy comparison decided this test after {decided + 1} block(s) "
                f"({2 * (decided + 1)} launches): no further launch needed"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        """Fail the launch whose figures made a level's failing verdict final."""
        result = item.stash.get(RESULT, None)
        if result is None or result.perf_session is None:
            return
        failing = self.config.stash[GATE].settings.failing_verdicts()
        before = self._judge(self.config.stash[STATE].tests)
        after = self._judge([*self.config.stash[STATE].tests, result.to_dict()])
        if after is None:
            return
        known = set() if before is None else {_id(lv) for lv in before.failing(failing)}
        new = [lv for lv in after.failing(failing) if _id(lv) not in known]
        mine = [lv for lv in new if lv.nodeid == result.nodeid]
        if mine:
            from pytest_kimi.scrub import scrub_text

            lines = [f"  {lv.label} on {lv.candidate}: {lv.text()}" for lv in mine]
            pytest.fail(
                scrub_text(
                    f"deploy comparison against {after.reference}, completed by this launch:\n"
                    + "\n".join(lines)
                ),
                pytrace=False,
            )

    def _judge(self, tests: Sequence[TestEntry]) -> DeployGate | None:
        from pytest_kimi.run.deploy_gate import judge

        config = self.config
        settings = config.stash[GATE].settings
        return judge(
            tests,
            [d.name for d in config.stash[DEPLOYMENTS]],
            max_launches=kimi_options(config).perf_max_launches,
            tolerance=settings.tolerance,
            alpha=settings.alpha,
        )


def _id(level: Any) -> tuple[str, str, str]:
    return (level.candidate, level.nodeid, level.label)
