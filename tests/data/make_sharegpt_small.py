"""Make ``pytest_kimi/data/sharegpt_small.json``: a small ShareGPT-format dataset of synthetic text.

Why synthetic: the plugin's tests and examples need a dataset that ships with it (no download at
run time) and that anyone may redistribute; the real ShareGPT files are large and scraped.  The
text here is made up from a fixed vocabulary by a seeded generator, with lengths spread the way
chat traffic spreads (log-uniform: many short prompts and answers, a long tail of long ones),
a few multi-turn conversations (only the first human/gpt pair is used) and a little non-ASCII
text.  The words mean nothing; only the shape and the lengths matter to a throughput test.

Run ``python tests/data/make_sharegpt_small.py`` to rewrite the file; the output is the same
bytes every time (``tests/plugin/test_dataset.py`` checks that the shipped file is this script's).
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "pytest_kimi" / "data" / "sharegpt_small.json"
CONVERSATIONS = 128
SEED = 20240615

TOPICS = (
    "the deployment",
    "a batch scheduler",
    "the cache",
    "an expert router",
    "the tokenizer",
    "a training run",
    "the dashboard",
    "a load test",
    "the database index",
    "a network link",
    "the release notes",
    "a sorting routine",
    "the garden",
    "a recipe",
    "the bicycle",
    "a travel plan",
)
ASKS = (
    "Explain how {t} works and what can go wrong with it.",
    "Write a short summary of {t} for a new colleague.",
    "Why does {t} slow down when many users arrive at once?",
    "Compare two ways to configure {t} and recommend one.",
    "List the steps to debug {t} after a failed upgrade.",
    "Write a Python function that models {t}, with comments.",
    "What questions should I ask before changing {t}?",
    "Draft an email that announces a change to {t}.",
)
WORDS = (
    "the a of to and in that is for on with as it by at from this be are was or an not which "
    "request token batch queue memory latency throughput server client cache prefix decode "
    "prefill kernel step stream model weight layer expert router shard replica node rack "
    "budget window sample median trial baseline change measure figure value limit target "
    "first next last every each several most few more less quickly slowly carefully often "
    "because although while until unless after before when where how why what then also "
    "system user answer question example detail reason result error warning note table "
    "simple short long large small fast slow busy idle warm cold steady noisy stable"
).split()
RARE = ("café", "naïve", "über", "résumé", "日本語", "façade", "jalapeño", "Zürich")


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(RARE) if rng.random() < 0.01 else rng.choice(WORDS) for _ in range(n)]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice((".", ".", ".", "?", "!"))


def text(rng: random.Random, n_words: int) -> str:
    """About ``n_words`` words in sentences of 4-18 words, in paragraphs of a few sentences."""
    out: list[str] = []
    left = n_words
    paragraph: list[str] = []
    while left > 0:
        n = min(left, rng.randint(4, 18))
        paragraph.append(sentence(rng, n))
        left -= n
        if len(paragraph) >= rng.randint(2, 5):
            out.append(" ".join(paragraph))
            paragraph = []
    if paragraph:
        out.append(" ".join(paragraph))
    return "\n\n".join(out)


def prompt(rng: random.Random) -> str:
    ask = rng.choice(ASKS).format(t=rng.choice(TOPICS))
    extra = log_uniform(rng, 1, 250)
    return ask if extra < 4 else ask + "\n\n" + text(rng, extra)


def conversation(rng: random.Random, i: int) -> dict[str, object]:
    turns = []
    for _ in range(2 if rng.random() < 0.15 else 1):
        turns.append({"from": "human", "value": prompt(rng)})
        turns.append({"from": "gpt", "value": text(rng, log_uniform(rng, 2, 600))})
    return {"id": f"synthetic-{i:04d}", "conversations": turns}


def make() -> bytes:
    rng = random.Random(SEED)
    data = [conversation(rng, i) for i in range(CONVERSATIONS)]
    return (json.dumps(data, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(make())
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {CONVERSATIONS} conversations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
