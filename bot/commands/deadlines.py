"""The buttons of deadline warnings, idle prompts and release-when-done prompts.

A button's value is its prompt's id; bot.services.instances.answers decides what the click does and
this module shows what it answered.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from bot.blocks import deadlines as blocks
from bot.blocks import render
from bot.commands.registry import ActionSpec, Registry, Reply, button_number
from bot.notify import Notice
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import answers

#: An answer to a prompt's button, given the prompt id.
Answer = Callable[[Runtime, Caller, int], Notice]


def _extend_1h(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    return answers.extend(rt, caller, prompt_id, timedelta(hours=1))


def _extend_4h(rt: Runtime, caller: Caller, prompt_id: int) -> Notice:
    return answers.extend(rt, caller, prompt_id, timedelta(hours=4))


def _action(answer: Answer) -> Callable[[Runtime, Caller, str], Reply]:
    """A button handler: the prompt id from the value, the answer, rendered."""

    def handle(rt: Runtime, caller: Caller, value: str) -> Reply:
        text, body = render(answer(rt, caller, button_number(value)))
        return Reply(text=text, blocks=body)

    return handle


def register(registry: Registry) -> None:
    """Add this module's commands and buttons to ``registry``."""
    for action in (
        ActionSpec(blocks.EXTEND_1H, _action(_extend_1h)),
        ActionSpec(blocks.EXTEND_4H, _action(_extend_4h)),
        ActionSpec(blocks.EXTEND_PAID_HOUR, _action(answers.extend_to_paid_hour)),
        ActionSpec(blocks.RELEASE_NOW, _action(answers.ask_release)),
        ActionSpec(blocks.RELEASE_CONFIRM, _action(answers.confirm_release)),
        ActionSpec(blocks.IDLE_KEEP, _action(answers.keep)),
        ActionSpec(blocks.IDLE_RELEASE, _action(answers.release)),
    ):
        registry.action(action)
