"""The statistical gate's documented names, importable from one place.

docs/statistics.md shows ``from pytest_kimi.gate.stats import ...`` for the gate's functions,
and users' own scripts (an offline comparison of two reports, a power simulation) call them
from here; the package itself imports each from its home:

* :mod:`pytest_kimi.gate.two_sample` -- one level against its baseline: the model, the tests,
  power, the verdict order (:func:`compare_batch`, :func:`smallest_vouchable_drop`);
* :mod:`pytest_kimi.gate.family_verdicts` -- the levels of one test as one family, and the
  test's common shift (:func:`compare_family`, :func:`compare_test`, :func:`compare_level`,
  :class:`Design`);
* :mod:`pytest_kimi.gate.trial_decision` -- the adaptive trials (:func:`decide`,
  :func:`decide_batch`, :class:`StopReason`);
* :mod:`pytest_kimi.gate.session_noise` -- the session noise from several sessions
  (:func:`estimate_session_sigma`).
"""

from __future__ import annotations

from pytest_kimi.gate.family_verdicts import Design, compare_family, compare_level, compare_test
from pytest_kimi.gate.session_noise import estimate_session_sigma
from pytest_kimi.gate.trial_decision import StopReason, decide, decide_batch
from pytest_kimi.gate.two_sample import compare_batch, smallest_vouchable_drop
from pytest_kimi.logscale import MIN_LOG_SD

__all__ = [
    "Design",
    "MIN_LOG_SD",
    "StopReason",
    "compare_batch",
    "compare_family",
    "compare_level",
    "compare_test",
    "decide",
    "decide_batch",
    "estimate_session_sigma",
    "smallest_vouchable_drop",
]
