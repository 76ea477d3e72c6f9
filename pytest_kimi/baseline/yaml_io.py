"""Baseline files as text: the styled YAML writer and the validating reader.

Everything here optimises for a readable ``git diff`` of a file a human reviews:

* a fixed key order, rounded figures (done by :mod:`pytest_kimi.baseline.model`), levels sorted
  by workload, ``server_info`` keys sorted;
* workloads, summaries and trial lists written on one line each, nested mappings as blocks;
* loading a file and dumping it again gives the same text, so re-saving never makes noise.

Reading is strict, because the file may have been edited by hand: duplicate keys
(:mod:`pytest_kimi.yamlstrict`), unknown keys, a wrong schema or a ``tok_s`` that is not the
median of its trials all raise :class:`BaselineError` naming the file and the field.  An error
says what a wrong value *is* (``a string of 23 characters``: :func:`pytest_kimi.files.described`),
never the value, numbers apart: the "baseline" may be a committed symlink to a secret, which
parses as one YAML string, and the error reaches the terminal, ``--perf-json`` and JUnit.  No
pytest, no file system: :mod:`pytest_kimi.baseline.store` does the I/O.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pytest_kimi import yamlstrict
from pytest_kimi.baseline.model import (
    BaselineError,
    CapacityBaseline,
    LevelBaseline,
    SessionNoise,
    TestBaseline,
    WorkloadKey,
)
from pytest_kimi.baseline.provenance import Provenance
from pytest_kimi.baseline.values import is_number, utc_timestamp
from pytest_kimi.files import described, key_shown

__all__ = ["MAX_BASELINE_BYTES", "SCHEMA_VERSION", "dumps", "loads"]

SCHEMA_VERSION = 1
"""Bumped only for changes an older reader would misinterpret; readers refuse other versions."""

MAX_BASELINE_BYTES = yamlstrict.MAX_CHARS
"""The largest baseline file read (1 MiB, the YAML loader's own bound): a 50-level baseline with
its trials and a full SGLang ``server_info`` is about 30 kB.  ``--perf-allow-large`` lifts it."""

_HEADER = (
    "# pytest-kimi throughput baseline; written by the plugin, reviewed as a diff.\n"
    "# tok_s is the median of trials_tok_s; rates in tok/s, times in seconds.\n"
)


class _Invalid(Exception):
    """Internal: a validation problem, wrapped into :class:`BaselineError` with the path."""


class _FlowMap(dict):  # type: ignore[type-arg]
    """A mapping written on one line: workloads and summaries, which read best as a row."""


class _FlowSeq(list):  # type: ignore[type-arg]
    """A list written on one line: trials and short scalar lists."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that indents block sequences under their key, as most people write YAML, and
    never writes an anchor or alias: the reader refuses them (:mod:`pytest_kimi.yamlstrict`),
    and PyYAML would emit ``&id001`` for any list or mapping that appears twice by identity."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a baseline holds no cycles: every value is written out in full


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    node = dumper.represent_str(data)
    if "\x85" in data:
        # PyYAML writes NEL (U+0085) raw in plain and single-quoted scalars, and its reader
        # takes a raw NEL for a line break and folds it into a space: only a double-quoted
        # scalar (which escapes it as "\N") reads back as the same string.
        node.style = '"'
    return node


_Dumper.add_representer(str, _represent_str)
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
        if level.itl_s:
            entry["itl_s"] = _FlowMap(level.itl_s)
        for name in ("trials_ttft_s", "trials_itl_s"):  # one line per latency: trials, as tok/s
            trials = getattr(level, name)
            if trials:
                entry[name] = _FlowMap((k, list(v)) for k, v in trials.items())
        if level.session_noise is not None:
            entry["session_noise"] = _FlowMap(
                [("sigma", level.session_noise.sigma), ("df", level.session_noise.df)]
            )
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
    document: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "test": baseline.test,
        "profile": baseline.profile,
        "levels": levels,  # before provenance: the numbers are what a reviewer looks for
    }
    if baseline.capacity is not None:
        document["capacity"] = _capacity_document(baseline.capacity)
    document["provenance"] = provenance
    return document


def _capacity_document(capacity: CapacityBaseline) -> dict[str, Any]:
    """A ``@capacity`` test's record: the capacity first (what a reviewer reads), the search's
    loads last; absent keys (a bracket end outside the range) are written as null."""
    return {
        "workload": _FlowMap(capacity.workload.items),
        "value": capacity.value,
        "low": capacity.low,
        "high": capacity.high,
        "estimate": capacity.estimate,
        "log_se": capacity.log_se,
        "log_se_df": capacity.log_se_df,
        "slope": capacity.slope,
        "held": _FlowSeq(capacity.held),
        "broke": _FlowSeq(capacity.broke),
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


_TOP_KEYS = ("schema", "test", "profile", "levels", "capacity", "provenance")
_CAPACITY_KEYS = (
    "workload",
    "value",
    "low",
    "high",
    "estimate",
    "log_se",
    "log_se_df",
    "slope",
    "held",
    "broke",
)
_LEVEL_KEYS = (
    "workload",
    "tok_s",
    "trials_tok_s",
    "request_tok_s",
    "ttft_s",
    "itl_s",
    "trials_ttft_s",
    "trials_itl_s",
    "session_noise",
)
_PROVENANCE_KEYS = (
    "model",
    "plugin_version",
    "git_commit",
    "recorded_at",
    "client_host",
    "session_ids",
    "server_info",
)


def _parse_yaml(text: str, max_chars: int | None) -> Any:
    try:
        return yamlstrict.load(text, max_chars=max_chars)
    except yamlstrict.DuplicateKeyError as exc:  # a hand edit must not keep the last one silently
        raise _Invalid(
            f"duplicate key {key_shown(exc.key)} at line {exc.line} (first at line "
            f"{exc.first_line})"
        ) from None
    except (yamlstrict.AliasError, yamlstrict.NodeLimitError) as exc:  # an alias bomb, say
        raise _Invalid(f"line {exc.line}: {exc.problem} (or delete the file)") from None
    except yamlstrict.TooLargeError as exc:
        raise _Invalid(f"{exc} (fix or delete the file)") from None
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
        raise _Invalid(f"{what} must be a mapping, got {described(value)}")
    return value


def _shown(value: Any) -> str:
    """A wrong value as an error shows it: a number as it is (what a reviewer compares), any
    other value only as what it is (:func:`~pytest_kimi.files.described`)."""
    return repr(value) if is_number(value) else described(value)


def _reject_unknown(mapping: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    unknown = [key_shown(k, quote=False) for k in mapping if k not in allowed]
    if unknown:
        raise _Invalid(
            f"{what} has unknown key(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})"
        )


def _optional_str(mapping: Mapping[str, Any], key: str, what: str) -> str | None:
    value = mapping.get(key)
    if isinstance(value, _dt.datetime) and key == "recorded_at":  # unquoted timestamp, hand-written
        return utc_timestamp(value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc))
    if value is not None and not isinstance(value, str):
        raise _Invalid(f"{what}.{key} must be a string (quote it in YAML), got {described(value)}")
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
        raise _Invalid(
            f"{what}: trials_tok_s must be a list of positive numbers, got {described(trials)}"
        )
    request_tok_s: Any = entry.get("request_tok_s")  # None or not a mapping: LevelBaseline says
    ttft_s: Any = entry.get("ttft_s")
    itl_s: Any = entry.get("itl_s")
    # latency per trial: absent from files recorded before the latency gate
    trials_ttft_s: Any = entry.get("trials_ttft_s")
    trials_itl_s: Any = entry.get("trials_itl_s")
    noise: SessionNoise | None = None
    if entry.get("session_noise") is not None:
        raw = _require_mapping(entry["session_noise"], f"{what}.session_noise")
        _reject_unknown(raw, ("sigma", "df"), f"{what}.session_noise")
        sigma, df = raw.get("sigma"), raw.get("df")
        if not is_number(sigma) or not math.isfinite(sigma) or sigma < 0:
            raise _Invalid(
                f"{what}: session_noise.sigma must be a number >= 0, got {described(sigma)}"
            )
        if isinstance(df, bool) or not isinstance(df, int) or df < 1:
            raise _Invalid(f"{what}: session_noise.df must be an integer >= 1, got {described(df)}")
        noise = SessionNoise(sigma=float(sigma), df=df)
    try:
        level = LevelBaseline(
            workload=workload,
            trials_tok_s=tuple(trials),
            request_tok_s=request_tok_s,
            ttft_s=ttft_s,
            itl_s=itl_s,
            trials_ttft_s=trials_ttft_s,
            trials_itl_s=trials_itl_s,
            session_noise=noise,
        )
    except ValueError as exc:
        raise _Invalid(f"{what}: {exc}") from None
    if "tok_s" in entry:
        stated = entry["tok_s"]
        if not is_number(stated) or stated != level.tok_s:
            raise _Invalid(
                f"{what}: tok_s {_shown(stated)} is not the median of trials_tok_s "
                f"({level.tok_s}); "
                f"it is derived from the trials: fix or delete it"
            )
    return level


def _parse_provenance(raw: Any) -> Provenance:
    what = "provenance"
    prov = _require_mapping(raw, what)
    _reject_unknown(prov, _PROVENANCE_KEYS, what)
    session_ids = prov.get("session_ids") or []
    if not isinstance(session_ids, list) or not all(isinstance(s, str) for s in session_ids):
        raise _Invalid(
            f"provenance.session_ids must be a list of strings, got {described(session_ids)}"
        )
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
            f"unsupported schema {_shown(top['schema'])}; this pytest-kimi reads schema "
            f"{SCHEMA_VERSION} "
            f"(upgrade pytest-kimi, or re-record the baseline)"
        )
    _reject_unknown(top, _TOP_KEYS, "the document")
    for key in ("test", "profile"):
        if not isinstance(top.get(key), str) or not top[key]:
            raise _Invalid(f"'{key}' must be a non-empty string, got {described(top.get(key))}")
    if "provenance" not in top:
        raise _Invalid("missing 'provenance'")
    provenance = _parse_provenance(top["provenance"])
    capacity = _parse_capacity(top["capacity"]) if top.get("capacity") is not None else None
    raw_levels = top.get("levels")
    # a @capacity test's file may hold its capacity alone (files before it always had levels)
    if not isinstance(raw_levels, list) or not (raw_levels or capacity is not None):
        raise _Invalid(f"'levels' must be a non-empty list, got {described(raw_levels)}")
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
            test=top["test"],
            profile=top["profile"],
            provenance=provenance,
            levels=tuple(levels),
            capacity=capacity,
        )
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


def _parse_capacity(raw: Any) -> CapacityBaseline:
    what = "capacity"
    entry = _require_mapping(raw, what)
    _reject_unknown(entry, _CAPACITY_KEYS, what)
    if "workload" not in entry:
        raise _Invalid(f"{what} has no 'workload'")
    try:
        workload = WorkloadKey.from_dict(_require_mapping(entry["workload"], f"{what}.workload"))
    except ValueError as exc:
        raise _Invalid(f"{what}.workload: {exc}") from None
    for name in ("held", "broke"):
        if not isinstance(entry.get(name, []), list):
            raise _Invalid(f"{what}.{name} must be a list of loads, got {described(entry[name])}")
    try:
        capacity = CapacityBaseline(
            workload=workload,
            low=entry.get("low"),
            high=entry.get("high"),
            estimate=entry.get("estimate"),
            log_se=entry.get("log_se"),
            log_se_df=entry.get("log_se_df"),
            slope=entry.get("slope"),
            held=tuple(entry.get("held") or ()),
            broke=tuple(entry.get("broke") or ()),
        )
    except ValueError as exc:
        raise _Invalid(f"{what}: {exc}") from None
    if "value" in entry and entry["value"] != capacity.value:
        raise _Invalid(
            f"{what}: value {_shown(entry['value'])} is not low ({capacity.value!r}); the "
            "capacity is "
            "the highest load that held: fix or delete it"
        )
    return capacity


def loads(text: str, *, source: Path | str = "<string>", allow_large: bool = False) -> TestBaseline:
    """Parse file text (``yaml.safe_load`` only); problems raise :class:`BaselineError`
    naming ``source`` (and what a wrong value is, never the value).  ``allow_large``
    (``--perf-allow-large``) lifts the loader's size bound, never its node bound."""
    try:
        return _from_data(_parse_yaml(text, None if allow_large else yamlstrict.MAX_CHARS))
    except _Invalid as exc:
        raise BaselineError(source, str(exc)) from None
