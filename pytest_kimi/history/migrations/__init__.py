"""Alembic's scripts for the history schema (``env.py``, ``versions/``), run by
:func:`pytest_kimi.history.store.open_history`; a package so that it ships with the plugin."""
