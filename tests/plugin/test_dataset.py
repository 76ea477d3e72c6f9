"""Datasets (``dataset=``, ``num_prompts=``): parsing, sampling, lengths in tokens, keys, replay.

Parsing and sampling are checked on small files written here; output lengths against the
simulator, whose tokenizer is known exactly (4 UTF-8 bytes a token, as ``/tokenize`` and
``usage`` count); the replay in real pytest sessions against it, where every request must
return exactly its own output length (``ignore_eos``) and an edited file must find no baseline.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from pytest_kimi.load.records import RequestRecord
from pytest_kimi.measure.one_trial import check_own_lengths
from pytest_kimi.sim.process import SimProcess
from pytest_kimi.sim.config import SimConfig
from pytest_kimi.workload.dataset import (
    CHARS_PER_TOKEN,
    DATA_DIR,
    DEFAULT_NUM_PROMPTS,
    DatasetError,
    TextTokenizer,
    load_dataset,
    prepare_dataset,
    resolve_path,
    sample_entries,
)
from pytest_kimi.workload.markers import parse_throughput
from pytest_kimi.workload.workload_spec import WHOLE_REQUESTS, MarkerError
from support.paths import REPO

pytest_plugins = ["pytester"]

ROOT = REPO
BUILTIN = "builtin:sharegpt-small"


def sim_tokens(text: str) -> int:
    """The simulator's count: one token per 4 UTF-8 bytes, rounded up."""
    return max(1, math.ceil(len(text.encode()) / 4))


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def conv(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"conversations": [{"from": who, "value": text} for who, text in turns]}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(SimConfig(speed=20), log_dir=tmp_path_factory.mktemp("simlogs")) as proc:
        yield proc


# ---------------------------------------------------------------------- the shipped dataset


def test_the_shipped_dataset_is_its_generators_output() -> None:
    """Synthetic and reproducible: the generator writes the same bytes every time."""
    script = ROOT / "tests" / "data" / "make_sharegpt_small.py"
    spec = importlib.util.spec_from_file_location("make_sharegpt_small", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = resolve_path(BUILTIN, Path("/nowhere"))
    assert path == DATA_DIR / "sharegpt_small.json"
    assert path.read_bytes() == module.make()
    dataset = load_dataset(BUILTIN, Path("/nowhere"))
    assert dataset.format == "sharegpt" and len(dataset.entries) == 128 and dataset.skipped == 0
    lengths = [sim_tokens(e.output_text or "") for e in dataset.entries]
    assert min(lengths) < 16 and max(lengths) > 512  # short answers and a long tail


# ---------------------------------------------------------------------- parsing


def test_sharegpt_first_human_turn_and_first_gpt_turn(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "sg.json",
        [
            conv(("human", "Q1"), ("gpt", "A1"), ("human", "Q1b"), ("gpt", "A1b")),
            conv(("system", "be brief"), ("human", "Q2"), ("gpt", "A2")),
            {
                "conversations": [
                    {"role": "user", "content": "Q3"},
                    {"role": "assistant", "content": "A3"},
                ]
            },
            conv(("human", "only a question")),
            conv(("gpt", "an answer first"), ("human", "Q5")),
            conv(("human", "Q6"), ("gpt", "   ")),
            {"id": "x", "conversations": []},
        ],
    )
    dataset = load_dataset(str(path), tmp_path)
    got = [(e.prompt, e.output_text, e.where) for e in dataset.entries]
    assert got == [
        ("Q1", "A1", "sg.json[0]"),
        ("Q2", "A2", "sg.json[1]"),
        ("Q3", "A3", "sg.json[2]"),
    ]
    assert dataset.skipped == 4
    assert dataset.skip_example == "sg.json[3]: no gpt turn after the first human turn"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"conversations": []}', r"sg.json: expected a JSON array of ShareGPT conversations"),
        ('[{"conversations": []}, 7]', r"sg.json\[1\]: expected an object with 'conversations'"),
        ('[{"turns": []}]', r"sg.json\[0\]: expected 'conversations', a list of turns"),
        (
            '[{"conversations": [{"from": "human"}]}]',
            r"sg.json\[0\].conversations\[0\]: expected an object with string 'from' and 'value'",
        ),
        ('{"prompt": "a"}\n{"prompt": "b"}\n', r"not valid JSON .*must be named \*.jsonl"),
        ("[]", r"sg.json: no usable entries"),
        (
            '[{"conversations": [{"from": "human", "value": "q"}]}]',
            r"no usable entries \(1 skipped",
        ),
    ],
)
def test_sharegpt_errors_name_the_file_the_entry_and_the_fix(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "sg.json").write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_dataset("sg.json", tmp_path)


def test_jsonl_prompts_with_output_and_input_tokens(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(
        '{"prompt": "a", "output_tokens": 12, "input_tokens": 3}\n'
        "\n"
        '{"prompt": "b"}\n' + json.dumps(conv(("human", "c"), ("gpt", "answer c"))) + "\n"
    )
    dataset = load_dataset("d.jsonl", tmp_path)
    assert dataset.format == "jsonl"
    a, b, c = dataset.entries
    assert (a.prompt, a.output_tokens, a.input_tokens, a.where) == ("a", 12, 3, "d.jsonl:1")
    assert (b.output_tokens, b.where) == (None, "d.jsonl:3")
    assert (c.prompt, c.output_text) == ("c", "answer c")
    for bad, message in (
        ("[1, 2]\n", r"d2.jsonl:1: expected an object like"),
        ('{"prompt": ""}\n', r"d2.jsonl:1: expected a non-empty string 'prompt'"),
        (
            '{"prompt": "x", "output_tokens": 0}\n',
            r"d2.jsonl:1: 'output_tokens' must be an integer >= 1",
        ),
        ('{"prompt": "x"}\n{oops\n', r"d2.jsonl:2: not valid JSON"),
    ):
        (tmp_path / "d2.jsonl").write_text(bad)
        with pytest.raises(DatasetError, match=message):
            load_dataset("d2.jsonl", tmp_path)


def test_paths_resolve_against_the_rootdir_and_builtins_are_named(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write_json(tmp_path / "sub" / "d.json", [conv(("human", "q"), ("gpt", "a"))])
    assert load_dataset("sub/d.json", tmp_path).path == tmp_path / "sub" / "d.json"
    with pytest.raises(
        DatasetError, match=r"does not exist \(dataset='nope.json', from the rootdir\)"
    ):
        load_dataset("nope.json", tmp_path)
    with pytest.raises(
        DatasetError, match=r"no such built-in dataset; built-in: builtin:sharegpt-small"
    ):
        load_dataset("builtin:sharegpt-large", tmp_path)


# ---------------------------------------------------------------------- sampling and keys


def test_seeded_sampling_and_the_content_hash_in_the_key(tmp_path: Path) -> None:
    data = [conv(("human", f"question {i}"), ("gpt", "x" * (4 * i + 4))) for i in range(40)]
    write_json(tmp_path / "d.json", data)
    dataset = load_dataset("d.json", tmp_path)
    first = sample_entries(dataset, 10, seed=0)
    assert first == sample_entries(dataset, 10, seed=0)  # the same requests, in the same order
    assert first != sample_entries(dataset, 10, seed=1)
    assert len({e.index for e in first}) == 10
    assert len(sample_entries(dataset, None, seed=0)) == min(40, DEFAULT_NUM_PROMPTS)
    with pytest.raises(DatasetError, match=r"num_prompts=41, but d.json has 40 usable entries"):
        sample_entries(dataset, 41, seed=0)
    sample = prepare_dataset("d.json", rootdir=tmp_path, num_prompts=10, seed=3, tokenizer=None)
    assert sample.key == f"dataset:{dataset.sha256[:12]}:n=10:seed=3:est"
    assert sample.estimated and any("estimate at 4 characters per token" in n for n in sample.notes)
    assert sample.output_tokens == tuple(
        round(len(e.output_text or "") / CHARS_PER_TOKEN) for e in sample.entries
    )
    data[5]["conversations"][0]["value"] += "!"  # an edited dataset is a new workload
    write_json(tmp_path / "d.json", data)
    edited = prepare_dataset("d.json", rootdir=tmp_path, num_prompts=10, seed=3, tokenizer=None)
    assert edited.key != sample.key and edited.key.endswith(":n=10:seed=3:est")


def test_marker_arguments() -> None:
    workload, _ = parse_throughput((), {"dataset": BUILTIN, "concurrency": [1, 4]})
    assert workload.dataset == BUILTIN and workload.protocol == WHOLE_REQUESTS
    sized = parse_throughput((), {"dataset": BUILTIN, "num_prompts": 20, "concurrency": 4})[0]
    (level,) = sized.levels
    assert sized.requests_for(level) == 20  # a trial replays the sample once
    per_stream = parse_throughput(
        (), {"dataset": BUILTIN, "num_prompts": 20, "concurrency": 4, "requests_per_stream": 2}
    )[0]
    assert per_stream.requests_for(per_stream.levels[0]) == 8
    for kwargs, message in (
        ({"dataset": BUILTIN, "prompts": "short"}, "dataset and prompts are exclusive"),
        ({"dataset": BUILTIN, "input_tokens": 64}, "dataset and input_tokens are exclusive"),
        ({"dataset": BUILTIN, "protocol": "stationary"}, "drop protocol='stationary'"),
        ({"num_prompts": 8}, "num_prompts= samples a dataset: give dataset= too"),
        (
            {"dataset": BUILTIN, "num_prompts": 4, "concurrency": 8},
            "num_prompts=4 is below concurrency 8",
        ),
        ({"dataset": ""}, "dataset='': expected a path to a ShareGPT JSON or JSONL file"),
        ({"datset": BUILTIN}, r"datset \(did you mean dataset\?\)"),
    ):
        with pytest.raises(MarkerError, match=message):
            parse_throughput((), kwargs)


def test_each_request_must_return_its_own_length() -> None:
    def rec(index: int, tokens: int) -> RequestRecord:
        return RequestRecord(
            index=index, worker=0, scheduled=0.0, status=200, completion_tokens=tokens
        )

    trial = SimpleNamespace(records=[rec(0, 5), rec(1, 7), rec(5, 7)], invalid=[])
    check_own_lengths(trial, [5, 7, 9])  # type: ignore[arg-type]
    assert trial.invalid and "first: 7 for max_tokens=9" in trial.invalid[0]
    fine = SimpleNamespace(records=[rec(0, 5), rec(4, 7)], invalid=[])
    check_own_lengths(fine, [5, 7, 9])  # type: ignore[arg-type]
    assert fine.invalid == []


# ---------------------------------------------------------------------- lengths in tokens


def test_answers_are_counted_by_the_servers_tokenizer_once(sim: SimProcess, tmp_path: Path) -> None:
    tok = TextTokenizer(sim.url, {}, "kimi-k2.6-sim")
    memo: dict[tuple[Any, ...], Any] = {}
    sample = prepare_dataset(
        BUILTIN,
        rootdir=tmp_path,
        num_prompts=40,
        seed=0,
        tokenizer=tok,
        memo=memo,
        endpoint_key=(sim.url, "m"),
    )
    assert not sample.estimated and not sample.notes and tok.batch is True
    assert sample.lengths == "answers counted by the server's tokenizer (/tokenize)"
    assert sample.output_tokens == tuple(sim_tokens(e.output_text or "") for e in sample.entries)
    assert not sample.key.endswith(":est")
    calls = tok.calls
    more = prepare_dataset(
        BUILTIN,
        rootdir=tmp_path,
        num_prompts=60,
        seed=0,
        tokenizer=tok,
        memo=memo,
        endpoint_key=(sim.url, "m"),
    )
    # a bigger sample with the same seed starts with the smaller one, and only its 20 new
    # answers are counted: one call, no answer counted twice
    assert more.entries[:40] == sample.entries and tok.calls - calls == 1
    assert more.output_tokens == tuple(sim_tokens(e.output_text or "") for e in more.entries)
    summary = sample.summary(max_tokens=64)
    assert summary["sampled"] == 40 and summary["output_tokens_max"] <= 64
    assert summary["capped"] == sum(1 for n in sample.output_tokens if n > 64)
    assert summary["output_tokens_mean"] == pytest.approx(
        sum(min(n, 64) for n in sample.output_tokens) / 40, abs=0.05
    )


def test_without_a_tokenizer_lengths_are_an_estimate_and_say_so(tmp_path: Path) -> None:
    with SimProcess(SimConfig(speed=20, no_tokenize=True), log_dir=tmp_path) as blind:
        tok = TextTokenizer(blind.url, {}, "kimi-k2.6-sim")
        sample = prepare_dataset(BUILTIN, rootdir=tmp_path, num_prompts=8, seed=0, tokenizer=tok)
    assert sample.estimated and sample.key.endswith(":est")
    assert sample.lengths.startswith("estimate at 4 characters per token: the server has no")
    assert sample.notes == (f"dataset output lengths are an {sample.lengths}",)


def test_the_files_input_tokens_are_checked(sim: SimProcess, tmp_path: Path) -> None:
    prompts = [f"prompt number {i} " * (i + 1) for i in range(6)]
    right = [{"prompt": p, "output_tokens": 4, "input_tokens": sim_tokens(p)} for p in prompts]
    wrong = [{**e, "input_tokens": 2 * e["input_tokens"]} for e in right]
    tok = TextTokenizer(sim.url, {}, "kimi-k2.6-sim")
    for name, rows in (("right.jsonl", right), ("wrong.jsonl", wrong)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok = prepare_dataset("right.jsonl", rootdir=tmp_path, num_prompts=None, seed=0, tokenizer=tok)
    assert ok.input_check is not None and ok.input_check.startswith("input_tokens agree")
    assert ok.lengths == "from the file (output_tokens)" and set(ok.output_tokens) == {4}
    bad = prepare_dataset("wrong.jsonl", rootdir=tmp_path, num_prompts=None, seed=0, tokenizer=tok)
    assert bad.input_check is not None and "tokenized for another model" in bad.input_check
    assert bad.input_check in bad.notes


# ---------------------------------------------------------------------- replayed in pytest


PERF_TEST = """
from pytest_kimi import throughput

@throughput(concurrency=[1, 4], dataset="builtin:sharegpt-small", num_prompts=12,
            max_tokens=48, trials=2)
def test_replay(throughput_result):
    for level in throughput_result.levels:
        for trial in level.trials:
            assert sorted(r.index for r in trial.records) == list(range(12))
            assert all(r.ok and r.completion_tokens <= 48 for r in trial.records)
"""


def test_a_dataset_replay_reports_its_sample_and_lengths(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_perf=PERF_TEST)
    monkeypatch.setenv("COLUMNS", "250")  # content, not layout: the dataset's note on one line
    run = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--endpoint=sim:speed=10,stream_interval=8",
        "--perf-json=r.json",
        "--perf-markdown=r.md",
    )
    run.assert_outcomes(passed=1)
    run.stdout.fnmatch_lines(
        [
            "*prompts=dataset:* api=chat",
            "*dataset builtin:sharegpt-small (sha256 *, 12 of 128 entries, seed 0): output *"
            "tokens, mean * at max_tokens=48; lengths: answers counted by the server's tokenizer*",
        ]
    )
    (test,) = json.loads(Path("r.json").read_text())["tests"]
    sha = load_dataset(BUILTIN, Path(".")).sha256
    for level in test["levels"]:
        assert level["prompts"] == f"dataset:{sha[:12]}:n=12:seed=0"
        assert level["protocol"] is None  # whole requests, keyed as such
        assert level["verdict"] not in ("invalid", "error"), level["reasons"]
        assert level["requests_ok"] == 24 and level["requests_failed"] == 0
        ds = level["dataset"]
        assert ds["sha256"] == sha and ds["sampled"] == 12 and not ds["estimated"]
        assert level["output_tokens_mean"] == ds["output_tokens_mean"] <= 48
        assert level["prefix_cache_hit_rate"] == 0.0  # unique leads: nothing shared
    assert "dataset builtin:sharegpt-small" in Path("r.md").read_text()


KEYED_TEST = """
from pytest_kimi import throughput

@throughput(concurrency=4, dataset="data/a.json", num_prompts=8, max_tokens=32, trials=2)
def test_same():
    pass

@throughput(concurrency=4, dataset="data/b.jsonl", num_prompts=8, max_tokens=32, trials=2,
            api="completions")
def test_edited():
    pass
"""


def test_an_edited_dataset_finds_no_baseline(pytester: pytest.Pytester) -> None:
    entries = json.loads(resolve_path(BUILTIN, Path(".")).read_text())[:20]
    data = pytester.mkdir("data")
    write_json(data / "a.json", entries)
    rows = [
        {"prompt": e["conversations"][0]["value"], "output_tokens": 5 + i}
        for i, e in enumerate(entries)
    ]
    (data / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pytester.makepyfile(test_perf=KEYED_TEST)
    # baselines of the marker's 2 trials a level (--perf-max-trials): found all the same,
    # quick to record
    args = ["-p", "no:cacheprovider", "--endpoint=sim:speed=10,stream_interval=8"]
    args.append("--perf-max-trials=2")
    pytester.runpytest(*args, "--update-baselines").assert_outcomes(passed=2)
    rows[3]["prompt"] += " (edited)"
    (data / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = pytester.runpytest(*args, "--perf-json=r.json")
    again.assert_outcomes(passed=2)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(Path("r.json").read_text())["tests"]}
    assert [lv["verdict"] for lv in tests["test_edited"]["levels"]] == ["no-baseline"]
    assert tests["test_same"]["levels"][0]["verdict"] != "no-baseline"
    (edited,) = tests["test_edited"]["levels"]
    assert edited["dataset"]["output_tokens"] == "from the file (output_tokens)"
    assert edited["verdict"] not in ("invalid", "error")


def test_a_corrupt_dataset_fails_the_test_naming_the_argument_and_the_file(
    pytester: pytest.Pytester,
) -> None:
    data = pytester.mkdir("data")
    (data / "a.json").write_text('[{"conversations": [{"from": "human", "value": "hi"}]')
    pytester.makepyfile(test_perf=KEYED_TEST.split('@throughput(concurrency=4, dataset="data/b')[0])
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--endpoint=sim:speed=10,stream_interval=8"
    )
    result.assert_outcomes(errors=1)  # at setup: no trial was run on a workload it cannot build
    result.stdout.fnmatch_lines(["*@throughput dataset: a.json: not valid JSON (line 1*"])
