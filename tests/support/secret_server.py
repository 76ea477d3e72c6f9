"""A server on 127.0.0.1 whose ``/server_info`` carries every secret a tester found leaking.

The simulator serves the load (``pytest_kimi.sim``, in its own process); its ``server_args``
knob merges extra keys into ``/server_info`` and ``/get_server_info``, as a proxy or a
deployment tool in front of SGLang would add them.  Each case holds a marker of its own
(:data:`MARKERS`), so a test can say which one leaked into which file.  The cases sit both in
fields the allow-list drops (only the allow-list stands between them and a baseline) and in
fields it keeps (``tokenizer_path``, ``chat_template``, ``speculative_config``,
``launch_command`` flags: only the scrubber stands there).

The markers live only in this process and the simulator's command line: the session under
test is given nothing but the URL.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

from pytest_kimi.sim import SimConfig
from pytest_kimi.sim.process import SimProcess

__all__ = ["MARKERS", "leaking_server_info", "start_secret_server"]


def _marker(case: str) -> str:
    # uppercase letters and digits: fits base64, base64url, URL parameters and key bodies
    return f"ZQ{case.upper().replace('_', '')}{uuid.uuid4().hex[:12].upper()}"


CASES = (
    "pem",
    "pem_kept",
    "api_keys",
    "api_keys_camel",
    "access_tokens",
    "tokens_nested",
    "tokens_kept",
    "jwt",
    "sas",
    "webhook",
    "webhook_kept",
    "github_pat",
    "launch_pat",
    "launch_key",
    "userinfo",
)
MARKERS: dict[str, str] = {case: _marker(case) for case in CASES}
"""One marker per leaking case, fresh per test process."""


def _pem(marker: str) -> str:
    return (
        "-----BEGIN PRIVATE KEY-----\n"
        f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQ{marker}\n"
        f"q1w2e3r4t5y6u7i8o9p0{marker}ASDFGHJKL\n"
        "-----END PRIVATE KEY-----\n"
    )


def _jwt(marker: str) -> str:
    def seg(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{seg({'alg': 'HS256', 'typ': 'JWT'})}.{seg({'sub': 'perf-ci'})}.{marker}Sg"


def leaking_server_info(markers: dict[str, str] = MARKERS) -> dict[str, Any]:
    """The extra ``/server_info`` keys: every leaking case, each with its marker."""
    m = markers
    sas = (
        "https://perfmodels.blob.core.windows.net/tok/tokenizer.json"
        f"?sv=2022-11-02&sp=r&se=2030-01-01T00%3A00%3A00Z&sig={m['sas']}%3D"
    )
    hook = f"https://hooks.slack.com/services/T000/B000/{m['webhook']}"
    return {
        # dropped by the allow-list
        "private_key_pem": _pem(m["pem"]),
        "api_keys": [f"sk-{m['api_keys']}abcdef"],
        "apiKeys": {"primary": m["api_keys_camel"]},
        "access_tokens": [m["access_tokens"]],
        "tokens": {"openai": m["tokens_nested"], "hf": {"read": m["tokens_nested"]}},
        "alerts_webhook": hook,
        "deploy_note": f"rolled out by ci with GITHUB_PAT={m['github_pat']} at 08:00",
        # kept by the allow-list: the scrubber must find them by shape or by name
        "tokenizer_path": sas,
        "model_path": f"https://perf:{m['userinfo']}@models.example/kimi",
        "chat_template": f"auth {_jwt(m['jwt'])} then {_pem(m['pem_kept'])}",
        "speculative_config": {
            "tokens": {"openai": m["tokens_kept"]},
            "notify": f"https://discord.com/api/webhooks/1234/{m['webhook_kept']}",
            "num_steps": 3,
        },
        "launch_command": (
            f"GITHUB_PAT={m['launch_pat']} python -m sglang.launch_server --model-path /m "
            f"--tokenizer-path {sas} --api-key {m['launch_key']} --tp-size 8 "
            f"--webhook-url {hook} --max-running-requests 64 --port 30123"
        ),
        # ordinary configuration the baseline must keep
        "max_total_tokens": 4096,
        "enable_eplb": False,
    }


def start_secret_server(log_dir: Path, *, model: str = "kimi-secret-sinks") -> SimProcess:
    """The simulator (fast, deterministic) serving :func:`leaking_server_info`; stop it with
    ``.stop()``.  Its log goes to ``log_dir``: keep that outside the directory a test scans,
    since the simulator's own command line holds the markers."""
    profile = SimConfig(speed=20.0, model=model, server_args=leaking_server_info())
    return SimProcess(profile, log_dir=log_dir).start()
