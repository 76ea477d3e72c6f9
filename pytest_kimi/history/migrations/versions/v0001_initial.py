"""The first history schema: runs, the tests each run measured, and their levels.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Written out in full, not imported from ``schema.py``: a revision is the schema as it was
then, and ``schema.py`` moves on with later revisions.
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "kimi_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("git_commit", sa.String(64)),
        sa.Column("branch", sa.String(255)),
        sa.Column("ci_url", sa.Text()),
        sa.Column("deployment", sa.String(255)),
        sa.Column("plugin_version", sa.String(64)),
        sa.Column("model", sa.Text()),
        sa.Column("report_schema", sa.Integer()),
        sa.Column("provenance", JSONType, nullable=False),
        sa.Column("deployments", JSONType, nullable=False),
        sa.Column("endpoint", JSONType, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_kimi_runs_time", "kimi_runs", ["time"])
    op.create_table(
        "kimi_tests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "run_id",
            sa.Integer(),
            sa.ForeignKey("kimi_runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("test", sa.Text(), nullable=False),
        sa.Column("deployment", sa.String(255)),
        sa.Column("session", sa.Integer()),
        sa.Column("outcome", sa.String(32)),
        sa.Column("data", JSONType, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_kimi_tests_run_id", "kimi_tests", ["run_id"])
    op.create_index("ix_kimi_tests_test", "kimi_tests", ["test"])
    op.create_table(
        "kimi_levels",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "test_id",
            sa.Integer(),
            sa.ForeignKey("kimi_tests.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "run_id",
            sa.Integer(),
            sa.ForeignKey("kimi_runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("level_key", sa.Text(), nullable=False),
        sa.Column("label", sa.String(255)),
        sa.Column("tok_s", sa.Double()),
        sa.Column("trials_tok_s", JSONType, nullable=False),
        sa.Column("verdict", sa.String(32)),
        sa.Column("baseline_tok_s", sa.Double()),
        sa.Column("change_pct", sa.Double()),
        sa.Column("tolerance_pct", sa.Double()),
        sa.Column("data", JSONType, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_kimi_levels_test_id", "kimi_levels", ["test_id"])
    op.create_index("ix_kimi_levels_run_id", "kimi_levels", ["run_id"])


def downgrade() -> None:
    op.drop_table("kimi_levels")
    op.drop_table("kimi_tests")
    op.drop_table("kimi_runs")
