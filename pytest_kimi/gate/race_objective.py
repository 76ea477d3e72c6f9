"""What a race ranks deployments by: one figure per launch, read from the launch's test record.

Why a module of its own: the race (:mod:`pytest_kimi.gate.race`) ranks numbers, higher is
better, and knows nothing of tests; the run layer launches deployments and gets test records
(the report's test objects).  Between them sits one question with several answers an operator
asks: the peak tok/s of the sweep, the same per GPU (an EP8 deployment on 8 GPUs against a
TP4 on 4), a ``@capacity`` test's capacity, or the throughput-interactivity frontier's point
at a per-user rate (the tok/s per GPU at the highest load where a user still sees at least
``X`` tok/s: InferenceX's axes, an SLO on interactivity).

A launch whose figure the plugin could not trust (a level ``invalid``, ``error``, ``not-run``)
gives no figure: :class:`NoFigure`, which the race records as a failed launch with its reason,
never as a slow one.

Also here: the frontier's points of one launch (per level: tok/s per user, tok/s per GPU) for
the report's chart; the run layer pools them over a deployment's launches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from pytest_kimi.verdicts import Verdict

__all__ = [
    "KINDS",
    "FrontierPoint",
    "NoFigure",
    "Objective",
    "frontier_points",
    "parse_objective",
    "pool_frontier",
]

KINDS = ("tok_s", "tok_s_per_gpu", "frontier", "capacity")


class NoFigure(Exception):
    """A launch that gave no figure to rank: the message says which level and why."""


@dataclass(frozen=True, slots=True)
class Objective:
    """What the race maximises (``--perf-race-objective``)."""

    kind: str
    level: str | None = None
    """``tok_s:C=64``: that level's tok/s (by the report's label) instead of the peak."""
    min_request_tok_s: float | None = None
    """``frontier:55``: the per-user rate (per-request p50 tok/s) a load must keep."""

    @property
    def per_gpu(self) -> bool:
        return self.kind in ("tok_s_per_gpu", "frontier")

    def text(self, nodeid: str) -> str:
        """How the reports name it: the test, then the figure."""
        if self.kind == "capacity":
            figure = "its capacity"
        elif self.kind == "frontier":
            figure = (
                f"tok/s per GPU at the highest load with per-request p50 >= "
                f"{self.min_request_tok_s:g} tok/s"
            )
        else:
            where = f"at {self.level}" if self.level else "peak over its levels"
            figure = f"tok/s{' per GPU' if self.per_gpu else ''} {where}"
        return f"{nodeid}: {figure}"

    def to_dict(self, nodeid: str) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text(nodeid),
            "test": nodeid,
            "level": self.level,
            "min_request_tok_s": self.min_request_tok_s,
        }

    def value(self, test: Mapping[str, Any], gpus: int | None) -> float:
        """This launch's figure from its test record; :class:`NoFigure` when it has none."""
        if self.kind == "capacity":
            cap = test.get("capacity")
            if not isinstance(cap, Mapping):
                raise NoFigure("the test measured no capacity (is it a @capacity test?)")
            known = Verdict.of(cap.get("verdict"))
            value = cap.get("value")
            if known is None or not known.comparable or not _positive(value):
                why = "; ".join(str(r) for r in cap.get("reasons") or [])
                raise NoFigure(f"capacity {cap.get('verdict')}{': ' + why if why else ''}")
            return float(value)
        levels = _trusted_levels(test)
        if self.level is not None:
            levels = [lv for lv in levels if lv.get("label") == self.level]
            if not levels:
                raise NoFigure(f"the test has no level {self.level}")
        if self.kind == "frontier":
            limit = self.min_request_tok_s or 0.0
            levels = [lv for lv in levels if (lv.get("request_tok_s_p50") or 0.0) >= limit]
            if not levels:
                raise NoFigure(f"no level kept per-request p50 >= {limit:g} tok/s (per user)")
        best = max(float(lv["tok_s"]) for lv in levels)
        if not self.per_gpu:
            return best
        if not gpus:
            raise NoFigure("its GPU count is unknown: give the profile a gpus: field")
        return best / gpus


def _positive(value: object) -> TypeGuard[float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _trusted_levels(test: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every level, each with a figure the run trusted; :class:`NoFigure` naming the first
    that has none (a sweep with a level missing has no peak to rank)."""
    levels = [lv for lv in test.get("levels") or [] if isinstance(lv, Mapping)]
    if not levels:
        raise NoFigure(f"no level was measured ({test.get('outcome') or 'no outcome'})")
    for lv in levels:
        known = Verdict.of(lv.get("verdict"))
        if known is None or not known.comparable or not _positive(lv.get("tok_s")):
            reasons = "; ".join(str(r) for r in lv.get("reasons") or [])[:300]
            raise NoFigure(
                f"{lv.get('label', '?')} {lv.get('verdict')}"
                + (f": {reasons}" if reasons else "")
                + ": no trustworthy figure"
            )
    return levels


def parse_objective(text: str) -> Objective:
    """``tok_s``, ``tok_s:C=64``, ``tok_s_per_gpu``, ``tok_s_per_gpu:C=64``, ``frontier:55``
    or ``capacity``; ValueError naming what is accepted."""
    kind, _, arg = text.strip().partition(":")
    accepted = (
        "expected tok_s, tok_s_per_gpu (either with :LEVEL, e.g. tok_s:C=64), "
        f"frontier:RATE (per-user tok/s, e.g. frontier:55) or capacity, got {text!r}"
    )
    if kind not in KINDS:
        raise ValueError(accepted)
    if kind == "frontier":
        try:
            rate = float(arg)
        except ValueError:
            raise ValueError(accepted) from None
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(accepted)
        return Objective(kind, min_request_tok_s=rate)
    if kind == "capacity":
        if arg:
            raise ValueError(accepted)
        return Objective(kind)
    return Objective(kind, level=arg.strip() or None)


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """One level of one launch on the throughput-interactivity plane."""

    label: str
    concurrency: int | None
    tok_s_per_user: float
    tok_s_per_gpu: float


def frontier_points(test: Mapping[str, Any], gpus: int | None) -> list[FrontierPoint]:
    """The launch's levels that have both figures (a level without a trusted figure is left
    out, not drawn at zero); tok/s per GPU is tok/s where the GPU count is unknown."""
    out = []
    for lv in test.get("levels") or []:
        if not isinstance(lv, Mapping):
            continue
        known = Verdict.of(lv.get("verdict"))
        tok_s, per_user = lv.get("tok_s"), lv.get("request_tok_s_p50")
        if known is None or not known.comparable or not _positive(tok_s):
            continue
        if not _positive(per_user):
            continue
        out.append(
            FrontierPoint(
                str(lv.get("label", "?")),
                lv.get("concurrency"),
                float(per_user),
                float(tok_s) / (gpus or 1),
            )
        )
    return out


def pool_frontier(launches: Sequence[Sequence[FrontierPoint]]) -> list[dict[str, Any]]:
    """Each level's point pooled over a deployment's launches: the mean per-user rate, the
    mean tok/s per GPU with a 90% t-interval over the launches (None from one launch), and
    the number of launches behind it."""
    from scipy import stats

    by_label: dict[str, list[FrontierPoint]] = {}
    for points in launches:
        for p in points:
            by_label.setdefault(p.label, []).append(p)
    out = []
    for label, points in by_label.items():
        ys = [p.tok_s_per_gpu for p in points]
        n = len(ys)
        mean_y = sum(ys) / n
        ci: list[float] | None = None
        if n >= 2:
            sd = math.sqrt(sum((y - mean_y) ** 2 for y in ys) / (n - 1))
            half = float(stats.t.ppf(0.95, n - 1)) * sd / math.sqrt(n)
            ci = [round(mean_y - half, 3), round(mean_y + half, 3)]
        out.append(
            {
                "label": label,
                "concurrency": points[0].concurrency,
                "tok_s_per_user": round(sum(p.tok_s_per_user for p in points) / n, 3),
                "tok_s_per_gpu": round(mean_y, 3),
                "tok_s_per_gpu_ci90": ci,
                "launches": n,
            }
        )
    return sorted(out, key=lambda p: p["tok_s_per_user"])
