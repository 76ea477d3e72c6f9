"""A deployment diff as atomic changes, and the deployments between two profiles.

When the deploy gate says a candidate deployment is slower, the next question is *which part of
the change* did it, and a deploy change is rarely one flag: a new profile changes several server
arguments, environment variables, the engine (another interpreter or venv, hence another
version) and sometimes the model.  The culprit search (:mod:`pytest_kimi.gate.culprit`) answers
it by launching the reference with a *subset* of the changes applied; this module is the
profile algebra it needs, pytest-free and launch-free:

* :func:`atomic_changes` cuts the difference between two managed profiles into
  :class:`Change` s, each named as the profile writes it (``enable-eplb`` for a server argument,
  ``env:NAME`` for an environment variable, ``engine`` for the command that runs the server,
  ``model`` for the model path or revision, ``nice`` for the server's CPU niceness), and gathers
  them into :class:`ChangeGroup` s: the units a search may apply apart.  Changes that cannot
  be applied apart (a speculative algorithm and its draft model) are declared as a group by
  the caller; every other change is a group of its own.
* :func:`derive` builds the reference with some groups applied: an ordinary
  :class:`~pytest_kimi.server.profile.ServerProfile` the launcher starts like any other.

A change is what the *server* would see differently: an argument whose rendered command-line
words are the same on both sides (``enable-eplb: false`` against no ``enable-eplb`` at all:
both leave the flag out) is no change, because testing it would spend launches on a
deployment identical to the reference.  Values are for reports and never carry a secret
(``***`` for a secret-named flag or variable, or one that either profile's ``secret_env``
lists); :func:`derive` reads the real values from the profiles themselves.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.scrub import is_secret_flag, is_secret_name, scrub_argv
from pytest_kimi.server import sglang_flags
from pytest_kimi.server.profile import ProfileError, ServerProfile

__all__ = [
    "ENGINE_KEY",
    "MODEL_FLAGS",
    "MODEL_KEY",
    "NICE_KEY",
    "SECRET_SHOWN",
    "Change",
    "ChangeGroup",
    "atomic_changes",
    "derive",
    "derived_name",
]

MODEL_FLAGS: tuple[str, ...] = ("model-path", "model", "revision")
"""Arguments that say *which weights* are served (SGLang's ``model-path``, vLLM's ``model``,
either's ``revision``): one change, ``model``, however many of them differ, because a new
path and its revision are one decision and applying one without the other serves a checkpoint
nobody deployed."""

MODEL_KEY = "model"
ENGINE_KEY = "engine"
NICE_KEY = "nice"
ENV_PREFIX = "env:"
SECRET_SHOWN = "***"
"""What a report shows for a secret value (an API key that changed is a change; its value is
never shown)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One atomic difference between the reference and the candidate deployment."""

    key: str
    """As the profile writes it: ``enable-eplb``, ``env:NAME``, ``engine``, ``model``,
    ``nice``.  Reports, ``--perf-culprit`` groups and derived profile names use it."""
    kind: str
    """``arg``, ``env``, ``engine``, ``model`` or ``setting`` (``nice``)."""
    reference: str | None
    """The reference's value as shown (``***`` when secret); None when the reference does not
    set it (an argument left out, a variable inherited from the plugin's environment)."""
    candidate: str | None
    """The candidate's value, shown the same way."""

    def __str__(self) -> str:
        return f"{self.key}: {_said(self.reference)} -> {_said(self.candidate)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "reference": self.reference,
            "candidate": self.candidate,
        }


@dataclass(frozen=True, slots=True)
class ChangeGroup:
    """Changes a search applies together or not at all (one change, unless declared)."""

    changes: tuple[Change, ...]
    declared: bool = False
    """The caller declared these as coupled (:func:`atomic_changes`' ``groups``)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.changes)

    @property
    def label(self) -> str:
        """``enable-eplb``, or ``speculative-algorithm+speculative-draft-model-path``."""
        return "+".join(self.keys)

    def __str__(self) -> str:
        return "; ".join(str(c) for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "declared": self.declared,
            "changes": [c.to_dict() for c in self.changes],
        }


def atomic_changes(
    reference: ServerProfile,
    candidate: ServerProfile,
    groups: Iterable[Iterable[str]] = (),
) -> list[ChangeGroup]:
    """The candidate's changes to the reference, as the groups a search may apply apart.

    ``groups``: lists of change keys that cannot be applied apart (a profile's declaration).
    A declared key the diff does not contain is ignored (a profile may declare a coupling its
    next revision does not change); groups sharing a key are one group (coupling is
    transitive).  Every change outside a declared group is a group of its own.  The order is
    fixed (engine, model, arguments, environment, settings; each in the candidate's file order,
    then what only the reference sets), so two runs of a search over the same profiles test
    the same deployments in the same order.

    ``ValueError`` for an external profile (nothing of its command line is the plugin's to
    change) or two profiles of different engine kinds (their flags are not each other's).
    """
    changes = _changes(reference, candidate)
    position = {c.key: i for i, c in enumerate(changes)}
    parent = list(range(len(changes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    declared: set[int] = set()
    for group in groups:
        if isinstance(group, str):
            raise TypeError(f"a group is a list of change keys, got the string {group!r}")
        members = [position[k] for k in group if k in position]
        if len(members) > 1:
            declared.update(members)
        for m in members[1:]:
            parent[root(m)] = root(members[0])
    by_root: dict[int, list[int]] = {}
    for i in range(len(changes)):
        by_root.setdefault(root(i), []).append(i)
    ordered = sorted(by_root.values(), key=lambda members: members[0])
    return [
        ChangeGroup(
            changes=tuple(changes[i] for i in members),
            declared=any(i in declared for i in members),
        )
        for members in ordered
    ]


def derive(
    reference: ServerProfile, candidate: ServerProfile, applied: Iterable[ChangeGroup]
) -> ServerProfile:
    """The reference with the ``applied`` groups' changes made: an argument added, changed or
    removed, a variable set or removed, the candidate's command (its engine) run, the
    candidate's model served.

    Deterministic whatever the order of ``applied``: changes are made, and named, in
    :func:`atomic_changes`' order, so a subset is one deployment with one name
    (``ref+enable-eplb+env:FOO``; the reference's own name when nothing is applied).  Operating
    settings that are not the deployment (how long to wait for a start, how to stop) take the
    longer of the two profiles', since a mix may start like either; ``secret_env`` is the
    union of both, so a value either side hides stays hidden.

    ``ValueError`` for an external profile, profiles of different engine kinds, or a change
    that is not in this diff; :class:`~pytest_kimi.server.profile.ProfileError` when the
    derived SGLang arguments fail SGLang's parser check (a flag the candidate's engine release
    knows, applied to the reference's: that deployment would not start, and saying so costs no
    launch).
    """
    changes = _changes(reference, candidate)
    known = {c.key: c for c in changes}
    wanted: set[str] = set()
    for group in applied:
        for change in group.changes:
            if known.get(change.key) != change:
                raise ValueError(
                    f"change {change} is not one of {reference.name!r} -> {candidate.name!r}'s "
                    f"({', '.join(known) or 'none'}): derive from the groups atomic_changes "
                    f"gave for these two profiles"
                )
            wanted.add(change.key)
    order = [c for c in changes if c.key in wanted]
    if not order:
        return reference

    args = dict(reference.args)
    env = dict(reference.env)
    command = list(reference.command)
    engine_version = reference.engine_version
    health_path = reference.health_path
    nice = reference.nice
    for change in order:
        if change.kind in ("arg", "model"):
            flags = MODEL_FLAGS if change.kind == "model" else (change.key,)
            for flag in flags:
                _take(args, candidate.args, flag)
        elif change.kind == "env":
            _take(env, candidate.env, change.key[len(ENV_PREFIX) :])
        elif change.kind == "engine":
            command = list(candidate.command)
            engine_version = candidate.engine_version
            health_path = candidate.health_path
        elif change.kind == "setting":
            nice = candidate.nice
    name = derived_name(reference.name, [c.key for c in order])
    warnings = _flag_warnings(reference, command, args, name, engine_version)
    return dataclasses.replace(
        reference,
        name=name,
        path=None,
        command=command,
        args=args,
        env=env,
        secret_env=reference.secret_env | candidate.secret_env,
        startup_timeout_s=max(reference.startup_timeout_s, candidate.startup_timeout_s),
        stop_grace_s=max(reference.stop_grace_s, candidate.stop_grace_s),
        stop_timeout_s=max(reference.stop_timeout_s, candidate.stop_timeout_s),
        health_path=health_path,
        nice=nice,
        engine_version=engine_version,
        flag_warnings=warnings,
    )


def derived_name(reference: str, keys: Sequence[str]) -> str:
    """``ref+enable-eplb+env:FOO``: the reference's name and the applied keys, in order.

    Readable in a report's table and a log's name (the launcher makes it file-safe); not a
    baseline profile name (``+`` and ``:`` are outside what a baseline directory may be
    called), which a derived deployment never records."""
    return "+".join([reference, *keys])


# ---------------------------------------------------------------------- the diff


def _changes(reference: ServerProfile, candidate: ServerProfile) -> list[Change]:
    """Every atomic change, in the fixed order :func:`atomic_changes` documents."""
    for p in (reference, candidate):
        if p.external:
            raise ValueError(
                f"{p.source}: an external server profile (url: {p.url}) cannot take part in a "
                f"culprit search: the plugin does not own its command line, so no change of it "
                f"can be applied; give two managed profiles (args:, optional command:)"
            )
    if reference.engine != candidate.engine:
        raise ValueError(
            f"{reference.source} runs {reference.engine}, {candidate.source} runs "
            f"{candidate.engine}: their flags are not each other's, so no deployment lies "
            f"between them; compare two profiles of one engine kind"
        )
    secret_env = reference.secret_env | candidate.secret_env
    out: list[Change] = []
    if _engine_of(reference) != _engine_of(candidate):
        out.append(Change(ENGINE_KEY, "engine", _engine_shown(reference), _engine_shown(candidate)))
    model_ref = _model_shown(reference)
    model_cand = _model_shown(candidate)
    if _model_of(reference) != _model_of(candidate):
        out.append(Change(MODEL_KEY, "model", model_ref, model_cand))
    for flag in _keys(candidate.args, reference.args):
        if flag in MODEL_FLAGS:
            continue
        ref_words = _words(reference, flag)
        cand_words = _words(candidate, flag)
        if ref_words != cand_words:
            out.append(
                Change(flag, "arg", _arg_shown(flag, ref_words), _arg_shown(flag, cand_words))
            )
    for name in _keys(candidate.env, reference.env):
        ref_env = _env_state(reference.env, name)
        cand_env = _env_state(candidate.env, name)
        if ref_env != cand_env:
            secret = is_secret_name(name) or name in secret_env
            out.append(
                Change(
                    ENV_PREFIX + name,
                    "env",
                    _env_shown(ref_env, secret),
                    _env_shown(cand_env, secret),
                )
            )
    if reference.nice != candidate.nice:
        out.append(Change(NICE_KEY, "setting", str(reference.nice), str(candidate.nice)))
    return out


def _keys(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[str]:
    """``first``'s keys in its order, then those only ``second`` has, in its order."""
    return list(first) + [k for k in second if k not in first]


def _words(profile: ServerProfile, flag: str) -> list[str]:
    """The command-line words the profile passes for ``flag`` (none when left out)."""
    if flag not in profile.args:
        return []
    return profile.engine_spec.render_args({flag: profile.args[flag]})


def _arg_shown(flag: str, words: list[str]) -> str | None:
    if not words:
        return None
    if is_secret_flag(flag):
        return SECRET_SHOWN
    return " ".join(words[1:]) if len(words) > 1 else "true"


def _engine_of(profile: ServerProfile) -> tuple[tuple[str, ...], str | None]:
    return tuple(profile.command), profile.engine_version


def _engine_shown(profile: ServerProfile) -> str:
    text = " ".join(scrub_argv(profile.command))
    if profile.engine_version:
        text += f" (engine_version {profile.engine_version})"
    return text


def _model_of(profile: ServerProfile) -> list[list[str]]:
    return [_words(profile, flag) for flag in MODEL_FLAGS]


def _model_shown(profile: ServerProfile) -> str | None:
    given = [(flag, _words(profile, flag)) for flag in MODEL_FLAGS]
    given = [(flag, words) for flag, words in given if words]
    if not given:
        return None
    if len(given) == 1:
        return " ".join(given[0][1][1:])
    return " ".join(f"{flag}={' '.join(words[1:])}" for flag, words in given)


_UNSET = ("unset",)
"""An env name the profile does not mention: the server inherits the plugin's value."""


def _env_state(env: Mapping[str, str | None], name: str) -> tuple[str, ...]:
    if name not in env:
        return _UNSET
    value = env[name]
    return ("removed",) if value is None else ("set", value)


def _env_shown(state: tuple[str, ...], secret: bool) -> str | None:
    if state == _UNSET:
        return None
    if state[0] == "removed":
        return "(removed)"
    return SECRET_SHOWN if secret and state[1] else state[1]


def _said(value: str | None) -> str:
    return "(not set)" if value is None else json.dumps(value) if value == "" else value


# ---------------------------------------------------------------------- derive


def _take(target: dict[str, Any], source: Mapping[str, Any], key: str) -> None:
    """Make ``target[key]`` what ``source`` says: its value, or absent when it has none."""
    if key in source:
        target[key] = source[key]
    else:
        target.pop(key, None)


def _flag_warnings(
    reference: ServerProfile,
    command: list[str],
    args: dict[str, Any],
    name: str,
    version: str | None,
) -> tuple[str, ...]:
    """SGLang's parser check of the derived arguments, as the profile loader does it: errors
    raise (that deployment cannot start), warnings are kept for the launcher to log."""
    engine = reference.engine_spec
    if engine.kind != "sglang" or not any("sglang" in word for word in command):
        return ()
    source = f"derived server profile {name!r}"
    check = sglang_flags.check_args(args, source, version or sglang_flags.DEFAULT_VERSION)
    if check.skipped is not None:
        return (check.skipped,)
    if check.errors:
        raise ProfileError("\n".join(p.message for p in check.errors))
    return tuple(p.message for p in check.warnings)
