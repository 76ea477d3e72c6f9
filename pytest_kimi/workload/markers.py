"""``@throughput(...)`` arguments -> :class:`Workload` (what to send) + :class:`Targets` (what must hold).

Validation happens at collection, so a typo in a marker costs nothing on the GPU: every
problem names the argument, the bad value and what is allowed.  This module knows nothing
of pytest; the plugin adds the test's name to the message.  Here: the parse and the rules on
how arguments combine; the types are in :mod:`pytest_kimi.workload.workload_spec`, each
argument's own check in :mod:`pytest_kimi.workload.marker_args`, the upper bounds in
:mod:`pytest_kimi.workload.marker_bounds`.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from pytest_kimi.workload.marker_args import _OPTIONAL, _finite, _floors, _levels, _prompts
from pytest_kimi.workload.marker_bounds import check_bounds
from pytest_kimi.workload.ramp import Ramp
from pytest_kimi.workload.workload_spec import (
    STATIONARY,
    WHOLE_REQUESTS,
    LevelSpec,
    MarkerError,
    Targets,
    Workload,
)


MARKER_SIGNATURE = (
    "throughput(concurrency=1, rate=None, max_tokens=512, min_tok_s=None, min_request_tok_s=None, "
    "max_ttft_s=None, max_itl_s=None, max_e2e_s=None, percentile=95, min_goodput=None, prompts='diverse', input_tokens=None, dataset=None, num_prompts=None, shared_prefix_tokens=None, prefix_groups=None, range_ratio=None, burstiness=1.0, max_concurrency=None, requests=None, requests_per_stream=1, duration_s=None, turns=1, "
    "trials=None, warmup=2, ignore_eos=True, timeout_s=600, api='chat', max_error_rate=0, "
    "tolerance=None, alpha=None, latency_tolerance=None, seed=0, protocol=None): measure output tok/s at each concurrency level against an "
    "OpenAI-compatible endpoint before the test body runs, and fail on a missed target"
)

ALLOWED_ARGS = (
    "concurrency",
    "rate",
    "max_tokens",
    "input_tokens",
    "min_tok_s",
    "prompts",
    *_OPTIONAL,
)


def _with_suggestion(name: str) -> str:
    """``min_toks`` -> ``min_toks (did you mean min_tok_s?)``: a typo names its fix."""
    close = difflib.get_close_matches(name, ALLOWED_ARGS, n=1, cutoff=0.6)
    return f"{name} (did you mean {close[0]}?)" if close else name


def parse_throughput(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], *, allow_large: bool = False
) -> tuple[Workload, Targets]:
    """Validate marker arguments; raise :class:`MarkerError` naming the first bad one.

    ``allow_large`` (``--perf-allow-large``) lifts the upper bounds
    (:data:`~pytest_kimi.workload.marker_bounds.BOUNDED_ARGS`);
    non-finite numbers are refused whatever it says.
    """
    if args:
        raise MarkerError(
            f"positional arguments {args!r} are not accepted: use keywords such as "
            "concurrency=[1, 8], min_tok_s=60"
        )
    unknown = sorted(set(kwargs) - set(ALLOWED_ARGS))
    if unknown:
        named = ", ".join(_with_suggestion(name) for name in unknown)
        raise MarkerError(
            f"unknown argument{'s' if len(unknown) > 1 else ''} {named}; "
            f"allowed: {', '.join(sorted(ALLOWED_ARGS))}"
        )
    levels = _levels(kwargs, allow_large)
    values = {
        name: check(name, kwargs[name])
        for name, check in _OPTIONAL.items()
        if kwargs.get(name) is not None
    }
    prompts = _prompts(kwargs.get("prompts"))
    if prompts is not None and kwargs.get("input_tokens") is not None:
        raise MarkerError("prompts and input_tokens are exclusive: give one or the other")
    _check_dataset_and_prefix(values, prompts, kwargs.get("input_tokens"), levels)
    requests = values.get("requests")
    exclusive = [
        name for name in ("requests", "requests_per_stream", "duration_s") if name in values
    ]
    if len(exclusive) > 1:
        raise MarkerError(
            f"{' and '.join(exclusive)} are exclusive: each sets how long a trial is "
            "(requests: in all; requests_per_stream: per concurrent stream; duration_s: in seconds)"
        )
    if values.get("protocol") == STATIONARY and exclusive:
        raise MarkerError(
            f"protocol='stationary' times its trials itself; {exclusive[0]}= sizes whole-request "
            "trials: drop it, or use protocol='whole-requests'"
        )
    whole = [name for name in ("max_e2e_s", "min_goodput") if name in values]
    if whole:
        # A stationary trial cuts its streams when its time box ends, so few requests of a
        # long max_tokens complete in it: end-to-end latency (and goodput, which judges it)
        # needs trials that wait for whole requests.
        if values.get("protocol") == STATIONARY:
            raise MarkerError(
                f"{whole[0]}= judges whole requests, which a stationary trial cuts short: "
                "drop protocol='stationary' (whole-request trials are then used)"
            )
        values["protocol"] = WHOLE_REQUESTS
    if "requests_per_stream" in values and all(lv.concurrency is None for lv in levels):
        raise MarkerError(
            "requests_per_stream applies to concurrency levels; an open-loop (rate=) trial is "
            "sized by requests or duration_s"
        )
    if "min_goodput" in values and not any(
        k in values for k in ("max_ttft_s", "max_itl_s", "max_e2e_s")
    ):
        raise MarkerError(
            "min_goodput needs at least one of max_ttft_s, max_itl_s, max_e2e_s to define a good request"
        )
    top = max((lv.concurrency or 0) for lv in levels)
    if requests is not None and requests < top:
        raise MarkerError(
            f"requests={requests} is below concurrency {top}: a trial needs at "
            "least one request per in-flight slot"
        )
    _check_turns(values, levels)
    _check_ramp(values, kwargs.get("rate"))
    _check_arrivals_and_ranges(values, kwargs, levels)
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
        latency_tolerance=values.pop("latency_tolerance", None),
    )
    workload = Workload(levels=levels, prompts=prompts, **values)
    check_bounds(workload, allow_large=allow_large)
    return workload, targets


def _check_dataset_and_prefix(
    values: dict[str, Any],
    prompts: Any,
    input_tokens: Any,
    levels: tuple[LevelSpec, ...],
) -> None:
    """``dataset=`` / ``num_prompts=`` and ``shared_prefix_tokens=`` / ``prefix_groups=``.

    A dataset run is a replay: each trial sends the sample's requests, each with its own output
    length, and waits for them (``whole-requests``).  A stationary trial's staggered openers and
    its time box assume one length for every request, and a time box of ~160 steps would see a
    different slice of the dataset in every trial; a whole pass keeps every trial the same
    workload, so the protocol is chosen here (and recorded in the baseline key as usual).
    """
    dataset = values.get("dataset")
    if dataset is not None:
        given = {"prompts": prompts, "input_tokens": input_tokens}
        other = next((name for name, value in given.items() if value is not None), None)
        if other is not None:
            raise MarkerError(
                f"dataset and {other} are exclusive: the dataset's entries are the prompts"
            )
        if values.get("protocol") == STATIONARY:
            raise MarkerError(
                "dataset= replays whole requests of the dataset's own lengths, which a "
                "stationary trial cuts short: drop protocol='stationary' (whole-request trials "
                "are then used)"
            )
        values["protocol"] = WHOLE_REQUESTS
        num = values.get("num_prompts")
        top = max((lv.concurrency or 0) for lv in levels)
        sized = any(k in values for k in ("requests", "requests_per_stream", "duration_s"))
        if num is not None and num < top and not sized:
            raise MarkerError(
                f"num_prompts={num} is below concurrency {top}: a trial replays the sample once, "
                "so it needs at least one prompt per in-flight slot (several per stream is better)"
            )
    elif "num_prompts" in values:
        raise MarkerError("num_prompts= samples a dataset: give dataset= too")
    if "prefix_groups" in values and "shared_prefix_tokens" not in values:
        raise MarkerError(
            "prefix_groups= says how many system prompts shared_prefix_tokens deals out: give "
            "shared_prefix_tokens= too"
        )
    if "shared_prefix_tokens" in values:
        values.setdefault("prefix_groups", 1)


def _check_turns(values: dict[str, Any], levels: tuple[LevelSpec, ...]) -> None:
    """``turns=``: conversations run in a closed loop, as whole requests.

    A turn is sent when the previous answer is in, which is what a closed-loop stream does; an
    open-loop arrival has no previous answer.  A conversation needs every answer whole, so a
    stationary trial (which cuts its streams at its time box and opens them with shortened
    requests) cannot carry one: multi-turn levels run ``whole-requests`` trials, one
    conversation per stream by default (``requests_per_stream`` = ``turns``), and the protocol
    and ``turns`` are both part of the baseline key (``docs/guide/workloads.md``).
    """
    turns = values.get("turns", 1)
    if turns < 2:
        return
    if any(lv.concurrency is None for lv in levels):
        raise MarkerError(
            f"turns={turns} applies to concurrency levels: a turn is sent when the previous "
            "answer is in (a closed loop); drop rate= or turns="
        )
    if values.get("protocol") == STATIONARY:
        raise MarkerError(
            f"turns={turns} sends every answer back whole, which a stationary trial cuts short: "
            "drop protocol='stationary' (whole-request trials are then used)"
        )
    if values.get("dataset") is not None:
        raise MarkerError(
            f"dataset= and turns={turns} are exclusive: a dataset's entries are replayed as "
            "they are; turns= builds conversations from prompts= or input_tokens="
        )
    per_stream = values.get("requests_per_stream")
    if per_stream is not None and per_stream % turns:
        raise MarkerError(
            f"requests_per_stream={per_stream} with turns={turns}: a stream runs whole "
            f"conversations in a trial, so give a multiple of {turns} (or leave it out: one "
            "conversation per stream)"
        )
    values["protocol"] = WHOLE_REQUESTS


def _check_arrivals_and_ranges(
    values: dict[str, Any], given: Mapping[str, Any], levels: tuple[LevelSpec, ...]
) -> None:
    """``burstiness=`` and ``max_concurrency=`` shape open-loop arrivals; ``range_ratio=`` draws
    each request's lengths (``docs/guide/workloads.md``).

    A closed loop has no arrivals to shape (its C streams send when they are free, and C is
    already its concurrency cap).  A range needs lengths of the plugin's own making: a
    dataset replays its entries' own lengths, and a conversation's turns keep the lengths its
    first request had; the input part needs synthetic prompts (``input_tokens=``), which a
    single ratio applies to where they are given and the dict form asks for explicitly.
    """
    closed = any(lv.concurrency is not None for lv in levels)
    for name in ("burstiness", "max_concurrency"):
        if name in values and closed:
            what = (
                "shapes the gaps between open-loop arrivals"
                if name == "burstiness"
                else "caps the requests in flight of an open loop (concurrency= is a closed "
                "loop's cap already)"
            )
            raise MarkerError(f"{name}={given[name]!r} {what}: give rate= instead of concurrency=")
    if values.get("burstiness") == 1.0:
        del values["burstiness"]  # the default: a Poisson process, as before
    if "range_ratio" not in values:
        return
    ratios = values["range_ratio"]
    raw_ratio = given["range_ratio"]
    if ratios == (0.0, 0.0):
        del values["range_ratio"]  # every length fixed: the workload without a range
        return
    if values.get("dataset") is not None:
        raise MarkerError(
            "dataset= and range_ratio= are exclusive: a dataset's entries keep their own "
            "input and output lengths"
        )
    if values.get("turns", 1) > 1:
        raise MarkerError(
            f"turns={values['turns']} and range_ratio= are exclusive: a conversation's turns "
            "keep the lengths of its first request"
        )
    if isinstance(raw_ratio, Mapping) and ratios[0] and levels[0].input_tokens is None:
        raise MarkerError(
            f"range_ratio={dict(raw_ratio)!r} draws input lengths around input_tokens=, which "
            "is not given (a prompt set's prompts keep their own lengths): give input_tokens=, "
            "or an 'input' ratio of 0"
        )


def _check_ramp(values: dict[str, Any], rate: Any) -> None:
    """``rate=ramp(..., duration_s=D)`` sizes each step's trial at ``D / steps`` seconds."""
    if not isinstance(rate, Ramp):
        return
    values["ramp"] = rate
    if rate.duration_s is None:
        return
    sized = [name for name in ("requests", "duration_s") if name in values]
    if sized:
        raise MarkerError(
            f"rate={rate!r} sizes each step (duration_s / steps seconds of arrivals): drop "
            f"{sized[0]}=, or the ramp's duration_s"
        )
    step_s = _finite(rate.duration_s)
    if step_s is None:  # the ramp lets inf through: each step would send for ever
        raise MarkerError(f"rate={rate!r}: duration_s must be a finite number of seconds")
    values["duration_s"] = rate.step_s


def merge_marker_kwargs(
    markers: list[tuple[tuple[Any, ...], Mapping[str, Any]]],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Closest marker wins per argument: function over class over module ``pytestmark``."""
    merged: dict[str, Any] = {}
    args: tuple[Any, ...] = ()
    for mark_args, mark_kwargs in reversed(markers):
        merged.update(mark_kwargs)
        args = args or tuple(mark_args)
    return args, merged
