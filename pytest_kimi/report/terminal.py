"""The per-level table: in the terminal summary and in a failed test's message.

Two guards hold for every line :func:`format_test` and :func:`format_session_noise` return,
whatever the report dict holds:

* **printable**: each line goes through :func:`~pytest_kimi.printable.printable`, so a model id,
  an HTTP error body or a reason quoting either cannot clear the screen, set the window title or
  overwrite a line with a CR (a hostile server forged ``[kimi] C=1: 99999.0 tok/s`` that way);
* **within the width**: a CI log that wraps a 150-column table turns it into noise, so a table
  that does not fit first loses its columns that say nothing (all ``-``), then is stacked in
  blocks (the level's label repeated, the gate's columns in the first), and any other line
  longer than the width is wrapped at its spaces, continued under its own indent.  The width is
  :func:`summary_width`: ``COLUMNS``, else the terminal's, else (a CI log) 100.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Callable, Mapping, Sequence

from pytest_kimi.crosscheck.contamination import NOTE_STARTS as CONTAMINATION_NOTES
from pytest_kimi.printable import DEFAULT_LIMIT, printable
from pytest_kimi.report.capacity_cells import capacity_lines
from pytest_kimi.report.latency_cells import latency_lines
from pytest_kimi.report.peer_cells import MIN_WIDTH, peer_lines, terminal_width

from pytest_kimi.report.workload_cells import RATES_HEADER, has_rates, rates_cell, shape_lines
from pytest_kimi.report.dataset_cells import (
    CACHE_HEADER,
    cache_hit_cell,
    dataset_lines,
    has_cache_column,
)
from pytest_kimi.wire import (
    LevelEntry,
    NoiseEstimateEntry,
    SessionNoiseSection,
    SessionServer,
    TestEntry,
)

Column = tuple[str, Callable[[LevelEntry], str]]


def num(value: float | None, fmt: str) -> str:
    """A figure, or ``-`` when there is none (shared by the Markdown report)."""
    return "-" if value is None else format(value, fmt)


def tok_s_cell(level: LevelEntry) -> str:
    """Median tok/s with ± half the trials' range."""
    tok_s = level.get("tok_s")
    if tok_s is None:
        return "-"
    spread = level.get("spread_pct")
    return f"{tok_s:.1f}" + (f" ±{spread / 2:.1f}%" if spread is not None else "")


def _ttft(level: LevelEntry) -> str:
    return f"{num(level.get('ttft_s_p50'), '.3f')}/{num(level.get('ttft_s_p95'), '.3f')}"


def _itl(level: LevelEntry) -> str:
    itl = level.get("itl_s_p50")
    return "-" if itl is None else f"{itl * 1e3:.2f}"


def _change(level: LevelEntry) -> str:
    change = level.get("change_pct")
    if change is None:
        return "-"
    ci = level.get("ci90") or [None, None]
    lo, hi = (("?" if x is None else f"{x:+.1f}") for x in ci)
    return f"{change:+.1f}% ({lo}..{hi})"


def server_tok_s_cell(level: LevelEntry) -> str:
    """``--perf-server-metrics``: the server's own median tok/s over the steady-state windows."""
    server = level.get("server")
    return num(server["tok_s"] if server is not None else None, ".1f")


def server_tokens_cell(level: LevelEntry) -> str:
    """The server's count of generated tokens, ``(exact)`` when it equals the client's."""
    server = level.get("server")
    if server is None:
        return "-"
    tokens, client = server["tokens"], server["client_tokens"]
    return f"{tokens} (exact)" if tokens == client else f"{tokens} (client {client})"


def prompt_tokens_cell(level: LevelEntry) -> str:
    """Prompt tokens the server's ``usage`` reported: mean and range, e.g. ``87 (75-119)``.

    What was really sent: ``input_tokens`` is sized with the server's tokenizer where it has
    one and estimated elsewhere, and given prompts have whatever length they have.
    """
    pt = level.get("prompt_tokens")
    if not isinstance(pt, Mapping) or pt.get("mean") is None:
        return "-"
    lo, hi = pt.get("min"), pt.get("max")
    return f"{pt['mean']:.0f}" + ("" if lo == hi else f" ({lo}-{hi})")


TERMINAL_NOTES = (*CONTAMINATION_NOTES, "max_concurrency=")
"""Level notes the terminal summary shows (every other sink shows every note): the
contamination check's, and how long arrivals queued under a rate's concurrency cap (a capped
rate is not the offered one, which the operator must see where they look)."""


def prompt_notes(test: TestEntry) -> list[str]:
    """Where prompt lengths are estimates, the dataset sample and shared prefix, the
    contamination check's notes (zombies waited for, a check not possible), arrivals queued
    under ``max_concurrency``, and a prefix-cache
    flush that failed: one line each."""
    notes: list[str] = []
    for lv in test.get("levels") or []:
        sizing = lv.get("input_tokens_sizing")
        if isinstance(sizing, str) and sizing.startswith("estimate"):
            line = f"input_tokens={lv.get('input_tokens')}: {sizing}"
            if line not in notes:
                notes.append(line)
        for error in lv.get("errors") or []:
            note = str(error)[len("note: ") :]
            if str(error).startswith("note: ") and note.startswith(TERMINAL_NOTES):
                line = f"{lv.get('label')}: {note}"
                if line not in notes:
                    notes.append(line)
    notes += dataset_lines(test)
    if test.get("cache_flush"):
        notes.append(str(test["cache_flush"]))
    return notes


PROMPT_COLUMNS: list[Column] = [("prompt tok", prompt_tokens_cell)]
"""Shown after ITL when any level carries the prompt tokens its requests' usage reported."""


def reasoning_tokens_cell(level: LevelEntry) -> str:
    """Reasoning/content tokens per request, e.g. ``412/88``: where the output went."""
    if level.get("reasoning_tokens_mean") is None:
        return "-"
    return f"{num(level.get('reasoning_tokens_mean'), '.0f')}/{num(level.get('content_tokens_mean'), '.0f')}"


def _ttfc(level: LevelEntry) -> str:
    if level.get("reasoning_tokens_mean") is None:
        return "-"
    return f"{num(level.get('ttfc_s_p50'), '.3f')}/{num(level.get('ttfc_s_p95'), '.3f')}"


REASONING_COLUMNS: list[Column] = [
    ("reason/content tok", reasoning_tokens_cell),
    ("TTFC p50/p95 s", _ttfc),
]
"""Shown after TTFT only when a level's streams separated reasoning from content."""


SERVER_COLUMNS: list[Column] = [
    ("server tok/s", server_tok_s_cell),
    ("server tokens", server_tokens_cell),
]
"""Shown beside ``tok/s`` only when a level carries the server's counters."""


COLUMNS: list[Column] = [
    ("level", lambda lv: str(lv.get("label") or f"C={lv['concurrency']}")),
    ("tok/s", tok_s_cell),
    ("req tok/s p50", lambda lv: num(lv.get("request_tok_s_p50"), ".1f")),
    ("TTFT p50/p95 s", _ttft),
    ("ITL p50 ms", _itl),
    ("ok/failed", lambda lv: f"{lv.get('requests_ok', 0)}/{lv.get('requests_failed', 0)}"),
    ("target", lambda lv: num(lv.get("target_tok_s"), "g")),
    ("baseline", lambda lv: num(lv.get("baseline_tok_s"), ".1f")),
    ("change (90% CI)", _change),
    ("p", lambda lv: num(lv.get("p_value"), ".3g")),
    ("trials", lambda lv: str(lv.get("trials", 0))),
    ("server s", lambda lv: num(lv.get("server_time_s"), ".1f")),
    ("verdict", lambda lv: str(lv.get("verdict", "?"))),
]


def columns_for(levels: Sequence[LevelEntry]) -> list[Column]:
    """:data:`COLUMNS`, with :data:`SERVER_COLUMNS` after ``tok/s`` and
    :data:`REASONING_COLUMNS` after TTFT when any level has them."""
    columns = COLUMNS
    if has_rates(levels):
        # open loop (ramps): offered, sent and completed requests/s beside tok/s
        at = [name for name, _ in columns].index("tok/s") + 1
        columns = [*columns[:at], (RATES_HEADER, rates_cell), *columns[at:]]
    if any(lv.get("prompt_tokens") for lv in levels):
        at = [name for name, _ in columns].index("ITL p50 ms") + 1
        columns = [*columns[:at], *PROMPT_COLUMNS, *columns[at:]]
    if has_cache_column(levels):
        # the server's prefix-cache hit rate: shared prefixes really served from its cache
        at = [name for name, _ in columns].index("ITL p50 ms") + 1
        columns = [*columns[:at], (CACHE_HEADER, cache_hit_cell), *columns[at:]]
    if any(lv.get("reasoning_tokens_mean") is not None for lv in levels):
        at = [name for name, _ in columns].index("TTFT p50/p95 s") + 1
        columns = [*columns[:at], *REASONING_COLUMNS, *columns[at:]]
    if not any(lv.get("server") for lv in levels):
        return columns
    at = [name for name, _ in columns].index("tok/s") + 1
    return [*columns[:at], *SERVER_COLUMNS, *columns[at:]]


NON_TTY_WIDTH = 100
"""The summary's width where neither ``COLUMNS`` nor a terminal says one: a CI log's viewer
shows this much without wrapping (pytest's own separators assume 80 there)."""

LINE_LIMIT = 4 * DEFAULT_LIMIT
"""Characters of one summary line kept (escapes counted): a refusal naming every level's
reason fits, a server's error page quoted whole is cut rather than wrapped over screenfuls."""

CELL_LIMIT = 60
"""Characters of one table cell kept: a label or a server's string cannot widen the table
past any terminal."""

CONTINUATION = "    "
"""What a wrapped line's continuations are indented by, beyond the line's own indent."""

ALWAYS_SHOWN = ("level", "tok/s", "verdict")
"""Columns kept even when every cell is ``-``: what a level is, measured, and judged."""

COLUMN_RANK: dict[str, int] = {
    name: rank
    for rank, name in enumerate(
        [
            "level",
            "tok/s",
            "verdict",
            "server tok/s",
            "server tokens",
            RATES_HEADER,
            "target",
            "baseline",
            "change (90% CI)",
            "p",
            "ok/failed",
            "TTFT p50/p95 s",
            "ITL p50 ms",
            "req tok/s p50",
            "prompt tok",
            CACHE_HEADER,
            "reason/content tok",
            "TTFC p50/p95 s",
            "trials",
            "server s",
        ]
    )
}
"""Which columns go into a table's first block when it must be stacked: the gate's (the figure,
its verdict, the server's own count of it where asked for, an open loop's offered and completed
rates, what it was judged against) before the latencies and the details."""


def summary_width(isatty: bool | None = None) -> int:
    """The width the terminal summary keeps to: ``COLUMNS`` (as pytest reads it: under
    :data:`~pytest_kimi.report.peer_cells.MIN_WIDTH` is a broken report, 80), else the
    terminal's when there is one (``isatty``: default, whether stdout is one), else
    :data:`NON_TTY_WIDTH`."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit():
        return int(columns) if int(columns) >= MIN_WIDTH else 80
    if sys.stdout.isatty() if isatty is None else isatty:
        return terminal_width()
    return NON_TTY_WIDTH


def fit_line(line: str, width: int) -> list[str]:
    """``line`` as lines of at most ``width`` columns: wrapped at spaces (a word longer than
    the width, such as a path, is split), continuations indented :data:`CONTINUATION` beyond
    the line's own indent.  A shell command to copy (a line whose text starts with ``$ ``, such
    as the ``git add`` an update prints) is left whole: wrapped, its paste would run half of it
    or break its quoting."""
    if len(line) <= width or line.lstrip(" ").startswith("$ "):
        return [line]
    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    if len(indent) + len(CONTINUATION) >= width // 2:
        indent = ""  # a deep indent would leave no room for the text
    return textwrap.wrap(
        body,
        width,
        initial_indent=indent,
        subsequent_indent=indent + CONTINUATION,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [line[:width]]


def fit_lines(lines: Sequence[str], width: int) -> list[str]:
    """Every line made printable (:func:`~pytest_kimi.printable.printable`) and fitted to
    ``width`` (:func:`fit_line`): the last step before a line reaches the terminal."""
    return [part for line in lines for part in fit_line(printable(line, LINE_LIMIT), width)]


def _span(widths: Sequence[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


COLUMN_GROUPS: dict[str, str] = {
    "reason/content tok": "TTFT p50/p95 s",
    "TTFC p50/p95 s": "TTFT p50/p95 s",
    "server tokens": "server tok/s",
}
"""Columns read together, kept in one block when a table is stacked: the wait for the answer
beside the wait for any token, the server's token count beside its rate."""


def _blocks(header: list[str], cells: list[list[str]], width: int) -> list[list[int]]:
    """The column indexes of each block of a table within ``width``: all of them when they
    fit; else without the all-``-`` columns; else stacked, the label in every block, the
    others packed by :data:`COLUMN_RANK` with their :data:`COLUMN_GROUPS` (each block in the
    table's own order; a group wider than ``width`` alone still gets a block)."""
    widths = [max(len(h), *(len(c) for c in col)) for h, col in zip(header, cells)]
    every = list(range(len(header)))
    if _span(widths) <= width:
        return [every]
    kept = [
        i for i in every if i == 0 or header[i] in ALWAYS_SHOWN or any(c != "-" for c in cells[i])
    ]
    if _span([widths[i] for i in kept]) <= width:
        return [kept]
    groups: dict[str, list[int]] = {}
    for i in kept[1:]:
        groups.setdefault(COLUMN_GROUPS.get(header[i], header[i]), []).append(i)
    rest = sorted(
        groups.values(), key=lambda g: (COLUMN_RANK.get(header[g[0]], len(COLUMN_RANK)), g[0])
    )
    blocks: list[list[int]] = []
    while rest:
        block = [0]
        for group in rest:
            if len(block) == 1 or _span([widths[j] for j in (*block, *group)]) <= width:
                block += group
        rest = [g for g in rest if g[0] not in block]
        blocks.append(sorted(block))
    return blocks


def format_table(
    levels: Sequence[LevelEntry],
    columns: Sequence[Column] | None = None,
    width: int | None = None,
) -> list[str]:
    """Aligned rows, numbers right-aligned, then one line per reason of a non-passing level.

    ``width``: the columns the lines may take (None: no limit): a table wider is narrowed and
    then stacked in blocks (:func:`_blocks`), and the reasons are wrapped.  Every cell is made
    printable, so a label or a server's string cannot move the columns or the cursor."""
    columns = columns_for(levels) if columns is None else columns
    header = [name for name, _ in columns]
    cells = [[printable(fn(lv), CELL_LIMIT) for lv in levels] for _, fn in columns]
    blocks = (
        [list(range(len(header)))] if width is None or not header else _blocks(header, cells, width)
    )
    lines: list[str] = []
    for block in blocks:
        widths = [max(len(header[i]), *(len(c) for c in cells[i])) for i in block]
        lines.append("  ".join(header[i].rjust(w) for i, w in zip(block, widths)))
        lines += [
            "  ".join(cells[i][row].rjust(w) for i, w in zip(block, widths))
            for row in range(len(levels))
        ]
    for lv in levels:
        label = lv.get("label") or f"C={lv['concurrency']}"
        for reason in lv.get("reasons", []):
            line = f"  {label} {lv.get('verdict')}: {reason}"
            lines += [printable(line, LINE_LIMIT)] if width is None else fit_lines([line], width)
    return lines


def _lengths(levels: Sequence[LevelEntry]) -> str:
    """The test's lengths and prompts once in the title, unless levels sweep them."""
    parts = []
    for name in ("max_tokens", "input_tokens", "prompts"):
        values = list(dict.fromkeys(lv.get(name) for lv in levels))
        if len(values) == 1 and values[0] is not None:
            parts.append(f"{name}={values[0]}")
    return " ".join(parts)


def price_text(test: TestEntry) -> str | None:
    """What the test's measurement cost the server, and the clock its figures are in (the
    simulator's: wall seconds times its speed), for every report's test heading."""
    spent = test.get("server_time_s")
    clock = test.get("server_clock")
    if spent is None:
        return None
    out = f"server time {spent:.1f} s"
    speed = clock.get("speed") if clock else None
    if speed:
        out += (
            f" in the simulator's clock (wall x {speed:g}); tok/s and latencies are in that "
            "clock too"
        )
    return out


def session_text(test: TestEntry) -> str:
    """`` (s2)`` after a test's title when it ran in one of several ``--perf-sessions``."""
    k = test.get("perf_session")
    return f" (s{k + 1})" if isinstance(k, int) else ""


def format_test(test: TestEntry, width: int | None = None) -> list[str]:
    """A test's lines in the terminal summary (and a failed test's message), every one
    printable and at most ``width`` columns (default: :func:`summary_width`)."""
    width = summary_width() if width is None else width
    w = test.get("workload", {})
    where = (f" on {test['profile']}" if test.get("profile") else "") + session_text(test)
    title = (
        f"{test['nodeid']}{where} [{test.get('outcome', '?')}] "
        f"{_lengths(test.get('levels', []))} api={w.get('api')}"
    )
    if test.get("levels"):
        lines = [title, *("  " + line for line in format_table(test["levels"], width=width - 2))]
    else:
        lines = [title, "  no levels measured"]
    lines += ["  " + line for line in capacity_lines(test)]  # a @capacity test's search
    lines += ["  " + line for line in latency_lines(test)]  # TTFT/ITL vs target and baseline
    lines += ["  " + line for line in peer_lines(test, width)]  # as vLLM/GuideLLM report them
    shift = test.get("shift")
    if isinstance(shift, Mapping) and shift.get("text"):
        lines.append("  " + str(shift["text"]))
    if test.get("error"):
        # split at newlines only: a CR (or any other break splitlines knows) the error's
        # server text carries is escaped on its line, never a line of its own; the lines after
        # the first indented under it, so none can pass for a line of the summary's own
        first, *rest = str(test["error"]).split("\n")[:10]
        lines += ["  " + first, *("    " + line for line in rest)]
    noise = test.get("session_noise")
    if isinstance(noise, Mapping) and noise.get("source"):
        lines.append(f"  judged with session noise {noise['source']}")
    for warm in test.get("warm_up") or []:
        if isinstance(warm, Mapping) and warm.get("text"):
            lines.append("  " + str(warm["text"]))
    price = price_text(test)
    if price:
        lines.append("  " + price)
    if test.get("baseline_note"):
        lines.append("  " + test["baseline_note"])
    lines += ["  note: " + note for note in prompt_notes(test)]
    lines += ["  " + line for line in shape_lines(test.get("levels") or [])]
    changes = test.get("provenance_changes")
    if changes:
        against = f"vs {test['compared_with']}" if test.get("compared_with") else "since baseline"
        lines.append(f"  changed {against}: " + "; ".join(changes))
    return fit_lines(lines, width)


def _estimate_text(estimate: NoiseEstimateEntry) -> str:
    """``0.071 (0.041..0.21)``: the estimate of ``--perf-session-sigma`` and its interval."""
    return f"{estimate['sigma']:.3f} ({estimate['low']:.3f}..{estimate['high']:.3f})"


def _server_text(server: SessionServer) -> str:
    k = server.get("perf_session")
    parts = [f"s{k + 1}" if isinstance(k, int) else "?"]
    if server.get("pid") is not None:
        parts.append(f"pid {server['pid']}")
    if server.get("seed") is not None:
        parts.append(f"seed {server['seed']}")
    return " ".join(parts)


def format_session_noise(section: SessionNoiseSection, width: int | None = None) -> list[str]:
    """``--perf-sessions``: the session noise per level and deployment, pooled, and the
    ``--perf-session-sigma`` it recommends (the ``session_noise`` section of the JSON); every
    line printable and at most ``width`` columns (default: :func:`summary_width`)."""
    confidence = section.get("confidence", 0.9)
    lines = [
        "session_sigma: sd of log(tok/s) between two fresh server starts (what "
        f"--perf-session-sigma means), with its {confidence:.0%} interval"
    ]
    for level in section.get("levels") or []:
        where = f" on {level['profile']}" if level.get("profile") else ""
        head = f"  {level['nodeid']}{where} {level['label']}: "
        per_session = " ".join(f"{x:g}" for x in level.get("session_tok_s") or [])
        estimate = level.get("estimate")
        if estimate is None:
            lines.append(head + f"no estimate; tok/s per session {per_session}")
            continue
        lines.append(
            head + f"{_estimate_text(estimate)}; tok/s per session {per_session}, "
            f"trial noise {estimate['within_sd']:.2%}"
        )
    for dep in section.get("deployments") or []:
        name = dep.get("profile") or "deployment"
        estimate = dep.get("estimate")
        servers = ", ".join(_server_text(s) for s in dep.get("servers") or [])
        if estimate is not None:
            lines.append(
                f"  {name}, levels pooled: {_estimate_text(estimate)} from "
                f"{estimate['sessions']} sessions x {estimate['levels']} levels"
            )
        if servers:
            lines.append(f"  {name} server starts: {servers}")
    pooled = section.get("pooled")
    if pooled is not None and len(section.get("deployments") or []) > 1:
        lines.append(f"  all deployments pooled: {_estimate_text(pooled)}")
    advice = section.get("recommendation")
    if advice is not None:
        lines.append(f"recommended: {advice['text']}")
    lines += [f"  note: {note}" for note in section.get("notes") or []]
    return fit_lines(lines, summary_width() if width is None else width)
