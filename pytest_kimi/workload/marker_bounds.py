"""The upper bounds on marker values (:data:`BOUNDED_ARGS`) and ``--perf-allow-large``, the
one switch that lifts them.

A module of its own because the bounds are a table with reasons (``docs/reference/reference.md``,
"Upper bounds") that three otherwise unrelated callers read: the ``@throughput`` parse
(:mod:`pytest_kimi.workload.markers`), the ``@capacity`` parse
(:mod:`pytest_kimi.workload.capacity_marker`) and the option table (:mod:`pytest_kimi.options`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from pytest_kimi.workload.prompts import length_bounds
from pytest_kimi.workload.workload_spec import LevelSpec, MarkerError, Workload, ratio_key


ALLOW_LARGE_FLAG = "--perf-allow-large"
"""The one override of the upper bounds below: a command-line switch (also ini
``kimi_perf_allow_large``, env ``KIMI_PERF_ALLOW_LARGE``; declared in :mod:`pytest_kimi.options`).
Named here because every bound's message names it."""
ALLOW_LARGE_HINT = (
    f"if you mean it, run with {ALLOW_LARGE_FLAG} (or ini kimi_perf_allow_large = true)"
)


@dataclass(frozen=True, slots=True)
class Bound:
    """An upper bound on a marker value: beyond it the value is a typo or a unit slip
    (``10**7`` for ``10**4``, milliseconds for seconds), not a deployment anyone runs.

    Why bounds at all: the client builds what a marker asks for before it sends anything (a
    stream per unit of concurrency, a prompt of ``input_tokens``, a record per request), so
    ``concurrency=10**7`` took 5.6 GB and died with ``SystemError`` and ``input_tokens=10**9``
    3.2 GB, silently.  Each limit is generous, set from what a real deployment can do, and
    ``--perf-allow-large`` lifts every one of them; non-finite numbers are refused always.
    """

    limit: int | float
    why: str
    """Why this limit: the message says it, so the reader can judge the override."""


MAX_CONCURRENCY = Bound(
    65_536,
    "far beyond the streams one deployment serves at once: SGLang's and vLLM's running "
    "batches hold hundreds to a few thousand",
)
MAX_RATE = Bound(
    10_000.0,
    "requests/s far beyond what one deployment completes; a default trial sends 20 s of them",
)
MAX_CONTEXT_TOKENS = Bound(
    2_097_152,
    "tokens: a 2M-token context, the longest a served model takes",
)
"""Bounds ``max_tokens``, ``input_tokens`` and ``shared_prefix_tokens``."""
MAX_TRIALS = Bound(1_000, "trials per level; the gate decides in 3 to 10")
MAX_WARMUP = Bound(10_000, "warm-up requests; 2 warm a server")
MAX_REQUESTS = Bound(
    1_000_000,
    "requests in one trial; the client keeps a record of each",
)
"""Bounds ``requests``, ``requests_per_stream``, ``num_prompts`` and what a level's trial sends
in all (streams x requests per stream, rate x seconds)."""
MAX_SECONDS = Bound(86_400.0, "seconds: a day")
"""Bounds ``duration_s`` (a ramp's step too) and ``timeout_s``."""
MAX_TURNS = Bound(1_000, "turns of one conversation, each re-sending the whole history")
MAX_PREFIX_GROUPS = Bound(65_536, "distinct system prompts, one per group")
MAX_PREFIX_TOKENS_HELD = Bound(
    2**25,
    "tokens of system prompts the client holds at once, about 130 MB of text",
)
MAX_LEVELS = Bound(1_000, "levels one test measures, each its own trials")
"""Bounds a sweep (loads x max_tokens x input_tokens) and a capacity search's ``max_levels``."""

BOUNDED_ARGS: Mapping[str, Bound] = {
    "concurrency": MAX_CONCURRENCY,
    "rate": MAX_RATE,
    "max_tokens": MAX_CONTEXT_TOKENS,
    "input_tokens": MAX_CONTEXT_TOKENS,
    "shared_prefix_tokens": MAX_CONTEXT_TOKENS,
    "trials": MAX_TRIALS,
    "warmup": MAX_WARMUP,
    "requests": MAX_REQUESTS,
    "requests_per_stream": MAX_REQUESTS,
    "num_prompts": MAX_REQUESTS,
    "duration_s": MAX_SECONDS,
    "timeout_s": MAX_SECONDS,
    "turns": MAX_TURNS,
    "prefix_groups": MAX_PREFIX_GROUPS,
    "max_concurrency": MAX_CONCURRENCY,
}
"""Every marker argument with an upper bound (``docs/reference/reference.md``, "Upper bounds")."""


def check_bound(
    name: str, value: float, bound: Bound, *, allow_large: bool = False, given: str | None = None
) -> None:
    """:class:`MarkerError` when ``value`` is above ``bound`` (unless ``allow_large``): the
    message names the argument as ``given`` (default ``name=value``), the bound, why, and the
    override."""
    if allow_large or value <= bound.limit:
        return
    written = given if given is not None else f"{name}={_shown(value)}"
    raise MarkerError(
        f"{written} is above the bound {_shown(bound.limit)} ({bound.why}); " + ALLOW_LARGE_HINT
    )


def _shown(value: float) -> str:
    """A bound or value as written in a marker: ``65536``, ``0.5``, ``2**25`` as digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def check_trial_size(workload: Workload, level: LevelSpec, *, allow_large: bool = False) -> None:
    """What one trial at ``level`` sends in all (streams x requests per stream x turns, or
    rate x seconds) against :data:`MAX_REQUESTS`: each value may be within its bound and the
    product not (``concurrency=65536, requests_per_stream=1000``)."""
    requests = workload.requests_for(level)
    if requests is None and level.rate is not None and workload.duration_s is not None:
        requests = math.ceil(level.rate * workload.duration_s)
    if requests is None or allow_large or requests <= MAX_REQUESTS.limit:
        return
    raise MarkerError(
        f"a trial at {workload.label(level)} sends {requests} requests, above the bound "
        f"{_shown(MAX_REQUESTS.limit)} ({MAX_REQUESTS.why}); size trials with fewer "
        f"requests, or {ALLOW_LARGE_HINT}"
    )


def check_bounds(workload: Workload, *, allow_large: bool = False) -> None:
    """Every bounded value of a parsed workload (levels, trial sizes, the prefix prompts held)
    against its :class:`Bound`; the first one above raises :class:`MarkerError`.

    Run at collection by :func:`~pytest_kimi.workload.markers.parse_throughput` (and so
    :func:`~pytest_kimi.workload.capacity_marker.parse_capacity`), before any prompt is built or
    a request sent.
    """
    if len(workload.levels) > MAX_LEVELS.limit and not allow_large:
        raise MarkerError(
            f"the sweep has {len(workload.levels)} levels, above the bound "
            f"{_shown(MAX_LEVELS.limit)} ({MAX_LEVELS.why}); " + ALLOW_LARGE_HINT
        )
    for level in workload.levels:
        for name in ("concurrency", "rate", "max_tokens", "input_tokens"):
            value = getattr(level, name)
            if value is not None:
                check_bound(name, value, BOUNDED_ARGS[name], allow_large=allow_large)
        if workload.range_ratio is not None:
            # the longest draw is what a request may ask for
            for name, value, ratio in (
                ("input_tokens", level.input_tokens, workload.range_ratio[0]),
                ("max_tokens", level.max_tokens, workload.range_ratio[1]),
            ):
                if value is not None and ratio:
                    top = length_bounds(value, ratio)[1]
                    given = (
                        f"{name}={value} with range_ratio={_ratio_shown(workload)} (up to {top})"
                    )
                    check_bound(name, top, MAX_CONTEXT_TOKENS, allow_large=allow_large, given=given)
    for name, bound in BOUNDED_ARGS.items():
        value = getattr(workload, name, None)
        if name not in ("concurrency", "rate", "max_tokens", "input_tokens") and value is not None:
            check_bound(name, value, bound, allow_large=allow_large)
    if workload.shared_prefix_tokens is not None:
        held = workload.shared_prefix_tokens * (workload.prefix_groups or 1)
        if held > MAX_PREFIX_TOKENS_HELD.limit and not allow_large:
            raise MarkerError(
                f"shared_prefix_tokens={workload.shared_prefix_tokens} x "
                f"prefix_groups={workload.prefix_groups} is {held} tokens, above the bound "
                f"{MAX_PREFIX_TOKENS_HELD.limit} ({MAX_PREFIX_TOKENS_HELD.why}); "
                + ALLOW_LARGE_HINT
            )
    for level in workload.levels:
        check_trial_size(workload, level, allow_large=allow_large)


def _ratio_shown(workload: Workload) -> str:
    """The workload's ``range_ratio`` as a marker would write it."""
    shown = ratio_key(workload.range_ratio)
    return repr(shown)
