"""The "race" section of the terminal, of the Markdown summary and of the HTML page: which
deployment of a ``--perf-race`` run is best, read from the report's ``race`` dict
(docs/reference/json-report.md), so a saved report prints the same lines.

One row per deployment, best first: its value with the 90% interval of that value, how far it
is from the top with the interval of that ratio (wholly below zero when the top beats it), the
chance it is the fastest, its launches, and what became of it (who eliminated it in which
round, at what adjusted p; why it did not start).  Then the answer, with what it cost against
the full grid the race replaced: the point of racing is the server time it saves, so the
answer says how much.

The rows are built once (:func:`race_rows`) as plain printable text, and each sink only lays
them out: the terminal as lines, Markdown as a table (cells escaped as
:func:`pytest_kimi.report.markdown_cell.cell`), HTML as a table (escaped by the page kit), so the
three never disagree.  Deployment names come from profile files and reasons quote servers, so
every one goes through :func:`~pytest_kimi.printable.printable` here, before any sink.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from pytest_kimi.printable import printable
from pytest_kimi.report.markdown_cell import cell
from pytest_kimi.report.terminal import fit_lines

NAME_LIMIT = 120
"""Characters of a deployment name kept: a name is a label, not a place for a whole file."""

UNITS = {
    "tok_s": "tok/s",
    "tok_s_per_gpu": "tok/s/GPU",
    "frontier": "tok/s/GPU",
    "capacity": "",
}
"""The unit of a ranking value per objective kind (``objective.unit`` wins when the run layer
gives one): ``frontier`` ranks tok/s per GPU at the per-user floor; a capacity is a load
level whose kind (concurrency or rate) the objective's text says."""


HEADER = (
    "rank",
    "deployment",
    "value (90% CI)",
    "vs best (90% CI)",
    "P(best)",
    "launches",
    "status",
)
"""The ranking table's columns, the same in Markdown and HTML."""


def name(value: Any) -> str:
    """A deployment name as shown anywhere: printable, capped."""
    return printable(str(value), NAME_LIMIT)


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (a missing figure, a NaN, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _pair(value: Any) -> tuple[float, float] | None:
    """A ``[lo, hi]`` interval of finite numbers, or None."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    lo, hi = _number(value[0]), _number(value[1])
    return None if lo is None or hi is None else (lo, hi)


def _figure(value: float) -> str:
    """``1,234.5``: thousands separated, one decimal (``0.987`` for small figures)."""
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3g}"


def unit(section: Mapping[str, Any]) -> str:
    """The unit of the ranking's values (empty when the objective has none)."""
    objective = section.get("objective")
    if isinstance(objective, Mapping):
        given = objective.get("unit")
        if given:
            return printable(str(given), 40)
        return UNITS.get(str(objective.get("kind")), "")
    return ""


def objective_text(section: Mapping[str, Any]) -> str:
    """What was raced, in words: the objective's ``text`` (or the string the run layer gave),
    with the per-user floor when there is one."""
    objective = section.get("objective")
    if isinstance(objective, Mapping):
        words = str(objective.get("text") or objective.get("test") or objective.get("kind") or "?")
        floor = _number(objective.get("min_request_tok_s"))
        if floor is not None:
            words += f", at least {_figure(floor)} tok/s per user"
        return printable(words)
    return printable(str(objective)) if objective else "the objective"


def value_text(entry: Mapping[str, Any], units: str) -> str:
    """``1,234.5 tok/s (CI 1,200.0 .. 1,260.0)``; ``no figure`` for a deployment without."""
    value = _number(entry.get("value"))
    if value is None:
        return "no figure"
    shown = f"{_figure(value)} {units}".rstrip()
    ci = _pair(entry.get("ci90"))
    return shown + (f" (CI {_figure(ci[0])} .. {_figure(ci[1])})" if ci else "")


def vs_best_text(entry: Mapping[str, Any], top: bool) -> str:
    """``-12.3% (CI -15.0% .. -9.6%)``; ``top`` for the top of the ranking (the reference of
    every other ratio); ``-`` without a figure."""
    pct = _number(entry.get("vs_best_pct"))
    ci = _pair(entry.get("vs_best_ci90_pct"))
    if top and pct is not None and not ci:
        return "top"
    if pct is None:
        return "-"
    return f"{pct:+.1f}%" + (f" (CI {ci[0]:+.1f}% .. {ci[1]:+.1f}%)" if ci else "")


def p_best_text(entry: Mapping[str, Any]) -> str:
    """``97%``; ``<1%`` and ``>99%`` rather than a rounded 0% or 100% the bootstrap cannot
    claim; ``-`` before the noise is measured."""
    p = _number(entry.get("p_best"))
    if p is None:
        return "-"
    if 0 < p < 0.005:
        return "<1%"
    if 0.995 < p < 1:
        return ">99%"
    return f"{p:.0%}"


def status_text(entry: Mapping[str, Any]) -> str:
    """What became of it: ``winner``, ``tie``, ``undecided``, ``racing``, or ``eliminated in
    round 2: slower than ...`` / ``failed in round 1: did not start: ...`` with the reason."""
    status = str(entry.get("status") or "?")
    if status not in ("eliminated", "failed"):
        return printable(status, 40)
    where = (
        f"{status} in round {entry['eliminated_in_round']}"
        if entry.get("eliminated_in_round")
        else status
    )
    reason = entry.get("reason")
    if reason:
        return f"{where}: {printable(str(reason))}"
    by = entry.get("beaten_by")
    if by:
        p = _number(entry.get("p_value"))
        return f"{where} by {name(by)}" + (f", p={p:.2g}" if p is not None else "")
    return where


def race_rows(section: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The ranking as rows of :data:`HEADER`'s columns, best first, every cell printable."""
    units = unit(section)
    rows: list[tuple[str, ...]] = []
    for rank, entry in enumerate(_ranking(section), 1):
        rows.append(
            (
                str(rank),
                name(entry.get("deployment")),
                value_text(entry, units),
                vs_best_text(entry, rank == 1),
                p_best_text(entry),
                str(entry.get("launches", "-")),
                status_text(entry),
            )
        )
    return rows


def _ranking(section: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in section.get("ranking") or [] if isinstance(e, Mapping)]


def _names(values: Any) -> str:
    return ", ".join(name(v) for v in values or []) or "none"


def _seconds(value: float) -> str:
    return f"{value:,.0f} s"


def cost_text(section: Mapping[str, Any]) -> str:
    """``9 launch(es) in 3 round(s), 812 s of server time: 34% of the 2,400 s of the full
    grid``: the grid comparison is what the race saved."""
    cost = f"{section.get('launches', 0)} launch(es) in {section.get('rounds', 0)} round(s)"
    spent = _number(section.get("server_s"))
    if spent is None:
        return cost
    cost += f", {_seconds(spent)} of server time"
    grid = _number(section.get("grid_server_s"))
    if grid is not None and grid > 0:
        cost += f": {spent / grid:.0%} of the {_seconds(grid)} of the full grid"
    return cost


def answer_text(section: Mapping[str, Any]) -> str:
    """The race's answer, with what it cost and where the winner's profile was written."""
    stop = section.get("stop")
    cost = cost_text(section)
    if section.get("problem") and not stop:
        return f"no race: {printable(str(section['problem']))}"
    if stop == "winner" and section.get("winner"):
        winner = name(section["winner"])
        ranking = _ranking(section)
        runner = ranking[1] if len(ranking) > 1 else None
        gap = _number(runner.get("vs_best_pct")) if runner else None
        # the runner-up's ratio to the winner, turned round: the winner's lead over it
        ahead = (
            f", {(100.0 / (100.0 + gap) - 1.0) * 100.0:+.1f}% over {name(runner.get('deployment'))}"
            if runner is not None and gap is not None and gap > -100.0
            else ""
        )
        answer = f"winner: {winner}{ahead} ({cost})"
    elif stop == "tie":
        tolerance = _number(section.get("tolerance"))
        within = f" within {tolerance * 100:g}%" if tolerance is not None else ""
        answer = f"tie{within}, no winner: {_names(section.get('tie'))} ({cost})"
    elif stop == "budget":
        answer = (
            f"undecided: the budget ended with {_names(section.get('undecided'))} "
            f"still racing ({cost})"
        )
    elif stop == "no-deployment":
        answer = f"no deployment started ({cost})"
    else:
        answer = f"racing: {_names(section.get('undecided'))} ({cost})"
    if section.get("winner_profile"):
        answer += f"; the winner's profile: {printable(str(section['winner_profile']))}"
    return answer


def head_text(section: Mapping[str, Any]) -> str:
    """What was raced and under which rule: the objective, the deployments, the tolerance and
    the false-elimination bound (with the per-look level it was spent as), the launch noise."""
    ranking = _ranking(section)
    parts = [f"{objective_text(section)}: {len(ranking)} deployment(s)"]
    tolerance = _number(section.get("tolerance"))
    if tolerance is not None:
        parts.append(f"tolerance {tolerance * 100:g}%")
    alpha = _number(section.get("alpha"))
    if alpha is not None:
        nominal = _number(section.get("nominal_alpha"))
        per_look = f" ({nominal:.3g} per look)" if nominal is not None else ""
        parts.append(f"the best eliminated with probability at most {alpha:g}{per_look}")
    sigma = _number(section.get("launch_sigma"))
    if sigma is not None:
        parts.append(f"launch noise {sigma * 100:.1f}%")
    return ", ".join(parts)


def format_race(section: Mapping[str, Any], width: int) -> list[str]:
    """The terminal's lines: what was raced, one line per deployment (best first), the answer."""
    lines = [head_text(section)]
    for row in race_rows(section):
        rank, deployment, value, vs_best, p_best, launches, status = row
        lines.append(
            f"  {rank}. {deployment}  {value}  {vs_best}  P(best) {p_best}  "
            f"{launches} launch(es)  {status}"
        )
    lines.append(answer_text(section))
    return fit_lines(lines, width)


def markdown_race(section: Mapping[str, Any]) -> list[str]:
    """The Markdown summary's section: the ranking as a table, then the answer."""
    lines = [
        "### Which deployment is best",
        "",
        cell(head_text(section)),
        "",
        _md_row(HEADER),
        "|" + "---|" * len(HEADER),
    ]
    lines += [_md_row(row, cell) for row in race_rows(section)]
    lines += ["", f"**{cell(answer_text(section))}**", ""]
    return lines


def _md_row(cells: Sequence[str], escape: Callable[[str], str] | None = None) -> str:
    shown = [escape(c) for c in cells] if escape else list(cells)
    return "| " + " | ".join(shown) + " |"


__all__ = [
    "HEADER",
    "answer_text",
    "format_race",
    "head_text",
    "markdown_race",
    "race_rows",
]
