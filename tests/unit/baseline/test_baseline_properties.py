"""Property tests for the baseline file format: whatever a baseline holds, its file reads back.

The example tests in ``test_baseline.py`` pin the exact text; these check the promise behind
it for baselines nobody thought of: arbitrary workloads, trial lists, unicode node ids and
nested provenance.  Example counts stay modest so the suite stays fast.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kimi import yamlstrict
from pytest_kimi.baseline import (
    LevelBaseline,
    Provenance,
    TestBaseline,
    baseline_relpath,
    dumps,
    loads,
)

SETTINGS = settings(max_examples=100, deadline=None)

# Any unicode but lone surrogates (not writable as UTF-8), with the characters and strings
# YAML treats specially drawn often, since uniform draws from all of unicode rarely hit them:
# C0 controls, tab, the line breaks YAML knows (LF, CR, NEL U+0085, LS U+2028, PS U+2029),
# DEL and the C1 range, NBSP, BOM, the BMP non-characters; and whole strings a YAML reader
# would take for something else (numbers, bools, null, dates, comments, indicators) unless
# the writer quotes them.
SPECIAL_CHARS = (
    "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x1f\x7f\x80\x85\x9f\xa0\u2028\u2029\ufeff\ufffe\uffff"
)
LOOK_ALIKES = (
    *(" ", "  ", "\t", "~", "null", "Null", "NULL", "true", "True", "FALSE", "yes", "No", "on"),
    *("OFF", "y", "n", "0", "-1", "+1", "007", "0o17", "0x1F", "0b101", "1e3", "1_000", "1:20"),
    *(".5", "-.5", "1.", ".inf", "-.Inf", ".NaN", "2024-01-01", "2024-01-01T08:00:00Z", "#"),
    *("# note", "a #b", "a# b", "a: b", ": ", "a:", "- x", "-", "--", "---", "...", "?", "? x"),
    *("[", "]", "{a: b}", ",", "&a", "*a", "!tag", "!!str", "|", ">", "'", '"', "''", "%YAML"),
    *("@", "`", "<<", "="),
)


def strings(min_size: int = 0, forbid: str = "") -> st.SearchStrategy[str]:
    """Unicode strings as above, none holding a character of ``forbid`` (no filters: a
    filtered draw retries, and retries made this file several times slower)."""
    chars = st.characters(blacklist_categories=("Cs",), blacklist_characters=forbid)
    special = st.sampled_from([c for c in SPECIAL_CHARS if c not in forbid])
    look_alikes = st.sampled_from([w for w in LOOK_ALIKES if not set(w) & set(forbid)])
    return st.one_of(
        look_alikes if min_size <= 1 else st.nothing(),
        st.text(chars, min_size=min_size, max_size=20),
        # mixed: leading/trailing blanks, breaks between words, '#' after text...
        st.lists(st.one_of(chars, special, look_alikes), min_size=min_size, max_size=8).map(
            "".join
        ),
    )


text = strings()
names = strings(min_size=1)
# a class or function name in a nodeid holds no '[' (it opens the parameter id) and no '::'
test_names = strings(min_size=1, forbid="[:")
finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), finite, text)

workloads = st.dictionaries(names, scalars, max_size=6).filter(
    lambda w: any(v is not None for v in w.values())  # an all-unset workload is refused on read
)
summaries = st.dictionaries(
    st.one_of(st.sampled_from(["p50", "p95", "p99", "p99.9", "mean"]), names),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    max_size=4,
)
levels = st.builds(
    LevelBaseline,
    workload=workloads,
    trials_tok_s=st.lists(st.floats(min_value=0.1, max_value=1e7), min_size=1, max_size=8).map(
        tuple
    ),
    request_tok_s=summaries,
    ttft_s=summaries,
)
json_like = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=12,
)
provenances = st.builds(
    Provenance,
    model=st.none() | text,
    server_info=st.dictionaries(names, json_like, max_size=6),
    plugin_version=st.none() | text,
    git_commit=st.none() | text,
    recorded_at=st.none() | text,
    client_host=st.none() | text,
    session_ids=st.lists(text, max_size=3).map(tuple),
)
nodeids = st.builds(
    lambda module, names_, param: (
        f"{module}.py::{'::'.join(names_)}" + (f"[{param}]" if param is not None else "")
    ),
    text.map(lambda module: module.replace("::", ":_")),  # '::' would end the module path
    st.lists(test_names, min_size=1, max_size=3),
    st.none() | text,
)


@st.composite
def baselines(draw: st.DrawFn) -> TestBaseline:
    drawn = draw(st.lists(levels, min_size=1, max_size=5, unique_by=lambda level: level.workload))
    return TestBaseline(
        test=draw(nodeids),
        profile=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True)),
        provenance=draw(provenances),
        levels=tuple(drawn),
    )


@SETTINGS
@given(baselines())
def test_file_text_reads_back_as_the_same_baseline(baseline: TestBaseline) -> None:
    text_ = dumps(baseline)
    assert loads(text_) == baseline
    # ``==`` lets 1 == 1.0 == True pass in server_info: the text must be stable too
    assert dumps(loads(text_)) == text_
    # the strict loader reads what the writer wrote exactly as PyYAML's safe_load does
    assert yamlstrict.load(text_) == yaml.safe_load(text_)
    assert text_.startswith("# pytest-kimi throughput baseline") and text_.endswith("\n")
    text_.encode("utf-8")  # what the store writes


@pytest.mark.parametrize("nel", ["\x85", "a\x85b", " \x85 ", "\x85\n\u2028"])
def test_a_string_with_nel_reads_back(nel: str) -> None:
    """PyYAML writes NEL (U+0085) raw unless told to double-quote, and reads a raw NEL as a
    line break folded into a space: every place a string can sit in the file must keep it."""
    baseline = TestBaseline(
        test=f"t{nel}.py::test[{nel}]",
        profile="p",
        provenance=Provenance(
            model=nel,
            server_info={nel: nel, "args": [nel, 1], "nested": {"k": nel}},
            session_ids=(nel,),
        ),
        levels=(LevelBaseline(workload={nel: nel, "c": 1}, trials_tok_s=(1.0,)),),
    )
    text_ = dumps(baseline)
    assert loads(text_) == baseline
    assert dumps(loads(text_)) == text_


@SETTINGS
@given(nodeids)
def test_relpath_stays_under_the_profile_directory(nodeid: str) -> None:
    rel = PurePosixPath(*baseline_relpath(nodeid).parts)
    assert not rel.is_absolute()
    assert all(part not in ("", ".", "..") for part in rel.parts)
    assert rel.suffix == ".yaml"


@SETTINGS
@given(
    st.lists(
        st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True), min_size=1, max_size=6, unique=True
    ),
    st.data(),
)
def test_a_repeated_key_is_named_with_both_lines(keys: list[str], data: st.DataObject) -> None:
    first = data.draw(st.integers(0, len(keys) - 1))
    lines = [f"{k}: {i}" for i, k in enumerate(keys)]
    at = data.draw(st.integers(first + 1, len(lines)))
    lines.insert(at, f"{keys[first]}: again")
    try:
        yamlstrict.load("\n".join(lines) + "\n")
    except yamlstrict.DuplicateKeyError as exc:
        assert (exc.key, exc.first_line, exc.line) == (keys[first], first + 1, at + 1)
        assert f"duplicate key {keys[first]!r} (first given on line {first + 1})" in str(exc)
    else:
        raise AssertionError("duplicate key accepted")
