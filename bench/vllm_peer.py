"""A peer's opinion: our figures and ``vllm bench serve``'s against the same real server.

Why: agreeing with our own simulator proves little; agreeing with vLLM's own benchmark
(and with the server's own token counter) on a real engine is the check a vLLM operator
would run before trusting the plugin.  The script launches ``servers/vllm-cpu-tiny.yaml``
through the plugin's launcher, then at each concurrency runs, alternately,

* ``pytest-kimi``: the plugin's measurement (steady-state window, median of trials), and
  the same trials' whole-run figure (all tokens / first send to last token), which is how
  ``vllm bench serve`` counts;
* ``vllm bench serve``: vLLM's benchmark module (``vllm.benchmarks.serve``, the code
  behind the CLI; the ``vllm`` command itself fails in the CPU build with
  ``PackageNotFoundError: vllm``) with the same output length, ``--ignore-eos``, the same
  number of requests and ``--max-concurrency``;

and scrapes ``vllm:generation_tokens_total`` around each run for the server's own rate.
Run it in the engine environment (``tox -e engine`` makes ``.tox/engine``)::

    .tox/engine/bin/python bench/vllm_peer.py --concurrency 1 8 --max-tokens 256 --repeat 3
    .tox/engine/bin/python bench/vllm_peer.py --context-cost 32 288 544 800 1056 --concurrency 8

``--context-cost`` measures instead what a decode step costs against the KV length (why a
stationary trial's per-request rate and ``vllm bench serve``'s TPOT differ at long outputs,
docs/evidence/engines.md): C requests with prompts of exactly that many token ids and
``--max-tokens`` output tokens, the lengths alternated round by round so a busy moment of the
machine hits each alike, and each length's median TPOT as a ratio to the first length's in
the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimi.workload.markers import parse_throughput  # noqa: E402
from pytest_kimi.server import load_profile, open_server  # noqa: E402
from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402

VLLM_BENCH = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
keep = ("completed", "duration", "total_output_tokens", "output_throughput", "mean_ttft_ms",
        "mean_tpot_ms", "mean_itl_ms")
print("RESULT " + json.dumps({k: result.get(k) for k in keep}))
"""


def generation_tokens(url: str) -> float:
    """The server's ``vllm:generation_tokens_total``, summed over label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    )


def run_ours(
    session: Measurer, info, c: int, max_tokens: int, requests: int, trials: int
) -> dict[str, float]:
    workload, targets = parse_throughput(
        (),
        dict(
            concurrency=c,
            max_tokens=max_tokens,
            requests=requests,
            trials=trials,
            warmup=2,
            api="completions",
        ),
    )
    spec = build_spec(info, "bench/vllm_peer.py::ours", workload, targets, rootdir=ROOT)
    before, t0 = generation_tokens(info.url), time.perf_counter()
    result = session.measure(spec)
    after, t1 = generation_tokens(info.url), time.perf_counter()
    (level,) = result.levels
    whole = [sum(r.completion_tokens for r in t.records) / t.wall_s for t in level.trials]
    client = sum(r.completion_tokens for t in level.trials for r in t.records)
    return {
        "steady": level.figures.tok_s or float("nan"),
        "whole": statistics.median(whole),
        "spread": level.figures.spread_pct or 0.0,
        "client_tokens": client,
        "server_tokens": after - before,
        "server_wall_s": t1 - t0,
    }


def run_vllm(url: str, tokenizer: str, c: int, max_tokens: int, requests: int) -> dict[str, float]:
    args = [
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "tiny-llama",
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        str(max_tokens),
        "--ignore-eos",
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(c),
        "--seed",
        "0",
        "--disable-tqdm",
    ]
    before = generation_tokens(url)
    proc = subprocess.run(
        [sys.executable, "-c", VLLM_BENCH, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    after = generation_tokens(url)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(line[7:])
    out["server_tokens"] = after - before
    return out


async def _stream(url: str, ids: list[int], max_tokens: int) -> list[float]:
    """One streamed completion of a token-id prompt: the arrival time of each token."""
    import aiohttp

    body = {
        "model": "tiny-llama",
        "prompt": ids,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    times: list[float] = []
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {") and b'"text"' in line:
                times.append(time.perf_counter())
    return times


def context_cost(url: str, c: int, lengths: list[int], max_tokens: int, rounds: int) -> None:
    """Median TPOT per prompt length, and its paired ratio to the first length's."""

    async def batch(ctx: int, seed: int) -> float:
        prompts = [
            [100 + (seed * 7919 + i * 104729 + j) % 3900 for i in range(ctx)] for j in range(c)
        ]
        runs = await asyncio.gather(*(_stream(url, ids, max_tokens) for ids in prompts))
        return statistics.median((t[-1] - t[0]) / (len(t) - 1) for t in runs if len(t) > 1)

    tpot: dict[int, list[float]] = {n: [] for n in lengths}
    for rnd in range(rounds):
        for n in lengths:
            tpot[n].append(asyncio.run(batch(n, rnd * 1000 + n)))
    print(f"# C={c}, {max_tokens} output tokens, {rounds} rounds, load {os.getloadavg()[0]:.2f}")
    print("| prompt tokens | median TPOT ms | paired ratio to the first |\n|--:|--:|--:|")
    for n in lengths:
        ratio = statistics.median(a / b for a, b in zip(tpot[n], tpot[lengths[0]]))
        print(f"| {n} | {statistics.median(tpot[n]) * 1e3:.2f} | {ratio:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(ROOT / "servers" / "vllm-cpu-tiny.yaml"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--waves", type=int, default=4, help="requests per concurrent stream")
    ap.add_argument("--trials", type=int, default=3, help="our trials per run")
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs of each client")
    ap.add_argument(
        "--context-cost",
        type=int,
        nargs="+",
        metavar="TOKENS",
        help="measure decode step cost against these prompt lengths instead (docstring)",
    )
    args = ap.parse_args()

    profile = load_profile(args.profile)
    tokenizer = str(Path(str(profile.args["model"])).resolve())
    server = open_server(profile, tempfile.mkdtemp(prefix="vllm-peer-"))
    print(f"# launching {args.profile} ...", flush=True)
    server.launch(progress=lambda m: print("#", m, flush=True))
    session = Measurer()
    try:
        assert server.url is not None
        if args.context_cost:
            for c in args.concurrency:
                context_cost(server.url, c, args.context_cost, args.max_tokens, args.repeat)
            return 0
        info = session.discover(server.url, api_key=None, model=None)
        print(
            f"# {info.model} at {server.url}, vLLM {info.server_info.get('version', '?')}; "
            f"max_tokens={args.max_tokens}, {args.waves} requests per stream, ignore_eos"
        )
        print(
            "| C | run | pytest-kimi steady tok/s | pytest-kimi whole-run tok/s | "
            "vllm bench serve output tok/s | server counter minus reported tokens |"
        )
        print("|--:|--:|--:|--:|--:|:--|")
        for c in args.concurrency:
            requests = c * args.waves
            for i in range(args.repeat):
                ours = run_ours(session, info, c, args.max_tokens, requests, args.trials)
                peer = run_vllm(server.url, tokenizer, c, args.max_tokens, requests)
                # both clients send warm-up requests their results leave out: ours 2 x 16
                # tokens, vLLM's one "initial test run" request at full length
                ours_extra = ours["server_tokens"] - ours["client_tokens"]
                peer_extra = peer["server_tokens"] - peer["total_output_tokens"]
                print(
                    f"| {c} | {i + 1} | {ours['steady']:.1f} (±{ours['spread']:.1f}%) | "
                    f"{ours['whole']:.1f} | {peer['output_throughput']:.1f} | "
                    f"ours +{ours_extra:.0f} (warm-up), vllm +{peer_extra:.0f} (test run) |",
                    flush=True,
                )
    finally:
        session.close()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
