"""Tests for the git-backed baseline store (the pytest_kimi.baseline package).

The store's promises are about files a human reviews: stable text, no half-written files, no
silent overwrite, and error messages that point at the file and the broken field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.baseline import store as bl
from pytest_kimi.baseline import (
    BaselineError,
    BaselineExistsError,
    BaselineStore,
    FieldChange,
    LevelBaseline,
    Provenance,
    ProvenanceConflict,
    TestBaseline,
    WorkloadKey,
    baseline_relpath,
    dumps,
    incomparable,
    loads,
    merge,
    provenance_diff,
    round_seconds,
    summarize_update,
)

NODE = "tests/perf/test_ep8.py::test_single_stream"


def workload(concurrency: int = 1, max_tokens: int = 512, **extra: Any) -> dict[str, Any]:
    return {
        "api": "chat",
        "concurrency": concurrency,
        "ignore_eos": True,
        "input_tokens": None,
        "max_tokens": max_tokens,
        "prompts": "builtin:diverse",
        **extra,
    }


def server_info(**overrides: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "version": "0.5.6",
        "model_path": "moonshotai/Kimi-K2.6",
        "tp_size": 8,
        "ep_size": 8,
        "enable_eplb": False,
        "max_running_requests": 64,
        "cuda_graph_bs": [1, 2, 4, 8],
        "host": "10.0.0.7",
        "port": 30000,
        "nccl_port": 31234,
        "random_seed": 918273,
        "speculative": {"algorithm": "EAGLE", "num_steps": 3},
        "internal_states": [{"memory_usage": {"weight": 120.5}, "last_gen_throughput": 1400.2}],
        "chat_template": None,
        "served_model_name": "kimi-k2.6",
        "note": "yes",  # a string YAML 1.1 would read as a boolean unless quoted
    }
    info.update(overrides)
    return info


def provenance(**overrides: Any) -> Provenance:
    fields: dict[str, Any] = dict(
        model="kimi-k2.6",
        server_info=server_info(),
        plugin_version="0.1.0",
        git_commit="abc123def456",
        recorded_at="2026-11-29T08:00:00Z",
        client_host="myhost",
        session_ids=("s-1",),
    )
    fields.update(overrides)
    return Provenance(**fields)


def level(
    concurrency: int = 1, trials: tuple[float, ...] = (65.1, 64.9, 65.3), **wl: Any
) -> LevelBaseline:
    return LevelBaseline(
        workload=WorkloadKey.from_dict(workload(concurrency, **wl)),
        trials_tok_s=trials,
        request_tok_s={"p50": 65.2},
        ttft_s={"p95": 0.052, "p50": 0.041},
    )


def make(levels: list[LevelBaseline] | None = None, test: str = NODE, **prov: Any) -> TestBaseline:
    if levels is None:
        levels = [level(1), level(8, (1520.3, 1510.0, 1525.9))]
    return TestBaseline(
        test=test, profile="default", provenance=provenance(**prov), levels=tuple(levels)
    )


@pytest.fixture
def store(tmp_path: Path) -> BaselineStore:
    return BaselineStore(tmp_path / "baselines", "default")


def leftovers(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"
    )


# ------------------------------------------------------------------------------ format, round trip


EXPECTED_TEXT = """\
# pytest-kimi throughput baseline; written by the plugin, reviewed as a diff.
# tok_s is the median of trials_tok_s; rates in tok/s, times in seconds.
schema: 1
test: tests/perf/test_ep8.py::test_single_stream
profile: default
levels:
  - workload: {api: chat, concurrency: 1, ignore_eos: true, max_tokens: 512, prompts: 'builtin:diverse'}
    tok_s: 65.1
    trials_tok_s: [65.1, 64.9, 65.3]
    request_tok_s: {p50: 65.2}
    ttft_s: {p50: 0.041, p95: 0.052}
provenance:
  model: kimi-k2.6
  plugin_version: 0.1.0
  git_commit: abc123
  recorded_at: '2026-11-29T08:00:00Z'
  client_host: myhost
  session_ids: [s-1]
  server_info:
    enable_eplb: false
    max_running_requests: 64
    version: 0.5.6
"""


def test_file_text_is_exactly_the_documented_format() -> None:
    baseline = make(
        [level(1)],
        git_commit="abc123",
        server_info={"version": "0.5.6", "max_running_requests": 64, "enable_eplb": False},
    )
    assert dumps(baseline) == EXPECTED_TEXT


def test_round_trip_through_a_file_is_lossless_and_text_stable(store: BaselineStore) -> None:
    original = make()
    path = store.save(original, overwrite=False)
    text = path.read_text(encoding="utf-8")
    loaded = store.load(NODE)
    assert loaded == original
    assert dumps(loaded) == text  # load + dump changes nothing
    store.save(loaded, overwrite=True)
    assert path.read_text(encoding="utf-8") == text


def test_text_does_not_depend_on_input_order() -> None:
    a = make([level(1), level(8, (1520.3, 1510.0))])
    shuffled_info = dict(reversed(list(server_info().items())))
    b = make([level(8, (1520.3, 1510.0)), level(1)], server_info=shuffled_info)
    assert dumps(a) == dumps(b)
    assert dumps(a).index("concurrency: 1,") < dumps(a).index("concurrency: 8,")


def test_figures_are_rounded_for_diffs() -> None:
    lv = LevelBaseline(
        workload=workload(),
        trials_tok_s=[65.14999, 64.96, 65.31],
        request_tok_s={"p50": 65.2444},
        ttft_s={"p50": 0.0412345, "p99": 12.34567},
    )
    assert lv.trials_tok_s == (65.1, 65.0, 65.3)
    assert lv.tok_s == 65.1
    assert lv.request_tok_s == {"p50": 65.2}
    assert lv.ttft_s == {"p50": 0.0412, "p99": 12.35}
    assert round_seconds(0.00012345) == 0.0001  # never finer than 0.1 ms
    assert round_seconds(1234.567) == 1235.0  # 4 significant digits
    assert round_seconds(round_seconds(0.099996)) == round_seconds(0.099996)


def test_workload_key_is_canonical_and_exact() -> None:
    a = WorkloadKey.from_dict({"max_tokens": 512, "concurrency": 8, "input_tokens": None})
    b = WorkloadKey.from_dict({"concurrency": 8.0, "max_tokens": 512})
    assert a == b and hash(a) == hash(b)
    assert a.keys() == ["concurrency", "max_tokens"]
    assert WorkloadKey.from_dict({"ignore_eos": True}) != WorkloadKey.from_dict({"ignore_eos": 1})
    with pytest.raises(ValueError, match="string, number or boolean"):
        WorkloadKey.from_dict({"prompts": ["a"]})


# ----------------------------------------------------------------------------------- atomic writes


def test_save_leaves_no_temp_files(store: BaselineStore) -> None:
    path = store.save(make(), overwrite=False)
    store.save(make(), overwrite=True)
    assert path.is_file()
    assert leftovers(store.root) == []


@pytest.mark.parametrize("failing", ["replace", "fsync", "write"])
def test_failure_mid_write_keeps_old_file(
    store: BaselineStore, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = store.save(make(), overwrite=False)
    before = path.read_bytes()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bl.os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        store.save(make(levels=[level(1, (70.0, 71.0, 72.0))]), overwrite=True)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert leftovers(store.root) == []


def test_overwrite_is_refused_without_flag(store: BaselineStore) -> None:
    path = store.save(make(), overwrite=False)
    before = path.read_bytes()
    with pytest.raises(BaselineExistsError, match="overwrite=True"):
        store.save(make(levels=[level(1, (1.0, 2.0))]), overwrite=False)
    assert path.read_bytes() == before
    assert leftovers(store.root) == []


def test_file_permissions_follow_umask(store: BaselineStore) -> None:
    path = store.save(make(), overwrite=False)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# ------------------------------------------------------------------------------------------ merge


def test_partial_update_keeps_other_levels(store: BaselineStore) -> None:
    store.save(make(), overwrite=False)
    rerun = make(
        [level(8, (1498.0, 1497.5, 1499.1))],
        session_ids=("s-2",),
        recorded_at="2026-12-01T09:00:00Z",
    )
    summary = store.update(rerun)
    stored = store.load(NODE)
    assert stored is not None
    assert [lv.workload.get("concurrency") for lv in stored.levels] == [1, 8]
    assert stored.level_for(workload(1)).trials_tok_s == (65.1, 64.9, 65.3)
    assert stored.level_for(workload(8)).tok_s == 1498.0
    assert stored.provenance.session_ids == ("s-1", "s-2")
    assert stored.provenance.recorded_at == "2026-12-01T09:00:00Z"
    assert [str(c) for c in summary.levels] == [
        "C=1 max_tokens=512: 65.1 tok/s (unchanged)",
        "C=8 max_tokens=512: 1520.3 -> 1498.0 tok/s (-1.5%)",
    ]
    assert summary.git_commands[0] == f"git diff -- {summary.path}"
    assert summary.git_commands[-1].startswith(f"git add -- {summary.path} && git commit -m ")


def test_partial_update_under_changed_setup_is_refused(store: BaselineStore) -> None:
    path = store.save(make(), overwrite=False)
    before = path.read_bytes()
    eplb = server_info(enable_eplb=True)
    with pytest.raises(ProvenanceConflict, match="enable_eplb: false -> true"):
        store.update(make([level(8, (1600.0, 1610.0))], server_info=eplb))
    assert path.read_bytes() == before
    store.update(make([level(8, (1600.0, 1610.0))], server_info=eplb), drop_stale=True)
    stored = store.load(NODE)
    assert stored is not None and stored.workloads == [WorkloadKey.from_dict(workload(8))]


def test_full_rerun_under_changed_setup_replaces_everything() -> None:
    old = make()
    new = make([level(1, (66.0,)), level(8, (1600.0,))], server_info=server_info(enable_eplb=True))
    assert merge(old, new) == new


def test_summary_for_new_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    summary = summarize_update(None, make([level(1)]), path, cwd=tmp_path)
    assert [str(c) for c in summary.levels] == ["C=1 max_tokens=512: 65.1 tok/s (new)"]
    assert summary.created
    assert summary.git_commands == (
        "git diff --no-index -- /dev/null x.yaml",
        "git add -- x.yaml && git commit -m 'kimi baseline (default): add " + NODE + "'",
    )


# --------------------------------------------------------------------------------------- lookups


def test_lookup_exact_workload(store: BaselineStore) -> None:
    store.save(make(), overwrite=False)
    found = store.lookup(NODE, workload(8))
    assert found.found and found.reason is None
    assert found.level is not None and found.level.tok_s == 1520.3


def test_lookup_other_workload_finds_nothing_and_says_why(store: BaselineStore) -> None:
    store.save(make(), overwrite=False)
    miss = store.lookup(NODE, workload(1, max_tokens=256))
    assert miss.level is None and miss.baseline is not None
    assert "baseline has concurrency 1, 8 at max_tokens 512; this run asks max_tokens 256" in str(
        miss.reason
    )


def test_lookup_new_key_is_a_miss(store: BaselineStore) -> None:
    store.save(make(), overwrite=False)
    miss = store.lookup(NODE, workload(1, rate=2.0))
    assert miss.level is None
    assert "rate unset" in str(miss.reason) and "this run asks rate 2.0" in str(miss.reason)
    # ...while an unset (None) key matches a file that never had it
    assert store.lookup(NODE, workload(1, rate=None)).found


def test_lookup_missing_combination_lists_levels() -> None:
    baseline = make([level(1, max_tokens=512), level(8, max_tokens=256)])
    reason = baseline.explain_miss(workload(1, max_tokens=256))
    assert "not in this combination" in reason
    assert "[C=1 max_tokens=512], [C=8 max_tokens=256]" in reason


def test_lookup_without_file(store: BaselineStore) -> None:
    miss = store.lookup(NODE, workload(1))
    assert miss.baseline is None and "does not exist" in str(miss.reason)
    assert store.load(NODE) is None


def test_iter_all_skips_temp_files(store: BaselineStore) -> None:
    store.save(make(), overwrite=False)
    store.save(make(test="tests/perf/test_ep8.py::TestSweep::test_peak[c8]"), overwrite=False)
    path = store.path_for(NODE)
    (path.parent / f".{path.name}.123.tmp").write_text("half a fi")
    assert sorted(b.test for b in store.iter_all()) == [
        "tests/perf/test_ep8.py::TestSweep::test_peak[c8]",
        NODE,
    ]


# ---------------------------------------------------------------------------------- corrupt files


GOOD = dumps(make())


def _corrupt(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


CORRUPT_CASES = {
    "syntax": (_corrupt("  model: kimi-k2.6", "  model: [kimi"), "YAML syntax error at line"),
    "schema": (_corrupt("schema: 1", "schema: 2"), "unsupported schema 2"),
    "no-schema": (_corrupt("schema: 1\n", ""), "missing 'schema'"),
    "trials-scalar": (
        _corrupt("trials_tok_s: [65.1, 64.9, 65.3]", "trials_tok_s: 65.1"),
        "levels[0] (workload {api: chat, concurrency: 1, ignore_eos: true, max_tokens: 512, "
        "prompts: builtin:diverse}): trials_tok_s must be a list of positive numbers",
    ),
    "trials-negative": (
        _corrupt("[65.1, 64.9, 65.3]", "[65.1, -64.9, 65.3]"),
        "item 1 is -64.9",
    ),
    "trials-bool": (_corrupt("[65.1, 64.9, 65.3]", "[65.1, true, 65.3]"), "item 1 is True"),
    "trials-empty": (_corrupt("[65.1, 64.9, 65.3]", "[]"), "non-empty list"),
    "tok_s-edited": (_corrupt("tok_s: 65.1\n", "tok_s: 70.0\n"), "tok_s 70.0 is not the median"),
    "duplicate-workload": (
        _corrupt("concurrency: 8,", "concurrency: 1,"),
        "levels[0] and levels[1] have the same workload",
    ),
    "duplicate-key": (
        _corrupt("    tok_s: 65.1\n", "    tok_s: 65.1\n    tok_s: 65.1\n"),
        "duplicate key 'tok_s'",
    ),
    "unknown-key": (
        _corrupt("    tok_s: 65.1\n", "    tok_s: 65.1\n    trails: 3\n"),
        "unknown key(s) trails",
    ),
    "missing-trials": (
        _corrupt("    trials_tok_s: [65.1, 64.9, 65.3]\n", ""),
        "has no 'trials_tok_s'",
    ),
    "ttft-negative": (
        _corrupt("ttft_s: {p50: 0.041,", "ttft_s: {p50: -0.041,"),
        "ttft_s.p50 must be a non-negative",
    ),
    "workload-list": (
        _corrupt("prompts: 'builtin:diverse'}", "prompts: [a, b]}"),
        "levels[0].workload",
    ),
    "wrong-test": (_corrupt(f"test: {NODE}", "test: tests/other.py::test_x"), "belongs at"),
    "wrong-profile": (_corrupt("profile: default", "profile: h200"), "profile is 'h200'"),
    "empty": ("", "file is empty"),
    "not-a-mapping": ("- 1\n- 2\n", "must be a mapping"),
    "session-ids": (
        _corrupt("session_ids: [s-1]", "session_ids: s-1"),
        "session_ids must be a list",
    ),
    "version-number": (_corrupt("plugin_version: 0.1.0", "plugin_version: 0.1"), "quote it"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_CASES))
def test_corrupt_file_is_reported_and_left_untouched(store: BaselineStore, case: str) -> None:
    text, expected = CORRUPT_CASES[case]
    path = store.path_for(NODE)
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    before = path.read_bytes()
    with pytest.raises(BaselineError) as info:
        store.load(NODE)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert info.value.path == path
    with pytest.raises(BaselineError):
        store.update(make())  # an update must not paper over a broken file
    with pytest.raises(BaselineError):
        list(store.iter_all())
    assert path.read_bytes() == before
    assert leftovers(store.root) == []


def test_syntax_error_names_the_line(store: BaselineStore) -> None:
    path = store.path_for(NODE)
    path.parent.mkdir(parents=True)
    path.write_text(_corrupt("  model: kimi-k2.6", "  model: [kimi"), encoding="utf-8")
    with pytest.raises(BaselineError, match=r"line 1[0-9]"):
        store.load(NODE)


def test_hand_written_unquoted_timestamp_is_accepted() -> None:
    text = _corrupt("recorded_at: '2026-11-29T08:00:00Z'", "recorded_at: 2026-11-29T08:00:00Z")
    assert loads(text).provenance.recorded_at == "2026-11-29T08:00:00Z"


# ------------------------------------------------------------------------------------- provenance


def test_provenance_diff_shows_server_arg_changes() -> None:
    old = provenance()
    new = provenance(server_info=server_info(enable_eplb=True, max_running_requests=256))
    assert [str(c) for c in provenance_diff(old, new)] == [
        "enable_eplb: false -> true",
        "max_running_requests: 64 -> 256",
    ]


def test_provenance_diff_ignores_volatile_fields() -> None:
    old = provenance()
    new = provenance(
        recorded_at="2027-01-01T00:00:00Z",
        client_host="other",
        session_ids=("s-9",),
        git_commit="fff",
        server_info=server_info(
            host="10.0.0.9",
            port=30001,
            nccl_port=4,
            random_seed=5,
            internal_states=[{"memory_usage": {"weight": 1.0}, "last_gen_throughput": 2.0}],
        ),
    )
    assert provenance_diff(old, new) == []
    assert incomparable(old, new) is None


def test_provenance_diff_flattens_nested_and_reports_absent_keys() -> None:
    old = provenance()
    info = server_info(speculative={"algorithm": "EAGLE", "num_steps": 4}, version="0.5.7")
    del info["tp_size"]
    info["dp_size"] = 2
    changes = provenance_diff(old, provenance(server_info=info, plugin_version="0.2.0"))
    assert [str(c) for c in changes] == [
        "plugin_version: 0.1.0 -> 0.2.0",
        "dp_size: (absent) -> 2",
        "speculative.num_steps: 3 -> 4",
        "tp_size: 8 -> (absent)",
        "version: 0.5.6 -> 0.5.7",
    ]
    assert changes[2] == FieldChange("speculative.num_steps", 3, 4)


def test_model_change_is_incomparable() -> None:
    old, new = provenance(), provenance(model="kimi-k2.5")
    reason = incomparable(old, new)
    assert reason is not None and "'kimi-k2.6'" in reason and "'kimi-k2.5'" in reason
    assert "model: kimi-k2.6 -> kimi-k2.5" in [str(c) for c in provenance_diff(old, new)]


# ------------------------------------------------------------------------------------------ paths


@pytest.mark.parametrize(
    ("nodeid", "expected"),
    [
        (NODE, "tests/perf/test_ep8/test_single_stream.yaml"),
        (
            "tests/perf/test_ep8.py::TestSweep::test_peak",
            "tests/perf/test_ep8/TestSweep.test_peak.yaml",
        ),
        (
            "tests/perf/test_ep8.py::TestSweep::test_peak[c8-512]",
            "tests/perf/test_ep8/TestSweep.test_peak[c8-512].yaml",
        ),
        ("tests/test_a.py::test_b[chat-True-0.5]", "tests/test_a/test_b[chat-True-0.5].yaml"),
    ],
)
def test_path_for_readable_nodeids(store: BaselineStore, nodeid: str, expected: str) -> None:
    assert store.path_for(nodeid) == store.root / "default" / expected


def test_path_sanitises_unsafe_parts_deterministically() -> None:
    weird = "tests/test_a.py::TestX::test_b[a/b c::d[e]]"
    path = baseline_relpath(weird)
    assert path == baseline_relpath(weird)
    assert path.parent == Path("tests/test_a")
    name = path.name
    assert name.startswith("TestX.test_b[a_b_c_d_e~") and name.endswith("].yaml")
    assert "/" not in name and " " not in name
    assert baseline_relpath("tests/test_a.py::test_b[a b]") != baseline_relpath(
        "tests/test_a.py::test_b[a_b]"
    )
    long_id = "x" * 300
    assert len(baseline_relpath(f"tests/test_a.py::test_b[{long_id}]").name) < 100


def test_path_cannot_escape_the_store(store: BaselineStore) -> None:
    path = store.path_for("../../etc/test_a.py::test_b")
    assert store.directory in path.parents
    assert ".." not in path.relative_to(store.directory).parts


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden"])
def test_profile_must_be_a_plain_name(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="profile"):
        BaselineStore(tmp_path, bad)


def test_not_a_test_nodeid_is_rejected() -> None:
    with pytest.raises(ValueError, match="nodeid"):
        baseline_relpath("tests/test_a.py")


def test_package_is_pytest_free() -> None:
    import ast

    for source in sorted(Path(bl.__file__).parent.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in (
                node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
            )
        }
        assert "pytest" not in imported, source.name


def test_collect_fills_what_the_plugin_can_know(tmp_path: Path) -> None:
    prov = Provenance.collect(
        model="kimi-k2.6", server_info={"tp_size": 8}, session_ids=["s-1"], suite_dir=tmp_path
    )
    assert prov.git_commit is None  # tmp_path is not a git checkout
    assert (
        prov.recorded_at is not None
        and prov.recorded_at.endswith("Z")
        and len(prov.recorded_at) == 20
    )
    assert prov.client_host and prov.session_ids == ("s-1",)
    assert Provenance.VOLATILE >= {"recorded_at", "client_host", "session_ids"}
