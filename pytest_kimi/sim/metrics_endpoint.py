"""``/metrics``: the engine's counters in Prometheus' text format, named as SGLang (and, for
the prefix cache, vLLM) name them.

Why a module of its own: the cross-checks (:mod:`pytest_kimi.crosscheck`) hold the client's
figures against exactly these counters, so what the simulator exposes, and under which
names, is kept in one place a reader of the cross-checks can find.
"""

from __future__ import annotations

import json

from aiohttp import web

from pytest_kimi.sim.app_common import ENGINE_KEY
from pytest_kimi.sim.engine import SimEngine


async def _metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    label = "{model_name=" + json.dumps(engine.profile.model, ensure_ascii=False) + "}"
    rows = [
        (
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            engine.prompt_tokens,
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            engine.finished_generated_tokens
            if engine.profile.metrics_per_request
            else engine.generated_tokens,
        ),
        (
            "sglang:num_requests_total",
            "counter",
            "Number of requests processed.",
            engine.requests_finished,
        ),
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", engine.num_running),
        (
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue.",
            engine.num_waiting,
        ),
    ]
    lines: list[str] = []
    for name, mtype, help_text, value in rows:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {mtype}")
        lines.append(f"{name}{label} {float(value)}")
    lines += _prefix_cache_metrics(engine, label)
    return web.Response(
        text="\n".join(lines) + "\n",
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


def _prefix_cache_metrics(engine: SimEngine, label: str) -> list[str]:
    """The prefix cache's counters under both engines' names, in prompt tokens, so each reader
    of :mod:`pytest_kimi.crosscheck.prefix_cache` has a server to read: SGLang's
    ``sglang:cached_tokens_total`` (labelled by ``cache_source``; its ``prompt_tokens_total``
    above is the denominator) and vLLM's ``vllm:prefix_cache_queries_total`` /
    ``vllm:prefix_cache_hits_total``.  The simulator counts both at admission, when a prompt
    is matched against the cache (vLLM does the same; SGLang adds a request's counts when it
    finishes)."""
    cached = float(engine.cached_prompt_tokens)
    source = label[:-1] + ',cache_source="device"}'
    return [
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source "
        "(device/host/storage).",
        "# TYPE sglang:cached_tokens_total counter",
        f"sglang:cached_tokens_total{source} {cached}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of "
        "queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{label} {float(engine.prompt_tokens)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached "
        "tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{label} {cached}",
    ]
