"""The merge rule of a baseline update: what a file holds after recording on top of it.

A partial re-record (one level of a sweep) must not silently lose the other levels, nor keep
them next to numbers from a different setup under a provenance block that describes only the
new ones.  :func:`merge` is that rule, in one place; writing is
:meth:`pytest_kimi.baseline.store.BaselineStore.update`, reporting is
:mod:`pytest_kimi.baseline.review`.  No pytest, no I/O.
"""

from __future__ import annotations

import dataclasses

from pytest_kimi.baseline.model import ProvenanceConflict, TestBaseline
from pytest_kimi.baseline.provenance import provenance_diff

__all__ = ["merge"]


def merge(old: TestBaseline | None, new: TestBaseline, *, drop_stale: bool = False) -> TestBaseline:
    """The file content after recording ``new`` on top of ``old``.

    Rule: a level in ``new`` replaces the level with the same workload; levels of ``old`` that
    ``new`` did not measure are kept unchanged; provenance becomes ``new``'s, with the session
    ids of both when old levels are kept.  Keeping old levels is refused
    (:class:`ProvenanceConflict`) when the provenance differs in a non-volatile way, since one
    provenance block would then describe numbers it did not produce; ``drop_stale=True``
    drops those levels instead.
    """
    if old is None:
        return new
    if (old.test, old.profile) != (new.test, new.profile):
        raise ValueError(f"cannot merge {old.test} [{old.profile}] into {new.test} [{new.profile}]")
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
