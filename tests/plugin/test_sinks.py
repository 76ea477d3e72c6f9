"""Nothing measured is lost to a sink: report paths are checked when the session starts, and
at its end every sink is written on its own, after the baselines and the history.

The sessions run against the simulator in a subprocess.  A sink that fails at the end is made
to fail for real, not mocked: the perf test's body (it runs after the measurement, before the
reports) puts a regular file where a report's directory was to be made, as a cleanup step or
an unmounted volume would.  A renderer's bug (an exception that is no ``OSError``) is the one
thing patched, by the session's own conftest.  No test writes to ``/dev/full``: a report
replaces the file at its path, and as root the old code replaced the device node itself.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from pytest_kimi.history.store import open_history
from pytest_kimi.run.output_paths import (
    OutputPath,
    OutputPathError,
    Target,
    check_output_paths,
)
from support.timing import SESSION_S

SUITE = """
import pathlib
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=16, trials=2, warmup=0)
def test_short():
    # after the measurement, before the reports: a file takes the name of {blocked!r}
    for name in {blocked!r}:
        pathlib.Path(name).write_text("in the way")
"""
BROKEN_MARKDOWN = """
import pytest_kimi.report.markdown as markdown

def _broken(*args, **kwargs):
    raise ValueError("a renderer bug")

markdown.render_markdown = _broken
"""


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's or CI's own variables must not add sinks to these sessions."""
    for name in ("GITHUB_STEP_SUMMARY", "KIMI_PERF_HISTORY", "KIMI_PERF_JSON"):
        monkeypatch.delenv(name, raising=False)


def _session(
    pytester: pytest.Pytester, *args: str, blocked: tuple[str, ...] = ()
) -> tuple[int | pytest.ExitCode, str]:
    """The suite's session in a subprocess (an inner conftest replaces a renderer, which must
    not outlive the session): its exit status and all it printed."""
    pytester.makepyfile(test_sinks_suite=SUITE.format(blocked=blocked))
    # content, not layout: a wide COLUMNS keeps each line of the summary whole
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "2000")
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--endpoint=sim:speed=10", *args, timeout=SESSION_S
        )
    return result.ret, result.stdout.str() + result.stderr.str()


def _baselines(where: Path) -> list[Path]:
    return sorted((where / "baselines").rglob("*.yaml"))


def _runs(url: str) -> int:
    with open_history(url) as history:
        return len(history.runs())


# ---------------------------------------------------------------------------- at the start


def test_report_paths_that_cannot_be_written_stop_the_session_before_any_load(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Found at the end, each cost its report after the whole measurement; now each is one
    line of a usage error, naming its option and path, before the simulator even starts."""
    where = pytester.path
    blocker = where / "a-file"
    blocker.write_text("not a directory")
    fifo = tmp_path_factory.mktemp("pipes") / "a-fifo"  # outside: a rerun copies the suite
    os.mkfifo(fifo)
    ret, out = _session(
        pytester,
        "--perf-history=sqlite:///h.db",
        f"--perf-json={blocker / 'perf.json'}",
        f"--perf-markdown={fifo}",
        f"--perf-html={blocker}",
        f"--junitxml={blocker / 'sub' / 'junit.xml'}",
    )
    assert ret == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert "report path cannot be written:" in out
    for line in (
        f"--perf-json {blocker / 'perf.json'}: cannot be created: {blocker} is a file",
        f"--perf-markdown {fifo}: is not a regular file",
        f"--perf-html {blocker}: is not a directory",
        f"--junitxml {blocker / 'sub' / 'junit.xml'}: cannot be created: {blocker} is a file",
    ):
        assert line in out, out[-3000:]
    assert "[kimi] measuring" not in out
    assert not (where / ".kimi").exists(), "no simulator was started"
    assert not (where / "h.db").exists()
    assert stat.S_ISFIFO(fifo.stat().st_mode), "the pipe is left as it was"
    assert blocker.read_text() == "not a directory"


def test_the_path_check_creates_nothing_and_takes_a_directory_still_to_be_made(
    tmp_path: Path,
) -> None:
    """A missing directory is fine when it can be made (the reports make it, as pytest's
    ``--junitxml`` does); a device is refused without being touched."""
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    check_output_paths(
        [
            OutputPath("--perf-json", tmp_path / "reports" / "2026" / "perf.json"),
            OutputPath("--perf-markdown", existing),
            OutputPath("--perf-html", tmp_path, Target.DIRECTORY),
            OutputPath("--perf-html", tmp_path / "html", Target.DIRECTORY),
        ]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
    with pytest.raises(OutputPathError) as caught:
        check_output_paths(
            [
                OutputPath("env KIMI_PERF_JSON", Path("/dev/full")),
                OutputPath("--perf-markdown", tmp_path),
            ]
        )
    lines = str(caught.value).splitlines()[1:]
    assert lines[0].startswith("  env KIMI_PERF_JSON /dev/full: is not a regular file")
    assert lines[1].startswith(f"  --perf-markdown {tmp_path}: is a directory")
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_directory_or_file_without_write_permission_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    read_only = tmp_path / "junit.xml"
    read_only.write_text("<testsuites/>")
    read_only.chmod(0o400)
    try:
        with pytest.raises(OutputPathError, match="no permission to create files in"):
            check_output_paths([OutputPath("--perf-json", locked / "sub" / "perf.json")])
        # replaced by a rename, a read-only report is no obstacle; opened in place, it is
        check_output_paths([OutputPath("--perf-json", read_only)])
        with pytest.raises(OutputPathError, match="junit.xml: is not writable"):
            check_output_paths([OutputPath("--junitxml", read_only, in_place=True)])
    finally:
        locked.chmod(0o700)


# ---------------------------------------------------------------------------- at the end


def test_failing_reports_cost_one_line_each_and_never_the_baselines_or_the_history(
    pytester: pytest.Pytester,
) -> None:
    """The JSON's directory cannot be made any more and the Markdown renderer raises (no
    ``OSError``): the Markdown's exception used to escape ``pytest_sessionfinish`` as a
    traceback, and the baseline update and the history row, written after the reports, were
    never written."""
    where = pytester.path
    pytester.makeconftest(BROKEN_MARKDOWN)
    history = f"sqlite:///{where / 'h.db'}"
    ret, out = _session(
        pytester,
        "--update-baselines",
        f"--perf-history={history}",
        f"--perf-json={where / 'out' / 'perf.json'}",
        f"--perf-markdown={where / 'perf.md'}",
        f"--perf-html={where / 'html'}",
        blocked=("out",),
    )
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    assert len(_baselines(where)) == 1, out[-3000:]
    assert _runs(history) == 1
    assert (where / "html" / "index.html").exists()
    failed = [line for line in out.splitlines() if " not written: " in line]
    assert len(failed) == 2, failed
    assert failed[0].startswith(f"--perf-json {where / 'out' / 'perf.json'} not written: ")
    assert failed[1] == (
        f"--perf-markdown {where / 'perf.md'} not written: ValueError: a renderer bug"
    )
    assert not (where / "perf.md").exists()
    # a lost report fails the job, so that nobody reads a missing artifact as a green run
    assert ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]


def test_junitxml_failing_at_the_end_does_not_cost_the_plugins_sinks(
    pytester: pytest.Pytester,
) -> None:
    """pytest's own ``--junitxml`` writer ran before the plugin's session end and raised
    (its directory is a file now): pluggy stopped there, and the baselines, the history row
    and every report of the run were lost with it.  The plugin's session end runs first."""
    where = pytester.path
    history = f"sqlite:///{where / 'h.db'}"
    ret, out = _session(
        pytester,
        "--update-baselines",
        f"--perf-history={history}",
        f"--perf-json={where / 'perf.json'}",
        f"--junitxml={where / 'junit' / 'junit.xml'}",
        blocked=("junit",),
    )
    assert len(_baselines(where)) == 1, out[-3000:]
    assert _runs(history) == 1
    (test,) = json.loads((where / "perf.json").read_text())["tests"]
    assert test["outcome"] == "passed"
