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

A ``@capacity`` test is one series, not one per load it probed: its result (the capacity, the
bracket the search ended with, the interpolated boundary, its verdict against the baseline
capacity) is one row of ``kimi_capacities``; the loads the search measured stay in
``kimi_levels`` as detail for the run pages, marked ``probe`` so that no analysis reads a probe
as a throughput series (a probe's load is chosen by the search, so its "series" would be a
different set of loads every run, and its verdict is ``held``/``broke``, not the gate's).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
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
    false,
)
from sqlalchemy.dialects.postgresql import JSONB

VERSION_TABLE = "kimi_alembic_version"
HEAD = "0002"
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
    # A @capacity search's probe (its load chosen by the search): detail, never a series.
    Column("probe", Boolean, nullable=False, server_default=false()),
    # The change's 90% interval in percent (an end is NULL where it is unbounded).
    Column("ci90_low", Double),
    Column("ci90_high", Double),
    sqlite_autoincrement=True,
)
Index("ix_kimi_levels_test_id", levels.c.test_id)
Index("ix_kimi_levels_run_id", levels.c.run_id)

capacities = Table(
    "kimi_capacities",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("test_id", Integer, ForeignKey("kimi_tests.id", ondelete="CASCADE"), nullable=False),
    Column("run_id", Integer, ForeignKey("kimi_runs.id", ondelete="CASCADE"), nullable=False),
    # The capacity's baseline key (its workload, metric, ceilings, percentile), canonical JSON:
    # a capacity under another SLO is another series.
    Column("capacity_key", Text, nullable=False),
    Column("label", String(255)),
    Column("metric", String(32)),
    # The capacity (the highest load that held), the bracket [low held, high broke], the
    # interpolated boundary with its 90% interval, and what the gate's comparison reads.
    Column("value", Double),
    Column("low", Double),
    Column("high", Double),
    Column("estimate", Double),
    Column("estimate_ci90_low", Double),
    Column("estimate_ci90_high", Double),
    Column("log_se", Double),
    Column("slope", Double),
    Column("verdict", String(32)),
    Column("baseline", Double),
    Column("baseline_low", Double),
    Column("baseline_high", Double),
    Column("baseline_estimate", Double),
    Column("change_pct", Double),
    Column("change_ci90_low", Double),
    Column("change_ci90_high", Double),
    Column("tolerance_pct", Double),
    sqlite_autoincrement=True,
)
Index("ix_kimi_capacities_test_id", capacities.c.test_id, unique=True)
Index("ix_kimi_capacities_run_id", capacities.c.run_id)

__all__ = ["HEAD", "VERSION_TABLE", "capacities", "levels", "metadata", "runs", "tests"]
