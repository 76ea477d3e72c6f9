"""A streaming "LLM server" that is never the bottleneck, for measuring client capacity.

Why not the simulator or aiohttp.web: to find the *client's* limit the server must produce
tokens far faster than any client can take them.  This is a raw asyncio Protocol that parses
just enough HTTP/1.1 (keep-alive, Content-Length bodies) and writes precomputed bytes:

* every SSE event is its own HTTP chunk (``<hex>\\r\\n data: {...}\\n\\n \\r\\n``), as uvicorn
  sends them for SGLang/vLLM, so the client pays the same per-chunk HTTP parsing it would
  against a real server;
* chunk payloads look like SGLang chat chunks (~250 bytes, ``"reasoning_content":null``
  and friends), cycling through a few token texts;
* events are written in large batches; with ``--rate``/``x_rate`` they are paced per stream.

Request body fields used: ``max_tokens`` (default 256), ``stream_options.
continuous_usage_stats`` (then every token chunk carries the usage so far, in SGLang 0.5.23's
shape and key order, as its ``serving_chat.py`` sends it: the client's running-usage path)
and the bench-only ``x_rate`` (tokens/s for this stream, 0 = as fast as the socket takes them)
and ``x_framing`` (``event`` or ``batch``: many SSE events per HTTP chunk).  Usage and
``[DONE]`` end every stream.

Run: ``python bench/firehose.py --port 8765`` (prints ``READY <port>`` when listening).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

WORDS = [
    " the",
    " of",
    " and",
    " to",
    " in",
    " is",
    " that",
    " for",
    " it",
    " as",
    " was",
    " with",
    " be",
    " by",
    " on",
    " not",
    " he",
    " this",
    " are",
    " or",
    " his",
    " from",
    " at",
    " which",
    " but",
    " have",
    " an",
    " had",
    " they",
    " you",
    " were",
    " their",
]
MODEL = "default"
CHUNK_ID = "6f1c2b9a4e7d4c0b"
BATCH = 64
"""Events per write() when unpaced: big enough that the server's Python work per token is
negligible, small enough to interleave many connections."""

HEADERS = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _chunk_obj(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "id": CHUNK_ID,
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
        ],
        "usage": None,
    }


EVENTS = [
    _sse(_chunk_obj({"role": None, "content": w, "reasoning_content": None, "tool_calls": None}))
    for w in WORDS
]
TOKENS = [_http_chunk(e) for e in EVENTS]
"""Precomputed HTTP chunks, one SSE token event each."""
ROLE = _http_chunk(
    _sse(
        _chunk_obj(
            {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}
        )
    )
)
_batch_cache: dict[tuple[int, int, bool], bytes] = {}


def batch(start: int, n: int, per_event: bool = True) -> bytes:
    """``n`` token events starting at word ``start``: one HTTP chunk per event (as uvicorn
    frames them) or, with ``per_event=False``, one HTTP chunk for all ``n``.  Cached: the hot
    path is one dict lookup."""
    key = (start % len(TOKENS), n, per_event)
    b = _batch_cache.get(key)
    if b is None:
        s = key[0]
        if per_event:
            b = b"".join(TOKENS[(s + i) % len(TOKENS)] for i in range(n))
        else:
            b = _http_chunk(b"".join(EVENTS[(s + i) % len(EVENTS)] for i in range(n)))
        if len(_batch_cache) < 4096:
            _batch_cache[key] = b
    return b


PROMPT_TOKENS = 32
_running_cache: dict[int, tuple[list[bytes], bytes, list[int]]] = {}


def running(total: int) -> tuple[list[bytes], bytes, list[int]]:
    """A ``total``-token stream whose every token chunk carries the usage so far: its SSE
    events, their HTTP chunks joined, and each event's offset in that join (one more at the
    end).  Built once per length, so a write is one slice, as cheap as the plain path."""
    got = _running_cache.get(total)
    if got is None:
        events = []
        for k in range(1, total + 1):
            obj = _chunk_obj(
                {
                    "role": None,
                    "content": WORDS[(k - 1) % len(WORDS)],
                    "reasoning_content": None,
                    "tool_calls": None,
                }
            )
            obj["usage"] = {
                "prompt_tokens": PROMPT_TOKENS,
                "total_tokens": PROMPT_TOKENS + k,
                "completion_tokens": k,
                "prompt_tokens_details": None,
                "reasoning_tokens": 0,
                "completion_tokens_details": None,
            }
            events.append(_sse(obj))
        chunks = [_http_chunk(e) for e in events]
        offsets = [0]
        for c in chunks:
            offsets.append(offsets[-1] + len(c))
        got = (events, b"".join(chunks), offsets)
        if len(_running_cache) < 64:
            _running_cache[total] = got
    return got


def tail(n_tokens: int, prompt_tokens: int = PROMPT_TOKENS) -> bytes:
    fin = _chunk_obj(
        {"role": None, "content": "", "reasoning_content": None, "tool_calls": None}, "length"
    )
    usage = {
        "id": CHUNK_ID,
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + n_tokens,
            "completion_tokens": n_tokens,
        },
    }
    return (
        _http_chunk(_sse(fin))
        + _http_chunk(_sse(usage))
        + _http_chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )


class Stream:
    """One response in progress on a connection."""

    __slots__ = ("proto", "left", "total", "pos", "rate", "credit", "per_event", "running")

    def __init__(
        self, proto: FirehoseProtocol, total: int, rate: float, per_event: bool, usage: bool
    ) -> None:
        self.proto = proto
        self.per_event = per_event
        self.running = running(total) if usage else None
        self.left = self.total = total
        self.pos = 0
        self.rate = rate
        self.credit = 0.0


class Pacer:
    """One ticker for all paced streams: per tick each gets rate*tick tokens of credit."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.streams: set[Stream] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._last = 0.0

    def add(self, s: Stream) -> None:
        self.streams.add(s)
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._last = loop.time()
            self._handle = loop.call_at(self._last + self.tick_s, self._tick)

    def _tick(self) -> None:
        # Credit by elapsed time (not by tick count) so a late tick still delivers exactly
        # the offered rate.
        loop = asyncio.get_running_loop()
        now = loop.time()
        dt, self._last = now - self._last, now
        done = []
        for s in self.streams:
            s.credit += s.rate * dt
            n = int(s.credit)
            if n:
                s.credit -= n
                if s.proto.emit(s, n):
                    done.append(s)
        for s in done:
            self.streams.discard(s)
        if self.streams:
            self._handle = loop.call_at(now + self.tick_s, self._tick)
        else:
            self._handle = None


class FirehoseProtocol(asyncio.Protocol):
    def __init__(self, pacer: Pacer, default_rate: float, default_framing: str) -> None:
        self.pacer = pacer
        self.default_rate = default_rate
        self.default_framing = default_framing
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self.stream: Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=1 << 18)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.pacer.streams.discard(self.stream)
        self.stream = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.stream is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            i = head.find(b"content-length:")
            if i >= 0:
                j = head.find(b"\r\n", i)
                length = int(head[i + 15 : j if j >= 0 else None])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.start(body)

    def start(self, body: bytes) -> None:
        try:
            req = json.loads(body) if body else {}
        except ValueError:
            req = {}
        n = int(req.get("max_tokens") or 256)
        rate = float(req.get("x_rate", self.default_rate) or 0.0)
        assert self.transport is not None
        self.transport.write(HEADERS + ROLE)
        framing = req.get("x_framing") or self.default_framing
        options = req.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("continuous_usage_stats"))
        s = self.stream = Stream(self, n, rate, framing != "batch", usage)
        if rate > 0:
            self.pacer.add(s)
        else:
            self.pump()

    def emit(self, s: Stream, n: int) -> bool:
        """Write up to ``n`` tokens of ``s``; True when the stream is finished."""
        if self.transport is None or self.stream is not s:
            return True
        n = min(n, s.left)
        if n and s.running is not None:
            events, joined, offsets = s.running
            if s.per_event:
                self.transport.write(joined[offsets[s.pos] : offsets[s.pos + n]])
            else:
                self.transport.write(_http_chunk(b"".join(events[s.pos : s.pos + n])))
            s.pos += n
            s.left -= n
        elif n:
            self.transport.write(batch(s.pos, n, s.per_event))
            s.pos += n
            s.left -= n
        if s.left == 0:
            self.transport.write(tail(s.total))
            self.stream = None
            if self.buf:  # a pipelined request already arrived
                self.data_received(b"")
            return True
        return False

    def pump(self) -> None:
        s = self.stream
        while s is not None and s.rate <= 0 and not self.paused:
            if self.emit(s, BATCH):
                return

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()


async def serve(host: str, port: int, rate: float, tick_s: float, framing: str = "event") -> None:
    loop = asyncio.get_running_loop()
    pacer = Pacer(tick_s)
    server = await loop.create_server(
        lambda: FirehoseProtocol(pacer, rate, framing), host, port, backlog=4096, reuse_address=True
    )
    actual = server.sockets[0].getsockname()[1]
    print(f"READY {actual}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765, help="0 = any free port (printed)")
    ap.add_argument(
        "--rate", type=float, default=0.0, help="default tokens/s per stream (0 = unpaced)"
    )
    ap.add_argument("--tick", type=float, default=0.005, help="pacing tick in seconds")
    ap.add_argument(
        "--framing",
        choices=["event", "batch"],
        default="event",
        help="event: one HTTP chunk per SSE event (uvicorn); batch: one per write",
    )
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    args = ap.parse_args(argv)
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    asyncio.run(serve(args.host, args.port, args.rate, args.tick, args.framing))


if __name__ == "__main__":
    sys.exit(main())
