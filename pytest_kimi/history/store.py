"""The history database: open (and migrate) it, write a run, read runs and series back.

One module above 700 lines on purpose: the one class every reader and writer of the
history goes through, its transactions and locking in one place (a write split over modules
would split the transaction rules that keep two runs finishing at once apart).

One class, :class:`HistoryStore`, over SQLAlchemy Core; the schema is versioned with Alembic
(``migrations/``), upgraded to head whenever a history is opened, so a database written by an
older plugin keeps working and a team's shared PostgreSQL is upgraded by the first newer run.
A database written by a *newer* plugin (a revision this one does not know) is refused, never
written: its schema may no longer be what this code writes.

Backends: SQLite (the default, a file under ``.kimi/``) and PostgreSQL through psycopg 3
(``postgresql://`` is opened with the ``postgresql+psycopg`` driver).  Concurrency: on SQLite
every write takes the database's write lock at its start (``BEGIN IMMEDIATE``), on PostgreSQL
the migration holds an advisory lock, so two runs finishing at once, or opening a new database
at once, do not trip over each other.

Every failure is a :class:`HistoryError` whose one-line message names the URL with its
password hidden; the plugin turns it into a warning, never into a failed run.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import threading
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from pytest_kimi.history import schema
from pytest_kimi.history.model import CAPACITY, CapacityFigures, LevelSeries, Point, RunInfo
from pytest_kimi.history.rows import RunMeta, RunRows, build_rows, canonical_key
from pytest_kimi.history.urls import (
    HistoryError,
    check_url,
    display_url,
    resolve_history_url,
    sqlite_path,
    url_secrets,
    with_sqlite_path,
)
from pytest_kimi.scrub import scrub_text
from pytest_kimi.wire import Report

__all__ = [
    "HistoryError",
    "HistoryStore",
    "RunMeta",
    "alembic_config",
    "create_history_engine",
    "open_history",
    "resolve_history_url",
]

SQLITE_BUSY_TIMEOUT_S = 30
"""How long a SQLite write waits for another process's write to finish."""
POSTGRES_CONNECT_TIMEOUT_S = 10
"""How long a run waits for an unreachable PostgreSQL before it warns and moves on."""
MIGRATION_LOCK = 0x6B696D69
"""The PostgreSQL advisory lock key ("kimi") held while the schema is checked and upgraded."""
SCRIPT_LOCATION = "pytest_kimi.history:migrations"
SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")
"""The files SQLite keeps beside a database while it writes: removed with a discarded one."""
SQLITE_CORRUPT = ("file is not a database", "database disk image is malformed")
"""SQLite's words for a file that is no (longer a) database: its message says to move it aside."""
_CREATING = threading.Lock()
"""Held while this process makes a new SQLite history (see :func:`_create_sqlite`)."""
WRITE = "kimi_write"
"""Execution option: this connection's transactions write (SQLite: BEGIN IMMEDIATE)."""


def open_history(url: str) -> HistoryStore:
    """The history at ``url``, its schema created or upgraded to this plugin's head.

    ``url`` is opened as given (a relative SQLite path from the working directory; resolve it
    first with :func:`resolve_history_url`).  A SQLite file's directory is created, and a new
    SQLite file is built whole before it takes its name (:func:`_create_sqlite`).  Raises
    :class:`HistoryError` for a malformed URL, an unreachable database, a missing driver, a
    file that is no SQLite database (saying to move it aside) or a schema newer than this
    plugin.
    """
    path = sqlite_path(url)
    if path:
        _create_sqlite(url, Path(path))
    return _open(url)


def _open(url: str, shown: str | None = None) -> HistoryStore:
    engine = create_history_engine(url)
    store = HistoryStore(engine, url)
    if shown is not None:
        store.shown = shown
    try:
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store


def _create_sqlite(url: str, path: Path) -> None:
    """Make a new SQLite history at ``path``, whole or not at all; nothing when it exists.

    SQLite creates its file on the first connection, so a migration that failed (a full disk,
    a quota, an interrupt) used to leave an empty or half-made database behind, which the next
    run then took for a history.  Here the schema is built in a file beside ``path`` under a
    temporary name and linked to ``path`` once complete; the temporary file goes whatever
    happens.  Two runs creating the same history at once: the first link wins, the other's
    file is dropped and both open the winner's.  Within one process the creation is
    serialised (:data:`_CREATING`): Alembic's migration context is a module global, not safe
    to run in two threads at once.
    """
    with _CREATING:
        if _exists(url, path):
            return
        _build_sqlite(url, path)


def _exists(url: str, path: Path) -> bool:
    """Whether a history file is at ``path``; raises for something that is no file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise HistoryError(f"history {display_url(url)}: {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise HistoryError(
            f"history {display_url(url)}: {path} is not a file (a directory or device): "
            "give --perf-history the path of a SQLite file"
        )
    return True


def _build_sqlite(url: str, path: Path) -> None:
    """The schema in a temporary file beside ``path``, then linked to ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.new")
    tmp_url = with_sqlite_path(url, tmp.as_posix())
    try:
        try:
            _open(tmp_url, shown=display_url(url)).close()
        except HistoryError as exc:  # said of the history, not of its temporary name
            raise HistoryError(str(exc).replace(display_url(tmp_url), display_url(url))) from None
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another run made it meanwhile: open theirs
        except OSError:  # a filesystem without hard links
            if not path.exists():
                os.replace(tmp, path)
    except OSError as exc:
        raise HistoryError(f"history {display_url(url)}: {path}: {exc.strerror or exc}") from None
    finally:
        for leftover in (tmp, *(tmp.with_name(tmp.name + end) for end in SQLITE_SIDE_FILES)):
            try:
                leftover.unlink()
            except OSError:  # gone, or never made; one that stays is never taken for a history
                pass


def create_history_engine(url: str) -> Engine:
    """An engine for ``url``: psycopg 3 for PostgreSQL, transactional SQLite (see below).

    SQLite's Python driver starts transactions only before data changes, so a schema upgrade
    would be committed statement by statement and two writers could deadlock upgrading their
    locks; here SQLAlchemy emits BEGIN itself, ``BEGIN IMMEDIATE`` for connections that write
    (the SQLAlchemy documentation's recipe), and foreign keys are enforced.
    """
    shown = display_url(url)
    try:
        check_url(url)
        parsed = make_url(url)
    except (ValueError, ArgumentError) as exc:
        raise HistoryError(f"history {shown}: {exc}") from None
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
        kwargs["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    else:
        path = sqlite_path(url)
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HistoryError(f"history {shown}: {exc}") from None
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    try:
        engine = create_engine(parsed, **kwargs)
    except ModuleNotFoundError as exc:
        raise HistoryError(
            f"history {shown}: PostgreSQL needs psycopg 3 ({exc.name} is not installed): "
            "pip install 'pytest-kimi[postgres]'"
        ) from None
    except (SQLAlchemyError, ValueError) as exc:
        raise HistoryError(f"history {shown}: {_one_line(exc, url)}") from None
    if engine.dialect.name == "sqlite":
        _transactional_sqlite(engine)
    return engine


def _transactional_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN, below
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        writes = conn.get_execution_options().get(WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Any:
    """Alembic's configuration for the history's migrations (the scripts ship in the
    package); ``connection`` is used as it is, else ``url`` is opened by ``env.py``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


class HistoryStore:
    """An open history: write runs, read runs and series back.  Close it (or use ``with``)."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        self.shown = display_url(url)
        """The URL as it may be printed: password hidden."""

    # ---------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _fail(self, exc: BaseException) -> HistoryError:
        why = _one_line(exc, self.url)
        path = sqlite_path(self.url)
        if path and any(words in why.lower() for words in SQLITE_CORRUPT):
            # no retry can fix it, and the run must not overwrite what may be someone's data
            aside = shlex.quote(f"{path}.corrupt")
            why = (
                f"{path} is not a usable SQLite database ({why}); move it aside "
                f"(mv {shlex.quote(path)} {aside}) and the next run starts a new history "
                "there, or point --perf-history at another file"
            )
        return HistoryError(f"history {self.shown}: {why}")

    # ---------------------------------------------------------------------------- schema

    def migrate(self) -> None:
        """Bring the schema to this plugin's head revision (creating it in an empty database).

        The version is read first without a write lock and without Alembic (a history at
        head, the common case, costs one query); an upgrade then runs in one transaction under
        the write lock (SQLite) or an advisory lock (PostgreSQL), re-reading the version inside
        it, so two processes opening a new database at once create it once.
        """
        try:
            with self.engine.connect() as conn:
                if self._current(conn) == (schema.HEAD,):
                    return
            from alembic import command
            from alembic.script import ScriptDirectory

            script = ScriptDirectory.from_config(alembic_config())
            known = {s.revision for s in script.walk_revisions()}
            with self.engine.connect() as conn:
                conn = conn.execution_options(**{WRITE: True})
                with conn.begin():
                    if conn.dialect.name == "postgresql":
                        conn.execute(
                            text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
                        )
                    current = self._current(conn)
                    newer = [rev for rev in current if rev not in known]
                    if newer:
                        raise HistoryError(
                            f"history {self.shown}: the database's schema is at revision "
                            f"{', '.join(newer)}, newer than this pytest-kimi knows (head "
                            f"{schema.HEAD}): upgrade pytest-kimi to write to it"
                        )
                    if current != (schema.HEAD,):
                        command.upgrade(alembic_config(connection=conn), "head")
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def schema_revision(self) -> str | None:
        """The database's Alembic revision (None: no schema yet)."""
        try:
            with self.engine.connect() as conn:
                current = self._current(conn)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return current[0] if current else None

    @staticmethod
    def _current(conn: Connection) -> tuple[str, ...]:
        """The revisions in the version table (Alembic's table, read with plain SQL)."""
        if not inspect(conn).has_table(schema.VERSION_TABLE):
            return ()
        query = text(f"SELECT version_num FROM {schema.VERSION_TABLE}")
        return tuple(sorted(str(rev) for rev in conn.scalars(query)))

    # ---------------------------------------------------------------------------- writing

    def record_run(self, report: Report, meta: RunMeta) -> int:
        """Store one run (the JSON report dict, see :mod:`pytest_kimi.history.rows`) in one
        transaction; returns its id."""
        rows = build_rows(report, meta)
        try:
            with self.engine.connect() as conn:
                conn = conn.execution_options(**{WRITE: True})
                with conn.begin():
                    return self._insert(conn, rows)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    @staticmethod
    def _insert(conn: Connection, rows: RunRows) -> int:
        meta = rows.meta
        result = conn.execute(
            schema.runs.insert().values(
                time=meta.time,
                git_commit=meta.commit,
                branch=meta.branch,
                ci_url=meta.ci_url,
                deployment=meta.deployment,
                plugin_version=meta.plugin_version,
                model=rows.model,
                report_schema=rows.report_schema,
                provenance=dict(meta.provenance),
                deployments={k: dict(v) for k, v in meta.deployments.items()},
                endpoint=rows.endpoint,
            )
        )
        run_id = _inserted_id(result)
        for test in rows.tests:
            test_id = _inserted_id(
                conn.execute(
                    schema.tests.insert().values(
                        run_id=run_id,
                        position=test.position,
                        nodeid=test.nodeid,
                        test=test.test,
                        deployment=test.deployment,
                        session=test.session,
                        outcome=test.outcome,
                        data=test.data,
                    )
                )
            )
            if test.levels:
                conn.execute(
                    schema.levels.insert(),
                    [
                        {
                            "test_id": test_id,
                            "run_id": run_id,
                            "position": lv.position,
                            "level_key": canonical_key(lv.key),
                            "label": lv.label,
                            "tok_s": lv.tok_s,
                            "trials_tok_s": lv.trials_tok_s,
                            "verdict": lv.verdict,
                            "baseline_tok_s": lv.baseline_tok_s,
                            "change_pct": lv.change_pct,
                            "tolerance_pct": lv.tolerance_pct,
                            "data": lv.data,
                            "probe": lv.probe,
                            "ci90_low": lv.ci90[0],
                            "ci90_high": lv.ci90[1],
                        }
                        for lv in test.levels
                    ],
                )
            cap = test.capacity
            if cap is not None:
                conn.execute(
                    schema.capacities.insert().values(
                        test_id=test_id,
                        run_id=run_id,
                        capacity_key=canonical_key(cap.key),
                        label=cap.label,
                        metric=cap.metric,
                        value=cap.value,
                        low=cap.low,
                        high=cap.high,
                        estimate=cap.estimate,
                        estimate_ci90_low=cap.estimate_ci90[0],
                        estimate_ci90_high=cap.estimate_ci90[1],
                        log_se=cap.log_se,
                        slope=cap.slope,
                        verdict=cap.verdict,
                        baseline=cap.baseline,
                        baseline_low=cap.baseline_low,
                        baseline_high=cap.baseline_high,
                        baseline_estimate=cap.baseline_estimate,
                        change_pct=cap.change_pct,
                        change_ci90_low=cap.change_ci90[0],
                        change_ci90_high=cap.change_ci90[1],
                        tolerance_pct=cap.tolerance_pct,
                    )
                )
        return run_id

    # ---------------------------------------------------------------------------- reading

    def runs(self) -> list[RunInfo]:
        """Every run, oldest first."""
        return list(self._runs().values())

    def _runs(self) -> dict[int, RunInfo]:
        query = select(schema.runs).order_by(schema.runs.c.time, schema.runs.c.id)
        try:
            with self.engine.connect() as conn:
                return {int(row.id): _run_info(row) for row in conn.execute(query)}
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def series(self, test: str | None = None) -> list[LevelSeries]:
        """Every (test, level key, deployment) across runs, points oldest first, and every
        ``@capacity`` test's capacity as one series (``kind`` ``capacity``) beside its test's;
        only the series of ``test`` (the series' test name, parameters stripped) when given.

        A capacity search's probes are no series (they are detail of the run pages, see
        :mod:`pytest_kimi.history.schema`).  Each point's run carries the series' deployment
        and, with server profiles, that deployment's own provenance (a same-run A/B measured
        two setups in one run).
        """
        runs = self._runs()
        infos: dict[tuple[int, str | None], RunInfo] = {}

        def run_for(row: Any) -> RunInfo:
            key = (int(row.run_id), row.deployment)
            if key not in infos:
                info = runs[key[0]]
                own = (row.deployments or {}).get(row.deployment) if row.deployment else None
                infos[key] = replace(
                    info,
                    deployment=row.deployment or info.deployment,
                    provenance=dict(own) if own else info.provenance,
                )
            return infos[key]

        out = self._level_series(test, run_for) + self._capacity_series(test, run_for)
        out.sort(key=lambda pair: pair[0])
        return [series for _, series in out]

    def _level_series(
        self, test: str | None, run_for: Any
    ) -> list[tuple[tuple[Any, ...], LevelSeries]]:
        r, t, lv = schema.runs, schema.tests, schema.levels
        query = (
            select(
                lv.c.level_key,
                lv.c.label,
                lv.c.position,
                lv.c.tok_s,
                lv.c.trials_tok_s,
                lv.c.verdict,
                lv.c.baseline_tok_s,
                lv.c.tolerance_pct,
                lv.c.change_pct,
                lv.c.ci90_low,
                lv.c.ci90_high,
                t.c.test,
                t.c.deployment,
                t.c.session,
                r.c.id.label("run_id"),
                r.c.deployments,
            )
            .select_from(lv.join(t, lv.c.test_id == t.c.id).join(r, lv.c.run_id == r.c.id))
            .where(lv.c.probe.is_(False))
            .order_by(r.c.time, r.c.id, t.c.session, t.c.position, lv.c.position)
        )
        if test is not None:
            query = query.where(t.c.test == test)
        groups = self._series_rows(query, "level_key")
        out = []
        for (name, key, deployment), members in groups.items():
            points = tuple(
                Point(
                    run=run_for(row),
                    tok_s=row.tok_s,
                    trials=tuple(float(x) for x in row.trials_tok_s or ()),
                    verdict=row.verdict,
                    baseline_tok_s=row.baseline_tok_s,
                    tolerance_pct=row.tolerance_pct,
                    change_pct=row.change_pct,
                    session=row.session,
                    ci90=_interval(row.ci90_low, row.ci90_high, row.change_pct),
                )
                for row in members
            )
            last = members[-1]
            out.append(
                (
                    (name, deployment or "", 1, last.position, last.label or ""),
                    LevelSeries(
                        test=name,
                        level=last.label or key,
                        key=json.loads(key),
                        deployment=deployment,
                        points=points,
                    ),
                )
            )
        return out

    def _series_rows(self, query: Any, key: str) -> dict[tuple[str, str, str | None], list[Any]]:
        """The rows of a series query, grouped by (test, ``key`` column, deployment) in order."""
        try:
            with self.engine.connect() as conn:
                rows = list(conn.execute(query))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        groups: dict[tuple[str, str, str | None], list[Any]] = {}
        for row in rows:
            groups.setdefault((row.test, getattr(row, key), row.deployment), []).append(row)
        return groups

    def _capacity_series(
        self, test: str | None, run_for: Any
    ) -> list[tuple[tuple[Any, ...], LevelSeries]]:
        """One series per (test, capacity key, deployment), sorted before its test's levels."""
        r, t, c = schema.runs, schema.tests, schema.capacities
        query = (
            select(
                c,
                t.c.test,
                t.c.deployment,
                t.c.session,
                r.c.deployments,
            )
            .select_from(c.join(t, c.c.test_id == t.c.id).join(r, c.c.run_id == r.c.id))
            .order_by(r.c.time, r.c.id, t.c.session, t.c.position)
        )
        if test is not None:
            query = query.where(t.c.test == test)
        groups = self._series_rows(query, "capacity_key")
        out = []
        for (name, key, deployment), members in groups.items():
            points = tuple(
                Point(
                    run=run_for(row),
                    tok_s=None,
                    verdict=row.verdict,
                    tolerance_pct=row.tolerance_pct,
                    change_pct=row.change_pct,
                    session=row.session,
                    ci90=_interval(row.change_ci90_low, row.change_ci90_high, row.change_pct),
                    capacity=CapacityFigures(
                        metric=row.metric,
                        value=row.value,
                        low=row.low,
                        high=row.high,
                        estimate=row.estimate,
                        estimate_ci90=(row.estimate_ci90_low, row.estimate_ci90_high),
                        log_se=row.log_se,
                        slope=row.slope,
                        baseline=row.baseline,
                        baseline_low=row.baseline_low,
                        baseline_high=row.baseline_high,
                        baseline_estimate=row.baseline_estimate,
                    ),
                )
                for row in members
            )
            last = members[-1]
            out.append(
                (
                    (name, deployment or "", 0, 0, last.label or ""),
                    LevelSeries(
                        test=name,
                        level=last.label or "capacity",
                        key=json.loads(key),
                        deployment=deployment,
                        points=points,
                        kind=CAPACITY,
                        metric=last.metric,
                    ),
                )
            )
        return out

    def run_details(self, run_id: int) -> dict[str, Any]:
        """One run as the dashboard's run page shows it, JSON-ready: its metadata and
        provenance, and per test its report fields with its levels (each with its ``key``).

        Raises ``KeyError`` for a run id the history does not have.
        """
        try:
            with self.engine.connect() as conn:
                run = conn.execute(
                    select(schema.runs).where(schema.runs.c.id == run_id)
                ).one_or_none()
                if run is None:
                    raise KeyError(f"history {self.shown} has no run {run_id}")
                tests = list(
                    conn.execute(
                        select(schema.tests)
                        .where(schema.tests.c.run_id == run_id)
                        .order_by(schema.tests.c.position)
                    )
                )
                levels = list(
                    conn.execute(
                        select(schema.levels)
                        .where(schema.levels.c.run_id == run_id)
                        .order_by(schema.levels.c.test_id, schema.levels.c.position)
                    )
                )
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        by_test: dict[int, list[dict[str, Any]]] = {}
        for level in levels:
            by_test.setdefault(int(level.test_id), []).append(
                {**(level.data or {}), "key": json.loads(level.level_key)}
            )
        info = _run_info(run)
        return {
            "id": info.id,
            "time": info.time.isoformat(),
            "commit": info.commit,
            "branch": info.branch,
            "ci_url": info.ci_url,
            "deployment": info.deployment,
            "plugin_version": info.plugin_version,
            "model": run.model,
            "provenance": dict(info.provenance),
            "deployments": dict(run.deployments or {}),
            "endpoint": dict(run.endpoint or {}),
            "tests": [
                {
                    **(test.data or {}),
                    "nodeid": test.nodeid,
                    "test": test.test,
                    "deployment": test.deployment,
                    "session": test.session,
                    "outcome": test.outcome,
                    "levels": by_test.get(int(test.id), []),
                }
                for test in tests
            ],
        }

    def tests(self) -> list[str]:
        """The series' test names, sorted."""
        query = select(schema.tests.c.test).distinct().order_by(schema.tests.c.test)
        try:
            with self.engine.connect() as conn:
                return [str(name) for name in conn.scalars(query)]
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None


def _interval(
    low: float | None, high: float | None, change: float | None
) -> tuple[float | None, float | None] | None:
    """A stored change interval; None for a level that was not compared (no change)."""
    if change is None and low is None and high is None:
        return None
    return (low, high)


def _inserted_id(result: Any) -> int:
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise HistoryError("the database returned no id for the row just written")
    return int(key[0])


def _run_info(row: Any) -> RunInfo:
    return RunInfo(
        id=int(row.id),
        time=_utc(row.time),
        commit=row.git_commit,
        branch=row.branch,
        ci_url=row.ci_url,
        deployment=row.deployment,
        provenance=dict(row.provenance or {}),
        plugin_version=row.plugin_version,
    )


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive times (stored as UTC); PostgreSQL aware ones."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _one_line(exc: BaseException, url: str) -> str:
    """A driver error as one line without the URL's password: the driver's own message (not
    SQLAlchemy's wrapper with its SQL and documentation link), first lines joined."""
    orig = getattr(exc, "orig", None)
    message = str(orig if orig is not None else exc) or type(exc).__name__
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return scrub_text(" ".join(lines[:3]), url_secrets(url))
