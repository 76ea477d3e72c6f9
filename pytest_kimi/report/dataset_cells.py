"""Report cells and lines for datasets and shared prefixes, shared by the terminal and Markdown.

The figures themselves are in the level's JSON (``dataset``, ``output_tokens_mean``,
``shared_prefix``, ``prefix_cache_hit_rate``, ``prefix_cache``); these helpers only decide
what a reader sees: a ``cache hit`` column where it says something, and one line per test
naming the dataset sample and how its lengths were obtained.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pytest_kimi.wire import LevelEntry, TestEntry

CACHE_HEADER = "cache hit"
NOTABLE_HIT_RATE = 0.05
"""Below this a hit rate is the expected near-zero of unique prompts (template tokens at most),
and the column stays out of the table unless the workload shares prefixes on purpose."""


def cache_hit_cell(level: LevelEntry) -> str:
    """The server's prefix-cache hit rate over the level, e.g. ``95.3%``; ``-`` where the
    server exposes no counters."""
    rate = level.get("prefix_cache_hit_rate")
    return "-" if not isinstance(rate, (int, float)) else f"{100 * rate:.1f}%"


def has_cache_column(levels: Sequence[LevelEntry]) -> bool:
    """Show the column for a shared-prefix workload, or where the cache served a notable share."""
    return any(
        lv.get("shared_prefix")
        or (
            isinstance(lv.get("prefix_cache_hit_rate"), (int, float))
            and lv["prefix_cache_hit_rate"] >= NOTABLE_HIT_RATE
        )
        for lv in levels
    )


def dataset_lines(test: TestEntry) -> list[str]:
    """One line per dataset sample (and shared prefix) of the test, as plain text."""
    lines: list[str] = []
    for lv in test.get("levels") or []:
        ds = lv.get("dataset")
        if isinstance(ds, Mapping):
            line = (
                f"dataset {ds.get('name')} (sha256 {str(ds.get('sha256', ''))[:12]}, "
                f"{ds.get('sampled')} of {ds.get('entries')} entries, seed {ds.get('seed')}): "
                f"output {ds.get('output_tokens_min')}-{ds.get('output_tokens_max')} tokens, mean "
                f"{ds.get('output_tokens_mean')} at max_tokens={lv.get('max_tokens')}; "
                f"lengths: {ds.get('output_tokens')}"
            )
            if line not in lines:
                lines.append(line)
            check = ds.get("input_check")
            if isinstance(check, str) and check not in lines:
                lines.append(check)
        sp = lv.get("shared_prefix")
        if isinstance(sp, Mapping):
            line = (
                f"shared prefix: {sp.get('groups')} system prompt(s) of "
                f"{sp.get('tokens')} tokens ({sp.get('sizing')})"
            )
            if line not in lines:
                lines.append(line)
    return lines
