"""``--perf-markdown``: the run summary people read on a CI job page or in a PR comment.

It reads the ``--perf-json`` shape (never measures) so the same text can be produced live by
the plugin, offline from a saved report, or from an offline ``kimi-perf compare``.  The column
model (:func:`summary_columns`) is shared with the HTML report, so both always show the same
figures.

GitHub renders Markdown tables and also raw HTML, which is why every cell goes through
:func:`cell` (a ``|`` would split the row; a ``<`` could open a tag and swallow text such as
``<absent>``), and why the failing verdicts are marked with bold capitals instead of colour or
emoji: the marker survives plain-text logs, e-mail notifications and screen readers.

Every string a server supplied (a model id, an HTTP error body quoted in a reason) reaches this
file's helpers, so each of them also makes its text printable
(:func:`~pytest_kimi.printable.printable`: control characters escaped, length capped), and
:func:`render_markdown` sweeps its whole document once more: a raw ESC in ``--perf-markdown``
or a step summary would act on whoever prints the file with ``cat``, and no renderer's path
may bypass it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_kimi.printable import printable
from pytest_kimi.report.markdown_cell import CELL_LIMIT, cell
from pytest_kimi.verdicts import Verdict
from pytest_kimi.report.capacity_cells import capacity_markdown
from pytest_kimi.report.latency_cells import latency_markdown
from pytest_kimi.report.peer_cells import peer_markdown
from pytest_kimi.report.json_report import run_status
from pytest_kimi.report.workload_cells import RATES_HEADER, has_rates, rates_cell, shape_lines
from pytest_kimi.report.dataset_cells import (
    CACHE_HEADER,
    cache_hit_cell,
    dataset_lines,
    has_cache_column,
)
from pytest_kimi.report.terminal import (
    price_text,
    num as _num,
    prompt_tokens_cell,
    reasoning_tokens_cell,
    server_tok_s_cell,
    server_tokens_cell,
    session_text,
    tok_s_cell as _current,
)
from pytest_kimi.wire import (
    LevelEntry,
    NoiseEstimateEntry,
    Report,
    SessionNoiseSection,
    TestEntry,
)

VERDICT_HELP: dict[str, str] = {v.value: v.meaning for v in Verdict}
"""What each verdict means, for the reports' legends (the words live on :class:`Verdict`)."""

MAX_ERRORS_SHOWN = 5
"""A level that failed every request has hundreds of near-identical errors; the summary shows
a few, the JSON report keeps them all."""

LEGEND = (
    "Verdicts that fail a run: **FAIL**, **INVALID**, **ERROR**, **REGRESSION**, "
    "**INCONCLUSIVE** (an estimate beyond the tolerance); also *no-baseline* with "
    "`--perf-require-baseline`, and *underpowered* with `--perf-strict`. Change is current vs baseline median with its 90% confidence "
    "interval; p is the Holm-adjusted p-value of the regression test."
)


# ------------------------------------------------------------------------------------ escaping


TEXT_LIMIT = 2000
"""Characters of one paragraph or list item kept: a reason fits, a server's error page not."""

ERROR_LIMIT = 5000
"""Characters of a test's error block kept (its lines kept too)."""


def text(value: str) -> str:
    """Free Markdown text (list items, paragraphs): only ``<`` can do harm there, and the
    control characters (escaped, as everywhere)."""
    return printable(value.replace("<", "&lt;").replace("\r", " ").replace("\n", " "), TEXT_LIMIT)


def code(value: str) -> str:
    """An inline code span that survives backticks inside ``value`` (CommonMark rule);
    printable."""
    value = printable(value, CELL_LIMIT)
    fence = "`"
    while fence in value:
        fence += "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def marker(verdict: str, failing: Iterable[str] | None = None) -> str:
    """``**REGRESSION**`` for verdicts that fail the run, ``*underpowered*`` for warnings.

    ``failing``: the verdict values the run was judged by (by default ``Verdict.failing()``).
    """
    if verdict in set(Verdict.failing() if failing is None else failing):
        return f"**{verdict.upper()}**"
    if is_warning(verdict):
        return f"*{verdict}*"
    return verdict


def is_warning(verdict: str) -> bool:
    """A report's verdict string is a warning (:attr:`Verdict.warning`); unknown words are not."""
    known = Verdict.of(verdict)
    return known is not None and known.warning


# ------------------------------------------------------------------------------- column model


def _change(level: LevelEntry) -> str:
    change = level.get("change_pct")
    if change is None:
        return "-"
    ci = level.get("ci90") or [None, None]
    lo, hi = ("?" if x is None else f"{x:+.1f}%" for x in ci)
    return f"{change:+.1f}% ({lo} .. {hi})"


def _first_tokens(level: LevelEntry) -> str:
    """TTFT/TTFC at the level's percentile: the wait for any token vs for the answer."""
    if level.get("reasoning_tokens_mean") is None:
        return "-"
    return f"{_num(level.get('ttft_s_pct'), '.3f')}/{_num(level.get('ttfc_s_pct'), '.3f')}"


def _trials(level: LevelEntry) -> str:
    base = level.get("baseline_trials")
    if isinstance(base, list):  # a report that carries the samples themselves
        base = len(base)
    return f"{level.get('trials', 0)}" + (f" (base {base})" if base else "")


@dataclass(frozen=True, slots=True)
class Column:
    """One table column: header, cell text (plain, unescaped) and alignment."""

    header: str
    value: Callable[[LevelEntry], str]
    numeric: bool = True


def summary_columns(levels: Sequence[LevelEntry]) -> list[Column]:
    """The per-level columns of the summary table.

    Columns that would be all dashes are dropped (profile, max_tokens, target, failed
    requests) so the common table stays narrow enough for a PR comment.
    """
    cols: list[Column] = []
    if any(lv.get("profile") is not None for lv in levels):
        cols.append(Column("profile", lambda lv: str(lv.get("profile") or "-"), numeric=False))
    cols.append(
        Column(
            "level",
            lambda lv: str(lv.get("label") or f"C={lv.get('concurrency', '?')}"),
            numeric=False,
        )
    )
    cols += [
        Column("baseline tok/s", lambda lv: _num(lv.get("baseline_tok_s"), ".1f")),
        Column("current tok/s", _current),
    ]
    if has_rates(levels):
        cols.append(Column(RATES_HEADER, rates_cell))
    if any(lv.get("server") for lv in levels):
        cols += [
            Column("server tok/s", server_tok_s_cell),
            Column("server tokens", server_tokens_cell),
        ]
    cols += [
        Column("change (90% CI)", _change),
        Column("p", lambda lv: _num(lv.get("p_value"), ".3g")),
        Column("trials", _trials),
    ]
    if any(lv.get("target_tok_s") is not None for lv in levels):
        cols.append(Column("target tok/s", lambda lv: _num(lv.get("target_tok_s"), "g")))
    if any(lv.get("prompt_tokens") for lv in levels):
        # what the server counted (usage): input_tokens is sized, or estimated, before the run
        cols.append(Column("prompt tokens", prompt_tokens_cell))
    if has_cache_column(levels):
        # the server's prefix-cache hit rate (shared prefixes really served from its cache)
        cols.append(Column(CACHE_HEADER, cache_hit_cell))
    if any(lv.get("reasoning_tokens_mean") is not None for lv in levels):
        # reasoning streams only: where the output went, and how long the answer took to start
        pct = next((lv.get("percentile") for lv in levels if lv.get("percentile") is not None), 95)
        cols += [
            Column("reasoning/content tok", reasoning_tokens_cell),
            Column(f"TTFT/TTFC p{pct:g} s", _first_tokens),
        ]
    if any(lv.get("requests_failed") for lv in levels):
        cols.append(
            Column(
                "failed req",
                lambda lv: (
                    f"{lv.get('requests_failed', 0)}/"
                    f"{lv.get('requests_ok', 0) + lv.get('requests_failed', 0)}"
                ),
            )
        )
    return cols


def level_label(level: LevelEntry, test: TestEntry | None = None) -> str:
    """``C=8`` or ``ep8 C=8``: how reasons name a level (no profile when the test entry is
    already the one deployment's)."""
    label = level.get("label") or f"C={level.get('concurrency', '?')}"
    profile = level.get("profile")
    if profile is None or (test is not None and test.get("profile") == profile):
        return label
    return f"{profile} {label}"


def test_title(test: TestEntry) -> str:
    """``nodeid``, or ``nodeid on <deployment>`` for the entries of a same-run A/B, where one
    nodeid appears once per deployment (test-level ``profile``)."""
    profile = test.get("profile")
    title = f"{test.get('nodeid', '?')} on {profile}" if profile else str(test.get("nodeid", "?"))
    return title + session_text(test)


def workload_text(workload: Mapping[str, Any]) -> str:
    """``api=chat max_tokens=64 prompts=builtin:diverse ignore_eos=true`` (unset keys left out)."""
    parts = []
    for key, value in workload.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        parts.append(f"{key}={value}")
    return " ".join(parts)


# ------------------------------------------------------------------------------------ headline


def outcome_counts(tests: Sequence[TestEntry]) -> Counter[str]:
    return Counter(str(t.get("outcome", "unknown")) for t in tests)


def headline(report: Report) -> tuple[str, str]:
    """(status word, one-line summary) shared with the HTML report.

    The word is the report's ``status`` (:func:`~pytest_kimi.report.json_report.run_status`;
    reports written before it had none are read the same way from their outcomes), so an
    interrupted run says ``INTERRUPTED``, never ``PASSED``, and the summary says what stopped it.
    """
    tests = report.get("tests") or []
    counts = outcome_counts(tests)
    word = report.get("status")
    if not isinstance(word, str):
        word = run_status(tests, interrupted=bool(report.get("interrupted")))
    status = word.replace("-", " ").upper()
    order = ["passed", "failed", "error", "skipped"]
    parts = [f"{counts.get(k, 0)} {k}" for k in order[:2]]
    parts += [
        f"{counts[k]} {k}" for k in (*order[2:], *sorted(set(counts) - set(order))) if counts.get(k)
    ]
    n = len(tests)
    summary = f"{n} test{'s' if n != 1 else ''}: " + ", ".join(parts)
    if isinstance(report.get("interrupted"), str):
        summary += f"; {report['interrupted']}"
    return status, summary


def run_facts(report: Report) -> list[tuple[str, str, bool]]:
    """What the run was against, as (label, value, value is code): endpoint, model, server
    version and plugin version, those that are known; both the Markdown and the HTML head."""
    endpoint = report.get("endpoint") or {}
    facts = [
        ("endpoint", endpoint.get("url"), True),
        ("model", endpoint.get("model"), True),
        ("server", (endpoint.get("server_info") or {}).get("version"), True),
        ("pytest-kimi", report.get("plugin_version"), False),
    ]
    return [(label, str(value), is_code) for label, value, is_code in facts if value]


def gate_line(report: Report) -> str | None:
    """What the verdicts were judged by, the session noise and where it came from (None for
    a report without the ``gate`` object: older versions, ``kimi-perf compare``)."""
    gate = report.get("gate")
    if not isinstance(gate, Mapping) or gate.get("session_sigma") is None:
        return None
    return (
        f"gate: tolerance {float(gate.get('tolerance', 0)) * 100:g}%, alpha "
        f"{gate.get('alpha')}, session noise {float(gate['session_sigma']):g} from "
        f"{gate.get('session_sigma_source', '?')}"
    )


def verdict_counts(tests: Sequence[TestEntry]) -> Counter[str]:
    return Counter(str(lv.get("verdict", "?")) for t in tests for lv in t.get("levels") or [])


# ------------------------------------------------------------------------------------- render


def render_markdown(report: Report, *, failing_verdicts: Iterable[str] | None = None) -> str:
    """The whole summary as GitHub-flavoured Markdown (ends with a newline).

    ``failing_verdicts`` is the set the run was judged by (``GateSettings.failing_verdicts()``)
    so that ``--perf-strict`` runs mark *underpowered* as failing; by default the base set.
    Optional top-level ``title`` and ``notes`` keys (written by ``kimi-perf compare``) replace
    the default title and add lines under the headline.
    """
    failing = frozenset(failing_verdicts) if failing_verdicts is not None else Verdict.failing()
    tests = list(report.get("tests") or [])
    status, summary = headline(report)
    title = report.get("title") or "pytest-kimi throughput"
    out = [f"## {text(str(title))}: {status}", "", f"**{summary}**"]
    where = [
        f"{label} {code(v) if is_code else text(v)}" for label, v, is_code in run_facts(report)
    ]
    if where:
        out += ["", " · ".join(where)]
    judged = gate_line(report)
    if judged:
        out += ["", text(judged)]
    verdicts = verdict_counts(tests)
    if verdicts:
        out += [
            "",
            "Levels: "
            + ", ".join(
                f"{n} {text(marker(v, failing))}"
                for v, n in sorted(verdicts.items(), key=lambda kv: (-kv[1], kv[0]))
            ),
        ]
    for note in report.get("notes") or []:
        out += ["", text(str(note))]
    for test in tests:
        out += ["", *_render_test(test, failing)]
    noise = report.get("session_noise")
    if isinstance(noise, Mapping):
        out += ["", *render_session_noise(noise)]
    culprit = report.get("culprit")
    if isinstance(culprit, Mapping):
        from pytest_kimi.report.culprit_text import markdown_culprit

        out += ["", *markdown_culprit(culprit)]
    race = report.get("race")
    if isinstance(race, Mapping):
        from pytest_kimi.report.race_text import markdown_race

        out += ["", *markdown_race(race)]
    out += ["", "---", "", LEGEND, ""]
    # the last guard: whatever a helper above missed, no control character but the newline
    # and the tab reaches the file
    return printable("\n".join(out), None, lines=True)


def _render_test(test: TestEntry, failing: frozenset[str]) -> list[str]:
    outcome = str(test.get("outcome", "?"))
    shown = f"**{outcome.upper()}**" if outcome in ("failed", "error") else text(outcome)
    where = f" on {code(str(test['profile']))}" if test.get("profile") else ""
    where += text(session_text(test))
    lines = [f"### {code(str(test.get('nodeid', '?')))}{where} {shown}"]
    meta = []
    workload = test.get("workload") or {}
    if workload:
        meta.append(f"workload: {code(workload_text(workload))}")
    if test.get("compared_with"):
        meta.append(f"compared with {text(str(test['compared_with']))}")
    elif test.get("baseline_profile"):
        meta.append(f"baseline profile {code(str(test['baseline_profile']))}")
    price = price_text(test)
    if price:
        meta.append(text(price))
    if meta:
        lines += ["", " · ".join(meta)]
    levels = list(test.get("levels") or [])
    if levels:
        cols = summary_columns(levels)
        lines += [
            "",
            "| " + " | ".join(cell(c.header) for c in cols) + " | verdict |",
            "|" + "|".join("---:" if c.numeric else ":---" for c in cols) + "|:---|",
        ]
        for lv in levels:
            cells = [cell(c.value(lv)) for c in cols]
            lines.append(
                "| "
                + " | ".join(cells)
                + f" | {cell(marker(str(lv.get('verdict', '?')), failing))} |"
            )
    else:
        lines += ["", "_no levels measured_"]
    lines += capacity_markdown(test, lambda v: marker(v, failing), cell, text)
    lines += latency_markdown(test, cell, text)  # TTFT/ITL vs target and baseline
    lines += peer_markdown(test, cell, text)  # the figures vLLM/GuideLLM report
    if test.get("error"):
        error = printable(str(test["error"]), ERROR_LIMIT, lines=True)
        lines += ["", "```text", error.replace("```", "'''"), "```"]
    notes: list[str] = []
    for lv in levels:
        label = text(level_label(lv, test))  # a deployment's name is in it
        verdict = text(marker(str(lv.get("verdict", "?")), failing))
        for reason in lv.get("reasons") or []:
            notes.append(f"- {label} {verdict}: {text(str(reason))}")
        errors = list(lv.get("errors") or [])
        for error in errors[:MAX_ERRORS_SHOWN]:
            notes.append(f"- {label} error: {text(str(error))}")
        if len(errors) > MAX_ERRORS_SHOWN:
            notes.append(
                f"- {label}: {len(errors) - MAX_ERRORS_SHOWN} more errors in the JSON report"
            )
    shift = test.get("shift")
    if isinstance(shift, Mapping) and shift.get("text"):
        notes.append(
            f"- all levels {text(marker(str(shift.get('verdict', '?')), failing))}: "
            f"{text(str(shift['text']))}"
        )
    notes += [f"- {text(line)}" for line in shape_lines(levels)]
    notes += [f"- {text(line)}" for line in dataset_lines(test)]
    if notes:
        lines += ["", *notes]
    if test.get("baseline_note"):
        lines += ["", text(str(test["baseline_note"]))]
    changes = test.get("provenance_changes") or []
    if changes:
        against = f"vs {test['compared_with']}" if test.get("compared_with") else "since baseline"
        lines += ["", f"changed {text(against)}: " + text("; ".join(str(c) for c in changes))]
    return lines


def _interval(estimate: NoiseEstimateEntry) -> tuple[str, str]:
    return f"{estimate['sigma']:.3f}", f"{estimate['low']:.3f} .. {estimate['high']:.3f}"


def render_session_noise(section: SessionNoiseSection) -> list[str]:
    """``--perf-sessions``: the session noise per level, pooled per deployment, and the
    recommended ``--perf-session-sigma`` (the JSON's ``session_noise`` section)."""
    confidence = float(section.get("confidence", 0.9))
    lines = [
        "### Session noise",
        "",
        "session_sigma is the sd of log(tok/s) between two fresh server starts: what "
        f"`--perf-session-sigma` means. Intervals are {confidence:.0%}.",
        "",
        f"| where | level | session_sigma | {confidence:.0%} interval | sessions | tok/s per session |",
        "|:---|:---|---:|:---|---:|:---|",
    ]
    for level in section.get("levels") or []:
        where = str(level.get("nodeid", "?"))
        if level.get("profile"):
            where += f" on {level['profile']}"
        estimate = level.get("estimate")
        sigma, interval = _interval(estimate) if estimate else ("-", "-")
        per_session = " ".join(f"{x:g}" for x in level.get("session_tok_s") or [])
        lines.append(
            f"| {cell(where)} | {cell(str(level.get('label', '?')))} | {sigma} | {interval} | "
            f"{len(level.get('sessions') or [])} | {cell(per_session)} |"
        )
    for dep in section.get("deployments") or []:
        estimate = dep.get("estimate")
        if estimate is None:
            continue
        sigma, interval = _interval(estimate)
        name = str(dep.get("profile") or "deployment")
        lines.append(
            f"| {cell(name)} | **{estimate['levels']} levels pooled** | **{sigma}** | {interval} | "
            f"{estimate['sessions']} | |"
        )
    advice = section.get("recommendation")
    if isinstance(advice, Mapping):
        lines += ["", f"**Recommended:** {text(str(advice['text']))}"]
    for note in section.get("notes") or []:
        lines += [f"- {text(str(note))}"]
    return lines
