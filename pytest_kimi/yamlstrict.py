"""The one YAML loader for files people edit by hand: ``safe_load`` that refuses duplicate keys.

PyYAML keeps the last of two equal keys silently, so a second ``tp-size:`` added further down a
server profile, or a ``tok_s:`` pasted twice into a baseline, would change what is read without
a word.  Server profiles (:mod:`pytest_kimi.server.profile`) and baselines
(:mod:`pytest_kimi.baseline.yaml_io`) both read through :func:`load`, so they agree on what a
duplicate is and both can name the key and the two lines; each keeps its own wording around it.

Only PyYAML here (no pytest): load-worker processes and offline scripts import it.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["DuplicateKeyError", "StrictLoader", "load"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives the same key twice.

    A :class:`yaml.MarkedYAMLError` like any other load error (``problem_mark`` is the second
    occurrence, ``context_mark`` the mapping), so a caller that formats YAML errors generically
    needs no special case; ``key``, ``line`` and ``first_line`` (1-based) are there for callers
    that word it themselves.
    """

    def __init__(
        self, mapping: yaml.MappingNode, key: Any, key_node: yaml.Node, first: yaml.Node
    ) -> None:
        self.key = key
        self.line = key_node.start_mark.line + 1
        self.first_line = first.start_mark.line + 1
        super().__init__(
            "while constructing a mapping",
            mapping.start_mark,
            f"found duplicate key {key!r} (first given on line {self.first_line})",
            key_node.start_mark,
        )


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings raise :class:`DuplicateKeyError` on a repeated key.

    Keys compare as constructed values (``tp-size`` and ``"tp-size"`` are the same key, ``1``
    and ``"1"`` are not).  Merge keys (``<<``) are left to PyYAML: overriding a merged key is
    what they are for.
    """

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


def load(text: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing duplicate keys.

    Raises :class:`yaml.YAMLError` (:class:`DuplicateKeyError` for a repeated key), or
    ``ValueError`` for a scalar PyYAML cannot construct (an impossible date).
    """
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
