"""The history's tables (SQLAlchemy Core): runs, the tests each run measured, their levels.

The schema the code reads and writes.  The database gets it from the migrations
(``migrations/versions/``), never from ``metadata.create_all``: a database written by an
older plugin is upgraded in place, and a test checks that the migrations end exactly at these
tables.  A change here is a new migration there.

Names carry a ``kimi_`` prefix, and Alembic's version table is ``kimi_alembic_version``, so a
team's PostgreSQL database may hold other applications' tables (their own Alembic's too).

Why the figures are columns and the rest JSON: the analyses read a level's throughput, its
trials, verdict and baseline across many runs (columns, one query); the run pages show the
whole level as the report had it (JSON, whatever fields later versions add).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

VERSION_TABLE = "kimi_alembic_version"
HEAD = "0001"
"""The newest migration's revision, which these tables are (a test checks it against the
scripts): a history already there is opened without importing Alembic at all."""

JSONType = JSON().with_variant(JSONB(), "postgresql")
"""JSON everywhere; JSONB on PostgreSQL (compact, indexable should anyone need it)."""

metadata = MetaData()

runs = Table(
    "kimi_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("git_commit", String(64)),
    Column("branch", String(255)),
    Column("ci_url", Text),
    Column("deployment", String(255)),
    Column("plugin_version", String(64)),
    Column("model", Text),
    Column("report_schema", Integer),
    # Flattened dotted keys (``server_info.tp_size``), scrubbed.
    Column("provenance", JSONType, nullable=False),
    # With server profiles: each deployment's flattened provenance, by name.
    Column("deployments", JSONType, nullable=False),
    # The report's endpoint (URL without credentials, model, server info), scrubbed.
    Column("endpoint", JSONType, nullable=False),
    sqlite_autoincrement=True,  # ids are never reused: the dashboard links to them
)
Index("ix_kimi_runs_time", runs.c.time)

tests = Table(
    "kimi_tests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("kimi_runs.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    # As the report has it.
    Column("nodeid", Text, nullable=False),
    # The series' test: the node id without deployment and session parameters.
    Column("test", Text, nullable=False),
    Column("deployment", String(255)),
    Column("session", Integer),
    Column("outcome", String(32)),
    # The report's test dict without its levels.
    Column("data", JSONType, nullable=False),
    sqlite_autoincrement=True,
)
Index("ix_kimi_tests_run_id", tests.c.run_id)
Index("ix_kimi_tests_test", tests.c.test)

levels = Table(
    "kimi_levels",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("test_id", Integer, ForeignKey("kimi_tests.id", ondelete="CASCADE"), nullable=False),
    Column("run_id", Integer, ForeignKey("kimi_runs.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    # The baseline key as canonical JSON (sorted keys): equal keys, equal text.
    Column("level_key", Text, nullable=False),
    Column("label", String(255)),
    Column("tok_s", Double),
    Column("trials_tok_s", JSONType, nullable=False),
    Column("verdict", String(32)),
    Column("baseline_tok_s", Double),
    Column("change_pct", Double),
    Column("tolerance_pct", Double),
    # The report's level dict.
    Column("data", JSONType, nullable=False),
    sqlite_autoincrement=True,
)
Index("ix_kimi_levels_test_id", levels.c.test_id)
Index("ix_kimi_levels_run_id", levels.c.run_id)

__all__ = ["HEAD", "VERSION_TABLE", "levels", "metadata", "runs", "tests"]
