"""Errors more than one layer raises and one layer above catches.

:class:`CliError` is raised by every ``kimi-perf`` command, those of :mod:`pytest_kimi.cli`
and those the history registers into it (:mod:`pytest_kimi.history.commands`), and caught once by
``kimi-perf``'s ``main``, which prints it and exits 2.  It lives in this base module, not in
:mod:`pytest_kimi.cli`, because the history sits below the CLI in the package's layers
(``.importlinter``): a command of a lower layer may raise it without importing the layer that
catches it.  No pytest here, and nothing of the package.
"""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A problem with the input that the user fixes (message printed as one line, exit 2)."""
