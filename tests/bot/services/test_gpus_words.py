"""What the agent says reads in the reader's language: the shared parser's and the agent's
English refusals of ``--gpus``, and why an instance's GPUs cannot be read (with the agent's
hint for each NVML error), exactly as they are worded, are each one of the bot's translated
templates."""

from __future__ import annotations

import pytest

from agents.gpu_queue import resolve_request
from agents.nvml import HINTS
from agents.protocol import JobError, JobRequestError, NvmlError, parse_gpus
from agents.runner import nvml_failure
from bot.i18n import speaking
from bot.services.jobs import _sentence, agent_words
from tests.chinese import assert_chinese


def _parser_says(text: str) -> str:
    with pytest.raises(JobRequestError) as raised:
        parse_gpus(text)
    return str(raised.value)


def _agent_says(text: str, available: tuple[int, ...]) -> str:
    with pytest.raises((JobRequestError, JobError)) as raised:
        resolve_request(parse_gpus(text), available, "NVML failed")
    return str(raised.value)


REFUSALS = [
    _parser_says("2gpus"),
    _parser_says("-1"),
    _parser_says("0,0"),
    _parser_says("any:0"),
    _agent_says("3", (0, 1)),
    _agent_says("2,3", (0, 1)),
    _agent_says("1", (0,)),
    _agent_says("1,2", (0,)),
    _agent_says("any:3", (0, 1)),
    _agent_says("any:2", (0,)),
    _agent_says("0", ()),
    *(
        nvml_failure(NvmlError(code=code, message="NVML failed", hint=hint))
        for code, hint in HINTS.items()
    ),
]


@pytest.mark.parametrize("english", REFUSALS)
def test_every_gpus_refusal_reads_in_chinese_and_unchanged_in_english(english: str) -> None:
    # As the bot shows it: a sentence, the instance's name for "this machine".
    shown = _sentence(english).replace("This machine", "box").replace("this machine", "box")
    assert agent_words(shown) == shown
    with speaking("zh"):
        said = agent_words(shown)
    assert said != shown
    assert_chinese(said.replace("NVML failed", "NVML"))


def test_other_words_of_the_agent_are_left_as_they_are() -> None:
    with speaking("zh"):
        assert agent_words("Something else went wrong.") == "Something else went wrong."
