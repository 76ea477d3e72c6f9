"""One check per ``@throughput`` argument (:data:`_OPTIONAL`), and the sweep the load and
length arguments make (:func:`_levels`, :func:`_floors`).

Each check looks at one value alone: it returns the value typed, or raises
:class:`~pytest_kimi.workload.workload_spec.MarkerError` naming the argument, the bad value
and what is allowed.  How arguments combine is :mod:`pytest_kimi.workload.markers`' job; kept
apart, a new argument's check is added here without reading those rules.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from pytest_kimi.workload.marker_bounds import MAX_RATE, check_bound
from pytest_kimi.workload.ramp import Ramp, RampError, check as check_ramp
from pytest_kimi.workload.workload_spec import (
    DEFAULT_MAX_TOKENS,
    PROTOCOLS,
    LevelSpec,
    MarkerError,
)


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MarkerError(f"{name}={value!r}: expected an integer >= {minimum}")
    return value


def _positive_float(name: str, value: Any) -> float:
    # finite: rate=inf passed collection and raised OverflowError at setup (round(inf * 20))
    number = _finite(value)
    if number is None or not number > 0:
        raise MarkerError(f"{name}={value!r}: expected a finite number > 0")
    return number


def _finite(value: Any) -> float | None:
    """``value`` as a finite float; None for a non-number, inf, nan or an int too large for a
    float (``10**400``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


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


RANGE_RATIO_FORM = "a number 0 <= r < 1, or {'input': r_in, 'output': r_out} with each 0 <= r < 1"


def _ratio(name: str, value: Any) -> float:
    """One ratio of vLLM's ``--random-range-ratio``: ``0 <= r < 1`` (its ``get_sampling_params``
    refuses 1 and above: the range's low end would be 0 tokens)."""
    number = _finite(value)
    if number is None or not 0 <= number < 1:
        raise MarkerError(
            f"{name}={value!r}: expected {RANGE_RATIO_FORM} (each length is drawn from "
            "[L * (1 - r), L * (1 + r)]; 0 keeps it fixed)"
        )
    return number


def _range_ratio(name: str, value: Any) -> tuple[float, float]:
    """``range_ratio=``: one ratio for input and output, or vLLM's dict of the two
    (``{"input": ..., "output": ...}``, both keys required as vLLM requires them)."""
    if isinstance(value, Mapping):
        keys = set(value)
        if keys != {"input", "output"}:
            raise MarkerError(
                f"{name}={dict(value)!r}: a dict needs exactly the keys 'input' and 'output' "
                f"(got {sorted(map(str, keys))}); expected {RANGE_RATIO_FORM}"
            )
        return (
            _ratio(f"{name}['input']", value["input"]),
            _ratio(f"{name}['output']", value["output"]),
        )
    ratio = _ratio(name, value)
    return ratio, ratio


def _burstiness(name: str, value: Any) -> float:
    """vLLM's ``--burstiness``: the gamma shape, any number > 0 (vLLM also takes inf for even
    gaps; a marker value is finite, and a large shape is as even as anyone needs: 10000 has a
    coefficient of variation of 1%)."""
    number = _finite(value)
    if number is None or not number > 0:
        raise MarkerError(
            f"{name}={value!r}: expected a finite number > 0 (the gamma shape of the gaps "
            "between arrivals: 1 is Poisson, below 1 burstier, above 1 more even)"
        )
    return number


def _sweep(name: str, value: Any, check: Callable[[str, Any], Any]) -> tuple[Any, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise MarkerError(f"{name}=[]: expected a value or a non-empty list of them")
    values = tuple(check(name, v) for v in items)
    if len(set(values)) != len(values):
        raise MarkerError(f"{name}={list(values)!r}: sweep values must be distinct")
    return values


def _levels(kwargs: Mapping[str, Any], allow_large: bool = False) -> tuple[LevelSpec, ...]:
    """The sweep: every load value (concurrency or rate) x max_tokens x input_tokens, in order."""
    if kwargs.get("rate") is not None and kwargs.get("concurrency") is not None:
        raise MarkerError(
            "concurrency and rate are exclusive: closed loop (concurrency) or open loop (rate)"
        )
    loads: list[tuple[int | None, float | None]]
    if kwargs.get("rate") is not None:
        loads = [(None, r) for r in _rates(kwargs["rate"], allow_large)]
    else:
        loads = [
            (c, None) for c in _sweep("concurrency", kwargs.get("concurrency", 1), _positive_int)
        ]
    lengths = _sweep("max_tokens", kwargs.get("max_tokens", DEFAULT_MAX_TOKENS), _positive_int)
    raw_inputs = kwargs.get("input_tokens")
    inputs = (None,) if raw_inputs is None else _sweep("input_tokens", raw_inputs, _positive_int)
    return tuple(LevelSpec(c, r, m, i) for (c, r) in loads for m in lengths for i in inputs)


def _rates(value: Any, allow_large: bool = False) -> tuple[float, ...]:
    """``rate=``: a number, a list of them, or a :func:`~pytest_kimi.workload.ramp.ramp` (whose
    top is held to :data:`MAX_RATE` here, so the message names the ramp as written)."""
    if isinstance(value, Ramp):
        try:
            rates = check_ramp(value).rates
        except RampError as exc:
            raise MarkerError(f"rate={value!r}: {exc}") from None
        check_bound("rate", max(rates), MAX_RATE, allow_large=allow_large, given=f"rate={value!r}")
        return rates
    if isinstance(value, Mapping):
        raise MarkerError(
            f"rate={dict(value)!r}: a ramp is written rate=ramp(start, stop, steps=4) "
            "(from pytest_kimi import ramp); a sweep of rates is a list"
        )
    return _sweep("rate", value, _positive_float)


def _floors(value: Any, levels: tuple[LevelSpec, ...]) -> dict[float, float]:
    loads = sorted({lv.load for lv in levels})
    kind = "concurrency" if levels[0].concurrency is not None else "rate"
    if value is None:
        return {}
    if isinstance(value, Mapping):
        floors = {}
        for load, floor in value.items():
            if (
                isinstance(load, bool)
                or not isinstance(load, (int, float))
                or float(load) not in loads
            ):
                shown = [int(x) if x == int(x) else x for x in loads]
                raise MarkerError(
                    f"min_tok_s={dict(value)!r}: level {load!r} is not one of the {kind} levels {shown}"
                )
            floors[float(load)] = _positive_float(f"min_tok_s[{load}]", floor)
        return floors
    floor = _positive_float("min_tok_s", value)
    return {load: floor for load in loads}


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


def _dataset(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MarkerError(
            f"{name}={value!r}: expected a path to a ShareGPT JSON or JSONL file (relative to "
            "the rootdir) or 'builtin:sharegpt-small'"
        )
    return value


_OPTIONAL: dict[str, Callable[[str, Any], Any]] = {
    "requests": _positive_int,
    "requests_per_stream": _positive_int,
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
    "latency_tolerance": _positive_float,
    "seed": lambda n, v: _positive_int(n, v, minimum=0),
    "protocol": lambda n, v: _choice(n, v, PROTOCOLS),
    "turns": _positive_int,
    "dataset": _dataset,
    "num_prompts": _positive_int,
    "shared_prefix_tokens": _positive_int,
    "prefix_groups": _positive_int,
    "range_ratio": _range_ratio,
    "burstiness": _burstiness,
    "max_concurrency": _positive_int,
}
