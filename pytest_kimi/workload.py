"""What to send: prompt sets and the request bodies built from them.

Bodies are JSON-encoded once per level, before any clock starts, so the load engine only
writes bytes.  Prompts come from a built-in set, an explicit list, a JSONL file, or are made
synthetically to a target length; synthetic prompts differ from their first word on, so a
server's prefix cache cannot serve one request from another's prefill.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

Api = Literal["chat", "completions"]

API_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

BUILTIN_PROMPTS: dict[str, tuple[str, ...]] = {
    # The five prompts of the seeds' hand-made EP8/TP8 benchmarks: code, science, trivia,
    # poetry, parsing.  Under ignore_eos every one yields exactly max_tokens tokens.
    "diverse": (
        "Write a Python function that implements quicksort and explain its complexity.",
        "Explain the theory of relativity to a curious high-school student.",
        "What is 2+2?",
        "Write a haiku about a GPU cluster at night.",
        "Write a Python JSON parser that handles nested objects, arrays, strings and numbers.",
    ),
    "short": ("Say OK.",),
}

WORDS = (
    "throughput latency expert router batch token decode prefill cache kernel tensor "
    "pipeline shard memory bandwidth stream request server cluster model weight"
).split()

SYNTHETIC_VARIANTS = 16
"""Distinct synthetic prompts per level: enough that concurrent requests do not share prefixes."""


class WorkloadError(ValueError):
    """A prompt source that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class PromptSource:
    """Where prompts come from; ``key`` is how baselines and reports name it."""

    prompts: tuple[str, ...]
    key: str


def builtin_names() -> list[str]:
    return sorted(BUILTIN_PROMPTS)


def synthetic_prompt(tokens: int, variant: int) -> str:
    """About ``tokens`` tokens of text (a word is ~1.3 tokens in BPE vocabularies)."""
    n_words = max(1, round(tokens / 1.3))
    words = [f"Request {variant}:"]
    for i in range(n_words - 1):
        words.append(WORDS[(i * 7 + variant * 3) % len(WORDS)])
    return " ".join(words)


def load_jsonl(path: Path) -> tuple[str, ...]:
    """Prompts from a JSONL file: each line a string or an object with ``prompt`` or ``text``."""
    if not path.is_file():
        raise WorkloadError(f"prompts file {path} does not exist")
    prompts: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if isinstance(obj, dict):
            obj = obj.get("prompt", obj.get("text"))
        if not isinstance(obj, str) or not obj:
            raise WorkloadError(
                f"{path}:{lineno}: expected a string or an object with a 'prompt' string"
            )
        prompts.append(obj)
    if not prompts:
        raise WorkloadError(f"prompts file {path} holds no prompts")
    return tuple(prompts)


def resolve_prompts(
    prompts: str | Sequence[str] | None, input_tokens: int | None, rootdir: Path
) -> PromptSource:
    """Turn the marker's ``prompts``/``input_tokens`` into concrete prompt texts."""
    if input_tokens is not None:
        texts = tuple(synthetic_prompt(input_tokens, v) for v in range(SYNTHETIC_VARIANTS))
        return PromptSource(texts, f"synthetic:{input_tokens}")
    if prompts is None:
        prompts = "diverse"
    if isinstance(prompts, str):
        if prompts in BUILTIN_PROMPTS:
            return PromptSource(BUILTIN_PROMPTS[prompts], f"builtin:{prompts}")
        path = Path(prompts)
        if not path.is_absolute():
            path = rootdir / path
        return PromptSource(load_jsonl(path), f"jsonl:{prompts}")
    texts = tuple(prompts)
    return PromptSource(texts, f"list:{len(texts)}")


def request_body(
    prompt: str, *, model: str, api: Api, max_tokens: int, ignore_eos: bool
) -> dict[str, Any]:
    """One OpenAI-compatible streaming request.

    ``ignore_eos`` is SGLang's (and vLLM's) top-level sampling extension: with it every request
    yields exactly ``max_tokens`` tokens, so levels and runs compare like with like.
    """
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def encode_bodies(
    source: PromptSource, *, model: str, api: Api, max_tokens: int, ignore_eos: bool
) -> list[bytes]:
    """Pre-encode one body per prompt; the runner cycles through them."""
    return [
        json.dumps(
            request_body(p, model=model, api=api, max_tokens=max_tokens, ignore_eos=ignore_eos),
            separators=(",", ":"),
        ).encode()
        for p in source.prompts
    ]
