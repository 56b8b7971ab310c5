"""Block Kit for the notices of :mod:`bot.services.instances.releases`: a prompt someone
answered, asking a manual instance's owner to release (or stop) it and reminding them, the
escalation when a release keeps failing, and the release itself. Pure functions, a notice in,
``(text, blocks)`` out.

Times arrive as naive UTC and are shown in the notice's time zone; money arrives in
micro-units. A button that records an instance released or stopped asks first in a confirm
dialog that says what a wrong press costs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.instances import RELEASE_DONE, STOP_DONE
from bot.blocks.kit import (
    Block,
    Message,
    button,
    confirm_dialog,
    escape,
    mention,
    when,
)
from bot.blocks.money import final_cost_sentence
from bot.blocks.parts import per_hour, plain, sentences, storage_note, with_buttons
from bot.i18n import N_, t
from bot.notify import Notice
from bot.providers.names import platform_name
from bot.services.instances.releases import (
    CONFIRMED_RELEASED,
    CONFIRMED_STOPPED,
    EXTENDED,
    KEPT,
    RELEASE_CANCELLED,
    RELEASE_REQUESTED,
    Decided,
    ManualReleaseReminder,
    ManualReleaseRequest,
    ReleasedNotice,
    ReleaseEscalation,
)
from bot.services.instances.views import InstanceBrief
from bot.values import format_duration


def reason_text(
    reason: str, by: str | None = None, owner_id: str | None = None, mode: str = "terminate"
) -> str:
    """A release reason in words (one it does not know, escaped as it is). A release someone
    other than the owner ``owner_id`` asked for (``by``: only an admin can) names them."""
    if reason == "user" and by and owner_id and by != owner_id:
        if mode == "stop":
            return t("stopped by {admin} (an admin)", admin=mention(by))
        return t("released by {admin} (an admin)", admin=mention(by))
    known = _REASONS.get(reason)
    return t(known) if known else escape(reason)


def decided(notice: Decided) -> Message:
    """A prompt after someone answered it: what was decided, by whom (an admin said so), when."""
    name = notice.instance.name
    decision = _decision_text(notice)
    at = when(notice.at, ZoneInfo(notice.tz_name))
    if not notice.by:
        return plain(t("*{name}*: {decision} at {at}.", name=name, decision=decision, at=at))
    by = mention(notice.by)
    if notice.by != notice.instance.owner_id:
        return plain(
            t(
                "*{name}*: {decision} by {user} (an admin) at {at}.",
                name=name,
                decision=decision,
                user=by,
                at=at,
            )
        )
    return plain(
        t("*{name}*: {decision} by {user} at {at}.", name=name, decision=decision, user=by, at=at)
    )


def manual_release_request(notice: ManualReleaseRequest) -> Message:
    """Ask the owner to release (or stop) a manual instance on its platform and say which
    they did: released (the meter stops, disk and all) or only stopped (its disk keeps
    billing)."""
    inst = notice.instance
    values = {
        "name": inst.name,
        "reason": reason_text(notice.reason, notice.requested_by, inst.owner_id, notice.mode),
        "cost": per_hour(inst),
    }
    if notice.mode == "stop":
        ask = t(
            ":warning: Please stop *{name}* on its platform now ({reason}); it costs {cost} "
            "until you do.",
            **values,
        )
    else:
        ask = t(
            ":warning: Please release *{name}* on its platform now ({reason}); it costs {cost} "
            "until you do.",
            **values,
        )
    text = sentences(
        ask,
        t(
            "Press the button for what you did: *Released* stops the meter, *Stopped* stops it "
            "for compute while its disk bills on."
        ),
    )
    buttons = _done_buttons(notice.instance_id, inst)
    return with_buttons(text, buttons, f"release-done-{notice.instance_id}")


def manual_release_reminder(notice: ManualReleaseReminder) -> Message:
    """A reminder that a manual instance still waits to be released (or stopped)."""
    inst = notice.instance
    values = {
        "name": inst.name,
        "waited": format_duration(notice.now - notice.asked_at),
        "cost": per_hour(inst),
    }
    if notice.mode == "stop":
        due = t(
            ":warning: Reminder: *{name}* was due to be stopped {waited} ago and still costs "
            "{cost}.",
            **values,
        )
    else:
        due = t(
            ":warning: Reminder: *{name}* was due to be released {waited} ago and still costs "
            "{cost}.",
            **values,
        )
    text = sentences(
        due,
        t(
            "Do it on its platform, then press the button for what you did, or keep it with "
            "`/gpu extend {name} 2h`.",
            name=inst.name,
        ),
    )
    if notice.last:
        text = sentences(
            text,
            t(
                "This is the last reminder: the bot stops reminding you and tells the ops "
                "channel. Until you do it, the platform may go on billing."
            ),
        )
    buttons = _done_buttons(notice.instance_id, inst)
    return with_buttons(text, buttons, f"release-remind-{notice.instance_id}")


def release_escalation(notice: ReleaseEscalation) -> Message:
    """To the owner and the channel: a release keeps failing or nobody confirmed it."""
    inst = notice.instance
    cost = per_hour(inst)
    owner = mention(inst.owner_id)
    if notice.manual and notice.reminders > 0:
        return plain(
            t(
                ":rotating_light: The bot stopped reminding {owner} to release *{name}*: "
                "{reminders} reminders in {waited}, none confirmed. It may still cost {cost} on "
                "its platform. Please release it there and press the button in the owner's "
                "message; the bot says nothing more about it.",
                name=inst.name,
                owner=owner,
                reminders=notice.reminders,
                waited=format_duration(timedelta(seconds=notice.reminded_for_s)),
                cost=cost,
            )
        )
    if notice.manual:
        return plain(
            t(
                ":rotating_light: *{name}* ({owner}) should have been released but nobody "
                "confirmed it; it may still cost {cost}. Please release it on its platform and "
                "press the button in the owner's message.",
                name=inst.name,
                owner=owner,
                cost=cost,
            )
        )
    text = t(
        ":rotating_light: Releasing *{name}* ({owner}) on {provider} failed {attempts} times; it "
        "may still cost {cost}. The bot keeps trying; release it on the platform if you can.",
        name=inst.name,
        owner=owner,
        provider=platform_name(inst.provider),
        attempts=notice.attempts,
        cost=cost,
    )
    if notice.last_error:
        text = sentences(text, t("Last error: {error}", error=escape(notice.last_error)))
    return plain(text)


def released_notice(notice: ReleasedNotice) -> Message:
    """Released (or stopped), confirmed by the platform or the owner."""
    inst = notice.instance
    stop = notice.mode == "stop"
    text = _released_head(
        notice, reason_text(notice.reason, notice.requested_by, inst.owner_id, notice.mode)
    )
    text = sentences(
        text,
        t("Its compute meter stopped.") if stop else t("The meter stopped."),
        final_cost_sentence(notice.final_cost, stopped=stop).lstrip(),
    )
    if stop and notice.storage_bills:
        text = sentences(text, storage_note(inst))
    if notice.release_at is not None:
        text = sentences(
            text,
            t(
                "It is released at {at} unless someone starts it again; `/gpu extend {name} 1d` "
                "moves that.",
                at=when(notice.release_at, ZoneInfo(notice.tz_name)),
                name=inst.name,
            ),
        )
    return plain(text)


#: Release reasons in words, by the reason the store records.
_REASONS = {
    "user": N_("requested by its owner"),
    "deadline": N_("its deadline passed"),
    "cap": N_("its maximum lifetime is reached"),
    "idle": N_("it was idle"),
    "jobs_done": N_("its jobs are done"),
    "reconcile": N_("found released on the platform"),
}


def _released_head(notice: ReleasedNotice, reason: str) -> str:
    """``*box* is released by <@U> (why).``: the first sentence of a release notice."""
    name = notice.instance.name
    if notice.by:
        by = mention(notice.by)
        if notice.mode == "stop":
            return t(
                ":white_check_mark: *{name}* is stopped by {user} ({reason}).",
                name=name,
                user=by,
                reason=reason,
            )
        return t(
            ":white_check_mark: *{name}* is released by {user} ({reason}).",
            name=name,
            user=by,
            reason=reason,
        )
    if notice.mode == "stop":
        return t(":white_check_mark: *{name}* is stopped ({reason}).", name=name, reason=reason)
    return t(":white_check_mark: *{name}* is released ({reason}).", name=name, reason=reason)


def _done_buttons(instance_id: int, inst: InstanceBrief) -> list[Block]:
    value = str(instance_id)
    return [
        button(
            t("Released on the platform"),
            RELEASE_DONE,
            value,
            style="primary",
            confirm=_done_confirm(inst, stopped=False),
        ),
        button(
            t("Stopped on the platform (disk kept)"),
            STOP_DONE,
            value,
            confirm=_done_confirm(inst, stopped=True),
        ),
    ]


def _done_confirm(inst: InstanceBrief, *, stopped: bool) -> Block:
    """What a Released/Stopped on the platform button records, and what a wrong press costs."""
    name = escape(inst.name)
    if stopped:
        return confirm_dialog(
            t("Is {name} stopped?", name=inst.name),
            t(
                "Confirm that *{name}* is stopped on its platform, its disk kept. From now on "
                "the bot counts only its disk; if it still runs there, it bills unseen.",
                name=name,
            ),
            confirm=t("Yes, it is stopped"),
        )
    return confirm_dialog(
        t("Is {name} released?", name=inst.name),
        t(
            "Confirm that *{name}* is released on its platform. The bot stops counting its cost "
            "and closes it; if it still runs there, it bills unseen.",
            name=name,
        ),
        confirm=t("Yes, it is released"),
    )


#: What a prompt's answer is called, by the decision bot.services.instances.releases records.
_DECISIONS = {
    KEPT: N_("Kept"),
    CONFIRMED_RELEASED: N_("Confirmed released on the platform"),
    CONFIRMED_STOPPED: N_("Confirmed stopped on the platform"),
}


def _decision_text(notice: Decided) -> str:
    if notice.decision == EXTENDED:
        added = format_duration(timedelta(seconds=notice.extended_s))
        return t("Extended {duration}", duration=added)
    if notice.decision == RELEASE_CANCELLED:
        added = format_duration(timedelta(seconds=notice.extended_s))
        return t("Release request withdrawn: extended {duration}", duration=added)
    stop = notice.mode == "stop"
    if notice.decision == RELEASE_REQUESTED:
        if notice.reason and notice.reason != "user":
            reason = reason_text(notice.reason)
            if stop:
                return t("Stop requested ({reason})", reason=reason)
            return t("Release requested ({reason})", reason=reason)
        return t("Stop requested") if stop else t("Release requested")
    known = _DECISIONS.get(notice.decision)
    return t(known) if known else notice.decision


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    Decided: decided,
    ManualReleaseRequest: manual_release_request,
    ManualReleaseReminder: manual_release_reminder,
    ReleaseEscalation: release_escalation,
    ReleasedNotice: released_notice,
}
