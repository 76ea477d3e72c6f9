"""History database URLs: checked, resolved and shown without SQLAlchemy.

Why apart from the store: ``--perf-history`` is read by every pytest session at start-up, and
a malformed URL must stop the run there, naming its source, before any GPU time is spent; most
sessions never open the history (nothing measured), so they must not pay for importing
SQLAlchemy to check it.  The forms are the ones SQLAlchemy writes:

* ``sqlite:///relative/path.db``: relative to a base (the rootdir for the plugin, the working
  directory for ``kimi-perf``), as every path option is;
* ``sqlite:////absolute/path.db`` (and ``sqlite://`` for an in-memory database, for tests);
* ``postgresql://user:password@host:port/db`` (``postgres://`` and ``postgresql+psycopg://``
  are taken too): PostgreSQL through psycopg 3, the ``postgres`` extra;
* ``off`` (or ``false``, ``no``, ``0``): no history.

Pure: no SQLAlchemy, no pytest.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "DEFAULT_URL",
    "HistoryError",
    "OFF_WORDS",
    "check_url",
    "display_url",
    "resolve_history_url",
    "sqlite_path",
    "url_secrets",
    "with_sqlite_path",
]

DEFAULT_URL = "sqlite:///.kimi/history.db"
"""Where runs go unless told otherwise: a SQLite file beside the lock file and logs in .kimi/."""

OFF_WORDS = frozenset({"off", "false", "no", "0", "none"})
"""Values that turn the history off (``--perf-history=off``)."""

FORMS = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "postgresql://user@host:port/dbname, or off"
)
"""What a history URL may look like: said by every error about one."""


class HistoryError(Exception):
    """The history cannot be opened, read or written: a one-line message that names the URL
    (password hidden) and what went wrong.  Defined here, beside the URLs, so that checking a
    URL raises it without importing SQLAlchemy; :mod:`pytest_kimi.history.store` re-exports it."""


_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")


def check_url(text: str) -> str | None:
    """``text`` as a history URL (stripped), or None for ``off``.

    Raises ``ValueError`` saying what is wrong and what to write instead; the message never
    holds the URL's password.
    """
    value = text.strip()
    if value.lower() in OFF_WORDS:
        return None
    if "://" not in value:
        raise ValueError(
            f"not a database URL; for a SQLite file write sqlite:///{value} (expected {FORMS})"
        )
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise ValueError(f"malformed URL ({exc}); expected {FORMS}") from None
    scheme = parts.scheme.lower()
    if scheme in _SQLITE_SCHEMES:
        if parts.netloc:
            raise ValueError(
                "a SQLite URL has no host: write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (three slashes, then the path)"
            )
        return value
    if scheme in _POSTGRES_SCHEMES:
        try:
            parts.port  # noqa: B018 -- urlsplit checks the port only when asked
        except ValueError:
            raise ValueError(
                f"the port of {display_url(value)} is not a number; expected {FORMS}"
            ) from None
        return value
    raise ValueError(
        f"unsupported database {parts.scheme or '(none)'!r}: the history is kept in SQLite or "
        f"PostgreSQL; expected {FORMS}"
    )


def sqlite_path(url: str) -> str | None:
    """The file path of a SQLite URL as SQLAlchemy reads it (``""`` for in-memory), or None
    when ``url`` is not SQLite."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in _SQLITE_SCHEMES:
        return None
    path = parts.path
    # sqlite:///rel -> path "/rel" -> "rel"; sqlite:////abs -> "//abs" -> "/abs"
    path = path[1:] if path.startswith("/") else path
    return "" if path == ":memory:" else path


def resolve_history_url(value: str | None, base: Path) -> str | None:
    """The history URL to open: None for ``off``; ``value`` None gives the default (a SQLite
    file ``base/.kimi/history.db``); a relative SQLite path is made absolute against ``base``.

    Raises :class:`HistoryError` for a malformed URL, saying what to write instead.
    """
    try:
        url = check_url(DEFAULT_URL if value is None else value)
    except ValueError as exc:
        raise HistoryError(f"history URL {display_url(str(value))}: {exc}") from None
    if url is None:
        return None
    path = sqlite_path(url)
    if not path or Path(path).is_absolute():
        return url
    return _sqlite_url(url, (base / path).as_posix())


def display_url(url: str, base: Path | None = None) -> str:
    """``url`` as it may be shown: the password hidden (``***``, as SQLAlchemy hides it), and
    a SQLite file under ``base`` written relative to it again (``sqlite:///.kimi/history.db``)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<malformed URL>"
    path = sqlite_path(url)
    if path is not None:
        if base is not None and path and Path(path).is_absolute():
            try:
                return _sqlite_url(url, Path(path).relative_to(base).as_posix())
            except ValueError:
                pass
        return url
    if password is not None:
        user, _, host = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}")
    return urlunsplit(parts)


def with_sqlite_path(url: str, path: str) -> str:
    """The SQLite ``url`` pointing at another file (``path``), its query kept: the history is
    built under a temporary name beside its file, then takes the file's name."""
    return _sqlite_url(url, path)


def _sqlite_url(url: str, path: str) -> str:
    """``url`` (SQLite) with its file path replaced by ``path``, query kept.  Written by hand:
    ``urlunsplit`` drops the empty host of ``sqlite:///``, and with it a slash."""
    parts = urlsplit(url)
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}:///{path}{query}"


def url_secrets(url: str | None) -> tuple[str, ...]:
    """The password in ``url`` as written and percent-decoded (as the driver sees it), if any:
    registered with the scrubber so that no text the plugin shows or writes (a driver's error
    message included) ever carries it."""
    if not url:
        return ()
    try:
        password = urlsplit(url).password
    except ValueError:
        return ()
    if not password:
        return ()
    return tuple(dict.fromkeys((password, unquote(password))))
