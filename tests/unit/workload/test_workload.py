"""Prompt sources and request bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.workload.prompts import WorkloadError, encode_bodies, resolve_prompts


def test_builtin_list_and_synthetic(tmp_path: Path) -> None:
    assert len(resolve_prompts("diverse", None, tmp_path).prompts) == 5
    assert resolve_prompts(["a", "b"], None, tmp_path).key == "list:2"
    synthetic = resolve_prompts(None, 1000, tmp_path)
    assert synthetic.key == "synthetic:1000" and len(set(synthetic.prompts)) == len(
        synthetic.prompts
    )
    assert {p.split()[1] for p in synthetic.prompts} == {
        f"{i}:" for i in range(len(synthetic.prompts))
    }


def test_jsonl_relative_to_rootdir_and_its_errors(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('"plain"\n{"prompt": "object"}\n\n{"text": "alt"}\n')
    assert resolve_prompts("p.jsonl", None, tmp_path).prompts == ("plain", "object", "alt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{broken\n')
    with pytest.raises(WorkloadError, match=r"bad.jsonl:2: not valid JSON"):
        resolve_prompts("bad.jsonl", None, tmp_path)
    (tmp_path / "num.jsonl").write_text("42\n")
    with pytest.raises(WorkloadError, match=r"num.jsonl:1: expected a string or an object"):
        resolve_prompts("num.jsonl", None, tmp_path)
    with pytest.raises(WorkloadError, match="does not exist"):
        resolve_prompts("missing.jsonl", None, tmp_path)


@pytest.mark.parametrize("api, field", [("chat", "messages"), ("completions", "prompt")])
def test_bodies_stream_with_usage_and_ignore_eos(tmp_path: Path, api: str, field: str) -> None:
    (body,) = encode_bodies(
        resolve_prompts(["hi"], None, tmp_path), model="m", api=api, max_tokens=7, ignore_eos=True
    )
    data = json.loads(body)
    assert (
        field in data
        and data["stream"] is True
        and data["stream_options"] == {"include_usage": True}
    )
    assert data["ignore_eos"] is True and data["max_tokens"] == 7 and data["temperature"] == 0


def test_requests_per_stream_sizes_each_closed_loop_level() -> None:
    from pytest_kimi.workload.markers import parse_throughput

    workload, _ = parse_throughput((), {"concurrency": [1, 8], "requests_per_stream": 4})
    assert [workload.requests_for(lv) for lv in workload.levels] == [4, 32]
    default, _ = parse_throughput((), {"concurrency": [1, 8]})
    assert [default.requests_for(lv) for lv in default.levels] == [1, 8]


# ------------------------------------------------------------------ sizing with a tokenizer


class _FakeTokenizer:
    """Counts like a BPE vocabulary would, roughly: a word ~1.7 tokens, plus the lead."""

    path = "/tokenize"
    unavailable = None

    def __init__(self) -> None:
        self.calls = 0

    def available(self) -> bool:
        return True

    def count(self, text: str) -> int:
        self.calls += 1
        words = text.split()
        return 3 + sum(1 + len(w) // 5 for w in words)


def test_fit_words_lands_on_the_asked_count_in_a_few_calls() -> None:
    from pytest_kimi.workload.prompts import fit_words

    calls = []

    def count(n: int) -> int:
        calls.append(n)
        return 12 + round(1.7 * n)

    for target in (20, 64, 500, 4000):
        calls.clear()
        n, got = fit_words(target, count, max(1, round(target / 1.3)))
        assert abs(got - target) <= 1 and got == count(n)
        assert len(calls) <= 7, calls


def test_prompt_sizer_sizes_every_variant_once_per_run() -> None:
    from pytest_kimi.workload.prompts import SIZE_TOLERANCE, SYNTHETIC_VARIANTS, PromptSizer, lead

    sizer = PromptSizer()
    fake = _FakeTokenizer()
    sizer._tokenizers[("http://s", "m", "chat")] = fake  # type: ignore[assignment]
    kwargs = dict(
        base_url="http://s", headers={}, model="m", api="chat", lead_text=lead("abcd1234")
    )
    texts, how = sizer.synthetic(300, **kwargs)
    assert len(set(texts)) == SYNTHETIC_VARIANTS
    sample = lead("abcd1234").replace("@" * 12, "9e3779b97f4b")
    assert all(abs(fake.count(sample + t) - 300) <= SIZE_TOLERANCE for t in texts)
    assert how.startswith("server tokenizer (/tokenize)")
    calls = fake.calls
    again, _ = sizer.synthetic(
        300, **{**kwargs, "lead_text": lead("ffff0000")}
    )  # another test, same run
    assert fake.calls == calls and again == texts


def test_no_tokenizer_means_an_estimate_that_says_so(tmp_path: Path) -> None:
    from pytest_kimi.workload.prompts import PromptSizer

    sizer = PromptSizer()
    texts, how = sizer.synthetic(
        64, base_url="http://127.0.0.1:9", headers={}, model="m", api="chat", lead_text=""
    )
    assert how.startswith(
        "estimate at 1.3 tokens per word: the server has no usable tokenizer endpoint"
    )
    assert texts == resolve_prompts(None, 64, tmp_path).prompts
