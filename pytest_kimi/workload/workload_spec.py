"""What a parsed marker is: :class:`Workload` (what to send), :class:`LevelSpec` (one point of
a sweep) and :class:`Targets` (what must hold), with the trial protocols and defaults they use.

It stands apart from the parsing (:mod:`pytest_kimi.workload.markers`) because every stage
below the plugin reads these types (the measurement, the gate, the report, the baseline key)
and none of them needs the argument checks.  :class:`MarkerError` lives here, at the bottom,
so the bounds and the checks can raise it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from pytest_kimi.load.records import Api
from pytest_kimi.workload.prompts import RANGE_DRAWS, draw_lengths
from pytest_kimi.workload.ramp import Ramp


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


def ratio_key(ratios: tuple[float, float] | None) -> float | dict[str, float] | None:
    """``range_ratio`` as the baseline key and the JSON hold it: one number where input and
    output share it, else vLLM's dict; None without a range."""
    if ratios is None:
        return None
    if ratios[0] == ratios[1]:
        return ratios[0]
    return {"input": ratios[0], "output": ratios[1]}
