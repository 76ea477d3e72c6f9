"""One streamed generation request -> one :class:`RequestRecord`.

Why the shape of this function matters: it runs once per request for the whole trial, so it
does nothing per read block except timestamp it and hand it to the parser, and it never
raises for anything the server (or its absence) can do: every failure becomes ``record.error``
so that a trial against a broken server still produces records and a clear verdict.
"""

from __future__ import annotations

import asyncio
import errno
import os
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Awaitable, Callable, Literal

import aiohttp
from aiohttp import StreamReader

from ..records import RequestRecord
from .sse import StreamParser

Api = Literal["chat", "completions"]

_SECRET_HEADERS = ("authorization", "api-key", "x-api-key", "proxy-authorization")

# --------------------------------------------------------------------------- block reads
# aiohttp's ``StreamReader.readany()`` drains its buffer one HTTP chunk at a time and calls
# ``protocol.resume_reading()`` (which re-feeds the parser and pokes the transport) for every
# chunk.  Servers behind uvicorn send one chunk per SSE event, so that is several Python calls
# per *token*: measured, it caps a client that does nothing else at ~250k tok/s on one core.
# ``drain()`` below does what ``readany()`` does, but takes all buffered chunks at once and
# runs the flow-control check once per block (~2.5x the ingest rate).  It touches aiohttp
# internals, so it is only used when they look exactly as expected (checked at import, and
# per response: ``EmptyStreamReader`` falls back) and can be switched off with
# ``PYTEST_KIMI_READANY=1``.
_DRAIN_ATTRS = (
    "_buffer", "_buffer_offset", "_size", "_cursor", "_eof", "_exception", "_http_chunk_splits",
    "_low_water", "_low_water_chunks", "_protocol", "_wait",
)


def _drain_supported() -> bool:
    if os.environ.get("PYTEST_KIMI_READANY"):
        return False
    slots = set(getattr(StreamReader, "__slots__", ()))
    return all(a in slots or hasattr(StreamReader, a) for a in _DRAIN_ATTRS)


FAST_DRAIN = _drain_supported()


async def drain(content: StreamReader) -> bytes:
    """Everything buffered in ``content`` as one block; waits if empty; ``b""`` at EOF.

    Same contract as ``StreamReader.readany()`` (exceptions, EOF, flow control), minus the
    per-chunk overhead.
    """
    exc = content._exception
    if exc is not None:
        raise exc
    buf = content._buffer
    while not buf and not content._eof:
        await content._wait("readany")
    if not buf:
        return b""
    if content._buffer_offset:
        buf[0] = buf[0][content._buffer_offset :]
        content._buffer_offset = 0
    data = buf.popleft() if len(buf) == 1 else b"".join(buf)
    buf.clear()
    n = len(data)
    content._size -= n
    cursor = content._cursor = content._cursor + n
    splits = content._http_chunk_splits
    if splits:
        last = splits[-1]
        splits.clear()
        if last >= cursor:
            splits.append(last)
    if content._size < content._low_water and (splits is None or len(splits) < content._low_water_chunks):
        content._protocol.resume_reading()
    return data


def block_reader(content: StreamReader) -> Callable[[], Awaitable[bytes]]:
    """The fastest safe "read whatever has arrived" for this response body."""
    if FAST_DRAIN and type(content) is StreamReader:
        return partial(drain, content)
    return content.readany


@dataclass(slots=True)
class Target:
    """Where to send generation requests.

    ``headers`` may carry an API key; it is excluded from ``repr`` and scrubbed from error
    texts so that it never reaches a log, report or assertion message.
    """

    url: str
    """Full generation URL, e.g. ``http://127.0.0.1:30000/v1/chat/completions``."""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    api: Api = "chat"

    def secrets(self) -> list[str]:
        """Header values that must never appear in output (the key and its bare token)."""
        out: list[str] = []
        for k, v in self.headers.items():
            if k.lower() in _SECRET_HEADERS and v:
                out.append(v)
                _, _, token = v.partition(" ")
                if len(token) >= 4:
                    out.append(token)
        return out


def redact(text: str, secrets: list[str]) -> str:
    for s in sorted(secrets, key=len, reverse=True):
        if s and s in text:
            text = text.replace(s, "***")
    return text


EOF_GRACE_S = 1.0
"""How long to wait after ``[DONE]`` for the end of the HTTP body (uvicorn writes the final
zero-length chunk separately).  Reading it lets the connection go back to the pool instead of
being closed, so a closed-loop trial does not open a new TCP connection per request."""


async def _finish_body(read: Callable[[], Awaitable[bytes]]) -> None:
    async def to_eof() -> None:
        while await read():
            pass

    try:
        await asyncio.wait_for(to_eof(), EOF_GRACE_S)
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
        pass  # the stream itself completed; the connection just is not reused


def silence_timeout(timeout_s: float) -> aiohttp.ClientTimeout:
    """Longest allowed *silence*: connecting, waiting for headers, and between reads.

    No total limit: a long generation that keeps streaming is legitimate.
    """
    return aiohttp.ClientTimeout(total=None, connect=None, sock_connect=timeout_s, sock_read=timeout_s)


def _fmt_s(x: float) -> str:
    return f"{x:g}"


async def stream_request(
    session: aiohttp.ClientSession,
    target: Target,
    body: bytes,
    *,
    index: int,
    worker: int,
    scheduled: float,
    timeout_s: float,
    timeout: aiohttp.ClientTimeout | None = None,
) -> RequestRecord:
    """Send ``body`` to ``target`` and read the SSE stream to its end.

    Never raises (except ``asyncio.CancelledError``); ``record.end`` is always set.
    ``timeout`` may be passed pre-built by a caller that sends many requests.
    """
    rec = RequestRecord(index=index, worker=worker, scheduled=scheduled)
    parser = StreamParser(rec, target.api)
    connected = False
    ctype = ""
    try:
        rec.sent = perf_counter()
        async with session.post(
            target.url, data=body, headers=target.headers, timeout=timeout or silence_timeout(timeout_s)
        ) as resp:
            connected = True
            rec.status = resp.status
            if resp.status != 200:
                raw = await resp.content.read(4096)
                text = raw.decode("utf-8", "replace").strip()[:200]
                rec.error = f"HTTP {resp.status}: {text}" if text else f"HTTP {resp.status} {resp.reason or ''}".rstrip()
            else:
                ctype = resp.headers.get("Content-Type", "")
                read = block_reader(resp.content)
                feed = parser.feed
                while True:
                    data = await read()
                    if not data:
                        break
                    feed(perf_counter(), data)
                    if parser.done or parser.failed:
                        break
                if parser.done and not resp.content.is_eof():
                    rec.end = perf_counter()
                    await _finish_body(read)
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
        where = "" if connected else f" (connecting to / waiting for headers from {target.url})"
        rec.error = f"stalled: no data for {_fmt_s(timeout_s)}s{where}"
    except aiohttp.ClientConnectorError as exc:
        err = exc.os_error
        if isinstance(err, ConnectionRefusedError) or getattr(err, "errno", None) == errno.ECONNREFUSED:
            reason = "connection refused"
        else:
            reason = (err.strerror if err is not None and err.strerror else None) or str(exc)
        rec.error = f"cannot connect to {target.url}: {reason} (server looks down)"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError, ConnectionError):
        # With a 200 stream this is reported below as a stream that ended without [DONE].
        if rec.status == 0:
            rec.error = f"connection to {target.url} dropped before a response (server crashed or closed it)"
        elif rec.status != 200 and rec.error is None:
            rec.error = f"HTTP {rec.status} (connection dropped while reading the error body)"
    except aiohttp.ClientError as exc:
        rec.error = f"client error: {type(exc).__name__}: {exc}"
    except Exception as exc:  # never let one request take the trial down
        rec.error = f"client error: {type(exc).__name__}: {exc}"
    finally:
        if not rec.end:
            rec.end = perf_counter()
    parser.close()
    if rec.error is None and rec.status == 200:
        if not parser.done:
            rec.error = f"stream ended without [DONE] after {parser.events} tokens"
            if ctype and "event-stream" not in ctype:
                rec.error += f" (Content-Type {ctype[:60]}, not an SSE stream)"
        elif parser.events == 0:
            rec.error = "200 response with no tokens"
    if rec.error is not None:
        secrets = target.secrets()
        if secrets:
            rec.error = redact(rec.error, secrets)
    return rec
