"""The buttons of the Home tab that no command message has: Extend 1h on one of the person's
instances (its value is the instance's id). Release on the Home is the release button of
`/gpu release` (bot.commands.instances); Register opens a form (bot.listeners)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.blocks import home as blocks
from bot.blocks import instances as instance_blocks
from bot.commands.registry import ActionSpec, Registry, Reply, button_number
from bot.errors import Conflict
from bot.i18n import t
from bot.services.access import Caller
from bot.services.instances import lifecycle, lookup

if TYPE_CHECKING:
    from bot.runtime import Runtime


def _extend_button(rt: Runtime, caller: Caller, value: str) -> Reply:
    inst = lookup.instance_by_id(rt, button_number(value))
    if inst.state == "released":  # a Home shown before: its name may be another's by now
        raise Conflict(t("{name} is already released.", name=inst.name))
    view = lifecycle.extend(rt, caller, inst.name, blocks.HOME_EXTEND_BY)
    text, body = instance_blocks.extended(view, now=rt.now(), timezone=rt.settings.timezone)
    return Reply(text=text, blocks=body)


def register(registry: Registry) -> None:
    """Add the Home's buttons to ``registry`` (those it does not have yet)."""
    for action in (ActionSpec(blocks.HOME_EXTEND, _extend_button),):
        if action.action_id not in registry.actions:
            registry.action(action)
