"""Hostile text: a server whose strings carry terminal control sequences (and secrets).

What a hostile endpoint did to the terminal before :mod:`pytest_kimi.printable`: its model id
from ``/v1/models`` and its HTTP error bodies were printed raw, so an ESC ``[2J`` cleared the
screen, an OSC set the window title, and a CR or BS followed by ``[kimi] C=1: 99999.0 tok/s``
forged a progress line under (or over) the genuine ones; ``--perf-markdown`` kept the raw bytes.
A model id carrying userinfo or ``token=`` was redacted in the JSON but shown in clear in the
terminal's header.

:class:`HostileTextServer` is :class:`support.hostile.HostileServer` (its routes, lifecycle and
request log) with the model id it announces of its own choosing, and this module adds two
generation modes to :data:`support.hostile.MODES`: ``escape_error`` (every generation request
answered HTTP 500 with :data:`ESCAPES` as its body) and ``escape_error_json`` (the same text as
an OpenAI-style JSON error's message).  Discovery modes: ``escape_models`` (``/v1/models``
answers HTTP 500 with :data:`ESCAPES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from support.hostile import DISCOVERY_MODES, MODEL, MODES, HostileServer

FORGED = "[kimi] C=1: 99999.0 tok/s (median of 3 trials), 15 requests, 0 failed, 1.0 s"
"""The progress line a hostile server forged: what a genuine level's end looks like."""

ESCAPES = (
    "\x1b[2J\x1b[H"  # CSI: clear the screen, cursor home
    "\x1b]0;pwned by the endpoint\x07"  # OSC: the window's title (BEL-terminated)
    "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\"  # OSC 8: a hyperlink
    "\x9b31m"  # a C1 CSI (one byte), red
    "\rbs\x08\x08"  # CR and BS: overwrite what was printed
    "\x7f\x00\x0b\x0c"  # DEL, NUL, VT, FF
    "\u202eevil\u202c"  # a right-to-left override
    f"\n{FORGED}\r\n{FORGED}"  # a forged line of its own
)
"""Control sequences of every kind a terminal or a Markdown viewer acts on, and forged lines."""

ESCAPE_MODEL = "kimi" + ESCAPES
"""The model id ``/v1/models`` announces in the escape cases."""

SECRET_MODEL = "https://deploy:hunter2pass@models.internal/kimi-k2.6?token=tok-abcdef0123456789"
"""A model id with userinfo and a ``token=`` parameter: the JSON redacts both."""

SECRET_PARTS = ("hunter2pass", "tok-abcdef0123456789")
"""What of :data:`SECRET_MODEL` must never be shown."""


def unsafe_characters(text: str) -> list[str]:
    """The control characters in ``text`` a terminal or a viewer could act on: every C0 control
    but the newline and the tab, DEL, every C1 control, the bidirectional overrides and the
    Unicode line separators (``repr`` of each, for a readable failure)."""
    bad = []
    for char in text:
        code = ord(char)
        if char in "\n\t":
            continue
        if (
            code < 0x20
            or 0x7F <= code <= 0x9F
            or 0x202A <= code <= 0x202E
            or 0x2066 <= code <= 0x2069
            or char in "\u2028\u2029\u200e\u200f\u061c"
        ):
            bad.append(repr(char))
    return bad


async def _escape_error(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """HTTP 500 whose plain-text body is :data:`ESCAPES`."""
    return web.Response(status=500, text=ESCAPES, content_type="text/plain")


async def _escape_error_json(
    server: HostileServer, request: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """HTTP 500 whose JSON error message is :data:`ESCAPES` (what an OpenAI server sends)."""
    return web.json_response(
        {"error": {"message": ESCAPES, "type": "internal_error", "code": 500}}, status=500
    )


MODES.setdefault("escape_error", _escape_error)
MODES.setdefault("escape_error_json", _escape_error_json)
DISCOVERY_MODES.add("escape_models")


@dataclass
class HostileTextServer(HostileServer):
    """:class:`~support.hostile.HostileServer` whose ``/v1/models`` announces ``model_id``
    (or, in mode ``escape_models``, answers HTTP 500 with :data:`ESCAPES`)."""

    model_id: str = MODEL

    def _app(self) -> web.Application:
        app = super()._app()

        @web.middleware
        async def models(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            if request.path != "/v1/models":
                return await handler(request)
            if self.mode == "escape_models":
                return web.Response(status=500, text=ESCAPES, content_type="text/plain")
            return web.json_response(
                {"object": "list", "data": [{"id": self.model_id, "object": "model"}]}
            )

        app.middlewares.append(models)  # after the base's, which records the request
        return app
