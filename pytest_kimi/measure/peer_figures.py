"""The figures peers report, from a level's request records: TTFT, ITL, TPOT and end-to-end
latency at mean, std, p50, p90, p95 and p99, request throughput, and input and total token
throughput.

Why: ``vllm bench serve``, GuideLLM and SGLang's ``bench_serving`` print these for every run,
and a user comparing our report with theirs must find each figure, defined so the two can be
compared.  They are computed after the level ends, from the same records and in the same
clock as the level's other figures (:func:`~pytest_kimi.measure.metrics.level_figures`):
latencies multiplied by ``clock`` (server seconds per wall second), rates divided by it.

Which requests count (docs/reference/json-report.md, "Peer figures"), under every protocol:

* failed requests count in none of them (``requests_failed`` counts them, as peers' "failed");
* **TTFT**: every successful request with a first token, including the streams a stationary
  trial's time box cut (their first token came before the cut) and the stationary trial's
  staggered first requests -- as the level's ``ttft_s_p50`` always has;
* **ITL**: one gap per token after a stream's first read
  (:func:`~pytest_kimi.measure.stream_timing.inter_token_latencies`: a read's gap is shared by the
  tokens it carries), over every successful request including cut streams (their gaps before
  the cut are real) -- the level's ``itl_s_p50`` pooled the same way;
* **TPOT**: vLLM's definition, per request ``(e2e - ttft) / (completion_tokens - 1)``, over the
  successful requests that *finished* (not cut: a cut stream has no end) with at least two
  tokens (one token has no time per output token; vLLM leaves them out too), the staggered
  first requests included (a time per token does not depend on the length asked for);
* **E2E**: send to the end of the stream, over the successful requests that finished with the
  level's own ``max_tokens`` -- no cut stream, no staggered first request (shorter on purpose),
  as ``e2e_s_pct`` and goodput have always been;
* **rates**, over the valid trials' steady-state windows (the spans ``tok_s`` is taken over):
  ``requests_per_s`` is ``tok_s`` times the request-equivalents per output token in those
  windows, each request counting by the share of its own tokens that arrived inside one (a
  request wholly inside counts 1, one that straddles an edge the fraction inside); so it is
  the rate at which the server completes the workload's requests in steady state (Little's
  law: ``requests_per_s x`` mean E2E is C in a closed loop), and with requests of one length
  L, ``requests_per_s = tok_s / L``.
  ``input_tok_s`` is the same with each request-equivalent weighted by its prompt tokens, and
  ``total_tok_s = input_tok_s + tok_s``.

Why the window and not the wall: peers divide by the benchmark's duration, ramp-up and drain
included, whose share shrinks only as the run grows; ``tok_s`` is taken over the steady-state
window so that it does not depend on a trial's length, and request and input rates over the
same span keep ``total_tok_s = input_tok_s + tok_s`` and ``requests_per_s ~ tok_s / mean
output tokens`` exact.  Counting requests *finished* in the window instead would be wrong in
a closed loop: C streams started together finish together, so a window holding n rounds has
n - 1 rounds of ends in it (-25% at four requests per stream).  Over a long run both agree
with the peers' ``completed / duration``.

A stationary trial's cut streams and its staggered first requests are parts of the
workload's requests (the rest of each lies after the cut or "before" the trial, which the
stagger stands in for), so each counts by its tokens against a whole request's length: the
level's ``max_tokens`` under ``ignore_eos``, else the median of its trial's whole requests (at
least the tokens it had).  Counted as whole requests, the short openers would put the figure
up to ``C`` requests per trial above the server's rate for the workload
(docs/evidence/accuracy.md, "Peer figures: counting a stationary trial's requests"), which a
peer running the same workload does not see.  A request whose usage gave no
prompt tokens (a cut stream's running usage need not carry them) counts with the median of
its trial's requests that had them.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Sequence, cast

import numpy as np

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.metrics import TrialResult
from pytest_kimi.measure.steady_state import tokens_between
from pytest_kimi.measure.stream_timing import inter_token_latencies
from pytest_kimi.wire import PeerEntry

STATS = ("mean", "std", "min", "p50", "p90", "p95", "p99", "max")
"""The statistics of each latency: ``vllm bench serve`` prints mean, median, std and its
``--metric-percentiles`` (p99 by default; p90/p95 asked for), GuideLLM mean, median, min,
max and percentiles; p50 is the median."""
LATENCIES = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
"""The latencies, in the JSON key's prefix: ``ttft_s_p99``, ``tpot_s_mean``..."""
RATES = ("requests_per_s", "input_tok_s", "total_tok_s")
"""The rates beside ``tok_s`` (which is the output token throughput)."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """One latency's statistics in seconds (None without a value) and how many values."""

    count: int
    mean: float | None = None
    std: float | None = None
    """Population standard deviation (numpy's default, as vLLM's ``np.std``)."""
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    """Percentiles by linear interpolation between the order statistics (numpy's default, as
    vLLM's ``np.percentile``)."""
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        arr = np.asarray(values, dtype=np.float64)
        if not arr.size:
            return cls(count=0)
        p50, p90, p95, p99 = (float(x) for x in np.percentile(arr, [50, 90, 95, 99]))
        lo, hi = float(arr.min()), float(arr.max())
        return cls(int(arr.size), float(arr.mean()), float(arr.std()), lo, p50, p90, p95, p99, hi)

    def stat(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class PeerFigures:
    """A level's peer figures in the server's clock (module docstring: what counts where)."""

    ttft_s: Distribution
    itl_s: Distribution
    """Per token gap: ``count`` is gaps, not requests."""
    tpot_s: Distribution
    e2e_s: Distribution
    requests_per_s: float | None
    input_tok_s: float | None
    total_tok_s: float | None
    window_tokens: float
    """Output tokens in the valid trials' windows (interpolated between reads), all trials
    together: what the request-equivalents are counted against."""
    window_requests: float
    """Request-equivalents in those windows: ``requests_per_s = tok_s * window_requests /
    window_tokens``."""

    def latency(self, name: str) -> Distribution:
        dist: Distribution = getattr(self, name)
        return dist

    def to_dict(self) -> PeerEntry:
        """The JSON keys (docs/reference/json-report.md), latencies rounded as the level's others."""
        out: dict[str, float | None] = {}
        for name in LATENCIES:
            digits = 6 if name in ("itl_s", "tpot_s") else 5
            dist = self.latency(name)
            for stat in STATS:
                out[f"{name}_{stat}"] = _round(dist.stat(stat), digits)
        out["requests_per_s"] = _round(self.requests_per_s, 4)
        out["input_tok_s"] = _round(self.input_tok_s, 2)
        out["total_tok_s"] = _round(self.total_tok_s, 2)
        entry = _peer_entry(out)
        entry["peer_counts"] = {
            "ttft": self.ttft_s.count,
            "itl": self.itl_s.count,
            "tpot": self.tpot_s.count,
            "e2e": self.e2e_s.count,
            "window_tokens": round(self.window_tokens, 1),
            "window_requests": round(self.window_requests, 3),
        }
        return entry


def empty_peer_dict() -> PeerEntry:
    """The keys of a level measured without records (not run): every figure null."""
    out: dict[str, float | None] = {f"{n}_{s}": None for n in LATENCIES for s in STATS}
    out.update(dict.fromkeys(RATES))
    return _peer_entry(out)


def _peer_entry(figures: dict[str, float | None]) -> PeerEntry:
    """``figures`` (every ``LATENCIES`` x ``STATS`` key and the ``RATES``) as the typed entry,
    ``peer_counts`` null until set.  The keys are made from those tuples, so mypy cannot see
    them: ``tests/unit/core/test_json_schema.py`` holds them against :class:`PeerEntry`'s."""
    return cast(PeerEntry, {**figures, "peer_counts": None})


def tpot(rec: RequestRecord) -> float | None:
    """vLLM's time per output token of one request, ``(e2e - ttft) / (tokens - 1)``; None for
    a request that did not finish (cut, failed) or has fewer than two tokens."""
    if not rec.ok or rec.cut or rec.first_token is None or rec.completion_tokens < 2:
        return None
    return (rec.end - rec.first_token) / (rec.completion_tokens - 1)


def peer_figures(
    trials: Sequence[TrialResult],
    tok_s: float | None,
    clock: float = 1.0,
    *,
    max_tokens: int,
    ignore_eos: bool = True,
) -> PeerFigures:
    """The peer figures of a level's trials.

    ``tok_s``: the level's output tok/s, already in the server's clock (the median of its
    valid trials, :class:`~pytest_kimi.measure.metrics.LevelFigures`); the rates scale it, so
    they are in that clock too.  ``clock``: server seconds per wall second, for the latencies.
    ``max_tokens`` and ``ignore_eos``: how long a cut stream would have run.
    """
    ok = [r for t in trials for r in t.records if r.ok]
    ttfts = [x * clock for x in (r.ttft for r in ok) if x is not None]
    itls = inter_token_latencies(ok) * clock
    tpots = [x * clock for x in (tpot(r) for r in ok) if x is not None]
    e2es = [r.e2e * clock for r in ok if not r.cut and not r.max_tokens]
    tokens = requests = prompt = 0.0
    for trial in trials:
        if not trial.valid or trial.window is None:
            continue
        t, n, p = _window_shares(trial, max_tokens, ignore_eos)
        tokens, requests, prompt = tokens + t, requests + n, prompt + p
    rps = input_rate = total = None
    if tok_s is not None and tokens > 0:
        rps = tok_s * requests / tokens
        input_rate = tok_s * prompt / tokens
        total = input_rate + tok_s
    return PeerFigures(
        ttft_s=Distribution.of(ttfts),
        itl_s=Distribution.of(itls),
        tpot_s=Distribution.of(tpots),
        e2e_s=Distribution.of(e2es),
        requests_per_s=rps,
        input_tok_s=input_rate,
        total_tok_s=total,
        window_tokens=tokens,
        window_requests=requests,
    )


def _window_shares(
    trial: TrialResult, max_tokens: int, ignore_eos: bool
) -> tuple[float, float, float]:
    """(output tokens, request-equivalents, prompt tokens of those) in the trial's window."""
    assert trial.window is not None
    start, end = trial.window
    ok = [r for r in trial.records if r.ok]
    whole = [r.completion_tokens for r in ok if not r.cut and not r.max_tokens]
    typical = median(whole) if whole else float(max_tokens)
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens > 0]
    typical_prompt = median(prompts) if prompts else 0.0
    tokens = requests = prompt = 0.0
    for rec in ok:
        inside = tokens_between([rec], start, end)
        if inside <= 0.0:
            continue
        if not rec.cut and not rec.max_tokens:
            length = float(rec.completion_tokens)
        else:  # a part of one of the workload's requests: the rest lies outside the trial
            length = float(max_tokens) if ignore_eos else typical
        length = max(length, float(rec.completion_tokens), inside)
        share = inside / length
        tokens += inside
        requests += share
        prompt += share * (rec.prompt_tokens or typical_prompt)
    return tokens, requests, prompt


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)
