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
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pytest_kimi.options import KimiOptions

__all__ = ["OutputPath", "OutputPathError", "Target", "check_output_paths", "report_paths"]


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
