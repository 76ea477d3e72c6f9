"""Hostile servers: each lie or misbehaviour ends the session in bounded time with its reason.

Every case runs a real ``pytest -m perf --endpoint=http://127.0.0.1:PORT`` session (bounded
by the suite's session timeout: a session that hangs fails the test instead of hanging it)
against :class:`support.hostile.HostileServer` in the mode of the case, and reads the level's
verdict and reasons from its JSON report.  Before these guards, the cases hung (a stream past
``max_tokens``), passed with bogus figures (``usage`` of 3.5 or ``"12"``, a gzip-buffered
stream, a redirect to another server), or failed without saying why (``HTTP 405`` after a
302, a 429 without its ``Retry-After``).  Below them, the figures' own rules: what makes a
trial ``buffered`` and what does not.
"""

from __future__ import annotations

import json
from array import array
from typing import Any, Callable, Iterator

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.load.trial import TrialRecords
from pytest_kimi.load.sse_usage import body_max_tokens
from pytest_kimi.measure.client_signals import ClientSignals
from pytest_kimi.measure.metrics import TrialResult, summarize_trial
from pytest_kimi.measure.trial_causes import BUFFERED_MIN_EVENTS
from pytest_kimi.measure.usage_checks import count_cut_tokens
from pytest_kimi.workload.workload_spec import LevelSpec
from pytest_kimi.workload.prompts import PromptSource, encode_bodies
from support.hostile import RETRY_AFTER, HostileServer
from support.timing import poll_until

MAX_TOKENS = 32
"""The session's ``max_tokens``: 32 token events, twice :data:`BUFFERED_MIN_EVENTS`."""

SESSION = f"""
from pytest_kimi import throughput

@throughput(
    concurrency=2, max_tokens={MAX_TOKENS}, trials=1, warmup=0, timeout_s=60,
    protocol="whole-requests", requests_per_stream=2,
)
def test_hostile():
    pass
"""
"""Short: one trial of 4 requests over 2 streams.  Whole requests, not the stationary time
box, so nothing but the stream's own end (or the client's guard) ends a request; the silence
timeout (60 s) is far longer than any case may take, so no case ends by waiting it out."""


@pytest.fixture
def hostile() -> Iterator[Callable[..., HostileServer]]:
    """``hostile(mode, redirect_to=None)``: a started :class:`HostileServer`, stopped after
    the test."""
    servers: list[HostileServer] = []

    def start(mode: str, redirect_to: str | None = None) -> HostileServer:
        server = HostileServer(mode, redirect_to=redirect_to).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _session(pytester: pytest.Pytester, url: str) -> tuple[pytest.RunResult, dict[str, Any] | None]:
    """Run the session against ``url``: its result and the (only) level of its report."""
    pytester.makepyfile(test_hostile=SESSION)
    report = pytester.path / "perf.json"
    result = pytester.runpytest("-m", "perf", f"--endpoint={url}", f"--perf-json={report}")
    level = None
    if report.exists():
        tests = json.loads(report.read_text())["tests"]
        level = tests[0]["levels"][0] if tests and tests[0].get("levels") else None
    return result, level


def _reasons(level: dict[str, Any] | None) -> str:
    assert level is not None, "the session wrote no level"
    return " | ".join(level["reasons"])


def test_an_honest_stream_passes_and_asks_for_no_compression(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer]
) -> None:
    """The control: the fixture's honest stream passes every guard below; and the client asks
    for the stream uncompressed (aiohttp offers gzip by default)."""
    server = hostile("ok")
    result, level = _session(pytester, server.url)
    result.assert_outcomes(passed=1)
    assert level is not None and level["verdict"] in ("pass", "no-baseline"), level
    sent = server.generations()
    assert len(sent) == 4
    assert all(s.headers.get("Accept-Encoding") == "identity" for s in sent), sent[0].headers


def test_a_stream_past_max_tokens_is_closed(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer]
) -> None:
    """Before: a stream that never ends (tokens past ``max_tokens``, ``ignore_eos``) hung the
    session.  After: the request fails as soon as it has more token events than tokens it may
    have, and the client hangs up."""
    server = hostile("endless")
    result, level = _session(pytester, server.url)
    result.assert_outcomes(failed=1)
    assert level is not None and level["verdict"] == "error"
    reasons = _reasons(level)
    assert f"stream passed max_tokens={MAX_TOKENS}: {MAX_TOKENS + 1} token events" in reasons
    result.stdout.fnmatch_lines([f"*C=2 error:*stream passed max_tokens={MAX_TOKENS}*"])
    # every stream was closed by the client, none left streaming
    poll_until(
        lambda: server.hangups == len(server.generations()) == 4, "the client hung up each stream"
    )


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("usage_one", f"usage.completion_tokens=1 is below the {MAX_TOKENS} token events"),
        ("usage_negative", "usage.completion_tokens=-165 is negative"),
        ("usage_float", f"usage.completion_tokens={MAX_TOKENS - 0.5} is fractional"),
        ("usage_string", f'usage.completion_tokens="{MAX_TOKENS}" is not a number'),
        ("usage_bool", "usage.completion_tokens is a bool (true), not a count"),
    ],
)
def test_usage_that_cannot_be_true_voids_the_trial(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer], mode: str, reason: str
) -> None:
    """Before: ``usage`` of 1 or -165 showed ``~-165.9 tok/s`` (and starved a stationary
    trial's token budget), 3.5 or ``"12"`` passed silently.  After: the level is ``invalid``
    and its reason names the value; the tokens are counted from the events meanwhile."""
    server = hostile(mode)
    result, level = _session(pytester, server.url)
    result.assert_outcomes(failed=1)
    assert level is not None and level["verdict"] == "invalid", level
    reasons = _reasons(level)
    assert reason in reasons
    assert "4 request(s) reported usage that cannot be true" in reasons
    result.stdout.fnmatch_lines(["*C=2 invalid:*usage that cannot be true*"])


def test_a_huge_sse_line_is_refused_at_the_cap(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer]
) -> None:
    """Before: one 50 MB line cost ~6 s of CPU per response (the pending buffer re-joined per
    read) and unbounded memory, then a "200 response with no tokens".  After: the request fails
    once the event passes 1 MB."""
    server = hostile("huge_line")
    result, level = _session(pytester, server.url)
    result.assert_outcomes(failed=1)
    assert level is not None and level["verdict"] == "error"
    assert "SSE event larger than 1 MB" in _reasons(level)
    poll_until(lambda: server.hangups == 4, "the client hung up each huge stream")


def test_a_buffered_stream_is_invalid(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer]
) -> None:
    """Before: a gzip-buffered response (all tokens in one read) passed with a tok/s figure
    and no ITL.  After: the trial is ``invalid``, buffered, and the reason says what to turn
    off; the server was asked not to compress (it did anyway)."""
    server = hostile("gzip_buffered")
    result, level = _session(pytester, server.url)
    result.assert_outcomes(failed=1)
    assert level is not None and level["verdict"] == "invalid"
    assert _reasons(level).startswith(
        "buffered: inter-token latency cannot be measured; turn off compression or proxy "
        "buffering (4 of 4 requests"
    )
    assert all(s.headers.get("Accept-Encoding") == "identity" for s in server.generations())


@pytest.mark.parametrize("status", [307, 302])
def test_a_redirect_is_not_followed(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer], status: int
) -> None:
    """Before: a 307 to another port was followed and the other server measured; a 302 became
    ``HTTP 405`` (the POST turned into a GET) with no word of the redirect.  After: no request
    reaches the other server, and the error names the status and the target."""
    other = hostile("ok")
    server = hostile(f"redirect_{status}", redirect_to=other.url)
    result, level = _session(pytester, server.url)
    result.assert_outcomes(failed=1)
    assert level is not None and level["verdict"] == "error"
    reasons = _reasons(level)
    assert (
        f"HTTP {status} redirect to {other.url}/v1/chat/completions: redirects are not "
        "followed" in reasons
    )
    # the old symptom, a POST turned into a GET: "HTTP 405" (a bare "405" can be in the port)
    assert "point --endpoint at the final URL" in reasons and "HTTP 405" not in reasons
    assert other.seen == [], "the redirect's target must not be contacted"


def test_a_redirect_at_discovery_is_not_followed(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer]
) -> None:
    """The endpoint's discovery (``/v1/models``) does not follow a redirect either: the
    session errors at once, naming the target."""
    other = hostile("ok")
    server = hostile("redirect_models", redirect_to=other.url)
    result, _ = _session(pytester, server.url)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*{server.url}/v1/models answered HTTP 307, a redirect to {other.url}/v1/models*",
            "*point --endpoint at the final URL*",
        ]
    )
    assert other.seen == []


def test_a_429_names_its_retry_after(
    pytester: pytest.Pytester, hostile: Callable[..., HostileServer]
) -> None:
    """Before: ``HTTP 429: {...}`` with no word of how long the server asked to wait."""
    server = hostile("too_many_requests")
    result, level = _session(pytester, server.url)
    result.assert_outcomes(failed=1)
    assert level is not None and level["verdict"] == "error"
    assert f"HTTP 429 (Retry-After: {RETRY_AFTER})" in _reasons(level)


# ------------------------------------------------------------------ the rules, without a server


def test_max_tokens_is_read_from_the_encoded_body() -> None:
    """The request's limit comes from its own body (once per request), for both APIs; prompt
    text that spells the key is escaped in JSON and cannot be taken for it."""
    source = PromptSource(('say "max_tokens":999 twice',), "list:1")
    for api in ("chat", "completions"):
        (body,) = encode_bodies(source, model="m", api=api, max_tokens=17, ignore_eos=True)
        assert body_max_tokens(body) == 17
    assert body_max_tokens(b'{"model":"m"}') == 0
    assert body_max_tokens(b'{"max_tokens": 5, "stream": true}') == 5


def _stream(start: float, events: int, reads: int) -> RequestRecord:
    """A finished request whose ``events`` token events came in ``reads`` reads, 2 ms apart."""
    per = [events // reads] * reads
    per[-1] += events - sum(per)
    rec = RequestRecord(
        index=0,
        worker=0,
        scheduled=start - 0.05,
        sent=start - 0.05,
        first_token=start,
        status=200,
        completion_tokens=events,
    )
    rec.chunk_times = array("d", [start + 0.002 * i for i in range(reads)])
    rec.chunk_events = array("I", per)
    rec.end = rec.chunk_times[-1]
    return rec


def _summarize(records: list[RequestRecord], **signals: Any) -> TrialResult:
    for i, r in enumerate(records):
        r.index, r.worker = i, i % 2
    level = LevelSpec(2, None, max(r.completion_tokens for r in records))
    tr = TrialRecords(records=records, started=0.0, ended=10.0, concurrency=2)
    return summarize_trial(0, level, tr, client=ClientSignals(**signals), ignore_eos=False)


def _buffered(trial: TrialResult) -> list[str]:
    return [m for m in trial.invalid if m.startswith("buffered:")]


def test_buffered_needs_many_events_in_few_reads_for_most_requests() -> None:
    many = 2 * BUFFERED_MIN_EVENTS
    lumped = [_stream(1.0 + 0.1 * i, many, 1) for i in range(4)]
    assert _buffered(_summarize(lumped)) == [
        "buffered: inter-token latency cannot be measured; turn off compression or proxy "
        f"buffering (4 of 4 requests brought their {many} token events in at most 2 reads)"
    ]
    # SGLang with a large --stream-interval: few fat events, which may come in two reads
    fat = [_stream(1.0 + 0.1 * i, BUFFERED_MIN_EVENTS - 1, 2) for i in range(4)]
    assert _buffered(_summarize(fat)) == []
    # one request lumped by a hiccup is no pattern; half of them is not "most" either
    honest = [_stream(1.0 + 0.1 * i, many, many) for i in range(4)]
    assert _buffered(_summarize([lumped[0], *honest[1:]])) == []
    assert _buffered(_summarize([*lumped[:2], *honest[2:]])) == []
    assert _buffered(_summarize([*lumped[:3], honest[3]]))
    # a client whose event loop was held up before each first read reads late, in lumps: its
    # doing, not the server's (its lag monitor covers the read)
    stalls = {
        "lag_times": array("d", [r.first_token for r in lumped]),
        "lag_values": array("d", [0.05] * 4),
    }
    assert _buffered(_summarize(lumped, **stalls)) == []


def test_usage_errors_void_the_trial_and_are_not_a_missing_usage() -> None:
    recs = [_stream(1.0 + 0.001 * i, 20, 20) for i in range(2)]
    recs[0].usage_error = "usage.completion_tokens=-165 is negative"
    recs[0].tokens_approx = True
    trial = _summarize(recs)
    assert trial.invalid == [
        "1 request(s) reported usage that cannot be true: usage.completion_tokens=-165 is "
        "negative: the server's token accounting is broken, so no token figure of it stands; "
        "fix its usage reporting (or the proxy that rewrites it)"
    ]
    assert trial.transient == []
    assert not any("sent no usage" in e for e in trial.errors)


def test_a_running_usage_below_the_events_of_a_cut_stream_is_not_believed() -> None:
    """A stream the stationary time box cut is counted by its last running usage
    (``continuous_usage_stats``); one below the events it streamed cannot be true either."""
    recs = [_stream(1.0, 10, 10), _stream(1.0, 10, 10)]
    recs[0].cut = True
    recs[0].last_read = b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\n'
    assert count_cut_tokens(recs) == 1  # estimated from its events instead
    assert recs[0].usage_error == "usage.completion_tokens=1 is below the 10 token events streamed"
    assert recs[0].completion_tokens == 10
