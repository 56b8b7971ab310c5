"""Pieces the notice modules share (:mod:`bot.blocks.deadlines`, :mod:`bot.blocks.releases`,
:mod:`bot.blocks.reconcile`, :mod:`bot.blocks.rent`, :mod:`bot.blocks.answers`,
:mod:`bot.blocks.trust`): sentences in a row, a plain or buttoned message, and what an instance
costs by the hour. Money arrives in micro-units.
"""

from __future__ import annotations

from bot.blocks.kit import Block, Message, actions, fallback, section
from bot.i18n import t
from bot.services.instances.views import STORAGE_HINT, InstanceBrief
from bot.values import format_money, format_rate


def per_hour(inst: InstanceBrief) -> str:
    """What the instance costs per hour, like ``$2.10/h``; says so when no price is recorded."""
    if inst.price_micros_per_hour <= 0:
        return t("money (no price recorded)")
    return format_rate(inst.price_micros_per_hour, inst.currency)


def sentences(*parts: str) -> str:
    """Sentences in a row, the empty ones left out: after a space, or straight after a
    full-width stop (Chinese)."""
    text = ""
    for sentence in parts:
        if not sentence:
            continue
        if text and not text.endswith(_FULL_WIDTH_STOPS):
            text += " "
        text += sentence
    return text


def plain(text: str) -> Message:
    return fallback(text), (section(text),)


def with_buttons(text: str, buttons: list[Block], block_id: str) -> Message:
    return fallback(text), (section(text), actions(buttons, block_id=block_id))


def storage_note(inst: InstanceBrief) -> str:
    """What a stopped instance still costs, and how to stop that."""
    if inst.storage_micros_per_hour <= 0:
        return sentences(
            t(
                "Its disk may still bill on the platform while it is stopped; "
                "`/gpu release {name}` terminates it, disk and all.",
                name=inst.name,
            ),
            t(STORAGE_HINT, name=inst.name),
        )
    return t(
        "Its disk keeps billing ({cost}/h) while it is stopped; `/gpu release {name}` "
        "terminates it, disk and all.",
        cost=format_money(inst.storage_micros_per_hour, inst.currency),
        name=inst.name,
    )


#: The full stop, exclamation and question marks a Chinese sentence ends with: the next one
#: follows without a space.
_FULL_WIDTH_STOPS = ("\u3002", "\uff01", "\uff1f")
