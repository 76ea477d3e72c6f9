"""Per-level figures as JUnit properties, so ``--junitxml`` carries them (also under xdist)."""

from __future__ import annotations

from typing import Any

from pytest_kimi.wire import LevelEntry, TestEntry

JUNIT_FIELDS = (
    "tok_s",
    "request_tok_s_p50",
    "ttft_s_p95",
    "ttfc_s_p95",
    "reasoning_tokens_mean",
    "content_tokens_mean",
    "output_tokens_mean",
    "prefix_cache_hit_rate",
    "baseline_tok_s",
    "change_pct",
    "p_value",
    "trials",
    "verdict",
)
"""The reasoning fields exist only for levels whose streams separated thinking from the answer;
``output_tokens_mean`` only for dataset levels, ``prefix_cache_hit_rate`` where the server
exposes prefix-cache counters."""


LATENCY_SUFFIXES = {"": "value", "_baseline": "baseline", "_target": "target"}
"""Per latency figure (``ttft_s_p95``): the level's figure, the baseline's and the ceiling, as
``kimi.C8.ttft_s_p95``, ``kimi.C8.ttft_s_p95_baseline``, ``kimi.C8.ttft_s_p95_target``; also
``..._change_pct`` and ``..._verdict`` where it was compared."""


def _latency_properties(prefix: str, level: LevelEntry, taken: set[str]) -> list[tuple[str, Any]]:
    """A level's TTFT and ITL figures (p50 and the marker's percentile) from its ``latency``
    section, each with its baseline and target; a name the level's fields gave already (the
    pooled ``ttft_s_p95``) is not repeated."""
    section = level.get("latency")
    if not isinstance(section, dict):
        return []
    props: list[tuple[str, Any]] = []
    for name, figure in (section.get("figures") or {}).items():
        if not isinstance(figure, dict):
            continue
        keys = {**LATENCY_SUFFIXES, "_change_pct": "change_pct", "_verdict": "verdict"}
        for suffix, key in keys.items():
            prop = name + suffix
            if (value := figure.get(key)) is not None and prop not in taken:
                props.append((f"{prefix}.{prop}", value))
    return props


def junit_properties(test: TestEntry) -> list[tuple[str, Any]]:
    """Per-level figures as ``kimi.C<c>.<field>`` properties: ``--junitxml`` carries them (also via xdist)."""
    props: list[tuple[str, Any]] = []
    for lv in test["levels"]:
        name = (lv.get("label") or f"C={lv['concurrency']}").replace("=", "").replace(" ", ".")
        prefix = f"kimi.{lv['profile']}.{name}" if lv.get("profile") else f"kimi.{name}"
        props += [
            (f"{prefix}.{field}", value)
            for field in JUNIT_FIELDS
            if (value := lv.get(field)) is not None
        ]
        props += _latency_properties(prefix, lv, {name for name in JUNIT_FIELDS if lv.get(name)})
    capacity = test.get("capacity")
    if isinstance(capacity, dict):  # a @capacity test: its capacity and verdict
        props += [
            (f"kimi.capacity.{key}", capacity[key])
            for key in ("metric", "value", "low", "high", "estimate", "change_pct", "verdict")
            if capacity.get(key) is not None
        ]
    if test.get("provenance_changes"):
        props.append(("kimi.provenance_changes", "; ".join(test["provenance_changes"])))
    return props
