"""GPU requests as ``--gpus`` gives them: parsing, rejecting and writing them back."""

from __future__ import annotations

import pytest

from agents import protocol
from agents.protocol import GpuRequest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, GpuRequest()),
        ("0", GpuRequest()),
        ("2", GpuRequest(count=2)),
        ("all", GpuRequest(count=-1)),
        ("0,1", GpuRequest(count=2, indices=(0, 1))),
        ("3,1", GpuRequest(count=2, indices=(1, 3))),
        ("3,", GpuRequest(count=1, indices=(3,))),
        (" 0, 2 ", GpuRequest(count=2, indices=(0, 2))),
    ],
)
def test_parse_gpus(text, expected):
    assert protocol.parse_gpus(text) == expected


@pytest.mark.parametrize("text", ["", ",", "a", "1,,2", "-1", "1.5", "0,0", "gpu0"])
def test_parse_gpus_rejects(text):
    with pytest.raises(protocol.JobRequestError):
        protocol.parse_gpus(text)


def test_gpu_request_text_round_trips():
    for text in ("2", "0,1", "3,"):
        assert protocol.parse_gpus(protocol.parse_gpus(text).text) == protocol.parse_gpus(text)
    assert GpuRequest().text is None
