"""Secrets never leave the process: scrub them where server info, commands and logs enter.

One module above 700 lines on purpose: the names, the shapes and the registered secrets are
one policy applied in one pass, and a secret that one half knew and the other did not would
leak through the gap; it depends on nothing of the package, so every stage can use it.

A real SGLang (0.5.23, ``sglang/srt/entrypoints/http_server.py`` ``server_info``) answers
``/server_info`` with every server argument, ``api_key`` and ``admin_api_key`` included, and
with ``launch_command``, the launcher's argv joined by spaces, ``--api-key VALUE`` verbatim
(``sglang/srt/server_args.py``: only watermark secrets are redacted there).  A server behind a
proxy, or one a deployment tool wraps, reports whatever else it was given: PEM keys, webhook
URLs, signed storage URLs, tokens per provider.  Server info enters through an allow-list
(:mod:`pytest_kimi.endpoint.serverinfo`); this module is the second line, applied to
everything that reaches a sink (baselines committed to git, JSON/Markdown/HTML/JUnit reports,
the history database and its dashboard, the terminal, server logs).  It scrubs by *name* and,
because a deny-list of names cannot win that race, by *shape*:

* by name: mapping entries, flags (``--api-key X``), ``NAME=value`` pairs and JSON-ish
  ``"name": value`` text whose name says secret (:func:`is_secret_name`: ``api_key``,
  ``apiKeys``, ``access_tokens``, ``GITHUB_PAT``, ``private_key_pem``, ``tokens``,
  ``webhook_url``, ``client_secret``...).  A secret-named mapping or list loses every string
  in its whole subtree (``tokens: {openai: ...}``); ``None``, ``""``, booleans and numbers are
  kept, so a diff still shows whether a key was set at all, and a count is never a secret;
* by shape, in every string: PEM blocks (and bare DER bodies, ``MII...``), JWTs
  (``eyJ...``.``...``.``...``), signed-URL parameters (``sig=``, ``signature=``,
  ``X-Amz-Signature=``, ``X-Goog-Signature=``, ``token=``, ``access_token=``, ``code=``...),
  webhook URLs (Slack, Discord, Teams, Zapier, Telegram bots, any ``/webhook`` path),
  userinfo in URLs (``https://user:pass@host``), ``Bearer``/``Basic`` credentials, and
  well-known key prefixes (``sk-``, ``ghp_``, ``github_pat_``, ``xoxb-``, ``AKIA...``,
  ``hf_``, ``glpat-``, ``AIza``...);
* inside base64: a run of 20 or more base64 characters (either alphabet, two layers deep) is
  decoded, and redacted whole when what it decodes to holds anything the rules above redact
  (a base64-wrapped ``sk-...`` in an allow-listed ``revision`` reached baselines and the
  history before);
* literal values known to be secret: the API key the plugin itself sends, a profile's
  ``api-key`` argument, env values of a profile marked secret (:func:`register_secret`).

Each is replaced by :data:`REDACTED`, the marker SGLang itself uses for watermark keys, so a
provenance diff still says that a key was set, or that it changed from unset to set.

Name rules are word-based: SGLang has dozens of legitimate ``*_tokens`` / ``tokenizer_*`` /
``*_token_*`` arguments (``max_total_tokens``, ``tokenizer_path``, ``stop_token_ids``,
``speculative_num_draft_tokens``) that a substring rule ``*token*`` would hide from the
provenance diff.  A name is split into words (``_``, ``-``, ``.``, camelCase, digits), neutral
trailing words are set aside (``_value``, ``_b64``, ``_2``, ``_v1``), and it is secret when a
word is always secret (``secret``, ``password``, ``webhook``...), or its last word is a
credential noun (``key``/``keys`` unless configuration such as ``cache_key``, ``token``,
``pat``, ``pem``, ``sig``...), or it is ``tokens`` qualified as credentials (``tokens``,
``access_tokens``, ``hf_tokens``), never ``max_total_tokens``.

Value rules in text keep ordinary words: after a secret name, a flag or ``Bearer``, a value
that is a closed-class word or a word for a value's state (``not``, ``is``, ``missing``,
``required``, ``expired``: :data:`_ORDINARY_WORDS`) is prose about a secret, not one
(``passwd: not valid JSON`` was turned into ``passwd: <redacted> valid JSON``).

No pytest, no third-party imports, no imports from the package: this file runs at every edge,
including the server supervisor, which loads it by path.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

__all__ = [
    "REDACTED",
    "is_secret_flag",
    "is_secret_name",
    "known_secrets",
    "register_secret",
    "scrub",
    "scrub_argv",
    "scrub_text",
]

REDACTED = "<redacted>"

# ------------------------------------------------------------------------------- names

_ALWAYS_SECRET_WORDS = frozenset(
    {
        "secret",
        "secrets",
        "password",
        "passwords",
        "passwd",
        "passphrase",
        "credential",
        "credentials",
        "apikey",
        "apikeys",
        "apitoken",
        "apitokens",
        "accesskey",
        "accesstoken",
        "accesstokens",
        "authtoken",
        "authkey",
        "refreshtoken",
        "idtoken",
        "secretkey",
        "privatekey",
        "privkey",
        "authorization",
        "bearer",
        "cookie",
        "cookies",
        "webhook",
        "webhooks",
        "jwt",
        "dsn",
    }
)
"""A name holding one of these words anywhere (``client_secret``, ``db_password``,
``slack_webhook_url``, ``SENTRY_DSN``) is secret."""
_LAST_WORD_SECRET = frozenset(
    {
        "key",
        "keys",
        "token",
        "auth",
        "oauth",
        "pat",
        "pats",
        "pem",
        "pems",
        "sig",
        "signature",
        "sas",
    }
)
"""Secret as the last word (after neutral suffixes): ``api_key``, ``apiKeys``, ``hf_token``,
``GITHUB_PAT``, ``private_key_pem``; not ``token_aligner`` or ``enable_token_filter``."""
_COMPOUND_SUFFIXES = ("apikey", "secretkey", "accesskey", "privatekey", "token", "secret", "pat")
"""A single glued word ending so (``OPENAIAPIKEY``, ``MYTOKEN``, ``GHPAT``) is secret."""
_NOT_SECRET_KEY_QUALIFIERS = frozenset(
    {
        "cache",
        "sort",
        "routing",
        "prefix",
        "partition",
        "primary",
        "foreign",
        "shard",
        "sharding",
        "hash",
        "lookup",
        "group",
        "index",
        "row",
        "column",
        "dict",
        "json",
        "metric",
        "metrics",
        "label",
        "labels",
        "lora",
        "adapter",
        "level",
        "capacity",
        "series",
        "baseline",
        "workload",
    }
)
"""``key``/``keys`` after one of these words names configuration (``kv_cache_key``,
``routing_key``, ``sort_keys``) or the plugin's own records (``level_key``,
``capacity_key``), not a credential."""
_CREDENTIAL_QUALIFIERS = frozenset(
    {
        "access",
        "api",
        "auth",
        "bearer",
        "refresh",
        "id",
        "session",
        "oauth",
        "personal",
        "secret",
        "client",
        "bot",
        "app",
        "user",
        "service",
        "deploy",
        "admin",
        "github",
        "gh",
        "gitlab",
        "hf",
        "huggingface",
        "openai",
        "anthropic",
        "slack",
        "discord",
        "jwt",
        "csrf",
        "xsrf",
        "sas",
        "aws",
        "azure",
        "gcp",
        "provider",
        "providers",
    }
)
"""``tokens`` (plural) is secret alone or after one of these words (``access_tokens``,
``hf_tokens``); after any other (``max_total_tokens``, ``num_draft_tokens``) it is a count."""
_NEUTRAL_SUFFIXES = frozenset(
    {
        "value",
        "values",
        "b64",
        "base64",
        "hex",
        "raw",
        "str",
        "string",
        "text",
        "data",
        "enc",
        "encoded",
        "plain",
        "plaintext",
        "old",
        "new",
        "prev",
        "next",
        "current",
        "primary",
        "secondary",
        "list",
        "map",
        "dict",
        "set",
    }
)
"""Trailing words that say how a value is held, not what it is: ``api_key_value``,
``hf_token_b64``, ``api_keys_list`` are as secret as ``api_key``."""

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_VERSIONISH = re.compile(r"^(?:v?[0-9]+|v)$")


def _words(name: str) -> list[str]:
    # camelCase to snake, then split on anything that is not a letter or digit
    snake = _CAMEL.sub("_", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", snake.lower()) if w]


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str) -> bool:
    """Whether a field, flag or environment variable named ``name`` holds a secret.

    Cached: a report repeats the same few hundred names thousands of times."""
    raw = _words(name)
    words = [w.rstrip("0123456789") or w for w in raw]  # api_key2, clientSecret1
    if not words:
        return False
    if any(w in _ALWAYS_SECRET_WORDS for w in words):
        return True
    if "private" in words and any(w in ("key", "keys", "pem", "pems") for w in words):
        return True
    core = list(raw)
    while len(core) > 1 and (core[-1] in _NEUTRAL_SUFFIXES or _VERSIONISH.match(core[-1])):
        core.pop()
    core = [w.rstrip("0123456789") or w for w in core]
    last = core[-1]
    before = core[-2] if len(core) > 1 else None
    if last in ("key", "keys"):
        return before not in _NOT_SECRET_KEY_QUALIFIERS
    if last in _LAST_WORD_SECRET:
        return True
    if last == "tokens":
        return before is None or before in _CREDENTIAL_QUALIFIERS
    return len(core) == 1 and any(
        last.endswith(s) and len(last) > len(s) for s in _COMPOUND_SUFFIXES
    )


_PARSER_DATA = "pytest_kimi.data"
"""Where the engines' flag lists ship (``sglang_<version>_args.json``, SGLang's own parser)."""


@functools.lru_cache(maxsize=1)
def _abbreviated_secret_flags() -> frozenset[str]:
    """Every prefix SGLang's parser expands to a secret-named flag: ``api``, ``ap``,
    ``api-k`` (``--api-key``), ``ad``, ``admin`` (``--admin-api-key``) ...

    SGLang 0.5.23's ``argparse.ArgumentParser`` keeps ``allow_abbrev``: a prefix that
    matches one flag alone is that flag, so ``--api sk-...`` starts a key-protected server
    and ``/server_info``'s ``launch_command`` carries it in clear.  Read from the shipped
    flag lists (file reads, not imports: this base module depends on nothing of the
    package); none readable, no prefixes (the full names are still caught)."""
    out: set[str] = set()
    try:
        entries = [
            e
            for e in resources.files(_PARSER_DATA).iterdir()
            if e.name.startswith("sglang_") and e.name.endswith("_args.json")
        ]
        tables = [json.loads(e.read_text(encoding="utf-8")) for e in entries]
    except (OSError, ValueError, ModuleNotFoundError):
        return frozenset()
    for table in tables:
        if not table.get("allow_abbrev"):
            continue
        names = {str(row["name"]) for row in table.get("flags", ())}
        for flag in (n for n in names if is_secret_name(n)):
            for i in range(1, len(flag)):
                prefix = flag[:i]
                if prefix not in names and sum(n.startswith(prefix) for n in names) == 1:
                    out.add(prefix)
    return frozenset(out)


def is_secret_flag(name: str) -> bool:
    """Whether ``--name`` sets a secret: a secret name (:func:`is_secret_name`), or a prefix
    an engine's parser expands to one (:func:`_abbreviated_secret_flags`)."""
    return is_secret_name(name) or name in _abbreviated_secret_flags()


# ---------------------------------------------------------------------------- literals

_MIN_LITERAL = 4
"""Shorter registered values are not replaced as literals (``1`` would garble everything);
a name- or flag-based rule still catches them."""

_lock = threading.Lock()
_literals: set[str] = set()


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


# ------------------------------------------------------------------------------ shapes

_PEM = re.compile(
    r"-----BEGIN[A-Z0-9 ]*-----(?:[\s\S]*?-----END[A-Z0-9 ]*-----|[\s\S]*\Z)",
)
"""A PEM block, headers included; one whose END line was cut is redacted to the end."""
_DER_BODY = re.compile(
    r"\b(?:MII|MHcCAQEE|MC4CAQAw)[A-Za-z0-9+/]{20,}={0,2}(?:(?:\s|\\n)+[A-Za-z0-9+/]{8,}={0,2})*"
)
"""A PEM body without its header lines: base64 DER of a key starts ``MII`` (RSA, PKCS#8),
``MHcCAQEE`` (EC) or ``MC4CAQAw`` (Ed25519)."""
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
"""A JSON Web Token: three base64url segments, the header's ``{"`` reading ``eyJ``."""
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]+")
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/\s@'\"]+)@")
_URL_PARAM = re.compile(r"(?P<pre>[?&;#](?P<name>[A-Za-z0-9_.\-\[\]]+)=)(?P<value>[^&;#\s]*)")
_URL_SECRET_PARAMS = frozenset(
    {
        "sig",
        "signature",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "x-ms-signature",
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "code",
        "key",
        "api_key",
        "apikey",
        "auth",
        "password",
        "secret",
        "client_secret",
        "hmac",
        "awsaccesskeyid",
        "key-pair-id",
        "policy",
    }
)
"""Query parameters of signed and authenticated URLs (Azure SAS ``sig``, S3 and GCS presigned
``X-Amz-*``/``X-Goog-*``, CloudFront ``Signature``/``Policy``, OAuth ``code``/``token``)."""
_WEBHOOK_HOST = re.compile(
    r"^(?:hooks\.[a-z0-9.-]+|[a-z0-9.-]*webhook[a-z0-9.-]*|(?:www\.)?discord(?:app)?\.com"
    r"|outlook\.office(?:365)?\.com|api\.telegram\.org|maker\.ifttt\.com)$"
)
_WEBHOOK_PATH = re.compile(r"(?i)webhook|/hooks?/|/bot[0-9]+:|/with/key/|/services/T[A-Z0-9]+/")
_BEARER = re.compile(r"(?P<word>\b(?:Bearer|Basic|Token)\s+)(?P<value>[A-Za-z0-9._~+/=-]{4,})")
_KEY_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}|rk_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}|AIza[0-9A-Za-z_-]{35}"
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{40,}|ya29\.[0-9A-Za-z_-]{20,})"
)
"""Values that are keys by their shape (OpenAI, Stripe, Hugging Face, GitHub, GitLab, Slack,
AWS access key ids, Google, npm, PyPI tokens)."""

_FLAG_WORD = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_VALUE = r"(?P<q>['\"])?(?P<value>(?(q)[^'\"\n]*|[^\s'\",;)\]}&]+))(?(q)(?P=q))"
_FLAG_VALUE = re.compile(
    r"(?P<flag>(?<![\w-])--?(?P<name>" + _FLAG_WORD + r"))(?P<sep>=|[ \t]+)" + _VALUE
)
_PAIR_HEAD = re.compile(
    r"(?P<name>(?<![\w.-])[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*)(?P<nq>['\"]?)"
    r"(?P<sep>\s*=\s*|(?<=['\"]):\s*|:[ \t]+)"
)
"""The ``NAME=`` / ``"name": `` / ``name: `` head of a pair; its value is :data:`_PAIR_VALUE`.
A dotted name is one name (``api.key.value: ...``, ``db.password=...``): its last part alone
(``value``) would say nothing."""
_PAIR_VALUE = re.compile(_VALUE)
_QUOTED_CONTAINER = re.compile(
    r"(?P<head>(?P<nq>['\"])(?P<name>[^'\"\n]{1,80})(?P=nq)\s*[:=]\s*)"
    r"(?P<body>\[[^\]]{0,2000}\]|\{[^}]{0,2000}\})"
)
"""``"api_keys": ["a", "b"]`` / ``'tokens': {'openai': 'x'}`` in JSON or repr text."""
_QUOTED_STRING = re.compile(r"(?P<q>['\"])(?P<s>[^'\"\n]*)(?P=q)")


_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{%d,}={0,2}" % 20)
"""A run of base64 (standard or URL-safe) long enough to hide a key: 20 characters decode to
15 bytes, the shortest key shape above (``xoxb-`` and ten more)."""
_B64_MAX_LAYERS = 2
"""Base64 inside base64 is opened once more; deeper is not looked into."""
_HEX_ONLY = re.compile(r"[0-9a-fA-F]+")
_PRINTABLE_SHARE = 0.6
"""Decoded bytes of which a smaller share is printable ASCII are binary (a digest, an id, an
identifier that only looks like base64: random bytes are about 40% printable), not text that
could hold a key: not scrubbed further.  Below 1 so that a few bytes of garbage before the
encoding's true start (letters the run picked up) do not hide a key."""
_PRINTABLE_BYTES = bytes(range(0x20, 0x7F)) + b"\t\n\r"


def _b64_texts(run: str) -> list[str]:
    """The text ``run`` decodes to, from each of the four places its first block may start
    (a run can begin with letters that are no part of the encoding: ``xc2st...``); only
    decodings that read as text (:data:`_PRINTABLE_SHARE`)."""
    body = run.rstrip("=").replace("-", "+").replace("_", "/")
    if _HEX_ONLY.fullmatch(body):
        return []  # a hex digest or id: base64 of text is never all hex digits
    out: list[str] = []
    for skip in range(4):
        chunk = body[skip:]
        chunk = chunk[: len(chunk) - len(chunk) % 4]
        if len(chunk) < 16:
            break
        try:
            raw = base64.b64decode(chunk, validate=True)
        except (binascii.Error, ValueError):
            continue
        unprintable = len(raw.translate(None, _PRINTABLE_BYTES))
        if unprintable <= (1 - _PRINTABLE_SHARE) * len(raw):
            out.append(raw.decode("utf-8", errors="replace"))
    return out


def _b64_sub(m: re.Match[str], literals: tuple[str, ...], depth: int) -> str:
    """A base64 run, redacted whole when what it decodes to holds anything this module
    redacts (a key by its shape, a secret-named pair, a registered literal, more base64):
    ``revision: c2stcHJvai0...`` is an ``sk-proj-...`` key to anyone who decodes it."""
    run = m.group(0)
    for text in _b64_texts(run):
        if _scrub_text(text, literals, depth + 1) != text:
            return REDACTED
    return run


_ORDINARY_WORDS = frozenset(
    """
    a an the this that these those it its there here
    no not none null nil nothing never without
    is are was were be been being has have had does do did done
    must should may might can cannot could will would shall
    of in on at to for from by with as or and but if then else when while than via per
    only also too still yet already now again just
    set unset empty blank missing required optional given provided supplied needed expected
    unknown invalid valid wrong incorrect bad expired rejected denied accepted refused
    changed updated reset configured found disabled enabled omitted hidden masked redacted
    see use using please same different too short long ok
    """.split()
)
"""Words that say something *about* a secret in prose or a message (``passwd: not valid
JSON``, ``--api-key is required``, ``api_key: missing``, ``Token expired``), never one
themselves: closed-class English words and the words messages use for a value's state.
A value that is one of them (any case) is kept; a name-based rule that met one redacted an
ordinary word.  Open-class words are not here: ``password: hunter`` stays redacted."""
_BEARER_NOUNS = frozenset({"token", "tokens", "auth", "authentication", "credentials", "header"})
"""After ``Bearer``/``Basic``/``Token``: the words that name the scheme's value in prose
(``Bearer token missing``, ``Basic auth failed``)."""


def _ordinary(value: str) -> bool:
    return value.lower() in _ORDINARY_WORDS


def _bearer_sub(m: re.Match[str]) -> str:
    value = m.group("value")
    if _ordinary(value) or value.lower() in _BEARER_NOUNS:
        return m.group(0)
    return f"{m.group('word')}{REDACTED}"


def _flag_sub(m: re.Match[str]) -> str:
    long_flag = m.group("flag").startswith("--")
    name = m.group("name")
    secret = is_secret_flag(name) if long_flag else is_secret_name(name)
    if not secret or m.group("value") == REDACTED or _ordinary(m.group("value")):
        return m.group(0)
    q = m.group("q") or ""
    return f"{m.group('flag')}{m.group('sep')}{q}{REDACTED}{q}"


def _pair_value_kept(value: str) -> bool:
    return (
        value in ("", "None", "null", "true", "false")
        or value.startswith("<")
        or value in ("Bearer", "Basic", "Token")
        or value[:1] in "[{"
        or _ordinary(value)
    )


def _prose(head: re.Match[str], value: str) -> bool:
    """``first token: the server ...``: a sentence, not a pair.  Only for the unquoted
    ``name: value`` form whose name is a word prose uses (``token``, ``key``, ``auth``) and
    whose value is a short plain lowercase word; ``password: hunter2`` or ``token: eyJ...`` stay
    secret (and the shape rules still see the value)."""
    return (
        not head.group("nq")
        and head.group("sep").startswith(":")
        and head.group("name").lower().rstrip("s") in _LAST_WORD_SECRET
        and len(value) <= 12
        and value.isalpha()
        and value.islower()
    )


def _sub_pairs(text: str) -> str:
    """``NAME=value`` pairs with a secret name redacted.  Heads are found without their
    values (``a = GITHUB_PAT=x``: the second head sits inside the first one's value), and a
    value is read only after a secret head: linear in the text, whatever it holds."""
    out: list[str] = []
    pos = 0
    for m in _PAIR_HEAD.finditer(text):
        if m.start() < pos or not is_secret_name(m.group("name")):
            continue
        v = _PAIR_VALUE.match(text, m.end())
        if v is None or _pair_value_kept(v.group("value")):
            continue
        if _prose(m, v.group("value")):
            continue
        q = v.group("q") or ""
        out.append(text[pos : m.start()])
        out.append(f"{m.group(0)}{q}{REDACTED}{q}")
        pos = v.end()
    out.append(text[pos:])
    return "".join(out)


def _container_sub(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")):
        return m.group(0)
    return m.group("head") + _redact_quoted_values(m.group("body"))


def _redact_quoted_values(body: str) -> str:
    """A quoted list or mapping body with each non-empty value string redacted; a mapping's
    keys (a string followed by ``:``) are names, kept."""
    out: list[str] = []
    pos = 0
    for s in _QUOTED_STRING.finditer(body):
        out.append(body[pos : s.start()])
        is_key = re.match(r"\s*:", body[s.end() :]) is not None
        keep = is_key or not s.group("s") or s.group("s") == REDACTED
        out.append(s.group(0) if keep else f"{s.group('q')}{REDACTED}{s.group('q')}")
        pos = s.end()
    out.append(body[pos:])
    return "".join(out)


def _url_sub(m: re.Match[str]) -> str:
    url = m.group(0)
    scheme, _, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    hostname = host.rpartition("@")[2].split(":")[0].lower()
    if path and (_WEBHOOK_HOST.match(hostname) or _WEBHOOK_PATH.search("/" + path)):
        if path != REDACTED:
            return f"{scheme}://{host}/{REDACTED}"
    return _URL_PARAM.sub(_param_sub, url)


def _param_sub(m: re.Match[str]) -> str:
    name = m.group("name")
    value = m.group("value")
    if not value or value == REDACTED:
        return m.group(0)
    if name.lower() in _URL_SECRET_PARAMS or is_secret_name(name):
        return f"{m.group('pre')}{REDACTED}"
    return m.group(0)


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret this module can recognise replaced by :data:`REDACTED`.

    Idempotent; never raises.  ``secrets`` adds literal values for this call on top of the
    registered ones.
    """
    if not text:
        return text
    literals = tuple(
        sorted(
            {s for s in (*known_secrets(), *secrets) if s and len(s) >= _MIN_LITERAL},
            key=len,
            reverse=True,
        )
    )
    return _scrub_text(text, literals, 0)


def _scrub_text(text: str, literals: tuple[str, ...], depth: int) -> str:
    """:func:`scrub_text` with its literals ready; ``depth``: base64 layers already opened."""
    for value in literals:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _PEM.sub(REDACTED, text)
    text = _DER_BODY.sub(REDACTED, text)
    text = _JWT.sub(REDACTED, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _URL.sub(_url_sub, text)
    text = _BEARER.sub(_bearer_sub, text)
    text = _FLAG_VALUE.sub(_flag_sub, text)
    text = _QUOTED_CONTAINER.sub(_container_sub, text)
    text = _sub_pairs(text)
    text = _KEY_SHAPES.sub(REDACTED, text)
    if depth < _B64_MAX_LAYERS:
        text = _B64_RUN.sub(lambda m: _b64_sub(m, literals, depth), text)
    return text


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
            if is_secret_flag(name) if word.startswith("--") else is_secret_name(name):
                if eq:
                    out.append(word.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(word)
                    hide_next = True
                continue
        out.append(scrub_text(word, secrets))
    return out


def _redact_all(value: Any, secrets: tuple[str, ...]) -> Any:
    """A secret-named entry's value: every non-empty string in its whole subtree redacted
    (``tokens: {openai: ...}``, ``api_keys: [...]``); ``None``, booleans and numbers kept."""
    if isinstance(value, str):
        return REDACTED if value else value
    if isinstance(value, Mapping):
        return {
            (scrub_text(k, secrets) if isinstance(k, str) else k): _redact_all(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact_all(v, secrets) for v in value]
    return value


def scrub(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A deep copy of a JSON-like value with secrets redacted (see the module docstring).

    A mapping entry whose key is a secret name loses every non-empty string of its value,
    however deep; ``None``, ``""``, booleans and numbers are kept (they say whether a key was
    set, and a key is never a number).  Every other string is scrubbed by shape; a list of
    strings with a ``-flag`` among them is treated as argv; string keys are scrubbed by shape
    too (a provider's key used as a mapping key).
    """
    secrets = tuple(secrets)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, sub in value.items():
            name = str(key)
            new_key = scrub_text(key, secrets) if isinstance(key, str) else key
            if is_secret_name(name):
                out[new_key] = _redact_all(sub, secrets)
            else:
                out[new_key] = scrub(sub, secrets)
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
