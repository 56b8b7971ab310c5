"""Block Kit for what the ops channel hears about trust in the platforms' word: an instance an
admin adopted, and a platform reconcile cannot list (and lists again). Pure functions, a notice
in, ``(text, blocks)`` out; everything a platform or a person wrote is escaped and clipped.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.kit import Message, clip, escape, mention, when
from bot.blocks.parts import plain
from bot.i18n import t
from bot.notify import Notice
from bot.providers.names import platform_name
from bot.services.instances.instance_trust import Adopted, PlatformListedAgain, PlatformUnlisted
from bot.values import format_duration

#: The most characters of a platform's answer shown.
ANSWER_MAX = 300
#: The most tags shown, and characters of each key and value.
TAGS_MAX = 10


def adopted(notice: Adopted) -> Message:
    """Who took over which platform instance, under what name, and what the platform calls
    it."""
    what = f"`{escape(clip(notice.provider_id, 100))}`"
    if notice.platform_name:
        what += f" ({escape(clip(notice.platform_name, 80))})"
    lines = [
        t(
            ":information_source: {user} adopted *{provider}* instance {what} as *{name}*; "
            "its owner is now {user}, and its deadline and reminders apply.",
            user=mention(notice.by),
            provider=escape(platform_name(notice.provider)),
            what=what,
            name=escape(notice.name),
        )
    ]
    if notice.tags:
        shown = ", ".join(
            f"{escape(clip(key, 40))}={escape(clip(value, 80))}"
            for key, value in notice.tags[:TAGS_MAX]
        )
        lines.append(t("Tags: {tags}", tags=shown))
    return plain("\n".join(lines))


def platform_unlisted(notice: PlatformUnlisted) -> Message:
    """Reconcile cannot list a platform: what it answered, and what that means."""
    tz = ZoneInfo(notice.timezone)
    return plain(
        t(
            ":warning: The bot cannot list the instances of *{provider}* (since {since}): "
            "{answer}\nUntil it can, instances stopped, started or terminated there outside "
            "the bot, and instances nobody registered, go unnoticed. This is said once; the "
            "bot says so again when it can list them.",
            provider=escape(platform_name(notice.provider)),
            since=when(notice.since, tz),
            answer=f"`{escape(clip(notice.answer, ANSWER_MAX)).replace('`', chr(39))}`",
        )
    )


def platform_listed_again(notice: PlatformListedAgain) -> Message:
    """A platform reconcile could not list lists again."""
    lasted = format_duration(max(notice.now - notice.since, timedelta(0)))
    return plain(
        t(
            ":white_check_mark: The bot can list the instances of *{provider}* again (it could "
            "not for {lasted}).",
            provider=escape(platform_name(notice.provider)),
            lasted=lasted,
        )
    )


#: Every notice this module renders.
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    Adopted: adopted,
    PlatformUnlisted: platform_unlisted,
    PlatformListedAgain: platform_listed_again,
}
