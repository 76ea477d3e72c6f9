"""Shared prefixes (``shared_prefix_tokens=``, ``prefix_groups=``) and the server's cache-hit rate.

Against the simulator, whose prefix cache is known exactly (16-token pages of 4 prompt bytes,
matched from the start of the prompt, prefill time only for what it misses), so every figure
is checked against what that model says for the requests sent: the cached tokens of a level,
the hit rate the plugin read from the counters, and a lower bound on how much TTFT drops.  No
upper timing bound is tight: a busy machine only makes things later.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_kimi.crosscheck.prefix_cache import (
    CacheCounters,
    PrefixCacheProbe,
    hit_rate,
    read_cache_counters,
)
from pytest_kimi.measure.results import workload_dict
from pytest_kimi.run.measurer import Measurer, build_spec
from pytest_kimi.sim.engine import RADIX_PAGE_TOKENS
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import MarkerError
from pytest_kimi.workload.prefix import SystemTokenizer, group_id, prefix_text, shared_prefixes
from pytest_kimi.workload.prompts import (
    PREFIX_SEPARATOR,
    SIZE_TOLERANCE,
    UNIQUE_SLOT,
    PromptSource,
    encode_bodies,
)

pytest_plugins = ["pytester"]

REAL_TIME = SimConfig(speed=1.0)
"""Real time: a 2000-token prefill costs 40 ms, a step at C=1 15 ms."""
PREFIX = 2000
QUESTION = 32


def _get(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if url.endswith("/sim/stats") else body.decode()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(REAL_TIME, log_dir=tmp_path_factory.mktemp("simlogs")) as proc:
        yield proc


# ---------------------------------------------------------------------- the marker and bodies


def test_marker_arguments_and_the_workload_key() -> None:
    workload, _ = parse_throughput((), {"shared_prefix_tokens": 512, "prefix_groups": 4})
    assert (workload.shared_prefix_tokens, workload.prefix_groups) == (512, 4)
    key = workload_dict(workload)
    assert key["shared_prefix_tokens"] == 512 and key["prefix_groups"] == 4
    one, _ = parse_throughput((), {"shared_prefix_tokens": 512})
    assert one.prefix_groups == 1 and workload_dict(one)["prefix_groups"] == 1
    plain, _ = parse_throughput((), {})
    assert "shared_prefix_tokens" not in workload_dict(plain)  # old keys still match
    with pytest.raises(MarkerError, match="give shared_prefix_tokens= too"):
        parse_throughput((), {"prefix_groups": 2})
    with pytest.raises(MarkerError, match=r"shared_prefix_tokens=0: expected an integer >= 1"):
        parse_throughput((), {"shared_prefix_tokens": 0})
    with pytest.raises(MarkerError, match=r"did you mean shared_prefix_tokens\?"):
        parse_throughput((), {"shared_prefix_token": 8})


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_bodies_deal_the_groups_round_robin_after_the_prefix(api: str) -> None:
    prefixes = ("SYS-A", "SYS-B", "SYS-C")
    bodies = encode_bodies(
        PromptSource(("q0", "q1", "q2", "q3", "q4"), "list:5"),
        model="m",
        api=api,  # type: ignore[arg-type]
        max_tokens=0,
        ignore_eos=True,
        unique="tok",
        prefixes=prefixes,
    )
    assert len(bodies) == 5  # max(prompts, groups)
    for k, raw in enumerate(bodies):
        assert raw.count(UNIQUE_SLOT.encode()) == 1
        body = json.loads(raw)
        question = f"{UNIQUE_SLOT}-tok q{k}"
        if api == "chat":
            assert body["messages"] == [
                {"role": "system", "content": prefixes[k % 3]},
                {"role": "user", "content": question},
            ]
        else:
            assert body["prompt"] == prefixes[k % 3] + PREFIX_SEPARATOR + question
    more_groups = encode_bodies(
        PromptSource(("q",), "list:1"),
        model="m",
        api="chat",
        max_tokens=0,
        ignore_eos=True,
        prefixes=prefixes,
    )
    assert [json.loads(b)["messages"][0]["content"] for b in more_groups] == list(prefixes)


def test_groups_differ_from_their_first_character() -> None:
    texts = [prefix_text(50, g) for g in range(64)]
    assert len({t[:2] for t in texts}) > 32 and len({t[:8] for t in texts}) == 64
    assert all(t.startswith(f"{group_id(g)}:") for g, t in enumerate(texts))
    assert all(len(t.split()) == 50 for t in texts)


def test_prefixes_are_sized_with_the_servers_tokenizer_once(sim: SimProcess) -> None:
    tok = SystemTokenizer(sim.url, {}, "kimi-k2.6-sim", "chat")
    memo: dict[tuple[Any, ...], Any] = {}
    sized = shared_prefixes(300, 3, tokenizer=tok, memo=memo, endpoint_key=(sim.url, "m"))
    assert not sized.estimated and sized.note is None
    assert sized.sizing.startswith("server tokenizer (/tokenize)")
    for text in sized.texts:
        # the simulator counts 4 UTF-8 bytes a token, system message included
        assert abs(-(-len(text.encode()) // 4) - 300) <= SIZE_TOLERANCE
    calls = tok.calls
    again = shared_prefixes(300, 3, tokenizer=tok, memo=memo, endpoint_key=(sim.url, "m"))
    assert again == sized and tok.calls == calls  # once per run, length and groups
    guess = shared_prefixes(300, 2, tokenizer=None)
    assert guess.estimated and guess.note is not None and "estimate" in guess.note


# ---------------------------------------------------------------------- the counters


VLLM_PAGE = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 150.0
"""
SGLANG_PAGE = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 900.0
sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 100.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
"""


def test_cache_counters_of_either_engine() -> None:
    vllm = read_cache_counters(VLLM_PAGE)
    assert vllm == CacheCounters(
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", 1500.0, 750.0
    )
    # SGLang's labelled counter has no sample before the first hit: declared, so zero
    sglang = read_cache_counters(SGLANG_PAGE)
    assert sglang is not None and (sglang.queries, sglang.hits) == (1000.0, 0.0)
    later = read_cache_counters(
        SGLANG_PAGE.replace("processed.\n", "processed.\n", 1).replace("900.0", "1900.0")
        + 'sglang:cached_tokens_total{model_name="m",cache_source="device"} 700.0\n'
        + 'sglang:cached_tokens_total{model_name="m",cache_source="host"} 100.0\n'
    )
    entry = hit_rate(sglang, later)
    assert entry is not None and entry["hit_rate"] == 0.8 and entry["prompt_tokens"] == 1000
    assert entry["metrics"] == ["sglang:cached_tokens_total", "sglang:prompt_tokens_total"]
    # SGLang's multiprocess registry shows the cached counter only once a hit wrote a sample:
    # a page with its prompt counter and no cached one at all has served 0 from the cache
    undeclared = "\n".join(SGLANG_PAGE.splitlines()[:4]) + "\n"
    assert read_cache_counters(undeclared) == CacheCounters(
        "sglang:prompt_tokens_total", "sglang:cached_tokens_total", 1000.0, 0.0, hits_absent=True
    )
    zero = hit_rate(
        read_cache_counters(undeclared), read_cache_counters(undeclared.replace("900.0", "1900.0"))
    )
    assert zero is not None and zero["hit_rate"] == 0.0 and zero["cached_metric_absent"] is True
    # vLLM's hit counter is created with its queries counter: one without the other is no reading
    assert read_cache_counters(VLLM_PAGE.replace("vllm:prefix_cache_hits_total", "x_total")) is None
    # no counters at all: no rate
    assert read_cache_counters("# nothing\nsome_other_total 3\n") is None
    assert hit_rate(vllm, None) is None and hit_rate(vllm, vllm) is None  # nothing counted


def test_the_simulator_exports_the_cache_counters_under_both_names(sim: SimProcess) -> None:
    page = _get(sim.url + "/metrics")
    stats = _get(sim.url + "/sim/stats")
    for name in ("sglang:cached_tokens_total", "vllm:prefix_cache_hits_total"):
        assert f"# TYPE {name} counter" in page
    counters = read_cache_counters(page)
    assert counters is not None
    assert counters.queries == stats["prompt_tokens"]
    assert counters.hits == stats["cached_prompt_tokens"]


@pytest.mark.asyncio
async def test_a_server_without_counters_gets_no_hit_rate() -> None:
    probe = PrefixCacheProbe("http://127.0.0.1:9", timeout_s=2)  # nothing listens on port 9
    await probe.start_level()
    assert await probe.end_level() == {} and probe.unavailable is not None


# ---------------------------------------------------------------------- against the simulator


def _cached(prefix: str) -> int:
    """Prompt tokens the simulator serves from the cache for a request after ``prefix``: its
    whole pages (the page that holds the boundary has the request's unique lead in it)."""
    return len(prefix.encode()) // (4 * RADIX_PAGE_TOKENS) * RADIX_PAGE_TOKENS


@pytest.fixture(scope="module")
def runs(sim: SimProcess, pytestconfig: pytest.Config) -> Iterator[dict[str, Any]]:
    """One request at a time (every TTFT is one step plus its own prefill), with and without
    a shared prefix of the same total prompt length."""
    session = Measurer()
    try:
        endpoint = session.discover(sim.url, api_key=None, model=None)
        common = dict(concurrency=1, requests=10, max_tokens=2, trials=1, warmup=2)
        out: dict[str, Any] = {}
        for name, extra in (
            ("shared", dict(shared_prefix_tokens=PREFIX, prefix_groups=2, input_tokens=QUESTION)),
            ("unshared", dict(input_tokens=PREFIX + QUESTION)),
        ):
            workload, targets = parse_throughput((), {**common, **extra})
            spec = build_spec(
                endpoint,
                name,
                workload,
                targets,
                rootdir=pytestconfig.rootpath,
                sizer=session.prompt_sizer,
            )
            before = _get(sim.url + "/sim/stats")
            result = session.measure(spec)
            after = _get(sim.url + "/sim/stats")
            first = [
                json.loads(b)["messages"][0] for b in next(iter(spec.send.bodies.values()))[:2]
            ]
            prefixes = [m["content"] for m in first if m["role"] == "system"]
            out[name] = (result.levels[0], after, before, prefixes)
        yield out
    finally:
        session.close()


def test_shared_prefixes_are_served_from_the_cache(runs: dict[str, Any]) -> None:
    level, after, before, prefixes = runs["shared"]
    assert level.verdict != "error" and all(r.ok for t in level.trials for r in t.records)
    records = [r for t in level.trials for r in t.records]
    entry = level.extra["prefix_cache"]
    # the counters the plugin read are the simulator's: every measured request found its
    # group's prefix (the warm-up put both groups in the cache), page by page
    assert entry["prompt_tokens"] == sum(r.prompt_tokens for r in records)
    low, high = (f(_cached(p) for p in prefixes) for f in (min, max))
    assert len(records) * low <= entry["cached_tokens"] <= len(records) * high
    # the warm-up (one request per group, first against this simulator) missed: all the
    # simulator's hits are the level's
    assert entry["cached_tokens"] == after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    rate = level.extra["prefix_cache_hit_rate"]
    assert rate == round(entry["cached_tokens"] / entry["prompt_tokens"], 4)
    mean_prompt = statistics.fmean(r.prompt_tokens for r in records)
    # about N / (N + question): the prefix is N tokens to within the sizing tolerance, less
    # the page that holds its end
    assert (
        (PREFIX - SIZE_TOLERANCE - RADIX_PAGE_TOKENS) / mean_prompt
        <= rate
        <= PREFIX / (mean_prompt - SIZE_TOLERANCE)
    )
    assert level.extra["shared_prefix"]["groups"] == 2
    assert level.extra["shared_prefix"]["sizing"].startswith("server tokenizer")


def test_without_sharing_nothing_is_served_from_the_cache(runs: dict[str, Any]) -> None:
    level, *_ = runs["unshared"]
    assert level.extra["prefix_cache_hit_rate"] == 0.0
    assert "shared_prefix" not in level.extra


def test_ttft_drops_by_the_prefill_the_cache_saves(runs: dict[str, Any]) -> None:
    """Every unshared request pays its whole prefill (TTFT never below step + prefill); a
    shared one only for what the cache misses, so the median drops by at least half of the
    prefix's prefill."""
    shared = [r for t in runs["shared"][0].trials for r in t.records]
    unshared = [r for t in runs["unshared"][0].trials for r in t.records]
    for r in unshared:
        assert r.ttft is not None
        assert r.ttft >= REAL_TIME.expected_ttft_s(r.prompt_tokens) - 0.001
    drop = statistics.median(r.ttft for r in unshared if r.ttft) - statistics.median(
        r.ttft for r in shared if r.ttft
    )
    assert drop > 0.5 * REAL_TIME.prefill_time(PREFIX), drop


PERF_TEST = """
from pytest_kimi import throughput

@throughput(concurrency=4, shared_prefix_tokens=512, prefix_groups=2, max_tokens=32, trials=2)
def test_shared():
    pass
"""


def test_reports_show_the_hit_rate_and_baselines_key_the_prefix(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_perf=PERF_TEST)
    args = ["-p", "no:cacheprovider", "--endpoint=sim:speed=10,stream_interval=8"]
    run = pytester.runpytest_subprocess(
        *args,
        "--update-baselines",
        "--perf-max-trials=2",  # a baseline of the marker's 2 trials: enough to check its key
        "--perf-json=r.json",
        "--perf-markdown=r.md",
        timeout=600,
    )
    run.assert_outcomes(passed=1)
    run.stdout.fnmatch_lines(
        ["*test_shared*", "*cache hit*", "*shared prefix: 2 system prompt(s) of 512 tokens*"]
    )
    (shared,) = json.loads(Path("r.json").read_text())["tests"]
    assert shared["workload"]["shared_prefix_tokens"] == 512
    assert shared["workload"]["prefix_groups"] == 2
    (level,) = shared["levels"]
    # a stationary trial's prompts: the 512-token prefix and a short question (the built-in
    # prompts with their unique lead, about 20 tokens): the cache serves ~95% of them
    assert level["protocol"] == "stationary"
    assert level["prefix_cache_hit_rate"] >= (512 - 16 - 3) / level["prompt_tokens"]["mean"]
    md = Path("r.md").read_text()
    assert "cache hit" in md and "shared prefix: 2 system prompt(s)" in md
    baseline = next(Path("baselines").rglob("test_shared.yaml")).read_text()
    assert "shared_prefix_tokens: 512" in baseline and "prefix_groups: 2" in baseline
