"""The README's dashboard screenshot, from real runs: simulator runs into a throwaway history.

    python bench/dashboard_screenshot.py [--runs 12] [--step-at 8] [--slowdown 1.15]
                                         [--drift 0.02] [--capacity]
                                         [--out docs/img/dashboard.png] [--site DIR]

``python bench/dashboard_screenshot.py`` with no arguments is the one command that makes
``docs/img/dashboard.png`` (docs/guide/history.md, *Dashboard*).

What it does, all on this machine (nothing is downloaded; the browser reads ``file://``):

1. writes a small perf suite (one stream, and 64 streams; with ``--capacity`` also a
   ``@capacity`` test, charted as its capacity with the search's bracket) into a temporary git
   checkout;
2. records its baselines against the simulator (``--update-baselines``);
3. runs it ``--runs`` times, one pytest session each, against the simulator with a session
   noise of 2% (``noise=0.02``, a new ``seed`` per run: each run is another server start), and
   from run ``--step-at`` on a server ``--slowdown`` times slower per step -- the injected
   step; with ``--drift X`` the server instead gets X slower with every run from ``--step-at``
   on (``slowdown`` (1+X)^k at the k-th run): the slow drift each gate passes step by step;
   the suite is committed before each run, so every run has its own commit;
4. stores each run's ``--perf-json`` report in a SQLite history with the plugin's own
   metadata (``RunMeta.collect``: commit, branch, provenance), stamped a day apart from a fixed
   date so the axis reads like the nightly runs a team would have (the figures are measured;
   only the dates are set);
5. finds the change points (``find_changes``), writes the dashboard (``write_dashboard``) and
   screenshots its top in headless Chromium (``tests/support/browser.py``) into ``--out``.

Every verdict drawn is the one the gate gave that run (the report's): the picture shows what the
gate says now, so regenerate it when the gate changes.

It takes a minute or two (the simulator runs 20x faster than EP8).  ``--site DIR`` keeps the
dashboard to look around in.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support/browser.py: the tests' headless Chromium helper

from support.browser import find_chromium, screenshot  # noqa: E402
from pytest_kimi.history.changes import find_changes  # noqa: E402
from pytest_kimi.history.dashboard import write_dashboard  # noqa: E402
from pytest_kimi.history.rows import RunMeta  # noqa: E402
from pytest_kimi.history.store import open_history  # noqa: E402

SUITE = '''"""A small serving suite: the dashboard screenshot's runs."""

from pytest_kimi import throughput


@throughput(concurrency=1, max_tokens=256, min_tok_s=50)
def test_single_stream():
    """One user gets at least 50 tok/s."""


@throughput(concurrency=64, max_tokens=256)
def test_batch():
    """64 users at once: judged against the recorded baseline."""
'''

CAPACITY_TEST = '''

@capacity(max_e2e_s=6.6, concurrency=(4, 128), max_tokens=128, trials=2)
def test_capacity():
    """The most streams whose p95 end-to-end latency stays within 6.6 s."""
'''

FIRST_RUN = datetime(2026, 4, 20, 2, 0, tzinfo=timezone.utc)
"""The first run's stamp: nightly runs, 02:00 UTC, a day apart."""
MAX_PNG_BYTES = 200_000


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def _pytest(suite: Path, endpoint: str, *extra: str) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "perf",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--endpoint={endpoint}",
        "--perf-history=off",  # this script stores the runs itself, with their dates
        *extra,
    ]
    result = subprocess.run(cmd, cwd=suite, capture_output=True, text=True, timeout=900)
    if result.returncode not in (0, 1):  # 1: a regression failed a test, as it should
        sys.exit(f"pytest failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr}")
    return result.returncode


def _verdict(test: dict) -> str:
    """``test_batch: pass``: a test's verdicts as the gate gave them (a capacity test's is its
    capacity's; its probes' held/broke are not verdicts)."""
    name = str(test.get("nodeid", "?")).split("::")[-1]
    capacity = test.get("capacity")
    if isinstance(capacity, dict):
        return f"{name}: capacity {capacity.get('value')} {capacity.get('verdict')}"
    return f"{name}: " + ", ".join(str(lv.get("verdict")) for lv in test.get("levels", []))


def record_runs(
    suite: Path,
    history: str,
    *,
    runs: int,
    step_at: int,
    slowdown: float,
    speed: float,
    drift: float = 0.0,
    capacity: bool = False,
) -> None:
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / ".gitignore").write_text(".kimi/\nreports/\n")
    text = SUITE
    if capacity:
        text = text.replace("import throughput", "import capacity, throughput") + CAPACITY_TEST
    (suite / "test_serving.py").write_text(text)
    _git(suite, "init", "-q", "-b", "main")
    _git(suite, "add", "-A")
    _git(suite, "commit", "-q", "-m", "suite")
    sim = f"sim:speed={speed:g},stream_interval=8,noise=0.02"
    print("recording baselines ...", flush=True)
    _pytest(suite, f"{sim},seed=1000", "--update-baselines")
    _git(suite, "add", "-A")
    _git(suite, "commit", "-q", "-m", "baselines")
    reports = suite / "reports"
    reports.mkdir(exist_ok=True)
    with open_history(history) as store:
        for i in range(1, runs + 1):
            slower = i >= step_at
            factor = (1 + drift) ** (i - step_at + 1) if drift else slowdown
            endpoint = f"{sim},seed={i}" + (f",slowdown={factor:.4g}" if slower else "")
            # a commit per run, as a nightly job would see the suite move
            with (suite / "test_serving.py").open("a") as fh:
                fh.write(f"# nightly {i}\n")
            _git(suite, "commit", "-q", "-am", f"nightly {i}")
            out = reports / f"run-{i}.json"
            rc = _pytest(suite, endpoint, f"--perf-json={out}")
            report = json.loads(out.read_text())
            meta = RunMeta.collect(
                report,
                suite_dir=suite,
                deployment="sim",
                environ={},
                time=FIRST_RUN + timedelta(days=i - 1),
            )
            run_id = store.record_run(report, meta)
            verdicts = [_verdict(t) for t in report["tests"]]
            print(f"run {run_id}: {endpoint} -> {verdicts} (pytest {rc})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--step-at", type=int, default=8, help="first run of the slower server")
    ap.add_argument("--slowdown", type=float, default=1.15, help="step-time factor from then on")
    ap.add_argument(
        "--drift", type=float, default=0.0, help="instead of a step: this much slower every run"
    )
    ap.add_argument("--speed", type=float, default=20.0, help="simulator clock speed")
    ap.add_argument(
        "--capacity", action="store_true", help="add a @capacity test to the suite (one chart)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dashboard.png")
    ap.add_argument("--site", type=Path, default=None, help="keep the dashboard here")
    ap.add_argument("--width", type=int, default=1000)
    ap.add_argument("--height", type=int, default=1240)
    args = ap.parse_args(argv)
    if find_chromium() is None:
        sys.exit("headless Chromium not found: apt-get install chromium (or set KIMI_CHROMIUM)")
    try:
        import otava.analysis  # noqa: F401  (find_changes needs it; fail before the runs)
    except ImportError:
        sys.exit("the change points need Apache Otava: pip install -e '.[otava]'")
    if shutil.which("git") is None:
        sys.exit("git not found: the runs' commits come from a temporary git checkout")
    with tempfile.TemporaryDirectory(prefix="kimi-dashboard-") as tmp:
        work = Path(tmp)
        history = f"sqlite:///{work / 'history.db'}"
        record_runs(
            work / "suite",
            history,
            runs=args.runs,
            step_at=args.step_at,
            slowdown=args.slowdown,
            speed=args.speed,
            drift=args.drift,
            capacity=args.capacity,
        )
        with open_history(history) as store:
            series = store.series()
            details = {r.id: store.run_details(r.id) for r in store.runs()}
        changes = find_changes(series)
        for change in changes:
            print("\n".join(change.describe()))
        site = args.site or work / "site"
        index = write_dashboard(series, changes, site, details)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(index, args.out, width=args.width, height=args.height)
    size = args.out.stat().st_size
    print(f"{args.out}: {size / 1000:.0f} kB" + (f"; site in {args.site}" if args.site else ""))
    if size > MAX_PNG_BYTES:
        print(
            f"warning: over {MAX_PNG_BYTES / 1000:.0f} kB; try a smaller --height", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
