"""``python -m pytest_kimi.sim --port N [--speed X ...]``: run the simulator as a process.

Running the simulator in its own process keeps its step loop off the load client's event
loop (and CPU core), which is what lets both keep to their schedules.  The one stdout line
``pytest-kimi sim listening on http://127.0.0.1:<port>`` is the readiness handshake that
:class:`pytest_kimi.sim.process.SimProcess` waits for; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import fields

from pytest_kimi.sim.app import ALLOWED_HOSTS, start_server
from pytest_kimi.sim.process import API_KEY_ENV, READY_PREFIX
from pytest_kimi.sim.config import KNOB_HELP, SimConfigError, SimConfig


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`SimConfig` knob: ``--step-base-s``, ``--speed``, ...

    Values are taken as text and converted by :meth:`SimConfig.from_options`, so the
    command line reports bad values with exactly the same messages as a ``sim:`` spec.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pytest_kimi.sim",
        description="SGLang-like OpenAI-compatible server with an exactly known token rate.",
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="must be 127.0.0.1; the simulator never listens elsewhere",
    )
    for f in fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "no_usage":
            parser.add_argument(
                flag,
                dest=f.name,
                action="store_const",
                const="true",
                default=None,
                help=KNOB_HELP[f.name],
            )
        else:
            parser.add_argument(
                flag, dest=f.name, default=None, metavar="VALUE", help=KNOB_HELP[f.name]
            )
    return parser


def profile_from_args(ns: argparse.Namespace) -> SimConfig:
    options = {
        f.name: getattr(ns, f.name) for f in fields(SimConfig) if getattr(ns, f.name) is not None
    }
    if "api_key" not in options and os.environ.get(API_KEY_ENV):
        options["api_key"] = os.environ[API_KEY_ENV]
    return SimConfig.from_options(options, "command line")


async def _serve(profile: SimConfig, port: int) -> None:
    server = await start_server(profile, port=port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(f"{READY_PREFIX}{server.url}\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.host not in ALLOWED_HOSTS:
        print(
            f"error: the pytest-kimi simulator binds 127.0.0.1 only; refusing --host {ns.host!r}",
            file=sys.stderr,
        )
        return 2
    if not 0 <= ns.port <= 65535:
        print(f"error: --port must be in [0, 65535], got {ns.port}", file=sys.stderr)
        return 2
    try:
        profile = profile_from_args(ns)
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(profile, ns.port))
    except OSError as exc:
        print(f"error: cannot listen on 127.0.0.1:{ns.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
