"""``@throughput(...)`` arguments -> :class:`Workload` (what to send) + :class:`Targets` (what must hold).

Validation happens at collection, so a typo in a marker costs nothing on the GPU: every
problem names the argument, the bad value and what is allowed.  This module knows nothing
of pytest; the plugin adds the test's name to the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .workload import Api

MARKER_SIGNATURE = (
    "throughput(concurrency=1, max_tokens=512, min_tok_s=None, min_request_tok_s=None, "
    "max_ttft_s=None, max_itl_s=None, max_e2e_s=None, percentile=95, min_goodput=None, prompts='diverse', input_tokens=None, requests=None, duration_s=None, "
    "trials=None, warmup=2, ignore_eos=True, timeout_s=600, api='chat', max_error_rate=0, "
    "tolerance=None, alpha=None): measure output tok/s at each concurrency level against an "
    "OpenAI-compatible endpoint before the test body runs, and fail on a missed target"
)

DEFAULT_MAX_TOKENS = 512
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 600.0
REQUESTS_PER_WORKER = 2
"""Default trial size: each closed-loop worker sends this many requests.

Two per worker keep every worker busy across the steady-state window even when the server
queues some requests (C above max_running_requests), at the cost of one more output length."""


class MarkerError(ValueError):
    """A malformed ``@throughput`` argument; the message says which and what is allowed."""


@dataclass(frozen=True, slots=True)
class Workload:
    """What to send at each level; also the key under which baselines are stored."""

    levels: tuple[int, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    prompts: str | tuple[str, ...] | None = None
    input_tokens: int | None = None
    requests: int | None = None
    duration_s: float | None = None
    trials: int | None = None
    warmup: int = DEFAULT_WARMUP
    ignore_eos: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    api: Api = "chat"
    max_error_rate: float = 0.0

    def requests_for(self, concurrency: int) -> int | None:
        """Requests in one trial at this level (None: bounded by ``duration_s`` alone)."""
        if self.requests is not None:
            return self.requests
        if self.duration_s is not None:
            return None
        return REQUESTS_PER_WORKER * concurrency


@dataclass(frozen=True, slots=True)
class Targets:
    """What must hold at every level; ``None`` means no target of that kind."""

    min_tok_s: Mapping[int, float] = field(default_factory=dict)
    min_request_tok_s: float | None = None
    max_ttft_s: float | None = None
    max_itl_s: float | None = None
    max_e2e_s: float | None = None
    percentile: float = 95.0
    """Latency ceilings apply at this percentile of the level's requests."""
    min_goodput: float | None = None
    """Floor on the share of requests that meet every latency ceiling (each request on its own)."""
    tolerance: float | None = None
    alpha: float | None = None

    def floor_for(self, concurrency: int) -> float | None:
        return self.min_tok_s.get(concurrency)


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MarkerError(f"{name}={value!r}: expected an integer >= {minimum}")
    return value


def _positive_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise MarkerError(f"{name}={value!r}: expected a number > 0")
    return float(value)


def _fraction(name: str, value: Any, *, open_low: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (0 < value < 1) if open_low else (0 <= value <= 1)
    if not ok:
        bounds = "0 < x < 1" if open_low else "0 <= x <= 1"
        raise MarkerError(f"{name}={value!r}: expected a number with {bounds}")
    return float(value)


def _percentile(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 100:
        raise MarkerError(f"{name}={value!r}: expected a number with 0 < x < 100")
    return float(value)


def _levels(value: Any) -> tuple[int, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise MarkerError("concurrency=[]: expected an integer >= 1 or a non-empty list of them")
    levels = tuple(_positive_int("concurrency", v) for v in items)
    if len(set(levels)) != len(levels):
        raise MarkerError(f"concurrency={list(levels)!r}: levels must be distinct")
    return levels


def _floors(value: Any, levels: tuple[int, ...]) -> dict[int, float]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        floors = {}
        for level, floor in value.items():
            if level not in levels:
                raise MarkerError(
                    f"min_tok_s={dict(value)!r}: level {level!r} is not one of the "
                    f"concurrency levels {list(levels)}"
                )
            floors[level] = _positive_float(f"min_tok_s[{level}]", floor)
        return floors
    floor = _positive_float("min_tok_s", value)
    return {level: floor for level in levels}


def _prompts(value: Any) -> str | tuple[str, ...] | None:
    if value is None or isinstance(value, str) and value:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(p, str) and p for p in value):
        return tuple(value)
    raise MarkerError(
        f"prompts={value!r}: expected a built-in set name, a JSONL path, or a non-empty "
        "list of non-empty strings"
    )


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise MarkerError(f"{name}={value!r}: expected one of {', '.join(map(repr, allowed))}")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise MarkerError(f"{name}={value!r}: expected True or False")
    return value


_OPTIONAL: dict[str, Callable[[str, Any], Any]] = {
    "max_tokens": _positive_int,
    "input_tokens": _positive_int,
    "requests": _positive_int,
    "duration_s": _positive_float,
    "trials": _positive_int,
    "warmup": lambda n, v: _positive_int(n, v, minimum=0),
    "ignore_eos": _bool,
    "timeout_s": _positive_float,
    "api": lambda n, v: _choice(n, v, ("chat", "completions")),
    "max_error_rate": _fraction,
    "min_request_tok_s": _positive_float,
    "max_ttft_s": _positive_float,
    "max_itl_s": _positive_float,
    "max_e2e_s": _positive_float,
    "percentile": lambda n, v: _percentile(n, v),
    "min_goodput": _fraction,
    "tolerance": lambda n, v: _fraction(n, v, open_low=True),
    "alpha": lambda n, v: _fraction(n, v, open_low=True),
}

ALLOWED_ARGS = ("concurrency", "min_tok_s", "prompts", *_OPTIONAL)


def parse_throughput(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Workload, Targets]:
    """Validate marker arguments; raise :class:`MarkerError` naming the first bad one."""
    if args:
        raise MarkerError(
            f"positional arguments {args!r} are not accepted: use keywords such as "
            "concurrency=[1, 8], min_tok_s=60"
        )
    unknown = sorted(set(kwargs) - set(ALLOWED_ARGS))
    if unknown:
        raise MarkerError(
            f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(ALLOWED_ARGS))}"
        )
    levels = _levels(kwargs.get("concurrency", 1))
    values = {
        name: check(name, kwargs[name])
        for name, check in _OPTIONAL.items()
        if kwargs.get(name) is not None
    }
    prompts = _prompts(kwargs.get("prompts"))
    if prompts is not None and "input_tokens" in values:
        raise MarkerError("prompts and input_tokens are exclusive: give one or the other")
    requests = values.get("requests")
    if "min_goodput" in values and not any(k in values for k in ("max_ttft_s", "max_itl_s", "max_e2e_s")):
        raise MarkerError("min_goodput needs at least one of max_ttft_s, max_itl_s, max_e2e_s to define a good request")
    if requests is not None and requests < max(levels):
        raise MarkerError(
            f"requests={requests} is below concurrency {max(levels)}: a trial needs at "
            "least one request per in-flight slot"
        )
    targets = Targets(
        min_tok_s=_floors(kwargs.get("min_tok_s"), levels),
        min_request_tok_s=values.pop("min_request_tok_s", None),
        max_ttft_s=values.pop("max_ttft_s", None),
        max_itl_s=values.pop("max_itl_s", None),
        max_e2e_s=values.pop("max_e2e_s", None),
        percentile=values.pop("percentile", 95.0),
        min_goodput=values.pop("min_goodput", None),
        tolerance=values.pop("tolerance", None),
        alpha=values.pop("alpha", None),
    )
    return Workload(levels=levels, prompts=prompts, **values), targets


def merge_marker_kwargs(markers: list[tuple[tuple[Any, ...], Mapping[str, Any]]]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Closest marker wins per argument: function over class over module ``pytestmark``."""
    merged: dict[str, Any] = {}
    args: tuple[Any, ...] = ()
    for mark_args, mark_kwargs in reversed(markers):
        merged.update(mark_kwargs)
        args = args or tuple(mark_args)
    return args, merged
