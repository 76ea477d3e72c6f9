"""The strict loader reads a mapping key as the name the file wrote: YAML 1.1 reads a plain
``on:``/``off:``/``yes:``/``no:`` as a boolean, and a duplicate ``on:`` was reported as ``True``."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kimi import yamlstrict

# every spelling PyYAML's YAML 1.1 resolver reads as a boolean
BOOL_WORDS = [
    word
    for stem in ("yes", "no", "true", "false", "on", "off")
    for word in (stem, stem.capitalize(), stem.upper())
]
SETTINGS = settings(max_examples=60, deadline=None)


def test_every_bool_word_is_a_bool_to_plain_yaml() -> None:
    # the premise: without the strict loader each of these keys would be True or False
    for word in BOOL_WORDS:
        assert yaml.safe_load(f"{word}: 1\n") == {bool(yaml.safe_load(word)): 1}


@SETTINGS
@given(
    st.lists(
        st.one_of(st.sampled_from(BOOL_WORDS), st.from_regex(r"[a-z][a-z_-]{0,8}", fullmatch=True)),
        min_size=1,
        max_size=6,
        unique=True,
    ),
    st.data(),
)
def test_a_repeated_key_is_named_as_written(keys: list[str], data: st.DataObject) -> None:
    lines = [f"{k}: {i}" for i, k in enumerate(keys)]
    assert yamlstrict.load("\n".join(lines) + "\n") == {k: i for i, k in enumerate(keys)}
    first = data.draw(st.integers(0, len(keys) - 1))
    at = data.draw(st.integers(first + 1, len(lines)))
    lines.insert(at, f"{keys[first]}: again")
    with pytest.raises(yamlstrict.DuplicateKeyError) as caught:
        yamlstrict.load("\n".join(lines) + "\n")
    exc = caught.value
    assert (exc.key, exc.written, exc.first_line, exc.line) == (
        keys[first],
        keys[first],
        first + 1,
        at + 1,
    )
    assert f"found duplicate key {keys[first]!r} (first given on line {first + 1})" in str(exc)


def test_on_and_On_are_two_keys_not_one_boolean() -> None:
    assert yamlstrict.load("on: 1\nOn: 2\nnested:\n  off: [x]\n") == {
        "on": 1,
        "On": 2,
        "nested": {"off": ["x"]},
    }


def test_values_and_tagged_keys_keep_yaml_s_reading() -> None:
    # a value ``true`` is a bare flag in a profile's args; only keys are names
    assert yamlstrict.load("enable-x: on\nl: [yes, no]\n") == {
        "enable-x": True,
        "l": [True, False],
    }
    assert yamlstrict.load("!!bool yes : 1\n'on': 2\n") == {True: 1, "on": 2}
    with pytest.raises(yamlstrict.DuplicateKeyError, match="duplicate key 'on'"):
        yamlstrict.load("on: 1\n'on': 2\n")


def test_a_repeated_non_string_key_is_shown_as_written() -> None:
    with pytest.raises(yamlstrict.DuplicateKeyError) as caught:
        yamlstrict.load("1: a\n1.0: b\n")
    assert caught.value.written == "1.0"
    assert "found duplicate key 1.0 (first given on line 1)" in str(caught.value)
