"""The fake SGLang behaves like 0.5.23 where the plugin depends on it.

Each point was checked against SGLang 0.5.23's wheel; the fake's docstring names the files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fake_sglang"
ENV = {
    **os.environ,
    "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
    "FAKE_SGLANG_STARTUP_S": "0",
    "FAKE_SGLANG_SPEED": "20",
    "FAKE_SGLANG_REASONING_TOKENS": "5",
}
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _launch(*flags: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", *flags],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
        start_new_session=True,
    )


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with _NO_PROXY.open(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from pytest_kimi.server.launcher import _free_port

    log = tmp_path_factory.mktemp("fake") / "server.log"
    port = _free_port()
    proc = _launch(
        "--model-path",
        "/models/kimi",
        "--port",
        str(port),
        "--tp-size",
        "8",
        "--api-key",
        "sk-fake-0123456789abcdef",
        "--reasoning-parser",
        "kimi_k2",
        "--cuda-graph-max-bs-decode",
        "64",
        log=log,
    )
    try:
        deadline = time.monotonic() + 60
        while "ready to roll" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "flag", ["--cuda-graph-max-bs", "--disable-cuda-graph", "--enable-dp-attention"]
)
def test_removed_spellings_are_rejected_like_0_5_23(flag: str, tmp_path: Path) -> None:
    words = [flag] if flag.startswith("--disable") or flag.startswith("--enable") else [flag, "8"]
    proc = _launch("--model-path", "/m", *words, log=tmp_path / "log")
    assert proc.wait(timeout=60) == 2
    # argparse's own words: "unrecognized arguments", or "ambiguous option" for a prefix of
    # the per-phase flags (SGLang's parser allows abbreviations too)
    assert "error: " in (tmp_path / "log").read_text()


def test_server_info_has_0_5_23_shape_with_the_key_in_clear(fake: tuple[str, Path]) -> None:
    url, _ = fake
    status, body = _get(url + "/server_info", "sk-fake-0123456789abcdef")
    info = json.loads(body)
    assert status == 200 and info["version"] == "0.5.23"
    assert info["api_key"] == "sk-fake-0123456789abcdef", "the real server does this; we scrub"
    assert "--api-key sk-fake-0123456789abcdef" in info["launch_command"]
    assert f"--port {url.rsplit(':', 1)[1]}" in info["launch_command"]
    assert set(info["startup_time"]) >= {"load_weight", "scheduler_e2e"}
    assert info["internal_states"] and info["cuda_graph_max_bs_decode"] == 64


def test_get_server_info_logs_a_deprecation_warning_on_every_call(fake: tuple[str, Path]) -> None:
    url, log = fake
    before = log.read_text().count("'/get_server_info' is deprecated")
    for _ in range(2):
        assert _get(url + "/get_server_info", "sk-fake-0123456789abcdef")[0] == 200
    deadline = time.monotonic() + 10
    while log.read_text().count("'/get_server_info' is deprecated") < before + 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _stream(url: str, max_tokens: int) -> list[dict[str, object]]:
    body = json.dumps(
        {
            "model": "/models/kimi",
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}],
            "stream_options": {"include_usage": True},
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        headers={
            "Authorization": "Bearer sk-fake-0123456789abcdef",
            "Content-Type": "application/json",
        },
    )
    events = []
    with _NO_PROXY.open(req, timeout=60) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_reasoning_parser_streams_thinking_first(fake: tuple[str, Path]) -> None:
    url, _ = fake
    deltas = [c["delta"] for e in _stream(url, 12) for c in e.get("choices") or []]
    kinds = [
        "reasoning" if d.get("reasoning_content") else "content" if d.get("content") else None
        for d in deltas
    ]
    kinds = [k for k in kinds if k]
    assert kinds[:5] == ["reasoning"] * 5 and set(kinds[5:]) == {"content"}


def test_generation_counter_rises_per_finished_request(fake: tuple[str, Path]) -> None:
    url, _ = fake

    def counter() -> float:
        text = _get(url + "/metrics")[1].decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("sglang:generation_tokens_total")
        )

    before = counter()
    _stream(url, 40)
    assert counter() - before == 40
