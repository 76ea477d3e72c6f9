"""The simulator's timing model and knobs: :class:`SimConfig`.

The simulator exists so that the plugin's own measurements can be checked against a server
whose throughput is known *exactly*.  Everything the server does with time is therefore
derived from this one frozen record, and the record can say in closed form what a client
ought to measure (:meth:`SimConfig.true_tok_s` and friends).

Batching model (continuous batching, as in SGLang): the engine runs decode *steps*; one step
hands one token to every running sequence.  A step over ``b`` sequences lasts::

    (step_base_s + step_per_seq_s * b ** step_exponent) * slowdown / speed

and a step that admits new sequences lasts an extra ``prefill_per_token_s * prompt_tokens``
(also scaled by ``slowdown / speed``); the admitted sequences get their first token at the
end of that step.  At serving time the engine additionally multiplies every step by the
session noise factor (drawn once per server start) and an optional per-step jitter whose
mean is 1, so jitter never moves the average rate.

Only model time is scaled by ``speed``; the fault knobs ``stall_s`` and ``slow_start_s``
are wall-clock seconds, because fault tests reason about them in real time.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "SimConfigError",
    "SimConfig",
    "parse_sim_spec",
    "KNOB_HELP",
]


class SimConfigError(ValueError):
    """A simulator option is unknown or has a bad value.

    A ValueError so callers that only care about "bad configuration" need not import us;
    the message always names where the option came from, so a typo in an ini file or a
    marker points at the right place.
    """


@dataclass(frozen=True)
class _Knob:
    """How one profile field is converted from text and validated."""

    kind: str  # "float" | "int" | "str" | "bool" | "json"
    lo: float | None = None
    lo_open: bool = False
    hi: float | None = None
    optional: bool = False
    help: str = ""

    def describe(self) -> str:
        """Human description of the accepted values, used in error messages."""
        if self.kind == "bool":
            text = "a boolean (true/false, 1/0, yes/no, on/off)"
        elif self.kind == "str":
            text = "a non-empty string"
        elif self.kind == "json":
            text = 'a JSON object, e.g. {"tp_size": 16}'
        else:
            noun = "an integer" if self.kind == "int" else "a finite number"
            if self.lo is not None and self.hi is not None:
                left = "(" if self.lo_open else "["
                text = f"{noun} in {left}{_fmt(self.lo)}, {_fmt(self.hi)}]"
            elif self.lo is not None:
                text = f"{noun} {'>' if self.lo_open else '>='} {_fmt(self.lo)}"
            else:
                text = noun
        if self.optional:
            text += " or 'none'"
        return text


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


_KNOBS: dict[str, _Knob] = {
    "step_base_s": _Knob("float", lo=0.0, help="fixed cost of one decode step, seconds"),
    "step_per_seq_s": _Knob("float", lo=0.0, help="per-sequence step cost coefficient, seconds"),
    "step_exponent": _Knob(
        "float",
        lo=0.0,
        lo_open=True,
        hi=2.0,
        help="exponent on the batch size (below 1: sublinear)",
    ),
    "max_running_requests": _Knob(
        "int", lo=1, hi=1_000_000, help="sequences decoded at once; the rest queue FIFO"
    ),
    "prefill_per_token_s": _Knob("float", lo=0.0, help="extra step time per admitted prompt token"),
    "eos_mean_tokens": _Knob("float", lo=1.0, help="mean answer length when ignore_eos is false"),
    "speed": _Knob("float", lo=0.0, lo_open=True, hi=1e6, help="time scale: 20 = 20x faster"),
    "slowdown": _Knob(
        "float",
        lo=0.0,
        lo_open=True,
        hi=1e6,
        help="step time multiplier: 1.15 = every step takes 1.15 times as long",
    ),
    "noise": _Knob(
        "float", lo=0.0, hi=5.0, help="sigma of the per-server-start log-normal step time factor"
    ),
    "step_jitter": _Knob(
        "float", lo=0.0, hi=5.0, help="sigma of the per-step log-normal jitter (mean 1)"
    ),
    "error_rate": _Knob(
        "float", lo=0.0, hi=1.0, help="fraction of generation requests answered HTTP 500"
    ),
    "stall_after_tokens": _Knob(
        "int", lo=1, optional=True, help="each stream goes silent after this many tokens"
    ),
    "stall_s": _Knob("float", lo=0.0, help="length of that silence, wall-clock seconds"),
    "disconnect_after_tokens": _Knob(
        "int", lo=0, optional=True, help="drop the TCP connection after this many tokens"
    ),
    "malformed_after_tokens": _Knob(
        "int", lo=0, optional=True, help="emit a non-JSON data: line after this many tokens"
    ),
    "cold_steps": _Knob(
        "int",
        lo=0,
        help="a fresh server's first-use costs: its first this many decode steps are slower "
        "(by cold_slowdown at the first step, falling linearly to none)",
    ),
    "cold_slowdown": _Knob(
        "float", lo=1.0, help="step time multiplier at the first step (with cold_steps)"
    ),
    "slow_start_s": _Knob(
        "float", lo=0.0, help="health and generation answer 503 for this long, wall-clock"
    ),
    "abort_on_disconnect": _Knob(
        "bool",
        help="false: keep decoding a request whose client disconnected until it ends (a "
        "server or proxy that does not abort: zombies in the batch)",
    ),
    "keepalive_after_tokens": _Knob(
        "int",
        lo=0,
        optional=True,
        help="after this many tokens each stream sends only SSE comments (': keep-alive'), "
        "never ending: bytes that are not tokens, so no silence timeout fires",
    ),
    "model": _Knob("str", help="served model name"),
    "api_key": _Knob("str", optional=True, help="require Authorization: Bearer <key>"),
    "seed": _Knob("int", lo=0, hi=2**63 - 1, help="seed for noise, jitter, errors, EOS lengths"),
    "server_args": _Knob("json", help="extra keys merged into /get_server_info"),
    "no_usage": _Knob("bool", help="never send usage, even when asked"),
    "metrics_per_request": _Knob(
        "bool",
        help="count generated tokens in /metrics when a "
        "request finishes, as SGLang does, not per token",
    ),
    "stream_interval": _Knob(
        "int",
        lo=1,
        hi=10_000,
        help="like SGLang 0.5.23's --stream-interval: the first token at once, then an event "
        "whenever this many tokens are unsent, the rest with the finish",
    ),
    "disable_radix_cache": _Knob(
        "bool",
        help="no prefix cache: every prompt token is prefilled, "
        "like SGLang's --disable-radix-cache",
    ),
    "no_tokenize": _Knob(
        "bool", help="no /tokenize endpoint (404): clients must estimate prompt lengths"
    ),
    "admin_api_key": _Knob(
        "str",
        optional=True,
        help="admin endpoints (/flush_cache) require Authorization: Bearer "
        "<key>, like SGLang's --admin-api-key",
    ),
    "crash_after_requests": _Knob(
        "int",
        lo=0,
        optional=True,
        help="the process dies (exit 1, traceback on stderr) when "
        "generation request N+1 arrives: a crash mid-sweep",
    ),
    "reasoning_tokens": _Knob(
        "int",
        lo=0,
        hi=1_000_000,
        help="chat only: the first N tokens of each response stream as "
        "delta.reasoning_content, the rest as delta.content, like "
        "SGLang with --reasoning-parser kimi_k2",
    ),
}

_BARE_FLAGS = frozenset({"no_usage"})
"""Knobs the command line takes as a bare flag (``sim/__main__.py``); every other knob, booleans
included, takes ``--name=VALUE``."""

KNOB_HELP: dict[str, str] = {name: knob.help for name, knob in _KNOBS.items()}
"""One-line help per knob, for the CLI and docs."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines how the simulator behaves; validated on construction.

    Defaults are shaped like a Kimi K2.6 deployment on 8 GPUs with expert parallelism:
    about 65 tok/s for a single stream and about 1500 tok/s aggregate at 256 concurrent
    streams, with a sublinear step cost so that batching pays off the way it does on real
    hardware.
    """

    step_base_s: float = 0.0135
    step_per_seq_s: float = 0.001862
    step_exponent: float = 0.8
    max_running_requests: int = 256
    prefill_per_token_s: float = 2e-5
    eos_mean_tokens: float = 64.0
    speed: float = 1.0
    slowdown: float = 1.0
    noise: float = 0.0
    step_jitter: float = 0.0
    error_rate: float = 0.0
    stall_after_tokens: int | None = None
    stall_s: float = 0.0
    disconnect_after_tokens: int | None = None
    malformed_after_tokens: int | None = None
    slow_start_s: float = 0.0
    cold_steps: int = 0
    """A fresh server's first-use costs (JIT-compiled kernels on first shapes, autotuning):
    its first ``cold_steps`` decode steps take up to ``cold_slowdown`` times as long, the
    excess falling linearly to none.  0: none."""
    cold_slowdown: float = 2.0
    abort_on_disconnect: bool = True
    """False: a request whose client went away keeps its slot and decodes to its end, as on a
    server (or behind a proxy) that does not abort on disconnect.  A stationary trial's cut
    streams then still share the next trial's batch (``crosscheck/contamination.py`` notices)."""
    keepalive_after_tokens: int | None = None
    """After this many tokens a stream carries only SSE comments, one every
    ``KEEPALIVE_INTERVAL_S``, and never ends: the hostile stream a trial's wall-clock limit is
    for (the silence timeout never fires, the stationary token budget never fills)."""
    model: str = "kimi-k2.6-sim"
    api_key: str | None = None
    seed: int = 0
    server_args: dict[str, Any] = field(default_factory=dict, hash=False)
    no_usage: bool = False
    metrics_per_request: bool = False
    """``sglang:generation_tokens_total`` rises per finished request (SGLang's tokenizer manager adds a
    request's output tokens when it finishes), not per decode step as vLLM's does."""
    crash_after_requests: int | None = None
    stream_interval: int = 1
    reasoning_tokens: int = 0
    """A thinking phase per chat response: its first ``reasoning_tokens`` tokens (all of them
    when the response is shorter) are reasoning.  They take decode steps like any token, so
    throughput is unchanged and time to first content token is TTFT plus that many steps
    (:meth:`expected_ttfc_s`).  A request turns it off with ``chat_template_kwargs``
    ``{"thinking": false}`` (or ``enable_thinking``) and streams it as content with
    ``"separate_reasoning": false``, as SGLang does."""
    disable_radix_cache: bool = False
    """No prefix cache.  With it (the default, as in SGLang) a prompt's cached prefix costs no
    prefill time (``engine.py``: pages of 16 tokens, at least one token computed)."""
    no_tokenize: bool = False
    """Answer 404 at ``/tokenize``, so clients must estimate prompt lengths."""
    admin_api_key: str | None = None
    """Key of the admin endpoints (``/flush_cache``): SGLang's ``ADMIN_OPTIONAL`` level."""

    def __post_init__(self) -> None:
        _validate(self, "SimConfig")

    # ------------------------------------------------------------------ timing model

    def step_time(self, b: int, *, include_noise: bool = False) -> float:
        """Wall seconds of one decode step over ``b`` sequences, without prefill.

        Includes ``speed`` and ``slowdown``.  The random session noise is excluded unless
        ``include_noise`` is set, because the plain figure is what a profile *promises*; the
        noise factor is what a particular server start happened to draw.
        """
        if b < 0:
            raise ValueError(f"batch size must be >= 0, got {b}")
        t = self.step_base_s + self.step_per_seq_s * float(b) ** self.step_exponent
        t = t * self.slowdown / self.speed
        if include_noise:
            t *= self.noise_factor
        return float(t)

    def prefill_time(self, prompt_tokens: int, *, include_noise: bool = False) -> float:
        """Extra wall seconds a step pays for admitting ``prompt_tokens`` prompt tokens."""
        t = self.prefill_per_token_s * prompt_tokens * self.slowdown / self.speed
        if include_noise:
            t *= self.noise_factor
        return float(t)

    @property
    def noise_factor(self) -> float:
        """The run-to-run step time factor a server started with this profile will use.

        Drawn as exp(N(0, noise)) from ``seed``, so it is deterministic per seed: vary the
        seed between runs to get run-to-run variation, and read this property to know the
        truth a noisy run should be compared with.
        """
        if self.noise == 0.0:
            return 1.0
        return math.exp(random.Random(f"{self.seed}/noise").gauss(0.0, self.noise))

    def batch_size(self, c: int) -> int:
        """Sequences running at once with ``c`` concurrent requests."""
        if c < 1:
            raise ValueError(f"concurrency must be >= 1, got {c}")
        return min(c, self.max_running_requests)

    def true_tok_s(self, c: int, *, include_noise: bool = False) -> float:
        """Steady-state aggregate output tokens/s with ``c`` closed-loop clients.

        This is the ideal decode rate ``b / step_time(b)`` with ``b = min(c,
        max_running_requests)``: it ignores the prefill steps and the one-step gap a slot
        sits empty while a closed-loop client re-sends; :meth:`closed_loop_tok_s` models
        those for a given request shape.
        """
        b = self.batch_size(c)
        return b / self.step_time(b, include_noise=include_noise)

    def request_tok_s(self, c: int, *, include_noise: bool = False) -> float:
        """Decode rate one running sequence sees with ``c`` concurrent requests."""
        return 1.0 / self.step_time(self.batch_size(c), include_noise=include_noise)

    def closed_loop_tok_s(
        self, c: int, output_tokens: int, prompt_tokens: int = 0, *, include_noise: bool = False
    ) -> float:
        """Expected aggregate tok/s of ``c`` closed-loop clients sending fixed-size requests.

        Refines :meth:`true_tok_s` for requests of ``output_tokens`` tokens (ignore_eos)
        and ``prompt_tokens`` prompt tokens, assuming the client's round trip is shorter
        than one step:

        * c == 1: the engine idles between requests, so a request costs its decode steps
          plus one prefill.
        * 1 < c <= max_running_requests: a finished client's next request arrives during
          the following step and joins at the step after, so each slot is empty for one
          step per request; the mean batch is ``c * L / (L + 1)``.
        * c > max_running_requests: the queue refills slots at the next step, the batch
          stays full, and only prefill is amortised.
        """
        if output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {output_tokens}")
        length = float(output_tokens)
        pf = self.prefill_time(prompt_tokens, include_noise=include_noise)
        if c == 1:
            st = self.step_time(1, include_noise=include_noise)
            return length / (length * st + pf)
        m = self.max_running_requests
        if c <= m:
            b = c * length / (length + 1.0)
            admissions = c / (length + 1.0)
        else:
            b = float(m)
            admissions = m / length
        step = self._step_time_real(b, include_noise) + admissions * pf
        return b / step

    def _step_time_real(self, b: float, include_noise: bool) -> float:
        t = self.step_base_s + self.step_per_seq_s * b**self.step_exponent
        t = t * self.slowdown / self.speed
        return float(t * self.noise_factor if include_noise else t)

    def expected_ttft_s(
        self, prompt_tokens: int, c: int = 1, *, include_noise: bool = False
    ) -> float:
        """Expected time to first token, measured at the server, for a new request.

        ``c == 1`` (an idle server) is exact: the request starts a step at once and its
        first token comes at the end of that step, which also pays its prefill.  For
        ``c > 1`` it is the closed-loop figure: the request arrives just after a step
        boundary, waits for the step over the other ``c - 1`` sequences, then joins the
        next one.  Queueing beyond ``max_running_requests`` is not included.
        """
        pf = self.prefill_time(prompt_tokens, include_noise=include_noise)
        if c <= 1:
            return self.step_time(1, include_noise=include_noise) + pf
        b = self.batch_size(c)
        wait = self.step_time(max(b - 1, 1), include_noise=include_noise)
        return wait + self.step_time(b, include_noise=include_noise) + pf

    def expected_e2e_s(
        self, output_tokens: int, c: int = 1, prompt_tokens: int = 0, *, include_noise: bool = False
    ) -> float:
        """End-to-end latency of a request when ``c`` requests of ``output_tokens`` tokens
        start together (a whole-requests trial): one step admits all ``c`` and pays their
        prefill (an upper bound: cached prompt pages cost none), then ``output_tokens - 1``
        decode steps over the batch.  The true latency of every request of such a trial, so
        ``@capacity`` tests have a boundary to check against (the client adds its own time to
        send and read).  Queueing beyond ``max_running_requests`` is not included.
        """
        if output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {output_tokens}")
        b = self.batch_size(max(c, 1))
        step = self.step_time(b, include_noise=include_noise)
        prefill = self.prefill_time(prompt_tokens * b, include_noise=include_noise)
        return output_tokens * step + prefill

    def expected_ttfc_s(
        self, prompt_tokens: int, c: int = 1, *, include_noise: bool = False
    ) -> float:
        """Expected time to first *content* token: TTFT plus one decode step per reasoning
        token (the first content token is token ``reasoning_tokens + 1``).

        Exact for ``c == 1``; for ``c > 1`` the steps are those of the full batch
        ``min(c, max_running_requests)``, as in :meth:`request_tok_s`.
        """
        steps = self.reasoning_tokens * self.step_time(
            self.batch_size(max(c, 1)), include_noise=include_noise
        )
        return self.expected_ttft_s(prompt_tokens, c, include_noise=include_noise) + steps

    # ------------------------------------------------------------------ conversions

    @classmethod
    def from_options(cls, mapping: Mapping[str, str], source: str) -> SimConfig:
        """Build a profile from text key/values (an ini line, a marker, CLI flags).

        Keys are the field names; ``-`` is accepted for ``_``.  Every problem raises
        :class:`SimConfigError` naming ``source``, the key and the accepted values, so the
        user can fix the right line without reading this module.
        """
        values: dict[str, Any] = {}
        shown: dict[str, object] = {}
        for raw_key, raw_value in mapping.items():
            key = str(raw_key).strip().replace("-", "_")
            if key not in _KNOBS:
                raise SimConfigError(
                    f"{source}: unknown sim option {raw_key!r}; allowed options: "
                    f"{', '.join(sorted(_KNOBS))}"
                )
            if key in values:
                raise SimConfigError(f"{source}: sim option {key!r} given twice")
            values[key] = _convert(key, raw_value, source)
            shown[key] = raw_value
        _validate_values(values, source, shown)
        return cls(**values)

    def to_options(self) -> dict[str, str]:
        """The non-default knobs as text, the inverse of :meth:`from_options`."""
        out: dict[str, str] = {}
        default = SimConfig()
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            out[f.name] = _to_text(value)
        return out

    def to_cli_args(self, *, include_secrets: bool = True) -> list[str]:
        """Flags for ``python -m pytest_kimi.sim`` that reproduce this profile.

        Only non-default knobs are emitted.  With ``include_secrets=False`` the API key is
        left out so it can travel in the environment instead of the process list.
        """
        args: list[str] = []
        for name, text in self.to_options().items():
            if name == "api_key" and not include_secrets:
                continue
            flag = "--" + name.replace("_", "-")
            if name in _BARE_FLAGS:
                if getattr(self, name):
                    args.append(flag)
                continue
            args.append(f"{flag}={text}")  # "=" form: safe for values starting with "-"
        return args

    def describe(self) -> dict[str, Any]:
        """All knobs as JSON-friendly values, API key redacted (for /get_server_info)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("api_key", "admin_api_key") and value is not None:
                value = "***"
            out[f.name] = dict(value) if isinstance(value, dict) else value
        return out


# ---------------------------------------------------------------------- helpers


def _to_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def _bad_msg(source: str, key: str, value: object, knob: _Knob, why: str = "") -> SimConfigError:
    extra = f" ({why})" if why else ""
    return SimConfigError(
        f"{source}: invalid value {value!r} for sim option {key!r}: "
        f"expected {knob.describe()}{extra}"
    )


def _convert(key: str, raw: object, source: str) -> Any:
    """Turn the text form of one knob into its Python value (range checked later)."""
    knob = _KNOBS[key]
    if not isinstance(raw, str):
        return raw  # already typed (e.g. from a YAML file); validated in _validate
    text = raw.strip()
    if knob.optional and text.lower() in ("none", "null", ""):
        return None
    if knob.kind == "bool":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise _bad_msg(source, key, raw, knob)
    if knob.kind == "int":
        try:
            return int(text, 10)
        except ValueError:
            raise _bad_msg(source, key, raw, knob) from None
    if knob.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise _bad_msg(source, key, raw, knob) from None
    if knob.kind == "json":
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise _bad_msg(source, key, raw, knob, f"not JSON: {exc.msg}") from None
        return value
    if not text:
        raise _bad_msg(source, key, raw, knob)
    return text


def _validate(profile: SimConfig, source: str) -> None:
    values = {f.name: getattr(profile, f.name) for f in fields(profile)}
    clean = _validate_values(values, source)
    for name, value in clean.items():
        if value is not values[name]:
            object.__setattr__(profile, name, value)


def _validate_values(
    values: dict[str, Any], source: str, shown: Mapping[str, object] | None = None
) -> dict[str, Any]:
    """Check types and ranges; returns values normalised (ints widened to float etc.).

    ``shown`` holds the text the user wrote, so messages quote ``'0'`` rather than ``0.0``.
    """
    out = dict(values)
    for key, value in values.items():
        problem = _check_one(_KNOBS[key], value)
        if isinstance(problem, _Problem):
            show = shown[key] if shown is not None and key in shown else value
            raise _bad_msg(source, key, show, _KNOBS[key], problem.why)
        out[key] = problem
    step_base = out.get("step_base_s", SimConfig.step_base_s)
    per_seq = out.get("step_per_seq_s", SimConfig.step_per_seq_s)
    if step_base == 0.0 and per_seq == 0.0:
        raise SimConfigError(
            f"{source}: sim options 'step_base_s' and 'step_per_seq_s' are both 0; "
            f"a step must take some time, so at least one must be > 0"
        )
    return out


@dataclass(frozen=True)
class _Problem:
    """Marker returned by :func:`_check_one` for a rejected value."""

    why: str = ""


def _check_one(knob: _Knob, value: Any) -> Any:
    """The normalised value, or a :class:`_Problem` when it is out of type or range."""
    if value is None:
        return None if knob.optional else _Problem()
    if knob.kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return _Problem()
        if knob.kind == "int":
            if isinstance(value, float):
                if not value.is_integer():
                    return _Problem()
                value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                return _Problem()
        if knob.lo is not None and (value < knob.lo or (knob.lo_open and value == knob.lo)):
            return _Problem()
        if knob.hi is not None and value > knob.hi:
            return _Problem()
        return value
    if knob.kind == "bool":
        return value if isinstance(value, bool) else _Problem()
    if knob.kind == "str":
        return value if isinstance(value, str) and value.strip() else _Problem()
    # json
    if not isinstance(value, dict):
        return _Problem("not an object")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return _Problem("not JSON-serialisable")
    return value


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside braces, brackets or quotes (for server_args)."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    escaped = False
    start = 0
    for i, ch in enumerate(text):
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_sim_spec(spec: str, source: str) -> SimConfig:
    """Parse ``sim`` or ``sim:key=value,key=value`` into a profile.

    A bare key (``sim:no_usage``) means true for boolean knobs.  The value may contain
    commas inside ``{...}`` so ``server_args={"tp_size":16,"ep_size":16}`` works.
    """
    text = spec.strip()
    head, sep, rest = text.partition(":")
    if head.strip().lower() != "sim":
        raise SimConfigError(
            f"{source}: {spec!r} is not a simulator spec; expected 'sim' or "
            f"'sim:key=value,...' with keys: {', '.join(sorted(_KNOBS))}"
        )
    mapping: dict[str, str] = {}
    if sep and rest.strip():
        for item in _split_top_level(rest):
            item = item.strip()
            if not item:
                continue
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq:
                norm = key.replace("-", "_")
                if norm in _KNOBS and _KNOBS[norm].kind == "bool":
                    value = "true"
                elif norm in _KNOBS:
                    raise SimConfigError(
                        f"{source}: sim option {key!r} needs a value "
                        f"({_KNOBS[norm].describe()}), write {key}=<value>"
                    )
                # unknown keys fall through to from_options' message
            if key in mapping or key.replace("-", "_") in {k.replace("-", "_") for k in mapping}:
                raise SimConfigError(f"{source}: sim option {key!r} given twice")
            mapping[key] = value.strip()
    return SimConfig.from_options(mapping, source)
