"""Block Kit for the notices of :mod:`bot.services.instances.deadlines`: deadline warnings, idle
and jobs-done prompts, what closes them, reminders of a stopped instance, and an instance's
deadline rules (`/gpu policy`). Pure functions, a notice or view in, ``(text, blocks)`` out,
every block from :mod:`bot.blocks.kit`.

Times arrive as naive UTC and are shown, with their date, in the notice's time zone; money
arrives in micro-units. Every message carries a ``text`` fallback, which Slack reads as mrkdwn
like the section it repeats. A button that releases an instance or keeps it running (and
billing) asks first in a confirm dialog that names the instance and what follows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.instances import stopped_buttons
from bot.blocks.kit import (
    Block,
    Message,
    button,
    confirm_dialog,
    escape,
    fallback,
    mention,
    section,
    when,
)
from bot.blocks.parts import per_hour, plain, sentences, storage_note, with_buttons
from bot.i18n import N_, t
from bot.notify import Notice
from bot.services.instances.deadlines import (
    BusyAgain,
    DeadlineWarning,
    IdlePrompt,
    JobsDonePrompt,
    NewJobs,
    ReleasedUnwarned,
    StoppedReminder,
    Superseded,
)
from bot.services.instances.policies import PolicyView
from bot.services.instances.views import STORAGE_HINT, InstanceBrief
from bot.values import format_duration, format_money

#: Button action ids of the prompts (the handlers live in bot.commands.deadlines).
EXTEND_1H = "deadline_extend_1h"
EXTEND_4H = "deadline_extend_4h"
#: Keep the instance to the last minute of the hour already billed (value: the prompt id).
EXTEND_PAID_HOUR = "deadline_extend_paid_hour"
RELEASE_NOW = "deadline_release_now"
RELEASE_CONFIRM = "deadline_release_confirm"
IDLE_KEEP = "idle_keep"
IDLE_RELEASE = "idle_release"


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
    return with_buttons(sentences(*lines), buttons, f"deadline-{notice.prompt_id}")


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
        text = sentences(
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
    return with_buttons(text, buttons, f"idle-{notice.prompt_id}")


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
    return with_buttons(text, buttons, f"jobs-done-{notice.prompt_id}")


def superseded(notice: Superseded) -> Message:
    """An old warning whose deadline moved: its buttons are gone."""
    name = notice.instance.name
    if notice.new_deadline_at is None:
        return plain(
            t("*{name}*: this warning is superseded; the instance has no deadline now.", name=name)
        )
    new = when(notice.new_deadline_at, ZoneInfo(notice.tz_name))
    if notice.by and notice.by != notice.instance.owner_id:
        return plain(
            t(
                "*{name}*: this warning is superseded; the deadline is now {at} (extended by "
                "{admin} (an admin)).",
                name=name,
                at=new,
                admin=mention(notice.by),
            )
        )
    return plain(
        t("*{name}*: this warning is superseded; the deadline is now {at}.", name=name, at=new)
    )


def busy_again(notice: BusyAgain) -> Message:
    """An idle prompt closed because the instance is busy again."""
    return plain(t("*{name}* is busy again; no action needed.", name=notice.instance.name))


def new_jobs(notice: NewJobs) -> Message:
    """A jobs-done prompt closed because new jobs started."""
    return plain(
        t(
            "*{name}* has new jobs; it will not be released when the earlier ones ended.",
            name=notice.instance.name,
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
    lines = [sentences(head, until)]
    if notice.last:
        lines.append(t("This is the last reminder."))
    text = "\n".join(lines)
    buttons = stopped_buttons(inst, notice.instance_id, can_start=notice.can_start)
    return fallback(text), (section(text), buttons)


def released_unwarned(notice: ReleasedUnwarned) -> Message:
    """For the ops channel: a deadline release whose warnings the chat platform never confirmed
    (Slack or Feishu: the words name neither)."""
    inst = notice.instance
    return plain(
        t(
            ":rotating_light: *{name}* (owner {owner}) was released at its deadline, but it was "
            "never confirmed that a warning reached its owner.",
            name=escape(inst.name),
            owner=mention(inst.owner_id),
        )
    )


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
    return plain("\n".join(["• " + line if i else line for i, line in enumerate(lines)]))


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
        return sentences(
            head,
            t(
                "It is released (disk and all) at {at} unless someone starts it again.",
                at=final,
            ),
        )
    if notice.stopped:
        return sentences(
            t(
                ":alarm_clock: *{name}* (stopped) will be released in *{left}* (at {at}), its "
                "disk deleted, unless someone starts it again.",
                name=inst.name,
                left=left,
                at=at,
            ),
            storage_note(inst),
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
            cost = sentences(cost, t(STORAGE_HINT, name=inst.name))
    return confirm_dialog(
        t("Extend {name} by {duration}?", name=inst.name, duration=values["duration"]),
        sentences(what, cost),
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


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    DeadlineWarning: deadline_warning,
    StoppedReminder: stopped_reminder,
    IdlePrompt: idle_prompt,
    JobsDonePrompt: jobs_done_prompt,
    Superseded: superseded,
    BusyAgain: busy_again,
    NewJobs: new_jobs,
    ReleasedUnwarned: released_unwarned,
}
