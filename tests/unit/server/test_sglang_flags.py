"""Profiles held to SGLang 0.5.23's own parser (``pytest_kimi/data/sglang_0_5_23_args.json``,
written from the real parser by ``tests/fake_sglang/dump_args.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kimi.server.profile import ProfileError, load_profile, parse_profile
from pytest_kimi.server.sglang_flags import check_args, known_versions, load_flag_table
from support.paths import REPO

ROOT = REPO
SGLANG_PROFILES = sorted(
    p for p in (ROOT / "servers").glob("*.yaml") if "engine: vllm" not in p.read_text()
)
MANAGED_SGLANG = [p for p in SGLANG_PROFILES if "\nargs:" in p.read_text()]


def test_the_table_is_the_real_parsers() -> None:
    """What the real parser has (counted from its wheel): 532 options, 559 long spellings,
    prefixes allowed, and the findings of issue 24 recorded."""
    table = load_flag_table("0.5.23")
    assert table.allow_abbrev is True
    assert len(table.flags) == 559
    assert len({f.dest for f in table.flags.values()}) >= 500
    assert table.flags["num-continuous-decode-steps"].dead
    assert table.flags["disable-cuda-graph"].deprecated
    assert "is deprecated" in (table.flags["disable-cuda-graph"].warning or "")
    assert table.flags["enable-dp-attention"].deprecated
    assert not table.flags["enable-metrics"].takes_value
    assert table.flags["stream-interval"].takes_value
    assert "0.5.23" in known_versions()


@pytest.mark.parametrize("path", SGLANG_PROFILES, ids=lambda p: p.name)
def test_shipped_profile_flags_are_real_full_and_alive(path: Path) -> None:
    profile = load_profile(path)  # raises on an unknown, abbreviated or dead flag
    check = check_args(profile.args, str(path))
    assert check.problems == (), [p.message for p in check.problems]
    assert profile.flag_warnings == ()


@pytest.mark.parametrize("path", MANAGED_SGLANG, ids=lambda p: p.name)
def test_every_managed_sglang_profile_enables_metrics(path: Path) -> None:
    assert load_profile(path).args.get("enable-metrics") is True


def test_tuned_profiles_differ_from_their_base_by_flags_that_act() -> None:
    table = load_flag_table()
    base = load_profile(ROOT / "servers/ep8.yaml").args
    for name in ("ep8-tuned", "ep8-eplb", "ep4", "tp8-tuned"):
        args = load_profile(ROOT / f"servers/{name}.yaml").args
        changed = {k for k in set(base) | set(args) if base.get(k) != args.get(k)}
        assert changed, name
        assert all(not table.flags[k].dead for k in changed), (name, changed)


@pytest.mark.parametrize(
    ("flag", "kind", "fix"),
    [
        ("enable-metric", "ambiguous", "'enable-metrics', 'enable-metrics-for-all-schedulers'"),
        ("cont", "ambiguous", "'context-bucket', 'context-length'"),
        ("api", "abbreviation", "write 'api-key'"),
        ("tp", "abbreviation", "write 'tp-size'"),
        ("num-continuous-decode-steps", "dead", "never read"),
        ("max-runing-requests", "unknown", "did you mean 'max-running-requests'"),
    ],
)
def test_a_bad_flag_fails_the_profile_naming_flag_file_and_fix(
    tmp_path: Path, flag: str, kind: str, fix: str
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(f"args:\n  model-path: /m\n  {flag}: 8\n")
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    text = str(err.value)
    assert str(path) in text and repr(flag) in text and fix in text
    assert check_args({flag: 8}, "x").problems[0].kind == kind


def test_a_deprecated_flag_loads_with_sglangs_own_warning() -> None:
    profile = parse_profile(
        {"args": {"model-path": "/m", "disable-cuda-graph": True}},
        source="p.yaml",
        default_name="p",
    )
    (warning,) = profile.flag_warnings
    assert "p.yaml" in warning and "'disable-cuda-graph'" in warning
    assert "--cuda-graph-backend-{decode,prefill}=disabled" in warning


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"enable-metrics": "yes"}, "takes no value"),
        ({"tp-size": True}, "takes a value"),
        ({"attention-backend": "tritonn"}, "must be one of"),
        ({"tp-size": [8, 4]}, "takes one value"),
    ],
)
def test_values_the_parser_would_refuse(args: dict[str, object], said: str) -> None:
    with pytest.raises(ProfileError, match=said):
        parse_profile({"args": {"model-path": "/m", **args}}, source="p.yaml", default_name="p")


def test_another_release_is_not_judged_by_this_parser() -> None:
    profile = parse_profile(
        {"args": {"model-path": "/m", "flag-of-0-6": 1}, "engine_version": "0.6.0"},
        source="p.yaml",
        default_name="p",
    )
    (note,) = profile.flag_warnings
    assert "not checked" in note and "0.6.0" in note


def test_a_command_that_is_not_sglang_is_not_checked() -> None:
    profile = parse_profile(
        {"command": "python my_server.py", "args": {"mode": "x"}}, source="p.yaml", default_name="p"
    )
    assert profile.args == {"mode": "x"}
