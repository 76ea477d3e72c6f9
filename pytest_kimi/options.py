"""Options: command line > environment > ini file, each value checked and traced to its source.

A bad value is reported with where it came from (``--perf-trials``, ``env KIMI_PERF_TRIALS``
or ``ini kimi_perf_trials``), so a stale variable in a CI job is found at once.  Marker
arguments override all three; that merge happens where the marker is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, TypeVar

import pytest

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option(Generic[T]):
    flag: str
    ini: str | None
    """None: command line only (a committed ini must not be able to set it)."""
    env: str | None
    help: str
    parse: Callable[[str], T]
    default: T | None = None
    metavar: str | None = None
    secret: bool = False
    switch: bool = False
    """A bare flag (``--perf-strict``); env and ini take true/false."""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True, slots=True)
class Resolved(Generic[T]):
    value: T | None
    source: str
    """Where the value came from: a flag, ``env NAME``, ``ini NAME`` or ``default``."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0 < value < 1:
        raise ValueError(f"expected a number between 0 and 1 (exclusive), got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"expected a number >= 0, got {text!r}")
    return value


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def update_mode(text: str) -> str:
    if text not in ("yes", "force"):
        raise ValueError(
            f"expected nothing or 'force', got {text!r} (write --update-baselines=force, and put "
            "test paths before a bare --update-baselines)"
        )
    return text


def non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a non-empty value")
    return text.strip()


OPTIONS: dict[str, Option[Any]] = {
    o.dest: o
    for o in (
        Option(
            "--endpoint",
            "kimi_endpoint",
            "KIMI_ENDPOINT",
            "base URL of an OpenAI-compatible server (SGLang, vLLM), e.g. http://127.0.0.1:30000; "
            "'sim' (or 'sim:speed=20,slowdown=1.1') starts the built-in simulator for the session",
            non_empty,
            metavar="URL",
        ),
        Option(
            "--model",
            "kimi_model",
            "KIMI_MODEL",
            "model name to request (default: the first id from /v1/models)",
            non_empty,
        ),
        Option(
            "--api-key",
            "kimi_api_key",
            "KIMI_API_KEY",
            "bearer token for the endpoint (default: env KIMI_API_KEY); never printed or written",
            non_empty,
            secret=True,
        ),
        Option(
            "--perf-json",
            "kimi_perf_json",
            "KIMI_PERF_JSON",
            "write every perf test's levels, figures and verdicts to this JSON file",
            non_empty,
            metavar="PATH",
        ),
        Option(
            "--perf-markdown",
            "kimi_perf_markdown",
            "KIMI_PERF_MARKDOWN",
            "write a Markdown summary (tables, verdicts, provenance diff); it is also appended to "
            "$GITHUB_STEP_SUMMARY when that is set",
            non_empty,
            metavar="PATH",
        ),
        Option(
            "--perf-html",
            "kimi_perf_html",
            "KIMI_PERF_HTML",
            "write a self-contained HTML report with plots (needs the 'plot' extra: matplotlib)",
            non_empty,
            metavar="DIR",
        ),
        Option(
            "--perf-trials",
            "kimi_perf_trials",
            "KIMI_PERF_TRIALS",
            "trials per level (default 3); the marker's trials= overrides it",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-workers",
            "kimi_perf_workers",
            "KIMI_PERF_WORKERS",
            "load client processes: shard each level's load across N processes (default 1) "
            "when one core cannot ingest the stream",
            positive_int,
            metavar="N",
        ),
        Option(
            "--baseline-dir",
            "kimi_baseline_dir",
            "KIMI_BASELINE_DIR",
            "where baselines live (default: baselines/ under the rootdir)",
            non_empty,
            metavar="DIR",
        ),
        Option(
            "--baseline-profile",
            "kimi_baseline_profile",
            "KIMI_BASELINE_PROFILE",
            "baseline group, e.g. the deployment's name (default 'default'; 'sim' for the simulator)",
            non_empty,
            metavar="NAME",
        ),
        Option(
            "--perf-tolerance",
            "kimi_perf_tolerance",
            "KIMI_PERF_TOLERANCE",
            "relative drop the gate tolerates before it may call a regression (default 0.05)",
            fraction,
            metavar="FRACTION",
        ),
        Option(
            "--perf-alpha",
            "kimi_perf_alpha",
            "KIMI_PERF_ALPHA",
            "false-alarm rate of the regression test per test (default 0.05)",
            fraction,
            metavar="ALPHA",
        ),
        Option(
            "--perf-session-sigma",
            "kimi_perf_session_sigma",
            "KIMI_PERF_SESSION_SIGMA",
            "session-to-session noise (log sd) of the deployment (default 0.03); 0 for a noiseless one",
            non_negative_float,
            metavar="SIGMA",
        ),
        Option(
            "--perf-max-trials",
            "kimi_perf_max_trials",
            "KIMI_PERF_MAX_TRIALS",
            "adaptive trials: at most this many per level while the verdict is unclear (default 10)",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-require-baseline",
            "kimi_perf_require_baseline",
            "KIMI_PERF_REQUIRE_BASELINE",
            "fail levels that have no baseline",
            boolean,
            switch=True,
        ),
        Option(
            "--perf-strict",
            "kimi_perf_strict",
            "KIMI_PERF_STRICT",
            "fail inconclusive and underpowered levels too",
            boolean,
            switch=True,
        ),
        Option(
            "--perf-server-metrics",
            "kimi_perf_server_metrics",
            "KIMI_PERF_SERVER_METRICS",
            "cross-check every trial against the server's Prometheus counters (GET /metrics): "
            "generated tokens must equal the client's count, and the counter's rate the "
            "client's over the same span of the steady-state window within 2%; a disagreement "
            "makes the level invalid",
            boolean,
            switch=True,
        ),
        Option(
            # Command line only: an ini key committed with the suite would rewrite the
            # baselines on every CI run and so bypass their review.
            "--update-baselines",
            None,
            None,
            "write the baselines of the tests that ran ('force': also from a run with failed or "
            "invalid levels)",
            update_mode,
            metavar="force",
        ),
    )
}


SERVER_PROFILE_HELP = (
    "YAML profile of a deployment the plugin launches (or starts/stops remotely), health-checks "
    "and tears down; give it twice or more for a same-run A/B (the first is the reference)"
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("kimi", "pytest-kimi: throughput targets for LLM endpoints")
    group.addoption(
        "--server-profile",
        dest="server_profile",
        action="append",
        default=None,
        metavar="PATH",
        help=SERVER_PROFILE_HELP,
    )
    parser.addini("kimi_server_profile", SERVER_PROFILE_HELP, type="args", default=[])
    for opt in OPTIONS.values():
        env = f" [env {opt.env}]" if opt.env else ""
        # argparse %-formats option help (``%(default)s``), ini help is printed as it is:
        # a bare "%" in the text crashed ``pytest --help`` for every user of the machine.
        cli_help = opt.help.replace("%", "%%")
        if opt.switch:
            group.addoption(
                opt.flag,
                dest=opt.dest,
                action="store_const",
                const="true",
                default=None,
                help=cli_help + env,
            )
        elif opt.dest == "update_baselines":
            group.addoption(
                opt.flag,
                dest=opt.dest,
                nargs="?",
                const="yes",
                default=None,
                metavar=opt.metavar,
                help=cli_help,
            )
        else:
            group.addoption(
                opt.flag, dest=opt.dest, default=None, metavar=opt.metavar, help=cli_help + env
            )
        if opt.ini is not None:
            parser.addini(opt.ini, opt.help, default="")


def resolve(
    config: pytest.Config, name: str, environ: Mapping[str, str] | None = None
) -> Resolved[Any]:
    """The option's value and its source; raises ``pytest.UsageError`` naming the source."""
    opt = OPTIONS[name]
    env = os.environ if environ is None else environ
    candidates: list[tuple[str, Any]] = [(opt.flag, config.getoption(opt.dest))]
    if opt.env:
        candidates.append((f"env {opt.env}", env.get(opt.env)))
    if opt.ini is not None:
        candidates.append((f"ini {opt.ini}", config.getini(opt.ini) or None))
    for source, raw in candidates:
        if raw is None or raw == "":
            continue
        try:
            return Resolved(opt.parse(str(raw)), source)
        except ValueError as exc:
            shown = "<hidden>" if opt.secret else repr(raw)
            raise pytest.UsageError(f"{source}: bad value {shown}: {exc}") from None
    return Resolved(opt.default, "default")


def server_profile_paths(config: pytest.Config) -> Resolved[list[str]]:
    """``--server-profile`` (repeatable) over the ini key ``kimi_server_profile`` (paths, rootdir-relative)."""
    given = config.getoption("server_profile")
    if given:
        return Resolved(list(given), "--server-profile")
    ini = config.getini("kimi_server_profile")
    if ini:
        return Resolved(list(ini), "ini kimi_server_profile")
    return Resolved([], "default")


def resolve_all(config: pytest.Config) -> dict[str, Resolved[Any]]:
    """Every option, checked once at start-up so a bad value stops the run before any test."""
    return {name: resolve(config, name) for name in OPTIONS}
