"""Secrets never leave the process: no API key in baselines, reports, logs or the terminal.

The fake SGLang (tests/fake_sglang) answers ``/server_info`` as 0.5.23 does: ``api_key`` and
``admin_api_key`` in clear, ``launch_command`` with ``--api-key VALUE --admin-api-key VALUE``
verbatim, and it logs its ``ServerArgs`` (key included) at start, like the real launcher.  A
gate flow with every output on must leave no trace of either key anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from pytest_kimi.scrub import REDACTED, is_secret_name, scrub, scrub_argv, scrub_text
from support.paths import REPO

FAKE = REPO / "tests" / "fake_sglang"

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=32, trials=2, warmup=1)
def test_sweep():
    pass
"""
RECORD = ("--update-baselines", "--perf-max-trials=2")
"""Record a baseline (every output then has provenance to leak) from as few trials as the
marker's: the keys would be in the file however many trials it holds."""

API_KEY = "sk-live-" + "a1b2c3d4e5f6a7b8c9d0"
ADMIN_KEY = "adm1n-" + "Zq9Xw8Vu7Ts6Rr5Qp4"
HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"


def _all_text(root: Path) -> dict[Path, str]:
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            out[path] = path.read_bytes().decode("utf-8", "replace")
    return out


def _leaks(texts: dict[Path, str], *secrets: str) -> list[str]:
    return [
        f"{path}: {secret[:6]}..."
        for path, text in texts.items()
        for secret in secrets
        if secret in text
    ]


def _no_key_fields(info: dict[str, object]) -> bool:
    """The allow-list stores neither key field nor either flag; the simulator's own knob (a
    fake SGLang serves through it) says, redacted, that a key is required."""
    args = info.get("launch_command", {})
    assert isinstance(args, dict)
    sim = info.get("sim", {})
    assert isinstance(sim, dict)
    return (
        not {"api_key", "admin_api_key"} & (set(info) | set(args.get("args", {})))
        and sim.get("api_key") == REDACTED
    )


def _managed_profile(pytester: pytest.Pytester) -> tuple[Path, str]:
    marker = f"/models/kimi-secret-{uuid.uuid4().hex[:12]}"
    env = {
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
        "FAKE_SGLANG_STARTUP_S": "0.3",
        "HF_TOKEN": HF_TOKEN,
    }
    env_yaml = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in env.items())
    path = pytester.path / "ep8-keyed.yaml"
    path.write_text(
        f"args:\n  model-path: {marker}\n  tp-size: 8\n  ep-size: 8\n"
        f"  max-running-requests: 64\n  api-key: {API_KEY}\n  admin-api-key: {ADMIN_KEY}\n"
        f"env:\n{env_yaml}\nstartup_timeout_s: 60\nstop_timeout_s: 3\n"
    )
    return path, marker


def _every_output(pytester: pytest.Pytester) -> list[str]:
    out = pytester.path / "out"
    return [
        f"--perf-json={out / 'perf.json'}",
        f"--perf-markdown={out / 'perf.md'}",
        f"--perf-html={out / 'html'}",
        f"--junitxml={out / 'junit.xml'}",
        "-rA",
    ]


def test_managed_sglang_key_reaches_no_file_and_no_terminal(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    profile, _ = _managed_profile(pytester)
    run = pytester.runpytest_subprocess(
        "-m",
        "perf",
        f"--server-profile={profile}",
        *RECORD,
        *_every_output(pytester),
        timeout=300,
    )
    run.assert_outcomes(passed=1)
    texts = _all_text(pytester.path)
    baseline = next(p for p in texts if p.suffix == ".yaml" and "baselines" in p.parts)
    logs = [p for p in texts if p.suffix == ".log"]
    assert logs, "the managed server's log copy is kept under .kimi/logs"
    assert "ServerArgs(" in "".join(texts[p] for p in logs), "the fake logged its arguments"
    # /server_info had the keys in four places (api_key, admin_api_key and both flags of
    # launch_command): the allow-list stores none of those fields, the flags of the rest
    info = yaml.safe_load(texts[baseline])["provenance"]["server_info"]
    assert info["max_running_requests"] == 64 and info["launch_command"]["args"]["tp_size"] == "8"
    assert _no_key_fields(info), info
    terminal = "\n".join(run.outlines + run.errlines)
    del texts[profile]  # the user's own profile holds the keys; nothing the plugin wrote may
    assert not _leaks({**texts, Path("<terminal>"): terminal}, API_KEY, ADMIN_KEY, HF_TOKEN)


def test_external_endpoint_key_reaches_no_file_and_no_terminal(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """``--endpoint=URL --api-key=KEY`` against a server that reports the key back."""
    port_file = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}", "FAKE_SGLANG_STARTUP_S": "0"}
    from pytest_kimi.server.ports import _free_port  # a free loopback port

    port = _free_port()
    with open(port_file, "wb") as log:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang.launch_server",
                "--model-path",
                "/models/kimi-ext",
                "--port",
                str(port),
                "--api-key",
                API_KEY,
                "--admin-api-key",
                ADMIN_KEY,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready to roll" not in port_file.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, port_file.read_text()
            time.sleep(0.05)
        pytester.makepyfile(test_suite=SUITE)
        run = pytester.runpytest_subprocess(
            "-m",
            "perf",
            f"--endpoint=http://127.0.0.1:{port}",
            f"--api-key={API_KEY}",
            *RECORD,
            *_every_output(pytester),
            timeout=300,
        )
        run.assert_outcomes(passed=1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    texts = _all_text(pytester.path)
    baselines = [t for p, t in texts.items() if "baselines" in p.parts and p.suffix == ".yaml"]
    assert baselines
    for text in baselines:
        info = yaml.safe_load(text)["provenance"]["server_info"]
        assert _no_key_fields(info), info
    terminal = "\n".join(run.outlines + run.errlines)
    assert not _leaks({**texts, Path("<terminal>"): terminal}, API_KEY, ADMIN_KEY)


# ------------------------------------------------------------------ the scrubber itself


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "admin_api_key",
        "hf_token",
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "watermark_key",
        "db_password",
        "client_secret",
        "authorization",
        "api-key",
        "apiKey",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        # SGLang configuration that a substring rule on "token"/"key" would wrongly hide
        "max_total_tokens",
        "tokenizer_path",
        "skip_tokenizer_init",
        "max_prefill_tokens",
        "token_aligner",
        "enable_token_filter",
        "kv_cache_dtype",
        "num_continuous_decode_steps",
    ],
)
def test_configuration_names_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "text, kept",
    [
        (f"python -m sglang.launch_server --api-key {API_KEY} --port 30001", "--port 30001"),
        (f"--api-key={API_KEY} --tp-size 8", "--tp-size 8"),
        (f"--admin-api-key '{ADMIN_KEY}'", "--admin-api-key"),
        (
            f"ServerArgs(model_path='/m', api_key='{API_KEY}', max_total_tokens=5)",
            "max_total_tokens=5",
        ),
        (f'{{"api_key": "{API_KEY}", "max_tokens": 5}}', '"max_tokens": 5'),
        (f"HF_TOKEN={HF_TOKEN} NCCL_IB_DISABLE=1", "NCCL_IB_DISABLE=1"),
        (f"https://user:{API_KEY}@gw.example/v1", "@gw.example/v1"),
        (f"https://gw.example/v1?api_key={API_KEY}&x=1", "&x=1"),
        (f"Authorization: Bearer {API_KEY}", "Authorization: Bearer"),
        (f"failed: {HF_TOKEN} rejected", "rejected"),
    ],
)
def test_scrub_text_removes_the_secret_and_keeps_the_rest(text: str, kept: str) -> None:
    out = scrub_text(text)
    assert API_KEY not in out and ADMIN_KEY not in out and HF_TOKEN not in out
    assert REDACTED in out and kept in out
    assert scrub_text(out) == out, "idempotent"


def test_scrub_keeps_unset_keys_visible_and_numbers_whole() -> None:
    info = {
        "api_key": API_KEY,
        "admin_api_key": None,
        "enable_token_filter": True,
        "max_total_tokens": 5,
        "nested": [{"hf_token": HF_TOKEN}],
        "argv": ["--api-key", API_KEY, "--port", "1"],
    }
    assert scrub(info) == {
        "api_key": REDACTED,
        "admin_api_key": None,
        "enable_token_filter": True,
        "max_total_tokens": 5,
        "nested": [{"hf_token": REDACTED}],
        "argv": ["--api-key", REDACTED, "--port", "1"],
    }
    assert scrub_argv(["x", f"--hf-token={HF_TOKEN}"]) == ["x", f"--hf-token={REDACTED}"]


def test_registered_literal_is_scrubbed_anywhere() -> None:
    from pytest_kimi.scrub import register_secret

    odd = "plain-" + uuid.uuid4().hex
    register_secret(odd)
    assert scrub_text(f"error: server said {odd}!") == f"error: server said {REDACTED}!"


@pytest.mark.parametrize("flag", ["--api", "--ap", "--api-k", "--admin", "--ad", "--admin-api"])
def test_a_key_flag_sglangs_parser_would_expand_is_scrubbed(flag: str) -> None:
    """SGLang 0.5.23's parser keeps argparse's allow_abbrev: each of these is its --api-key
    or --admin-api-key, so launch_command and logs carry the key after it."""
    key = "k3y-not-shaped-like-any-vendor"
    line = f"launch_command: python -m sglang.launch_server {flag} {key} --port 30000"
    assert key not in scrub_text(line) and "--port 30000" in scrub_text(line)
    assert key not in scrub_text(f"{flag}={key}")
    assert key not in scrub_argv([flag, key]) and key not in " ".join(scrub_argv([f"{flag}={key}"]))


@pytest.mark.parametrize("flag", ["--a", "--port", "--tp", "--adm-x", "--apis"])
def test_flags_that_are_no_key_are_kept(flag: str) -> None:
    """Ambiguous (``--a``), other flags, and words that are no prefix keep their value."""
    assert scrub_text(f"{flag} value123") == f"{flag} value123"


# ------------------------------------------------------------ a key wrapped in base64

WRAPPED_KEY = "sk-proj-" + "Wr4pp3dK3yB64x" + "q" * 12


def test_a_base64_wrapped_key_in_a_kept_field_reaches_no_sink(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """``revision`` is allow-listed (it says which weights ran), so only the scrubber stands
    between its value and the baseline; a tester's server put a base64-wrapped ``sk-`` key
    there, and it reached the baseline, the JSON report and the history.  Neither the key nor
    its encoding may reach any of them now, while an honest ``revision`` beside it is kept."""
    import base64

    from pytest_kimi.sim import SimConfig
    from pytest_kimi.sim.process import SimProcess

    wrapped = base64.b64encode(WRAPPED_KEY.encode()).decode()
    config = SimConfig(
        speed=20.0,
        model="kimi-b64",
        server_args={"revision": wrapped, "tokenizer_revision": "a3f9c2e1d4b5", "tp_size": 8},
    )
    sim = SimProcess(config, log_dir=tmp_path / "sim-logs").start()  # outside pytester.path
    try:
        pytester.makepyfile(test_suite=SUITE)
        history = pytester.path / "hist" / "history.db"
        run = pytester.runpytest_subprocess(
            "-m",
            "perf",
            f"--endpoint={sim.url}",
            *RECORD,
            *_every_output(pytester),
            f"--perf-history=sqlite:///{history}",
            timeout=300,
        )
    finally:
        sim.stop()
    run.assert_outcomes(passed=1)
    texts = _all_text(pytester.path)
    written = {p.relative_to(pytester.path).as_posix() for p in texts}
    assert "out/perf.json" in written and "hist/history.db" in written, sorted(written)
    terminal = "\n".join(run.outlines + run.errlines)
    # the key, its encoding, and any long piece of the encoding
    pieces = [WRAPPED_KEY, wrapped, wrapped[:24], wrapped[-24:]]
    assert not _leaks({**texts, Path("<terminal>"): terminal}, *pieces)
    baseline = next(p for p in texts if p.suffix == ".yaml" and "baselines" in p.parts)
    info = yaml.safe_load(texts[baseline])["provenance"]["server_info"]
    assert info["revision"] == REDACTED and info["tp_size"] == 8, info
    report = json.loads(texts[pytester.path / "out" / "perf.json"])
    assert report["endpoint"]["server_info"]["revision"] == REDACTED


def test_the_message_a_tester_saw_garbled_is_kept() -> None:
    """``passwd: not valid JSON`` became ``passwd: <redacted> valid JSON``: a message about a
    value, scrubbed as if it were one (the properties are in test_secret_shapes.py)."""
    assert scrub_text("passwd: not valid JSON") == "passwd: not valid JSON"
    assert scrub({"reason": "api_key: missing"}) == {"reason": "api_key: missing"}
    assert scrub_text(f"passwd: {API_KEY} valid") == f"passwd: {REDACTED} valid"
