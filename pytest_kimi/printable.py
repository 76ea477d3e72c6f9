"""Server-supplied text made safe to print: control characters escaped, length capped.

A model id from ``/v1/models``, an HTTP error body, a reason that quotes either: whatever a
server sends ends up in the terminal summary and in the Markdown report.  Printed raw, an ESC
(CSI, OSC) sequence clears the screen or sets the window title, and a CR or BS overwrites what
was already printed, so a hostile endpoint could forge a line such as ``[kimi] C=1: 99999.0
tok/s`` under a genuine one.  :func:`printable` is the one function every such string goes
through before a human reads it: each C0 control (but the newline and tab where the caller
keeps them), DEL and each C1 control is written as a visible escape (``\\x1b``), as are the
Unicode controls that reorder or break text without being C0/C1 (bidirectional overrides and
isolates, which make a line read other than it is, and the line and paragraph separators, which
some terminals and renderers treat as newlines).  The escapes are Python's own spelling, so the
text shows what was sent, and a backslash the server sent stays one backslash: the escape is
for the eye, not a reversible encoding.

The cap keeps one string from filling a CI log: a 50 MB error body is shown as its head and a
note of how much was left out.

No imports from the package: every stage's sink (terminal, Markdown, the plugin's header) uses
it, so it lives at the bottom layer with :mod:`pytest_kimi.scrub`.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_LIMIT", "printable"]

DEFAULT_LIMIT = 1000
"""Characters of one string kept by default: a long reason or error line fits, a server's
whole error page does not."""

_BIDI_AND_SEPARATORS = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
"""The arabic letter mark, LRM/RLM, the line and paragraph separators, the embeddings and
overrides (LRE..RLO) and the isolates (LRI..PDI)."""

_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
"""C0 controls, DEL, C1 controls and the Unicode controls above."""

_UNSAFE_KEEP_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
"""The same, less the newline (``\\n``) and the tab: for text whose lines are meant."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, limit: int | None = DEFAULT_LIMIT, *, lines: bool = False) -> str:
    """``text`` (``str()`` of it) with every control character escaped, at most ``limit``
    characters long (None: no cap) plus a note of how many characters were left out.

    ``lines``: keep newlines and tabs (a multi-line error text, a whole Markdown document);
    by default they are escaped too, so a value meant for one line stays on one line and
    cannot start a line of its own.  The cap counts what is shown, escapes included, so a
    string of 10,000 ESC bytes is capped like one of 10,000 letters.
    """
    value = str(text)
    unsafe = _UNSAFE_KEEP_LINES if lines else _UNSAFE
    if limit is None:
        return unsafe.sub(lambda m: _escape(m.group()), value)
    if len(value) <= limit and unsafe.search(value) is None:
        return value
    out: list[str] = []
    size = 0
    for i, char in enumerate(value):
        piece = _escape(char) if unsafe.match(char) else char
        if size + len(piece) > limit:
            return "".join(out) + f"... ({len(value) - i} more characters)"
        out.append(piece)
        size += len(piece)
    return "".join(out)
