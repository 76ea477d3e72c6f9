"""A ``@capacity`` test in the history: one series (its capacity), its probes only detail.

A capacity search probes loads of its own choosing, a different set every run, and judges each
``held`` or ``broke``; the test's result is the capacity with the bracket the search ended on
and the capacity gate's verdict.  So the history keeps one series per capacity test (capacity,
bracket, boundary, verdict, the change against the baseline with its interval), never one per
probed load, and what reads the series (change points, session noise, the dashboard) reads
capacities.  Checked end to end with real sessions against the simulator, on made-up histories
in SQLite and PostgreSQL (a step in the capacity, and a bigger one in the probes' tok/s that
must not be named), on a database written before capacities were stored (the migration fills
them from the rows it has), and the capacity noise's interval against its nominal coverage.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from support.otava import needs_otava
from support.pg_server import PostgresServer, require_postgres
from pytest_kimi.cli import main
from pytest_kimi.history.dashboard import write_dashboard
from pytest_kimi.history.model import CAPACITY, CapacityFigures, LevelSeries, Point, RunInfo
from pytest_kimi.history.noise import capacity_noise, estimate_noise
from pytest_kimi.history.rows import RunMeta, build_rows, flat_provenance
from pytest_kimi.history.store import open_history

T0 = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
NODE = "test_cap.py::test_capacity"
LABEL = "capacity under p95 end-to-end <= 6.6 s"
CAPACITY_KEY = {
    "api": "chat",
    "ignore_eos": True,
    "max_tokens": 128,
    "prompts": "builtin:diverse",
    "metric": "concurrency",
    "percentile": 95.0,
    "max_e2e_s": 6.6,
    "protocol": "whole-requests",
}


@pytest.fixture(autouse=True)
def _no_history_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's or CI's own variables must not choose these sessions' history."""
    for name in ("KIMI_PERF_HISTORY", "GITHUB_RUN_ID", "GITHUB_STEP_SUMMARY", "CI_PIPELINE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer(require_postgres()) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def history_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty history of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/h.db"
    pg: PostgresServer = request.getfixturevalue("postgres")
    return pg.url(pg.create_database())


# ------------------------------------------------------------------------ made-up reports


def probe(load: int, order: int, held: bool, tok_s: float) -> dict[str, Any]:
    """One level of a capacity search as the report has it (``capacity_level`` beside the
    level's own throughput figures)."""
    return {
        "label": f"C={load}",
        "concurrency": load,
        "rate": None,
        "max_tokens": 128,
        "input_tokens": None,
        "prompts": "builtin:diverse",
        "protocol": "whole-requests",
        "tok_s": tok_s,
        "trials_tok_s": [tok_s * 0.99, tok_s * 1.01],
        "verdict": "held" if held else "broke",
        "baseline_tok_s": None,
        "change_pct": None,
        "ci90": None,
        "capacity_level": {
            "load": load,
            "order": order,
            "held": held,
            "trials": 2,
            "margin_pct": 5.0 if held else -3.0,
            "sure": 0.99,
            "binding": "e2e_s",
            "latencies": {"e2e_s": 6.3 if held else 6.8},
            "note": None,
        },
    }


def capacity_test(
    estimate: float,
    *,
    verdict: str = "no-baseline",
    probes_tok_s: float = 600.0,
    baseline: tuple[float, float, float] | None = None,
    change: tuple[float, float, float] | None = None,
    log_se: float = 0.005,
) -> dict[str, Any]:
    """A ``@capacity`` test dict whose search ended with ``low = floor(estimate)`` held and
    ``low + 1`` broke, after probes at 4, 11 and a broken load well above."""
    low = math.floor(estimate)
    probes = [
        probe(4, 1, True, probes_tok_s * 0.3),
        probe(11, 2, True, probes_tok_s * 0.6),
        probe(low + 7, 3, False, probes_tok_s * 1.1),
        probe(low, 4, True, probes_tok_s),
        probe(low + 1, 5, False, probes_tok_s * 1.02),
    ]
    base_value, base_high, base_estimate = baseline or (None, None, None)
    pct, lo, hi = change or (None, None, None)
    return {
        "nodeid": NODE,
        "outcome": "failed" if verdict == "regression" else "passed",
        "workload": {"api": "chat", "ignore_eos": True},
        "baseline_profile": "sim",
        "levels": sorted(probes, key=lambda p: p["concurrency"]),
        "capacity": {
            "metric": "concurrency",
            "value": low,
            "low": low,
            "high": low + 1,
            "estimate": estimate,
            "ci90": [estimate * 0.99, estimate * 1.01],
            "log_se": log_se,
            "log_se_df": 1,
            "slope": 0.6,
            "step": 3,
            "resolution": 0.1,
            "range": [4, 128],
            "percentile": 95.0,
            "ceilings": {"e2e_s": 6.6},
            "min_capacity": None,
            "stop": "converged",
            "levels": [p["capacity_level"] for p in probes],
            "non_monotonic": [],
            "workload": dict(CAPACITY_KEY),
            "baseline": base_value,
            "baseline_low": base_value,
            "baseline_high": base_high,
            "baseline_estimate": base_estimate,
            "change_pct": pct,
            "change_ci90": None if lo is None else [lo, hi],
            "p_value": None,
            "tolerance_pct": 5.0,
            "verdict": verdict,
            "reasons": [],
        },
    }


def throughput_test(tok_s: float, change: tuple[float, float, float] | None) -> dict[str, Any]:
    pct, lo, hi = change or (None, None, None)
    return {
        "nodeid": "test_cap.py::test_tp",
        "outcome": "passed",
        "workload": {"api": "chat", "ignore_eos": True},
        "baseline_profile": "sim",
        "levels": [
            {
                "label": "C=4",
                "concurrency": 4,
                "rate": None,
                "max_tokens": 64,
                "input_tokens": None,
                "prompts": "builtin:diverse",
                "protocol": "whole-requests",
                "tok_s": tok_s,
                "trials_tok_s": [tok_s * 0.995, tok_s, tok_s * 1.005],
                "verdict": "pass" if change else "no-baseline",
                "baseline_tok_s": 200.0 if change else None,
                "change_pct": pct,
                "ci90": None if change is None else [lo, hi],
                "tolerance_pct": 5.0 if change else None,
            }
        ],
    }


def report(*tests: dict[str, Any], seed: int = 0, slowdown: float = 1.0) -> dict[str, Any]:
    return {
        "schema": 1,
        "plugin_version": "0.2.0",
        "endpoint": {
            "url": "http://127.0.0.1:1",
            "model": "kimi-k2.6-sim",
            "server_info": {"tp_size": 8, "sim": {"seed": seed, "slowdown": slowdown}},
        },
        "tests": list(tests),
    }


def record(url: str, reports: Sequence[Mapping[str, Any]]) -> list[int]:
    ids = []
    with open_history(url) as store:
        for i, rep in enumerate(reports):
            meta = RunMeta(
                time=T0 + timedelta(days=i),
                commit=f"c{i:02d}",
                deployment="sim",
                provenance=flat_provenance(rep["endpoint"], plugin_version="0.2.0"),
            )
            ids.append(store.record_run(rep, meta))
    return ids


def stepped_reports() -> list[dict[str, Any]]:
    """Eight runs: the capacity's boundary 40 for five, then 30 (a slower server); the
    probes' tok/s jumps by half at run 3, which the history must not name (probes are no
    series).  Each run another seed of one build, the last three another slowdown."""
    rng = random.Random(7)
    out = []
    for i in range(8):
        slow = i >= 5
        estimate = (30.0 if slow else 40.0) * math.exp(rng.gauss(0, 0.01))
        cap = capacity_test(
            round(estimate, 4),
            verdict="regression" if slow else "pass",
            probes_tok_s=900.0 if i >= 3 else 600.0,
            baseline=(40.0, 41.0, 40.5),
            change=(round((estimate / 40.5 - 1) * 100, 2), -30.0 if slow else -6.0, 5.0),
        )
        tp = throughput_test(200.0 * math.exp(rng.gauss(0, 0.01)), (-1.0, -3.5, 1.6))
        out.append(report(cap, tp, seed=i, slowdown=1.3 if slow else 1.0))
    return out


# ------------------------------------------------------------------------------ the rows


def test_a_capacity_test_is_one_row_and_its_levels_are_probes() -> None:
    rows = build_rows(report(capacity_test(40.5, baseline=(40, 41, 40.4))), RunMeta(time=T0))
    (test,) = rows.tests
    assert test.capacity is not None
    cap = test.capacity
    assert (cap.value, cap.low, cap.high, cap.estimate) == (40.0, 40.0, 41.0, 40.5)
    assert (cap.baseline, cap.baseline_high, cap.baseline_estimate) == (40.0, 41.0, 40.4)
    assert cap.label == LABEL and cap.key == CAPACITY_KEY and cap.verdict == "no-baseline"
    assert len(test.levels) == 5 and all(lv.probe for lv in test.levels)
    (tp,) = build_rows(report(throughput_test(200.0, (-1.0, -3.5, 1.6))), RunMeta(time=T0)).tests
    assert tp.capacity is None
    assert [(lv.probe, lv.ci90) for lv in tp.levels] == [(False, (-3.5, 1.6))]


# ---------------------------------------------------------------- store, changes, noise


@needs_otava
def test_history_reads_capacities_not_probes(history_url: str) -> None:
    from pytest_kimi.history.changes import find_changes

    ids = record(history_url, stepped_reports())
    with open_history(history_url) as store:
        series = store.series()
        details = store.run_details(ids[0])
    # one capacity series and the throughput level: not one series per probed load
    assert [(s.test, s.level, s.kind) for s in series] == [
        (NODE, LABEL, CAPACITY),
        ("test_cap.py::test_tp", "C=4", "throughput"),
    ]
    cap = series[0]
    assert cap.key == CAPACITY_KEY and cap.unit == "streams" and cap.metric == "concurrency"
    assert [p.run.id for p in cap.points] == ids
    assert [p.verdict for p in cap.points] == ["pass"] * 5 + ["regression"] * 3
    last = cap.points[-1]
    assert last.tok_s is None and last.trials == () and last.capacity is not None
    figures = stepped_reports()[-1]["tests"][0]["capacity"]
    assert (last.capacity.value, last.capacity.low, last.capacity.high) == (
        figures["value"],
        figures["low"],
        figures["high"],
    )
    assert last.capacity.estimate == figures["estimate"] == last.figure
    assert (last.change_pct, last.ci90) == (figures["change_pct"], (-30.0, 5.0))
    assert last.capacity.baseline_compared == 40.5
    assert series[1].points[0].ci90 == (-3.5, 1.6)
    # the probes are still there, as the run's detail
    (probes, _) = details["tests"]
    assert [lv["verdict"] for lv in probes["levels"]].count("broke") == 2
    assert probes["capacity"]["verdict"] == "pass"

    # change points: the capacity's step, and nothing of the probes' jump at run 3
    (change,) = find_changes(series)
    assert (change.test, change.level, change.kind, change.unit) == (
        NODE,
        LABEL,
        CAPACITY,
        "streams",
    )
    assert change.run == ids[5] and change.previous_run == ids[4]
    assert change.before_tok_s == pytest.approx(40.0, rel=0.02)
    assert change.after_tok_s == pytest.approx(30.0, rel=0.02)
    assert "streams" in "\n".join(change.describe())
    assert "lower" in change.describe()[0]

    # session noise: the capacity on its own (split at its change point), no probe anywhere
    noise = estimate_noise(series)
    assert [s.level for s in noise.series] == ["C=4"]
    (cn,) = noise.capacities
    assert (cn.series, cn.sessions, cn.groups, cn.df) == (cap.ident, 8, 2, 6)
    assert 0.0 < cn.sd < 0.03 and cn.low <= cn.sd <= cn.high
    assert cn.slope == 0.6
    assert cn.to_dict()["implied_session_sigma"] == pytest.approx(math.sqrt(2) * cn.sd * 0.6)
    assert not any("C=" in why for why in noise.skipped), noise.skipped
    text = "\n".join(noise.describe())
    assert cap.ident in text and "ln(boundary)" in text


@needs_otava
def test_cli_changes_and_noise_name_the_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    ids = record(url, stepped_reports())
    assert main(["history", "changes", "--history", url, "--json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)
    assert (change["kind"], change["unit"], change["run"]) == (CAPACITY, "streams", ids[5])
    assert change["series"] == f"{NODE} {LABEL} [sim]"
    assert main(["history", "noise", "--history", url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["series"] for c in out["capacities"]] == [f"{NODE} {LABEL} [sim]"]
    assert [s["level"] for s in out["series"]] == ["C=4"]


def _capacity_series(values: Sequence[tuple[float, float]], slope: float = 0.5) -> LevelSeries:
    """One build's capacity series: (boundary, log_se) per run, every run another seed."""
    points = tuple(
        Point(
            run=RunInfo(
                id=i + 1,
                time=T0 + timedelta(hours=i),
                provenance={"server_info.sim.seed": i, "model": "m"},
            ),
            tok_s=None,
            verdict="pass",
            capacity=CapacityFigures(
                metric="concurrency",
                value=math.floor(b),
                low=math.floor(b),
                high=math.floor(b) + 1,
                estimate=b,
                log_se=se,
                slope=slope,
            ),
        )
        for i, (b, se) in enumerate(values)
    )
    return LevelSeries(NODE, LABEL, CAPACITY_KEY, "sim", points, kind=CAPACITY)


def test_capacity_noise_interval_covers_the_true_session_sd() -> None:
    """Histories of 6 server starts: ``ln(boundary) = ln 40 + N(0, tau) + N(0, log_se)``; the
    90% interval of ``tau`` holds the truth about 90% of the time (the chi-square interval
    is exact when ``log_se`` is the trial sd, as here)."""
    tau, se, n, reps = 0.04, 0.015, 6, 600
    rng = random.Random(11)
    hits = 0
    estimates = []
    for _ in range(reps):
        values = [(40.0 * math.exp(rng.gauss(0, tau) + rng.gauss(0, se)), se) for _ in range(n)]
        found = capacity_noise(_capacity_series(values), [])
        assert not isinstance(found, str)
        hits += found.low <= tau <= found.high
        estimates.append(found.sd)
    assert 0.86 <= hits / reps <= 0.94, hits / reps
    # the trial part is taken out: the median estimate is near tau, not sqrt(tau^2 + se^2)
    median = sorted(estimates)[reps // 2]
    assert abs(median - tau) < abs(median - math.hypot(tau, se)) + 0.002
    assert median == pytest.approx(tau, rel=0.15)


def test_capacity_noise_says_why_there_is_none() -> None:
    one = _capacity_series([(40.0, 0.01)])
    assert capacity_noise(one, []) == f"{one.ident}: at most 1 session of one build"
    bound = LevelSeries(
        NODE,
        LABEL,
        CAPACITY_KEY,
        "sim",
        tuple(
            Point(
                run=RunInfo(id=i, time=T0 + timedelta(hours=i)),
                tok_s=None,
                capacity=CapacityFigures("concurrency", 128.0, 128.0, None, None),
            )
            for i in range(3)
        ),
        kind=CAPACITY,
    )  # the top of the range held every run: bounds, no boundary
    assert capacity_noise(bound, []) == f"{bound.ident}: no capacity boundary stored"


# -------------------------------------------------------------- an older database


def _old_database(url: str) -> None:
    """A history written by the plugin before capacities were stored (revision 0001): a
    capacity test's probes as levels of their own, a throughput level's interval only in its
    JSON."""
    import sqlalchemy as sa
    from alembic import command
    from sqlalchemy.dialects.postgresql import JSONB

    from pytest_kimi.history.rows import canonical_key
    from pytest_kimi.history.store import alembic_config, create_history_engine
    from pytest_kimi.measure.results import level_key

    command.upgrade(alembic_config(url), "0001")
    json_type = sa.JSON().with_variant(JSONB(), "postgresql")
    runs = sa.table(
        "kimi_runs",
        sa.column("id", sa.Integer()),
        sa.column("time", sa.DateTime(timezone=True)),
        sa.column("deployment"),
        *(sa.column(c, json_type) for c in ("provenance", "deployments", "endpoint")),
    )
    tests = sa.table(
        "kimi_tests",
        sa.column("id", sa.Integer()),
        *(sa.column(c) for c in ("run_id", "position", "nodeid", "test", "deployment")),
        sa.column("outcome"),
        sa.column("data", json_type),
    )
    levels = sa.table(
        "kimi_levels",
        *(sa.column(c) for c in ("test_id", "run_id", "position", "level_key", "label")),
        *(sa.column(c) for c in ("tok_s", "verdict", "baseline_tok_s", "change_pct")),
        sa.column("trials_tok_s", json_type),
        sa.column("data", json_type),
    )
    engine = create_history_engine(url)
    try:
        with engine.begin() as conn:
            for day, estimate in ((1, 40.4), (2, 30.6)):
                run_id = conn.execute(
                    runs.insert()
                    .values(
                        time=T0 + timedelta(days=day),
                        deployment="sim",
                        provenance={},
                        deployments={},
                        endpoint={},
                    )
                    .returning(runs.c.id)
                ).scalar_one()
                cap = capacity_test(
                    estimate,
                    verdict="pass" if day == 1 else "regression",
                    baseline=(40.0, 41.0, 40.5),
                    change=(-0.2, -6.0, 6.0) if day == 1 else (-24.4, -30.0, -18.0),
                )
                tp = throughput_test(200.0, (-1.0, -3.5, 1.6))
                for position, test in enumerate((cap, tp)):
                    test_id = conn.execute(
                        tests.insert()
                        .values(
                            run_id=run_id,
                            position=position,
                            nodeid=test["nodeid"],
                            test=test["nodeid"],
                            deployment="sim",
                            outcome=test["outcome"],
                            data={k: v for k, v in test.items() if k != "levels"},
                        )
                        .returning(tests.c.id)
                    ).scalar_one()
                    for i, lv in enumerate(test["levels"]):
                        conn.execute(
                            levels.insert().values(
                                test_id=test_id,
                                run_id=run_id,
                                position=i,
                                level_key=canonical_key(level_key(lv, test["workload"])),
                                label=lv["label"],
                                tok_s=lv["tok_s"],
                                verdict=lv["verdict"],
                                baseline_tok_s=lv.get("baseline_tok_s"),
                                change_pct=lv.get("change_pct"),
                                trials_tok_s=lv["trials_tok_s"],
                                data=lv,
                            )
                        )
    finally:
        engine.dispose()


def test_an_older_database_opens_with_its_capacities_filled_in(history_url: str) -> None:
    from pytest_kimi.history.schema import HEAD

    _old_database(history_url)
    with open_history(history_url) as store:
        assert store.schema_revision() == HEAD
        series = store.series()
        details = store.run_details(2)
    assert [(s.level, s.kind) for s in series] == [(LABEL, CAPACITY), ("C=4", "throughput")]
    cap, tp = series
    assert [p.verdict for p in cap.points] == ["pass", "regression"]
    assert [p.capacity.estimate for p in cap.points if p.capacity] == [40.4, 30.6]
    assert [(p.capacity.low, p.capacity.high) for p in cap.points if p.capacity] == [
        (40.0, 41.0),
        (30.0, 31.0),
    ]
    assert cap.points[1].ci90 == (-30.0, -18.0) and cap.points[1].change_pct == -24.4
    assert cap.key == CAPACITY_KEY
    assert [p.ci90 for p in tp.points] == [(-3.5, 1.6), (-3.5, 1.6)]
    assert len(details["tests"][0]["levels"]) == 5  # the probes, kept as detail
    # and the upgraded history takes new runs of both kinds
    record(history_url, [report(capacity_test(29.5), throughput_test(190.0, None))])
    with open_history(history_url) as store:
        cap, tp = store.series()
    assert len(cap.points) == 3 and len(tp.points) == 3
    newest = max(tp.points, key=lambda p: p.run.id)
    assert newest.ci90 is None and newest.verdict == "no-baseline"


# ----------------------------------------------------------------- real sessions

SUITE = """
from pytest_kimi import capacity

@capacity(max_e2e_s=6.6, concurrency=(4, 128), max_tokens=128, trials=2)
def test_capacity(capacity_result):
    assert capacity_result["metric"] == "concurrency"
"""
SIM = "--endpoint=sim:speed=20"


def test_real_capacity_runs_are_one_series_and_one_chart(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Two sessions against the simulator: the first records the baseline capacity, the
    second runs a server 1.3 times slower (the capacity gate's ``regression``).  The history
    holds one series of two capacities as the reports had them, none of the probed loads, and
    the dashboard charts it with the gate's verdicts and the change against the baseline."""
    pytester.makepyfile(test_cap=SUITE)
    reports = []
    for n, extra in enumerate((("--update-baselines",), ()), start=1):
        sim = SIM if n == 1 else SIM + ",slowdown=1.3"
        result = pytester.runpytest("-p", "no:cacheprovider", sim, f"--perf-json=r{n}.json", *extra)
        assert f"history: run {n} -> sqlite:///.kimi/history.db" in result.outlines, (
            result.outlines[-30:]
        )
        reports.append(json.loads((pytester.path / f"r{n}.json").read_text())["tests"][0])
    first, second = (r["capacity"] for r in reports)
    assert first["verdict"] == "no-baseline" and second["verdict"] == "regression", second
    assert second["value"] < first["value"]
    with open_history(f"sqlite:///{pytester.path}/.kimi/history.db") as store:
        series = store.series()
        details = {r.id: store.run_details(r.id) for r in store.runs()}
    (cap,) = series  # not one series per load the searches probed
    assert (cap.test, cap.level, cap.kind) == ("test_cap.py::test_capacity", LABEL, CAPACITY)
    for point, figures in zip(cap.points, (first, second)):
        assert point.verdict == figures["verdict"] and point.capacity is not None
        assert (point.capacity.value, point.capacity.low, point.capacity.high) == (
            figures["value"],
            figures["low"],
            figures["high"],
        )
        assert point.capacity.estimate == figures["estimate"]
    assert cap.points[1].change_pct == second["change_pct"]
    assert cap.points[1].ci90 == tuple(second["change_ci90"])
    probes = details[2]["tests"][0]["levels"]
    assert {lv["verdict"] for lv in probes} == {"held", "broke"}

    index = write_dashboard(series, [], tmp_path / "site", details)
    page = index.read_text()
    assert page.count("<section ") == 1 and "capacity over runs: test_cap.py::test_capacity" in page
    assert page.count('class="brackets"') == 1
    rows = page[page.index("<details><summary>the numbers") :]
    text = " ".join(re.sub(r"<[^>]+>", "", rows).split())
    assert "no-baseline" in text  # the first run had no baseline
    lo, hi = second["change_ci90"]
    assert f"{second['change_pct']:+.1f}% ({lo:+.1f}% .. {hi:+.1f}%)" in text
    assert "m-failing" in rows.split("#2</a>")[1]  # the regression drawn failing
    run2 = (tmp_path / "site" / "runs" / "2.html").read_text()
    assert "Capacity" in run2  # the capacity, and the probes as detail, drawn as probes:
    broke = sum(1 for lv in probes if lv["verdict"] == "broke")
    assert run2.count('class="verdict m-broke"') == broke > 0  # not pass's marker
    assert run2.count('class="verdict m-held"') == len(probes) - broke
