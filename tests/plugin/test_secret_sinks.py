"""No secret a server reports reaches any sink: baseline, reports, history, dashboard, terminal.

A tester's server (here :mod:`tests.support.secret_server`, on 127.0.0.1) put
``private_key_pem``, ``api_keys``, ``apiKeys``, ``access_tokens``, ``tokens: {openai: ...}``,
a JWT, an Azure SAS ``?sig=`` URL, webhook URLs and ``GITHUB_PAT=...`` in text into its
``/server_info``; each reached the baseline YAML meant for git, the JSON report, the SQLite
history and the dashboard's run page.  One real session with every output on, then the
dashboard, must leave none of the markers in any file or in the terminal; and the baseline
must hold neither the port nor the simulator's pid, which change at every start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
import urllib.request
from pathlib import Path

import pytest
import yaml

from pytest_kimi.cli import main as kimi_perf
from support.secret_server import MARKERS, start_secret_server
from support.timing import SESSION_S

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=16, trials=2, warmup=1)
def test_sweep():
    pass
"""


def _files(root: Path) -> dict[Path, str]:
    """Every file under ``root`` as text, undecodable bytes kept as latin-1 (the SQLite
    database, its journal): a marker is ASCII, so it shows in the raw bytes either way."""
    return {
        path: path.read_bytes().decode("latin-1")
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _leaks(texts: dict[Path, str]) -> list[str]:
    return [
        f"{case} in {path}"
        for path, text in texts.items()
        for case, marker in MARKERS.items()
        if marker in text
    ]


@pytest.fixture
def secret_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The leaking server's URL; its log (which holds the markers) outside pytester's dir."""
    sim = start_secret_server(tmp_path_factory.mktemp("secret-server-logs"))
    try:
        assert sim.url is not None
        yield sim.url
    finally:
        sim.stop()


def test_no_reported_secret_reaches_any_sink(
    pytester: pytest.Pytester, secret_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = secret_server
    with urllib.request.urlopen(url + "/server_info", timeout=30) as resp:
        served = resp.read().decode()
    # the server really reports every case: each marker is there to leak
    assert all(marker in served for marker in MARKERS.values()), served

    pytester.makepyfile(test_suite=SUITE)
    out = pytester.path / "out"
    history = pytester.path / "hist" / "history.db"
    run = pytester.runpytest_subprocess(
        "-m",
        "perf",
        f"--endpoint={url}",
        "--update-baselines",
        "--perf-max-trials=2",
        f"--perf-json={out / 'perf.json'}",
        f"--perf-markdown={out / 'perf.md'}",
        f"--perf-html={out / 'html'}",
        f"--perf-requests={out / 'requests.jsonl'}",
        f"--junitxml={out / 'junit.xml'}",
        f"--perf-history=sqlite:///{history}",
        "-rA",
        timeout=SESSION_S,
    )
    run.assert_outcomes(passed=1)
    capsys.readouterr()
    assert (
        kimi_perf(["dashboard", "--history", f"sqlite:///{history}", "--out", str(out / "dash")])
        == 0
    )
    dashboard_output = capsys.readouterr()

    texts = _files(pytester.path)
    baseline = next(p for p in texts if p.suffix == ".yaml" and "baselines" in p.parts)
    written = {p.relative_to(pytester.path).as_posix() for p in texts}
    for expected in (
        "out/perf.json",
        "out/perf.md",
        "out/requests.jsonl",
        "out/junit.xml",
        "hist/history.db",
    ):
        assert expected in written, sorted(written)
    assert any(p.startswith("out/html/") for p in written), sorted(written)
    run_pages = [p for p in written if p.startswith("out/dash/") and p != "out/dash/index.html"]
    assert run_pages, sorted(written)
    terminal = "\n".join([*run.outlines, *run.errlines, dashboard_output.out, dashboard_output.err])
    assert not _leaks({**texts, Path("<terminal>"): terminal})

    info = yaml.safe_load(texts[baseline])["provenance"]["server_info"]
    # what changes at every start is not stored: each re-record's pull request stays quiet
    assert "port" not in info and "host" not in info, info
    assert "pid" not in info["sim"] and "port" not in info["launch_command"]["args"], info
    # the configuration is kept, the rest digested, the kept secrets' fields redacted
    assert info["max_total_tokens"] == 4096 and info["enable_eplb"] is False
    assert info["launch_command"]["args"]["max_running_requests"] == "64"
    assert info["unlisted"].split(",")[0].endswith("settings"), info["unlisted"]
    for dropped in ("private_key_pem", "api_keys", "apiKeys", "access_tokens", "tokens"):
        assert dropped not in info, dropped
    assert info["speculative_config"]["num_steps"] == 3
    report = json.loads(texts[pytester.path / "out" / "perf.json"])
    assert report["endpoint"]["server_info"] == info
