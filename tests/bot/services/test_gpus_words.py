"""What the agent says reads in the reader's language: the shared parser's and the agent's
English refusals of ``--gpus``, and why an instance's GPUs cannot be read (with the agent's
hint for each NVML error), exactly as they are worded, are each one of the bot's translated
templates."""

from __future__ import annotations

import pytest

from agents.gpu_queue import resolve_request
from agents.nvml import _RESET_HINT, HINTS
from agents.protocol import NVML_ERROR_CODES, JobError, JobRequestError, NvmlError, parse_gpus
from agents.runner import nvml_failure
from bot.i18n import speaking
from bot.services import nvml_words
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


#: What the loader says when the driver's library is missing (agents/nvml.py passes it on).
LOADER_SAYS = (
    "the NVIDIA driver's NVML library does not load: libnvidia-ml.so.1: cannot open shared "
    "object file: No such file or directory"
)


@pytest.mark.parametrize("code", [*HINTS, "reset_required", "a_newer_kind"])
def test_a_chinese_run_reply_says_the_kind_and_keeps_the_drivers_words_as_code(
    code: str,
) -> None:
    hint = HINTS.get(code, _RESET_HINT)
    error = NvmlError(code=code, message=LOADER_SAYS, hint=hint)
    if code == "reset_required":
        error = NvmlError(code="unknown", message=LOADER_SAYS, hint=_RESET_HINT)
    shown = _sentence(nvml_failure(error)).replace("this machine", "box")
    with speaking("zh"):
        said = agent_words(shown)
    assert_chinese(said)
    assert LOADER_SAYS in said or code == "library_not_found"  # that one says no detail
    if LOADER_SAYS in said:
        assert f"`{LOADER_SAYS}`" in said
    assert agent_words(shown) == shown  # English: the agent's own words


def test_no_gpu_for_the_job_keeps_the_drivers_words_as_code_in_chinese() -> None:
    english = _sentence(_agent_says("0", ())).replace("NVML failed", LOADER_SAYS)
    shown = english.replace("this machine", "box")
    with speaking("zh"):
        said = agent_words(shown)
    assert_chinese(said)
    assert f"`{LOADER_SAYS}`" in said


def test_the_bot_knows_the_agents_nvml_hints_word_for_word() -> None:
    assert nvml_words.HINTS == HINTS
    assert nvml_words.RESET_HINT == _RESET_HINT
    assert set(nvml_words.HINTS) == set(NVML_ERROR_CODES)


def test_a_long_text_that_repeats_the_agents_words_is_left_as_it_is_unmatched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Text past AGENT_WORDS_MAX is never matched against the patterns (their lazy groups
    backtrack as the fourth power of a text that repeats their words: 3,000 characters took
    seconds), and comes back as it is."""
    from bot.services import jobs

    text = "box has 2 GPUs (0, 1); --gpus " * 100
    assert len(text) > jobs.AGENT_WORDS_MAX

    def no_matching(*_: object, **__: object) -> None:
        raise AssertionError("a long text was matched")

    monkeypatch.setattr(jobs, "_template_pattern", no_matching)
    assert jobs.agent_words(text) == text
