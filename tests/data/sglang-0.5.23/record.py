"""Record what a real SGLang 0.5.23 server says, so the fakes can be held to it.

Why: the fake SGLang (``tests/fake_sglang``) and the simulator (``pytest_kimi/sim``) were
written from SGLang's source, and fakes drift.  These samples are what the real server
answered; ``tests/unit/server/test_fakes_match_sglang.py`` (the normal suite, no SGLang needed) holds
both fakes to them.  Only shapes are kept where a value would be a machine path or a secret:
``/server_info`` is stored as its keys and value types, ``/metrics`` as metric families with
their label names, the model path is replaced by ``<model>``.

Regenerate (about two minutes on two cores; SGLang 0.5.23's CPU env from ``tox -e sglang``
and the tiny model from ``tests/engine/make_tiny_model.py``)::

    python tests/engine/make_tiny_model.py .kimi/models/tiny-llama
    python tests/data/sglang-0.5.23/record.py --python .tox/sglang/bin/python \\
        --model .kimi/models/tiny-llama

It starts the server twice (``--stream-interval 1`` and ``8``), each in its own process
group on a free 127.0.0.1 port, and always kills that group.  Standard library only, so any
Python runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "sglang"))  # tests/sglang/cpu_server.py

import cpu_server  # noqa: E402  (how the real server is started, shared with tests/sglang)

SGLANG_VERSION = "0.5.23"
MAX_TOKENS = 20
"""Tokens per recorded stream: with ``--stream-interval 8`` events end at 1, 9, 17, 20."""
STREAM_INTERVALS = (1, 8)
LAUNCH_FLAGS = cpu_server.LAUNCH_FLAGS
"""The flags of the CPU profile (issue 24), the ones the samples were recorded with."""
STREAM_REQUEST: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Say something about the sea."}],
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,
    "temperature": 0.0,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}
COMPLETIONS_STREAM_REQUEST: dict[str, Any] = {
    **{k: v for k, v in STREAM_REQUEST.items() if k != "messages"},
    "prompt": "Say something about the sea.",
}
"""The same stream through ``/v1/completions`` (the plugin's ``api="completions"``)."""
TOKENIZE_REQUESTS: dict[str, dict[str, Any]] = {
    "prompt": {"prompt": "Hello world, hello sea.", "add_special_tokens": False},
    "prompt_special": {"prompt": "Hello world, hello sea."},
    "prompt_list": {"prompt": ["Hello world.", "The sea is wide."], "add_special_tokens": False},
    "messages": {"messages": [{"role": "user", "content": "Hello world, hello sea."}]},
}
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(url: str, body: Any = None, timeout: float = 60.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    try:
        with _NO_PROXY.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def type_name(value: Any) -> str:
    """A JSON value's type, as the samples spell it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "dict"


def metric_families(text: str) -> dict[str, dict[str, Any]]:
    """``name -> {"type", "labels", "samples"}`` from a Prometheus text page: label names
    only (values can be the model path), sample suffixes seen (``_bucket``, ``_sum``...)."""
    families: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            families.setdefault(m[1], {"type": m[2], "labels": set(), "samples": set()})
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([^\s{]+)(?:\{(.*)\})?\s", line)
        if not m:
            continue
        name, labels = m[1], m[2] or ""
        family = next(
            (f for f in sorted(families, key=len, reverse=True) if name.startswith(f)), name
        )
        entry = families.setdefault(family, {"type": "untyped", "labels": set(), "samples": set()})
        entry["samples"].add(name[len(family) :])
        entry["labels"].update(k for k in re.findall(r'(\w+)="', labels) if k != "le")
    return {
        k: {"type": v["type"], "labels": sorted(v["labels"]), "samples": sorted(v["samples"])}
        for k, v in sorted(families.items())
    }


def normalise_event(data: str, model: str) -> Any:
    """One SSE ``data:`` payload with what differs per request or machine replaced."""
    if data == "[DONE]":
        return "[DONE]"
    event = json.loads(data)
    for key, placeholder in (("id", "<id>"), ("created", 0), ("model", "<model>")):
        if key in event:
            event[key] = placeholder
    return json.loads(json.dumps(event).replace(json.dumps(model)[1:-1], "<model>"))


def key_order(event: Any) -> list[list[str]]:
    """The keys of an event as sent, top level, the first choice's, its delta's and the
    usage's (the samples are written with sorted keys; a byte-level parser cares for order)."""
    if not isinstance(event, dict):
        return []
    choice = (event.get("choices") or [{}])[0]
    return [
        list(event),
        list(choice),
        list(choice.get("delta") or {}),
        list(event.get("usage") or {}),
    ]


def record_stream(url: str, model: str, api: str = "chat") -> dict[str, Any]:
    """One stream of :data:`STREAM_REQUEST` (``api="chat"``) or
    :data:`COMPLETIONS_STREAM_REQUEST` (``"completions"``), normalised."""
    chat = api == "chat"
    body = {**(STREAM_REQUEST if chat else COMPLETIONS_STREAM_REQUEST), "model": model}
    req = urllib.request.Request(
        url + ("/v1/chat/completions" if chat else "/v1/completions"),
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    raw = b""
    with _NO_PROXY.open(req, timeout=120) as resp:
        status, content_type = resp.status, resp.headers.get("Content-Type")
        raw = resp.read()
    text = raw.decode("utf-8")
    blocks = [b for b in text.split("\n\n") if b.strip()]
    events = []
    for block in blocks:
        assert block.startswith("data: "), block
        events.append(normalise_event(block[len("data: ") :], model))
    return {
        "request": {k: v for k, v in body.items() if k != "model"},
        "status": status,
        "content_type": content_type,
        "framing": "data: <json>\\n\\n" if text.endswith("\n\n") else "other",
        "events": events,
        "key_orders": [key_order(e) for e in events],
    }


def record_server(url: str, model: str, out: dict[str, Any]) -> None:
    """Everything but the streams, from a server that served nothing yet, then after two
    identical prompts (the second a prefix-cache hit)."""
    fresh = http(url + "/metrics")[1].decode()
    for path in ("/server_info", "/get_server_info"):
        status, body = http(url + path)
        info = json.loads(body) if status == 200 else {}
        out[path] = {
            "status": status,
            "keys": {k: type_name(v) for k, v in sorted(info.items())},
            "nested_keys": {
                k: sorted(v[0] if isinstance(v, list) and v and isinstance(v[0], dict) else v)
                for k, v in sorted(info.items())
                if isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict))
            },
            "version": info.get("version"),
            "launch_command_flags": sorted(
                w.split("=")[0]
                for w in str(info.get("launch_command", "")).split()
                if w.startswith("--")
            ),
        }
    tokenize = {}
    for name, body in TOKENIZE_REQUESTS.items():
        status, reply = http(url + "/tokenize", {**body, "model": model})
        tokenize[name] = {"request": body, "status": status, "reply": json.loads(reply)}
    out["tokenize"] = tokenize
    generate = {
        "model": model,
        "messages": [{"role": "user", "content": "The same prompt, twice: a cache hit. " * 8}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    usages = []
    for _ in range(2):
        status, body = http(url + "/v1/chat/completions", generate)
        usages.append(json.loads(body).get("usage"))
    time.sleep(1.0)  # the counters are written when the scheduler reports the finish
    after = http(url + "/metrics")[1].decode()
    out["metrics"] = {
        "fresh": metric_families(fresh),
        "after_requests": metric_families(after),
        "usage_of_the_two_requests": usages,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="the Python of an env with sglang==0.5.23")
    ap.add_argument("--model", default=os.environ.get("KIMI_TINY_MODEL"), help="the tiny model")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    if not args.model:
        ap.error("give --model (or set KIMI_TINY_MODEL): tests/engine/make_tiny_model.py DEST")
    model = str(Path(args.model).resolve())
    logs = Path(tempfile.mkdtemp(prefix="sglang-record-"))
    print(f"server logs under {logs}")
    server: dict[str, Any] = {}
    streams: dict[str, Any] = {}
    for interval in STREAM_INTERVALS:
        log = logs / f"server-stream-interval-{interval}.log"
        for attempt in range(3):
            url, _, proc = cpu_server.launch(
                args.python, model, log, "--stream-interval", str(interval)
            )
            try:
                cpu_server.wait_ready(url, proc, log, args.ready_timeout)
                break
            except cpu_server.NotReady:
                cpu_server.stop(proc)
                # a free port can be taken by the time the server binds it (SGLang picks
                # its own internal ports too): another port, twice; anything else is fatal
                if attempt == 2 or "address already in use" not in log.read_text():
                    raise SystemExit(str(sys.exc_info()[1])) from None
        try:
            if not server:
                record_server(url, model, server)
            streams[f"stream_interval_{interval}"] = record_stream(url, model)
            streams[f"completions_stream_interval_{interval}"] = record_stream(
                url, model, "completions"
            )
        finally:
            cpu_server.stop(proc)
    meta = {
        "sglang": SGLANG_VERSION,
        "launch_flags": LAUNCH_FLAGS,
        "recorded_with": "tests/data/sglang-0.5.23/record.py",
        "model": "tests/engine/make_tiny_model.py (a 4-layer Llama, byte-level BPE)",
    }
    for name, body in (
        (
            "server_info.json",
            {"meta": meta, **{k: server[k] for k in ("/server_info", "/get_server_info")}},
        ),
        ("metrics.json", {"meta": meta, **server["metrics"]}),
        ("tokenize.json", {"meta": meta, "requests": server["tokenize"]}),
        ("streams.json", {"meta": meta, **streams}),
    ):
        text = json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False)
        assert model not in text, f"{name} would hold the model's path"
        (args.out / name).write_text(text + "\n")
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
