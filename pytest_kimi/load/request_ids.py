"""The unique id each request's prompt carries, and how a trial's requests are numbered.

On its own because the workload's prompt sizing (the slot's width, its token count) and the
load's senders (closed loop, open loop, worker shards) must agree on one numbering scheme.
"""

from __future__ import annotations

from typing import Sequence

UNIQUE_ID_WIDTH = 15
"""Bytes of a request's unique id: 15 decimal digits (``10**15 > 2**48`` request numbers).

Why decimal, not hex: the id is part of the prompt, so its token count is part of
``input_tokens``.  Every major tokenizer splits a run of digits the same way whatever the
digits are (Llama 2, Qwen, Gemma: one token per digit; Llama 3, DeepSeek V3, Kimi K2's tiktoken:
groups of three), so every request's prompt has the count the sizing measured on a sample id.
Hex mixes letters and digits, whose splits depend on the digits: on SGLang 0.5.23 with a
byte-level BPE, 64-token prompts came out at 57-64 tokens."""
_ID_MODULUS = 10**UNIQUE_ID_WIDTH
_ID_MULT = 0x9E3779B97F4B
"""Coprime to 10 (odd, not a multiple of 5), so ``n * _ID_MULT mod 10**15`` is a bijection:
distinct numbers, distinct ids."""
TRIAL_ID_BITS = 28
"""A trial's request numbers are ``base + g`` with ``base = serial << TRIAL_ID_BITS``: room for
2**27 requests and as many warm-up requests per trial, and 2**20 trials per measurement."""
WARMUP_IDS = 1 << (TRIAL_ID_BITS - 1)
"""Numbers of a plan's own warm-up requests start here, above any of its trial's requests."""


def unique_id(n: int) -> bytes:
    """The 15 decimal digits that make request number ``n`` unique (``n < 2**48``).

    Scrambled (a multiplication modulo 2**48), not counted: consecutive requests then differ
    from the first digit on, so a prefix cache that shares even a token or two of a prompt's
    start finds nothing to share.
    """
    return b"%015d" % (n * _ID_MULT % _ID_MODULUS)


def split_at_slot(bodies: Sequence[bytes], slot: bytes) -> list[tuple[bytes, bytes]]:
    """Each body as (before, after) its one ``slot``; done once per trial, before the clock.

    A request's body is then ``before + unique_id(n) + after``: one join of bytes per request,
    nothing per chunk.
    """
    if len(slot) != UNIQUE_ID_WIDTH:
        raise ValueError(f"unique_slot must be {UNIQUE_ID_WIDTH} bytes, got {len(slot)}")
    out = []
    for k, body in enumerate(bodies):
        if body.count(slot) != 1:
            raise ValueError(
                f"body {k} holds the unique_slot {slot!r} {body.count(slot)} times, "
                "not once: encode the bodies with the slot in the prompt"
            )
        head, _, tail = body.partition(slot)
        out.append((head, tail))
    return out
