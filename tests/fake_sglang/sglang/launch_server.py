"""Fake ``python -m sglang.launch_server``: SGLang's flags and log lines, the simulator's API.

Mirrors SGLang 0.5.23 (the newest release when this was written; checked against its wheel):
the flags the example profiles and tests use, spelt as 0.5.23 spells them (argparse rejects
the removed ``--cuda-graph-max-bs``, ambiguous among the per-phase flags as in the real
launcher; it also rejects ``--disable-cuda-graph``, which the real launcher would take
silently as an abbreviation of ``--disable-cuda-graph-padding``: a profile must not use it);
``/server_info`` with every argument (``api_key`` included, in clear), ``launch_command``
(argv joined by spaces, ``--api-key VALUE`` verbatim), ``startup_time``, ``internal_states``;
the deprecation warning logged on every ``/get_server_info``; generation tokens counted per
finished request in ``/metrics``; reasoning deltas with ``--reasoning-parser``.

Behaviour is chosen by environment variables, so one launcher profile can be pointed at
every failure a real deployment has shown:

``FAKE_SGLANG_MODE``
    ``ok`` (default): log the usual startup lines, serve, print the ready line.
    ``crash-at-start``: die with a real ``ZeroDivisionError`` traceback while placing
    experts (the TP2 EP4 failure seen on real hardware), exit code 1.
    ``crash-mid-sweep``: serve, then exit 1 once ``FAKE_SGLANG_CRASH_AFTER`` (default 3)
    generation requests arrived; readiness probes via ``/health_generate`` count too.
    ``never-ready``: print weight-loading progress forever, never listen.
    ``ignore-sigterm``: ignore SIGTERM and spawn a child that ignores it as well (its pid
    is logged as ``scheduler child pid N``), to prove the launcher kills the whole group.
``FAKE_SGLANG_SCHEDULERS``
    Number of scheduler child processes to fork (default 0), each logged as ``scheduler
    child pid N``; unlike SGLang's they do not die with the main process, so only a stop of
    the whole process group ends them.
``FAKE_SGLANG_STARTUP_S``
    Seconds of simulated loading before the server listens (default 0.5).
``FAKE_SGLANG_SPEED`` / ``FAKE_SGLANG_SLOWDOWN``
    Simulator time scale (default 20) and step multiplier (default 1.8 with
    ``--enable-eplb``, the ratio seen between EP8 and EP8+EPLB, else 1.0).

The simulator always binds 127.0.0.1, whatever ``--host`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

READY_LINE = "The server is fired up and ready to roll!"
NUM_EXPERTS = 384
MODES = ("ok", "crash-at-start", "crash-mid-sweep", "never-ready", "ignore-sigterm")


def build_parser() -> argparse.ArgumentParser:
    """The SGLang flags the example profiles and the tests use; anything else is an error
    (exit 2), as with the real launcher, so a typo in a profile fails the same way."""
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    # sglang/srt/arg_groups/fields/{model,parallel,serving,exec_,memory,schedule}.py
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--ep-size", "--expert-parallel-size", "--ep", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--num-continuous-decode-steps", type=int, default=1)
    p.add_argument("--attention-backend")
    p.add_argument("--moe-a2a-backend")
    p.add_argument("--kv-cache-dtype", default="auto")
    # 0.5.23 splits CUDA-graph settings per phase; --cuda-graph-max-bs, --cuda-graph-bs,
    # --disable-cuda-graph and --enable-dp-attention have no command-line spelling any more
    # (sglang/srt/arg_groups/fields/exec_.py: no_cli=True).
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int)
    p.add_argument("--cuda-graph-bs-decode", type=int, nargs="+")
    p.add_argument("--cuda-graph-bs-prefill", type=int, nargs="+")
    p.add_argument("--disable-decode-cuda-graph", action="store_true")
    p.add_argument("--disable-prefill-cuda-graph", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-eplb", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--reasoning-parser")
    p.add_argument("--random-seed", type=int)
    p.add_argument("--api-key")
    p.add_argument("--admin-api-key")
    p.add_argument("--json-model-override-args")
    p.add_argument("--log-level", default="info")
    return p


def log(msg: str, rank: str | None = None) -> None:
    """One line in SGLang's format: ``[date time TP0] message`` on stderr."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    where = f" {rank}" if rank else ""
    print(f"[{stamp}{where}] {msg}", file=sys.stderr, flush=True)


def place_experts(tp_size: int, ep_size: int) -> int:
    """Experts per rank.  Deliberately written the fragile way: with ``ep_size > tp_size``
    the group count is 0 and this raises ZeroDivisionError, like the real TP2 EP4 launch."""
    groups = tp_size // ep_size
    return NUM_EXPERTS // groups // max(ep_size, 1)


def server_args_of(ns: argparse.Namespace) -> dict[str, Any]:
    """The flags as parsed, SGLang's underscore spelling, unset ones as null (0.5.23's
    ``resolved_dict`` lists every field), secrets in clear as the real server has them."""
    return dict(vars(ns))


def server_info_of(ns: argparse.Namespace, argv: list[str], startup_s: float) -> dict[str, Any]:
    """What 0.5.23's ``/server_info`` adds around the arguments
    (``sglang/srt/entrypoints/http_server.py`` ``server_info``; ``build_server_info`` in
    ``sglang/srt/utils/common.py``; ``sglang/srt/observability/startup_time.py``)."""
    import random

    return {
        **server_args_of(ns),
        # random_seed is drawn per launch when none is given, as SGLang does
        "random_seed": ns.random_seed if ns.random_seed is not None else random.randrange(2**30),
        "launch_command": " ".join(argv),
        "status": "ready",
        "max_total_num_tokens": 1_048_576,
        "max_req_input_len": 262_136,
        "startup_time": {
            "load_weight": round(startup_s * 0.6, 3),
            "kv_cache_allocation": round(startup_s * 0.1, 3),
            "scheduler_e2e": round(startup_s, 3),
            "cuda_graph": {"decode": round(startup_s * 0.2, 3)},
        },
        "internal_states": [
            {
                "last_gen_throughput": round(random.uniform(50, 70), 2),
                "memory_usage": {"weight": 120.5, "kvcache": 9.1},
            }
        ],
        "kv_events": None,
        "version": "0.5.23",
        "frontend": "python",
    }


def sim_profile(
    ns: argparse.Namespace, mode: str, argv: list[str] | None = None, startup_s: float = 0.0
) -> Any:
    from pytest_kimi.sim import SimConfig

    slowdown_env = os.environ.get("FAKE_SGLANG_SLOWDOWN")
    slowdown = float(slowdown_env) if slowdown_env else (1.8 if ns.enable_eplb else 1.0)
    kwargs: dict[str, Any] = dict(
        speed=float(os.environ.get("FAKE_SGLANG_SPEED", "20")),
        slowdown=slowdown,
        model=ns.served_model_name or ns.model_path,
        server_args=server_info_of(ns, argv if argv is not None else sys.argv[1:], startup_s),
        api_key=ns.api_key,
    )
    if ns.max_running_requests:
        kwargs["max_running_requests"] = ns.max_running_requests
    # SGLang counts generated tokens per finished request
    # (sglang/srt/managers/tokenizer_manager.py -> observe_one_finished_request in
    # sglang/srt/observability/metrics_collector.py); with a reasoning parser it streams the
    # thinking as delta.reasoning_content (sglang/srt/entrypoints/openai/serving_chat.py).
    kwargs["metrics_per_request"] = True
    if ns.reasoning_parser:
        kwargs["reasoning_tokens"] = int(os.environ.get("FAKE_SGLANG_REASONING_TOKENS", "16"))
    if mode == "crash-mid-sweep":
        kwargs["crash_after_requests"] = int(os.environ.get("FAKE_SGLANG_CRASH_AFTER", "3"))
    return SimConfig(**kwargs)


async def serve(ns: argparse.Namespace, mode: str, started: float) -> None:
    from pytest_kimi.sim import start_server

    profile = sim_profile(ns, mode, sys.argv[1:], time.monotonic() - started)
    server = await start_server(profile, port=ns.port, host="127.0.0.1")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = [signal.SIGINT] if mode == "ignore-sigterm" else [signal.SIGTERM, signal.SIGINT]
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    log(f"Uvicorn running on http://127.0.0.1:{server.port} (Press CTRL+C to quit)")
    log(READY_LINE)
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    ns = build_parser().parse_args(argv)
    mode = os.environ.get("FAKE_SGLANG_MODE", "ok")
    if mode not in MODES:
        print(
            f"fake sglang: FAKE_SGLANG_MODE must be one of {', '.join(MODES)}, got {mode!r}",
            file=sys.stderr,
        )
        return 2
    startup_s = float(os.environ.get("FAKE_SGLANG_STARTUP_S", "0.5"))
    step = startup_s / 6

    if mode == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child below
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
            stdin=subprocess.DEVNULL,
        )
        log(f"scheduler child pid {child.pid}")
    for _ in range(int(os.environ.get("FAKE_SGLANG_SCHEDULERS", "0"))):
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
            stdin=subprocess.DEVNULL,
        )
        log(f"scheduler child pid {child.pid}")

    log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in server_args_of(ns).items())})")
    time.sleep(step)
    log("Init torch distributed begin.", "TP0")
    time.sleep(step)
    log("Load weight begin. avail mem=139.25 GB", "TP0")
    if mode == "crash-at-start":
        tp, ep = ns.tp_size, max(ns.ep_size, ns.tp_size * 2)  # force the impossible split
        log(f"Initializing expert placement for tp_size={tp}, ep_size={ep}", "TP0")
        place_experts(tp, ep)  # raises: uncaught, Python prints the traceback, exit 1
    if mode == "never-ready":
        pct = 0
        while True:
            log(
                f"Loading safetensors checkpoint shards: {pct % 100}% Completed | {pct % 64}/64",
                "TP0",
            )
            pct += 1
            time.sleep(0.2)
    log("Loading safetensors checkpoint shards: 100% Completed | 64/64", "TP0")
    time.sleep(step)
    log("Load weight end. type=KimiK2ForCausalLM, dtype=torch.bfloat16, avail mem=60.11 GB", "TP0")
    time.sleep(step)
    log("Memory pool end. avail mem=12.40 GB", "TP0")
    if not ns.disable_decode_cuda_graph:
        log("Capture cuda graph begin. This can take up to several minutes.", "TP0")
        time.sleep(step)
        log("Capture cuda graph end. Time elapsed: 0.08 s.", "TP0")
    time.sleep(step)
    try:
        asyncio.run(serve(ns, mode, started))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
