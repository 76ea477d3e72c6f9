"""Managed servers: start the deployment a profile describes, wait until it is really ready,
and tear it down without leaving a GPU-holding process behind.

Deliberately free of pytest so the same lifecycle can serve the plugin, a script or a CLI::

    profile = load_profile("servers/ep8-tuned.yaml")
    with open_server(profile, ".kimi/logs") as server:   # start + wait_ready
        ...  # measure server.url

See ``docs/guide/managed-servers.md`` for the profile format and failure behaviour.
"""

from __future__ import annotations

from pytest_kimi.server.engines import ENGINES, SGLANG, VLLM, Engine, get_engine
from pytest_kimi.server.launcher import ExternalServer, ManagedServer, Server, open_server
from pytest_kimi.server.profile import (
    ProfileError,
    ServerProfile,
    argv,
    described_server_info,
    load_profile,
    parse_profile,
    profile_secrets,
    server_args,
)
from pytest_kimi.server.server_base import ProgressFn, ServerError, ServerStartError

__all__ = [
    "ENGINES",
    "Engine",
    "ExternalServer",
    "ManagedServer",
    "ProfileError",
    "ProgressFn",
    "SGLANG",
    "Server",
    "ServerError",
    "ServerProfile",
    "ServerStartError",
    "VLLM",
    "argv",
    "get_engine",
    "load_profile",
    "open_server",
    "parse_profile",
    "described_server_info",
    "profile_secrets",
    "server_args",
]
