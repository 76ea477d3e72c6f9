"""``kimi-perf``: every subcommand in-process through ``main([...])``, plus ``sim`` as the
subprocess a user would run (``python -m pytest_kimi.cli sim``)."""

from __future__ import annotations

import copy
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.baseline import BaselineStore, LevelBaseline, Provenance, TestBaseline, WorkloadKey
from pytest_kimi.cli import main
from support.paths import REPO, TESTS

DATA = TESTS / "data"
BASELINE_RUN = str(DATA / "report-baseline-run.json")
REGRESSION = str(DATA / "report-regression.json")
ROOT = REPO


def _write(path: Path, report: dict[str, Any]) -> str:
    path.write_text(json.dumps(report), encoding="utf-8")
    return str(path)


# ------------------------------------------------------------------------------------ compare


def test_compare_finds_the_regressions(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    md = tmp_path / "cmp" / "compare.md"
    rc = main(["compare", BASELINE_RUN, REGRESSION, "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 1
    assert (
        "4 regressions: test_s.py::test_sweep C=1, test_s.py::test_sweep C=4, "
        "test_s.py::test_sweep C=16, test_s.py::test_single C=1" in out
    )
    assert "changed between the reports: sim.slowdown: 1.0 -> 1.2" in out
    changes = next(line for line in out.splitlines() if "changed between the reports" in line)
    assert changes.split(": ", 1)[1] == "sim.slowdown: 1.0 -> 1.2", (
        "per-launch fields (port, pid) are not changes"
    )
    header = next(line for line in out.splitlines() if "change (90% CI)" in line)
    assert header.split() == [
        "level",
        "baseline",
        "tok/s",
        "change",
        "(90%",
        "CI)",
        "p",
        "trials",
        "base",
        "trials",
        "verdict",
    ]
    text = md.read_text(encoding="utf-8")
    assert text.startswith("## kimi-perf compare: FAILED")
    assert text.count("**REGRESSION** |") == 4


def test_compare_with_itself_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", REGRESSION, REGRESSION]) == 0
    out = capsys.readouterr().out
    assert "no regressions" in out
    assert "regression " not in out


def test_compare_matches_levels_by_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = json.loads(Path(BASELINE_RUN).read_text())
    new = copy.deepcopy(old)
    new["tests"][0]["levels"].pop(0)  # C=1 only in OLD
    new["tests"][0]["levels"][0]["max_tokens"] = 512  # C=4 at another length: a new level
    extra = copy.deepcopy(new["tests"][1])
    extra["nodeid"] = "test_s.py::test_new"
    new["tests"].append(extra)  # a test only in NEW
    old["tests"].pop(1)  # test_single only in NEW as well
    rc = main(["compare", _write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "only in " + str(tmp_path / "old.json") + ": test_s.py::test_sweep C=1" in out
    assert "only in " + str(tmp_path / "old.json") + ": test_s.py::test_sweep C=4" in out
    assert "only in " + str(tmp_path / "new.json") + ": test_s.py::test_sweep C=4" in out
    assert "only in " + str(tmp_path / "new.json") + ": test_s.py::test_single" in out
    assert "only in " + str(tmp_path / "new.json") + ": test_s.py::test_new" in out
    assert "no-baseline" in out


def test_compare_skips_levels_without_trustworthy_samples(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    new = json.loads(Path(REGRESSION).read_text())
    new["tests"][1]["levels"][0].update(verdict="invalid", trials_tok_s=[1.0])
    rc = main(["compare", BASELINE_RUN, _write(tmp_path / "new.json", new)])
    out = capsys.readouterr().out
    assert rc == 1  # the sweep still regressed
    assert "not compared: new.json level is invalid" in out
    assert "test_s.py::test_single C=1" not in out.split("regressions:")[-1]


def test_compare_profiles_are_separate_levels(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def with_profiles(report: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(report)
        for test in out["tests"]:
            test["levels"] = [dict(lv, profile=p) for p in ("ep8", "tp8") for lv in test["levels"]]
        return out

    old = with_profiles(json.loads(Path(BASELINE_RUN).read_text()))
    new = with_profiles(json.loads(Path(REGRESSION).read_text()))
    rc = main(["compare", _write(tmp_path / "o.json", old), _write(tmp_path / "n.json", new)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "test_s.py::test_single tp8 C=1" in out
    assert "profile" in next(line for line in out.splitlines() if "change (90% CI)" in line)


@pytest.mark.parametrize(
    "option", [["--tolerance", "1.5"], ["--alpha", "0.7"], ["--session-sigma", "-1"]]
)
def test_compare_bad_statistics_options(
    capsys: pytest.CaptureFixture[str], option: list[str]
) -> None:
    assert main(["compare", REGRESSION, REGRESSION, *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kimi-perf: error: ") and err.count("\n") == 1


# ------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON (line 1, column 2"),
        ('{"hello": 1}', "not a pytest-kimi report"),
        ("[1, 2]", "not a pytest-kimi report"),
        ('{"schema": 99, "tests": []}', "report schema 99"),
        ('{"schema": 1, "tests": [{"levels": []}]}', "tests[0] is not a test entry"),
    ],
)
@pytest.mark.parametrize("command", ["compare", "plot"])
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: str | None,
    message: str,
    command: str,
) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    argv = (
        ["compare", REGRESSION, str(path)]
        if command == "compare"
        else ["plot", str(path), "--out", str(tmp_path / "o")]
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"kimi-perf: error: {path}: ") and message in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["compare", REGRESSION])
    assert exc.value.code == 2


# --------------------------------------------------------------------------------------- plot


def test_plot_writes_html(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kimi-perf plot`` draws its figures as SVG: no plotting library needed (blocked here)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out_dir = tmp_path / "html"
    assert main(["plot", REGRESSION, "--out", str(out_dir)]) == 0
    assert f"wrote {out_dir / 'index.html'}" in capsys.readouterr().out
    assert len(list(out_dir.glob("*.svg"))) == 4
    assert (out_dir / "index.html").read_text(encoding="utf-8").count('class="chart"') == 4


# ---------------------------------------------------------------------------------- baselines


def _baseline(
    test: str, profile: str, trials: tuple[float, ...] = (1270.0, 1276.3, 1281.0)
) -> TestBaseline:
    workload = {"api": "chat", "ignore_eos": True, "max_tokens": 64, "prompts": "builtin:diverse"}
    return TestBaseline(
        test=test,
        profile=profile,
        provenance=Provenance(
            model="kimi-k2.6",
            server_info={"ep_size": 8},
            plugin_version="0.1.0",
            git_commit="0123456789abcdef0123",
            recorded_at="2026-11-29T08:00:00Z",
        ),
        levels=(
            LevelBaseline(WorkloadKey.from_dict({**workload, "concurrency": 1}), trials),
            LevelBaseline(
                WorkloadKey.from_dict({**workload, "concurrency": 16}), (10102.0, 10150.0)
            ),
        ),
    )


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "baselines"
    BaselineStore(root, "ep8-tuned").save(
        _baseline("tests/perf/test_k.py::test_sweep", "ep8-tuned")
    )
    BaselineStore(root, "tp8").save(_baseline("tests/perf/test_k.py::test_sweep", "tp8", (900.0,)))
    return root


def test_baselines_lists_all_profiles(capsys: pytest.CaptureFixture[str], store_root: Path) -> None:
    assert main(["baselines", str(store_root)]) == 0
    out = capsys.readouterr().out
    assert "[ep8-tuned] tests/perf/test_k.py::test_sweep" in out
    assert "[tp8] tests/perf/test_k.py::test_sweep" in out
    assert (
        "model kimi-k2.6, recorded 2026-11-29T08:00:00Z, commit 0123456789ab, plugin 0.1.0" in out
    )
    lines = out.splitlines()
    assert any(
        line.split() == ["C=1", "max_tokens=64", "1276.3", "tok/s", "3", "trials"] for line in lines
    )
    assert any(
        line.split() == ["C=16", "max_tokens=64", "10126.0", "tok/s", "2", "trials"]
        for line in lines
    )
    assert any(
        line.split() == ["C=1", "max_tokens=64", "900.0", "tok/s", "1", "trial"] for line in lines
    )
    assert "2 baseline files in" in out


def test_baselines_one_profile(capsys: pytest.CaptureFixture[str], store_root: Path) -> None:
    assert main(["baselines", str(store_root), "--profile", "tp8"]) == 0
    out = capsys.readouterr().out
    assert "[tp8]" in out and "[ep8-tuned]" not in out


def test_baselines_default_dir_is_cwd_baselines(
    capsys: pytest.CaptureFixture[str], store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(store_root.parent)
    assert main(["baselines"]) == 0
    assert "2 baseline files" in capsys.readouterr().out


def test_baselines_corrupt_file(capsys: pytest.CaptureFixture[str], store_root: Path) -> None:
    bad = store_root / "tp8" / "tests" / "perf" / "test_k" / "test_broken.yaml"
    bad.write_text("schema: 1\ntest: [unclosed\n", encoding="utf-8")
    assert main(["baselines", str(store_root)]) == 1
    captured = capsys.readouterr()
    assert f"error: {bad}: " in captured.err
    assert "[ep8-tuned] tests/perf/test_k.py::test_sweep" in captured.out, (
        "other files still listed"
    )
    assert "1 unreadable" in captured.out


def test_baselines_missing_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["baselines", str(tmp_path / "nope")]) == 2
    assert "no such baseline directory" in capsys.readouterr().err


def test_baselines_bad_profile_name(capsys: pytest.CaptureFixture[str], store_root: Path) -> None:
    assert main(["baselines", str(store_root), "--profile", "../etc"]) == 2
    assert "profile must be" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- sim


def test_sim_subcommand_runs_the_simulator() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_kimi.cli", "sim", "--port", "0", "--speed", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and not line:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = proc.stdout.readline()
                break
        assert line.startswith("pytest-kimi sim listening on http://127.0.0.1:"), (
            line,
            proc.poll(),
            proc.stderr.read() if proc.poll() is not None and proc.stderr else "",
        )
        port = int(line.strip().rsplit(":", 1)[1])
        assert port > 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def test_sim_bad_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--host", "0.0.0.0"]) == 2
    assert "127.0.0.1 only" in capsys.readouterr().err


def test_compare_same_run_ab_entries(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One nodeid per deployment: entries are matched by nodeid and deployment."""

    def ab(report: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(report)
        entries = []
        for name in ("ep8", "tp8"):
            entry = copy.deepcopy(out["tests"][1])
            entry["profile"] = name
            entry["levels"] = [dict(lv, profile=name) for lv in entry["levels"]]
            entries.append(entry)
        out["tests"] = entries
        return out

    old, new = (
        ab(json.loads(Path(BASELINE_RUN).read_text())),
        ab(json.loads(Path(REGRESSION).read_text())),
    )
    new["tests"][0] = copy.deepcopy(old["tests"][0])  # ep8 unchanged, tp8 slowed down
    rc = main(["compare", _write(tmp_path / "o.json", old), _write(tmp_path / "n.json", new)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "1 regression: test_s.py::test_single on tp8 C=1" in out
    assert "test_s.py::test_single on ep8 [ok]" in out
