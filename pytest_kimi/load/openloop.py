"""Open-loop load: what a trial sends when requests *arrive* at a rate instead of waiting.

A closed loop (``TrialPlan``) never has more than C requests in flight, so a slow server slows
the client down with it and queueing delay stays hidden.  Real users do not wait for each
other: requests arrive whenever they arrive.  An open-loop plan models that with a Poisson
process, sends every request at its planned instant whatever is still in flight, and so
shows what a server does when it falls behind (growing TTFT, a growing queue).

Two knobs of vLLM's ``vllm bench serve`` (0.32, ``vllm/benchmarks/serve.py``) shape it:

* ``burstiness``: the gaps between arrivals are gamma-distributed with shape ``burstiness``
  and mean ``1 / rate`` (vLLM's ``get_request``: ``np.random.gamma(shape=burstiness,
  scale=1 / (rate * burstiness))``), so their coefficient of variation is
  ``1 / sqrt(burstiness)``: 1 is the Poisson process (the default, exponential gaps, drawn
  exactly as before), below 1 burstier, above 1 more even.  vLLM rescales the cumulative
  delays so the schedule spans exactly ``n / rate``, as ``exact_rate`` does here (the one
  difference: vLLM's first request waits one gap, here it leaves at 0).
* ``max_concurrency``: at most that many requests in flight; an arrival that finds every
  slot taken waits for one (vLLM's semaphore around each request), and is sent when one
  frees.  Its record's ``scheduled`` is then the instant the slot freed (when the client
  could send it), so the send delay still measures the client alone; how long it queued is
  ``scheduled`` minus its planned arrival (:func:`queue_waits`, vLLM's
  ``client_queue_time``), and the achieved rate shows the rate the cap let through.

This module holds only the plan and the arrival schedule (pure, no I/O); sending is done by
:meth:`pytest_kimi.load.runner.LoadClient.run_open_loop` and, sharded over processes, by
:class:`pytest_kimi.load.workers.ShardedClient`.  The schedule is computed completely before
the clock starts so that the send path does nothing per arrival but wait and launch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

from pytest_kimi.load.records import RequestRecord

MAX_ARRIVALS = 20_000_000
"""Refuse schedules longer than this: ``rate`` x ``duration_s`` typos (req/s vs req/min)
would otherwise allocate gigabytes before a single request goes out."""


def check_wall_limit(limit_s: float | None) -> None:
    """A plan's ``wall_limit_s`` (open or closed loop) is None or positive, finite seconds."""
    if limit_s is not None and not (limit_s > 0 and math.isfinite(limit_s)):
        raise ValueError(f"wall_limit_s must be a positive number of seconds, got {limit_s!r}")


@dataclass(slots=True)
class OpenLoopPlan:
    """What one open-loop trial sends.  At least one of ``requests`` / ``duration_s``."""

    rate: float
    """Mean arrival rate, requests per second."""
    bodies: Sequence[bytes]
    """Pre-encoded request bodies; arrival ``i`` uses ``bodies[i % len(bodies)]``."""
    requests: int | None = None
    """Number of arrivals of the trial."""
    unique_slot: bytes | None = None
    """As :attr:`~pytest_kimi.load.trial.TrialPlan.unique_slot`: arrival ``i`` sends its body
    with the slot replaced by ``unique_id(unique_base + i)`` (``i``: the global arrival index,
    so a sharded schedule stays unique too)."""
    unique_base: int = 0
    duration_s: float | None = None
    """No arrival is scheduled at or after this many seconds; in-flight ones finish."""
    timeout_s: float = 600.0
    """Longest silence allowed per request (connect, headers, between reads)."""
    max_failures: int | None = None
    """Stop sending once this many requests failed: a dead server must not be spun on."""
    seed: int = 0
    """Seed of the arrival schedule: the same plan always offers the same arrivals."""
    burstiness: float = 1.0
    """Shape of the gamma-distributed gaps (mean ``1 / rate``, cv ``1 / sqrt(burstiness)``);
    1: a Poisson process.  vLLM's ``--burstiness``."""
    max_concurrency: int | None = None
    """At most this many requests in flight: an arrival that finds them all taken waits for a
    slot.  None: no cap (the open loop proper).  vLLM's ``--max-concurrency``."""
    exact_rate: bool = True
    """Rescale the drawn gaps so that the schedule's mean rate is exactly ``rate``.

    Why: 200 exponential gaps have a sample mean that is off by ~7% (one sigma), so two
    trials "at 50 req/s" would offer visibly different loads and that noise would land in
    the measured throughput.  Normalising the gaps by their sum gives a Poisson process
    *conditioned on its count* (arrivals are uniform order statistics over the span): the
    gaps are still exponential-shaped with cv ~1, only the total is pinned.  False draws
    plain i.i.d. exponential gaps."""

    wall_limit_s: float | None = None
    """As :attr:`~pytest_kimi.load.trial.TrialPlan.wall_limit_s`: past this many wall seconds
    after the start no arrival is sent any more and the requests in flight are cut, kept as
    ``cut`` records.  None: no limit."""

    def __post_init__(self) -> None:
        check_wall_limit(self.wall_limit_s)
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of requests/s, got {self.rate!r}")
        if not self.bodies:
            raise ValueError("bodies must not be empty")
        if self.requests is None and self.duration_s is None:
            raise ValueError("an OpenLoopPlan needs requests or duration_s (or both)")
        if self.requests is not None and self.requests < 0:
            raise ValueError("requests must be >= 0")
        if self.duration_s is not None and not self.duration_s >= 0:
            raise ValueError("duration_s must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        check_burstiness(self.burstiness)
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {self.max_concurrency!r}")

    def arrivals(self) -> list[float]:
        """Planned arrival instants, seconds after the trial start (first one at 0)."""
        return gamma_arrivals(
            self.rate,
            burstiness=self.burstiness,
            requests=self.requests,
            duration_s=self.duration_s,
            seed=self.seed,
            exact_rate=self.exact_rate,
        )


def check_burstiness(burstiness: float) -> None:
    """A gamma shape: a finite number > 0."""
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")


def poisson_arrivals(
    rate: float,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    exact_rate: bool = True,
) -> list[float]:
    """Arrival offsets of a Poisson process at ``rate``/s: :func:`gamma_arrivals` of shape 1."""
    return gamma_arrivals(
        rate, requests=requests, duration_s=duration_s, seed=seed, exact_rate=exact_rate
    )


def gamma_arrivals(
    rate: float,
    *,
    burstiness: float = 1.0,
    requests: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    exact_rate: bool = True,
) -> list[float]:
    """Arrival offsets at ``rate``/s with gamma-distributed gaps of shape ``burstiness``
    (mean ``1 / rate``, cv ``1 / sqrt(burstiness)``), sorted, starting at 0.

    The first arrival is at 0 so that a trial starts doing something at once (no idle
    lead-in to subtract from the wall time).  Count: ``requests`` when given, else every
    arrival before ``duration_s`` (with ``exact_rate``: ``ceil(rate * duration_s)`` of them,
    the last one ``(n - 1) / rate`` after the first).  Both given: the first ``requests``
    arrivals that fall before ``duration_s``.  Shape 1 draws exponential gaps exactly as the
    Poisson schedule always has (same seed, same instants); another shape draws
    ``random.gammavariate(burstiness, 1 / burstiness)`` (mean 1) and scales it.
    """
    if requests is None and duration_s is None:
        raise ValueError("poisson_arrivals needs requests or duration_s")
    check_burstiness(burstiness)
    if requests is not None:
        n = requests
    else:
        assert duration_s is not None
        # Without exact_rate the count is random; this is an upper bound for allocation checks.
        n = math.ceil(rate * duration_s) if exact_rate else None  # type: ignore[assignment]
    if n is not None and n > MAX_ARRIVALS:
        raise ValueError(
            f"{n} arrivals planned (more than {MAX_ARRIVALS}): check rate and duration_s"
        )
    rng = random.Random(seed)
    if burstiness == 1.0:
        draw = rng.expovariate  # the Poisson schedule as it always was, draw for draw
    else:
        gamma, shape, mean_one = rng.gammavariate, burstiness, 1.0 / burstiness

        def draw(lambd: float) -> float:
            return gamma(shape, mean_one) / lambd

    offsets: list[float] = []
    if n is not None:
        if n <= 0:
            return []
        gaps = [draw(1.0) for _ in range(n - 1)]
        total = sum(gaps)
        # exact: n - 1 gaps spanning exactly (n - 1) / rate; plain: gaps of mean 1 / rate
        scale = ((n - 1) / rate / total) if (exact_rate and total > 0) else 1.0 / rate
        t = 0.0
        offsets.append(0.0)
        for g in gaps:
            t += g * scale
            offsets.append(t)
        if duration_s is not None:
            offsets = [x for x in offsets if x < duration_s]
        return offsets
    # plain gaps until the duration runs out (count is random)
    assert duration_s is not None
    t = 0.0
    while t < duration_s:
        offsets.append(t)
        if len(offsets) > MAX_ARRIVALS:
            raise ValueError(
                f"more than {MAX_ARRIVALS} arrivals planned: check rate and duration_s"
            )
        t += draw(rate)
    return offsets


def queue_waits(
    records: Sequence[RequestRecord], offsets: Sequence[float], started: float
) -> list[float]:
    """How long each sent arrival waited for a slot under ``max_concurrency`` (seconds, wall
    clock; 0 for one sent on time): its record's ``scheduled`` (the slot freed) minus its
    planned arrival ``started + offsets[index]``.  vLLM reports the same as
    ``client_queue_time``.  Works on a sharded trial's merged records too: their indices are
    the global arrival indices and ``started`` the agreed start."""
    out = []
    for r in records:
        if r.sent and 0 <= r.index < len(offsets):
            out.append(max(0.0, r.scheduled - (started + offsets[r.index])))
    return out


def deal(offsets: Sequence[float], parts: int) -> list[tuple[list[int], list[float]]]:
    """Split one schedule into ``parts`` sub-schedules, round-robin by arrival order.

    Returns, per part, the global arrival indices and their offsets.  Why deal one schedule
    rather than draw ``parts`` independent ones at ``rate / parts``: the union is then the
    *same* arrival process a single client would send for this plan and seed (same instants,
    same global indices, same bodies), so results do not depend on how many processes sent
    them; each part still offers ``rate / parts``.
    """
    if parts < 1:
        raise ValueError("parts must be >= 1")
    out: list[tuple[list[int], list[float]]] = [([], []) for _ in range(parts)]
    for i, off in enumerate(offsets):
        idx, offs = out[i % parts]
        idx.append(i)
        offs.append(off)
    return out
