"""How fast the server answered a trial (:class:`Pace`): the spec carries the latest between
trials, and the trial limits price the next trial with it.

On its own because both :mod:`.measure_spec` (which holds it) and :mod:`.trial_limits`
(which reads it) need it, and neither may import the other's dependents.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Sequence

import numpy as np

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.workload.workload_spec import LevelSpec


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast this server answered one trial (wall seconds), for the next trials' limits."""

    token_s: float
    """Seconds per output token of one stream (the median request's decode rate)."""
    ttft_s: float
    """The slowest first token."""
    streams: int
    """Requests in flight when these were seen: the batch the times are for."""
    prompt_tokens: float = 0.0
    """Mean prompt tokens of those requests (0: unknown)."""
    tokens_per_read: float = 1.0
    """Median tokens a read of a stream brought after its first (1 unless the server packs its
    tokens: SGLang's ``--stream-interval``), for the next stationary trial's time box."""

    @classmethod
    def of(cls, tr: TrialRecords) -> Pace | None:
        ok = [r for r in tr.records if r.ok and not r.cut]
        rates = [rate for r in ok if (rate := r.decode_tok_s)]
        if not rates:
            # streams whose tokens came in one read (a buffering proxy) have no decode rate;
            # their whole time a token prices a request no faster than it went, so the next
            # trial's limit follows it instead of the request timeout (600 s by default)
            rates = [r.completion_tokens / (r.end - r.sent) for r in ok if r.end > r.sent]
            rates = [x for x in rates if x > 0]
        if not rates:
            return None
        prompts = [r.prompt_tokens for r in ok if r.prompt_tokens > 0]
        return cls(
            token_s=1.0 / median(rates),
            ttft_s=max((t for r in ok if (t := r.ttft) is not None), default=0.0),
            streams=max(1, tr.concurrency),
            prompt_tokens=sum(prompts) / len(prompts) if prompts else 0.0,
            tokens_per_read=_tokens_per_read(ok),
        )

    def request_s(self, level: LevelSpec, streams: float) -> float:
        """A request of ``level`` with ``streams`` in flight: the times seen, scaled linearly
        with the streams (and the first token with the prompt's length too)."""
        scale = max(1.0, streams / self.streams)
        prompt = 1.0
        if level.input_tokens and self.prompt_tokens:
            prompt = max(1.0, level.input_tokens / self.prompt_tokens)
        return scale * (level.max_tokens * self.token_s + self.ttft_s * prompt)


def _tokens_per_read(records: Sequence[RequestRecord]) -> float:
    """Median tokens per read after each stream's first (which SGLang sends alone)."""
    reads = [rec.read_tokens()[1:] for rec in records if len(rec.chunk_times) > 1]
    return float(median(np.concatenate(reads))) if reads else 1.0
