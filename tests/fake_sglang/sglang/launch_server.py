"""Fake ``python -m sglang.launch_server``: SGLang's flags and log lines, the simulator's API.

Mirrors SGLang 0.5.23 (checked against its wheel): its own argument parser, rebuilt from the
flag list that parser produced (``pytest_kimi/data/sglang_0_5_23_args.json``, written by
``tests/fake_sglang/dump_args.py``): every flag, abbreviations resolved or refused as
argparse does there (``--api`` is ``--api-key``; ``--enable-metric`` and ``--cont`` are
ambiguous, exit 2), deprecated flags (``--disable-cuda-graph``, ``--enable-dp-attention``)
accepted with SGLang's own warning; ``/metrics`` only with ``--enable-metrics`` (404
otherwise); ``/server_info`` with every argument (``api_key`` included, in clear),
``launch_command`` (argv joined by spaces, ``--api-key VALUE`` verbatim), ``startup_time``,
``internal_states``; the deprecation warning logged on every ``/get_server_info``;
generation tokens counted per finished request in ``/metrics``; reasoning deltas with
``--reasoning-parser``; the admin key on ``/flush_cache`` with ``--admin-api-key``.

Behaviour is chosen by environment variables, so one launcher profile can be pointed at
every failure a real deployment has shown:

``FAKE_SGLANG_MODE``
    ``ok`` (default): log the usual startup lines, serve, print the ready line.
    ``crash-at-start``: die with a real ``ZeroDivisionError`` traceback while placing
    experts (the TP2 EP4 failure seen on real hardware), exit code 1.
    ``crash-mid-sweep``: serve, then exit 1 once ``FAKE_SGLANG_CRASH_AFTER`` (default 3)
    generation requests arrived; readiness probes via ``/health_generate`` count too.
    ``crash-like-sglang``: serve, then die as a multi-rank SGLang does after
    ``FAKE_SGLANG_CRASH_AFTER`` generation requests: a scheduler's traceback, 60 lines of
    the other ranks' output after it, then SIGKILL to itself (exit code -9).
    ``never-ready``: print weight-loading progress forever, never listen.
    ``ignore-sigterm``: ignore SIGTERM and spawn a child that ignores it as well (its pid
    is logged as ``scheduler child pid N``), to prove the launcher kills the whole group.
``FAKE_SGLANG_SCHEDULERS``
    Number of scheduler child processes to fork (default 0), each logged as ``scheduler
    child pid N``; unlike SGLang's they do not die with the main process, so only a stop of
    the whole process group ends them.
``FAKE_SGLANG_STOP``
    ``at-once`` (default): SIGTERM stops the server at once.  ``sglang``: SGLang 0.5.23's
    stop (``sglang/srt/managers/tokenizer_manager.py``): until the first request there is no
    SIGTERM handler, so SIGTERM kills the process outright (exit -15) and the scheduler
    children, which watch their parent, exit with it; after it, SIGTERM starts a drain that
    waits for every running or queued request without limit (a second SIGTERM changes
    nothing), then exits 0.  An open stream so holds the server until SIGKILL, unless
    ``SGL_FORCE_SHUTDOWN=1`` (as in SGLang) ends the wait at once.
``FAKE_SGLANG_STARTUP_S``
    Seconds of simulated loading before the server listens (default 0.5).
``FAKE_SGLANG_SPEED`` / ``FAKE_SGLANG_SLOWDOWN``
    Simulator time scale (default 20) and step multiplier (default: the product of the flag
    effects below, 1.0 without any; ``FAKE_SGLANG_SLOWDOWN`` replaces it).

``FAKE_SGLANG_LAUNCH_NOISE`` / ``FAKE_SGLANG_SEED_FILE`` / ``FAKE_SGLANG_SEED_BASE``
    Per-launch speed noise: each launch draws its own speed factor exp(N(0, noise)) (the
    simulator's ``noise=``), as a real deployment's placement, clocks and autotuning do.  The
    seed is ``FAKE_SGLANG_SEED_BASE`` (default 0) plus a launch counter kept in
    ``FAKE_SGLANG_SEED_FILE`` (so a test's launches draw known factors), else random.

Flag effects (:data:`FLAG_EFFECTS`, :func:`flag_slowdown`): what the culprit search's tests
hide among harmless changes.  Each multiplies every decode step's time:

* ``--enable-eplb``: 1.8 (EP8 -> EP8+EPLB: 1538 -> 862 tok/s at the peak);
* ``--enable-torch-compile``: 1.15;
* ``--enable-mixed-chunk``: 1.02 (within the race's 2% row: a near-tie);
* ``--enable-two-batch-overlap`` with ``--enable-single-batch-overlap``: 1.15 together,
  nothing alone (an interaction);
* env ``FAKE_SGLANG_SLOW_KERNELS=1``: 1.15;
* anything else (``--log-level``, ``--schedule-policy``, ``--stream-interval``,
  ``--num-continuous-decode-steps``...): nothing.

``--max-running-requests`` caps the running batch, as SGLang's does.

The simulator always binds 127.0.0.1, whatever ``--host`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

READY_LINE = "The server is fired up and ready to roll!"
NUM_EXPERTS = 384
MODES = (
    "ok",
    "crash-at-start",
    "crash-mid-sweep",
    "crash-like-sglang",
    "never-ready",
    "ignore-sigterm",
)


class _Deprecated(argparse.Action):
    """SGLang 0.5.23's ``Deprecated*Action``: accept, log SGLang's own warning (yellow, as
    ``print_deprecated_warning`` logs it through the root logger before logging is set up),
    store the value (``sglang/srt/arg_groups/argparse_actions.py``)."""

    def __init__(self, option_strings: list[str], dest: str, warning: str = "", **kw: Any) -> None:
        self.warning = warning
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(f"\033[1;33m{self.warning}\033[0m", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def _type(name: str | None) -> Any:
    """The few converters of SGLang's parser that matter for a fake; the rest stay strings."""
    if name in ("int", "human_readable_int"):
        return int
    if name == "float":
        return float
    if name in ("loads", "json_list_type"):
        return json.loads
    return None


def build_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's own parser, rebuilt from the flag list it produced
    (``pytest_kimi/data/sglang_0_5_23_args.json``, ``tests/fake_sglang/dump_args.py``): the
    same 559 long options, argparse's ``allow_abbrev`` on as in the real one (so
    ``--enable-metric`` and ``--cont`` are ambiguous and exit 2, ``--api`` is taken as
    ``--api-key``), deprecated flags accepted with SGLang's warning, dead ones accepted and
    ignored.  Each option string is its own action: Python 3.11's argparse counts option
    strings, not actions, when it judges a prefix ambiguous, so this matches the real one."""
    from pytest_kimi.server.sglang_flags import DEFAULT_VERSION, raw_flags

    p = argparse.ArgumentParser(prog="sglang serve")
    for row in raw_flags(DEFAULT_VERSION):
        flag = "--" + row["name"]
        kw: dict[str, Any] = {"dest": row["dest"]}
        if row["warning"]:
            kw.update(
                action=_Deprecated,
                warning=row["warning"],
                nargs=0 if not row["takes_value"] else None,
            )
            kw["default"] = row["default"]
        elif not row["takes_value"]:
            kw.update(action="store_true", default=bool(row["default"]))
        else:
            convert = _type(row["type"])
            if convert is not None:
                kw["type"] = convert
            if row["nargs"] is not None:
                kw["nargs"] = row["nargs"]
            if row["choices"]:
                kw["choices"] = [convert(c) if convert is int else c for c in row["choices"]]
            kw["default"] = row["default"]
        p.add_argument(flag, **kw)
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
        # fields 0.5.23 resolves without a flag (``no_cli=True`` in sglang/srt/arg_groups/
        # fields/spec.py and parallel.py): in /server_info, not in the parser's flag list
        "speculative_boundary_reduction": "rs+rsv",
        "enable_cp_tp_group_sharing": False,
        "version": "0.5.23",
        "frontend": "python",
    }


def launch_seed() -> int:
    """This launch's seed (``FAKE_SGLANG_LAUNCH_NOISE``): the base plus the launches before it
    (counted in ``FAKE_SGLANG_SEED_FILE``), else a random one."""
    counter = os.environ.get("FAKE_SGLANG_SEED_FILE")
    if not counter:
        return random.SystemRandom().randrange(2**31)
    path = Path(counter)
    n = int(path.read_text()) if path.exists() else 0
    path.write_text(str(n + 1))
    return int(os.environ.get("FAKE_SGLANG_SEED_BASE", "0")) + n


FLAG_EFFECTS: dict[str, float] = {
    "enable_eplb": 1.8,
    "enable_torch_compile": 1.15,
    "enable_mixed_chunk": 1.02,
}
"""A flag's step-time multiplier on this fake (module docstring), by its argparse dest."""
PAIR_EFFECT = (("enable_two_batch_overlap", "enable_single_batch_overlap"), 1.15)
"""Two flags that slow the fake only together: the interaction the culprit search must name."""
ENV_EFFECTS: dict[str, float] = {"FAKE_SGLANG_SLOW_KERNELS": 1.15}
"""An environment variable set to ``1`` and its multiplier."""


def flag_slowdown(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> float:
    """The step-time multiplier of the flags and env this launch got (:data:`FLAG_EFFECTS`)."""
    env = os.environ if environ is None else environ
    factor = 1.0
    for dest, effect in FLAG_EFFECTS.items():
        if getattr(ns, dest, False):
            factor *= effect
    pair, effect = PAIR_EFFECT
    if all(getattr(ns, dest, False) for dest in pair):
        factor *= effect
    for name, effect in ENV_EFFECTS.items():
        if env.get(name) == "1":
            factor *= effect
    return factor


def sim_profile(
    ns: argparse.Namespace, mode: str, argv: list[str] | None = None, startup_s: float = 0.0
) -> Any:
    from pytest_kimi.sim import SimConfig

    slowdown_env = os.environ.get("FAKE_SGLANG_SLOWDOWN")
    slowdown = float(slowdown_env) if slowdown_env else flag_slowdown(ns)
    kwargs: dict[str, Any] = dict(
        speed=float(os.environ.get("FAKE_SGLANG_SPEED", "20")),
        slowdown=slowdown,
        model=ns.served_model_name or ns.model_path,
        server_args=server_info_of(ns, argv if argv is not None else sys.argv[1:], startup_s),
        api_key=ns.api_key,
        admin_api_key=ns.admin_api_key,
    )
    if ns.max_running_requests:
        kwargs["max_running_requests"] = ns.max_running_requests
    launch_noise = os.environ.get("FAKE_SGLANG_LAUNCH_NOISE")
    if launch_noise:
        kwargs["noise"] = float(launch_noise)
        kwargs["seed"] = launch_seed()
    kwargs["disable_radix_cache"] = ns.disable_radix_cache
    # streamed as 0.5.23 streams with --stream-interval (the simulator's framing, which the
    # recorded samples hold: tests/unit/server/test_fakes_match_sglang.py)
    kwargs["stream_interval"] = ns.stream_interval or 1
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


_PROBES = ("/health", "/metrics")
"""Requests that do not start SGLang's tokenizer-manager loop (its SIGTERM handler)."""


_PER_REQUEST_COUNTERS = (
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_requests_total",
)


def _sglang_page(text: str) -> str:
    """The simulator's ``/metrics`` as SGLang 0.5.23 shows it: no ``vllm:*`` families, and
    no ``sglang:cached_tokens_total`` before the first cache hit (its multiprocess registry
    lists a labelled counter only once a sample was written: ``metrics_collector.py``
    increments it only for ``cached_tokens > 0``), and none of the per-request counters before
    the first request finished: ``observe_one_finished_request`` writes their first samples,
    so a fresh real server's page lacks ``prompt_tokens_total``, ``generation_tokens_total``
    and ``num_requests_total`` (``tests/data/sglang-0.5.23/metrics.json``, ``fresh``)."""
    families: dict[str, list[str]] = {}
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else line
        name = name.split("{", 1)[0].split(" ", 1)[0]
        families.setdefault(name, []).append(line)

    def all_zero(name: str) -> bool:
        samples = [ln for ln in families.get(name, []) if not ln.startswith("#")]
        return all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in samples)

    unfinished = all_zero("sglang:num_requests_total")
    out: list[str] = []
    for name, lines in families.items():
        if name.startswith("vllm:"):
            continue
        if name == "sglang:cached_tokens_total" and all_zero(name):
            continue
        if unfinished and name in _PER_REQUEST_COUNTERS:
            continue
        out += lines
    return "\n".join(out) + "\n"


def _crash_like_sglang(after: int) -> None:
    """How a real multi-rank SGLang dies: a scheduler's traceback, the other ranks' lines
    after it, then the main process kills its own tree with SIGKILL (``kill_process_tree``
    in ``sglang/srt/utils/common.py`` after the SIGQUIT a dead child sends): exit -9."""
    log("Scheduler hit an exception: Traceback (most recent call last):", "TP3")
    print(
        '  File "sglang/srt/managers/scheduler.py", line 3100, in run_scheduler_process\n'
        "    scheduler.event_loop_normal()\n"
        f"RuntimeError: simulated scheduler crash after {after} generation requests\n",
        file=sys.stderr,
        flush=True,
    )
    for i in range(60):  # the other ranks keep logging: the traceback is not the last lines
        log(
            f"Decode batch, #running-req: {i % 8}, #token: {i * 64}, gen throughput (token/s): 0.00",
            f"TP{i % 3}",
        )
    log("SIGQUIT received. It usually means one child failed.")
    os.kill(os.getpid(), signal.SIGKILL)


async def serve(ns: argparse.Namespace, mode: str, started: float) -> None:
    """The simulator behind SGLang's HTTP surface, with what the fake adds in front of it:
    ``/metrics`` only with ``--enable-metrics`` (else 404, as SGLang mounts its Prometheus
    app only then: ``sglang/srt/entrypoints/http_server.py``), SGLang's stop behaviour when
    ``FAKE_SGLANG_STOP=sglang``, and the ``crash-like-sglang`` mode."""
    from aiohttp import web

    from pytest_kimi.sim.app import SimServer, create_app
    from pytest_kimi.sim.app_common import ENGINE_KEY

    profile = sim_profile(ns, mode, sys.argv[1:], time.monotonic() - started)
    app = create_app(profile)
    engine = app[ENGINE_KEY]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    sglang_stop = os.environ.get("FAKE_SGLANG_STOP", "at-once") == "sglang"
    seen = {"requests": 0, "generation": 0}
    crash_after = int(os.environ.get("FAKE_SGLANG_CRASH_AFTER", "3"))

    def drain_then_stop() -> None:
        log("SIGTERM received. Draining requests and shutting down...")

        async def drain() -> None:
            # sigterm_watchdog: no limit on the wait (a second SIGTERM changes nothing) unless
            # SGL_FORCE_SHUTDOWN is true: then it stops waiting for the requests at once
            force = os.environ.get("SGL_FORCE_SHUTDOWN", "false").lower() in ("true", "1")
            while (engine.num_running or engine.num_waiting) and not force:
                log(
                    "Gracefully exiting... Remaining number of requests "
                    f"{engine.num_running + engine.num_waiting}."
                )
                await asyncio.sleep(0.5)
            stop.set()

        loop.create_task(drain())

    @web.middleware
    async def sglang_front(request: web.Request, handler: Any) -> Any:
        if request.path == "/metrics" and not ns.enable_metrics:
            return web.json_response({"detail": "Not Found"}, status=404)
        if not request.path.startswith(_PROBES):
            seen["requests"] += 1
            if sglang_stop and seen["requests"] == 1:
                loop.add_signal_handler(signal.SIGTERM, drain_then_stop)
            if request.path.startswith(
                ("/v1/chat", "/v1/completions", "/generate", "/health_generate")
            ):
                seen["generation"] += 1
                if mode == "crash-like-sglang" and seen["generation"] > crash_after:
                    _crash_like_sglang(crash_after)
        response = await handler(request)
        if request.path == "/metrics" and response.status == 200:
            return web.Response(
                text=_sglang_page(response.text or ""),
                headers={"Content-Type": response.content_type},
            )
        return response

    app.middlewares.insert(0, sglang_front)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", ns.port, reuse_address=True)
    await site.start()
    server = SimServer(runner=runner, engine=engine, profile=profile, port=runner.addresses[0][1])
    if mode == "ignore-sigterm":
        signals = [signal.SIGINT]
    elif sglang_stop:
        # Until the first request SGLang has no SIGTERM handler: the default action kills it.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signals = [signal.SIGINT]
    else:
        signals = [signal.SIGTERM, signal.SIGINT]
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    log(f"Uvicorn running on http://127.0.0.1:{server.port} (Press CTRL+C to quit)")
    log(READY_LINE)
    try:
        await stop.wait()
    finally:
        await server.close()


_SCHEDULER = (
    "import os, sys, time\n"
    "parent = os.getppid()\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
    "    if {follow} and os.getppid() != parent: sys.exit(0)\n"
)


def _scheduler(follow_parent: bool) -> subprocess.Popen[bytes]:
    """A scheduler child.  ``follow_parent``: it exits once its parent is gone, as SGLang's
    schedulers do (their parent-death watchdog); otherwise only a stop of the whole process
    group ends it."""
    return subprocess.Popen(
        [sys.executable, "-c", _SCHEDULER.format(follow=follow_parent)], stdin=subprocess.DEVNULL
    )


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.model_path is None:
        parser.error("the following arguments are required: --model-path")
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
        child = _scheduler(follow_parent=False)
        log(f"scheduler child pid {child.pid}")
    follow = os.environ.get("FAKE_SGLANG_STOP", "at-once") == "sglang"
    for _ in range(int(os.environ.get("FAKE_SGLANG_SCHEDULERS", "0"))):
        child = _scheduler(follow_parent=follow)
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
    elif (ns.ep_size or 1) > (ns.tp_size or 1):
        # as SGLang 0.5 places experts: EP wider than TP does not start, in any mode (the
        # culprit search's untestable subsets: tp-size changed without its ep-size)
        log(f"Initializing expert placement for tp_size={ns.tp_size}, ep_size={ns.ep_size}", "TP0")
        place_experts(ns.tp_size, ns.ep_size)
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
    if not (ns.disable_decode_cuda_graph or ns.disable_cuda_graph):
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
