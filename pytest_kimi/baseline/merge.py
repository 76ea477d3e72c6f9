"""The merge rule of a baseline update: what a file holds after recording on top of it.

A partial re-record (one level of a sweep) must not silently lose the other levels, nor keep
them next to numbers from a different setup under a provenance block that describes only the
new ones.  :func:`merge` is that rule, in one place; writing is
:meth:`pytest_kimi.baseline.store.BaselineStore.update`, reporting is
:mod:`pytest_kimi.baseline.review`.  No pytest, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pytest_kimi.baseline.model import LevelBaseline, ProvenanceConflict, SessionNoise, TestBaseline
from pytest_kimi.baseline.provenance import deployment_diff, provenance_diff

__all__ = ["NoisePool", "merge", "pool_noise"]

NoisePool = Callable[[LevelBaseline, LevelBaseline], SessionNoise | None]
"""(old level, new level) -> the session noise both recordings measure, or None to leave the
new level's own (:func:`pytest_kimi.gate.noise_evidence.occasion_noise`, passed in by the run:
the statistics live above this layer)."""


def pool_noise(old: TestBaseline, new: TestBaseline, pool: NoisePool) -> TestBaseline:
    """``new`` with each re-recorded level's session noise pooled with its old recording's,
    where the two recordings are of the same deployment: a provenance that differs only in
    volatile fields (session ids, times) or in the launch's lottery (its seed).  A changed deployment (new flags, another model or
    engine version: an approved tuning) starts its noise afresh, since the distance between
    the two recordings is then the change, not noise."""
    if deployment_diff(old.provenance, new.provenance):
        return new
    levels = []
    for level in new.levels:
        before = old.level_for(level.workload)
        noise = pool(before, level) if before is not None else None
        levels.append(level if noise is None else dataclasses.replace(level, session_noise=noise))
    return dataclasses.replace(new, levels=tuple(levels))


def merge(
    old: TestBaseline | None,
    new: TestBaseline,
    *,
    drop_stale: bool = False,
    pool: NoisePool | None = None,
) -> TestBaseline:
    """The file content after recording ``new`` on top of ``old``.

    Rule: a level in ``new`` replaces the level with the same workload; levels of ``old`` that
    ``new`` did not measure are kept unchanged; provenance becomes ``new``'s, with the session
    ids of both when old levels are kept.  Keeping old levels is refused
    (:class:`ProvenanceConflict`) when the provenance differs in a non-volatile way, since one
    provenance block would then describe numbers it did not produce; ``drop_stale=True``
    drops those levels instead.  With ``pool``, a re-recorded level of the same deployment
    keeps the session noise both recordings measure (:func:`pool_noise`).
    """
    if old is None:
        return new
    if (old.test, old.profile) != (new.test, new.profile):
        raise ValueError(f"cannot merge {old.test} [{old.profile}] into {new.test} [{new.profile}]")
    if pool is not None:
        new = pool_noise(old, new, pool)
    measured = set(new.workloads)
    stale = [level for level in old.levels if level.workload not in measured]
    # a capacity this run did not measure is kept like a level it did not measure
    stale_capacity = old.capacity if new.capacity is None else None
    if not stale and stale_capacity is None:
        return new
    if drop_stale:
        return new
    changes = provenance_diff(old.provenance, new.provenance)
    if changes:
        shown = "; ".join(str(c) for c in changes[:8]) + ("; ..." if len(changes) > 8 else "")
        what = [level.workload.label() for level in stale]
        if stale_capacity is not None:
            what.append(f"capacity {stale_capacity.text()}")
        raise ProvenanceConflict(
            f"{new.test} [{new.profile}]: levels {', '.join(what)} "
            f"were recorded under a different setup ({shown}) and this run did not re-measure "
            f"them; re-record every level of the test, or drop the stale levels"
        )
    session_ids = list(old.provenance.session_ids)
    session_ids += [s for s in new.provenance.session_ids if s not in session_ids]
    provenance = dataclasses.replace(new.provenance, session_ids=tuple(session_ids))
    return dataclasses.replace(
        new,
        provenance=provenance,
        levels=new.levels + tuple(stale),
        capacity=new.capacity if new.capacity is not None else stale_capacity,
    )
