"""A deployment diff as atomic changes, and the deployments between two profiles
(:mod:`pytest_kimi.server.profile_diff`): what counts as a change, how it is named and shown
(never a secret's value), how groups are declared, and that a derived profile is the reference
with exactly the applied changes made, deterministically."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from typing import Any

import pytest

from pytest_kimi.server import ServerProfile, parse_profile
from pytest_kimi.server.profile import ProfileError
from pytest_kimi.server.profile_diff import (
    SECRET_SHOWN,
    Change,
    ChangeGroup,
    atomic_changes,
    derive,
    derived_name,
)

SGLANG = [sys.executable, "-m", "sglang.launch_server"]
OTHER_VENV = ["/opt/sglang-0.5.24/bin/python", "-m", "sglang.launch_server"]


def _profile(name: str, **data: Any) -> ServerProfile:
    data.setdefault("command", SGLANG)
    return parse_profile(data, source=f"{name}.yaml", default_name=name)


def _reference() -> ServerProfile:
    return _profile(
        "ref",
        args={
            "model-path": "/models/k2",
            "tp-size": 8,
            "log-level": "info",
            "stream-interval": 1,
            "enable-metrics": True,
        },
        env={"SGLANG_A": "1", "HF_TOKEN": "hf_reference_value", "GONE": "x"},
    )


def _candidate() -> ServerProfile:
    return _profile(
        "cand",
        args={
            "model-path": "/models/k2",
            "tp-size": 8,
            "log-level": "debug",  # changed
            "enable-eplb": True,  # added
            "stream-interval": 1,
            # enable-metrics removed
        },
        env={"SGLANG_A": "2", "HF_TOKEN": "hf_candidate_value", "NEW": "y"},  # GONE unset
    )


def _keys(groups: list[ChangeGroup]) -> list[str]:
    return [k for g in groups for k in g.keys]


# ------------------------------------------------------------------------ the diff


def test_every_difference_is_one_atomic_change_named_as_the_profile_writes_it() -> None:
    groups = atomic_changes(_reference(), _candidate())
    assert all(len(g.changes) == 1 and not g.declared for g in groups)
    by_key = {c.key: c for g in groups for c in g.changes}
    assert _keys(groups) == [
        "log-level",
        "enable-eplb",
        "enable-metrics",
        "env:SGLANG_A",
        "env:HF_TOKEN",
        "env:NEW",
        "env:GONE",
    ]
    assert by_key["log-level"] == Change("log-level", "arg", "info", "debug")
    assert by_key["enable-eplb"] == Change("enable-eplb", "arg", None, "true")
    assert by_key["enable-metrics"] == Change("enable-metrics", "arg", "true", None)
    assert by_key["env:SGLANG_A"] == Change("env:SGLANG_A", "env", "1", "2")
    assert by_key["env:NEW"] == Change("env:NEW", "env", None, "y")
    assert by_key["env:GONE"] == Change("env:GONE", "env", "x", None)
    assert str(by_key["enable-eplb"]) == "enable-eplb: (not set) -> true"


def test_secret_values_are_never_shown() -> None:
    ref = _profile(
        "ref",
        args={"model-path": "/m", "api-key": "sk-reference-0123456789"},
        env={"DEPLOY_CRED": "alpha-cred", "HF_TOKEN": "hf_a"},
        secret_env=["DEPLOY_CRED"],
    )
    cand = _profile(
        "cand",
        args={"model-path": "/m", "api-key": "sk-candidate-0123456789"},
        env={"DEPLOY_CRED": "beta-cred", "HF_TOKEN": "hf_b"},
    )
    groups = atomic_changes(ref, cand)
    changes = [c for g in groups for c in g.changes]
    assert [c.key for c in changes] == ["api-key", "env:DEPLOY_CRED", "env:HF_TOKEN"]
    for c in changes:
        assert (c.reference, c.candidate) == (SECRET_SHOWN, SECRET_SHOWN)
    text = repr(groups) + " ".join(str(g) for g in groups) + repr([g.to_dict() for g in groups])
    for secret in ("sk-reference", "sk-candidate", "alpha-cred", "beta-cred", "hf_a", "hf_b"):
        assert secret not in text


def test_what_the_server_does_not_see_differently_is_no_change() -> None:
    ref = _profile("ref", args={"model-path": "/m", "enable-eplb": False, "log-level": None})
    cand = _profile("cand", args={"model-path": "/m", "log-level": None})
    assert atomic_changes(ref, cand) == []
    assert atomic_changes(_reference(), _reference()) == []


def test_the_engine_and_the_model_are_one_change_each() -> None:
    ref = _profile("ref", args={"model-path": "/models/k2", "tp-size": 8})
    cand = _profile(
        "cand",
        command=OTHER_VENV,
        engine_version="0.5.24",
        args={"model-path": "/models/k2-0905", "revision": "abc123", "tp-size": 8},
    )
    groups = atomic_changes(ref, cand)
    assert _keys(groups) == ["engine", "model"]
    engine, model = (g.changes[0] for g in groups)
    assert engine.kind == "engine"
    assert engine.candidate == " ".join(OTHER_VENV) + " (engine_version 0.5.24)"
    assert model == Change(
        "model", "model", "/models/k2", "model-path=/models/k2-0905 revision=abc123"
    )


def test_nice_is_a_setting_change() -> None:
    ref = _profile("ref", args={"model-path": "/m"})
    cand = _profile("cand", args={"model-path": "/m"}, nice=10)
    [group] = atomic_changes(ref, cand)
    assert group.changes == (Change("nice", "setting", "0", "10"),)


def test_declared_groups_are_applied_together_and_merge_when_they_share_a_key() -> None:
    groups = atomic_changes(
        _reference(),
        _candidate(),
        groups=[
            ["enable-eplb", "env:NEW"],
            ["env:NEW", "env:GONE"],
            ["not-in-this-diff", "log-level"],  # only one member changed: a plain change
        ],
    )
    labels = [g.label for g in groups]
    assert labels == [
        "log-level",
        "enable-eplb+env:NEW+env:GONE",
        "enable-metrics",
        "env:SGLANG_A",
        "env:HF_TOKEN",
    ]
    assert [g.declared for g in groups] == [False, True, False, False, False]
    with pytest.raises(TypeError, match="list of change keys"):
        atomic_changes(_reference(), _candidate(), groups=["enable-eplb"])


def test_an_external_profile_or_another_engine_kind_is_refused() -> None:
    external = parse_profile(
        {"url": "http://127.0.0.1:30000"}, source="ext.yaml", default_name="ext"
    )
    with pytest.raises(ValueError, match="external server profile .* cannot take part"):
        atomic_changes(_reference(), external)
    with pytest.raises(ValueError, match="external"):
        derive(external, _reference(), [])
    vllm = parse_profile(
        {"engine": "vllm", "args": {"model": "/m"}}, source="v.yaml", default_name="v"
    )
    with pytest.raises(ValueError, match="runs sglang.*runs vllm"):
        atomic_changes(_reference(), vllm)


# ------------------------------------------------------------------------ derive


def test_derive_applies_exactly_the_given_changes() -> None:
    ref, cand = _reference(), _candidate()
    groups = {g.label: g for g in atomic_changes(ref, cand)}
    mid = derive(ref, cand, [groups["enable-eplb"], groups["env:GONE"], groups["enable-metrics"]])
    assert mid.name == "ref+enable-eplb+enable-metrics+env:GONE"
    assert mid.args == {
        "model-path": "/models/k2",
        "tp-size": 8,
        "log-level": "info",
        "stream-interval": 1,
        "enable-eplb": True,
    }
    assert mid.env == {"SGLANG_A": "1", "HF_TOKEN": "hf_reference_value"}
    assert mid.command == ref.command
    assert mid.path is None


def test_derive_with_everything_is_the_candidate_and_with_nothing_the_reference() -> None:
    ref, cand = _reference(), _candidate()
    groups = atomic_changes(ref, cand)
    full = derive(ref, cand, groups)
    assert full.args == cand.args and full.env == cand.env and full.command == cand.command
    assert derive(ref, cand, []) is ref


def test_derive_is_deterministic_whatever_the_order() -> None:
    ref, cand = _reference(), _candidate()
    groups = atomic_changes(ref, cand)[:4]
    results = {
        (p.name, tuple(p.args.items()), tuple(p.env.items()))
        for p in (derive(ref, cand, order) for order in itertools.permutations(groups))
    }
    assert len(results) == 1


def test_derive_runs_the_candidate_engine_and_serves_its_model() -> None:
    ref = _profile("ref", args={"model-path": "/models/k2", "tp-size": 8})
    cand = _profile(
        "cand",
        command=OTHER_VENV,
        engine_version="0.5.23",
        args={"model-path": "/models/k2-0905", "revision": "abc123", "tp-size": 8},
    )
    engine, model = atomic_changes(ref, cand)
    with_engine = derive(ref, cand, [engine])
    assert with_engine.command == OTHER_VENV and with_engine.engine_version == "0.5.23"
    assert with_engine.args["model-path"] == "/models/k2"
    with_model = derive(ref, cand, [model])
    assert with_model.command == SGLANG
    assert with_model.args == {"model-path": "/models/k2-0905", "tp-size": 8, "revision": "abc123"}
    assert with_model.name == "ref+model"
    back = derive(cand, ref, atomic_changes(cand, ref)[1:])
    assert "revision" not in back.args and back.args["model-path"] == "/models/k2"


def test_derive_keeps_secrets_hidden_and_waits_like_the_slower_profile() -> None:
    ref = dataclasses.replace(
        _reference(), secret_env=frozenset({"A_CRED"}), startup_timeout_s=60.0
    )
    cand = dataclasses.replace(_candidate(), secret_env=frozenset({"B_CRED"}), stop_grace_s=99.0)
    mid = derive(ref, cand, atomic_changes(ref, cand)[:1])
    assert mid.secret_env == {"A_CRED", "B_CRED"}
    assert mid.startup_timeout_s == max(60.0, cand.startup_timeout_s)
    assert mid.stop_grace_s == 99.0


def test_derive_refuses_a_change_of_another_diff() -> None:
    ref, cand = _reference(), _candidate()
    foreign = ChangeGroup((Change("enable-eplb", "arg", None, "false"),))
    with pytest.raises(ValueError, match="is not one of 'ref' -> 'cand'"):
        derive(ref, cand, [foreign])


def test_a_derived_deployment_sglang_would_refuse_is_refused_before_any_launch() -> None:
    ref = _profile("ref", args={"model-path": "/m"})
    # a candidate for a release whose flags are not shipped: not checked when it was loaded
    cand = _profile(
        "cand", engine_version="9.9.9", args={"model-path": "/m", "enable-warp-drive": True}
    )
    [flag] = [g for g in atomic_changes(ref, cand) if g.keys == ("enable-warp-drive",)]
    with pytest.raises(ProfileError, match="derived server profile 'ref\\+enable-warp-drive'"):
        derive(ref, cand, [flag])


def test_derived_names() -> None:
    assert derived_name("ref", ["enable-eplb", "env:FOO"]) == "ref+enable-eplb+env:FOO"
    assert derived_name("ref", []) == "ref"
