"""The plugin as users meet it: real pytest sessions run by ``pytester`` against the simulator."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from support.timing import SESSION_S, poll_until

FAST = dict(speed=10.0)
"""The pace of conftest's ``sim_url`` (EP8-shaped, 10x faster: C=1 gives ~650 tok/s), for this
module's own simulators."""

SECRET = "sk-test-5f1d9a0c-never-print-me"


@pytest.fixture(scope="module")
def secret_sim_url(tmp_path_factory: pytest.TempPathFactory):
    sim = SimProcess(SimConfig(api_key=SECRET, **FAST), log_dir=tmp_path_factory.mktemp("simlogs"))
    sim.start()
    try:
        yield sim.url
    finally:
        sim.stop()


SMALL = "max_tokens=64, trials=2, warmup=1"


def test_marker_is_registered_with_its_signature(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.throughput(concurrency=1, rate=None, max_tokens=512, min_tok_s=None*"]
    )
    result.stdout.fnmatch_lines(["@pytest.mark.perf:*"])


def test_perf_tests_skip_with_one_clear_reason_without_endpoint(
    pytester: pytest.Pytester, monkeypatch
) -> None:
    monkeypatch.delenv("KIMI_ENDPOINT", raising=False)
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=1, {SMALL}, min_tok_s=1)
        def test_a():
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no endpoint given: pass --endpoint=URL*--endpoint=sim*"])


def test_m_perf_selects_exactly_the_throughput_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest
        from pytest_kimi import throughput

        @throughput(concurrency=1, {SMALL})
        def test_fn():
            pass

        @throughput(concurrency=2, {SMALL})
        class TestClass:
            def test_in_class(self):
                pass

        def test_plain():
            pass
        """
    )
    pytester.makepyfile(
        test_module_mark=f"""
        from pytest_kimi import throughput
        pytestmark = throughput(concurrency=1, {SMALL})

        def test_module_level():
            pass
        """
    )
    result = pytester.runpytest("-m", "perf", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_fn", "*test_in_class", "*test_module_level"])
    assert "test_plain" not in result.stdout.str()
    result = pytester.runpytest("-m", "not perf", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_plain"])
    assert "test_fn" not in result.stdout.str()


@pytest.mark.parametrize(
    "args, expected",
    [
        ("concurrency=0", "concurrency=0: expected an integer >= 1"),
        ("concurrency=[1, 'x']", "concurrency='x': expected an integer >= 1"),
        ("concurency=4", "unknown argument concurency (did you mean concurrency?); allowed: *"),
        (
            "min_tok_s={8: 100}",
            "min_tok_s={8: 100}: level 8 is not one of the concurrency levels [[]1[]]",
        ),
        ("api='grpc'", "api='grpc': expected one of 'chat', 'completions'"),
        ("prompts='diverse', input_tokens=100", "prompts and input_tokens are exclusive*"),
        ("ignore_eos='yes'", "ignore_eos='yes': expected True or False"),
        ("max_error_rate=2", "max_error_rate=2: expected a number with 0 <= x <= 1"),
        ("requests=8, requests_per_stream=2", "requests and requests_per_stream are exclusive*"),
        ("rate=2, requests_per_stream=2", "requests_per_stream applies to concurrency levels*"),
    ],
)
def test_malformed_marker_fails_collection_naming_test_and_argument(
    pytester: pytest.Pytester, args: str, expected: str
) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput({args})
        def test_bad():
            pass
        """
    )
    result = pytester.runpytest("--endpoint=http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_malformed_marker*.py::test_bad: @throughput {expected}"])


def test_bad_option_value_names_its_source(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--perf-trials=abc", "--endpoint=http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-trials: bad value 'abc': expected a positive integer*"])
    monkeypatch.setenv("KIMI_PERF_TRIALS", "0")
    result = pytester.runpytest("--endpoint=http://127.0.0.1:9")
    result.stderr.fnmatch_lines(["*env KIMI_PERF_TRIALS: bad value '0'*"])
    monkeypatch.delenv("KIMI_PERF_TRIALS")
    pytester.makeini("[pytest]\nkimi_endpoint = ftp://nowhere\n")
    pytester.makepyfile(
        test_y=f"""
        from pytest_kimi import throughput
        @throughput({SMALL})
        def test_y(): pass
        """
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*ini kimi_endpoint: 'ftp://nowhere' is not an http(s) URL*"])


def test_floor_met_passes_and_missed_fails_with_table(
    pytester: pytest.Pytester, sim_url: str
) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=1, {SMALL}, min_tok_s=10)
        def test_met():
            pass

        @throughput(concurrency=[1, 4], {SMALL}, min_tok_s={{4: 10_000_000}})
        def test_missed():
            raise AssertionError("the body must not run when a target is missed")
        """
    )
    result = pytester.runpytest(f"--endpoint={sim_url}")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "the body must not run" not in out
    result.stdout.fnmatch_lines(
        [
            "*throughput target missed:*",
            "*level*tok/s*req tok/s p50*TTFT p50/p95 s*ITL p50 ms*ok/failed*target*verdict*",
            "*C=4 fail: aggregate * tok/s < min_tok_s 1e+07*",
        ]
    )
    result.stdout.fnmatch_lines(["*pytest-kimi throughput*", "*test_met [[]passed[]]*"])


def test_other_targets_and_throughput_result(pytester: pytest.Pytester, sim_url: str) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=2, {SMALL}, min_request_tok_s=1e9)
        def test_request_rate():
            pass

        @throughput(concurrency=2, {SMALL}, max_ttft_s=1e-6)
        def test_ttft():
            pass

        @throughput(concurrency=2, {SMALL})
        def test_result(throughput_result):
            lv = throughput_result.level(2)
            assert lv.verdict == "no-baseline"
            assert len(lv.trials) == 2
            # every stream the time box did not cut got its whole request
            assert all(
                r.completion_tokens == (r.max_tokens or 64)
                for t in lv.trials for r in t.records if not r.cut
            )
            assert lv.figures.tok_s > lv.figures.request_tok_s_p50
        """
    )
    result = pytester.runpytest(f"--endpoint={sim_url}")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*per-request p50 * tok/s < min_request_tok_s 1e+09*"])
    result.stdout.fnmatch_lines(["*TTFT p95 * s > max_ttft_s 1e-06*"])


def test_json_report_fields(pytester: pytest.Pytester, sim_url: str, tmp_path: Path) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=[1, 4], {SMALL}, min_tok_s=20)
        def test_sweep():
            pass
        """
    )
    # min_tok_s=20: a floor the C=1 level clears on any machine.  The client's few ms of
    # latency on a busy core count `speed` times in the simulator's clock: at speed 50, C=1
    # measured 48.8 tok/s on a loaded CI machine (about 60 idle), so a floor of 50 failed there.
    out = tmp_path / "perf.json"
    result = pytester.runpytest(f"--endpoint={sim_url}", f"--perf-json={out}")
    result.assert_outcomes(passed=1)
    report = json.loads(out.read_text())
    assert report["endpoint"]["url"] == sim_url
    assert report["endpoint"]["model"] == "kimi-k2.6-sim"
    assert report["endpoint"]["server_info"]
    (test,) = report["tests"]
    assert test["nodeid"] == "test_json_report_fields.py::test_sweep"
    assert test["outcome"] == "passed"
    assert [lv["concurrency"] for lv in test["levels"]] == [1, 4]
    for lv in test["levels"]:
        for key in (
            "concurrency",
            "max_tokens",
            "tok_s",
            "trials_tok_s",
            "request_tok_s_p50",
            "ttft_s_p50",
            "ttft_s_p95",
            "itl_s_p50",
            "requests_ok",
            "requests_failed",
            "verdict",
        ):
            assert key in lv, key
        assert lv["verdict"] == "no-baseline"
        assert lv["max_tokens"] == 64
        assert len(lv["trials_tok_s"]) == 2
        assert sorted(lv["trials_tok_s"])[0] <= lv["tok_s"] <= sorted(lv["trials_tok_s"])[-1]
        assert lv["requests_failed"] == 0


def test_api_key_is_used_and_never_shown(
    pytester: pytest.Pytester, secret_sim_url: str, tmp_path: Path, monkeypatch
) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=[1, 2], {SMALL})
        def test_auth():
            pass
        """
    )
    out = tmp_path / "perf.json"
    monkeypatch.setenv("KIMI_API_KEY", SECRET)
    result = pytester.runpytest(f"--endpoint={secret_sim_url}", f"--perf-json={out}", "-v", "-rA")
    result.assert_outcomes(passed=1)
    assert SECRET not in result.stdout.str() + result.stderr.str()
    assert SECRET not in out.read_text()
    monkeypatch.setenv("KIMI_API_KEY", "wrong-" + SECRET)
    result = pytester.runpytest(f"--endpoint={secret_sim_url}", f"--perf-json={out}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*answered 401: the server wants an API key*"])
    assert SECRET not in result.stdout.str() + result.stderr.str()
    assert SECRET not in out.read_text()


def test_kimi_load_from_an_async_test(pytester: pytest.Pytester, sim_url: str) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.asyncio
        async def test_sweep(kimi_load, kimi_endpoint):
            assert kimi_endpoint.model == "kimi-k2.6-sim"
            result = await kimi_load.sweep(concurrency=[1, 8], max_tokens=128, trials=2, warmup=0)
            assert [lv.verdict for lv in result.levels] == ["pass", "pass"]
            assert result.level(8).figures.tok_s > result.level(1).figures.tok_s
        """
    )
    result = pytester.runpytest(f"--endpoint={sim_url}")
    result.assert_outcomes(passed=1)


def test_kimi_load_sweep_sync_from_a_plain_test(pytester: pytest.Pytester, sim_url: str) -> None:
    """``sweep_sync`` from a plain ``def`` test: the same measurement, the session's
    ``--perf-protocol`` included, and the simulator's clock."""
    pytester.makepyfile(
        """
        def test_sweep(kimi_load):
            result = kimi_load.sweep_sync(concurrency=[1, 4], max_tokens=64, trials=2, warmup=0)
            assert [lv.verdict for lv in result.levels] == ["pass", "pass"]
            assert [lv.to_dict()["protocol"] for lv in result.levels] == [None, None]
            assert all((lv.server_time_s or 0) > 0 for lv in result.levels)
            assert result.level(4).figures.tok_s > result.level(1).figures.tok_s
        """
    )
    result = pytester.runpytest(f"--endpoint={sim_url}", "--perf-protocol=whole-requests")
    result.assert_outcomes(passed=1)


def test_endpoint_sim_starts_and_reaps_a_simulator(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        f"""
        import os
        from pytest_kimi import throughput

        @throughput(concurrency=2, {SMALL})
        def test_sim(kimi_endpoint):
            pid = kimi_endpoint.server_pid
            with open(os.environ["PID_FILE"], "w") as fh:
                fh.write(str(pid))
        """
    )
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    # a session of its own: the simulator it starts and reaps is none of this process's
    result = pytester.runpytest_subprocess("--endpoint=sim:speed=10", timeout=SESSION_S)
    result.assert_outcomes(passed=1)
    pid = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    poll_until(gone, f"simulator {pid} gone after the session")


def test_perf_tests_never_measure_in_parallel_under_xdist(
    pytester: pytest.Pytester, sim_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(
        f"""
        import os
        from pytest_kimi import throughput

        @throughput(concurrency=1, {SMALL})
        def test_a():
            print(os.environ.get("PYTEST_XDIST_WORKER"))

        @throughput(concurrency=2, {SMALL})
        def test_b():
            pass

        def test_plain():
            pass
        """
    )
    out = tmp_path / "perf.json"
    result = pytester.runpytest_subprocess(
        "-n", "2", f"--endpoint={sim_url}", f"--perf-json={out}", "-v"
    )
    result.assert_outcomes(passed=3)
    report = json.loads(out.read_text())
    assert sorted(t["nodeid"].split("::")[-1] for t in report["tests"]) == ["test_a", "test_b"]
    spans = sorted(tuple(t["measured"]) for t in report["tests"])
    assert spans[0][1] <= spans[1][0], f"measurements overlapped: {spans}"


def test_junit_properties_carry_levels_also_under_xdist(
    pytester: pytest.Pytester, sim_url: str
) -> None:
    import xml.etree.ElementTree as ET

    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=[1, 2], {SMALL})
        def test_sweep():
            pass
        """
    )
    for extra in (["-n", "2"],):  # through xdist: the properties travel with the reports
        junit = pytester.path / "junit.xml"
        result = pytester.runpytest_subprocess(
            f"--endpoint={sim_url}", f"--junitxml={junit}", *extra
        )
        result.assert_outcomes(passed=1)
        props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
        assert float(props["kimi.C1.tok_s"]) > 0 and float(props["kimi.C2.tok_s"]) > 0
        assert props["kimi.C2.verdict"] == "no-baseline"
        assert props["kimi.C1.trials"] == "2"


def test_markdown_step_summary_and_html_reports(
    pytester: pytest.Pytester, sim_url: str, tmp_path: Path, monkeypatch
) -> None:
    import sys

    # the HTML report's figures are SVG drawn by the plugin: no plotting library needed
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=[1, 4], {SMALL}, min_tok_s={{4: 10_000_000}})
        def test_sweep():
            pass
        """
    )
    summary = tmp_path / "step_summary.md"
    summary.write_text("previous step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    md, html_dir = tmp_path / "perf.md", tmp_path / "html"
    result = pytester.runpytest_inprocess(
        f"--endpoint={sim_url}", f"--perf-markdown={md}", f"--perf-html={html_dir}"
    )
    result.assert_outcomes(failed=1)
    text = md.read_text()
    assert "## pytest-kimi throughput: FAILED" in text
    assert "### `test_markdown_step_summary_and_html_reports.py::test_sweep` **FAILED**" in text
    rows = [line for line in text.splitlines() if line.startswith("| C=4 |")]
    # the level's row in the throughput table, its row in the latency table, then in the
    # peers' figures (p50/p90/p99 (mean) per latency, then req/s and input/total tok/s)
    assert len(rows) == 3 and "**FAIL**" in rows[0] and "1e+07" in rows[0]
    assert "not compared" in rows[1]
    assert rows[2].count("/") >= 8 and "(" in rows[2]
    assert summary.read_text().startswith("previous step\n") and text in summary.read_text()
    page = (html_dir / "index.html").read_text()
    svgs = sorted(html_dir.glob("*.svg"))
    assert len(svgs) == 2 and all(p.read_text().startswith("<?xml") for p in svgs)
    assert page.count('class="chart"') == 2


def test_latency_targets_and_goodput(
    pytester: pytest.Pytester, sim_url: str, tmp_path: Path
) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        # ceilings in the simulator's clock (speed 10): 25 s, 5 s and 50 s of the wall clock
        @throughput(concurrency=2, {SMALL}, max_ttft_s=250, max_itl_s=50, max_e2e_s=500, percentile=90, min_goodput=0.9)
        def test_met():
            pass

        @throughput(concurrency=2, {SMALL}, max_itl_s=1e-7, max_e2e_s=1e-6, percentile=99, min_goodput=0.5)
        def test_missed():
            pass
        """
    )
    report = tmp_path / "perf.json"
    result = pytester.runpytest(f"--endpoint={sim_url}", f"--perf-json={report}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*C=2 fail: ITL p99 * s > max_itl_s 1e-07*",
            "*C=2 fail: end-to-end latency p99 * s > max_e2e_s 1e-06*",
            "*C=2 fail: goodput 0.0% < min_goodput 50% (requests meeting every latency ceiling)*",
        ]
    )
    met = json.loads(report.read_text())["tests"][0]["levels"][0]
    assert met["percentile"] == 90 and met["goodput"] == 1.0
    assert 0 < met["ttft_s_pct"] < 250 and 0 < met["itl_s_pct"] < 50 and 0 < met["e2e_s_pct"] < 500


def test_open_loop_rates_and_length_sweeps(
    pytester: pytest.Pytester, sim_url: str, tmp_path: Path
) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_kimi import throughput
        from pytest_kimi.load.trial_book import LAG_INTERVAL_S

        # rates per second of the simulator's clock: at speed 10, 25 and 40 requests per wall s
        @throughput(rate=[2.5, 4], max_tokens=32, requests=20, trials=2, warmup=1, min_tok_s={4: 10})
        def test_rates(throughput_result):
            for lv in throughput_result.levels:
                for t in lv.trials:
                    planned = sorted(r.scheduled for r in t.records)
                    sent = sorted(r.sent for r in t.records)
                    n = len(sent)
                    # the plan offers exactly the rate (the schedule's mean gap is pinned; the
                    # rate is per server second, the simulator's clock runs `clock` times fast)
                    wall_rate = lv.spec.rate * lv.figures.clock
                    assert (n - 1) / (planned[-1] - planned[0]) == pytest.approx(wall_rate)
                    assert t.achieved_rate == pytest.approx((n - 1) / (sent[-1] - sent[0]))
                    # every request left on time, late by no more than the client's own lag
                    # monitor saw its loop held up (plus one monitor interval and the timer's
                    # slack): so the achieved rate is the plan's, give or take that
                    bound = t.client.loop_lag_max_s + LAG_INTERVAL_S + 0.002
                    late = [r.sent - r.scheduled for r in t.records]
                    assert 0 <= min(late) and max(late) <= bound, (max(late), bound)

        # one trial a level: the sweep's product and the lengths in its records are the point
        @throughput(concurrency=4, max_tokens=[16, 64], input_tokens=[50, 400], trials=1, warmup=1)
        def test_lengths(throughput_result):
            assert len(throughput_result.levels) == 4
            lv = throughput_result.level(4, max_tokens=64, input_tokens=400)
            assert all(
                r.completion_tokens == (r.max_tokens or 64)
                for t in lv.trials for r in t.records if not r.cut
            )
            def prompts(level):  # streams cut before their first usage have none
                return [r.prompt_tokens for t in level.trials for r in t.records if r.prompt_tokens]

            short = throughput_result.level(4, max_tokens=64, input_tokens=50)
            assert prompts(lv) and prompts(short) and min(prompts(lv)) > max(prompts(short))
        """
    )
    report = tmp_path / "perf.json"
    result = pytester.runpytest(f"--endpoint={sim_url}", f"--perf-json={report}")
    result.assert_outcomes(passed=2)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(report.read_text())["tests"]}
    rates = tests["test_rates"]["levels"]
    assert [lv["rate"] for lv in rates] == [2.5, 4] and [lv["label"] for lv in rates] == [
        "rate=2.5/s",
        "rate=4/s",
    ]
    for lv in rates:
        assert lv["achieved_rate"] > 0  # checked against the plan and the lag in test_rates
        assert lv["concurrency"] is None and lv["tok_s"] > 0
    labels = [lv["label"] for lv in tests["test_lengths"]["levels"]]
    assert labels == [
        "C=4 max_tokens=16 input_tokens=50",
        "C=4 max_tokens=16 input_tokens=400",
        "C=4 max_tokens=64 input_tokens=50",
        "C=4 max_tokens=64 input_tokens=400",
    ]
    result.stdout.fnmatch_lines(["*rate=4/s*", "*C=4 max_tokens=64 input_tokens=400*"])


def test_load_workers_shard_the_client(
    pytester: pytest.Pytester, sim_url: str, tmp_path: Path
) -> None:
    pytester.makepyfile(
        f"""
        from pytest_kimi import throughput

        @throughput(concurrency=[1, 8], {SMALL})
        def test_sharded(throughput_result):
            records = [r for t in throughput_result.level(8).trials for r in t.records]
            # (a stream the time box cut before its response began has no status: not an error)
            assert len({{r.worker for r in records}}) == 8 and all(r.ok or r.cut for r in records)
        """
    )
    report = tmp_path / "perf.json"
    result = pytester.runpytest_subprocess(
        f"--endpoint={sim_url}", "--perf-workers=2", f"--perf-json={report}"
    )
    result.assert_outcomes(passed=1)
    levels = json.loads(report.read_text())["tests"][0]["levels"]
    assert all(lv["tok_s"] > 0 for lv in levels)
