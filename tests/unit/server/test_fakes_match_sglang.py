"""The fakes held to what real SGLang 0.5.23 answered (``tests/data/sglang-0.5.23``).

Why: the fake SGLang (``tests/fake_sglang``) and the simulator (``pytest_kimi/sim``, what
``sim:`` endpoints and the fake serve) were written from SGLang's source, and every test of
the plugin's SGLang handling runs against them.  A fake that drifts from the real server
makes those tests prove the wrong thing.  The samples were recorded from the real server by
``tests/data/sglang-0.5.23/record.py`` (its header has the command); these tests need no
SGLang: they start the fakes, ask them what the recorder asked the real server, and compare
what the plugin depends on:

* ``/server_info``: the fields the plugin keeps for provenance (``clean_server_info``'s
  allow-list) exist on the real server with the same JSON type;
* ``/metrics``: the metric families the plugin reads (the generated-token, prompt-token,
  request and running/queue counters, the prefix-cache pair) exist on both with the same
  type, and the fakes' labels are among the real ones;
* streaming chat and completions with ``include_usage`` and ``continuous_usage_stats`` at
  stream interval 1 and 8: the same events (role chunk, token deltas, finish chunk or finish
  on the last token, usage-only chunk, ``[DONE]``) with the same usage on each, the same
  keys in the same order, for the same ``max_tokens``;
* ``/tokenize``: the same reply keys and types for a string, a list and chat messages.

The fake SGLang is held to all of it.  The plain simulator (``sim:`` endpoints) is an
engine-neutral stand-in by design, and differs in exactly the ways :data:`SIM_BY_DESIGN`
lists, which its tests assert (so it cannot drift further unnoticed): its ``/server_info`` is
a deployment summary (a subset of 0.5.23's fields) plus its own ``sim`` knobs; its counters
exist from the start, as vLLM's do; it serves vLLM's prefix-cache pair beside SGLang's, so
either reader has a server.

A difference that is the fakes' to fix is marked ``xfail(strict=True)`` with the difference
as its reason (``KNOWN_DIFFERENCES``): the test then fails the day the fake is fixed, so the
mark is removed with the fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_kimi.crosscheck.prefix_cache import PREFIX_CACHE_COUNTERS, read_cache_counters
from pytest_kimi.crosscheck.counter_scraper import (
    GENERATION_COUNTERS,
    PROMPT_COUNTERS,
    REQUEST_COUNTERS,
)
from pytest_kimi.endpoint.serverinfo import is_provenance_field
from pytest_kimi.sim import SimConfig, SimProcess
from support.paths import REPO

SAMPLES = REPO / "tests" / "data" / "sglang-0.5.23"
FAKE = REPO / "tests" / "fake_sglang"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _recorder() -> ModuleType:
    """``record.py``: the same request bodies and the same normalisation for both sides."""
    spec = importlib.util.spec_from_file_location("sglang_record", SAMPLES / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record = _recorder()
if not (SAMPLES / "streams.json").exists():
    pytest.skip(
        f"no samples recorded in {SAMPLES}: run its record.py against SGLang 0.5.23 (its header "
        "has the command)",
        allow_module_level=True,
    )


def sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    return data


METRICS_READ = tuple(
    sorted(
        {
            *(n for n in GENERATION_COUNTERS if n.startswith("sglang:")),
            PROMPT_COUNTERS["sglang:"],
            REQUEST_COUNTERS["sglang:"],
            *(n for pair in PREFIX_CACHE_COUNTERS for n in pair if n.startswith("sglang:")),
            # the contamination check's gauges (crosscheck/contamination.py)
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
        }
    )
)
"""The ``sglang:*`` families the plugin reads (crosscheck/ and endpoint/)."""
METRICS_READ_ANY_ENGINE = tuple(
    sorted(
        {
            *GENERATION_COUNTERS,
            *PROMPT_COUNTERS.values(),
            *REQUEST_COUNTERS.values(),
            *(n for pair in PREFIX_CACHE_COUNTERS for n in pair),
        }
    )
)
"""Every family the plugin's readers look for, vLLM's included: the first pair found wins
(``read_cache_counters`` looks for vLLM's first)."""

KNOWN_DIFFERENCES: dict[str, str] = {}
"""test id -> the difference that makes it fail today (none: the findings of the first
recording were fixed in the fakes, see the closing note of issue 24)."""

SIM_KEY = "sim"
"""The one ``/server_info`` field both fakes add: the simulator's knobs, so a report can tell
a simulated run apart (no real server has it, so no real baseline can differ by it)."""
PER_REQUEST_COUNTERS = (
    "sglang:generation_tokens_total",
    "sglang:num_requests_total",
    "sglang:prompt_tokens_total",
)
"""Absent from a fresh 0.5.23 page: written first when a request finishes."""
SIM_BY_DESIGN: dict[str, set[str]] = {
    # counters from the start, at 0 (as vLLM's); the cache counter too, hit or not
    "metrics_fresh": {*PER_REQUEST_COUNTERS, "sglang:cached_tokens_total"},
    # vLLM's prefix-cache pair beside SGLang's
    "metrics_foreign": {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
}
"""How the plain simulator differs from SGLang 0.5.23 on purpose (the fake SGLang does not)."""


def expect_difference(request: pytest.FixtureRequest, key: str) -> None:
    """Mark the running test ``xfail(strict=True)`` when ``key`` is a known difference: it
    must fail until the fake is fixed, and then its pass fails the run until the entry goes."""
    reason = KNOWN_DIFFERENCES.get(key)
    if reason:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))


# ----------------------------------------------------------------------------------- fakes


class Fake:
    """One running fake: ``kind`` is ``sim`` (the simulator itself) or ``fake`` (the fake
    ``python -m sglang.launch_server``, which serves the simulator behind SGLang's flags)."""

    def __init__(self, kind: str, url: str, model: str) -> None:
        self.kind, self.url, self.model = kind, url, model

    def http(self, path: str, body: Any = None) -> tuple[int, Any]:
        status, raw = record.http(self.url + path, body)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def metrics(self) -> str:
        status, raw = record.http(self.url + "/metrics")
        assert status == 200, (status, raw[:200])
        text: str = raw.decode()
        return text


def _sim(interval: int, log_dir: Path) -> Iterator[Fake]:
    sim = SimProcess(SimConfig(speed=20, stream_interval=interval), log_dir=log_dir)
    sim.start()
    try:
        assert sim.url is not None
        models = json.loads(record.http(sim.url + "/v1/models")[1])
        yield Fake("sim", sim.url, models["data"][0]["id"])
    finally:
        sim.stop()


def _fake_sglang(interval: int, log: Path) -> Iterator[Fake]:
    """The fake launcher with the recorded server's flags (those it knows)."""
    from pytest_kimi.server.ports import _free_port

    port = _free_port()
    flags = ["--model-path", "/models/tiny-llama", "--port", str(port), "--enable-metrics"]
    flags += ["--max-running-requests", "8", "--context-length", "2048"]
    flags += ["--max-total-tokens", "8192", "--mem-fraction-static", "0.1"]
    flags += ["--attention-backend", "torch_native"]
    if interval != 1:
        flags += ["--stream-interval", str(interval)]
    env = {
        **os.environ,
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0",
        "FAKE_SGLANG_SPEED": "20",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *flags],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready to roll" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                pytest.fail(f"the fake SGLang exited {proc.returncode}: {log.read_text()[-2000:]}")
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Fake("fake", f"http://127.0.0.1:{port}", "/models/tiny-llama")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module", params=["sim", "fake"])
def fake(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fake]:
    """Each fake at stream interval 1 (the default), fresh: nothing served yet."""
    where = tmp_path_factory.mktemp(f"{request.param}1")
    if request.param == "sim":
        yield from _sim(1, where)
    else:
        yield from _fake_sglang(1, where / "server.log")


# ------------------------------------------------------------------------------ server info


def _kept(keys: dict[str, str]) -> dict[str, str]:
    """The fields ``clean_server_info`` keeps (``launch_command`` is parsed, not kept whole)."""
    return {k: t for k, t in keys.items() if is_provenance_field(k) or k == "launch_command"}


def _server_info_keys(fake: Fake) -> dict[str, str]:
    status, info = fake.http("/server_info")
    assert status == 200 and isinstance(info, dict), (status, info)
    return {k: record.type_name(v) for k, v in info.items()}


def test_the_samples_are_from_sglang_0_5_23() -> None:
    info = sample("server_info.json")
    assert info["meta"]["sglang"] == "0.5.23"
    assert info["/server_info"]["status"] == 200 and info["/server_info"]["version"] == "0.5.23"
    for name in ("metrics.json", "tokenize.json", "streams.json"):
        assert sample(name)["meta"]["sglang"] == "0.5.23", name


def test_server_info_fields_the_plugin_keeps_exist_on_the_real_server(
    request: pytest.FixtureRequest, fake: Fake
) -> None:
    """A field a fake invents (or spells unlike 0.5.23) would put a knob into baselines that
    no real deployment ever reports, and a provenance diff between the two."""
    expect_difference(request, f"server_info_invented[{fake.kind}]")
    real = sample("server_info.json")["/server_info"]["keys"]
    invented = sorted(set(_kept(_server_info_keys(fake))) - set(real) - {SIM_KEY})
    assert not invented, f"{fake.kind} serves fields 0.5.23 does not: {invented}"


def test_server_info_kept_fields_have_the_real_types(
    request: pytest.FixtureRequest, fake: Fake
) -> None:
    """The same field with another JSON type (a number as a string, a list as a scalar)
    changes a baseline's provenance between a fake and a real run; null is a value either
    side may have (an unset flag)."""
    expect_difference(request, f"server_info_types[{fake.kind}]")
    real = sample("server_info.json")["/server_info"]["keys"]
    ours = _kept(_server_info_keys(fake))
    differ = {
        k: (real[k], t)
        for k, t in ours.items()
        if k in real and "null" not in (real[k], t) and real[k] != t
    }
    assert not differ, f"{fake.kind}: field -> (0.5.23's type, the fake's): {differ}"


def test_server_info_serves_what_the_plugin_keeps_from_the_real_server(
    request: pytest.FixtureRequest, fake: Fake
) -> None:
    """The other way round: what a real server's provenance holds, the fake's must too, or
    tests of the provenance diff never see those fields."""
    expect_difference(request, f"server_info_missing[{fake.kind}]")
    real = _kept(sample("server_info.json")["/server_info"]["keys"])
    if fake.kind == "sim":
        # a deployment summary by design: the fields the provenance diff is about
        real = {k: t for k, t in real.items() if k in SIM_SUMMARY}
    missing = sorted(set(real) - set(_server_info_keys(fake)))
    assert not missing, f"{fake.kind} lacks {len(missing)} kept fields 0.5.23 serves: {missing}"


SIM_SUMMARY = frozenset(
    "tp_size ep_size dp_size pp_size nnodes max_running_requests max_total_tokens "
    "chunked_prefill_size max_prefill_tokens schedule_policy enable_eplb enable_dp_attention "
    "moe_a2a_backend attention_backend context_length dtype kv_cache_dtype mem_fraction_static "
    "cuda_graph_max_bs_decode disable_radix_cache speculative_algorithm model_path".split()
)
"""What the plain simulator's ``/server_info`` summarises of a deployment (0.5.23's names)."""


def test_the_deprecated_server_info_has_the_same_keys(fake: Fake) -> None:
    info = sample("server_info.json")
    real_new, real_old = info["/server_info"]["keys"], info["/get_server_info"]["keys"]
    assert set(real_new) == set(real_old)
    status, old = fake.http("/get_server_info")
    assert status == 200 and set(old) == set(_server_info_keys(fake))


# ---------------------------------------------------------------------------------- metrics


def _families(fake: Fake) -> dict[str, dict[str, Any]]:
    families: dict[str, dict[str, Any]] = record.metric_families(fake.metrics())
    return families


def _serve_two_identical_prompts(fake: Fake) -> None:
    """What the recorder sent before its second scrape: the same prompt twice."""
    body = {
        "model": fake.model,
        "messages": [{"role": "user", "content": "The same prompt, twice: a cache hit. " * 8}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    for _ in range(2):
        status, _answer = fake.http("/v1/chat/completions", body)
        assert status == 200


@pytest.fixture(scope="module")
def fake_pages(fake: Fake) -> dict[str, dict[str, dict[str, Any]]]:
    """The fake's metric families fresh and after the recorder's two requests."""
    fresh = _families(fake)
    _serve_two_identical_prompts(fake)
    time.sleep(0.2)
    return {"fresh": fresh, "after_requests": _families(fake)}


@pytest.mark.parametrize("page", ["fresh", "after_requests"])
def test_the_metrics_the_plugin_reads_exist_as_on_the_real_server(
    request: pytest.FixtureRequest,
    fake: Fake,
    fake_pages: dict[str, dict[str, dict[str, Any]]],
    page: str,
) -> None:
    """Each family the plugin reads is on the fake's page exactly when it is on the real
    one (a fresh server's and one that served a cache hit), with the same type."""
    key = f"metrics_{page}[{fake.kind}]"
    expect_difference(request, key)
    real = sample("metrics.json")[page]
    ours = fake_pages[page]
    differ = {
        name: (real.get(name, {}).get("type"), ours.get(name, {}).get("type"))
        for name in METRICS_READ
        if real.get(name, {}).get("type") != ours.get(name, {}).get("type")
        or bool(real.get(name, {}).get("samples")) != bool(ours.get(name, {}).get("samples"))
    }
    if fake.kind == "sim" and page == "fresh":
        # the simulator's counters exist from the start, nothing else may differ
        assert set(differ) <= SIM_BY_DESIGN["metrics_fresh"], differ
        assert all(real_type is None for real_type, _ in differ.values()), differ
        return
    assert not differ, f"{fake.kind} ({page}): name -> (0.5.23's type, the fake's): {differ}"


def test_the_fakes_labels_are_real_ones(
    fake: Fake, fake_pages: dict[str, dict[str, dict[str, Any]]]
) -> None:
    """The plugin sums a family over its label sets; a fake with fewer labels is fine, one
    with a label 0.5.23 never sets would hide a reader that depends on it."""
    real = sample("metrics.json")["after_requests"]
    ours = fake_pages["after_requests"]
    extra = {
        name: sorted(set(ours[name]["labels"]) - set(real[name]["labels"]))
        for name in METRICS_READ
        if name in ours and name in real and set(ours[name]["labels"]) - set(real[name]["labels"])
    }
    assert not extra, extra


def test_the_fakes_serve_no_family_the_plugin_reads_that_sglang_lacks(
    request: pytest.FixtureRequest, fake: Fake, fake_pages: dict[str, dict[str, dict[str, Any]]]
) -> None:
    """A reader takes the first family it finds; a fake SGLang page with one the real page
    lacks (vLLM's, say) sends the reader down a path no SGLang server takes."""
    key = f"metrics_foreign[{fake.kind}]"
    expect_difference(request, key)
    real = sample("metrics.json")["after_requests"]
    foreign = sorted(
        n for n in METRICS_READ_ANY_ENGINE if n in fake_pages["after_requests"] and n not in real
    )
    if fake.kind == "sim":
        assert set(foreign) == SIM_BY_DESIGN["metrics_foreign"], foreign
        return
    assert not foreign, f"{fake.kind} serves {foreign}, which 0.5.23 does not"


def test_the_real_cache_counters_are_read_by_the_plugin() -> None:
    """The recorded page after a cache hit, rebuilt from the sample's families, is one the
    prefix-cache reader finds its pair on (the real names)."""
    families = sample("metrics.json")["after_requests"]
    lines = []
    for name in ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"):
        lines.append(f"# TYPE {name} {families[name]['type']}")
        labels = ",".join(f'{k}="x"' for k in families[name]["labels"])
        lines.append(f"{name}{{{labels}}} 1.0")
    counters = read_cache_counters("\n".join(lines) + "\n")
    assert counters is not None
    assert (counters.queries_metric, counters.hits_metric) == (
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
    )


# ---------------------------------------------------------------------------------- streams


def _kind(event: Any) -> str:
    if event == "[DONE]":
        return "[DONE]"
    choices = event.get("choices") or []
    if not choices:
        return "usage"
    choice = choices[0]
    delta = choice.get("delta") or {}
    if choice.get("finish_reason") is not None:
        return "finish+delta" if delta.get("content") else "finish"
    if delta.get("role") and not delta.get("content"):
        return "role"
    return "delta"


def _sequence(events: list[Any]) -> list[tuple[Any, ...]]:
    """Each event as (kind, completion tokens of its usage, whether its usage has
    prompt_tokens): what the plugin's stream parser reads."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        usage = event.get("usage") if isinstance(event, dict) else None
        out.append(
            (
                _kind(event),
                None if usage is None else usage.get("completion_tokens"),
                None if usage is None else isinstance(usage.get("prompt_tokens"), int),
            )
        )
    return out


def _fields(events: list[Any]) -> list[tuple[Any, ...]]:
    """Each event's field names (top level, the choice's, the delta's)."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        if not isinstance(event, dict):
            out.append((event,))
            continue
        choices = event.get("choices") or [{}]
        out.append(
            (
                tuple(sorted(event)),
                tuple(sorted(choices[0])),
                tuple(sorted(choices[0].get("delta") or {})),
            )
        )
    return out


@pytest.fixture(
    scope="module",
    params=[
        f"{k}-{i}-{api}" for api in ("chat", "completions") for k in ("sim", "fake") for i in (1, 8)
    ],
)
def stream_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int, dict[str, Any], dict[str, Any]]]:
    """(id, stream interval, the real recorded stream, the fake's) for one API."""
    kind, interval, api = request.param.split("-")
    prefix = "" if api == "chat" else "completions_"
    real = sample("streams.json")[f"{prefix}stream_interval_{interval}"]
    where = tmp_path_factory.mktemp(request.param)
    try:
        fakes = (
            _sim(int(interval), where)
            if kind == "sim"
            else _fake_sglang(int(interval), where / "server.log")
        )
        for f in fakes:
            yield request.param, int(interval), real, record.record_stream(f.url, f.model, api)
    except pytest.fail.Exception as exc:
        key = f"stream_start[{request.param}]"
        if key in KNOWN_DIFFERENCES:
            pytest.xfail(KNOWN_DIFFERENCES[key])
        raise exc


def _token_positions(events: list[Any]) -> list[int]:
    """The running usage of each event that carries tokens (``continuous_usage_stats``)."""
    return [c for kind, c, _ in _sequence(events) if kind != "usage" and c is not None]


def _frame(events: list[Any]) -> list[tuple[Any, ...]]:
    """Everything but the token events, and the kind of the last token event (completions
    put the finish on it, chat sends a chunk of its own)."""
    seq = _sequence(events)
    tokens = [e for e in seq if e[0] != "usage" and e[1] is not None]
    return [e for e in seq if not (e[0] != "usage" and e[1] is not None)] + [
        ("last token event", tokens[-1][0] if tokens else None)
    ]


def test_the_stream_has_the_real_events_and_usage(
    request: pytest.FixtureRequest,
    stream_pair: tuple[str, int, dict[str, Any], dict[str, Any]],
) -> None:
    """Same events, same usage on each, for the same ``max_tokens`` and stream interval.

    Up to one difference SGLang makes and a fake cannot: the fake's token events end at
    0.5.23's nominal positions (token 1, then every ``interval``, the rest with the finish;
    ``OutputStreamer``), and the real stream's at a subset of them ending on the same total:
    when the HTTP side is late for an output, the tokenizer manager hands the next event
    everything queued (recorded at interval 1: tokens 2 and 3 in one chat event)."""
    name, interval, real, ours = stream_pair
    expect_difference(request, f"stream_events[{name}]")
    assert ours["status"] == real["status"] == 200
    assert ours["framing"] == real["framing"]
    assert _frame(ours["events"]) == _frame(real["events"])
    max_tokens = real["request"]["max_tokens"]
    nominal = sorted({*range(1, max_tokens + 1, interval), max_tokens})
    assert _token_positions(ours["events"]) == nominal
    got = _token_positions(real["events"])
    assert got == sorted(set(got)) and set(got) <= set(nominal) and got[-1] == max_tokens, got


def _orders(stream: dict[str, Any]) -> set[tuple[str, str]]:
    """Each kind of event with its keys in the order sent (events of one kind look alike)."""
    return {
        (kind, json.dumps(order))
        for (kind, _, _), order in zip(_sequence(stream["events"]), stream["key_orders"])
    }


def test_the_stream_events_have_the_real_fields_in_order(
    request: pytest.FixtureRequest,
    stream_pair: tuple[str, int, dict[str, Any], dict[str, Any]],
) -> None:
    """The field names of each kind of event, in the order 0.5.23 sends them (the plugin
    reads a few by byte pattern; a fake missing one, or adding one such as ``"usage":null``
    or ``tool_calls``, would let a parser depend on what no SGLang sends)."""
    name, _, real, ours = stream_pair
    expect_difference(request, f"stream_fields[{name}]")
    assert _orders(ours) == _orders(real)


def test_the_stream_content_type_is_the_real_one(
    request: pytest.FixtureRequest,
    stream_pair: tuple[str, int, dict[str, Any], dict[str, Any]],
) -> None:
    name, _, real, ours = stream_pair
    expect_difference(request, f"stream_content_type[{name}]")
    assert ours["content_type"].split(";")[0] == real["content_type"].split(";")[0]


# --------------------------------------------------------------------------------- tokenize


def _shape(value: Any) -> Any:
    """A reply's structure: keys with their types, a list as [the type of its items]."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [sorted({json.dumps(_shape(v)) for v in value})]
    return record.type_name(value)


@pytest.mark.parametrize("request_name", sorted(record.TOKENIZE_REQUESTS))
def test_tokenize_replies_have_the_real_shape(
    request: pytest.FixtureRequest, fake: Fake, request_name: str
) -> None:
    key = f"tokenize_{request_name}[{fake.kind}]"
    expect_difference(request, key)
    real = sample("tokenize.json")["requests"][request_name]
    status, reply = fake.http(
        "/tokenize", {**record.TOKENIZE_REQUESTS[request_name], "model": fake.model}
    )
    assert status == real["status"] == 200, reply
    assert _shape(reply) == _shape(real["reply"])
    count, tokens = reply["count"], reply["tokens"]
    if isinstance(count, list):
        assert count == [len(t) for t in tokens]
    else:
        assert count == len(tokens)


def test_the_plugin_counts_the_real_tokenize_replies() -> None:
    """The plugin's prompt sizer reads each real reply's count (a list of one, or a count)."""
    from pytest_kimi.workload.prompts import Tokenizer

    for name, entry in sample("tokenize.json")["requests"].items():
        reply = entry["reply"]
        expected = reply["count"] if isinstance(reply["count"], int) else None
        if expected is not None:
            assert Tokenizer._count(reply) == expected, name
