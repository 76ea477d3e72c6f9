"""Markdown, HTML and plot reports, rendered from the two sample ``--perf-json`` reports.

The samples are real runs against the simulator: ``report-regression.json`` was measured with
a 20% slowdown (every level a regression, provenance diff ``sim.slowdown``), and
``report-baseline-run.json`` is the unchanged run.  Reports only read that shape, so these
tests need no endpoint.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.verdicts import Verdict
from pytest_kimi.report.markdown import LEGEND, cell, render_markdown
from support.paths import TESTS

DATA = TESTS / "data"
SVG_NS = "{http://www.w3.org/2000/svg}"


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@pytest.fixture
def regression() -> dict[str, Any]:
    return _load("report-regression.json")


@pytest.fixture
def baseline_run() -> dict[str, Any]:
    return _load("report-baseline-run.json")


def _ab_report(report: dict[str, Any]) -> dict[str, Any]:
    """The sweep measured on two deployments in one run (levels carry ``profile``), with the
    baseline samples present so the plots draw their band."""
    out = copy.deepcopy(report)
    test = out["tests"][0]
    levels = []
    for profile, factor in (("ep8-tuned", 1.1), ("tp8", 1.0)):
        for lv in test["levels"]:
            lv = copy.deepcopy(lv)
            lv["profile"] = profile
            lv["tok_s"] *= factor
            lv["trials_tok_s"] = [x * factor for x in lv["trials_tok_s"]]
            lv["baseline_trials_tok_s"] = [lv["baseline_tok_s"] * k for k in (0.98, 1.0, 1.02)]
            levels.append(lv)
    test["levels"] = levels
    return out


# ----------------------------------------------------------------------------------- markdown


def test_legend_names_the_failing_verdicts() -> None:
    # the legend is prose, so it is the one place the failing set is still spelled out
    for value in Verdict.failing():
        assert f"**{value.upper()}**" in LEGEND
    for value in Verdict.failing(strict=True, require_baseline=True) - Verdict.failing():
        assert f"*{value}*" in LEGEND


def test_markdown_regression_report(regression: dict[str, Any]) -> None:
    md = render_markdown(regression)
    first = md.splitlines()[0]
    assert first.startswith("## ") and "FAILED" in first
    assert "2 tests: 0 passed, 2 failed" in md
    assert "`http://127.0.0.1:44285`" in md and "`kimi-k2.6-sim`" in md
    assert "### `test_s.py::test_sweep` **FAILED**" in md
    assert "### `test_s.py::test_single` **FAILED**" in md
    header = "| level | baseline tok/s | current tok/s | change (90% CI) | p | trials | target tok/s | verdict |"
    assert header in md
    assert (
        "| C=1 | 1276.3 | 1065.2 ±0.3% | -16.6% (-20.6% .. -12.4%) | 0.000241 | 3 (base 4) | - "
        "| **REGRESSION** |"
    ) in md
    assert (
        "| C=16 | 10102.0 | 8533.7 ±0.6% | -15.7% (-19.9% .. -11.3%) | 0.00126 | 3 (base 4) | 1000 |"
        in md
    )
    assert md.count("| **REGRESSION** |") == 4
    assert "changed since baseline: sim.slowdown: 1.0 -> 1.2" in md
    assert "- C=4 **REGRESSION**: regression -14.9%" in md
    # the legend says which verdicts fail a run
    assert "Verdicts that fail a run: **FAIL**, **INVALID**, **ERROR**, **REGRESSION**" in md
    assert "--perf-strict" in md and "--perf-require-baseline" in md


def test_markdown_tables_are_well_formed(regression: dict[str, Any]) -> None:
    rows = [line for line in render_markdown(regression).splitlines() if line.startswith("|")]
    widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows[:5]}
    assert len(widths) == 1, rows[:5]


def test_markdown_passing_report(baseline_run: dict[str, Any]) -> None:
    md = render_markdown(baseline_run)
    assert md.splitlines()[0].endswith("PASSED")
    assert "2 tests: 2 passed, 0 failed" in md
    assert "### `test_s.py::test_sweep` passed" in md
    assert "| *underpowered* |" in md and "| pass |" in md
    assert "**REGRESSION**" not in md.split("---")[0]
    assert "changed since baseline" not in md
    # the single-level test has no target, so no target column
    single = md.split("### `test_s.py::test_single`")[1]
    assert "target tok/s" not in single.split("\n\n")[2]


def test_markdown_no_baseline_and_strict(baseline_run: dict[str, Any]) -> None:
    report = copy.deepcopy(baseline_run)
    for test in report["tests"]:
        for lv in test["levels"]:
            for key in ("baseline_tok_s", "baseline_trials", "change_pct", "ci90", "p_value"):
                lv.pop(key, None)
            lv["verdict"], lv["reasons"] = "no-baseline", []
        test["baseline_note"] = (
            "no baseline yet: baselines/sim/x.yaml (record it with --update-baselines)"
        )
    md = render_markdown(report)
    assert "| C=1 | - | 1273.2 ±2.4% | - | - | 3 | - | *no-baseline* |" in md
    assert "no baseline yet: baselines/sim/x.yaml" in md
    strict = render_markdown(report, failing_verdicts=Verdict.failing(require_baseline=True))
    assert "**NO-BASELINE**" in strict


def test_markdown_escapes_pipes_and_tags(regression: dict[str, Any]) -> None:
    assert cell("a|b") == "a\\|b"
    report = copy.deepcopy(regression)
    lv = report["tests"][1]["levels"][0]
    lv["profile"] = "ep|8"
    lv["verdict"] = "weird|verdict"
    lv["reasons"] = ["value <absent> | other"]
    md = render_markdown(report)
    assert "| ep\\|8 | C=1 |" in md
    assert "weird\\|verdict |" in md
    assert "&lt;absent>" in md and "<absent>" not in md
    table = [
        line
        for line in md.split("### `test_s.py::test_single`")[1].splitlines()
        if line.startswith("|")
    ]
    assert len({len(re.split(r"(?<!\\)\|", row)) for row in table}) == 1


def test_markdown_profile_on_every_row(regression: dict[str, Any]) -> None:
    md = render_markdown(_ab_report(regression))
    sweep = md.split("### `test_s.py::test_sweep`")[1].split("###")[0]
    rows = [line for line in sweep.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| profile | level |")
    assert sum(r.startswith("| ep8-tuned |") for r in rows) == 3
    assert sum(r.startswith("| tp8 |") for r in rows) == 3
    assert "- ep8-tuned C=1 **REGRESSION**" in sweep


def test_markdown_empty_report() -> None:
    md = render_markdown({"schema": 1, "tests": []})
    assert "NO TESTS" in md and "0 tests" in md


def test_an_interrupted_run_is_never_passed(baseline_run: dict[str, Any]) -> None:
    """Interrupted between two tests, every test it finished passed: the headline is still
    INTERRUPTED (a cancelled CI job's step summary must not read as a green gate), in the
    JSON's ``status``, the Markdown and the HTML; a report saved without ``status`` is read
    from its outcomes the same way."""
    from pytest_kimi.report.html import render_html
    from pytest_kimi.report.json_report import build_report

    why = "run interrupted by SIGTERM: the levels that finished keep their verdicts"
    report = build_report(baseline_run["endpoint"], baseline_run["tests"], interrupted=why)
    assert report["status"] == "interrupted" and report["interrupted"] == why
    assert build_report(baseline_run["endpoint"], baseline_run["tests"])["status"] == "passed"
    md = render_markdown(report)
    assert md.splitlines()[0] == "## pytest-kimi throughput: INTERRUPTED"
    assert f"2 tests: 2 passed, 0 failed; {why}" in md and "PASSED" not in md
    page = render_html(report)
    assert '<span class="status s-interrupted">INTERRUPTED</span></h1>' in page
    assert "<title>pytest-kimi throughput: INTERRUPTED</title>" in page
    assert "PASSED</span></h1>" not in page  # the tests it finished still say PASSED
    saved = copy.deepcopy(baseline_run)  # older reports: no status; a test stopped mid-run
    saved["tests"][1]["outcome"] = "interrupted"
    assert render_markdown(saved).splitlines()[0].endswith(": INTERRUPTED")


# -------------------------------------------------------------------------------- plots, HTML


def _charts(page: str) -> list[ET.Element]:
    """The page's inline charts, each parsed as XML: SVG in HTML must also be well-formed."""
    return [ET.fromstring(m) for m in re.findall(r'<svg [^>]*class="chart".*?</svg>', page, re.S)]


def _svg_file(path: Path) -> ET.Element:
    text = path.read_text(encoding="utf-8")
    assert text.startswith('<?xml version="1.0" encoding="utf-8"?>\n<svg ')
    root = ET.fromstring(text.split("\n", 1)[1])
    assert root.tag == f"{SVG_NS}svg" and root.find(f"{SVG_NS}style") is not None, (
        "a figure file carries the chart CSS it gets from the page when inline"
    )
    return root


def _labelled(chart: ET.Element) -> tuple[str, str]:
    """The chart's title and description, found through its aria-labelledby ids."""
    ids = (chart.get("aria-labelledby") or "").split()
    found = {el.get("id"): "".join(el.itertext()) for el in chart.iter() if el.get("id")}
    assert len(ids) == 2 and all(i in found for i in ids), ids
    return found[ids[0]], found[ids[1]]


def test_html_report_needs_no_matplotlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, regression: dict[str, Any]
) -> None:
    """The figures are SVG drawn by the kit: an install without matplotlib draws them all."""
    from pytest_kimi.report import html

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    index = html.write_html(regression, tmp_path / "out")
    assert len(_charts(index.read_text(encoding="utf-8"))) == 4
    assert len(list(index.parent.glob("*.svg"))) == 4
    # the tables alone, when asked for
    index = html.write_html(regression, tmp_path / "tables", plots=False)
    page = index.read_text(encoding="utf-8")
    assert "<table" in page and "<svg" not in page
    assert [p.name for p in index.parent.iterdir()] == ["index.html"]


@pytest.mark.parametrize("sample", ["report-regression.json", "report-baseline-run.json"])
def test_write_html_and_svgs(tmp_path: Path, sample: str) -> None:
    from pytest_kimi.report.html import write_html
    from pytest_kimi.report.svg import VERMILLION

    report = _load(sample)
    index = write_html(report, tmp_path / "html")
    assert index == tmp_path / "html" / "index.html"
    names = sorted(p.name for p in index.parent.iterdir())
    assert names == [
        "index.html",
        "test_s-test_single-latency.svg",
        "test_s-test_single-throughput.svg",
        "test_s-test_sweep-latency.svg",
        "test_s-test_sweep-throughput.svg",
    ]
    page = index.read_text(encoding="utf-8")
    charts = _charts(page)
    assert len(charts) == 4
    ids = [el.get("id") for c in charts for el in c.iter() if el.get("id")]
    assert len(ids) == len(set(ids)) == 8, "two charts in one page never share an id"
    for chart in charts:
        title, desc = _labelled(chart)
        assert title.startswith("test_s.py::test_") and desc
    # the figure files are the charts of the page, each with the CSS it needs on its own
    files = {name: _svg_file(index.parent / name) for name in names[1:]}
    inline_titles = sorted(_labelled(c)[0] for c in charts)
    assert sorted(_labelled(f)[0] for f in files.values()) == inline_titles
    for name in names[1:]:
        assert f"({name})</figcaption>" in page
    # self-contained: no external references
    assert not re.search(r'(src|href)="(https?:|//)', page)
    assert "<script" not in page and "<img" not in page and "url(" not in page
    sweep_tp = charts[0]
    assert _labelled(sweep_tp)[0] == "test_s.py::test_sweep: output throughput vs concurrency"
    ticks = [t.text for t in sweep_tp.iter(f"{SVG_NS}text") if t.get("class") == "xtick"]
    assert ticks == ["1", "4", "16"], "the x axis is ticked at the measured concurrencies"
    rings = [
        c
        for c in sweep_tp.iter(f"{SVG_NS}circle")
        if c.get("stroke") == VERMILLION and c.get("r") == "9.0"
    ]
    notes = [
        "".join(t.itertext()) for t in sweep_tp.iter(f"{SVG_NS}text") if t.get("class") == "note"
    ]
    tips = ["".join(t.itertext()) for t in sweep_tp.iter(f"{SVG_NS}title")]
    desc = _labelled(sweep_tp)[1]
    # the tables
    assert page.count('<table class="levels">') == 2
    assert "<code>test_s.py::test_sweep</code>" in page
    assert "<th>change (90% CI)</th>" in page
    if sample == "report-regression.json":
        assert page.count('<td class="v-failing"') == 4
        assert "sim.slowdown: 1.0 -&gt; 1.2" in page
        # every failing level ringed in the failing colour, its verdict and change beside it
        assert len(rings) == 3
        assert notes == ["REGRESSION -16.6%", "REGRESSION -14.9%", "REGRESSION -15.7%"]
        assert any("target at least 1,000 tok/s" in t for t in tips)
        assert "C=16 8,534 tok/s (regression)" in desc and "baseline: 1,276 tok/s" in desc
    else:
        assert ">underpowered</td>" in page
        assert rings == [] and notes == []
    assert any(
        re.fullmatch(r"current C=4: [\d,]+ tok/s \(median of \d+ trials\), \S+", t) for t in tips
    )


def test_html_report_renders_in_a_browser(tmp_path: Path, regression: dict[str, Any]) -> None:
    """Chromium draws the charts from file://: the series line and the failing rings show."""
    from support.browser import read_png, require_chromium, screenshot

    from pytest_kimi.report.html import write_html
    from pytest_kimi.report.svg import BLUE, PURPLE, VERMILLION

    browser = require_chromium()
    index = write_html(regression, tmp_path / "html")
    image = read_png(screenshot(index, tmp_path / "page.png", height=2400, browser=browser))
    assert len(image.matches(BLUE)) > 800, "the median lines did not render"
    assert len(image.matches(VERMILLION)) > 200, "the failing levels' rings did not render"
    assert image.matches(PURPLE, tolerance=10) == [], "the change-point colour means only that"


def test_html_escapes_content(tmp_path: Path, regression: dict[str, Any]) -> None:
    from pytest_kimi.report.html import render_html

    report = copy.deepcopy(regression)
    report["tests"][0]["levels"][0]["reasons"] = ["<script>alert(1)</script>"]
    page = render_html(report)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_plots_with_profiles_and_odd_names(tmp_path: Path, regression: dict[str, Any]) -> None:
    from pytest_kimi.report.html import write_html
    from pytest_kimi.report.htmlkit import safe_name

    report = _ab_report(regression)
    report["tests"][1]["nodeid"] = "tests/perf/test_x.py::TestY::test_z[c8/../ep 8]"
    index = write_html(report, tmp_path)
    names = {p.name for p in tmp_path.glob("*.svg")}
    assert "tests-perf-test_x-TestY-test_z-c8-ep-8-latency.svg" in names
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.svg", n) for n in names)
    assert len(names) == 4
    assert len(safe_name("t.py::" + "x" * 300)) <= 80
    assert safe_name("a.py::t[1]") != safe_name("a.py::t[2]")
    for name in names:
        _svg_file(tmp_path / name)
    page = index.read_text(encoding="utf-8")
    assert ">ep8-tuned</td>" in page
    # two deployments: one series each, both named in the legend, the band of their baselines
    sweep_tp = _charts(page)[0]
    legend = [
        "".join(t.itertext()) for t in sweep_tp.iter(f"{SVG_NS}text") if t.get("class") == "ltext"
    ]
    assert "ep8-tuned: median" in legend and "tp8: median" in legend
    assert "tp8: baseline min-max" in legend
    strokes = {
        p.get("stroke") for p in sweep_tp.iter(f"{SVG_NS}polyline") if p.get("class") == "series"
    }
    assert len(strokes) == 2, "each deployment has its own colour"


def test_chart_text_is_escaped(tmp_path: Path, regression: dict[str, Any]) -> None:
    from pytest_kimi.report.html import write_html

    report = copy.deepcopy(regression)
    hostile = "x.py::test_<script>alert(1)</script>[a\"b'<img src=x onerror=alert(2)>]"
    report["tests"][0]["nodeid"] = hostile
    report["tests"][0]["levels"][0]["profile"] = "</text><script>alert(3)</script>"
    report["tests"][0]["levels"][0]["verdict"] = "<b>regression</b>"
    index = write_html(report, tmp_path)
    page = index.read_text(encoding="utf-8")
    assert "<script" not in page and "<img" not in page and "<b>regression" not in page
    for chart in _charts(page):  # still well-formed, the strings shown as text
        assert not [el for el in chart.iter() if any(k.startswith("on") for k in el.attrib)]
    titles = [_labelled(c)[0] for c in _charts(page)]
    assert f"{hostile}: output throughput vs concurrency" in titles
    for path in tmp_path.glob("*.svg"):
        assert "<script" not in path.read_text(encoding="utf-8")
        _svg_file(path)


def test_plots_tolerate_missing_figures(tmp_path: Path, regression: dict[str, Any]) -> None:
    """An errored level has no tok_s / latency: it is left out, not a crash."""
    from pytest_kimi.report.plots import render_test

    test = copy.deepcopy(regression["tests"][0])
    for key in ("tok_s", "request_tok_s_p50", "ttft_s_p95", "baseline_tok_s"):
        test["levels"][1][key] = None
    test["levels"][1]["trials_tok_s"] = []
    test["levels"][1]["verdict"] = "error"
    images = render_test(test)
    assert [i.kind for i in images] == ["throughput", "latency"]
    for image in images:
        chart = ET.fromstring(image.svg)
        medians = [el for el in chart.iter(f"{SVG_NS}title") if "C=4" in (el.text or "")]
        assert medians == [], "the errored level is not drawn"
    empty = render_test({"nodeid": "t.py::t", "levels": []})
    for image in empty:
        texts = ["".join(t.itertext()) for t in ET.fromstring(image.svg).iter(f"{SVG_NS}text")]
        assert "no measured levels" in texts


def _same_run_ab(report: dict[str, Any]) -> dict[str, Any]:
    """The plugin's shape for ``--server-profile`` given twice: one test entry per deployment,
    test- and level-level ``profile``, the candidate ``compared_with`` the reference."""
    out = copy.deepcopy(report)
    sweep = out["tests"][0]
    ref, cand = copy.deepcopy(sweep), copy.deepcopy(sweep)
    for entry, name in ((ref, "ep8"), (cand, "tp8")):
        entry["profile"] = name
        for lv in entry["levels"]:
            lv["profile"] = name
    cand["compared_with"] = "deployment ep8 (same run)"
    cand["provenance_changes"] = ["ep_size: 8 -> 1"]
    out["tests"] = [ref, cand]
    return out


def test_markdown_same_run_ab(regression: dict[str, Any]) -> None:
    md = render_markdown(_same_run_ab(regression))
    assert "### `test_s.py::test_sweep` on `ep8` **FAILED**" in md
    assert "### `test_s.py::test_sweep` on `tp8` **FAILED**" in md
    assert "compared with deployment ep8 (same run)" in md
    assert "changed vs deployment ep8 (same run): ep_size: 8 -> 1" in md
    assert "| tp8 | C=16 |" in md
    assert "- C=16 **REGRESSION**" in md, "the entry already names the deployment"


def test_html_same_run_ab_one_figure_pair(tmp_path: Path, regression: dict[str, Any]) -> None:
    from pytest_kimi.report.html import plot_tests, write_html

    report = _same_run_ab(regression)
    merged = plot_tests(report["tests"])
    assert len(merged) == 1 and {lv["profile"] for lv in merged[0]["levels"]} == {"ep8", "tp8"}
    index = write_html(report, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.svg")) == [
        "test_s-test_sweep-latency.svg",
        "test_s-test_sweep-throughput.svg",
    ]
    page = index.read_text(encoding="utf-8")
    assert page.count('class="chart"') == 2
    assert 'id="test_s-test_sweep-on-ep8"' in page and 'id="test_s-test_sweep-on-tp8"' in page
    assert page.index('id="test_s-test_sweep-on-tp8"') < page.index('class="chart"'), (
        "figures follow the last entry of the nodeid"
    )
