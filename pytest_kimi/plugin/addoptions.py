"""The plugin's options on pytest's parser, and the session's :class:`KimiOptions` from them.

The option table, defaults and parsing live in :mod:`pytest_kimi.options` (no pytest there);
this module only declares them to pytest and reads them back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_kimi.options import KimiOptions


def add_options(parser: pytest.Parser) -> None:
    # imported here, as everything the plugin uses: importing the plugin loads pytest alone
    from pytest_kimi.options import OPTIONS, help_text

    group = parser.getgroup("kimi", "pytest-kimi: throughput targets for LLM endpoints")
    for name, opt in OPTIONS.items():
        text = help_text(name)
        env = f" [env {opt.env}]" if opt.env else ""
        # argparse %-formats option help (``%(default)s``), ini help is printed as it is:
        # a bare "%" in the text crashed ``pytest --help`` for every user of the machine.
        cli_help = text.replace("%", "%%") + env
        if opt.many:
            group.addoption(
                opt.flag,
                dest=opt.dest,
                action="append",
                default=None,
                metavar=opt.metavar,
                help=cli_help,
            )
        elif opt.switch:
            group.addoption(
                opt.flag,
                dest=opt.dest,
                action="store_const",
                const="true",
                default=None,
                help=cli_help,
            )
        elif opt.dest == "update_baselines":
            group.addoption(
                opt.flag,
                dest=opt.dest,
                nargs="?",
                const="yes",
                default=None,
                metavar=opt.metavar,
                help=cli_help,
            )
        else:
            group.addoption(
                opt.flag, dest=opt.dest, default=None, metavar=opt.metavar, help=cli_help
            )
        if opt.ini is not None:
            if opt.many:
                parser.addini(opt.ini, text, type="args", default=[])
            else:
                parser.addini(opt.ini, text, default="")


def options_from_config(
    config: pytest.Config, environ: Mapping[str, str] | None = None
) -> KimiOptions:
    """The session's options (command line > environment > ini > default), paths against the
    rootdir; a bad value is a ``pytest.UsageError`` naming its source."""
    from pytest_kimi.options import KimiOptions, OptionError

    try:
        return KimiOptions.from_sources(
            config.getoption,
            config.getini,
            os.environ if environ is None else environ,
            Path(config.rootpath),
        )
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
