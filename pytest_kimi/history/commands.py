"""``kimi-perf history changes|noise|runs`` and ``kimi-perf dashboard``: the history, read.

Registered into ``kimi-perf``'s parser by :func:`add_commands`.  Every command opens the
history named by ``--history`` (default: ``$KIMI_PERF_HISTORY``, else the SQLite file the
plugin writes by default, ``./.kimi/history.db``), reads it and closes it.  A history that is
not there yet is an error, not an empty database created by a command that only reads.

Exit codes: 0 when the command could say what it was asked (``changes`` reports change points,
it does not judge them: failing a build is the gate's job, and a change point in a series of
last month would fail every later run), 2 with one ``kimi-perf: error:`` line when it could
not (no history, a malformed URL, a database that does not answer, Otava missing).

Heavy imports (SQLAlchemy, numpy, scipy, Otava) happen inside the commands, so ``kimi-perf``
itself starts without them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.printable import printable
from pytest_kimi.errors import CliError
from pytest_kimi.history.changes import DEFAULT_MAX_PVALUE, DEFAULT_MIN_MAGNITUDE

if TYPE_CHECKING:
    from pytest_kimi.history.changes import Change
    from pytest_kimi.history.model import LevelSeries
    from pytest_kimi.history.store import HistoryStore

__all__ = ["ENV", "add_commands", "cmd_changes", "cmd_dashboard", "cmd_noise", "cmd_runs"]

ENV = "KIMI_PERF_HISTORY"
"""The environment variable the plugin's ``--perf-history`` reads too."""

EXIT_OK = 0


def say(*values: object, sep: str = " ", file: Any = None) -> None:
    """``print`` with control characters escaped (test ids and server strings from the
    history are a server's text: never an escape sequence on the terminal)."""
    print(printable(sep.join(str(v) for v in values), None, lines=True), file=file)


# ----------------------------------------------------------------------------- the store


def history_url(value: str | None, base: Path | None = None) -> str:
    """The URL to read: ``value``, else ``$KIMI_PERF_HISTORY``, else the default SQLite file
    under ``base`` (the working directory); relative SQLite paths resolved against ``base``."""
    from pytest_kimi.history.urls import HistoryError, resolve_history_url

    where = Path.cwd() if base is None else base
    given = value if value is not None else (os.environ.get(ENV) or None)
    try:
        url = resolve_history_url(given, where)
    except HistoryError as exc:
        raise CliError(str(exc)) from None
    if url is None:
        source = "--history" if value is not None else ENV
        raise CliError(f"the history is off ({source}={given}): there is nothing to read")
    return url


@contextmanager
def opened(value: str | None, base: Path | None = None) -> Iterator[HistoryStore]:
    """The history, open, for the length of a command; every store error is one CLI line."""
    from pytest_kimi.history.urls import HistoryError, display_url, sqlite_path

    where = Path.cwd() if base is None else base
    url = history_url(value, where)
    path = sqlite_path(url)
    if path and not Path(path).exists():
        raise CliError(
            f"no history at {display_url(url, where)} yet: pytest records every run that "
            f"measured something there (--perf-history URL, env {ENV}); pass --history URL "
            "to read another"
        )
    try:
        from pytest_kimi.history.store import open_history
    except ModuleNotFoundError as exc:
        raise CliError(
            f"reading the history needs {exc.name} (pip install pytest-kimi brings it)"
        ) from None
    try:
        store = open_history(url)
    except HistoryError as exc:
        raise CliError(str(exc)) from None
    try:
        yield store
    except HistoryError as exc:
        raise CliError(str(exc)) from None
    finally:
        store.close()


def _series(store: HistoryStore, test: str | None) -> list[LevelSeries]:
    series = store.series()
    if test:
        series = [s for s in series if test in s.test]
    return series


def _find_changes(series: Sequence[LevelSeries], ns: argparse.Namespace) -> list[Change]:
    from pytest_kimi.history.changes import ChangePointsUnavailable, find_changes

    try:
        return find_changes(series, max_pvalue=ns.max_pvalue, min_magnitude=ns.min_magnitude)
    except (ChangePointsUnavailable, ValueError) as exc:
        raise CliError(str(exc)) from None


# ---------------------------------------------------------------------------- commands


def cmd_changes(ns: argparse.Namespace) -> int:
    with opened(ns.history) as store:
        series = _series(store, ns.test)
        runs = len(store.runs())
        shown = store.shown
    found = _find_changes(series, ns)
    if ns.json:
        say(json.dumps([c.to_dict() for c in found], indent=2))
        return EXIT_OK
    say(
        f"change points in {shown}: {runs} run{'s' if runs != 1 else ''}, "
        f"{len(series)} series{' matching ' + repr(ns.test) if ns.test else ''} "
        f"(Otava e-divisive means, p < {ns.max_pvalue:g}, steps over {ns.min_magnitude:.0%})"
    )
    previous: Change | None = None
    for change in found:
        say()
        for line in change.describe():
            say(line)
        if (
            previous is not None
            and previous.series == change.series
            and (previous.change_pct < 0) == (change.change_pct < 0)
        ):
            total = (change.after_tok_s / previous.before_tok_s - 1.0) * 100.0
            say(
                f"  with the change from run {previous.run} before it, the same way: "
                f"{total:+.1f}% in all (a drift reads as steps)"
            )
        previous = change
    say()
    with_changes = len({c.series for c in found})
    say(
        f"{len(found)} change point{'s' if len(found) != 1 else ''} in {with_changes} of "
        f"{len(series)} series"
    )
    return EXIT_OK


def cmd_noise(ns: argparse.Namespace) -> int:
    from pytest_kimi.history.changes import ChangePointsUnavailable
    from pytest_kimi.history.noise import estimate_noise

    with opened(ns.history) as store:
        series = _series(store, ns.test)
        shown = store.shown
    try:
        report = estimate_noise(
            series,
            confidence=ns.confidence,
            current=ns.session_sigma,
            max_pvalue=ns.max_pvalue,
            min_magnitude=ns.min_magnitude,
        )
    except (ChangePointsUnavailable, ValueError) as exc:
        raise CliError(str(exc)) from None
    if ns.json:
        say(json.dumps(report.to_dict(), indent=2))
        return EXIT_OK
    say(
        f"session noise in {shown}: sessions of unchanged builds (equal provenance but for "
        "seeds, ports, commits and times; no change point between them)"
    )
    for line in report.describe():
        say(line)
    return EXIT_OK


def cmd_runs(ns: argparse.Namespace) -> int:
    with opened(ns.history) as store:
        runs = store.runs()
    if ns.json:
        say(
            json.dumps(
                [
                    {
                        "id": r.id,
                        "time": r.time.isoformat(),
                        "commit": r.commit,
                        "branch": r.branch,
                        "deployment": r.deployment,
                        "plugin_version": r.plugin_version,
                        "ci_url": r.ci_url,
                    }
                    for r in runs
                ],
                indent=2,
            )
        )
        return EXIT_OK
    for r in runs:
        parts = [f"{r.id:>5}", r.time.strftime("%Y-%m-%d %H:%M:%S UTC")]
        parts.append(r.deployment or "-")
        parts.append(r.commit or "-")
        if r.branch:
            parts.append(r.branch)
        if r.ci_url:
            parts.append(r.ci_url)
        say("  ".join(parts))
    say(f"{len(runs)} run{'s' if len(runs) != 1 else ''}")
    return EXIT_OK


def cmd_dashboard(ns: argparse.Namespace) -> int:
    from pytest_kimi.history.changes import ChangePointsUnavailable, find_changes
    from pytest_kimi.history.dashboard import write_dashboard

    with opened(ns.history) as store:
        series = _series(store, ns.test)
        runs = {r.id: store.run_details(r.id) for r in store.runs()}
    try:
        found = find_changes(series, max_pvalue=ns.max_pvalue, min_magnitude=ns.min_magnitude)
    except ChangePointsUnavailable as exc:
        say(f"{exc}; the dashboard is drawn without them", file=sys.stderr)
        found = []
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        index = write_dashboard(series, found, Path(ns.out), runs)
    except OSError as exc:
        raise CliError(f"{ns.out}: cannot write: {exc}") from None
    say(f"wrote {index}")
    return EXIT_OK


# ------------------------------------------------------------------------------ parser


def _common(p: argparse.ArgumentParser, *, detector: bool = True, test: bool = True) -> None:
    p.add_argument(
        "--history",
        metavar="URL",
        default=None,
        help=f"the history database (default: ${ENV}, else sqlite:///.kimi/history.db "
        "under the working directory, where pytest writes it)",
    )
    if test:
        p.add_argument(
            "--test", metavar="SUBSTR", default=None, help="only tests whose name contains SUBSTR"
        )
    if detector:
        p.add_argument(
            "--max-pvalue",
            type=float,
            default=DEFAULT_MAX_PVALUE,
            metavar="P",
            help=f"change-point significance threshold (default {DEFAULT_MAX_PVALUE:g})",
        )
        p.add_argument(
            "--min-magnitude",
            type=float,
            default=DEFAULT_MIN_MAGNITUDE,
            metavar="X",
            help=f"smallest step named a change, as a fraction (default {DEFAULT_MIN_MAGNITUDE:g})",
        )


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    """Register ``history`` (``changes``, ``noise``, ``runs``) and ``dashboard``."""
    history = sub.add_parser(
        "history",
        help="the run history: change points, session noise, stored runs",
        description="Read the history every pytest run is recorded in (--perf-history).",
    )
    hsub = history.add_subparsers(dest="history_command", metavar="SUBCOMMAND", required=True)

    p = hsub.add_parser(
        "changes",
        help="change points of every test level's tok/s across runs",
        description="Find the runs after which a test level's throughput changed (Apache "
        "Otava's e-divisive means with a t-test), with the throughput before and after, the "
        "step's 90% interval and the provenance that changed across it.  A slow drift shows "
        "as one or a few steps.  Exit status 0 whatever is found: this reports, it does not "
        "gate (2 on an error).",
    )
    _common(p)
    p.add_argument("--json", action="store_true", help="a JSON list of change points")
    p.set_defaults(func=cmd_changes)

    p = hsub.add_parser(
        "noise",
        help="session-to-session noise from runs of unchanged builds, and the "
        "--perf-session-sigma to use",
        description="Estimate the session noise (the sd of the log ratio of two sessions, "
        "what --perf-session-sigma takes) per test level and pooled, with an interval, from "
        "runs whose provenance is equal apart from seeds, ports, commits and times and "
        "between which no change point was found.  Exit status 0 (2 on an error).",
    )
    _common(p)
    p.add_argument(
        "--confidence",
        type=float,
        default=0.90,
        metavar="C",
        help="two-sided confidence of the intervals (default 0.9)",
    )
    p.add_argument(
        "--session-sigma",
        type=float,
        default=None,
        metavar="X",
        help="the --perf-session-sigma in use, to say whether it is inside the interval",
    )
    p.add_argument("--json", action="store_true", help="the estimates as JSON")
    p.set_defaults(func=cmd_noise)

    p = hsub.add_parser("runs", help="list the stored runs")
    _common(p, detector=False, test=False)
    p.add_argument("--json", action="store_true", help="a JSON list of runs")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser(
        "dashboard",
        help="write the history dashboard: every level's tok/s over runs, change points marked",
        description="Write a static HTML dashboard of the history (index.html and a page per "
        "run) and print the path of index.html.",
    )
    _common(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.set_defaults(func=cmd_dashboard)
