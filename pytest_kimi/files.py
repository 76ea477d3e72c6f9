"""Files in and out: the one home of "a reader never sees half a file" and of "an input file is
read only when it is a bounded regular file where it should be".

Writing.  Reports, baselines, the dashboard and server records are read while a run may be
writing them (a CI step uploading ``--perf-json``, a reviewer's editor, a second pytest), and a
run can be killed mid-write.  Every writer goes through :func:`write_atomic`: the bytes go to a
fresh file beside the target, are flushed to disk, and then take the target's name in one
rename (or one hard link where the caller must not replace a file that exists).

Reading.  Baselines, server profiles, datasets and prompts files come from a checkout, that is
from anyone who can open a pull request, and every one of them is read by
:func:`read_regular_bytes` (or :func:`read_regular_text`).  A committed symlink to a one-line
secret made the run print that secret in a "must be a mapping, got str '...'" error (terminal,
JSON, JUnit); a symlink to ``/dev/zero`` turned the gate off as "no baseline yet" or read until
``MemoryError``; a FIFO would block the run for ever.  So a file is read only when it is a
regular file (after following symlinks: a device, pipe, socket or directory is refused before
it is read), when its size is within the caller's bound (checked on the open file before the
first byte is read, and again while reading, as a file may grow), and, when the caller names
the directory it belongs in, when a path that lies in that directory does not resolve out of it
through a symlink.  Refusals are :class:`FileRefusedError`, whose text names the path, the type
and the size, never the content; :func:`described` and :func:`key_shown` are how an error about
a value read from such a file says what it is without showing it.  No pytest here.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

__all__ = [
    "FileRefusedError",
    "described",
    "file_type",
    "fsync_dir",
    "key_shown",
    "read_regular_bytes",
    "read_regular_text",
    "write_atomic",
]


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


# ----------------------------------------------------------------------------------- reading

Refusal = Literal["not-regular", "dangling", "too-large", "outside"]

_READ_CHUNK = 1 << 20


class FileRefusedError(ValueError):
    """An input file the plugin will not read; ``str()`` is ``"<what> <path>: <problem>"``.

    ``kind`` says why (``not-regular``: a device, pipe, socket or directory; ``dangling``: a
    symlink to nothing; ``too-large``: over the caller's bound; ``outside``: a symlink out of
    the directory it belongs in), so a caller can add its own fix.  ``problem`` names types,
    sizes and paths only: never a byte of the file.
    """

    def __init__(self, path: Path, what: str, kind: Refusal, problem: str) -> None:
        self.path = path
        self.what = what
        self.kind: Refusal = kind
        self.problem = problem
        super().__init__(f"{what} {path}: {problem}")


def read_regular_text(
    path: Path,
    *,
    what: str,
    limit: int | None,
    within: Path | None = None,
    lift: str | None = None,
    encoding: str = "utf-8",
) -> str:
    """:func:`read_regular_bytes`, decoded (``UnicodeDecodeError`` passes through: its message
    holds a byte value and an offset, no text)."""
    data = read_regular_bytes(path, what=what, limit=limit, within=within, lift=lift)
    return data.decode(encoding)


def read_regular_bytes(
    path: Path,
    *,
    what: str,
    limit: int | None,
    within: Path | None = None,
    lift: str | None = None,
) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes.

    ``what`` names the file in messages (``baseline``, ``server profile``, ``dataset``).
    ``limit``: the bound in bytes, None for none (``--perf-allow-large``); ``lift`` is how the
    bound is lifted, said when it is passed.  ``within``: the directory the file belongs in; a
    path that lies in it (as written, ``..`` resolved) must not leave it through a symlink (a
    path written outside it was named on purpose and is read where it is).

    Raises :class:`FileRefusedError` (see there); ``FileNotFoundError`` when nothing is at
    ``path`` (a symlink to nothing is a refusal: something was committed there), and any other
    ``OSError`` (permissions) for the caller's own wording.  Nothing is opened that is not a
    regular file: opening some devices has effects of its own, and a FIFO blocks.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileRefusedError(
                path,
                what,
                "dangling",
                f"is a symbolic link to {os.readlink(path)}, which does not exist",
            ) from None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise FileRefusedError(path, what, "not-regular", _not_regular(path, st.st_mode))
    if within is not None:
        _check_within(path, within, what)
    _check_size(path, what, st.st_size, limit, lift)
    # O_NONBLOCK: should the path have become a FIFO since the stat, the open must not wait
    # for a writer; the type is checked again on the open file, which is what is read
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefusedError(path, what, "not-regular", _not_regular(path, st.st_mode))
        _check_size(path, what, st.st_size, limit, lift)
        chunks: list[bytes] = []
        got = 0
        while True:
            want = _READ_CHUNK if limit is None else min(_READ_CHUNK, limit + 1 - got)
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if limit is not None and got > limit:  # it grew since the fstat
                _check_size(path, what, got, limit, lift, growing=True)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _check_within(path: Path, within: Path, what: str) -> None:
    """A path inside ``within`` (as written) must resolve inside it (symlinks followed)."""
    written = Path(os.path.normpath(os.path.abspath(path)))
    base = Path(os.path.normpath(os.path.abspath(within)))
    if not written.is_relative_to(base):
        return  # named outside on purpose: read where it is
    real = Path(os.path.realpath(path))
    real_base = Path(os.path.realpath(base))
    if real.is_relative_to(real_base):
        return
    raise FileRefusedError(
        path,
        what,
        "outside",
        f"resolves through a symbolic link to {real}, outside {base}, where a {what} must "
        "stay (a symlink committed there may point at any file on the machine)",
    )


def _check_size(
    path: Path, what: str, size: int, limit: int | None, lift: str | None, growing: bool = False
) -> None:
    if limit is None or size <= limit:
        return
    grew = " and still growing while it was read" if growing else ""
    how = f"; {lift}" if lift else ""
    raise FileRefusedError(
        path,
        what,
        "too-large",
        f"is a regular file of {_bytes(size)}{'+' if growing else ''}{grew}, over the "
        f"{_bytes(limit)} bound for a {what}; is this the file you meant?{how}",
    )


def _bytes(n: int) -> str:
    """``1048576 bytes (1.0 MiB)``: exact, and readable at a glance."""
    if n < 1024:
        return f"{n} bytes"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n} bytes ({n / size:.1f} {unit})"
    return f"{n} bytes"  # pragma: no cover - the loop always returns


_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
)


def file_type(mode: int) -> str:
    """What a ``st_mode`` is, in words (``a character device``)."""
    for test, name in _TYPES:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _not_regular(path: Path, mode: int) -> str:
    kind = file_type(mode)
    if os.path.islink(path):
        where = f"is a symbolic link to {os.path.realpath(path)}, {kind}"
    else:
        where = f"is {kind}"
    return (
        f"{where}, not a regular file; nothing else is read (a device or pipe has no end, and "
        "may not be what it seems): give the path of a regular file"
    )


# ------------------------------------------------------------ saying what a value is, unseen

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_KEY_DIGITS = 3
"""A field name holds a few digits at most (``p50``, ``trials_tok_s``); a token many."""


def described(value: object) -> str:
    """What a value read from an input file is, without a character of its content: ``a string
    of 23 characters``, ``a list of 3 items``, ``a mapping of 2 keys``, ``an integer``.

    For errors about a file that may not be what it claims (a symlink to a secret parses as one
    YAML string), where the value's repr would print the secret.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return f"a string of {_count(len(value), 'character')}"
    if isinstance(value, (bytes, bytearray)):
        return f"binary data of {_count(len(value), 'byte')}"
    if isinstance(value, Mapping):
        return f"a mapping of {_count(len(value), 'key')}"
    if isinstance(value, (list, tuple)):
        return f"a list of {_count(len(value), 'item')}"
    if isinstance(value, (_dt.date, _dt.datetime, _dt.time)):
        return "a date or time"
    return f"a {type(value).__name__}"


def key_shown(key: object, *, quote: bool = True) -> str:
    """A mapping key as an error may show it: as it is (quoted unless ``quote=False``) when it
    looks like a field name (a letter or ``_``, then letters, digits, ``_.-``, at most 32
    characters and 3 digits), else only :func:`described` (a key can be a secret as well as a
    value: ``ghp_...: x``)."""
    if (
        isinstance(key, str)
        and _PLAIN_KEY.fullmatch(key)
        and sum(c.isdigit() for c in key) <= _KEY_DIGITS
    ):
        return repr(key) if quote else key
    return f"a key that is {described(key)}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
