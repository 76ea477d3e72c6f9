"""Bounded reads of what a server answers: a byte cap on every body, a depth cap on its JSON.

Why: the plugin asks the server under test about itself (``/v1/models``, ``/server_info``,
``/get_server_info``, ``/version``, ``/metrics``) before and during a run, and such a server
may be broken, misconfigured or hostile.  Read whole, a 200 MB answer held the run silent
until it was killed (docs/evidence/engines.md, "Observed on real servers"); parsed whole, a
``/server_info`` nested a few thousand
levels deep ended the run in a raw ``RecursionError`` (``json`` recurses per level, and so
does every walk over ``server_info`` after it).  So every such GET reads its body in blocks
and gives up as soon as it passes a cap (one announced by ``Content-Length`` is refused
before a byte is read), and JSON is checked for depth *before* it is parsed, with one linear
scan that neither recurses nor backtracks.  What fails either check is "not JSON" (or "too
large") with a reason that names the check, never the content.

Both are shared: :func:`read_body_capped` by discovery and the Prometheus readers
(``crosscheck/metrics_page.py``), :func:`read_stream_capped` and :func:`loads_bounded` by
the launcher's synchronous probes too.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the launcher's synchronous probes use this module without aiohttp
    import aiohttp

__all__ = [
    "DISCOVERY_MAX_BYTES",
    "JSON_MAX_DEPTH",
    "BodyTooLarge",
    "NotJSON",
    "json_too_deep",
    "loads_bounded",
    "read_body_capped",
    "read_stream_capped",
]

DISCOVERY_MAX_BYTES = 8 * 2**20
"""Largest discovery answer read (``/v1/models``, ``/server_info``, ``/version``; after
decompression).  SGLang 0.5.23's ``/server_info`` is about 20 kB, a model list a few hundred
bytes (a gateway's list of every model it routes, descriptions included, well under 1 MB): 8 MB
is far above any of them and is read on loopback in milliseconds."""

JSON_MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a server's JSON.  SGLang's
``/server_info`` nests five levels (``internal_states[i].memory_usage...``); 64 leaves room for
any real configuration while every recursive walk after parsing (the allow-list, the
scrubber, ``json.dumps`` into reports) stays far inside Python's recursion limit."""

BLOCK_BYTES = 2**16
"""Size of each block read off the socket: the cap is checked after each."""


class BodyTooLarge(Exception):
    """A body past its cap: it was not read to its end (``announced``: the ``Content-Length``
    that refused it before any byte was read, None when it was counted as it came)."""

    def __init__(self, limit: int, announced: int | None = None) -> None:
        self.limit = limit
        self.announced = announced
        size = f"announced {announced} bytes" if announced is not None else "sent more"
        super().__init__(f"{size}, over the cap of {limit / 2**20:g} MB")


class NotJSON(ValueError):
    """The text is not JSON the plugin accepts; ``reason`` says which check failed (never
    the text itself: it is the server's, and it may be anything)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


async def read_body_capped(
    resp: aiohttp.ClientResponse, limit: int, *, truncate: bool = False
) -> bytes:
    """The response's body, read in blocks and given up on as soon as it passes ``limit``
    bytes (:class:`BodyTooLarge`); a size the server announces is refused before a byte is
    read.  With ``truncate`` the first ``limit`` bytes are returned instead (an error
    page's head is all a message needs, however long the page)."""
    announced = resp.content_length
    if not truncate and announced is not None and announced > limit:
        raise BodyTooLarge(limit, announced)
    blocks: list[bytes] = []
    size = 0
    async for block in resp.content.iter_chunked(BLOCK_BYTES):
        size += len(block)
        if size > limit:
            if truncate:
                blocks.append(block[: len(block) - (size - limit)])
                break
            raise BodyTooLarge(limit)
        blocks.append(block)
    return b"".join(blocks)


class _Readable(Protocol):
    def read(self, n: int = ..., /) -> bytes: ...


def read_stream_capped(stream: _Readable, limit: int) -> bytes:
    """:func:`read_body_capped` for a synchronous file-like body (urllib's response):
    ``limit`` bytes at most, :class:`BodyTooLarge` when there is more."""
    blocks: list[bytes] = []
    size = 0
    while True:
        block = stream.read(min(BLOCK_BYTES, limit + 1 - size))
        if not block:
            return b"".join(blocks)
        size += len(block)
        if size > limit:
            raise BodyTooLarge(limit)
        blocks.append(block)


_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[{]|[\]}]')
"""A JSON string (its closing quote optional, so an unterminated one is one token to the end,
not a rescan from every later quote) or a bracket: strings are skipped whole, so brackets
inside them do not count.  Unrolled-loop form: linear, no backtracking."""


def json_too_deep(text: str, max_depth: int = JSON_MAX_DEPTH) -> bool:
    """Whether ``text`` opens more than ``max_depth`` arrays or objects inside each other.

    One pass, stopping at the first level past the cap (a hostile ``[[[[...`` costs
    ``max_depth`` steps, not its length); valid or not, the text is not parsed here."""
    depth = 0
    for m in _TOKEN.finditer(text):
        c = text[m.start()]
        if c == "[" or c == "{":
            depth += 1
            if depth > max_depth:
                return True
        elif c == "]" or c == "}":
            depth -= 1
    return False


def loads_bounded(data: bytes | str, max_depth: int = JSON_MAX_DEPTH) -> Any:
    """``json.loads`` for a server's answer: bytes decoded as UTF-8 (bad bytes replaced),
    nesting checked before parsing; :class:`NotJSON` with the reason otherwise (the parser's
    own message with its position, "empty", "nested deeper than N levels", a number too long
    for Python's int conversion...), never a ``RecursionError`` or a raw ``ValueError``."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    if not text.strip():
        raise NotJSON("the body is empty")
    if json_too_deep(text, max_depth):
        raise NotJSON(f"nested deeper than {max_depth} levels (JSON_MAX_DEPTH)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        looks = " (it looks like HTML or XML)" if text.lstrip()[:1] == "<" else ""
        raise NotJSON(f"{exc.msg} at line {exc.lineno} column {exc.colno}{looks}") from None
    except (ValueError, RecursionError) as exc:
        # a number past sys.get_int_max_str_digits(), or a recursion the scan let through
        raise NotJSON(f"{type(exc).__name__}: {str(exc)[:160]}") from None
