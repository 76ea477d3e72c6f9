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
from typing import Awaitable, Callable, Mapping
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp
from aiohttp import StreamReader

from pytest_kimi.load.records import Api, RequestRecord
from pytest_kimi.load.sse import StreamParser
from pytest_kimi.load.sse_usage import body_max_tokens


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
    "_buffer",
    "_buffer_offset",
    "_size",
    "_cursor",
    "_eof",
    "_exception",
    "_http_chunk_splits",
    "_low_water",
    "_low_water_chunks",
    "_protocol",
    "_wait",
)


def _drain_supported() -> bool:
    if os.environ.get("PYTEST_KIMI_READANY"):
        return False
    slots = set(getattr(StreamReader, "__slots__", ()))
    return all(a in slots or hasattr(StreamReader, a) for a in _DRAIN_ATTRS)


FAST_DRAIN = _drain_supported()


def take(content: StreamReader) -> bytes:
    """Everything buffered in ``content`` (non-empty) as one block, with ``readany()``'s
    bookkeeping done once for the block instead of once per HTTP chunk."""
    buf = content._buffer
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
    proto = content._protocol
    # readany() calls resume_reading() for every chunk, which re-feeds the parser and pokes
    # the transport even when nothing was paused; only a paused reader needs it.
    if (
        getattr(proto, "_reading_paused", True)
        and content._size < content._low_water
        and (splits is None or len(splits) < content._low_water_chunks)
    ):
        proto.resume_reading()
    return data


async def drain(content: StreamReader) -> bytes:
    """Everything buffered in ``content`` as one block; waits if empty; ``b""`` at EOF.

    Same contract as ``StreamReader.readany()`` (exceptions, EOF, flow control), minus the
    per-chunk overhead.
    """
    while True:
        exc = content._exception
        if exc is not None:
            raise exc
        if content._buffer:
            return take(content)
        if content._eof:
            return b""
        await content._wait("readany")


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

    def __post_init__(self) -> None:
        # Ask for the stream uncompressed: a compressed stream is buffered by its compressor
        # (and by proxies that compress), so tokens arrive in lumps and inter-token latency
        # cannot be measured.  aiohttp otherwise offers gzip/deflate/br on every request.  A
        # server (or proxy) that compresses anyway is caught by its reads (metrics: buffered).
        if not any(k.lower() == "accept-encoding" for k in self.headers):
            self.headers = {**self.headers, "Accept-Encoding": "identity"}

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


async def _read_with(read: Callable[[], Awaitable[bytes]], parser: StreamParser) -> None:
    feed = parser.feed
    while True:
        data = await read()
        if not data:
            return
        feed(perf_counter(), data)
        if parser.done or parser.failed:
            return


class _SilenceWatchdog:
    """Stall detection for the body without aiohttp's per-read timer.

    aiohttp's ``sock_read`` cancels and re-arms a timer on every socket read (~10% of the
    client's per-read cost when each token is its own read).  Once the headers are in, this
    turns it off for the response and polls ``content.total_bytes`` every ``timeout_s / 4``
    instead; no new bytes for ``timeout_s`` (detected within 1.25x) fails the read exactly as
    aiohttp would, with ``ServerTimeoutError``.  Connection setup and the wait for headers keep
    aiohttp's own timeouts.  If the protocol does not look as expected, aiohttp's timer stays.
    """

    __slots__ = ("content", "timeout_s", "period", "seen", "last", "handle", "loop")

    def __init__(self, content: StreamReader, timeout_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.content = content
        self.timeout_s = timeout_s
        self.period = timeout_s / 4
        self.seen = content.total_bytes
        self.last = self.loop.time()
        self.handle: asyncio.TimerHandle | None = self.loop.call_later(self.period, self._check)

    @classmethod
    def start(cls, resp: aiohttp.ClientResponse, timeout_s: float) -> _SilenceWatchdog | None:
        conn = resp.connection
        proto = getattr(conn, "protocol", None)
        if (
            proto is None
            or not hasattr(type(proto), "read_timeout")
            or not hasattr(resp.content, "total_bytes")
        ):
            return None
        proto.read_timeout = (
            None  # takes effect at the next read; until then aiohttp's timer stands
        )
        return cls(resp.content, timeout_s)

    def _check(self) -> None:
        now = self.loop.time()
        tb = self.content.total_bytes
        if tb != self.seen:
            self.seen, self.last = tb, now
        elif now - self.last >= self.timeout_s:
            self.handle = None
            self.content.set_exception(
                aiohttp.ServerTimeoutError("no data for the silence timeout")
            )
            return
        self.handle = self.loop.call_later(self.period, self._check)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


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
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=timeout_s, sock_read=timeout_s
    )


def _fmt_s(x: float) -> str:
    return f"{x:g}"


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def http_error_message(
    status: int, reason: str | None, headers: Mapping[str, str], body: str, url: str
) -> str:
    """The error text of a non-200 answer to a generation request.

    A redirect is not followed (``allow_redirects=False``): following it would measure
    whatever server answers at its target, and a 302/303 turns the POST into a GET (the
    tester saw an unexplained ``HTTP 405``); the text names the target.  A 429 names its
    ``Retry-After``, which says how long the server wants the client to wait.
    """
    text = f"HTTP {status}: {body}" if body else f"HTTP {status} {reason or ''}".rstrip()
    if 300 <= status < 400:
        location = headers.get("Location")
        target = _without_userinfo(urljoin(url, location))[:200] if location else "(no Location)"
        return (
            f"HTTP {status} redirect to {target}: redirects are not followed (the server "
            "there would be measured instead); point --endpoint at the final URL"
        )
    if status == 429:
        after = headers.get("Retry-After")
        wait = f"Retry-After: {after.strip()[:40]}" if after else "no Retry-After"
        return (
            f"HTTP 429 ({wait}): {body or 'too many requests'}: the server rate-limits the "
            "benchmark; lift its limit for this client (or lower the load)"
        )
    return text


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
    record: RequestRecord | None = None,
) -> RequestRecord:
    """Send ``body`` to ``target`` and read the SSE stream to its end.

    Never raises (except ``asyncio.CancelledError``); ``record.end`` is always set.
    ``timeout`` may be passed pre-built by a caller that sends many requests; ``record`` lets
    the caller see the request while it streams (progress display).
    """
    rec = (
        record
        if record is not None
        else RequestRecord(index=index, worker=worker, scheduled=scheduled)
    )
    # the request's own limit (a stationary opener's staggered one is in its body too)
    rec.token_limit = rec.max_tokens or body_max_tokens(body)
    parser = StreamParser(rec, target.api, rec.token_limit)
    connected = False
    ctype = ""
    try:
        rec.sent = perf_counter()
        async with session.post(
            target.url,
            data=body,
            headers=target.headers,
            timeout=timeout or silence_timeout(timeout_s),
            allow_redirects=False,
        ) as resp:
            connected = True
            rec.status = resp.status
            if resp.status != 200:
                raw = await resp.content.read(4096)
                text = raw.decode("utf-8", "replace").strip()[:200]
                rec.error = http_error_message(
                    resp.status, resp.reason, resp.headers, text, target.url
                )
            else:
                ctype = resp.headers.get("Content-Type", "")
                content = resp.content
                watchdog = _SilenceWatchdog.start(resp, timeout_s)
                try:
                    if FAST_DRAIN and type(content) is StreamReader:
                        # drain() inlined: one coroutine frame less per read
                        feed = parser.feed
                        wait = content._wait
                        while True:
                            exc = content._exception
                            if exc is not None:
                                raise exc
                            if content._buffer:
                                feed(perf_counter(), take(content))
                                if parser.done or parser.failed:
                                    break
                            elif content._eof:
                                break
                            else:
                                await wait("readany")
                    else:
                        await _read_with(content.readany, parser)
                    if parser.failed:
                        # a stream past its bounds (max_tokens, event size) or broken: close
                        # it now rather than read on (the connection is not reused)
                        resp.close()
                    elif parser.done and not content.is_eof():
                        rec.end = perf_counter()
                        await _finish_body(block_reader(content))
                finally:
                    if watchdog is not None:
                        watchdog.cancel()
                    # once a stream, also when the time box cancels it: the body's size
                    # against its token events tells a flood (metrics.FLOOD_BYTES_PER_EVENT)
                    rec.body_bytes = getattr(content, "total_bytes", 0)
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
        where = "" if connected else f" (connecting to / waiting for headers from {target.url})"
        rec.error = f"stalled: no data for {_fmt_s(timeout_s)}s{where}"
    except aiohttp.ClientConnectorError as exc:
        err = exc.os_error
        if (
            isinstance(err, ConnectionRefusedError)
            or getattr(err, "errno", None) == errno.ECONNREFUSED
        ):
            reason = "connection refused"
        else:
            reason = (err.strerror if err is not None and err.strerror else None) or str(exc)
        rec.error = f"cannot connect to {target.url}: {reason} (server looks down)"
    except (
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientOSError,
        ConnectionError,
    ):
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
        elif parser.events == 0 and rec.completion_tokens == 0:
            # Tokens the server's usage counts but whose text it never sent (a byte-level
            # model's partial UTF-8, held back by the detokenizer) are no failure: the record
            # adds those tokens, and no first token.
            rec.error = "200 response with no tokens"
    if rec.error is not None:
        secrets = target.secrets()
        if secrets:
            rec.error = redact(rec.error, secrets)
    return rec
