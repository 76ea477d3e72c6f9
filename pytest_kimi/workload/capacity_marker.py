"""``@capacity(...)`` arguments -> what the search looks for (:class:`CapacitySpec`) plus the
:class:`~pytest_kimi.workload.workload_spec.Workload` and
:class:`~pytest_kimi.workload.workload_spec.Targets` of the levels it measures.

Everything that says *what to send* (lengths, prompts, protocol, trials, api, ...) is
``@throughput``'s own argument with ``@throughput``'s own validation: the marker's range and
capacity arguments are taken out, the bottom of the range stands in as the one level, and the
rest goes through :func:`~pytest_kimi.workload.markers.parse_throughput`.  So a workload argument
added to ``@throughput`` works here with nothing to add.  No pytest; the plugin adds the test's
name to the message.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pytest_kimi.workload.marker_bounds import (
    MAX_CONCURRENCY,
    MAX_LEVELS,
    MAX_RATE,
    check_bound,
    check_trial_size,
)
from pytest_kimi.workload.markers import ALLOWED_ARGS, parse_throughput
from pytest_kimi.workload.workload_spec import LevelSpec, MarkerError, Targets, Workload

CAPACITY_SIGNATURE = (
    "capacity(max_ttft_s=None, max_itl_s=None, max_e2e_s=None, percentile=95, "
    "concurrency=(1, 512), rate=None, max_tokens=512, min_capacity=None, resolution=0.1, "
    "max_levels=12, tolerance=None, alpha=None, trials=None, ...): find the highest "
    "concurrency (or open-loop rate=(lo, hi)) at which every latency ceiling holds at the "
    "percentile, by a search over the range; the capacity is gated against its baseline and "
    "min_capacity (other arguments as @throughput's)"
)

DEFAULT_CONCURRENCY_RANGE = (1, 512)
DEFAULT_RESOLUTION = 0.1
"""The search step, relative to the load: the bracket a search ends with is this wide (at
least 1 for concurrency)."""
DEFAULT_MAX_LEVELS = 12
"""Loads measured at most (top-ups of a load do not count): a search that has not converged
by then reports the bracket it has."""

CEILINGS = ("max_ttft_s", "max_itl_s", "max_e2e_s")
CAPACITY_ONLY = ("min_capacity", "resolution", "max_levels")
RANGES = ("concurrency", "rate")
NOT_FOR_CAPACITY = {
    "min_tok_s": "a throughput floor",
    "min_request_tok_s": "a per-request rate floor",
    "min_goodput": "a goodput floor",
    "requests": "a fixed number of requests per trial, whatever the load",
    "latency_tolerance": "the tolerance of the latency comparison with a baseline",
    "max_concurrency": (
        "a cap on the requests in flight, behind which arrivals queue in the client: the "
        "latencies (from the send) would never show the overload a rate search looks for"
    ),
}
"""``@throughput`` arguments that mean nothing for a search, with what they are."""


ItlStatistic = Literal["request", "token"]
"""How an ITL ceiling is judged: ``request``, each request's mean time per token with the
percentile across requests (a capacity's, robust to the client's read timing:
:mod:`pytest_kimi.measure.capacity_latency`), or ``token``, the percentile of every gap between
reads (``@throughput``'s ITL figure)."""


@dataclass(frozen=True, slots=True)
class CapacitySpec:
    """What a ``@capacity`` test searches for; the levels' workload is separate."""

    metric: Literal["concurrency", "rate"]
    low: float
    high: float
    ceilings: Mapping[str, float]
    """Latency name (``ttft_s``, ``itl_s``, ``e2e_s``) -> ceiling in seconds."""
    percentile: float
    min_capacity: float | None = None
    resolution: float = DEFAULT_RESOLUTION
    max_levels: int = DEFAULT_MAX_LEVELS
    itl: ItlStatistic = "request"
    """The ITL statistic (no marker argument yet: ``bench/capacity.py truth --itl token``
    measures the other)."""

    def label(self, load: float | None) -> str:
        if load is None:
            return "-"
        if self.metric == "concurrency":
            return f"C={int(load)}"
        return f"rate={load:g}/s"


def _range(name: str, value: Any) -> tuple[float, float]:
    ints = name == "concurrency"
    what = "two integers 1 <= lo < hi" if ints else "two numbers 0 < lo < hi (requests/s)"
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise MarkerError(f"{name}={value!r}: expected a range ({what}), e.g. {name}=(1, 512)")
    lo, hi = value
    for x in (lo, hi):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise MarkerError(f"{name}={value!r}: expected {what}")
        if ints and not isinstance(x, int):
            raise MarkerError(f"{name}={value!r}: expected {what}")
    if not (1 <= lo < hi if ints else 0 < lo < hi):
        raise MarkerError(f"{name}={value!r}: expected {what}")
    return float(lo), float(hi)


def parse_capacity(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], *, allow_large: bool = False
) -> tuple[CapacitySpec, Workload, Targets]:
    """Validate ``@capacity`` arguments; raise :class:`MarkerError` naming the first bad one.

    The range's top has ``@throughput``'s bound on a load (a search may measure it), as has a
    trial there; ``allow_large`` (``--perf-allow-large``) lifts the bounds.
    """
    if args:
        raise MarkerError(
            f"positional arguments {args!r} are not accepted: use keywords such as "
            "max_itl_s=0.05, concurrency=(1, 512)"
        )
    for name, what in NOT_FOR_CAPACITY.items():
        if kwargs.get(name) is not None:
            hint = (
                "use requests_per_stream= or duration_s= to size trials"
                if name == "requests"
                else "it belongs to @throughput"
            )
            raise MarkerError(
                f"{name}= is {what}; a capacity search sets the load itself and is judged on "
                f"latency ceilings: {hint}"
            )
    # @throughput's arguments as they are now: one added there is accepted here too
    allowed = {*ALLOWED_ARGS, *CAPACITY_ONLY} - set(NOT_FOR_CAPACITY)
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        named = ", ".join(_suggest(name, allowed) for name in unknown)
        raise MarkerError(
            f"unknown argument{'s' if len(unknown) > 1 else ''} {named}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    if kwargs.get("concurrency") is not None and kwargs.get("rate") is not None:
        raise MarkerError(
            "concurrency and rate are exclusive: search concurrency (closed loop) or an "
            "arrival rate (open loop)"
        )
    metric: Literal["concurrency", "rate"] = (
        "rate" if kwargs.get("rate") is not None else "concurrency"
    )
    raw = kwargs.get(metric, DEFAULT_CONCURRENCY_RANGE)
    low, high = _range(metric, raw)
    check_bound(
        metric,
        high,
        MAX_CONCURRENCY if metric == "concurrency" else MAX_RATE,
        allow_large=allow_large,
        given=f"the top of {metric}={raw!r}",
    )
    if not any(kwargs.get(name) is not None for name in CEILINGS):
        raise MarkerError(
            "a capacity needs at least one latency ceiling: max_ttft_s, max_itl_s or max_e2e_s "
            "(the highest load at which they all hold is the capacity)"
        )
    resolution = kwargs.get("resolution", DEFAULT_RESOLUTION)
    if (
        isinstance(resolution, bool)
        or not isinstance(resolution, (int, float))
        or not 0 < resolution < 1
    ):
        raise MarkerError(
            f"resolution={resolution!r}: expected a number with 0 < x < 1 (the search step "
            "relative to the load: 0.1 stops at a bracket 10% wide)"
        )
    max_levels = kwargs.get("max_levels", DEFAULT_MAX_LEVELS)
    if isinstance(max_levels, bool) or not isinstance(max_levels, int) or max_levels < 2:
        raise MarkerError(f"max_levels={max_levels!r}: expected an integer >= 2")
    check_bound("max_levels", max_levels, MAX_LEVELS, allow_large=allow_large)
    min_capacity = kwargs.get("min_capacity")
    if min_capacity is not None:
        if (
            isinstance(min_capacity, bool)
            or not isinstance(min_capacity, (int, float))
            or not math.isfinite(min_capacity)
        ):
            raise MarkerError(f"min_capacity={min_capacity!r}: expected a number")
        if not low <= min_capacity <= high:
            shown = f"({_num(low)}, {_num(high)})"
            raise MarkerError(
                f"min_capacity={min_capacity!r} is outside the searched {metric} range {shown}: "
                "the search could neither confirm nor refute it"
            )
        if metric == "concurrency" and not float(min_capacity).is_integer():
            raise MarkerError(f"min_capacity={min_capacity!r}: a concurrency is a whole number")
    rest = {k: v for k, v in kwargs.items() if k not in (*CAPACITY_ONLY, *RANGES) and v is not None}
    rest[metric] = int(low) if metric == "concurrency" else low
    try:
        workload, targets = parse_throughput((), rest, allow_large=allow_large)
    except MarkerError as exc:
        raise MarkerError(
            str(exc).replace(f"{metric}={rest[metric]!r}", f"{metric}={raw!r}")
        ) from None
    if len(workload.levels) != 1:
        raise MarkerError(
            "a capacity search varies the load alone: give one max_tokens and one input_tokens, "
            "not lists"
        )
    (bottom,) = workload.levels
    top = LevelSpec(
        int(high) if metric == "concurrency" else None,
        high if metric == "rate" else None,
        bottom.max_tokens,
        bottom.input_tokens,
    )
    check_trial_size(workload, top, allow_large=allow_large)  # the search may measure the top
    ceilings = {
        name[len("max_") :]: float(limit)
        for name in CEILINGS
        if (limit := getattr(targets, name)) is not None
    }
    spec = CapacitySpec(
        metric=metric,
        low=low,
        high=high,
        ceilings=ceilings,
        percentile=targets.percentile,
        min_capacity=None if min_capacity is None else float(min_capacity),
        resolution=float(resolution),
        max_levels=max_levels,
    )
    return spec, workload, targets


def _suggest(name: str, allowed: set[str]) -> str:
    """``min_capcity`` -> ``min_capcity (did you mean min_capacity?)``."""
    close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
    return f"{name} (did you mean {close[0]}?)" if close else name


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"
