"""Input files from a checkout: no disclosure, no unbounded read, outputs that do not move.

Baselines, server profiles, datasets and prompts files come with a pull request.  Before these
guards a baseline committed as a symlink to a one-line secret printed the secret in its
"must be a mapping, got str '...'" error (terminal, ``--perf-json``, JUnit); a symlink to
``/dev/zero`` turned the gate off as "no baseline yet", a ``dataset=`` one read until
``MemoryError`` and a ``prompts`` one was reported as missing; a 100 MB dataset line was sent
whole; and ``--server-profile ../other/x.yaml`` moved pytest's rootdir into the other checkout,
where the reports, history and baselines were written.

The user-facing cases run real sessions against the simulator (``pytester``, bounded by
the suite's session timeout, so a read that does not stop fails the test instead of
hanging it); below them, the one reader (:func:`pytest_kimi.files.read_regular_bytes`) and
each file's reader on their own.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from pytest_kimi import cli
from pytest_kimi.baseline import BaselineError, BaselineStore, loads
from pytest_kimi.baseline.yaml_io import MAX_BASELINE_BYTES
from pytest_kimi.files import (
    FileRefusedError,
    described,
    key_shown,
    read_regular_bytes,
    read_regular_text,
)
from pytest_kimi.run.output_paths import SeparateValue, separate_values, value_flags
from pytest_kimi.server.profile import ProfileError, load_profile
from pytest_kimi.workload import dataset as dataset_mod
from pytest_kimi.workload import prompts as prompts_mod
from pytest_kimi.workload.dataset import MAX_DATASET_BYTES, DatasetError, load_dataset
from pytest_kimi.workload.prompts import WorkloadError, resolve_prompts
from support.timing import DEADLINE_S, SESSION_S

SECRET = "kimi-test-secret-5f1e0c9b2a7d"
"""The one-line "secret" the symlinks point at: no byte of it may reach any output."""

needs_posix = pytest.mark.skipif(
    sys.platform == "win32" or not os.path.exists("/dev/zero"), reason="POSIX files"
)


@pytest.fixture
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-line secret outside the project (a mounted token, say)."""
    path = tmp_path_factory.mktemp("elsewhere") / "token"
    path.write_text(SECRET + "\n")
    return path


def _link(link: Path, target: Path | str) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def _outputs(result: pytest.RunResult, *files: Path) -> str:
    """Everything the session wrote: terminal (both streams) and the report files."""
    text = "\n".join(result.outlines + result.errlines)
    for path in files:
        assert path.exists(), f"{path} was not written"
        text += "\n" + path.read_text()
    return text


# ----------------------------------------------------------------------------- baselines

BASELINE_SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0)
def test_linked_out():
    pass

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0)
def test_linked_in():
    pass

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0)
def test_zero():
    pass
"""


@needs_posix
def test_a_symlinked_baseline_prints_no_content_anywhere(
    pytester: pytest.Pytester, secret_file: Path
) -> None:
    """Three baselines committed as symlinks: to a secret outside the baseline directory, to
    a secret file inside it, and to ``/dev/zero``.  Each test errors naming its file and what
    the file is; the secret is in no line of the terminal, ``--perf-json`` or JUnit, and
    ``/dev/zero`` is not "no baseline yet"."""
    pytester.makepyfile(test_perf=BASELINE_SUITE)
    store = BaselineStore(pytester.path / "baselines", "sim")
    inside = pytester.path / "baselines" / "sim" / "token.txt"
    _link(store.path_for("test_perf.py::test_linked_out"), secret_file)
    inside.write_text(SECRET)
    _link(store.path_for("test_perf.py::test_linked_in"), inside)
    _link(store.path_for("test_perf.py::test_zero"), "/dev/zero")
    report, junit = pytester.path / "perf.json", pytester.path / "junit.xml"
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--endpoint=sim:speed=50",
        "--perf-history=off",
        f"--perf-json={report}",
        f"--junitxml={junit}",
    )
    result.assert_outcomes(errors=3)
    everything = _outputs(result, report, junit)
    assert SECRET not in everything
    assert SECRET[:12] not in everything  # not even a prefix of it
    out = "\n".join(result.outlines)
    # what each file is, with its path
    assert f"resolves through a symbolic link to {secret_file.resolve()}" in out
    assert "the document must be a mapping, got a string of 29 characters" in out
    assert "is a symbolic link to /dev/zero, a character device, not a regular file" in out
    tests = {t["nodeid"]: t for t in json.loads(report.read_text())["tests"]}
    zero = json.dumps(tests["test_perf.py::test_zero"])
    assert "character device" in zero and "no baseline yet" not in zero


@needs_posix
def test_store_refuses_what_is_not_a_regular_file_under_its_root(
    tmp_path: Path, secret_file: Path
) -> None:
    store = BaselineStore(tmp_path / "baselines", "sim")
    path = _link(store.path_for("t.py::test_a"), "/dev/zero")
    with pytest.raises(BaselineError, match="a character device, not a regular file") as info:
        store.load("t.py::test_a")
    assert info.value.path == path
    path.unlink()
    _link(path, tmp_path / "nowhere.yaml")  # something committed there that points nowhere
    with pytest.raises(BaselineError, match="which does not exist"):
        store.load("t.py::test_a")
    path.unlink()
    assert store.load("t.py::test_a") is None  # nothing there at all: no baseline yet
    _link(path, secret_file)
    with pytest.raises(BaselineError, match="outside") as info:
        store.load("t.py::test_a")
    assert SECRET not in str(info.value)
    # the listing yields such files (to report them), and `kimi-perf baselines` names them
    assert list(store.paths()) == [path]


@needs_posix
def test_kimi_perf_baselines_names_a_device_and_prints_no_secret(
    tmp_path: Path, secret_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = BaselineStore(tmp_path / "baselines", "sim")
    _link(store.path_for("t.py::test_zero"), "/dev/zero")
    _link(store.path_for("t.py::test_secret"), secret_file)
    assert cli.main(["baselines", str(tmp_path / "baselines")]) != 0
    err = capsys.readouterr().err
    assert "a character device, not a regular file" in err
    assert "outside" in err and SECRET not in err


def test_a_baseline_over_its_bound_is_refused_unread_unless_allowed(tmp_path: Path) -> None:
    """A sparse file: its size is on disk at once, its bytes are never read (a read of it
    would take the bound's worth of zeros, and parse them)."""
    store = BaselineStore(tmp_path / "baselines", "sim")
    path = store.path_for("t.py::test_big")
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(MAX_BASELINE_BYTES + 1)
    with pytest.raises(BaselineError, match=r"over the 1048576 bytes \(1\.0 MiB\) bound") as info:
        store.load("t.py::test_big")
    assert "--perf-allow-large" in str(info.value)
    # --perf-allow-large lifts the size bound: the file is read (and is no baseline)
    lifted = BaselineStore(tmp_path / "baselines", "sim", allow_large=True)
    with pytest.raises(BaselineError) as info:
        lifted.load("t.py::test_big")
    assert "bytes bound" not in info.value.problem


def test_baseline_errors_describe_values_and_never_show_them() -> None:
    """Every message about a wrong value says what it is; numbers a reviewer compares stay."""
    cases = {
        f"{SECRET}\n": "the document must be a mapping, got a string of 29 characters",
        f"- {SECRET}\n": "the document must be a mapping, got a list of 1 item",
        f"schema: '{SECRET}'\n": "unsupported schema a string of 29 characters",
        f"schema: 1\ntest: [{SECRET}]\n": "'test' must be a non-empty string, got a list",
        f"schema: 1\n{SECRET} x: 1\n": "unknown key(s) a key that is a string of 31 characters",
        "schema: 7\n": "unsupported schema 7;",
    }
    for text, expected in cases.items():
        with pytest.raises(BaselineError) as info:
            loads(text, source="b.yaml")
        assert expected in str(info.value), str(info.value)
        assert SECRET not in str(info.value)


# ------------------------------------------------------------------ datasets and prompts

INPUT_SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0, dataset="data/zero.jsonl")
def test_dataset_zero():
    pass

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0, prompts="data/zero-prompts.jsonl")
def test_prompts_zero():
    pass

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0, dataset="data/huge.json")
def test_dataset_huge():
    pass

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0, dataset="data/long-line.jsonl")
def test_dataset_long_line():
    pass
"""


@needs_posix
def test_dataset_and_prompts_files_fail_fast_naming_what_they_are(
    pytester: pytest.Pytester,
) -> None:
    """``dataset=`` and ``prompts=`` symlinked to ``/dev/zero`` name the device (the prompts
    one said "does not exist"), a sparse file over the dataset bound is refused before a byte
    is read (a read would take a GiB), and a line longer than a prompt may be is refused
    rather than sent whole.  The session ends within its timeout, so every read stopped."""
    pytester.makepyfile(test_perf=INPUT_SUITE)
    data = pytester.path / "data"
    _link(data / "zero.jsonl", "/dev/zero")
    _link(data / "zero-prompts.jsonl", "/dev/zero")
    with open(data / "huge.json", "wb") as f:
        f.truncate(MAX_DATASET_BYTES + 1)
    long_prompt = "x" * (prompts_mod.MAX_PROMPT_CHARS + 1)
    (data / "long-line.jsonl").write_text(json.dumps({"prompt": long_prompt}) + "\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--endpoint=sim:speed=50", "--perf-history=off"
    )
    result.assert_outcomes(errors=4)
    out = "\n".join(result.outlines)
    zero = "is a symbolic link to /dev/zero, a character device, not a regular file"
    assert f"dataset file {data / 'zero.jsonl'}: {zero}" in out
    assert f"prompts file {data / 'zero-prompts.jsonl'}: {zero}" in out
    assert "does not exist" not in out
    assert f"is a regular file of {MAX_DATASET_BYTES + 1} bytes (1.0 GiB), over the" in out
    assert (
        f"long-line.jsonl:1: the prompt is {prompts_mod.MAX_PROMPT_CHARS + 1} characters, over"
        in out
    )
    assert "xxxxxxxxxx" not in out


@needs_posix
def test_a_relative_dataset_or_prompts_path_stays_in_the_rootdir(
    tmp_path: Path, secret_file: Path
) -> None:
    """A path inside the rootdir must not leave it through a symlink; a path the marker
    names outside it is read where it is (named on purpose)."""
    root = tmp_path / "project"
    outside = tmp_path / "shared" / "prompts.jsonl"
    outside.parent.mkdir()
    outside.write_text('"hello"\n')
    _link(root / "data" / "prompts.jsonl", outside)
    with pytest.raises(WorkloadError, match="outside") as info:
        resolve_prompts("data/prompts.jsonl", None, root)
    assert f"give its own path in the marker ({outside})" in str(info.value)
    assert resolve_prompts(str(outside), None, root).prompts == ("hello",)
    _link(root / "data" / "secret.jsonl", secret_file)
    with pytest.raises(DatasetError, match="outside") as caught:
        load_dataset("data/secret.jsonl", root)
    assert SECRET not in str(caught.value)


def test_dataset_entry_errors_say_what_a_value_is_not_what_it_holds(tmp_path: Path) -> None:
    """The dataset may be a symlink to something else: no entry error quotes the file."""
    path = tmp_path / "d.jsonl"
    for line, expected in (
        (json.dumps(SECRET), "got a string of 29 characters"),
        (json.dumps({"prompt": [SECRET]}), "got a list of 1 item"),
        (json.dumps({"prompt": "p", "output_tokens": SECRET}), "got a string of 29"),
    ):
        path.write_text(line + "\n")
        dataset_mod._CACHE.clear()
        with pytest.raises(DatasetError) as info:
            load_dataset(str(path), tmp_path)
        assert expected in str(info.value) and SECRET not in str(info.value), str(info.value)


def test_perf_allow_large_lifts_the_entry_bound_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prompts_mod, "MAX_PROMPT_CHARS", 10)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "y" * 11}) + "\n")
    with pytest.raises(DatasetError, match="the prompt is 11 characters, over the 10"):
        load_dataset(str(path), tmp_path)
    assert load_dataset(str(path), tmp_path, allow_large=True).entries[0].prompt == "y" * 11
    # what a lifted read parsed is not served from the cache to a bounded read
    with pytest.raises(DatasetError, match="over the 10"):
        load_dataset(str(path), tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps("z" * 11) + "\n")
    with pytest.raises(WorkloadError, match="over the 10"):
        resolve_prompts(str(prompts), None, tmp_path)
    assert resolve_prompts(str(prompts), None, tmp_path, allow_large=True).prompts == ("z" * 11,)


# --------------------------------------------------------------------------- profiles


@needs_posix
def test_a_server_profile_is_read_only_as_a_bounded_regular_file(
    tmp_path: Path, secret_file: Path
) -> None:
    zero = _link(tmp_path / "zero.yaml", "/dev/zero")
    with pytest.raises(ProfileError, match="a character device, not a regular file"):
        load_profile(zero)
    linked = _link(tmp_path / "secret.yaml", secret_file)
    with pytest.raises(ProfileError, match="must be a mapping") as info:
        load_profile(linked)
    assert SECRET not in str(info.value)
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text(f"{SECRET}: 1\n")
    with pytest.raises(ProfileError, match="unknown key a key that is a string of 29") as info:
        load_profile(keyed)
    assert SECRET not in str(info.value)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_BASELINE_BYTES + 1)
    with pytest.raises(ProfileError, match="over the 1048576 bytes"):
        load_profile(big)


# ----------------------------------------------------------------------- the one reader


@needs_posix
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: the reader must not open it.
    In a thread, so that a reader that does block fails this test instead of hanging it."""
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def read() -> None:
        try:
            read_regular_bytes(fifo, what="baseline", limit=100)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            caught.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(DEADLINE_S)
    if reader.is_alive():  # unblock it before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("reading a FIFO blocked")
    assert len(caught) == 1 and isinstance(caught[0], FileRefusedError)
    assert caught[0].kind == "not-regular"
    assert str(caught[0]) == (
        f"baseline {fifo}: is a named pipe (FIFO), not a regular file; nothing else is read (a "
        "device or pipe has no end, and may not be what it seems): give the path of a regular "
        "file"
    )


def test_the_reader_bounds_regular_files_and_names_types(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"a" * 100)
    assert read_regular_bytes(path, what="x", limit=100) == b"a" * 100
    assert read_regular_text(path, what="x", limit=None) == "a" * 100
    with pytest.raises(FileRefusedError) as info:
        read_regular_bytes(path, what="dataset", limit=99, lift="run with --perf-allow-large")
    assert info.value.kind == "too-large"
    assert str(info.value) == (
        f"dataset {path}: is a regular file of 100 bytes, over the 99 bytes bound for a "
        "dataset; is this the file you meant?; run with --perf-allow-large"
    )
    with pytest.raises(FileRefusedError, match="is a directory, not a regular file"):
        read_regular_bytes(tmp_path, what="x", limit=None)
    with pytest.raises(FileNotFoundError):
        read_regular_bytes(tmp_path / "absent", what="x", limit=None)


@needs_posix
def test_within_refuses_only_a_symlink_out_of_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    inside = root / "sub" / "a.txt"
    inside.write_text("in")
    outside = tmp_path / "out.txt"
    outside.write_text("out")
    _link(root / "to-inside.txt", inside)
    _link(root / "to-outside.txt", outside)
    _link(root / "linked-dir", tmp_path)
    assert read_regular_text(root / "to-inside.txt", what="x", limit=None, within=root) == "in"
    for path in (root / "to-outside.txt", root / "linked-dir" / "out.txt"):
        with pytest.raises(FileRefusedError) as info:
            read_regular_text(path, what="x", limit=None, within=root)
        assert info.value.kind == "outside"
        assert f"to {outside}, outside {root}" in str(info.value)
    # named outside on purpose (``..``, an absolute path): read where it is
    assert read_regular_text(root / ".." / "out.txt", what="x", limit=None, within=root) == "out"
    # a root that is itself a symlink holds what is under its target
    linked_root = _link(tmp_path / "root-link", root)
    assert read_regular_text(
        linked_root / "sub" / "a.txt", what="x", limit=None, within=linked_root
    )


def test_described_and_key_shown_never_show_the_value() -> None:
    assert described(SECRET) == "a string of 29 characters"
    assert described([SECRET]) == "a list of 1 item"
    assert described({SECRET: SECRET}) == "a mapping of 1 key"
    assert described(3) == "an integer" and described(None) == "null"
    assert described(SECRET.encode()) == "binary data of 29 bytes"
    assert key_shown("tok_s") == "'tok_s'" and key_shown("tok_s", quote=False) == "tok_s"
    assert key_shown(SECRET) == "a key that is a string of 29 characters"
    assert key_shown("a b") == "a key that is a string of 3 characters"
    assert key_shown("ghp_" + "a1" * 18) == "a key that is a string of 40 characters"
    assert key_shown("max-running-requests") == "'max-running-requests'"


# ------------------------------------------------------------------------ the rootdir


def test_separate_values_finds_the_plugins_options_given_as_two_words() -> None:
    flags = value_flags()
    assert "--server-profile" in flags and "--perf-json" in flags
    assert "--update-baselines" not in flags and "--perf-allow-large" not in flags
    words = ["--server-profile", "a.yaml", "--perf-json=r.json", "-x", "--", "--perf-json", "b"]
    assert separate_values(words, flags) == [SeparateValue("--server-profile", "a.yaml")]


PROFILE_SUITE = """
def test_nothing():
    pass
"""


def _projects(pytester: pytest.Pytester) -> tuple[Path, Path]:
    """``main/`` (where pytest is run) and ``other/`` (a checkout beside it, with a profile):
    each its own pytest.ini."""
    main, other = pytester.mkdir("main"), pytester.mkdir("other")
    for project in (main, other):
        (project / "pytest.ini").write_text("[pytest]\n")
        (project / "servers").mkdir()
        (project / "servers" / "ext.yaml").write_text("url: http://127.0.0.1:9\n")
    (main / "test_main.py").write_text(PROFILE_SUITE)
    return main, other


def test_a_profile_in_another_checkout_does_not_move_the_outputs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--server-profile ../other/servers/ext.yaml`` made pytest take the other checkout for
    the rootdir (and read its ini file): the session now stops before reading or writing
    anything, saying how to write it; written as one word, or with a profile inside the
    project, the rootdir is where pytest was run."""
    main, other = _projects(pytester)
    monkeypatch.chdir(main)
    before = sorted(p.name for p in other.rglob("*"))
    profile = "../other/servers/ext.yaml"
    refused = pytester.runpytest_subprocess(
        "--server-profile", profile, "--perf-json", "report.json", timeout=SESSION_S
    )
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(refused.errlines)
    assert f"--server-profile {profile}: pytest took this value for a test path" in err
    assert f"chose the rootdir {other} (ini file {other / 'pytest.ini'})" in err
    assert f"instead of {main} (ini file {main / 'pytest.ini'})" in err
    assert f"Write --server-profile={profile} (one word)" in err
    assert sorted(p.name for p in other.rglob("*")) == before  # nothing written there
    assert not (main / "report.json").exists() and not (other / "report.json").exists()
    for args in ([f"--server-profile={profile}"], ["--server-profile", "servers/ext.yaml"]):
        collected = pytester.runpytest_subprocess(
            *args, "--collect-only", "-q", "-p", "no:cacheprovider", timeout=SESSION_S
        )
        assert collected.ret == pytest.ExitCode.OK, "\n".join(collected.outlines)
        collected.stdout.fnmatch_lines(["test_main.py::test_nothing"])
    header = pytester.runpytest_subprocess(
        f"--server-profile={profile}",
        "--collect-only",
        "-p",
        "no:cacheprovider",
        timeout=SESSION_S,
    )
    header.stdout.fnmatch_lines([f"rootdir: {main}"])
    assert sorted(p.name for p in other.rglob("*")) == before
