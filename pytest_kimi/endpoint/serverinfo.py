"""What a server says about itself, made safe and stable where it enters the plugin.

Baselines (committed to git), reports and the provenance diff all read ``server_info``.
SGLang 0.5.23's ``/server_info`` (``sglang/srt/entrypoints/http_server.py``, built by
``build_server_info`` in ``sglang/srt/utils/common.py``) returns the resolved server
arguments plus

* ``api_key`` / ``admin_api_key`` in clear, and ``launch_command``: the launcher's argv
  joined by single spaces (``sglang/srt/server_args.py`` ``prepare_server_args``), with
  ``--api-key VALUE`` verbatim and the ``--port`` the plugin picked at random;
* ``startup_time`` (seconds spent loading weights, allocating KV cache, capturing CUDA
  graphs: ``sglang/srt/observability/startup_time.py``), ``internal_states`` (live scheduler
  state per DP rank), ``status``: different on every launch of the same configuration.

:func:`clean_server_info` is the one door: it scrubs secrets (:mod:`pytest_kimi.scrub`) and
replaces the ``launch_command`` string by its parsed form, so the provenance diff compares
flags (``launch_command.max_running_requests: 64 -> 128``) instead of a string that differs
in its port on every run.  What is volatile is still stored (a reviewer may want the startup
timings) but :data:`VOLATILE_SERVER_INFO` keeps it out of the diff.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_kimi.scrub import scrub, scrub_argv

__all__ = ["VOLATILE_SERVER_INFO", "clean_server_info", "parse_launch_command"]

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
    "*_requests_total",
    "num_*_reqs",
    # how the launcher was invoked (interpreter path, `sglang serve` vs `-m`), not the config
    "launch_command.program",
)
"""Patterns for ``server_info`` entries that the provenance diff leaves out.

A pattern without a dot is matched (fnmatch) against every component of the flattened key, so
``port`` hides ``port`` and ``launch_command.port``, and ``internal_states`` hides
``internal_states[0].memory_usage``; a pattern with a dot is matched against the full dotted
key or one of its prefixes.
"""


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


def clean_server_info(raw: Mapping[str, Any] | None, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """``raw`` scrubbed of secrets, with ``launch_command`` parsed (see the module docstring).

    Idempotent: an already clean mapping (a stored baseline's) comes back equal.
    """
    if not raw:
        return {}
    secrets = tuple(s for s in secrets if s)
    info = dict(raw)
    command = info.get("launch_command")
    if isinstance(command, str) or (
        isinstance(command, (list, tuple)) and all(isinstance(w, str) for w in command)
    ):
        words = (
            shlex.split(command)
            if isinstance(command, str) and _balanced(command)
            else (command.split() if isinstance(command, str) else list(command))
        )
        info["launch_command"] = parse_launch_command(scrub_argv(words, secrets))
    cleaned = scrub(info, secrets)
    assert isinstance(cleaned, dict)
    return cleaned


def _balanced(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:
        return False
    return True
