"""One measurement at a time per endpoint, across every process of this user on this machine.

Why.  Two pytest runs against one server at once each measure the other's load: both got a
false ``regression`` (docs/evidence/engines.md, "Observed on real servers"), and the second
run's baselines silently
replaced the first's.  The old lock was a file in ``<rootdir>/.kimi/`` taken only by xdist
workers, so two plain runs, or runs from two checkouts, never met.  The lock is now keyed by the
endpoint (the normalised ``host:port`` of the URL the load goes to) and lives in a per-user
directory of the system's temp dir (``pytest-kimi-<uid>/``), which every run of this user sees
whatever its rootdir.  The built-in simulator started for a session listens on a port of its
own, so it is an endpoint of its own and rarely waits.

A run that must wait says so once (who holds the endpoint, since when: the holder writes its
pid, argv and start into a sidecar ``.json`` next to the lock file), and waits at most
``timeout_s`` (``--perf-lock-timeout``); past it :class:`EndpointBusy` names the holder.  The
lock is a ``filelock`` (``fcntl.flock`` on POSIX, ``msvcrt`` on Windows): the kernel releases it
when its holder dies, so a killed run never leaves the endpoint locked (a stale sidecar is
overwritten by the next holder).

Limits: one machine, one user (runs of two users, or on two machines, against one server are
not seen; the server's own gauges are the check for those), and one name per server:
``localhost`` and ``0.0.0.0`` are taken as ``127.0.0.1``, but a server reached by two other
names is two endpoints.  No pytest here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from filelock import FileLock, Timeout

from pytest_kimi.files import write_atomic
from pytest_kimi.scrub import scrub_argv, scrub_text

__all__ = [
    "EndpointBusy",
    "EndpointLockError",
    "Holder",
    "endpoint_key",
    "lock_dir",
    "measuring",
]

DIR_PREFIX = "pytest-kimi-"
"""The per-user directory's name in the temp dir, before the user id."""
POLL_S = 0.1
"""How often a waiting run tries the lock: a waiter starts at most this long after the holder
is done, against measurements of seconds to minutes."""
_LOOPBACK_ALIASES = {"localhost": "127.0.0.1", "0.0.0.0": "127.0.0.1"}
"""Host names that reach the same server as ``127.0.0.1`` on this machine."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


class EndpointLockError(RuntimeError):
    """The lock directory cannot be used (not ours, not a directory); the message says the fix."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who measures an endpoint: what the holder wrote into the lock's sidecar."""

    pid: int
    started: float
    """Epoch seconds when it took the lock."""
    endpoint: str
    argv: tuple[str, ...] = field(default_factory=tuple)
    host: str = ""

    def describe(self) -> str:
        """``pid 4242 since 14:03:07 (pytest tests/perf -x)``, for the terminal and errors."""
        since = time.strftime("%H:%M:%S", time.localtime(self.started))
        command = f" ({' '.join(self.argv)})" if self.argv else ""
        return f"pid {self.pid} since {since}{command}"


class EndpointBusy(TimeoutError):
    """The endpoint stayed locked by another run past the wait; the message names that run."""

    def __init__(self, url: str, waited_s: float, holder: Holder | None, lock_file: Path) -> None:
        self.url = url
        self.holder = holder
        who = holder.describe() if holder is not None else f"the holder of {lock_file}"
        super().__init__(
            f"another pytest-kimi run has been measuring {url} for longer than the "
            f"{waited_s:g} s this test waited: {who}.  Wait for it to finish (or stop it), "
            "or raise --perf-lock-timeout"
        )


def endpoint_key(url: str) -> str:
    """The normalised ``host:port`` of ``url``: what makes two URLs one server.

    Scheme, path, credentials and case do not count; a missing port is the scheme's default;
    ``localhost`` and ``0.0.0.0`` are ``127.0.0.1``.
    """
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = (parts.hostname or "").lower()
    host = _LOOPBACK_ALIASES.get(host, host)
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: keep the text, still one key per URL
        port = None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme.lower(), 80)
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}"


def _user() -> str:
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return str(getuid())
    import getpass  # Windows: no uids; the user name keeps users apart

    return getpass.getuser()


def lock_dir() -> Path:
    """The per-user lock directory, created ``0700``; :class:`EndpointLockError` when it is not
    a directory of this user (a name another user took first in a shared ``/tmp``)."""
    path = Path(tempfile.gettempdir()) / f"{DIR_PREFIX}{_user()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise EndpointLockError(
            f"cannot create the endpoint lock directory {path}: {exc}; set TMPDIR to a "
            "writable directory"
        ) from None
    getuid = getattr(os, "getuid", None)
    if not stat.S_ISDIR(info.st_mode) or (getuid is not None and info.st_uid != getuid()):
        raise EndpointLockError(
            f"the endpoint lock directory {path} is not a directory of yours (a link, a file, "
            "or another user's): remove it, or set TMPDIR to a directory of your own"
        )
    return path


def lock_files(url: str, directory: Path | None = None) -> tuple[Path, Path]:
    """The lock file and its sidecar for ``url``: named by a digest of :func:`endpoint_key`,
    so any URL text gives a safe file name."""
    digest = hashlib.sha256(endpoint_key(url).encode()).hexdigest()[:20]
    base = (directory if directory is not None else lock_dir()) / digest
    return base.with_suffix(".lock"), base.with_suffix(".json")


def read_holder(sidecar: Path) -> Holder | None:
    """The sidecar's holder; None when there is none or it is unreadable (being written)."""
    try:
        data = json.loads(sidecar.read_text(encoding="utf-8"))
        return Holder(
            pid=int(data["pid"]),
            started=float(data["started"]),
            endpoint=str(data["endpoint"]),
            argv=tuple(str(a) for a in data.get("argv", ())),
            host=str(data.get("host", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_holder(sidecar: Path, holder: Holder) -> None:
    """Write the sidecar atomically (a waiter never reads half of it); not flushed to disk:
    it is worthless after a crash, whose kernel releases the lock anyway."""
    data: dict[str, Any] = asdict(holder)
    data["argv"] = list(holder.argv)
    write_atomic(sidecar, json.dumps(data), fsync=False)


@contextlib.contextmanager
def measuring(
    url: str,
    *,
    timeout_s: float,
    on_wait: Callable[[str], None] | None = None,
    argv: Sequence[str] | None = None,
    directory: Path | None = None,
) -> Iterator[None]:
    """Hold ``url``'s endpoint lock for the block; wait for it at most ``timeout_s`` seconds.

    ``on_wait`` is told once, when the lock is taken by another run, who holds it
    (``waiting for another pytest-kimi run measuring http://...: pid N since HH:MM:SS``).
    Raises :class:`EndpointBusy` past the wait, :class:`EndpointLockError` when the lock
    directory is unusable.  ``argv`` (default ``sys.argv``) is recorded, scrubbed, for waiters.
    """
    shown = scrub_text(url)
    lock_file, sidecar = lock_files(url, directory)
    lock = FileLock(str(lock_file))
    started = time.monotonic()
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = read_holder(sidecar)
        if on_wait is not None:
            who = holder.describe() if holder is not None else "its pid not yet written"
            on_wait(f"waiting for another pytest-kimi run measuring {shown}: {who}")
        try:
            lock.acquire(
                timeout=max(0.0, timeout_s - (time.monotonic() - started)), poll_interval=POLL_S
            )
        except Timeout:
            raise EndpointBusy(
                shown, timeout_s, read_holder(sidecar) or holder, lock_file
            ) from None
    me = Holder(
        pid=os.getpid(),
        started=time.time(),
        endpoint=shown,
        argv=tuple(scrub_argv(list(sys.argv if argv is None else argv))),
        host=socket.gethostname(),
    )
    try:
        _write_holder(sidecar, me)
        yield
    finally:
        # the sidecar goes first: only the holder writes it, so no waiter's can be lost
        with contextlib.suppress(OSError):
            sidecar.unlink()
        lock.release()
