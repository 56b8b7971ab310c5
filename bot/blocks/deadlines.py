"""Block Kit for deadlines, idle prompts, releases, reconciling and renting: pure functions, a
notice or view in, ``(text, blocks)`` out, every block from :mod:`bot.blocks.kit`.

Times arrive as naive UTC and are shown, with their date, in the notice's time zone; money
arrives in micro-units. Every message carries a ``text`` fallback, which Slack reads as mrkdwn
like the section it repeats: errors and anything else from people or platforms go into it
escaped. A button that releases an instance, records it released or stopped, or keeps it running
(and billing) asks first in a confirm dialog that names the instance and what follows.
"""

from __future__ import annotations

from collections.abc import Callable as _Callable
from datetime import UTC, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.instances import RELEASE_DONE, STOP_DONE, stopped_buttons, unregistered_notice
from bot.blocks.kit import (
    Block,
    Message,
    actions,
    button,
    confirm_dialog,
    escape,
    fallback,
    mention,
    section,
    when,
)
from bot.blocks.money import final_cost_sentence
from bot.i18n import N_, t
from bot.notify import Notice
from bot.providers.names import platform_name
from bot.services.answers import (
    AnsweredBefore,
    BeingReleased,
    Extended,
    Kept,
    ReleaseAnswered,
    ReleaseConfirmAsk,
    ReleasePending,
    ReleaseRefused,
)
from bot.services.deadlines import (
    BusyAgain,
    DeadlineWarning,
    IdlePrompt,
    JobsDonePrompt,
    NewJobs,
    PolicyView,
    ReleasedUnwarned,
    StoppedReminder,
    Superseded,
)
from bot.services.reconcile import ReleasedOutside, UnregisteredFound
from bot.services.releases import (
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
from bot.services.rent import (
    RentFailed,
    RentFinished,
    RentGivenBackFailed,
    RentLaunchChecked,
    RentRecovered,
    RentRecoverFailed,
    RentStarted,
)
from bot.services.views import STORAGE_HINT, InstanceBrief
from bot.values import format_duration, format_money, format_rate, spoken_duration

#: Button action ids (the handlers live in bot.commands.deadlines; RELEASE_DONE and STOP_DONE
#: in bot.commands.instances).
EXTEND_1H = "deadline_extend_1h"
EXTEND_4H = "deadline_extend_4h"
#: Keep the instance to the last minute of the hour already billed (value: the prompt id).
EXTEND_PAID_HOUR = "deadline_extend_paid_hour"
RELEASE_NOW = "deadline_release_now"
RELEASE_CONFIRM = "deadline_release_confirm"
IDLE_KEEP = "idle_keep"
IDLE_RELEASE = "idle_release"


def per_hour(inst: InstanceBrief) -> str:
    """What the instance costs per hour, like ``$2.10/h``; says so when no price is recorded."""
    if inst.price_micros_per_hour <= 0:
        return t("money (no price recorded)")
    return format_rate(inst.price_micros_per_hour, inst.currency)


#: Release reasons in words, by the reason the store records.
_REASONS = {
    "user": N_("requested by its owner"),
    "deadline": N_("its deadline passed"),
    "cap": N_("its maximum lifetime is reached"),
    "idle": N_("it was idle"),
    "jobs_done": N_("its jobs are done"),
    "reconcile": N_("found released on the platform"),
}


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


# --- prompts ----------------------------------------------------------------------------------


def deadline_warning(notice: DeadlineWarning) -> Message:
    """The warning before a deadline, with Extend 1h / Extend 4h (those the recipient may use)
    and Release now buttons, each asking to confirm what it does."""
    tz = ZoneInfo(notice.tz_name)
    left = format_duration(max(notice.release_at - notice.now, timedelta(0)))
    lines = [_warning_head(notice, left, when(notice.release_at, tz))]
    late = notice.release_at != notice.deadline_at
    if late and notice.deadline_at <= notice.now:
        lines.append(
            t("Its deadline passed while the bot could not warn you, so you get this grace.")
        )
    elif late:
        lines.append(
            t(
                "Its deadline ({at}) left too little notice, so the release waits until then.",
                at=when(notice.deadline_at, tz),
            )
        )
    if notice.cap_at is not None and len(notice.extend_s) < len(_EXTEND_BUTTONS):
        cap_at = when(notice.cap_at, tz)
        if notice.extend_s:
            lines.append(
                t(
                    "The lifetime cap set by an admin ends it at {at}; it can be extended only up "
                    "to then.",
                    at=cap_at,
                )
            )
        else:
            lines.append(
                t(
                    "The lifetime cap set by an admin ends it at {at}; only an admin can extend "
                    "it past that.",
                    at=cap_at,
                )
            )
    if notice.paid_until is not None:
        lines.append(
            t(
                "It is billed by the whole hour: keeping it until {at} costs nothing more.",
                at=when(notice.paid_until, tz),
            )
        )
    value = str(notice.prompt_id)
    extends = [s for s in notice.extend_s if s in _EXTEND_BUTTONS]
    buttons = [
        button(
            t(_EXTEND_BUTTONS[s][0]),
            _EXTEND_BUTTONS[s][1],
            value,
            style="primary" if i == 0 else None,
            confirm=_extend_confirm(notice, s),
        )
        for i, s in enumerate(extends)
    ]
    if notice.paid_until is not None:
        buttons.insert(0, _paid_hour_button(notice, tz))
    buttons.append(
        button(
            t("Release now"),
            RELEASE_NOW,
            value,
            style="danger",
            confirm=_release_confirm(notice.instance),
        )
    )
    return _with_buttons(_sentences(*lines), buttons, f"deadline-{notice.prompt_id}")


def _paid_hour_button(notice: DeadlineWarning, tz: ZoneInfo) -> Block:
    """Keep it to the last minute of the hour already paid for, asking first."""
    assert notice.paid_until is not None
    at = when(notice.paid_until, tz)
    return button(
        t(
            "Keep to {time} (paid)",
            time=notice.paid_until.replace(tzinfo=UTC).astimezone(tz).strftime("%H:%M"),
        ),
        EXTEND_PAID_HOUR,
        str(notice.prompt_id),
        confirm=confirm_dialog(
            t("Keep {name} to the end of the paid hour?", name=notice.instance.name),
            t(
                "*{name}* keeps running until {at}: the hour it is billed for anyway.",
                name=escape(notice.instance.name),
                at=at,
            ),
            confirm=t("Yes, keep it"),
        ),
    )


#: The Extend buttons by what they add, in seconds: label and action id.
_EXTEND_BUTTONS = {3600: (N_("Extend 1h"), EXTEND_1H), 4 * 3600: (N_("Extend 4h"), EXTEND_4H)}


def _warning_head(notice: DeadlineWarning, left: str, at: str) -> str:
    """The first line of a warning: what happens, when, and what it costs."""
    inst = notice.instance
    if notice.action == "stop":
        head = t(
            ":alarm_clock: *{name}* will be stopped in *{left}* (at {at}); its disk is kept. It "
            "costs {cost}.",
            name=inst.name,
            left=left,
            at=at,
            cost=per_hour(inst),
        )
        if notice.final_release_at is None:
            return head
        final = when(notice.final_release_at, ZoneInfo(notice.tz_name))
        return _sentences(
            head,
            t(
                "It is released (disk and all) at {at} unless someone starts it again.",
                at=final,
            ),
        )
    if notice.stopped:
        return _sentences(
            t(
                ":alarm_clock: *{name}* (stopped) will be released in *{left}* (at {at}), its "
                "disk deleted, unless someone starts it again.",
                name=inst.name,
                left=left,
                at=at,
            ),
            _storage_note(inst),
        )
    if notice.policy == "wait-for-jobs":
        return t(
            ":alarm_clock: *{name}* will be released in *{left}* (at {at}), or once its jobs "
            "finish if they still run then. It costs {cost}.",
            name=inst.name,
            left=left,
            at=at,
            cost=per_hour(inst),
        )
    return t(
        ":alarm_clock: *{name}* will be released in *{left}* (at {at}). It costs {cost}.",
        name=inst.name,
        left=left,
        at=at,
        cost=per_hour(inst),
    )


def idle_prompt(notice: IdlePrompt) -> Message:
    """Idle for a while: what it costs per hour, Keep / Release buttons (both confirmed)."""
    inst = notice.instance
    text = t(
        ":zzz: *{name}* has been idle for {idle} (no GPU use, no jobs), costing {cost}. Still "
        "needed?",
        name=inst.name,
        idle=format_duration(notice.now - notice.idle_since),
        cost=per_hour(inst),
    )
    if notice.release_at is not None:
        text = _sentences(
            text,
            t(
                "If it stays idle it will be released at {at}.",
                at=when(notice.release_at, ZoneInfo(notice.tz_name)),
            ),
        )
    value = str(notice.prompt_id)
    buttons = [
        button(t("Keep it"), IDLE_KEEP, value, style="primary", confirm=_keep_confirm(inst)),
        button(
            t("Release it"), IDLE_RELEASE, value, style="danger", confirm=_release_confirm(inst)
        ),
    ]
    return _with_buttons(text, buttons, f"idle-{notice.prompt_id}")


def jobs_done_prompt(notice: JobsDonePrompt) -> Message:
    """The job queue drained on an instance marked release-when-done."""
    inst = notice.instance
    text = t(
        ":checkered_flag: The jobs on *{name}* are done. It will be released at {at} unless you "
        "keep it.",
        name=inst.name,
        at=when(notice.release_at, ZoneInfo(notice.tz_name)),
    )
    value = str(notice.prompt_id)
    buttons = [
        button(t("Keep it"), IDLE_KEEP, value, style="primary", confirm=_keep_confirm(inst)),
        button(
            t("Release now"), IDLE_RELEASE, value, style="danger", confirm=_release_confirm(inst)
        ),
    ]
    return _with_buttons(text, buttons, f"jobs-done-{notice.prompt_id}")


def decided(notice: Decided) -> Message:
    """A prompt after someone answered it: what was decided, by whom (an admin said so), when."""
    name = notice.instance.name
    decision = _decision_text(notice)
    at = when(notice.at, ZoneInfo(notice.tz_name))
    if not notice.by:
        return _plain(t("*{name}*: {decision} at {at}.", name=name, decision=decision, at=at))
    by = mention(notice.by)
    if notice.by != notice.instance.owner_id:
        return _plain(
            t(
                "*{name}*: {decision} by {user} (an admin) at {at}.",
                name=name,
                decision=decision,
                user=by,
                at=at,
            )
        )
    return _plain(
        t("*{name}*: {decision} by {user} at {at}.", name=name, decision=decision, user=by, at=at)
    )


def superseded(notice: Superseded) -> Message:
    """An old warning whose deadline moved: its buttons are gone."""
    name = notice.instance.name
    if notice.new_deadline_at is None:
        return _plain(
            t("*{name}*: this warning is superseded; the instance has no deadline now.", name=name)
        )
    new = when(notice.new_deadline_at, ZoneInfo(notice.tz_name))
    if notice.by and notice.by != notice.instance.owner_id:
        return _plain(
            t(
                "*{name}*: this warning is superseded; the deadline is now {at} (extended by "
                "{admin} (an admin)).",
                name=name,
                at=new,
                admin=mention(notice.by),
            )
        )
    return _plain(
        t("*{name}*: this warning is superseded; the deadline is now {at}.", name=name, at=new)
    )


def busy_again(notice: BusyAgain) -> Message:
    """An idle prompt closed because the instance is busy again."""
    return _plain(t("*{name}* is busy again; no action needed.", name=notice.instance.name))


def new_jobs(notice: NewJobs) -> Message:
    """A jobs-done prompt closed because new jobs started."""
    return _plain(
        t(
            "*{name}* has new jobs; it will not be released when the earlier ones ended.",
            name=notice.instance.name,
        )
    )


# --- releases ---------------------------------------------------------------------------------


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
    text = _sentences(
        ask,
        t(
            "Press the button for what you did: *Released* stops the meter, *Stopped* stops it "
            "for compute while its disk bills on."
        ),
    )
    buttons = _done_buttons(notice.instance_id, inst)
    return _with_buttons(text, buttons, f"release-done-{notice.instance_id}")


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
    text = _sentences(
        due,
        t(
            "Do it on its platform, then press the button for what you did, or keep it with "
            "`/gpu extend {name} 2h`.",
            name=inst.name,
        ),
    )
    if notice.last:
        text = _sentences(
            text,
            t(
                "This is the last reminder: the bot stops reminding you and tells the ops "
                "channel. Until you do it, the platform may go on billing."
            ),
        )
    buttons = _done_buttons(notice.instance_id, inst)
    return _with_buttons(text, buttons, f"release-remind-{notice.instance_id}")


def release_escalation(notice: ReleaseEscalation) -> Message:
    """To the owner and the channel: a release keeps failing or nobody confirmed it."""
    inst = notice.instance
    cost = per_hour(inst)
    owner = mention(inst.owner_id)
    if notice.manual and notice.reminders > 0:
        return _plain(
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
        return _plain(
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
        text = _sentences(text, t("Last error: {error}", error=escape(notice.last_error)))
    return _plain(text)


def released_notice(notice: ReleasedNotice) -> Message:
    """Released (or stopped), confirmed by the platform or the owner."""
    inst = notice.instance
    stop = notice.mode == "stop"
    text = _released_head(
        notice, reason_text(notice.reason, notice.requested_by, inst.owner_id, notice.mode)
    )
    text = _sentences(
        text,
        t("Its compute meter stopped.") if stop else t("The meter stopped."),
        final_cost_sentence(notice.final_cost, stopped=stop).lstrip(),
    )
    if stop and notice.storage_bills:
        text = _sentences(text, _storage_note(inst))
    if notice.release_at is not None:
        text = _sentences(
            text,
            t(
                "It is released at {at} unless someone starts it again; `/gpu extend {name} 1d` "
                "moves that.",
                at=when(notice.release_at, ZoneInfo(notice.tz_name)),
                name=inst.name,
            ),
        )
    return _plain(text)


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


def released_unwarned(notice: ReleasedUnwarned) -> Message:
    """For the ops channel: a deadline release whose warnings Slack never confirmed."""
    inst = notice.instance
    return _plain(
        t(
            ":rotating_light: *{name}* (owner {owner}) was released at its deadline, but Slack "
            "never confirmed that a warning reached its owner.",
            name=escape(inst.name),
            owner=mention(inst.owner_id),
        )
    )


# --- reconciling ------------------------------------------------------------------------------


def released_outside(notice: ReleasedOutside) -> Message:
    """Reconcile found the instance gone, stopped, running again or at another address on the
    platform, without the bot: ``state`` terminated, stopped, started or moved."""
    inst = notice.instance
    if notice.state == "moved":
        return _plain(
            t(
                ":information_source: *{name}* came back at `{address}` on {provider} "
                "(restarted there); the bot reaches it there now, and still expects the host key "
                "it pinned.",
                name=inst.name,
                address=notice.address,
                provider=platform_name(inst.provider),
            )
        )
    if notice.state == "started" and notice.by:
        text = t(
            ":arrow_forward: *{name}* was started again on {provider} by {user}; its meter runs "
            "again ({cost}).",
            name=inst.name,
            provider=platform_name(inst.provider),
            user=mention(notice.by),
            cost=per_hour(inst),
        )
    elif notice.state == "started":
        text = t(
            ":information_source: *{name}* was started again on {provider} outside the bot; its "
            "meter runs again ({cost}).",
            name=inst.name,
            provider=platform_name(inst.provider),
            cost=per_hour(inst),
        )
    if notice.state == "started":
        if notice.address:
            text = _sentences(text, t("It came back at `{address}`.", address=notice.address))
        if notice.deadline_at is not None:
            text = _sentences(
                text,
                t(
                    "Its new deadline is {at}; `/gpu extend {name}` moves it.",
                    at=when(notice.deadline_at, ZoneInfo(notice.tz_name)),
                    name=inst.name,
                ),
            )
        return _plain(text)
    if notice.state == "stopped":
        return _plain(
            _sentences(
                t(
                    ":information_source: *{name}* was stopped on {provider} outside the bot; its "
                    "compute meter is stopped.",
                    name=inst.name,
                    provider=platform_name(inst.provider),
                ),
                _storage_note(inst),
                _platform_release(notice),
            )
        )
    return _plain(
        t(
            ":information_source: *{name}* was released on {provider} outside the bot; its "
            "meter is stopped.",
            name=inst.name,
            provider=platform_name(inst.provider),
        )
    )


def stopped_reminder(notice: StoppedReminder) -> Message:
    """To the owner of a stopped instance, on a widening schedule: what its disk bills, since
    when, until when, and Start / Release."""
    inst = notice.instance
    tz = ZoneInfo(notice.tz_name)
    since = format_duration(notice.now - notice.stopped_at)
    if inst.storage_micros_per_hour > 0:
        head = t(
            ":zzz: *{name}* has been stopped for {since}; its disk bills "
            "{rate}/h ({total} so far).",
            name=escape(inst.name),
            since=since,
            rate=format_money(inst.storage_micros_per_hour, inst.currency),
            total=format_money(notice.storage_micros, inst.currency),
        )
    else:
        head = t(
            ":zzz: *{name}* has been stopped for {since}; its disk may still bill on the "
            "platform (no storage price recorded).",
            name=escape(inst.name),
            since=since,
        )
    if notice.release_at is not None:
        until = t("It is released at {at}.", at=when(notice.release_at, tz))
    else:
        until = t("It is kept until someone releases it.")
    lines = [_sentences(head, until)]
    if notice.last:
        lines.append(t("This is the last reminder."))
    text = "\n".join(lines)
    buttons = stopped_buttons(inst, notice.instance_id, can_start=notice.can_start)
    return fallback(text), (section(text), buttons)


def _platform_release(notice: ReleasedOutside) -> str:
    """When the platform itself releases the stopped instance (and its disk), where it says."""
    if notice.platform_release_at is None:
        return ""
    return t(
        "{provider} itself releases it, disk and data, at {at} unless it is started again.",
        provider=platform_name(notice.instance.provider),
        at=when(notice.platform_release_at, ZoneInfo(notice.tz_name)),
    )


def unregistered_found(notice: UnregisteredFound) -> Message:
    """For the ops channel: an instance nobody registered (see instances.unregistered_notice)."""
    return unregistered_notice(notice.view)


# --- policies ---------------------------------------------------------------------------------


def policy_summary(view: PolicyView) -> Message:
    """An instance's deadline rules, after `/gpu policy` or `/gpu cap`."""
    tz = ZoneInfo(view.tz_name)
    if view.deadline_at:
        lines = [t("*{name}*: deadline {at}", name=view.name, at=when(view.deadline_at, tz))]
    else:
        lines = [t("*{name}*: deadline none", name=view.name)]
    if view.lifetime_cap_at is not None:
        lines.append(
            t(
                "maximum lifetime until {at} (only an admin lifts it)",
                at=when(view.lifetime_cap_at, tz),
            )
        )
    grace = format_duration(timedelta(seconds=view.max_grace_s))
    if view.at_deadline == "wait-for-jobs":
        lines.append(t("at the deadline: wait for running jobs, at most {grace}", grace=grace))
    elif view.at_deadline == "stop":
        lines.append(
            t(
                "at the deadline: stop (disk kept and billed), released {after} after the "
                "deadline unless someone starts it again",
                after=grace,
            )
        )
    else:
        lines.append(t("at the deadline: release"))
    if view.idle_release_after_s:
        after = format_duration(timedelta(seconds=view.idle_release_after_s))
        lines.append(t("idle: released {after} after the idle prompt", after=after))
    else:
        lines.append(t("idle: prompt only"))
    if view.release_when_done:
        lines.append(t("released when its job queue is empty"))
    return _plain("\n".join(["• " + line if i else line for i, line in enumerate(lines)]))


# --- answers to prompt buttons ------------------------------------------------------------------


def answered_before(notice: AnsweredBefore) -> Message:
    """A click on a prompt someone already answered."""
    decision = escape(_resolution_text(notice.resolution))
    if notice.by:
        return _plain(
            t(
                "This was already answered by {user}: {decision}.",
                user=mention(notice.by),
                decision=decision,
            )
        )
    return _plain(t("This was already answered: {decision}.", decision=decision))


def release_pending(notice: ReleasePending) -> Message:
    """A click on a prompt of a manual instance whose release waits for its owner."""
    inst = notice.instance
    if notice.by_owner:
        return _plain(
            t(
                "*{name}*: release requested; waiting for you to confirm it is released on the "
                "platform (the buttons in my message). To keep it instead: "
                "`/gpu extend {name} 2h`.",
                name=inst.name,
            )
        )
    return _plain(
        t(
            "*{name}*: release requested; waiting for {owner} to confirm it is released on the "
            "platform (the buttons in my message). To keep it instead: `/gpu extend {name} 2h`.",
            name=inst.name,
            owner=mention(inst.owner_id),
        )
    )


def being_released(notice: BeingReleased) -> Message:
    """A click on a prompt whose instance is already being released."""
    return _plain(
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
        return _plain(t("Extended {duration}: *{name}*.", duration=added, name=name))
    return _plain(
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
    return _with_buttons(text, [confirm], f"release-confirm-{notice.prompt_id}")


def kept(notice: Kept) -> Message:
    """After Keep it."""
    return _plain(t("Kept *{name}*; it will not be released for this.", name=notice.instance.name))


def release_answered(notice: ReleaseAnswered) -> Message:
    """After a release from a prompt: released, waiting for the owner, or under way."""
    name = notice.instance.name
    if notice.state == "confirmed":
        return _plain(t("*{name}* is released.", name=name))
    if notice.state in ("awaiting_owner", "awaiting_owner_quiet"):
        return _plain(
            t("Release *{name}* on its platform, then press the button I sent.", name=name)
        )
    return _plain(
        t(
            "Releasing *{name}* ({state}); I will say when the platform confirms.",
            name=name,
            state=_state_text(notice.state),
        )
    )


def release_refused(notice: ReleaseRefused) -> Message:
    """A release from a prompt that could not be opened, and why."""
    return _plain(notice.reason)


# --- renting ----------------------------------------------------------------------------------


def rent_started(notice: RentStarted) -> Message:
    """The immediate answer to `/gpu rent`."""
    return _plain(
        _sentences(
            t(
                ":hourglass_flowing_sand: Renting {count} x {instance_type} on {provider} as "
                "{names}.",
                count=len(notice.names),
                instance_type=escape(notice.instance_type),
                provider=platform_name(notice.provider),
                names=escape(", ".join(notice.names)),
            ),
            t(
                "I will post here once SSH answers and the health check ran (usually a few "
                "minutes)."
            ),
        )
    )


def rent_finished(notice: RentFinished) -> Message:
    """What `/gpu rent` achieved, posted when it is done."""
    lines = []
    if notice.registered:
        lines.append(
            _sentences(
                t(
                    ":white_check_mark: {owner} rented on {provider} and registered: {names}.",
                    owner=mention(notice.owner_id),
                    provider=platform_name(notice.provider),
                    names=", ".join(f"*{escape(n)}*" for n in notice.registered),
                ),
                t("`/gpu status NAME` shows them."),
            )
        )
    for provider_id, why in notice.failed:
        lines.append(
            t(
                ":x: {provider} instance {provider_id} could not be registered and was "
                "terminated again: {why}",
                provider=platform_name(notice.provider),
                provider_id=escape(provider_id),
                why=escape(why),
            )
        )
    return _plain(
        "\n".join(lines)
        or t("Nothing was rented on {provider}.", provider=platform_name(notice.provider))
    )


def rent_failed(notice: RentFailed) -> Message:
    """`/gpu rent` failed as a whole."""
    if notice.error is None:
        return _plain(
            t(
                ":x: Renting on {provider} failed; see the bot's log.",
                provider=platform_name(notice.provider),
            )
        )
    return _plain(
        t(
            ":x: Renting on {provider} failed: {error}",
            provider=platform_name(notice.provider),
            error=escape(notice.error),
        )
    )


def rent_given_back_failed(notice: RentGivenBackFailed) -> Message:
    """A rented instance that could not be registered nor terminated: it bills."""
    return _plain(
        _sentences(
            t(
                ":rotating_light: {provider} instance {provider_id} was rented but could not be "
                "registered ({why}), and terminating it failed: {error}.",
                provider=platform_name(notice.provider),
                provider_id=escape(notice.provider_id),
                why=escape(notice.why),
                error=escape(notice.error),
            ),
            t("Terminate it on the platform now; it is billing."),
        )
    )


def rent_recovered(notice: RentRecovered) -> Message:
    """A rental never registered (the bot stopped, say) was terminated."""
    launched = when(notice.launched_at, ZoneInfo(notice.tz_name))
    return _plain(
        _sentences(
            t(
                ":warning: {instance}, rented with /gpu rent at {at}, was never registered because "
                "{reason}.",
                instance=_rented(notice.provider, notice.provider_id, notice.name),
                at=launched,
                reason=escape(notice.reason),
            ),
            t("It has been terminated so it does not bill."),
            t("Rent again with /gpu rent if you still need it."),
        )
    )


def rent_recover_failed(notice: RentRecoverFailed) -> Message:
    """A rental never registered could not be terminated: it bills."""
    return _plain(
        _sentences(
            t(
                ":rotating_light: {instance} was rented with /gpu rent but never registered "
                "({reason}), and terminating it failed: {error}.",
                instance=_rented(notice.provider, notice.provider_id, notice.name),
                reason=escape(notice.reason),
                error=escape(notice.error),
            ),
            t("Terminate it on the platform now; it is billing."),
            t("The bot keeps trying."),
        )
    )


def rent_launch_checked(notice: RentLaunchChecked) -> Message:
    """A launch without an answer, checked: nothing was started."""
    return _plain(
        _sentences(
            t(
                ":information_source: Your /gpu rent of {instance_type} on {provider} at {at} "
                "got no answer from the platform.",
                instance_type=escape(notice.instance_type),
                provider=platform_name(notice.provider),
                at=when(notice.started_at, ZoneInfo(notice.tz_name)),
            ),
            t(
                "The bot checked: nothing was started under its name {platform_name}, so nothing "
                "bills.",
                platform_name=escape(notice.platform_name),
            ),
            t("Rent again if you still need it."),
        )
    )


# --- confirm dialogs --------------------------------------------------------------------------


def _extend_confirm(notice: DeadlineWarning, added_s: int) -> Block:
    """What an Extend button does: the deadline it sets and what the time added costs."""
    inst = notice.instance
    added = timedelta(seconds=added_s)
    values = {
        "name": escape(inst.name),
        "at": when(max(notice.deadline_at, notice.now) + added, ZoneInfo(notice.tz_name)),
        "duration": format_duration(added),
    }
    if notice.stopped:
        what = t("*{name}* stays stopped, its disk kept, until {at} ({duration} more).", **values)
        rate = inst.storage_micros_per_hour
    else:
        what = t("*{name}* keeps running until {at} ({duration} more).", **values)
        rate = inst.price_micros_per_hour
    if rate > 0:
        cost = t(
            "That costs about {cost} more.",
            cost=format_money(rate * added_s // 3600, inst.currency),
        )
    else:
        cost = t("It keeps billing on its platform; no price is recorded.")
        if notice.stopped:
            cost = _sentences(cost, t(STORAGE_HINT, name=inst.name))
    return confirm_dialog(
        t("Extend {name} by {duration}?", name=inst.name, duration=values["duration"]),
        _sentences(what, cost),
        confirm=t("Yes, extend"),
    )


def _release_confirm(inst: InstanceBrief) -> Block:
    """What a Release button does: the instance is terminated, its disks with it."""
    return confirm_dialog(
        t("Release {name} now?", name=inst.name),
        t(
            "*{name}* stops billing and its disks are deleted: anything not saved off it is lost.",
            name=escape(inst.name),
        ),
        confirm=t("Yes, release it"),
    )


def _keep_confirm(inst: InstanceBrief) -> Block:
    """What Keep it does: the instance runs on, and bills, without this prompt releasing it."""
    return confirm_dialog(
        t("Keep {name} running?", name=inst.name),
        t(
            "*{name}* keeps running and costing {cost}; this prompt will not release it.",
            name=escape(inst.name),
            cost=per_hour(inst),
        ),
        confirm=t("Keep it"),
    )


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


# --- parts ------------------------------------------------------------------------------------


#: The full stop, exclamation and question marks a Chinese sentence ends with: the next one
#: follows without a space.
_FULL_WIDTH_STOPS = ("\u3002", "\uff01", "\uff1f")


def _sentences(*sentences: str) -> str:
    """Sentences in a row, the empty ones left out: after a space, or straight after a
    full-width stop (Chinese)."""
    text = ""
    for sentence in sentences:
        if not sentence:
            continue
        if text and not text.endswith(_FULL_WIDTH_STOPS):
            text += " "
        text += sentence
    return text


def _plain(text: str) -> Message:
    return fallback(text), (section(text),)


def _with_buttons(text: str, buttons: list[Block], block_id: str) -> Message:
    return fallback(text), (section(text), actions(buttons, block_id=block_id))


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


#: What a prompt's answer is called, by the decision bot.services.releases records.
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


#: How a prompt was answered, by the resolution bot.services.prompts records (the English is
#: the resolution with spaces for underscores).
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


def _storage_note(inst: InstanceBrief) -> str:
    """What a stopped instance still costs, and how to stop that."""
    if inst.storage_micros_per_hour <= 0:
        return _sentences(
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


def _rented(provider: str, provider_id: str, name: str | None) -> str:
    """A rented instance as ``lambda instance i-1 (box)``."""
    if name:
        return t(
            "{provider} instance {provider_id} ({name})",
            provider=platform_name(provider),
            provider_id=escape(provider_id),
            name=escape(name),
        )
    return t(
        "{provider} instance {provider_id}",
        provider=platform_name(provider),
        provider_id=escape(provider_id),
    )


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], _Callable[[Any], Message]] = {
    DeadlineWarning: deadline_warning,
    StoppedReminder: stopped_reminder,
    IdlePrompt: idle_prompt,
    JobsDonePrompt: jobs_done_prompt,
    Decided: decided,
    Superseded: superseded,
    BusyAgain: busy_again,
    NewJobs: new_jobs,
    ManualReleaseRequest: manual_release_request,
    ManualReleaseReminder: manual_release_reminder,
    ReleaseEscalation: release_escalation,
    ReleasedNotice: released_notice,
    ReleasedUnwarned: released_unwarned,
    ReleasedOutside: released_outside,
    UnregisteredFound: unregistered_found,
    AnsweredBefore: answered_before,
    BeingReleased: being_released,
    ReleasePending: release_pending,
    Extended: extend_answered,
    ReleaseConfirmAsk: release_confirm,
    Kept: kept,
    ReleaseAnswered: release_answered,
    ReleaseRefused: release_refused,
    RentStarted: rent_started,
    RentFinished: rent_finished,
    RentFailed: rent_failed,
    RentGivenBackFailed: rent_given_back_failed,
    RentRecovered: rent_recovered,
    RentRecoverFailed: rent_recover_failed,
    RentLaunchChecked: rent_launch_checked,
}
