"""Secrets never leave the process: scrub them where server info, commands and logs enter.

A real SGLang (0.5.23, ``sglang/srt/entrypoints/http_server.py`` ``server_info``) answers
``/server_info`` with every server argument, ``api_key`` and ``admin_api_key`` included, and
with ``launch_command``, the launcher's argv joined by spaces, ``--api-key VALUE`` verbatim
(``sglang/srt/server_args.py``: only watermark secrets are redacted there).  Everything the
plugin stores or shows (baselines committed to git, JSON/Markdown/HTML/JUnit reports, the
terminal, server logs) would carry the key.  So the plugin scrubs

* mapping entries whose *name* says secret (``api_key``, ``hf_token``, ``*_secret``,
  ``*password*``, ``authorization``...), keeping ``None``/empty so a diff still shows
  whether a key was set at all;
* the value after a secret-named flag inside any command string or argv list
  (``--api-key X``, ``--api-key=X``, ``--hf-token X``);
* ``NAME=value`` pairs whose name says secret (``HF_TOKEN=...`` in a logged environment);
* credentials in URLs (``https://user:pass@host``, ``?token=...``) and ``Bearer`` tokens;
* literal values known to be secret: the API key the plugin itself sends, a profile's
  ``api-key`` argument, env values of a profile marked secret (:func:`register_secret`).

Each is replaced by :data:`REDACTED`, the marker SGLang itself uses for watermark keys, so a
provenance diff still says that a key was set, or that it changed from unset to set.

Name rules are deliberately word-based: SGLang has dozens of legitimate ``*_tokens`` /
``tokenizer_*`` arguments (``max_total_tokens``, ``tokenizer_path``) that a substring rule
``*token*`` would hide from the provenance diff.  A name is secret when one of its ``_``/``-``
separated words is a secret word (``token``, ``key`` as the last word, ``secret``,
``password``...), never for the plural ``tokens`` or for ``tokenizer``.

No pytest, no third-party imports: this runs at every edge, including child processes.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "REDACTED",
    "is_secret_name",
    "known_secrets",
    "register_secret",
    "scrub",
    "scrub_argv",
    "scrub_text",
]

REDACTED = "<redacted>"

_ALWAYS_SECRET_WORDS = frozenset(
    {
        "secret",
        "password",
        "passwd",
        "passphrase",
        "credential",
        "credentials",
        "apikey",
        "authorization",
        "bearer",
        "cookie",
        "privatekey",
    }
)
"""A name containing one of these words (``client_secret``, ``db_password``) is secret."""
_LAST_WORD_SECRET = frozenset({"key", "token", "auth"})
"""Secret only as the last word: ``api_key``, ``admin_api_key``, ``hf_token``,
``HF_TOKEN``; not ``token_aligner`` or ``enable_token_filter`` (SGLang config)."""
_NOT_SECRET_KEYS = frozenset(
    {
        # names ending in "key" that are configuration, not credentials
        "kv_cache_key",
        "routing_key",
        "prefix_key",
        "cache_key",
        "sort_key",
        "partition_key",
    }
)

_MIN_LITERAL = 4
"""Shorter registered values are not replaced as literals (``1`` would garble everything);
a name- or flag-based rule still catches them."""

_lock = threading.Lock()
_literals: set[str] = set()


def _words(name: str) -> list[str]:
    # camelCase to snake, then split on anything that is not a letter or digit
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", snake.lower()) if w]


def is_secret_name(name: str) -> bool:
    """Whether a field, flag or environment variable named ``name`` holds a secret."""
    words = _words(name)
    if not words:
        return False
    if "_".join(words) in _NOT_SECRET_KEYS:
        return False
    if any(w in _ALWAYS_SECRET_WORDS for w in words):
        return True
    return words[-1] in _LAST_WORD_SECRET


def register_secret(value: str | None) -> None:
    """Remember a value that must never be shown, wherever it turns up in text later.

    Process-wide on purpose: the API key given on the command line must be scrubbed from a
    server's error message as much as from its ``/server_info``, wherever that text goes.
    """
    if value and len(value) >= _MIN_LITERAL:
        with _lock:
            _literals.add(value)


def known_secrets() -> frozenset[str]:
    """The literal values registered so far (for a child process's environment, tests)."""
    with _lock:
        return frozenset(_literals)


_FLAG_WORD = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_VALUE = r"(?P<q>['\"])?(?P<value>(?(q)[^'\"\n]*|[^\s'\",;)\]}&]+))(?(q)(?P=q))"
_FLAG_VALUE = re.compile(
    r"(?P<flag>(?<![\w-])--?(?P<name>" + _FLAG_WORD + r"))(?P<sep>=|[ \t]+)" + _VALUE
)
_ENV_PAIR = re.compile(
    r"(?P<name>(?<![\w-])[A-Za-z_][A-Za-z0-9_-]*)(?P<nq>['\"]?)(?P<sep>\s*=\s*|(?<=['\"]):\s*|:[ \t]+)"
    + _VALUE
)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/\s@'\"]+)@")
_BEARER = re.compile(r"(?P<word>\b(?:Bearer|Basic|Token)\s+)(?P<value>[A-Za-z0-9._~+/=-]{4,})")
_KEY_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[baprs]-[A-Za-z0-9-]{10,})"
)
"""Values that are keys by their shape (OpenAI-style, Hugging Face, GitHub, Slack tokens)."""


def _flag_sub(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")) or m.group("value") == REDACTED:
        return m.group(0)
    q = m.group("q") or ""
    return f"{m.group('flag')}{m.group('sep')}{q}{REDACTED}{q}"


def _pair_sub(m: re.Match[str]) -> str:
    value = m.group("value")
    if (
        not is_secret_name(m.group("name"))
        or value in ("", "None", "null", "true", "false")
        or value.startswith("<")
        or value in ("Bearer", "Basic", "Token")
    ):
        return m.group(0)
    q = m.group("q") or ""
    return f"{m.group('name')}{m.group('nq')}{m.group('sep')}{q}{REDACTED}{q}"


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret this module can recognise replaced by :data:`REDACTED`.

    Idempotent; never raises.  ``secrets`` adds literal values for this call on top of the
    registered ones.
    """
    if not text:
        return text
    literals = sorted(
        {s for s in (*known_secrets(), *secrets) if s and len(s) >= _MIN_LITERAL},
        key=len,
        reverse=True,
    )
    for value in literals:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _BEARER.sub(lambda m: f"{m.group('word')}{REDACTED}", text)
    text = _FLAG_VALUE.sub(_flag_sub, text)
    text = _ENV_PAIR.sub(_pair_sub, text)
    return _KEY_SHAPES.sub(REDACTED, text)


def scrub_argv(words: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """An argv list with the value after (or in) each secret-named flag redacted."""
    out: list[str] = []
    hide_next = False
    for word in words:
        word = str(word)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if word.startswith("-") and not word.startswith("---"):
            name, eq, _ = word.lstrip("-").partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(word.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(word)
                    hide_next = True
                continue
        out.append(scrub_text(word, secrets))
    return out


def scrub(value: Any, secrets: Iterable[str] = (), *, _name: str | None = None) -> Any:
    """A deep copy of a JSON-like value with secrets redacted (see the module docstring).

    A mapping entry whose key is a secret name has a non-empty string value replaced by
    :data:`REDACTED`; ``None``, ``""``, booleans and numbers are kept (they say whether a
    key was set, and a key is never a number).  Lists of strings
    under a key such as ``argv``/``*command*`` are treated as argv.
    """
    secrets = tuple(secrets)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, sub in value.items():
            name = str(key)
            if is_secret_name(name) and isinstance(sub, str) and sub:
                out[key] = REDACTED
            elif is_secret_name(name) and isinstance(sub, (list, tuple)):
                out[key] = [REDACTED if isinstance(v, str) and v else v for v in sub]
            else:
                out[key] = scrub(sub, secrets, _name=name)
        return out
    if isinstance(value, (list, tuple)):
        if (
            value
            and all(isinstance(v, str) for v in value)
            and any(str(v).startswith("-") for v in value)
        ):
            return scrub_argv(value, secrets)
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        return scrub_text(value, secrets)
    return value
