"""``@throughput(...)`` arguments -> :class:`Workload` (what to send) + :class:`Targets` (what must hold).

Validation happens at collection, so a typo in a marker costs nothing on the GPU: every
problem names the argument, the bad value and what is allowed.  This module knows nothing
of pytest; the plugin adds the test's name to the message.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pytest_kimi.load.records import Api
from pytest_kimi.workload.prompts import RANGE_DRAWS, draw_lengths, length_bounds
from pytest_kimi.workload.ramp import Ramp, RampError, check as check_ramp

MARKER_SIGNATURE = (
    "throughput(concurrency=1, rate=None, max_tokens=512, min_tok_s=None, min_request_tok_s=None, "
    "max_ttft_s=None, max_itl_s=None, max_e2e_s=None, percentile=95, min_goodput=None, prompts='diverse', input_tokens=None, dataset=None, num_prompts=None, shared_prefix_tokens=None, prefix_groups=None, range_ratio=None, burstiness=1.0, max_concurrency=None, requests=None, requests_per_stream=1, duration_s=None, turns=1, "
    "trials=None, warmup=2, ignore_eos=True, timeout_s=600, api='chat', max_error_rate=0, "
    "tolerance=None, alpha=None, latency_tolerance=None, seed=0, protocol=None): measure output tok/s at each concurrency level against an "
    "OpenAI-compatible endpoint before the test body runs, and fail on a missed target"
)

STATIONARY = "stationary"
WHOLE_REQUESTS = "whole-requests"
PROTOCOLS = (STATIONARY, WHOLE_REQUESTS)
"""How a closed-loop trial is run (``docs/statistics.md``, "Trial protocols"):

* ``stationary``: C streams send back to back, each starting with a request of a staggered
  shorter length so the batch holds every decode position from the first steps; a trial is
  a time box of :func:`~pytest_kimi.measure.time_box.time_box` steps of that load,
  cut when it is over (the streams in flight are cancelled), not when its requests end;
* ``whole-requests``: every trial sends whole requests (one per stream by default) and waits
  for them; the window is when all C decode at once.  The protocol before 0.2, and what
  ``requests=``, ``requests_per_stream=`` and ``duration_s=`` ask for."""
DEFAULT_PROTOCOL = STATIONARY

DEFAULT_MAX_TOKENS = 512
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 600.0
REQUESTS_PER_WORKER = 1
"""Default trial size: each closed-loop worker sends one request, so a trial is one round.

With fixed-length outputs (ignore_eos) a round's requests decode side by side and the
steady-state window spans nearly all of it.  When C exceeds the server's max running requests
the queued ones start late and the window is empty: the level then says so (invalid, give more
``requests``) rather than report a number."""


class MarkerError(ValueError):
    """A malformed ``@throughput`` argument; the message says which and what is allowed."""


OPEN_LOOP_SECONDS = 20.0
"""Default open-loop trial: this many seconds of arrivals (at least ``MIN_OPEN_LOOP`` requests)."""
MIN_OPEN_LOOP = 10


@dataclass(frozen=True, slots=True)
class LevelSpec:
    """One point of a sweep: the load (closed-loop concurrency or open-loop rate) and lengths."""

    concurrency: int | None
    rate: float | None
    """Requests per second (open loop): Poisson arrivals, or gamma-distributed gaps with the
    workload's ``burstiness``; exclusive with ``concurrency``."""
    max_tokens: int
    input_tokens: int | None = None

    @property
    def load(self) -> float:
        """The swept load value, for floors and plots: C, or requests/s."""
        return float(self.concurrency if self.concurrency is not None else self.rate or 0.0)

    @property
    def label(self) -> str:
        return f"C={self.concurrency}" if self.concurrency is not None else f"rate={self.rate:g}/s"


@dataclass(frozen=True, slots=True)
class Workload:
    """What to send at each level; also the key under which baselines are stored."""

    levels: tuple[LevelSpec, ...]
    prompts: str | tuple[str, ...] | None = None
    requests: int | None = None
    requests_per_stream: int | None = None
    """Closed loop: requests each of the C streams sends in a row per trial (default 1)."""
    duration_s: float | None = None
    trials: int | None = None
    warmup: int = DEFAULT_WARMUP
    ignore_eos: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    api: Api = "chat"
    max_error_rate: float = 0.0
    seed: int = 0
    turns: int = 1
    """Closed loop: each stream runs conversations of this many turns, every turn sending the
    history so far (:mod:`pytest_kimi.load.conversation`); 1: independent requests."""
    ramp: Ramp | None = None
    """The ``rate=ramp(...)`` the open-loop levels came from (each step is one level)."""
    protocol: str | None = None
    """The marker's ``protocol=``; None: chosen by :meth:`protocol_for`."""
    dataset: str | None = None
    """``dataset=``: a ShareGPT JSON or JSONL file (a path from the rootdir, or
    ``builtin:sharegpt-small``) replayed with each entry's own output length
    (:mod:`pytest_kimi.workload.dataset`); its trials are whole requests, one pass over the sample."""
    num_prompts: int | None = None
    """Entries sampled from the dataset (seeded by ``seed``); None until the dataset is read,
    then the sample's size (all entries, up to :data:`~pytest_kimi.workload.dataset.DEFAULT_NUM_PROMPTS`)."""
    shared_prefix_tokens: int | None = None
    """Every request opens with its group's system prompt of this many tokens, so a server's
    prefix cache is exercised on purpose (:mod:`pytest_kimi.workload.prefix`)."""
    prefix_groups: int | None = None
    """How many distinct system prompts (groups) ``shared_prefix_tokens`` deals out, round robin."""
    range_ratio: tuple[float, float] | None = None
    """``range_ratio=``: (input, output) ratios r of vLLM's ``--random-range-ratio``: each
    request's ``input_tokens`` and ``max_tokens`` are drawn uniformly from the integers
    ``[floor(L * (1 - r)), ceil(L * (1 + r))]`` around the level's L (seeded by ``seed``,
    :data:`~pytest_kimi.workload.prompts.RANGE_DRAWS` draws a level, cycled).  The input part is
    0 where the prompts are not synthetic (a prompt set keeps its own lengths).  None: every
    request has the level's lengths, as before."""
    burstiness: float = 1.0
    """Open loop: the shape of the gamma-distributed gaps between arrivals (mean ``1 / rate``,
    coefficient of variation ``1 / sqrt(burstiness)``), vLLM's ``--burstiness``: 1 is a
    Poisson process, below 1 burstier, above 1 more even."""
    max_concurrency: int | None = None
    """Open loop: at most this many requests in flight; an arrival that finds every slot taken
    waits for one (vLLM's ``--max-concurrency`` with ``--request-rate``).  None: no cap."""

    @property
    def swept(self) -> frozenset[str]:
        """Which of max_tokens / input_tokens vary between levels (they then label each level)."""
        out = set()
        if len({lv.max_tokens for lv in self.levels}) > 1:
            out.add("max_tokens")
        if len({lv.input_tokens for lv in self.levels}) > 1:
            out.add("input_tokens")
        return frozenset(out)

    def label(self, level: LevelSpec) -> str:
        parts = [level.label]
        if "max_tokens" in self.swept:
            parts.append(f"max_tokens={level.max_tokens}")
        if "input_tokens" in self.swept:
            parts.append(f"input_tokens={level.input_tokens}")
        return " ".join(parts)

    def input_lengths(self, input_tokens: int | None) -> tuple[int, ...] | None:
        """Each body's drawn prompt length for a level of ``input_tokens`` (None: no input
        range, every prompt is sized to ``input_tokens``).  The same for every run of one seed."""
        if self.range_ratio is None or not self.range_ratio[0] or input_tokens is None:
            return None
        return draw_lengths(
            input_tokens, self.range_ratio[0], RANGE_DRAWS, seed=self.seed, what="input"
        )

    def output_lengths(self, max_tokens: int) -> tuple[int, ...] | None:
        """Each body's drawn ``max_tokens`` for a level of ``max_tokens`` (None: no output
        range).  The same for every run of one seed."""
        if self.range_ratio is None or not self.range_ratio[1]:
            return None
        return draw_lengths(
            max_tokens, self.range_ratio[1], RANGE_DRAWS, seed=self.seed, what="output"
        )

    def protocol_for(self, level: LevelSpec, default: str = DEFAULT_PROTOCOL) -> str | None:
        """The trial protocol of a level: None for open loop (arrivals are its protocol); the
        marker's choice; ``whole-requests`` where the marker sizes trials in requests or
        seconds; else ``default`` (``--perf-protocol``)."""
        if level.concurrency is None:
            return None
        if self.protocol is not None:
            return self.protocol
        if (
            self.requests is not None
            or self.requests_per_stream is not None
            or self.duration_s is not None
        ):
            return WHOLE_REQUESTS
        return default

    def requests_for(self, level: LevelSpec) -> int | None:
        """Requests in one trial at this level (None: bounded by ``duration_s`` alone).

        A dataset's trial replays its sample once (``num_prompts`` requests) unless the marker
        sizes trials itself: every trial then sends the same requests, in the same order."""
        if self.requests is not None:
            return self.requests
        if self.duration_s is not None:
            return None
        if self.dataset is not None and self.num_prompts is not None:
            if self.requests_per_stream is None or level.concurrency is None:
                return self.num_prompts
        if level.concurrency is not None:
            # a conversation's turns are requests in a row: one whole conversation per stream
            per_stream = self.requests_per_stream or max(REQUESTS_PER_WORKER, self.turns)
            return per_stream * level.concurrency
        return max(MIN_OPEN_LOOP, round((level.rate or 0) * OPEN_LOOP_SECONDS))


@dataclass(frozen=True, slots=True)
class Targets:
    """What must hold at every level; ``None`` means no target of that kind."""

    min_tok_s: Mapping[float, float] = field(default_factory=dict)
    """Floor per load value (concurrency, or rate for open-loop levels)."""
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
    latency_tolerance: float | None = None
    """How much slower TTFT and ITL may be than the baseline's (None: the session's
    ``--perf-latency-tolerance``)."""

    def floor_for(self, level: LevelSpec) -> float | None:
        return self.min_tok_s.get(level.load)


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
"""Every marker argument with an upper bound (``docs/reference.md``, "Upper bounds")."""


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

    Run at collection by :func:`parse_throughput` (and so :func:`~pytest_kimi.workload.
    capacity_marker.parse_capacity`), before any prompt is built or a request sent.
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


def _ratio_shown(workload: Workload) -> str:
    """The workload's ``range_ratio`` as a marker would write it."""
    shown = ratio_key(workload.range_ratio)
    return repr(shown)


def ratio_key(ratios: tuple[float, float] | None) -> float | dict[str, float] | None:
    """``range_ratio`` as the baseline key and the JSON hold it: one number where input and
    output share it, else vLLM's dict; None without a range."""
    if ratios is None:
        return None
    if ratios[0] == ratios[1]:
        return ratios[0]
    return {"input": ratios[0], "output": ratios[1]}


def ratio_fields(ratios: tuple[float, float]) -> dict[str, float]:
    """``range_ratio`` as baseline key fields, which are scalars: ``range_ratio`` where input
    and output share it, else ``range_ratio_input`` and ``range_ratio_output``."""
    if ratios[0] == ratios[1]:
        return {"range_ratio": ratios[0]}
    return {"range_ratio_input": ratios[0], "range_ratio_output": ratios[1]}


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

    ``allow_large`` (``--perf-allow-large``) lifts the upper bounds (:data:`BOUNDED_ARGS`);
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
    and ``turns`` are both part of the baseline key (``docs/workloads.md``).
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
    each request's lengths (``docs/workloads.md``).

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
