"""Shared prefixes: requests that open with one of a few system prompts, on purpose.

Every prompt the plugin sends is otherwise unique from its first token (``prompts.py``'s
lead), so a server's prefix cache has nothing to serve.  Production traffic is not like that:
an application sends the same system prompt (instructions, tools, a document) before every
user question, and SGLang's radix cache and vLLM's automatic prefix caching turn the repeated
part into a cache hit, with less prefill work and a shorter time to first token.
``shared_prefix_tokens=N, prefix_groups=G`` measures that: G system prompts of N tokens each,
dealt round robin over the requests (request ``k`` has group ``k % G``), before the usual user
content (its unique lead, then the prompt).  In the chat API the prefix is a system message;
in the completions API it starts the prompt, followed by a blank line.

The prefixes are sized like ``input_tokens`` prompts: with the server's tokenizer where it has
one (the system message rendered through the chat template, as the server would see it), once
per run, length and group count; elsewhere at about 1.3 tokens per word, which the reports
say.  They are the same in every run (the groups differ from their first characters on, so
they share nothing with each other): a server that keeps its cache across runs sees the warm
cache a server in service has, and the warm-up sends one request per group before the first
level, so the first trial of a run is measured warm too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_kimi.load.records import Api
from pytest_kimi.wire import SharedPrefixSection
from pytest_kimi.workload.prompts import (
    SIZE_TOLERANCE,
    TOKENS_PER_WORD,
    Tokenizer,
    fit_words,
)

PREFIX_WORDS = (
    "You are a careful assistant for an inference team. Follow the style guide, cite the "
    "runbook section, keep answers short, prefer numbers to adjectives, and say when a figure "
    "was measured or estimated. Context: cluster scheduler quota batch decode prefill expert "
    "router kernel memory bandwidth latency throughput replica shard rollout canary baseline"
).split()

GROUP_CHECK_LIMIT = 64
"""Groups whose size is checked one by one (one tokenizer call each); beyond it the others reuse
the first group's word count (their texts differ only in the group's id)."""


def group_id(group: int) -> str:
    """8 hex digits that differ between groups from the first character on (a scrambled
    number, like the unique request ids), so no two groups share even a cache page."""
    return f"{(group * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF:08x}"


def prefix_text(n_words: int, group: int) -> str:
    """The system prompt of ``group``: its id, then ``n_words - 1`` words of instructions."""
    words = [f"{group_id(group)}:"]
    for i in range(max(0, n_words - 1)):
        words.append(PREFIX_WORDS[i % len(PREFIX_WORDS)])
    return " ".join(words)


class SystemTokenizer(Tokenizer):
    """Counts a text as a system prompt: a system message through the chat template (chat
    API), or the start of a prompt (completions API, special tokens included): the tokens a
    request's shared part occupies in the server's cache."""

    def _body(self, text: str) -> dict[str, Any]:
        if self.api == "chat":
            return {"model": self.model, "messages": [{"role": "system", "content": text}]}
        return {"model": self.model, "prompt": text}


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """The groups' system prompts and how they were sized."""

    texts: tuple[str, ...]
    tokens: int
    """The asked length (``shared_prefix_tokens``)."""
    sizing: str
    estimated: bool = False

    @property
    def groups(self) -> int:
        return len(self.texts)

    @property
    def note(self) -> str | None:
        """What the reports say when the prefix's length is an estimate."""
        if not self.estimated:
            return None
        return f"shared_prefix_tokens={self.tokens} is an {self.sizing}"

    def summary(self) -> SharedPrefixSection:
        """The level's ``shared_prefix`` entry in the JSON report."""
        return {
            "tokens": self.tokens,
            "groups": self.groups,
            "sizing": self.sizing,
            "estimated": self.estimated,
        }


def shared_prefixes(
    tokens: int,
    groups: int,
    *,
    tokenizer: Tokenizer | None,
    memo: dict[tuple[Any, ...], Any] | None = None,
    endpoint_key: tuple[str, str] = ("", ""),
    api: Api = "chat",
) -> SharedPrefixes:
    """G system prompts of about ``tokens`` tokens each, sized once per run and endpoint."""
    memo = {} if memo is None else memo
    key = ("shared-prefix", *endpoint_key, api, tokens, groups)
    if key not in memo:
        memo[key] = _size(tokens, groups, tokenizer)
    words, how, estimated = memo[key]
    return SharedPrefixes(
        tuple(prefix_text(n, g) for g, n in enumerate(words)), tokens, how, estimated
    )


def _size(tokens: int, groups: int, tok: Tokenizer | None) -> tuple[tuple[int, ...], str, bool]:
    start = max(1, round(tokens / TOKENS_PER_WORD))
    if tok is None or not tok.available():
        why = "no tokenizer asked" if tok is None else tok.unavailable
        return (start,) * groups, f"estimate at {TOKENS_PER_WORD} tokens per word: {why}", True
    assert tok is not None
    words: list[int] = []
    counts: list[int] = []
    for g in range(groups):
        if g >= GROUP_CHECK_LIMIT:
            words.append(words[0])
            continue

        def count(k: int, g: int = g) -> int:
            assert tok is not None
            return tok.count(prefix_text(k, g))

        if g > 0:
            c = count(start)
            if abs(c - tokens) <= SIZE_TOLERANCE:
                words.append(start)
                counts.append(c)
                continue
        n, c = fit_words(tokens, count, start)
        words.append(n)
        counts.append(c)
        start = n
    off = max(abs(c - tokens) for c in counts)
    how = f"server tokenizer ({tok.path}): {min(counts)}-{max(counts)} tokens per group" + (
        "" if off <= SIZE_TOLERANCE else f", {off} from the asked {tokens} at worst"
    )
    if groups > GROUP_CHECK_LIMIT:
        how += f" (groups past {GROUP_CHECK_LIMIT} reuse the first group's length)"
    return tuple(words), how, False
