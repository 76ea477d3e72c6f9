"""What every handler of the simulator's app shares: where the engine and its profile hang on
the app, the SGLang-shaped error body, and the warm-up rule.

Why a module of its own: the generation routes, the side endpoints and the app's middleware
all need these, and the app module imports the handlers; kept here, none imports another.
"""

from __future__ import annotations

from aiohttp import web

from pytest_kimi.sim.config import SimConfig
from pytest_kimi.sim.engine import SimEngine

SIM_VERSION = "0.1.0-sim"

ENGINE_KEY: web.AppKey[SimEngine] = web.AppKey("pytest_kimi_sim_engine", SimEngine)
PROFILE_KEY: web.AppKey[SimConfig] = web.AppKey("pytest_kimi_sim_profile", SimConfig)

MAX_MODEL_LEN = 262144


def _error(status: int, message: str, etype: str) -> web.Response:
    """An error shaped like SGLang's OpenAI-compatible error body."""
    return web.json_response(
        {"object": "error", "message": message, "type": etype, "param": None, "code": status},
        status=status,
    )


def _warming_up(engine: SimEngine) -> bool:
    return engine.uptime_s() < engine.profile.slow_start_s
