"""The history dashboard: a static site that renders in a real browser, from disk.

The pages are loaded in headless Chromium (``tests/support/browser.py``) and judged by their pixels:
the change point's colour is used for change points and nothing else, so a vertical run of it
in the screenshot is the marker, drawn; the series line's colour on both sides of it, higher
before a drop than after, is the step, drawn.  A page without a change point must have no pixel
of that colour at all.  The DOM Chromium built (``--dump-dom``) shows the SVG was parsed as SVG
and every point links to a run page that exists.
"""

from __future__ import annotations

import html
import random
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from support.browser import dump_dom, find_chromium, read_png, require_chromium, screenshot
from support.otava import require_otava
from pytest_kimi.history import dashboard_chart
from pytest_kimi.history.dashboard import write_dashboard
from pytest_kimi.history.dashboard_cells import BLUE, PURPLE, VERMILLION
from pytest_kimi.history.model import CAPACITY, CapacityFigures, LevelSeries, Point, RunInfo

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=timezone.utc)
TEST = "tests/perf/test_suite.py::test_peak"
STEP_RUN = 12


@dataclass(frozen=True)
class FakeChange:
    """The fields the dashboard reads of ``pytest_kimi.history.changes.Change``."""

    test: str
    level: str
    deployment: str | None
    run: int
    time: datetime | None
    commit: str | None
    before_tok_s: float
    after_tok_s: float
    change_pct: float
    uncertainty_pct: float | None = None
    provenance_changes: tuple[str, ...] = field(default_factory=tuple)


def make_runs(n: int, *, first_id: int = 1, eplb_until: int | None = None) -> list[RunInfo]:
    rng = random.Random(n)
    return [
        RunInfo(
            id=first_id + i,
            time=T0 + timedelta(days=i),
            commit=f"{rng.getrandbits(160):040x}",
            branch="main",
            deployment="sim",
            provenance={
                "model": "kimi-k2",
                "server_info.tp_size": 8,
                "server_info.enable_eplb": eplb_until is None or first_id + i < eplb_until,
            },
            plugin_version="0.2.0",
        )
        for i in range(n)
    ]


def make_series(
    runs: list[RunInfo],
    *,
    test: str = TEST,
    level: str = "C=256",
    base: float = 1480.0,
    step_at: int | None = None,
    drop: float = 0.15,
    noise: float = 0.01,
    seed: int = 7,
) -> LevelSeries:
    """A level across ``runs``: ``base`` tok/s with ``noise`` (relative sd) per trial, lower by
    ``drop`` from run id ``step_at`` on; judged against a baseline of ``base`` with 5%."""
    rng = random.Random(seed)
    points = []
    for run in runs:
        level_tok_s = base * (1 - drop) if step_at is not None and run.id >= step_at else base
        trials = tuple(level_tok_s * (1 + rng.gauss(0, noise)) for _ in range(3))
        median = sorted(trials)[1]
        change = (median / base - 1) * 100
        points.append(
            Point(
                run=run,
                tok_s=median,
                trials=trials,
                verdict="regression" if change < -5 else "pass",
                baseline_tok_s=base,
                tolerance_pct=5.0,
                change_pct=change,
            )
        )
    return LevelSeries(
        test=test, level=level, key={"concurrency": 256}, deployment="sim", points=tuple(points)
    )


def step_change(runs: list[RunInfo], series: LevelSeries) -> FakeChange:
    run = next(r for r in runs if r.id == STEP_RUN)
    return FakeChange(
        test=series.test,
        level=series.level,
        deployment=series.deployment,
        run=STEP_RUN,
        time=run.time,
        commit=run.commit,
        before_tok_s=1480.0,
        after_tok_s=1258.0,
        change_pct=-15.0,
        uncertainty_pct=1.2,
        provenance_changes=("server_info.enable_eplb: true -> false",),
    )


class Links(HTMLParser):
    """Tags, hrefs and text of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def hrefs(self) -> list[str]:
        return [str(a["href"]) for t, a in self.tags if t == "a" and a.get("href")]


def parse(text: str) -> Links:
    parser = Links()
    parser.feed(text)
    return parser


# ------------------------------------------------------------------------------- sites


def run_details(run: RunInfo, series: LevelSeries) -> dict[str, Any]:
    """What ``HistoryStore.run_details`` gives for a run: its metadata and provenance, and per
    test the report's fields with its level dicts."""
    point = next(p for p in series.points if p.run.id == run.id)
    level = {
        "concurrency": 256,
        "max_tokens": 512,
        "label": series.level,
        "tok_s": point.tok_s,
        "trials_tok_s": list(point.trials),
        "verdict": point.verdict,
        "baseline_tok_s": point.baseline_tok_s,
        "tolerance_pct": point.tolerance_pct,
        "change_pct": point.change_pct,
        "reasons": ["slower than the baseline beyond 5%"] if point.verdict == "regression" else [],
        "key": {"concurrency": 256, "max_tokens": 512},
    }
    return {
        "id": run.id,
        "time": run.time.isoformat(),
        "commit": run.commit,
        "branch": run.branch,
        "ci_url": f"https://ci.example/runs/{run.id}",
        "deployment": run.deployment,
        "plugin_version": run.plugin_version,
        "model": "kimi-k2",
        "provenance": dict(run.provenance),
        "deployments": {},
        "endpoint": {"url": "http://127.0.0.1:30001", "model": "kimi-k2", "server_info": {}},
        "tests": [
            {
                "nodeid": series.test,
                "test": series.test,
                "deployment": series.deployment,
                "session": None,
                "outcome": "failed" if point.verdict == "regression" else "passed",
                "workload": {"api": "chat", "max_tokens": 512},
                "levels": [level],
            }
        ],
        "queue_note": "<b>kept</b>",  # a key the dashboard does not know: shown as text
    }


@pytest.fixture(scope="module")
def step_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RunInfo]]:
    """One series with a 15% drop at run 12, and its change point."""
    runs = make_runs(20, eplb_until=STEP_RUN)
    series = make_series(runs, step_at=STEP_RUN)
    details = {r.id: run_details(r, series) for r in runs}
    out = tmp_path_factory.mktemp("step-site")
    write_dashboard([series], [step_change(runs, series)], out, details)
    return out, runs


@pytest.fixture(scope="module")
def flat_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same series without a step, and no change point."""
    runs = make_runs(20)
    out = tmp_path_factory.mktemp("flat-site")
    write_dashboard([make_series(runs)], [], out, {})
    return out


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_chromium()


# ------------------------------------------------------------------------------- pixels


def test_the_plot_and_the_change_marker_render_in_a_browser(
    step_site: tuple[Path, list[RunInfo]], chromium: str, tmp_path: Path
) -> None:
    out, _ = step_site
    image = read_png(
        screenshot(out / "index.html", tmp_path / "step.png", height=860, browser=chromium)
    )

    marker = image.matches(PURPLE)
    columns: dict[int, list[int]] = {}
    for x, y in marker:
        columns.setdefault(x, []).append(y)
    xc, ys = max(columns.items(), key=lambda kv: len(kv[1]))
    # a vertical line of the marker colour through most of the plot's 210 px height
    assert len(ys) >= 150, f"no change-marker line: tallest purple column has {len(ys)} px"
    top, bottom = min(ys), max(ys)
    # and its label: a filled pill beside the line's top, not only a line
    assert len(marker) - len(ys) >= 800

    line = [(x, y) for x, y in image.matches(BLUE) if top <= y <= bottom]
    before = [y for x, y in line if x < xc - 4]
    after = [y for x, y in line if x > xc + 4]
    assert len(before) > 150 and len(after) > 150, (len(before), len(after))
    # the drop is drawn as a drop: the line is lower on screen (larger y) after the marker
    assert sum(after) / len(after) - sum(before) / len(before) > 40

    # regressions (after the step) are marked in the failing colour, and only after it
    failing = [(x, y) for x, y in image.matches(VERMILLION) if top <= y <= bottom]
    assert len(failing) > 100
    assert all(x > xc for x, _ in failing)


def test_a_page_without_a_change_point_has_no_marker(
    flat_site: Path, chromium: str, tmp_path: Path
) -> None:
    image = read_png(
        screenshot(flat_site / "index.html", tmp_path / "flat.png", height=860, browser=chromium)
    )
    assert len(image.matches(BLUE)) > 500, "the series line did not render"
    assert image.matches(PURPLE, tolerance=10) == []


# ------------------------------------------------------------------------------- DOM and links


def test_the_browser_builds_svg_with_a_link_per_run(
    step_site: tuple[Path, list[RunInfo]], chromium: str
) -> None:
    out, runs = step_site
    dom = parse(dump_dom(out / "index.html", browser=chromium))
    svgs = [a for t, a in dom.tags if t == "svg" and "chart" in (a.get("class") or "")]
    assert len(svgs) == 1
    assert svgs[0].get("aria-labelledby")
    names = [t for t, _ in dom.tags]
    assert "polyline" in names and "title" in names and "desc" in names
    changes = [
        a for t, a in dom.tags if t == "line" and a.get("class") == "change" and a.get("data-run")
    ]
    assert [a["data-run"] for a in changes] == [str(STEP_RUN)]
    text = " ".join(dom.text)
    assert f"▼ -15.0% at run {STEP_RUN}" in text
    run_links = {h for h in dom.hrefs() if h.startswith("runs/")}
    assert run_links == {f"runs/{r.id}.html" for r in runs}
    for href in run_links:
        assert (out / href).is_file(), href


def test_every_run_page_shows_provenance_verdicts_and_stored_details(
    step_site: tuple[Path, list[RunInfo]],
) -> None:
    out, runs = step_site
    for run in runs:
        page = parse((out / "runs" / f"{run.id}.html").read_text())
        text = " ".join(page.text)
        assert run.commit is not None and run.commit in text
        assert "server_info.tp_size" in text and "kimi-k2" in text
        verdict, outcome = ("regression", "failed") if run.id >= STEP_RUN else ("pass", "passed")
        assert verdict in text and outcome in text
        assert "http://127.0.0.1:30001" in text  # the endpoint
        assert "<b>kept</b>" in text  # a detail the page has no place for, shown as text
        hrefs = page.hrefs()
        assert "../index.html" in hrefs
        assert f"https://ci.example/runs/{run.id}" in hrefs
        assert any(h.startswith("../index.html#s-") for h in hrefs)  # to the test's chart
    step = " ".join(parse((out / "runs" / f"{STEP_RUN}.html").read_text()).text)
    assert "-15.0% at run 12" in step and "enable_eplb: true -> false" in step
    assert "±1.2%" in step
    assert "slower than the baseline beyond 5%" in step


def test_the_summary_table_says_where_each_series_stands(
    step_site: tuple[Path, list[RunInfo]],
) -> None:
    out, _ = step_site
    page = (out / "index.html").read_text()
    summary = page[page.index('<table class="summary">') : page.index("</table>")]
    text = " ".join(parse(summary).text)
    assert "regression" in text and "▼ -15.0% at run 12" in text
    assert re.search(r"-1[4-6]\.\d%", text), text  # latest vs first run
    assert 'href="#s-' in summary


def test_the_site_loads_nothing_from_elsewhere(step_site: tuple[Path, list[RunInfo]]) -> None:
    out, _ = step_site
    for page in [out / "index.html", *sorted((out / "runs").glob("*.html"))]:
        text = page.read_text()
        assert "<script" not in text and "<link" not in text and "@import" not in text
        assert "url(" not in text
        tags = parse(text).tags
        assert not [a for _, a in tags if a.get("src")]
        for href in (str(a["href"]) for t, a in tags if t == "a" and a.get("href")):
            if href.startswith("https://ci.example/"):  # a link to the CI run, never loaded
                continue
            assert not re.match(r"[a-z]+:", href) and not href.startswith("//"), href


# ------------------------------------------------------------------------------- escaping

HOSTILE = "tests/x.py::test_<script>alert(1)</script>[a\"b'<img src=x onerror=alert(2)>]"


def test_hostile_strings_are_shown_as_text(tmp_path: Path) -> None:
    base = make_runs(4)
    runs = [
        RunInfo(
            id=r.id,
            time=r.time,
            commit='"><svg onload=alert(3)>',
            branch="<b>main</b>",
            ci_url="javascript:alert(4)",
            deployment="<i>sim</i>",
            provenance={"<key onclick=x>": "</td><script>alert(5)</script>"},
        )
        for r in base
    ]
    series = make_series(runs, test=HOSTILE, level='C=1"><svg onload=alert(6)>')
    change = FakeChange(
        test=HOSTILE,
        level=series.level,
        deployment=series.deployment,
        run=3,
        time=None,
        commit=None,
        before_tok_s=1480.0,
        after_tok_s=1300.0,
        change_pct=-12.2,
        provenance_changes=("<script>alert(7)</script>",),
    )
    details = {1: {"note": "<script>alert(8)</script>", "ci_url": "javascript:alert(9)"}}
    write_dashboard([series], [change], tmp_path, details)
    pages = [tmp_path / "index.html", *sorted((tmp_path / "runs").glob("*.html"))]
    assert len(pages) == 5
    for page in pages:
        text = page.read_text()
        parsed = parse(text)
        tags = {t for t, _ in parsed.tags}
        assert not tags & {"script", "img", "b", "i"}, (
            page.name,
            tags & {"script", "img", "b", "i"},
        )
        assert not [a for _, a in parsed.tags if any(k.startswith("on") for k in a)]
        assert "javascript:" not in " ".join(parsed.hrefs())
        assert sum(1 for t, _ in parsed.tags if t == "svg") == text.count("<svg")
    index_text = " ".join(parse((tmp_path / "index.html").read_text()).text)
    assert "test_<script>alert(1)</script>" in index_text  # shown, as text
    run1 = " ".join(parse((tmp_path / "runs" / "1.html").read_text()).text)
    assert "<script>alert(8)</script>" in run1 and "javascript:alert(4)" in run1


def test_hostile_page_in_the_browser_runs_nothing(tmp_path: Path, chromium: str) -> None:
    runs = make_runs(3)
    series = make_series(runs, test=HOSTILE)
    write_dashboard([series], [], tmp_path, {})
    dom = dump_dom(tmp_path / "index.html", browser=chromium)
    parsed = parse(dom)
    assert not {t for t, _ in parsed.tags} & {"script", "img"}
    assert HOSTILE.split("::")[1][:20] in " ".join(parsed.text)


# ------------------------------------------------------------------------------- shapes of data


def test_a_run_without_a_figure_breaks_the_line_and_still_links(tmp_path: Path) -> None:
    runs = make_runs(6)
    series = make_series(runs)
    points = list(series.points)
    points[3] = Point(run=runs[3], tok_s=None, trials=(), verdict="error")
    series = LevelSeries(series.test, series.level, series.key, series.deployment, tuple(points))
    write_dashboard([series], [], tmp_path, {})
    page = (tmp_path / "index.html").read_text()
    assert page.count('class="figure"') == 2  # two polylines: runs 1-3 and 5-6
    assert f'href="runs/{runs[3].id}.html"' in page
    assert "no valid figure" in page
    assert "error" in (tmp_path / "runs" / f"{runs[3].id}.html").read_text()


def test_sessions_of_one_run_share_its_label_and_page(tmp_path: Path) -> None:
    """With ``--perf-sessions`` a run gives several points of a series: each is drawn and
    linked, and the run is labelled once."""
    runs = make_runs(4)
    points = tuple(
        Point(run=r, tok_s=1480.0 + 10 * k, trials=(1480.0,), verdict="pass", session=k)
        for r in runs
        for k in range(3)
    )
    series = LevelSeries(TEST, "C=256", {"concurrency": 256}, "sim", points)
    write_dashboard([series], [], tmp_path, {})
    page = (tmp_path / "index.html").read_text()
    assert page.count('class="run"') == 12
    assert len(re.findall(r'class="xtick"><tspan[^>]*>#\d+<', page)) == 4
    assert "session 2" in (tmp_path / "runs" / f"{runs[0].id}.html").read_text()


def test_many_runs_keep_the_x_labels_apart(tmp_path: Path) -> None:
    runs = make_runs(300)
    series = make_series(runs, step_at=150)
    change = FakeChange(series.test, series.level, "sim", 150, None, None, 1480.0, 1258.0, -15.0)
    write_dashboard([series], [change], tmp_path, {})
    page = (tmp_path / "index.html").read_text()
    xs = [float(x) for x in re.findall(r'<text x="([\d.]+)" y="[\d.]+" class="xtick"', page)]
    assert 5 <= len(xs) <= 16
    assert all(b - a >= 50 for a, b in zip(xs, xs[1:])), xs
    assert ">#150<" in page  # the change's run keeps its label
    assert len(list((tmp_path / "runs").glob("*.html"))) == 300


def test_series_are_matched_to_their_own_changes_and_deployments(tmp_path: Path) -> None:
    runs = make_runs(10)
    a = make_series(runs, level="C=1", base=65.0)
    b = make_series(runs, level="C=256", step_at=6)
    other = LevelSeries(b.test, b.level, b.key, "ep8", b.points)
    change = FakeChange(b.test, b.level, "sim", 6, None, None, 1480.0, 1258.0, -15.0)
    write_dashboard([a, b, other], [change], tmp_path, {})
    page = (tmp_path / "index.html").read_text()
    sections = re.findall(r'<section id="([^"]+)">(.*?)</section>', page, re.S)
    assert len(sections) == 3 and len({s for s, _ in sections}) == 3
    marked = [sid for sid, body in sections if 'class="change"' in body]
    assert len(marked) == 1 and "C-256" in marked[0] and "ep8" not in marked[0]


def test_the_y_axis_neither_starts_at_zero_nor_magnifies_noise() -> None:
    lo, hi, step = dashboard_chart._y_range([1480.0, 1481.0, 1479.5])
    assert lo > 0 and hi - lo >= 0.2 * 1480 and step > 0
    lo, hi, _ = dashboard_chart._y_range([1480.0, 1258.0])
    assert lo <= 1258.0 and hi >= 1480.0 and lo > 900


def test_empty_history_writes_a_page(tmp_path: Path) -> None:
    index = write_dashboard([], [], tmp_path / "site", {})
    assert index == tmp_path / "site" / "index.html"
    assert "No runs recorded yet" in index.read_text()


def test_with_the_real_change_detector(tmp_path: Path) -> None:
    require_otava()
    from pytest_kimi.history import changes as changes_mod

    runs = make_runs(20, eplb_until=STEP_RUN)
    series = make_series(runs, step_at=STEP_RUN)
    found: list[Any] = list(changes_mod.find_changes([series]))
    assert [c.run for c in found] == [STEP_RUN]
    write_dashboard([series], found, tmp_path, {})
    page = (tmp_path / "index.html").read_text()
    assert f'data-run="{STEP_RUN}"' in page and f"at run {STEP_RUN}" in page
    assert "90% CI" in page and "enable_eplb: true -&gt; false" in page
    assert f"at run {STEP_RUN}" in (tmp_path / "runs" / f"{STEP_RUN}.html").read_text()


def _report(tok_s: float, slowdown: float) -> dict[str, Any]:
    """A ``--perf-json`` report of one level, as the store records it."""
    endpoint = {
        "url": "http://127.0.0.1:30001",
        "model": "kimi-k2",
        "server_info": {"tp_size": 8, "sim": {"slowdown": slowdown}},
    }
    trials = [tok_s * f for f in (0.99, 1.0, 1.01)]
    return {
        "endpoint": endpoint,
        "tests": [
            {
                "nodeid": TEST,
                "outcome": "passed",
                "workload": {"api": "chat", "max_tokens": 512},
                "baseline_profile": "sim",
                "levels": [
                    {
                        "concurrency": 256,
                        "max_tokens": 512,
                        "label": "C=256",
                        "tok_s": tok_s,
                        "trials_tok_s": trials,
                        "verdict": "pass" if tok_s > 1400 else "regression",
                        "baseline_tok_s": 1480.0,
                        "tolerance_pct": 5.0,
                        "change_pct": (tok_s / 1480 - 1) * 100,
                    }
                ],
            }
        ],
    }


def test_from_a_real_history_database(tmp_path: Path) -> None:
    """The store's read model, its run details and the detector's changes, end to end."""
    require_otava()
    from pytest_kimi.history import changes as changes_mod
    from pytest_kimi.history import store as store_mod
    from pytest_kimi.history.rows import RunMeta, flat_provenance

    rng = random.Random(3)
    with store_mod.open_history(f"sqlite:///{tmp_path / 'history.db'}") as store:
        for i in range(12):
            slowdown = 1.0 if i < 7 else 1.18
            report = _report(1480.0 / slowdown * (1 + rng.gauss(0, 0.01)), slowdown)
            meta = RunMeta(
                time=T0 + timedelta(days=i),
                commit=f"{i:07x}",
                branch="main",
                deployment="sim",
                provenance=flat_provenance(report["endpoint"], plugin_version="0.2.0"),
                plugin_version="0.2.0",
            )
            store.record_run(report, meta)
        series = store.series()
        changes = changes_mod.find_changes(series)
        details = {r.id: store.run_details(r.id) for r in store.runs()}
    assert [c.run for c in changes] == [8]
    index = write_dashboard(series, changes, tmp_path / "site", details)
    page = index.read_text()
    assert 'data-run="8"' in page and "at run 8" in page
    assert re.search(r"sim\.slowdown: 1(\.0)? -&gt; 1\.18", page)
    run8 = (tmp_path / "site" / "runs" / "8.html").read_text()
    assert "regression" in run8 and "server_info.sim.slowdown" in run8 and "C=256" in run8


# ------------------------------------------------------------------------------- the helper


def test_missing_chromium_skips_or_fails_as_ci_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_CHROMIUM", "/nonexistent/chromium")
    assert find_chromium() is None
    monkeypatch.delenv("KIMI_REQUIRE_CHROMIUM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        require_chromium()
    monkeypatch.setenv("KIMI_REQUIRE_CHROMIUM", "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium"):
        require_chromium()


# ------------------------------------------------------------------------------- capacity

CAP_TEST = "tests/perf/test_suite.py::test_capacity"
CAP_LEVEL = "capacity under p95 end-to-end <= 6.6 s"
CAP_STEP = 9


def capacity_series(runs: list[RunInfo]) -> LevelSeries:
    """A ``@capacity`` test over ``runs``: C=40 held, C=41 broke (boundary 40.5) against a
    baseline boundary of 40.5, until run ``CAP_STEP``, from which C=34 held, C=35 broke (the
    gate's ``regression``); the first run had no baseline yet."""
    points = []
    for run in runs:
        low = 34.0 if run.id >= CAP_STEP else 40.0
        first = run.id == runs[0].id
        change = None if first else round(((low + 0.5) / 40.5 - 1) * 100, 2)
        points.append(
            Point(
                run=run,
                tok_s=None,
                verdict="no-baseline" if first else ("regression" if low < 40 else "pass"),
                tolerance_pct=None if first else 5.0,
                change_pct=change,
                ci90=None if first else (round(change - 4.9, 2), round(change + 4.9, 2)),
                capacity=CapacityFigures(
                    metric="concurrency",
                    value=low,
                    low=low,
                    high=low + 1,
                    estimate=low + 0.5,
                    log_se=0.004,
                    slope=0.6,
                    baseline=None if first else 40.0,
                    baseline_low=None if first else 40.0,
                    baseline_high=None if first else 41.0,
                    baseline_estimate=None if first else 40.5,
                ),
            )
        )
    return LevelSeries(
        CAP_TEST,
        CAP_LEVEL,
        {"metric": "concurrency"},
        "sim",
        tuple(points),
        kind=CAPACITY,
        metric="concurrency",
    )


@pytest.fixture(scope="module")
def capacity_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RunInfo]]:
    """A capacity series beside a throughput level whose points carry their interval."""
    runs = make_runs(12)
    tp = make_series(runs, step_at=CAP_STEP)
    tp = LevelSeries(
        tp.test,
        tp.level,
        tp.key,
        tp.deployment,
        tuple(
            replace(p, ci90=(p.change_pct - 2.0, p.change_pct + 2.0))
            if p.run.id > 1
            # the first run: recorded before there was a baseline
            else replace(p, baseline_tok_s=None, change_pct=None, verdict="no-baseline")
            for p in tp.points
        ),
    )
    out = tmp_path_factory.mktemp("capacity-site")
    write_dashboard([capacity_series(runs), tp], [], out, {})
    return out, runs


def _rows(table: str) -> list[list[str]]:
    """A table's body rows as the text of their cells."""
    body = table[table.index("<tbody>") : table.index("</tbody>")]
    return [
        [
            " ".join("".join(parse(cell).text).split())
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)
    ]


def test_the_tables_say_each_level_against_its_baseline(
    capacity_site: tuple[Path, list[RunInfo]],
) -> None:
    out, runs = capacity_site
    page = (out / "index.html").read_text()
    summary = page[page.index('<table class="summary">') :]
    summary = summary[: summary.index("</table>")]
    head = re.findall(r"<th>([^<]*)</th>", summary)
    vs = head.index("vs baseline (90% CI)")
    cap_row, tp_row = _rows(summary)
    cap_last = capacity_series(runs).points[-1]
    assert cap_row[vs] == (
        f"{cap_last.change_pct:+.1f}% ({cap_last.ci90[0]:+.1f}% .. {cap_last.ci90[1]:+.1f}%)"
    )
    assert re.fullmatch(r"-1[4-6]\.\d% \(-1\d\.\d% \.\. -1\d\.\d%\)", tp_row[vs]), tp_row
    assert cap_row[3] == "C=34"  # the latest capacity, as the reports write it
    # per series: every run's change with its interval; the first run had no baseline
    tables = re.findall(r"<details><summary>the numbers</summary>(.*?)</details>", page)
    assert len(tables) == 2
    for table in tables:
        cols = re.findall(r"<th>([^<]*)</th>", table)
        rows = _rows(table)
        at = cols.index("vs baseline (90% CI)")
        assert rows[0][at] == "no-baseline"
        change = r"[-+]\d+\.\d%"
        pattern = rf"{change} \({change} \.\. {change}\)"
        assert all(re.fullmatch(pattern, r[at]) for r in rows[1:]), rows
    cap_cols = re.findall(r"<th>([^<]*)</th>", tables[0])
    assert cap_cols[3:6] == ["capacity", "bracket", "boundary"]
    assert _rows(tables[0])[-1][3:6] == ["C=34", "[34..35]", "34.5"]


def test_a_capacity_is_charted_with_its_bracket_and_the_gates_verdicts(
    capacity_site: tuple[Path, list[RunInfo]],
) -> None:
    out, runs = capacity_site
    page = (out / "index.html").read_text()
    assert page.count("<section ") == 2  # the capacity and the level: no chart per probe
    section = page[page.index("<section ") : page.index("</section>")]
    assert html.escape(f"capacity over runs: {CAP_TEST} {CAP_LEVEL} on sim") in section
    assert ">streams</text>" in section  # the y axis' unit
    brackets = re.search(r'<g class="brackets"[^>]*>(.*?)</g>', section)
    assert brackets is not None
    # per run a whisker and its two caps, and the boundary's tick
    assert brackets.group(1).count("<line") == 4 * len(runs)
    assert brackets.group(1).count('class="boundary"') == len(runs)
    markers = re.findall(
        r'<a href="runs/(\d+)\.html" class="run" aria-label="([^"]*)">(.*?)</a>', section, re.S
    )
    assert len(markers) == len(runs)
    for run_id, said, inner in markers:
        failing = int(run_id) >= CAP_STEP
        assert ("regression" in said) == failing, said
        assert (VERMILLION in inner) == failing, inner
    assert "capacity C=34 [34..35], boundary 34.5" in markers[-1][1]
    assert "bracket: held .. broke" in section and "boundary (interpolated" in section


def test_a_capacity_chart_renders_its_regressions_failing(chromium: str, tmp_path: Path) -> None:
    """In the browser: the capacity chart's four regressions are four markers in the failing
    colour, lower on screen than the runs that passed, and its whiskers are SVG lines."""
    runs = make_runs(12)
    write_dashboard([capacity_series(runs)], [], tmp_path / "site", {})
    index = tmp_path / "site" / "index.html"
    image = read_png(screenshot(index, tmp_path / "cap.png", height=760, browser=chromium))
    red = image.matches(VERMILLION)
    bottom = max(y for _, y in red)  # the chart is the page's last thing: its markers lowest
    markers = sorted({x for x, y in red if y > bottom - 30})
    clusters = 1 + sum(1 for a, b in zip(markers, markers[1:]) if b - a > 8)
    assert clusters == len([r for r in runs if r.id >= CAP_STEP]), markers
    plot = [(x, y) for x, y in image.matches(BLUE) if bottom - 215 < y <= bottom]
    passing = [y for x, y in plot if x < markers[0] - 8]
    assert len(passing) > 100
    assert bottom - 10 - sum(passing) / len(passing) > 40  # the capacity fell: drawn falling
    dom = parse(dump_dom(index, browser=chromium))
    lines = [a for t, a in dom.tags if t == "line" and a.get("class") == "boundary"]
    assert len(lines) == len(runs)
