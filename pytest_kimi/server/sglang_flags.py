"""SGLang's own command-line flags, and the check of a profile's ``args:`` against them.

Why: a typo in a profile is found by SGLang only after the launch, and some mistakes are
never found at all.  SGLang 0.5.23's parser (``argparse.ArgumentParser(prog="sglang
serve")``) keeps argparse's ``allow_abbrev``: ``--enable-cache`` is taken as
``--enable-cache-report``, and a profile that says ``disable-cuda-graph-pad`` silently means
something its reviewer never read.  Other flags are parsed and never read
(``--num-continuous-decode-steps``: a "tuning" that cannot act), or deprecated.  So before a
launch the plugin holds each flag to the list SGLang's own parser produced
(``pytest_kimi/data/sglang_<version>_args.json``, written by
``tests/fake_sglang/dump_args.py``):

* an unknown flag, an abbreviation (argparse would expand it), an ambiguous prefix
  (argparse would refuse it), a dead flag, a value where the flag takes none (or none where
  it takes one), a value outside the flag's choices: an error naming the flag, the profile
  and the fix (the full or closest real flag);
* a deprecated flag: a warning with SGLang's own replacement.

The data is versioned: a profile for another SGLang release says ``engine_version:``, and a
release without shipped data is not checked (the check says so) rather than judged by the
wrong parser.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = [
    "DEFAULT_VERSION",
    "FlagCheck",
    "FlagProblem",
    "FlagSpec",
    "FlagTable",
    "check_args",
    "known_versions",
    "load_flag_table",
    "raw_flags",
]

DEFAULT_VERSION = "0.5.23"
"""The SGLang release whose parser the plugin ships, and checks a profile against unless the
profile names another (``engine_version:``)."""

_DATA_PACKAGE = "pytest_kimi.data"
_FILE_PREFIX = "sglang_"
_FILE_SUFFIX = "_args.json"


@dataclass(frozen=True)
class FlagSpec:
    """One long option of SGLang's parser, as ``dump_args.py`` recorded it."""

    name: str
    """Without the leading ``--``."""
    dest: str
    takes_value: bool
    choices: tuple[str, ...] | None = None
    deprecated: bool = False
    warning: str | None = None
    """What SGLang logs when the flag is given (None: it says nothing, only its help does)."""
    note: str | None = None
    """The flag's help text when deprecated: SGLang's own pointer to the replacement."""
    dead: bool = False
    """Parsed and never read anywhere in SGLang's source: setting it changes nothing."""
    many: bool = False
    """Takes several words (argparse ``nargs`` ``+``/``*``): a list in ``args``."""


@dataclass(frozen=True)
class FlagTable:
    """Every long option of one SGLang release's launch parser."""

    version: str
    allow_abbrev: bool
    flags: Mapping[str, FlagSpec]

    def resolve(self, word: str) -> tuple[FlagSpec | None, tuple[str, ...]]:
        """What argparse makes of ``--word``: the flag it selects (None when none or several
        match) and, for a prefix, every flag it is a prefix of."""
        exact = self.flags.get(word)
        if exact is not None:
            return exact, ()
        if not self.allow_abbrev:
            return None, ()
        matches = tuple(sorted(n for n in self.flags if n.startswith(word)))
        if len(matches) == 1:
            return self.flags[matches[0]], matches
        return None, matches

    def closest(self, word: str, n: int = 3) -> list[str]:
        """The real flags nearest to a wrong one, for the fix in an error message."""
        return difflib.get_close_matches(word, list(self.flags), n=n, cutoff=0.6)


@dataclass(frozen=True)
class FlagProblem:
    """One finding about one flag of a profile."""

    flag: str
    kind: str
    """``unknown``, ``abbreviation``, ``ambiguous``, ``dead``, ``value``, ``choice`` (errors)
    or ``deprecated`` (a warning)."""
    message: str

    @property
    def fatal(self) -> bool:
        return self.kind != "deprecated"


@dataclass(frozen=True)
class FlagCheck:
    """The outcome of checking one profile: its errors, its warnings, or why it was skipped."""

    version: str
    problems: tuple[FlagProblem, ...] = ()
    skipped: str | None = None

    @property
    def errors(self) -> list[FlagProblem]:
        return [p for p in self.problems if p.fatal]

    @property
    def warnings(self) -> list[FlagProblem]:
        return [p for p in self.problems if not p.fatal]


def _file_name(version: str) -> str:
    return f"{_FILE_PREFIX}{version.replace('.', '_')}{_FILE_SUFFIX}"


def known_versions() -> list[str]:
    """The SGLang releases whose parser data ships with the plugin."""
    out = []
    for entry in resources.files(_DATA_PACKAGE).iterdir():
        name = entry.name
        if name.startswith(_FILE_PREFIX) and name.endswith(_FILE_SUFFIX):
            out.append(name[len(_FILE_PREFIX) : -len(_FILE_SUFFIX)].replace("_", "."))
    return sorted(out)


@functools.lru_cache(maxsize=4)
def _data(version: str) -> dict[str, Any]:
    entry = resources.files(_DATA_PACKAGE).joinpath(_file_name(version))
    if not entry.is_file():
        raise LookupError(
            f"no SGLang {version} flag list ships with pytest-kimi (shipped: "
            f"{', '.join(known_versions()) or 'none'}); tests/fake_sglang/dump_args.py "
            f"writes one from that release's parser"
        )
    data: dict[str, Any] = json.loads(entry.read_text(encoding="utf-8"))
    return data


def raw_flags(version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """The recorded rows as they are (type, nargs and default included): what the fake
    SGLang rebuilds the real parser from."""
    return [dict(row) for row in _data(version)["flags"]]


@functools.lru_cache(maxsize=4)
def load_flag_table(version: str = DEFAULT_VERSION) -> FlagTable:
    """The shipped parser data of ``version``; ``LookupError`` naming the shipped ones when
    there is none."""
    data = _data(version)
    flags = {
        f["name"]: FlagSpec(
            name=f["name"],
            dest=f["dest"],
            takes_value=bool(f["takes_value"]),
            choices=tuple(f["choices"]) if f.get("choices") else None,
            deprecated=bool(f.get("deprecated")),
            warning=f.get("warning"),
            note=f.get("note"),
            dead=bool(f.get("dead")),
            many=f.get("nargs") in ("+", "*")
            or (isinstance(f.get("nargs"), int) and f["nargs"] > 1),
        )
        for f in data["flags"]
    }
    return FlagTable(version=data["sglang_version"], allow_abbrev=data["allow_abbrev"], flags=flags)


def _suggest(table: FlagTable, word: str) -> str:
    near = table.closest(word)
    if not near:
        return "see `python -m sglang.launch_server --help` for the flags"
    return "did you mean " + " or ".join(repr(n) for n in near) + "?"


def _check_value(
    spec: FlagSpec, key: str, value: Any, source: str, version: str
) -> FlagProblem | None:
    """A value the rendered command line would fail on (or misread)."""
    if value is None or value is False:
        return None  # the flag is left out of the command line
    if not spec.takes_value and value is not True:
        return FlagProblem(
            key,
            "value",
            f"{source}: args flag {key!r} takes no value in SGLang (a switch), got "
            f"{value!r}; write '{key}: true' to pass it or 'false' to leave it out",
        )
    if spec.takes_value and value is True:
        return FlagProblem(
            key,
            "value",
            f"{source}: args flag {key!r} takes a value in SGLang, got 'true' (which passes "
            f"the bare flag); give the value, e.g. '{key}: ...'",
        )
    if isinstance(value, (list, tuple)) and not spec.many:
        return FlagProblem(
            key,
            "value",
            f"{source}: args flag {key!r} takes one value in SGLang, got a list {value!r} "
            f"(it would pass several words after the flag, which its parser refuses)",
        )
    if spec.choices and not isinstance(value, (list, tuple, Mapping)):
        word = str(value).lower() if isinstance(value, bool) else str(value)
        if word not in spec.choices:
            return FlagProblem(
                key,
                "choice",
                f"{source}: args flag {key!r} must be one of {', '.join(spec.choices)} in "
                f"SGLang {version}, got {value!r}",
            )
    return None


def check_args(args: Mapping[str, Any], source: str, version: str = DEFAULT_VERSION) -> FlagCheck:
    """Hold a profile's ``args`` (dashed keys, values as the profile gives them) to SGLang
    ``version``'s parser; see the module docstring for what is an error and what a warning."""
    try:
        table = load_flag_table(version)
    except LookupError as exc:
        return FlagCheck(version, skipped=f"{source}: flags not checked: {exc}")
    problems: list[FlagProblem] = []
    where = f"(SGLang {table.version}'s own parser)"
    for key, value in args.items():
        spec, prefixes = table.resolve(key)
        if spec is None and prefixes:
            problems.append(
                FlagProblem(
                    key,
                    "ambiguous",
                    f"{source}: args flag {key!r} is not a flag of SGLang {table.version}, only "
                    f"a prefix of {', '.join(repr(p) for p in prefixes[:6])}"
                    f"{' ...' if len(prefixes) > 6 else ''}, which its parser refuses "
                    f"(ambiguous option); write the full flag name",
                )
            )
            continue
        if spec is None:
            problems.append(
                FlagProblem(
                    key,
                    "unknown",
                    f"{source}: args flag {key!r} is not a flag of SGLang {table.version} "
                    f"{where}; {_suggest(table, key)}",
                )
            )
            continue
        if spec.name != key:
            problems.append(
                FlagProblem(
                    key,
                    "abbreviation",
                    f"{source}: args flag {key!r} is an abbreviation: SGLang {table.version}'s "
                    f"parser expands it to {spec.name!r}; write '{spec.name}' so the profile "
                    f"says what the server runs with",
                )
            )
            continue
        if spec.dead:
            problems.append(
                FlagProblem(
                    key,
                    "dead",
                    f"{source}: args flag {key!r} is parsed and never read by SGLang "
                    f"{table.version} (no code uses {spec.dest!r}), so it changes nothing; "
                    f"remove it, and tune with a flag that acts (e.g. max-running-requests, "
                    f"chunked-prefill-size, schedule-policy)",
                )
            )
            continue
        bad = _check_value(spec, key, value, source, table.version)
        if bad is not None:
            problems.append(bad)
            continue
        if spec.deprecated and value not in (None, False):
            said = spec.warning or spec.note or "deprecated"
            problems.append(
                FlagProblem(
                    key,
                    "deprecated",
                    f"{source}: args flag {key!r} is deprecated in SGLang {table.version}: {said}",
                )
            )
    return FlagCheck(table.version, tuple(problems))
