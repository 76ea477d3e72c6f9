"""Session noise from the history (pytest_kimi.history.noise, ``kimi-perf history noise``).

Synthetic sessions with a known noise give an interval that covers it; runs are grouped into
unchanged builds (provenance equal but for per-launch fields, no change point between them);
levels of one server start are pooled as one measurement, not several.  At the end, the
simulator: runs with its per-start ``noise`` and a different ``seed`` each, recorded by
pytest, and the interval covers ``sqrt(2) * noise``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kimi.cli import main
from pytest_kimi.gate import session_noise
from pytest_kimi.history.changes import find_changes
from pytest_kimi.history.model import LevelSeries, Point, RunInfo
from pytest_kimi.history.noise import build_groups, estimate_noise
from pytest_kimi.sim.config import SimConfig
from support.otava import needs_otava

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=timezone.utc)


def _run(i: int, **server: Any) -> RunInfo:
    prov: dict[str, Any] = {
        "model": "kimi-k2.6-sim",
        "plugin_version": "0.2.0",
        "client_host": "ci",
        "server_info.port": 30000 + i,
        "server_info.sim.seed": i,
        "server_info.sim.noise": 0.03,
        "server_info.sim.slowdown": 1.0,
    }
    prov.update({f"server_info.{k}": v for k, v in server.items()})
    return RunInfo(id=i + 1, time=T0 + timedelta(hours=i), commit=f"c{i}", provenance=prov)


def history(
    runs: Sequence[RunInfo],
    levels: Mapping[str, float],
    *,
    tau: float,
    within: float = 0.01,
    trials: int = 3,
    seed: int = 0,
    step: Mapping[int, float] | None = None,
) -> list[LevelSeries]:
    """Series of ``levels`` over ``runs``: one factor ``exp(N(0, tau))`` per run shared by
    its levels (a server start), ``trials`` trials each with ``within`` noise; ``step`` maps a
    run index to a true factor from there on."""
    rng = np.random.default_rng(seed)
    points: dict[str, list[Point]] = {name: [] for name in levels}
    true = 1.0
    for i, run in enumerate(runs):
        true = (step or {}).get(i, true)
        factor = true * math.exp(rng.normal(0.0, tau))
        for name, base in levels.items():
            xs = tuple(
                float(base * factor * math.exp(rng.normal(0.0, within))) for _ in range(trials)
            )
            points[name].append(Point(run=run, tok_s=statistics.median(xs), trials=xs))
    return [
        LevelSeries(
            test="t.py::test_sweep", level=name, key={"c": name}, deployment="sim", points=tuple(p)
        )
        for name, p in points.items()
    ]


@needs_otava
def test_one_build_one_level_is_the_gates_own_estimate() -> None:
    runs = [_run(i) for i in range(8)]
    (series,) = history(runs, {"C=1": 65.0}, tau=0.03, seed=1)
    report = estimate_noise([series])
    (one,) = report.series
    sessions = [p.trials for p in series.points]
    assert one.estimate.sigma == pytest.approx(session_noise.estimate_session_sigma(sessions))
    assert one.estimate.sessions == 8 and one.estimate.trials == 24 and one.groups == 1
    assert one.runs == tuple(range(1, 9))
    assert one.estimate.low < one.estimate.sigma < one.estimate.high
    assert one.estimate.low < math.sqrt(2) * 0.03 < one.estimate.high


def test_seeds_ports_and_commits_do_not_split_a_build_but_a_knob_does() -> None:
    runs = [_run(i) for i in range(4)] + [_run(i, **{"sim.noise": 0.05}) for i in range(4, 8)]
    (series,) = history(runs, {"C=1": 65.0}, tau=0.03, seed=2)
    groups = build_groups(series, [])
    assert [[s.key[0] for s in g] for g in groups] == [[1, 2, 3, 4], [5, 6, 7, 8]]


@needs_otava
def test_a_build_change_is_not_noise() -> None:
    """Eight runs, then a deploy 15% slower: two builds, each scattering around its own level;
    all runs thrown together would read the step as session noise."""
    runs = [_run(i) for i in range(8)] + [_run(i, **{"sim.slowdown": 1.15}) for i in range(8, 16)]
    series = history(runs, {"C=1": 65.0}, tau=0.02, seed=3, step={8: 0.87})
    report = estimate_noise(series)
    (one,) = report.series
    assert one.groups == 2 and one.estimate.sessions == 16 and one.estimate.df_between == 14
    naive = session_noise.estimate_session_sigma([p.trials for p in series[0].points])
    assert naive > 0.09 > one.estimate.sigma
    assert one.estimate.low < math.sqrt(2) * 0.02 < one.estimate.high


@needs_otava
def test_a_change_point_splits_a_build_the_provenance_did_not_record() -> None:
    runs = [_run(i) for i in range(16)]  # same provenance: a driver update nobody recorded
    (series,) = history(runs, {"C=1": 65.0}, tau=0.01, seed=4, step={8: 0.8})
    found = find_changes([series])
    assert [c.run for c in found] == [9]
    assert [len(g) for g in build_groups(series, found)] == [8, 8]
    report = estimate_noise([series])
    assert report.series[0].groups == 2 and report.series[0].estimate.sigma < 0.04


@needs_otava
def test_levels_of_one_server_start_pool_as_one_measurement() -> None:
    runs = [_run(i) for i in range(6)]
    series = history(runs, {"C=1": 65.0, "C=16": 700.0, "C=64": 1300.0}, tau=0.04, seed=5)
    report = estimate_noise(series)
    assert len(report.series) == 3
    pooled = report.pooled
    assert pooled is not None
    assert pooled.levels == 3 and pooled.sessions == 6 and pooled.trials == 54
    assert pooled.df_between == 5, "three levels do not triple the sessions"
    assert pooled.low < math.sqrt(2) * 0.04 < pooled.high
    assert report.recommendation is not None
    value = report.recommendation.value
    assert value >= pooled.sigma and value - pooled.sigma < 0.005 + 1e-9
    assert f"--perf-session-sigma {value:g}" in report.recommendation.text


def test_perf_sessions_points_are_sessions_of_their_own() -> None:
    rng = np.random.default_rng(6)
    points = []
    for r in range(2):
        run = _run(r)
        for s in range(3):
            f = math.exp(rng.normal(0.0, 0.03))
            xs = tuple(float(100 * f * math.exp(rng.normal(0.0, 0.01))) for _ in range(3))
            points.append(Point(run=run, tok_s=statistics.median(xs), trials=xs, session=s))
    stalled = Point(run=_run(2), tok_s=50.0, trials=(50.0, 60.0), verdict="invalid")
    series = LevelSeries("t", "C=1", {}, "sim", (*points, stalled))
    report = estimate_noise([series])
    (one,) = report.series
    assert one.estimate.sessions == 6 and one.runs == (1, 2), "an invalid level is no session"


@needs_otava
def test_a_level_added_later_is_left_out_of_the_sessions_it_missed() -> None:
    runs = [_run(i) for i in range(6)]
    old, new = history(runs, {"C=1": 65.0, "C=8": 400.0}, tau=0.03, seed=7)
    new = LevelSeries(new.test, new.level, new.key, new.deployment, new.points[3:])
    report = estimate_noise([old, new])
    assert [s.estimate.sessions for s in report.series] == [6, 3]
    assert report.pooled is not None and report.pooled.sessions == 6
    assert report.pooled.levels == 1, "the level with every session, not 3 of them"


def test_too_little_data_is_said_not_guessed() -> None:
    runs = [_run(0), _run(1, **{"sim.slowdown": 2.0})]
    one_each = history(runs, {"C=1": 65.0}, tau=0.03)
    no_trials = [
        LevelSeries("t", "C=4", {}, "sim", tuple(Point(run=r, tok_s=100.0) for r in runs[:1]))
    ]
    report = estimate_noise(one_each + no_trials)
    assert report.series == () and report.pooled is None and report.recommendation is None
    assert report.skipped == (
        "t.py::test_sweep C=1 [sim]: at most 1 session of one build",
        "t C=4 [sim]: no trials stored",
    )
    assert "no estimate" in "\n".join(report.describe())


@needs_otava
def test_to_dict_says_both_sigmas() -> None:
    series = history([_run(i) for i in range(5)], {"C=1": 65.0}, tau=0.03, seed=8)
    data = json.loads(json.dumps(estimate_noise(series).to_dict()))
    one = data["series"][0]
    assert one["one_session_sd"] == pytest.approx(one["session_sigma"] / math.sqrt(2), abs=1e-6)
    assert one["session_sigma_low"] <= one["session_sigma"] <= one["session_sigma_high"]
    assert data["pooled"]["sessions"] == 5 and data["recommendation"]["session_sigma"] > 0


@needs_otava
def test_interval_coverage_over_many_histories() -> None:
    """The per-level 90% interval covers the true sqrt(2) * tau in about 90% of histories of
    6 runs (bench/history_noise.py measures it more widely)."""
    truth = math.sqrt(2) * 0.03
    hits = 0
    sims = 300
    for seed in range(sims):
        series = history([_run(i) for i in range(6)], {"C=1": 65.0}, tau=0.03, seed=1000 + seed)
        (one,) = estimate_noise(series).series
        hits += one.estimate.low <= truth <= one.estimate.high
    assert 0.84 <= hits / sims <= 0.96, hits / sims


# ------------------------------------------------------------------------------------- CLI


def _report(factor: float, seed: int, noise: float = 0.05) -> dict[str, Any]:
    trials = [65.0 / factor * (1 + d) for d in (-0.004, 0.0, 0.004)]
    return {
        "endpoint": {
            "url": "http://127.0.0.1:1",
            "model": "kimi-k2.6-sim",
            "server_info": {"port": 1000 + seed, "sim": {"noise": noise, "seed": seed}},
        },
        "tests": [
            {
                "nodeid": "test_suite.py::test_one",
                "baseline_profile": "sim",
                "workload": {"max_tokens": 64},
                "levels": [
                    {
                        "concurrency": 1,
                        "label": "C=1",
                        "tok_s": statistics.median(trials),
                        "trials_tok_s": trials,
                    }
                ],
            }
        ],
    }


@needs_otava
def test_cli_noise(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from pytest_kimi.history.rows import flat_provenance
    from pytest_kimi.history.store import RunMeta, open_history

    url = f"sqlite:///{tmp_path / 'h.db'}"
    with open_history(url) as store:
        for seed in range(1, 7):
            report = _report(SimConfig(noise=0.05, seed=seed).noise_factor, seed)
            meta = RunMeta(
                time=T0 + timedelta(hours=seed),
                deployment="sim",
                provenance=flat_provenance(report["endpoint"]),
            )
            store.record_run(report, meta)
    assert main(["history", "noise", "--history", url, "--json", "--session-sigma", "0.03"]) == 0
    data = json.loads(capsys.readouterr().out)
    (one,) = data["series"]
    assert one["sessions"] == 6 and one["runs"] == [1, 2, 3, 4, 5, 6]
    assert one["session_sigma_low"] <= math.sqrt(2) * 0.05 <= one["session_sigma_high"]
    assert "the 0.03 this run used" in data["recommendation"]["text"]
    assert main(["history", "noise", "--history", url]) == 0
    out = capsys.readouterr().out
    assert "test_suite.py::test_one C=1 [sim]: session sigma 0." in out
    assert "one session 0." in out and "recommendation: --perf-session-sigma 0." in out


# -------------------------------------------------------------------------- end to end

NOISE = 0.05
SEEDS = (1, 2, 3, 4)
"""Four server starts whose noise factors scatter with a sample sd of 0.051 around the
simulator's 0.05 (:attr:`SimConfig.noise_factor` is a function of the seed), so the check
below tests the pipeline, not the luck of four draws; bench/history_noise.py measures the
interval's coverage over many draws."""


@needs_otava
def test_simulator_runs_with_per_start_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_history_changes import SIM, SUITE, run_pytest

    (tmp_path / "test_suite.py").write_text(SUITE)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    for seed in SEEDS:
        run_pytest(tmp_path, url, f"{SIM},noise={NOISE},seed={seed}")
    assert main(["history", "noise", "--history", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (one,) = data["series"]
    assert one["sessions"] == len(SEEDS) and one["groups"] == 1, "seeds do not split builds"
    truth = math.sqrt(2) * NOISE
    assert one["session_sigma_low"] <= truth <= one["session_sigma_high"], one
    # the estimate is the draws' own scatter, give or take the measurement's: each session's
    # mean log tok/s is its drawn factor plus what the machine added to that session (on a
    # loaded machine, a whole session slowed by a percent or two), and the scatter of a sum
    # lies within the scatter of that addition of the draws' (|sd(a + b) - sd(a)| <= sd(b))
    drawn = [math.log(SimConfig(noise=NOISE, seed=s).noise_factor) for s in SEEDS]
    from pytest_kimi.history.changes import trusted
    from pytest_kimi.history.store import open_history

    with open_history(url) as history:
        (series,) = history.series()
    kept = [p for p in series.points if trusted(p) and p.trials]  # as the analysis keeps them
    means = [statistics.fmean(math.log(v) for v in p.trials) for p in kept]
    added = statistics.stdev(m - d for m, d in zip(means, drawn, strict=True))
    assert one["session_sigma"] == pytest.approx(
        math.sqrt(2) * statistics.stdev(drawn), abs=0.015 + math.sqrt(2) * added
    )
    assert one["one_session_sd"] == pytest.approx(one["session_sigma"] / math.sqrt(2), abs=1e-5)
