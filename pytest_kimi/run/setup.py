"""The session's deployments and endpoint, resolved from the options without pytest.

The plugin's fixtures call these and turn their errors into pytest's: a :class:`SetupError`
is a bad command line or profile (``pytest.UsageError``: the run stops before any test), an
:class:`~pytest_kimi.endpoint.discovery.EndpointError` a server that cannot be measured (the
perf tests fail, naming it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimi.endpoint.discovery import EndpointError, EndpointInfo, normalize_url
from pytest_kimi.endpoint.serverinfo import clean_server_info
from pytest_kimi.gate.paired import MIN_BLOCKS
from pytest_kimi.options import KimiOptions
from pytest_kimi.run.measurer import Measurer
from pytest_kimi.scrub import register_secret
from pytest_kimi.server.profile import parse_profile, profile_secrets, read_profile_data
from pytest_kimi.server import (
    ProfileError,
    ServerProfile,
    described_server_info,
)

NOTHING_MEASURED = (
    "pytest-kimi: nothing was measured and --perf-require-measurement is set: no perf test "
    "ran against an endpoint (none selected, none given one, or every one skipped); a job "
    "that measured nothing is not green"
)

NO_ENDPOINT_REASON = (
    "no endpoint given: pass --endpoint=URL (an OpenAI-compatible server, e.g. "
    "http://127.0.0.1:30000), --endpoint=sim (the built-in simulator) or --server-profile=PATH "
    "(a deployment to launch), or set KIMI_ENDPOINT or the ini key kimi_endpoint"
)


class SetupError(ValueError):
    """A command line or profile the session cannot run with; the message says which and how
    to fix it."""


def load_deployments(opts: KimiOptions) -> list[ServerProfile]:
    """The ``--server-profile`` deployments, checked; each one's secrets are registered with
    the scrubber before any of its text can be printed."""
    source = opts.source("server_profile")
    profiles = []
    for path in opts.server_profile:
        try:
            profiles.extend(_read_deployments(Path(path), opts))
        except ProfileError as exc:
            raise SetupError(f"{source}: {exc}") from None
    for profile in profiles:
        for secret in profile_secrets(profile):
            register_secret(secret)
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise SetupError(f"{source}: two server profiles share a name: {names}")
    if profiles and opts.endpoint is not None:
        raise SetupError(
            f"{source} and {opts.source('endpoint')} both name the endpoint: "
            "give a server profile or an endpoint, not both"
        )
    return profiles


def _read_deployments(path: Path, opts: KimiOptions) -> list[ServerProfile]:
    """One ``--server-profile`` file's deployments: itself, or with ``--perf-race`` every
    deployment of a grid profile (:mod:`pytest_kimi.server.profile_grid`); elsewhere a grid
    file is refused, saying that only a race expands it."""
    from pytest_kimi.server.profile_grid import is_grid, parse_grid

    data = read_profile_data(path, allow_large=opts.perf_allow_large)
    source, name = str(path), path.stem
    if opts.perf_race and is_grid(data):
        points = parse_grid(data, source=source, default_name=name, path=path)
        return [dataclasses.replace(p, grid=point) for p, point in points]
    try:
        return [parse_profile(data, source=source, default_name=name, path=path)]
    except ProfileError as exc:
        if not is_grid(data):
            raise
        raise ProfileError(
            f"{exc} (a grid profile, whose args hold lists or which has exclude: or gpus:, "
            "expands to its deployments only with --perf-race)"
        ) from None


def check_server_starts(opts: KimiOptions, deployments: list[ServerProfile]) -> int:
    """The number of ``--perf-sessions``; a SetupError where the plugin cannot restart the
    deployment.

    A session is a fresh server start, and only a deployment the plugin starts can be started
    afresh: the simulator and server profiles with ``command``/``args`` or ``start:``.  An
    external ``--endpoint`` URL (or a profile with only ``url:``) would give N runs against
    one server start, whose scatter says nothing about the noise between starts.
    """
    if opts.perf_culprit and not opts.perf_max_launches:
        raise SetupError(
            f"{opts.source('perf_culprit')}: the culprit search explains a regression the "
            "paired deploy comparison decided; give two --server-profile (the reference first) "
            "and --perf-max-launches N (12 is a good budget)"
        )
    if opts.perf_race:
        return check_race(opts, deployments)
    if opts.perf_max_launches:
        return check_paired(opts, deployments)
    n = opts.perf_sessions
    if n == 1:
        return n
    given = f"{opts.source('perf_sessions')} = {n}"
    fix = (
        "give a --server-profile the plugin launches (command/args, or start:/stop:), or "
        "measure the simulator with --endpoint=sim, or run the sessions as separate pytest runs "
        "(restarting the server between them) and let the history estimate the noise"
    )
    if opts.endpoint is not None and not opts.is_sim:
        raise SetupError(
            f"{given}: {opts.source('endpoint')} names a server that someone else runs, which "
            f"the plugin cannot restart between sessions; {fix}"
        )
    fixed = [d.name for d in deployments if d.external and d.start is None]
    if fixed:
        raise SetupError(
            f"{given}: server profile {', '.join(fixed)} has only url: (a running server the "
            f"plugin never starts or stops), so it cannot be restarted between sessions; {fix}"
        )
    return n


def check_race(opts: KimiOptions, deployments: list[ServerProfile]) -> int:
    """``--perf-race``: one session (its launches are the race's first round); a SetupError
    where a race cannot run: fewer than two deployments, one the plugin cannot launch afresh,
    or another experiment asked for at once."""
    given = opts.source("perf_race")
    if len(deployments) < 2:
        raise SetupError(
            f"{given}: a race needs two or more deployments: give several --server-profile, or "
            f"one whose args hold lists (a grid), got {len(deployments)}"
        )
    if opts.perf_max_launches or opts.perf_culprit:
        raise SetupError(
            f"{given} with {opts.source('perf_max_launches')}: a race and a paired deploy "
            "comparison are two experiments; run them as two pytest runs"
        )
    if opts.perf_sessions != 1:
        raise SetupError(
            f"{given} with {opts.source('perf_sessions')} = {opts.perf_sessions}: the race "
            "sets the launches itself (--perf-race-rounds); drop --perf-sessions"
        )
    fixed = [d.name for d in deployments if d.external and d.start is None]
    if fixed:
        raise SetupError(
            f"{given}: server profile {', '.join(fixed)} has only url: (a running server the "
            "plugin never starts), so the race cannot launch it afresh each round; give "
            "profiles with command/args (or start:/stop:)"
        )
    return 1


def check_paired(opts: KimiOptions, deployments: list[ServerProfile]) -> int:
    """``--perf-max-launches``: the number of ABBA blocks (launches of each deployment); a
    SetupError where a paired deploy comparison cannot run.

    It needs two deployments to pair (the reference first) and two blocks for its first look.
    Profiles with only ``url:`` are allowed: the operator runs both servers, and each block is
    then a fresh session against them rather than a fresh launch (the deploy gate says so).
    """
    n = opts.perf_max_launches
    given = f"{opts.source('perf_max_launches')} = {n}"
    if len(deployments) != 2:
        raise SetupError(
            f"{given}: a paired deploy comparison needs exactly two --server-profile (the "
            f"reference first, then the candidate), got {len(deployments)}; for one "
            "deployment's session noise use --perf-sessions"
        )
    if n < 2 * MIN_BLOCKS:
        raise SetupError(
            f"{given}: the first look needs {MIN_BLOCKS} launches of each deployment; "
            f"give --perf-max-launches {2 * MIN_BLOCKS} or more (12 is a good budget)"
        )
    if opts.perf_sessions != 1:
        raise SetupError(
            f"{given} with {opts.source('perf_sessions')} = {opts.perf_sessions}: the paired "
            "experiment sets the launches itself; drop --perf-sessions"
        )
    external = [d.name for d in deployments if d.external]
    if opts.perf_culprit and external:
        raise SetupError(
            f"{opts.source('perf_culprit')}: server profile {', '.join(external)} is external "
            "(url:): the culprit search launches deployments between the two profiles itself, "
            "so both must be profiles the plugin starts (command/args)"
        )
    if opts.update_baselines is not None:
        raise SetupError(
            f"{given} with --update-baselines: a paired deploy comparison judges two "
            "deployments against each other and records no baseline; record from a run "
            "without --perf-max-launches"
        )
    return n // 2


@dataclass(slots=True)
class OpenEndpoint:
    """The endpoint under test and the simulator started for it (stopped by :meth:`close`)."""

    info: EndpointInfo
    sim: Any = None

    def close(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None


def open_endpoint(
    opts: KimiOptions,
    measurer: Measurer,
    server: Any,
    *,
    rootdir: Path,
    perf_session: int = 0,
    say: Callable[[str], None] | None = None,
) -> OpenEndpoint:
    """The endpoint a perf test measures: a managed server's, the simulator's (started here,
    with the spec's seed plus the ``--perf-sessions`` index) or the external URL's, discovered
    (model, server info).  Raises EndpointError (the simulator, if started, is stopped) or
    SetupError for a bad ``sim:`` spec."""
    api_key = opts.api_key
    sim = None
    try:
        if server is not None:
            api_key = api_key or getattr(server, "api_key", None)
            base = normalize_url(server.url, f"server profile {server.profile.name}")
        elif opts.is_sim:
            sim = start_sim(opts, api_key, rootdir, perf_session, say)
            base = sim.url
        else:
            base = normalize_url(str(opts.endpoint), opts.source("endpoint"))
        info = measurer.discover(base, api_key=api_key, model=opts.model)
        if server is not None:
            info.server_info = clean_server_info(
                described_server_info(server.profile, info.server_info)
            )
    except EndpointError:
        if sim is not None:
            sim.stop()
        raise
    return OpenEndpoint(info, sim)


def start_sim(
    opts: KimiOptions,
    api_key: str | None,
    rootdir: Path,
    perf_session: int = 0,
    say: Callable[[str], None] | None = None,
) -> Any:
    """Start the simulator ``--endpoint=sim:...`` names; a restart (``perf_session`` > 0)
    redraws the session factor (the ``noise`` knob) as a real server's would."""
    from pytest_kimi.sim.process import SimProcess
    from pytest_kimi.sim.config import SimConfigError, parse_sim_spec

    try:
        profile = parse_sim_spec(str(opts.endpoint), opts.source("endpoint"))
    except SimConfigError as exc:
        raise SetupError(str(exc)) from None
    if api_key and profile.api_key is None:
        profile = dataclasses.replace(profile, api_key=api_key)
    if perf_session:
        profile = dataclasses.replace(profile, seed=(profile.seed + perf_session) % 2**63)
    kimi = rootdir / ".kimi"
    sim = SimProcess(profile, log_dir=kimi / "logs", record_dir=kimi / "servers")
    sim.start()
    if say is not None:
        say(f"started (pid {sim.pid}, seed {profile.seed}) at {sim.url}")
    return sim
