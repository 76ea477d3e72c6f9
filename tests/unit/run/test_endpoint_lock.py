"""One measurement at a time per endpoint, across processes on this machine, xdist or not.

Two runs against one server at once both got a false ``regression``, and the second's baselines
replaced the first's: the lock held only between xdist workers of one rootdir.  Now a second
pytest process measuring the same endpoint waits for the first (saying who it waits for), and
errors naming it once ``--perf-lock-timeout`` has passed.

The first run is held inside its measurement by a conftest that waits for a file before the
conductor starts, so "the second arrives while the first measures" is arranged, not hoped
for; every wait is a poll of a file or of the output.  Each test gives its processes a TMPDIR
of their own, so their lock files are theirs alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_kimi.run import endpoint_lock
from pytest_kimi.run.endpoint_lock import (
    EndpointBusy,
    EndpointLockError,
    endpoint_key,
    lock_dir,
    lock_files,
    measuring,
    read_holder,
)
from support.timing import DEADLINE_S, SESSION_S, poll_until
from support.paths import REPO


PERF_TEST = textwrap.dedent(
    """
    from pytest_kimi import throughput

    @throughput(concurrency=1, max_tokens=16, trials=2, warmup=0)
    def test_measured():
        pass
    """
)

HOLD_IN_MEASUREMENT = textwrap.dedent(
    """
    # Hold this run inside its measurement (the endpoint lock taken, the conductor not yet
    # started) until the test that started it creates the release file.
    import os, pathlib, time
    import pytest_kimi.plugin.fixtures as fixtures

    _conduct = fixtures.conduct

    def conduct(*args, **kwargs):
        pathlib.Path(os.environ["KIMI_TEST_HOLDING"]).write_text(str(os.getpid()))
        release = pathlib.Path(os.environ["KIMI_TEST_RELEASE"])
        while not release.exists():
            time.sleep(0.02)
        return _conduct(*args, **kwargs)

    fixtures.conduct = conduct
    """
)


@pytest.fixture
def own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp dir of this test's own, for this process and the runs it starts."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    return tmp


# ------------------------------------------------------------------------------- the module


@pytest.mark.parametrize(
    "a, b",
    [
        ("http://127.0.0.1:30000", "http://localhost:30000/v1"),
        ("http://127.0.0.1:30000", "HTTP://user:pw@127.0.0.1:30000/"),
        ("http://0.0.0.0:8000", "http://127.0.0.1:8000"),
        ("http://gpu-box", "http://GPU-BOX:80"),
        ("https://gpu-box", "https://gpu-box:443/v1"),
    ],
)
def test_one_server_is_one_key(a: str, b: str) -> None:
    assert endpoint_key(a) == endpoint_key(b)


def test_other_ports_and_hosts_are_other_keys() -> None:
    keys = {
        endpoint_key(u)
        for u in ("http://127.0.0.1:30000", "http://127.0.0.1:30001", "http://gpu-box:30000")
    }
    assert len(keys) == 3


HOLDER = textwrap.dedent(
    """
    import pathlib, sys, time
    from pytest_kimi.run.endpoint_lock import measuring

    url, release = sys.argv[1], pathlib.Path(sys.argv[2])
    with measuring(url, timeout_s=60, argv=["holder", "--api-key=sk-hidden-0123456789"]):
        while not release.exists():
            time.sleep(0.02)
    """
)


@dataclass
class _Holder:
    proc: subprocess.Popen[bytes]
    release: Path
    sidecar: Path


def _hold(url: str, tmp_path: Path) -> _Holder:
    """Another process holding ``url``'s lock until ``release`` exists; returned once its
    sidecar names it."""
    release = tmp_path / "release"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, str(release)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    _, sidecar = lock_files(url)

    def held() -> bool:
        holder = read_holder(sidecar)
        return holder is not None and holder.pid == proc.pid

    poll_until(held, "the holder's sidecar")
    return _Holder(proc, release, sidecar)


def test_a_second_process_waits_then_errors_naming_the_holder(
    own_tmpdir: Path, tmp_path: Path
) -> None:
    url = "http://127.0.0.1:40001"
    holder = _hold(url, tmp_path)
    said: list[str] = []
    try:
        with pytest.raises(EndpointBusy) as caught:
            with measuring("http://localhost:40001/v1", timeout_s=0.3, on_wait=said.append):
                raise AssertionError("took a lock another process holds")
    finally:
        holder.release.touch()
        holder.proc.wait(timeout=DEADLINE_S)
    assert len(said) == 1
    assert said[0].startswith(
        f"waiting for another pytest-kimi run measuring http://localhost:40001/v1: "
        f"pid {holder.proc.pid} since "
    )
    message = str(caught.value)
    assert f"pid {holder.proc.pid} since" in message and "--perf-lock-timeout" in message
    assert caught.value.holder is not None and caught.value.holder.pid == holder.proc.pid
    # the holder's argv is recorded for waiters, but never its secrets
    assert "holder" in message and "sk-hidden-0123456789" not in message
    assert not holder.sidecar.exists()  # removed by its holder on release
    assert holder.sidecar.parent == lock_dir() == own_tmpdir / f"pytest-kimi-{os.getuid()}"


def test_the_waiter_goes_on_when_the_holder_releases(own_tmpdir: Path, tmp_path: Path) -> None:
    url = "http://127.0.0.1:40002"
    holder = _hold(url, tmp_path)
    said: list[str] = []

    def release_on_wait(text: str) -> None:
        said.append(text)
        holder.release.touch()  # the holder finishes while we wait

    with measuring(url, timeout_s=DEADLINE_S, on_wait=release_on_wait):
        assert holder.proc.wait(timeout=DEADLINE_S) == 0
        assert read_holder(holder.sidecar).pid == os.getpid()  # type: ignore[union-attr]
    assert len(said) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_holder_leaves_the_endpoint_free(own_tmpdir: Path, tmp_path: Path) -> None:
    """The kernel drops a dead process's lock: no stale lock to clear by hand, and the stale
    sidecar is overwritten."""
    url = "http://127.0.0.1:40003"
    holder = _hold(url, tmp_path)
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait(timeout=DEADLINE_S)
    with measuring(url, timeout_s=DEADLINE_S):
        assert read_holder(holder.sidecar).pid == os.getpid()  # type: ignore[union-attr]


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_a_lock_directory_that_is_not_ours_is_refused(own_tmpdir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (own_tmpdir / f"{endpoint_lock.DIR_PREFIX}{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(EndpointLockError, match="not a directory of yours.*set TMPDIR"):
        with measuring("http://127.0.0.1:40004", timeout_s=1):
            pass


# ------------------------------------------------------------------- two pytest processes


def _start_run(
    where: Path, url: str, *extra: str, hold: bool = False
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A pytest run of :data:`PERF_TEST` in ``where`` (its own rootdir) against ``url``; its
    output goes to a file the test polls."""
    where.mkdir()
    (where / "test_measured.py").write_text(PERF_TEST)
    (where / "pytest.ini").write_text("[pytest]\n")
    if hold:
        (where / "conftest.py").write_text(HOLD_IN_MEASUREMENT)
    out = where / "out.txt"
    report = where / "perf.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
        "KIMI_TEST_HOLDING": str(where / "holding"),
        "KIMI_TEST_RELEASE": str(where / "release"),
    }
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                f"--endpoint={url}",
                "--perf-history=off",
                f"--perf-json={report}",
                *extra,
            ],
            cwd=where,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return proc, out, report


def _measured(report: Path) -> tuple[float, float]:
    (test,) = json.loads(report.read_text())["tests"]
    start, end = test["measured"]
    return float(start), float(end)


def test_a_second_run_against_one_endpoint_waits_for_the_first(
    sim_url: str, own_tmpdir: Path, tmp_path: Path
) -> None:
    first, first_out, first_report = _start_run(tmp_path / "first", sim_url, hold=True)
    second = None
    try:
        poll_until(lambda: (tmp_path / "first" / "holding").exists(), "the first run measuring")
        second, second_out, second_report = _start_run(tmp_path / "second", sim_url)
        waiting = f"waiting for another pytest-kimi run measuring {sim_url}: pid {first.pid} since"

        def second_waits_or_ends() -> bool:
            return waiting in second_out.read_text() or second.poll() is not None

        poll_until(second_waits_or_ends, "the second run to wait", timeout_s=SESSION_S)
        assert second.poll() is None, second_out.read_text()[-3000:]  # it did not go ahead
        assert second_out.read_text().count(waiting) == 1  # said once
    finally:
        (tmp_path / "first" / "release").touch()
        first.wait(timeout=SESSION_S)
        if second is not None:
            second.wait(timeout=SESSION_S)
    assert first.returncode == 0, first_out.read_text()[-3000:]
    assert second.returncode == 0, second_out.read_text()[-3000:]
    # the second measured only after the first had finished
    assert _measured(second_report)[0] >= _measured(first_report)[1]


def test_a_run_that_waits_too_long_errors_naming_the_other(
    sim_url: str, own_tmpdir: Path, tmp_path: Path
) -> None:
    first, first_out, _ = _start_run(tmp_path / "first", sim_url, hold=True)
    try:
        poll_until(lambda: (tmp_path / "first" / "holding").exists(), "the first run measuring")
        second, second_out, _ = _start_run(tmp_path / "second", sim_url, "--perf-lock-timeout=0.5")
        second.wait(timeout=SESSION_S)
        # meanwhile a run against a simulator of its own (another endpoint) does not wait
        other, other_out, _ = _start_run(tmp_path / "other", "sim:speed=10")
        other.wait(timeout=SESSION_S)
    finally:
        (tmp_path / "first" / "release").touch()
        first.wait(timeout=SESSION_S)
    assert other.returncode == 0, other_out.read_text()[-3000:]
    assert "waiting for another pytest-kimi run" not in other_out.read_text()
    text = second_out.read_text()
    assert second.returncode == 1, text[-3000:]
    assert (
        f"another pytest-kimi run has been measuring {sim_url} for longer than the 0.5 s this "
        f"test waited: pid {first.pid} since"
    ) in text, text[-3000:]
    assert "1 error" in text
    assert first.returncode == 0, first_out.read_text()[-3000:]


SWEEP_TEST = textwrap.dedent(
    """
    def test_sweep(kimi_load):
        result = kimi_load.sweep_sync(concurrency=[1], max_tokens=16, trials=1, warmup=0)
        assert result.levels
    """
)


def test_a_kimi_load_sweep_takes_the_endpoint_lock_too(
    sim_url: str, own_tmpdir: Path, tmp_path: Path
) -> None:
    """A test that drives the load itself (``kimi_load.sweep``) measured beside another run's
    test on the same server: it held no lock.  Now it waits like a marked test, and errors
    naming the holder past ``--perf-lock-timeout``."""
    holder = _hold(sim_url, tmp_path)
    where = tmp_path / "sweep"
    where.mkdir()
    (where / "test_sweep.py").write_text(SWEEP_TEST)
    (where / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                f"--endpoint={sim_url}",
                "--perf-history=off",
                "--perf-lock-timeout=0.5",
            ],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=SESSION_S,
        )
    finally:
        holder.release.touch()
        holder.proc.wait(timeout=DEADLINE_S)
    assert run.returncode == 1, run.stdout[-3000:]
    assert f"another pytest-kimi run has been measuring {sim_url}" in run.stdout
    assert f"pid {holder.proc.pid} since" in run.stdout
    assert "1 failed" in run.stdout
