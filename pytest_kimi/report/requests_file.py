"""``--perf-requests FILE``: one JSON line per request the measurement sent.

Why.  The JSON report's figures are per level and per trial (``trial_windows``); a third party
reconciling them with a server's own log, or computing a figure the plugin does not report,
needs every request: when it was sent, its first token and its end on the client's monotonic
clock, its token counts as the server reported them, its status and error.  vLLM's
``--save-detailed`` and GuideLLM's per-request output give the same; this is ours.

How it is written, and why so:

- **As levels finish.**  A level's lines are appended once the level is final (its trials
  judged, replaced trials included), before the next level starts: a run stopped by Ctrl-C,
  SIGTERM or a crash keeps the lines of every level it finished.  Nothing is written inside a
  trial, so the load's hot path never pays for it.
- **Whole lines.**  A level's lines go to the file in one ``write`` on a file opened for
  appending, under a lock, each ending in a newline: a reader that drops an unterminated last
  line never sees half a request.
- **Through xdist.**  Workers measure, so they write: each appends under one lock file
  (``<rootdir>/.kimi/requests.lock``), so two processes never interleave their writes (perf
  tests run one at a time under xdist anyway: :mod:`pytest_kimi.plugin.xdist`; the lock holds
  where that grouping does not).  The controller (or the single process) empties the file when
  the session starts, so it holds this run's requests only.
- **No secrets.**  Request bodies, prompts and answers are not written; an error text is
  scrubbed (:func:`pytest_kimi.scrub.scrub_text`) as every report's is.
- **Never costs the measurement.**  A write that fails (a full disk) adds a note to the level,
  which rides on its JSON; the session's end reports it as a failed sink
  (:func:`problems_in`).

No pytest here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kimi.files import write_atomic
from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.results import LevelResult
from pytest_kimi.measure.windows import TrialWindow
from pytest_kimi.scrub import scrub_text
from pytest_kimi.wire import TestEntry

LOCK_NAME = "requests.lock"
"""The lock file's name in ``<rootdir>/.kimi/``, beside the measurement's own lock."""
NOTE = "note: --perf-requests"
"""Begins the note a level gets when its lines could not be written."""


def start(path: Path) -> None:
    """Empty ``path`` at the start of a session (the controller's, once): the file then holds
    this run's requests only.  Replaced by a rename, as the other reports are, so the checks
    of :mod:`pytest_kimi.run.output_paths` are what it needs."""
    write_atomic(path, b"", fsync=False)


def request_line(
    rec: RequestRecord,
    window: TrialWindow,
    level: LevelResult,
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """One request's object: the test and level it belongs to, then what the client saw.

    Times are ``time.perf_counter()`` seconds (wall seconds, on the clock of the trial's
    ``start_monotonic``/``end_monotonic``); ``unix_offset`` converts them to Unix time.  They
    are not converted to the simulator's clock: multiply a difference by the test's
    ``server_clock.speed`` for the server's seconds, as the level's latencies are.
    """
    out: dict[str, Any] = {
        **context,
        "level": level.label,
        "trial": window.trial,
        "kept": window.kept,
        "request": rec.index,
        "worker": rec.worker,
        "scheduled": rec.scheduled,
        "sent": rec.sent or None,
        "first_token": rec.first_token,
        "last_token": rec.last_token,
        "end": rec.end or None,
        "unix_offset": window.unix_offset,
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "tokens_approx": rec.tokens_approx,
        "max_tokens": rec.max_tokens or level.max_tokens,
        "events": rec.events,
        "reads": len(rec.chunk_times),
        "status": rec.status,
        "ok": rec.ok,
        "error": None if rec.error is None else scrub_text(rec.error),
        "finish_reason": rec.finish_reason,
        "cut": rec.cut,
    }
    if rec.turn:
        out["turn"] = rec.turn
    if rec.reasoning_tokens:
        out["reasoning_tokens"] = rec.reasoning_tokens
    return out


class RequestsFile:
    """The session's ``--perf-requests`` file: appends whole lines under the lock."""

    def __init__(self, path: Path, lock_dir: Path) -> None:
        self.path = path
        self.lock_path = lock_dir / LOCK_NAME

    def append(self, lines: Sequence[str]) -> None:
        """Append ``lines`` (each without its newline) in one write, under the lock."""
        if not lines:
            return
        from filelock import FileLock  # filelock, not fcntl: the plugin imports on Windows too

        data = ("\n".join(lines) + "\n").encode("utf-8")
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.lock_path)):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)

    def for_test(
        self, nodeid: str, *, profile: str | None = None, perf_session: int | None = None
    ) -> TestRequests:
        """The level sink of one test (``MeasureSpec.level_done``)."""
        context: dict[str, Any] = {"nodeid": nodeid}
        if profile is not None:
            context["profile"] = profile
        if perf_session is not None:
            context["perf_session"] = perf_session
        return TestRequests(self, context)


class TestRequests:
    """Writes one test's levels as they finish, each trial once.

    A ``@capacity`` top-up hands over the merged level again, its first measurement's trials
    already written: trials are remembered by identity for this test's lifetime (the results
    hold them alive, so an identity is never reused meanwhile)."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, file: RequestsFile, context: Mapping[str, Any]) -> None:
        self._file = file
        self._context = dict(context)
        self._written: dict[int, object] = {}
        self._failed = False

    def __call__(self, level: LevelResult) -> None:
        new = [
            w
            for w in level.trial_windows
            if w.result is not None and id(w.result) not in self._written
        ]
        try:
            lines = [
                json.dumps(request_line(rec, w, level, self._context), separators=(",", ":"))
                for w in new
                for rec in _records(w)
            ]
            self._file.append(lines)
        except Exception as exc:  # a failing sink never costs the measurement
            if not self._failed:
                self._failed = True
                level.errors.append(
                    scrub_text(
                        f"{NOTE} {self._file.path}: the requests of {level.label} were not "
                        f"written: {type(exc).__name__}: {exc}"
                    )
                )
            return
        for w in new:
            self._written[id(w.result)] = w.result


def _records(window: TrialWindow) -> Iterable[RequestRecord]:
    return window.result.records if window.result is not None else ()


def problems_in(tests: Iterable[TestEntry]) -> list[str]:
    """The failed writes the run's levels noted (also a worker's, on its test's record): one
    line each for the summary, which then fails the run like any failed sink."""
    found: list[str] = []
    for test in tests:
        for level in test.get("levels") or ():
            for error in level.get("errors") or ():
                if isinstance(error, str) and error.startswith(NOTE):
                    text = error.removeprefix("note: ")
                    if text not in found:
                        found.append(text)
    return found
