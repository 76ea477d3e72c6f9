"""Change points over the history (pytest_kimi.history.changes, ``kimi-perf history changes``).

Synthetic series first: a step in simulator-like noise found at its run, a slow drift that
passes every run's gate named as a change, an unchanged series left alone.  Then the CLI on
a history written through the store, and at the end the whole story with the simulator: runs
recorded by pytest, a slowdown injected with a sim knob, the change named at its run.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kimi.baseline.values import ABSENT
from pytest_kimi.cli import main
from pytest_kimi.gate import family_verdicts
from pytest_kimi.verdicts import Verdict
from pytest_kimi.history import changes as changes_mod
from pytest_kimi.history.changes import (
    ChangePointsUnavailable,
    detect,
    find_changes,
    provenance_changes,
    run_figures,
    step_interval,
)
from pytest_kimi.history.model import LevelSeries, Point, RunInfo
from support.otava import needs_otava
from pytest_kimi.sim.config import SimConfig
from support.timing import SESSION_S

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=timezone.utc)


def _prov(i: int, **server: Any) -> dict[str, Any]:
    """A run's flattened provenance: what a sim run stores, with the per-launch fields that
    change every run (commit, host, port, pid, the sim's seed)."""
    out: dict[str, Any] = {
        "model": "kimi-k2.6-sim",
        "plugin_version": "0.2.0",
        "client_host": f"ci-{i % 3}",
        "server_info.port": 30000 + i,
        "server_info.sim.pid": 4000 + i,
        "server_info.sim.seed": i,
        "server_info.sim.slowdown": 1.0,
        "server_info.tp_size": 8,
    }
    out.update({f"server_info.{k}": v for k, v in server.items()})
    return out


def make_series(
    tok_s: Sequence[float],
    *,
    trials: Sequence[Sequence[float]] | None = None,
    provenance: Callable[[int], Mapping[str, Any]] = _prov,
    test: str = "tests/perf/test_x.py::test_peak",
    level: str = "C=64",
) -> LevelSeries:
    """One level over ``len(tok_s)`` runs, ids 1.., an hour apart, commit ``c<i>``."""
    points = []
    for i, x in enumerate(tok_s):
        run = RunInfo(
            id=i + 1,
            time=T0 + timedelta(hours=i),
            commit=f"c{i:02d}",
            deployment="sim",
            provenance=dict(provenance(i)),
        )
        points.append(Point(run=run, tok_s=x, trials=tuple(trials[i]) if trials else (x,)))
    return LevelSeries(
        test=test, level=level, key={"concurrency": 64}, deployment="sim", points=tuple(points)
    )


def noisy(truth: Sequence[float], sigma: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(t * math.exp(rng.normal(0.0, sigma))) for t in truth]


# ----------------------------------------------------------------------------------- steps


@needs_otava
@pytest.mark.parametrize("seed", range(5))
def test_a_15pct_step_is_found_at_its_run(seed: int) -> None:
    truth = [1400.0] * 12 + [1400.0 * 0.85] * 8
    values = noisy(truth, 0.02, seed)

    def prov(i: int) -> dict[str, Any]:
        return _prov(i, **{"sim.slowdown": 1.15 if i >= 12 else 1.0})

    (change,) = find_changes([make_series(values, provenance=prov)])
    assert (change.run, change.index, change.previous_run) == (13, 12, 12)
    assert change.time == T0 + timedelta(hours=12) and change.commit == "c12"
    assert change.previous_commit == "c11"
    assert (change.before_runs, change.after_runs) == (12, 8)
    geo = [
        math.exp(sum(math.log(v) for v in part) / len(part)) for part in (values[:12], values[12:])
    ]
    assert change.before_tok_s == pytest.approx(geo[0])
    assert change.after_tok_s == pytest.approx(geo[1])
    assert change.change_pct == pytest.approx((geo[1] / geo[0] - 1) * 100)
    assert change.direction == "slower"
    assert change.ci_pct is not None
    lo, hi = change.ci_pct
    assert lo < change.change_pct < hi
    assert lo - (hi - lo) / 2 < -15 < hi + (hi - lo) / 2, "the truth, within twice the 90% CI"
    assert change.pvalue < changes_mod.DEFAULT_MAX_PVALUE
    # the cause, and nothing that changes with every launch (seed, port, pid, host, commit)
    assert [str(c) for c in change.provenance_changes] == ["sim.slowdown: 1.0 -> 1.15"]


@needs_otava
@pytest.mark.parametrize("seed", range(5))
def test_an_unchanged_series_has_no_change(seed: int) -> None:
    assert find_changes([make_series(noisy([1400.0] * 20, 0.02, 100 + seed))]) == []


@needs_otava
def test_a_slow_drift_that_passes_every_gate_is_named() -> None:
    """2% slower every run for ten runs: each run against the one before passes the gate
    (inside the 5% tolerance), the series has lost 18%."""
    rng = np.random.default_rng(7)
    truth = [1400.0] * 10 + [1400.0 * 0.98**k for k in range(1, 11)]
    session = [math.exp(rng.normal(0.0, 0.015)) for _ in truth]  # a server start's factor
    trials = [
        [t * f * math.exp(rng.normal(0.0, 0.01)) for _ in range(3)] for t, f in zip(truth, session)
    ]
    figures = [float(np.median(x)) for x in trials]
    for before, after in zip(trials, trials[1:]):
        verdict = family_verdicts.compare_level(before, after).verdict
        assert verdict != Verdict.REGRESSION, "each step alone is within the tolerance"

    found = find_changes([make_series(figures, trials=trials)])
    assert found, "the drift is named"
    slower = [c for c in found if c.change_pct < 0]
    assert slower == found
    assert all(10 <= c.index <= 19 for c in found), [c.index for c in found]
    # named: the first run after it, the throughput before and after, the change
    first, last = found[0], found[-1]
    assert first.run == first.index + 1 and first.before_tok_s > first.after_tok_s
    total = (last.after_tok_s / first.before_tok_s - 1) * 100
    assert -25 < total < -8, total


@needs_otava
def test_a_drift_that_settles_is_named_within_it() -> None:
    truth = [1000.0] * 10 + [1000.0 * 0.98**k for k in range(1, 11)] + [1000.0 * 0.98**10] * 10
    found = find_changes([make_series(noisy(truth, 0.02, 11))])
    assert found and all(10 <= c.index <= 20 and c.change_pct < 0 for c in found)
    assert (found[-1].after_tok_s / found[0].before_tok_s - 1) * 100 == pytest.approx(-18, abs=4)


@needs_otava
def test_the_merge_retests_both_neighbours_of_a_dropped_point() -> None:
    """A drift that Otava's split cuts into three weak steps: its merge dropped the middle
    one and kept the left one's p-value from its narrow segment, then lost all three (see the
    module docstring); re-testing both neighbours keeps the change."""
    values = [1006, 997, 1005, 991, 996, 990, 1011, 1000, 993, 996]
    values += [978, 967, 926, 913, 901, 909, 876, 850, 840, 834]
    found = detect(values, max_pvalue=1e-4)
    assert found and all(10 <= i <= 19 for i, _ in found)


@needs_otava
def test_a_step_in_the_last_runs_is_found() -> None:
    values = noisy([800.0] * 15 + [680.0] * 3, 0.01, 3)
    (change,) = find_changes([make_series(values)])
    assert change.index == 15 and change.after_runs == 3


@needs_otava
def test_many_series_each_with_its_own_changes() -> None:
    a = make_series(noisy([100.0] * 8 + [80.0] * 8, 0.01, 1), level="C=1")
    b = make_series(noisy([500.0] * 16, 0.01, 2), level="C=8")
    c = make_series(noisy([900.0] * 4 + [1200.0] * 12, 0.01, 3), level="C=64")
    found = find_changes([a, b, c])
    assert [(x.level, x.run, x.direction) for x in found] == [
        ("C=1", 9, "slower"),
        ("C=64", 5, "faster"),
    ]
    assert found[1].series == c.ident == "tests/perf/test_x.py::test_peak C=64 [sim]"


# ----------------------------------------------------------------------------- run figures


def test_runs_without_a_figure_are_left_out_and_sessions_make_one_figure() -> None:
    runs = [RunInfo(id=i, time=T0 + timedelta(hours=i)) for i in range(1, 6)]
    points = (
        Point(run=runs[0], tok_s=100.0, trials=(99.0, 101.0), verdict="pass"),
        Point(run=runs[1], tok_s=None),
        Point(run=runs[4], tok_s=80.0, trials=(80.0, 80.0), verdict="invalid"),
        Point(run=runs[2], tok_s=90.0, trials=(90.0,), session=0),
        Point(run=runs[2], tok_s=110.0, trials=(110.0, float("nan")), session=1),
        Point(run=runs[3], tok_s=0.0),
    )
    figures = run_figures(LevelSeries("t", "C=1", {}, None, points))
    assert [f.run.id for f in figures] == [1, 3], "no figure, an invalid one: left out"
    assert figures[1].tok_s == pytest.approx(math.sqrt(90.0 * 110.0))
    assert figures[1].trials == (90.0, 110.0) and figures[1].sessions == 2


def test_too_few_runs_hold_no_change_and_need_no_otava(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "otava", None)
    assert find_changes([make_series([100.0, 50.0])]) == []
    with pytest.raises(ChangePointsUnavailable, match=r"pip install 'pytest-kimi\[otava\]'"):
        find_changes([make_series([100.0, 100.0, 50.0, 50.0, 50.0])])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_pvalue": 0.0}, "max_pvalue"),
        ({"max_pvalue": 1.5}, "max_pvalue"),
        ({"min_magnitude": -0.1}, "min_magnitude"),
        ({"min_magnitude": float("nan")}, "min_magnitude"),
        ({"window": 1}, "window"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        find_changes([], **kwargs)


@needs_otava
def test_min_magnitude_drops_small_steps() -> None:
    values = noisy([1000.0] * 10 + [975.0] * 10, 0.002, 5)  # a real 2.5% step, very quiet
    assert [c.index for c in find_changes([make_series(values)], min_magnitude=0.0)] == [10]
    assert find_changes([make_series(values)]) == []


# ------------------------------------------------------------------------------ uncertainty


def test_step_interval_is_welch_on_the_logs() -> None:
    from scipy import stats as st

    before, after = [100.0, 102.0, 98.0, 101.0], [90.0, 88.0, 91.0]
    lo, hi = step_interval(before, after) or (0, 0)
    lb, la = np.log(before), np.log(after)
    d = la.mean() - lb.mean()
    wb, wa = lb.var(ddof=1) / 4, la.var(ddof=1) / 3
    df = (wb + wa) ** 2 / (wb**2 / 3 + wa**2 / 2)
    half = st.t.ppf(0.95, df) * math.sqrt(wb + wa)
    assert lo == pytest.approx((math.exp(d - half) - 1) * 100)
    assert hi == pytest.approx((math.exp(d + half) - 1) * 100)


def test_step_interval_covers_the_true_step_90pct_of_the_time() -> None:
    rng = np.random.default_rng(20261202)
    hits = 0
    sims = 2000
    for _ in range(sims):
        before = np.exp(rng.normal(0.0, 0.02, 8)) * 1000
        after = np.exp(rng.normal(math.log(0.85), 0.03, 4)) * 1000
        lo, hi = step_interval(before.tolist(), after.tolist()) or (0, 0)
        hits += lo < -15 < hi
    assert 0.87 < hits / sims < 0.93, hits / sims


def test_step_interval_borrows_a_single_runs_spread() -> None:
    lo, hi = step_interval([100.0, 102.0, 98.0], [90.0]) or (0, 0)
    assert lo < (90 / math.exp(np.log([100.0, 102.0, 98.0]).mean()) - 1) * 100 < hi
    assert step_interval([100.0], [90.0]) is None


# ------------------------------------------------------------------------------ provenance


def test_provenance_changes_leave_out_what_changes_every_launch() -> None:
    old = _prov(1)
    new = _prov(2, **{"sim.slowdown": 1.15, "enable_eplb": True})
    new["git_commit"] = "abc"
    new["plugin_version"] = "0.3.0"
    assert [str(c) for c in provenance_changes(old, new)] == [
        "plugin_version: 0.2.0 -> 0.3.0",
        "enable_eplb: (absent) -> true",
        "sim.slowdown: 1.0 -> 1.15",
    ]


def test_a_flag_changed_as_launched_and_as_resolved_is_named_once() -> None:
    old = {
        "server_info.max_running_requests": 256,
        "server_info.launch_command.args.max_running_requests": 256,
    }
    new = {
        "server_info.max_running_requests": 128,
        "server_info.launch_command.args.max_running_requests": 128,
    }
    (change,) = provenance_changes(old, new)
    assert change.field == "max_running_requests"


@needs_otava
def test_to_dict_is_json_with_the_fields_the_cli_promises() -> None:
    values = noisy([1400.0] * 6 + [1190.0] * 4, 0.01, 2)

    def prov(i: int) -> dict[str, Any]:
        return _prov(i, **({"enable_eplb": True} if i >= 6 else {}))

    (change,) = find_changes([make_series(values, provenance=prov)])
    data = json.loads(json.dumps(change.to_dict()))
    for key in (
        "test",
        "level",
        "run",
        "time",
        "commit",
        "before_tok_s",
        "after_tok_s",
        "change_pct",
    ):
        assert key in data
    assert data["run"] == 7 and data["time"] == "2026-11-02T14:00:00+00:00"
    assert data["provenance_changes"] == [{"field": "enable_eplb", "old": None, "new": True}]
    assert data["changed"] == ["enable_eplb: (absent) -> true"]
    assert data["key"] == {"concurrency": 64} and data["deployment"] == "sim"
    assert change.provenance_changes[0].old is ABSENT
    text = "\n".join(change.describe())
    assert "from run 7" in text and "commit c06" in text and "enable_eplb" in text


# ------------------------------------------------------------------------------------- CLI


def _report(
    tok_s: float, trials: Sequence[float], slowdown: float = 1.0, seed: int = 0
) -> dict[str, Any]:
    """A minimal --perf-json report with one test of one level (what the store records)."""
    return {
        "schema": 3,
        "endpoint": {
            "url": "http://127.0.0.1:1",
            "model": "kimi-k2.6-sim",
            "server_info": {
                "tp_size": 8,
                "port": 1000 + seed,
                "sim": {"slowdown": slowdown, "seed": seed},
            },
        },
        "tests": [
            {
                "nodeid": "test_suite.py::test_one",
                "outcome": "passed",
                "baseline_profile": "sim",
                "workload": {"max_tokens": 64, "prompts": "builtin:diverse", "api": "chat"},
                "levels": [
                    {
                        "concurrency": 1,
                        "max_tokens": 64,
                        "label": "C=1",
                        "tok_s": tok_s,
                        "trials_tok_s": list(trials),
                        "verdict": "no-baseline",
                    }
                ],
            }
        ],
    }


def record(url: str, reports: Sequence[Mapping[str, Any]]) -> None:
    from pytest_kimi.history.rows import flat_provenance
    from pytest_kimi.history.store import RunMeta, open_history

    with open_history(url) as store:
        for i, report in enumerate(reports):
            meta = RunMeta(
                time=T0 + timedelta(hours=i),
                commit=f"c{i:02d}",
                deployment="sim",
                provenance=flat_provenance(report["endpoint"], plugin_version="0.2.0"),
            )
            store.record_run(report, meta)


@pytest.fixture
def stepped_history(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    values = noisy([60.0] * 6 + [51.0] * 4, 0.01, 4)
    reports = [
        _report(v, [v * 0.995, v * 1.005], slowdown=1.15 if i >= 6 else 1.0, seed=i)
        for i, v in enumerate(values)
    ]
    record(url, reports)
    return url


@needs_otava
def test_cli_changes_json(capsys: pytest.CaptureFixture[str], stepped_history: str) -> None:
    assert main(["history", "changes", "--history", stepped_history, "--json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)
    assert change["test"] == "test_suite.py::test_one" and change["level"] == "C=1"
    assert change["run"] == 7 and change["commit"] == "c06" and change["deployment"] == "sim"
    assert change["change_pct"] == pytest.approx(-15, abs=3)
    assert change["changed"] == ["sim.slowdown: 1.0 -> 1.15"]


@needs_otava
def test_cli_changes_text(capsys: pytest.CaptureFixture[str], stepped_history: str) -> None:
    assert main(["history", "changes", "--history", stepped_history]) == 0
    out = capsys.readouterr().out
    assert "test_suite.py::test_one C=1 [sim]: -1" in out and "from run 7" in out
    assert "changed: sim.slowdown: 1.0 -> 1.15" in out
    assert out.rstrip().endswith("1 change point in 1 of 1 series")
    assert main(["history", "changes", "--history", stepped_history, "--test", "nomatch"]) == 0
    assert "0 change points in 0 of 0 series" in capsys.readouterr().out


def test_cli_runs(capsys: pytest.CaptureFixture[str], stepped_history: str) -> None:
    assert main(["history", "runs", "--history", stepped_history, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in runs] == list(range(1, 11)) and runs[0]["commit"] == "c00"
    assert main(["history", "runs", "--history", stepped_history]) == 0
    assert capsys.readouterr().out.rstrip().endswith("10 runs")


@needs_otava
def test_cli_reads_the_default_history_and_the_environment(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    stepped_history: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KIMI_PERF_HISTORY", raising=False)
    assert main(["history", "changes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kimi-perf: error: no history at sqlite:///.kimi/history.db yet")
    assert "\n" not in err and not (tmp_path / ".kimi").exists(), "reading creates nothing"
    monkeypatch.setenv("KIMI_PERF_HISTORY", stepped_history)
    assert main(["history", "changes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["run"] == 7
    (tmp_path / ".kimi").mkdir()
    Path(stepped_history.removeprefix("sqlite:///")).rename(tmp_path / ".kimi" / "history.db")
    monkeypatch.delenv("KIMI_PERF_HISTORY")
    assert main(["history", "changes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["run"] == 7


@pytest.mark.parametrize(
    "url, message",
    [
        ("mysql://db/x", "unsupported database 'mysql'"),
        ("off", "the history is off"),
        ("sqlite:////nonexistent/dir/h.db", "no history at sqlite:////nonexistent/dir/h.db yet"),
        ("postgresql://u:secret@127.0.0.1:9/db", "history postgresql://u:***@127.0.0.1:9/db"),
    ],
)
def test_cli_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], url: str, message: str
) -> None:
    assert main(["history", "changes", "--history", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kimi-perf: error: ") and message in err, err
    assert err.count("\n") == 1 and "secret" not in err


def test_cli_without_otava_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stepped_history: str
) -> None:
    monkeypatch.setitem(sys.modules, "otava", None)
    assert main(["history", "changes", "--history", stepped_history]) == 2
    assert "pip install 'pytest-kimi[otava]'" in capsys.readouterr().err


@needs_otava
def test_cli_dashboard_draws_the_change(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stepped_history: str
) -> None:
    out = tmp_path / "dash"
    assert main(["dashboard", "--history", stepped_history, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == f"wrote {out / 'index.html'}"
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "run 7" in html


# -------------------------------------------------------------------------- end to end

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[4], max_tokens=64, trials=2, warmup=1)
def test_one():
    pass
"""
SIM = "sim:speed=10,stream_interval=8"


def run_pytest(where: Path, history: str, sim: str, attempts: int = 3) -> int:
    """One pytest session against the simulator, recorded into ``history`` (a subprocess: a
    session starts a simulator and the plugin keeps session state); the id of the run.

    A run whose level came out ``invalid`` because the machine took the load client's core
    (the plugin says so and fails the test) is recorded too, and the analyses leave it out;
    it is run again, so the history gets the valid run the test needs.
    """
    for _ in range(attempts):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                f"--endpoint={sim}",
                f"--perf-history={history}",
            ],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=SESSION_S,
        )
        recorded = re.search(r"history: run (\d+) ->", proc.stdout)
        assert recorded, proc.stdout[-3000:] + proc.stderr[-3000:]
        if proc.returncode == 0:
            return int(recorded.group(1))
        assert "throughput measurement invalid" in proc.stdout, (
            proc.stdout[-3000:] + proc.stderr[-3000:]
        )
    raise AssertionError(f"no valid run in {attempts} attempts on this machine")


@needs_otava
def test_simulator_runs_with_a_slowdown_injected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seven runs of the simulator recorded by pytest; from the fifth every step takes 1.5
    times as long (``slowdown``): the change is named at that run with the knob beside it.
    Each run is a fresh simulator with its own seed (seeds do not split builds).  Seven: with
    the default ``max_pvalue`` (1e-4) three runs on either side leave a step of a third
    unproven at 3% of measurement jitter one time in five, four and three almost never."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    history = f"sqlite:///{tmp_path / 'h.db'}"
    slowdowns = [1.0] * 4 + [1.5] * 3
    ids = [
        run_pytest(tmp_path, history, f"{SIM},seed={i + 1},slowdown={slowdown}")
        for i, slowdown in enumerate(slowdowns)
    ]
    assert main(["history", "changes", "--history", history, "--json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)
    assert change["test"] == "test_suite.py::test_one" and change["level"] == "C=4"
    assert change["run"] == ids[4] and change["previous_run"] == ids[3]
    assert (change["before_runs"], change["after_runs"]) == (4, 3)
    truth = SimConfig(slowdown=1.5).true_tok_s(4) / SimConfig().true_tok_s(4) - 1
    assert change["change_pct"] == pytest.approx(truth * 100, abs=4)
    assert change["changed"] == ["sim.slowdown: 1.0 -> 1.5"]
