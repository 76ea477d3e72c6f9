"""Baseline store: recorded throughput per test, kept in git as human-reviewable YAML.

Why files in git rather than a database: a throughput target is a claim about the serving stack,
and changing it should go through the same review as a code change.  Everything here therefore
optimises for a readable ``git diff``:

* one file per test, at ``<root>/<profile>/<module path without .py>/<test name>.yaml``
  (see :func:`baseline_relpath` for how class and parameter parts become a file name);
* a fixed key order, rounded figures (tok/s to 0.1; seconds to 4 significant digits but never
  finer than 0.1 ms), levels sorted by workload, ``server_info`` keys sorted;
* loading a file and dumping it again gives the same text, so re-saving never makes noise.

The key of a level is its *workload* (concurrency, max_tokens, prompts, ...).  A lookup with a
workload that is not in the file finds nothing: a number measured at another concurrency or
output length is never a valid target, however close.  :meth:`TestBaseline.explain_miss` says
what the file does hold, so the user can tell a typo from a genuinely new level.

This module must not import pytest: the plugin, CLI helpers and offline scripts share it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fnmatch
import hashlib
import json
import math
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

import yaml

from pytest_kimi.endpoint.serverinfo import VOLATILE_SERVER_INFO, clean_server_info

__all__ = [
    "SCHEMA_VERSION",
    "DEFAULT_DIRNAME",
    "DEFAULT_PROFILE",
    "SERVER_INFO_IGNORE",
    "BaselineError",
    "BaselineExistsError",
    "ProvenanceConflict",
    "WorkloadKey",
    "LevelBaseline",
    "Provenance",
    "TestBaseline",
    "FieldChange",
    "LevelChange",
    "UpdateSummary",
    "BaselineLookup",
    "BaselineStore",
    "baseline_relpath",
    "dumps",
    "loads",
    "merge",
    "provenance_diff",
    "incomparable",
    "summarize_update",
    "git_review_commands",
    "round_tok_s",
    "round_seconds",
    "utc_timestamp",
]

SCHEMA_VERSION = 1
"""Bumped only for changes an older reader would misinterpret; readers refuse other versions."""

DEFAULT_DIRNAME = "baselines"
"""Directory under the rootdir that holds baselines unless configured otherwise."""

DEFAULT_PROFILE = "default"

Scalar = Union[str, int, float, bool, None]
WorkloadLike = Union["WorkloadKey", Mapping[str, Any], Any]

_HEADER = (
    "# pytest-kimi throughput baseline; written by the plugin, reviewed as a diff.\n"
    "# tok_s is the median of trials_tok_s; rates in tok/s, times in seconds.\n"
)


# --------------------------------------------------------------------------------------- errors


class BaselineError(ValueError):
    """A baseline file that cannot be used as it is (bad YAML, wrong schema, invalid field).

    The message always starts with the file path, because the user has to open and fix (or
    delete) that file; ``path`` and ``problem`` are kept separately for callers that format
    their own report.  Raising never modifies the file.
    """

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class BaselineExistsError(FileExistsError):
    """``save`` was asked to write over an existing baseline without ``overwrite=True``.

    Replacing a target must be a deliberate act (a re-record), never a side effect.
    """


class ProvenanceConflict(ValueError):
    """A partial update would mix levels measured under different server configurations.

    The file has a single provenance block; keeping old levels next to new ones is only honest
    when both were produced by the same (non-volatile) setup.
    """


class _Invalid(Exception):
    """Internal: a validation problem, wrapped into :class:`BaselineError` with the path."""


# ------------------------------------------------------------------------------------- rounding


def round_tok_s(value: float) -> float:
    """Round a token rate to 0.1 tok/s: finer digits are noise and only make diffs noisy."""
    return round(float(value), 1)


def round_seconds(value: float) -> float:
    """Round a duration to 4 significant digits, but never finer than 0.1 ms.

    TTFTs are tens of milliseconds: sub-0.1 ms digits are timer and scheduling noise, while
    long durations still keep four meaningful digits.
    """
    value = float(value)
    if value == 0.0 or not math.isfinite(value):
        return value
    exponent = math.floor(math.log10(abs(value)))
    return round(value, min(3 - exponent, 4))


def utc_timestamp(when: _dt.datetime | None = None) -> str:
    """``2026-11-29T08:00:00Z``: second resolution, UTC, the form written to ``recorded_at``."""
    when = when or _dt.datetime.now(_dt.timezone.utc)
    if when.tzinfo is not None:
        when = when.astimezone(_dt.timezone.utc)
    return when.replace(tzinfo=None, microsecond=0).isoformat() + "Z"


# ------------------------------------------------------------------------------------- workload

_ABSENT: Any = type("_AbsentType", (), {"__repr__": lambda self: "<absent>"})()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar_text(value: Any) -> str:
    """A value as a reviewer reads it in YAML: ``true``, ``null``, ``512``, ``builtin:diverse``."""
    if value is _ABSENT:
        return "(absent)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if _is_number(value):
        return repr(value)
    return json.dumps(value, sort_keys=True, default=str)


def _value_rank(value: Any) -> tuple[int, Any]:
    """Total order over workload values of mixed types (bool < number < str)."""
    if isinstance(value, bool):
        return (1, value)
    if _is_number(value):
        return (2, value)
    return (3, str(value))


@dataclass(frozen=True, eq=False)
class WorkloadKey:
    """The identity of a level: the workload parameters, in canonical (sorted-key) order.

    Keys whose value is ``None`` are dropped, so ``None`` means "not set" and equals an absent
    key.  That is what lets a later plugin version add an optional workload key (say ``rate``
    for open-loop runs) without orphaning every existing baseline: closed-loop runs report
    ``rate: None`` and still match files that never had the key.  Any *set* value must match
    exactly; numbers compare numerically (``8 == 8.0``) but ``true`` never equals ``1``.
    """

    items: tuple[tuple[str, Scalar], ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        clean: list[tuple[str, Scalar]] = []
        for key, value in self.items:
            if not isinstance(key, str) or not key:
                raise ValueError(f"workload keys must be non-empty strings, got {key!r}")
            if key in seen:
                raise ValueError(f"workload key {key!r} given twice")
            seen.add(key)
            if value is None:
                continue
            if not isinstance(value, (str, int, float, bool)):
                raise ValueError(
                    f"workload value for {key!r} must be a string, number or boolean, "
                    f"got {type(value).__name__} {value!r}"
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"workload value for {key!r} must be finite, got {value!r}")
            clean.append((key, value))
        clean.sort(key=lambda kv: kv[0])
        object.__setattr__(self, "items", tuple(clean))

    @classmethod
    def from_dict(cls, workload: Mapping[str, Any]) -> WorkloadKey:
        return cls(tuple(workload.items()))

    @classmethod
    def of(cls, workload: WorkloadLike) -> WorkloadKey:
        """Accept a key, a mapping, or a dataclass (e.g. the load engine's workload spec)."""
        if isinstance(workload, WorkloadKey):
            return workload
        if isinstance(workload, Mapping):
            return cls.from_dict(workload)
        if dataclasses.is_dataclass(workload) and not isinstance(workload, type):
            return cls.from_dict(dataclasses.asdict(workload))
        to_dict = getattr(workload, "to_dict", None)
        if callable(to_dict):
            return cls.from_dict(to_dict())
        raise TypeError(f"cannot make a workload key from {type(workload).__name__}")

    def to_dict(self) -> dict[str, Scalar]:
        return dict(self.items)

    def keys(self) -> list[str]:
        return [k for k, _ in self.items]

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.items:
            if k == key:
                return v
        return default

    def _canonical(self) -> tuple[tuple[str, tuple[str, Any]], ...]:
        def tag(v: Any) -> tuple[str, Any]:
            if isinstance(v, bool):
                return ("b", v)
            if _is_number(v):
                return ("n", v)
            return ("s", v)

        return tuple((k, tag(v)) for k, v in self.items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkloadKey):
            return NotImplemented
        return self._canonical() == other._canonical()

    def __hash__(self) -> int:
        return hash(self._canonical())

    def sort_key(self) -> tuple[tuple[str, int, Any], ...]:
        """Deterministic order of levels in a file: by key name, then value (C=1 before C=8)."""
        return tuple((k, *_value_rank(v)) for k, v in self.items)

    def label(self, extra_keys: Iterable[str] = ()) -> str:
        """Short human label, e.g. ``C=8 max_tokens=512`` (plus ``extra_keys`` when set)."""
        parts: list[str] = []
        if "concurrency" in dict(self.items):
            parts.append(f"C={_scalar_text(self.get('concurrency'))}")
        wanted = ["max_tokens", *[k for k in extra_keys if k not in ("concurrency", "max_tokens")]]
        for key in wanted:
            value = self.get(key, _ABSENT)
            if value is not _ABSENT:
                parts.append(f"{key}={_scalar_text(value)}")
        return " ".join(parts) if parts else str(self)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{k}: {_scalar_text(v)}" for k, v in self.items) + "}"

    def __repr__(self) -> str:
        return f"WorkloadKey({self.to_dict()!r})"


# --------------------------------------------------------------------------------------- levels


def _summary_order(key: str) -> tuple[int, float, str]:
    """Percentiles ascending (p50, p95, p99, p99.9), then any other statistic by name."""
    match = re.fullmatch(r"p(\d+(?:\.\d+)?)", key)
    if match:
        return (0, float(match.group(1)), key)
    return (1, 0.0, key)


def _normalise_summary(name: str, values: Mapping[str, Any] | None, rounder: Any) -> dict[str, float]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be a mapping like {{p50: ...}}, got {values!r}")
    out: dict[str, float] = {}
    for key in sorted(values, key=lambda k: _summary_order(str(k))):
        value = values[key]
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name} keys must be statistic names like p50, got {key!r}")
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}.{key} must be a non-negative number, got {value!r}")
        out[key] = rounder(value)
    return out


@dataclass(frozen=True)
class LevelBaseline:
    """The recorded figures for one workload of one test.

    Values are rounded on construction, so an in-memory baseline equals the one read back from
    its file; a comparison made right after recording sees the same numbers as a later run.
    """

    workload: WorkloadKey
    trials_tok_s: tuple[float, ...]
    """Steady-state output tok/s of each trial: the samples later runs are tested against."""
    request_tok_s: Mapping[str, float] = field(default_factory=dict)
    """Per-request decode rate summary (tok/s), e.g. ``{p50: 65.2}``."""
    ttft_s: Mapping[str, float] = field(default_factory=dict)
    """Time-to-first-token summary (seconds), e.g. ``{p50: 0.041, p95: 0.052}``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", WorkloadKey.of(self.workload))
        trials = self.trials_tok_s
        if isinstance(trials, (str, bytes, Mapping)) or not isinstance(trials, Iterable):
            raise ValueError(f"trials_tok_s must be a list of positive numbers, got {trials!r}")
        trials = tuple(trials)
        if not trials:
            raise ValueError("trials_tok_s must be a non-empty list of positive numbers, got []")
        rounded: list[float] = []
        for i, value in enumerate(trials):
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"trials_tok_s must be a list of positive numbers; item {i} is {value!r}"
                )
            r = round_tok_s(value)
            if r <= 0:
                raise ValueError(f"trials_tok_s item {i} ({value!r}) rounds to 0.0 tok/s")
            rounded.append(r)
        object.__setattr__(self, "trials_tok_s", tuple(rounded))
        object.__setattr__(
            self, "request_tok_s", _normalise_summary("request_tok_s", self.request_tok_s, round_tok_s)
        )
        object.__setattr__(self, "ttft_s", _normalise_summary("ttft_s", self.ttft_s, round_seconds))

    @property
    def tok_s(self) -> float:
        """Median of the trials, rounded: the one number a reviewer reads."""
        return round_tok_s(statistics.median(self.trials_tok_s))


# ----------------------------------------------------------------------------------- provenance

SERVER_INFO_IGNORE: tuple[str, ...] = VOLATILE_SERVER_INFO
"""Patterns for ``server_info`` entries that :func:`provenance_diff` ignores (their one home
is :mod:`pytest_kimi.endpoint.serverinfo`, where server info enters the plugin)."""


def _plain(value: Any, where: str) -> Any:
    """A JSON-like copy with sorted mapping keys; rejects what YAML/JSON could not round-trip."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} must be finite, got {value!r}")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key in sorted(value, key=str):
            if not isinstance(key, str):
                raise ValueError(f"{where} keys must be strings, got {key!r}")
            out[key] = _plain(value[key], f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where} holds a {type(value).__name__}, which a baseline cannot store")


@dataclass(frozen=True)
class Provenance:
    """Who and what produced a baseline's numbers: needed to judge whether a later run is
    comparable at all, and to show a reviewer what changed when targets move."""

    model: str | None = None
    """Model name the endpoint serves."""
    server_info: Mapping[str, Any] = field(default_factory=dict)
    """Server arguments and version as the endpoint reports them (SGLang ``/get_server_info``)."""
    plugin_version: str | None = None
    git_commit: str | None = None
    """Commit of the test suite that recorded the numbers, when known."""
    recorded_at: str | None = None
    """UTC time of the recording, ``2026-11-29T08:00:00Z``."""
    client_host: str | None = None
    session_ids: tuple[str, ...] = ()
    """Sessions whose measurements the file holds (more than one after a partial update)."""

    VOLATILE: ClassVar[frozenset[str]] = frozenset(
        {"git_commit", "recorded_at", "client_host", "session_ids"}
    )
    """Fields that change on every recording without changing what is measured.

    ``git_commit`` is here because the suite's commit moves with unrelated edits; anything that
    alters a level's workload already changes the level key itself.
    """

    def __post_init__(self) -> None:
        for name in ("model", "plugin_version", "git_commit", "recorded_at", "client_host"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"provenance.{name} must be a string or null, got {value!r}")
        info = self.server_info if self.server_info is not None else {}
        if not isinstance(info, Mapping):
            raise ValueError(f"provenance.server_info must be a mapping, got {info!r}")
        # Scrubbed here too, whatever path the info took: a baseline is committed to git.
        object.__setattr__(self, "server_info", _plain(clean_server_info(info), "server_info"))
        ids = self.session_ids if self.session_ids is not None else ()
        if isinstance(ids, str) or not all(isinstance(s, str) for s in ids):
            raise ValueError(f"provenance.session_ids must be a list of strings, got {ids!r}")
        object.__setattr__(self, "session_ids", tuple(ids))

    @classmethod
    def collect(
        cls,
        *,
        model: str | None,
        server_info: Mapping[str, Any] | None = None,
        session_ids: Sequence[str] = (),
        suite_dir: Path | None = None,
    ) -> Provenance:
        """Fill the fields the plugin can find out by itself (version, commit, time, host)."""
        return cls(
            model=model,
            server_info=server_info or {},
            plugin_version=_plugin_version(),
            git_commit=_git_commit(suite_dir),
            recorded_at=utc_timestamp(),
            client_host=socket.gethostname() or None,
            session_ids=tuple(session_ids),
        )


def _plugin_version() -> str | None:
    """Installed distribution version, else the package's ``__version__`` (source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-kimi")
    except PackageNotFoundError:
        package = sys.modules.get(__name__.rpartition(".")[0])
        found = getattr(package, "__version__", None)
        return found if isinstance(found, str) else None


def _git_commit(suite_dir: Path | None) -> str | None:
    """Short commit of the suite, ``+dirty`` when tracked files are modified; None outside git."""
    cwd = str(suite_dir) if suite_dir is not None else None
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if head and dirty else (head or None)


@dataclass(frozen=True)
class FieldChange:
    """One provenance difference that may explain a throughput change."""

    field: str
    """``model``, ``plugin_version``, or a flattened server_info key like ``enable_eplb``."""
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.field}: {_scalar_text(self.old)} -> {_scalar_text(self.new)}"


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Dotted keys for nested mappings; lists of mappings by index; other lists whole."""
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            _flatten(sub, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and any(isinstance(v, Mapping) for v in value):
        for i, sub in enumerate(value):
            _flatten(sub, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def _ignored(key: str, patterns: Sequence[str]) -> bool:
    components = [c for c in re.split(r"\.|\[\d+\]", key) if c]
    prefixes = []
    for match in re.finditer(r"\.|\[\d+\]|$", key):
        prefixes.append(key[: match.start()])
    for pattern in patterns:
        if "." in pattern:
            if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
                return True
        elif any(fnmatch.fnmatchcase(c, pattern) for c in components):
            return True
    return False


def provenance_diff(
    old: Provenance, new: Provenance, *, ignore: Sequence[str] = SERVER_INFO_IGNORE
) -> list[FieldChange]:
    """Non-volatile differences: model, plugin version, then server_info keys (sorted).

    Volatile provenance fields (:attr:`Provenance.VOLATILE`) and server_info entries matching
    ``ignore`` are left out, so an empty list means "same setup, numbers directly comparable".
    """
    changes: list[FieldChange] = []
    for name in ("model", "plugin_version"):
        if getattr(old, name) != getattr(new, name):
            changes.append(FieldChange(name, getattr(old, name), getattr(new, name)))
    flat_old: dict[str, Any] = {}
    flat_new: dict[str, Any] = {}
    _flatten(old.server_info, "", flat_old)
    _flatten(new.server_info, "", flat_new)
    for key in sorted(set(flat_old) | set(flat_new)):
        if not key or _ignored(key, ignore):
            continue
        a, b = flat_old.get(key, _ABSENT), flat_new.get(key, _ABSENT)
        if a is _ABSENT or b is _ABSENT or _canon_json(a) != _canon_json(b):
            changes.append(FieldChange(key, a, b))
    # A flag changed on the command line shows twice: as asked (launch_command.args.X) and as
    # resolved (X).  Name it once, as resolved; a launch arg stays when only it changed.
    resolved = {c.field for c in changes}
    return [c for c in changes
            if not (c.field.startswith(_LAUNCH_ARGS) and c.field[len(_LAUNCH_ARGS):] in resolved)]


_LAUNCH_ARGS = "launch_command.args."


def _canon_json(value: Any) -> str:
    # type-exact comparison: false != 0, 1 == 1.0 is fine for config numbers
    if isinstance(value, bool):
        return "b" + str(value)
    if _is_number(value):
        return "n" + repr(float(value))
    return json.dumps(value, sort_keys=True)


def incomparable(old: Provenance, new: Provenance) -> str | None:
    """Why numbers recorded under ``old`` cannot be a target for a run under ``new``, if so.

    Only a different model is refused: other changes (server flags, versions) are exactly what
    the regression test exists to judge, and :func:`provenance_diff` reports them.
    """
    if old.model and new.model and old.model != new.model:
        return (
            f"baseline was recorded against model {old.model!r} but the endpoint serves "
            f"{new.model!r}; throughput of different models is not comparable "
            f"(re-record the baseline or use a separate profile)"
        )
    return None


# ------------------------------------------------------------------------------------ test file


@dataclass(frozen=True)
class TestBaseline:
    """Everything recorded for one test in one profile: the content of one file."""

    __test__ = False  # a class named Test* imported into a test module is not a test

    test: str
    """pytest nodeid, e.g. ``tests/perf/test_ep8.py::TestSweep::test_peak[c8]``."""
    profile: str
    provenance: Provenance
    levels: tuple[LevelBaseline, ...]
    """Sorted by workload; no two levels share a workload."""

    def __post_init__(self) -> None:
        if not isinstance(self.test, str) or "::" not in self.test:
            raise ValueError(f"test must be a pytest nodeid like 'tests/x.py::test_y', got {self.test!r}")
        _check_profile(self.profile)
        levels = tuple(self.levels)
        seen: dict[WorkloadKey, int] = {}
        for i, level in enumerate(levels):
            if not isinstance(level, LevelBaseline):
                raise ValueError(f"levels[{i}] is not a LevelBaseline: {level!r}")
            if level.workload in seen:
                raise ValueError(
                    f"levels[{seen[level.workload]}] and levels[{i}] have the same workload "
                    f"{level.workload}"
                )
            seen[level.workload] = i
        object.__setattr__(self, "levels", tuple(sorted(levels, key=lambda l: l.workload.sort_key())))

    @property
    def workloads(self) -> list[WorkloadKey]:
        return [level.workload for level in self.levels]

    def level_for(self, workload: WorkloadLike) -> LevelBaseline | None:
        """The level with exactly this workload, or None: never a "nearest" one."""
        key = WorkloadKey.of(workload)
        for level in self.levels:
            if level.workload == key:
                return level
        return None

    def explain_miss(self, workload: WorkloadLike) -> str:
        """Why :meth:`level_for` finds nothing, phrased in terms of the differing keys, e.g.
        ``baseline has concurrency 1, 8 at max_tokens 512; this run asks max_tokens 256``."""
        want = WorkloadKey.of(workload)
        head = f"no baseline level for {self.test} (profile {self.profile}) with workload {want}"
        if self.level_for(want) is not None:
            return f"{head.replace('no baseline level', 'a baseline level exists')}"
        if not self.levels:
            return f"{head}: the baseline has no levels"
        keys = sorted(set(want.keys()).union(*(w.keys() for w in self.workloads)))
        values: dict[str, list[Any]] = {}
        for key in keys:
            distinct: list[Any] = []
            for w in self.workloads:
                v = w.get(key, _ABSENT)
                if not any(_same(v, d) for d in distinct):
                    distinct.append(v)
            values[key] = sorted(distinct, key=lambda v: (-1, 0) if v is _ABSENT else _value_rank(v))
        outside = [k for k in keys if not any(_same(want.get(k, _ABSENT), v) for v in values[k])]

        def show(key: str, vals: Sequence[Any]) -> str:
            return f"{key} {', '.join('unset' if v is _ABSENT else _scalar_text(v) for v in vals)}"

        varying = [show(k, values[k]) for k in keys if len(values[k]) > 1]
        constant = [
            show(k, values[k])
            for k in keys
            if len(values[k]) == 1 and (k in outside or not varying)
        ]
        if varying and constant:
            has = f"{'; '.join(varying)} at {', '.join(constant)}"
        else:
            has = "; ".join(varying or constant)
        if outside:
            asks = ", ".join(show(k, [want.get(k, _ABSENT)]) for k in outside)
            return f"{head}: baseline has {has}; this run asks {asks}"
        extra = [k for k in keys if len(values[k]) > 1]
        levels = ", ".join(f"[{w.label(extra)}]" for w in self.workloads)
        return (
            f"{head}: each value exists in the baseline but not in this combination; "
            f"baseline levels are {levels}; this run asks [{want.label(extra)}]"
        )


def _same(a: Any, b: Any) -> bool:
    if a is _ABSENT or b is _ABSENT:
        return a is b
    return WorkloadKey((("k", a),)) == WorkloadKey((("k", b),))


# ------------------------------------------------------------------------------------------ paths

_SAFE_PART = re.compile(r"[A-Za-z0-9_=+,@-][A-Za-z0-9_.=+,@-]*")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.=+,@-]+")
_MAX_PART = 100
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _safe_part(text: str) -> str:
    """A file-name-safe, deterministic, practically injective form of one nodeid component.

    Components made only of ``[A-Za-z0-9_.=+,@-]`` (not starting with ``.``, at most 100
    characters) are kept verbatim, which covers ordinary names and parameter ids.  Anything
    else has each run of other characters replaced by ``_``, is cut to 60 characters, and gets
    ``~`` plus 8 hex digits of the SHA-1 of the original appended; ``~`` never occurs in a
    verbatim component, so a sanitised name cannot collide with a verbatim one.
    """
    if _SAFE_PART.fullmatch(text) and len(text) <= _MAX_PART:
        return text
    cleaned = _UNSAFE_RUN.sub("_", text).strip("._")[:60] or "_"
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned}~{digest}"


def baseline_relpath(nodeid: str) -> Path:
    """Where a test's baseline lives, relative to ``<root>/<profile>``.

    ``tests/perf/test_ep8.py::TestSweep::test_peak[c8-512]`` becomes
    ``tests/perf/test_ep8/TestSweep.test_peak[c8-512].yaml``: the module path without ``.py``
    as directories, then class and function joined by ``.``, then the parameter id in
    brackets.  Each part goes through :func:`_safe_part`, so ``/``, spaces, ``..`` or very long
    ids can neither escape the directory nor make an unusable name.
    """
    if not isinstance(nodeid, str) or "::" not in nodeid:
        raise ValueError(f"not a pytest test nodeid (expected 'path.py::name'): {nodeid!r}")
    module, rest = nodeid.split("::", 1)
    param: str | None = None
    if "[" in rest:  # class and function names cannot hold '[': the first one opens the id
        names_text, param = rest.split("[", 1)
        if param.endswith("]"):
            param = param[:-1]
    else:
        names_text = rest
    names = [n for n in names_text.split("::") if n]
    if not names:
        raise ValueError(f"not a pytest test nodeid (no test name): {nodeid!r}")
    dirs = [c for c in module.replace("\\", "/").split("/") if c]
    if not dirs:
        raise ValueError(f"not a pytest test nodeid (no module path): {nodeid!r}")
    if dirs[-1].endswith(".py") and len(dirs[-1]) > 3:
        dirs[-1] = dirs[-1][:-3]
    stem = ".".join(_safe_part(n) for n in names)
    if param is not None:
        stem += f"[{_safe_part(param)}]"
    return Path(*[_safe_part(d) for d in dirs], f"{stem}.yaml")


def _check_profile(profile: str) -> None:
    if not isinstance(profile, str) or not _PROFILE.fullmatch(profile):
        raise ValueError(
            f"profile must be 1-64 characters of letters, digits, '_', '.', '-' starting with a "
            f"letter or digit (it is a directory name), got {profile!r}"
        )


# ------------------------------------------------------------------------------------------ YAML


class _FlowMap(dict):  # type: ignore[type-arg]
    """A mapping written on one line: workloads and summaries, which read best as a row."""


class _FlowSeq(list):  # type: ignore[type-arg]
    """A list written on one line: trials and short scalar lists."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that indents block sequences under their key, as most people write YAML."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_Dumper.add_representer(
    _FlowMap, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)
_Dumper.add_representer(
    _FlowSeq, lambda d, data: d.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def _styled(value: Any) -> Any:
    """Block style for nested mappings, flow style for lists of scalars (server_info)."""
    if isinstance(value, Mapping):
        return {k: _styled(v) for k, v in value.items()}
    if isinstance(value, list):
        if all(not isinstance(v, (Mapping, list)) for v in value):
            return _FlowSeq(value)
        return [_styled(v) for v in value]
    return value


def _document(baseline: TestBaseline) -> dict[str, Any]:
    levels = []
    for level in baseline.levels:
        entry: dict[str, Any] = {
            "workload": _FlowMap(level.workload.items),
            "tok_s": level.tok_s,
            "trials_tok_s": _FlowSeq(level.trials_tok_s),
        }
        if level.request_tok_s:
            entry["request_tok_s"] = _FlowMap(level.request_tok_s)
        if level.ttft_s:
            entry["ttft_s"] = _FlowMap(level.ttft_s)
        levels.append(entry)
    p = baseline.provenance
    provenance = {
        "model": p.model,
        "plugin_version": p.plugin_version,
        "git_commit": p.git_commit,
        "recorded_at": p.recorded_at,
        "client_host": p.client_host,
        "session_ids": _FlowSeq(p.session_ids),
        "server_info": _styled(p.server_info),  # last: it can be long
    }
    return {
        "schema": SCHEMA_VERSION,
        "test": baseline.test,
        "profile": baseline.profile,
        "levels": levels,  # before provenance: the numbers are what a reviewer looks for
        "provenance": provenance,
    }


def dumps(baseline: TestBaseline) -> str:
    """The exact file text for a baseline (stable: same baseline, same bytes)."""
    body = yaml.dump(
        _document(baseline),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 16,
        indent=2,
    )
    return _HEADER + body


_TOP_KEYS = ("schema", "test", "profile", "levels", "provenance")
_LEVEL_KEYS = ("workload", "tok_s", "trials_tok_s", "request_tok_s", "ttft_s")
_PROVENANCE_KEYS = (
    "model", "plugin_version", "git_commit", "recorded_at", "client_host", "session_ids", "server_info",
)


def _check_duplicate_keys(node: yaml.Node, seen_nodes: set[int] | None = None) -> None:
    """``safe_load`` keeps the last of two equal keys silently; a hand edit must not."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                line = key_node.start_mark.line + 1
                if key_node.value in first:
                    raise _Invalid(
                        f"duplicate key {key_node.value!r} at line {line} "
                        f"(first at line {first[key_node.value]})"
                    )
                first[key_node.value] = line
            _check_duplicate_keys(value_node, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, seen_nodes)


def _parse_yaml(text: str) -> Any:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)  # node graph only, no construction
    except yaml.YAMLError as exc:
        raise _Invalid(_yaml_error_text(exc)) from None
    if node is not None:
        _check_duplicate_keys(node)
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as exc:  # e.g. an impossible date
        raise _Invalid(
            _yaml_error_text(exc) if isinstance(exc, yaml.YAMLError) else f"cannot read YAML: {exc}"
        ) from None


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    detail = f"{problem} ({context})" if context else problem
    return f"YAML syntax error{where}: {detail}"


def _require_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Invalid(f"{what} must be a mapping, got {type(value).__name__} {value!r}")
    return value


def _reject_unknown(mapping: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    unknown = [str(k) for k in mapping if k not in allowed]
    if unknown:
        raise _Invalid(f"{what} has unknown key(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")


def _optional_str(mapping: Mapping[str, Any], key: str, what: str) -> str | None:
    value = mapping.get(key)
    if isinstance(value, _dt.datetime) and key == "recorded_at":  # unquoted timestamp, hand-written
        return utc_timestamp(value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc))
    if value is not None and not isinstance(value, str):
        raise _Invalid(f"{what}.{key} must be a string (quote it in YAML), got {value!r}")
    return value


def _parse_level(index: int, raw: Any) -> LevelBaseline:
    what = f"levels[{index}]"
    entry = _require_mapping(raw, what)
    if "workload" not in entry:
        raise _Invalid(f"{what} has no 'workload'")
    workload_raw = _require_mapping(entry["workload"], f"{what}.workload")
    try:
        workload = WorkloadKey.from_dict(workload_raw)
    except ValueError as exc:
        raise _Invalid(f"{what}.workload: {exc}") from None
    if not workload.items:
        raise _Invalid(f"{what}.workload is empty")
    what = f"{what} (workload {workload})"
    _reject_unknown(entry, _LEVEL_KEYS, what)
    if "trials_tok_s" not in entry:
        raise _Invalid(f"{what} has no 'trials_tok_s'")
    trials = entry["trials_tok_s"]
    if not isinstance(trials, list):
        raise _Invalid(f"{what}: trials_tok_s must be a list of positive numbers, got {trials!r}")
    try:
        level = LevelBaseline(
            workload=workload,
            trials_tok_s=tuple(trials),
            request_tok_s=entry.get("request_tok_s"),
            ttft_s=entry.get("ttft_s"),
        )
    except ValueError as exc:
        raise _Invalid(f"{what}: {exc}") from None
    if "tok_s" in entry:
        stated = entry["tok_s"]
        if not _is_number(stated) or stated != level.tok_s:
            raise _Invalid(
                f"{what}: tok_s {stated!r} is not the median of trials_tok_s ({level.tok_s}); "
                f"it is derived from the trials: fix or delete it"
            )
    return level


def _parse_provenance(raw: Any) -> Provenance:
    what = "provenance"
    prov = _require_mapping(raw, what)
    _reject_unknown(prov, _PROVENANCE_KEYS, what)
    session_ids = prov.get("session_ids") or []
    if not isinstance(session_ids, list) or not all(isinstance(s, str) for s in session_ids):
        raise _Invalid(f"provenance.session_ids must be a list of strings, got {session_ids!r}")
    server_info = prov.get("server_info") or {}
    _require_mapping(server_info, "provenance.server_info")
    try:
        return Provenance(
            model=_optional_str(prov, "model", what),
            server_info=server_info,
            plugin_version=_optional_str(prov, "plugin_version", what),
            git_commit=_optional_str(prov, "git_commit", what),
            recorded_at=_optional_str(prov, "recorded_at", what),
            client_host=_optional_str(prov, "client_host", what),
            session_ids=tuple(session_ids),
        )
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


def _from_data(data: Any) -> TestBaseline:
    if data is None:
        raise _Invalid("file is empty")
    top = _require_mapping(data, "the document")
    if "schema" not in top:
        raise _Invalid(f"missing 'schema' (this pytest-kimi reads schema: {SCHEMA_VERSION})")
    if top["schema"] != SCHEMA_VERSION or isinstance(top["schema"], bool):
        raise _Invalid(
            f"unsupported schema {top['schema']!r}; this pytest-kimi reads schema {SCHEMA_VERSION} "
            f"(upgrade pytest-kimi, or re-record the baseline)"
        )
    _reject_unknown(top, _TOP_KEYS, "the document")
    for key in ("test", "profile"):
        if not isinstance(top.get(key), str) or not top[key]:
            raise _Invalid(f"'{key}' must be a non-empty string, got {top.get(key)!r}")
    if "provenance" not in top:
        raise _Invalid("missing 'provenance'")
    provenance = _parse_provenance(top["provenance"])
    raw_levels = top.get("levels")
    if not isinstance(raw_levels, list) or not raw_levels:
        raise _Invalid(f"'levels' must be a non-empty list, got {raw_levels!r}")
    levels = [_parse_level(i, raw) for i, raw in enumerate(raw_levels)]
    first: dict[WorkloadKey, int] = {}
    for i, level in enumerate(levels):
        if level.workload in first:
            raise _Invalid(
                f"levels[{first[level.workload]}] and levels[{i}] have the same workload "
                f"{level.workload}; keep one"
            )
        first[level.workload] = i
    try:
        return TestBaseline(
            test=top["test"], profile=top["profile"], provenance=provenance, levels=tuple(levels)
        )
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


def loads(text: str, *, source: Path | str = "<string>") -> TestBaseline:
    """Parse file text (``yaml.safe_load`` only); problems raise :class:`BaselineError`
    naming ``source``."""
    try:
        return _from_data(_parse_yaml(text))
    except _Invalid as exc:
        raise BaselineError(source, str(exc)) from None


# ----------------------------------------------------------------------------------------- merge


def merge(old: TestBaseline | None, new: TestBaseline, *, drop_stale: bool = False) -> TestBaseline:
    """The file content after recording ``new`` on top of ``old``.

    Rule: a level in ``new`` replaces the level with the same workload; levels of ``old`` that
    ``new`` did not measure are kept unchanged; provenance becomes ``new``'s, with the session
    ids of both when old levels are kept.  Keeping old levels is refused
    (:class:`ProvenanceConflict`) when the provenance differs in a non-volatile way, since one
    provenance block would then describe numbers it did not produce; ``drop_stale=True``
    drops those levels instead.
    """
    if old is None:
        return new
    if (old.test, old.profile) != (new.test, new.profile):
        raise ValueError(f"cannot merge {old.test} [{old.profile}] into {new.test} [{new.profile}]")
    measured = set(new.workloads)
    stale = [level for level in old.levels if level.workload not in measured]
    if not stale:
        return new
    if drop_stale:
        return new
    changes = provenance_diff(old.provenance, new.provenance)
    if changes:
        shown = "; ".join(str(c) for c in changes[:8]) + ("; ..." if len(changes) > 8 else "")
        raise ProvenanceConflict(
            f"{new.test} [{new.profile}]: levels {', '.join(l.workload.label() for l in stale)} "
            f"were recorded under a different setup ({shown}) and this run did not re-measure "
            f"them; re-record every level of the test, or drop the stale levels"
        )
    session_ids = list(old.provenance.session_ids)
    session_ids += [s for s in new.provenance.session_ids if s not in session_ids]
    provenance = dataclasses.replace(new.provenance, session_ids=tuple(session_ids))
    return dataclasses.replace(new, provenance=provenance, levels=new.levels + tuple(stale))


# --------------------------------------------------------------------------------- update report


@dataclass(frozen=True)
class LevelChange:
    """One line of an update summary."""

    workload: WorkloadKey
    old_tok_s: float | None
    new_tok_s: float | None
    status: Literal["new", "changed", "unchanged", "removed"]
    label: str

    @property
    def delta_pct(self) -> float | None:
        if self.old_tok_s is None or self.new_tok_s is None:
            return None
        return (self.new_tok_s - self.old_tok_s) / self.old_tok_s * 100.0

    def __str__(self) -> str:
        if self.status == "new":
            return f"{self.label}: {self.new_tok_s} tok/s (new)"
        if self.status == "removed":
            return f"{self.label}: {self.old_tok_s} tok/s (removed)"
        if self.status == "unchanged":
            return f"{self.label}: {self.new_tok_s} tok/s (unchanged)"
        return f"{self.label}: {self.old_tok_s} -> {self.new_tok_s} tok/s ({self.delta_pct:+.1f}%)"


@dataclass(frozen=True)
class UpdateSummary:
    """What a baseline update did, for the terminal report and the PR description."""

    path: Path
    test: str
    profile: str
    created: bool
    levels: tuple[LevelChange, ...]
    provenance_changes: tuple[FieldChange, ...]
    git_commands: tuple[str, ...]
    """Review then commit, e.g. ``git diff -- <path>`` and ``git add <path> && git commit ...``."""

    def lines(self) -> list[str]:
        out = [f"{self.test} [{self.profile}] -> {self.path}{' (new file)' if self.created else ''}"]
        out += [f"  {change}" for change in self.levels]
        out += [f"  provenance: {change}" for change in self.provenance_changes]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines() + [f"  $ {cmd}" for cmd in self.git_commands])


def _display_path(path: Path, cwd: Path | None) -> str:
    base = Path.cwd() if cwd is None else cwd
    try:
        return str(Path(os.path.abspath(path)).relative_to(os.path.abspath(base)))
    except ValueError:
        return str(path)


def git_review_commands(
    paths: Sequence[Path], *, message: str, new_paths: Sequence[Path] = (), cwd: Path | None = None
) -> tuple[str, ...]:
    """Shell commands to review and commit updated baselines (paths quoted for the shell).

    New files are not in ``git diff`` until added, so they get a ``--no-index`` diff instead.
    """
    new_set = {os.path.abspath(p) for p in new_paths}
    shown = [shlex.quote(_display_path(p, cwd)) for p in paths]
    changed = [s for p, s in zip(paths, shown) if os.path.abspath(p) not in new_set]
    created = [s for p, s in zip(paths, shown) if os.path.abspath(p) in new_set]
    commands: list[str] = []
    if changed:
        commands.append(f"git diff -- {' '.join(changed)}")
    commands += [f"git diff --no-index -- /dev/null {s}" for s in created]
    if shown:
        commands.append(f"git add -- {' '.join(shown)} && git commit -m {shlex.quote(message)}")
    return tuple(commands)


def summarize_update(
    old: TestBaseline | None, new: TestBaseline, path: Path, *, cwd: Path | None = None
) -> UpdateSummary:
    """Per-level lines (``C=8 max_tokens=512: 1520.3 -> 1498.0 tok/s (-1.5%)``), provenance
    changes, and the git commands; ``new`` is the content written (after :func:`merge`)."""
    old_levels = {level.workload: level for level in (old.levels if old else ())}
    all_keys = [lvl.workload for lvl in new.levels] + [w for w in old_levels if new.level_for(w) is None]
    varying = sorted(
        {k for w in all_keys for k in w.keys() if len({_scalar_text(x.get(k, _ABSENT)) for x in all_keys}) > 1}
    )
    changes: list[LevelChange] = []
    for level in new.levels:
        before = old_levels.get(level.workload)
        label = level.workload.label(varying)
        if before is None:
            changes.append(LevelChange(level.workload, None, level.tok_s, "new", label))
        elif before == level:
            changes.append(LevelChange(level.workload, before.tok_s, level.tok_s, "unchanged", label))
        else:
            changes.append(LevelChange(level.workload, before.tok_s, level.tok_s, "changed", label))
    for workload, before in old_levels.items():
        if new.level_for(workload) is None:
            changes.append(LevelChange(workload, before.tok_s, None, "removed", workload.label(varying)))
    prov = tuple(provenance_diff(old.provenance, new.provenance)) if old else ()
    created = old is None
    verb = "add" if created else "update"
    commands = git_review_commands(
        [path],
        message=f"kimi baseline ({new.profile}): {verb} {new.test}",
        new_paths=[path] if created else [],
        cwd=cwd,
    )
    return UpdateSummary(path, new.test, new.profile, created, tuple(changes), prov, commands)


# ----------------------------------------------------------------------------------------- store


@dataclass(frozen=True)
class BaselineLookup:
    """Result of looking a workload up: the level, or the reason there is none."""

    path: Path
    baseline: TestBaseline | None
    level: LevelBaseline | None
    reason: str | None
    """Set exactly when ``level`` is None: no file, or which workloads the file does hold."""

    @property
    def found(self) -> bool:
        return self.level is not None


class BaselineStore:
    """Baselines of one profile under ``root`` (usually ``<rootdir>/baselines``)."""

    def __init__(self, root: Path, profile: str = DEFAULT_PROFILE) -> None:
        _check_profile(profile)
        self.root = Path(root)
        self.profile = profile

    @property
    def directory(self) -> Path:
        return self.root / self.profile

    def path_for(self, nodeid: str) -> Path:
        return self.directory / baseline_relpath(nodeid)

    def _read(self, path: Path) -> TestBaseline:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise BaselineError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        baseline = loads(text, source=path)
        if baseline.profile != self.profile:
            raise BaselineError(
                path, f"profile is {baseline.profile!r} but the file is in profile {self.profile!r}"
            )
        expected = self.path_for(baseline.test)
        if os.path.abspath(expected) != os.path.abspath(path):
            raise BaselineError(
                path, f"holds test {baseline.test!r}, whose baseline belongs at {expected}"
            )
        return baseline

    def load(self, nodeid: str) -> TestBaseline | None:
        """The test's baseline, None when it has none; :class:`BaselineError` when unusable."""
        path = self.path_for(nodeid)
        if not path.is_file():
            return None
        baseline = self._read(path)
        if baseline.test != nodeid:  # only reachable through a sanitisation hash collision
            raise BaselineError(path, f"holds test {baseline.test!r}, not {nodeid!r}")
        return baseline

    def lookup(self, nodeid: str, workload: WorkloadLike) -> BaselineLookup:
        path = self.path_for(nodeid)
        baseline = self.load(nodeid)
        if baseline is None:
            return BaselineLookup(path, None, None, f"no baseline for {nodeid} (profile {self.profile}): {path} does not exist")
        level = baseline.level_for(workload)
        reason = None if level is not None else baseline.explain_miss(workload)
        return BaselineLookup(path, baseline, level, reason)

    def save(self, baseline: TestBaseline, *, overwrite: bool = False) -> Path:
        """Write the file atomically; an existing file is replaced only with ``overwrite``."""
        if baseline.profile != self.profile:
            raise ValueError(f"baseline is for profile {baseline.profile!r}, store is {self.profile!r}")
        path = self.path_for(baseline.test)
        _atomic_write(path, dumps(baseline), overwrite=overwrite)
        return path

    def update(self, new: TestBaseline, *, drop_stale: bool = False, cwd: Path | None = None) -> UpdateSummary:
        """Merge ``new`` into the stored file (see :func:`merge`), write it, and summarise.

        A corrupt existing file raises :class:`BaselineError` before anything is written.
        """
        old = self.load(new.test)
        merged = merge(old, new, drop_stale=drop_stale)
        path = self.save(merged, overwrite=old is not None)
        return summarize_update(old, merged, path, cwd=cwd)

    def iter_all(self) -> Iterator[TestBaseline]:
        """Every baseline of the profile, in path order; a bad file raises BaselineError."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.rglob("*.yaml")):
            if path.name.startswith(".") or not path.is_file():
                continue  # our temp files, editor swap files
            yield self._read(path)


def _atomic_write(path: Path, text: str, *, overwrite: bool) -> None:
    """Temp file in the same directory, fsync, then rename into place.

    Readers (and a crash) see the old file or the new one, never half of one.  Without
    ``overwrite`` the rename is a hard link, which fails atomically if the target appeared in
    the meantime (two workers recording the same test); filesystems without hard links fall
    back to check-then-rename.
    """
    if not overwrite and path.exists():
        raise BaselineExistsError(
            f"{path}: a baseline already exists; pass overwrite=True (a deliberate re-record) to replace it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies, unlike mkstemp
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise BaselineExistsError(
                    f"{path}: a baseline was created concurrently; not overwriting it"
                ) from None
            except OSError:
                if path.exists():
                    raise BaselineExistsError(f"{path}: a baseline already exists") from None
                os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; not possible on every platform, so best effort."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
