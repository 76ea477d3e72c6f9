"""The "culprit" section of the terminal and of the Markdown summary: the search of a
``--perf-culprit`` run, read from the report's ``culprit`` dict (docs/reference/json-report.md), so a saved
report prints the same lines.

A short table, one row per paired comparison the search made (the deploy gate's own comparison
of the whole candidate first): the changes applied to the reference, the effect with its 90%
interval, the verdict, why it was asked (``split``, ``alone``, ``without``, ``dd``) and its
launches; then the answer, with what it cost.
"""

from __future__ import annotations

from typing import Any, Mapping

from pytest_kimi.printable import printable
from pytest_kimi.report.terminal import fit_lines


def _answer(section: Mapping[str, Any]) -> str:
    named = [printable(str(k)) for k in section.get("named") or []]
    cost = (
        f"{section.get('probes', 0)} comparison(s), {section.get('launches', 0)} launch(es), "
        f"{float(section.get('server_s') or 0):.0f} s of server time"
    )
    status = section.get("status")
    if status == "nothing-to-explain" and section.get("problem"):
        return f"nothing to explain: {printable(str(section['problem']))}"
    if section.get("problem"):
        return f"no search: {printable(str(section['problem']))}"
    if status == "named":
        return f"named: {' + '.join(named)} ({cost})"
    if status == "nothing-to-explain":
        return f"nothing to explain ({cost})"
    hint = ", ".join(printable(str(k)) for k in section.get("hypothesis") or []) or "none"
    return f"undecided, best hypothesis: {hint} ({cost})"


def _effect(step: Mapping[str, Any]) -> str:
    if step.get("untestable"):
        return f"did not start: {printable(str(step['untestable']))}"
    change, ci = step.get("change_pct"), step.get("ci90")
    if change is None or not ci:
        return "not measured"
    return f"{change:+.1f}% (CI {ci[0]:+.1f}% .. {ci[1]:+.1f}%)"


def _applied(step: Mapping[str, Any]) -> str:
    return "+".join(printable(str(k)) for k in step.get("applied") or []) or "(reference)"


def format_culprit(section: Mapping[str, Any], width: int) -> list[str]:
    """The terminal's lines: what was searched, one line per step, the answer."""
    changes = [printable(str(c)) for c in section.get("changes") or []]
    if section.get("status") == "nothing-to-explain" and not section.get("steps"):
        pair = (
            f"{printable(str(section.get('candidate')))} against "
            f"{printable(str(section.get('reference')))}"
        )
        return fit_lines([f"{pair}: {_answer(section)}"], width)
    lines = [
        f"{printable(str(section.get('test')))} {printable(str(section.get('level')))}: "
        f"{printable(str(section.get('candidate')))} against "
        f"{printable(str(section.get('reference')))}, {len(changes)} change(s): "
        + (", ".join(changes) or "none")
    ]
    for step in section.get("steps") or []:
        lines.append(
            f"  {_applied(step)}  {_effect(step)}  {step.get('verdict')}  "
            f"[{step.get('purpose')}, {step.get('launches')} launch(es)]"
        )
    for note in section.get("notes") or []:
        lines.append(f"  note: {printable(str(note))}")
    lines.append(_answer(section))
    return fit_lines(lines, width)


def markdown_culprit(section: Mapping[str, Any]) -> list[str]:
    """The Markdown summary's section: the same table, then the answer."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "### Which change did it",
        "",
        cell(
            f"{printable(str(section.get('test')))} {printable(str(section.get('level')))}: "
            f"{printable(str(section.get('candidate')))} against "
            f"{printable(str(section.get('reference')))}"
        ),
        "",
        "| applied to the reference | change (90% CI) | verdict | step | launches |",
        "|---|---|---|---|---|",
    ]
    for step in section.get("steps") or []:
        lines.append(
            f"| {cell(_applied(step))} | {cell(_effect(step))} | {step.get('verdict')} | "
            f"{step.get('purpose')} | {step.get('launches')} |"
        )
    lines += ["", f"**{cell(_answer(section))}**", ""]
    return lines


__all__ = ["format_culprit", "markdown_culprit"]
