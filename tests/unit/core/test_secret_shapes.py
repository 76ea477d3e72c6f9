"""Property tests for the scrubber and the server-info allow-list: no secret survives, no
SGLang argument is hidden.

A deny-list of names lost to ``private_key_pem``, ``api_keys``, ``apiKeys``,
``access_tokens``, ``tokens: {openai: ...}``, JWTs, Azure SAS ``?sig=`` URLs, webhook URLs
and ``GITHUB_PAT=...`` in text.  These tests draw secret *names* (case, plural, camelCase,
prefix and suffix variants) and secret *shapes*, each carrying a unique marker, embed them in
nested server_info, argv and free text, and assert that no marker survives
:func:`~pytest_kimi.scrub.scrub` and :func:`~pytest_kimi.endpoint.serverinfo.clean_server_info`;
and that ordinary SGLang argument names and values come through both unchanged.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kimi.endpoint import serverinfo
from pytest_kimi.endpoint.serverinfo import clean_server_info
from pytest_kimi.scrub import REDACTED, is_secret_name, scrub, scrub_argv, scrub_text

SETTINGS = settings(max_examples=150, deadline=None)

# ------------------------------------------------------------------------------ names

STEMS: tuple[tuple[str, ...], ...] = (
    ("api", "key"),
    ("admin", "api", "key"),
    ("openai", "api", "key"),
    ("access", "key"),
    ("secret", "key"),
    ("access", "token"),
    ("auth", "token"),
    ("refresh", "token"),
    ("id", "token"),
    ("session", "token"),
    ("hf", "token"),
    ("github", "token"),
    ("github", "pat"),
    ("gitlab", "pat"),
    ("private", "key"),
    ("private", "key", "pem"),
    ("tls", "key", "pem"),
    ("client", "secret"),
    ("db", "password"),
    ("passphrase",),
    ("secret",),
    ("password",),
    ("credentials",),
    ("webhook", "url"),
    ("slack", "webhook"),
    ("sentry", "dsn"),
    ("authorization",),
    ("bearer",),
    ("cookie",),
    ("sas", "token"),
    ("tokens",),
    ("keys",),
)
"""Words of secret names; variants are drawn around them."""
PLURAL = {
    "key": "keys",
    "token": "tokens",
    "secret": "secrets",
    "password": "passwords",
    "pat": "pats",
    "credentials": "credentials",
    "cookie": "cookies",
    "pem": "pems",
    "url": "urls",
    "webhook": "webhooks",
}
PREFIXES = ("x", "my", "prod", "azure", "default", "backup", "service")
SUFFIXES = ("value", "b64", "2", "v1", "list", "old", "hex")


def _styled(words: list[str], style: str) -> str:
    if style == "snake":
        return "_".join(words)
    if style == "upper":
        return "_".join(words).upper()
    if style == "kebab":
        return "-".join(words)
    if style == "dotted":
        return ".".join(words)
    caps = "".join(w[:1].upper() + w[1:] for w in words)
    return caps if style == "pascal" else words[0] + caps[len(words[0]) :]


@st.composite
def secret_names(draw: st.DrawFn) -> str:
    words = list(draw(st.sampled_from(STEMS)))
    if draw(st.booleans()) and words[-1] in PLURAL:
        words[-1] = PLURAL[words[-1]]
    # a qualifier in front of a bare plural ("my_tokens") says nothing: only multi-word stems
    if len(words) > 1 or words[0] not in ("tokens", "keys"):
        if draw(st.booleans()):
            words.insert(0, draw(st.sampled_from(PREFIXES)))
    if draw(st.booleans()):
        words.append(draw(st.sampled_from(SUFFIXES)))
    return _styled(words, draw(st.sampled_from(["snake", "upper", "kebab", "dotted", "camel"])))


markers = st.from_regex(r"ZQ[A-Z0-9]{14}", fullmatch=True)
"""A unique marker: uppercase letters and digits fit every shape below (base64, base64url,
hex-free key bodies, URL parameters); the surrounding text is lowercase, so it never holds one
by chance."""
filler = st.text(alphabet="abcdefghijklmnopqrstuvwxyz .,:;()-_/\n\t", max_size=24)
separators = st.sampled_from([" ", "\n", "\t", "'", '"', "(", ", ", "; ", " = ", ": "])


@SETTINGS
@given(secret_names())
def test_every_variant_of_a_secret_name_is_secret(name: str) -> None:
    assert is_secret_name(name), name


@st.composite
def nested_secret_values(draw: st.DrawFn, marker: str) -> Any:
    """The marker as a string, in a list, or under a provider in a mapping (the whole
    subtree of a secret-named entry is secret: ``tokens: {openai: ...}``)."""
    provider = draw(st.sampled_from(["openai", "anthropic", "primary", "model", "url"]))
    return draw(
        st.sampled_from(
            [
                marker,
                [marker],
                ["x-" + marker.lower(), marker],
                {provider: marker},
                {provider: {"value": marker, "limit": 5}},
            ]
        )
    )


@SETTINGS
@given(st.data(), secret_names(), markers)
def test_no_secret_named_value_survives_at_any_depth(
    data: st.DataObject, name: str, marker: str
) -> None:
    value = data.draw(nested_secret_values(marker))
    # under a field the allow-list keeps (so only the scrubber stands between it and a
    # baseline), under one it drops, and at the top
    wrap = data.draw(st.sampled_from(["top", "sim", "speculative_config", "notes"]))
    inner: dict[str, Any] = {name: value, "max_total_tokens": 4096}
    info: dict[str, Any] = inner if wrap == "top" else {wrap: inner, "tp_size": 8}
    for out in (scrub(info), clean_server_info(info)):
        assert marker not in json.dumps(out), (name, out)
    assert scrub(info) == scrub(scrub(info)), "idempotent"
    kept = clean_server_info(info)
    assert kept.get("tp_size", 8) == 8
    if wrap == "sim":
        assert kept["sim"]["max_total_tokens"] == 4096, "a count beside the secret is kept"


# ----------------------------------------------------------------------------- shapes


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _shape(kind: str, marker: str, env_name: str) -> str:
    """One secret by its shape, the marker inside the part that is secret."""
    if kind == "pem":
        body = f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC{marker}\nAoIBAQC7{marker}abcdEFGH"
        return f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----"
    if kind == "pem-escaped":  # as JSON or a log line shows it
        return f"-----BEGIN RSA PRIVATE KEY-----\\nMIIEpAIBAAKC{marker}\\n-----END RSA PRIVATE KEY-----"
    if kind == "pem-body":  # headers stripped
        return f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC{marker}xyz"
    if kind == "jwt":
        head = _b64url(b'{"alg":"HS256","typ":"JWT"}')
        claims = _b64url(json.dumps({"sub": marker}).encode())
        return f"{head}.{claims}.{marker}sIgNaTuRe"
    if kind == "azure-sas":
        return (
            "https://acct.blob.core.windows.net/models/tok.json"
            f"?sv=2022-11-02&ss=b&srt=o&sp=r&se=2030-01-01T00:00:00Z&sig={marker}%3D"
        )
    if kind == "s3-presigned":
        return (
            "https://bucket.s3.amazonaws.com/w.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Credential=AKIAZZZZ%2F20300101&X-Amz-Signature={marker}&X-Amz-Expires=60"
        )
    if kind == "gcs-signed":
        return f"https://storage.googleapis.com/b/o?X-Goog-Date=1&X-Goog-Signature={marker}"
    if kind == "oauth":
        param = {0: "token", 1: "access_token", 2: "code"}[len(marker) % 3]
        return f"https://gw.example/cb?state=ok&{param}={marker}"
    if kind == "slack-webhook":
        return f"https://hooks.slack.com/services/T000/B000/{marker}"
    if kind == "discord-webhook":
        return f"https://discord.com/api/webhooks/123456/{marker}"
    if kind == "teams-webhook":
        return f"https://contoso.webhook.office.com/webhookb2/{marker}/IncomingWebhook/x"
    if kind == "generic-webhook":
        return f"https://ci.example/api/webhook/{marker}"
    if kind == "userinfo":
        return f"postgresql://perf:{marker}@db.example:5432/runs"
    if kind == "env-pair":
        return f"{env_name}={marker}"
    if kind == "bearer":
        return f"Authorization: Bearer {marker}"
    if kind == "openai":
        return f"sk-proj-{marker}abc"
    if kind == "github":
        return f"ghp_{marker}abcdefgh"
    if kind == "github-pat":
        return f"github_pat_11AB{marker}_abcdefghij"
    if kind == "slack-bot":
        return f"xoxb-1234-{marker}"
    if kind == "aws":
        return "AKIA" + marker[:16]
    if kind == "hf":
        return f"hf_{marker}abcdefghij"
    raise AssertionError(kind)


SHAPES = (
    "pem",
    "pem-escaped",
    "pem-body",
    "jwt",
    "azure-sas",
    "s3-presigned",
    "gcs-signed",
    "oauth",
    "slack-webhook",
    "discord-webhook",
    "teams-webhook",
    "generic-webhook",
    "userinfo",
    "env-pair",
    "bearer",
    "openai",
    "github",
    "github-pat",
    "slack-bot",
    "aws",
    "hf",
)
env_names = st.sampled_from(
    ["GITHUB_PAT", "HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "SLACK_WEBHOOK_URL"]
    + ["DB_PASSWORD", "MY_SECRET", "APIKEY", "DEPLOY_TOKEN", "GITLAB_PAT", "SECRETKEY"]
)


@SETTINGS
@given(st.sampled_from(SHAPES), markers, env_names, filler, filler, separators, separators)
def test_no_secret_shape_survives_in_free_text(
    kind: str, marker: str, env_name: str, before: str, after: str, sep1: str, sep2: str
) -> None:
    text = before + sep1 + _shape(kind, marker, env_name) + sep2 + after
    out = scrub_text(text)
    assert marker not in out, (kind, out)
    assert REDACTED in out
    assert scrub_text(out) == out, "idempotent"


@SETTINGS
@given(st.sampled_from(SHAPES), markers, env_names, st.data())
def test_no_secret_shape_survives_in_server_info_or_argv(
    kind: str, marker: str, env_name: str, data: st.DataObject
) -> None:
    secret = _shape(kind, marker, env_name)
    # an innocent name the allow-list keeps: only the shape can give it away
    field = data.draw(st.sampled_from(["tokenizer_path", "model_path", "chat_template"]))
    info = {
        field: secret,
        "tp_size": 8,
        "sim": {"notes": [f"see {secret} now"]},
        "extra": {"deep": [{"x": secret}]},
        "launch_command": f"python -m sglang.launch_server --{field.replace('_', '-')} "
        f"'{secret}' --tp-size 8",
    }
    for out in (scrub(info), clean_server_info(info)):
        assert marker not in json.dumps(out), (kind, out)
    argv = ["python", "-m", "sglang.launch_server", f"--{field}", secret, "--tp-size", "8"]
    scrubbed = scrub_argv(argv)
    assert marker not in " ".join(scrubbed) and scrubbed[-2:] == ["--tp-size", "8"]
    kept = clean_server_info(info)
    assert kept["tp_size"] == 8 and kept["launch_command"]["args"]["tp_size"] == "8"


# ------------------------------------------------- ordinary SGLang arguments pass unchanged

SGLANG_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "model_path": st.sampled_from(["/root/models/Kimi-K2.6", "moonshotai/Kimi-K2.6"]),
    "tokenizer_path": st.sampled_from(["/root/models/Kimi-K2.6", "moonshotai/Kimi-K2.6"]),
    "served_model_name": st.sampled_from(["kimi-k2.6", "tiny-llama"]),
    "tp_size": st.sampled_from([1, 2, 4, 8, 16]),
    "ep_size": st.sampled_from([1, 4, 8]),
    "dp_size": st.sampled_from([1, 2]),
    "pp_size": st.just(1),
    "nnodes": st.sampled_from([1, 2]),
    "max_running_requests": st.integers(1, 4096),
    "max_total_tokens": st.integers(1, 2**22) | st.none(),
    "max_prefill_tokens": st.integers(1, 65536),
    "chunked_prefill_size": st.sampled_from([-1, 2048, 8192]),
    "max_total_num_tokens": st.integers(1, 2**22),
    "num_continuous_decode_steps": st.integers(1, 16),
    "stream_interval": st.integers(1, 64),
    "schedule_policy": st.sampled_from(["fcfs", "lpm", "dfs-weight"]),
    "schedule_conservativeness": st.floats(0.1, 2.0),
    "mem_fraction_static": st.floats(0.5, 0.95),
    "context_length": st.sampled_from([None, 32768, 262144]),
    "dtype": st.sampled_from(["auto", "bfloat16"]),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8_e5m2"]),
    "quantization": st.sampled_from([None, "fp8", "w4afp8"]),
    "attention_backend": st.sampled_from(["triton", "flashinfer", "fa3"]),
    "sampling_backend": st.sampled_from(["flashinfer", "pytorch"]),
    "moe_a2a_backend": st.sampled_from(["none", "deepep"]),
    "moe_runner_backend": st.sampled_from(["auto", "triton"]),
    "deepep_mode": st.sampled_from(["auto", "normal", "low_latency"]),
    "enable_eplb": st.booleans(),
    "eplb_rebalance_num_iterations": st.integers(1, 2000),
    "ep_num_redundant_experts": st.integers(0, 32),
    "enable_dp_attention": st.booleans(),
    "enable_token_filter": st.booleans(),
    "disable_radix_cache": st.booleans(),
    "disable_overlap_schedule": st.booleans(),
    "disable_cuda_graph": st.booleans(),
    "cuda_graph_max_bs": st.sampled_from([None, 256, 512]),
    "cuda_graph_bs": st.lists(st.integers(1, 512), max_size=5),
    "enable_torch_compile": st.booleans(),
    "torch_compile_max_bs": st.integers(1, 64),
    "speculative_algorithm": st.sampled_from([None, "EAGLE", "EAGLE3"]),
    "speculative_num_steps": st.integers(1, 8),
    "speculative_num_draft_tokens": st.integers(1, 16),
    "speculative_eagle_topk": st.integers(1, 8),
    "swa_full_tokens_ratio": st.floats(0.1, 1.0),
    "skip_tokenizer_init": st.booleans(),
    "trust_remote_code": st.booleans(),
    "reasoning_parser": st.sampled_from([None, "kimi_k2"]),
    "tool_call_parser": st.sampled_from([None, "kimi_k2"]),
    "page_size": st.sampled_from([1, 16, 64]),
    "version": st.sampled_from(["0.5.23", "0.5.6.post2"]),
}
"""Real SGLang 0.5.x server arguments (``sglang/srt/server_args.py``) and value shapes."""
SGLANG_UNLISTED = {
    # arguments that do not move throughput: dropped from provenance, never secret
    "log_level": "info",
    "stop_token_ids": [163585, 163586],
    "skip_special_tokens": True,
    "token_aligner": None,
    "tokenizer_worker_num": 1,
    "watchdog_timeout": 300,
    "kv_cache_key": "default",
}


@SETTINGS
@given(st.fixed_dictionaries({}, optional=SGLANG_ARGS))
def test_ordinary_sglang_arguments_survive_unchanged(args: dict[str, Any]) -> None:
    info = {**args, **SGLANG_UNLISTED}
    assert scrub(info) == info, "the scrubber touches no ordinary argument"
    assert not [name for name in info if is_secret_name(name)]
    kept = clean_server_info(info)
    assert {k: v for k, v in kept.items() if k != "unlisted"} == args
    assert all(serverinfo.is_provenance_field(name) for name in SGLANG_ARGS)
    assert not [name for name in SGLANG_UNLISTED if serverinfo.is_provenance_field(name)]
    # as the launch command gives them: each flag's words, as strings
    flags: list[str] = []
    for name, value in args.items():
        if value is None or value is False or value == []:
            continue
        flags.append("--" + name.replace("_", "-"))
        if isinstance(value, list):
            flags += [str(v) for v in value]
        elif value is not True:
            flags.append(str(value))
    command = " ".join(["python3", "-m", "sglang.launch_server", *flags, "--port", "30001"])
    assert scrub_text(command) == command
    parsed = clean_server_info({"launch_command": command}).get("launch_command", {"args": {}})
    assert set(parsed["args"]) == {
        n for n, v in args.items() if v is not None and v is not False and v != []
    }


# --------------------------------------------------------------- the leaks that were found

LEAKS = {
    "private_key_pem": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIZQPEM0000000001\n-----END EC PRIVATE KEY-----",
    "api_keys": ["ZQAPIKEYS0000000002abcdef"],
    "apiKeys": {"default": "ZQCAMEL0000000003"},
    "access_tokens": ["ZQACCESS000000004"],
    "tokens": {"openai": "ZQNESTED000000005", "anthropic": {"key": "ZQNESTED000000006"}},
    "auth_jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.ZQJWT0000000007",
    "tokenizer_path": "https://a.blob.core.windows.net/t?sv=1&sig=ZQSAS0000000008",
    "alerts": "https://hooks.slack.com/services/T000/B000/ZQHOOK000000009",
    "notes": "deployed with GITHUB_PAT=ZQPAT0000000010 by ci",
}


@pytest.mark.parametrize("field", sorted(LEAKS))
def test_the_leaks_that_were_found_are_gone(field: str) -> None:
    config = {"max_total_tokens": 4096, "tokenizer_mode": "auto"}
    info = {field: LEAKS[field], "sim": {field: LEAKS[field], **config}, **config}
    for out in (scrub(info), clean_server_info(info)):
        text = json.dumps(out)
        assert "ZQ" not in text, (field, text)
        assert out["max_total_tokens"] == 4096 and out["sim"]["tokenizer_mode"] == "auto"


def test_prose_that_says_token_is_no_pair() -> None:
    """A reason such as "before every stream had its first token: the server ..." is prose;
    the same head before a key-like value is still a pair."""
    from pytest_kimi.scrub import REDACTED, scrub_text

    prose = "cut before every stream had its first token: the server runs fewer"
    assert scrub_text(prose) == prose
    assert REDACTED in scrub_text("token: abcdefghijklmnopqrstuvwxyz")
    assert REDACTED in scrub_text("password: hunter")


# ------------------------------------------------------------ base64-wrapped secrets


def _wrapped(text: str, how: str, lead: str) -> str:
    """``text`` base64-encoded the ways a value carries it: standard or URL-safe alphabet,
    padded or not, twice over, or behind letters that are no part of the encoding."""
    raw = text.encode()
    if how == "std":
        out = base64.b64encode(raw).decode()
    elif how == "std-nopad":
        out = base64.b64encode(raw).decode().rstrip("=")
    elif how == "url":
        out = _b64url(raw)
    else:  # twice
        out = base64.b64encode(base64.b64encode(raw)).decode()
    return lead + out


@SETTINGS
@given(
    st.sampled_from(SHAPES),
    markers,
    env_names,
    st.sampled_from(["std", "std-nopad", "url", "twice"]),
    st.sampled_from(["", "x", "ab", "v1a"]),
    filler,
    filler,
)
def test_no_secret_shape_survives_base64_wrapped(
    kind: str, marker: str, env_name: str, how: str, lead: str, before: str, after: str
) -> None:
    """A key base64-encoded (``revision: c2stcHJvai0...``) is a key to anyone who decodes
    it: the run is redacted whole when what it decodes to holds anything redacted, in free
    text and in a field the allow-list keeps."""
    plain = f"deployed {_shape(kind, marker, env_name)} by ci"
    wrapped = _wrapped(plain, how, lead)
    out = scrub_text(f"{before} {wrapped} {after}")
    assert wrapped not in out and REDACTED in out, (kind, how, out)
    assert scrub_text(out) == out, "idempotent"
    info = {"revision": wrapped, "tp_size": 8}
    for cleaned in (scrub(info), clean_server_info(info)):
        assert cleaned["revision"] == REDACTED, (kind, how, cleaned)
        assert cleaned["tp_size"] == 8


@SETTINGS
@given(st.binary(min_size=15, max_size=200), st.sampled_from(["std", "url"]))
def test_base64_of_what_holds_no_secret_is_kept(data: bytes, how: str) -> None:
    """Digests, ids, tokenizer blobs: base64 whose decoding holds nothing the scrubber
    redacts comes through unchanged."""
    encoded = base64.b64encode(data).decode() if how == "std" else _b64url(data)
    text = f"revision {encoded} done"
    decoded = data.decode("utf-8", "replace")
    if scrub_text(decoded) == decoded:  # (random bytes that spell a key shape: no claim)
        assert scrub_text(text) == text


@pytest.mark.parametrize(
    "value",
    [
        "a3f9c2e1d4b5a6978877665544332211aabbccdd",  # a git commit
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "moonshotai/Kimi-K2-Instruct-0905",
        "internationalization_and_localization_settings",
        base64.b64encode(b"main branch of the model repository, tagged v2").decode(),
    ],
)
def test_ordinary_revisions_are_kept(value: str) -> None:
    assert scrub_text(value) == value
    assert clean_server_info({"revision": value})["revision"] == value


# ------------------------------------------------------------ ordinary words are not secrets

ORDINARY = (
    "not",
    "is",
    "none",
    "missing",
    "required",
    "invalid",
    "empty",
    "unset",
    "set",
    "given",
    "expired",
    "the",
    "was",
    "must",
    "cannot",
)
"""Words that say something about a secret, never one (a sample of the scrubber's list)."""
PROSE = st.lists(
    st.sampled_from(
        ["valid", "json", "for", "this", "server", "port", "after", "retry", "found", "in", "the"]
        + list(ORDINARY)
    ),
    max_size=6,
).map(" ".join)


@SETTINGS
@given(
    secret_names(),
    st.sampled_from(ORDINARY),
    st.sampled_from([str.lower, str.upper, str.title]),
    st.sampled_from(["{n}: {w}", "{n}={w}", "{n} = {w}", '"{n}": "{w}"', "--{n} {w}", "--{n}={w}"]),
    PROSE,
    markers,
)
def test_ordinary_words_after_a_secret_name_are_never_redacted(
    name: str, word: str, case: Any, form: str, rest: str, marker: str
) -> None:
    """``passwd: not valid JSON`` is a message about a password, not one: the scrubber turned
    it into ``passwd: <redacted> valid JSON``.  The same frame with a real value still hides
    it, so the rule is about the word, not the frame."""
    text = form.format(n=name, w=case(word)) + (" " + rest if rest else "")
    assert scrub_text(text) == text, text
    secret = form.format(n=name, w=marker.lower() + "x9") + (" " + rest if rest else "")
    assert marker.lower() not in scrub_text(secret), secret


@pytest.mark.parametrize(
    "text",
    [
        "passwd: not valid JSON",
        "PASSWORD: NOT SET",
        "--api-key is required for this server",
        "api_key: missing",
        "the password: was rejected",
        "credentials: invalid for user perf",
        "Token expired after 3 s",
        "Basic auth failed",
        "Bearer token missing",
        "Authorization: Bearer required",
    ],
)
def test_messages_about_secrets_are_kept_whole(text: str) -> None:
    assert scrub_text(text) == text


@pytest.mark.parametrize(
    "text, secret",
    [
        ("password: hunter", "hunter"),
        ("passwd: dragon valid", "dragon"),
        ("--api-key opensesame", "opensesame"),
        ("Bearer abcdefgh", "abcdefgh"),
    ],
)
def test_open_words_stay_secret(text: str, secret: str) -> None:
    """Only the closed list is kept: a dictionary word is a common password."""
    assert secret not in scrub_text(text)
