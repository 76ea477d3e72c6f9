"""Atomic file writes: the one home of "a reader never sees half a file".

Reports, baselines, the dashboard and server records are read while a run may be writing
them (a CI step uploading ``--perf-json``, a reviewer's editor, a second pytest), and a run can
be killed mid-write.  Every writer goes through :func:`write_atomic`: the bytes go to a fresh
file beside the target, are flushed to disk, and then take the target's name in one rename (or
one hard link where the caller must not replace a file that exists).  No pytest here.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(
    path: Path, data: str | bytes, *, overwrite: bool = True, fsync: bool = True
) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` so that it appears whole or not at all.

    ``overwrite=False`` raises :class:`FileExistsError` when ``path`` exists, also when it
    appeared while this call was writing (the rename is then a hard link, which fails
    atomically; filesystems without hard links fall back to check-then-rename).  The temporary
    file is created with ``O_EXCL`` and the umask's mode (``mkstemp`` would make it 0600), and
    is removed whatever happens.  ``fsync=False`` skips the flushes, for files that are cheap
    to lose (a server's pid record) but must never be read half-written.
    """
    if not overwrite and path.exists():
        raise FileExistsError(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:
                if path.exists():
                    raise FileExistsError(path) from None
                os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
