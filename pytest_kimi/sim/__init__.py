"""Built-in SGLang simulator: a local server whose token rate is known exactly.

The plugin's accuracy tests measure this server and compare with
:meth:`SimConfig.true_tok_s`; fault knobs exercise the client's error handling.  Use
:class:`SimProcess` to run it out of process (the normal case) or
:func:`start_server` to embed it in the current event loop (tests).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kimi.sim.app import SimServer, create_app, start_server
    from pytest_kimi.sim.engine import EngineStats, SimEngine
    from pytest_kimi.sim.process import SimProcess, SimProcessError
    from pytest_kimi.sim.config import SimConfigError, SimConfig, parse_sim_spec
    from pytest_kimi.sim.request_parsing import count_prompt_tokens

_WHERE = {
    "SimServer": "app",
    "count_prompt_tokens": "request_parsing",
    "create_app": "app",
    "start_server": "app",
    "EngineStats": "engine",
    "SimEngine": "engine",
    "SimProcess": "process",
    "SimProcessError": "process",
    "SimConfigError": "config",
    "SimConfig": "config",
    "parse_sim_spec": "config",
}
"""Lazy (PEP 562): the plugin starts a simulator through :mod:`.process`, which must not
import aiohttp's server side into the pytest process just to spawn a child."""


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EngineStats",
    "SimConfigError",
    "SimEngine",
    "SimProcess",
    "SimProcessError",
    "SimConfig",
    "SimServer",
    "count_prompt_tokens",
    "create_app",
    "parse_sim_spec",
    "start_server",
]
