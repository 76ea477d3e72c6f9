"""The rootdir pytest chose, checked: outputs stay in the project the user ran pytest in.

pytest picks the rootdir and the ini file before it loads plugins, from the words of the
command line that are not options; at that moment the plugin's options are unknown, so the
value of ``--server-profile ../other/servers/ep8.yaml`` counts as a test path, the rootdir
moves to the other checkout (its ini file is read), and the reports, baselines and history are
written there (:mod:`pytest_kimi.run.output_paths` says more).  The plugin cannot make pytest
decide again (the other ini file's ``addopts`` are already applied), so it asks pytest's own
function what the rootdir would have been without those values and, when that differs, stops
the session with a usage error that says how to run it, before anything is read or written.
"""

from __future__ import annotations

import inspect
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

__all__ = ["check_rootdir"]


def check_rootdir(config: pytest.Config) -> None:
    """``pytest.UsageError`` when the plugin's options given as two words (``--server-profile
    PATH``) moved pytest's rootdir or ini file; nothing otherwise (``--flag=PATH``, or a value
    inside the project that changes nothing, as ``--server-profile servers/ep8.yaml``)."""
    from pytest_kimi.options import OPTIONS

    words = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.invocation_params.args]
    if not any(opt.flag in words for opt in OPTIONS.values()):
        return  # no option of the plugin's is a word of its own: none took a path's place
    from pytest_kimi.run.output_paths import moved_rootdir_message, separate_values, value_flags

    base = config.invocation_params.dir
    taken = [
        v for v in separate_values(words, value_flags()) if _exists(base / v.value.split("::")[0])
    ]
    if not taken:
        return
    chosen = (Path(config.rootpath), config.inipath)
    ns = config.known_args_namespace
    paths = [str(a) for a in ns.file_or_dir]
    with_values = _setup(config, paths + [str(base / v.value) for v in taken])
    meant = _setup(config, paths)
    # refuse only what is explained: pytest's own answer with the values is what it chose,
    # and without them it differs (None: this pytest's function could not be asked)
    if meant is None or with_values != chosen or meant == chosen:
        return
    raise pytest.UsageError(moved_rootdir_message(taken, chosen, meant))


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False


def _setup(config: pytest.Config, args: list[str]) -> tuple[Path, Path | None] | None:
    """(rootdir, ini file) as pytest determines them for ``args`` and this session's
    ``-c``/``--rootdir``/``-o``; None where the function cannot be called (its module is
    pytest's private one, whose signature has changed between releases)."""
    try:
        from _pytest.config.findpaths import determine_setup
    except ImportError:  # pragma: no cover - every supported pytest has it
        return None
    ns = config.known_args_namespace
    given: dict[str, Any] = {
        "inifile": getattr(ns, "inifilename", None),
        "override_ini": getattr(ns, "override_ini", None),
        "args": args,
        "rootdir_cmd_arg": getattr(ns, "rootdir", None) or None,
        "invocation_dir": config.invocation_params.dir,
        "config": None,  # pytest 7's keyword in place of invocation_dir
    }
    accepted = inspect.signature(determine_setup).parameters
    try:
        found = determine_setup(**{k: v for k, v in given.items() if k in accepted})
    except Exception:  # a usage error pytest has already reported, or an unknown signature
        return None
    root, ini = found[0], found[1]
    return Path(root), (Path(ini) if ini is not None else None)
