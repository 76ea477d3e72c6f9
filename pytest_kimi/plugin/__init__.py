"""pytest-kimi's pytest plugin: wiring only, a module per job.

The entry point (``pytest11: kimi = pytest_kimi.plugin``) loads this package; pytest finds
the hooks and fixtures below as its attributes.  What a perf test does -- plan, endpoint,
measure, judge, annotate -- is :mod:`pytest_kimi.run`, which knows nothing of pytest:

* :mod:`~pytest_kimi.plugin.hooks` -- configure, collection (plans), call-phase failure, the
  record on each test report;
* :mod:`~pytest_kimi.plugin.fixtures` -- measurer, deployment, server, endpoint, ``kimi_load``
  and the autouse fixture that hands a planned test to the conductor;
* :mod:`~pytest_kimi.plugin.reporter` -- collects the records (xdist too), the summary, the
  session's end;
* :mod:`~pytest_kimi.plugin.uncaptured` -- the one way to write past output capture;
* :mod:`~pytest_kimi.plugin.xdist`, :mod:`~pytest_kimi.plugin.ordering` -- one measurement at a
  time, ``--perf-sessions`` order;
* :mod:`~pytest_kimi.plugin.addoptions`, :mod:`~pytest_kimi.plugin.state`,
  :mod:`~pytest_kimi.plugin.nodeids` -- options on pytest's parser, stash keys, baseline ids.
"""

from pytest_kimi.plugin.fixtures import (
    _kimi_measure,
    _kimi_measurer,
    capacity_result,
    kimi_deployment,
    kimi_endpoint,
    kimi_load,
    kimi_perf_session,
    kimi_server,
    throughput_result,
)
from pytest_kimi.plugin.hooks import (
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_report_collectionfinish,
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_unconfigure,
)
from pytest_kimi.plugin.state import KIMI_OPTIONS, kimi_options
from pytest_kimi.plugin.xdist import pytest_configure_node

__all__ = [
    "KIMI_OPTIONS",
    "_kimi_measure",
    "_kimi_measurer",
    "capacity_result",
    "kimi_deployment",
    "kimi_endpoint",
    "kimi_load",
    "kimi_options",
    "kimi_perf_session",
    "kimi_server",
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_configure_node",
    "pytest_generate_tests",
    "pytest_report_collectionfinish",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
    "pytest_unconfigure",
    "throughput_result",
]
