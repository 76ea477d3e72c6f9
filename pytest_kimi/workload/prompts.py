"""What to send: prompt sets and the request bodies built from them.

Bodies are JSON-encoded once per level, before any clock starts, so the load engine only
writes bytes.  Prompts come from a built-in set, an explicit list, a JSONL file, or are made
synthetically to a target length.

Cache policy: by default every request's prompt is unique within a run.  The user content
starts with a short lead, ``<15 decimal digits>-<run token> ``: the encoded body holds a
placeholder (:data:`UNIQUE_SLOT`) where the load runner writes each request's own scrambled
number (a bytes join per request, see :func:`pytest_kimi.load.request_ids.unique_id`), and the run
token (random per measurement) separates runs against a long-lived server.  A server's prefix
cache (SGLang's radix cache is on by default) then has nothing to share between requests:
with a handful of fixed prompts cycled, every request after the first pass would be a cache
hit, and ``input_tokens`` levels would measure cached prefill and a flattering TTFT.  The lead
is counted in the prompt's length, so ``input_tokens`` stays what was asked for.
``encode_bodies(..., unique=None)`` gives the old repeated bodies (for tests that want them).

Synthetic prompts (``input_tokens``) are sized with the server's tokenizer where it has one
(``POST /tokenize``: SGLang, vLLM), once per run and per length, so every variant is within a
few tokens of the asked count as the server counts it; elsewhere their length is an estimate
(about 1.3 tokens per word), which reports say.

Prompts files (``prompts="file.jsonl"``) come from the checkout: one is read only when it is a
regular file, within :data:`MAX_PROMPTS_FILE_BYTES`, and (named inside the rootdir) not a
symlink out of it (:func:`pytest_kimi.files.read_regular_bytes`); a prompt longer than
:data:`MAX_PROMPT_CHARS` is refused rather than sent whole.  ``--perf-allow-large`` lifts both
bounds, never the type checks.

Length ranges (``range_ratio=``, vLLM's ``--random-range-ratio``): :func:`draw_lengths` draws
each body's input and output length from vLLM's range around the level's, seeded, and a ranged
input level has one synthetic prompt per drawn length (:meth:`PromptSizer.synthetic` with
``lengths``), each sized as a fixed length is.
"""

from __future__ import annotations

import json
import math
import random
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from pytest_kimi.files import FileRefusedError, read_regular_bytes
from pytest_kimi.load.records import Api

API_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

BUILTIN_PROMPTS: dict[str, tuple[str, ...]] = {
    # The five prompts of the seeds' hand-made EP8/TP8 benchmarks: code, science, trivia,
    # poetry, parsing.  Under ignore_eos every one yields exactly max_tokens tokens.
    "diverse": (
        "Write a Python function that implements quicksort and explain its complexity.",
        "Explain the theory of relativity to a curious high-school student.",
        "What is 2+2?",
        "Write a haiku about a GPU cluster at night.",
        "Write a Python JSON parser that handles nested objects, arrays, strings and numbers.",
    ),
    "short": ("Say OK.",),
}

WORDS = (
    "throughput latency expert router batch token decode prefill cache kernel tensor "
    "pipeline shard memory bandwidth stream request server cluster model weight"
).split()

SYNTHETIC_VARIANTS = 16
"""Distinct synthetic prompt texts per level (their unique leads make every request distinct)."""

TOKENS_PER_WORD = 1.3
"""The estimate where the server cannot count: BPE vocabularies average about 1.3 tokens per
English word."""

UNIQUE_SLOT = "@" * 15
"""Where a request's unique id goes (15 characters, the width of
:func:`pytest_kimi.load.request_ids.unique_id`): JSON-encoded as is, and never produced by a word
list, so the runner finds it once per body."""
SAMPLE_ID = "173961102589771"
"""A representative unique id: what the tokenizer counts in place of the slot (any 15 digits
count alike, see :data:`pytest_kimi.load.request_ids.UNIQUE_ID_WIDTH`)."""
LEAD_TOKENS_ESTIMATE = 12
"""The lead ``<15 digits>-<8 hex> `` in tokens where no tokenizer counts it (5 to 15 for
the digits, by how the tokenizer groups them, and a few for the rest)."""
SIZE_TOLERANCE = 3
"""A sized prompt this many tokens from the asked count or closer counts as exact."""
PREFIX_SEPARATOR = "\n\n"
"""Between a shared prefix and the rest of a completions prompt (chat: a message boundary)."""


MAX_PROMPT_CHARS = 2**24
"""The longest prompt a prompts file or dataset entry may hold (16 Mi characters): eight
characters per token (English averages four) at a 2M-token context, the longest a served model
takes (:data:`pytest_kimi.workload.marker_bounds.MAX_CONTEXT_TOKENS`).  A longer one was a
100 MB line sent whole to the server.  ``--perf-allow-large`` lifts it."""
MAX_PROMPTS_FILE_BYTES = 2**30
"""The largest prompts file read (1 GiB, as a dataset: :data:`MAX_PROMPT_CHARS` x 64);
``--perf-allow-large`` lifts it."""
ALLOW_LARGE = "if you mean it, run with --perf-allow-large (or ini kimi_perf_allow_large = true)"
"""How the size bounds are lifted (:data:`pytest_kimi.workload.marker_bounds.ALLOW_LARGE_HINT`,
which this module cannot import: marker_bounds imports it)."""


RANGE_DRAWS = 128
"""Lengths drawn per level under ``range_ratio=``: the level's bodies are this many (each with
its own input and output length), cycled by its requests as a prompt set is.  Why a fixed
number and not one draw per request: every trial, and every run of one seed, then sends the
same lengths in the same order, so the baseline's trials and the rerun's compare like with
like; 128 uniform draws put the mean within about ``0.05 * r * L`` of ``L`` (one sigma) and
cost one tokenizer fit per input length, once a session."""


def length_bounds(value: int, ratio: float) -> tuple[int, int]:
    """The integers a ranged length is drawn from, as vLLM 0.32's ``get_sampling_params``
    (``vllm/benchmarks/datasets/utils.py``) computes them: ``[floor(L * (1 - r)),
    ceil(L * (1 + r))]``, both ends included, and at least 1.  (vLLM first subtracts the
    tokenizer's special tokens from an input length; a synthetic prompt here is sized as the
    server counts it, template included, so there is nothing to subtract.)"""
    if not 0 <= ratio < 1:
        raise ValueError(f"a range ratio is 0 <= r < 1, got {ratio!r}")
    low = max(1, math.floor(value * (1 - ratio)))
    high = max(low, math.ceil(value * (1 + ratio)))
    return low, high


def draw_lengths(
    value: int, ratio: float, count: int = RANGE_DRAWS, *, seed: int = 0, what: str = "output"
) -> tuple[int, ...]:
    """``count`` lengths drawn uniformly from :func:`length_bounds` (each integer equally
    likely, as vLLM's ``rng.integers(low, high + 1)``), the same for the same arguments in
    every run and process: a string seed (``random`` hashes it with SHA-512, whatever
    ``PYTHONHASHSEED`` says).  ``what`` (``input``/``output``) gives each its own stream.

    The distribution is vLLM's, not its draws: vLLM draws with numpy's generator from its own
    seed, and a prompt here has a different text anyway."""
    low, high = length_bounds(value, ratio)
    rng = random.Random(f"pytest-kimi range {what} seed={seed} L={value} r={ratio!r}")
    return tuple(rng.randint(low, high) for _ in range(count))


class WorkloadError(ValueError):
    """A prompt source that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class PromptSource:
    """Where prompts come from; ``key`` is how baselines and reports name it."""

    prompts: tuple[str, ...]
    key: str
    sizing: str | None = None
    """Synthetic prompts: how their length was set ("server tokenizer ..." or "estimate ...",
    shown in reports); None for given prompts."""
    lengths: tuple[int, ...] | None = None
    """A ranged level's drawn input length of each prompt (``range_ratio=``); None otherwise."""


def lead(run_token: str, slot: str = UNIQUE_SLOT) -> str:
    """The start of every user content: a request's unique id and the run's token."""
    return f"{slot}-{run_token} "


def builtin_names() -> list[str]:
    return sorted(BUILTIN_PROMPTS)


def synthetic_prompt(tokens: int, variant: int) -> str:
    """About ``tokens`` tokens of text (an estimate: :data:`TOKENS_PER_WORD`)."""
    return synthetic_words(max(1, round(tokens / TOKENS_PER_WORD)), variant)


def synthetic_words(n_words: int, variant: int) -> str:
    """``n_words`` words of variant ``variant`` (variants differ from their first word on)."""
    words = [f"Request {variant}:"]
    for i in range(n_words - 1):
        words.append(WORDS[(i * 7 + variant * 3) % len(WORDS)])
    return " ".join(words)


TokenCount = Callable[[str], int]
"""The server's token count of one user content (chat template included for the chat API)."""


class Tokenizer:
    """The server's tokenizer endpoint: ``POST /tokenize`` (SGLang also ``/v1/tokenize``).

    Both engines take ``{"model", "prompt"}`` or ``{"model", "messages"}`` and answer with the
    ``count`` (and ``tokens``) the generation endpoints would see: a ``messages`` request is
    rendered through the chat template as a chat completion would be.  Shapes:
    ``sglang/srt/entrypoints/http_server.py`` (``openai_v1_tokenize``), ``.../openai/protocol.py``
    (``TokenizeRequest``/``TokenizeResponse``), ``.../openai/serving_tokenize.py``; vLLM's
    ``/tokenize`` has the same request keys and ``count``.  Plain urllib, no proxy: called
    once per run and length, before any clock starts.
    """

    PATHS = ("/tokenize", "/v1/tokenize")

    def __init__(
        self, base_url: str, headers: dict[str, str], model: str, api: Api, timeout_s: float = 10.0
    ) -> None:
        self.base_url = base_url
        self.headers = {**headers, "Content-Type": "application/json"}
        self.model = model
        self.api = api
        self.timeout_s = timeout_s
        self.path: str | None = None
        self.unavailable: str | None = None
        """Why the server cannot count (None: it can, or it was not asked yet)."""
        self.calls = 0
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _body(self, text: str) -> dict[str, Any]:
        if self.api == "chat":
            return {"model": self.model, "messages": [{"role": "user", "content": text}]}
        return {"model": self.model, "prompt": text}

    def _post(self, path: str, text: str) -> tuple[int, Any]:
        data = json.dumps(self._body(text)).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, headers=self.headers, method="POST"
        )
        self.calls += 1
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return 0, str(getattr(exc, "reason", exc))

    @staticmethod
    def _count(answer: Any) -> int | None:
        if not isinstance(answer, dict):
            return None
        count = answer.get("count")
        if isinstance(count, list) and len(count) == 1:
            count = count[0]
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        tokens = answer.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    def available(self) -> bool:
        """Find the endpoint (once); False, with :attr:`unavailable` saying why, when none."""
        if self.path is not None:
            return True
        if self.unavailable is not None:
            return False
        seen = []
        for path in self.PATHS:
            status, answer = self._post(path, "Hello")
            if status == 200 and self._count(answer) is not None:
                self.path = path
                return True
            seen.append(f"{path}: " + (f"HTTP {status}" if status else f"no answer ({answer})"))
        self.unavailable = "the server has no usable tokenizer endpoint (" + "; ".join(seen) + ")"
        return False

    def count(self, text: str) -> int:
        """Tokens of ``text`` as the server counts this API's prompt."""
        if not self.available():
            raise WorkloadError(self.unavailable or "no tokenizer")
        assert self.path is not None
        status, answer = self._post(self.path, text)
        count = self._count(answer) if status == 200 else None
        if count is None:
            raise WorkloadError(
                f"{self.base_url}{self.path} answered HTTP {status} while sizing "
                f"prompts: {str(answer)[:200]}"
            )
        return count


def fit_words(
    target: int, count: Callable[[int], int], start: int, max_calls: int = 10
) -> tuple[int, int]:
    """(words, tokens): the word count whose text the server counts closest to ``target``.

    Secant steps from the estimate ``start``, then a word either side; about three calls.
    """
    seen: dict[int, int] = {}

    def at(n: int) -> int:
        n = max(1, n)
        if n not in seen:
            seen[n] = count(n)
        return seen[n]

    n = max(1, start)
    prev: tuple[int, int] | None = None
    for _ in range(max_calls - 2):
        c = at(n)
        if c == target:
            break
        if prev is not None and prev[0] != n and prev[1] != c:
            per_word = (c - prev[1]) / (n - prev[0])
        else:
            per_word = max(c, 1) / n
        per_word = max(per_word, 0.25)
        step = round((target - c) / per_word) or (1 if target > c else -1)
        prev = (n, c)
        nxt = max(1, n + step)
        if nxt in seen or nxt == n:
            break
        n = nxt
    best = min(seen, key=lambda k: (abs(seen[k] - target), k))
    for n in (best - 1, best + 1):
        if len(seen) < max_calls and n >= 1 and abs(seen[best] - target) > 0:
            at(n)
    best = min(seen, key=lambda k: (abs(seen[k] - target), k))
    return best, seen[best]


@dataclass(slots=True)
class PromptSizer:
    """Sizes synthetic prompts with a server's tokenizer, once per run and length.

    A measuring session holds one, so tests and levels that ask for the same length against
    the same endpoint reuse the first sizing (word counts per variant) instead of asking again.
    """

    _tokenizers: dict[tuple[str, str, str], Tokenizer] = field(default_factory=dict)
    _sized: dict[tuple[str, str, str, int, int], tuple[tuple[int, ...], tuple[int, ...], str]] = (
        field(default_factory=dict)
    )
    _sized_one: dict[tuple[str, str, str, int, int, int], tuple[int, int]] = field(
        default_factory=dict
    )
    """One variant sized to one length (a ranged level's prompts): (words, tokens counted)."""
    memo: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """Other sizings kept for the session, keyed by what and where they were sized: shared
    prefixes (:mod:`.prefix`), a dataset's token counts per hash (:mod:`.dataset`)."""

    def tokenizer(self, base_url: str, headers: dict[str, str], model: str, api: Api) -> Tokenizer:
        key = (base_url, model, api)
        if key not in self._tokenizers:
            self._tokenizers[key] = Tokenizer(base_url, headers, model, api)
        return self._tokenizers[key]

    def synthetic(
        self,
        tokens: int,
        *,
        base_url: str,
        headers: dict[str, str],
        model: str,
        api: Api,
        lead_text: str,
        lengths: Sequence[int] | None = None,
    ) -> tuple[tuple[str, ...], str]:
        """The variants' prompt texts (without the lead) and how they were sized.

        ``lead_text`` is what each request carries before the prompt; it is counted in with a
        sample id in its slot, so lead + prompt comes out at ``tokens``.  ``lengths``: a
        ranged level's drawn lengths instead: one prompt per length (variant ``k % 16`` for
        length ``k``), each fitted to its own count.
        """
        sample = lead_text.replace(UNIQUE_SLOT, SAMPLE_ID)
        if lengths is not None:
            return self._synthetic_lengths(
                lengths,
                self.tokenizer(base_url, headers, model, api),
                sample,
                (base_url, model, api),
            )
        key = (base_url, model, api, tokens, len(sample))
        if key not in self._sized:
            self._sized[key] = self._size(
                tokens, self.tokenizer(base_url, headers, model, api), sample
            )
        words, counts, how = self._sized[key]
        return tuple(synthetic_words(n, v) for v, n in enumerate(words)), how

    def _synthetic_lengths(
        self, lengths: Sequence[int], tok: Tokenizer, sample: str, where: tuple[str, str, str]
    ) -> tuple[tuple[str, ...], str]:
        """One prompt per drawn length.  Each fit starts from the words per token the previous
        one found (the synthetic text's count is close to linear in its words), so a length
        costs one or two tokenizer calls; each is kept for the session."""
        lead_estimate = LEAD_TOKENS_ESTIMATE if sample else 0
        if not lengths:
            return (), "no lengths"
        if not tok.available():
            estimated = tuple(
                synthetic_words(
                    max(1, round((n - lead_estimate) / TOKENS_PER_WORD)), k % SYNTHETIC_VARIANTS
                )
                for k, n in enumerate(lengths)
            )
            return estimated, (
                f"estimate at {TOKENS_PER_WORD} tokens per word ({min(lengths)}-{max(lengths)} "
                f"tokens drawn): {tok.unavailable}"
            )
        texts: list[str] = []
        off = 0
        words_per_token = 1 / TOKENS_PER_WORD
        for k, n in enumerate(lengths):
            v = k % SYNTHETIC_VARIANTS
            key = (*where, n, len(sample), v)
            if key not in self._sized_one:

                def count(w: int, v: int = v) -> int:
                    return tok.count(sample + synthetic_words(w, v))

                start = max(1, round(n * words_per_token))
                self._sized_one[key] = fit_words(n, count, start)
            words, counted = self._sized_one[key]
            if counted > 0:
                # the next fit starts where this one's words per token put it
                words_per_token = words / counted
            off = max(off, abs(counted - n))
            texts.append(synthetic_words(words, v))
        how = (
            f"server tokenizer ({tok.path}): {len(lengths)} drawn lengths {min(lengths)}-"
            f"{max(lengths)} tokens, each within {off}"
        )
        return tuple(texts), how

    @staticmethod
    def _size(
        tokens: int, tok: Tokenizer, sample: str
    ) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        lead_estimate = LEAD_TOKENS_ESTIMATE if sample else 0
        start = max(1, round((tokens - lead_estimate) / TOKENS_PER_WORD))
        if not tok.available():
            return (
                (start,) * SYNTHETIC_VARIANTS,
                (),
                f"estimate at {TOKENS_PER_WORD} tokens per word: {tok.unavailable}",
            )
        words, counts = [], []
        for v in range(SYNTHETIC_VARIANTS):

            def count(k: int, v: int = v) -> int:
                return tok.count(sample + synthetic_words(k, v))

            n, c = fit_words(tokens, count, start)
            words.append(n)
            counts.append(c)
            start = n  # the next variant needs about as many words
        off = max(abs(c - tokens) for c in counts)
        how = f"server tokenizer ({tok.path}): {min(counts)}-{max(counts)} tokens per variant" + (
            "" if off <= SIZE_TOLERANCE else f", {off} from the asked {tokens} at worst"
        )
        return tuple(words), tuple(counts), how


def check_prompt_size(text: str, where: str, what: str, *, allow_large: bool) -> None:
    """:class:`WorkloadError` when ``text`` is over :data:`MAX_PROMPT_CHARS` (unless
    ``allow_large``): its size, never its content."""
    if allow_large or len(text) <= MAX_PROMPT_CHARS:
        return
    raise WorkloadError(
        f"{where}: the {what} is {len(text)} characters, over the {MAX_PROMPT_CHARS} a prompt "
        f"may be (8 characters per token at a 2M-token context); {ALLOW_LARGE}"
    )


def read_input_file(
    path: Path, what: str, *, rootdir: Path | None, allow_large: bool, limit: int
) -> bytes:
    """A prompts file's or dataset's bytes (:func:`pytest_kimi.files.read_regular_bytes`),
    every refusal a :class:`WorkloadError` naming the path, its type and size (never its
    content) and the fix.  ``rootdir``: a path inside it must not leave it through a symlink."""
    try:
        return read_regular_bytes(
            path,
            what=what,
            limit=None if allow_large else limit,
            within=rootdir,
            lift=ALLOW_LARGE,
        )
    except FileNotFoundError:
        raise WorkloadError(f"{what} {path} does not exist") from None
    except FileRefusedError as exc:
        fix = (
            f"; to read a file outside the rootdir, give its own path in the marker "
            f"({exc.path.resolve()})"
            if exc.kind == "outside"
            else ""
        )
        raise WorkloadError(f"{exc}{fix}") from None
    except OSError as exc:
        raise WorkloadError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def load_jsonl(
    path: Path, *, rootdir: Path | None = None, allow_large: bool = False
) -> tuple[str, ...]:
    """Prompts from a JSONL file: each line a string or an object with ``prompt`` or ``text``.

    Read only as a bounded regular file (:func:`read_input_file`); ``rootdir``: where a
    relative ``prompts=`` was resolved, which a symlink must not leave."""
    data = read_input_file(
        path,
        "prompts file",
        rootdir=rootdir,
        allow_large=allow_large,
        limit=MAX_PROMPTS_FILE_BYTES,
    )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(
            f"prompts file {path}: not UTF-8 text (byte {exc.start}): save it as UTF-8"
        ) from None
    prompts: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if isinstance(obj, dict):
            obj = obj.get("prompt", obj.get("text"))
        if not isinstance(obj, str) or not obj:
            raise WorkloadError(
                f"{path}:{lineno}: expected a string or an object with a 'prompt' string"
            )
        check_prompt_size(obj, f"{path}:{lineno}", "prompt", allow_large=allow_large)
        prompts.append(obj)
    if not prompts:
        raise WorkloadError(f"prompts file {path} holds no prompts")
    return tuple(prompts)


class SizeFn(Protocol):
    """Sizes synthetic prompts (:meth:`PromptSizer.synthetic` bound to an endpoint): the
    variants of one length, or with ``lengths`` one prompt per drawn length."""

    def __call__(
        self, tokens: int, lengths: Sequence[int] | None = None
    ) -> tuple[tuple[str, ...], str]: ...


def resolve_prompts(
    prompts: str | Sequence[str] | None,
    input_tokens: int | None,
    rootdir: Path,
    *,
    size: SizeFn | None = None,
    lengths: Sequence[int] | None = None,
    allow_large: bool = False,
) -> PromptSource:
    """Turn the marker's ``prompts``/``input_tokens`` into concrete prompt texts.

    ``size``: sizes synthetic prompts (:meth:`PromptSizer.synthetic` bound to an endpoint);
    without it their length is an estimate.  ``lengths``: a ranged level's drawn input
    lengths (:meth:`~pytest_kimi.workload.workload_spec.Workload.input_lengths`): one synthetic
    prompt per length, in order, instead of the variants of ``input_tokens``.
    ``allow_large`` (``--perf-allow-large``): a prompts file's size bounds are lifted.
    """
    if input_tokens is not None and lengths is not None:
        if size is not None:
            texts, how = size(input_tokens, lengths=lengths)
        else:
            texts = tuple(
                synthetic_prompt(n, k % SYNTHETIC_VARIANTS) for k, n in enumerate(lengths)
            )
            how = f"estimate at {TOKENS_PER_WORD} tokens per word (no tokenizer asked)"
        return PromptSource(texts, f"synthetic:{input_tokens}", how, tuple(lengths))
    if input_tokens is not None:
        if size is not None:
            texts, how = size(input_tokens)
        else:
            texts = tuple(synthetic_prompt(input_tokens, v) for v in range(SYNTHETIC_VARIANTS))
            how = f"estimate at {TOKENS_PER_WORD} tokens per word (no tokenizer asked)"
        return PromptSource(texts, f"synthetic:{input_tokens}", how)
    if prompts is None:
        prompts = "diverse"
    if isinstance(prompts, str):
        if prompts in BUILTIN_PROMPTS:
            return PromptSource(BUILTIN_PROMPTS[prompts], f"builtin:{prompts}")
        path = Path(prompts)
        if not path.is_absolute():
            path = rootdir / path
        return PromptSource(
            load_jsonl(path, rootdir=rootdir, allow_large=allow_large), f"jsonl:{prompts}"
        )
    texts = tuple(prompts)
    return PromptSource(texts, f"list:{len(texts)}")


def request_body(
    prompt: str,
    *,
    model: str,
    api: Api,
    max_tokens: int,
    ignore_eos: bool,
    system: str | None = None,
) -> dict[str, Any]:
    """One OpenAI-compatible streaming request (``prompt``: the whole user content).

    ``ignore_eos`` is SGLang's (and vLLM's) top-level sampling extension: with it every request
    yields exactly ``max_tokens`` tokens, so levels and runs compare like with like.
    ``system``: a shared prefix (:mod:`pytest_kimi.workload.prefix`): a system message before the
    user's in the chat API, the start of the prompt (then a blank line) in the completions API.
    """
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if system is not None:
            body["messages"].insert(0, {"role": "system", "content": system})
    else:
        body["prompt"] = prompt if system is None else system + PREFIX_SEPARATOR + prompt
    body.update(
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def encode_bodies(
    source: PromptSource,
    *,
    model: str,
    api: Api,
    max_tokens: int,
    ignore_eos: bool,
    unique: str | None = None,
    prefixes: Sequence[str] | None = None,
) -> list[bytes]:
    """Pre-encode one body per prompt; the runner cycles through them.

    ``unique``: the run token; each prompt then starts with :func:`lead`, whose
    :data:`UNIQUE_SLOT` the runner fills per request.  None: the prompts as given (every
    pass over them repeats the same bodies, which a prefix cache serves).
    ``prefixes``: shared system prompts, dealt round robin: body ``k`` is prompt ``k % n``
    after prefix ``k % len(prefixes)``, ``max(n, len(prefixes))`` bodies in all (the lead
    stays at the start of the user content, after the shared part).
    """
    prompts = source.prompts
    count = len(prompts) if not prefixes else max(len(prompts), len(prefixes))
    out = []
    for k in range(count):
        p = prompts[k % len(prompts)]
        text = p if unique is None else lead(unique) + p
        system = prefixes[k % len(prefixes)] if prefixes else None
        raw = json.dumps(
            request_body(
                text,
                model=model,
                api=api,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
                system=system,
            ),
            separators=(",", ":"),
        ).encode()
        if unique is not None and raw.count(UNIQUE_SLOT.encode()) != 1:
            raise WorkloadError(
                f"the model name or a prompt contains {UNIQUE_SLOT!r}, which marks where each "
                "request's unique id goes: remove it from the prompt"
            )
        out.append(raw)
    return out
