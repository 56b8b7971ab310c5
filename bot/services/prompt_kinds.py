"""Every prompt kind the bot posts, and what says it: one explicit table.

The tick hands :data:`PROMPT_NOTICES` to ``prompts.deliver_pending``; a prompt whose kind is
missing here is never posted, so each module that creates prompts lists its kinds in its own
``PROMPT_NOTICES`` table (kind -> its ``notice_for``) and that table is joined here. The
functions here return notices; Block Kit is rendered only by the presentation floor (bot.blocks).
"""

from __future__ import annotations

from bot.services.instances import deadlines, releases
from bot.services.instances.lookup import KIND_HOST_KEY_CHANGED
from bot.services.instances.registration import host_key_prompt
from bot.services.speaking.prompts import PromptNotice

__all__ = ["PROMPT_NOTICES", "PromptNotice"]

#: What a prompt of each kind says (see bot.services.speaking.prompts.PromptNotice).
PROMPT_NOTICES: dict[str, PromptNotice] = {
    **deadlines.PROMPT_NOTICES,
    **releases.PROMPT_NOTICES,
    KIND_HOST_KEY_CHANGED: host_key_prompt,
}
