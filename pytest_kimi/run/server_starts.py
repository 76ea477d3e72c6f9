"""``--perf-sessions``: the run order of fresh server starts, and what the reports make of them.

Pure functions over the per-test report dicts (the shape of ``--perf-json``'s ``tests``), so
the controller computes the same figures under xdist as in one process, and a saved report
can be read again.  With ``--perf-sessions N`` every perf test appears once per session and
deployment, its dict carrying ``perf_session`` (0-based); these functions never need more.

* :func:`run_order` -- which server start runs when: A1 B1 B2 A2 A3 B3 ... (ABBA), so a drift
  over the run (a machine warming up, a neighbour's job) falls on both deployments alike and
  cancels in the A/B, as it would not in A1 A2 B1 B2.
* :func:`session_noise` -- the ``session_noise`` section of the reports: per level and
  deployment the session noise with its interval (:mod:`pytest_kimi.gate.session_noise`),
  pooled over the levels into one recommended ``--perf-session-sigma``.
* :func:`pool_sessions` -- one test dict per test and deployment with every session's trials,
  which ``--update-baselines`` records (see its docstring for why pooled).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from pytest_kimi.gate.session_noise import (
    DEFAULT_CONFIDENCE,
    NoiseEstimate,
    estimate_with_interval,
    pooled,
    recommend,
)
from pytest_kimi.verdicts import Verdict
from pytest_kimi.measure.results import PERF_SERVER, PERF_SESSION, level_key, session_id
from pytest_kimi.wire import (
    LevelEntry,
    NoiseDeploymentEntry,
    NoiseLevelEntry,
    PooledNoise,
    SessionNoiseSection,
    SessionServer,
    TestEntry,
)


def run_order(deployments: int, sessions: int) -> list[tuple[int, int]]:
    """``(deployment, session)`` indices in the order their servers start (ABBA).

    Session ``k`` runs the deployments forward when ``k`` is even and backward when it is odd,
    so with two deployments: A1 B1 B2 A2 A3 B3 B4 A4.  A linear drift ``d`` per start then
    adds ``0+3`` to A and ``1+2`` to B over each four starts: the same, so it cancels in the
    A/B; in plain alternation (A B A B) B would be behind by ``d`` at every pair.  Each
    session still starts with a reference run, so the candidate is never judged before one.
    """
    order: list[tuple[int, int]] = []
    forward = list(range(max(deployments, 1)))
    for k in range(sessions):
        for d in forward if k % 2 == 0 else reversed(forward):
            order.append((d, k))
    return order


# ------------------------------------------------------------------------------ the estimate


@dataclass(frozen=True, slots=True)
class _Cell:
    """One level of one test on one deployment: its trials per session."""

    profile: str | None
    nodeid: str
    label: str
    key: str
    trials: dict[int, list[float]]


def _key(level: LevelEntry, test: TestEntry) -> str:
    return json.dumps(level_key(level, test.get("workload") or {}), sort_keys=True)


def _session_tests(tests: Iterable[TestEntry]) -> list[TestEntry]:
    return [t for t in tests if isinstance(t.get(PERF_SESSION), int)]


def _cells(tests: Sequence[TestEntry]) -> tuple[list[_Cell], list[str]]:
    """The levels' trials per session, and a note for every level left out of a session."""
    cells: dict[tuple[str | None, str, str], _Cell] = {}
    notes: list[str] = []
    for test in tests:
        k = int(test[PERF_SESSION])
        profile = test.get("profile")
        for level in test.get("levels") or []:
            label = str(level.get("label") or f"C={level.get('concurrency')}")
            key = _key(level, test)
            cell = cells.setdefault(
                (profile, str(test.get("nodeid")), key),
                _Cell(profile, str(test.get("nodeid")), label, key, {}),
            )
            verdict = Verdict.of(level.get("verdict"))
            trials = [float(x) for x in level.get("trials_tok_s") or [] if x]
            if (verdict is not None and not verdict.comparable) or not trials:
                where = f" on {profile}" if profile else ""
                notes.append(
                    f"{test.get('nodeid')}{where} {label} {session_id(k)}: left out "
                    f"({level.get('verdict')}: no trustworthy trials)"
                )
                continue
            cell.trials[k] = trials
    return list(cells.values()), notes


def _sessions(cell: _Cell, keep: Iterable[int] | None = None) -> list[list[float]]:
    chosen = sorted(cell.trials) if keep is None else sorted(keep)
    return [cell.trials[k] for k in chosen]


def _deployment_levels(cells: Sequence[_Cell]) -> tuple[list[_Cell], list[int]]:
    """The levels pooled for one deployment, and the sessions they share.

    Pooling needs every level measured in the same sessions (a session's levels share its
    factor and are averaged).  Normally that is all of them; when a session lost some levels
    (a crash, an invalid level), the sessions count first (they alone give the between-session
    term its degrees of freedom; more levels only average trial noise down): the largest set
    of sessions that some level has, with every level measured in all of them.
    """
    sets: dict[tuple[int, ...], list[_Cell]] = {}
    for cell in cells:
        if len(cell.trials) >= 2:
            sets.setdefault(tuple(sorted(cell.trials)), []).append(cell)
    if not sets:
        return [], []

    def levels_in(shared: tuple[int, ...]) -> list[_Cell]:
        return [c for c in cells if set(shared) <= set(c.trials)]

    best = max(sets, key=lambda s: (len(s), len(levels_in(s))))
    return levels_in(best), list(best)


def session_noise(
    tests: Iterable[TestEntry],
    *,
    current_sigma: float | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> SessionNoiseSection | None:
    """The reports' ``session_noise`` section; None when no test ran in two sessions.

    Per level and deployment: ``sigma`` (the estimate of ``--perf-session-sigma``), ``low``,
    ``high``, the sessions' median tok/s.  Per deployment, and over all: the levels pooled
    (:func:`pytest_kimi.gate.session_noise.pooled`).  ``recommendation``: the value to use
    (:func:`~pytest_kimi.gate.session_noise.recommend`), judged against ``current_sigma``,
    the value this run's gate used.  Levels without two sessions of trustworthy trials, or
    without trial noise to subtract, are listed under ``notes``.
    """
    chosen_tests = _session_tests(tests)
    if not chosen_tests:
        return None
    cells, notes = _cells(chosen_tests)
    levels: list[NoiseLevelEntry] = []
    for cell in cells:
        row: NoiseLevelEntry = {
            "profile": cell.profile,
            "nodeid": cell.nodeid,
            "label": cell.label,
            "sessions": sorted(cell.trials),
            "session_tok_s": [round(statistics.median(t), 2) for t in _sessions(cell)],
        }
        try:
            row["estimate"] = estimate_with_interval(_sessions(cell), confidence).to_dict()
        except ValueError as exc:
            where = f" on {cell.profile}" if cell.profile else ""
            notes.append(f"{cell.nodeid}{where} {cell.label}: no estimate ({exc})")
        levels.append(row)
    deployments: list[NoiseDeploymentEntry] = []
    pool_input: list[list[list[list[float]]]] = []
    profiles = list(dict.fromkeys(c.profile for c in cells))
    for profile in profiles:
        mine = [c for c in cells if c.profile == profile]
        chosen, shared = _deployment_levels(mine)
        entry: NoiseDeploymentEntry = {
            "profile": profile,
            "sessions": sorted(
                {int(t[PERF_SESSION]) for t in chosen_tests if t.get("profile") == profile}
            ),
            "servers": _servers(chosen_tests, profile),
        }
        if chosen:
            data = [_sessions(c, shared) for c in chosen]
            try:
                entry["estimate"] = pooled([data], confidence).to_dict()
                entry["pooled_sessions"] = shared
                pool_input.append(data)
            except ValueError as exc:
                notes.append(f"{profile or 'the deployment'}: no pooled estimate ({exc})")
        deployments.append(entry)
    section: SessionNoiseSection = {
        "confidence": confidence,
        "deployments": deployments,
        "levels": levels,
        "notes": notes,
    }
    if pool_input:
        overall = pooled(pool_input, confidence)
        advice = recommend(overall, current=current_sigma)
        section["pooled"] = overall.to_dict()
        section["recommendation"] = {
            "perf_session_sigma": advice.value,
            "current": current_sigma,
            "text": advice.text,
        }
    return section


def _servers(tests: Sequence[TestEntry], profile: str | None) -> list[SessionServer]:
    """Which server start ran each session of a deployment (first test of each session)."""
    seen: dict[int, SessionServer] = {}
    for test in tests:
        if test.get("profile") != profile:
            continue
        k = int(test[PERF_SESSION])
        server = test.get(PERF_SERVER)
        if k not in seen and isinstance(server, Mapping):
            seen[k] = {PERF_SESSION: k, **server}
    return [seen[k] for k in sorted(seen)]


def estimate_of(section: SessionNoiseSection) -> NoiseEstimate | None:
    """The pooled estimate of a report's ``session_noise`` section, if it has one."""
    data = section.get("pooled")
    return NoiseEstimate.from_dict(data) if isinstance(data, dict) else None


# ---------------------------------------------------------------------------- the baselines


def pool_sessions(tests: Sequence[TestEntry]) -> list[TestEntry]:
    """One test dict per test and deployment, every session's trials pooled per level.

    What ``--update-baselines`` records from a run with ``--perf-sessions N``.  Pooled, not one
    session chosen: a baseline of one server start carries that start's whole session factor,
    one of N starts an average of N (its mean is off by ``tau / sqrt(N)``, not ``tau``), so
    later runs are judged against the deployment rather than against one lucky or unlucky
    start.  The gate still adds the full ``session_sigma`` for the baseline side, and the
    pooled trials' scatter includes the between-session part: both err toward fewer false
    alarms.  A level keeps the first verdict any session gave it that may not be recorded
    (:attr:`Verdict.recordable`: untrustworthy samples, or a ``fail`` or ``regression`` that
    failed the run), so the refusal without ``force`` still applies when one start of N did,
    and the median of the sessions' request rates and TTFTs.
    Tests without ``perf_session`` pass through unchanged.
    """
    groups: dict[tuple[Any, Any], list[TestEntry]] = {}
    for test in tests:
        if isinstance(test.get(PERF_SESSION), int):
            groups.setdefault((test.get("profile"), test.get("nodeid")), []).append(test)
    out: list[TestEntry] = []
    for test in tests:
        if not isinstance(test.get(PERF_SESSION), int):
            out.append(test.copy())
            continue
        members = groups.pop((test.get("profile"), test.get("nodeid")), None)
        if members is not None:  # at the first session's place; the others are in it
            out.append(_pooled_test(sorted(members, key=lambda t: int(t[PERF_SESSION]))))
    return out


def attach_session_noise(pooled: Sequence[TestEntry], section: SessionNoiseSection | None) -> None:
    """Give each pooled level (:func:`pool_sessions`) the session noise its sessions measured
    (``session_noise``'s per-level estimate: ``sigma`` and ``df``, the sessions less one), so
    the baseline recorded from them stores it (:class:`pytest_kimi.baseline.model.SessionNoise`)."""
    if not section:
        return
    found: dict[tuple[Any, Any, Any], PooledNoise] = {}
    for row in section.get("levels") or []:
        est = row.get("estimate")
        if isinstance(est, Mapping) and int(est.get("df_between") or 0) >= 1:
            found[(row.get("profile"), row.get("nodeid"), row.get("label"))] = {
                "sigma": float(est["sigma"]),
                "df": int(est["df_between"]),
            }
    for test in pooled:
        for level in test.get("levels") or []:
            label = str(level.get("label") or f"C={level.get('concurrency')}")
            noise = found.get((test.get("profile"), test.get("nodeid"), label))
            if noise is not None:
                level["session_noise"] = noise


def _pooled_test(members: Sequence[TestEntry]) -> TestEntry:
    first = members[0].copy()
    first.pop(PERF_SESSION, None)
    first.pop(PERF_SERVER, None)
    first["perf_sessions"] = [int(t[PERF_SESSION]) for t in members]
    by_key: dict[str, list[LevelEntry]] = {}
    for test in members:
        for level in test.get("levels") or []:
            by_key.setdefault(_key(level, test), []).append(level)
    levels = []
    for same in by_key.values():
        level = same[0].copy()
        level["trials_tok_s"] = [x for lv in same for x in lv.get("trials_tok_s") or []]
        level["trials"] = len(level["trials_tok_s"])
        bad = [lv for lv in same if not _recordable(lv.get("verdict"))]
        if bad:
            level["verdict"] = bad[0]["verdict"]
        level["request_tok_s_p50"] = _median([lv.get("request_tok_s_p50") for lv in same])
        level["ttft_s_p50"] = _median([lv.get("ttft_s_p50") for lv in same])
        level["ttft_s_p95"] = _median([lv.get("ttft_s_p95") for lv in same])
        if level["trials_tok_s"]:
            level["tok_s"] = round(statistics.median(level["trials_tok_s"]), 2)
        levels.append(level)
    first["levels"] = levels
    return first


def _median(values: Sequence[float | None]) -> float | None:
    """The median of the sessions' figures that are there (None: none is)."""
    present = [x for x in values if x is not None]
    return statistics.median(present) if present else None


def _recordable(verdict: Any) -> bool:
    known = Verdict.of(verdict)
    return known is None or known.recordable


__all__ = [
    "PERF_SERVER",
    "PERF_SESSION",
    "estimate_of",
    "pool_sessions",
    "run_order",
    "session_id",
    "session_noise",
]
