"""agents.wire: the agent's JSON writer is byte for byte ``json.dumps`` with sorted keys."""

from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import wire

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(), inner, max_size=5)
    ),
    max_leaves=40,
)


def reference(doc: object) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(documents)
def test_dumps_matches_json(doc):
    assert wire.dumps(doc) == reference(doc)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_the_pure_python_quote_matches_the_c_one(text):
    assert wire.quote_python(text) == json.encoder.py_encode_basestring_ascii(text)
    assert wire.quote_python(text) == wire.quote(text)


@pytest.mark.parametrize(
    "text", ["", 'say "hi"\\', "tab\tnew\nline\r\b\f", "\x00\x1f\x7f", "é✓", "🎉 GPU", "\ud800"]
)
def test_quote_escapes_like_json(text):
    assert wire.quote_python(text) == json.dumps(text)
    assert wire.dumps(text) == json.dumps(text)


class Level(enum.IntEnum):
    HIGH = 2


class Money(float):
    pass


def test_subclasses_and_special_floats_are_written_as_json_writes_them():
    doc = {"level": Level.HIGH, "cost": Money(1.5), "x": [math.nan, math.inf, -math.inf, -0.0]}
    assert wire.dumps(doc) == reference(doc)
    assert wire.dumps(True) == "true"
    assert wire.dumps({"b": 1, "a": {"d": None, "c": (1, 2)}}) == '{"a":{"c":[1,2],"d":null},"b":1}'


@pytest.mark.parametrize("bad", [{1: "int key"}, {"set": {1, 2}}, [b"bytes"], object()])
def test_anything_but_json_data_with_str_keys_is_a_type_error(bad):
    with pytest.raises(TypeError):
        wire.dumps(bad)
