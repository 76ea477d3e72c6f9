"""The one verdict enum: its values are the report strings, and every question the stages ask
of a verdict (fails a test? may it be recorded? compared? is it a warning? how is it named?)
has one answer here."""

from __future__ import annotations

import json

import pytest

from pytest_kimi.gate import family_verdicts
from pytest_kimi.verdicts import Verdict

ALWAYS_FAILING = {"fail", "invalid", "error", "regression", "inconclusive"}
UNTRUSTWORTHY = {"error", "invalid", "not-run"}


def test_values_are_the_report_strings() -> None:
    assert {v.value for v in Verdict} == {
        "pass",
        "fail",
        "invalid",
        "error",
        "not-run",
        "regression",
        "improved",
        "inconclusive",
        "underpowered",
        "no-baseline",
        "held",
        "broke",
    }
    assert str.__eq__(Verdict.NOT_RUN, "not-run") and str(Verdict.NO_BASELINE) == "no-baseline"
    assert f"{Verdict.REGRESSION}" == "regression"
    assert json.dumps({"verdict": Verdict.NO_BASELINE}) == json.dumps({"verdict": "no-baseline"})


def test_stats_returns_the_same_enum() -> None:
    r = family_verdicts.compare_level(
        [1000.0, 1010.0, 990.0], [800.0, 808.0, 792.0], session_sigma=0.0
    )
    assert r.verdict is Verdict.REGRESSION


def test_of_reads_report_strings_and_refuses_others() -> None:
    assert Verdict.of("underpowered") is Verdict.UNDERPOWERED
    assert Verdict.of(Verdict.PASS) is Verdict.PASS
    for other in ("PASS", "skipped", None, 3, ["pass"]):
        assert Verdict.of(other) is None


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("require_baseline", [False, True])
def test_fails(strict: bool, require_baseline: bool) -> None:
    expected = set(ALWAYS_FAILING)
    if strict:
        expected |= {"underpowered"}
    if require_baseline:
        expected.add("no-baseline")
    got = {v.value for v in Verdict if v.fails(strict=strict, require_baseline=require_baseline)}
    assert got == expected
    assert Verdict.failing(strict=strict, require_baseline=require_baseline) == frozenset(expected)


def test_failing_holds_plain_strings() -> None:
    # A str-enum member hashes by its name, so a set of members would not find "fail":
    # the set reports look verdict strings up in must hold the values.
    failing = Verdict.failing()
    assert "fail" in failing and all(type(v) is str for v in failing)


def test_never_failing() -> None:
    for v in (Verdict.PASS, Verdict.IMPROVED, Verdict.NOT_RUN):
        assert not v.fails(strict=True, require_baseline=True)


def test_warning_is_what_only_a_flag_makes_fail() -> None:
    warnings = {v.value for v in Verdict if v.warning}
    assert warnings == {"underpowered", "no-baseline"}
    assert warnings == set(Verdict.failing(strict=True, require_baseline=True) - Verdict.failing())


def test_comparable_excludes_untrustworthy_samples_and_recordable_failed_runs() -> None:
    assert {v.value for v in Verdict if not v.comparable} == UNTRUSTWORTHY
    # a level that missed its floor or regressed measured sound samples: comparable, but
    # --update-baselines refuses it without force (the rejected figure would be the target)
    # nor an estimate beyond the tolerance (inconclusive): it failed the run too
    assert {v.value for v in Verdict if not v.recordable} == UNTRUSTWORTHY | {
        "fail",
        "regression",
        "inconclusive",
    }
    for v in ("improved", "pass", "no-baseline", "underpowered", "held", "broke"):
        assert Verdict(v).recordable, v
    assert Verdict.FAIL.comparable and Verdict.REGRESSION.comparable


def test_headlines() -> None:
    assert Verdict.FAIL.headline == "target missed"
    assert Verdict.REGRESSION.headline == "regression beyond noise"
    assert Verdict.ERROR.headline == "requests failed"
    assert Verdict.INVALID.headline == "measurement invalid"
    assert Verdict.NO_BASELINE.headline == "no baseline (--perf-require-baseline)"
    assert Verdict.INCONCLUSIVE.headline == "inconclusive: the estimate lies beyond the tolerance"
    assert Verdict.UNDERPOWERED.headline == "underpowered (--perf-strict)"
    # every verdict that can fail a test names why; the others are named as themselves
    for v in Verdict:
        if v.fails(strict=True, require_baseline=True):
            assert v.headline != v.value
        else:
            assert v.headline == v.value
    # a conditional failure names the flag that made it one
    for v in Verdict:
        if v.warning:
            assert "(--perf-" in v.headline
