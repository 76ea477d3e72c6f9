"""Every run in a database: ``--perf-history``, the store, its migrations, SQLite and PostgreSQL.

Real sessions (``pytester``, against the simulator) write the runs; the store
reads them back.  PostgreSQL is a real server (``tests/support/pg_server.py``) started once for the
module; without Debian's ``postgresql`` binaries those tests skip, or fail under
``KIMI_REQUIRE_POSTGRES=1`` (CI).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from support.pg_server import PostgresServer, require_postgres
from pytest_kimi.history.rows import RunMeta, build_rows, ci_run_url, series_test
from pytest_kimi.history.store import HistoryError, open_history, resolve_history_url
from pytest_kimi.history.urls import DEFAULT_URL, check_url, display_url, url_secrets
from support.timing import SESSION_S

PERF_TEST = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], max_tokens=64, trials=2)
def test_sweep():
    pass
"""
PERF_ONE = PERF_TEST.replace("[1, 4]", "1")
"""For the runs whose history write, not its levels, is the point."""
SIM = "--endpoint=sim:speed=10,stream_interval=8"
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
T0 = datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def _no_history_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's or CI's own variables must not choose these sessions' history."""
    for name in (
        "KIMI_PERF_HISTORY",
        "GITHUB_SERVER_URL",
        "GITHUB_REPOSITORY",
        "GITHUB_RUN_ID",
        "GITHUB_HEAD_REF",
        "GITHUB_REF_NAME",
        "GITHUB_STEP_SUMMARY",
        "CI_PIPELINE_URL",
    ):
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


# ---------------------------------------------------------------------------- made-up reports


def level(label: str, c: int, trials: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "label": label,
        "concurrency": c,
        "rate": None,
        "max_tokens": 64,
        "input_tokens": None,
        "prompts": "builtin:diverse",
        "protocol": "stationary",
        "tok_s": sorted(trials)[len(trials) // 2] if trials else None,
        "trials_tok_s": trials,
        "verdict": "no-baseline",
        **extra,
    }


def report(*tests: dict[str, Any], server_info: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema": 1,
        "plugin_version": "0.2.0",
        "endpoint": {
            "url": "http://127.0.0.1:1",
            "model": "kimi",
            "server_info": server_info or {},
        },
        "tests": list(tests),
    }


def perf_dict(nodeid: str, *levels: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "nodeid": nodeid,
        "outcome": "passed",
        "workload": {"api": "chat", "ignore_eos": True},
        "levels": list(levels),
        "baseline_profile": "sim",
        **extra,
    }


# ---------------------------------------------------------------------------- URLs and options


def test_urls_resolve_against_the_base_and_off_is_none(tmp_path: Path) -> None:
    assert resolve_history_url(None, tmp_path) == f"sqlite:///{tmp_path}/.kimi/history.db"
    assert resolve_history_url("off", tmp_path) is None
    assert resolve_history_url("sqlite:///a/b.db", tmp_path) == f"sqlite:///{tmp_path}/a/b.db"
    assert resolve_history_url("sqlite:////abs/b.db", tmp_path) == "sqlite:////abs/b.db"
    pg = "postgresql://kimi:pw@127.0.0.1:5432/history"
    assert resolve_history_url(pg, tmp_path) == pg
    shown = display_url(f"sqlite:///{tmp_path}/.kimi/history.db", tmp_path)
    assert shown == DEFAULT_URL
    assert display_url(pg) == "postgresql://kimi:***@127.0.0.1:5432/history"
    assert url_secrets("postgresql://kimi:p%40ss@h/db") == ("p%40ss", "p@ss")
    with pytest.raises(HistoryError, match="sqlite:///history.db"):
        resolve_history_url("history.db", tmp_path)


@pytest.mark.parametrize(
    "bad, says",
    [
        ("history.db", "write sqlite:///history.db"),
        ("mysql://u@h/db", "unsupported database 'mysql'"),
        ("sqlite://host/x.db", "three slashes"),
        ("postgresql://kimi:hunter22@h:port/db", "port of postgresql://kimi:***@h:port/db"),
    ],
)
def test_malformed_urls_say_what_to_write(bad: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        check_url(bad)
    assert says in str(info.value) and "hunter22" not in str(info.value)


def test_option_sources_and_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_kimi.plugin import KIMI_OPTIONS

    pytester.makeini(f"{INI}kimi_perf_history = sqlite:///ini.db\n")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)  # relative paths still resolve against the rootdir
    opts = pytester.parseconfigure().stash[KIMI_OPTIONS]
    assert opts.perf_history == f"sqlite:///{pytester.path}/ini.db"
    assert opts.source("perf_history") == "ini kimi_perf_history"
    monkeypatch.setenv("KIMI_PERF_HISTORY", "off")
    opts = pytester.parseconfigure().stash[KIMI_OPTIONS]
    assert opts.perf_history is None and opts.source("perf_history") == "env KIMI_PERF_HISTORY"
    opts = pytester.parseconfigure("--perf-history=sqlite:///cli.db").stash[KIMI_OPTIONS]
    assert opts.perf_history == f"sqlite:///{pytester.path}/cli.db"
    monkeypatch.delenv("KIMI_PERF_HISTORY")
    pytester.makeini(INI)
    opts = pytester.parseconfigure().stash[KIMI_OPTIONS]
    assert opts.perf_history == f"sqlite:///{pytester.path}/.kimi/history.db"
    assert opts.source("perf_history") == "default"


def test_malformed_option_is_a_usage_error_naming_its_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    monkeypatch.setenv("KIMI_PERF_HISTORY", "postgresql://kimi:hunter22@db:nope/history")
    result = pytester.runpytest()  # refused at configure: nothing started to keep apart
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "env KIMI_PERF_HISTORY: bad value" in err and "is not a number" in err
    assert "hunter22" not in err + result.stdout.str()


# ---------------------------------------------------------------------------- rows of a run


def test_rows_strip_deployment_and_session_ids_and_keep_the_test_own() -> None:
    assert series_test("t.py::test_x[ep8-tuned]", ["ep8-tuned"]) == "t.py::test_x"
    assert series_test("t.py::test_x[64-ep8-s2]", ["ep8", "s2"]) == "t.py::test_x[64]"
    assert series_test("t.py::test_x[s2-64]", ["s2"]) == "t.py::test_x[64]"
    assert series_test("t.py::test_x[ep80]", ["ep8"]) == "t.py::test_x[ep80]"
    rows = build_rows(
        report(
            perf_dict("t.py::test_x[a-s1]", level("C=1", 1, [1.0]), profile="a", perf_session=0),
            perf_dict("t.py::test_x[b-s1]", level("C=1", 1, [2.0]), profile="b", perf_session=0),
            perf_dict("t.py::test_x[a-s2]", level("C=1", 1, [3.0]), profile="a", perf_session=1),
        ),
        RunMeta(time=T0),
    )
    assert [(t.test, t.deployment, t.session) for t in rows.tests] == [
        ("t.py::test_x", "a", 0),
        ("t.py::test_x", "b", 0),
        ("t.py::test_x", "a", 1),
    ]


def test_rows_are_scrubbed_and_json_safe() -> None:
    secret = "sk-abcdefghijklmnopqrstuvwx"
    rows = build_rows(
        report(
            perf_dict(
                "t.py::test_x",
                level("C=1", 1, [1.0, math.nan], change_pct=math.inf),
                error=f"--api-key {secret}",
            ),
            server_info={"api_key": secret, "tp_size": 8},
        ),
        RunMeta(
            time=T0.replace(tzinfo=None),
            ci_url="https://ci:hunter22-token@ci.example/run/1",
            provenance={"model": "kimi", "server_info.hf_token": "hf-secret-value"},
        ),
    )
    assert secret not in json.dumps([rows.endpoint, [t.data for t in rows.tests]])
    assert "hunter22-token" not in str(rows.meta.ci_url)
    assert rows.meta.provenance["server_info.hf_token"] == "<redacted>"
    (lv,) = rows.tests[0].levels
    assert lv.trials_tok_s == [1.0] and lv.change_pct is None and lv.data["change_pct"] is None
    assert rows.meta.time == T0  # a naive time is UTC
    assert lv.key == {
        "api": "chat",
        "ignore_eos": True,
        "concurrency": 1,
        "max_tokens": 64,
        "prompts": "builtin:diverse",
        "protocol": "stationary",
    }


def test_run_meta_from_github_actions_and_git(tmp_path: Path) -> None:
    env = {
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "org/suite",
        "GITHUB_RUN_ID": "42",
        "GITHUB_REF_NAME": "main",
    }
    assert ci_run_url(env) == "https://github.com/org/suite/actions/runs/42"
    assert ci_run_url({}) is None
    meta = RunMeta.collect(
        report(server_info={"tp_size": 8, "admin_api_key": "s3cr3t-admin", "sim": {"b": 1}}),
        suite_dir=tmp_path,  # not a checkout: no commit, branch from CI
        deployment="sim",
        environ=env,
    )
    assert meta.commit is None and meta.branch == "main" and meta.deployment == "sim"
    assert meta.ci_url == "https://github.com/org/suite/actions/runs/42"
    assert meta.provenance["server_info.tp_size"] == 8
    assert meta.provenance["server_info.sim.b"] == 1
    assert meta.provenance["model"] == "kimi" and meta.provenance["plugin_version"]
    assert "server_info.admin_api_key" not in meta.provenance
    assert "s3cr3t-admin" not in repr(meta.provenance)
    assert meta.time.tzinfo is not None
    git = ["git", "-C", str(tmp_path), "-c", "user.name=k", "-c", "user.email=k@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "perf"], check=True, timeout=60)
    (tmp_path / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "-m", "m"], check=True, timeout=60)
    meta = RunMeta.collect(report(), suite_dir=tmp_path, deployment="sim", environ=env)
    assert meta.branch == "perf" and meta.commit and len(meta.commit) == 12


# ---------------------------------------------------------------------------- the store


def test_store_round_trip(history_url: str) -> None:
    with open_history(history_url) as history:
        assert history.runs() == [] and history.series() == []
        ids = []
        for i, trials in enumerate(([100.0, 102.0], [90.0, 91.0, 89.0])):
            run = report(
                perf_dict(
                    "t.py::test_x",
                    level(
                        "C=1", 1, trials, baseline_tok_s=101.0, change_pct=-1.0, tolerance_pct=5.0
                    ),
                    level("C=4", 4, [t * 3 for t in trials]),
                ),
                server_info={"tp_size": 8 + i},
            )
            meta = RunMeta(
                time=T0 + timedelta(hours=i),
                commit=f"c{i}",
                branch="main",
                deployment="sim",
                provenance={"server_info.tp_size": 8 + i},
            )
            ids.append(history.record_run(run, meta))
        assert ids[1] > ids[0]
        runs = history.runs()
        assert [(r.id, r.commit, r.time) for r in runs] == [
            (ids[0], "c0", T0),
            (ids[1], "c1", T0 + timedelta(hours=1)),
        ]
        assert runs[1].provenance == {"server_info.tp_size": 9}
        c1, c4 = history.series()
        assert (c1.test, c1.level, c1.deployment) == ("t.py::test_x", "C=1", "sim")
        assert c1.key["concurrency"] == 1 and c4.key["concurrency"] == 4
        assert [p.trials for p in c1.points] == [(100.0, 102.0), (90.0, 91.0, 89.0)]
        first = c1.points[0]
        assert (first.tok_s, first.verdict, first.baseline_tok_s) == (102.0, "no-baseline", 101.0)
        assert (first.change_pct, first.tolerance_pct, first.session) == (-1.0, 5.0, None)
        assert first.run.id == ids[0] and first.run.time == T0
        assert c4.points[1].trials == (270.0, 273.0, 267.0)
        assert history.series("t.py::other") == []
        assert history.series("t.py::test_x") == [c1, c4]
        details = history.run_details(ids[1])
        assert details["commit"] == "c1" and details["endpoint"]["server_info"] == {"tp_size": 9}
        (test,) = details["tests"]
        assert test["nodeid"] == "t.py::test_x" and test["outcome"] == "passed"
        assert [lv["label"] for lv in test["levels"]] == ["C=1", "C=4"]
        assert test["levels"][0]["key"]["concurrency"] == 1
        json.dumps(details)  # JSON-ready
        with pytest.raises(KeyError):
            history.run_details(ids[1] + 100)


def test_series_carry_each_deployments_provenance_and_sessions(tmp_path: Path) -> None:
    run = report(
        perf_dict(
            "t.py::test_x",
            level("C=1", 1, [1.0]),
            profile="a",
            baseline_profile="a",
            perf_session=0,
        ),
        perf_dict(
            "t.py::test_x",
            level("C=1", 1, [2.0]),
            profile="b",
            baseline_profile="b",
            perf_session=0,
        ),
        perf_dict(
            "t.py::test_x",
            level("C=1", 1, [3.0]),
            profile="b",
            baseline_profile="b",
            perf_session=1,
        ),
        perf_dict(
            "t.py::test_x",
            level("C=1", 1, [4.0]),
            profile="a",
            baseline_profile="a",
            perf_session=1,
        ),
    )
    meta = RunMeta(
        time=T0,
        deployment="a,b",
        provenance={"x": "a"},
        deployments={"a": {"x": "a"}, "b": {"x": "b"}},
    )
    with open_history(f"sqlite:///{tmp_path}/h.db") as history:
        history.record_run(run, meta)
        a, b = history.series()
    assert (a.deployment, b.deployment) == ("a", "b")
    assert [(p.session, p.trials) for p in a.points] == [(0, (1.0,)), (1, (4.0,))]
    assert [(p.session, p.trials) for p in b.points] == [(0, (2.0,)), (1, (3.0,))]
    assert b.points[0].run.provenance == {"x": "b"} and b.points[0].run.deployment == "b"
    assert a.points[0].run.provenance == {"x": "a"}


def test_migrations_end_at_the_schema_and_reopening_is_idempotent(history_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import inspect

    from pytest_kimi.history import schema
    from pytest_kimi.history.store import alembic_config

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head == schema.HEAD, "schema.HEAD names the newest migration"
    for _ in range(2):
        with open_history(history_url) as history:
            assert history.schema_revision() == head
            with history.engine.connect() as conn:
                context = MigrationContext.configure(
                    conn, opts={"version_table": schema.VERSION_TABLE, "compare_type": True}
                )
                assert compare_metadata(context, schema.metadata) == []
                tables = set(inspect(conn).get_table_names())
    assert {"kimi_runs", "kimi_tests", "kimi_levels", "kimi_capacities"} <= tables
    assert schema.VERSION_TABLE in tables


def test_a_shared_database_keeps_other_applications_tables(postgres: PostgresServer) -> None:
    """A team's PostgreSQL may hold other tables, their own Alembic's version too."""
    import psycopg

    name = postgres.create_database()
    with psycopg.connect(postgres.dsn(name), autocommit=True) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('theirs')")
    from pytest_kimi.history.schema import HEAD

    with open_history(postgres.url(name)) as history:
        assert history.schema_revision() == HEAD
    with psycopg.connect(postgres.dsn(name)) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("theirs",)]


def test_a_newer_schema_is_refused(history_url: str) -> None:
    from sqlalchemy import text

    from pytest_kimi.history.schema import VERSION_TABLE

    open_history(history_url).close()
    history = open_history(history_url)
    with history.engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    history.close()
    with pytest.raises(
        HistoryError, match="newer than this pytest-kimi knows.*upgrade pytest-kimi"
    ):
        open_history(history_url)


def test_concurrent_first_opens_create_the_schema_once(history_url: str) -> None:
    errors: list[BaseException] = []
    ids: list[int] = []

    def one() -> None:
        try:
            with open_history(history_url) as history:
                ids.append(history.record_run(report(), RunMeta(time=T0)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with open_history(history_url) as history:
        assert sorted(r.id for r in history.runs()) == sorted(ids) and len(set(ids)) == 4


def test_unreachable_and_malformed_say_so_without_the_password(tmp_path: Path) -> None:
    with pytest.raises(HistoryError) as info:
        open_history("postgresql://kimi:hunter22@127.0.0.1:1/history")
    message = str(info.value)
    assert message.startswith("history postgresql://kimi:***@127.0.0.1:1/history: ")
    assert "hunter22" not in message and "\n" not in message
    with pytest.raises(HistoryError, match="unsupported database"):
        open_history("mysql://u@h/db")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HistoryError):
        open_history(f"sqlite:///{blocker}/h.db")  # its directory cannot be made


def test_a_file_that_is_no_database_is_named_with_how_to_move_it_aside(tmp_path: Path) -> None:
    """``file is not a database`` said what SQLite found, not what to do; the file (maybe
    someone's data under the wrong name) is left exactly as it was."""
    garbage = tmp_path / "my history.db"
    garbage.write_bytes(b"\x00garbage, not SQLite\xff" * 400)
    with pytest.raises(HistoryError) as info:
        open_history(f"sqlite:///{garbage}")
    message = str(info.value)
    assert f"{garbage} is not a usable SQLite database (file is not a database)" in message
    assert f"move it aside (mv '{garbage}' '{garbage}.corrupt')" in message
    assert "--perf-history" in message and "\n" not in message
    assert garbage.read_bytes() == b"\x00garbage, not SQLite\xff" * 400
    directory = tmp_path / "a-directory.db"
    directory.mkdir()
    with pytest.raises(HistoryError, match="a-directory.db is not a file"):
        open_history(f"sqlite:///{directory}")


FULL_DISK = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # two SQLite pages: the schema needs more
from pytest_kimi.history.store import HistoryError, open_history
try:
    open_history(sys.argv[1]).close()
except HistoryError as exc:
    print(exc)
else:
    print("opened")
"""


def test_a_new_history_that_cannot_be_made_whole_leaves_no_file(tmp_path: Path) -> None:
    """The disk fills while the schema is written: SQLite had already made the file, and the
    next run took the empty or half-made database for a history (an empty one is a valid
    SQLite file).  The schema is built under a temporary name now, and takes the history's
    name only whole."""
    where = tmp_path / "runs"
    url = f"sqlite:///{where / 'h.db'}"
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, url], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.startswith(f"history {url}: "), done.stdout + done.stderr
    assert list(where.iterdir()) == [], "no database, no temporary file, no journal"
    with open_history(url) as history:  # with room again, the history is made as usual
        assert history.runs() == []
    assert [p.name for p in where.iterdir()] == ["h.db"]


# ---------------------------------------------------------------------------- real runs


def _stored(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("history: ")]


def _finished(result: pytest.RunResult, tests: int, plain: int = 0) -> None:
    """The session ran its ``tests`` perf tests (and ``plain`` others) to a verdict, and its exit
    code is theirs: the history never changes it.  A perf test may fail where a busy machine
    stalled the load client (its level is ``invalid``); what it stored is checked either way."""
    outcomes = result.parseoutcomes()
    passed, failed = outcomes.get("passed", 0), outcomes.get("failed", 0)
    assert (passed + failed, outcomes.get("errors", 0)) == (tests + plain, 0), result.outlines[-40:]
    expected = pytest.ExitCode.OK if failed == 0 else pytest.ExitCode.TESTS_FAILED
    assert result.ret == expected, result.outlines[-40:]


def _as_reported(series: list[Any], reports: dict[int, dict[str, Any]]) -> None:
    """Each stored point holds what its run's ``--perf-json`` said of that level."""
    for s in series:
        for point in s.points:
            (test,) = reports[point.run.id]["tests"]
            (lv,) = [lv for lv in test["levels"] if lv["label"] == s.level]
            assert point.trials == tuple(lv["trials_tok_s"])
            assert (point.tok_s, point.verdict) == (lv["tok_s"], lv["verdict"])
    assert any(len(p.trials) == 2 for s in series for p in s.points)


def test_runs_append_to_the_default_sqlite_history(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_perf=PERF_TEST)
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.example")
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/suite")
    monkeypatch.setenv("GITHUB_RUN_ID", "7")
    reports = {}
    for n in (1, 2):
        result = pytester.runpytest("-p", "no:cacheprovider", SIM, f"--perf-json=r{n}.json")
        _finished(result, 1)
        assert _stored(result) == [f"history: run {n} -> sqlite:///.kimi/history.db"]
        reports[n] = json.loads((pytester.path / f"r{n}.json").read_text())
    with open_history(f"sqlite:///{pytester.path}/.kimi/history.db") as history:
        runs = history.runs()
        series = history.series()
    assert [r.id for r in runs] == [1, 2] and runs[0].time < runs[1].time
    assert runs[0].ci_url == "https://github.example/org/suite/actions/runs/7"
    assert runs[0].deployment == "sim" and runs[0].provenance["model"]
    assert [(s.test, s.level, s.deployment) for s in series] == [
        ("test_perf.py::test_sweep", "C=1", "sim"),
        ("test_perf.py::test_sweep", "C=4", "sim"),
    ]
    for s in series:
        assert [p.run.id for p in s.points] == [1, 2]
        assert s.key["max_tokens"] == 64 and s.key["protocol"] == "stationary"
    _as_reported(series, reports)


def test_runs_append_to_postgresql_and_the_password_never_shows(
    pytester: pytest.Pytester, postgres: PostgresServer
) -> None:
    pytester.makepyfile(test_perf=PERF_TEST)
    url = postgres.url(postgres.create_database())
    reports = {}
    for n in (1, 2):
        result = pytester.runpytest(
            "-p",
            "no:cacheprovider",
            SIM,
            f"--perf-history={url}",
            f"--perf-json=r{n}.json",
            "-v",
        )
        _finished(result, 1)
        reports[n] = json.loads((pytester.path / f"r{n}.json").read_text())
        (line,) = _stored(result)
        assert line.startswith(f"history: run {n} -> postgresql://")
        assert line.endswith(f"@127.0.0.1:{postgres.port}/{url.rsplit('/', 1)[1]}")
        assert postgres.password not in result.stdout.str() + result.stderr.str()
    with open_history(url) as history:
        assert [r.id for r in history.runs()] == [1, 2]
        series = history.series("test_perf.py::test_sweep")
        assert [(s.level, len(s.points)) for s in series] == [("C=1", 2), ("C=4", 2)]
        _as_reported(series, reports)
        details = history.run_details(1)
    assert postgres.password not in json.dumps(details)


def test_a_database_that_is_down_costs_a_line_not_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=PERF_ONE)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        SIM,
        "--perf-history=postgresql://kimi:hunter22-secret@127.0.0.1:1/history",
    )
    _finished(result, 1)  # with the exit code of its verdicts
    (line,) = _stored(result)
    assert (
        line.startswith("history: run not stored in postgresql://") and "(--perf-history)" in line
    )
    assert "hunter22-secret" not in result.stdout.str() + result.stderr.str()


def test_under_xdist_the_controller_writes_once(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_perf="""
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=64, trials=2)
def test_a():
    pass

@throughput(concurrency=4, max_tokens=64, trials=2)
def test_b():
    pass
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", SIM, timeout=SESSION_S
    )
    _finished(result, 2)
    assert _stored(result) == ["history: run 1 -> sqlite:///.kimi/history.db"]
    with open_history(f"sqlite:///{pytester.path}/.kimi/history.db") as history:
        (run,) = history.runs()
        tests = {t["test"] for t in history.run_details(run.id)["tests"]}
    assert tests == {"test_perf.py::test_a", "test_perf.py::test_b"}


def test_off_and_a_run_that_measured_nothing_write_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=PERF_ONE, test_plain="def test_plain(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", SIM, "--perf-history=off")
    _finished(result, 1, plain=1)
    assert _stored(result) == []
    assert not (pytester.path / ".kimi" / "history.db").exists()
    result = pytester.runpytest("-p", "no:cacheprovider", "test_plain.py", SIM)
    result.assert_outcomes(passed=1)  # no perf test ran: nothing measured
    assert _stored(result) == [] and not (pytester.path / ".kimi" / "history.db").exists()
