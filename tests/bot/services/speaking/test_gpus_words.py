"""What the agent says reads in the reader's language: the shared parser's and the agent's
refusals of ``--gpus``, and why an instance's GPUs cannot be read (with the agent's hint for
each NVML error), each a template of agents.messages with its parameters, shown through the
catalogue with the instance's name for the machine."""

from __future__ import annotations

import pytest

from agents.gpu_queue import resolve_request
from agents.nvml import _RESET_HINT, HINTS
from agents.protocol import NVML_ERROR_CODES, JobError, JobRequestError, NvmlError, parse_gpus
from agents.runner import nvml_failure
from bot.i18n import speaking
from bot.services.speaking import agent_text, nvml_words
from tests.chinese import assert_chinese


def _parser_says(text: str) -> JobError:
    with pytest.raises(JobRequestError) as raised:
        parse_gpus(text)
    return raised.value


def _agent_says(text: str, available: tuple[int, ...], why: str = "NVML failed") -> JobError:
    with pytest.raises((JobRequestError, JobError)) as raised:
        resolve_request(parse_gpus(text), available, why)
    return raised.value


def _shown(error: JobError) -> str:
    return agent_text.said(error.template, error.params, str(error), name="box")


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


@pytest.mark.parametrize("error", REFUSALS, ids=lambda e: e.code)
def test_every_gpus_refusal_reads_in_chinese_and_as_the_agent_says_it_in_english(
    error: JobError,
) -> None:
    english = _shown(error)
    # English: the agent's own sentence, the instance's name for "this machine".
    said = str(error).replace("this machine", "box")
    assert english.rstrip(".").lower() == said.rstrip(".").lower()
    with speaking("zh"):
        chinese = _shown(error)
    assert chinese != english
    assert_chinese(chinese)


def test_a_gpus_refusal_names_the_instance_in_chinese() -> None:
    with speaking("zh"):
        chinese = _shown(_agent_says("3", (0, 1)))
    assert chinese.startswith("box ")
    assert "3" in chinese


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
    failure = nvml_failure(error)
    with speaking("zh"):
        said = _shown(failure)
    assert_chinese(said)
    assert LOADER_SAYS in said or code == "library_not_found"  # that one says no detail
    if LOADER_SAYS in said:
        assert f"`{LOADER_SAYS}`" in said
    assert _shown(failure) == str(failure).replace("this machine", "box")


def test_no_gpu_for_the_job_keeps_the_drivers_words_as_code_in_chinese() -> None:
    with speaking("zh"):
        said = _shown(_agent_says("0", (), why=LOADER_SAYS))
    assert_chinese(said)
    assert f"`{LOADER_SAYS}`" in said


def test_the_bot_knows_the_agents_nvml_hints_word_for_word() -> None:
    assert nvml_words.HINTS == HINTS
    assert nvml_words.RESET_HINT == _RESET_HINT
    assert set(nvml_words.HINTS) == set(NVML_ERROR_CODES)


def test_text_without_a_template_is_shown_as_the_agent_wrote_it() -> None:
    with speaking("zh"):
        assert agent_text.said(None, {}, "Something else went wrong.") == (
            "Something else went wrong."
        )


def test_parameters_that_do_not_fit_the_template_leave_the_english() -> None:
    error = _agent_says("3", (0, 1))
    with speaking("zh"):
        said = agent_text.said(error.template, {"text": "3"}, "as sent", name="box")
    assert said == "as sent"
