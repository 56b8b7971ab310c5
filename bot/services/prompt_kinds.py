"""Every prompt kind the bot posts, and what says it: one explicit table.

The tick hands :data:`PROMPT_NOTICES` to ``prompts.deliver_pending``; a prompt whose kind is
missing here is never posted, so each module that creates prompts lists its kinds in its own
``PROMPT_NOTICES`` table (kind -> its ``notice_for``) and that table is joined here. The
functions here return notices; Block Kit is rendered only by the presentation floor (bot.blocks).
"""

from __future__ import annotations

from bot.services import deadlines, releases
from bot.services.lookup import KIND_HOST_KEY_CHANGED
from bot.services.prompts import PromptNotice
from bot.services.registration import host_key_prompt

__all__ = ["PROMPT_NOTICES", "PromptNotice"]

#: What a prompt of each kind says (see bot.services.prompts.PromptNotice).
PROMPT_NOTICES: dict[str, PromptNotice] = {
    **deadlines.PROMPT_NOTICES,
    **releases.PROMPT_NOTICES,
    KIND_HOST_KEY_CHANGED: host_key_prompt,
}
