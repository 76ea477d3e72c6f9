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
from support.paths import REPO

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
    from pytest_kimi.server.ports import _free_port

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
        "--enable-metrics",
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


def _parse_only(*flags: str, tmp_path: Path) -> tuple[int, str]:
    """Exit code and log of a launch: one the parser refuses exits 2; one it takes is
    killed once it logged its arguments, so no server is left listening."""
    log = tmp_path / "log"
    proc = _launch(*flags, log=log)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and "server_args=" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait(timeout=30)
    return code, log.read_text(errors="replace")


@pytest.mark.parametrize(
    ("flag", "matches"),
    [
        ("--enable-metric", "--enable-metrics, --enable-metrics-for-all-schedulers"),
        ("--cont", "--context-bucket, --context-length"),
        ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"),
    ],
)
def test_ambiguous_prefixes_are_refused_like_0_5_23(
    flag: str, matches: str, tmp_path: Path
) -> None:
    code, log = _parse_only("--model-path", "/m", flag, "8", tmp_path=tmp_path)
    assert code == 2
    assert f"error: ambiguous option: {flag} could match {matches}" in log


@pytest.mark.parametrize("flag", ["--stream-interval 8", "--enable-cache-report", "--api k"])
def test_flags_and_unambiguous_prefixes_the_real_parser_takes(flag: str, tmp_path: Path) -> None:
    code, log = _parse_only("--model-path", "/m", *flag.split(), tmp_path=tmp_path)
    assert "server_args=" in log, log
    assert "error:" not in log


def test_an_unknown_flag_is_refused(tmp_path: Path) -> None:
    code, log = _parse_only("--model-path", "/m", "--no-such-flag", tmp_path=tmp_path)
    assert code == 2 and "unrecognized arguments: --no-such-flag" in log


@pytest.mark.parametrize(
    ("flag", "warning"),
    [
        (
            "--disable-cuda-graph",
            "'--disable-cuda-graph' is deprecated and will be removed in a future release. "
            "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead.",
        ),
        (
            "--enable-dp-attention",
            "'--enable-dp-attention' is deprecated and will be removed in a future release. "
            "Use '--attn-dp-size <dp-size>' instead.",
        ),
    ],
)
def test_deprecated_flags_are_accepted_with_sglangs_warning(
    flag: str, warning: str, tmp_path: Path
) -> None:
    code, log = _parse_only("--model-path", "/m", flag, tmp_path=tmp_path)
    assert warning in log and "server_args=" in log


def test_the_flag_list_is_the_real_parsers() -> None:
    from pytest_kimi.server.sglang_flags import raw_flags

    sys.path.insert(0, str(FAKE))
    try:
        from sglang.launch_server import build_parser
    finally:
        sys.path.remove(str(FAKE))
    longs = {o[2:] for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
    assert longs - {"help"} == {row["name"] for row in raw_flags("0.5.23")}


def test_metrics_answer_404_without_enable_metrics(tmp_path: Path) -> None:
    from pytest_kimi.server.ports import _free_port

    port = _free_port()
    log = tmp_path / "log"
    proc = _launch("--model-path", "/m", "--port", str(port), log=log)
    try:
        deadline = time.monotonic() + 60
        while "ready to roll" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 404 and json.loads(body) == {"detail": "Not Found"}
        assert _get(f"http://127.0.0.1:{port}/health")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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


def test_no_cache_hit_reads_as_zero_percent_not_as_no_reading(tmp_path: Path) -> None:
    """SGLang shows ``sglang:cached_tokens_total`` only after the first cache hit: with
    ``--disable-radix-cache`` the page never has it, and the probe reports 0%, while a page
    without SGLang's counters at all still gives no reading."""
    from pytest_kimi.crosscheck.prefix_cache import hit_rate, read_cache_counters
    from pytest_kimi.server.ports import _free_port

    port = _free_port()
    log = tmp_path / "log"
    flags = ("--model-path", "/m", "--port", str(port), "--enable-metrics", "--disable-radix-cache")
    proc = _launch(*flags, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while "ready to roll" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        before = read_cache_counters(_get(url + "/metrics")[1].decode())
        body = json.dumps({"model": "/m", "prompt": "a shared prompt " * 20, "max_tokens": 4})
        for _ in range(2):  # the same prompt twice: a hit, had the cache been on
            req = urllib.request.Request(
                url + "/v1/completions",
                data=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            with _NO_PROXY.open(req, timeout=60) as resp:
                resp.read()
        page = _get(url + "/metrics")[1].decode()
        after = read_cache_counters(page)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "sglang:cached_tokens_total" not in page and "vllm:" not in page
    assert before is not None and after is not None and after.hits_absent
    entry = hit_rate(before, after)
    assert entry is not None and entry["hit_rate"] == 0.0 and entry["prompt_tokens"] > 0
    assert entry["cached_metric_absent"] is True
    # a fresh SGLang page (gauges, no request finished: neither counter written) is 0 and 0,
    # as `before` above was read; a page of no SGLang without the pair is no reading
    fresh = read_cache_counters("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n")
    assert fresh is not None and (fresh.queries, fresh.hits) == (0.0, 0.0)
    assert before.queries == 0.0 and before.hits_absent
    assert read_cache_counters("# TYPE other_running gauge\nother_running 0\n") is None
