"""The byte patterns the SSE parser counts with: per API and JSON style, and the envelope by
which a finishing token event is longer than an ordinary one.

Stands on its own because the patterns are data, built once at import: in valid JSON a ``"``
inside a string is escaped, so each can only come from the JSON structure, never from token
text (:mod:`pytest_kimi.load.sse` says why that makes counting sound).
"""

from __future__ import annotations

import re

_CHAT_FIELDS = ("content", "reasoning_content", "reasoning")
_COMPLETION_FIELDS = ("text",)


_OPEN_FINISH_VALUES = re.compile(rb'"(finish_reason|matched_stop)":\s*("[^"\\]*"|-?\d+)')


def _finish_envelope_extra(payload: bytes) -> int:
    """Bytes by which a token event that finishes is longer than an ordinary one, whose
    ``finish_reason`` and ``matched_stop`` are ``null``: their values' lengths less 4 each
    (``"length"``: 4 more; a stop token id such as ``163586``: 2 more)."""
    return sum(max(0, len(m[2]) - 4) for m in _OPEN_FINISH_VALUES.finditer(payload))


class _Patterns:
    """Byte patterns for one JSON style (compact ``"k":"v"`` or spaced ``"k": "v"``)."""

    __slots__ = ("kinds", "first", "first_empty", "finish")

    def __init__(self, fields: tuple[str, ...], sep: str) -> None:
        self.kinds: tuple[tuple[bytes, bytes], ...] = tuple(
            (f'"{f}":{sep}"'.encode(), f'"{f}":{sep}""'.encode()) for f in fields
        )
        self.first, self.first_empty = self.kinds[0]
        self.finish = f'"finish_reason":{sep}"'.encode()


_STYLES = {
    api: (_Patterns(fields, ""), _Patterns(fields, " "))
    for api, fields in (("chat", _CHAT_FIELDS), ("completions", _COMPLETION_FIELDS))
}
"""Pattern sets per API, built once: compact JSON first (vLLM, SGLang, llama.cpp, TGI), the
spaced ``json.dumps`` default second (switched to when a decoded event shows it)."""
