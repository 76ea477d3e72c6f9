"""Side by side on real SGLang: the plugin and SGLang's own ``bench_serving`` at one workload.

Why: the plugin is named for SGLang deployments, and an SGLang operator's first question is
whether it agrees with the benchmark SGLang ships.  Both clients measure the same server
(SGLang 0.5.23's CPU engine serving the tiny local Llama) at the same workload: chat
completions, prompts of ``--input-len`` tokens, ``--max-tokens`` output tokens with
``ignore_eos``, ``--waves`` requests per concurrent stream, ``--max-concurrency`` C.  The
table prints each client's output throughput, median TTFT, median ITL and median TPOT, the
difference in percent, and the server's ``sglang:generation_tokens_total`` rise over each
run beside the tokens the client counted.

* the plugin: ``parse_throughput(concurrency=C, max_tokens=N, input_tokens=IN, requests=C x
  waves)`` (whole requests, the closed loop bench_serving runs), its steady-state tok/s and
  the same trials' whole-run figure (all tokens / first send to last token, bench_serving's
  definition), and its peer figures (``level.peer``: TTFT, ITL, TPOT as vLLM/SGLang define
  them);
* SGLang: ``python -m sglang.benchmark.serving`` (``sglang.bench_serving`` is its
  deprecated alias) from ``--sglang-python``, ``--backend sglang-oai-chat --dataset-name
  random --random-range-ratio 1`` with ``--dataset-path`` the plugin's own ShareGPT-format
  sample (``random`` samples its token ids from a ShareGPT file, which it would otherwise
  download), ``--warmup-requests 1``.

The two alternate ``--repeat`` times at each level, so a busy moment of the machine hits both
alike.  Run it where SGLang 0.5.23's CPU env exists (``tox -e sglang`` makes ``.tox/sglang``)::

    python bench/sglang_side_by_side.py --sglang-python .tox/sglang/bin/python \\
        --model .kimi/models/tiny-llama --concurrency 1 8 --max-tokens 128 --repeat 2

``--url`` measures a server already running (started with ``--enable-metrics``) instead of
launching one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402
from pytest_kimi.workload.markers import parse_throughput  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "sglang"))
import cpu_server  # noqa: E402  (the real server's flags and start, shared with tests/sglang)

SHAREGPT = ROOT / "pytest_kimi" / "data" / "sharegpt_small.json"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class Row:
    """One client's figures for one run at one level (wall clock, ms and tok/s)."""

    client: str
    tok_s: float
    """Output throughput as bench_serving defines it: all output tokens / the run's wall."""
    ttft_ms: float
    itl_ms: float
    tpot_ms: float
    client_tokens: int
    server_tokens: float
    ttft_mean_ms: float = float("nan")
    tpot_mean_ms: float = float("nan")
    server_ttft_mean_ms: float = float("nan")
    """The server's own mean over the run: its TTFT histogram's ``_sum``/``_count`` rise
    (warm-up requests included: 2 of the plugin's 14 at C=1, 1 of bench_serving's 5)."""
    server_tpot_mean_ms: float = float("nan")
    """Likewise from ``sglang:request_time_per_output_token_seconds``."""
    note: str = ""


def generation_tokens(url: str) -> float:
    """``sglang:generation_tokens_total``, summed over its label sets."""
    with _NO_PROXY.open(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^sglang:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    )


HISTOGRAMS = {
    "ttft": "sglang:time_to_first_token_seconds",
    "tpot": "sglang:request_time_per_output_token_seconds",
}


def histogram_sums(url: str) -> dict[str, tuple[float, float]]:
    """``(sum, count)`` of each of :data:`HISTOGRAMS`, summed over label sets (absent: 0)."""
    with _NO_PROXY.open(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for key, name in HISTOGRAMS.items():
        parts = []
        for suffix in ("_sum", "_count"):
            pattern = rf"^{re.escape(name + suffix)}(?:\{{[^}}]*\}})? (\S+)$"
            parts.append(sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M)))
        out[key] = (parts[0], parts[1])
    return out


def server_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """The server's mean of each histogram over a run, in ms (nan without observations)."""
    means = {}
    for key in HISTOGRAMS:
        count = after[key][1] - before[key][1]
        total = after[key][0] - before[key][0]
        means[key] = total / count * 1e3 if count > 0 else float("nan")
    return means


def settled_tokens(url: str, quiet_s: float = 0.5) -> float:
    """The counter once it stopped moving: SGLang counts a request when its finish reaches
    the tokenizer manager, a moment after the client saw the last token."""
    last, since = generation_tokens(url), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = generation_tokens(url)
        if now != last:
            last, since = now, time.monotonic()
    return last


def run_plugin(
    session: Measurer, info: Any, c: int, input_len: int, max_tokens: int, requests: int
) -> Row:
    workload, targets = parse_throughput(
        (),
        dict(
            concurrency=c,
            max_tokens=max_tokens,
            input_tokens=input_len,
            requests=requests,
            trials=3,
            warmup=2,
            api="chat",
        ),
    )
    spec = build_spec(info, "bench/sglang_side_by_side.py::plugin", workload, targets, rootdir=ROOT)
    before = settled_tokens(info.url)
    hist = histogram_sums(info.url)
    result = session.measure(spec)
    after = settled_tokens(info.url)
    server = server_means(hist, histogram_sums(info.url))
    (level,) = result.levels
    whole = [sum(r.completion_tokens for r in t.records) / t.wall_s for t in level.trials]
    client = sum(r.completion_tokens for t in level.trials for r in t.records)
    peer = level.peer
    assert peer is not None, "the level has no peer figures"

    def ms(x: float | None) -> float:
        return float("nan") if x is None else x * 1e3

    steady = level.figures.tok_s
    return Row(
        "pytest-kimi",
        statistics.median(whole),
        ms(peer.ttft_s.p50),
        ms(peer.itl_s.p50),
        ms(peer.tpot_s.p50),
        client,
        after - before,
        ms(peer.ttft_s.mean),
        ms(peer.tpot_s.mean),
        server["ttft"],
        server["tpot"],
        f"steady-state {steady:.1f} tok/s; {len(level.trials)} trials; warm-up 2 x 16 tokens"
        if steady is not None
        else "no steady-state figure",
    )


def run_bench_serving(
    python: str, url: str, model: str, c: int, input_len: int, max_tokens: int, requests: int,
    out: Path,
) -> tuple[Row, str]:  # fmt: skip
    result = out / f"bench_serving_c{c}_{time.monotonic_ns()}.jsonl"
    args = [
        "--backend", "sglang-oai-chat", "--base-url", url, "--model", model,
        "--tokenizer", model, "--dataset-name", "random", "--dataset-path", str(SHAREGPT),
        "--random-input-len", str(input_len), "--random-output-len", str(max_tokens),
        "--random-range-ratio", "1", "--num-prompts", str(requests),
        "--max-concurrency", str(c), "--warmup-requests", "1", "--seed", "0",
        "--disable-tqdm", "--output-file", str(result),
    ]  # fmt: skip
    before = settled_tokens(url)
    hist = histogram_sums(url)
    proc = subprocess.run(
        [python, "-m", "sglang.benchmark.serving", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    after = settled_tokens(url)
    server = server_means(hist, histogram_sums(url))
    (out / f"{result.stem}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result.exists():
        raise SystemExit(f"bench_serving failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d = json.loads(result.read_text().splitlines()[-1])
    printed = re.search(r"=+ Serving Benchmark Result =+\n(.*?)\n=+\n", proc.stdout, re.S)
    row = Row(
        "sglang bench_serving",
        d["output_throughput"],
        d["median_ttft_ms"],
        d["median_itl_ms"],
        d["median_tpot_ms"],
        int(d["total_output_tokens"]),
        after - before,
        d["mean_ttft_ms"],
        d["mean_tpot_ms"],
        server["ttft"],
        server["tpot"],
        f"{d['completed']} requests; warm-up 1 request (its tokens: counter rise less client tokens)",
    )
    return row, printed.group(0).rstrip() if printed else proc.stdout[-2000:]


def pct(ours: float, theirs: float) -> str:
    return "--" if not theirs or theirs != theirs else f"{(ours - theirs) / theirs * 100:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sglang-python", default=str(ROOT / ".tox" / "sglang" / "bin" / "python"))
    ap.add_argument(
        "--model",
        default=os.environ.get("KIMI_TINY_MODEL", str(ROOT / ".kimi" / "models" / "tiny-llama")),
    )
    ap.add_argument("--url", help="a running SGLang server (with --enable-metrics)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--waves", type=int, default=4, help="requests per concurrent stream")
    ap.add_argument("--repeat", type=int, default=2, help="alternating runs of each client")
    ap.add_argument("--out", default=None, help="folder for bench_serving's JSONL and logs")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="sglang-side-by-side-"))
    out.mkdir(parents=True, exist_ok=True)
    model = str(Path(args.model).resolve())
    proc = None
    url = args.url
    if url is None:
        print(f"# launching SGLang from {args.sglang_python} (log in {out})", flush=True)
        log = out / "server.log"
        url, _, proc = cpu_server.launch(args.sglang_python, model, log)
        try:
            cpu_server.wait_ready(url, proc, log)
        except cpu_server.NotReady as exc:
            cpu_server.stop(proc)
            raise SystemExit(str(exc)) from None
    session = Measurer()
    rows: list[tuple[int, int, Row, Row]] = []
    try:
        info = session.discover(url, api_key=None, model=None)
        print(
            f"# SGLang {info.server_info.get('version', '?')} at {url}; chat, input {args.input_len}"
            f" tokens, max_tokens={args.max_tokens} (ignore_eos), {args.waves} requests per "
            f"stream; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        for c in args.concurrency:
            requests = c * args.waves
            for i in range(args.repeat):
                ours = run_plugin(session, info, c, args.input_len, args.max_tokens, requests)
                theirs, printed = run_bench_serving(
                    args.sglang_python, url, info.model, c, args.input_len, args.max_tokens,
                    requests, out,
                )  # fmt: skip
                print(f"\n## bench_serving, C={c}, run {i + 1}\n{printed}", flush=True)
                rows.append((c, i + 1, ours, theirs))
                print(f"# C={c} run {i + 1}: {ours}\n# {theirs}", flush=True)
    finally:
        session.close()
        if proc is not None:
            cpu_server.stop(proc)
    print(
        "\n| C | run | client | output tok/s | TTFT p50 ms | ITL p50 ms | TPOT p50 ms | "
        "TTFT mean ms: client / server | TPOT mean ms: client / server | client tokens | "
        "counter rise | note |\n|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"
    )
    for c, i, ours, theirs in rows:
        for r in (ours, theirs):
            print(
                f"| {c} | {i} | {r.client} | {r.tok_s:.1f} | {r.ttft_ms:.2f} | {r.itl_ms:.2f} | "
                f"{r.tpot_ms:.2f} | {r.ttft_mean_ms:.2f} / {r.server_ttft_mean_ms:.2f} "
                f"({pct(r.ttft_mean_ms, r.server_ttft_mean_ms)}) | {r.tpot_mean_ms:.2f} / "
                f"{r.server_tpot_mean_ms:.2f} ({pct(r.tpot_mean_ms, r.server_tpot_mean_ms)}) | "
                f"{r.client_tokens} | {r.server_tokens:.0f} | {r.note} |"
            )
        print(
            f"| {c} | {i} | difference | {pct(ours.tok_s, theirs.tok_s)} | "
            f"{pct(ours.ttft_ms, theirs.ttft_ms)} | {pct(ours.itl_ms, theirs.itl_ms)} | "
            f"{pct(ours.tpot_ms, theirs.tpot_ms)} | | | | | pytest-kimi vs bench_serving |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
