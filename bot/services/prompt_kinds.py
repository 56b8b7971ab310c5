"""Every prompt kind the bot posts, and what says it: one explicit table.

The tick hands :data:`KINDS` to ``prompts.deliver_pending``; a prompt whose kind is missing here
is never posted, so each module that creates prompts lists its kinds in its own ``KINDS`` table
and that table is joined here.
"""

from __future__ import annotations

from bot.services import deadlines, releases
from bot.services.lookup import KIND_HOST_KEY_CHANGED
from bot.services.prompts import PromptRenderer
from bot.services.registration import host_key_prompt

__all__ = ["KINDS", "PromptRenderer"]

#: What a prompt of each kind says (see bot.services.prompts.PromptRenderer).
KINDS: dict[str, PromptRenderer] = {
    **deadlines.KINDS,
    **releases.KINDS,
    KIND_HOST_KEY_CHANGED: host_key_prompt,
}
