"""Hostile YAML: an alias bomb ("billion laughs") in a baseline or a server profile ends at once,
with a message naming the file and the line, instead of hanging pytest and ``kimi-perf
baselines`` at gigabytes; a node count and a size bound stand behind the alias ban.

The bomb below is 1 kB of text that a walk of its value expands to 9**9 (387 million) strings.
The sessions that read one run in a subprocess with a memory limit and a timeout, so that on a
loader that still follows aliases they fail within bounded time and memory, not hang the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_kimi import yamlstrict
from pytest_kimi.baseline import (
    BaselineStore,
    LevelBaseline,
    Provenance,
    TestBaseline,
    dumps,
    loads,
)
from pytest_kimi.server.profile import ProfileError, load_profile
from support.timing import SESSION_S
from support.paths import REPO


LAUGHS = [
    "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]",
    *(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)),
    "bomb: [" + ", ".join(["*a8"] * 9) + "]",
]
"""Nine lists of nine aliases nine deep: 9**9 strings once expanded."""

MEMORY_LIMIT = 2 * 1024**3
"""Address space for a session reading a bomb: what a plain session needs, several times over,
and a small share of the 3 GB a bomb took; a loader that expands the bomb dies here."""


def _limited(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with :data:`MEMORY_LIMIT` and a timeout (the suite's per-session bound)."""

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=SESSION_S,
        preexec_fn=limit if sys.platform != "win32" else None,
    )


# ------------------------------------------------------------------------------- the loader


def test_an_anchor_is_refused_before_its_aliases_are_read() -> None:
    text = "\n".join(LAUGHS) + "\n"
    with pytest.raises(yamlstrict.AliasError) as caught:
        yamlstrict.load(text)
    assert (caught.value.kind, caught.value.name, caught.value.line) == ("anchor", "a0", 1)
    assert "no hand-written baseline or server profile needs them" in str(caught.value)


def test_an_alias_is_refused_even_without_its_anchor() -> None:
    with pytest.raises(yamlstrict.AliasError) as caught:
        yamlstrict.load("ok: 1\nx: *nowhere\n")
    assert (caught.value.kind, caught.value.name, caught.value.line) == ("alias", "nowhere", 2)


def test_aliases_are_refused_and_what_people_write_still_loads() -> None:
    """The ban costs no real file: ``<<`` over an inline mapping, the repository's own server
    profiles, and every baseline the plugin's writer produces (which never emits PyYAML's
    ``&id001``, even for a list shared by identity) still load."""
    with pytest.raises(yamlstrict.AliasError):
        yamlstrict.load("base: &b {x: 1}\n<<: *b\n")
    assert yamlstrict.load("a: 1\n<<: {b: 2}\n") == {"a": 1, "b": 2}
    profiles = sorted((REPO / "servers").glob("*.yaml"))
    assert profiles
    for path in profiles:
        load_profile(path)
    shared = [1, 2, 4, 8]
    baseline = TestBaseline(
        test="t.py::test",
        profile="p",
        provenance=Provenance(server_info={"a": {"bs": shared}, "b": {"bs": shared}}),
        levels=(LevelBaseline(workload={"c": 1}, trials_tok_s=(1.0,)),),
    )
    text = dumps(baseline)
    assert "&" not in text and "*" not in text
    assert loads(text) == baseline


def test_more_nodes_than_the_limit_are_refused() -> None:
    """The second line: a flat list of MAX_NODES scalars (no alias) is a file no one writes."""
    text = "[" + "1," * yamlstrict.MAX_NODES + "]"
    assert len(text) <= yamlstrict.MAX_CHARS  # the node count, not the size, must stop it
    with pytest.raises(yamlstrict.NodeLimitError, match=f"more than {yamlstrict.MAX_NODES}"):
        yamlstrict.load(text)


def test_text_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "huge.yaml"
    big.write_text("x: '" + "a" * yamlstrict.MAX_CHARS + "'\n")
    with pytest.raises(yamlstrict.TooLargeError, match="over the"):
        yamlstrict.load(big.read_text())
    with pytest.raises(yamlstrict.TooLargeError):
        yamlstrict.read_text(big)
    with pytest.raises(ProfileError, match=r"huge\.yaml.*over the"):
        load_profile(big)


# ------------------------------------------------------------------------------ the files


def _bomb_baseline(root: Path, nodeid: str, profile: str = "sim") -> Path:
    """A baseline written by the plugin's own writer, with the bomb under
    ``provenance.server_info`` (where a hostile server's info would land)."""
    baseline = TestBaseline(
        test=nodeid,
        profile=profile,
        provenance=Provenance(model="m", server_info={"version": "1"}),
        levels=(
            LevelBaseline(
                workload={"api": "chat", "concurrency": 1, "max_tokens": 8},
                trials_tok_s=(10.0, 11.0, 12.0),
            ),
        ),
    )
    lines = dumps(baseline).splitlines()
    at = lines.index("  server_info:") + 1
    lines[at:at] = ["    " + li for li in LAUGHS]
    path = BaselineStore(root, profile).path_for(nodeid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


LOADS = """
import sys
from pathlib import Path
from pytest_kimi.baseline import BaselineError, loads

path = Path(sys.argv[1])
try:
    loads(path.read_text(), source=path)
except BaselineError as exc:
    print(exc)
"""


def test_loads_names_the_file_and_line_of_the_bomb(tmp_path: Path) -> None:
    """In a subprocess: a reader that follows the aliases expands the bomb as it walks
    ``server_info`` (this test's own process must not be the one to hang)."""
    path = _bomb_baseline(tmp_path, "test_x.py::test_x")
    line = next(i for i, li in enumerate(path.read_text().splitlines(), 1) if "&a0" in li)
    done = _limited([sys.executable, "-c", LOADS, str(path)], tmp_path)
    assert done.stdout.startswith(f"{path}: line {line}: found anchor &a0"), (
        done.stdout + done.stderr[-2000:]
    )


def test_kimi_perf_baselines_ends_at_once_on_a_bomb(tmp_path: Path) -> None:
    path = _bomb_baseline(tmp_path / "baselines", "test_x.py::test_x")
    line = next(i for i, li in enumerate(path.read_text().splitlines(), 1) if "&a0" in li)
    done = _limited(
        [sys.executable, "-m", "pytest_kimi.cli", "baselines", str(tmp_path / "baselines")],
        tmp_path,
    )
    assert done.returncode != 0, done.stdout
    assert f"{path}: line {line}: found anchor &a0: anchors and aliases are refused" in (
        done.stderr
    ), done.stderr[-2000:]


SIMPLE_PERF_TEST = textwrap.dedent(
    """
    from pytest_kimi import throughput

    @throughput(concurrency=1, max_tokens=8, trials=3, warmup=0)
    def test_x():
        pass
    """
)


def test_a_session_with_a_bomb_baseline_fails_the_test_with_the_file_and_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_x.py").write_text(SIMPLE_PERF_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    path = _bomb_baseline(tmp_path / "baselines", "test_x.py::test_x")
    done = _limited(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--endpoint=sim:speed=50",
            "--perf-history=off",
            "test_x.py",
        ],
        tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "found anchor &a0: anchors and aliases are refused" in out, out[-3000:]
    assert path.name in out


def test_a_session_with_a_bomb_profile_stops_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(SIMPLE_PERF_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    profile = tmp_path / "bomb.yaml"
    profile.write_text("url: http://127.0.0.1:9\n" + "\n".join(LAUGHS) + "\n")
    done = _limited(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--server-profile={profile}",
            "--perf-history=off",
            "test_x.py",
        ],
        tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert f"{profile}: line 2: found anchor &a0: anchors and aliases are refused" in out, out[
        -3000:
    ]
