"""``--perf-requests FILE``: one JSON line per request, reconcilable with the JSON's windows.

What a third party needs from it: every request of every trial (replaced trials too), each
line whole, naming its test, level and trial as the JSON's ``trial_windows`` do, with the
client's times and the server's token counts; the tokens a window counted must be covered by
its requests'.  Written as each level finishes, so an interrupted run keeps what it measured;
appended under a lock, so xdist workers never interleave; no bodies, errors scrubbed.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.capacity_run import _merged
from pytest_kimi.measure.trials import measure_level
from pytest_kimi.report.requests_file import (
    NOTE,
    RequestsFile,
    problems_in,
    request_line,
    start,
)
from pytest_kimi.scrub import REDACTED
from support.busy_machine import INNER_ADDOPTS
from support.timing import SESSION_S, read_until
from test_trial_windows import LEVEL, StallingClient, _spec
from support.paths import REPO

SIM = "--endpoint=sim:speed=10,stream_interval=8"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


def _lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), "every line the writer finished ends in a newline"
    return [json.loads(line) for line in text.splitlines()]


# ---------------------------------------------------------------------------------- logic


def test_each_trial_is_written_once_the_replaced_one_too(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    start(path)
    sink = RequestsFile(path, tmp_path / ".kimi").for_test("t.py::t", profile="ep8")
    spec = _spec(clock=2.0, trials=2)
    first = asyncio.run(measure_level(StallingClient(1), spec, LEVEL))
    sink(first)
    lines = _lines(path)
    assert [(x["trial"], x["kept"]) for x in lines] == [(0, False)] * 2 + [(1, True)] * 2 + [
        (2, True)
    ] * 2
    assert {x["nodeid"] for x in lines} == {"t.py::t"} and {x["profile"] for x in lines} == {"ep8"}
    assert "perf_session" not in lines[0]
    # a capacity top-up hands the merged level over again: only its new trials are appended
    more = asyncio.run(measure_level(StallingClient(0), spec, LEVEL))
    sink(_merged(first, more, spec))
    lines = _lines(path)
    assert Counter(x["trial"] for x in lines) == {0: 2, 1: 2, 2: 2, 3: 2, 4: 2}
    rec = lines[-1]
    assert rec["completion_tokens"] == 101 and rec["events"] == 101 and rec["reads"] == 101
    assert rec["sent"] <= rec["first_token"] <= rec["last_token"] <= rec["end"]
    assert rec["ok"] and rec["status"] == 200 and rec["error"] is None and not rec["cut"]
    assert rec["max_tokens"] == LEVEL.max_tokens and "turn" not in rec


def test_a_line_carries_no_body_and_a_scrubbed_error() -> None:
    level = asyncio.run(measure_level(StallingClient(0), _spec(trials=1), LEVEL))
    window = level.trial_windows[0]
    rec = RequestRecord(
        index=7, worker=1, scheduled=1.0, sent=1.5, status=401, error=f"401: bad token {JWT}"
    )
    line = request_line(rec, window, level, {"nodeid": "t"})
    assert JWT not in json.dumps(line) and REDACTED in line["error"]
    assert line["first_token"] is None and line["end"] is None and not line["ok"]
    assert not {"body", "prompt", "messages", "blocks", "last_read"} & set(line)


def test_a_write_that_fails_notes_the_level_and_fails_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    sink = RequestsFile(blocker / "requests.jsonl", tmp_path / ".kimi").for_test("t")
    level = asyncio.run(measure_level(StallingClient(0), _spec(trials=1), LEVEL))
    sink(level)  # never raises: the measurement is not lost to the sink
    notes = [e for e in level.errors if e.startswith(NOTE)]
    assert len(notes) == 1 and "were not written" in notes[0], level.errors
    (problem,) = problems_in([{"levels": [level.to_dict()]}])
    assert problem.startswith("--perf-requests ") and "NotADirectoryError" in problem


def _append_batches(path: str, lock_dir: str, who: int, batches: int) -> None:
    file = RequestsFile(Path(path), Path(lock_dir))
    for b in range(batches):
        # a level's lines, large enough that an unlocked writer's could interleave
        file.append(
            [json.dumps({"who": who, "batch": b, "i": i, "pad": "x" * 900}) for i in range(40)]
        )


def test_writers_in_several_processes_never_interleave(tmp_path: Path) -> None:
    """xdist workers each append their levels; a level's lines stay together and whole."""
    path = tmp_path / "requests.jsonl"
    start(path)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_append_batches, args=(str(path), str(tmp_path / ".kimi"), who, 25))
        for who in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(SESSION_S)
        assert p.exitcode == 0
    lines = _lines(path)
    assert len(lines) == 3 * 25 * 40
    for k in range(0, len(lines), 40):  # each batch is 40 consecutive lines of one writer
        block = lines[k : k + 40]
        assert len({(x["who"], x["batch"]) for x in block}) == 1
        assert [x["i"] for x in block] == list(range(40))


# ------------------------------------------------------------------------------- sessions

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass

@throughput(concurrency=2, max_tokens=32, turns=2, trials=2, warmup=1)
def test_chat():
    pass
"""


def _by_trial(lines: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        out[(x["nodeid"], x["level"], x["trial"])].append(x)
    return out


def _reconcile(report: dict[str, Any], lines: list[dict[str, Any]]) -> int:
    """Every window's requests are in the file, and the tokens it counted are theirs; returns
    the windows checked."""
    grouped = _by_trial(lines)
    seen = set()
    for test in report["tests"]:
        for lv in test["levels"]:
            for w in lv["trial_windows"]:
                key = (test["nodeid"], lv["label"], w["trial"])
                mine = grouped.get(key, [])
                assert len(mine) == w["requests"], (key, w, len(mine))
                assert sorted(x["request"] for x in mine) == list(range(w["requests"])), key
                assert {x["kept"] for x in mine} == {w["kept"]}, key
                assert {x["unix_offset"] for x in mine} == {w["unix_offset"]}, key
                # the window counts tokens the requests received: never more than they report
                assert sum(x["completion_tokens"] for x in mine) >= w["tokens"] - 1e-6, key
                assert sum(x["cut"] for x in mine) == w["cut"], key
                for x in mine:
                    if x["ok"] and x["first_token"] is not None:
                        assert x["sent"] <= x["first_token"] <= x["last_token"] <= x["end"], x
                seen.add(key)
    assert set(grouped) == seen, "no line belongs to a trial the JSON does not have"
    return len(seen)


def test_the_file_has_every_request_of_every_trial(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    requests = pytester.path / "out" / "requests.jsonl"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        SIM,
        "--perf-history=off",
        "--perf-json=perf.json",
        "-o",
        f"kimi_perf_requests={requests}",  # the ini key is one of its sources
        timeout=SESSION_S,
    )
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "perf.json").read_text())
    lines = _lines(requests)
    assert _reconcile(report, lines) == 2 * 2 + 2
    chat = [x for x in lines if x["nodeid"].endswith("test_chat")]
    assert {x["turn"] for x in chat} == {1, 2}
    assert all("turn" not in x for x in lines if x["nodeid"].endswith("test_sweep"))
    stationary = [x for x in lines if x["nodeid"].endswith("test_sweep")]
    assert any(x["cut"] for x in stationary) and any(x["max_tokens"] < 64 for x in stationary)
    # no prompt or answer text: the built-in prompts' words are nowhere in the file
    text = requests.read_text()
    assert "messages" not in text and "content" not in text


def test_under_xdist_every_worker_appends_to_the_one_file(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    one = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 2], max_tokens=32, trials=2, warmup=1)
def test_{name}():
    pass
"""
    pytester.makepyfile(test_a=one.format(name="a"), test_b=one.format(name="b"))
    requests = pytester.path / "requests.jsonl"
    requests.write_text('{"stale": "a line of the run before"}\n')
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        "--dist",
        "loadfile",  # one file per worker: two processes measure and write
        SIM,
        "--perf-history=off",
        "--perf-json=perf.json",
        f"--perf-requests={requests}",
        timeout=SESSION_S,
    )
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "perf.json").read_text())
    lines = _lines(requests)
    assert all("stale" not in x for x in lines), "the file holds this run's requests only"
    assert _reconcile(report, lines) == 2 * 2 * 2
    assert {x["nodeid"].split("::")[-1] for x in lines} == {"test_a", "test_b"}


def test_an_interrupted_run_keeps_the_levels_it_finished(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_suite="""
from pytest_kimi import throughput

@throughput(concurrency=[1, 4, 8], max_tokens=64, trials=2, warmup=1)
def test_sweep():
    pass
"""
    )
    where = pytester.path
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--endpoint=sim:speed=10",
            "--perf-history=off",
            f"--perf-json={where / 'perf.json'}",
            f"--perf-requests={where / 'requests.jsonl'}",
        ],
        cwd=where,
        env={**os.environ, "PYTEST_ADDOPTS": INNER_ADDOPTS},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        head = read_until(proc, "[kimi] C=1: ")  # the first level is final: its lines written
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=SESSION_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, (head + out)[-3000:]
    report = json.loads((where / "perf.json").read_text())
    (test,) = report["tests"]
    finished = {lv["label"] for lv in test["levels"]}
    assert "C=1" in finished and "C=8" not in finished, finished
    lines = _lines(where / "requests.jsonl")
    assert {x["level"] for x in lines} == finished
    _reconcile(report, lines)


def test_a_path_that_cannot_be_written_is_refused_at_the_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite="def test_plain():\n    pass\n")
    directory = pytester.path / "a-dir"
    directory.mkdir()
    result = pytester.runpytest_subprocess(f"--perf-requests={directory}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--perf-requests {directory}: is a directory: give a file's path*"]
    )
    blocker = pytester.path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KIMI_PERF_REQUESTS", str(blocker / "requests.jsonl"))
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*env KIMI_PERF_REQUESTS {blocker / 'requests.jsonl'}: cannot be created: *is a file*"]
    )
    assert blocker.read_text() == "not a directory"


def test_every_key_a_line_can_carry_is_documented() -> None:
    doc = (REPO / "docs" / "reference" / "json-report.md").read_text()
    section = doc[doc.index("## The requests file") :]
    documented = set(re.findall(r"`([a-z_0-9]+)`", section))
    level = asyncio.run(measure_level(StallingClient(0), _spec(trials=1), LEVEL))
    rec = RequestRecord(index=0, worker=0, scheduled=1.0, turn=2, reasoning_tokens=3)
    line = request_line(rec, level.trial_windows[0], level, {"nodeid": "t", "profile": "p"})
    assert not set(line) - documented - {"perf_session"}, (
        "document them in docs/reference/json-report.md"
    )
    assert "perf_session" in documented
