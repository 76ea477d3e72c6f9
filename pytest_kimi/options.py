"""Options: one typed, frozen :class:`KimiOptions` per session that owns every default.

One module above 700 lines on purpose: it is the one table of every option, one declaration
each (its :class:`KimiOptions` field and default, its :data:`OPTIONS` entry: flag, ini key,
variable, parser, help), which the help texts, the README and docs/reference/reference.md are
checked against (tests/plugin/test_options.py, tests/plugin/test_readme.py); split over modules, an option
could be declared twice, or a check read half the table.

Why one object.  Defaults used to be supplied where each value was read (3 trials in the
measuring code, ``baselines/`` in the plugin, the statistics' defaults in ``GateSettings``), so
a help text, the README and the code could disagree and no test would notice.  Now each
option is one typed field of :class:`KimiOptions` and its default is that field's default,
stated here and nowhere else in the plugin (the statistical ones equal
:mod:`pytest_kimi.gate.two_sample`' ``DEFAULT_*`` constants, which stay the defaults of its
pytest-free functions, and are restated below so that this table loads no numpy; tests check
that they agree, and that ``GateSettings`` and ``kimi-perf compare`` do).
Help texts are formatted from the same field defaults.  ``pytest_configure`` builds the object
once (:meth:`KimiOptions.from_sources`, through :mod:`pytest_kimi.plugin.addoptions`) and stores it on ``config.stash``; the plugin, the gate
and the reports read only that.

Precedence: command line > environment > ini > default.  Marker arguments (``trials=``,
``tolerance=``, ``alpha=``) override all four for their test; that merge happens where the
marker is read (``build_spec``, ``GateSettings.for_test``).  Every value is checked at start-up
and a bad one is reported with where it came from (``--perf-trials``, ``env KIMI_PERF_TRIALS``
or ``ini kimi_perf_trials``), so a stale variable in a CI job is found before any GPU time is
spent; :attr:`KimiOptions.sources` keeps that for later messages.

Paths (``--baseline-dir``, ``--perf-json``, ``--perf-markdown``, ``--perf-html``,
``--perf-requests``, ``--server-profile``, and the file of a ``sqlite:///`` ``--perf-history``): a relative one resolves against one base whatever its source, the
rootdir (where the ini file and ``baselines/`` live).  pytest's own convention differs by
source (the invocation directory for arguments, the ini file's directory for ini paths, the
process's directory for anything read from the environment), so the same text could name two
files depending on where pytest was started from, or on whether CI set it as a variable or
the suite committed it in the ini.  One base makes a value name the same file everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Generic, Literal, Mapping, TypeVar, cast

from pytest_kimi.history.urls import DEFAULT_URL as DEFAULT_HISTORY_URL
from pytest_kimi.history.urls import check_url, resolve_history_url
from pytest_kimi.scrub import scrub_text
from pytest_kimi.workload.marker_bounds import ALLOW_LARGE_FLAG
from pytest_kimi.workload.workload_spec import DEFAULT_PROTOCOL, PROTOCOLS

if TYPE_CHECKING:
    from pytest_kimi.gate.policy import GateSettings

# The defaults of the stages below, as they state them for their pytest-free functions
# (gate/two_sample.py, gate/latency_gate.py, measure/measure_spec.py, baseline/paths.py),
# restated so that the option table -- read by every pytest session, perf tests or not --
# imports neither numpy nor the baseline store; tests/unit/core/test_import_budget.py checks that each
# equals its source.
DEFAULT_TOLERANCE = 0.05
DEFAULT_ALPHA = 0.05
DEFAULT_SESSION_SIGMA = 0.03
DEFAULT_POWER = 0.95
DEFAULT_DETECTABLE_DROP = 0.15
DEFAULT_MAX_TRIALS = 10
DEFAULT_LATENCY_TOLERANCE = 0.25
DEFAULT_TRIALS = 3
DEFAULT_DIRNAME = "baselines"
DEFAULT_PROFILE = "default"

T = TypeVar("T")

UpdateMode = Literal["yes", "force"]

DEFAULT_SOURCE = "default"


@dataclass(frozen=True, slots=True)
class KimiOptions:
    """Every option's value for this session; the field defaults are the documented defaults.

    Built by :meth:`from_config` (command line > environment > ini > default), whose paths are
    absolute (made so against the rootdir).  Constructed directly (tests, tools), paths are as
    given until :meth:`with_base`.
    """

    endpoint: str | None = None
    """URL, ``sim`` or ``sim:...``; None: none given (perf tests skip, unless a server profile)."""
    model: str | None = None
    """None: the first id from ``/v1/models``."""
    api_key: str | None = field(default=None, repr=False)
    perf_json: Path | None = None
    perf_markdown: Path | None = None
    perf_html: Path | None = None
    perf_requests: Path | None = None
    """``--perf-requests``: one JSON line per request, appended as each level finishes."""
    perf_trials: int = DEFAULT_TRIALS
    """Trials per level; a marker's ``trials=`` overrides it."""
    perf_workers: int = 1
    perf_protocol: str = DEFAULT_PROTOCOL
    """Closed-loop trial protocol where a marker does not choose one (``stationary``)."""
    baseline_dir: Path = Path(DEFAULT_DIRNAME)
    baseline_profile: str | None = None
    """None: derived (:meth:`default_profile`): the deployment's name, ``sim`` or ``default``."""
    perf_tolerance: float = DEFAULT_TOLERANCE
    perf_alpha: float = DEFAULT_ALPHA
    perf_session_sigma: float = DEFAULT_SESSION_SIGMA
    perf_detectable_drop: float = DEFAULT_DETECTABLE_DROP
    perf_latency_tolerance: float = DEFAULT_LATENCY_TOLERANCE
    """How much slower TTFT and ITL may be than the baseline's (0.25: 25%); a marker's
    ``latency_tolerance=`` overrides it."""
    perf_max_trials: int = DEFAULT_MAX_TRIALS
    perf_sessions: int = 1
    """Fresh server starts per run (``--perf-sessions``): every perf test runs in each, and the
    scatter between them measures the session noise.  Only for deployments the plugin starts."""
    perf_max_launches: int = 0
    """``--perf-max-launches``: judge a deploy change (two ``--server-profile`` s, the reference
    first) by a paired sequential experiment of at most this many launches, in ABBA blocks,
    stopping once decided (:mod:`pytest_kimi.run.deploy_gate`); 0: off."""
    perf_culprit: bool = False
    """``--perf-culprit``: when the paired deploy comparison decides a regression, search the
    two profiles' differences for the change that does it (:mod:`pytest_kimi.run.culprit_run`),
    in at most ``--perf-max-launches`` more launches."""
    perf_race: bool = False
    """``--perf-race``: find the best of several deployments (``--server-profile`` s, or a grid
    profile's) for the one selected perf test's objective (:mod:`pytest_kimi.run.race_run`)."""
    perf_race_rounds: int = 10
    """Launches of one deployment at most in a race (its budget)."""
    perf_race_objective: str = "tok_s"
    """What the race maximises (:func:`pytest_kimi.gate.race_objective.parse_objective`)."""
    perf_require_baseline: bool = False
    perf_require_measurement: bool = False
    perf_strict: bool = False
    perf_server_metrics: bool = False
    perf_allow_large: bool = False
    """Lift the upper bounds on marker values
    (:data:`pytest_kimi.workload.marker_bounds.BOUNDED_ARGS`), which stop a typo such as
    ``concurrency=10**7`` at collection, and the size bounds on the files the plugin reads
    (:mod:`pytest_kimi.files`); non-finite numbers and files that are not regular files stay
    refused."""
    perf_lock_timeout: float = 1800.0
    """Seconds a perf test waits for another pytest-kimi run measuring the same endpoint on this
    machine (:mod:`pytest_kimi.run.endpoint_lock`) before it errors naming that run: 30
    minutes, longer than a typical perf job's measurement, short enough that a CI job whose
    neighbour hangs fails within its own timeout rather than at the runner's."""
    update_baselines: UpdateMode | None = None
    perf_history: str | None = DEFAULT_HISTORY_URL
    """Database every run is stored in (SQLAlchemy URL); None: ``--perf-history=off``.  A
    relative SQLite path is made absolute against the rootdir, as paths are."""
    """Command line only: ``yes`` (bare flag), ``force`` or None."""
    server_profile: tuple[Path, ...] = ()
    sources: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )
    """Where each set value came from (a flag, ``env NAME``, ``ini NAME``); see :meth:`source`."""

    def source(self, name: str) -> str:
        """Where option ``name`` came from, for error messages: a flag, ``env X``, ``ini x`` or
        ``default``."""
        if name not in OPTIONS:
            raise KeyError(name)
        return self.sources.get(name, DEFAULT_SOURCE)

    def is_set(self, name: str) -> bool:
        return self.source(name) != DEFAULT_SOURCE

    @property
    def is_sim(self) -> bool:
        e = self.endpoint
        return e is not None and (e == "sim" or e.startswith("sim:"))

    def default_profile(self) -> str:
        """The baseline profile without a deployment: the option, else ``sim`` or ``default``."""
        if self.baseline_profile is not None:
            return self.baseline_profile
        return "sim" if self.is_sim else DEFAULT_PROFILE

    def gate_settings(self) -> GateSettings:
        """The gate's settings: taken from here, so they cannot keep defaults of their own."""
        from pytest_kimi.gate.policy import GateSettings

        return GateSettings(
            tolerance=self.perf_tolerance,
            alpha=self.perf_alpha,
            session_sigma=self.perf_session_sigma,
            max_trials=self.perf_max_trials,
            require_baseline=self.perf_require_baseline,
            strict=self.perf_strict,
            updating=self.update_baselines is not None,
            detectable_drop=self.perf_detectable_drop,
        )

    def with_base(self, root: Path) -> KimiOptions:
        """A copy whose relative paths (the defaults too) are absolute against ``root``."""

        def absolute(path: Path) -> Path:
            return path if path.is_absolute() else root / path

        changes: dict[str, Any] = {
            name: absolute(getattr(self, name))
            for name, opt in OPTIONS.items()
            if opt.path and not opt.many and getattr(self, name) is not None
        }
        changes["server_profile"] = tuple(absolute(p) for p in self.server_profile)
        if self.perf_history is not None:
            changes["perf_history"] = resolve_history_url(self.perf_history, root)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_sources(
        cls,
        getoption: Callable[[str], Any],
        getini: Callable[[str], Any],
        environ: Mapping[str, str],
        rootdir: Path,
    ) -> KimiOptions:
        """Every option from command line > environment > ini > default, checked once at
        start-up (a bad value stops the run before any test), paths against ``rootdir``.

        ``getoption(dest)`` and ``getini(name)`` read the command line and the ini file (the
        plugin passes pytest's, ``kimi-perf`` its own); raises :class:`OptionError` naming the
        bad value's source.
        """
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, opt in OPTIONS.items():
            found = _lookup(getoption, getini, opt, environ)
            if found is not None:
                values[name], sources[name] = found
        made = cls(**values, sources=MappingProxyType(sources))
        return made.with_base(rootdir)


class OptionError(ValueError):
    """A bad option value; the message names its source (``--perf-trials``, ``env X``)."""


@dataclass(frozen=True, slots=True)
class Option(Generic[T]):
    """How one :class:`KimiOptions` field is given: its flag, ini key, variable, parser, help.

    No default here: that is the field's default.  ``{default}`` in ``help`` is replaced by it.
    """

    flag: str
    ini: str | None
    """None: command line only (a committed ini must not be able to set it)."""
    env: str | None
    help: str
    parse: Callable[[str], T]
    metavar: str | None = None
    secret: bool = False
    switch: bool = False
    """A bare flag (``--perf-strict``); env and ini take true/false."""
    path: bool = False
    """A path: a relative one resolves against the rootdir, whichever the source."""
    many: bool = False
    """Repeatable flag, an ini list (whitespace-separated); the field is a tuple."""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


N = TypeVar("N", int, float)


def _number(text: str, convert: Callable[[str], N], ok: Callable[[N], bool], expected: str) -> N:
    """``text`` as a number that passes ``ok``; the error says what was ``expected``."""
    try:
        value = convert(text)
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise ValueError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def fraction(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < 1, "a number between 0 and 1 (exclusive)")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: v > 0 and v != float("inf"), "a number > 0")


def non_negative_float(text: str) -> float:
    return _number(text, float, lambda v: v >= 0, "a number >= 0")


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def protocol_name(text: str) -> str:
    if text not in PROTOCOLS:
        raise ValueError(f"expected one of {', '.join(PROTOCOLS)}, got {text!r}")
    return text


def update_mode(text: str) -> UpdateMode:
    if text not in ("yes", "force"):
        raise ValueError(
            f"expected nothing or 'force', got {text!r} (write --update-baselines=force, and put "
            "test paths before a bare --update-baselines)"
        )
    return cast(UpdateMode, text)


def race_rounds(text: str) -> int:
    return _number(text, int, lambda v: v >= 2, "an integer >= 2 (the first look needs two)")


def race_objective(text: str) -> str:
    from pytest_kimi.gate.race_objective import parse_objective

    parse_objective(text)  # raises with what is accepted
    return text.strip()


def non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a non-empty value")
    return text.strip()


def path_value(text: str) -> Path:
    return Path(non_empty(text))


def history_url(text: str) -> str | None:
    """A history database URL, None for ``off`` (:func:`pytest_kimi.history.urls.check_url`)."""
    return check_url(non_empty(text))


RELATIVE = "; a relative path is taken from the rootdir"

OPTIONS: dict[str, Option[Any]] = {
    o.dest: o
    for o in (
        Option(
            "--server-profile",
            "kimi_server_profile",
            None,
            "YAML profile of a deployment the plugin launches (or starts/stops remotely), "
            "health-checks and tears down; give it twice or more for a same-run A/B (the first "
            "is the reference)" + RELATIVE,
            path_value,
            metavar="PATH",
            path=True,
            many=True,
        ),
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
            "write every perf test's levels, figures and verdicts to this JSON file" + RELATIVE,
            path_value,
            metavar="PATH",
            path=True,
        ),
        Option(
            "--perf-markdown",
            "kimi_perf_markdown",
            "KIMI_PERF_MARKDOWN",
            "write a Markdown summary (tables, verdicts, provenance diff); it is also appended to "
            "$GITHUB_STEP_SUMMARY when that is set" + RELATIVE,
            path_value,
            metavar="PATH",
            path=True,
        ),
        Option(
            "--perf-html",
            "kimi_perf_html",
            "KIMI_PERF_HTML",
            "write a self-contained HTML report with plots (inline SVG)" + RELATIVE,
            path_value,
            metavar="DIR",
            path=True,
        ),
        Option(
            "--perf-requests",
            "kimi_perf_requests",
            "KIMI_PERF_REQUESTS",
            "write one JSON line per request measured (test, level, trial, send, first token "
            "and end times, token counts, status, error; no request bodies), appended as each "
            "level finishes" + RELATIVE,
            path_value,
            metavar="PATH",
            path=True,
        ),
        Option(
            "--perf-history",
            "kimi_perf_history",
            "KIMI_PERF_HISTORY",
            "database every run that measured something is stored in, for kimi-perf history "
            "and dashboard (default {default}, a SQLite file under the rootdir): "
            "sqlite:///relative/path (from the rootdir), sqlite:////absolute/path, "
            "postgresql://user@host:port/db (needs the 'postgres' extra: psycopg), or 'off'",
            history_url,
            metavar="URL",
        ),
        Option(
            "--perf-trials",
            "kimi_perf_trials",
            "KIMI_PERF_TRIALS",
            "trials per level (default {default}); the marker's trials= overrides it",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-workers",
            "kimi_perf_workers",
            "KIMI_PERF_WORKERS",
            "load client processes: shard each level's load across N processes (default "
            "{default}) when one core cannot ingest the stream",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-protocol",
            "kimi_perf_protocol",
            "KIMI_PERF_PROTOCOL",
            "closed-loop trial protocol (default {default}): 'stationary' (streams back to back "
            "with staggered starts, each trial a time box of an eighth of a request, 16 to 128 "
            "steps) or 'whole-requests' "
            "(each trial waits for whole requests: the protocol before 0.2); a marker's "
            "protocol= overrides it",
            protocol_name,
            metavar="NAME",
        ),
        Option(
            "--baseline-dir",
            "kimi_baseline_dir",
            "KIMI_BASELINE_DIR",
            "where baselines live (default: {default}/)" + RELATIVE,
            path_value,
            metavar="DIR",
            path=True,
        ),
        Option(
            "--baseline-profile",
            "kimi_baseline_profile",
            "KIMI_BASELINE_PROFILE",
            "baseline group, e.g. the deployment's name (default: the server profile's name, "
            f"'sim' for the simulator, else '{DEFAULT_PROFILE}')",
            non_empty,
            metavar="NAME",
        ),
        Option(
            "--perf-tolerance",
            "kimi_perf_tolerance",
            "KIMI_PERF_TOLERANCE",
            "relative drop the gate tolerates before it may call a regression (default "
            "{default}); the marker's tolerance= overrides it",
            fraction,
            metavar="FRACTION",
        ),
        Option(
            "--perf-alpha",
            "kimi_perf_alpha",
            "KIMI_PERF_ALPHA",
            "false-alarm rate of the regression test per test (default {default}); the "
            "marker's alpha= overrides it",
            fraction,
            metavar="ALPHA",
        ),
        Option(
            "--perf-session-sigma",
            "kimi_perf_session_sigma",
            "KIMI_PERF_SESSION_SIGMA",
            "session-to-session noise (log sd) of the deployment (default {default} until the "
            "history has measured it: 5 or more server starts of an unchanged build); 0 for a "
            "noiseless one",
            non_negative_float,
            metavar="SIGMA",
        ),
        Option(
            "--perf-detectable-drop",
            "kimi_perf_detectable_drop",
            "KIMI_PERF_DETECTABLE_DROP",
            f"true relative drop the gate must catch (with {DEFAULT_POWER:.0%} "
            "probability) before a level may pass; a level whose noise could hide it is "
            "underpowered (default {default})",
            fraction,
            metavar="FRACTION",
        ),
        Option(
            "--perf-latency-tolerance",
            "kimi_perf_latency_tolerance",
            "KIMI_PERF_LATENCY_TOLERANCE",
            "relative slow-down of TTFT and ITL (p50 and the marker's percentile) the gate "
            "tolerates before it may call a latency regression (default {default}: 25% "
            "slower); the marker's latency_tolerance= overrides it",
            positive_float,
            metavar="FRACTION",
        ),
        Option(
            "--perf-max-trials",
            "kimi_perf_max_trials",
            "KIMI_PERF_MAX_TRIALS",
            "adaptive trials: at most this many per level while the verdict is unclear "
            "(default {default})",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-sessions",
            "kimi_perf_sessions",
            "KIMI_PERF_SESSIONS",
            "restart the deployment (a --server-profile, or the simulator) N times and run "
            "every perf test in each fresh session, to measure the session noise and "
            "recommend a --perf-session-sigma (default {default}: one session); with two or "
            "more server profiles the sessions run in ABBA order",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-max-launches",
            "kimi_perf_max_launches",
            "KIMI_PERF_MAX_LAUNCHES",
            "judge a deploy change as a paired sequential experiment: two --server-profile "
            "(the reference first) launched in ABBA blocks, each perf test measured on every "
            "launch, until its verdict is decided or N launches (at least 4) are spent; the "
            "verdicts and the smallest drop the experiment could catch are in the 'deploy "
            "gate' section (default: off; 12 is a good budget)",
            positive_int,
            metavar="N",
        ),
        Option(
            "--perf-culprit",
            "kimi_perf_culprit",
            "KIMI_PERF_CULPRIT",
            "with --perf-max-launches: when the candidate is a decided regression, name the "
            "change (a server argument, an env variable, the engine, the model) that does it, "
            "each step a paired comparison of the reference with some of the changes applied, "
            "in at most --perf-max-launches more launches (the 'culprit' section)",
            boolean,
            switch=True,
        ),
        Option(
            "--perf-race",
            "kimi_perf_race",
            "KIMI_PERF_RACE",
            "find the best deployment for the selected perf test: several --server-profile "
            "(or one whose args hold lists: a grid) raced in rounds of fresh launches, those "
            "significantly worse than the best eliminated, until one is left or the rest tie "
            "within the tolerance (the 'race' section)",
            boolean,
            switch=True,
        ),
        Option(
            "--perf-race-rounds",
            "kimi_perf_race_rounds",
            "KIMI_PERF_RACE_ROUNDS",
            "with --perf-race: launches of one deployment at most (default {default})",
            race_rounds,
            metavar="N",
        ),
        Option(
            "--perf-race-objective",
            "kimi_perf_race_objective",
            "KIMI_PERF_RACE_OBJECTIVE",
            "with --perf-race: what is best: tok_s (the peak over the test's levels, or "
            "tok_s:C=64 for one), tok_s_per_gpu, frontier:RATE (tok/s per GPU at the highest "
            "load whose per-request tok/s stays >= RATE) or capacity (default {default})",
            race_objective,
            metavar="OBJECTIVE",
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
            "--perf-require-measurement",
            "kimi_perf_require_measurement",
            "KIMI_PERF_REQUIRE_MEASUREMENT",
            "fail the run when nothing was measured: a perf test without an endpoint fails "
            "instead of skipping, and a session that measured no perf test fails (a CI job "
            "whose endpoint secret went missing is not green)",
            boolean,
            switch=True,
        ),
        Option(
            "--perf-strict",
            "kimi_perf_strict",
            "KIMI_PERF_STRICT",
            "fail underpowered levels too (inconclusive ones, whose estimate lies beyond the "
            "tolerance, always fail)",
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
            ALLOW_LARGE_FLAG,
            "kimi_perf_allow_large",
            "KIMI_PERF_ALLOW_LARGE",
            "accept marker values above their upper bounds (concurrency 65536, input_tokens "
            "and max_tokens 2097152, trials 1000, rate 10000/s, ...), which otherwise stop the "
            "run at collection as the typo they nearly always are, and files above their size "
            "bounds (a baseline or server profile of 1 MiB, a dataset or prompts file of 1 "
            "GiB); a file must still be a regular file",
            boolean,
            switch=True,
        ),
        Option(
            "--perf-lock-timeout",
            "kimi_perf_lock_timeout",
            "KIMI_PERF_LOCK_TIMEOUT",
            "seconds a perf test waits for another pytest-kimi run on this machine measuring "
            "the same endpoint (default {default}); past it the test errors naming that run",
            positive_float,
            metavar="SECONDS",
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


def default_of(name: str) -> Any:
    """The documented default of option ``name``: the :class:`KimiOptions` field's default."""
    f = next(f for f in dataclasses.fields(KimiOptions) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    raise KeyError(name)


def help_text(name: str) -> str:
    """The option's help with its default filled in (from the field, never restated)."""
    opt = OPTIONS[name]
    if "{default}" not in opt.help:
        return opt.help
    value = default_of(name)
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return opt.help.replace("{default}", shown)


def _lookup(
    getoption: Callable[[str], Any],
    getini: Callable[[str], Any],
    opt: Option[Any],
    env: Mapping[str, str],
) -> tuple[Any, str] | None:
    """The first source that sets ``opt`` (command line, environment, ini) as (value, source);
    None: unset, the field's default applies."""
    candidates: list[tuple[str, Any]] = [(opt.flag, getoption(opt.dest))]
    if opt.env:
        candidates.append((f"env {opt.env}", env.get(opt.env)))
    if opt.ini is not None:
        candidates.append((f"ini {opt.ini}", getini(opt.ini)))
    for source, raw in candidates:
        if raw is None or raw == "" or raw == []:
            continue
        items = list(raw) if opt.many else [raw]
        try:
            parsed = [opt.parse(str(item)) for item in items]
        except ValueError as exc:
            shown = "<hidden>" if opt.secret else scrub_text(repr(raw))
            raise OptionError(f"{source}: bad value {shown}: {exc}") from None
        return (tuple(parsed) if opt.many else parsed[0]), source
    return None


GATE_OPTIONS = ("perf_tolerance", "perf_alpha", "perf_session_sigma", "perf_detectable_drop")
"""The gate's statistical options, which ``kimi-perf compare`` takes too (without ``perf-``)."""


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the gate's options on a ``kimi-perf`` command from the same table the plugin
    declares them from: one flag text, parser, default and help for both (``--perf-tolerance``
    in pytest is ``--tolerance`` in ``kimi-perf compare``)."""
    for name in GATE_OPTIONS:
        opt = OPTIONS[name]
        parser.add_argument(
            "--" + opt.flag.removeprefix("--perf-"),
            dest=name.removeprefix("perf_"),
            # checked where the statistics take it, as a one-line error of the command's own
            type=float,
            default=default_of(name),
            metavar=opt.metavar,
            # a saved report has no marker to override the option
            help=help_text(name).split("; the marker")[0].replace("%", "%%"),
        )
