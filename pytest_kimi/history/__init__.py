"""History: every run in a database, and the analyses over it (change points, session noise,
the dashboard).

This package face imports nothing: the plugin reaches it at the end of every session that
measured something, and the read model (:mod:`pytest_kimi.history.model`) is used by analyses
that have no database at all.  SQLAlchemy and Alembic are imported by
:mod:`pytest_kimi.history.store` only, when a history is opened.
"""
