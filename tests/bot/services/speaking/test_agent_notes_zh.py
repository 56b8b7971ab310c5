"""Every note the agent may put on a job has its Chinese, with the same placeholders."""

from __future__ import annotations

from agents import messages
from bot.i18n import placeholders, speaking, t
from tests.chinese import assert_said_in_chinese


def test_every_job_note_is_said_in_chinese() -> None:
    with speaking("zh"):
        for template in messages.NOTE_TEMPLATES:
            said = t(template)
            assert said != template, template
            assert placeholders(said) == placeholders(template), template
            values = {name: "SIGKILL" for name in placeholders(template)}
            assert_said_in_chinese(said.format(**values))
