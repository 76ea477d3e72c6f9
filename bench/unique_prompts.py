"""Does making every prompt unique cost the load client anything?

    python bench/unique_prompts.py [--rounds 5] [--prompt-bytes 6000]

By default the runner writes each request's unique id into its pre-encoded body (one
``head + id + tail`` join per request, nothing per chunk).  This runs our ``LoadClient``
against ``bench/firehose.py`` (a server that is never the bottleneck; client and server each
pinned to a core where possible) with the same bodies sent as they are ("repeated") and with
the slot filled per request ("unique"), alternating, and prints requests/s and tokens/s of each:

* ``short``: C=64, 8-token answers, long prompts: the per-request cost at its most visible;
* ``stream``: C=64, 1024-token answers: the streamed-token capacity of ``client_capacity.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from client_capacity import Firehose, pin  # noqa: E402

from pytest_kimi.load import LoadClient, Target, TrialPlan  # noqa: E402
from pytest_kimi.workload.prompts import UNIQUE_SLOT, lead  # noqa: E402


def bodies(tokens: int, prompt_bytes: int, unique: bool) -> list[bytes]:
    out = []
    for k in range(4):
        text = f"prompt {k} " + "x" * prompt_bytes
        if unique:
            text = lead("bench123") + text
        req = {
            "model": "default",
            "messages": [{"role": "user", "content": text}],
            "stream": True,
            "max_tokens": tokens,
            "stream_options": {"include_usage": True},
        }
        out.append(json.dumps(req, separators=(",", ":")).encode())
    return out


async def one(
    url: str, c: int, requests: int, tokens: int, prompt_bytes: int, unique: bool
) -> tuple[float, float, float]:
    async with LoadClient() as client:
        plan = TrialPlan(
            concurrency=c,
            bodies=bodies(8, prompt_bytes, unique),
            requests=c,
            timeout_s=30,
            unique_slot=UNIQUE_SLOT.encode() if unique else None,
        )
        await client.run_trial(Target(url), plan)  # connections up first
        plan = TrialPlan(
            concurrency=c,
            bodies=bodies(tokens, prompt_bytes, unique),
            requests=requests,
            timeout_s=30,
            unique_slot=UNIQUE_SLOT.encode() if unique else None,
        )
        tr = await client.run_trial(Target(url), plan)
    wall = tr.ended - tr.started
    toks = sum(r.completion_tokens for r in tr.records if r.ok)
    assert all(r.ok for r in tr.records), [r.error for r in tr.records if r.error][:3]
    return len(tr.records) / wall, toks / wall, tr.client_cpu_s / wall


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-bytes", type=int, default=6000)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args()
    _, server_cpu, where = pin(args)
    print(f"# {where}; prompt {args.prompt_bytes} bytes, {args.rounds} alternating rounds, median")
    fire = Firehose(server_cpu)
    try:
        for name, c, requests, tokens in (("short", 64, 4096, 8), ("stream", 64, 256, 1024)):
            got: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
            for _ in range(args.rounds):
                for unique in (False, True):
                    got[unique].append(
                        asyncio.run(one(fire.url, c, requests, tokens, args.prompt_bytes, unique))
                    )
            for unique in (False, True):
                rs = got[unique]
                print(
                    f"{name:<6} C={c:<3} {tokens:>4} tok  {'unique' if unique else 'repeated':<8} "
                    f"{statistics.median(r[0] for r in rs):>9,.0f} req/s {statistics.median(r[1] for r in rs):>10,.0f} tok/s "
                    f"CPU {statistics.median(r[2] for r in rs):.0%}",
                    flush=True,
                )
    finally:
        fire.close()


if __name__ == "__main__":
    main()
