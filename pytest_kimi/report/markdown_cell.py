"""One Markdown table cell, escaped: its own module so that every section's renderer (the
Markdown summary and the sections it includes, such as the race's) escapes cells the same way
without importing the summary that imports them (sibling report modules may not import each
other both ways: ``.importlinter``)."""

from __future__ import annotations

from pytest_kimi.printable import printable

CELL_LIMIT = 500
"""Characters of one table cell or code span kept: any figure, label or model id fits."""


def cell(text: str) -> str:
    """One Markdown table cell: pipes escaped, no line breaks, no HTML tags, printable."""
    return printable(
        text.replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace("\r", " ")
        .replace("\n", " "),
        CELL_LIMIT,
    )


__all__ = ["CELL_LIMIT", "cell"]
