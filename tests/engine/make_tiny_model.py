"""Make the tiny Llama the engine tests serve, locally and deterministically, in seconds.

Why a model of our own: CI here has no GPU and must not download anything, yet the plugin
has to be proven against a real engine with real continuous batching.  A random-weight
Llama with 4 layers and hidden size 256 is enough for that: vLLM's CPU build serves it at
about a hundred tok/s per stream, and batches it for real.  What it says is noise, which
is fine, because every measurement runs with ``ignore_eos`` and a fixed ``max_tokens``.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on Python's own standard
library sources (always on disk, same bytes for the same Python), with a chat template, so
both ``/v1/completions`` and ``/v1/chat/completions`` work.  Weights come from a seeded
``torch`` generator.  The result is cached under ``~/.cache/pytest-kimi/models/<key>``,
where the key hashes this script and the library versions, and linked into the output
directory; a missing or broken cache is simply rebuilt.

    python tests/engine/make_tiny_model.py .kimi/models/tiny-llama
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

SEED = 20261129
VOCAB_SIZE = 4096
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 4
INTERMEDIATE = 688
MAX_POSITIONS = 2048
CORPUS_BYTES = 6_000_000
"""Enough stdlib text for a 4k-token BPE; more only makes training slower."""

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MARKER = ".complete"
"""Written last: a cache entry without it was interrupted and is rebuilt."""


def corpus_files() -> list[Path]:
    """Standard-library sources in a fixed order, up to CORPUS_BYTES."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        size = path.stat().st_size
        if total + size > CORPUS_BYTES:
            continue
        files.append(path)
        total += size
    if not files:
        raise SystemExit(f"no Python sources under {root} to train the tokenizer on")
    return files


def build_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # digits one by one, as Llama 2, Qwen and Gemma split them (Llama 3 and Kimi's tiktoken:
    # groups of three): a number's token count is then its length, whatever its digits, which
    # is what lets the plugin's decimal request ids keep every prompt at its sized length
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(p) for p in corpus_files()], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL[0], eos_token=SPECIAL[1], pad_token=SPECIAL[2],
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return tok.get_vocab_size()


def build_model(out: Path, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        tie_word_embeddings=False, torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}, indent=2) + "\n")


def cache_key() -> str:
    import tokenizers
    import torch
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in (sys.version.split()[0], torch.__version__, transformers.__version__,
                 tokenizers.__version__):
        h.update(part.encode())
    return h.hexdigest()[:16]


def make(dest: Path, cache_root: Path | None) -> Path:
    """Build (or reuse from the cache) and put the model at ``dest``; returns the real dir."""
    started = time.perf_counter()
    key = cache_key()
    cached = cache_root / f"tiny-llama-{key}" if cache_root else None
    if cached is not None and (cached / MARKER).exists():
        source = cached
        how = f"cached {cached}"
    else:
        parent = cache_root or dest.parent
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=parent))
        try:
            vocab = build_tokenizer(tmp)
            build_model(tmp, vocab)
            (tmp / MARKER).write_text(key + "\n")
            source = cached or dest.with_name(dest.name + f"-{key}")
            if source.exists():
                shutil.rmtree(source)
            os.replace(tmp, source)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        how = f"built {source} in {time.perf_counter() - started:.1f} s"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.symlink_to(source.resolve(), target_is_directory=True)
    print(f"tiny model at {dest} ({how})")
    return source


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-kimi" / "models"


def ensure(repo: Path) -> Path:
    """The tiny model the engine and SGLang tests serve: ``KIMI_TINY_MODEL`` where it names
    one, else made (or taken from the cache) at ``repo/.kimi/models/tiny-llama``, and
    ``KIMI_TINY_MODEL`` set to it, which the server profiles read."""
    configured = os.environ.get("KIMI_TINY_MODEL")
    if configured and (Path(configured) / "config.json").exists():
        return Path(configured)
    dest = repo / ".kimi" / "models" / "tiny-llama"
    make(dest, default_cache_dir())
    os.environ["KIMI_TINY_MODEL"] = str(dest.resolve())
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="where the model directory (a link) goes")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir(),
                        help="cache across runs (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="build afresh, cache nothing")
    args = parser.parse_args(argv)
    make(args.dest, None if args.no_cache else args.cache_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
