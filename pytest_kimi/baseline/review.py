"""What a baseline update changed, told for review: per-level lines and the git commands.

Baselines move through code review, so an update ends with what a reviewer needs: each
level's old and new figure, the provenance changes that may explain them, and the commands that
show the diff and commit it.  Used for the terminal summary of ``--update-baselines`` and
for PR descriptions.  No pytest; no git is run here, only commands are written.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_kimi.baseline.model import CapacityBaseline, SessionNoise, TestBaseline, WorkloadKey
from pytest_kimi.baseline.provenance import FieldChange, provenance_diff
from pytest_kimi.baseline.values import ABSENT, scalar_text

__all__ = [
    "LevelChange",
    "UpdateSummary",
    "git_review_commands",
    "replaced_summary",
    "summarize_update",
]


@dataclass(frozen=True)
class LevelChange:
    """One line of an update summary."""

    workload: WorkloadKey
    old_tok_s: float | None
    new_tok_s: float | None
    status: Literal["new", "changed", "unchanged", "removed"]
    label: str
    noise: SessionNoise | None = None
    """The session noise the written level holds (its recordings measured it), if any."""

    @property
    def delta_pct(self) -> float | None:
        if self.old_tok_s is None or self.new_tok_s is None:
            return None
        return (self.new_tok_s - self.old_tok_s) / self.old_tok_s * 100.0

    def __str__(self) -> str:
        return self._figures() + (
            f", session noise {self.noise.sigma:.4f} on {self.noise.df} df"
            if self.noise is not None and self.status != "removed"
            else ""
        )

    def _figures(self) -> str:
        if self.status == "new":
            return f"{self.label}: {self.new_tok_s} tok/s (new)"
        if self.status == "removed":
            return f"{self.label}: {self.old_tok_s} tok/s (removed)"
        if self.status == "unchanged":
            return f"{self.label}: {self.new_tok_s} tok/s (unchanged)"
        return f"{self.label}: {self.old_tok_s} -> {self.new_tok_s} tok/s ({self.delta_pct:+.1f}%)"


@dataclass(frozen=True)
class UpdateSummary:
    """What a baseline update did, for the terminal report and the PR description."""

    path: Path
    test: str
    profile: str
    created: bool
    levels: tuple[LevelChange, ...]
    provenance_changes: tuple[FieldChange, ...]
    git_commands: tuple[str, ...]
    """Review then commit, e.g. ``git diff -- <path>`` and ``git add <path> && git commit ...``."""
    capacity: str | None = None
    """A ``@capacity`` test's line: old -> new capacity (None when neither side has one)."""
    replaced: str | None = None
    """What was wrong with the corrupt file ``--update-baselines=force`` replaced (None: it
    was read and merged, or there was none)."""

    def lines(self) -> list[str]:
        if self.replaced is not None:
            what = f" (replaced a corrupt file: {self.replaced})"
        else:
            what = " (new file)" if self.created else ""
        out = [f"{self.test} [{self.profile}] -> {self.path}{what}"]
        if self.capacity is not None:
            out.append(f"  {self.capacity}")
        out += [f"  {change}" for change in self.levels]
        out += [f"  provenance: {change}" for change in self.provenance_changes]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines() + [f"  $ {cmd}" for cmd in self.git_commands])


def _display_path(path: Path, cwd: Path | None) -> str:
    base = Path.cwd() if cwd is None else cwd
    try:
        return str(Path(os.path.abspath(path)).relative_to(os.path.abspath(base)))
    except ValueError:
        return str(path)


def git_review_commands(
    paths: Sequence[Path], *, message: str, new_paths: Sequence[Path] = (), cwd: Path | None = None
) -> tuple[str, ...]:
    """Shell commands to review and commit updated baselines (paths quoted for the shell).

    New files are not in ``git diff`` until added, so they get a ``--no-index`` diff instead.
    """
    new_set = {os.path.abspath(p) for p in new_paths}
    shown = [shlex.quote(_display_path(p, cwd)) for p in paths]
    changed = [s for p, s in zip(paths, shown) if os.path.abspath(p) not in new_set]
    created = [s for p, s in zip(paths, shown) if os.path.abspath(p) in new_set]
    commands: list[str] = []
    if changed:
        commands.append(f"git diff -- {' '.join(changed)}")
    commands += [f"git diff --no-index -- /dev/null {s}" for s in created]
    if shown:
        commands.append(f"git add -- {' '.join(shown)} && git commit -m {shlex.quote(message)}")
    return tuple(commands)


def summarize_update(
    old: TestBaseline | None, new: TestBaseline, path: Path, *, cwd: Path | None = None
) -> UpdateSummary:
    """Per-level lines (``C=8 max_tokens=512: 1520.3 -> 1498.0 tok/s (-1.5%)``), provenance
    changes, and the git commands; ``new`` is the content written (after :func:`merge`)."""
    old_levels = {level.workload: level for level in (old.levels if old else ())}
    all_keys = [lvl.workload for lvl in new.levels] + [
        w for w in old_levels if new.level_for(w) is None
    ]
    varying = sorted(
        {
            k
            for w in all_keys
            for k in w.keys()
            if len({scalar_text(x.get(k, ABSENT)) for x in all_keys}) > 1
        }
    )
    changes: list[LevelChange] = []
    for level in new.levels:
        before = old_levels.get(level.workload)
        label = level.workload.label(varying)
        noise = level.session_noise
        if before is None:
            changes.append(LevelChange(level.workload, None, level.tok_s, "new", label, noise))
        elif before == level:
            changes.append(
                LevelChange(level.workload, before.tok_s, level.tok_s, "unchanged", label, noise)
            )
        else:
            changes.append(
                LevelChange(level.workload, before.tok_s, level.tok_s, "changed", label, noise)
            )
    for workload, before in old_levels.items():
        if new.level_for(workload) is None:
            changes.append(
                LevelChange(workload, before.tok_s, None, "removed", workload.label(varying))
            )
    prov = tuple(provenance_diff(old.provenance, new.provenance)) if old else ()
    created = old is None
    verb = "add" if created else "update"
    commands = git_review_commands(
        [path],
        message=f"kimi baseline ({new.profile}): {verb} {new.test}",
        new_paths=[path] if created else [],
        cwd=cwd,
    )
    return UpdateSummary(
        path,
        new.test,
        new.profile,
        created,
        tuple(changes),
        prov,
        commands,
        capacity_change(old.capacity if old else None, new.capacity),
    )


def replaced_summary(summary: UpdateSummary, problem: str, cwd: Path | None) -> UpdateSummary:
    """``summary`` (of ``new`` written as if there had been no file) for a corrupt file that
    was replaced: the file is in git already, so its review is a plain ``git diff``."""
    commands = git_review_commands(
        [summary.path],
        message=f"kimi baseline ({summary.profile}): replace corrupt {summary.test}",
        cwd=cwd,
    )
    return dataclasses.replace(summary, created=False, replaced=problem, git_commands=commands)


def capacity_change(old: CapacityBaseline | None, new: CapacityBaseline | None) -> str | None:
    """``capacity C=40 [40..44], boundary 41.3 -> C=36 [36..39], boundary 37.2 (-9.9%)``: the
    change is the boundary's (else the capacity's), as the gate compares them."""
    if new is None:
        return None if old is None else f"capacity {old.text()} (kept)"
    if old is None:
        return f"capacity {new.text()} (new)"
    if old == new:
        return f"capacity {new.text()} (unchanged)"
    before = old.estimate if old.estimate is not None else old.value
    after = new.estimate if new.estimate is not None else new.value
    change = (
        f" ({(after / before - 1) * 100:+.1f}%)"
        if before and after and old.workload == new.workload
        else ""
    )
    return f"capacity {old.text()} -> {new.text()}{change}"
