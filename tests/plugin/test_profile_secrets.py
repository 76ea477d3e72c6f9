"""A server profile's secrets, worked out once (``profile_secrets``) and never shown.

``secret_env`` marks environment variables whose values are secret though their names do not
say so (``DEPLOY_CRED``), including variables the profile does not set but the server inherits
from the plugin's environment.  The launcher scrubs them from its log; the plugin must register
them with the scrubber too, or a value that reaches ``/server_info`` (here through a presigned
tokenizer URL in the arguments) is written to the report and the baseline in clear.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.scrub import REDACTED
from pytest_kimi.server import ServerProfile, open_server, parse_profile, profile_secrets
from support.paths import REPO

FAKE = REPO / "tests" / "fake_sglang"

# long enough for the scrubber (short literals are not registered), unlike anything else here
CRED = "cred-" + "Q7w2E9r4T1y8U5i3O6p0"
TOKEN = "hf_" + "ZyXwVuTsRqPoNmLkJiHg9876"
KEY = "sk-test-" + "m3n4b5v6c7x8z9l0k1j2"


def _profile(**data: Any) -> ServerProfile:
    return parse_profile(
        {"args": {"model-path": "/m"}, **data}, source="test.yaml", default_name="test"
    )


# ------------------------------------------------------------------------- the function


def test_secret_named_args_and_env_values() -> None:
    # a list under a one-value flag is refused by 0.5.23's flag check; an engine_version with
    # no flag list shipped skips that check, so the scrubber still meets a list of keys
    profile = _profile(
        engine_version="0.0.1-no-flag-list",
        args={
            "model-path": "/m",
            "api-key": KEY,
            "admin-api-key": ["adm-1-secret-value", "adm-2-secret-value"],
            "max-total-tokens": 4096,  # "tokens" is configuration, not a secret
            "served-model-name": "kimi",
        },
        env={"HF_TOKEN": TOKEN, "NCCL_IB_DISABLE": "1", "CACHE": "/cache"},
    )
    assert profile_secrets(profile, environ={}) == sorted(
        [KEY, "adm-1-secret-value", "adm-2-secret-value", TOKEN]
    )


def test_secret_env_values_set_by_the_profile() -> None:
    profile = _profile(env={"DEPLOY_CRED": CRED, "OTHER": "plain"}, secret_env=["DEPLOY_CRED"])
    assert profile_secrets(profile, environ={}) == [CRED]


def test_secret_env_values_inherited_from_the_environment() -> None:
    """A profile may mark a variable it does not set: the server inherits it."""
    profile = _profile(secret_env=["DEPLOY_CRED", "UNSET_CRED"])
    environ = {"DEPLOY_CRED": CRED, "PATH": "/usr/bin", "HF_TOKEN": TOKEN}
    # only what secret_env names: a secret-named variable of the environment is the
    # scrubber's (NAME=value) business, not the profile's
    assert profile_secrets(profile, environ=environ) == [CRED]


def test_profile_value_and_inherited_value_both_count() -> None:
    profile = _profile(env={"DEPLOY_CRED": CRED}, secret_env=["DEPLOY_CRED"])
    assert profile_secrets(profile, environ={"DEPLOY_CRED": "cred-of-the-shell-0000"}) == sorted(
        [CRED, "cred-of-the-shell-0000"]
    )


def test_removed_variable_is_still_a_secret() -> None:
    profile = _profile(env={"DEPLOY_CRED": None}, secret_env=["DEPLOY_CRED"])
    assert profile_secrets(profile, environ={"DEPLOY_CRED": CRED}) == [CRED]


def test_empty_values_are_not_secrets() -> None:
    profile = _profile(
        args={"model-path": "/m", "api-key": ""},
        env={"HF_TOKEN": "", "DEPLOY_CRED": ""},
        secret_env=["DEPLOY_CRED", "SHELL_CRED"],
    )
    assert profile_secrets(profile, environ={"SHELL_CRED": ""}) == []


def test_sorted_once_each_and_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_TEST_DEPLOY_CRED", CRED)
    profile = _profile(
        args={"model-path": "/m", "api-key": CRED},
        env={"MY_TOKEN": CRED},
        secret_env=["KIMI_TEST_DEPLOY_CRED"],
    )
    assert profile_secrets(profile) == [CRED]


def test_the_launcher_scrubs_what_the_function_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_TEST_DEPLOY_CRED", CRED)
    profile = _profile(
        args={"model-path": "/m", "api-key": KEY}, secret_env=["KIMI_TEST_DEPLOY_CRED"]
    )
    server = open_server(profile, tmp_path / "logs")
    assert set(profile_secrets(profile)) <= set(server.secrets())
    assert CRED in server.secrets() and KEY in server.secrets()
    assert CRED not in server._scrub(f"--tokenizer-path https://x.example/t?sig={CRED}")


# -------------------------------------------------------------- a real session, end to end

SUITE = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=16, trials=2, warmup=1)
def test_one_level():
    pass
"""


def _all_text(root: Path) -> dict[Path, str]:
    return {
        path: path.read_bytes().decode("utf-8", "replace")
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_secret_env_value_reaches_no_report_baseline_or_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value of a ``secret_env`` variable the profile only names (the session inherits it)
    is in the server's ``/server_info`` twice (``tokenizer_path``, ``launch_command``): the
    report, the baseline, the server log and the terminal show it redacted."""
    monkeypatch.setenv("KIMI_TEST_DEPLOY_CRED", CRED)
    pytester.makepyfile(test_suite=SUITE)
    env = {"PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}", "FAKE_SGLANG_STARTUP_S": "0.3"}
    profile = pytester.path / "signed.yaml"
    profile.write_text(
        "args:\n  model-path: /models/kimi-signed\n"
        '  tokenizer-path: "https://models.example/tok?sig=${KIMI_TEST_DEPLOY_CRED}"\n'
        f"env:\n{''.join(f'  {k}: {json.dumps(v)}{chr(10)}' for k, v in env.items())}"
        "secret_env: [KIMI_TEST_DEPLOY_CRED]\nstartup_timeout_s: 60\nstop_timeout_s: 3\n",
        encoding="utf-8",
    )
    report = pytester.path / "out" / "perf.json"
    run = pytester.runpytest_subprocess(
        "-m",
        "perf",
        f"--server-profile={profile}",
        "--update-baselines",
        f"--perf-json={report}",
        "-rA",
        timeout=300,
    )
    run.assert_outcomes(passed=1)
    texts = _all_text(pytester.path)
    baseline = next(p for p in texts if p.suffix == ".yaml" and "baselines" in p.parts)
    logs = [p for p in texts if p.suffix == ".log"]
    assert logs, "the managed server's log copy is kept under .kimi/logs"
    # the value was really there to leak: the fake reports its arguments
    assert f"sig={REDACTED}" in texts[baseline], texts[baseline]
    assert REDACTED in texts[report]
    terminal = "\n".join(run.outlines + run.errlines)
    leaks = [
        str(path) for path, text in {**texts, Path("<terminal>"): terminal}.items() if CRED in text
    ]
    assert not leaks, leaks
