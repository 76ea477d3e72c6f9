"""The one YAML loader for files people edit by hand: ``safe_load`` that refuses duplicate keys,
anchors and aliases, and inputs too large to be a hand-written file.

PyYAML keeps the last of two equal keys silently, so a second ``tp-size:`` added further down a
server profile, or a ``tok_s:`` pasted twice into a baseline, would change what is read without
a word.  Server profiles (:mod:`pytest_kimi.server.profile`) and baselines
(:mod:`pytest_kimi.baseline.yaml_io`) both read through :func:`load`, so they agree on what a
duplicate is and both can name the key and the two lines; each keeps its own wording around it.

Anchors and aliases (``&a`` / ``*a``) are refused outright: a "billion laughs" of nine aliases
nine deep under a baseline's ``provenance.server_info`` is a 1 kB file that every later walk of
the value (scrubbing, comparing, dumping) expands to 10**9 items; pytest and ``kimi-perf
baselines`` hung at 3 GB.  No hand-written baseline or profile needs them (the plugin's own
writer never emits one), so the loader refuses the first one it meets, before it is composed,
naming its line.  Two limits back that up, each far above any real file: the text's size
(:data:`MAX_CHARS`) and the number of nodes composed (:data:`MAX_NODES`).

Every mapping key in these files is a name (a field, a flag, a variable), so a plain key that
YAML 1.1 would read as a boolean (``on:``, ``off:``, ``yes:``, ``No:``) is read as the string
written; values keep YAML's reading (``args: {enable-x: true}`` stays a bare flag).

Only PyYAML here (no pytest): load-worker processes and offline scripts import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "AliasError",
    "DuplicateKeyError",
    "MAX_CHARS",
    "MAX_NODES",
    "NodeLimitError",
    "StrictLoader",
    "TooLargeError",
    "load",
    "read_text",
]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_STR_TAG = "tag:yaml.org,2002:str"

MAX_CHARS = 1024 * 1024
"""The largest text :func:`load` parses (1 Mi characters).  A baseline of 50 levels with their
trials and a full SGLang ``server_info`` is about 30 kB; a server profile is a few kB.  PyYAML
in pure Python parses a few hundred kB a second, so this also bounds the time spent."""
MAX_NODES = 100_000
"""The most YAML nodes :func:`load` composes (a 50-level baseline has about 2000): a second
line behind the alias ban, and a bound on the time (PyYAML composes some 50,000 a second)."""
_NO_ALIASES = (
    "anchors and aliases are refused: no hand-written baseline or server profile needs them "
    "(an alias bomb would expand without bound); write the value out in full"
)


class AliasError(yaml.composer.ComposerError):
    """An anchor (``&name``) or alias (``*name``); ``kind``, ``name`` and ``line`` (1-based) are
    there for callers that word it themselves."""

    def __init__(self, kind: str, name: str, mark: Any) -> None:
        # ``mark``: a ``yaml.Mark`` (PyYAML's stubs allow its C twin and None on an event)
        self.kind = kind
        self.name = name
        self.line = mark.line + 1
        sign = "&" if kind == "anchor" else "*"
        super().__init__(None, None, f"found {kind} {sign}{name}: {_NO_ALIASES}", mark)


class NodeLimitError(yaml.composer.ComposerError):
    """More than :data:`MAX_NODES` nodes; ``line`` (1-based) is where the limit was passed."""

    def __init__(self, mark: Any) -> None:
        self.line = mark.line + 1
        super().__init__(
            None,
            None,
            f"more than {MAX_NODES} YAML nodes: far more than a hand-written baseline or server "
            "profile holds; is this the file you meant?",
            mark,
        )


class TooLargeError(yaml.YAMLError):
    """The text is over :data:`MAX_CHARS`; ``size`` is its length (characters or bytes)."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(
            f"{size} characters, over the {MAX_CHARS} a hand-written baseline or server profile "
            "could hold; is this the file you meant?"
        )


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives the same key twice.

    A :class:`yaml.MarkedYAMLError` like any other load error (``problem_mark`` is the second
    occurrence, ``context_mark`` the mapping), so a caller that formats YAML errors generically
    needs no special case; ``key`` (the constructed value), ``written`` (the second occurrence's
    text as the file has it, None for a collection key), ``line`` and ``first_line`` (1-based)
    are there for callers that word it themselves.  The message shows a string key quoted and
    any other scalar as written (``1.0``, not ``1``).
    """

    def __init__(
        self, mapping: yaml.MappingNode, key: Any, key_node: yaml.Node, first: yaml.Node
    ) -> None:
        self.key = key
        self.written: str | None = (
            str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
        )
        self.line = key_node.start_mark.line + 1
        self.first_line = first.start_mark.line + 1
        if isinstance(key, str) or self.written is None:
            shown = repr(key)
        else:
            shown = self.written
        super().__init__(
            "while constructing a mapping",
            mapping.start_mark,
            f"found duplicate key {shown} (first given on line {self.first_line})",
            key_node.start_mark,
        )


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings raise :class:`DuplicateKeyError` on a repeated key and
    whose composer raises :class:`AliasError` on an anchor or alias, :class:`NodeLimitError` past
    :data:`MAX_NODES` nodes.

    A plain mapping key YAML 1.1 resolves to a boolean (``on``, ``No``, ``YES``) is read as the
    string written, since every key in our files is a name; an explicit ``!!bool`` tag and every
    value are left to YAML.  Keys compare as constructed values (``tp-size`` and ``"tp-size"``
    are the same key, ``1`` and ``"1"`` are not, nor ``on`` and ``On``).  Merge keys (``<<``)
    are left to PyYAML: overriding a merged key is what they are for (with aliases refused, only
    an inline mapping can be merged).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # Checked before PyYAML's composer sees the event: an alias is refused before the
        # anchored node is looked up, an anchor before its node is composed.
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise AliasError("alias", str(event.anchor), event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise AliasError("anchor", str(anchor), event.start_mark)
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise NodeLimitError(event.start_mark)
        node = super().compose_node(parent, index)
        # A mapping's key is composed with ``index`` None (its value with the key node).  A plain
        # untagged key YAML 1.1 reads as a boolean (``on:``) is the name written: a string.
        if (
            isinstance(parent, yaml.MappingNode)
            and index is None
            and isinstance(event, yaml.ScalarEvent)
            and event.tag is None
            and node is not None
            and node.tag == _BOOL_TAG
        ):
            node.tag = _STR_TAG
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: SafeLoader reports it below
                if first is not None:
                    raise DuplicateKeyError(node, key, key_node, first)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load(text: str, *, max_chars: int | None = MAX_CHARS) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing duplicate keys, anchors and
    aliases, and more than ``max_chars`` (:data:`MAX_CHARS`; None: no bound, for
    ``--perf-allow-large``) of text or :data:`MAX_NODES` nodes.

    Raises :class:`yaml.YAMLError` (:class:`DuplicateKeyError` for a repeated key,
    :class:`AliasError`, :class:`NodeLimitError`, :class:`TooLargeError`), or ``ValueError``
    for a scalar PyYAML cannot construct (an impossible date).
    """
    if max_chars is not None and len(text) > max_chars:
        raise TooLargeError(len(text))
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def read_text(path: Path) -> str:
    """A file's UTF-8 text for :func:`load`, refusing (:class:`TooLargeError`) one whose size on
    disk is over :data:`MAX_CHARS` bytes before reading any of it: a baseline or profile path
    pointed at a log or a core dump must not be read whole into memory.

    ``OSError`` and ``UnicodeDecodeError`` pass through, for the caller's own wording.
    """
    with path.open("rb") as f:
        data = f.read(MAX_CHARS + 1)
    if len(data) > MAX_CHARS:
        raise TooLargeError(path.stat().st_size)
    return data.decode("utf-8")
