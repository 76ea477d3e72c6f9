"""Server profiles: one YAML file per deployment, loaded into :class:`ServerProfile`.

A profile replaces the command line someone used to paste into a terminal before a
benchmark run.  Keeping it in a file means the exact flags of a deployment are reviewed,
versioned and reported with its numbers, and an A/B comparison is two file names.

Two shapes are accepted:

* **managed**: ``command`` (optional) + ``args`` + ``env``; the plugin starts the server
  itself on a free loopback port and owns the process until the end of the session.
* **external**: ``url`` with optional ``start``/``stop`` shell commands (for instance
  ``ssh gpu-host systemctl start sglang-ep8``); the plugin runs ``start``, waits for the
  engine's health probe at ``url`` and runs ``stop`` at the end.

Every problem raises :class:`ProfileError` naming the file and the offending key, because
a typo found after a ten-minute server start is a lost ten minutes.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from pytest_kimi import yamlstrict
from pytest_kimi.files import FileRefusedError, described, key_shown, read_regular_text
from pytest_kimi.scrub import is_secret_flag, is_secret_name
from pytest_kimi.server import sglang_flags
from pytest_kimi.server.engines import ENGINES, Engine, get_engine

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_STOP_GRACE_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "ProfileError",
    "ServerProfile",
    "argv",
    "load_profile",
    "parse_profile",
    "profile_secrets",
    "server_args",
]

DEFAULT_STARTUP_TIMEOUT_S = 2400.0
"""Large on purpose: loading a 1 TB Kimi K2 checkpoint plus warm-up and CUDA-graph capture
takes 10-20 minutes (a TP8 deployment took 570 s on a warm page cache).  Set it lower for a
small model, so that a hung start is reported sooner."""
DEFAULT_STOP_GRACE_S = 60.0
"""Stop, phase 1: after SIGTERM to the server's main process alone, how long it gets to
drain and shut its own workers down.  SGLang checks for the SIGTERM every 5 s, waits for
in-flight requests, then asks its schedulers to release the GPUs and waits for them
(``sglang/srt/managers/tokenizer_manager.py``, ``sigterm_watchdog``)."""
DEFAULT_STOP_TIMEOUT_S = 30.0
"""Stop, phase 2: after SIGTERM to the whole process group, how long until SIGKILL."""

_MANAGED_KEYS = ("command", "args", "nice", "engine_version")
_EXTERNAL_KEYS = ("start", "stop", "url")
ALLOWED_KEYS: tuple[str, ...] = (
    "name",
    "engine",
    "command",
    "args",
    "env",
    "secret_env",
    "startup_timeout_s",
    "stop_grace_s",
    "stop_timeout_s",
    "start",
    "stop",
    "url",
    "health_path",
    "nice",
    "engine_version",
)

_SCALARS = (str, int, float)

_ALLOW_LARGE = "if you mean it, run with --perf-allow-large"
"""How the size bound is lifted (the flag is the plugin's; this layer cannot import its name)."""


class ProfileError(ValueError):
    """A server profile cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class ServerProfile:
    """One deployment: how to start it (or reach it), how long to wait, how to stop it."""

    name: str
    """Used in log file names and reports; the file stem unless ``name:`` is given."""
    path: Path | None = None
    engine: str = "sglang"
    command: list[str] = field(default_factory=list)
    """argv prefix for a managed server; empty for an external one."""
    args: dict[str, Any] = field(default_factory=dict)
    """Flag name (dashed, without ``--``) -> value, in file order."""
    env: dict[str, str | None] = field(default_factory=dict)
    """Added to the plugin's environment; ``None`` removes a variable."""
    secret_env: frozenset[str] = frozenset()
    """Env variables whose values are never shown (logs, records, messages), besides those
    whose name says secret (``*_TOKEN``, ``*_KEY``, ``*SECRET*``, ``*PASSWORD*``...)."""
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    """SIGTERM to the main process, then this long for it (and its children) to exit."""
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    """Then SIGTERM to the whole process group, and this long until SIGKILL."""
    start: str | None = None
    """External: shell command that starts the server (may return at once or keep running)."""
    stop: str | None = None
    """External: shell command that stops it, run at teardown."""
    url: str | None = None
    """External: base URL where the server answers once started."""
    health_path: str | None = None
    """Overrides the engine's readiness probe path (rarely needed)."""
    nice: int = 0
    """Managed: CPU niceness of the server (0-19) when it shares a machine with the load
    client.  vLLM's CPU engine core busy-polls a core; at equal priority the client waits
    for it, its event loop lags and its timestamps come late.  A niced server still gets
    every cycle the client (a few percent of a core) does not use.  The launcher applies it to
    the server's whole session as well (its autogroup, :func:`procgroup.nice_session`): under
    autogroup scheduling a process's nice alone does not weigh against other sessions."""
    grid: Any = field(default=None, compare=False, repr=False)
    """A grid profile's deployment (``--perf-race``): its
    :class:`~pytest_kimi.server.profile_grid.GridPoint` (the axes' values, the GPUs, the
    mapping that writes it out as a profile of its own); None for a profile file."""
    engine_version: str | None = None
    """SGLang: the release ``args`` are checked against (default
    :data:`sglang_flags.DEFAULT_VERSION`, the parser the plugin ships); a release without
    shipped data is not checked."""
    flag_warnings: tuple[str, ...] = ()
    """Findings about ``args`` that do not stop a launch (a deprecated flag), each naming
    the profile and the flag; the launcher logs and reports them."""

    @property
    def external(self) -> bool:
        """Whether something other than the plugin owns the server process."""
        return self.url is not None

    @property
    def engine_spec(self) -> Engine:
        return get_engine(self.engine)

    @property
    def source(self) -> str:
        """How messages refer to this profile: its file, else its name."""
        return str(self.path) if self.path is not None else f"server profile {self.name!r}"

    def readiness_path(self) -> str:
        return self.health_path or self.engine_spec.health_path


# ---------------------------------------------------------------------- loading


def load_profile(path: str | Path, *, allow_large: bool = False) -> ServerProfile:
    """Read and validate a profile file; :class:`ProfileError` on any problem
    (:func:`read_profile_data`, then :func:`parse_profile`)."""
    p = Path(path)
    return parse_profile(
        read_profile_data(p, allow_large=allow_large), source=str(p), default_name=p.stem, path=p
    )


def read_profile_data(path: str | Path, *, allow_large: bool = False) -> object:
    """A profile file's YAML, read and parsed but not validated (a grid profile,
    :mod:`pytest_kimi.server.profile_grid`, is validated per deployment); :class:`ProfileError`
    when it cannot be read or is not YAML.

    Read only when it is a regular file (symlinks followed) of at most
    :data:`pytest_kimi.yamlstrict.MAX_CHARS` bytes, checked before a byte is read
    (:func:`pytest_kimi.files.read_regular_text`): a path to ``/dev/zero``, a FIFO or a log is
    refused naming its type and size, never its content.  ``allow_large``
    (``--perf-allow-large``) lifts the size bound, never the type check.  The path is the
    user's own (a flag, a variable or the ini names it), so it is read wherever it points.
    """
    p = Path(path)
    limit = None if allow_large else yamlstrict.MAX_CHARS
    try:
        text = read_regular_text(p, what="server profile", limit=limit, lift=_ALLOW_LARGE)
    except FileNotFoundError:
        raise ProfileError(f"server profile {p}: file not found") from None
    except FileRefusedError as exc:
        raise ProfileError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"server profile {p}: not UTF-8 text (byte {exc.start}): save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ProfileError(f"server profile {p}: cannot read it: {exc.strerror or exc}") from None
    try:
        # a second ``tp-size:`` further down is an error, and so is an anchor or alias
        data = yamlstrict.load(text, max_chars=limit)
    except (yamlstrict.AliasError, yamlstrict.NodeLimitError) as exc:
        raise ProfileError(f"{p}: line {exc.line}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise ProfileError(f"{p}: invalid YAML{where}: {what}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{p}: invalid YAML: {exc}") from None
    if data is None:
        raise ProfileError(
            f"{p}: the file is empty; a server profile needs at least "
            f"'args:' (managed server) or 'url:' (external server)"
        )
    return data


def parse_profile(
    data: object, *, source: str, default_name: str, path: Path | None = None
) -> ServerProfile:
    """Validate an already-parsed mapping (what :func:`load_profile` does after YAML)."""
    if not isinstance(data, Mapping):
        raise ProfileError(
            f"{source}: a server profile must be a mapping of keys "
            f"({', '.join(ALLOWED_KEYS)}), got {type(data).__name__}"
        )
    for key in data:
        if not isinstance(key, str) or key not in ALLOWED_KEYS:
            hint = _did_you_mean(key, ALLOWED_KEYS)
            raise ProfileError(  # a key is shown only when it looks like one: a file that
                # is no profile (a symlink to a secret) may hold anything
                f"{source}: unknown key {key_shown(key)}{hint}; allowed keys: "
                f"{', '.join(ALLOWED_KEYS)}"
            )

    name = _opt_str(data, "name", source) or default_name
    engine = _opt_str(data, "engine", source) or "sglang"
    if engine not in ENGINES:
        raise ProfileError(
            f"{source}: unknown engine {engine!r}; known engines: {', '.join(sorted(ENGINES))}"
        )
    startup = _positive(data, "startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S, source)
    stop_timeout = _positive(data, "stop_timeout_s", DEFAULT_STOP_TIMEOUT_S, source)
    stop_grace = _non_negative(data, "stop_grace_s", DEFAULT_STOP_GRACE_S, source)
    env = _env(data.get("env"), source)
    secret_env = _secret_env(data.get("secret_env"), source)
    health_path = _opt_str(data, "health_path", source)
    if health_path is not None and not health_path.startswith("/"):
        raise ProfileError(f"{source}: 'health_path' must start with '/', got {health_path!r}")

    managed = [k for k in _MANAGED_KEYS if k in data]
    external = [k for k in _EXTERNAL_KEYS if k in data]
    if managed and external:
        raise ProfileError(
            f"{source}: {' and '.join(repr(k) for k in managed)} cannot be combined with "
            f"{' and '.join(repr(k) for k in external)}; a profile either has the plugin "
            f"launch the server (command/args) or drives an external one (start/stop/url)"
        )
    common: dict[str, Any] = dict(
        name=name,
        path=path,
        engine=engine,
        env=env,
        secret_env=secret_env,
        startup_timeout_s=startup,
        stop_grace_s=stop_grace,
        stop_timeout_s=stop_timeout,
        health_path=health_path,
    )
    if external:
        start = _opt_str(data, "start", source)
        stop = _opt_str(data, "stop", source)
        url = _opt_str(data, "url", source)
        if url is None:
            raise ProfileError(
                f"{source}: {' and '.join(repr(k) for k in external)} need 'url:', the "
                f"base URL where the server answers once started "
                f"(e.g. url: http://127.0.0.1:30000)"
            )
        return ServerProfile(**common, start=start, stop=stop, url=_url(url, source))

    if "args" not in data:
        raise ProfileError(
            f"{source}: no 'args:'; a managed server profile needs the engine's flags "
            f"(at least model-path), an external one needs 'url:'"
        )
    engine_spec = get_engine(engine)
    command = _command(data.get("command"), source, engine_spec)
    args = _args(data["args"], source)
    nice = data.get("nice", 0)
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
        raise ProfileError(
            f"{source}: 'nice' must be an integer from 0 (default) to 19, got {nice!r}"
        )
    engine_version = _opt_str(data, "engine_version", source)
    warnings = _check_flags(engine_spec, command, args, source, engine_version)
    return ServerProfile(
        **common,
        command=command,
        args=args,
        nice=nice,
        engine_version=engine_version,
        flag_warnings=warnings,
    )


def _check_flags(
    engine: Engine, command: list[str], args: dict[str, Any], source: str, version: str | None
) -> tuple[str, ...]:
    """Hold an SGLang profile's flags to SGLang's own parser (:mod:`sglang_flags`) before
    the launch: errors raise :class:`ProfileError`, warnings are returned.

    Only a command that runs SGLang is checked (a ``command:`` running some other program
    takes other flags), and only SGLang: vLLM's parser is not shipped.
    """
    if engine.kind != "sglang" or not any("sglang" in word for word in command):
        return ()
    check = sglang_flags.check_args(args, source, version or sglang_flags.DEFAULT_VERSION)
    if check.skipped is not None:
        return (check.skipped,)
    if check.errors:
        fix = (
            "; a profile for another SGLang release says engine_version: (the check then "
            "uses that release's flag list, or is skipped when none ships)"
        )
        raise ProfileError("\n".join(p.message for p in check.errors) + fix)
    return tuple(p.message for p in check.warnings)


# ---------------------------------------------------------------------- argv


def argv(profile: ServerProfile, host: str = "127.0.0.1", port: int | None = None) -> list[str]:
    """The full command line of a managed server.

    ``--host``/``--port`` are appended from the arguments unless the profile's ``args``
    set them itself, so the plugin can pick a free port per run (two profiles of an A/B
    comparison must not collide) while a profile that pins a port still gets it.
    """
    if profile.external:
        raise ProfileError(
            f"{profile.source}: an external server profile has no command "
            f"line; the plugin runs its 'start:' command instead"
        )
    engine = profile.engine_spec
    words = list(profile.command) + engine.render_args(profile.args)
    if "host" not in profile.args:
        words += [engine.flag("host"), host]
    if "port" not in profile.args:
        if port is None:
            raise ValueError("argv() needs a port when the profile does not set one")
        words += [engine.flag("port"), str(port)]
    return words


def server_args(profile: ServerProfile) -> dict[str, Any]:
    """The profile's arguments as SGLang's ``/get_server_info`` spells them.

    For reports and baseline provenance when the server cannot be asked (or to compare
    what was requested with what it reports).  ``false`` is kept, as it is a statement
    about the deployment (``enable_eplb: false``); ``null`` means "not given" and is
    dropped.
    """
    return {
        key.replace("-", "_"): (list(v) if isinstance(v, (list, tuple)) else v)
        for key, v in profile.args.items()
        if v is not None
    }


def profile_secrets(profile: ServerProfile, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every secret value the profile brings, sorted, each once: what must never be shown.

    The one answer for the launcher (its log, records and errors) and the plugin (which
    registers them with the scrubber for every report, baseline and terminal line):

    * the values of secret-named ``args`` (``api-key``, ``admin-api-key``; each string of a
      list value);
    * the values of ``env`` entries whose name says secret (``HF_TOKEN``) or that
      ``secret_env`` lists;
    * the values, in ``environ`` (the plugin's environment, which the server inherits), of
      the variables ``secret_env`` lists: a profile marks a variable it does not set, as
      much as one it does.  A variable the profile removes (``env: {X: null}``) is still
      scrubbed: its value is a secret whoever holds it.

    Empty values are not secrets (the scrubber would redact every empty string).
    """
    out: set[str] = set()
    for key, value in profile.args.items():
        if not is_secret_flag(key):  # "api" too: SGLang's parser expands it to api-key
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        out.update(v for v in values if isinstance(v, str) and v)
    for key, env_value in profile.env.items():
        if env_value and (is_secret_name(key) or key in profile.secret_env):
            out.add(env_value)
    for name in profile.secret_env:
        inherited = environ.get(name)
        if inherited:
            out.add(inherited)
    return sorted(out)


def described_server_info(profile: ServerProfile, reported: Mapping[str, Any]) -> dict[str, Any]:
    """What baseline provenance records about a deployment the plugin launched.

    SGLang reports its effective arguments (``/get_server_info``, defaults included): that
    is the better record and is kept as it is.  vLLM reports only its version, so there the
    profile's own arguments describe the deployment: a baseline then says
    ``max_num_seqs: 1`` and a provenance diff can name the flag that changed.
    """
    if profile.external or set(reported) - {"version"}:
        return dict(reported)
    return {"engine": profile.engine, **server_args(profile), **reported}


# ---------------------------------------------------------------------- helpers


def _did_you_mean(key: object, choices: tuple[str, ...]) -> str:
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _opt_str(data: Mapping[str, Any], key: str, source: str) -> str | None:
    if key not in data or data[key] is None:
        return None
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{source}: '{key}' must be a non-empty string, got {described(value)}")
    return value.strip()


def _seconds(
    data: Mapping[str, Any], key: str, default: float, source: str, *, zero_ok: bool
) -> float:
    """A finite number of seconds, > 0 (or >= 0 with ``zero_ok``); ``default`` when absent."""
    if key not in data:
        return default
    value = data[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_ok)
    ):
        bound = ">= 0" if zero_ok else "> 0"
        raise ProfileError(f"{source}: '{key}' must be a number of seconds {bound}, got {value!r}")
    return float(value)


def _positive(data: Mapping[str, Any], key: str, default: float, source: str) -> float:
    return _seconds(data, key, default, source, zero_ok=False)


def _non_negative(data: Mapping[str, Any], key: str, default: float, source: str) -> float:
    return _seconds(data, key, default, source, zero_ok=True)


def _secret_env(value: object, source: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ProfileError(
            f"{source}: 'secret_env' must be a list of environment variable "
            f"names, got {_type_name(value)}"
        )
    return frozenset(value)


def _url(url: str, source: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProfileError(
            f"{source}: 'url' must be an http(s) base URL such as "
            f"http://127.0.0.1:30000, got {url!r}"
        )
    try:
        _ = parts.port  # urlsplit checks the port only when it is read
    except ValueError:
        raise ProfileError(f"{source}: 'url' has an invalid port: {url!r}") from None
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _command(value: object, source: str, engine: Engine) -> list[str]:
    if value is None:
        return engine.default_command()
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ProfileError(
                f"{source}: 'command' cannot be split into words: {exc} (in {value!r})"
            ) from None
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ProfileError(
            f"{source}: 'command' must be a string (split like a shell "
            f"would) or a list of strings, got {_type_name(value)}"
        )
    if not words:
        raise ProfileError(f"{source}: 'command' is empty")
    return words


def _args(value: object, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ProfileError(
            f"{source}: 'args' must be a mapping of flag -> value "
            f"(e.g. tp-size: 8), got {_type_name(value)}"
        )
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for raw_key, v in value.items():
        if not isinstance(raw_key, str):
            raise ProfileError(
                f"{source}: args key {raw_key!r} is not a flag name (YAML reads unquoted "
                f"digits as numbers; quote the key)"
            )
        # Accept "--tp-size" and "tp_size" (server_info's spelling): both engines only
        # accept the dashed long option, so normalise rather than fail at launch.
        key = raw_key.strip().lstrip("-").replace("_", "-")
        if not key or any(c.isspace() for c in key) or "=" in key:
            raise ProfileError(f"{source}: args key {raw_key!r} is not a flag name")
        if key in out:
            raise ProfileError(
                f"{source}: args flag {key!r} is given twice (as {spelled[key]!r} and {raw_key!r})"
            )
        out[key] = _arg_value(key, v, source)
        spelled[key] = raw_key
    if "port" in out and out["port"] is not None:
        port = out["port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ProfileError(
                f"{source}: args 'port' must be an integer in [1, 65535], got {port!r}"
            )
    if "host" in out and out["host"] is not None and not isinstance(out["host"], str):
        raise ProfileError(f"{source}: args 'host' must be a string, got {out['host']!r}")
    return out


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(text: str, source: str, where: str) -> str:
    """``${NAME}`` and ``${NAME:-default}`` from the environment, as a shell would.

    Model paths differ per machine (and a CI job builds its model somewhere else), so a
    reviewed profile names the variable rather than one person's path.  An unset variable
    without a default is an error naming it, never an empty string passed to the server.
    """

    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value:
            return value
        if m.group(2) is not None:
            return m.group(2)
        raise ProfileError(
            f"{source}: {where} uses ${{{m.group(1)}}}, which is not set; "
            f"export it or give a default as ${{{m.group(1)}:-value}}"
        )

    return _VAR.sub(sub, text) if "${" in text else text


def _arg_value(key: str, v: object, source: str) -> Any:
    if isinstance(v, str):
        return _expand(v, source, f"args '{key}'")
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        raise ProfileError(f"{source}: args '{key}' must be finite, got {v!r}")
    if isinstance(v, _SCALARS):
        return v
    if isinstance(v, list):
        if not v or not all(isinstance(x, _SCALARS) and not isinstance(x, bool) for x in v):
            raise ProfileError(
                f"{source}: args '{key}' is a list; it must be a non-empty list of numbers "
                f"or strings (written as --{key} v1 v2 ...)"
            )
        return [_expand(x, source, f"args '{key}'") if isinstance(x, str) else x for x in v]
    if isinstance(v, Mapping):
        return dict(v)  # passed as one JSON word; keys are strings after YAML anyway
    raise ProfileError(
        f"{source}: args '{key}' has unsupported value {v!r}; use true "
        f"(bare flag), false/null (left out), a number, a string or a list"
    )


def _env(value: object, source: str) -> dict[str, str | None]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ProfileError(
            f"{source}: 'env' must be a mapping of variable -> value, got {_type_name(value)}"
        )
    out: dict[str, str | None] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ProfileError(f"{source}: env variable name {k!r} is invalid")
        if v is None:
            out[k] = None
        elif isinstance(v, bool):
            raise ProfileError(
                f"{source}: env {k} is a YAML boolean ({v!r}); environment values are "
                f'text, so quote it (e.g. {k}: "1" or {k}: "true")'
            )
        elif isinstance(v, (str, int, float)):
            out[k] = _expand(str(v), source, f"env {k}")
        else:
            raise ProfileError(
                f"{source}: env {k} must be a string or a number, got {_type_name(v)}"
            )
    return out
