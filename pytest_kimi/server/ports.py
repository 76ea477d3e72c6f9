"""The port a managed server listens on: free now, and out of the ranges that take it later.

Why a module of its own: picking a port is the one part of a start that must know the
kernel's ephemeral range and SGLang's own port choices (its NCCL port, DP attention's
``port + 233`` ..); the launcher only asks for one.
"""

from __future__ import annotations

import socket

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

PORT_FLOOR = 10000
"""Lowest port the launcher picks: well above the range services are usually pinned to."""
PORT_CEILING = 21700
"""Highest port it picks.  SGLang picks its own NCCL port from 22000-29999
(``sglang/srt/utils/network.py`` ``get_free_port_below_ephemeral``), and with DP attention
it binds ``port + 233`` to ``port + 240`` (``sglang/srt/server_args.py``,
``ZMQ_TCP_PORT_DELTA``); staying below 21700 keeps all of them apart."""
_PORT_TRIES = 64


def _ephemeral_low() -> int:
    """Start of the kernel's ephemeral port range (outgoing connections and bind(0))."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS's is 49152


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def _free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, chosen **below** the ephemeral range.

    SGLang binds its HTTP port only after loading, minutes after start; a port from the
    ephemeral range (what bind(0) hands out) can meanwhile be taken as the source port of
    any outgoing connection, and the server then dies with "address already in use" after
    a ten-minute load.  Ports below the range are never handed out that way.  Falls back to
    bind(0) where the range leaves no room (a tuned ip_local_port_range).
    """
    import random

    bind_host = "0.0.0.0" if host in _WILDCARD_HOSTS else host
    high = min(PORT_CEILING, _ephemeral_low() - 1)
    if high - PORT_FLOOR >= _PORT_TRIES:
        for port in random.sample(range(PORT_FLOOR, high + 1), _PORT_TRIES):
            if _port_free(bind_host, port):
                return port
    family = socket.AF_INET6 if ":" in bind_host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((bind_host.strip("[]"), 0))
        return int(s.getsockname()[1])


def _connect_host(host: str) -> str:
    """Where to connect to a server bound to ``host`` (a wildcard bind is reached locally)."""
    if host in _WILDCARD_HOSTS:
        return "127.0.0.1"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host
