"""Open-loop rate ramps: ``@throughput(rate=ramp(1, 16, steps=4))``.

A ramp is a sweep of open-loop arrival rates written as its two ends and a number of steps,
because the question it answers -- where does the server stop keeping up with the load
offered to it -- is asked over a range, not at hand-picked points.  Each step is one level of
an ordinary open-loop sweep (``rate=[1, 6, 11, 16]``): its own trials, its own window, its own
baseline keyed by its rate.  Why steps as levels and not one continuous ramp whose report is
cut into steps: a continuous ramp's later steps inherit the queue the earlier ones left, so a
step's figures would depend on every step before it, trials of a step would not be
independent samples, and a regression at one rate would show up at the next ones too.  A step
that starts from an idle server measures the server at that rate alone, which is what the
statistical gate compares with a baseline; what a ramp adds to a plain list is the reading of
the result: every report shows the rate offered, the rate the client sent and the rate the
server completed requests at, step by step (``docs/guide/workloads.md``, "Rate ramps").

Pure and pytest-free: :func:`ramp` only records its arguments; ``@throughput`` validates
them at collection (:func:`check`) so a bad ramp is reported with the test's name, like every
other marker argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_STEPS = 4
"""Steps of a ramp that does not say: both ends and two rates between them."""
MAX_STEPS = 100
"""More levels than this is a typo (steps=1000), not a test anyone can wait for."""
SPACINGS = ("linear", "geometric")
SIGNIFICANT_DIGITS = 4
"""Step rates are rounded to this many significant digits: they label levels and key
baselines, where ``1.3333333333333333`` would be noise."""


class RampError(ValueError):
    """A ramp that cannot be run; the message says which argument and what is allowed."""


@dataclass(frozen=True, slots=True)
class Ramp:
    """``ramp(start, stop, steps=4, duration_s=None, spacing="linear")``; see :func:`ramp`."""

    start: Any
    stop: Any
    steps: Any = DEFAULT_STEPS
    duration_s: Any = None
    """The whole ramp's arrivals, in seconds (of the server's clock, like ``duration_s=``):
    each step's trial sends for ``duration_s / steps``.  None: each step is sized like any
    rate level (``requests=``, ``duration_s=``, or 20 s of arrivals)."""
    spacing: Any = "linear"

    def __repr__(self) -> str:
        args = [_num(self.start), _num(self.stop), f"steps={self.steps!r}"]
        if self.duration_s is not None:
            args.append(f"duration_s={_num(self.duration_s)}")
        if self.spacing != "linear":
            args.append(f"spacing={self.spacing!r}")
        return f"ramp({', '.join(args)})"

    @property
    def rates(self) -> tuple[float, ...]:
        """The steps' rates, first to last (call :func:`check` first)."""
        n = int(self.steps)
        lo, hi = float(self.start), float(self.stop)
        if self.spacing == "geometric":
            values = [lo * (hi / lo) ** (k / (n - 1)) for k in range(n)]
        else:
            values = [lo + (hi - lo) * k / (n - 1) for k in range(n)]
        values[0], values[-1] = lo, hi  # the ends exactly as written
        return tuple(_round(v) for v in values)

    @property
    def step_s(self) -> float | None:
        """Seconds of arrivals per step, or None when the ramp leaves it to the marker."""
        return None if self.duration_s is None else float(self.duration_s) / int(self.steps)


def ramp(
    start: float,
    stop: float,
    steps: int = DEFAULT_STEPS,
    *,
    duration_s: float | None = None,
    spacing: str = "linear",
) -> Ramp:
    """A rate ramp for ``@throughput(rate=...)``: ``steps`` open-loop levels from ``start`` to
    ``stop`` requests per second, both included.

    ``spacing="linear"`` (default) spaces them evenly (``ramp(1, 16, steps=4)``: 1, 6, 11,
    16); ``"geometric"`` by a constant factor (``ramp(1, 16, steps=5, spacing="geometric")``:
    1, 2, 4, 8, 16), which finds a knee over a wide range in few steps.  ``duration_s``: the
    whole ramp's seconds of arrivals, shared evenly by the steps.  Validated by the marker.
    """
    return Ramp(start, stop, steps, duration_s, spacing)


def check(value: Ramp) -> Ramp:
    """The ramp, or :class:`RampError` naming the first bad argument and the fix."""
    for name in ("start", "stop"):
        x = getattr(value, name)
        if not _number(x) or not (x > 0 and math.isfinite(x)):
            raise RampError(f"{name}={x!r}: expected a rate > 0 (requests per second)")
    if value.start == value.stop:
        raise RampError(
            f"start and stop are both {_num(value.start)}: a ramp needs two different "
            "ends (one rate is rate=" + _num(value.start) + ")"
        )
    steps = value.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= MAX_STEPS:
        raise RampError(f"steps={steps!r}: expected an integer from 2 to {MAX_STEPS}")
    if value.duration_s is not None and (
        not _number(value.duration_s) or not (value.duration_s > 0)
    ):
        raise RampError(f"duration_s={value.duration_s!r}: expected a number of seconds > 0")
    if value.spacing not in SPACINGS:
        raise RampError(
            f"spacing={value.spacing!r}: expected one of {', '.join(map(repr, SPACINGS))}"
        )
    rates = value.rates
    if len(set(rates)) != len(rates):
        raise RampError(
            f"its steps {list(rates)} are not distinct at {SIGNIFICANT_DIGITS} significant "
            "digits: use fewer steps or ends further apart"
        )
    return value


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def _num(x: Any) -> str:
    return format(x, "g") if _number(x) else repr(x)
