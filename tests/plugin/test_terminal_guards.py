"""No terminal injection, no secret in the header, and a quiet end to a signal in the summary.

A hostile endpoint's model id and HTTP error bodies reached the terminal with their control
characters: it cleared the screen, set the window title and forged a line ``[kimi] C=1: 99999.0
tok/s``; ``--perf-markdown`` kept the raw ESC bytes; a model id with userinfo or ``token=`` was
redacted in the JSON and printed in clear in the terminal's header.  And a SIGTERM (or a Ctrl-C)
during the terminal summary, after the reports were written, printed a 40-frame traceback and
exited 130 under reports that said PASSED.

The sessions run ``python -m pytest`` in a subprocess and read its raw output (pytester's
``RunResult`` splits lines at CR, VT and FF too, which would hide exactly what is checked here)
against :class:`support.hostile_text.HostileTextServer`; the units pin
:func:`pytest_kimi.printable.printable`, the renderers that call it and the signal handler's
late mode.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_kimi.plugin.uncaptured import shown
from pytest_kimi.printable import printable
from pytest_kimi.report.markdown import render_markdown
from pytest_kimi.report.terminal import format_session_noise, format_test
from pytest_kimi.server import interrupts as interrupts_module
from pytest_kimi.server.interrupts import TOGETHER_S, Interrupts
from support.busy_machine import INNER_ADDOPTS
from support.hostile_text import (
    ESCAPE_MODEL,
    ESCAPES,
    FORGED,
    SECRET_MODEL,
    SECRET_PARTS,
    HostileTextServer,
    unsafe_characters,
)
from support.timing import SESSION_S, poll_until, read_until

FORGED_HEAD = FORGED[: FORGED.index(" tok/s")]
"""``[kimi] C=1: 99999.0``: a line that starts so is a forged one (the genuine level ends at
the simulator's pace, nowhere near 99999 tok/s).  Only the first column counts, where the
plugin's own progress lines start: inside the summary every line is indented, and a wrapped
reason may well continue with the server's words."""


# ------------------------------------------------------------------------------ printable()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # ESC (CSI)
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # OSC and BEL
        ("a\rb\x08", "a\\rb\\x08"),  # CR, BS
        ("\x00\x0b\x0c\x1f", "\\x00\\x0b\\x0c\\x1f"),  # the other C0 controls
        ("\x7f", "\\x7f"),  # DEL
        ("\x85\x9b", "\\x85\\x9b"),  # C1: NEL, the one-byte CSI
        ("\u202eabc\u202c", "\\u202eabc\\u202c"),  # a right-to-left override
        ("a\u2028b", "a\\u2028b"),  # a line separator
        ("line\nnext\ttab", "line\\nnext\\ttab"),  # one line stays one line
        ("ümlaut 中文 ✓ tok/s ±1.2%", "ümlaut 中文 ✓ tok/s ±1.2%"),  # text is text
    ],
)
def test_printable_escapes_every_control_and_keeps_text(raw: str, expected: str) -> None:
    assert printable(raw) == expected
    assert not unsafe_characters(printable(raw))
    assert printable(printable(raw)) == printable(raw)  # a second pass changes nothing


def test_printable_keeps_lines_only_when_asked() -> None:
    assert printable("a\nb\tc\rd", lines=True) == "a\nb\tc\\rd"
    assert printable("a\nb", lines=False) == "a\\nb"


def test_printable_caps_what_is_shown_escapes_included() -> None:
    assert printable("x" * 30, 10) == "x" * 10 + "... (20 more characters)"
    # 10,000 ESC bytes are capped like 10,000 letters: the cap counts what is shown
    capped = printable("\x1b" * 10_000, 100)
    assert len(capped) < 100 + len("... (10000 more characters)")
    assert capped.endswith("more characters)") and not unsafe_characters(capped)
    assert printable("short", 10) == "short"
    assert len(printable("y" * 100_000, None)) == 100_000


def test_a_notice_is_escaped_and_cannot_start_a_line_of_its_own() -> None:
    text = shown(f"[kimi sim] last log line: {ESCAPES}")
    assert not unsafe_characters(text)
    lines = text.split("\n")
    assert lines[0].startswith("[kimi sim] last log line: \\x1b[2J")
    assert all(line.startswith("  ") for line in lines[1:])  # the server's lines, indented
    assert not any(line.startswith(FORGED_HEAD) for line in lines)


# ----------------------------------------------------------------------------- renderers


def _hostile_test() -> dict[str, Any]:
    """A test record every server-supplied string of which carries :data:`ESCAPES`."""
    level = {
        "label": "C=1",
        "concurrency": 1,
        "tok_s": None,
        "verdict": "error",
        "requests_ok": 0,
        "requests_failed": 2,
        "reasons": [f"2 of 2 requests failed: HTTP 500: {ESCAPES}"],
        "errors": [f"HTTP 500: {ESCAPES}", f"note: max_concurrency=4: {ESCAPES}"],
        "profile": ESCAPES,
    }
    return {
        "nodeid": "test_h.py::test_h",
        "outcome": "failed",
        "workload": {"api": "chat", "model": ESCAPE_MODEL},
        "levels": [level],
        "error": f"setup failed: {ESCAPES}",
        "baseline_note": f"no baseline yet {ESCAPES}",
        "cache_flush": ESCAPES,
        "shift": {"text": ESCAPES, "verdict": "regression"},
        "provenance_changes": [ESCAPES],
        "compared_with": ESCAPES,
    }


def test_the_terminal_renderer_escapes_every_server_string() -> None:
    lines = format_test(_hostile_test(), width=100)
    text = "\n".join(lines)
    assert not unsafe_characters(text), unsafe_characters(text)[:10]
    assert "HTTP 500: \\x1b[2J" in text  # shown, escaped: the operator sees what was sent
    assert not any(line.startswith(FORGED_HEAD) for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])  # all under the test's title
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)


def test_the_session_noise_lines_are_escaped() -> None:
    section = {
        "levels": [{"nodeid": ESCAPES, "label": "C=1", "estimate": None, "session_tok_s": [1.0]}],
        "notes": [ESCAPES],
    }
    lines = format_session_noise(section, width=100)
    assert not unsafe_characters("\n".join(lines))
    assert all(len(line) <= 100 for line in lines)


def test_the_markdown_report_escapes_every_server_string() -> None:
    report = {
        "endpoint": {"url": "http://127.0.0.1:1", "model": ESCAPE_MODEL},
        "tests": [_hostile_test()],
        "notes": [ESCAPES],
        "title": ESCAPES,
    }
    markdown = render_markdown(report)
    assert "\x1b" not in markdown
    assert not unsafe_characters(markdown), unsafe_characters(markdown)[:10]
    assert "kimi\\x1b[2J" in markdown
    # the error block keeps the error's lines (a fenced block: read as the error's own);
    # outside it no server text starts a line
    outside = re.sub(r"```text\n.*?\n```", "", markdown, flags=re.S)
    assert "setup failed" not in outside and "pwned" in outside
    assert not any(line.startswith(FORGED_HEAD) for line in outside.split("\n"))


# -------------------------------------------------------------------------------- sessions

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=16, trials=1, warmup=0, requests=2, timeout_s=60)
def test_h():
    pass
"""


@pytest.fixture
def hostile_text() -> Iterator[list[HostileTextServer]]:
    """The servers a test starts (appended to the list), stopped after it."""
    servers: list[HostileTextServer] = []
    yield servers
    for server in servers:
        server.stop()


def _session(where: Path, url: str) -> tuple[str, bytes]:
    """``pytest`` against ``url`` at ``COLUMNS=100``: its output, as text and as raw bytes."""
    (where / "test_h.py").write_text(SUITE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--color=no",
            f"--endpoint={url}",
            "--perf-history=off",
            f"--perf-json={where / 'perf.json'}",
            f"--perf-markdown={where / 'perf.md'}",
        ],
        cwd=where,
        env={**os.environ, "PYTEST_ADDOPTS": INNER_ADDOPTS, "COLUMNS": "100"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=SESSION_S,
        check=False,
    )
    return done.stdout.decode("utf-8"), done.stdout


def _assert_clean(out: str, raw: bytes, markdown: Path) -> None:
    assert b"\x1b" not in raw, out[-3000:]
    assert not unsafe_characters(out), (unsafe_characters(out)[:10], out[-3000:])
    assert not any(line.startswith(FORGED_HEAD) for line in out.split("\n")), out
    if markdown.exists():
        text = markdown.read_bytes()
        assert b"\x1b" not in text
        assert not unsafe_characters(text.decode("utf-8"))


def test_a_hostile_model_id_and_error_body_reach_no_terminal_raw(
    pytester: pytest.Pytester, hostile_text: list[HostileTextServer]
) -> None:
    """The model id from ``/v1/models`` and every generation's HTTP 500 body carry
    :data:`ESCAPES`: the header, the reasons, pytest's failure message and the Markdown show
    them escaped."""
    server = HostileTextServer("escape_error", model_id=ESCAPE_MODEL).start()
    hostile_text.append(server)
    out, raw = _session(pytester.path, server.url)
    assert server.generations(), out[-3000:]  # the requests were sent: the bodies came back
    _assert_clean(out, raw, pytester.path / "perf.md")
    assert "model kimi\\x1b[2J\\x1b[H\\x1b]0;pwned" in out, out[-3000:]  # the header
    assert "HTTP 500: \\x1b[2J" in out  # a reason
    markdown = (pytester.path / "perf.md").read_text()
    assert "kimi\\x1b[2J" in markdown and "HTTP 500: \\x1b[2J" in markdown


def test_a_hostile_discovery_error_reaches_no_terminal_raw(
    pytester: pytest.Pytester, hostile_text: list[HostileTextServer]
) -> None:
    """``/v1/models`` answers HTTP 500 with :data:`ESCAPES`: pytest's own error report of
    the setup (its section and the short summary's line) shows it escaped too."""
    server = HostileTextServer("escape_models").start()
    hostile_text.append(server)
    out, raw = _session(pytester.path, server.url)
    _assert_clean(out, raw, pytester.path / "perf.md")
    assert "/v1/models answered HTTP 500: \\x1b[2J" in out, out[-3000:]
    assert "ERROR test_h.py::test_h - Failed:" in out


def test_the_terminal_header_is_scrubbed_like_the_json(
    pytester: pytest.Pytester, hostile_text: list[HostileTextServer]
) -> None:
    server = HostileTextServer("ok", model_id=SECRET_MODEL).start()
    hostile_text.append(server)
    out, _ = _session(pytester.path, server.url)
    report = json.loads((pytester.path / "perf.json").read_text())
    shown_model = report["endpoint"]["model"]
    assert "<redacted>" in shown_model
    assert f"model {shown_model}" in out, out[-3000:]  # the header says what the JSON says
    for secret in SECRET_PARTS:
        assert secret not in out and secret not in shown_model


# ------------------------------------------------------------------------ signals, late


@pytest.fixture
def no_exit(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``os._exit`` and the servers' kill recorded instead of done: the exit codes."""
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(interrupts_module.os, "_exit", fake_exit)
    monkeypatch.setattr(interrupts_module.supervised, "kill_all", lambda wait_s: None)
    return codes


def test_a_signal_after_the_tests_is_noted_not_raised(no_exit: list[int]) -> None:
    said: list[str] = []
    stops = Interrupts(say=said.append)
    stops.finishing()
    stops._handle(signal.SIGTERM, None)  # no KeyboardInterrupt: the run ends as it was going to
    assert stops.first == signal.SIGTERM and said and "after the tests ended" in said[0]
    assert not no_exit


@pytest.mark.parametrize("settled", [None, 1])
def test_a_second_signal_after_the_tests_exits_with_the_reports_status(
    no_exit: list[int], settled: int | None
) -> None:
    stops = Interrupts(say=lambda text: None)
    stops.finishing()
    if settled is not None:
        stops.settle(settled)
    stops._handle(signal.SIGINT, None)
    stops._handle(signal.SIGINT, None)  # an echo of the first: nothing
    assert not no_exit
    stops._first_at -= TOGETHER_S  # the second decision, TOGETHER_S later
    with pytest.raises(SystemExit):
        stops._handle(signal.SIGINT, None)
    # with the reports written, the exit status is theirs; before, 128 + the signal
    assert no_exit == [settled if settled is not None else 128 + signal.SIGINT]


def test_before_the_tests_end_a_signal_still_stops_the_run() -> None:
    stops = Interrupts(say=lambda text: None)
    with pytest.raises(KeyboardInterrupt):
        stops._handle(signal.SIGINT, None)


SUMMARY_GATE = """
import os
import time
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    # the summary's first hook: tell the test, then wait (bounded) for its word to go on
    here = Path(__file__).parent
    (here / "in-summary").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (here / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
"""
"""A conftest that holds the session in its terminal summary until the test says go: the
signal arrives there for sure, after every report was written."""


@pytest.mark.parametrize(
    ("signum", "min_tok_s", "status", "code"),
    [
        (signal.SIGTERM, 1, "passed", pytest.ExitCode.OK),
        (signal.SIGINT, 10_000_000, "failed", pytest.ExitCode.TESTS_FAILED),
    ],
    ids=["SIGTERM-passed", "SIGINT-failed"],
)
def test_a_signal_during_the_summary_ends_quietly_as_the_reports_say(
    pytester: pytest.Pytester, signum: signal.Signals, min_tok_s: int, status: str, code: int
) -> None:
    where = pytester.path
    (where / "conftest.py").write_text(SUMMARY_GATE)
    (where / "test_suite.py").write_text(
        "from pytest_kimi import throughput\n\n"
        f"@throughput(concurrency=1, max_tokens=16, trials=1, warmup=0, requests=2,"
        f" min_tok_s={min_tok_s})\n"
        "def test_one():\n    pass\n"
    )
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
            f"--perf-markdown={where / 'perf.md'}",
        ],
        cwd=where,
        env={**os.environ, "PYTEST_ADDOPTS": INNER_ADDOPTS},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        poll_until(lambda: (where / "in-summary").exists(), "the session in its summary")
        # the reports are written before the summary (the reporter's session finish)
        assert json.loads((where / "perf.json").read_text())["status"] == status
        os.kill(proc.pid, signum)
        head = read_until(proc, "after the tests ended")  # the one-line notice
        (where / "go").write_text("")
        rest, _ = proc.communicate(timeout=SESSION_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = head + rest
    for text in ("Traceback", "KeyboardInterrupt", "INTERRUPTED"):
        assert text not in out, out[-3000:]
    assert proc.returncode == code, out[-3000:]  # what the reports say
    assert "pytest-kimi throughput" in out and f"test_suite.py::test_one [{status}]" in out
    report = json.loads((where / "perf.json").read_text())
    assert report["status"] == status and not report.get("interrupted")
    assert (
        (where / "perf.md").read_text().startswith(f"## pytest-kimi throughput: {status.upper()}\n")
    )
