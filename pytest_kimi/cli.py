"""``kimi-perf``: the offline side of pytest-kimi, for the moments no test session is running.

* ``sim``        run the simulator in the foreground (to develop a suite without GPUs);
* ``baselines``  what the stored targets are, and who recorded them when (review aid);
* ``compare``    the regression statistics between two saved ``--perf-json`` reports, e.g. a
                 run from before and after a deploy whose baselines were never recorded, or
                 two deployments measured on different days;
* ``plot``       the HTML page and SVG figures of a saved report;
* ``history``    the run history pytest records (``--perf-history``): ``changes`` (the runs
                 after which a level's throughput moved, with what changed across them: a
                 slow drift that passed every gate shows here), ``noise`` (session-to-session
                 noise from runs of unchanged builds, and the ``--perf-session-sigma`` to
                 use), ``runs`` (what is stored);
* ``dashboard``  a static HTML dashboard of the history, change points marked.

Exit codes: 0 fine, 1 the answer is "bad" (a regression; a corrupt baseline file), 2 the
command could not do its job (missing or malformed input, bad option, missing extra, no
history, a database that does not answer).  ``history changes`` reports and exits 0 whatever
it finds: failing builds is the gate's job.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, cast

from pytest_kimi.errors import CliError
from pytest_kimi.printable import printable
from pytest_kimi.verdicts import Verdict
from pytest_kimi.measure.results import level_key
from pytest_kimi.report.markdown import test_title
from pytest_kimi.wire import LevelEntry, NoiseEstimateEntry, Report, ShiftEntry, TestEntry

EXIT_OK = 0
EXIT_BAD = 1
EXIT_ERROR = 2

PROG = "kimi-perf"


def say(*values: object, sep: str = " ", file: Any = None) -> None:
    """``print``, with every control character a report or baseline carries escaped: a test
    id, a model id or an error body written by a server reaches the terminal as text, never
    as an escape sequence that clears the screen or forges a line (newlines are kept)."""
    print(printable(sep.join(str(v) for v in values), None, lines=True), file=file)


# ----------------------------------------------------------------------------------- reports


def load_report(path: Path) -> Report:
    """Read a ``--perf-json`` report, or raise :class:`CliError` saying what is wrong with it."""
    from pytest_kimi.report.json_report import SCHEMA_VERSION

    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, expected a --perf-json report") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read: {exc}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("tests"), list)
        or "schema" not in data
    ):
        raise CliError(
            f"{path}: not a pytest-kimi report (expected an object with 'schema' and a "
            "'tests' list, as written by --perf-json)"
        )
    if data["schema"] != SCHEMA_VERSION:
        raise CliError(
            f"{path}: report schema {data['schema']!r}; this kimi-perf reads schema "
            f"{SCHEMA_VERSION}"
        )
    for i, test in enumerate(data["tests"]):
        if (
            not isinstance(test, dict)
            or not isinstance(test.get("nodeid"), str)
            or not isinstance(test.get("levels", []), list)
        ):
            raise CliError(
                f"{path}: tests[{i}] is not a test entry (needs a 'nodeid' and a 'levels' list)"
            )
        for j, level in enumerate(test.get("levels", [])):
            if not isinstance(level, dict) or (
                level.get("concurrency") is None and level.get("rate") is None
            ):
                raise CliError(f"{path}: tests[{i}].levels[{j}] has no 'concurrency' or 'rate'")
    # parsed JSON: the shape the plugin writes, checked above as far as every reader needs it
    return cast(Report, data)


# ----------------------------------------------------------------------------------- compare


def level_match_key(test: TestEntry, level: LevelEntry) -> tuple[tuple[str, str], ...]:
    """Identity of a level across reports: its test's workload, its own max_tokens and
    concurrency, and its deployment profile when it has one.

    Same rule as the baseline store: a level at another concurrency or output length is never
    a stand-in, however close.  Values are compared as JSON text so ``8`` and ``8.0`` match.
    """
    key = level_key(level, test.get("workload") or {})
    profile = level.get("profile")
    if profile is not None:
        key["profile"] = profile

    def canon(v: Any) -> str:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return repr(float(v))
        return json.dumps(v, sort_keys=True)

    return tuple(sorted((k, canon(v)) for k, v in key.items()))


def _samples(level: LevelEntry) -> list[float]:
    values = level.get("trials_tok_s") or []
    out = []
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            out.append(float(v))
    return out


@dataclass(slots=True)
class Comparison:
    """The offline comparison, shaped as a report so every renderer can show it."""

    report: Report
    regressions: list[str] = field(default_factory=list)
    """``nodeid C=N`` of every regressed level."""
    only_old: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    """Tests or levels present in only one of the reports."""


def compare_reports(
    old: Report,
    new: Report,
    *,
    tolerance: float,
    alpha: float,
    session_sigma: float,
    old_name: str = "OLD",
    new_name: str = "NEW",
    detectable_drop: float | None = None,
) -> Comparison:
    """Compare every level of ``new`` with the same level of ``old``.

    ``old`` plays the baseline: its ``trials_tok_s`` are the baseline samples.  Holm runs over
    the compared levels of each test, as in a live run.  The result is a report dict: NEW's
    levels with the baseline fields and verdict replaced by this comparison, so ``render_*``
    and the terminal table need no special case.
    """
    from pytest_kimi.gate import family_verdicts, two_sample
    from pytest_kimi.gate.policy import compared_level, shift_record
    from pytest_kimi.report.json_report import SCHEMA_VERSION, run_status
    from pytest_kimi.baseline import Provenance, provenance_diff

    drop = two_sample.DEFAULT_DETECTABLE_DROP if detectable_drop is None else detectable_drop
    old_ep, new_ep = old.get("endpoint") or {}, new.get("endpoint") or {}
    changes = [
        str(c)
        for c in provenance_diff(
            Provenance(
                model=old_ep.get("model"),
                server_info=old_ep.get("server_info") or {},
                plugin_version=old.get("plugin_version"),
            ),
            Provenance(
                model=new_ep.get("model"),
                server_info=new_ep.get("server_info") or {},
                plugin_version=new.get("plugin_version"),
            ),
        )
    ]
    old_tests = {test_title(t): t for t in old.get("tests", [])}
    new_ids = {test_title(t) for t in new.get("tests", [])}
    regressions: list[str] = []
    only_old: list[str] = []
    only_new: list[str] = []
    out_tests: list[TestEntry] = []
    for test in new.get("tests", []):
        nodeid = test_title(test)
        before = old_tests.get(nodeid)
        if before is None:
            only_new.append(nodeid)
            continue
        old_levels = {level_match_key(before, lv): lv for lv in before.get("levels", [])}
        levels: list[LevelEntry] = []
        pending: list[tuple[int, list[float], list[float]]] = []
        seen: set[tuple[tuple[str, str], ...]] = set()
        for lv in test.get("levels", []):
            key = level_match_key(test, lv)
            seen.add(key)
            row = _without_comparison(lv)
            levels.append(row)
            match = old_levels.get(key)
            label = _label(lv, test)
            if match is None:
                row["verdict"] = Verdict.NO_BASELINE.value
                row["reasons"].append(f"no level with this workload in {old_name}")
                only_new.append(f"{nodeid} {label}")
                continue
            bad = next(
                (
                    f"{name} level is {side.get('verdict')}"
                    for name, side in ((old_name, match), (new_name, lv))
                    if not _comparable(side.get("verdict"))
                ),
                None,
            )
            base, cur = _samples(match), _samples(lv)
            if bad is None and (not base or not cur):
                bad = f"{old_name if not base else new_name} level has no trial samples"
            if bad is not None:
                row["verdict"] = Verdict.NOT_RUN.value
                row["reasons"].append(f"not compared: {bad}")
                continue
            pending.append((len(levels) - 1, base, cur))
        for key, lv in old_levels.items():
            if key not in seen:
                only_old.append(f"{nodeid} {_label(lv, test)}")
        shift: ShiftEntry | None = None
        if pending:
            family = family_verdicts.compare_family(
                [(b, c) for _, b, c in pending],
                tolerance=tolerance,
                alpha=alpha,
                session_sigma=session_sigma,
                detectable_drop=drop,
            )
            if family.shift is not None:
                shift = shift_record(family.shift, tolerance, changes)
            for (i, base, _), cmp in zip(pending, family.levels):
                # the gate's own fields and notes, so a compared level reads as a gated one
                fields, note = compared_level(
                    cmp, base, tolerance=tolerance, alpha=alpha, changes=changes
                )
                row = levels[i] = {**levels[i], **fields.to_dict(), "verdict": cmp.verdict.value}
                if note:
                    row["reasons"].append(note)
                if row["verdict"] == Verdict.REGRESSION:
                    regressions.append(f"{nodeid} {_label(row, test)}")
                elif row["verdict"] == Verdict.INCONCLUSIVE:  # beyond the tolerance: not green
                    regressions.append(f"{nodeid} {_label(row, test)} (inconclusive)")
        judged = (Verdict.REGRESSION.value, Verdict.INCONCLUSIVE.value)
        regressed = any(r["verdict"] in judged for r in levels) or (
            shift is not None and shift["verdict"] in judged
        )
        out = test.copy()
        # the comparison's own, or none: no baseline file or profile, no A/B
        out.pop("baseline_note", None)
        out.pop("compared_with", None)
        out.pop("shift", None)
        out.pop("baseline_profile", None)
        out.pop("baseline_file", None)
        if shift is not None:
            out["shift"] = shift
        out["levels"] = levels
        out["outcome"] = "failed" if regressed else "passed"
        # provenance changes are one list for the whole comparison: said once, in the notes
        out["provenance_changes"] = []
        missing = [_label(lv, test) for k, lv in old_levels.items() if k not in seen]
        if missing:
            out["baseline_note"] = f"levels only in {old_name}: " + ", ".join(missing)
        out_tests.append(out)
    only_old[:0] = [t for t in old_tests if t not in new_ids]
    notes = [
        f"Offline comparison: {new_name} against {old_name} as the baseline "
        f"(tolerance {tolerance * 100:g}%, alpha {alpha:g}, session sigma {session_sigma:g}, "
        f"detectable drop {drop * 100:g}%)."
    ]
    if changes:
        notes.append("changed between the reports: " + "; ".join(changes))
    only_old_tests = [t for t in old_tests if t not in new_ids]
    only_new_tests = [
        n for n in (test_title(t) for t in new.get("tests", [])) if n not in old_tests
    ]
    if only_old_tests:
        notes.append(f"tests only in {old_name}: " + ", ".join(only_old_tests))
    if only_new_tests:
        notes.append(f"tests only in {new_name}: " + ", ".join(only_new_tests))
    report: Report = {
        "schema": new.get("schema", SCHEMA_VERSION),
        "plugin_version": new.get("plugin_version") or "",
        "status": run_status(out_tests),
        "endpoint": new_ep,
        "title": "kimi-perf compare",
        "notes": notes,
        "tests": out_tests,
    }
    return Comparison(report, regressions, only_old, only_new)


def _without_comparison(level: LevelEntry) -> LevelEntry:
    """NEW's level without its own comparison with a baseline (this one replaces it): the
    headline fields null, the rest absent, no reasons, its errors kept."""
    row = level.copy()
    row.pop("baseline_trials_tok_s", None)
    row.pop("min_detectable_drop_pct", None)
    row.pop("tolerance_pct", None)
    row["baseline_tok_s"] = None
    row["baseline_trials"] = None
    row["change_pct"] = None
    row["ci90"] = None
    row["p_value"] = None
    row["reasons"] = []
    row["errors"] = list(level.get("errors") or [])
    return row


def _label(level: LevelEntry, test: TestEntry | None = None) -> str:
    """``C=8``, with the level's deployment unless the test entry already names it."""
    label = level.get("label") or f"C={level.get('concurrency')}"
    profile = level.get("profile")
    if profile is None or (test is not None and test.get("profile") == profile):
        return label
    return f"{profile} {label}"


def _comparable(verdict: Any) -> bool:
    """A saved level's verdict lets it be compared: an unknown word (a newer or foreign
    report) does not stop the comparison, the missing samples check catches a useless one."""
    known = Verdict.of(verdict)
    return known is None or known.comparable


def _print_comparison(cmp: Comparison, old_path: Path, new_path: Path) -> None:
    from pytest_kimi.report.terminal import COLUMNS, format_table

    base = dict(COLUMNS)
    columns = [
        ("level", base["level"]),
        ("baseline", base["baseline"]),
        ("tok/s", base["tok/s"]),
        ("change (90% CI)", base["change (90% CI)"]),
        ("p", base["p"]),
        ("trials", base["trials"]),
        ("base trials", lambda lv: str(lv.get("baseline_trials") or "-")),
        ("verdict", base["verdict"]),
    ]
    if any(lv.get("profile") is not None for t in cmp.report["tests"] for lv in t["levels"]):
        columns.insert(0, ("profile", lambda lv: str(lv.get("profile") or "-")))
    say(f"{PROG} compare: {new_path} against {old_path} (baseline)")
    for note in cmp.report["notes"][1:]:
        say(f"  {note}")
    for test in cmp.report["tests"]:
        say()
        say(f"{test_title(test)} [{'REGRESSION' if test['outcome'] == 'failed' else 'ok'}]")
        for line in format_table(test["levels"], columns):
            say("  " + line)
        if test.get("baseline_note"):
            say("  " + test["baseline_note"])
    for item in cmp.only_old:
        say(f"only in {old_path}: {item}")
    for item in cmp.only_new:
        say(f"only in {new_path}: {item}")
    say()
    if cmp.regressions:
        say(
            f"{len(cmp.regressions)} regression{'s' if len(cmp.regressions) != 1 else ''}: "
            + ", ".join(cmp.regressions)
        )
    else:
        say("no regressions")


def cmd_compare(ns: argparse.Namespace) -> int:
    old, new = load_report(Path(ns.old)), load_report(Path(ns.new))
    try:
        cmp = compare_reports(
            old,
            new,
            tolerance=ns.tolerance,
            alpha=ns.alpha,
            session_sigma=ns.session_sigma,
            detectable_drop=ns.detectable_drop,
            old_name=Path(ns.old).name,
            new_name=Path(ns.new).name,
        )
    except ValueError as exc:  # bad tolerance / alpha / sigma, from stats
        raise CliError(str(exc)) from None
    _print_comparison(cmp, Path(ns.old), Path(ns.new))
    if ns.markdown:
        from pytest_kimi.report.markdown import render_markdown

        path = Path(ns.markdown)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render_markdown(cmp.report), encoding="utf-8")
        except OSError as exc:
            raise CliError(f"{path}: cannot write: {exc}") from None
        say(f"markdown: {path}")
    return EXIT_BAD if cmp.regressions else EXIT_OK


# --------------------------------------------------------------------------------- baselines


def _profiles(root: Path, only: str | None) -> list[str]:
    if only is not None:
        return [only]
    from pytest_kimi.baseline import profile_names

    return profile_names(root)


def cmd_baselines(ns: argparse.Namespace) -> int:
    from pytest_kimi.baseline import BaselineError, BaselineStore, loads

    root = Path(ns.dir)
    if not root.is_dir():
        raise CliError(
            f"{root}: no such baseline directory (record some with "
            "pytest --update-baselines, or pass the directory)"
        )
    try:
        stores = [BaselineStore(root, name) for name in _profiles(root, ns.profile)]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    shown = broken = 0
    for store in stores:
        if not store.directory.is_dir():
            say(f"[{store.profile}] no baselines in {store.directory}")
            continue
        # Read file by file (not iter_all) so one corrupt file does not hide the others.
        for path in store.paths():
            try:
                text = store.read_text(path)  # a regular file under the root, bounded
                baseline = loads(text, source=path)
                if baseline.profile != store.profile:
                    raise BaselineError(
                        path,
                        f"profile is {baseline.profile!r} but the file is "
                        f"in profile {store.profile!r}",
                    )
            except BaselineError as exc:
                say(f"error: {exc}", file=sys.stderr)
                broken += 1
                continue
            shown += 1
            say(f"[{baseline.profile}] {baseline.test}  ({path})")
            prov = baseline.provenance
            say(
                f"  model {prov.model or '?'}, recorded {prov.recorded_at or '?'}, "
                f"commit {(prov.git_commit or '?')[:12]}, plugin {prov.plugin_version or '?'}"
            )
            workloads = [lv.workload for lv in baseline.levels]
            varying = sorted(
                {
                    k
                    for w in workloads
                    for k in w.keys()
                    if len({json.dumps(x.get(k), default=str) for x in workloads}) > 1
                }
            )
            labels = [lv.workload.label(varying) for lv in baseline.levels]
            width = max((len(lb) for lb in labels), default=0)
            for label, lv in zip(labels, baseline.levels):
                n = len(lv.trials_tok_s)
                say(
                    f"  {label.ljust(width)}  {lv.tok_s:>10.1f} tok/s  {n} trial{'s' if n != 1 else ''}"
                )
            if baseline.capacity is not None:  # a @capacity test's record
                say(f"  capacity {baseline.capacity.text()}")
    say(
        f"{shown} baseline file{'s' if shown != 1 else ''} in {root}"
        + (f", {broken} unreadable" if broken else "")
    )
    return EXIT_BAD if broken else EXIT_OK


# --------------------------------------------------------------------------------- calibrate


def cmd_calibrate(ns: argparse.Namespace) -> int:
    """An A/A experiment's verdict on the gate: per level and pooled, the session noise and
    what it lets a stored baseline and the paired comparison vouch for
    (:mod:`pytest_kimi.gate.calibration`).  From a saved ``--perf-sessions`` report, or run
    here: ``kimi-perf calibrate --sessions 5 -- <pytest arguments>``."""
    import subprocess
    import tempfile

    from pytest_kimi.gate.calibration import calibrate
    from pytest_kimi.gate.session_noise import NoiseEstimate

    extra = list(ns.pytest_args)
    if ns.report is not None and (ns.sessions or extra):
        raise CliError("give a REPORT.json or --sessions N with pytest arguments, not both")
    if ns.report is None:
        if not ns.sessions or ns.sessions < 2:
            raise CliError("give a --perf-sessions report, or --sessions N (2 or more) to run one")
        with tempfile.TemporaryDirectory(prefix="kimi-calibrate-") as tmp:
            path = Path(tmp) / "calibrate.json"
            command = [
                sys.executable,
                "-m",
                "pytest",
                "-m",
                "perf",
                f"--perf-sessions={ns.sessions}",
                f"--perf-json={path}",
                *extra,
            ]
            say(f"{PROG} calibrate: {' '.join(command[1:])}")
            code = subprocess.call(command)
            if not path.is_file():
                raise CliError(f"the A/A run wrote no report (pytest exit status {code})")
            report = load_report(path)
    else:
        report = load_report(Path(ns.report))
    section = report.get("session_noise")
    if not isinstance(section, dict):
        raise CliError(
            "the report has no session_noise: calibrate needs a run with --perf-sessions 2 or "
            "more (a managed --server-profile, or the simulator)"
        )
    settings = {
        "tolerance": ns.tolerance,
        "alpha": ns.alpha,
        "detectable_drop": ns.detectable_drop,
        "max_launches": ns.max_launches,
        "trials": ns.trials,
    }
    rows: list[tuple[str, NoiseEstimateEntry]] = []
    for level in section.get("levels") or []:
        if isinstance(level.get("estimate"), dict):
            where = f"{level.get('nodeid')} {level.get('label')}"
            if level.get("profile"):
                where += f" on {level['profile']}"
            rows.append((where, level["estimate"]))
    if isinstance(section.get("pooled"), dict):
        rows.append(("all levels pooled", section["pooled"]))
    if not rows:
        raise CliError("the report's session_noise has no estimate: no level ran in 2 sessions")
    say(
        f"{PROG} calibrate: tolerance {ns.tolerance:g}, alpha {ns.alpha:g}, detectable drop "
        f"{ns.detectable_drop:g}; a stored baseline of {ns.trials} trials, a paired comparison "
        f"of at most {ns.max_launches} launches"
    )
    warned = False
    out = []
    for where, data in rows:
        try:
            cal = calibrate(where, NoiseEstimate.from_dict(data), **settings)
        except (KeyError, TypeError, ValueError) as exc:
            raise CliError(f"{where}: not a session-noise estimate ({exc})") from None
        say(cal.text())
        warned = warned or bool(cal.warnings())
        out.append(cal.to_dict())
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        say(f"json: {ns.json}")
    return EXIT_BAD if warned and ns.strict else EXIT_OK


# -------------------------------------------------------------------------------------- plot


def cmd_plot(ns: argparse.Namespace) -> int:
    from pytest_kimi.report.html import write_html

    report = load_report(Path(ns.report))
    try:
        index = write_html(report, Path(ns.out))
    except OSError as exc:
        raise CliError(f"{ns.out}: cannot write: {exc}") from None
    say(f"wrote {index}")
    return EXIT_OK


# --------------------------------------------------------------------------------------- sim


def cmd_sim(argv: Sequence[str]) -> int:
    """Hand the rest of the command line to the simulator's own parser, so its flags (one per
    profile knob) and its ``--help`` never drift from what ``python -m pytest_kimi.sim`` takes."""
    from pytest_kimi.sim.__main__ import main as sim_main

    return sim_main(list(argv))


# -------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    # The same constants the plugin's options take their defaults from (tests/plugin/test_options.py).
    from pytest_kimi.baseline.paths import DEFAULT_DIRNAME
    from pytest_kimi.options import add_gate_arguments

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="pytest-kimi offline tools: simulator, baselines, report comparison, plots, "
        "the run history.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser(
        "sim",
        add_help=False,
        help="run the simulator in the foreground (flags: see 'kimi-perf sim --help')",
    )

    p = sub.add_parser("baselines", help="list stored baselines with their provenance")
    p.add_argument(
        "dir",
        nargs="?",
        default=DEFAULT_DIRNAME,
        metavar="DIR",
        help=f"baseline root directory (default: ./{DEFAULT_DIRNAME})",
    )
    p.add_argument("--profile", default=None, help="only this profile (default: all)")
    p.set_defaults(func=cmd_baselines)

    p = sub.add_parser(
        "compare",
        help="regression statistics between two --perf-json reports",
        description="Compare NEW against OLD (OLD plays the baseline). "
        "Exit 1 when any level regressed.",
    )
    p.add_argument("old", metavar="OLD.json")
    p.add_argument("new", metavar="NEW.json")
    add_gate_arguments(p)  # the plugin's --perf-tolerance etc., declared once (options.py)
    p.add_argument("--markdown", metavar="PATH", help="also write the comparison as Markdown")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "calibrate",
        help="session noise of a deployment (an A/A run) and what the gate can vouch for",
        description="Read a --perf-sessions report (or run one: --sessions N -- <pytest "
        "arguments>) and print per level the session noise, the smallest drop a stored "
        "baseline catches and vouches for, and the launches a paired comparison needs. "
        "Exit 1 with --strict when a warning was printed.",
    )
    p.add_argument("report", metavar="REPORT.json", nargs="?", default=None)
    p.add_argument("--sessions", type=int, default=0, metavar="N", help="run the A/A here")
    p.add_argument(
        "--trials", type=int, default=10, metavar="N", help="trials of a stored-baseline run"
    )
    p.add_argument("--max-launches", type=int, default=12, metavar="N", help="the paired budget")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when a warning was printed")
    add_gate_arguments(p)
    # "-- <pytest arguments>" is split off in main(): argparse would give them to REPORT.json
    p.set_defaults(func=cmd_calibrate, pytest_args=[])

    p = sub.add_parser("plot", help="write the HTML report and SVG figures of a --perf-json report")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument(
        "--out", default="perf-html", metavar="DIR", help="output directory (default: ./perf-html)"
    )
    p.set_defaults(func=cmd_plot)

    from pytest_kimi.history.commands import add_commands

    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "sim":
        return cmd_sim(args[1:])
    tail: list[str] | None = None
    if args and args[0] == "calibrate" and "--" in args:
        at = args.index("--")
        args, tail = args[:at], args[at + 1 :]
    parser = build_parser()
    ns = parser.parse_args(args)  # exits 2 with usage on bad arguments, like any CLI
    if tail is not None:
        ns.pytest_args = tail
    func: Callable[[argparse.Namespace], int] = ns.func
    try:
        return func(ns)
    except CliError as exc:
        say(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
