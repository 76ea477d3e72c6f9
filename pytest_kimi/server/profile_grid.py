"""A grid of deployments written as one profile: argument values that are lists expand to one
profile per combination, each named by what differs, minus the combinations that cannot run.

Why: the deployments an operator races are rarely unrelated files; they are one deployment
with a few knobs turned (``tp-size`` 4 or 8, EPLB on or off, two CUDA-graph batch lists).
Writing the knobs once keeps the deployments' common part reviewed once, and the names say
which knob values a deployment has, so a ranking reads as an answer (``kimi-tp8-enable-eplb``
won) rather than as file names.

The YAML form (a server profile, :mod:`pytest_kimi.server.profile`, plus two keys)::

    name: kimi                     # the base of every name (else the file's stem)
    args:
      model-path: /models/Kimi-K2.6
      tp-size: [4, 8]              # an axis: one deployment per value
      ep-size: [4, 8]
      enable-eplb: [false, true]
      cuda-graph-bs-decode: [[1, 2, 4], [1, 2, 4, 8, 16]]   # a multi-word flag's axis
      cuda-graph-bs-prefill: [1, 2, 4]    # a multi-word flag's one value: not an axis
    exclude:                       # combinations that cannot run (partial assignments)
      - {tp-size: 4, ep-size: 8}   # every key given must match
      - {enable-eplb: true, ep-size: [4]}   # a list: any of its values
    gpus: 8                        # GPUs per deployment (else from the parallel sizes)

* **Axes.**  An ``args`` value that is a list is an axis, except for a flag that takes several
  words (SGLang's parser says so: ``nargs`` ``+``; :mod:`pytest_kimi.server.sglang_flags`),
  where a flat list is that flag's one value, as in any profile, and an axis is a list of
  lists.  For an engine whose parser is not shipped (vLLM) a flat list is always an axis;
  write a multi-word value as a one-item axis there (``[[1, 2, 4]]``).  An axis of one value
  is just a value.  Values are taken in the file's order, axes too: the deployments come out
  in a fixed order.
* **Names.**  ``<base>-<label>-<label>...``, one label per axis whose value differs among the
  deployments kept, in the file's order: ``tp8`` (a ``-size`` suffix dropped, a number
  appended), ``enable-eplb`` / ``no-enable-eplb`` (true / false or null), ``attention-backend-
  triton`` (a string; a path by its last part), ``cuda-graph-bs-decode1_2_4`` (a list).  Only
  ``[A-Za-z0-9._+-]`` (a file name, a test id, a log name); a label over 40 characters is cut
  and given a hash, and two deployments whose names would still coincide both get a hash of
  their values.
* **Exclusions.**  ``exclude:`` lists partial assignments; a combination matching every key
  of one of them is dropped.  A rule naming a flag that is not an axis, or a value the axis
  does not hold, is an error (it would match always or never: a typo).
* **GPUs.**  :func:`gpus_of`: the ``gpus:`` field, else the product of the parallel sizes
  (``tp-size`` x ``pp-size`` x ``dp-size``; SGLang's ``dp-size`` with
  ``enable-dp-attention`` splits the tensor-parallel GPUs instead of adding replicas), for
  throughput per GPU.

:func:`expand` returns plain profile mappings without the grid's keys, so the loader validates
each deployment as it does any profile (:func:`pytest_kimi.server.profile.parse_profile`);
:func:`parse_grid` does that, for a loader that has read the YAML (a grid file is read like a
profile file, then handed here instead of to ``parse_profile``).  Only a race expands a grid:
elsewhere a list is what it always was, a flag's several words, and a grid file given to a
plain run is refused rather than launched as a guess: by ``exclude:`` or ``gpus:`` (unknown
keys), by SGLang's flag check (``tp-size`` takes one value), or by vLLM's own parser at launch.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimi.server import sglang_flags
from pytest_kimi.server.profile import ProfileError, ServerProfile, parse_profile

__all__ = [
    "GRID_KEYS",
    "MAX_COMBINATIONS",
    "MAX_DEPLOYMENTS",
    "GridPoint",
    "expand",
    "gpus_of",
    "grid_points",
    "is_grid",
    "label",
    "parse_grid",
]

GRID_KEYS: tuple[str, ...] = ("exclude", "gpus")
"""Top-level keys of a grid profile that are not a server profile's: :func:`expand` removes
them from every deployment it returns."""
MAX_COMBINATIONS = 4096
"""Combinations enumerated at most (before exclusions): a grid larger than this is a typo
or a search, not a race."""
MAX_DEPLOYMENTS = 64
"""Deployments a grid may expand to (after exclusions): each is launched at least twice."""
_LABEL_CHARS = 40
_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One deployment of a grid."""

    name: str
    profile: dict[str, Any]
    """The profile mapping, grid keys removed, ``name`` set: what ``parse_profile`` reads."""
    assignment: tuple[tuple[str, Any], ...]
    """Every axis (normalised flag name) and this deployment's value of it, in file order."""
    gpus: int | None
    """GPUs of this deployment (:func:`gpus_of`)."""


def _flag(key: object) -> str:
    """A flag name as the loader normalises it: ``--tp_size`` -> ``tp-size``."""
    return str(key).strip().lstrip("-").replace("_", "-")


def _same(a: object, b: object) -> bool:
    """YAML values compared as the server would read them: ``8 == 8.0``, never ``true == 1``."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, list) or isinstance(b, list):
        return (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b))
        )
    return a == b


def _multi_word(raw: Mapping[str, Any]) -> Callable[[str], bool]:
    """Whether a flag takes several words, by the engine's shipped parser (none: never)."""
    engine = raw.get("engine") or "sglang"
    if engine != "sglang":
        return lambda flag: False
    version = raw.get("engine_version") or sglang_flags.DEFAULT_VERSION
    try:
        table = sglang_flags.load_flag_table(str(version))
    except LookupError:
        return lambda flag: False

    def many(flag: str) -> bool:
        spec, _ = table.resolve(flag)
        return spec is not None and spec.many

    return many


def _axes(raw: Mapping[str, Any], source: str) -> dict[str, tuple[str, list[Any]]]:
    """Normalised flag -> (the key as written, its values), for every axis, in file order."""
    args = raw.get("args")
    if not isinstance(args, Mapping):
        return {}
    many = _multi_word(raw)
    out: dict[str, tuple[str, list[Any]]] = {}
    for key, value in args.items():
        if not isinstance(key, str) or not isinstance(value, list):
            continue
        flag = _flag(key)
        if many(flag) and not (value and all(isinstance(v, list) for v in value)):
            continue  # a multi-word flag's one value
        if not value:
            raise ProfileError(f"{source}: args '{key}' is an empty list: an axis needs a value")
        for i, v in enumerate(value):
            if isinstance(v, Mapping):
                raise ProfileError(
                    f"{source}: args '{key}' value {i + 1} is a mapping; an axis holds "
                    f"numbers, strings, booleans, null or lists"
                )
            if any(_same(v, w) for w in value[:i]):
                raise ProfileError(f"{source}: args '{key}' lists {v!r} twice")
        out[flag] = (key, list(value))
    return out


def _rules(
    raw: Mapping[str, Any], axes: Mapping[str, tuple[str, list[Any]]], source: str
) -> list[dict[str, Any]]:
    """The ``exclude:`` rules, keys normalised, every key an axis and every value one of it."""
    rules = raw.get("exclude")
    if rules is None:
        return []
    if not isinstance(rules, list):
        raise ProfileError(
            f"{source}: 'exclude' must be a list of partial assignments "
            f"(e.g. - {{tp-size: 4, ep-size: 8}}), got {type(rules).__name__}"
        )
    out: list[dict[str, Any]] = []
    for n, rule in enumerate(rules, 1):
        if not isinstance(rule, Mapping) or not rule:
            raise ProfileError(
                f"{source}: exclude rule {n} must be a non-empty mapping of flag -> value"
            )
        parsed: dict[str, Any] = {}
        for key, wanted in rule.items():
            flag = _flag(key)
            if flag not in axes:
                listed = ", ".join(axes) or "none"
                raise ProfileError(
                    f"{source}: exclude rule {n} names {key!r}, which is not an axis (a list "
                    f"in args), so it would match always or never; the axes: {listed}"
                )
            values = axes[flag][1]
            options = [wanted]
            if isinstance(wanted, list) and not any(_same(wanted, v) for v in values):
                options = wanted  # any of these values
            for option in options:
                if not any(_same(option, v) for v in values):
                    raise ProfileError(
                        f"{source}: exclude rule {n}: {key} {option!r} is not among the "
                        f"axis' values {values!r}, so the rule never matches"
                    )
            parsed[flag] = options
        out.append(parsed)
    return out


def _excluded(assignment: Mapping[str, Any], rules: list[dict[str, Any]]) -> bool:
    return any(
        all(any(_same(assignment[flag], o) for o in options) for flag, options in rule.items())
        for rule in rules
    )


def _safe(text: str) -> str:
    return _SAFE.sub("_", text).strip("_.") or "_"


def _hash(value: object) -> str:
    data = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:6]


def _number(v: int | float) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def _word(v: object) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower()
    if isinstance(v, (int, float)):
        return _number(v)
    text = str(v)
    if "/" in text.strip("/"):
        text = text.rstrip("/").rsplit("/", 1)[-1]  # a path by its last part
    return _safe(text)


def label(flag: str, value: object) -> str:
    """The part of a deployment's name that says ``flag`` has ``value`` (module docstring)."""
    short = flag[: -len("-size")] if flag.endswith("-size") and len(flag) > 5 else flag
    short = _safe(short)
    if value is True:
        return short
    if value is False or value is None:
        return f"no-{short}"
    if isinstance(value, (int, float)):
        text = f"{short}{_number(value)}"
    elif isinstance(value, list):
        words = "_".join(_word(v) for v in value)
        numeric = value and isinstance(value[0], (int, float)) and not isinstance(value[0], bool)
        text = f"{short}{words}" if numeric else f"{short}-{words}"
    else:
        text = f"{short}-{_word(value)}"
    text = _safe(text)
    if len(text) > _LABEL_CHARS:
        text = f"{text[: _LABEL_CHARS - 7]}-{_hash(value)}"
    return text


def grid_points(
    raw: Mapping[str, Any], *, default_name: str = "profile", source: str | None = None
) -> list[GridPoint]:
    """Every deployment of the grid ``raw`` (a profile mapping as read from YAML), in order.

    A profile without axes is one deployment, named as it is.  :class:`ProfileError` for an
    empty axis, a duplicated value, an exclusion that cannot match, a grid that excludes
    everything or holds more than :data:`MAX_DEPLOYMENTS` deployments."""
    where = source or f"server profile {default_name!r}"
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: a server profile must be a mapping")
    name = raw.get("name")
    base = name.strip() if isinstance(name, str) and name.strip() else default_name
    axes = _axes(raw, where)
    rules = _rules(raw, axes, where)
    if not axes:
        profile = {k: copy.deepcopy(v) for k, v in raw.items() if k not in GRID_KEYS}
        profile["name"] = base
        return [GridPoint(base, profile, (), gpus_of(raw))]
    total = math.prod(len(values) for _, values in axes.values())
    if total > MAX_COMBINATIONS:
        raise ProfileError(
            f"{where}: the grid has {total} combinations (more than {MAX_COMBINATIONS}); "
            f"fewer axes or values, or a search in several races"
        )
    flags = list(axes)
    kept: list[dict[str, Any]] = []
    for combo in itertools.product(*(values for _, values in axes.values())):
        assignment = dict(zip(flags, combo))
        if not _excluded(assignment, rules):
            kept.append(assignment)
    if not kept:
        raise ProfileError(f"{where}: 'exclude' leaves none of the {total} combinations")
    if len(kept) > MAX_DEPLOYMENTS:
        raise ProfileError(
            f"{where}: the grid expands to {len(kept)} deployments (at most "
            f"{MAX_DEPLOYMENTS}); exclude combinations or race fewer axes"
        )
    varying = [f for f in flags if any(not _same(a[f], kept[0][f]) for a in kept)]
    names = [
        "-".join([_safe(base)] + [label(f, a[f]) for f in varying]) if varying else _safe(base)
        for a in kept
    ]
    clashes = {n for n in names if names.count(n) > 1 or len(n) > 200}
    names = [
        f"{n[:190]}-{_hash([[f, a[f]] for f in flags])}" if n in clashes else n
        for n, a in zip(names, kept)
    ]
    out: list[GridPoint] = []
    for assignment, point_name in zip(kept, names):
        profile = {k: copy.deepcopy(v) for k, v in raw.items() if k not in GRID_KEYS}
        args = dict(profile["args"])
        for flag, (key, _) in axes.items():
            args[key] = copy.deepcopy(assignment[flag])
        profile["args"] = args
        profile["name"] = point_name
        gpus = gpus_of({**profile, "gpus": raw["gpus"]} if "gpus" in raw else profile)
        out.append(GridPoint(point_name, profile, tuple((f, assignment[f]) for f in flags), gpus))
    return out


def expand(
    raw: Mapping[str, Any], *, default_name: str = "profile", source: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, profile mapping)]`` per deployment of the grid ``raw`` (:func:`grid_points`):
    what a loader turns into :class:`~pytest_kimi.server.profile.ServerProfile` s with
    ``parse_profile(mapping, source=..., default_name=name)``."""
    return [(p.name, p.profile) for p in grid_points(raw, default_name=default_name, source=source)]


def parse_grid(
    data: object, *, source: str, default_name: str, path: Path | None = None
) -> list[tuple[ServerProfile, GridPoint]]:
    """Every deployment of the grid ``data`` (a profile mapping as read from YAML), validated
    as any profile (:func:`~pytest_kimi.server.profile.parse_profile`), with its grid point
    (the axes' values, the GPUs): what a loader returns for a grid file.  A deployment's
    messages name the file and the deployment (``servers/kimi.yaml [kimi-tp8]``)."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: a server profile must be a mapping")
    points = grid_points(data, default_name=default_name, source=source)
    single = len(points) == 1 and not points[0].assignment
    return [
        (
            parse_profile(
                p.profile,
                source=source if single else f"{source} [{p.name}]",
                default_name=p.name,
                path=path,
            ),
            p,
        )
        for p in points
    ]


def is_grid(raw: object) -> bool:
    """Whether ``raw`` uses the grid form: an axis, ``exclude:`` or ``gpus:`` (a loader that
    sees none of them reads the profile as it always did)."""
    if not isinstance(raw, Mapping):
        return False
    if any(k in raw for k in GRID_KEYS):
        return True
    try:
        return bool(_axes(raw, "profile"))
    except ProfileError:
        return True


_TP = ("tp-size", "tensor-parallel-size")
_PP = ("pp-size", "pipeline-parallel-size")
_DP = ("dp-size", "data-parallel-size")


def _size(args: Mapping[str, Any], names: tuple[str, ...], source: str) -> int:
    for name in names:
        if name not in args or args[name] is None:
            continue
        v = args[name]
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(
                f"{source}: args '{name}' must be a positive integer to count GPUs, got {v!r}"
                + (" (a grid axis: expand the grid first)" if isinstance(v, list) else "")
            )
        return v
    return 1


def gpus_of(profile: Mapping[str, Any] | ServerProfile) -> int | None:
    """GPUs one deployment uses: for throughput per GPU.

    A profile mapping's ``gpus:`` field when given (the only way for an external server, and
    the override when the parallel sizes do not tell: a multi-node launch, a GPU left idle);
    else ``tp-size x pp-size x dp-size`` from ``args`` (vLLM's long names too), except that
    SGLang's ``dp-size`` with ``enable-dp-attention`` splits the tensor-parallel GPUs rather
    than adding replicas (and ``attn-dp-size`` never adds any).  Both engines default to one
    GPU, so a managed profile that sets none of them uses 1.  None for an external server
    without ``gpus:`` (its arguments are not the plugin's to read)."""
    if isinstance(profile, ServerProfile):
        source, args, external, declared = profile.source, profile.args, profile.external, None
    else:
        source = f"server profile {profile.get('name')!r}"
        raw_args = profile.get("args")
        args = dict(raw_args) if isinstance(raw_args, Mapping) else {}
        external = "url" in profile
        declared = profile.get("gpus")
    if declared is not None:
        if isinstance(declared, bool) or not isinstance(declared, int) or declared < 1:
            raise ProfileError(f"{source}: 'gpus' must be a positive integer, got {declared!r}")
        return declared
    if external:
        return None
    norm = {_flag(k): v for k, v in args.items()}
    tp = _size(norm, _TP, source)
    pp = _size(norm, _PP, source)
    dp = _size(norm, _DP, source)
    if norm.get("enable-dp-attention") is True:
        dp = 1
    return tp * pp * dp
