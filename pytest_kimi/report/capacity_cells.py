"""A ``@capacity`` test in the reports: the capacity, its bracket and boundary, the search.

Every renderer reads the report's ``capacity`` object (:func:`pytest_kimi.gate.capacity_gate.
capacity_dict`), so the terminal, the Markdown summary and the HTML page say the same: the
capacity with the bracket the search ended with, the interpolated boundary and its 90%
interval under trial noise, the baseline comparison, and each level of the search in the
order it was measured (held or broke, by how much, on how many trials).
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from pytest_kimi.wire import CapacityEntry, CapacityLevelEntry, TestEntry

LATENCY_NAMES = {"ttft_s": "TTFT", "itl_s": "ITL", "e2e_s": "end-to-end"}


def _load(capacity: CapacityEntry, load: Any) -> str:
    if load is None:
        return "-"
    if capacity.get("metric") == "rate":
        return f"rate={float(load):g}/s"
    return f"C={load}"


def _num(x: Any, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def slo_text(capacity: CapacityEntry) -> str:
    """``p95 ITL <= 0.05 s, TTFT <= 2 s``: the ceilings the capacity is under."""
    ceilings = capacity.get("ceilings") or {}
    parts = [f"{LATENCY_NAMES.get(k, k)} <= {v:g} s" for k, v in ceilings.items()]
    return f"p{capacity.get('percentile', 95):g} " + ", ".join(parts)


def headline(capacity: CapacityEntry) -> str:
    """``capacity C=40 under p95 ITL <= 0.05 s: C=40 held, C=44 broke; boundary 41.2 (90% CI
    40.7..41.7) [pass]``."""
    low, high = capacity.get("low"), capacity.get("high")
    slo = slo_text(capacity)
    verdict = capacity.get("verdict", "?")
    if low is None and high is None:
        return f"capacity not found under {slo} [{verdict}]"
    if low is None:
        return (
            f"capacity below {_load(capacity, high)} under {slo}: the bottom of the range "
            f"broke [{verdict}]"
        )
    if high is None:
        return (
            f"capacity at least {_load(capacity, low)} under {slo}: the top of the range held "
            f"[{verdict}]"
        )
    text = (
        f"capacity {_load(capacity, capacity.get('value'))} under {slo}: "
        f"{_load(capacity, low)} held, {_load(capacity, high)} broke"
    )
    estimate, ci = capacity.get("estimate"), capacity.get("ci90")
    if estimate is not None:
        text += f"; boundary {estimate:.4g}"
        if ci:
            text += f" (90% CI {ci[0]:.4g}..{ci[1]:.4g})"
    return text + f" [{verdict}]"


def baseline_text(capacity: CapacityEntry) -> str | None:
    """``baseline C=40 [40..44] boundary 41.3; change -9.9% (90% CI -15.2% .. -4.3%), p=0.002``."""
    if capacity.get("baseline") is None and capacity.get("baseline_high") is None:
        return None
    text = (
        f"baseline {_load(capacity, capacity.get('baseline'))} "
        f"[{_num(capacity.get('baseline_low'), 'g')}..{_num(capacity.get('baseline_high'), 'g')}]"
    )
    if capacity.get("baseline_estimate") is not None:
        text += f" boundary {capacity['baseline_estimate']:.4g}"
    change = capacity.get("change_pct")
    if change is not None:
        lo, hi = capacity.get("change_ci90") or (None, None)
        text += f"; change {change:+.1f}% (90% CI {_num(lo, '+.1f')}% .. {_num(hi, '+.1f')}%)"
    if capacity.get("p_value") is not None:
        text += f", p={capacity['p_value']:.3g}"
    return text


def level_text(capacity: CapacityEntry, level: CapacityLevelEntry) -> str:
    """``C=48 broke -24.3% (ITL, 3 trials, jitter)``: one level of the search (``jitter``: its
    per-gap ITL tail carries the client's timing; ``1 re-measured``: trials voided by a client
    stall and measured again)."""
    held = level.get("held")
    word = "held" if held else ("broke" if held is False else "not judged")
    margin = level.get("margin_pct")
    parts = [f"{level.get('trials', 0)} trial{'s' if level.get('trials') != 1 else ''}"]
    binding = level.get("binding")
    if binding:
        parts.insert(0, LATENCY_NAMES.get(binding, binding))
    if any(str(w).startswith("client jitter") for w in level.get("warnings") or ()):
        parts.append("jitter")
    if level.get("replaced"):
        parts.append(f"{level['replaced']} re-measured")
    shown = f" {margin:+.1f}%" if margin is not None else ""
    return f"{_load(capacity, level.get('load'))} {word}{shown} ({', '.join(parts)})"


def search_text(capacity: CapacityEntry) -> str:
    levels: Sequence[CapacityLevelEntry] = capacity.get("levels") or []
    step = capacity.get("step")
    head = (
        f"search: {len(levels)} level{'s' if len(levels) != 1 else ''}, stop {capacity.get('stop')}"
        + (f", step {step:g}" if isinstance(step, (int, float)) else "")
    )
    return head + ": " + ", ".join(level_text(capacity, lv) for lv in levels)


def capacity_lines(test: TestEntry) -> list[str]:
    """The terminal's lines for a ``@capacity`` test (none for others)."""
    capacity = test.get("capacity")
    if not isinstance(capacity, Mapping):
        return []
    lines = [headline(capacity), "  " + search_text(capacity)]
    base = baseline_text(capacity)
    if base:
        lines.append("  " + base)
    lines += [f"  capacity {capacity.get('verdict')}: {r}" for r in capacity.get("reasons") or []]
    return lines


MARGIN_HELP = (
    "margin: how far the binding latency's percentile is below (+) or above (-) its ceiling; "
    "sure: the probability, from the level's trials, that it lies on that side."
)


def note_text(level: CapacityLevelEntry) -> str:
    """The note column: why a level was not judged or broke without a figure, then what its
    figures carry (client jitter, trials re-measured for a client stall), shortened to what a
    table cell holds; the level's reasons below the table have the whole text."""
    parts = [str(level["note"])] if level.get("note") else []
    ratio = level.get("itl_p95_p50")
    if ratio is not None and any(
        str(w).startswith("client jitter") for w in level.get("warnings") or ()
    ):
        parts.append(f"client jitter: ITL p95/p50 {ratio:.2f}")
    if level.get("replaced"):
        parts.append(f"{level['replaced']} trial(s) re-measured (client stall)")
    return "; ".join(parts)


def _rows(capacity: CapacityEntry) -> list[list[str]]:
    ceilings = capacity.get("ceilings") or {}
    rows = []
    for lv in capacity.get("levels") or []:
        latencies = lv.get("latencies") or {}
        held = lv.get("held")
        rows.append(
            [
                str(lv.get("order", "?")),
                _load(capacity, lv.get("load")),
                "held" if held else ("broke" if held is False else "not judged"),
                *[_num(latencies.get(name)) for name in ceilings],
                _num(lv.get("margin_pct"), "+.1f")
                + ("%" if lv.get("margin_pct") is not None else ""),
                _num(lv.get("sure"), ".3f"),
                str(lv.get("trials", 0)),
                note_text(lv),
            ]
        )
    return rows


def _header(capacity: CapacityEntry) -> list[str]:
    pct = f"p{capacity.get('percentile', 95):g}"
    ceilings = capacity.get("ceilings") or {}
    itl = (capacity.get("workload") or {}).get("itl")

    def name(k: str) -> str:
        # the ITL judged per request says so: it is not the per-gap ITL of the level table
        return (
            "ITL (request mean)" if k == "itl_s" and itl == "request" else LATENCY_NAMES.get(k, k)
        )

    return [
        "#",
        "load",
        "result",
        *[f"{name(k)} {pct} s (<= {v:g})" for k, v in ceilings.items()],
        "margin",
        "sure",
        "trials",
        "note",
    ]


def capacity_markdown(test: TestEntry, marker: Any, cell: Any, text: Any) -> list[str]:
    """The Markdown section: the capacity line, the baseline line, and the search as a table
    in the order it was measured (``marker``, ``cell`` and ``text`` are the Markdown report's
    own escaping and verdict marking, so the section reads like the rest)."""
    capacity = test.get("capacity")
    if not isinstance(capacity, Mapping):
        return []
    verdict = str(capacity.get("verdict", "?"))
    head = headline(capacity).rsplit(" [", 1)[0]
    lines = ["", f"**Capacity** {marker(verdict)}: {text(head)}"]
    base = baseline_text(capacity)
    if base:
        lines += ["", text(base)]
    header = _header(capacity)
    lines += [
        "",
        "| " + " | ".join(cell(h) for h in header) + " |",
        "|" + "|".join("---:" if h not in ("result", "note") else ":---" for h in header) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in _rows(capacity)]
    lines += ["", text(MARGIN_HELP)]
    lines += [
        f"- capacity {marker(verdict)}: {text(str(r))}" for r in capacity.get("reasons") or []
    ]
    return lines


def capacity_html(test: TestEntry, verdict_class: str) -> str:
    """The HTML section (``verdict_class``: the page's class for the capacity's verdict)."""
    capacity = test.get("capacity")
    if not isinstance(capacity, Mapping):
        return ""
    e = html.escape
    verdict = str(capacity.get("verdict", "?"))
    head = headline(capacity).rsplit(" [", 1)[0]
    parts = [
        f'<p class="capacity"><b>Capacity</b> <span class="{e(verdict_class)}">{e(verdict)}</span>'
        f": {e(head)}</p>"
    ]
    base = baseline_text(capacity)
    if base:
        parts.append(f"<p>{e(base)}</p>")
    header = "".join(f"<th>{e(h)}</th>" for h in _header(capacity))
    body = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in _rows(capacity)
    )
    parts.append(
        f'<table class="capacity-search"><thead><tr>{header}</tr></thead><tbody>{body}'
        f'</tbody></table><p class="meta">{e(MARGIN_HELP)}</p>'
    )
    reasons = capacity.get("reasons") or []
    if reasons:
        parts.append("<ul>" + "".join(f"<li>{e(str(r))}</li>" for r in reasons) + "</ul>")
    return "\n".join(parts)
