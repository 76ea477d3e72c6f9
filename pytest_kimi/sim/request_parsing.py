"""Request bodies the simulator accepts: validated and reduced to what the engine needs.

Why a module of its own: what a body may hold (chat messages or a completions prompt, the
``stream_options``, thinking switched off the ways SGLang and Kimi's template read it) is the
larger part of the simulator's faithfulness to SGLang, and it needs no HTTP server: the
generation handler and ``/tokenize`` call it, and so can a test, without aiohttp.

Prompts are counted without a tokenizer: one token per 4 UTF-8 bytes
(:func:`count_prompt_tokens`), which client and server can both compute.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass
from typing import Any


def count_prompt_tokens(text: str) -> int:
    """Deterministic prompt size: one token per 4 UTF-8 bytes, rounded up, at least 1.

    Real tokenizers average roughly 4 bytes per token on English; what matters here is
    that client and server can both compute the same number without a tokenizer.
    """
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


# ---------------------------------------------------------------------- request parsing


class BadRequest(Exception):
    """A request body the server rejects with 400 and this message."""


@dataclass(frozen=True, slots=True)
class GenParams:
    """What the engine and the writer need from a generation request body."""

    kind: str  # "chat" | "completion"
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    continuous_usage: bool = False
    """``stream_options.continuous_usage_stats``: every token chunk carries the usage so far
    (SGLang's ``serving_chat.py``, vLLM alike), not only the last chunk."""
    thinking: bool = True
    """Chat: the response opens with the profile's reasoning phase (off with
    ``chat_template_kwargs: {"thinking": false}``, as Kimi's template reads it)."""
    separate_reasoning: bool = True
    """Chat: reasoning streams as ``reasoning_content``; false streams it as content (SGLang's
    ``separate_reasoning`` request field) while usage still counts it."""
    prompt_key: bytes = b""
    """The prompt as the simulator tokenizes it (4 bytes a token), for the prefix cache."""


def _thinking(body: dict[str, Any]) -> bool:
    """Whether a chat request leaves thinking on: SGLang maps ``reasoning_effort: "none"`` to
    ``thinking`` / ``enable_thinking`` false in ``chat_template_kwargs`` (``protocol.py``);
    Kimi K2's template reads ``thinking``, Qwen3's ``enable_thinking``: either turns it off."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object")
    on = body.get("reasoning_effort") != "none"
    for key in ("thinking", "enable_thinking"):
        value = kwargs.get(key)
        if value is not None:
            on = on and bool(value)
    return on


def _opt_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean, got {json.dumps(value)}")
    return value


def _max_tokens(body: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"'{key}' must be an integer >= 1, got {json.dumps(value)}")
        return value
    return 16


def _chat_prompt_tokens(body: dict[str, Any]) -> int:
    return count_prompt_tokens(_chat_prompt_text(body))


def _chat_prompt_text(body: dict[str, Any]) -> str:
    """The text the simulator counts for a chat request: every message's content, joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    texts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
        content = msg.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise BadRequest(f"messages[{i}].content[{j}] must be an object")
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        else:
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null")
    return "".join(texts)


def _completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_prompt_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return len(prompt)
        if len(prompt) == 1:
            only = prompt[0]
            if isinstance(only, str):
                return count_prompt_tokens(only)
            if (
                isinstance(only, list)
                and only
                and all(isinstance(x, int) and not isinstance(x, bool) for x in only)
            ):
                return len(only)
        if len(prompt) > 1 and all(isinstance(x, (str, list)) for x in prompt):
            raise BadRequest(
                "batched prompts are not supported by the simulator; send one prompt per request"
            )
    raise BadRequest("'prompt' must be a string, a list of token ids, or a one-element list")


def _token_bytes(ids: list[int]) -> bytes:
    """Token ids as prompt bytes, 4 a token, like text is counted."""
    return array("I", [x & 0xFFFFFFFF for x in ids]).tobytes()


def _completion_prompt_key(body: dict[str, Any]) -> bytes:
    """The completion prompt's bytes (its shape was checked by ``_completion_prompt_tokens``)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.encode("utf-8")
    return _token_bytes(prompt) if isinstance(prompt, list) else b""


def tokenize_text(text: str) -> list[int]:
    """The simulator's token ids of ``text``: each 4 UTF-8 bytes one id, as
    :func:`count_prompt_tokens` counts them (and the prefix cache matches them)."""
    data = text.encode("utf-8")
    ids = [int.from_bytes(data[at : at + 4], "little") for at in range(0, len(data), 4)]
    return ids or [0]


def parse_generation(body: object, kind: str) -> GenParams:
    """Validate a chat or completions body; raises :class:`BadRequest` with a clear reason."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"'n' must be 1 in the simulator, got {json.dumps(n)}")
    if kind == "chat":
        text = _chat_prompt_text(body)
        prompt_tokens = count_prompt_tokens(text)
        prompt_key = text.encode("utf-8")
        max_tokens = _max_tokens(body, ("max_tokens", "max_completion_tokens"))
    else:
        prompt_tokens = _completion_prompt_tokens(body)
        prompt_key = _completion_prompt_key(body)
        max_tokens = _max_tokens(body, ("max_tokens",))
    stream = _opt_bool(body, "stream", False)
    options = body.get("stream_options")
    include_usage = continuous_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object")
        include_usage = _opt_bool(options, "include_usage", False)
        # independent of include_usage, as in SGLang 0.5.23 (should_include_usage in
        # entrypoints/openai/utils.py); vLLM needs both
        continuous_usage = _opt_bool(options, "continuous_usage_stats", False)
    ignore_eos = _opt_bool(body, "ignore_eos", False)
    chat = kind == "chat"
    return GenParams(
        kind=kind,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        ignore_eos=ignore_eos,
        thinking=chat and _thinking(body),
        separate_reasoning=_opt_bool(body, "separate_reasoning", True),
        prompt_key=prompt_key,
    )
