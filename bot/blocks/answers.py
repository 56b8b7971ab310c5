"""Block Kit for the notices of :mod:`bot.services.instances.answers`: what a click on a
prompt's button gets back (extended, kept, released, asked to confirm, already answered,
refused). Pure functions, a notice in, ``(text, blocks)`` out.

Times arrive as naive UTC and are shown in the notice's time zone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.deadlines import RELEASE_CONFIRM
from bot.blocks.kit import (
    Message,
    button,
    escape,
    mention,
    when,
)
from bot.blocks.parts import plain, with_buttons
from bot.i18n import N_, t
from bot.notify import Notice
from bot.services.instances.answers import (
    AnsweredBefore,
    BeingReleased,
    Extended,
    Kept,
    ReleaseAnswered,
    ReleaseConfirmAsk,
    ReleasePending,
    ReleaseRefused,
)
from bot.values import format_duration, spoken_duration


def answered_before(notice: AnsweredBefore) -> Message:
    """A click on a prompt someone already answered."""
    decision = escape(_resolution_text(notice.resolution))
    if notice.by:
        return plain(
            t(
                "This was already answered by {user}: {decision}.",
                user=mention(notice.by),
                decision=decision,
            )
        )
    return plain(t("This was already answered: {decision}.", decision=decision))


def release_pending(notice: ReleasePending) -> Message:
    """A click on a prompt of a manual instance whose release waits for its owner."""
    inst = notice.instance
    if notice.by_owner:
        return plain(
            t(
                "*{name}*: release requested; waiting for you to confirm it is released on the "
                "platform (the buttons in my message). To keep it instead: "
                "`/gpu extend {name} 2h`.",
                name=inst.name,
            )
        )
    return plain(
        t(
            "*{name}*: release requested; waiting for {owner} to confirm it is released on the "
            "platform (the buttons in my message). To keep it instead: `/gpu extend {name} 2h`.",
            name=inst.name,
            owner=mention(inst.owner_id),
        )
    )


def being_released(notice: BeingReleased) -> Message:
    """A click on a prompt whose instance is already being released."""
    return plain(
        t(
            "*{name}* is already being released ({state}).",
            name=notice.name,
            state=_state_text(notice.state),
        )
    )


def extend_answered(notice: Extended) -> Message:
    """After Extend 1h / 4h."""
    added = format_duration(timedelta(seconds=notice.extended_s))
    name = notice.instance.name
    if notice.deadline_at is None:
        return plain(t("Extended {duration}: *{name}*.", duration=added, name=name))
    return plain(
        t(
            "Extended {duration}: *{name}*; the deadline is now {at}.",
            duration=added,
            name=name,
            at=when(notice.deadline_at, ZoneInfo(notice.tz_name)),
        )
    )


def release_confirm(notice: ReleaseConfirmAsk) -> Message:
    """Asked after Release now: the button that releases (the question is the confirmation)."""
    text = t(
        "Release *{name}* now? Anything not saved off the instance is lost.",
        name=notice.instance.name,
    )
    confirm = button(t("Yes, release it"), RELEASE_CONFIRM, str(notice.prompt_id), style="danger")
    return with_buttons(text, [confirm], f"release-confirm-{notice.prompt_id}")


def kept(notice: Kept) -> Message:
    """After Keep it."""
    return plain(t("Kept *{name}*; it will not be released for this.", name=notice.instance.name))


def release_answered(notice: ReleaseAnswered) -> Message:
    """After a release from a prompt: released, waiting for the owner, or under way."""
    name = notice.instance.name
    if notice.state == "confirmed":
        return plain(t("*{name}* is released.", name=name))
    if notice.state in ("awaiting_owner", "awaiting_owner_quiet"):
        return plain(
            t("Release *{name}* on its platform, then press the button I sent.", name=name)
        )
    return plain(
        t(
            "Releasing *{name}* ({state}); I will say when the platform confirms.",
            name=name,
            state=_state_text(notice.state),
        )
    )


def release_refused(notice: ReleaseRefused) -> Message:
    """A release from a prompt that could not be opened, and why."""
    return plain(notice.reason)


#: How a prompt was answered, by the resolution bot.services.speaking.prompts records (the English
#: is the resolution with spaces for underscores).
_RESOLUTIONS = {
    "kept": N_("kept"),
    "released": N_("released"),
    "superseded": N_("superseded"),
    "active": N_("active"),
    "cancelled": N_("cancelled"),
    "skipped": N_("skipped"),
    "re_registered": N_("re registered"),
}
_EXTENDED_PREFIX = "extended_"


def _resolution_text(resolution: str | None) -> str:
    """A prompt's resolution in words (one it does not know, with spaces for underscores)."""
    if resolution is None:
        return t("answered")
    if resolution.startswith(_EXTENDED_PREFIX):
        added = spoken_duration(resolution.removeprefix(_EXTENDED_PREFIX).replace("_", " "))
        return t("extended {duration}", duration=added)
    known = _RESOLUTIONS.get(resolution)
    return t(known) if known else resolution.replace("_", " ")


#: Instance and release states in words (the English is the state as the store records it).
_STATES = {
    "registering": N_("registering"),
    "active": N_("active"),
    "releasing": N_("releasing"),
    "awaiting_confirmation": N_("awaiting_confirmation"),
    "released": N_("released"),
    "stopped": N_("stopped"),
    "pending": N_("pending"),
    "in_progress": N_("in_progress"),
    "escalated": N_("escalated"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
}


def _state_text(state: str) -> str:
    """An instance's or a release's state in words (one it does not know, as it is)."""
    known = _STATES.get(state)
    return t(known) if known else state


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    AnsweredBefore: answered_before,
    BeingReleased: being_released,
    ReleasePending: release_pending,
    Extended: extend_answered,
    ReleaseConfirmAsk: release_confirm,
    Kept: kept,
    ReleaseAnswered: release_answered,
    ReleaseRefused: release_refused,
}
