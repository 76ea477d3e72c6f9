"""Tests of managed servers: profile files, command lines, and the launcher's lifecycle.

The lifecycle tests run ``tests/fake_sglang`` (a fake ``sglang.launch_server`` that serves
the simulator) in each failure mode a real deployment has shown: a crash during startup,
a server that never gets ready, a crash in the middle of a sweep, and a server that
ignores SIGTERM and leaves children behind.  What they guard is what cost real time
before: waiting out a timeout for a server that died in the first second, and orphaned
GPU processes after a run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_kimi.server import (
    SGLANG,
    ExternalServer,
    ManagedServer,
    ProfileError,
    ServerError,
    ServerStartError,
    argv,
    described_server_info,
    load_profile,
    open_server,
    parse_profile,
    server_args,
)
from pytest_kimi.endpoint.discovery import discover
from pytest_kimi.server.procgroup import AUTOGROUP_SWITCH, nice_session
from support.timing import DEADLINE_S, poll_until
from support.paths import REPO, TESTS

FAKE_SGLANG = TESTS / "fake_sglang"
FAKE_VLLM = TESTS / "fake_vllm" / "server.py"
SERVERS = REPO / "servers"
PYTHONPATH = os.pathsep.join([str(FAKE_SGLANG), str(REPO)])
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# ---------------------------------------------------------------------- helpers


def write_profile(tmp_path: Path, text: str, name: str = "prof") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def fake_profile(
    tmp_path: Path,
    mode: str = "ok",
    *,
    args: dict[str, Any] | None = None,
    startup_s: float = 0.3,
    env: dict[str, str] | None = None,
    name: str = "fake",
    **top: Any,
) -> Path:
    """A managed profile running the fake sglang in ``mode``, written as YAML and loaded
    back, so the lifecycle tests also go through the file format."""
    data: dict[str, Any] = {
        "args": {
            "model-path": "/root/models/Kimi-K2.6",
            "tp-size": 8,
            "ep-size": 8,
            **(args or {}),
        },
        "env": {
            "PYTHONPATH": PYTHONPATH,
            "FAKE_SGLANG_MODE": mode,
            "FAKE_SGLANG_STARTUP_S": str(startup_s),
            **(env or {}),
        },
        "startup_timeout_s": 30,
        "stop_timeout_s": 5,
        **top,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (killed, not yet reaped by init) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> int:
    try:
        with NO_PROXY.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def chat(url: str) -> int:
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with NO_PROXY.open(req, timeout=10) as resp:
        return int(resp.status)


@pytest.fixture
def servers() -> Any:
    """Collects launched servers and stops every one of them, even after a failed assert."""
    started: list[ManagedServer | ExternalServer] = []
    yield started
    for server in started:
        server.stop()


# ---------------------------------------------------------------------- profiles


def test_minimal_profile_defaults(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "args:\n  model-path: /m\n", name="ep8-tuned")
    p = load_profile(path)
    assert p.name == "ep8-tuned"
    assert p.path == path
    assert p.engine == "sglang"
    assert p.command == [sys.executable, "-m", "sglang.launch_server"]
    assert p.args == {"model-path": "/m"}
    assert p.env == {}
    assert p.startup_timeout_s == 2400.0  # a 1 TB checkpoint takes 10-20 minutes
    assert p.stop_grace_s == 60.0
    assert p.stop_timeout_s == 30.0
    assert not p.external
    assert p.readiness_path() == "/health_generate"


def test_profile_fields_are_converted(tmp_path: Path) -> None:
    path = write_profile(
        tmp_path,
        """
name: kimi-ep8
command: python3 -m sglang.launch_server --log-level "warning"
args:
  --tp-size: 8          # leading dashes are accepted
  ep_size: 8            # as is server_info's spelling
  model-path: /root/models/Kimi-K2.6
env:
  NCCL_IB_DISABLE: 1
  NCCL_P2P_LEVEL: "5"
  CUDA_VISIBLE_DEVICES: null
startup_timeout_s: 60
stop_timeout_s: 2.5
""",
    )
    p = load_profile(path)
    assert p.name == "kimi-ep8"
    assert p.command == ["python3", "-m", "sglang.launch_server", "--log-level", "warning"]
    assert list(p.args) == ["tp-size", "ep-size", "model-path"]
    assert p.env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "5", "CUDA_VISIBLE_DEVICES": None}
    assert (p.startup_timeout_s, p.stop_timeout_s) == (60.0, 2.5)

    listed = write_profile(
        tmp_path,
        "command: [/opt/venv/bin/python, -m, sglang.launch_server]\nargs: {}\n",
        name="listed",
    )
    assert load_profile(listed).command[0] == "/opt/venv/bin/python"


def test_external_profile(tmp_path: Path) -> None:
    path = write_profile(
        tmp_path,
        """
start: ssh gpu-host systemctl start sglang-k26-ep8
stop: ssh gpu-host systemctl stop sglang-k26-ep8
url: http://127.0.0.1:30000/v1/
startup_timeout_s: 1200
""",
    )
    p = load_profile(path)
    assert p.external
    assert p.url == "http://127.0.0.1:30000"
    assert p.start == "ssh gpu-host systemctl start sglang-k26-ep8"
    assert p.command == [] and p.args == {}
    assert isinstance(open_server(p, tmp_path / "logs"), ExternalServer)
    with pytest.raises(ServerError, match="ExternalServer"):
        ManagedServer(p, tmp_path / "logs")
    with pytest.raises(ProfileError, match="no command line"):
        argv(p, "127.0.0.1", 1)


PROFILE_ERRORS = [
    ("args: [1, 2\n", ["invalid YAML at line 2", "expected ',' or ']'"]),
    (
        "args:\n  tp-size: 8\n  tp-size: 4\n",
        ["invalid YAML at line 3", "duplicate key 'tp-size' (first given on line 2)"],
    ),
    ("- a\n- b\n", ["must be a mapping of keys", "got list"]),
    ("", ["the file is empty", "'args:'", "'url:'"]),
    (
        "argz:\n  tp-size: 8\n",
        [
            "unknown key 'argz' (did you mean 'args'?)",
            "allowed keys: name, engine, command, args, env",
        ],
    ),
    ("args: 5\n", ["'args' must be a mapping of flag -> value", "got a number"]),
    (
        "args:\n  tp-size: 8\n  tp_size: 4\n",
        ["'tp-size' is given twice", "'tp-size' and 'tp_size'"],
    ),
    ("args:\n  8: true\n", ["args key 8 is not a flag name", "quote the key"]),
    ("args:\n  cuda-graph-bs: []\n", ["args 'cuda-graph-bs' is a list", "non-empty list"]),
    ("args:\n  port: http\n", ["args 'port' must be an integer in [1, 65535]", "'http'"]),
    (
        "args: {}\nstartup_timeout_s: soon\n",
        ["'startup_timeout_s' must be a number of seconds > 0", "'soon'"],
    ),
    ("args: {}\nstartup_timeout_s: -1\n", ["'startup_timeout_s' must be", "-1"]),
    ("args: {}\nstop_timeout_s: true\n", ["'stop_timeout_s' must be", "True"]),
    (
        "command: python -m x\nargs: {}\nurl: http://127.0.0.1:1\n",
        [
            "'command' and 'args' cannot be combined with 'url'",
            "(command/args)",
            "(start/stop/url)",
        ],
    ),
    (
        "start: systemctl start sglang\nstop: systemctl stop sglang\n",
        ["'start' and 'stop' need 'url:'"],
    ),
    ("url: ftp://127.0.0.1/\n", ["'url' must be an http(s) base URL", "'ftp://127.0.0.1/'"]),
    ("engine: trtllm\nargs: {}\n", ["unknown engine 'trtllm'", "known engines: sglang, vllm"]),
    (
        'command: "python -m \'x"\nargs: {}\n',
        ["'command' cannot be split into words", "No closing quotation"],
    ),
    ("command: 5\nargs: {}\n", ["'command' must be a string", "or a list of strings"]),
    (
        "args: {}\nenv:\n  NCCL_IB_DISABLE: yes\n",
        ["env NCCL_IB_DISABLE is a YAML boolean", "quote it"],
    ),
    ("args: {}\nenv: [1]\n", ["'env' must be a mapping", "got a list"]),
    ("args: {}\nenv:\n  A: [1]\n", ["env A must be a string or a number"]),
    ("name: ''\nargs: {}\n", ["'name' must be a non-empty string"]),
    ("url: http://127.0.0.1:1\nhealth_path: health\n", ["'health_path' must start with '/'"]),
    ("args:\n  model-path: m\nnice: 20\n", ["'nice' must be an integer from 0 (default) to 19"]),
    ("url: http://127.0.0.1:1\nnice: 5\n", ["'nice' cannot be combined with 'url'"]),
    ("engine: sglang\n", ["no 'args:'", "model-path"]),
]


@pytest.mark.parametrize(
    ("text", "expected"), PROFILE_ERRORS, ids=[f"e{i}" for i in range(len(PROFILE_ERRORS))]
)
def test_profile_errors(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write_profile(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nope\.yaml: file not found"):
        load_profile(tmp_path / "nope.yaml")


def test_parse_profile_from_mapping() -> None:
    p = parse_profile(
        {"args": {"model-path": "/m"}}, source="--server-profile", default_name="inline"
    )
    assert p.name == "inline" and p.path is None
    with pytest.raises(ProfileError, match=r"^--server-profile: unknown key 'x'"):
        parse_profile({"x": 1}, source="--server-profile", default_name="inline")


# ---------------------------------------------------------------------- argv


def test_argv_flags_and_free_port(tmp_path: Path) -> None:
    p = load_profile(
        write_profile(
            tmp_path,
            """
command: python -m sglang.launch_server
args:
  model-path: /root/models/Kimi-K2.6
  tp-size: 8
  mem-fraction-static: 0.88
  trust-remote-code: true
  enable-eplb: false
  chunked-prefill-size: null
  cuda-graph-bs-decode: [1, 2, 4]
  json-model-override-args: {rope_scaling: {factor: 2}}
""",
        )
    )
    assert argv(p, "127.0.0.1", 31234) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/root/models/Kimi-K2.6",
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.88",
        "--trust-remote-code",
        "--cuda-graph-bs-decode",
        "1",
        "2",
        "4",
        "--json-model-override-args",
        '{"rope_scaling":{"factor":2}}',
        "--host",
        "127.0.0.1",
        "--port",
        "31234",
    ]
    assert server_args(p) == {
        "model_path": "/root/models/Kimi-K2.6",
        "tp_size": 8,
        "mem_fraction_static": 0.88,
        "trust_remote_code": True,
        "enable_eplb": False,
        "cuda_graph_bs_decode": [1, 2, 4],
        "json_model_override_args": {"rope_scaling": {"factor": 2}},
    }


def test_argv_keeps_host_and_port_from_profile(tmp_path: Path) -> None:
    p = load_profile(
        write_profile(tmp_path, "args:\n  model-path: /m\n  host: 0.0.0.0\n  port: 30000\n")
    )
    words = argv(p, "127.0.0.1", 31234)
    assert words[3:] == ["--model-path", "/m", "--host", "0.0.0.0", "--port", "30000"]
    assert ManagedServer(p, tmp_path).host == "0.0.0.0"
    unpinned = load_profile(write_profile(tmp_path, "args: {}\n", name="u"))
    with pytest.raises(ValueError, match="needs a port"):
        argv(unpinned, "127.0.0.1", None)


def test_engine_render_args() -> None:
    assert SGLANG.render_args({"a": True, "b": False, "c": None, "d": "x y", "e": 1.5}) == [
        "--a",
        "--d",
        "x y",
        "--e",
        "1.5",
    ]
    assert SGLANG.default_command("/py") == ["/py", "-m", "sglang.launch_server"]


def test_example_profiles_load() -> None:
    files = sorted(SERVERS.glob("*.yaml"))
    assert {f.stem for f in files} >= {"ep8", "ep8-tuned", "ep4", "tp8-tuned", "ep8-eplb"}
    profiles = {f.stem: load_profile(f) for f in files}
    remote = profiles.pop("remote-ep8")
    assert (
        remote.external and remote.url == "http://gpu-host:30001" and remote.start and remote.stop
    )
    tiny, no_batching = profiles.pop("vllm-cpu-tiny"), profiles.pop("vllm-cpu-tiny-no-batching")
    assert tiny.engine == no_batching.engine == "vllm"
    assert tiny.env["VLLM_HOST_IP"] == "127.0.0.1", "vLLM's queues must stay on loopback"
    assert argv(tiny, port=1)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert server_args(no_batching) == {**server_args(tiny), "max_num_seqs": 1}
    sglang_cpu = profiles.pop("sglang-cpu-tiny", None)  # tests/sglang's real CPU engine
    if sglang_cpu is not None:
        assert sglang_cpu.engine == "sglang" and sglang_cpu.args["device"] == "cpu"
    for p in profiles.values():
        assert p.args["model-path"] == "/root/models/Kimi-K2.6"
        assert p.args["tp-size"] == 8
        assert p.args["trust-remote-code"] is True
        assert p.env["NCCL_IB_DISABLE"] == "1"
        assert "--disable-cuda-graph" not in argv(p, "127.0.0.1", 1)
    assert profiles["ep8"].args["max-running-requests"] == 64
    assert profiles["ep8-tuned"].args["max-running-requests"] == 256
    # the tuning is in flags SGLang 0.5.23 reads (num-continuous-decode-steps is never read)
    assert profiles["ep8-tuned"].args["cuda-graph-max-bs-decode"] == 256
    assert all("num-continuous-decode-steps" not in p.args for p in profiles.values())
    assert all(p.args["enable-metrics"] is True for p in profiles.values())
    assert profiles["ep4"].args["ep-size"] == 4
    assert "ep-size" not in profiles["tp8-tuned"].args
    for name in ("ep8", "ep8-tuned", "ep4", "tp8-tuned", "ep8-eplb"):
        assert profiles[name].startup_timeout_s >= 2400, name  # 10-20 min for Kimi K2
        assert profiles[name].stop_grace_s >= 60, name
    eplb = server_args(profiles["ep8-eplb"])
    assert eplb["enable_eplb"] is True
    assert {k: v for k, v in eplb.items() if k != "enable_eplb"} == server_args(
        profiles["ep8-tuned"]
    )


# ---------------------------------------------------------------------- lifecycle


def test_ready_health_and_server_info(tmp_path: Path, servers: list[Any]) -> None:
    profile = load_profile(
        fake_profile(
            tmp_path,
            args={"enable-eplb": True, "max-running-requests": 64, "disable-cuda-graph": False},
            startup_s=1.0,
            name="ep8-eplb",
        )
    )
    server = open_server(profile, tmp_path / "logs", progress_every_s=0.2)
    assert isinstance(server, ManagedServer)
    servers.append(server)
    messages: list[str] = []
    server.launch(progress=messages.append)

    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.log_path is not None and server.log_path.parent == tmp_path / "logs"
    assert re.fullmatch(r"ep8-eplb-\d{8}-\d{6}\.log", server.log_path.name)
    assert messages and all(m.startswith("ep8-eplb: starting for ") for m in messages)
    assert any("last log line: [" in m for m in messages)
    assert "--port" in server.command and "--enable-eplb" in server.command
    assert get(server.url + "/health_generate") == 200
    info = server.server_info()
    assert info["enable_eplb"] is True
    assert info["max_running_requests"] == 64
    assert (info["tp_size"], info["ep_size"]) == (8, 8)
    assert info["port"] == server.port
    assert info["sim"]["slowdown"] == 1.8  # the fake derives EPLB's cost from the flag
    assert server.flush_cache() is True
    assert server.alive() and server.crashed() is None
    pid = server.pid
    assert pid is not None and server.pgid == pid

    assert server.stop() == 0
    assert server.stop() == 0  # idempotent
    assert not server.alive() and not pid_alive(pid)
    assert server.crashed() is None  # we stopped it: not a crash
    assert "The server is fired up and ready to roll!" in server.log_tail()


def test_crash_at_start_reports_traceback_quickly(tmp_path: Path, servers: list[Any]) -> None:
    profile = load_profile(
        fake_profile(
            tmp_path, "crash-at-start", args={"tp-size": 2, "ep-size": 4}, startup_timeout_s=120
        )
    )
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.launch()
    elapsed = time.monotonic() - t0
    # reported when it happens, not when the startup timeout runs out
    assert elapsed < profile.startup_timeout_s, f"crash reported after {elapsed:.1f} s"
    err = info.value
    message = str(err)
    assert err.reason == "exited" and err.returncode == 1
    assert "exited with code 1 before it was ready" in message
    assert "Traceback (most recent call last)" in message
    assert "ZeroDivisionError" in message
    assert str(server.log_path) in message and err.log_path == server.log_path
    assert server.pid is not None and not pid_alive(server.pid)
    assert server.crashed() == 1


def test_unknown_flag_fails_before_the_launch(tmp_path: Path) -> None:
    """SGLang's own flag list is checked at load: no ten-minute start to learn of a typo."""
    with pytest.raises(ProfileError) as info:
        load_profile(fake_profile(tmp_path, args={"enable-eplbb": True}))
    text = str(info.value)
    assert "fake.yaml" in text and "'enable-eplbb' is not a flag of SGLang 0.5.23" in text
    assert "did you mean 'enable-eplb'" in text


def test_unknown_flag_fails_like_sglang(tmp_path: Path, servers: list[Any]) -> None:
    """A profile for another release skips the check; the server then refuses the flag."""
    path = fake_profile(tmp_path, args={"enable-turbo": True}, engine_version="0.0.1")
    profile = load_profile(path)
    assert any("not checked" in w for w in profile.flag_warnings)
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    with pytest.raises(ServerStartError, match="exited with code 2") as info:
        server.launch()
    assert "unrecognized arguments: --enable-turbo" in str(info.value)


def test_never_ready_times_out_and_is_stopped(tmp_path: Path, servers: list[Any]) -> None:
    profile = load_profile(fake_profile(tmp_path, "never-ready", startup_timeout_s=2))
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.launch()
    elapsed = time.monotonic() - t0
    message = str(info.value)
    # the configured timeout ended it (its reason and its words), and not before
    assert info.value.reason == "timeout"
    assert elapsed >= 1.9
    assert "not ready after 2 s" in message
    assert "startup_timeout_s in" in message and str(profile.path) in message
    assert "Loading safetensors checkpoint shards" in message
    assert str(server.log_path) in message
    assert server.pid is not None and not pid_alive(server.pid)
    assert server.crashed() is None


def test_crash_mid_sweep_is_detected(tmp_path: Path, servers: list[Any]) -> None:
    profile = load_profile(
        fake_profile(tmp_path, "crash-mid-sweep", env={"FAKE_SGLANG_CRASH_AFTER": "3"})
    )
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    server.launch()
    assert server.crashed() is None
    assert server.url is not None
    failed = False
    for _ in range(10):
        try:
            chat(server.url)
        except (urllib.error.URLError, ConnectionError, OSError):
            failed = True
            break
    assert failed, "the fake should have crashed"
    poll_until(lambda: server.crashed() is not None, "the crash noticed")
    assert server.crashed() == 1
    assert not server.alive()
    assert "simulated crash after 3 generation requests" in server.log_tail()
    server.stop()
    assert server.crashed() == 1 and server.returncode == 1


def test_ignore_sigterm_group_is_killed(tmp_path: Path, servers: list[Any]) -> None:
    profile = load_profile(
        fake_profile(tmp_path, "ignore-sigterm", stop_grace_s=0.5, stop_timeout_s=1)
    )
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    server.launch()
    assert server.log_path is not None
    match = re.search(r"scheduler child pid (\d+)", server.log_path.read_text())
    assert match, server.log_tail()
    child = int(match.group(1))
    leader = server.pid
    assert leader is not None and pid_alive(leader) and pid_alive(child)

    t0 = time.monotonic()
    server.stop()
    elapsed = time.monotonic() - t0
    # the grace was honoured; then SIGKILL (-9 below), which a server ignoring SIGTERM needs
    assert elapsed >= 0.9, f"stop took {elapsed:.1f} s"
    assert not pid_alive(leader), "server survived stop()"
    assert not pid_alive(child), "the server's child survived stop()"
    assert server.returncode == -9


def test_stop_while_starting(tmp_path: Path, servers: list[Any]) -> None:
    profile = load_profile(fake_profile(tmp_path, startup_s=60))
    server = open_server(profile, tmp_path / "logs", progress_every_s=0.05)
    servers.append(server)
    server.start()
    errors: list[BaseException] = []
    waiting = threading.Event()

    def wait() -> None:
        try:
            server.wait_ready(progress=lambda _: waiting.set())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert waiting.wait(DEADLINE_S), "never waiting for readiness"  # stop while it waits
    pid = server.pid
    assert pid is not None and pid_alive(pid)
    server.stop()
    waiter.join(timeout=DEADLINE_S)
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ServerStartError)
    assert errors[0].reason == "stopped"
    assert "stopped while starting" in str(errors[0])
    assert not pid_alive(pid)
    assert server.crashed() is None


def test_stop_before_start_and_single_use(tmp_path: Path) -> None:
    profile = load_profile(fake_profile(tmp_path))
    server = ManagedServer(profile, tmp_path / "logs")
    assert server.stop() is None
    with pytest.raises(ServerError, match="call start"):
        server.wait_ready()


def test_spawn_failure_is_reported(tmp_path: Path) -> None:
    profile = load_profile(
        write_profile(tmp_path, "command: /nonexistent/python -m sglang.launch_server\nargs: {}\n")
    )
    server = open_server(profile, tmp_path / "logs")
    with pytest.raises(ServerStartError, match="cannot run '/nonexistent/python'") as info:
        server.launch()
    assert info.value.reason == "spawn"


# ---------------------------------------------------------------------- external


def test_external_start_stop(tmp_path: Path, servers: list[Any]) -> None:
    port = free_port()
    pidfile = tmp_path / "sim.pid"
    # The sim answers /v1/models at once but /health_generate only after 1.5 s: the
    # launcher must wait for the latter.
    path = write_profile(
        tmp_path,
        yaml.safe_dump(
            {
                "start": f"{sys.executable} -m pytest_kimi.sim --port {port} --slow-start-s 1.5 "
                f"& echo $! > {pidfile}",
                "stop": f"kill $(cat {pidfile})",
                "url": f"http://127.0.0.1:{port}",
                "env": {"PYTHONPATH": str(REPO)},
                "startup_timeout_s": 30,
                "stop_timeout_s": 5,
            }
        ),
        name="remote-ep8",
    )
    server = open_server(load_profile(path), tmp_path / "logs")
    assert isinstance(server, ExternalServer)
    servers.append(server)
    t0 = time.monotonic()
    server.launch()
    assert time.monotonic() - t0 >= 1.4, "ready before /health_generate answered"
    sim_pid = int(pidfile.read_text())
    assert pid_alive(sim_pid)
    assert server.alive()
    assert "sim" in server.server_info()
    assert server.crashed() is None

    server.stop()
    assert not pid_alive(sim_pid)
    assert not server.alive()
    log = server.log_tail(100)
    assert "running stop command: kill" in log
    assert "stop command exited with code 0" in log


def test_external_start_failure_is_fast(tmp_path: Path, servers: list[Any]) -> None:
    path = write_profile(
        tmp_path,
        yaml.safe_dump(
            {
                "start": "echo 'ssh: connect to host gpu-7 port 22: No route to host' >&2; exit 255",
                "url": f"http://127.0.0.1:{free_port()}",
                "startup_timeout_s": 120,
            }
        ),
    )
    server = open_server(load_profile(path), tmp_path / "logs")
    servers.append(server)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.launch()
    # the start command's exit is final: not a wait for the startup timeout
    assert time.monotonic() - t0 < server.profile.startup_timeout_s
    assert info.value.reason == "start-failed"
    assert "start command exited with code 255" in str(info.value)
    assert "No route to host" in str(info.value)


def test_external_url_only_times_out(tmp_path: Path, servers: list[Any]) -> None:
    path = write_profile(
        tmp_path, yaml.safe_dump({"url": f"http://127.0.0.1:{free_port()}", "startup_timeout_s": 1})
    )
    server = open_server(load_profile(path), tmp_path / "logs")
    servers.append(server)
    with pytest.raises(ServerStartError, match="not ready after 1 s") as info:
        server.launch()
    assert "ConnectionRefusedError" in str(info.value)


# ---------------------------------------------------------------------- engines


def test_profile_values_expand_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_TEST_MODELS", "/data/models")
    monkeypatch.delenv("KIMI_TEST_UNSET", raising=False)
    path = write_profile(
        tmp_path,
        "args:\n  model-path: ${KIMI_TEST_MODELS}/kimi\n"
        "  tokenizer-path: ${KIMI_TEST_UNSET:-/fallback}\n"
        '  cuda-graph-bs-decode: ["${KIMI_TEST_UNSET:-1}", 2]\n'
        "env:\n  CACHE: ${KIMI_TEST_MODELS}/cache\n",
    )
    profile = load_profile(path)
    assert profile.args["model-path"] == "/data/models/kimi"
    assert profile.args["tokenizer-path"] == "/fallback"
    assert profile.args["cuda-graph-bs-decode"] == ["1", 2]
    assert profile.env["CACHE"] == "/data/models/cache"
    bad = write_profile(tmp_path, "args:\n  model-path: ${KIMI_TEST_UNSET}/kimi\n", "bad")
    with pytest.raises(
        ProfileError,
        match=r"bad.yaml: args 'model-path' uses \$\{KIMI_TEST_UNSET\}, "
        r"which is not set; export it or give a default",
    ):
        load_profile(bad)


def _fake_vllm_profile(tmp_path: Path, warm_s: float) -> Path:
    return write_profile(
        tmp_path,
        (
            f"engine: vllm\ncommand: {sys.executable} {FAKE_VLLM}\n"
            "args:\n  model: /models/tiny\n  served-model-name: tiny\n  max-num-seqs: 4\n"
            f'env:\n  FAKE_VLLM_WARM_S: "{warm_s}"\nnice: 5\nstartup_timeout_s: 30\n'
            "stop_timeout_s: 3\n"
        ),
        "fake-vllm",
    )


def test_vllm_ready_only_once_a_token_is_generated(tmp_path: Path, servers: list[Any]) -> None:
    """vLLM's /health answers before generation works; readiness waits for a real token."""
    server = open_server(
        load_profile(_fake_vllm_profile(tmp_path, warm_s=1.5)),
        tmp_path / "logs",
        progress_every_s=0.3,
    )
    servers.append(server)
    messages: list[str] = []
    started = time.monotonic()
    server.launch(progress=messages.append)
    assert time.monotonic() - started >= 1.5, "ready before a completion could succeed"
    assert get(server.url + "/health") == 200
    log = server.log_tail(200)
    assert "POST /v1/completions" in log and '"POST /v1/completions HTTP/1.1" 503' in log, log
    assert '"POST /v1/completions HTTP/1.1" 200' in log, log
    assert messages and all(m.startswith("fake-vllm: starting for ") for m in messages)
    assert server.pid is not None and server.pgid == server.pid, "nice execs in place"
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, server.pid) == min(ours + 5, 19)
    if Path(AUTOGROUP_SWITCH).exists() and Path(AUTOGROUP_SWITCH).read_text().strip() == "1":
        # the server's session weighs against the client's as a whole (nice_session)
        group = Path(f"/proc/{server.pid}/autogroup").read_text()
        assert group.rstrip().endswith("nice 5"), group
        assert "nice 5 for the server's whole session (its autogroup)" in log, log

    import asyncio

    info = asyncio.run(discover(server.url, api_key=None, model=None))
    assert info.model == "tiny" and info.server_info == {"version": "0.0-fake"}
    described = described_server_info(server.profile, info.server_info)
    assert described == {
        "engine": "vllm",
        "model": "/models/tiny",
        "served_model_name": "tiny",
        "max_num_seqs": 4,
        "version": "0.0-fake",
    }
    pid = server.pid
    server.stop()
    assert pid is not None and not pid_alive(pid)


def test_reported_server_info_wins_over_the_profile(tmp_path: Path) -> None:
    """SGLang reports its effective arguments, defaults included: that record is kept."""
    profile = load_profile(fake_profile(tmp_path, args={"enable-eplb": True}))
    reported = {"enable_eplb": True, "tp_size": 8, "version": "0.5"}
    assert described_server_info(profile, reported) == reported


# ---------------------------------------------------------------------- stop, secrets, ports


def test_stop_is_staged_leader_first_then_group(tmp_path: Path, servers: list[Any]) -> None:
    """SIGTERM to the main process alone first (SGLang shuts its schedulers down itself);
    children it leaves get the group SIGTERM; nothing survives."""
    profile = load_profile(
        fake_profile(
            tmp_path, env={"FAKE_SGLANG_SCHEDULERS": "2"}, stop_grace_s=20, stop_timeout_s=20
        )
    )
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    server.launch()
    assert server.log_path is not None
    children = [
        int(p) for p in re.findall(r"scheduler child pid (\d+)", server.log_path.read_text())
    ]
    assert len(children) == 2 and all(pid_alive(p) for p in children)
    assert server.stop() == 0
    assert not any(pid_alive(p) for p in [server.pid or 0, *children])
    log = server.log_path.read_text()
    leader = log.index("sent SIGTERM to the main process")
    group = log.index(f"sent SIGTERM to process group {server.pgid}")
    assert leader < group and "sent SIGKILL" not in log[leader:]
    assert "stop: SIGTERM to the main process, 20 s (stop_grace_s)" in log


def test_secrets_stay_out_of_log_record_and_errors(tmp_path: Path, servers: list[Any]) -> None:
    key, admin, token, custom = (
        "sk-test-" + "a" * 20,
        "admin-" + "b" * 20,
        "hf_" + "c" * 24,
        "custom-" + "d" * 16,
    )
    profile = load_profile(
        fake_profile(
            tmp_path,
            "crash-mid-sweep",
            args={"api-key": key},
            env={"HF_TOKEN": token, "MY_CREDS": custom, "FAKE_SGLANG_CRASH_AFTER": "1"},
            secret_env=["MY_CREDS"],
        )
    )
    assert profile.secret_env == {"MY_CREDS"}
    server = open_server(profile, tmp_path / "logs", record_dir=tmp_path / "servers")
    servers.append(server)
    server.launch()
    (record,) = (tmp_path / "servers").glob("*.json")
    rec = json.loads(record.read_text())
    assert rec["pid"] == server.pid and rec["port"] == server.port
    assert rec["owner_pid"] == os.getpid() and rec["name"] == "fake"
    assert "--api-key" in rec["command"] and key not in record.read_text()
    server.stop()
    assert not record.exists(), "removed once the group is gone"
    assert server.log_path is not None
    log = server.log_path.read_text()
    assert "api_key='<redacted>'" in log  # the fake logs its ServerArgs, key included
    assert "MY_CREDS=<redacted>" in log and "HF_TOKEN=<redacted>" in log
    for secret in (key, token, custom):
        assert secret not in log

    crash = load_profile(
        fake_profile(tmp_path, "crash-at-start", args={"api-key": key}, name="crash")
    )
    server = open_server(crash, tmp_path / "logs")
    servers.append(server)
    with pytest.raises(ServerStartError) as info:
        server.launch()
    assert key not in str(info.value) and "<redacted>" in str(info.value)
    del admin


def test_port_is_picked_below_the_ephemeral_range(tmp_path: Path) -> None:
    from pytest_kimi.server.ports import PORT_CEILING, PORT_FLOOR, _ephemeral_low, _free_port

    low = _ephemeral_low()
    for _ in range(20):
        port = _free_port("127.0.0.1")
        if low > PORT_FLOOR + 100:
            assert PORT_FLOOR <= port <= min(PORT_CEILING, low - 1)
    assert PORT_CEILING + 240 < 22000, "clear of SGLang's NCCL and DP-attention ports"


def test_server_info_asks_the_current_path_first() -> None:
    assert SGLANG.info_paths == ("/server_info", "/get_server_info")


def test_leftover_record_of_a_gone_process_is_dropped(tmp_path: Path) -> None:
    from pytest_kimi.server import leftovers

    records = tmp_path / "servers"
    records.mkdir()
    stale = records / "old.json"
    stale.write_text(
        json.dumps(
            {"pid": 2**22 + 12345, "pgid": 2**22 + 12345, "starttime": 1, "owner_pid": 2**22 + 1}
        )
    )
    (records / "junk.json").write_text("not json")
    assert leftovers.clear(records) == []
    assert not list(records.glob("*.json"))


def test_stop_profile_keys_are_validated(tmp_path: Path) -> None:
    p = load_profile(write_profile(tmp_path, "args: {}\nstop_grace_s: 0\nstop_timeout_s: 1\n"))
    assert (p.stop_grace_s, p.stop_timeout_s) == (0.0, 1.0)
    with pytest.raises(ProfileError, match="'stop_grace_s' must be a number of seconds >= 0"):
        load_profile(write_profile(tmp_path, "args: {}\nstop_grace_s: -1\n"))
    with pytest.raises(ProfileError, match="'secret_env' must be a list"):
        load_profile(write_profile(tmp_path, "args: {}\nsecret_env: TOKEN\n"))


def test_nice_session_is_a_no_op_without_autogroup(tmp_path: Path) -> None:
    """Where the kernel shares the CPU per process (no autogroup), plain nice already counts."""
    off = tmp_path / "sched_autogroup_enabled"
    off.write_text("0\n")
    assert nice_session(os.getpid(), 5, switch=str(off)) is None
    assert nice_session(os.getpid(), 5, switch=str(tmp_path / "absent")) is None
    on = tmp_path / "on"
    on.write_text("1\n")
    note = nice_session(2**22 + 12345, 5, switch=str(on))  # no such process
    assert note is not None and note.startswith("cannot set the nice of the server's session")


# ---------------------------------------------------------------------- SGLang 0.5.23's own ways


def _open_stream(url: str, opened: threading.Event) -> None:
    """A long stream, held open until the server goes away."""
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100_000,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with NO_PROXY.open(req, timeout=120) as resp:
            for _ in resp:
                opened.set()
    except (OSError, ValueError):
        pass
    finally:
        opened.set()


def _scheduler_pids(server: ManagedServer) -> list[int]:
    assert server.log_path is not None
    return [int(p) for p in re.findall(r"scheduler child pid (\d+)", server.log_path.read_text())]


def test_a_drain_held_by_an_open_stream_is_ended_by_the_escalation(
    tmp_path: Path, servers: list[Any]
) -> None:
    """SGLang 0.5.23 drains without limit after SIGTERM: an open stream holds it.  The
    staged stop (stop_grace_s, SIGTERM to the group, stop_timeout_s, SIGKILL) still ends it
    and every scheduler of it."""
    env = {"FAKE_SGLANG_STOP": "sglang", "FAKE_SGLANG_SCHEDULERS": "2", "FAKE_SGLANG_SPEED": "1"}
    profile = load_profile(fake_profile(tmp_path, env=env, stop_grace_s=1, stop_timeout_s=1))
    server = open_server(profile, tmp_path / "logs")
    assert isinstance(server, ManagedServer)
    servers.append(server)
    server.launch()
    assert server.url is not None and server.log_path is not None
    children = _scheduler_pids(server)
    assert len(children) == 2
    opened = threading.Event()
    threading.Thread(target=_open_stream, args=(server.url, opened), daemon=True).start()
    assert opened.wait(DEADLINE_S)
    t0 = time.monotonic()
    code = server.stop()
    took = time.monotonic() - t0
    log = server.log_path.read_text()
    assert "Gracefully exiting... Remaining number of requests 1" in log  # it did drain
    assert code == -9 and "after SIGKILL" in log  # and only the SIGKILL ended it
    assert took >= profile.stop_grace_s + profile.stop_timeout_s
    assert server.pid is not None and not pid_alive(server.pid)
    poll_until(lambda: not any(pid_alive(c) for c in children), "the schedulers gone")


def test_a_stop_before_the_first_request_kills_outright(tmp_path: Path, servers: list[Any]) -> None:
    """Until a request arrives SGLang has no SIGTERM handler: the stop is an exit -15, and
    its schedulers, which follow their parent, are gone with it."""
    env = {"FAKE_SGLANG_STOP": "sglang", "FAKE_SGLANG_SCHEDULERS": "1"}
    profile = load_profile(fake_profile(tmp_path, env=env))
    server = open_server(profile, tmp_path / "logs")
    assert isinstance(server, ManagedServer)
    servers.append(server)
    server.launch()
    (child,) = _scheduler_pids(server)
    assert server.stop() == -15
    assert server.log_path is not None and "after SIGKILL" not in server.log_path.read_text()
    poll_until(lambda: not pid_alive(child), "the scheduler gone")


def test_a_drain_with_nothing_in_flight_exits_on_its_own(
    tmp_path: Path, servers: list[Any]
) -> None:
    profile = load_profile(
        fake_profile(tmp_path, env={"FAKE_SGLANG_STOP": "sglang"}, stop_grace_s=30)
    )
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    server.launch()
    assert server.url is not None and chat(server.url) == 200  # SGLang's handler is now set
    assert server.stop() == 0
    assert server.log_path is not None and "after SIGKILL" not in server.log_path.read_text()


def test_a_crash_reports_sigkill_and_the_traceback_above_the_tail(
    tmp_path: Path, servers: list[Any]
) -> None:
    """A dying SGLang rank: its traceback, then the other ranks' output, then SIGKILL of the
    whole tree: exit -9, and the traceback is quoted although it is not in the last lines."""
    profile = load_profile(
        fake_profile(tmp_path, "crash-like-sglang", env={"FAKE_SGLANG_CRASH_AFTER": "2"})
    )
    server = open_server(profile, tmp_path / "logs")
    assert isinstance(server, ManagedServer)
    servers.append(server)
    server.launch()
    assert server.url is not None
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        for _ in range(5):
            chat(server.url)
    poll_until(lambda: server.crashed() is not None, "the crash noticed")
    assert server.crashed() == -9
    assert "Traceback" not in server.log_tail(40)
    excerpt = server.crash_excerpt(40)
    assert "RuntimeError: simulated scheduler crash after 2 generation requests" in excerpt
    assert excerpt.index("Traceback") < excerpt.index("--- last 40 log lines ---")
    server.stop()


def test_a_start_killed_by_a_signal_says_so(tmp_path: Path, servers: list[Any]) -> None:
    from pytest_kimi.server.supervised import describe_exit

    assert describe_exit(-9) == "was killed by SIGKILL (exit code -9)"
    assert describe_exit(1) == "exited with code 1"
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, signal\n"
        "print('Traceback (most recent call last):\\n  File \"x\"\\nOSError: boom', flush=True)\n"
        "for i in range(50):\n    print('[TP1] other rank', i, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    path = write_profile(tmp_path, f"command: {sys.executable} {script}\nargs: {{}}\n")
    server = open_server(load_profile(path), tmp_path / "logs")
    servers.append(server)
    with pytest.raises(ServerStartError) as info:
        server.launch()
    text = str(info.value)
    assert "was killed by SIGKILL (exit code -9) before it was ready" in text
    assert "OSError: boom" in text and "--- last traceback in the log ---" in text


def test_the_flush_sends_the_key_an_external_server_needs(
    tmp_path: Path, servers: list[Any]
) -> None:
    """A key-protected server behind an external profile (no args:) is flushed with the key
    the load client has; without it the note points at --api-key, not at profile args."""
    from pytest_kimi.server.ports import _free_port

    port = _free_port()
    managed = load_profile(
        fake_profile(
            tmp_path,
            args={"port": port, "api-key": "sk-a-0123456789", "admin-api-key": "adm-0123456789"},
        )
    )
    server = open_server(managed, tmp_path / "logs")
    servers.append(server)
    server.launch()
    assert server.flush_cache() is True  # the profile's admin key
    external = load_profile(write_profile(tmp_path, f"url: http://127.0.0.1:{port}\n", "ext"))
    outside = open_server(external, tmp_path / "logs")
    servers.append(outside)
    outside.launch()
    assert outside.flush_cache() is False
    assert "--api-key or KIMI_API_KEY" in str(outside.flush_error)
    assert "args:" in str(outside.flush_error) and "admin-api-key in" not in str(
        outside.flush_error
    )
    assert outside.flush_cache(api_key="sk-a-0123456789") is False  # the API key is not enough
    assert "was refused" in str(outside.flush_error)
    assert outside.flush_cache(api_key="adm-0123456789") is True


def test_sgl_force_shutdown_ends_the_drain_without_the_kill(
    tmp_path: Path, servers: list[Any]
) -> None:
    """What the Kimi profiles set: with SGL_FORCE_SHUTDOWN=1 an open stream no longer holds
    the stop until SIGKILL."""
    env = {"FAKE_SGLANG_STOP": "sglang", "FAKE_SGLANG_SPEED": "1", "SGL_FORCE_SHUTDOWN": "1"}
    profile = load_profile(fake_profile(tmp_path, env=env, stop_grace_s=30))
    server = open_server(profile, tmp_path / "logs")
    servers.append(server)
    server.launch()
    assert server.url is not None
    opened = threading.Event()
    threading.Thread(target=_open_stream, args=(server.url, opened), daemon=True).start()
    assert opened.wait(DEADLINE_S)
    assert server.stop() == 0
    assert server.log_path is not None and "after SIGKILL" not in server.log_path.read_text()
    for name in ("ep8", "ep8-tuned", "ep8-eplb", "ep4", "tp8-tuned"):
        assert load_profile(SERVERS / f"{name}.yaml").env["SGL_FORCE_SHUTDOWN"] == "1", name
