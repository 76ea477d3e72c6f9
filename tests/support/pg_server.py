"""A throwaway PostgreSQL server for the history's tests: Debian's ``postgresql`` binaries.

The history is tested against a real server, not a mock, because what differs between SQLite
and PostgreSQL (types, JSONB, transactional DDL, locks, error messages) is what a mock would
leave out.  :class:`PostgresServer` runs ``initdb`` into a fresh temporary directory and
``postgres`` on 127.0.0.1 on a free port (no Unix socket), password authentication for the
``kimi`` role, and stops it on exit whatever happened: SIGINT (fast shutdown), then SIGKILL to
its process group.

PostgreSQL refuses to run as root; as root the binaries run as the ``postgres`` user (created
by the Debian package) through ``setpriv``, which execs in place, so the process this module
holds is the server itself.  The data directory is then made in the system's temporary
directory (pytest's own temporary directories are private to root) and handed to that user.

Without the binaries (or psycopg) the tests skip with the command that installs them; CI sets
``KIMI_REQUIRE_POSTGRES=1`` so a runner that lost them fails instead of passing on skips.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from support.timing import poll_until

INSTALL_HINT = "apt-get install -y postgresql (and pip install 'pytest-kimi[postgres]')"
ROLE = "kimi"
STARTUP_S = 120.0
"""Generous: initdb and a first start on a busy 2-core machine take seconds; a hang must end."""
STOP_S = 30.0


def find_bindir() -> Path | None:
    """The directory of ``initdb``/``postgres``: ``pg_config --bindir`` when it has them, else
    the newest ``/usr/lib/postgresql/*/bin`` (Debian keeps them off PATH), else None."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            candidates.append(Path(out))

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    candidates += [
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version)[::-1]
    ]
    for bindir in candidates:
        if all((bindir / exe).is_file() for exe in ("initdb", "postgres")):
            return bindir
    return None


def require_postgres() -> Path:
    """The binaries' directory; skip the test without them (or without psycopg), or fail with
    ``KIMI_REQUIRE_POSTGRES=1``."""
    bindir = find_bindir()
    problem = None
    if bindir is None:
        problem = "PostgreSQL server binaries (initdb, postgres) not found"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            problem = "psycopg (PostgreSQL's driver) is not installed"
    if problem is None:
        assert bindir is not None
        return bindir
    message = f"{problem}: {INSTALL_HINT}"
    if os.environ.get("KIMI_REQUIRE_POSTGRES", "") not in ("", "0"):
        pytest.fail(message + " (KIMI_REQUIRE_POSTGRES is set)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    """``with PostgresServer(bindir) as pg:`` a running server; :meth:`create_database` gives
    each test a database of its own, :meth:`url` its SQLAlchemy URL."""

    bindir: Path
    password: str = field(default_factory=lambda: "pw-" + secrets.token_hex(12))
    port: int = 0
    base: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    _databases: int = 0

    # ------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> PostgresServer:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _as_owner(self) -> tuple[list[str], Any]:
        """How to run a binary: as ``postgres`` through setpriv when we are root."""
        if os.geteuid() != 0:
            return [], None
        user = pwd.getpwnam("postgres")
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("running as root needs setpriv (util-linux) to drop to postgres")
        prefix = [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
        return prefix, user

    def _start(self) -> None:
        prefix, user = self._as_owner()
        self.base = Path(tempfile.mkdtemp(prefix="kimi-pg-"))
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        if user is not None:
            for path in (self.base, pwfile):
                os.chown(path, user.pw_uid, user.pw_gid)
        data = self.base / "data"
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        if user is not None:
            env["HOME"] = user.pw_dir
        init = subprocess.run(
            [
                *prefix,
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                ROLE,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=STARTUP_S,
            env=env,
            cwd=self.base,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
        self.port = free_port()
        self.log = self.base / "postgres.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    *prefix,
                    str(self.bindir / "postgres"),
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-c",
                    "unix_socket_directories=",
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "synchronous_commit=off",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.base,
                start_new_session=True,
            )
        poll_until(self._ready, f"PostgreSQL on 127.0.0.1:{self.port} accepting", STARTUP_S, 0.1)

    def _ready(self) -> bool:
        import psycopg

        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log.read_text()[-2000:] if self.log is not None else ""
            raise RuntimeError(f"postgres exited with {self.proc.returncode}: {tail}")
        try:
            with psycopg.connect(self.dsn("postgres"), connect_timeout=5):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        """Fast shutdown, then SIGKILL to the process group; the directory is removed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                pass
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    # ------------------------------------------------------------------------ databases

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={ROLE} password={self.password} dbname={database}"

    def url(self, database: str, *, scheme: str = "postgresql") -> str:
        """The database's URL as a user writes it (``postgresql://kimi:PASSWORD@...``)."""
        return f"{scheme}://{ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its name."""
        import psycopg

        self._databases += 1
        name = f"kimi_{os.getpid()}_{self._databases}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name
