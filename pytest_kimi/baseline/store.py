"""The baseline store: one profile's baseline files under a root, read, looked up and written.

Why files in git rather than a database: a throughput target is a claim about the serving stack,
and changing it should go through the same review as a code change.  This module is the file
system side of that: it walks ``<root>/<profile>`` (:meth:`BaselineStore.paths`, the one walk
of a baseline directory), reads a file only when it is a bounded regular file that stays under
the root (:meth:`BaselineStore.read_text`: a baseline comes with a pull request, and a committed
symlink to ``/dev/zero`` or to a secret must neither switch the gate off nor print the secret),
checks that a file sits where its test says it belongs, refuses to overwrite a target by
accident, and writes atomically (:func:`pytest_kimi.files.write_atomic`), so a reader or a
crash never sees half a file.  The format is
:mod:`pytest_kimi.baseline.yaml_io`, the merge rule :mod:`pytest_kimi.baseline.merge`.

This module must not import pytest: the plugin, CLI helpers and offline scripts share it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.baseline.merge import NoisePool, merge
from pytest_kimi.baseline.model import (
    BaselineError,
    BaselineExistsError,
    LevelBaseline,
    TestBaseline,
    WorkloadLike,
)
from pytest_kimi.baseline.paths import DEFAULT_PROFILE, baseline_relpath, check_profile
from pytest_kimi.baseline.review import UpdateSummary, replaced_summary, summarize_update
from pytest_kimi.baseline.yaml_io import MAX_BASELINE_BYTES, dumps, loads
from pytest_kimi.files import FileRefusedError, read_regular_text, write_atomic
from pytest_kimi.workload.marker_bounds import ALLOW_LARGE_HINT

__all__ = ["BaselineLookup", "BaselineStore", "profile_names"]

_REGULAR_ONLY = "a baseline must be a regular file under the baseline directory"


@dataclass(frozen=True)
class BaselineLookup:
    """Result of looking a workload up: the level, or the reason there is none."""

    path: Path
    baseline: TestBaseline | None
    level: LevelBaseline | None
    reason: str | None
    """Set exactly when ``level`` is None: no file, or which workloads the file does hold."""

    @property
    def found(self) -> bool:
        return self.level is not None


class BaselineStore:
    """Baselines of one profile under ``root`` (usually ``<rootdir>/baselines``)."""

    def __init__(
        self, root: Path, profile: str = DEFAULT_PROFILE, *, allow_large: bool = False
    ) -> None:
        """``allow_large`` (``--perf-allow-large``) lifts the size bound on a file read
        (:data:`~pytest_kimi.baseline.yaml_io.MAX_BASELINE_BYTES`), never the type checks."""
        check_profile(profile)
        self.root = Path(root)
        self.profile = profile
        self.allow_large = allow_large

    @property
    def directory(self) -> Path:
        return self.root / self.profile

    def path_for(self, nodeid: str) -> Path:
        return self.directory / baseline_relpath(nodeid)

    def read_text(self, path: Path) -> str:
        """A baseline file's text, read only if it is a regular file (symlinks followed) that
        stays under :attr:`root` and within the size bound; :class:`BaselineError` naming the
        path, its type and size otherwise (never a byte of its content), or when it is not
        UTF-8.  ``FileNotFoundError`` when nothing is there."""
        try:
            return read_regular_text(
                path,
                what="baseline",
                limit=None if self.allow_large else MAX_BASELINE_BYTES,
                within=self.root,
                lift=ALLOW_LARGE_HINT,
            )
        except FileRefusedError as exc:
            fix = f"; {_REGULAR_ONLY}" if exc.kind != "too-large" else ""
            raise BaselineError(path, exc.problem + fix) from None
        except UnicodeDecodeError as exc:
            raise BaselineError(
                path, f"not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        except FileNotFoundError:
            raise
        except OSError as exc:  # permissions, say
            raise BaselineError(path, f"cannot be read: {exc.strerror or exc}") from None

    def _read(self, path: Path) -> TestBaseline:
        text = self.read_text(path)
        baseline = loads(text, source=path, allow_large=self.allow_large)
        if baseline.profile != self.profile:
            raise BaselineError(
                path, f"profile is {baseline.profile!r} but the file is in profile {self.profile!r}"
            )
        expected = self.path_for(baseline.test)
        if os.path.abspath(expected) != os.path.abspath(path):
            raise BaselineError(
                path, f"holds test {baseline.test!r}, whose baseline belongs at {expected}"
            )
        return baseline

    def load(self, nodeid: str) -> TestBaseline | None:
        """The test's baseline, None when it has none; :class:`BaselineError` when unusable."""
        path = self.path_for(nodeid)
        if not os.path.lexists(path):  # anything there (a link to a device too) is read
            return None
        baseline = self._read(path)
        if baseline.test != nodeid:  # only reachable through a sanitisation hash collision
            raise BaselineError(path, f"holds test {baseline.test!r}, not {nodeid!r}")
        return baseline

    def lookup(self, nodeid: str, workload: WorkloadLike) -> BaselineLookup:
        path = self.path_for(nodeid)
        baseline = self.load(nodeid)
        if baseline is None:
            return BaselineLookup(
                path,
                None,
                None,
                f"no baseline for {nodeid} (profile {self.profile}): {path} does not exist",
            )
        level = baseline.level_for(workload)
        reason = None if level is not None else baseline.explain_miss(workload)
        return BaselineLookup(path, baseline, level, reason)

    def save(self, baseline: TestBaseline, *, overwrite: bool = False) -> Path:
        """Write the file atomically; an existing file is replaced only with ``overwrite``."""
        if baseline.profile != self.profile:
            raise ValueError(
                f"baseline is for profile {baseline.profile!r}, store is {self.profile!r}"
            )
        path = self.path_for(baseline.test)
        _atomic_write(path, dumps(baseline), overwrite=overwrite)
        return path

    def update(
        self,
        new: TestBaseline,
        *,
        drop_stale: bool = False,
        cwd: Path | None = None,
        replace_corrupt: bool = False,
        pool: NoisePool | None = None,
    ) -> UpdateSummary:
        """Merge ``new`` into the stored file (see :func:`merge`), write it, and summarise.

        A corrupt existing file raises :class:`BaselineError` before anything is written,
        unless ``replace_corrupt`` (``--update-baselines=force``): nothing in a file that
        cannot be read can be merged, so ``new`` alone replaces it, and the summary says what
        was wrong with it (git still has the old text).  ``pool``: see :func:`merge`.
        """
        try:
            old = self.load(new.test)
        except BaselineError as exc:
            if not replace_corrupt:
                raise
            path = self.save(new, overwrite=True)
            return replaced_summary(summarize_update(None, new, path, cwd=cwd), exc.problem, cwd)
        merged = merge(old, new, drop_stale=drop_stale, pool=pool)
        path = self.save(merged, overwrite=old is not None)
        return summarize_update(old, merged, path, cwd=cwd)

    def paths(self) -> Iterator[Path]:
        """Every baseline file of the profile, in path order (none when the directory is missing).

        The one walk of ``<root>/<profile>``: hidden files (our temp files, editor swap files)
        are not baselines, nor are directories.  Anything else named ``*.yaml`` is yielded, a
        symlink to a device or out of the root too, so that reading it reports it rather than
        skipping it without a word.  Yields paths, not baselines, so a caller that lists files
        can report a corrupt one and go on.
        """
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.rglob("*.yaml")):
            if path.name.startswith(".") or (path.is_dir() and not path.is_symlink()):
                continue
            yield path

    def iter_all(self) -> Iterator[TestBaseline]:
        """Every baseline of the profile, in path order; a bad file raises BaselineError."""
        for path in self.paths():
            yield self._read(path)


def profile_names(root: Path) -> list[str]:
    """The profiles that have a directory under ``root`` (hidden directories are not), sorted."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def _atomic_write(path: Path, text: str, *, overwrite: bool) -> None:
    """:func:`~pytest_kimi.files.write_atomic`, its :class:`FileExistsError` (no ``overwrite``,
    the file exists or appeared while writing: two workers recording the same test) said as
    :class:`BaselineExistsError`."""
    if not overwrite and path.exists():
        raise BaselineExistsError(
            f"{path}: a baseline already exists; pass overwrite=True (a deliberate re-record) to replace it"
        )
    try:
        write_atomic(path, text, overwrite=overwrite)
    except FileExistsError as exc:
        # os.link's own error (an errno) is the race; write_atomic's (none) is its check, or the
        # fallback of a filesystem without hard links finding the file there
        if exc.errno is None:
            raise BaselineExistsError(f"{path}: a baseline already exists") from None
        raise BaselineExistsError(
            f"{path}: a baseline was created concurrently; not overwriting it"
        ) from None
