"""Where the repository and the tests folder are, for tests at any depth under ``tests/``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
"""The ``tests/`` folder: its data, fakes and the example perf suite."""
REPO = TESTS.parent
"""The repository's root: README, docs, bench, servers."""
