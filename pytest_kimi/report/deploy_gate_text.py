"""The terminal's "deploy gate" section: the paired comparison of a ``--perf-max-launches`` run,
read from the report's ``deploy_gate`` dict (docs/reference/json-report.md), so a saved report prints the
same lines."""

from __future__ import annotations

from pytest_kimi.printable import printable
from pytest_kimi.report.terminal import fit_lines
from pytest_kimi.wire import DeployGateEntry

_GREEN = frozenset({"pass", "improved"})
"""The verdicts a deploy gate says nothing more about: decided within the tolerance, or faster."""


def format_deploy_gate(section: DeployGateEntry, width: int) -> list[str]:
    """The section's lines: how the experiment ran, one line per level with its verdict, the
    change and its interval, the launches it rests on and the smallest drop it could have
    caught, then the notes and one line that says what the job's colour means."""
    levels = list(section.get("levels") or [])
    reference = printable(str(section.get("reference")))
    candidates = list(dict.fromkeys(printable(str(lv.get("candidate"))) for lv in levels))
    lines = [
        f"{', '.join(candidates) or 'the candidate'} against {reference}: paired launches in "
        f"ABBA blocks, at most {section.get('max_launches')}, stopped once decided; "
        f"tolerance {float(section.get('tolerance') or 0) * 100:g}%, "
        f"false alarms at most {section.get('alpha')} over all looks"
    ]
    for name, changes in (section.get("changes") or {}).items():
        shown = "; ".join(printable(str(c)) for c in changes) or "nothing the server reports"
        lines.append(f"  changed on {printable(str(name))}: {shown}")
    for lv in levels:
        lines.append(
            f"  {printable(str(lv.get('nodeid')))} {printable(str(lv.get('label')))}: "
            f"{printable(str(lv.get('text')))}"
        )
    for note in section.get("notes") or []:
        lines.append(f"  note: {printable(str(note))}")
    verdicts = [str(lv.get("verdict")) for lv in levels]
    if levels and all(v in _GREEN for v in verdicts):
        lines.append("every level decided: within the tolerance, or faster")
    elif levels:
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
        lines.append(f"levels: {counts}")
    return fit_lines(lines, width)


__all__ = ["format_deploy_gate"]
