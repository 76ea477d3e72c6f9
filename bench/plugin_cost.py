"""What installing the plugin costs a pytest session that has no perf test.

Issue 36: the plugin is installed in a monorepo and every developer's every run pays for it.
This prints, for a throwaway project of one plain test:

* the modules ``import pytest_kimi.plugin`` adds to ``import pytest`` (all, and pytest_kimi's),
  and ``python -X importtime``'s cumulative microseconds for the plugin's import;
* the wall time of ``pytest -q`` with the plugin and with ``-p no:kimi``, best of ``--runs``.

``tests/unit/core/test_import_budget.py`` holds the module budget; the seconds are this script's.

    python bench/plugin_cost.py [--runs 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNT = (
    "import sys, pytest; before = set(sys.modules); import pytest_kimi.plugin; "
    "added = set(sys.modules) - before; "
    "print(len(added), sum(m.startswith('pytest_kimi') for m in added))"
)


def best_of(runs: int, command: list[str], cwd: Path) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(command, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    added, ours = subprocess.run(
        [sys.executable, "-c", COUNT], check=True, capture_output=True, text=True
    ).stdout.split()
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import pytest_kimi.plugin"],
        check=True,
        capture_output=True,
        text=True,
    ).stderr.strip()
    cumulative = trace.splitlines()[-1].split("|")[1].strip()
    print(f"import pytest_kimi.plugin: {added} modules over pytest's ({ours} of pytest_kimi)")
    print(f"import time, cumulative (pytest included): {cumulative} us")
    with tempfile.TemporaryDirectory(prefix="kimi-plugin-cost-") as tmp:
        root = Path(tmp)
        (root / "test_plain.py").write_text("def test_plain():\n    assert True\n")
        (root / "pytest.ini").write_text("[pytest]\n")
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        with_plugin = best_of(args.runs, base, root)
        without = best_of(args.runs, [*base, "-p", "no:kimi"], root)
    print(
        f"pytest -q, one plain test, best of {args.runs}: {with_plugin:.3f} s with the plugin, "
        f"{without:.3f} s with -p no:kimi ({with_plugin - without:+.3f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
