"""Options: one frozen object owns every default; where each value may come from; one path base.

Most checks build the session's :class:`KimiOptions` in process (``pytester.parseconfigure``,
no tests run); a few run real sessions against the simulator where only the outcome shows it:
a marker over the command line, an ini key that must not exist, files landing under the
rootdir from a subdirectory.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.baseline.paths import DEFAULT_DIRNAME
from pytest_kimi.cli import build_parser
from pytest_kimi.gate import two_sample
from pytest_kimi.gate.policy import GateSettings
from pytest_kimi.options import OPTIONS, KimiOptions, default_of, help_text
from pytest_kimi.plugin import KIMI_OPTIONS
from pytest_kimi.plugin.addoptions import options_from_config
from pytest_kimi.workload.workload_spec import Targets
from support.paths import REPO

README = REPO / "README.md"

DOCUMENTED_DEFAULTS: dict[str, Any] = {
    "server_profile": (),
    "endpoint": None,
    "model": None,
    "api_key": None,
    "perf_json": None,
    "perf_markdown": None,
    "perf_html": None,
    "perf_requests": None,
    "perf_trials": 3,
    "perf_workers": 1,
    "perf_protocol": "stationary",
    "baseline_dir": Path("baselines"),
    "baseline_profile": None,
    "perf_tolerance": 0.05,
    "perf_alpha": 0.05,
    "perf_session_sigma": 0.03,
    "perf_detectable_drop": 0.15,
    "perf_latency_tolerance": 0.25,
    "perf_max_trials": 10,
    "perf_sessions": 1,
    "perf_max_launches": 0,
    "perf_culprit": False,
    "perf_race": False,
    "perf_race_rounds": 10,
    "perf_race_objective": "tok_s",
    "perf_require_baseline": False,
    "perf_require_measurement": False,
    "perf_strict": False,
    "perf_server_metrics": False,
    "perf_allow_large": False,
    "perf_lock_timeout": 1800.0,
    "update_baselines": None,
    "perf_history": "sqlite:///.kimi/history.db",
}
"""What README and ``--help`` promise, written out once more on purpose."""

ENV_VARS = [o.env for o in OPTIONS.values() if o.env]


@pytest.fixture(autouse=True)
def _no_kimi_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's or CI's own KIMI_* variables must not leak into these sessions."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def _options(pytester: pytest.Pytester, *args: str) -> KimiOptions:
    return pytester.parseconfigure(*args).stash[KIMI_OPTIONS]


# ------------------------------------------------------------------------------------ defaults


def test_every_option_is_one_field_and_every_field_one_option() -> None:
    fields = {f.name for f in dataclasses.fields(KimiOptions)} - {"sources"}
    assert fields == set(OPTIONS) == set(DOCUMENTED_DEFAULTS)


@pytest.mark.parametrize("name", sorted(DOCUMENTED_DEFAULTS))
def test_each_default_is_the_documented_one(name: str) -> None:
    assert getattr(KimiOptions(), name) == DOCUMENTED_DEFAULTS[name] == default_of(name)
    assert KimiOptions().source(name) == "default"


def test_help_and_readme_state_the_field_defaults() -> None:
    """Help texts are formatted from the fields; the README table is checked against them."""
    readme = README.read_text()
    checked = 0
    for name, opt in OPTIONS.items():
        value = default_of(name)
        if "{default}" in opt.help:
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            assert f"default {shown}" in help_text(name) or f"default: {shown}" in help_text(name)
        row = re.search(rf"^\| `{re.escape(opt.flag)}[ `\[].*$", readme, re.M)
        if row is None:  # (--perf-workers has no row yet); the table is the README's business
            continue
        said = re.search(r"default:? `?([0-9.]+|[a-z]+/?)`?\)?", row.group(0).split("|")[-2])
        if said and said.group(1)[0].isdigit():
            assert float(said.group(1)) == value, (opt.flag, said.group(0))
            checked += 1
        elif said and name == "baseline_dir":
            assert Path(said.group(1)) == value
            checked += 1
    assert checked >= 6, "the README table no longer states the defaults it used to"
    trials_row = re.search(r"^\| `trials` \| (\d+) \(`--perf-trials`\)", readme, re.M)
    assert trials_row is not None and int(trials_row.group(1)) == KimiOptions().perf_trials


def test_gate_settings_and_kimi_perf_share_the_options_defaults() -> None:
    """GateSettings keeps defaults for pytest-free callers: the very same ones."""
    opts = KimiOptions()
    assert GateSettings() == opts.gate_settings()
    assert (opts.perf_tolerance, opts.perf_alpha, opts.perf_session_sigma) == (
        two_sample.DEFAULT_TOLERANCE,
        two_sample.DEFAULT_ALPHA,
        two_sample.DEFAULT_SESSION_SIGMA,
    )
    assert opts.perf_max_trials == two_sample.DEFAULT_MAX_TRIALS
    assert opts.perf_detectable_drop == two_sample.DEFAULT_DETECTABLE_DROP
    compare = build_parser().parse_args(["compare", "old.json", "new.json"])
    assert (compare.tolerance, compare.alpha, compare.session_sigma) == (
        opts.perf_tolerance,
        opts.perf_alpha,
        opts.perf_session_sigma,
    )
    assert compare.detectable_drop == opts.perf_detectable_drop
    assert Path(build_parser().parse_args(["baselines"]).dir) == opts.baseline_dir


def test_gate_settings_are_built_from_the_options() -> None:
    opts = KimiOptions(
        perf_tolerance=0.2,
        perf_alpha=0.01,
        perf_session_sigma=0.0,
        perf_max_trials=4,
        perf_require_baseline=True,
        perf_strict=True,
        update_baselines="force",
    )
    assert opts.gate_settings() == GateSettings(0.2, 0.01, 0.0, 4, True, True, updating=True)


def test_the_options_object_is_frozen() -> None:
    opts = KimiOptions(perf_trials=4, sources={"perf_trials": "--perf-trials"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.perf_trials = 5  # type: ignore[misc]
    assert not hasattr(opts, "__dict__"), "slotted: no stray attributes either"
    assert "sk-secret" not in repr(KimiOptions(api_key="sk-secret"))


def test_the_built_object_is_frozen_and_its_sources_read_only(pytester: pytest.Pytester) -> None:
    opts = _options(pytester, "--perf-trials=4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.perf_trials = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts.sources["perf_trials"] = "x"  # type: ignore[index]
    assert opts.source("perf_trials") == "--perf-trials"
    with pytest.raises(KeyError):
        opts.source("perf_trails")


# ---------------------------------------------------------------------------------- precedence

# One option of each kind: int, float, str, bool switch, path, repeatable path.
# (name, flag given on the command line, env value, ini value, expected per case)
KINDS = [
    ("perf_trials", ["--perf-trials=3"], "4", "5", (3, 4, 5, 3)),
    ("perf_tolerance", ["--perf-tolerance=0.1"], "0.2", "0.3", (0.1, 0.2, 0.3, 0.05)),
    ("baseline_profile", ["--baseline-profile=cli"], "env", "ini", ("cli", "env", "ini", None)),
    ("perf_strict", ["--perf-strict"], "false", "true", (True, False, True, False)),
    ("perf_json", ["--perf-json=c.json"], "e.json", "i.json", ("c.json", "e.json", "i.json", None)),
    ("perf_allow_large", ["--perf-allow-large"], "false", "true", (True, False, True, False)),
    ("perf_lock_timeout", ["--perf-lock-timeout=5"], "60", "0.5", (5.0, 60.0, 0.5, 1800.0)),
]


@pytest.mark.parametrize("case", ["cli", "env", "ini", "default"])
@pytest.mark.parametrize("name, cli, env, ini, expected", KINDS, ids=[k[0] for k in KINDS])
def test_precedence_cli_env_ini_default(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    name: str,
    cli: list[str],
    env: str,
    ini: str,
    expected: tuple[Any, ...],
) -> None:
    """Each source set together with every lower one: the highest one wins, and is named."""
    opt = OPTIONS[name]
    rank = ["cli", "env", "ini", "default"].index(case)
    if rank <= 2:
        pytester.makeini(f"[pytest]\n{opt.ini} = {ini}\n")
    if rank <= 1:
        monkeypatch.setenv(str(opt.env), env)
    opts = _options(pytester, *(cli if rank == 0 else []))
    want = expected[rank]
    if name == "perf_json" and want is not None:
        want = pytester.path / want
    assert getattr(opts, name) == want
    assert opts.source(name) == [opt.flag, f"env {opt.env}", f"ini {opt.ini}", "default"][rank]


def test_server_profiles_cli_over_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkimi_server_profile = a.yaml b.yaml\n")
    config = pytester.parseconfig("--server-profile=c.yaml")
    # parseconfig only: building the options loads nothing; loading the profiles is the plugin's
    opts = options_from_config(config, environ={})
    assert opts.server_profile == (pytester.path / "c.yaml",)
    assert opts.source("server_profile") == "--server-profile"
    opts = options_from_config(pytester.parseconfig(), environ={})
    assert opts.server_profile == (pytester.path / "a.yaml", pytester.path / "b.yaml")
    assert opts.source("server_profile") == "ini kimi_server_profile"


@pytest.mark.parametrize(
    "args, env, ini, source",
    [
        (["--perf-tolerance=2"], None, None, "--perf-tolerance"),
        ([], "lots", None, "env KIMI_PERF_TRIALS"),
        ([], None, "kimi_perf_strict = maybe", "ini kimi_perf_strict"),
        (["--update-baselines=always"], None, None, "--update-baselines"),
        (["--perf-lock-timeout=0"], None, None, "--perf-lock-timeout"),
        (["--perf-lock-timeout=inf"], None, None, "--perf-lock-timeout"),
        ([], None, "kimi_perf_lock_timeout = soon", "ini kimi_perf_lock_timeout"),
        ([], None, "kimi_perf_allow_large = perhaps", "ini kimi_perf_allow_large"),
    ],
)
def test_bad_value_names_its_source(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: str | None,
    ini: str | None,
    source: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("KIMI_PERF_TRIALS", env)
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    with pytest.raises(pytest.UsageError, match=f"^{re.escape(source)}: bad value "):
        _options(pytester, *args)


def test_bad_value_from_env_stops_a_real_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite="def test_x(): pass")
    monkeypatch.setenv("KIMI_PERF_TRIALS", "lots")
    result = pytester.runpytest("--endpoint=sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*env KIMI_PERF_TRIALS: bad value 'lots'*"])


def test_marker_tolerance_and_alpha_override_the_options() -> None:
    settings = KimiOptions(perf_tolerance=0.1, perf_alpha=0.01).gate_settings()
    assert settings.for_test(Targets()) is settings
    marked = settings.for_test(Targets(tolerance=0.3))
    assert (marked.tolerance, marked.alpha) == (0.3, 0.01)
    marked = settings.for_test(Targets(alpha=0.2))
    assert (marked.tolerance, marked.alpha) == (0.1, 0.2)


TRIALS = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=32, warmup=0)
def test_option(throughput_result):
    assert [len(lv.trials) for lv in throughput_result.levels] == [1]

@throughput(concurrency=1, max_tokens=32, warmup=0, trials=2)
def test_marker_wins(throughput_result):
    assert [len(lv.trials) for lv in throughput_result.levels] == [2]
"""


def test_marker_trials_over_cli_over_env_over_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the command line's 1 is used, except where the marker says 2."""
    pytester.makepyfile(test_suite=TRIALS)
    pytester.makeini("[pytest]\nkimi_perf_trials = 5\n")
    monkeypatch.setenv("KIMI_PERF_TRIALS", "4")
    pytester.runpytest("--endpoint=sim:speed=50", "--perf-trials=1").assert_outcomes(passed=2)


TOLERANCE = """
from pytest_kimi import throughput

@throughput(concurrency=4, max_tokens=64, warmup=1, trials=2)
def test_option():
    pass

@throughput(concurrency=4, max_tokens=64, warmup=1, trials=2, tolerance=0.9, latency_tolerance=9)
def test_marker_wins():
    pass
"""


def test_marker_tolerance_over_cli(pytester: pytest.Pytester) -> None:
    """An 80% slower server: a regression at the command line's 10%, not at the marker's 90%
    (nor its latency, 5 times as long, at the marker's latency_tolerance=9: 900% slower)."""
    pytester.makepyfile(test_suite=TOLERANCE)
    gate = ("--perf-max-trials=2", "--perf-tolerance=0.1")  # -80% needs no more trials
    pytester.runpytest("--endpoint=sim:speed=50", "--update-baselines", *gate).assert_outcomes(
        passed=2
    )
    report = pytester.path / "perf.json"
    result = pytester.runpytest(
        "--endpoint=sim:speed=50,slowdown=5", *gate, f"--perf-json={report}"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAILED test_suite.py::test_option*regression*"])
    tests = {t["nodeid"].split("::")[-1]: t for t in json.loads(report.read_text())["tests"]}
    assert [lv["tolerance_pct"] for lv in tests["test_option"]["levels"]] == [10]
    assert [lv["tolerance_pct"] for lv in tests["test_marker_wins"]["levels"]] == [90]
    latency = {name: t["levels"][0]["latency"]["tolerance_pct"] for name, t in tests.items()}
    assert latency == {"test_option": 25, "test_marker_wins": 900}


# --------------------------------------------------------------------------------------- paths


def test_relative_paths_from_every_source_resolve_against_the_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started from a subdirectory: command line, environment and ini all name rootdir files."""
    pytester.makeini(
        "[pytest]\nkimi_perf_markdown = reports/perf.md\nkimi_server_profile = deploy/a.yaml\n"
    )
    monkeypatch.setenv("KIMI_BASELINE_DIR", "store")
    monkeypatch.setenv("KIMI_PERF_JSON", "reports/perf.json")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    config = pytester.parseconfig("--perf-html=reports/html")
    assert Path(config.rootpath) == pytester.path
    opts = options_from_config(config)
    root = pytester.path
    assert opts.baseline_dir == root / "store"
    assert opts.perf_json == root / "reports" / "perf.json"
    assert opts.perf_markdown == root / "reports" / "perf.md"
    assert opts.perf_html == root / "reports" / "html"
    assert opts.server_profile == (root / "deploy" / "a.yaml",)
    # the default too, and an absolute path is kept as it is
    monkeypatch.setenv("KIMI_PERF_JSON", str(sub / "abs.json"))
    monkeypatch.delenv("KIMI_BASELINE_DIR")
    opts = options_from_config(pytester.parseconfig())
    assert opts.baseline_dir == root / DEFAULT_DIRNAME
    assert opts.perf_json == sub / "abs.json"


SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=32, trials=1, warmup=0)
def test_one():
    pass
"""


def test_reports_from_env_and_ini_land_under_the_rootdir_from_a_subdirectory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real session started in a subdirectory, the rootdir found from the ini file."""
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\nkimi_perf_markdown = reports/perf.md\n")
    monkeypatch.setenv("KIMI_PERF_JSON", "reports/perf.json")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = pytester.run(
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        str(pytester.path / "test_suite.py"),
        "--endpoint=sim:speed=50",
        "--baseline-dir=store",
        "--update-baselines",
        "--perf-max-trials=1",  # the marker's one trial: where the files land is the point
    )
    assert result.ret == 0, result.outlines[-20:]
    assert (pytester.path / "reports" / "perf.json").is_file()
    assert (pytester.path / "reports" / "perf.md").is_file()
    assert list((pytester.path / "store").rglob("test_one.yaml"))
    assert not [p for p in sub.rglob("*") if p.name != "__pycache__"]


# ------------------------------------------------------------------------ --update-baselines


def test_update_baselines_cannot_come_from_an_ini_file(pytester: pytest.Pytester) -> None:
    """A committed ``kimi_update_baselines`` would rewrite baselines on every CI run."""
    pytester.makeini("[pytest]\nkimi_update_baselines = yes\n")
    assert OPTIONS["update_baselines"].ini is None and OPTIONS["update_baselines"].env is None
    opts = _options(pytester)
    assert opts.update_baselines is None and not opts.gate_settings().updating
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest("-W", "default")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*Unknown config option: kimi_update_baselines*"])
    assert "kimi_update_baselines" not in "\n".join(pytester.runpytest("--help").outlines)


def test_update_baselines_from_the_command_line(pytester: pytest.Pytester) -> None:
    assert _options(pytester, "--update-baselines").update_baselines == "yes"
    opts = _options(pytester, "--update-baselines=force")
    assert opts.update_baselines == "force" and opts.gate_settings().updating


# ------------------------------------------------------------------------ --perf-detectable-drop


def test_detectable_drop_from_each_source_reaches_the_gate(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _options(pytester, "--perf-detectable-drop=0.2").gate_settings().detectable_drop == 0.2
    monkeypatch.setenv("KIMI_PERF_DETECTABLE_DROP", "0.25")
    assert _options(pytester).perf_detectable_drop == 0.25
    monkeypatch.delenv("KIMI_PERF_DETECTABLE_DROP")
    pytester.makeini("[pytest]\nkimi_perf_detectable_drop = 0.3\n")
    assert _options(pytester).perf_detectable_drop == 0.3


def test_settings_that_make_pass_unreachable_are_said_up_front(pytester: pytest.Pytester) -> None:
    """5% session noise: no number of trials can catch a 15% drop with 95% probability, so
    every compared level would be underpowered; said once, before any trial, with the fix.
    Said where a perf test is collected (a session without one never computes it: the plugin
    costs it nothing); without an endpoint the perf test then skips."""
    pytester.makepyfile(
        test_x="""
        from pytest_kimi import throughput

        @throughput(concurrency=1)
        def test_x():
            pass
        """
    )
    # in a subprocess: in-process, a warning about the already imported plugin joins the count
    result = pytester.runpytest_subprocess("--perf-session-sigma=0.05")
    result.assert_outcomes(skipped=1, warnings=1)
    out = result.stdout.str()
    assert out.count("no compared level can pass") == 2  # the header, the warnings summary
    assert "smaller than 19.4%" in out and "detectable drop is 15.0% (default)" in out
    assert "Raise --perf-detectable-drop to 19.5% or more" in out
    quiet = pytester.runpytest_subprocess()  # the defaults can pass: nothing said
    quiet.assert_outcomes(skipped=1)
    assert "no compared level can pass" not in quiet.stdout.str()
    wide = pytester.runpytest_subprocess("--perf-session-sigma=0.05", "--perf-detectable-drop=0.2")
    assert "no compared level can pass" not in wide.stdout.str()


def test_a_marker_tolerance_that_makes_pass_unreachable_is_said_on_its_test(
    pytester: pytest.Pytester,
) -> None:
    """A marker's own tolerance=12%: with 3% session noise no number of trials can catch a 15%
    drop with 95% probability; said at collection, on that test, with the fix (the session's
    own settings can pass, so the session-wide warning stays quiet)."""
    pytester.makepyfile(
        test_x="""
        from pytest_kimi import capacity, throughput

        @throughput(concurrency=1, tolerance=0.12)
        def test_loose():
            pass

        @throughput(concurrency=1, tolerance=0.04, alpha=0.01)
        def test_tight():
            pass

        # a capacity's gate is a test on the boundary, with no power rule: nothing to say
        @capacity(max_e2e_s=10, tolerance=0.12)
        def test_capacity():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-W", "always::pytest.PytestConfigWarning")
    result.assert_outcomes(skipped=3, warnings=1)  # no endpoint: skipped, still warned
    out = result.stdout.str()
    assert "no compared level can pass" not in out
    result.stdout.fnmatch_lines(
        [
            "*test_x.py::test_loose: no level of this test can pass: with the marker's "
            "tolerance 12.0% and alpha 0.05*smaller than 20.3%*detectable drop is 15.0%*",
        ]
    )
    summary = out.split("warnings summary")[-1]
    assert "test_tight" not in summary and "test_capacity" not in summary
