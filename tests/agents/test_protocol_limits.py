"""agents.protocol.loads refuses hostile documents (too deep, too long) before parsing them."""

from __future__ import annotations

import json
import sys

import pytest

from agents.protocol import (
    MAX_DEPTH,
    MAX_DOCUMENT_CHARS,
    JobList,
    ProtocolError,
    StatusSnapshot,
    dumps,
    loads,
    nesting_depth,
)
from tests.agents.factories import make_process, make_status


def test_a_normal_document_parses() -> None:
    snapshot = make_status(n=2, processes=[make_process(0), make_process(1, pid=7)])

    assert loads(StatusSnapshot, dumps(snapshot)) == snapshot


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, '{"a":' * 100_000, "[" * 100_000 + "]" * 100_000, '{"jobs": ' + "[" * 10**6],
)
def test_deep_nesting_is_refused_without_recursion(text: str) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # the check itself must not recurse
    try:
        with pytest.raises(ProtocolError, match=f"at most {MAX_DEPTH}"):
            loads(JobList, text)
    finally:
        sys.setrecursionlimit(limit)


def test_nesting_up_to_the_limit_reaches_the_parser() -> None:
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    over = "[" + at_limit + "]"

    with pytest.raises(ProtocolError, match="expected an object"):
        loads(StatusSnapshot, at_limit)  # parsed; only its shape is wrong
    with pytest.raises(ProtocolError, match=f"nests {MAX_DEPTH + 1} deep"):
        loads(StatusSnapshot, over)


def test_brackets_inside_strings_do_not_count() -> None:
    command = '[{"' * 500 + '\\"' + "]" * 3
    snapshot = make_status(processes=[make_process(command=command)])
    text = dumps(snapshot)

    assert nesting_depth(text) == nesting_depth(json.dumps(json.loads(text)))
    assert nesting_depth(text) < 5
    assert loads(StatusSnapshot, text) == snapshot


@pytest.mark.parametrize(
    ("text", "depth"),
    [("", 0), ("1", 0), ('"[["', 0), ("{}", 1), ('[[], {"a": [1]}]', 3), ('["\\\\", [[]]]', 3)],
)
def test_nesting_depth(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth


def test_an_oversized_document_is_refused_before_parsing() -> None:
    text = '{"schema": 1, "pad": "' + "x" * MAX_DOCUMENT_CHARS + '"}'

    with pytest.raises(ProtocolError, match="characters long"):
        loads(StatusSnapshot, text)


def test_bad_json_is_still_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        loads(StatusSnapshot, '{"schema": 1,')
