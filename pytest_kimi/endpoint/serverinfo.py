"""What a server says about itself, let in by an allow-list where it enters the plugin.

Baselines (committed to git), reports, the history and the provenance diff all read
``server_info``.  SGLang 0.5.23's ``/server_info`` (``sglang/srt/entrypoints/http_server.py``,
built by ``build_server_info`` in ``sglang/srt/utils/common.py``) returns every resolved
server argument plus

* ``api_key`` / ``admin_api_key`` in clear, and ``launch_command``: the launcher's argv
  joined by single spaces (``sglang/srt/server_args.py`` ``prepare_server_args``), with
  ``--api-key VALUE`` verbatim and the ``--port`` the plugin picked at random;
* ``startup_time`` (seconds spent loading weights, allocating KV cache, capturing CUDA
  graphs: ``sglang/srt/observability/startup_time.py``), ``internal_states`` (live scheduler
  state per DP rank), ``status``: different on every launch of the same configuration.

A server behind a proxy or a deployment tool reports whatever else it was given (PEM keys,
webhook URLs, tokens per provider).  A deny-list of secret names cannot keep up with that, so
:func:`clean_server_info`, the one door, keeps only what a provenance diff needs: the fields
:data:`PROVENANCE_SERVER_INFO` names (engine, version, model, and the server arguments that
change throughput), with ``launch_command`` parsed into its flags and filtered by the same
list.  What changes at every start (:data:`VOLATILE_SERVER_INFO`: ports, hosts, pids,
timestamps, live statistics) is not stored at all.  Everything else is dropped; a digest of
the dropped rest (``unlisted: "12 settings, sha256:..."``) keeps "something else changed"
visible in the diff without storing any of it.  What is kept still goes through the scrubber
(:mod:`pytest_kimi.scrub`), by name and by shape.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_kimi.scrub import scrub, scrub_argv

__all__ = [
    "PROVENANCE_SERVER_INFO",
    "UNLISTED_KEY",
    "VOLATILE_SERVER_INFO",
    "clean_server_info",
    "is_provenance_field",
    "is_volatile",
    "parse_launch_command",
]

PROVENANCE_SERVER_INFO: tuple[str, ...] = (
    # what runs: the engine, its version, the model, how its weights and prompts are read
    "engine",
    "version",
    "model",
    "model_path",
    "model_impl",
    "revision",
    "served_model_name",
    "tokenizer",
    "tokenizer_path",
    "tokenizer_mode",
    "skip_tokenizer_init",
    "trust_remote_code",
    "load_format",
    "dtype",
    "quantization",
    "quantization_*",
    "kv_cache_dtype",
    "context_length",
    "max_model_len",
    "chat_template",
    "reasoning_parser",
    "tool_call_parser",
    "json_model_override_args",
    # parallelism
    "tp",
    "tp_size",
    "pp",
    "pp_size",
    "dp",
    "dp_size",
    "ep",
    "ep_size",
    "*_parallel_size",
    "moe_dense_tp_size",
    "nnodes",
    "load_balance_method",
    # scheduling and batching
    "max_running_requests",
    "max_queued_requests",
    "max_total_tokens",
    "max_total_num_tokens",
    "max_prefill_tokens",
    "max_req_input_len",
    "chunked_prefill_size",
    "schedule_policy",
    "schedule_conservativeness",
    "num_continuous_decode_steps",
    "stream_interval",
    "stream_output",
    "page_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "scheduling_policy",
    "async_scheduling",
    "num_scheduler_steps",
    # memory and caches
    "mem_fraction_static",
    "gpu_memory_utilization",
    "cpu_offload_gb",
    "swap_space",
    "block_size",
    "swa_full_tokens_ratio",
    "radix_eviction_policy",
    "hicache_ratio",
    "hicache_size",
    "hicache_write_policy",
    "hicache_io_backend",
    "hicache_mem_layout",
    "hicache_storage_backend",
    # kernels, backends, compilation, CUDA graphs (enable_*/disable_* cover the switches:
    # enable_eplb, enable_dp_attention, disable_radix_cache, disable_overlap_schedule...)
    "enable_*",
    "disable_*",
    "*_backend",
    "deepep_mode",
    "enforce_eager",
    "compilation_config",
    "torch_compile_max_bs",
    "cuda_graph_*",
    "max_seq_len_to_capture",
    # mixture of experts and expert load balancing
    "moe_*",
    "eplb_*",
    "ep_num_redundant_experts",
    "ep_dispatch_algorithm",
    "init_expert_location",
    # speculative decoding, disaggregation, LoRA
    "speculative*",
    "num_speculative_tokens",
    "disaggregation_mode",
    "max_loras_per_batch",
    "max_lora_rank",
    # the simulator's own knobs (its configuration: speed, slowdown, noise, seed...)
    "sim",
    # the digest of what this list leaves out (written by clean_server_info itself)
    "unlisted",
)
"""The ``server_info`` fields a baseline, a report and the history keep: the one place they
are named (fnmatch patterns over a top-level field, or a ``launch_command`` flag in
server_info's spelling).  Chosen for the provenance diff: each is something whose change can
move throughput (a tuning knob such as ``enable_eplb``, ``max_running_requests``,
``chunked_prefill_size``, ``tp_size``, ``ep_size``, ``cuda_graph_max_bs_decode``,
``stream_interval``) or says what was measured (engine, version, model).  A kept field's
whole value is kept (``sim``, ``speculative`` mappings), less its volatile entries, and
scrubbed.  Add a field here when a diff must name it; until then its changes show only as a
changed ``unlisted`` digest."""

UNLISTED_KEY = "unlisted"
"""The kept field that digests the dropped rest: ``"12 settings, sha256:0123456789abcdef"``."""

VOLATILE_SERVER_INFO: tuple[str, ...] = (
    # where the server runs, not how: differ between launches of the same config
    "host",
    "hostname",
    "port",
    "*_port",
    "*_ports",
    "*_host",
    "*_addr",
    "pid",
    "pids",
    "*_pid",
    "node_rank",
    # SGLang draws a random seed per launch when none is given
    "random_seed",
    # timings and live runtime statistics, not configuration (SGLang 0.5.23: startup_time
    # from the scheduler's handshake, internal_states per DP rank, status "ready")
    "startup_time",
    "internal_states",
    "last_gen_throughput",
    "memory_usage",
    "status",
    "uptime*",
    "start_time",
    "*_timestamp",
    "timestamp",
    "created_at",
    "started_at",
    "*_requests_total",
    "num_*_reqs",
    # how the launcher was invoked (interpreter path, `sglang serve` vs `-m`), not the config
    "launch_command.program",
)
"""Patterns for ``server_info`` entries that change at every start: never stored (not even in
the ``unlisted`` digest, which would then change at every start too), and left out of the
provenance diff for records written before they were dropped.

A pattern without a dot is matched (fnmatch) against every component of the flattened key, so
``port`` hides ``port`` and ``launch_command.args.port``, and ``pid`` hides ``sim.pid``; a
pattern with a dot is matched against the full dotted key or one of its prefixes.
"""

_LAUNCH = "launch_command"


def is_volatile(key: str, patterns: Sequence[str] = VOLATILE_SERVER_INFO) -> bool:
    """Whether a flat server_info key (``sim.pid``, ``internal_states[0].memory_usage``)
    matches a volatile pattern: a dotted pattern matches a key prefix, a plain one any
    component."""
    components = [c for c in re.split(r"\.|\[\d+\]", key) if c]
    prefixes = [key[: m.start()] for m in re.finditer(r"\.|\[\d+\]|$", key)]
    for pattern in patterns:
        if "." in pattern:
            if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
                return True
        elif any(fnmatch.fnmatchcase(c, pattern) for c in components):
            return True
    return False


def is_provenance_field(name: str) -> bool:
    """Whether a top-level server_info field (or a ``launch_command`` flag, in server_info's
    spelling) is kept: named by :data:`PROVENANCE_SERVER_INFO` and not volatile."""
    return not is_volatile(name) and any(
        fnmatch.fnmatchcase(name, p) for p in PROVENANCE_SERVER_INFO
    )


def _flag_name(word: str) -> str:
    """``--max-running-requests`` -> ``max_running_requests`` (server_info's spelling)."""
    return word.lstrip("-").replace("-", "_")


def _value(words: list[str]) -> Any:
    if not words:
        return True  # a store_true flag
    return words[0] if len(words) == 1 else list(words)


def parse_launch_command(command: str | Sequence[str]) -> dict[str, Any]:
    """``{"program": ..., "args": {flag: value}}`` from a command string or argv.

    Flags take the words up to the next flag (argparse ``nargs``: ``--cuda-graph-bs-decode 1
    2 4`` gives a list), ``--flag=value`` one value, a bare flag ``True``.  A string is
    split like a shell would, falling back to whitespace when its quoting is unbalanced
    (SGLang joins argv with spaces and does not quote).  A flag given twice keeps the last
    value, as argparse does.
    """
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
    else:
        words = [str(w) for w in command]
    program: list[str] = []
    args: dict[str, Any] = {}
    flag: str | None = None
    pending: list[str] = []
    for word in words:
        # the program (``python -m sglang.launch_server``) ends at the first long option
        is_flag = (
            (word.startswith("--") or (args or flag is not None) and word.startswith("-"))
            and len(word) > 1
            and not _is_number(word)
        )
        if is_flag:
            if flag is not None:
                args[flag] = _value(pending)
            name, eq, inline = word.partition("=")
            flag, pending = _flag_name(name), []
            if eq:
                args[flag] = inline
                flag = None
        elif flag is None:
            if args:  # a stray word after an inline --flag=value: keep it, positionally
                args.setdefault("_positional", []).append(word)
            else:
                program.append(word)
        else:
            pending.append(word)
    if flag is not None:
        args[flag] = _value(pending)
    return {"program": " ".join(program), "args": dict(sorted(args.items()))}


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _launch_args(command: Any, secrets: tuple[str, ...]) -> dict[str, Any] | None:
    """The flags of a ``launch_command``: parsed from SGLang's string or an argv list, or
    taken from an already parsed ``{"args": ...}`` (a stored baseline's); None when it is
    something else."""
    if isinstance(command, str) or (
        isinstance(command, (list, tuple)) and all(isinstance(w, str) for w in command)
    ):
        words = (
            shlex.split(command)
            if isinstance(command, str) and _balanced(command)
            else (command.split() if isinstance(command, str) else list(command))
        )
        args = parse_launch_command(scrub_argv(words, secrets))["args"]
        return dict(args)
    if isinstance(command, Mapping) and isinstance(command.get("args"), Mapping):
        return {str(k): v for k, v in command["args"].items()}
    return None


def _without_volatile(value: Any, key: str) -> Any:
    """``value`` less the entries below it whose flat key (``key.name``) is volatile."""
    if isinstance(value, Mapping):
        return {
            k: _without_volatile(v, f"{key}.{k}")
            for k, v in value.items()
            if not is_volatile(f"{key}.{k}")
        }
    if isinstance(value, (list, tuple)):
        return [_without_volatile(v, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _digest(dropped: Mapping[str, Any], prior: str | None) -> str:
    """``"N settings, sha256:<16 hex>"`` over the dropped rest, scrubbed first (a digest of a
    short password could be guessed), canonical JSON so key order does not matter; a digest
    already stored (re-cleaning a baseline's info) is folded in."""
    body = json.dumps(
        {"dropped": scrub(dict(dropped)), "prior": prior},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
        ensure_ascii=True,
    )
    h = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    n = len(dropped)
    return f"{n} setting{'s' if n != 1 else ''}, sha256:{h}"


def clean_server_info(raw: Mapping[str, Any] | None, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """The allow-listed part of ``raw`` (see the module docstring), scrubbed, with
    ``launch_command`` parsed into ``{"args": {flag: value}}`` filtered by the same list and
    the dropped rest digested under :data:`UNLISTED_KEY`.

    Idempotent: an already clean mapping (a stored baseline's) comes back equal.
    """
    if not raw:
        return {}
    secrets = tuple(s for s in secrets if s)
    kept: dict[str, Any] = {}
    dropped: dict[str, Any] = {}
    prior = raw.get(UNLISTED_KEY)
    for key, value in raw.items():
        name = str(key)
        if name == UNLISTED_KEY or is_volatile(name):
            continue
        if name == _LAUNCH:
            args = _launch_args(value, secrets)
            if args is None:
                dropped[name] = value
                continue
            kept_args: dict[str, Any] = {}
            for flag, arg in args.items():
                flat = f"{_LAUNCH}.args.{flag}"
                if is_volatile(flat):
                    continue
                if is_provenance_field(flag):
                    kept_args[flag] = _without_volatile(arg, flat)
                else:
                    dropped[flat] = _without_volatile(arg, flat)
            if kept_args:
                kept[_LAUNCH] = {"args": dict(sorted(kept_args.items()))}
        elif is_provenance_field(name):
            kept[name] = _without_volatile(value, name)
        else:
            dropped[name] = _without_volatile(value, name)
    if dropped:
        kept[UNLISTED_KEY] = _digest(dropped, prior if isinstance(prior, str) else None)
    elif isinstance(prior, str) and prior:
        kept[UNLISTED_KEY] = prior
    cleaned = scrub(kept, secrets)
    assert isinstance(cleaned, dict)
    return cleaned


def _balanced(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:
        return False
    return True
