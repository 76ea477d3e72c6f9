"""Alembic's environment for the history schema.

Run by :func:`pytest_kimi.history.store.migrate` with an open connection, already inside the
transaction (and, on PostgreSQL, the advisory lock) that makes the upgrade atomic; that
connection comes in ``config.attributes["connection"]``.  A developer writing a new revision
runs it through :func:`pytest_kimi.history.store.alembic_config` instead, with a URL:

    python -c "from alembic import command; from pytest_kimi.history.store import alembic_config;
    command.revision(alembic_config('sqlite:////tmp/h.db'), 'what changed', autogenerate=True)"

(upgrade that scratch database to head first; see migrations/README.md).
"""

from __future__ import annotations

from typing import Any

from alembic import context

from pytest_kimi.history.schema import VERSION_TABLE, metadata


def run_migrations() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is None:
        from pytest_kimi.history.store import create_history_engine

        engine = create_history_engine(config.get_main_option("sqlalchemy.url") or "")
        try:
            with engine.connect() as conn, conn.begin():
                _run(conn)
        finally:
            engine.dispose()
    else:
        _run(connection)


def _run(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite alters tables by copying them: say so in new revisions
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
