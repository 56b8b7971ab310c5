"""Block Kit for the notice of :mod:`bot.services.speaking.outbox`: a message the bot could not
post, told to the ops channel. A pure function, a notice in, ``(text, blocks)`` out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.kit import Message, clip, escape, fallback, mention, when
from bot.i18n import t
from bot.notify import Notice
from bot.services.speaking.outbox import PostFailed


def post_failed(notice: PostFailed) -> Message:
    """The ops channel told of a message the bot could not post (text only: it must get
    through where blocks might not)."""
    recipient = notice.recipient
    what = mention(recipient) if recipient[:1] in "UW" else f"<#{recipient}>"
    text = t(
        ":warning: A {kind} for {recipient} could not be posted after {attempts} tries since "
        "{since}: {error}. {hint}",
        kind=notice.kind.replace("_", " "),
        recipient=what,
        attempts=notice.attempts,
        since=when(notice.since, ZoneInfo(notice.tz_name)),
        error=escape(clip(notice.error, 300)),
        hint=notice.hint or t("Check the bot token and the channel."),
    )
    return fallback(text), ()


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    PostFailed: post_failed,
}
