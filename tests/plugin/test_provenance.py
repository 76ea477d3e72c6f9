"""Provenance that changes only when the deployment changed (SGLang 0.5.23's /server_info).

0.5.23 adds ``launch_command`` (with the random ``--port`` the launcher picked),
``startup_time`` timings, ``internal_states`` and a per-launch ``random_seed``: an unchanged
server must show zero changes next to its verdict, a changed flag must be named once.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_kimi.baseline import Provenance, provenance_diff
from pytest_kimi.endpoint.serverinfo import clean_server_info, parse_launch_command
from support.paths import REPO

FAKE = REPO / "tests" / "fake_sglang"
sys.path.insert(0, str(FAKE))
from sglang import launch_server as fake  # noqa: E402  (the fake SGLang 0.5.23)

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=32, trials=2, warmup=1)
def test_sweep():
    pass
"""


def _info(*flags: str, startup_s: float = 600.0) -> dict[str, Any]:
    argv = [
        "--model-path",
        "/models/kimi",
        "--tp-size",
        "8",
        "--ep-size",
        "8",
        "--host",
        "127.0.0.1",
        *flags,
    ]
    return fake.server_info_of(fake.build_parser().parse_args(argv), argv, startup_s)


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [
        str(c) for c in provenance_diff(Provenance(server_info=old), Provenance(server_info=new))
    ]


def test_relaunch_on_another_port_is_no_change() -> None:
    a = _info("--port", "31001", "--max-running-requests", "64", startup_s=612.4)
    b = _info("--port", "42777", "--max-running-requests", "64", startup_s=655.0)
    assert a["launch_command"] != b["launch_command"] and a["random_seed"] != b["random_seed"]
    assert _diff(a, b) == []


@pytest.mark.parametrize(
    "old, new, named",
    [
        (
            ["--max-running-requests", "64"],
            ["--max-running-requests", "128"],
            "max_running_requests: 64 -> 128",
        ),
        ([], ["--enable-eplb"], "enable_eplb: false -> true"),
    ],
)
def test_a_changed_flag_is_named_once(old: list[str], new: list[str], named: str) -> None:
    changes = _diff(_info("--port", "31001", *old), _info("--port", "31002", *new))
    assert changes == [named]


def test_a_flag_only_the_command_line_shows_is_named() -> None:
    """Passing a default explicitly changes what was asked for, not the resolved value."""
    changes = _diff(_info("--port", "1"), _info("--port", "2", "--kv-cache-dtype", "auto"))
    assert changes == ["launch_command.args.kv_cache_dtype: (absent) -> auto"]


def test_launch_command_parsed_into_args() -> None:
    parsed = parse_launch_command(
        "python3 -m sglang.launch_server --model-path /m --cuda-graph-bs-decode 1 2 4 --enable-eplb "
        "--api-key=sk-abc --port 30001"
    )
    assert parsed == {
        "program": "python3 -m sglang.launch_server",
        "args": {
            "api_key": "sk-abc",
            "cuda_graph_bs_decode": ["1", "2", "4"],
            "enable_eplb": True,
            "model_path": "/m",
            "port": "30001",
        },
    }


def test_clean_server_info_is_idempotent_and_keeps_stable_fields() -> None:
    raw = _info("--port", "31001", "--api-key", "sk-verysecretvalue123", "--enable-eplb")
    once = clean_server_info(raw)
    assert clean_server_info(once) == once
    assert once["tp_size"] == 8 and once["enable_eplb"] is True and once["version"] == "0.5.23"
    assert once["launch_command"] == {
        "args": {"enable_eplb": True, "ep_size": "8", "model_path": "/models/kimi", "tp_size": "8"}
    }, "flags on the allow-list only: no --api-key, --host or --port"
    # neither the keys nor what changes at every start is stored at all
    for gone in ("api_key", "admin_api_key", "startup_time", "internal_states", "random_seed"):
        assert gone not in once, gone
    assert "host" not in once and "port" not in once
    assert "sk-verysecretvalue123" not in repr(once)


def test_what_the_allow_list_drops_shows_as_a_digest() -> None:
    """A field the list does not name is not stored, but its change is still visible."""
    a = clean_server_info({"tp_size": 8, "log_level": "info", "port": 1})
    b = clean_server_info({"tp_size": 8, "log_level": "debug", "port": 2})
    c = clean_server_info({"tp_size": 8, "log_level": "info", "port": 3})
    assert "log_level" not in a and "info" not in repr(a)
    assert a["unlisted"].startswith("1 setting, sha256:")
    assert a == c, "a new port is no change"
    assert _diff(a, b) == [f"unlisted: {a['unlisted']} -> {b['unlisted']}"]


@pytest.mark.parametrize(
    "flag, value, named",
    [
        ("--enable-eplb", None, "enable_eplb: false -> true"),
        ("--max-running-requests", "128", "max_running_requests: 64 -> 128"),
        ("--chunked-prefill-size", "4096", "chunked_prefill_size: null -> 4096"),
        ("--tp-size", "16", "tp_size: 8 -> 16"),
        ("--ep-size", "4", "ep_size: 8 -> 4"),
        ("--cuda-graph-max-bs-decode", "128", "cuda_graph_max_bs_decode: null -> 128"),
        ("--attention-backend", "triton", "attention_backend: null -> triton"),
        ("--mem-fraction-static", "0.8", "mem_fraction_static: null -> 0.8"),
    ],
)
def test_the_allow_list_keeps_every_tuning_knob(flag: str, value: str | None, named: str) -> None:
    """A provenance diff still names the knob that moved throughput, while neither side
    stores what changes at every start."""
    base = ["--max-running-requests", "64"]
    # a flag given again overrides the first (argparse): --tp-size 8 ... --tp-size 16
    new = [*base, flag] if value is None else [*base, flag, value]
    old_info, new_info = _info("--port", "1", *base), _info("--port", "2", *new)
    assert _diff(old_info, new_info) == [named]
    for kept in (Provenance(server_info=old_info), Provenance(server_info=new_info)):
        assert not {"port", "startup_time", "random_seed"} & set(kept.server_info)


def test_stream_interval_and_the_simulator_knobs_are_kept() -> None:
    info = clean_server_info(
        {"stream_interval": 4, "sim": {"speed": 10.0, "seed": 3, "pid": 4242}, "port": 80}
    )
    assert info == {"stream_interval": 4, "sim": {"speed": 10.0, "seed": 3}}


def _profile(pytester: pytest.Pytester, marker: str, max_running: int) -> Path:
    env = {"PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}", "FAKE_SGLANG_STARTUP_S": "0.3"}
    env_yaml = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items())
    path = pytester.path / "ep8.yaml"
    path.write_text(
        f"args:\n  model-path: {marker}\n  tp-size: 8\n  ep-size: 8\n"
        f"  max-running-requests: {max_running}\nenv:\n{env_yaml}\n"
        f"startup_timeout_s: 60\nstop_timeout_s: 3\n"
    )
    return path


def _changes(pytester: pytest.Pytester, profile: Path, *extra: str) -> list[str]:
    report = pytester.path / f"perf-{uuid.uuid4().hex[:6]}.json"
    run = pytester.runpytest_subprocess(
        "-m", "perf", f"--server-profile={profile}", f"--perf-json={report}", *extra, timeout=300
    )
    assert run.ret in (0, 1), run.outlines[-20:]
    (test,) = json.loads(report.read_text())["tests"]
    return list(test.get("provenance_changes") or [])


def test_rerun_of_an_unchanged_managed_server_lists_no_change(pytester: pytest.Pytester) -> None:
    """Each launch gets a fresh port, seed and startup timings; none of that is a change."""
    pytester.makepyfile(test_suite=SUITE)
    marker = f"/models/kimi-prov-{uuid.uuid4().hex[:10]}"
    profile = _profile(pytester, marker, 64)
    # (a baseline of the marker's trials: its provenance is what the reruns compare with)
    assert _changes(pytester, profile, "--update-baselines", "--perf-max-trials=2") == []
    baseline = next((pytester.path / "baselines").rglob("*.yaml")).read_text()
    assert "launch_command" in baseline and "max_running_requests" in baseline
    # what changes at every start is not in the file at all (each re-record's diff was noisier)
    saved = yaml.safe_load(baseline)["provenance"]["server_info"]
    for gone in ("port", "host", "startup_time", "random_seed", "internal_states"):
        assert gone not in saved, gone
    assert "pid" not in saved["sim"] and "port" not in saved["launch_command"]["args"]
    assert _changes(pytester, profile) == []
    _profile(pytester, marker, 128)
    # (the fake serves through the simulator, whose own knobs sit under "sim.")
    changes = [c for c in _changes(pytester, profile) if not c.startswith("sim.")]
    assert changes == ["max_running_requests: 64 -> 128"]
