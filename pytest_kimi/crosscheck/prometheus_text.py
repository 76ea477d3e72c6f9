"""Prometheus text exposition parsing: a ``/metrics`` page's samples summed per name.

Apart because it is pure text handling, with no I/O and no knowledge of which counters a
cross-check wants: every reader of a metrics page (the token check, the prefix-cache probe,
the contamination check) parses with it.

The text exposition format is parsed by prometheus_client's parser (the reference
implementation, escapes, special values and timestamps included).  Two things it does not do
are done here: it stops at the first malformed line, while a scrape must keep every good
sample of a page with one bad line (a proxy's HTML error page, a truncated read), so a page
that fails whole is parsed again line by line; and it parses every line, while the scrapes
during a trial run on the load client's loop and vLLM's page has hundreds of histogram
lines nobody needs, so lines are filtered by name prefix first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of the text exposition format: ``name{labels} value [timestamp]``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(slots=True)
class MetricTotals:
    """Each sample name's value summed over all its label sets (engines, models, reasons)."""

    totals: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    bad_lines: int = 0
    """Lines that were neither comments nor samples: counted, never fatal."""

    def get(self, name: str) -> float | None:
        return self.totals.get(name)


def _parse(text: str) -> list[Sample]:
    """Every sample of ``text`` (no comment lines); ValueError when any line is malformed."""
    return [
        Sample(s.name, tuple(sorted(s.labels.items())), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def parse_sample(line: str) -> Sample | None:
    """One sample line, or None for a blank line, a comment or a malformed line.

    ``+Inf``, ``-Inf`` and ``NaN`` are values like any other; an optional timestamp is ignored
    (a counter's value is what it is when scraped).
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    try:
        samples = _parse(line + "\n")
    except ValueError:
        return None
    return samples[0] if len(samples) == 1 else None


def parse_metrics(text: str, names: Sequence[str] | None = None) -> MetricTotals:
    """Sum every sample name over its label sets: enough for counters, and never raises.

    vLLM labels its counters per engine (``{engine="0",model_name="..."}``) and per finish
    reason; the server's total is the sum.  Comments (``# HELP``, ``# TYPE``, ``# EOF``) and
    lines that do not parse are skipped; the latter are counted in ``bad_lines``.

    ``names``: parse only lines that start with one of these (the scrapes during a trial run on
    the load client's loop, and vLLM's page has hundreds of histogram lines nobody needs).
    """
    out = MetricTotals()
    wanted = tuple(names) if names is not None else None
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # no TYPE lines: sample names stay exactly as written (``*_total``)
        if wanted is None or stripped.startswith(wanted):
            lines.append(stripped)
    try:
        samples = _parse("\n".join(lines) + "\n") if lines else []
    except ValueError:
        samples = []
        for line in lines:
            sample = parse_sample(line)
            if sample is None:
                out.bad_lines += 1
            else:
                samples.append(sample)
    for sample in samples:
        if wanted is not None and sample.name not in wanted:
            continue
        out.samples += 1
        out.totals[sample.name] = out.totals.get(sample.name, 0.0) + sample.value
    return out
