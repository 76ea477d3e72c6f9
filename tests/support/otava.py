"""The change-point tests need Apache Otava, the ``otava`` extra (kept out of ``test``: it
pulls cloud SDKs): skipped without it, failed instead with ``KIMI_REQUIRE_OTAVA=1`` (CI), so a
runner that lost the extra fails rather than passing on skips."""

from __future__ import annotations

import os

import pytest

OTAVA_HINT = "pip install 'pytest-kimi[otava]'"


def require_otava() -> None:
    """Skip (or, with ``KIMI_REQUIRE_OTAVA=1``, fail) a test that runs the detector."""
    try:
        import otava.analysis  # noqa: F401
    except ImportError:
        message = f"change points need Apache Otava (the otava extra): {OTAVA_HINT}"
        if os.environ.get("KIMI_REQUIRE_OTAVA", "") not in ("", "0"):
            pytest.fail(message + " (KIMI_REQUIRE_OTAVA is set)", pytrace=False)
        pytest.skip(message)


needs_otava = pytest.mark.usefixtures("otava")
"""For the tests that run the detector: the ``otava`` fixture (tests/conftest.py)."""
