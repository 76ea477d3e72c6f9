"""Every discovery GET is bounded: a byte cap on the body, a depth cap on its JSON.

A tester's server answered ``/v1/models`` and ``/server_info`` with 200 MB (the run printed
nothing for 115 s and grew to 546 MB until it was killed) and with JSON nested deeper than
Python's recursion limit (the run ended in a raw ``RecursionError``).  Here the hostile
discovery server (:mod:`support.hostile_discovery`) answers each discovery path with each of
those, and each case checks three things: what the plugin concluded (a clear "not JSON" or
"past the cap" naming the URL and the check, or the optional server info left out while the
run goes on), that the read stopped at its cap (the server saw the client hang up, having
sent no more than the cap plus what the sockets' buffers hold), and that no server-supplied
content reached the message.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kimi.endpoint import discovery
from pytest_kimi.endpoint.bounded import (
    DISCOVERY_MAX_BYTES,
    JSON_MAX_DEPTH,
    BodyTooLarge,
    NotJSON,
    json_too_deep,
    loads_bounded,
    read_stream_capped,
)
from pytest_kimi.endpoint.discovery import EndpointError, discover
from pytest_kimi.server.launcher import ExternalServer
from pytest_kimi.server.server_http import ResponseTooLarge, _http
from pytest_kimi.server.profile import load_profile
from support.hostile_discovery import DEEP_LEVELS, HUGE_BYTES, DiscoveryServer
from support.timing import poll_until

# ------------------------------------------------------------------ depth and parsing


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='[]{}"\\ab,:', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=40,
)
"""JSON values whose strings are made of the characters a depth scan could stumble on."""


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(0, 8))
def test_the_depth_scan_agrees_with_the_true_depth(value: Any, cap: int) -> None:
    text = json.dumps(value)
    assert json_too_deep(text, cap) == (_depth(value) > cap), (text, cap)
    if _depth(value) <= JSON_MAX_DEPTH:
        assert loads_bounded(text) == value
        assert loads_bounded(text.encode()) == value


def test_depth_at_the_cap_is_json_and_one_past_it_is_not() -> None:
    at_cap = "[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH
    assert _depth(loads_bounded(at_cap)) == JSON_MAX_DEPTH
    with pytest.raises(NotJSON) as err:
        loads_bounded("[" + at_cap + "]")
    assert err.value.reason == f"nested deeper than {JSON_MAX_DEPTH} levels (JSON_MAX_DEPTH)"


def test_far_too_deep_is_not_json_and_no_recursion_error() -> None:
    """The tester's case: past Python's recursion limit, as an object of arrays too."""
    for text in ("[" * DEEP_LEVELS, '{"a":' * DEEP_LEVELS + "1" + "}" * DEEP_LEVELS):
        with pytest.raises(NotJSON, match="nested deeper than"):
            loads_bounded(text)


def test_an_unterminated_string_is_one_token_not_a_rescan_per_quote() -> None:
    """``"\\"\\"\\"...`` without a closing quote: scanned once (a pattern that rescans from
    each quote would take hours on 4 MB), and then not JSON by the parser's own word."""
    text = '"' + '\\"' * (2 * 2**20)
    assert not json_too_deep(text)
    with pytest.raises(NotJSON, match="Unterminated string"):
        loads_bounded(text)


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"", "the body is empty"),
        (b"  \n", "the body is empty"),
        (b"<html>\x1b[2J hello</html>", "Expecting value at line 1 column 1 (it looks like HTML"),
        (b'{"a": ' + b"9" * 100_000 + b"}", "ValueError: Exceeds the limit"),
        (b'{"a": 1', "Expecting ',' delimiter at line 1 column 8"),
    ],
)
def test_not_json_names_the_check_never_the_content(body: bytes, reason: str) -> None:
    with pytest.raises(NotJSON) as err:
        loads_bounded(body)
    assert err.value.reason.startswith(reason), err.value.reason
    assert "hello" not in err.value.reason and "\x1b" not in err.value.reason


def test_a_synchronous_body_is_read_up_to_its_cap() -> None:
    assert read_stream_capped(io.BytesIO(b"x" * 100), 100) == b"x" * 100
    with pytest.raises(BodyTooLarge) as err:
        read_stream_capped(io.BytesIO(b"x" * 101), 100)
    assert err.value.limit == 100 and err.value.announced is None
    # reads at most cap + 1 bytes, whatever the stream holds
    stream = io.BytesIO(b"x" * 10_000)
    with pytest.raises(BodyTooLarge):
        read_stream_capped(stream, 100)
    assert stream.tell() == 101


# ------------------------------------------------------------------ discovery


def _socket_slack() -> int:
    """What the kernel may hold between the server's writes and the client's reads on
    loopback: the largest send buffer plus the largest receive buffer it grows to."""
    total = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        try:
            total += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
        except (OSError, ValueError, IndexError):
            total += 32 * 2**20
    return total


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[DiscoveryServer] = []

    def start(**bodies: str) -> DiscoveryServer:
        # keyword to path: v1__models -> /v1/models, server_info -> /server_info
        paths = {"/" + k.replace("__", "/"): v for k, v in bodies.items()}
        server = DiscoveryServer(paths).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _discover(url: str, timeout_s: float = 30.0) -> discovery.EndpointInfo:
    return asyncio.run(discover(url, api_key=None, model=None, timeout_s=timeout_s))


def _assert_stopped_at_the_cap(server: DiscoveryServer, path: str) -> None:
    poll_until(lambda: server.hangups[path] >= 1, f"the client hung up on {path}")
    sent = server.sent[path]
    assert sent <= DISCOVERY_MAX_BYTES + _socket_slack(), (sent, "read past the cap")
    assert sent < HUGE_BYTES


def test_the_paths_of_the_fixture() -> None:
    server = DiscoveryServer({"/v1/models": "deep", "/server_info": "html"})
    assert server.mode("/v1/models") == "deep" and server.mode("/get_server_info") == "absent"


def test_a_huge_model_list_is_refused_at_the_cap(serve: Any) -> None:
    server = serve(v1__models="huge_chunked")
    with pytest.raises(EndpointError) as err:
        _discover(server.url)
    message = str(err.value)
    assert f"{server.url}/v1/models answered 200 but sent more, over the cap of 8 MB" in message
    assert "DISCOVERY_MAX_BYTES" in message and "check the port" in message
    _assert_stopped_at_the_cap(server, "/v1/models")


def test_a_huge_announced_model_list_is_refused_before_it_is_read(serve: Any) -> None:
    server = serve(v1__models="huge_announced")
    with pytest.raises(EndpointError) as err:
        _discover(server.url)
    assert f"announced {HUGE_BYTES} bytes, over the cap of 8 MB" in str(err.value)
    poll_until(lambda: server.hangups["/v1/models"] >= 1, "the client hung up")
    # nothing was read: the server got onto the socket only what the buffers took
    assert server.sent["/v1/models"] <= _socket_slack()


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("deep", f"nested deeper than {JSON_MAX_DEPTH} levels"),
        ("html", "Expecting value at line 1 column 1 (it looks like HTML or XML)"),
        ("bigint", "ValueError: Exceeds the limit"),
    ],
)
def test_a_model_list_that_is_no_json_says_why(serve: Any, mode: str, reason: str) -> None:
    server = serve(v1__models=mode)
    with pytest.raises(EndpointError) as err:
        _discover(server.url)
    message = str(err.value)
    assert f"{server.url}/v1/models answered 200 but not JSON ({reason}" in message, message
    assert "is this an OpenAI-compatible server" in message
    assert "nginx" not in message and "\x1b" not in message, "no content of the answer"


@pytest.mark.parametrize("mode", ["huge_chunked", "huge_announced", "deep", "html", "bigint"])
def test_a_hostile_server_info_is_left_out_and_the_next_path_asked(serve: Any, mode: str) -> None:
    server = serve(server_info=mode, get_server_info="ok")
    info = _discover(server.url)
    assert info.model == "hostile-model"
    assert info.server_info["tp_size"] == 2 and info.server_info["model_path"] == "/models/hostile"
    assert server.requests["/get_server_info"] == 1
    if mode == "huge_chunked":
        _assert_stopped_at_the_cap(server, "/server_info")


def test_every_info_path_hostile_leaves_the_version_or_nothing(serve: Any) -> None:
    server = serve(server_info="deep", get_server_info="huge_chunked", version="ok")
    assert _discover(server.url).server_info == {"version": "0.0-discovery"}
    _assert_stopped_at_the_cap(server, "/get_server_info")
    server = serve(server_info="deep", get_server_info="bigint", version="huge_announced")
    assert _discover(server.url).server_info == {}


def test_brackets_inside_strings_are_no_nesting(serve: Any) -> None:
    server = serve(server_info="deep_in_strings")
    assert _discover(server.url).server_info["tp_size"] == 2


def test_a_trickling_server_info_costs_its_own_timeout_not_the_runs(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discovery, "INFO_TIMEOUT_S", 0.5)
    server = serve(server_info="trickle", get_server_info="ok")
    info = _discover(server.url)
    assert info.server_info["tp_size"] == 2, "the next path was asked"
    poll_until(lambda: server.hangups["/server_info"] >= 1, "the client hung up on the trickle")


def test_a_trickling_model_list_is_reported_as_such(serve: Any) -> None:
    server = serve(v1__models="trickle")
    with pytest.raises(EndpointError) as err:
        _discover(server.url, timeout_s=1.0)
    assert f"{server.url} did not answer /v1/models within 1 s" in str(err.value)


# ------------------------------------------------------------------ the launcher's reads


def test_the_launchers_reads_are_capped_too(serve: Any, tmp_path: Path) -> None:
    """Its readiness probes and ``server_info()`` read with urllib: capped the same way, and
    a hostile answer is no server info rather than an error or a hang."""
    server = serve(server_info="huge_chunked", get_server_info="deep")
    with pytest.raises(ResponseTooLarge, match="answered 200 but sent more, over the cap"):
        _http("GET", server.url + "/server_info", timeout=30)
    _assert_stopped_at_the_cap(server, "/server_info")

    def external(url: str) -> ExternalServer:
        profile = tmp_path / "ext.yaml"
        profile.write_text(f"url: {url}\n")
        return ExternalServer(load_profile(profile), tmp_path / "logs")

    assert external(server.url).server_info() == {}
    server = serve(server_info="deep", get_server_info="ok")
    assert external(server.url).server_info() == {}, "the first path answered, not JSON: no info"


# ------------------------------------------------------------------ a session


SESSION = """
from pytest_kimi import throughput

@throughput(concurrency=1, max_tokens=8, trials=1, warmup=0, timeout_s=60,
            protocol="whole-requests", requests_per_stream=2)
def test_discovered():
    pass
"""


def _session(pytester: pytest.Pytester, url: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    pytester.makepyfile(test_discovered=SESSION)
    report = pytester.path / "perf.json"
    result = pytester.runpytest("-m", "perf", f"--endpoint={url}", f"--perf-json={report}")
    return result, json.loads(report.read_text()) if report.exists() else {}


def test_a_session_against_a_huge_model_list_fails_with_one_clear_line(
    pytester: pytest.Pytester, serve: Any
) -> None:
    server = serve(v1__models="huge_chunked")
    result, _ = _session(pytester, server.url)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*/v1/models answered 200 but sent more, over the cap of 8 MB (DISCOVERY_MAX_BYTES*"]
    )
    assert "Traceback" not in result.stdout.str()
    _assert_stopped_at_the_cap(server, "/v1/models")


def test_a_session_against_a_deep_server_info_runs_without_it(
    pytester: pytest.Pytester, serve: Any
) -> None:
    server = serve(server_info="deep", get_server_info="deep")
    result, report = _session(pytester, server.url)
    result.assert_outcomes(passed=1)
    assert "RecursionError" not in result.stdout.str()
    assert report["endpoint"]["server_info"] == {}
    assert report["tests"][0]["levels"][0]["tok_s"] > 0
