"""One run's rows, built from the JSON report dict and the run's metadata.

Why from the report dict: it is the one record of a run (``--perf-json`` writes it, the other
reports render it), it exists on the xdist controller once the workers have sent their
results, and it is already scrubbed.  The store writes what :func:`build_rows` returns and
nothing else, so what a run stores is decided here, tested without a database.

What a run stores: when it finished, the suite's commit and branch, the CI run's page, the
deployment, the scrubbed provenance (flattened to dotted keys, as the analyses compare it);
per test its node id, outcome and report fields; per level the baseline key, label, every
trial's tok/s, tok/s, verdict, the baseline compared with, the change and the tolerance, and
the level's whole report dict.

A ``@capacity`` test stores its result once, as :class:`CapacityRow` (the capacity, its
bracket and boundary, its verdict against the baseline capacity): that is its series.  The
loads its search probed are kept as levels marked ``probe``, detail for the run pages and
never a series of their own (which loads a search probes changes from run to run, and a
probe's ``held``/``broke`` is not a verdict on throughput).

Series identity: a series is one (test, level key, deployment); a capacity's is one (test,
capacity key, deployment), its key the capacity's baseline key (workload, metric, ceilings,
percentile), so a capacity under another SLO is another series.  The test is the report's
node id with the parametrization ids the plugin adds stripped: the deployment's
(``[ep8-tuned]``: the test's server profile or baseline profile) and the ``--perf-sessions``
session's (``[s2]``, ``[ep8-s2]``: :func:`pytest_kimi.measure.results.session_id` of the
test's ``perf_session``), as a whole bracket or as its first or last part; the test's own
parameters stay.  So a test measured on two deployments, or in three sessions of one run,
is one test name with a deployment and a session beside it.  The plugin's node ids have these
stripped already (baselines are keyed by them); stripping again is a no-op then, and a
report from elsewhere is read the same way.

Pure: no SQLAlchemy, no pytest.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_kimi.baseline.provenance import (
    Provenance,
    flatten,
    git_branch,
    git_commit,
    plugin_version as installed_version,
)
from pytest_kimi.endpoint.serverinfo import clean_server_info
from pytest_kimi.scrub import scrub, scrub_text
from pytest_kimi.wire import CapacityEntry, LevelEntry, Report

__all__ = [
    "CapacityRow",
    "LevelRow",
    "RunMeta",
    "RunRows",
    "TestRows",
    "build_rows",
    "canonical_key",
    "capacity_label",
    "capacity_row",
    "ci_run_url",
    "flat_provenance",
    "measured_anything",
    "series_test",
]


@dataclass(frozen=True, slots=True)
class RunMeta:
    """What a run is, beside its figures: when, which suite commit, which deployment, which CI
    run.  :meth:`collect` fills it for the plugin; tests and tools construct it directly."""

    time: datetime
    """When the run finished; a naive time is taken as UTC."""
    commit: str | None = None
    """The test suite's git commit (``+dirty`` when tracked files were modified)."""
    branch: str | None = None
    ci_url: str | None = None
    """The CI run's page (GitHub Actions: ``$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/
    $GITHUB_RUN_ID``)."""
    deployment: str | None = None
    """The baseline profile the run measured (server profile name, ``sim`` or ``default``);
    with several server profiles, their names joined by commas."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """The endpoint's provenance flattened to dotted keys (``server_info.tp_size``), as the
    baseline stores it: model, plugin version, client host, server info."""
    plugin_version: str | None = None
    deployments: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """With server profiles: each deployment's flattened provenance, by profile name (a same-run
    A/B measures two setups; each series gets its own)."""

    def __post_init__(self) -> None:
        when = self.time
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        object.__setattr__(self, "time", when.astimezone(timezone.utc))

    @classmethod
    def collect(
        cls,
        report: Report,
        *,
        suite_dir: Path | None,
        deployment: str | None,
        endpoints: Mapping[str, Mapping[str, Any]] | None = None,
        environ: Mapping[str, str] | None = None,
        time: datetime | None = None,
    ) -> RunMeta:
        """The metadata of a run that just finished: git of ``suite_dir`` (the rootdir), CI's
        variables from ``environ``, provenance from the report's endpoint (and ``endpoints``:
        the endpoint of each deployment by profile name, '' without profiles)."""
        env = os.environ if environ is None else environ
        version = installed_version()
        host = socket.gethostname() or None
        per_deployment = {
            name: flat_provenance(endpoint, plugin_version=version, client_host=host)
            for name, endpoint in (endpoints or {}).items()
            if name
        }
        return cls(
            time=time or datetime.now(timezone.utc),
            commit=git_commit(suite_dir),
            branch=git_branch(suite_dir)
            or env.get("GITHUB_HEAD_REF")
            or env.get("GITHUB_REF_NAME")
            or None,
            ci_url=ci_run_url(env),
            deployment=deployment,
            provenance=flat_provenance(
                report.get("endpoint") or {}, plugin_version=version, client_host=host
            ),
            plugin_version=version,
            deployments=per_deployment,
        )


def ci_run_url(environ: Mapping[str, str]) -> str | None:
    """The CI run's page from the environment: GitHub Actions, else GitLab CI; None outside CI."""
    server = environ.get("GITHUB_SERVER_URL")
    repo = environ.get("GITHUB_REPOSITORY")
    run = environ.get("GITHUB_RUN_ID")
    if server and repo and run:
        return f"{server.rstrip('/')}/{repo}/actions/runs/{run}"
    return environ.get("CI_PIPELINE_URL") or None


def flat_provenance(
    endpoint: Mapping[str, Any],
    *,
    plugin_version: str | None = None,
    client_host: str | None = None,
) -> dict[str, Any]:
    """An endpoint's provenance as the baseline records it, flattened to dotted keys
    (``model``, ``plugin_version``, ``client_host``, ``server_info.tp_size``) and scrubbed.

    Built through :class:`Provenance` so that server info is cleaned exactly as a baseline's
    is; info that a baseline could not hold is kept as allow-listed, scrubbed JSON rather than
    dropped.
    """
    info = endpoint.get("server_info") or {}
    model = endpoint.get("model")
    try:
        prov = Provenance(
            model=model if isinstance(model, str) else None,
            server_info=info if isinstance(info, Mapping) else {},
            plugin_version=plugin_version,
            client_host=client_host,
        )
        server_info: Any = prov.server_info
    except ValueError:  # a non-finite number, say: allow-listed and scrubbed all the same
        server_info = clean_server_info(info) if isinstance(info, Mapping) else {}
    nested = {
        "model": model,
        "plugin_version": plugin_version,
        "client_host": client_host,
        "server_info": server_info,
    }
    out = flatten(nested)
    return {k: v for k, v in clean_json(scrub(out)).items() if v is not None and v != {}}


def clean_json(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats become None (JSON has no NaN; PostgreSQL refuses
    it), tuples lists, keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def canonical_key(key: Mapping[str, Any]) -> str:
    """A level key as canonical JSON: equal keys give equal text, in every database."""
    return json.dumps(clean_json(key), sort_keys=True, separators=(",", ":"))


def series_test(nodeid: str, strip: Iterable[str]) -> str:
    """``nodeid`` without the parametrization ids in ``strip``.

    A node id's parameters are one bracket, ids joined by ``-`` (``test_x[64-ep8]``); an id to
    strip is removed when it is the whole bracket, or its first or last part.  Ids are tried
    longest first (``ep8-tuned`` before ``ep8``), until none applies.
    """
    ids = sorted({s for s in strip if s}, key=len, reverse=True)
    changed = True
    while changed and nodeid.endswith("]") and "[" in nodeid:
        changed = False
        head, _, inner = nodeid[:-1].rpartition("[")
        for name in ids:
            if inner == name:
                return head
            if inner.endswith("-" + name):
                inner = inner[: -len(name) - 1]
            elif inner.startswith(name + "-"):
                inner = inner[len(name) + 1 :]
            else:
                continue
            nodeid = f"{head}[{inner}]"
            changed = True
            break
    return nodeid


def measured_anything(report: Report) -> bool:
    """Whether a run has anything to store: some test with at least one level.  A run whose
    tests all failed before measuring (no endpoint, a server that did not start) has not."""
    return any(test.get("levels") for test in report.get("tests") or ())


@dataclass(frozen=True, slots=True)
class LevelRow:
    position: int
    key: dict[str, Any]
    label: str | None
    tok_s: float | None
    trials_tok_s: list[float]
    verdict: str | None
    baseline_tok_s: float | None
    change_pct: float | None
    tolerance_pct: float | None
    data: dict[str, Any]
    probe: bool = False
    """A ``@capacity`` search's probe: kept for the run pages, never a series."""
    ci90: tuple[float | None, float | None] = (None, None)
    """The change's 90% interval in percent (an end None where it is unbounded)."""


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """A ``@capacity`` test's result in one run: what its one series holds per run.

    From the report's ``capacity`` object (:func:`pytest_kimi.gate.capacity_gate.capacity_dict`):
    the capacity (``value``, the highest load that held), the bracket the search ended with
    (``low`` held, ``high`` broke; one of them None when the capacity is a bound), the
    interpolated boundary (``estimate``) with its 90% interval, and the gate's comparison with
    the baseline capacity (its verdict, the change of the compared quantities and its interval).
    """

    key: dict[str, Any]
    label: str
    metric: str | None
    value: float | None
    low: float | None
    high: float | None
    estimate: float | None
    estimate_ci90: tuple[float | None, float | None]
    log_se: float | None
    slope: float | None
    verdict: str | None
    baseline: float | None
    baseline_low: float | None
    baseline_high: float | None
    baseline_estimate: float | None
    change_pct: float | None
    change_ci90: tuple[float | None, float | None]
    tolerance_pct: float | None


@dataclass(frozen=True, slots=True)
class TestRows:
    __test__ = False  # not a pytest test class, whatever its name

    position: int
    nodeid: str
    test: str
    deployment: str | None
    session: int | None
    outcome: str | None
    data: dict[str, Any]
    """The test dict without its levels."""
    levels: tuple[LevelRow, ...]
    capacity: CapacityRow | None = None
    """A ``@capacity`` test's result (its levels are then the search's probes)."""


@dataclass(frozen=True, slots=True)
class RunRows:
    meta: RunMeta
    endpoint: dict[str, Any]
    report_schema: int | None
    tests: tuple[TestRows, ...]

    @property
    def model(self) -> str | None:
        model = self.endpoint.get("model")
        return model if isinstance(model, str) else None


def build_rows(report: Report, meta: RunMeta) -> RunRows:
    """The rows of one run: every ``server_info`` allow-listed, everything scrubbed once more
    and made JSON-safe first."""
    # The baseline's own key function and the sessions' parameter ids; they bring the load
    # engine's imports, paid only here.
    from pytest_kimi.measure.results import level_key
    from pytest_kimi.measure.results import PERF_SESSION, session_id

    clean: Report = clean_json(scrub(_allow_listed(dict(report))))
    tests = [t for t in clean.get("tests") or () if isinstance(t, Mapping)]
    profiles = {t.get("profile") for t in tests if t.get("profile")}
    rows = []
    for position, test in enumerate(tests):
        profile = test.get("profile")
        baseline_profile = test.get("baseline_profile")
        # Two deployments in one run (a same-run A/B) are two series even when an explicit
        # --baseline-profile gave them one baseline group.
        deployment = (
            profile if len(profiles) > 1 and profile else baseline_profile or profile
        ) or meta.deployment
        session = test.get(PERF_SESSION)
        session = session if isinstance(session, int) and not isinstance(session, bool) else None
        strip: list[str] = [str(p) for p in (profile, baseline_profile) if p]
        if session is not None:
            strip.append(session_id(session))
            if profile:
                strip.append(f"{profile}-{session_id(session)}")
        nodeid = str(test.get("nodeid", ""))
        workload = test.get("workload") or {}
        raw_capacity = test.get("capacity")
        capacity = capacity_row(raw_capacity) if isinstance(raw_capacity, Mapping) else None
        levels = tuple(
            _level_row(i, lv, level_key(lv, workload), probe=capacity is not None)
            for i, lv in enumerate(test.get("levels") or ())
            if isinstance(lv, Mapping)
        )
        rows.append(
            TestRows(
                position=position,
                nodeid=nodeid,
                test=series_test(nodeid, strip),
                deployment=str(deployment) if deployment else None,
                session=session,
                outcome=test.get("outcome"),
                data={k: v for k, v in test.items() if k != "levels"},
                levels=levels,
                capacity=capacity,
            )
        )
    schema = clean.get("schema")
    return RunRows(
        meta=_scrubbed(meta),
        endpoint=dict(clean.get("endpoint") or {}),
        report_schema=schema if isinstance(schema, int) else None,
        tests=tuple(rows),
    )


def _allow_listed(value: Any) -> Any:
    """``value`` with each ``server_info`` mapping in it (the endpoint's, a test's) through
    the allow-list: the plugin's own reports hold it so already, a report from elsewhere (an
    older plugin, another tool) may not, and a database row outlives its run."""
    if isinstance(value, Mapping):
        return {
            k: clean_server_info(v)
            if k == "server_info" and isinstance(v, Mapping)
            else _allow_listed(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_allow_listed(v) for v in value]
    return value


def _scrubbed(meta: RunMeta) -> RunMeta:
    """``meta`` with every text and the provenance through the scrubber (a RunMeta built by
    hand has not been), JSON-safe."""

    def text(value: str | None) -> str | None:
        return None if value is None else scrub_text(value)

    return replace(
        meta,
        commit=text(meta.commit),
        branch=text(meta.branch),
        ci_url=text(meta.ci_url),
        deployment=text(meta.deployment),
        plugin_version=text(meta.plugin_version),
        provenance=clean_json(scrub(dict(meta.provenance))),
        deployments={
            str(name): clean_json(scrub(dict(prov))) for name, prov in meta.deployments.items()
        },
    )


def capacity_label(capacity: CapacityEntry) -> str:
    """The capacity series' name beside its test: ``capacity under p95 end-to-end <= 6.6 s``
    (the ceilings are what tell two capacities of one test apart)."""
    from pytest_kimi.report.capacity_cells import slo_text

    try:
        return f"capacity under {slo_text(capacity)}"[:255]
    except (TypeError, ValueError, AttributeError):  # a malformed record still gets a name
        return "capacity"


def capacity_row(capacity: CapacityEntry) -> CapacityRow:
    """A report's ``capacity`` object as its series' row (fields missing or malformed: None)."""
    metric = capacity.get("metric")
    verdict = capacity.get("verdict")
    workload = capacity.get("workload")
    return CapacityRow(
        key=dict(workload) if isinstance(workload, Mapping) else {},
        label=capacity_label(capacity),
        metric=metric if isinstance(metric, str) else None,
        value=_number(capacity.get("value")),
        low=_number(capacity.get("low")),
        high=_number(capacity.get("high")),
        estimate=_number(capacity.get("estimate")),
        estimate_ci90=_pair(capacity.get("ci90")),
        log_se=_number(capacity.get("log_se")),
        slope=_number(capacity.get("slope")),
        verdict=verdict if isinstance(verdict, str) else None,
        baseline=_number(capacity.get("baseline")),
        baseline_low=_number(capacity.get("baseline_low")),
        baseline_high=_number(capacity.get("baseline_high")),
        baseline_estimate=_number(capacity.get("baseline_estimate")),
        change_pct=_number(capacity.get("change_pct")),
        change_ci90=_pair(capacity.get("change_ci90")),
        tolerance_pct=_number(capacity.get("tolerance_pct")),
    )


def _pair(value: Any) -> tuple[float | None, float | None]:
    """A ``[low, high]`` interval (either end may be null: unbounded), else (None, None)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _number(value[0]), _number(value[1])
    return None, None


def _level_row(
    position: int, level: LevelEntry, key: dict[str, Any], *, probe: bool = False
) -> LevelRow:
    trials = [float(x) for x in level.get("trials_tok_s") or () if _is_number(x)]
    return LevelRow(
        position=position,
        key=key,
        label=level.get("label"),
        tok_s=_number(level.get("tok_s")),
        trials_tok_s=trials,
        verdict=level.get("verdict"),
        baseline_tok_s=_number(level.get("baseline_tok_s")),
        change_pct=_number(level.get("change_pct")),
        tolerance_pct=_number(level.get("tolerance_pct")),
        data=dict(level),
        probe=probe or isinstance(level.get("capacity_level"), Mapping),
        ci90=_pair(level.get("ci90")),
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    return float(value) if _is_number(value) else None
