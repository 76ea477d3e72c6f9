"""Installing the plugin costs other pytest users nothing: the budget, in modules.

pytest loads the plugin (its ``pytest11`` entry point) in every session on the machine, perf
tests or not.  Importing it loads pytest and the plugin's wiring alone, and a session that
collects no perf test never imports the run stage, numpy, scipy or aiohttp (the hooks and
fixtures import them where a perf test needs them).  Counted in a fresh interpreter's
``sys.modules``, never timed: a module count does not flake on a loaded machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "scipy", "aiohttp", "yaml", "sqlalchemy")
RUN_STAGE = (
    "pytest_kimi.run",
    "pytest_kimi.measure",
    "pytest_kimi.load",
    "pytest_kimi.gate",
    "pytest_kimi.sim",
    "pytest_kimi.server",
    "pytest_kimi.history",
    "pytest_kimi.report",
    "pytest_kimi.baseline",
    "pytest_kimi.endpoint",
    "pytest_kimi.crosscheck",
)
OPTION_TABLE_NEEDS = {
    "pytest_kimi.history",
    "pytest_kimi.history.urls",  # --perf-history's check
    "pytest_kimi.load",
    "pytest_kimi.load.records",  # the marker names' module: its API names (no aiohttp)
}
"""Data-only modules of the stages that the option table's parsers use in every session."""
PLUGIN_IMPORT_BUDGET = 20
"""Modules the plugin adds to ``import pytest`` (14 when this was written; 420 before)."""
SESSION_PACKAGE_BUDGET = 30
"""pytest_kimi modules in a session without perf tests (about 24 when written; 104 before):
the plugin, the option table and what its parsers need (the workload's marker names, the
history URL's check)."""


def _heavy(names: set[str]) -> list[str]:
    return sorted(m for m in names if m.split(".")[0] in HEAVY)


def _run_stage(names: set[str]) -> list[str]:
    return sorted(m for m in names if any(m == s or m.startswith(s + ".") for s in RUN_STAGE))


def test_importing_the_plugin_loads_no_run_stage() -> None:
    code = (
        "import sys, json\n"
        "import pytest\n"
        "before = set(sys.modules)\n"
        "import pytest_kimi.plugin\n"
        "print(json.dumps([sorted(sys.modules), sorted(set(sys.modules) - before)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    loaded, added = (set(names) for names in json.loads(out.splitlines()[-1]))
    assert not _heavy(loaded), _heavy(loaded)
    assert not _run_stage(loaded), _run_stage(loaded)
    assert len(added) <= PLUGIN_IMPORT_BUDGET, sorted(added)


PLAIN_PROJECT = """
import json
import os
import sys


def test_plain():
    assert True


def test_zz_report_modules():  # runs last: what the session loaded by the end of its tests
    with open(os.environ["KIMI_TEST_MODULES"], "w") as f:
        json.dump(sorted(sys.modules), f)
    assert "scipy" not in sys.modules
    assert "numpy" not in sys.modules
    assert "aiohttp" not in sys.modules
"""


def test_a_session_without_perf_tests_loads_no_run_stage(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain project's session (the plugin loaded from its entry point, as on any machine
    where it is installed) imports neither the statistics nor the load engine, nor opens the
    baselines or the history."""
    pytester.makepyfile(test_plain=PLAIN_PROJECT)
    modules = pytester.path / "modules.json"
    monkeypatch.setenv("KIMI_TEST_MODULES", str(modules))
    for name in ("KIMI_ENDPOINT", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    loaded = set(json.loads(modules.read_text()))
    assert "pytest_kimi.plugin.hooks" in loaded  # the plugin was there
    assert not _heavy(loaded), _heavy(loaded)
    assert not set(_run_stage(loaded)) - OPTION_TABLE_NEEDS, _run_stage(loaded)
    ours = sorted(m for m in loaded if m.startswith("pytest_kimi"))
    assert len(ours) <= SESSION_PACKAGE_BUDGET, ours
    assert not (pytester.path / ".kimi").exists()  # no history, no lock file


def test_a_perf_test_is_still_planned(pytester: pytest.Pytester) -> None:
    """The other side of the budget: a collected perf test is planned (a malformed marker
    still stops the run at collection), so laziness never skips the plan."""
    pytester.makepyfile(
        test_perf="""
        from pytest_kimi import throughput

        @throughput(concurrency=1, no_such_argument=1)
        def test_measured():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*malformed @throughput marker:",
            "*test_measured: @throughput unknown argument no_such_argument*",
        ]
    )


def test_the_restated_defaults_agree_with_their_stages() -> None:
    """The option table restates a few defaults of the stages below it (so that reading it
    loads no numpy); each must equal its source."""
    from pytest_kimi import options
    from pytest_kimi.baseline import paths
    from pytest_kimi.gate import latency_gate, two_sample
    from pytest_kimi.measure import measure_spec
    from pytest_kimi.plugin import hooks
    from pytest_kimi.run import plan

    for name in (
        "DEFAULT_TOLERANCE",
        "DEFAULT_ALPHA",
        "DEFAULT_SESSION_SIGMA",
        "DEFAULT_POWER",
        "DEFAULT_DETECTABLE_DROP",
        "DEFAULT_MAX_TRIALS",
    ):
        assert getattr(options, name) == getattr(two_sample, name), name
    assert options.DEFAULT_LATENCY_TOLERANCE == latency_gate.DEFAULT_LATENCY_TOLERANCE
    assert options.DEFAULT_TRIALS == measure_spec.DEFAULT_TRIALS
    assert options.DEFAULT_DIRNAME == paths.DEFAULT_DIRNAME
    assert options.DEFAULT_PROFILE == paths.DEFAULT_PROFILE
    assert hooks.PERF_MARKERS == plan.PERF_MARKERS
    # the default settings can pass: a session that sets no gate option has nothing to warn
    assert options.KimiOptions().gate_settings().pass_floor() is None
