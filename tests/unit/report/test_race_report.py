"""The ``race`` section (``--perf-race``: which deployment is best) in the terminal, the Markdown
summary and the HTML page, on hand-made sections: the renderers read the saved report's shape,
so a section that the race never produced (a tie, a budget end, a hostile name) is checked as
well as the common winner.  Deployment names and reasons come from profile files and servers:
they must reach no sink raw."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.report.html import render_html, write_html
from pytest_kimi.report.markdown import render_markdown
from pytest_kimi.report.race_chart import frontier_svg
from pytest_kimi.report.race_text import format_race, markdown_race

HOSTILE = "evil\x1b[31m|red</td><script>alert(1)</script>"

SHOWN = HOSTILE.replace("\x1b", "\\x1b")
"""The hostile name as every sink shows it: the ESC written as a visible escape."""

SVG = "{http://www.w3.org/2000/svg}"


def _point(
    c: int, per_user: float, per_gpu: float, ci: list[float] | None = None
) -> dict[str, Any]:
    return {
        "label": f"C={c}",
        "concurrency": c,
        "tok_s_per_user": per_user,
        "tok_s_per_gpu": per_gpu,
        "tok_s_per_gpu_ci90": ci,
        "launches": 3,
    }


def winner_section() -> dict[str, Any]:
    """Four deployments: a winner, a runner-up eliminated in round 3, one eliminated in round 2,
    one that did not start."""
    return {
        "objective": {
            "kind": "tok_s",
            "text": "test_suite.py::test_peak: peak tok/s over its levels",
            "test": "test_suite.py::test_peak",
            "min_request_tok_s": None,
        },
        "ranking": [
            {
                "deployment": "kimi-tp8",
                "value": 12345.6,
                "ci90": [12100.0, 12590.2],
                "eliminated_in_round": None,
                "status": "winner",
                "launches": 4,
                "vs_best_pct": 0.0,
                "vs_best_ci90_pct": None,
                "p_best": 0.9991,
                "reason": None,
                "gpus": 8,
                "launch_values": [12300.0, 12400.0, 12290.0, 12390.0],
            },
            {
                "deployment": "kimi-ep8",
                "value": 10829.1,
                "ci90": [10600.0, 11050.0],
                "eliminated_in_round": 3,
                "status": "eliminated",
                "launches": 3,
                "vs_best_pct": -12.3,
                "vs_best_ci90_pct": [-15.0, -9.6],
                "p_best": 0.0009,
                "reason": "slower than kimi-tp8: -12.3% (90% CI -15.0% .. -9.6%), "
                "Tukey-adjusted p 0.003 <= 0.012 over 3 survivors",
                "gpus": 8,
                "launch_values": [10800.0, 10850.0, 10840.0],
            },
            {
                "deployment": "kimi-tp4",
                "value": 5000.0,
                "ci90": [4890.0, 5110.0],
                "eliminated_in_round": 2,
                "status": "eliminated",
                "launches": 2,
                "vs_best_pct": -59.5,
                "vs_best_ci90_pct": [-60.4, -58.5],
                "p_best": 0.0,
                "reason": None,
                "beaten_by": "kimi-tp8",
                "p_value": 0.00012,
                "gpus": 4,
                "launch_values": [4990.0, 5010.0],
            },
            {
                "deployment": "kimi-dp2",
                "value": None,
                "ci90": None,
                "eliminated_in_round": 1,
                "status": "failed",
                "launches": 1,
                "vs_best_pct": None,
                "vs_best_ci90_pct": None,
                "p_best": 0.0,
                "reason": "did not start: CUDA out of memory",
                "gpus": 16,
                "launch_values": [None],
            },
        ],
        "winner": "kimi-tp8",
        "tie": [],
        "undecided": [],
        "stop": "winner",
        "rounds": 4,
        "launches": 10,
        "server_s": 812.4,
        "grid_server_s": 2400.0,
        "tolerance": 0.05,
        "alpha": 0.05,
        "nominal_alpha": 0.012,
        "launch_sigma": 0.018,
        "winner_profile": ".kimi/race/kimi-tp8.yaml",
        "frontier": [
            {
                "deployment": "kimi-tp8",
                "gpus": 8,
                "points": [
                    _point(64, 20.5, 180.0, [171.0, 189.0]),
                    _point(8, 61.2, 55.1, [53.0, 57.2]),
                    _point(32, 35.0, 140.0, None),
                ],
            },
            {
                "deployment": "kimi-ep8",
                "gpus": 8,
                "points": [
                    _point(8, 58.0, 50.0, [48.0, 52.0]),
                    _point(64, 18.0, 170.0, [160, 180]),
                ],
            },
            {"deployment": "kimi-dp2", "gpus": 16, "points": []},
        ],
    }


def tie_section() -> dict[str, Any]:
    section = winner_section()
    section["ranking"] = [dict(e) for e in section["ranking"][:2]]
    for entry in section["ranking"]:
        entry.update(status="tie", eliminated_in_round=None, reason=None)
    section["ranking"][1].update(vs_best_pct=-1.2, vs_best_ci90_pct=[-3.0, 0.6], p_best=0.2)
    section.update(
        winner=None, tie=["kimi-tp8", "kimi-ep8"], stop="tie", winner_profile=None, frontier=[]
    )
    return section


def undecided_section() -> dict[str, Any]:
    section = tie_section()
    for entry in section["ranking"]:
        entry["status"] = "undecided"
    section.update(tie=[], undecided=["kimi-tp8", "kimi-ep8"], stop="budget", grid_server_s=None)
    return section


def hostile_section() -> dict[str, Any]:
    section = winner_section()
    section["ranking"][0]["deployment"] = HOSTILE
    section["ranking"][1]["reason"] = f"slower than {HOSTILE}: -12.3%"
    section["ranking"][3]["reason"] = f"did not start: {HOSTILE}"
    section["winner"] = HOSTILE
    section["frontier"][0]["deployment"] = HOSTILE
    section["frontier"][0]["points"][0]["label"] = HOSTILE
    section["objective"]["text"] = f"peak tok/s of {HOSTILE}"
    return section


def _report(section: dict[str, Any] | None) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema": 1,
        "plugin_version": "0",
        "status": "passed",
        "endpoint": {},
        "tests": [],
    }
    if section is not None:
        report["race"] = section
    return report


# ------------------------------------------------------------------------------ terminal


def test_terminal_lines_of_a_clear_winner() -> None:
    lines = format_race(winner_section(), 400)
    assert lines[0].startswith("test_suite.py::test_peak: peak tok/s over its levels: ")
    assert "4 deployment(s), tolerance 5%" in lines[0]
    assert "at most 0.05 (0.012 per look)" in lines[0] and "launch noise 1.8%" in lines[0]
    first, second, third, fourth = lines[1:5]
    assert first == (
        "  1. kimi-tp8  12,345.6 tok/s (CI 12,100.0 .. 12,590.2)  top  P(best) >99%  "
        "4 launch(es)  winner"
    )
    assert "2. kimi-ep8  10,829.1 tok/s" in second
    assert "-12.3% (CI -15.0% .. -9.6%)  P(best) <1%  3 launch(es)" in second
    assert "eliminated in round 3: slower than kimi-tp8: -12.3%" in second
    assert "Tukey-adjusted p 0.003" in second
    # no reason: who eliminated it, and at what p
    assert third.endswith("eliminated in round 2 by kimi-tp8, p=0.00012")
    assert "4. kimi-dp2  no figure  -  P(best) 0%  1 launch(es)" in fourth
    assert fourth.endswith("failed in round 1: did not start: CUDA out of memory")
    answer = lines[5]
    assert answer.startswith("winner: kimi-tp8, +14.0% over kimi-ep8 ")
    assert "10 launch(es) in 4 round(s), 812 s of server time: 34% of the 2,400 s" in answer
    assert answer.endswith("; the winner's profile: .kimi/race/kimi-tp8.yaml")
    assert len(lines) == 6


def test_terminal_lines_fit_the_width() -> None:
    lines = format_race(winner_section(), 80)
    assert all(len(line) <= 80 for line in lines)
    assert any(line.startswith("winner: kimi-tp8") for line in lines)


def test_terminal_tie_and_undecided() -> None:
    tie = format_race(tie_section(), 400)
    assert tie[-1].startswith("tie within 5%, no winner: kimi-tp8, kimi-ep8 (")
    assert not tie[-1].startswith("winner") and "profile" not in tie[-1]
    assert tie[2].endswith("-1.2% (CI -3.0% .. +0.6%)  P(best) 20%  3 launch(es)  tie")
    undecided = format_race(undecided_section(), 400)
    assert undecided[-1] == (
        "undecided: the budget ended with kimi-tp8, kimi-ep8 still racing "
        "(10 launch(es) in 4 round(s), 812 s of server time)"
    )
    assert undecided[1].endswith("undecided")


def test_terminal_no_deployment_and_a_bare_section() -> None:
    section = winner_section()
    section.update(stop="no-deployment", winner=None, winner_profile=None)
    assert format_race(section, 400)[-1].startswith("no deployment started (10 launch(es)")
    bare = format_race({"objective": "tok/s of test_x", "ranking": [], "stop": None}, 400)
    assert bare == ["tok/s of test_x: 0 deployment(s)", "racing: none (0 launch(es) in 0 round(s))"]


def test_terminal_a_race_that_could_not_run() -> None:
    section = {
        "objective": None,
        "ranking": [],
        "problem": "one deployment\x1b[2J: nothing to race",
    }
    lines = format_race(section, 400)
    assert lines[-1] == "no race: one deployment\\x1b[2J: nothing to race"


def test_terminal_escapes_a_hostile_name() -> None:
    text = "\n".join(format_race(hostile_section(), 400))
    assert "\x1b" not in text and "\\x1b[31m" in text
    assert f"winner: {SHOWN}" in text


# ------------------------------------------------------------------------------ Markdown


def _table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of each Markdown table row, split on unescaped pipes."""
    rows = []
    for line in lines:
        if line.startswith("| "):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_markdown_table_and_answer() -> None:
    lines = markdown_race(winner_section())
    assert lines[0] == "### Which deployment is best"
    rows = _table_rows(lines)
    assert rows[0] == [
        "rank",
        "deployment",
        "value (90% CI)",
        "vs best (90% CI)",
        "P(best)",
        "launches",
        "status",
    ]
    assert [r[1] for r in rows[1:]] == ["kimi-tp8", "kimi-ep8", "kimi-tp4", "kimi-dp2"]
    assert rows[1][2:] == ["12,345.6 tok/s (CI 12,100.0 .. 12,590.2)", "top", ">99%", "4", "winner"]
    assert rows[4][-1] == "failed in round 1: did not start: CUDA out of memory"
    assert all(len(r) == 7 for r in rows)
    assert "**winner: kimi-tp8, +14.0% over kimi-ep8" in "\n".join(lines)


def test_markdown_tie_and_undecided() -> None:
    assert "**tie within 5%, no winner: kimi-tp8, kimi-ep8" in "\n".join(
        markdown_race(tie_section())
    )
    undecided = "\n".join(markdown_race(undecided_section()))
    assert "**undecided: the budget ended with kimi-tp8, kimi-ep8 still racing" in undecided


def test_markdown_escapes_a_hostile_name() -> None:
    lines = markdown_race(hostile_section())
    rows = _table_rows(lines)
    assert all(len(r) == 7 for r in rows), "a | in a name split a row"
    text = "\n".join(lines)
    assert "\x1b" not in text and "<script>" not in text and "</td>" not in text
    assert "&lt;script>" in text and "\\|red" in text


def test_markdown_report_has_the_section_after_the_culprit() -> None:
    report = _report(winner_section())
    report["culprit"] = {"status": "named", "named": ["tp"], "steps": []}
    doc = render_markdown(report)  # type: ignore[arg-type]
    assert doc.index("### Which change did it") < doc.index("### Which deployment is best")
    assert "### Which deployment is best" not in render_markdown(_report(None))  # type: ignore[arg-type]
    hostile = render_markdown(_report(hostile_section()))  # type: ignore[arg-type]
    assert "\x1b" not in hostile and "<script>" not in hostile


# ------------------------------------------------------------------------------ SVG


def _svg_texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def test_frontier_chart_is_valid_svg_with_lines_bands_and_legend() -> None:
    chart = frontier_svg(winner_section())
    root = ET.fromstring(chart)
    assert root.tag == f"{SVG}svg"
    assert not [el for el in root.iter() if el.tag.endswith("script")]
    assert "href" not in chart and "url(" not in chart
    lines = root.findall(f".//{SVG}polyline")
    assert len(lines) == 2  # kimi-dp2 has no point
    # the winner last (on top) and thicker; its points sorted by tok/s per user
    assert lines[-1].get("stroke-width") == "3.5" and lines[0].get("stroke-width") == "1.8"
    xs = [float(p.split(",")[0]) for p in (lines[-1].get("points") or "").split()]
    assert xs == sorted(xs) and len(xs) == 3
    # bands: kimi-ep8's two points (a polygon of 4 corners); kimi-tp8's C=8 and C=64 are
    # split by C=32, which has no interval, so each gets a bar of its own
    bands = [p for p in root.iter(f"{SVG}polygon") if p.get("fill-opacity") == "0.2"] + [
        r for r in root.iter(f"{SVG}rect") if r.get("fill-opacity") == "0.2" and r.get("x") != "1.0"
    ]
    assert len(bands) == 3
    assert sum(1 for b in bands if b.tag == f"{SVG}polygon") == 1
    texts = _svg_texts(root)
    assert "kimi-tp8 (winner)" in texts and "kimi-ep8" in texts and "kimi-dp2 (no point)" in texts
    assert "output tok/s per user (p50)" in texts and "output tok/s per GPU" in texts
    assert "0" in texts and "90% interval" in texts
    tips = ["".join(t.itertext()) for t in root.iter(f"{SVG}title")]
    assert any(
        t.startswith("kimi-tp8 C=8: 61.2 tok/s per user, 55.1 tok/s per GPU (90% CI 53.0 .. 57.2)")
        for t in tips
    )


def test_frontier_chart_draws_the_per_user_floor_and_no_points() -> None:
    section = winner_section()
    section["objective"].update(kind="frontier", min_request_tok_s=55.0)
    root = ET.fromstring(frontier_svg(section))
    assert "floor 55.0 tok/s/user" in _svg_texts(root)
    section["frontier"] = [{"deployment": "x", "points": [_point(1, float("nan"), 3.0)]}]
    empty = ET.fromstring(frontier_svg(section))
    assert "no frontier points" in _svg_texts(empty)


def test_frontier_chart_escapes_a_hostile_name() -> None:
    chart = frontier_svg(hostile_section())
    root = ET.fromstring(chart)  # a raw ESC is not even valid XML
    assert "\x1b" not in chart and "<script" not in chart
    assert not [el for el in root.iter() if el.tag.endswith("script")]
    assert f"{SHOWN} (winner)" in _svg_texts(root)


# ------------------------------------------------------------------------------ HTML


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    return parser


def _svg_of(page: str) -> ET.Element:
    match = re.search(r"<svg\b.*?</svg>", page, re.S)
    assert match, "no chart in the page"
    return ET.fromstring(match.group())


def test_html_section_with_table_answer_and_chart() -> None:
    page = render_html(_report(winner_section()))  # type: ignore[arg-type]
    assert '<h2 id="race">Which deployment is best</h2>' in page
    parsed = _parse(page)
    assert parsed.tags.count("tr") == 5 and "figure" in parsed.tags
    assert "<td><b>kimi-tp8</b></td>" in page  # the winner's row
    text = " ".join(parsed.text)
    assert "winner: kimi-tp8, +14.0% over kimi-ep8" in text
    assert "failed in round 1: did not start: CUDA out of memory" in text
    assert _svg_of(page).get("aria-labelledby") == "t-race-frontier d-race-frontier"
    # no frontier point: no chart
    tie = render_html(_report(tie_section()))  # type: ignore[arg-type]
    assert "<svg" not in tie and "tie within 5%, no winner" in tie
    assert 'id="race"' not in render_html(_report(None))  # type: ignore[arg-type]


def test_html_escapes_a_hostile_name() -> None:
    page = render_html(_report(hostile_section()))  # type: ignore[arg-type]
    parsed = _parse(page)
    assert "script" not in parsed.tags
    assert "\x1b" not in page
    assert parsed.tags.count("td") == 4 * 7
    _svg_of(page)  # still valid XML


def test_html_race_renders_in_a_browser(tmp_path: Path) -> None:
    """Chromium draws the page from file://: the deployments' colours show, the hostile name
    runs nothing."""
    from support.browser import dump_dom, read_png, require_chromium, screenshot

    from pytest_kimi.report.svg import BLUE, ORANGE

    browser = require_chromium()
    index = write_html(_report(hostile_section()), tmp_path / "html")  # type: ignore[arg-type]
    image = read_png(screenshot(index, tmp_path / "page.png", height=1600, browser=browser))
    assert len(image.matches(BLUE)) > 300, "the winner's line did not render"
    assert len(image.matches(ORANGE)) > 100, "the runner-up's line did not render"
    dom = _parse(dump_dom(index, browser=browser))
    assert "script" not in dom.tags
    assert "Which deployment is best" in " ".join(dom.text)


@pytest.mark.parametrize("section", [winner_section, tie_section, undecided_section])
def test_renderers_do_not_change_the_section(section: Any) -> None:
    given = section()
    kept = copy.deepcopy(given)
    format_race(given, 100)
    markdown_race(given)
    frontier_svg(given)
    render_html(_report(given))  # type: ignore[arg-type]
    assert given == kept
