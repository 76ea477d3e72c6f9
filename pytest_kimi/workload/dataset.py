"""Datasets: replay a file of real (or realistic) prompts, each with its own output length.

Why a dataset and not ``input_tokens``: production traffic is a mix of short and long prompts
and answers, and a server's throughput under that mix (batch slots freed at random moments,
prefills of every size interleaved with decodes) is not the throughput at one fixed length.
A dataset run replays the mix, and keeps runs comparable the way fixed lengths do: every
request's ``max_tokens`` is its entry's output length (capped by the level's ``max_tokens``)
and is sent with ``ignore_eos``, so a run produces exactly the same tokens whatever the model
would have said.

Formats (chosen by the file name: ``.jsonl``/``.ndjson`` is JSON Lines, anything else one JSON
document):

* **ShareGPT** (a JSON array, as ``ShareGPT_V3_unfiltered_cleaned_split.json``): each entry has
  ``conversations``, a list of turns ``{"from": "human" | "gpt", "value": text}``.  The first
  human turn is the prompt, the first gpt turn after it is the answer whose length, in tokens,
  becomes the output length.  Entries without such a pair are skipped and counted.
* **JSONL**: one object per line with ``prompt`` and optionally ``output_tokens`` (the output
  length; without it the level's ``max_tokens``) and ``input_tokens`` (the prompt's length as
  the file's author counted it: checked against the server's tokenizer and reported when they
  disagree, which means the file was made for another tokenizer).  A line may also be one
  ShareGPT entry (``{"conversations": [...]}``).

ShareGPT answers are text, so their length must be counted in tokens: with the server's own
tokenizer where it has one (``POST /tokenize`` with ``add_special_tokens: false``: SGLang's
``TokenizeRequest`` and vLLM's ``TokenizeCompletionRequest`` both take it; SGLang also counts a
list of prompts in one call, which is tried first), once per dataset and tokenizer (the
counts are kept per dataset hash, endpoint and model for the session); elsewhere the length is
an **estimate** at :data:`CHARS_PER_TOKEN` characters per token, which the reports say and the
baseline key records (``:est``), since an estimate and a count are different workloads.

Sampling is seeded (the marker's ``seed``): ``num_prompts`` entries drawn without replacement
in a fixed pseudo-random order, so every trial, level and run sends the same requests in the
same order.  The baseline key holds the first :data:`HASH_CHARS` hex digits of the file's
SHA-256, the sample size and the seed: an edited dataset is a new workload, whatever its name.

A dataset file comes from the checkout or a path a marker names, and is read only when it is a
regular file within :data:`MAX_DATASET_BYTES` that (named inside the rootdir) does not leave it
through a symlink (:func:`pytest_kimi.workload.prompts.read_input_file`): a ``dataset=``
symlinked to ``/dev/zero`` read until ``MemoryError``.  A prompt or answer longer than
:data:`~pytest_kimi.workload.prompts.MAX_PROMPT_CHARS` is refused, not sent whole, and an error
about an entry says what a wrong value is (``a string of 40 characters``), never the value.
``--perf-allow-large`` lifts the size bounds, never the type checks.

Nothing here imports pytest.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_kimi.files import described
from pytest_kimi.wire import DatasetSection
from pytest_kimi.workload.prompts import (
    Tokenizer,
    WorkloadError,
    check_prompt_size,
    read_input_file,
)

BUILTIN_PREFIX = "builtin:"
BUILTIN_DATASETS: dict[str, str] = {"sharegpt-small": "sharegpt_small.json"}
"""Datasets shipped with the plugin (``pytest_kimi/data/``): synthetic text made by
``tests/data/make_sharegpt_small.py``, for tests and examples; nothing is downloaded."""
DATA_DIR = Path(__file__).resolve().parent.parent / "data"

DEFAULT_NUM_PROMPTS = 1000
"""Entries a dataset run samples when the marker gives no ``num_prompts`` (fewer when the file
has fewer), as ``vllm bench serve`` does: a trial replays the sample once, so its cost is about
``num_prompts`` x the mean output length in tokens."""
CHARS_PER_TOKEN = 4.0
"""The estimate where the server cannot count: English BPE text averages about four characters
per token."""
HASH_CHARS = 12
"""Hex digits of the file's SHA-256 in the baseline key (48 bits: no accidental collisions)."""
COUNT_BATCH = 64
"""Texts per ``/tokenize`` call where the server counts a list at once (SGLang, the simulator)."""
MAX_DATASET_BYTES = 2**30
"""The largest dataset file read (1 GiB): ``ShareGPT_V3_unfiltered_cleaned_split.json``, the
largest file benchmark clients replay, is 642 MiB.  Parsed, a file takes several times its size
in memory.  ``--perf-allow-large`` lifts it."""
INPUT_CHECK_TOLERANCE = 0.10
"""A dataset's ``input_tokens`` more than this far (median relative difference) from the
server's count were made with another tokenizer: the reports say so."""

HUMAN_ROLES = frozenset({"human", "user"})
GPT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "model"})

SHAREGPT_SHAPE = (
    '[{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}, ...]'
)


class DatasetError(WorkloadError):
    """A dataset that cannot be used; the message names the file, the entry and the fix."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One usable entry: a prompt and what the file says about its output."""

    index: int
    """Position among the file's usable entries (the key of its cached token counts)."""
    prompt: str
    where: str
    """``file.json[17]`` or ``file.jsonl:18``: where an error or a note points."""
    output_text: str | None = None
    """ShareGPT: the answer, whose token count is the output length."""
    output_tokens: int | None = None
    """JSONL: the output length as given (None: the level's ``max_tokens``)."""
    input_tokens: int | None = None
    """JSONL: the prompt's length as the file's author counted it (checked, never sent)."""


@dataclass(frozen=True, slots=True)
class Dataset:
    """A parsed dataset file."""

    name: str
    """As the marker gave it (a path or ``builtin:NAME``)."""
    path: Path
    sha256: str
    format: str
    """``sharegpt`` or ``jsonl``."""
    entries: tuple[Entry, ...]
    skipped: int = 0
    """Entries without a usable prompt/answer pair (ShareGPT has many: single turns, empty
    answers)."""
    skip_example: str | None = None
    allow_large: bool = False
    """Read with ``--perf-allow-large`` (its entries were not held to the size bounds)."""

    @property
    def short_hash(self) -> str:
        return self.sha256[:HASH_CHARS]


def resolve_path(name: str, rootdir: Path) -> Path:
    """``builtin:NAME`` -> the shipped file; a relative path -> under the rootdir (like
    ``prompts=`` files), so it names the same file from any working directory."""
    if name.startswith(BUILTIN_PREFIX):
        key = name[len(BUILTIN_PREFIX) :]
        if key not in BUILTIN_DATASETS:
            raise DatasetError(
                f"dataset={name!r}: no such built-in dataset; built-in: "
                + ", ".join(BUILTIN_PREFIX + k for k in sorted(BUILTIN_DATASETS))
            )
        return DATA_DIR / BUILTIN_DATASETS[key]
    path = Path(name).expanduser()
    return path if path.is_absolute() else rootdir / path


_CACHE: dict[tuple[str, int, int], Dataset] = {}
"""Parsed files by (path, mtime, size): a session's tests share one parse of a big file."""


def load_dataset(name: str, rootdir: Path, *, allow_large: bool = False) -> Dataset:
    """Read, hash and parse a dataset file; :class:`DatasetError` says what is wrong where.

    Read only as a bounded regular file that a symlink does not take out of the rootdir (or,
    built in, out of the plugin's data); ``allow_large`` (``--perf-allow-large``) lifts the
    size bounds (:data:`MAX_DATASET_BYTES`, the prompt's)."""
    path = resolve_path(name, rootdir)
    within = DATA_DIR if name.startswith(BUILTIN_PREFIX) else rootdir
    if not os.path.lexists(path):
        raise DatasetError(
            f"dataset file {path} does not exist"
            + ("" if Path(name).is_absolute() else f" (dataset={name!r}, from the rootdir)")
        )
    try:
        stat = path.stat()
    except OSError:
        stat = None  # a dangling symlink, say: the read below says what it is
    if stat is not None:
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        cached = _CACHE.get(key)
        if cached is not None and cached.name == name and allow_large >= cached.allow_large:
            return cached
    try:
        data = read_input_file(
            path, "dataset file", rootdir=within, allow_large=allow_large, limit=MAX_DATASET_BYTES
        )
    except WorkloadError as exc:
        raise DatasetError(str(exc)) from None
    sha = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        fmt, (entries, skipped, example) = "jsonl", parse_jsonl(text, path.name)
    else:
        fmt, (entries, skipped, example) = "sharegpt", parse_sharegpt(text, path.name)
    if not entries:
        why = f" ({skipped} skipped, e.g. {example})" if skipped else ""
        raise DatasetError(f"{path}: no usable entries{why}")
    _check_sizes(entries, allow_large)
    dataset = Dataset(name, path, sha, fmt, tuple(entries), skipped, example, allow_large)
    if stat is not None:
        _CACHE[key] = dataset
    return dataset


def _check_sizes(entries: Sequence[Entry], allow_large: bool) -> None:
    """Every prompt and answer within :data:`~pytest_kimi.workload.prompts.MAX_PROMPT_CHARS`:
    a prompt is sent whole, and an answer is sent to be counted."""
    try:
        for e in entries:
            check_prompt_size(e.prompt, e.where, "prompt", allow_large=allow_large)
            if e.output_text is not None:
                check_prompt_size(e.output_text, e.where, "answer", allow_large=allow_large)
    except WorkloadError as exc:
        raise DatasetError(str(exc)) from None


Parsed = tuple[list[Entry], int, str | None]


def parse_sharegpt(text: str, name: str) -> Parsed:
    """A ShareGPT JSON array: (usable entries, skipped count, an example of a skip)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); a file "
            "with one JSON object per line must be named *.jsonl"
        ) from None
    if not isinstance(doc, list):
        raise DatasetError(
            f"{name}: expected a JSON array of ShareGPT conversations, {SHAREGPT_SHAPE}, "
            f"got a JSON {type(doc).__name__}"
        )
    entries: list[Entry] = []
    skipped = 0
    example: str | None = None
    for i, item in enumerate(doc):
        where = f"{name}[{i}]"
        if not isinstance(item, Mapping):
            raise DatasetError(
                f"{where}: expected an object with 'conversations', got {_shown(item)}"
            )
        pair = sharegpt_pair(item, where)
        if isinstance(pair, str):
            skipped += 1
            example = example or f"{where}: {pair}"
            continue
        entries.append(Entry(len(entries), pair[0], where, output_text=pair[1]))
    return entries, skipped, example


def sharegpt_pair(item: Mapping[str, Any], where: str) -> tuple[str, str] | str:
    """(prompt, answer) of one ShareGPT entry, or why it has none (a skip, not an error).

    Malformed structure is an error (the file is not ShareGPT); a conversation that simply
    lacks a human turn followed by a gpt turn, or has empty text, is skipped, as benchmark
    clients do with the real ShareGPT files."""
    turns = item.get("conversations", item.get("conversation"))
    if not isinstance(turns, list):
        raise DatasetError(
            f"{where}: expected 'conversations', a list of turns like "
            f'{{"from": "human", "value": "..."}}, got {_shown(turns)}'
        )
    prompt: str | None = None
    for j, turn in enumerate(turns):
        role, value = _turn(turn)
        if role is None or value is None:
            raise DatasetError(
                f"{where}.conversations[{j}]: expected an object with string 'from' and "
                f"'value' (or 'role' and 'content'), got {_shown(turn)}"
            )
        role = role.lower()
        if prompt is None and role in HUMAN_ROLES:
            if not value.strip():
                return "its first human turn is empty"
            prompt = value
        elif prompt is not None and role in GPT_ROLES:
            if not value.strip():
                return "its first gpt turn is empty"
            return prompt, value
    return "no human turn" if prompt is None else "no gpt turn after the first human turn"


def _turn(turn: Any) -> tuple[str | None, str | None]:
    if not isinstance(turn, Mapping):
        return None, None
    role = turn.get("from", turn.get("role"))
    value = turn.get("value", turn.get("content"))
    return (
        role if isinstance(role, str) else None,
        value if isinstance(value, str) else None,
    )


def parse_jsonl(text: str, name: str) -> Parsed:
    """JSON Lines: ``{"prompt", "output_tokens"?, "input_tokens"?}`` or a ShareGPT entry."""
    entries: list[Entry] = []
    skipped = 0
    example: str | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, Mapping):
            raise DatasetError(
                f'{where}: expected an object like {{"prompt": "...", "output_tokens": 128}}, '
                f"got {_shown(obj)}"
            )
        if "prompt" not in obj and ("conversations" in obj or "conversation" in obj):
            pair = sharegpt_pair(obj, where)
            if isinstance(pair, str):
                skipped += 1
                example = example or f"{where}: {pair}"
                continue
            entries.append(Entry(len(entries), pair[0], where, output_text=pair[1]))
            continue
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(
                f"{where}: expected a non-empty string 'prompt', got {_shown(prompt)} (a "
                "ShareGPT entry per line needs 'conversations')"
            )
        entries.append(
            Entry(
                len(entries),
                prompt,
                where,
                output_tokens=_count_field(obj, "output_tokens", where),
                input_tokens=_count_field(obj, "input_tokens", where),
            )
        )
    return entries, skipped, example


def _count_field(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DatasetError(f"{where}: '{key}' must be an integer >= 1, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """What a wrong value is (``a string of 40 characters``), never its text: the file may be a
    symlink to something that is not a dataset (:func:`pytest_kimi.files.described`)."""
    return "nothing" if value is None else described(value)


def sample_entries(dataset: Dataset, num_prompts: int | None, seed: int) -> tuple[Entry, ...]:
    """``num_prompts`` entries (default: all, up to :data:`DEFAULT_NUM_PROMPTS`) in a seeded
    order, without replacement: the same seed gives the same requests in the same order, and
    the counts of a smaller sample serve a bigger one."""
    n = len(dataset.entries)
    k = min(n, DEFAULT_NUM_PROMPTS) if num_prompts is None else num_prompts
    if k > n:
        skipped = (
            f" ({dataset.skipped} entries skipped, e.g. {dataset.skip_example})"
            if dataset.skipped
            else ""
        )
        raise DatasetError(
            f"num_prompts={k}, but {dataset.path.name} has {n} usable entries{skipped}: ask for "
            f"at most {n}"
        )
    order = list(range(n))
    random.Random(f"pytest-kimi-dataset/{seed}").shuffle(order)
    # a prefix of one seeded permutation: a bigger sample starts with the smaller one
    return tuple(dataset.entries[i] for i in order[:k])


class TextTokenizer(Tokenizer):
    """The server's count of plain text: no chat template, no BOS (``add_special_tokens``
    false), which is what an answer's length in tokens is."""

    def __init__(self, base_url: str, headers: dict[str, str], model: str) -> None:
        super().__init__(base_url, headers, model, "completions")
        self.batch: bool | None = None
        """Whether the server counts a list of prompts in one call (None: not tried yet)."""

    def _body(self, text: str) -> dict[str, Any]:
        return {"model": self.model, "prompt": text, "add_special_tokens": False}

    def _post_batch(self, texts: Sequence[str]) -> list[int] | None:
        assert self.path is not None
        body = {"model": self.model, "prompt": list(texts), "add_special_tokens": False}
        req = urllib.request.Request(
            self.base_url + self.path,
            data=json.dumps(body).encode(),
            headers=self.headers,
            method="POST",
        )
        self.calls += 1
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                answer = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        if (
            isinstance(count, list)
            and len(count) == len(texts)
            and all(isinstance(c, int) and not isinstance(c, bool) for c in count)
        ):
            return list(count)
        return None

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Each text's count: in lists of :data:`COUNT_BATCH` where the server takes them
        (SGLang), else one call per text (vLLM's ``/tokenize`` takes one prompt)."""
        if not self.available():
            raise WorkloadError(self.unavailable or "no tokenizer")
        out: list[int] = []
        for at in range(0, len(texts), COUNT_BATCH):
            chunk = texts[at : at + COUNT_BATCH]
            counted = (
                self._post_batch(chunk) if self.batch is not False and len(chunk) > 1 else None
            )
            if counted is None:
                if len(chunk) > 1:
                    self.batch = False
                counted = [self.count(t) for t in chunk]
            else:
                self.batch = True
            out.extend(counted)
        return out


Memo = dict[tuple[Any, ...], Any]
"""The session's store of sizings (:attr:`~pytest_kimi.workload.prompts.PromptSizer.memo`)."""


def counted(
    texts: Mapping[int, str], tokenizer: TextTokenizer, memo: Memo, key: tuple[Any, ...]
) -> dict[int, int]:
    """Token counts of ``texts`` (by entry index), asking the server only for the ones not
    counted before under ``key`` (dataset hash, endpoint, model, what)."""
    known: dict[int, int] = memo.setdefault(key, {})
    missing = [i for i in texts if i not in known]
    if missing:
        for i, n in zip(missing, tokenizer.count_many([texts[i] for i in missing])):
            known[i] = n
    return {i: known[i] for i in texts}


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` at :data:`CHARS_PER_TOKEN` characters a token (at least 1)."""
    return max(1, round(len(text) / CHARS_PER_TOKEN))


@dataclass(frozen=True, slots=True)
class DatasetSample:
    """What a dataset run sends: the sampled prompts and their output lengths in tokens."""

    dataset: Dataset
    entries: tuple[Entry, ...]
    seed: int
    output_tokens: tuple[int, ...]
    """Per entry; 0 where the file gives none (the level's ``max_tokens`` is used)."""
    lengths: str
    """How the output lengths were obtained (shown in reports)."""
    estimated: bool = False
    input_check: str | None = None
    """What the check of the file's ``input_tokens`` found (None: the file has none)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Notes every level of the run carries (estimates, input_tokens that disagree)."""

    @property
    def prompts(self) -> tuple[str, ...]:
        return tuple(e.prompt for e in self.entries)

    @property
    def key(self) -> str:
        """The ``prompts`` part of the baseline key: content hash, sample size and seed, and
        ``:est`` when the output lengths are estimates rather than the server's counts."""
        key = f"dataset:{self.dataset.short_hash}:n={len(self.entries)}:seed={self.seed}"
        return key + (":est" if self.estimated else "")

    def lengths_for(self, max_tokens: int) -> list[int]:
        """Each request's ``max_tokens`` at a level: its own length, capped by the level's."""
        return [min(n, max_tokens) if n else max_tokens for n in self.output_tokens]

    def summary(self, max_tokens: int) -> DatasetSection:
        """The level's ``dataset`` entry in the JSON report (the output lengths at its cap)."""
        lengths = self.lengths_for(max_tokens)
        return {
            "name": self.dataset.name,
            "file": self.dataset.path.name,
            "sha256": self.dataset.sha256,
            "format": self.dataset.format,
            "entries": len(self.dataset.entries),
            "skipped": self.dataset.skipped,
            "sampled": len(self.entries),
            "seed": self.seed,
            "output_tokens": self.lengths,
            "estimated": self.estimated,
            "output_tokens_mean": round(statistics.fmean(lengths), 1),
            "output_tokens_min": min(lengths),
            "output_tokens_max": max(lengths),
            "capped": sum(1 for n in self.output_tokens if n > max_tokens),
            "input_check": self.input_check,
        }


def prepare_dataset(
    name: str,
    *,
    rootdir: Path,
    num_prompts: int | None,
    seed: int,
    tokenizer: TextTokenizer | None,
    memo: Memo | None = None,
    endpoint_key: tuple[str, str] = ("", ""),
    allow_large: bool = False,
) -> DatasetSample:
    """Load, sample and measure a dataset: everything a run needs before any clock starts.

    ``tokenizer``: the server's (None: estimates only); ``memo``/``endpoint_key`` (base URL,
    model): where counts are kept for the session, so each answer is counted once.
    ``allow_large``: ``--perf-allow-large`` (the file's size bounds are lifted).
    """
    dataset = load_dataset(name, rootdir, allow_large=allow_large)
    entries = sample_entries(dataset, num_prompts, seed)
    memo = {} if memo is None else memo
    notes: list[str] = []
    texts = {e.index: e.output_text for e in entries if e.output_text is not None}
    why = _cannot_count(tokenizer)
    counts: dict[int, int] = {}
    estimated = False
    if not texts:
        lengths = "from the file (output_tokens)"
    elif why is None:
        assert tokenizer is not None
        key = ("dataset-output", dataset.sha256, *endpoint_key)
        counts = counted(texts, tokenizer, memo, key)
        lengths = f"answers counted by the server's tokenizer ({tokenizer.path})"
    else:
        counts = {i: estimate_tokens(t) for i, t in texts.items()}
        estimated = True
        lengths = f"estimate at {CHARS_PER_TOKEN:g} characters per token: {why}"
        notes.append(f"dataset output lengths are an {lengths}")
    output = tuple(
        max(1, counts[e.index]) if e.index in counts else (e.output_tokens or 0) for e in entries
    )
    input_check = _check_inputs(entries, tokenizer, why, memo, (dataset.sha256, *endpoint_key))
    if input_check is not None and input_check.startswith("the dataset's input_tokens"):
        notes.append(input_check)
    return DatasetSample(
        dataset, entries, seed, output, lengths, estimated, input_check, tuple(notes)
    )


def _cannot_count(tokenizer: TextTokenizer | None) -> str | None:
    if tokenizer is None:
        return "no tokenizer asked"
    if not tokenizer.available():
        return tokenizer.unavailable or "no tokenizer endpoint"
    return None


def _check_inputs(
    entries: Sequence[Entry],
    tokenizer: TextTokenizer | None,
    why: str | None,
    memo: Memo,
    key: tuple[Any, ...],
) -> str | None:
    """The file's ``input_tokens`` against the server's count of the same prompts."""
    given = {e.index: e for e in entries if e.input_tokens is not None}
    if not given:
        return None
    if why is not None:
        return f"input_tokens not checked: {why}"
    assert tokenizer is not None
    counts = counted(
        {i: e.prompt for i, e in given.items()}, tokenizer, memo, ("dataset-input", *key)
    )
    off = {
        i: abs(counts[i] - e.input_tokens) / e.input_tokens
        for i, e in given.items()
        if e.input_tokens
    }
    median = statistics.median(off.values())
    worst = max(off, key=lambda i: off[i])
    w = given[worst]
    detail = f"{median:.0%} median, worst {w.where}: {w.input_tokens} in the file, {counts[worst]} counted"
    if median > INPUT_CHECK_TOLERANCE:
        return (
            f"the dataset's input_tokens differ from the server tokenizer's count ({detail}): "
            "the file was tokenized for another model; its prompts are sent as they are"
        )
    return f"input_tokens agree with the server's tokenizer ({detail})"
