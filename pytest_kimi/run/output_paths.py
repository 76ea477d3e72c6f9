"""The report paths, checked when the session starts: a path that cannot be written is a
usage error before any load is sent, not a lost report at the end.

Why at the start: a run can take hours of GPU time, and its reports are written at its end.
A ``--perf-json`` in a directory that cannot be created (a regular file is in the way), in one
that cannot be written (permissions, a read-only filesystem) or a path that is no regular file
(``/dev/full``, a directory, a pipe: a report replaces the file at its path, so as root it would
replace a device node) only turned up then, as one error line beside results nobody could
upload.  Nothing is created here: a directory that does not exist yet is fine when it can be
made (the reports create it when they write, as pytest's ``--junitxml`` does).

What this cannot see (a disk that fills during the run) still costs one error line at the end
(:func:`pytest_kimi.run.finish.write_reports`).  No pytest here: the plugin passes pytest's
``--junitxml`` in with the plugin's own options.

Where the outputs go at all: relative report, baseline and history paths are taken from the
rootdir, and pytest picks the rootdir (and the ini file) from the command line's test paths
*before* it loads plugins.  At that moment ``--server-profile`` is an unknown option, so in
``--server-profile ../other/servers/ep8.yaml`` the value is one more "test path": the rootdir
became the common ancestor's project (``../other``), whose ini file was read, and the reports,
baselines and history were written into that other checkout.  ``--server-profile=PATH`` (one
word) is skipped there, as every word starting with ``-`` is.  :func:`separate_values` finds the
plugin's options given the other way; the plugin (``pytest_kimi/plugin/rootdir.py``) asks
pytest what the rootdir would be without them and, when that differs, stops the session with
:func:`moved_rootdir_message` before anything is read or written.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pytest_kimi.options import OPTIONS, KimiOptions

__all__ = [
    "OutputPath",
    "OutputPathError",
    "SeparateValue",
    "Target",
    "check_output_paths",
    "moved_rootdir_message",
    "report_paths",
    "separate_values",
    "value_flags",
]


class OutputPathError(ValueError):
    """One or more report paths cannot be written: one line each, naming the option (and
    where it was set), the path, what is wrong and what to do."""


class Target(Enum):
    """What the sink writes at its path."""

    FILE = "file"
    """One file (``--perf-json``, ``--perf-markdown``, ``--perf-requests``, ``--junitxml``)."""
    DIRECTORY = "directory"
    """A directory of files (``--perf-html``: ``index.html`` and its charts)."""


@dataclass(frozen=True, slots=True)
class OutputPath:
    """A sink's path and where it was given (a flag, ``env X``, ``ini x``)."""

    source: str
    path: Path
    target: Target = Target.FILE
    in_place: bool = False
    """The writer opens an existing file and overwrites it (pytest's ``--junitxml``), so the
    file itself must be writable; the plugin's reports replace it by a rename instead."""


def report_paths(opts: KimiOptions, junitxml: str | os.PathLike[str] | None) -> list[OutputPath]:
    """The session's report paths: the plugin's four and pytest's ``--junitxml`` (relative:
    against the working directory, as pytest writes it)."""
    found = [
        OutputPath(opts.source(name), path, target)
        for name, path, target in (
            ("perf_json", opts.perf_json, Target.FILE),
            ("perf_markdown", opts.perf_markdown, Target.FILE),
            ("perf_html", opts.perf_html, Target.DIRECTORY),
            ("perf_requests", opts.perf_requests, Target.FILE),
        )
        if path is not None
    ]
    if junitxml:
        found.append(OutputPath("--junitxml", Path(os.path.abspath(junitxml)), in_place=True))
    return found


def check_output_paths(paths: Iterable[OutputPath]) -> None:
    """Raise :class:`OutputPathError` listing every path that cannot be written; create
    nothing."""
    problems = [f"{p.source} {p.path}: {why}" for p in paths if (why := _problem(p)) is not None]
    if problems:
        raise OutputPathError("report path cannot be written:\n  " + "\n  ".join(problems))


def _problem(out: OutputPath) -> str | None:
    """What stops ``out`` from being written, with the fix; None when it can be."""
    path = Path(os.path.abspath(out.path))
    try:
        mode: int | None = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # not there, or a file on the way
        mode = None
    except OSError as exc:  # permissions on the way, a symlink loop
        return f"cannot be reached: {exc.strerror or exc}; give another path"
    if mode is None:
        return _missing(path)
    if out.target is Target.DIRECTORY:
        if not stat.S_ISDIR(mode):
            return (
                "is not a directory: the HTML report writes index.html and its charts into "
                "a directory; give a directory's path (it is created if missing)"
            )
        return _unwritable(path)
    if stat.S_ISDIR(mode):
        return f"is a directory: give a file's path, e.g. {path / 'report'}"
    if not stat.S_ISREG(mode):
        return (
            "is not a regular file (a device, pipe or socket): a report replaces the file at "
            "its path; give the path of a regular file, or leave the option off to write none"
        )
    if out.in_place and not os.access(path, os.W_OK):
        return "is not writable: change its permissions, or give another path"
    return _unwritable(path.parent)


def _missing(path: Path) -> str | None:
    """For a path that does not exist: why its directory cannot be made (None: it can)."""
    ancestor = path.parent
    while True:  # ends at the root at the latest, which exists
        try:
            mode = ancestor.stat().st_mode
            break
        except (FileNotFoundError, NotADirectoryError):  # a file further up: look higher
            ancestor = ancestor.parent
        except OSError as exc:
            return f"cannot be created: {ancestor}: {exc.strerror or exc}; give another path"
    if not stat.S_ISDIR(mode):
        return (
            f"cannot be created: {ancestor} is a file, not a directory; give a path in a "
            "directory, or move that file"
        )
    return _unwritable(ancestor)


def _unwritable(directory: Path) -> str | None:
    """Why nothing can be created in ``directory`` (None: it can): a report is written to a
    new file beside its target and renamed, so the directory must be writable."""
    if os.access(directory, os.W_OK | os.X_OK):
        return None
    return (
        f"cannot be written: no permission to create files in {directory} (or its filesystem "
        "is read-only); give a path in a directory you can write"
    )


# ------------------------------------------------------------------- the rootdir pytest chose


@dataclass(frozen=True, slots=True)
class SeparateValue:
    """One of the plugin's options given as two words (``--server-profile PATH``)."""

    flag: str
    value: str


def value_flags() -> tuple[str, ...]:
    """The plugin's options that take a value as the next word: every option but the bare
    switches, and ``--update-baselines``, whose value is optional (``=force``)."""
    return tuple(
        opt.flag for opt in OPTIONS.values() if not opt.switch and opt.dest != "update_baselines"
    )


def separate_values(words: Sequence[str], flags: Iterable[str]) -> list[SeparateValue]:
    """Each of ``flags`` given with its value as the next word, in order; ``--`` ends the
    options (what follows is test paths).  ``--flag=value`` is one word and not listed: pytest
    never takes it for a test path."""
    wanted = frozenset(flags)
    found: list[SeparateValue] = []
    i = 0
    while i < len(words) - 1:
        word = words[i]
        if word == "--":
            break
        if word in wanted:
            found.append(SeparateValue(word, words[i + 1]))
            i += 2
            continue
        i += 1
    return found


def moved_rootdir_message(
    values: Sequence[SeparateValue],
    chosen: tuple[Path, Path | None],
    meant: tuple[Path, Path | None],
) -> str:
    """Why the session stops when ``values`` moved pytest's rootdir (and ini file) from
    ``meant`` to ``chosen``, and how to run it."""
    given = ", ".join(f"{v.flag} {v.value}" for v in values)
    one_word = " ".join(f"{v.flag}={v.value}" for v in values)

    def where(place: tuple[Path, Path | None]) -> str:
        root, ini = place
        return f"{root} (ini file {ini})" if ini is not None else f"{root} (no ini file)"

    return (
        f"{given}: pytest took this value for a test path and chose the rootdir "
        f"{where(chosen)} instead of {where(meant)}; reports, baselines and history would be "
        "read and written there (pytest picks the rootdir before it knows the plugin's options, "
        f"so a value given as a separate word counts as a test path).  Write {one_word} (one "
        "word)"
    )
