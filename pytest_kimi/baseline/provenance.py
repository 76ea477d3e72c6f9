"""Provenance: who and what produced a baseline's numbers, and whether two setups differ.

A throughput figure is only a target for a run on the same setup; when a target moves, the
reviewer needs to see what else moved with it (a server flag, the engine version, the model).
:class:`Provenance` is what a baseline file records about its recording (gathered by
:meth:`Provenance.collect`, which asks git and the installed distribution), and
:func:`provenance_diff` / :func:`incomparable` are the one place that decides which differences
matter.  No pytest here.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pytest_kimi.baseline.values import ABSENT, is_number, scalar_text, utc_timestamp
from pytest_kimi.endpoint.serverinfo import VOLATILE_SERVER_INFO, clean_server_info, is_volatile

__all__ = [
    "SERVER_INFO_IGNORE",
    "Provenance",
    "FieldChange",
    "deployment_diff",
    "provenance_diff",
    "incomparable",
]

SERVER_INFO_IGNORE: tuple[str, ...] = VOLATILE_SERVER_INFO
"""Patterns for ``server_info`` entries that :func:`provenance_diff` ignores (their one home
is :mod:`pytest_kimi.endpoint.serverinfo`, where server info enters the plugin).  Server info
entering now never holds them; records written before it dropped them (the history's older
runs) still do."""


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
    """The allow-listed server arguments and version as the endpoint reports them (SGLang
    ``/server_info``): :func:`~pytest_kimi.endpoint.serverinfo.clean_server_info` keeps the
    fields :data:`~pytest_kimi.endpoint.serverinfo.PROVENANCE_SERVER_INFO` names, scrubbed,
    and a digest of the rest; whatever it is given, as a baseline is committed to git."""
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
        # Allow-listed and scrubbed here too, whatever path the info took (a hand-edited or
        # older baseline, a report from elsewhere): a baseline is committed to git.
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
            plugin_version=plugin_version(),
            git_commit=git_commit(suite_dir),
            recorded_at=utc_timestamp(),
            client_host=socket.gethostname() or None,
            session_ids=tuple(session_ids),
        )


def plugin_version() -> str | None:
    """Installed distribution version, else the package's ``__version__`` (source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-kimi")
    except PackageNotFoundError:
        from pytest_kimi import __version__

        return __version__


def _git(suite_dir: Path | None, *args: str) -> str:
    """One git command in the suite's directory, its output stripped.

    Raises ``OSError`` (no git) or ``subprocess.SubprocessError`` (not a checkout, a timeout).
    """
    return subprocess.run(
        ["git", *args],
        cwd=str(suite_dir) if suite_dir is not None else None,
        capture_output=True,
        text=True,
        timeout=5,
        check=True,
    ).stdout.strip()


def git_commit(suite_dir: Path | None) -> str | None:
    """Short commit of the suite, ``+dirty`` when tracked files are modified; None outside git."""
    try:
        head = _git(suite_dir, "rev-parse", "--short=12", "HEAD")
        dirty = _git(suite_dir, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if head and dirty else (head or None)


def git_branch(suite_dir: Path | None) -> str | None:
    """The suite's checked-out branch; None outside git and on a detached HEAD (as CI checks
    out a pull request), where the caller may know it from CI's environment instead."""
    try:
        branch = _git(suite_dir, "rev-parse", "--abbrev-ref", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return None if branch in ("", "HEAD") else branch


@dataclass(frozen=True)
class FieldChange:
    """One provenance difference that may explain a throughput change."""

    field: str
    """``model``, ``plugin_version``, or a flattened server_info key like ``enable_eplb``."""
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.field}: {scalar_text(self.old)} -> {scalar_text(self.new)}"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys for nested mappings; lists of mappings by index; other lists whole
    (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``).  The one flat form of provenance: the baseline
    diff and the history (which stores and compares it) both use it."""
    out: dict[str, Any] = {}
    _flatten_into(value, prefix, out)
    return out


def _flatten_into(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            _flatten_into(sub, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and any(isinstance(v, Mapping) for v in value):
        for i, sub in enumerate(value):
            _flatten_into(sub, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def is_ignored(key: str, patterns: Sequence[str]) -> bool:
    """Whether a flat server_info key matches an ignore pattern: a dotted pattern matches a
    key prefix (``launch_command.*``), a plain one any component (``*_port``).  The one
    matcher is :func:`pytest_kimi.endpoint.serverinfo.is_volatile`."""
    return is_volatile(key, patterns)


def flat_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str] | None = None
) -> list[FieldChange]:
    """What differs between two flat provenances, over ``keys`` (all of both, sorted, when
    None): a key on one side only (the other side :data:`ABSENT`), or a value that differs as
    configuration (``false != 0``, ``1 == 1.0``)."""
    changes: list[FieldChange] = []
    for key in sorted(set(old) | set(new)) if keys is None else keys:
        a, b = old.get(key, ABSENT), new.get(key, ABSENT)
        if a is ABSENT or b is ABSENT or _canon_json(a) != _canon_json(b):
            changes.append(FieldChange(key, a, b))
    return changes


def named_once(changes: Sequence[FieldChange]) -> list[FieldChange]:
    """A flag changed on the command line shows twice: as asked (launch_command.args.X) and as
    resolved (X).  Name it once, as resolved; a launch arg stays when only it changed."""
    resolved = {c.field for c in changes}
    return [
        c
        for c in changes
        if not (c.field.startswith(_LAUNCH_ARGS) and c.field[len(_LAUNCH_ARGS) :] in resolved)
    ]


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

    def info(p: Provenance) -> dict[str, Any]:
        flat = flatten(p.server_info)
        return {k: v for k, v in flat.items() if k and not is_ignored(k, ignore)}

    changes += flat_changes(info(old), info(new))
    return named_once(changes)


LAUNCH_LOTTERY = ("seed", "random_seed")
"""Settings a launch draws afresh (the simulator's ``seed``, SGLang's ``random_seed`` when not
given): two launches of one deployment differ in them by chance, not by a change."""


def deployment_diff(old: Provenance, new: Provenance) -> list[FieldChange]:
    """:func:`provenance_diff` without the launch's lottery (:data:`LAUNCH_LOTTERY`): what
    makes two launches two deployments.  Empty: the same deployment, launched again, so the
    distance between their figures is session noise (the deploy gate's list of changed flags,
    the pooling of a re-recorded baseline's noise)."""
    return [
        c for c in provenance_diff(old, new) if c.field.rsplit(".", 1)[-1] not in LAUNCH_LOTTERY
    ]


_LAUNCH_ARGS = "launch_command.args."


def _canon_json(value: Any) -> str:
    # type-exact comparison: false != 0, 1 == 1.0 is fine for config numbers
    if isinstance(value, bool):
        return "b" + str(value)
    if is_number(value):
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
