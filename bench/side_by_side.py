"""Side by side: the plugin, ``vllm bench serve`` and GuideLLM against one simulator.

Why: a figure is only comparable with a peer's when both name the same quantity, and the
simulator is the one server whose answer is known (``SimConfig.true_tok_s`` and friends,
``/sim/truth``), so this is where the definitions show: each client measures the same server at
C=1/8/64 and the table prints every client's aggregate tok/s, per-request decode rate, TTFT and
ITL beside the truth.  The peers' own summary lines are printed as they print them (and kept
whole under ``--out``) so nobody has to trust our transcription.

The simulator runs the EP8 profile at ``--speed`` (default 1: its clock is the wall clock, so
the peers, which know nothing of a simulator's clock, report in the same units as the plugin).
Each peer runs in its own interpreter, and a peer that is not installed is skipped with a
line that says how to install it:

* ``vllm bench serve``: ``vllm.benchmarks.serve`` (the module behind the CLI) in
  ``--vllm-python`` (default ``.tox/engine/bin/python``, which ``tox -e engine`` makes),
  ``--backend openai`` on ``/v1/completions``, random prompts, ``--ignore-eos``,
  ``--max-concurrency C``; it needs a tokenizer for its random prompts, the tiny Llama's
  (``--tokenizer``, made by ``tests/engine/make_tiny_model.py``);
* GuideLLM: ``--guidellm`` (default: ``guidellm`` on the PATH; it is no dependency of this
  project: ``python -m venv /tmp/guidellm-venv && /tmp/guidellm-venv/bin/pip install
  guidellm``), ``--profile kind=concurrent,streams=C``, synthetic prompts, ``output_tokens``
  (which it sends with ``ignore_eos``).

::

    python bench/side_by_side.py --levels 1 8 64 --max-tokens 256 \\
        --guidellm /tmp/guidellm-venv/bin/guidellm --out /tmp/side_by_side
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimi.run.measurer import Measurer, build_spec  # noqa: E402
from pytest_kimi.sim.config import SimConfig  # noqa: E402
from pytest_kimi.sim.process import SimProcess  # noqa: E402
from pytest_kimi.workload.markers import parse_throughput  # noqa: E402

VLLM_BENCH = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
PROMPT_TOKENS = 32
"""Prompt length every client asks for (in the tiny Llama's tokens; the simulator counts its
own way): short, so TTFT is one admission step, as in the accuracy runs."""


@dataclass
class Row:
    """One client's figures at one level, in the simulator's clock (ms and tok/s)."""

    client: str
    tok_s: float | None
    """Aggregate output tok/s as the client defines it."""
    req_tok_s: float | None
    """Per-request decode rate: the client's median (1000 / median TPOT for the peers)."""
    ttft_ms: float | None
    itl_ms: float | None
    note: str = ""


def truth(profile: SimConfig, c: int, max_tokens: int) -> Row:
    """The simulator's closed form at concurrency ``c`` (EP8's clock)."""
    ep8 = replace(profile, speed=1.0)
    step = ep8.step_time(ep8.batch_size(c))
    # TTFT has no one true value: a request's first token comes at the end of the step that
    # admits it (that step also pays the prompt's prefill), so it is one step or two (docs)
    return Row(
        "truth",
        ep8.true_tok_s(c),
        ep8.request_tok_s(c),
        None,
        step * 1e3,
        f"steady state; whole requests back to back {ep8.closed_loop_tok_s(c, max_tokens):.1f}",
    )


def run_plugin(session: Measurer, info, c: int, max_tokens: int, protocol: str) -> Row:
    kwargs: dict[str, object] = dict(
        concurrency=c, max_tokens=max_tokens, trials=3, warmup=2, api="completions"
    )
    if protocol == "whole-requests":
        kwargs["requests_per_stream"] = 2
    else:
        kwargs["protocol"] = "stationary"
    workload, targets = parse_throughput((), kwargs)
    spec = build_spec(info, "bench/side_by_side.py::plugin", workload, targets, rootdir=ROOT)
    result = session.measure(spec)
    (level,) = result.levels
    f = level.figures
    ms = 1e3
    return Row(
        f"pytest-kimi ({protocol})",
        f.tok_s,
        f.request_tok_s_p50,
        f.ttft_s_p50 * ms if f.ttft_s_p50 is not None else None,
        f.itl_s_p50 * ms if f.itl_s_p50 is not None else None,
        f"trials {', '.join(f'{x:.1f}' for x in f.trials_tok_s)}",
    )


def run_vllm(
    python: str, url: str, model: str, tokenizer: str, c: int, max_tokens: int, out: Path
) -> tuple[Row, str]:
    result = out / f"vllm_c{c}.json"
    args = [
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(max_tokens), "--ignore-eos",
        "--num-prompts", str(max(4, 2 * c)), "--max-concurrency", str(c),
        "--seed", "0", "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(out), "--result-filename", result.name,
    ]  # fmt: skip
    proc = subprocess.run(
        [python, "-c", VLLM_BENCH, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    (out / f"vllm_c{c}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result.exists():
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d = json.loads(result.read_text())
    lines = re.search(r"=+ Serving Benchmark Result =+\n(.*?)\n=+\n", proc.stdout, re.S)
    printed = lines.group(0).rstrip() if lines else proc.stdout[-2000:]
    return (
        Row(
            "vllm bench serve",
            d["output_throughput"],
            1000.0 / d["median_tpot_ms"],
            d["median_ttft_ms"],
            d["median_itl_ms"],
            f"{d['completed']} requests",
        ),
        printed,
    )


def run_guidellm(exe: str, url: str, tokenizer: str, c: int, max_tokens: int, out: Path):
    result = out / f"guidellm_c{c}.json"
    args = [
        "run",
        "--backend", f"kind=openai_http,target={url},request_format=/v1/completions",
        "--profile", f"kind=concurrent,streams={c}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={max_tokens}",
        "--tokenizer", f"kind=hf_auto,model={tokenizer}",
        "--constraint", f"kind=max_requests,count={max(4, 2 * c)}",
        "--output", f"kind=json,path={result}",
        "--disable-console-interactive",
    ]  # fmt: skip
    proc = subprocess.run([exe, *args], capture_output=True, text=True)
    (out / f"guidellm_c{c}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result.exists():
        raise SystemExit(
            f"guidellm failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    (bench,) = json.loads(result.read_text())["benchmarks"]
    m = bench["metrics"]

    def stat(name: str, key: str = "median", part: str = "successful") -> float:
        return float(m[name][part][key])

    # GuideLLM's "ITL" is each request's (latency - TTFT) / (tokens - 1), vLLM's TPOT; its
    # "TPOT" is latency / tokens, the first token's wait included
    itl = stat("inter_token_latency_ms")
    # its latency and throughput tables, as it prints them (the rows of this benchmark)
    text = proc.stdout
    keep = []
    for title in ("Request Latency Statistics", "Server Throughput Statistics"):
        block = re.search(rf"{title}.*?\n(.*?)\n\n", text, re.S)
        if block:
            keep.append(f"{title}\n{block.group(1)}")
    return (
        Row(
            "GuideLLM",
            stat("output_tokens_per_second", "mean", "total"),
            1000.0 / itl,
            stat("time_to_first_token_ms"),
            itl,
            f"{int(m['request_totals']['successful'])} requests",
        ),
        "\n".join(keep) or text[-3000:],
    )


def in_sim_clock(row: Row, speed: float) -> Row:
    """A peer's row (wall clock: it knows no simulator) in the simulator's clock, as ours is."""
    if speed == 1.0:
        return row
    rate = lambda x: None if x is None else x / speed  # noqa: E731
    late = lambda x: None if x is None else x * speed  # noqa: E731
    return Row(
        row.client,
        rate(row.tok_s),
        rate(row.req_tok_s),
        late(row.ttft_ms),
        late(row.itl_ms),
        f"{row.note}; wall-clock figures converted at speed {speed:g}",
    )


def fmt(x: float | None, digits: int = 1) -> str:
    return "--" if x is None else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--vllm-python", default=str(ROOT / ".tox" / "engine" / "bin" / "python"))
    ap.add_argument("--guidellm", default=shutil.which("guidellm") or "")
    ap.add_argument(
        "--tokenizer",
        default=os.environ.get("KIMI_TINY_MODEL", str(ROOT / ".kimi" / "models" / "tiny-llama")),
        help="a local Hugging Face tokenizer for the peers' synthetic prompts",
    )
    ap.add_argument("--out", default=None, help="folder for the peers' JSON and full output")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="side-by-side-"))
    out.mkdir(parents=True, exist_ok=True)
    have_vllm = Path(args.vllm_python).exists() and (
        subprocess.run(
            [args.vllm_python, "-c", "import vllm.benchmarks.serve"], capture_output=True
        ).returncode
        == 0
    )
    have_guidellm = bool(args.guidellm) and Path(args.guidellm).exists()
    have_tokenizer = (Path(args.tokenizer) / "tokenizer.json").exists()
    if not have_vllm:
        print(
            f"# skipping vllm bench serve: no vLLM in {args.vllm_python} (tox -e engine makes it)"
        )
    if not have_guidellm:
        print(
            "# skipping GuideLLM: not installed (pip install guidellm in a venv; --guidellm PATH)"
        )
    if (have_vllm or have_guidellm) and not have_tokenizer:
        print(f"# skipping both peers: no tokenizer at {args.tokenizer} "
              "(python tests/engine/make_tiny_model.py DIR makes one)")  # fmt: skip
        have_vllm = have_guidellm = False
    profile = SimConfig(speed=args.speed)
    print(
        f"# simulator: EP8 profile at speed {args.speed:g} (figures in its clock), "
        f"max_tokens={args.max_tokens}, prompts of {PROMPT_TOKENS} tokens; "
        f"load average {os.getloadavg()[0]:.2f}; peers' output in {out}"
    )
    rows: dict[int, list[Row]] = {}
    with SimProcess(profile) as sim:
        assert sim.url is not None
        session = Measurer()
        try:
            info = session.discover(sim.url, api_key=None, model=None)
            for c in args.levels:
                level = rows.setdefault(c, [truth(profile, c, args.max_tokens)])
                for protocol in ("stationary", "whole-requests"):
                    level.append(run_plugin(session, info, c, args.max_tokens, protocol))
                if have_vllm:
                    row, printed = run_vllm(
                        args.vllm_python, sim.url, info.model, args.tokenizer, c,
                        args.max_tokens, out,
                    )  # fmt: skip
                    level.append(in_sim_clock(row, args.speed))
                    print(f"\n## vllm bench serve, C={c}\n{printed}")
                if have_guidellm:
                    row, printed = run_guidellm(
                        args.guidellm, sim.url, args.tokenizer, c, args.max_tokens, out
                    )
                    level.append(in_sim_clock(row, args.speed))
                    print(f"\n## GuideLLM, C={c}\n{printed}")
                print(f"# C={c} done, load average {os.getloadavg()[0]:.2f}", flush=True)
        finally:
            session.close()
    print(
        "\n| C | client | aggregate tok/s | per-request tok/s | TTFT p50 ms | ITL p50 ms | note |"
        "\n|--:|---|--:|--:|--:|--:|---|"
    )
    for c, level in rows.items():
        for r in level:
            print(
                f"| {c} | {r.client} | {fmt(r.tok_s)} | {fmt(r.req_tok_s)} | "
                f"{fmt(r.ttft_ms, 2)} | {fmt(r.itl_ms, 2)} | {r.note} |"
            )
    medians = {
        c: statistics.median([r.tok_s for r in level[1:] if r.tok_s is not None])
        for c, level in rows.items()
    }
    print(f"\n# median aggregate over the clients per level: {medians}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
