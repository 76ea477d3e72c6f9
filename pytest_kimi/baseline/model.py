"""The baseline data model: what one baseline file holds, independent of how it is stored.

A file is one :class:`TestBaseline` (a test in a profile): its :class:`LevelBaseline` per
workload, keyed by :class:`WorkloadKey`, plus one provenance block
(:mod:`pytest_kimi.baseline.provenance`).  Values are validated and rounded on construction,
so a baseline built in memory equals the one read back from its file
(:mod:`pytest_kimi.baseline.yaml_io`), and comparisons never see noise digits.

The key of a level is its *workload* (concurrency, max_tokens, prompts, ...).  A lookup with a
workload that is not in the file finds nothing: a number measured at another concurrency or
output length is never a valid target, however close.  :meth:`TestBaseline.explain_miss` says
what the file does hold, so the user can tell a typo from a genuinely new level.

The errors every baseline module raises live here too.  No pytest, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from pytest_kimi.baseline.paths import check_profile
from pytest_kimi.baseline.provenance import Provenance
from pytest_kimi.baseline.values import ABSENT, is_number, scalar_text

__all__ = [
    "BaselineError",
    "BaselineExistsError",
    "ProvenanceConflict",
    "WorkloadKey",
    "LevelBaseline",
    "SessionNoise",
    "CapacityBaseline",
    "TestBaseline",
    "round_tok_s",
    "round_seconds",
    "round_latency",
    # for pytest_kimi.history.changes, which imports it from here
    "ABSENT",
]

Scalar = Union[str, int, float, bool, None]
WorkloadLike = Union["WorkloadKey", Mapping[str, Any], Any]


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


def round_latency(value: float) -> float:
    """Round a latency to 4 significant digits, however small.

    Unlike :func:`round_seconds` no 0.1 ms floor: an inter-token latency of 1.2 ms would keep
    only two digits (8% steps) under it, coarser than the latency gate's tolerance can bear.
    """
    value = float(value)
    if value == 0.0 or not math.isfinite(value):
        return value
    return round(value, 3 - math.floor(math.log10(abs(value))))


# ------------------------------------------------------------------------------------- workload


def _value_rank(value: Any) -> tuple[int, Any]:
    """Total order over workload values of mixed types (bool < number < str)."""
    if isinstance(value, bool):
        return (1, value)
    if is_number(value):
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
            if is_number(v):
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
            parts.append(f"C={scalar_text(self.get('concurrency'))}")
        wanted = ["max_tokens", *[k for k in extra_keys if k not in ("concurrency", "max_tokens")]]
        for key in wanted:
            value = self.get(key, ABSENT)
            if value is not ABSENT:
                parts.append(f"{key}={scalar_text(value)}")
        return " ".join(parts) if parts else str(self)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{k}: {scalar_text(v)}" for k, v in self.items) + "}"

    def __repr__(self) -> str:
        return f"WorkloadKey({self.to_dict()!r})"


# --------------------------------------------------------------------------------------- levels


def _summary_order(key: str) -> tuple[int, float, str]:
    """Percentiles ascending (p50, p95, p99, p99.9), then any other statistic by name."""
    match = re.fullmatch(r"p(\d+(?:\.\d+)?)", key)
    if match:
        return (0, float(match.group(1)), key)
    return (1, 0.0, key)


def _normalise_summary(
    name: str, values: Mapping[str, Any] | None, rounder: Any
) -> dict[str, float]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be a mapping like {{p50: ...}}, got {values!r}")
    out: dict[str, float] = {}
    for key in sorted(values, key=lambda k: _summary_order(str(k))):
        value = values[key]
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name} keys must be statistic names like p50, got {key!r}")
        if not is_number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}.{key} must be a non-negative number, got {value!r}")
        out[key] = rounder(value)
    return out


def _normalise_trials(name: str, values: Mapping[str, Any] | None) -> dict[str, tuple[float, ...]]:
    """``{p50: [..], p95: [..]}``: per statistic, each trial's positive latency in seconds."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be a mapping like {{p50: [0.041, ...]}}, got {values!r}")
    out: dict[str, tuple[float, ...]] = {}
    for key in sorted(values, key=lambda k: _summary_order(str(k))):
        if not isinstance(key, str) or not re.fullmatch(r"p\d+(?:\.\d+)?", key):
            raise ValueError(f"{name} keys must be percentiles like p50, got {key!r}")
        trials = values[key]
        if isinstance(trials, (str, bytes, Mapping)) or not isinstance(trials, Iterable):
            raise ValueError(f"{name}.{key} must be a list of positive numbers, got {trials!r}")
        clean: list[float] = []
        for i, value in enumerate(trials):
            if not is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"{name}.{key} must be a list of positive numbers; item {i} is {value!r}"
                )
            clean.append(round_latency(value))
        if not clean:
            raise ValueError(f"{name}.{key} must be a non-empty list of positive numbers, got []")
        out[key] = tuple(clean)
    return out


@dataclass(frozen=True)
class SessionNoise:
    """A level's session noise as its recording measured it: ``sigma`` (the log sd of the
    ratio of two server starts, the gate's ``session_sigma``) and the degrees of freedom of the
    scatter it rests on (sessions less one), which weigh it against the other evidence
    (:func:`pytest_kimi.gate.noise_evidence.combine`)."""

    sigma: float
    df: int

    def __post_init__(self) -> None:
        if not is_number(self.sigma) or not math.isfinite(self.sigma) or self.sigma < 0:
            raise ValueError(f"session_noise.sigma must be a number >= 0, got {self.sigma!r}")
        if isinstance(self.df, bool) or not isinstance(self.df, int) or self.df < 1:
            raise ValueError(f"session_noise.df must be an integer >= 1, got {self.df!r}")
        object.__setattr__(self, "sigma", round(float(self.sigma), 5))


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
    itl_s: Mapping[str, float] = field(default_factory=dict)
    """Inter-token latency summary (seconds), e.g. ``{p50: 0.0154, p95: 0.0161}``."""
    trials_ttft_s: Mapping[str, Sequence[float]] = field(default_factory=dict)
    """Each trial's TTFT per percentile, ``{p50: [...], p95: [...]}``: the samples the latency
    gate tests later runs against (:mod:`pytest_kimi.gate.latency_gate`).  Empty in files
    recorded before latency was gated: their latency is then not compared."""
    trials_itl_s: Mapping[str, Sequence[float]] = field(default_factory=dict)
    """The same for the inter-token latency."""
    session_noise: SessionNoise | None = None
    """The session noise the recording measured (a ``--perf-sessions`` recording: several
    server starts), with its degrees of freedom; None when it measured none."""

    def __post_init__(self) -> None:
        if self.session_noise is not None and not isinstance(self.session_noise, SessionNoise):
            raise ValueError(f"session_noise is not a SessionNoise: {self.session_noise!r}")
        object.__setattr__(self, "workload", WorkloadKey.of(self.workload))
        trials = self.trials_tok_s
        if isinstance(trials, (str, bytes, Mapping)) or not isinstance(trials, Iterable):
            raise ValueError(f"trials_tok_s must be a list of positive numbers, got {trials!r}")
        trials = tuple(trials)
        if not trials:
            raise ValueError("trials_tok_s must be a non-empty list of positive numbers, got []")
        rounded: list[float] = []
        for i, value in enumerate(trials):
            if not is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"trials_tok_s must be a list of positive numbers; item {i} is {value!r}"
                )
            r = round_tok_s(value)
            if r <= 0:
                raise ValueError(f"trials_tok_s item {i} ({value!r}) rounds to 0.0 tok/s")
            rounded.append(r)
        object.__setattr__(self, "trials_tok_s", tuple(rounded))
        object.__setattr__(
            self,
            "request_tok_s",
            _normalise_summary("request_tok_s", self.request_tok_s, round_tok_s),
        )
        object.__setattr__(self, "ttft_s", _normalise_summary("ttft_s", self.ttft_s, round_seconds))
        object.__setattr__(self, "itl_s", _normalise_summary("itl_s", self.itl_s, round_latency))
        for name in ("trials_ttft_s", "trials_itl_s"):
            object.__setattr__(self, name, _normalise_trials(name, getattr(self, name)))

    def latency_trials(self, kind: str, stat: str) -> tuple[float, ...]:
        """The stored per-trial samples of ``kind`` (``ttft_s``/``itl_s``) at ``stat`` (``p95``);
        empty when this baseline holds none."""
        stored = self.trials_ttft_s if kind == "ttft_s" else self.trials_itl_s
        return tuple(stored.get(stat, ()))

    def latency_summary(self, kind: str, stat: str) -> float | None:
        """The stored pooled figure of ``kind`` at ``stat``, None when not recorded."""
        stored = self.ttft_s if kind == "ttft_s" else self.itl_s
        return stored.get(stat)

    @property
    def tok_s(self) -> float:
        """Median of the trials, rounded: the one number a reviewer reads."""
        return round_tok_s(statistics.median(self.trials_tok_s))


# ------------------------------------------------------------------------------------ capacity


def round_load(value: float) -> float | int:
    """A load as a reviewer reads it: a whole concurrency as an int, a rate to 4 digits."""
    value = float(value)
    if value.is_integer():
        return int(value)
    return round(value, 3 - math.floor(math.log10(abs(value))))


def _optional_positive(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number or null, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CapacityBaseline:
    """A ``@capacity`` test's recorded capacity (``docs/guide/workloads.md``, *Capacity under an SLO*).

    ``workload`` keys it like a level: the metric searched (``concurrency`` or ``rate``), the
    ceilings and their percentile, the lengths, prompts, api and protocol.  A run that asks
    for another ceiling finds no baseline: a capacity under another SLO is another number.
    The figures are those of :class:`~pytest_kimi.measure.capacity_search.CapacityEstimate`: the
    bracket (``low`` held, ``high`` broke; one of them null when the capacity lay outside the
    searched range), the interpolated boundary ``estimate`` with its trial-noise standard
    error ``log_se`` (of ``ln(estimate)``; ``log_se_df`` degrees of freedom), and ``slope``, how fast the binding latency's
    margin falls per unit of ``ln(load)``, with which the gate turns latency noise into
    capacity noise.  ``held`` and ``broke`` list the loads the search measured.
    """

    workload: WorkloadKey
    low: float | None
    high: float | None
    estimate: float | None = None
    log_se: float | None = None
    slope: float | None = None
    held: tuple[float, ...] = ()
    broke: tuple[float, ...] = ()
    log_se_df: int | None = None
    """Degrees of freedom of ``log_se`` (the fewer trials of the bracket's ends, less one)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", WorkloadKey.of(self.workload))
        df = self.log_se_df
        if df is not None and (isinstance(df, bool) or not isinstance(df, int) or df < 1):
            raise ValueError(f"log_se_df must be an integer >= 1 or null, got {df!r}")
        metric = self.workload.get("metric")
        if metric not in ("concurrency", "rate"):
            raise ValueError(f"workload.metric must be 'concurrency' or 'rate', got {metric!r}")
        low = _optional_positive("low", self.low)
        high = _optional_positive("high", self.high)
        if low is None and high is None:
            raise ValueError("low and high are both null: a capacity needs one end of its bracket")
        if low is not None and high is not None and not low < high:
            raise ValueError(f"low ({self.low!r}) must be below high ({self.high!r})")
        estimate = _optional_positive("estimate", self.estimate)
        if estimate is not None:
            if low is None or high is None:
                raise ValueError("estimate needs both ends of the bracket (low and high)")
            if not low * 0.999 <= estimate <= high * 1.001:
                raise ValueError(
                    f"estimate {self.estimate!r} lies outside its bracket [{self.low!r}, "
                    f"{self.high!r}]"
                )
        log_se = self.log_se
        if log_se is not None and (
            not is_number(log_se) or not math.isfinite(log_se) or log_se < 0
        ):
            raise ValueError(f"log_se must be a non-negative number or null, got {log_se!r}")
        slope = _optional_positive("slope", self.slope)
        for name in ("held", "broke"):
            loads = getattr(self, name)
            if isinstance(loads, (str, bytes, Mapping)) or not isinstance(loads, Iterable):
                raise ValueError(f"{name} must be a list of loads, got {loads!r}")
            clean = tuple(
                round_load(v) for v in (_optional_positive(f"{name} item", x) for x in loads) if v
            )
            object.__setattr__(self, name, tuple(sorted(clean)))
        object.__setattr__(self, "low", None if low is None else round_load(low))
        object.__setattr__(self, "high", None if high is None else round_load(high))
        object.__setattr__(self, "estimate", None if estimate is None else round_load(estimate))
        object.__setattr__(self, "log_se", None if log_se is None else round(float(log_se), 5))
        object.__setattr__(self, "slope", None if slope is None else round(slope, 4))

    @property
    def metric(self) -> str:
        return str(self.workload.get("metric"))

    @property
    def value(self) -> float | None:
        """The capacity: the highest load that held (``low``)."""
        return self.low

    def text(self) -> str:
        """``C=40 [40..44], boundary 41.3``: how an update summary names it."""

        def load(x: float | None) -> str:
            return "-" if x is None else f"{x:g}"

        name = "C" if self.metric == "concurrency" else "rate"
        head = f"{name}={load(self.low)}" if self.low is not None else f"{name}<{load(self.high)}"
        if self.high is None:
            head = f"{name}>={load(self.low)}"
        out = f"{head} [{load(self.low)}..{load(self.high)}]"
        return out + (f", boundary {self.estimate:g}" if self.estimate is not None else "")


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
    capacity: CapacityBaseline | None = None
    """A ``@capacity`` test's capacity (its file may then hold no levels)."""

    def __post_init__(self) -> None:
        if self.capacity is not None and not isinstance(self.capacity, CapacityBaseline):
            raise ValueError(f"capacity is not a CapacityBaseline: {self.capacity!r}")
        if not isinstance(self.test, str) or "::" not in self.test:
            raise ValueError(
                f"test must be a pytest nodeid like 'tests/x.py::test_y', got {self.test!r}"
            )
        check_profile(self.profile)
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
        object.__setattr__(
            self, "levels", tuple(sorted(levels, key=lambda level: level.workload.sort_key()))
        )

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
                v = w.get(key, ABSENT)
                if not any(_same(v, d) for d in distinct):
                    distinct.append(v)
            values[key] = sorted(distinct, key=lambda v: (-1, 0) if v is ABSENT else _value_rank(v))
        outside = [k for k in keys if not any(_same(want.get(k, ABSENT), v) for v in values[k])]

        def show(key: str, vals: Sequence[Any]) -> str:
            return f"{key} {', '.join('unset' if v is ABSENT else scalar_text(v) for v in vals)}"

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
            asks = ", ".join(show(k, [want.get(k, ABSENT)]) for k in outside)
            why = f"{head}: baseline has {has}; this run asks {asks}"
            if "protocol" in outside:
                # 'unset' is the whole-requests protocol: baselines before 0.2 have no key
                why += (
                    " (a baseline recorded under one trial protocol is never compared with a "
                    "run under another: record one with --update-baselines, or run with "
                    "--perf-protocol=whole-requests to use a baseline recorded before 0.2)"
                )
            return why
        extra = [k for k in keys if len(values[k]) > 1]
        levels = ", ".join(f"[{w.label(extra)}]" for w in self.workloads)
        return (
            f"{head}: each value exists in the baseline but not in this combination; "
            f"baseline levels are {levels}; this run asks [{want.label(extra)}]"
        )


def _same(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return WorkloadKey((("k", a),)) == WorkloadKey((("k", b),))
