"""Measure the server, not its prefix cache; and say what ``input_tokens`` really sent.

Against the simulator, whose prefill model is known (``prefill_per_token_s`` per uncached
prompt token, a prefix cache matched in 16-token pages, at most ``len - 1`` tokens), so every
check is derived from that model: the simulator's own count of cached prompt tokens must be
exactly what the model says for the requests sent, and TTFT has lower bounds from it.  No
upper timing bound is tight: a busy machine only makes things later.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from pathlib import Path

import pytest

from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.server.launcher import ManagedServer
from pytest_kimi.server.profile import ServerProfile
from pytest_kimi.run.measurer import Measurer, build_spec
from pytest_kimi.sim.engine import RADIX_PAGE_TOKENS
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.prompts import SIZE_TOLERANCE, SYNTHETIC_VARIANTS

REAL_TIME = SimConfig(speed=1.0)
"""Real time: a 2000-token prefill costs 40 ms, a step at C=1 15 ms."""


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/sim/stats", timeout=10) as resp:
        return json.loads(resp.read())


def _cached(p: int) -> int:
    """The simulator's cache hit for a repeated prompt of ``p`` tokens."""
    return min(p // RADIX_PAGE_TOKENS * RADIX_PAGE_TOKENS, p - 1)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    proc = SimProcess(REAL_TIME, log_dir=tmp_path_factory.mktemp("simlogs"))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def runs(sim: SimProcess, pytestconfig: pytest.Config):
    """The same workload with repeated prompts (the old behaviour) and with the default."""
    session = Measurer()
    try:
        endpoint = session.discover(sim.url, api_key=None, model=None)
        workload, targets = parse_throughput(
            (),
            dict(
                concurrency=1,
                requests=SYNTHETIC_VARIANTS + 6,
                max_tokens=2,
                input_tokens=2000,
                trials=1,
                warmup=0,
            ),
        )
        out = {}
        for unique in (False, True):
            spec = build_spec(
                endpoint,
                "cache",
                workload,
                targets,
                rootdir=pytestconfig.rootpath,
                sizer=session.prompt_sizer,
                unique_prompts=unique,
            )
            before = _stats(sim.url)["cached_prompt_tokens"]
            level = session.measure(spec).levels[0]
            out[unique] = (level, _stats(sim.url)["cached_prompt_tokens"] - before)
        yield out
    finally:
        session.close()


def test_input_tokens_are_sized_with_the_servers_tokenizer(runs) -> None:
    for level, _ in runs.values():
        assert (level.input_tokens_sizing or "").startswith("server tokenizer (/tokenize)")
        counts = [r.prompt_tokens for t in level.trials for r in t.records]
        assert counts and all(abs(c - 2000) <= SIZE_TOLERANCE for c in counts), counts
        summary = level.prompt_tokens
        assert summary["min"] == min(counts) and summary["max"] == max(counts)


def test_repeated_prompts_are_served_by_the_prefix_cache(runs) -> None:
    """The old behaviour: after one pass over the 16 variants every prompt is a cache hit."""
    level, cached = runs[False]
    records = sorted((r for t in level.trials for r in t.records), key=lambda r: r.index)
    assert all(r.ok for r in records)
    hits = records[SYNTHETIC_VARIANTS:]
    assert cached == sum(_cached(r.prompt_tokens) for r in hits) > 0


def test_unique_prompts_get_nothing_from_the_cache(runs) -> None:
    level, cached = runs[True]
    assert all(r.ok for t in level.trials for r in t.records)
    assert cached == 0


def test_ttft_drops_only_for_repeated_prompts(runs) -> None:
    """Every unique request pays its whole prefill (TTFT never below step + prefill); cache
    hits skip most of it, so their median TTFT is lower by at least half a full prefill."""
    unique = [r for t in runs[True][0].trials for r in t.records]
    for r in unique:
        assert r.ttft >= REAL_TIME.expected_ttft_s(r.prompt_tokens) - 0.001, (
            r.ttft,
            r.prompt_tokens,
        )
    repeated = sorted((r for t in runs[False][0].trials for r in t.records), key=lambda r: r.index)
    hits = repeated[SYNTHETIC_VARIANTS:]
    for r in hits:
        assert (
            r.ttft >= REAL_TIME.expected_ttft_s(r.prompt_tokens - _cached(r.prompt_tokens)) - 0.001
        )
    drop = statistics.median(r.ttft for r in unique) - statistics.median(r.ttft for r in hits)
    assert drop > 0.5 * REAL_TIME.prefill_time(2000), drop


def test_estimated_lengths_are_reported_as_estimates(tmp_path: Path) -> None:
    sim = SimProcess(SimConfig(speed=20.0, no_tokenize=True), log_dir=tmp_path)
    sim.start()
    session = Measurer()
    try:
        endpoint = session.discover(sim.url, api_key=None, model=None)
        workload, targets = parse_throughput(
            (), dict(concurrency=2, requests=4, max_tokens=4, input_tokens=64, trials=1, warmup=0)
        )
        level = session.measure(
            build_spec(endpoint, "est", workload, targets, rootdir=tmp_path)
        ).levels[0]
    finally:
        session.close()
        sim.stop()
    sizing = level.input_tokens_sizing
    assert sizing.startswith("estimate at 1.3 tokens per word") and "/tokenize: HTTP 404" in sizing
    assert any(e.startswith("note: input_tokens=64 is an estimate") for e in level.errors)
    counts = [r.prompt_tokens for t in level.trials for r in t.records]
    assert level.prompt_tokens == {
        "mean": round(sum(counts) / len(counts), 1),
        "min": min(counts),
        "max": max(counts),
        "requests": len(counts),
    }


def test_every_report_shows_the_prompt_tokens(pytester: pytest.Pytester, tmp_path: Path) -> None:
    sim = SimProcess(SimConfig(speed=20.0, no_tokenize=True), log_dir=tmp_path)
    sim.start()
    try:
        pytester.makepyfile(
            """
            from pytest_kimi import throughput

            @throughput(concurrency=2, max_tokens=4, input_tokens=64, requests=4, trials=1, warmup=0)
            def test_short():
                pass
            """
        )
        out = tmp_path / "out"
        result = pytester.runpytest(
            f"--endpoint={sim.url}",
            f"--perf-json={out / 'r.json'}",
            f"--perf-markdown={out / 'r.md'}",
            f"--perf-html={out / 'html'}",
        )
    finally:
        sim.stop()
    result.assert_outcomes(passed=1)
    level = json.loads((out / "r.json").read_text())["tests"][0]["levels"][0]
    pt = level["prompt_tokens"]
    assert pt["min"] <= pt["mean"] <= pt["max"] and pt["requests"] == 4
    cell = f"{pt['mean']:.0f}" + ("" if pt["min"] == pt["max"] else f" ({pt['min']}-{pt['max']})")
    result.stdout.fnmatch_lines(
        ["*prompt tok*", f"*{cell}*", "*note: input_tokens=64: estimate at 1.3 tokens per word*"]
    )
    markdown = (out / "r.md").read_text()
    assert "prompt tokens" in markdown and cell in markdown and "is an estimate" in markdown
    html = "".join(p.read_text() for p in (out / "html").rglob("*.html"))
    assert "prompt tokens" in html and cell in html


def test_managed_flush_sends_the_admin_key_and_reports_refusals(tmp_path: Path) -> None:
    """``flush_cache`` asks the server to wait for idle and sends the admin key, else the API key."""
    sim = SimProcess(
        SimConfig(speed=50.0, api_key="user-k", admin_api_key="admin-k"), log_dir=tmp_path
    )
    sim.start()
    try:

        def server(args: dict) -> ManagedServer:
            srv = ManagedServer(
                ServerProfile(name="s", command=["true"], args=args), tmp_path / "logs"
            )
            srv.url = sim.url  # as if launched: only the flush is under test
            return srv

        good = server({"api-key": "user-k", "admin-api-key": "admin-k"})
        assert good.flush_cache(timeout_s=5) is True and good.flush_error is None
        no_admin = server({"api-key": "user-k"})
        assert no_admin.flush_cache(timeout_s=5) is False
        assert "HTTP 401" in no_admin.flush_error and "admin-api-key" in no_admin.flush_error
        stats = _stats(sim.url)
        assert stats["cache_flushes"] == 1
    finally:
        sim.stop()


def test_a_refused_flush_is_a_note_on_the_test() -> None:
    from types import SimpleNamespace

    from pytest_kimi.run.conductor import flush_cache

    def server(path: str | None, ok: bool) -> SimpleNamespace:
        return SimpleNamespace(
            engine=SimpleNamespace(flush_path=path),
            flush_error=None
            if ok
            else "POST /flush_cache answered HTTP 400: Cache not flushed: 2 running",
            flush_cache=lambda: ok,
        )

    assert flush_cache(None) is None  # an endpoint the plugin does not manage
    assert flush_cache(server(None, False)) is None  # vLLM: no flush endpoint, nothing failed
    assert flush_cache(server("/flush_cache", True)) is None
    assert flush_cache(server("/flush_cache", False)) == (
        "prefix cache not flushed before this test: POST /flush_cache answered HTTP 400: "
        "Cache not flushed: 2 running"
    )
