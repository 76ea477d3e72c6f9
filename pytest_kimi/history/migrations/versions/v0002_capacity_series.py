"""A ``@capacity`` test is one series: its capacity in ``kimi_capacities``, its probes marked.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03

Until this revision every load a capacity search probed was stored as a throughput level of
its own, so one ``@capacity`` test became one series per probed load (a different set every
run), its ``broke`` probes were drawn and analysed like passing levels, and the capacity
itself was nowhere but in the test's JSON.  This revision adds the capacity table and marks
the probes (``kimi_levels.probe``), and fills both from what the old rows already hold: the
test's ``data`` has the report's ``capacity`` object, a probe's ``data`` its
``capacity_level``.  It also copies each level's change interval (``ci90``) out of its JSON
into columns, which the dashboard's "vs baseline" column reads.

Written out in full, not imported from ``schema.py`` or ``rows.py``: a revision is the
schema (and the reading of the old rows) as it was then.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
LATENCY_NAMES = {"ttft_s": "TTFT", "itl_s": "ITL", "e2e_s": "end-to-end"}
BATCH = 500


def upgrade() -> None:
    with op.batch_alter_table("kimi_levels") as batch:
        batch.add_column(
            sa.Column("probe", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("ci90_low", sa.Double()))
        batch.add_column(sa.Column("ci90_high", sa.Double()))
    op.create_table(
        "kimi_capacities",
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
        sa.Column("capacity_key", sa.Text(), nullable=False),
        sa.Column("label", sa.String(255)),
        sa.Column("metric", sa.String(32)),
        *(sa.Column(name, sa.Double()) for name in _FIGURES[:8]),
        sa.Column("verdict", sa.String(32)),
        *(sa.Column(name, sa.Double()) for name in _FIGURES[8:]),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_kimi_capacities_test_id", "kimi_capacities", ["test_id"], unique=True)
    op.create_index("ix_kimi_capacities_run_id", "kimi_capacities", ["run_id"])
    _backfill(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_kimi_capacities_run_id", "kimi_capacities")
    op.drop_index("ix_kimi_capacities_test_id", "kimi_capacities")
    op.drop_table("kimi_capacities")
    with op.batch_alter_table("kimi_levels") as batch:
        batch.drop_column("ci90_high")
        batch.drop_column("ci90_low")
        batch.drop_column("probe")


_FIGURES = (
    "value",
    "low",
    "high",
    "estimate",
    "estimate_ci90_low",
    "estimate_ci90_high",
    "log_se",
    "slope",
    "baseline",
    "baseline_low",
    "baseline_high",
    "baseline_estimate",
    "change_pct",
    "change_ci90_low",
    "change_ci90_high",
    "tolerance_pct",
)
"""The capacity table's figure columns: before ``verdict`` the run's own, after it the
comparison's (the order the table is created in)."""


# ------------------------------------------------------------------------------ the old rows


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _pair(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _number(value[0]), _number(value[1])
    return None, None


def _canonical(key: Any) -> str:
    return json.dumps(
        key if isinstance(key, Mapping) else {}, sort_keys=True, separators=(",", ":")
    )


def _label(capacity: Mapping[str, Any]) -> str:
    ceilings = capacity.get("ceilings") or {}
    parts = [
        f"{LATENCY_NAMES.get(k, k)} <= {v:g} s"
        for k, v in ceilings.items()
        if isinstance(v, (int, float))
    ]
    percentile = capacity.get("percentile", 95)
    percentile = percentile if isinstance(percentile, (int, float)) else 95
    return f"capacity under p{percentile:g} " + ", ".join(parts)


def _capacity_row(test_id: int, run_id: int, capacity: Mapping[str, Any]) -> dict[str, Any]:
    est_lo, est_hi = _pair(capacity.get("ci90"))
    ch_lo, ch_hi = _pair(capacity.get("change_ci90"))
    verdict = capacity.get("verdict")
    metric = capacity.get("metric")
    return {
        "test_id": test_id,
        "run_id": run_id,
        "capacity_key": _canonical(capacity.get("workload")),
        "label": _label(capacity)[:255],
        "metric": metric if isinstance(metric, str) else None,
        "value": _number(capacity.get("value")),
        "low": _number(capacity.get("low")),
        "high": _number(capacity.get("high")),
        "estimate": _number(capacity.get("estimate")),
        "estimate_ci90_low": est_lo,
        "estimate_ci90_high": est_hi,
        "log_se": _number(capacity.get("log_se")),
        "slope": _number(capacity.get("slope")),
        "verdict": verdict if isinstance(verdict, str) else None,
        "baseline": _number(capacity.get("baseline")),
        "baseline_low": _number(capacity.get("baseline_low")),
        "baseline_high": _number(capacity.get("baseline_high")),
        "baseline_estimate": _number(capacity.get("baseline_estimate")),
        "change_pct": _number(capacity.get("change_pct")),
        "change_ci90_low": ch_lo,
        "change_ci90_high": ch_hi,
        "tolerance_pct": _number(capacity.get("tolerance_pct")),
    }


def _backfill(conn: Any) -> None:
    """The capacities of the tests stored so far, their probes marked, every level's ``ci90``
    in columns: read from the JSON the old rows already hold."""
    tests = sa.table(
        "kimi_tests",
        sa.column("id", sa.Integer()),
        sa.column("run_id", sa.Integer()),
        sa.column("data", JSONType),
    )
    levels = sa.table(
        "kimi_levels",
        sa.column("id", sa.Integer()),
        sa.column("test_id", sa.Integer()),
        sa.column("data", JSONType),
        sa.column("probe", sa.Boolean()),
        sa.column("ci90_low", sa.Double()),
        sa.column("ci90_high", sa.Double()),
    )
    capacities = sa.table(
        "kimi_capacities",
        sa.column("test_id", sa.Integer()),
        sa.column("run_id", sa.Integer()),
        sa.column("capacity_key", sa.Text()),
        sa.column("label", sa.String()),
        sa.column("metric", sa.String()),
        sa.column("verdict", sa.String()),
        *(sa.column(name, sa.Double()) for name in _FIGURES),
    )
    rows = []
    capacity_tests: set[int] = set()
    for test_id, run_id, data in conn.execute(sa.select(tests.c.id, tests.c.run_id, tests.c.data)):
        capacity = data.get("capacity") if isinstance(data, Mapping) else None
        if isinstance(capacity, Mapping):
            capacity_tests.add(int(test_id))
            rows.append(_capacity_row(int(test_id), int(run_id), capacity))
    for start in range(0, len(rows), BATCH):
        conn.execute(capacities.insert(), rows[start : start + BATCH])
    updates = []
    for level_id, test_id, data in conn.execute(
        sa.select(levels.c.id, levels.c.test_id, levels.c.data)
    ):
        data = data if isinstance(data, Mapping) else {}
        probe = int(test_id) in capacity_tests or isinstance(data.get("capacity_level"), Mapping)
        low, high = _pair(data.get("ci90"))
        if probe or low is not None or high is not None:
            updates.append({"lid": int(level_id), "p": probe, "lo": low, "hi": high})
    statement = (
        levels.update()
        .where(levels.c.id == sa.bindparam("lid"))
        .values(probe=sa.bindparam("p"), ci90_low=sa.bindparam("lo"), ci90_high=sa.bindparam("hi"))
    )
    for start in range(0, len(updates), BATCH):
        conn.execute(statement, updates[start : start + BATCH])
