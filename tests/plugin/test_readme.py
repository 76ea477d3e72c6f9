"""The README and docs/ say what runs: their examples are real test files, their reference
tables match the code, and their links and the paths they name exist.

* the README's first two commands are CI's, and its example collects and passes against the
  simulator;
* every ``python`` block of a page under docs/ that uses ``@throughput`` or ``@capacity`` is a
  test file that collects as perf tests (as the README's does);
* docs/reference/reference.md lists every option with its ini key, environment variable and default,
  and every marker argument;
* every relative link of README.md and docs/*.md reaches a file and, with ``#anchor``, one of
  its headings; every ``pytest_kimi/``, ``bench/``, ``tests/`` and ``servers/`` path they name
  exists; docs/README.md indexes every page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_kimi.options import OPTIONS, default_of
from support.paths import REPO

ROOT = REPO
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

IMPORTS = "from pytest_kimi import capacity, ramp, throughput\n\n"
"""Prepended to a doc example that does not import the markers itself."""


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def _test_examples(path: Path) -> list[str]:
    """The ``python`` blocks of a page that are perf test files."""
    return [b for b in _python_blocks(path) if re.search(r"^@(throughput|capacity)\(", b, re.M)]


# ---------------------------------------------------------------------------------- README


TEST_COMMAND = "pytest -n 3 --dist loadfile"
"""The README's test command: three workers on two cores (the sessions wait on their trials'
clocks more than they compute), each test file on one (its module fixtures, such as a recorded
baseline or a measured simulator, are made once)."""


def test_readme_starts_with_the_two_commands() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert blocks[0].strip().startswith("pip install -e '.[test]' && pytest -m perf --endpoint=sim")
    assert blocks[1].strip() == TEST_COMMAND
    ci = (README.parent / ".ci" / "run").read_text()
    assert blocks[0].strip() in ci and f"\n{TEST_COMMAND}\n" in ci
    tox = (README.parent / "tox.ini").read_text()
    assert f"{TEST_COMMAND} {{posargs}}" in tox


def test_readme_example_collects_as_perf_tests(pytester: pytest.Pytester) -> None:
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest(
        "-m", "perf", "--collect-only", "-q", "--endpoint=http://127.0.0.1:9"
    )
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*::test_single_stream", "*::test_peak"])


def test_readme_example_runs_against_the_simulator(pytester: pytest.Pytester) -> None:
    """Not only collected: measured against the simulator and judged, as a reader would run it."""
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest_subprocess(
        "-m",
        "perf",
        "--endpoint=sim:speed=20,stream_interval=8",
        "--perf-trials=1",
        timeout=600,
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_single_stream*[[]passed[]]*", "*test_peak*[[]passed[]]*"])


# ---------------------------------------------------------------------------- doc examples


@pytest.mark.parametrize(
    "page", [p for p in PAGES if _test_examples(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_doc_examples_collect_as_perf_tests(pytester: pytest.Pytester, page: Path) -> None:
    """Each example is its own test file; collected with an endpoint that is never contacted,
    so its markers validate (a wrong argument stops collection) without any load."""
    examples = _test_examples(page)
    names = []
    for i, block in enumerate(examples):
        source = block if "from pytest_kimi import" in block else IMPORTS + block
        pytester.makepyfile(**{f"test_example_{i}": source})
        names += re.findall(r"^def (test_\w+)\(", block, re.M)
    result = pytester.runpytest(
        "-m", "perf", "--collect-only", "-q", "--endpoint=http://127.0.0.1:9"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines([f"*::{name}" for name in names], consecutive=False)
    assert len(names) >= len(examples)


# ------------------------------------------------------------------------- reference tables


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def _first_cells(section: str) -> list[str]:
    return [row.split("|")[1].strip() for row in re.findall(r"^\|[^\n]*\|$", section, re.M)]


def test_reference_lists_every_option_with_its_sources_and_default() -> None:
    options = _section(DOCS / "reference" / "reference.md", "Options")
    for name, opt in OPTIONS.items():
        row = re.search(rf"^\| `{re.escape(opt.flag)}[ `\[].*$", options, re.M)
        assert row is not None, f"docs/reference/reference.md has no row for {opt.flag}"
        cells = [c.strip() for c in row.group(0).split("|")[1:-1]]
        assert cells[1] == (f"`{opt.ini}`" if opt.ini else ""), (opt.flag, cells[1])
        assert cells[2] == (f"`{opt.env}`" if opt.env else ""), (opt.flag, cells[2])
        value = default_of(name)
        said = re.search(r"\bdefault:? `?([^`),;]+)`?[),;]", cells[3])
        if isinstance(value, bool) or value in (None, ()):
            continue
        assert said is not None, f"docs/reference/reference.md states no default for {opt.flag}"
        if isinstance(value, (int, float)):
            assert float(said.group(1)) == value, (opt.flag, said.group(0))
        elif isinstance(value, Path):
            assert Path(said.group(1)) == value, (opt.flag, said.group(0))
        else:
            assert said.group(1) == str(value), (opt.flag, said.group(0))


def _marker_args() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The marker modules' argument lists."""
    from pytest_kimi.workload.capacity_marker import CAPACITY_ONLY
    from pytest_kimi.workload.markers import ALLOWED_ARGS

    return tuple(ALLOWED_ARGS), tuple(CAPACITY_ONLY)


def test_reference_lists_every_marker_argument() -> None:
    allowed, capacity_only = _marker_args()
    reference = DOCS / "reference" / "reference.md"
    listed = {
        name
        for cell in _first_cells(_section(reference, "`@throughput` arguments"))
        for name in re.findall(r"`(\w+)`", cell)
    }
    assert set(allowed) <= listed, sorted(set(allowed) - listed)
    listed_cap = {
        name
        for cell in _first_cells(_section(reference, "`@capacity` arguments"))
        for name in re.findall(r"`(\w+)`", cell)
    }
    assert set(capacity_only) <= listed_cap, sorted(set(capacity_only) - listed_cap)


# ------------------------------------------------------------------------- links and paths


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not checked here
        target, _, anchor = link.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(f"{link}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.name}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_paths_exist(page: Path) -> None:
    """Module, script and profile paths a page names in backticks exist (module paths move)."""
    named = re.findall(
        r"`((?:pytest_kimi|bench|tests|servers)/[\w./-]*[\w/])(?::\w+)?`", page.read_text()
    )
    missing = sorted({p for p in named if not (ROOT / p).exists() and "<" not in p})
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_docs_index_lists_every_page() -> None:
    index = DOCS / "README.md"
    linked = {link.partition("#")[0] for link in _links(index)}
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")} - {"README.md"}
    assert pages <= linked, sorted(pages - linked)
    assert "docs/README.md" in README.read_text()
