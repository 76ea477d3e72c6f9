"""Per-level figures as JUnit properties, so ``--junitxml`` carries them (also under xdist)."""

from __future__ import annotations

from typing import Any

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


def junit_properties(test: dict[str, Any]) -> list[tuple[str, Any]]:
    """Per-level figures as ``kimi.C<c>.<field>`` properties: ``--junitxml`` carries them (also via xdist)."""
    props: list[tuple[str, Any]] = []
    for lv in test["levels"]:
        name = (lv.get("label") or f"C={lv['concurrency']}").replace("=", "").replace(" ", ".")
        prefix = f"kimi.{lv['profile']}.{name}" if lv.get("profile") else f"kimi.{name}"
        props += [
            (f"{prefix}.{name}", lv[name]) for name in JUNIT_FIELDS if lv.get(name) is not None
        ]
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
