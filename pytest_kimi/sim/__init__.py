"""Built-in SGLang simulator: a local server whose token rate is known exactly.

The plugin's accuracy tests measure this server and compare with
:meth:`SimProfile.true_tok_s`; fault knobs exercise the client's error handling.  Use
:class:`SimProcess` to run it out of process (the normal case) or
:func:`start_server` to embed it in the current event loop (tests).
"""

from __future__ import annotations

from .app import SimServer, count_prompt_tokens, create_app, start_server
from .engine import EngineStats, SimEngine
from .process import SimProcess, SimProcessError
from .profile import SimConfigError, SimProfile, parse_sim_spec

__all__ = [
    "EngineStats",
    "SimConfigError",
    "SimEngine",
    "SimProcess",
    "SimProcessError",
    "SimProfile",
    "SimServer",
    "count_prompt_tokens",
    "create_app",
    "parse_sim_spec",
    "start_server",
]
