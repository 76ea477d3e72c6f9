"""What a multi-turn workload (``turns=``) costs the load client, per streamed event.

    python bench/conversation_cost.py [--events 512] [--rounds 3]

A conversation needs each turn's answer, which the parser never decodes.  The client keeps a
reference to every raw read block of such a request (one list append per read) and takes the
answer once, after the stream ended (:func:`pytest_kimi.load.conversation.answer_bytes`).
This script times, in one process so that machine load hits all three alike:

* the parser's own work per event (one event per read block: a client that keeps up with a
  fast server, the most reads per token there can be), without and with the blocks kept;
* taking the answer from the kept blocks at the end, per event.

It prints each round and the answer's cost as a share of the parsing.  The shares, not the
nanoseconds, are the figure to read: they hold on a loaded machine, the nanoseconds do not.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_kimi.load.conversation import answer_bytes  # noqa: E402
from pytest_kimi.load.records import RequestRecord  # noqa: E402
from pytest_kimi.load.sse import StreamParser  # noqa: E402


def event(text: str) -> bytes:
    """One chat chunk shaped like SGLang's (id, created, model, one choice)."""
    obj = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "kimi-k2.6",
        "choices": [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        ],
    }
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=512, help="token events per stream")
    parser.add_argument("--rounds", type=int, default=3, help="rounds to print")
    args = parser.parse_args()
    n = args.events
    stream = [event(" word") for _ in range(n)] + [b"data: [DONE]\n\n"]

    def parse(keep: bool) -> RequestRecord:
        rec = RequestRecord(0, 0, 0.0)
        if keep:
            rec.blocks = []
        p = StreamParser(rec, "chat")
        for block in stream:
            p.feed(0.0, block)
        p.close()
        return rec

    def best(fn: object) -> float:
        return min(timeit.repeat(fn, number=20, repeat=5)) / 20  # type: ignore[arg-type]

    for _ in range(args.rounds):
        plain = best(lambda: parse(False))
        kept = best(lambda: parse(True))
        blocks = parse(True).blocks or []
        answer = best(lambda blocks=blocks: answer_bytes(blocks, "chat"))
        print(
            f"parse {plain / n * 1e9:.0f} ns/event, keeping the blocks {kept / n * 1e9:.0f} "
            f"ns/event, the answer at the end {answer / n * 1e9:.0f} ns/event "
            f"({answer / plain:.0%} of parsing)"
        )


if __name__ == "__main__":
    main()
