"""Block Kit for deadlines, idle prompts and releases: pure functions, values in, message out.

Times arrive as naive UTC and are shown in the configured zone; money arrives in micro-units.
Every message carries a ``text`` fallback, which Slack reads as mrkdwn like the section it
repeats: errors and anything else from people or platforms go into it escaped.
"""

from __future__ import annotations

from collections.abc import Callable as _Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.kit import escape
from bot.notify import Notice
from bot.services.views import InstanceBrief
from bot.values import format_duration, format_money

Block = dict[str, Any]
Message = tuple[str, tuple[Block, ...]]

#: Button action ids (the handlers live in bot.commands.deadlines; instance_release_done in
#: bot.commands.instances).
EXTEND_1H = "deadline_extend_1h"
EXTEND_4H = "deadline_extend_4h"
RELEASE_NOW = "deadline_release_now"
RELEASE_CONFIRM = "deadline_release_confirm"
IDLE_KEEP = "idle_keep"
IDLE_RELEASE = "idle_release"
RELEASE_DONE = "instance_release_done"
STOP_DONE = "instance_stop_done"


def mention(user_id: str) -> str:
    """A Slack mention of a user."""
    return f"<@{user_id}>"


def when(at: datetime, tz: ZoneInfo) -> str:
    """A naive-UTC time as ``Wed 18:00 CET`` in ``tz``."""
    local = at.replace(tzinfo=UTC).astimezone(tz)
    return local.strftime("%a %H:%M %Z")


def per_hour(inst: InstanceBrief) -> str:
    """What the instance costs per hour, like ``$2.10/h``; says so when no price is recorded."""
    if inst.price_micros_per_hour <= 0:
        return "money (no price recorded)"
    return f"{format_money(inst.price_micros_per_hour, inst.currency)}/h"


def deadline_warning(
    inst: InstanceBrief,
    *,
    deadline_at: datetime,
    now: datetime,
    tz: ZoneInfo,
    prompt_id: int,
    policy: str = "release",
    capped: bool = False,
    late_release_at: datetime | None = None,
) -> Message:
    """The warning before a deadline, with Extend 1h / Extend 4h / Release now buttons.

    ``late_release_at`` is set when the deadline already passed while the bot could not warn:
    the release then happens at that time instead."""
    release_at = late_release_at or deadline_at
    left = format_duration(max(release_at - now, timedelta(0)))
    after_jobs = "" if policy == "release" else ", or once its jobs finish if they still run then"
    cost = per_hour(inst)
    lines = [
        f":alarm_clock: *{inst.name}* will be released in *{left}* "
        f"(at {when(release_at, tz)}){after_jobs}. It costs {cost}.",
    ]
    if late_release_at is not None and deadline_at <= now:
        lines.append("Its deadline passed while the bot could not warn you, so you get this grace.")
    elif late_release_at is not None:
        lines.append(
            f"Its deadline ({when(deadline_at, tz)}) left too little notice, "
            "so the release waits until then."
        )
    if capped:
        lines.append("This is the maximum lifetime an admin set; only an admin can extend it.")
    text = " ".join(lines)
    buttons = [
        button("Extend 1h", EXTEND_1H, str(prompt_id), style="primary"),
        button("Extend 4h", EXTEND_4H, str(prompt_id)),
        button("Release now", RELEASE_NOW, str(prompt_id), style="danger"),
    ]
    return text, (section(text), actions(f"deadline-{prompt_id}", buttons))


def release_confirm(inst: InstanceBrief, *, prompt_id: int) -> Message:
    """Asked after Release now: the confirmation button."""
    text = f"Release *{inst.name}* now? Anything not saved off the instance is lost."
    confirm = button("Yes, release it", RELEASE_CONFIRM, str(prompt_id), style="danger")
    return text, (section(text), actions(f"release-confirm-{prompt_id}", [confirm]))


def decided(
    inst: InstanceBrief, *, what: str, by: str | None, at: datetime, tz: ZoneInfo
) -> Message:
    """A prompt after someone answered it: ``what`` like "Extended 1h" or "Release requested"."""
    who = f" by {mention(by)}" if by else ""
    text = f"*{inst.name}*: {what}{who} at {when(at, tz)}."
    return text, (section(text),)


def superseded(inst: InstanceBrief, *, new_deadline_at: datetime | None, tz: ZoneInfo) -> Message:
    """An old warning whose deadline moved: its buttons are gone."""
    if new_deadline_at is None:
        text = f"*{inst.name}*: this warning is superseded; the instance has no deadline now."
    else:
        text = (
            f"*{inst.name}*: this warning is superseded; the deadline is now "
            f"{when(new_deadline_at, tz)}."
        )
    return text, (section(text),)


def idle_prompt(
    inst: InstanceBrief,
    *,
    idle_for: timedelta,
    prompt_id: int,
    release_at: datetime | None,
    tz: ZoneInfo,
) -> Message:
    """Idle for a while: what it costs per hour, Keep / Release buttons."""
    cost = per_hour(inst)
    text = (
        f":zzz: *{inst.name}* has been idle for {format_duration(idle_for)} "
        f"(no GPU use, no jobs), costing {cost}. Still needed?"
    )
    if release_at is not None:
        text += f" If it stays idle it will be released at {when(release_at, tz)}."
    buttons = [
        button("Keep it", IDLE_KEEP, str(prompt_id), style="primary"),
        button("Release it", IDLE_RELEASE, str(prompt_id), style="danger"),
    ]
    return text, (section(text), actions(f"idle-{prompt_id}", buttons))


def jobs_done_prompt(
    inst: InstanceBrief, *, prompt_id: int, release_at: datetime, tz: ZoneInfo
) -> Message:
    """The job queue drained on an instance marked release-when-done."""
    text = (
        f":checkered_flag: The jobs on *{inst.name}* are done. It will be released at "
        f"{when(release_at, tz)} unless you keep it."
    )
    buttons = [
        button("Keep it", IDLE_KEEP, str(prompt_id), style="primary"),
        button("Release now", IDLE_RELEASE, str(prompt_id), style="danger"),
    ]
    return text, (section(text), actions(f"jobs-done-{prompt_id}", buttons))


def manual_release_request(
    inst: InstanceBrief, *, instance_id: int, reason: str, mode: str = "terminate"
) -> Message:
    """Ask the owner to release (or stop) a manual instance on its platform and say which
    they did: released (the meter stops, disk and all) or only stopped (its disk keeps
    billing)."""
    cost = per_hour(inst)
    verb = "stop" if mode == "stop" else "release"
    text = (
        f":warning: Please {verb} *{inst.name}* on its platform now ({reason_text(reason)}); "
        f"it costs {cost} until you do. Press the button for what you did: "
        "*Released* stops the meter, *Stopped* stops it for compute while its disk bills on."
    )
    return text, (section(text), actions(f"release-done-{instance_id}", _done_buttons(instance_id)))


def manual_release_reminder(
    inst: InstanceBrief,
    *,
    instance_id: int,
    asked_at: datetime,
    now: datetime,
    mode: str = "terminate",
) -> Message:
    """A reminder that a manual instance still waits to be released (or stopped)."""
    waited = format_duration(now - asked_at)
    cost = per_hour(inst)
    verb = "stopped" if mode == "stop" else "released"
    text = (
        f":warning: Reminder: *{inst.name}* was due to be {verb} {waited} ago and still "
        f"costs {cost}. Do it on its platform, then press the button for what you did."
    )
    return text, (
        section(text),
        actions(f"release-remind-{instance_id}", _done_buttons(instance_id)),
    )


def _done_buttons(instance_id: int) -> list[Block]:
    return [
        button("Released on the platform", RELEASE_DONE, str(instance_id), style="primary"),
        button("Stopped on the platform (disk kept)", STOP_DONE, str(instance_id)),
    ]


def release_escalation(
    inst: InstanceBrief, *, attempts: int, last_error: str | None, manual: bool
) -> Message:
    """To the owner and the channel: a release keeps failing or nobody confirmed it."""
    cost = per_hour(inst)
    if manual:
        text = (
            f":rotating_light: *{inst.name}* ({mention(inst.owner_id)}) should have been released "
            f"but nobody confirmed it; it may still cost {cost}. "
            "Please release it on its platform and press the button in the owner's message."
        )
    else:
        error = f" Last error: {escape(last_error)}" if last_error else ""
        text = (
            f":rotating_light: Releasing *{inst.name}* ({mention(inst.owner_id)}) on "
            f"{inst.provider} failed {attempts} times; it may still cost {cost}. "
            f"The bot keeps trying; release it on the platform if you can.{error}"
        )
    return text, (section(text),)


def released_notice(
    inst: InstanceBrief, *, mode: str, reason: str, storage_bills: bool, by: str | None
) -> Message:
    """Released (or stopped), confirmed by the platform or the owner."""
    verb = "stopped" if mode == "stop" else "released"
    who = f" by {mention(by)}" if by else ""
    meter = "Its compute meter stopped." if mode == "stop" else "The meter stopped."
    text = f":white_check_mark: *{inst.name}* is {verb}{who} ({reason_text(reason)}). {meter}"
    if mode == "stop" and storage_bills:
        text += " " + _storage_note(inst)
    return text, (section(text),)


def released_outside(inst: InstanceBrief, *, state: str) -> Message:
    """Reconcile found the instance gone, stopped, or running again on the platform, without
    the bot: ``state`` terminated, stopped or started."""
    if state == "started":
        text = (
            f":information_source: *{inst.name}* was started again on {inst.provider} outside "
            f"the bot; its meter runs again ({per_hour(inst)})."
        )
    elif state == "stopped":
        text = (
            f":information_source: *{inst.name}* was stopped on {inst.provider} outside the "
            f"bot; its compute meter is stopped. {_storage_note(inst)}"
        )
    else:
        text = (
            f":information_source: *{inst.name}* was released on {inst.provider} outside the "
            "bot; its meter is stopped."
        )
    return text, (section(text),)


def _storage_note(inst: InstanceBrief) -> str:
    """What a stopped instance still costs, and how to stop that."""
    release = f"`/gpu release {inst.name}` terminates it, disk and all."
    if inst.storage_micros_per_hour <= 0:
        return f"Its disk may still bill on the platform while it is stopped; {release}"
    cost = format_money(inst.storage_micros_per_hour, inst.currency)
    return f"Its disk keeps billing ({cost}/h) while it is stopped; {release}"


def released_unwarned(inst: InstanceBrief) -> Message:
    """For the ops channel: a deadline release whose warnings Slack never confirmed."""
    text = (
        f":rotating_light: *{escape(inst.name)}* (owner {mention(inst.owner_id)}) was released "
        "at its deadline, but Slack never confirmed that a warning reached its owner."
    )
    return text, (section(text),)


def reason_text(reason: str) -> str:
    """A release reason in words."""
    return {
        "user": "requested by its owner",
        "deadline": "its deadline passed",
        "cap": "its maximum lifetime is reached",
        "idle": "it was idle",
        "jobs_done": "its jobs are done",
        "reconcile": "found released on the platform",
    }.get(reason, reason)


def section(text: str) -> Block:
    """A markdown section (Slack allows 3000 characters)."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}


def actions(block_id: str, elements: list[Block]) -> Block:
    """An actions block."""
    return {"type": "actions", "block_id": block_id, "elements": elements}


def button(text: str, action_id: str, value: str, *, style: str | None = None) -> Block:
    """A button; ``style`` primary or danger."""
    element: Block = {
        "type": "button",
        "text": {"type": "plain_text", "text": text[:75]},
        "action_id": action_id,
        "value": value,
    }
    if style:
        element["style"] = style
    return element


def policy_summary(
    *,
    name: str,
    deadline_at: datetime | None,
    lifetime_cap_at: datetime | None,
    at_deadline: str,
    max_grace_s: int,
    idle_release_after_s: int | None,
    release_when_done: bool,
    tz: ZoneInfo,
) -> Message:
    """An instance's deadline rules, after `/gpu policy` or `/gpu cap`."""
    deadline = when(deadline_at, tz) if deadline_at else "none"
    lines = [f"*{name}*: deadline {deadline}"]
    if lifetime_cap_at is not None:
        lines.append(f"maximum lifetime until {when(lifetime_cap_at, tz)} (only an admin lifts it)")
    if at_deadline == "wait-for-jobs":
        grace = format_duration(timedelta(seconds=max_grace_s))
        lines.append(f"at the deadline: wait for running jobs, at most {grace}")
    else:
        lines.append("at the deadline: release")
    if idle_release_after_s:
        lines.append(
            f"idle: released {format_duration(timedelta(seconds=idle_release_after_s))} "
            "after the idle prompt"
        )
    else:
        lines.append("idle: prompt only")
    if release_when_done:
        lines.append("released when its job queue is empty")
    text = "\n".join(["• " + line if i else line for i, line in enumerate(lines)])
    return text, (section(text),)


def rent_started(provider: str, instance_type: str, names: tuple[str, ...]) -> Message:
    """The immediate answer to `/gpu rent`."""
    text = (
        f":hourglass_flowing_sand: Renting {len(names)} x {escape(instance_type)} on {provider} "
        f"as {escape(', '.join(names))}. I will post here once SSH answers and the health check "
        "ran (usually a few minutes)."
    )
    return text, (section(text),)


def rent_finished(
    provider: str, registered: list[str], failed: list[tuple[str, str]], owner_id: str
) -> Message:
    """What `/gpu rent` achieved, posted when it is done."""
    lines = []
    if registered:
        lines.append(
            f":white_check_mark: {mention(owner_id)} rented on {provider} and registered: "
            + ", ".join(f"*{escape(n)}*" for n in registered)
            + ". `/gpu status NAME` shows them."
        )
    for provider_id, why in failed:
        lines.append(
            f":x: {provider} instance {escape(provider_id)} could not be registered and was "
            f"terminated again: {escape(why)}"
        )
    text = "\n".join(lines) or f"Nothing was rented on {provider}."
    return text, (section(text),)


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], _Callable[[Any], Message]] = {}
