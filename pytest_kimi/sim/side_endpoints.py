"""The simulator's side endpoints: what a harness probes besides generation.

``/v1/models``, ``/server_info`` (and its deprecated alias ``/get_server_info``),
``/get_model_info``, ``/health``, ``/health_generate``, ``/flush_cache``, ``/tokenize``, and
the simulator's own ``/sim/stats`` and ``/sim/truth`` (what the engine really delivered, for
the accuracy checks).  ``/metrics`` is :mod:`.metrics_endpoint`.

Why a module of its own: none of these touches the streaming path, and each imitates one
SGLang 0.5.23 endpoint closely enough that it carries its own source references.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from pytest_kimi.sim.app_common import (
    ENGINE_KEY,
    MAX_MODEL_LEN,
    PROFILE_KEY,
    SIM_VERSION,
    _error,
    _warming_up,
)
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.sim.engine import EngineNotRunning, SeqState
from pytest_kimi.sim.request_parsing import BadRequest, _chat_prompt_text, tokenize_text

# ---------------------------------------------------------------------- side endpoints


async def _models(request: web.Request) -> web.Response:
    model = request.app[PROFILE_KEY].model
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sglang",
                    "root": model,
                    "max_model_len": 262144,
                }
            ],
        }
    )


def server_info(profile: SimConfig, port: int | None) -> dict[str, Any]:
    """A dict shaped like SGLang's ``/get_server_info`` (server args plus a few extras).

    The numbers describe the deployment the default profile imitates; the ``sim`` key
    holds the simulator's own knobs so a report can tell a simulated run apart.
    """
    info: dict[str, Any] = {
        "model_path": profile.model,
        "tokenizer_path": profile.model,
        "served_model_name": profile.model,
        "host": "127.0.0.1",
        "port": port,
        "tp_size": 8,
        "ep_size": 8,
        "dp_size": 1,
        "pp_size": 1,
        "nnodes": 1,
        "max_running_requests": profile.max_running_requests,
        "max_total_tokens": 1_048_576,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "num_continuous_decode_steps": 1,
        "schedule_policy": "fcfs",
        "enable_eplb": False,
        "enable_dp_attention": False,
        "moe_a2a_backend": "deepep",
        "attention_backend": "flashinfer",
        "context_length": 262144,
        "dtype": "bfloat16",
        "kv_cache_dtype": "auto",
        "mem_fraction_static": 0.85,
        "cuda_graph_max_bs_decode": 256,
        "disable_radix_cache": profile.disable_radix_cache,
        "speculative_algorithm": None,
        "reasoning_parser": "kimi_k2" if profile.reasoning_tokens else None,
        "api_key": "***" if profile.api_key else None,
        "admin_api_key": "***" if profile.admin_api_key else None,
        "version": SIM_VERSION,
        # the knobs, less server_args: those are merged at the top level already
        "sim": {
            **{k: v for k, v in profile.describe().items() if k != "server_args"},
            "pid": os.getpid(),
        },
    }
    info.update(profile.server_args)
    return info


async def _deprecated_server_info(request: web.Request) -> web.Response:
    """SGLang 0.5.23 keeps ``/get_server_info`` as an alias that logs a warning on every call
    (``sglang/srt/entrypoints/http_server.py``); so does the simulator, so a client that asks
    it first shows up in the server's log."""
    print(
        f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Endpoint '/get_server_info' is deprecated "
        "and will be removed in a future version. Please use '/server_info' instead.",
        file=sys.stderr,
        flush=True,
    )
    return await _server_info(request)


async def _server_info(request: web.Request) -> web.Response:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None
    return web.json_response(server_info(request.app[PROFILE_KEY], port))


async def _model_info(request: web.Request) -> web.Response:
    model = request.app[PROFILE_KEY].model
    return web.json_response({"model_path": model, "tokenizer_path": model, "is_generation": True})


async def _health(request: web.Request) -> web.Response:
    if _warming_up(request.app[ENGINE_KEY]):
        return web.Response(status=503, text="starting up")
    return web.Response(status=200)


async def _health_generate(request: web.Request) -> web.Response:
    """Runs a real one-token generation so a probe proves the batching loop is alive."""
    engine = request.app[ENGINE_KEY]
    if _warming_up(engine):
        return web.Response(status=503, text="starting up")
    try:
        seq = engine.submit(1, 1, ignore_eos=True, faults=False)
    except EngineNotRunning:
        return web.Response(status=503, text="engine not running")
    try:
        await seq.wait_done()
    finally:
        engine.abort(seq)
    if seq.state is not SeqState.FINISHED:
        return web.Response(status=503, text="generation aborted")
    return web.Response(status=200)


async def _flush_cache(request: web.Request) -> web.Response:
    """Empty the prefix cache, as SGLang 0.5.23 does: only while the scheduler is idle.

    ``?timeout=S`` (seconds, >= 0) waits up to S for running and waiting requests to finish;
    without it a busy server refuses at once.  Refusals are HTTP 400 with the reason as text;
    one flush at a time.  (``sglang/srt/entrypoints/http_server.py`` ``flush_cache``,
    ``sglang/srt/managers/scheduler_components/flush_wrapper.py``.)
    """
    engine = request.app[ENGINE_KEY]
    raw = request.query.get("timeout", "0")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not (timeout >= 0.0 and math.isfinite(timeout)):
        return web.json_response(
            {
                "detail": [
                    {
                        "loc": ["query", "timeout"],
                        "input": raw,
                        "msg": "timeout must be a number of seconds >= 0",
                    }
                ]
            },
            status=422,
        )
    if engine.flush_pending:
        return web.Response(status=400, text="Another flush_cache is already in progress.\n")
    if timeout > 0.0 and not engine.idle:
        engine.flush_pending = True
        try:
            deadline = engine.time() + timeout
            while not engine.idle and engine.time() < deadline:
                await asyncio.sleep(0.005)
        finally:
            engine.flush_pending = False
        if not engine.idle:
            return web.Response(
                status=400,
                text=f"Cache not flushed: timed out after "
                f"{timeout:g} s waiting for an idle scheduler.\n",
            )
    if not engine.flush_cache():
        return web.Response(
            status=400,
            text=f"Cache not flushed: {engine.num_running} running "
            f"and {engine.num_waiting} waiting requests.\n",
        )
    return web.Response(text="Cache flushed.\n")


async def _tokenize(request: web.Request) -> web.Response:
    """SGLang's ``/tokenize`` (and ``/v1/tokenize``): the counts generation requests would see.

    ``{"prompt": str | [str, ...]}`` or ``{"messages": [...]}`` -> ``{"tokens", "count",
    "max_model_len"}`` (``sglang/srt/entrypoints/openai/protocol.py`` ``TokenizeRequest``,
    ``TokenizeResponse``; ``.../openai/serving_tokenize.py``).  404 with ``no_tokenize``.
    """
    if request.app[PROFILE_KEY].no_tokenize:
        raise web.HTTPNotFound()
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "BadRequestError")
    tokens: list[int] | list[list[int]]
    count: int | list[int]
    try:
        if body.get("messages") is not None:
            tokens = tokenize_text(_chat_prompt_text(body))
            count = len(tokens)
        elif isinstance(body.get("prompt"), str):
            tokens = tokenize_text(body["prompt"])
            count = len(tokens)
        elif isinstance(body.get("prompt"), list) and all(
            isinstance(p, str) for p in body["prompt"]
        ):
            tokens = [tokenize_text(p) for p in body["prompt"]]
            count = [len(t) for t in tokens]
        else:
            raise BadRequest("give 'prompt' (a string or a list of strings) or 'messages'")
    except BadRequest as exc:
        return _error(400, str(exc), "BadRequestError")
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": MAX_MODEL_LEN})


async def _sim_stats(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    data = asdict(engine.stats())
    data["profile"] = engine.profile.describe()
    return web.json_response(data)


async def _sim_truth(request: web.Request) -> web.Response:
    """``GET /sim/truth?start=T0&end=T1``: what the engine really delivered in a window of the
    client's ``perf_counter`` clock (the same CLOCK_MONOTONIC as the engine's), so a check can
    hold the plugin's figure for exactly the window it measured against the truth."""
    engine = request.app[ENGINE_KEY]
    try:
        start = float(request.query["start"])
        end = float(request.query["end"])
    except (KeyError, ValueError):
        return _error(400, "give start= and end= (perf_counter seconds)", "BadRequestError")
    if not end > start:
        return _error(400, "end must be after start", "BadRequestError")
    tokens, steps, span = engine.truth(start, end)
    wall_tok_s = tokens / span if span > 0 else 0.0
    between = engine.tokens_between(start, end)
    return web.json_response(
        {
            "tokens": tokens,
            "steps": steps,
            "wall_tok_s": wall_tok_s,
            "tok_s": wall_tok_s / engine.profile.speed,
            "speed": engine.profile.speed,
            "edge_lag_s": engine.edge_lag(start, end),
            # the window's ends anywhere, each step's tokens spread over its duration
            "between_tokens": between,
            "between_tok_s": between / (end - start) / engine.profile.speed,
        }
    )
