"""The reviewed YAML baseline store: recorded throughput per test, kept in git.

Why files in git rather than a database: a throughput target is a claim about the serving stack,
and changing it should go through the same review as a code change.  One module per job:

* :mod:`~pytest_kimi.baseline.model`: what a file holds (:class:`TestBaseline`, its levels,
  :class:`WorkloadKey`), rounding, and the errors;
* :mod:`~pytest_kimi.baseline.paths`: where a test's file lives, what a profile name may be;
* :mod:`~pytest_kimi.baseline.values`: how a value is spelled (absent, as text, timestamps);
* :mod:`~pytest_kimi.baseline.provenance`: who and what recorded the numbers, what differs;
* :mod:`~pytest_kimi.baseline.yaml_io`: the file text (styled writer, strict reader);
* :mod:`~pytest_kimi.baseline.merge`: the file after recording on top of it;
* :mod:`~pytest_kimi.baseline.review`: what an update changed, and the git commands to review it;
* :mod:`~pytest_kimi.baseline.store`: the files of one profile (walk, lookup, atomic write);
* :mod:`~pytest_kimi.baseline.update`: the ``--update-baselines`` flow (not re-exported here).

The names below are the public API; import them from ``pytest_kimi.baseline``.  Nothing in this
package imports pytest: the plugin, CLI helpers and offline scripts share it.
"""

from __future__ import annotations

from pytest_kimi.baseline.merge import merge
from pytest_kimi.baseline.model import (
    BaselineError,
    BaselineExistsError,
    CapacityBaseline,
    LevelBaseline,
    ProvenanceConflict,
    TestBaseline,
    WorkloadKey,
    round_seconds,
    round_tok_s,
)
from pytest_kimi.baseline.paths import DEFAULT_DIRNAME, DEFAULT_PROFILE, baseline_relpath
from pytest_kimi.baseline.provenance import (
    SERVER_INFO_IGNORE,
    FieldChange,
    Provenance,
    incomparable,
    provenance_diff,
)
from pytest_kimi.baseline.review import (
    LevelChange,
    UpdateSummary,
    git_review_commands,
    summarize_update,
)
from pytest_kimi.baseline.store import BaselineLookup, BaselineStore, profile_names
from pytest_kimi.baseline.yaml_io import SCHEMA_VERSION, dumps, loads
from pytest_kimi.baseline.values import utc_timestamp

__all__ = [
    "SCHEMA_VERSION",
    "DEFAULT_DIRNAME",
    "DEFAULT_PROFILE",
    "SERVER_INFO_IGNORE",
    "BaselineError",
    "BaselineExistsError",
    "ProvenanceConflict",
    "WorkloadKey",
    "LevelBaseline",
    "CapacityBaseline",
    "Provenance",
    "TestBaseline",
    "FieldChange",
    "LevelChange",
    "UpdateSummary",
    "BaselineLookup",
    "BaselineStore",
    "baseline_relpath",
    "dumps",
    "loads",
    "merge",
    "profile_names",
    "provenance_diff",
    "incomparable",
    "summarize_update",
    "git_review_commands",
    "round_tok_s",
    "round_seconds",
    "utc_timestamp",
]
