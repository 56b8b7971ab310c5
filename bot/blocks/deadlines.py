"""Block Kit for deadlines, idle prompts, releases, reconciling and renting: pure functions, a
notice or view in, ``(text, blocks)`` out, every block from :mod:`bot.blocks.kit`.

Times arrive as naive UTC and are shown, with their date, in the notice's time zone; money
arrives in micro-units. Every message carries a ``text`` fallback, which Slack reads as mrkdwn
like the section it repeats: errors and anything else from people or platforms go into it
escaped.
"""

from __future__ import annotations

from collections.abc import Callable as _Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.instances import RELEASE_DONE, STOP_DONE, unregistered_notice
from bot.blocks.kit import Block, Message, actions, button, escape, fallback, mention, section, when
from bot.blocks.money import final_cost_sentence
from bot.notify import Notice
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
from bot.services.views import InstanceBrief
from bot.values import format_duration, format_money

#: Button action ids (the handlers live in bot.commands.deadlines; RELEASE_DONE and STOP_DONE
#: in bot.commands.instances).
EXTEND_1H = "deadline_extend_1h"
EXTEND_4H = "deadline_extend_4h"
RELEASE_NOW = "deadline_release_now"
RELEASE_CONFIRM = "deadline_release_confirm"
IDLE_KEEP = "idle_keep"
IDLE_RELEASE = "idle_release"


def per_hour(inst: InstanceBrief) -> str:
    """What the instance costs per hour, like ``$2.10/h``; says so when no price is recorded."""
    if inst.price_micros_per_hour <= 0:
        return "money (no price recorded)"
    return f"{format_money(inst.price_micros_per_hour, inst.currency)}/h"


def reason_text(
    reason: str, by: str | None = None, owner_id: str | None = None, mode: str = "terminate"
) -> str:
    """A release reason in words (one it does not know, escaped as it is). A release someone
    other than the owner ``owner_id`` asked for (``by``: only an admin can) names them."""
    if reason == "user" and by and owner_id and by != owner_id:
        verb = "stopped" if mode == "stop" else "released"
        return f"{verb} by {mention(by)} (an admin)"
    return {
        "user": "requested by its owner",
        "deadline": "its deadline passed",
        "cap": "its maximum lifetime is reached",
        "idle": "it was idle",
        "jobs_done": "its jobs are done",
        "reconcile": "found released on the platform",
    }.get(reason) or escape(reason)


# --- prompts ----------------------------------------------------------------------------------


def deadline_warning(notice: DeadlineWarning) -> Message:
    """The warning before a deadline, with Extend 1h / Extend 4h (those the recipient may use)
    and Release now buttons."""
    tz = ZoneInfo(notice.tz_name)
    left = format_duration(max(notice.release_at - notice.now, timedelta(0)))
    after_jobs = (
        ", or once its jobs finish if they still run then"
        if notice.policy == "wait-for-jobs"
        else ""
    )
    lines = [_warning_head(notice, left, when(notice.release_at, tz), after_jobs)]
    late = notice.release_at != notice.deadline_at
    if late and notice.deadline_at <= notice.now:
        lines.append("Its deadline passed while the bot could not warn you, so you get this grace.")
    elif late:
        lines.append(
            f"Its deadline ({when(notice.deadline_at, tz)}) left too little notice, "
            "so the release waits until then."
        )
    if notice.cap_at is not None and len(notice.extend_s) < len(_EXTEND_BUTTONS):
        limit = (
            "it can be extended only up to then"
            if notice.extend_s
            else "only an admin can extend it past that"
        )
        lines.append(
            f"The lifetime cap set by an admin ends it at {when(notice.cap_at, tz)}; {limit}."
        )
    value = str(notice.prompt_id)
    buttons = [
        button(label, action_id, value, style="primary" if i == 0 else None)
        for i, (label, action_id) in enumerate(
            _EXTEND_BUTTONS[s] for s in notice.extend_s if s in _EXTEND_BUTTONS
        )
    ]
    buttons.append(button("Release now", RELEASE_NOW, value, style="danger"))
    return _with_buttons(" ".join(lines), buttons, f"deadline-{notice.prompt_id}")


#: The Extend buttons by what they add, in seconds.
_EXTEND_BUTTONS = {3600: ("Extend 1h", EXTEND_1H), 4 * 3600: ("Extend 4h", EXTEND_4H)}


def _warning_head(notice: DeadlineWarning, left: str, at: str, after_jobs: str) -> str:
    """The first line of a warning: what happens, when, and what it costs."""
    inst = notice.instance
    if notice.action == "stop":
        final = ""
        if notice.final_release_at is not None:
            final = (
                f" It is released (disk and all) at "
                f"{when(notice.final_release_at, ZoneInfo(notice.tz_name))} unless someone "
                "starts it again."
            )
        return (
            f":alarm_clock: *{inst.name}* will be stopped in *{left}* (at {at}); its disk is "
            f"kept. It costs {per_hour(inst)}.{final}"
        )
    if notice.stopped:
        return (
            f":alarm_clock: *{inst.name}* (stopped) will be released in *{left}* (at {at}), "
            f"its disk deleted, unless someone starts it again. {_storage_note(inst)}"
        )
    return (
        f":alarm_clock: *{inst.name}* will be released in *{left}* "
        f"(at {at}){after_jobs}. It costs {per_hour(inst)}."
    )


def idle_prompt(notice: IdlePrompt) -> Message:
    """Idle for a while: what it costs per hour, Keep / Release buttons."""
    inst = notice.instance
    text = (
        f":zzz: *{inst.name}* has been idle for {format_duration(notice.now - notice.idle_since)} "
        f"(no GPU use, no jobs), costing {per_hour(inst)}. Still needed?"
    )
    if notice.release_at is not None:
        text += (
            " If it stays idle it will be released at "
            f"{when(notice.release_at, ZoneInfo(notice.tz_name))}."
        )
    value = str(notice.prompt_id)
    buttons = [
        button("Keep it", IDLE_KEEP, value, style="primary"),
        button("Release it", IDLE_RELEASE, value, style="danger"),
    ]
    return _with_buttons(text, buttons, f"idle-{notice.prompt_id}")


def jobs_done_prompt(notice: JobsDonePrompt) -> Message:
    """The job queue drained on an instance marked release-when-done."""
    text = (
        f":checkered_flag: The jobs on *{notice.instance.name}* are done. It will be released at "
        f"{when(notice.release_at, ZoneInfo(notice.tz_name))} unless you keep it."
    )
    value = str(notice.prompt_id)
    buttons = [
        button("Keep it", IDLE_KEEP, value, style="primary"),
        button("Release now", IDLE_RELEASE, value, style="danger"),
    ]
    return _with_buttons(text, buttons, f"jobs-done-{notice.prompt_id}")


def decided(notice: Decided) -> Message:
    """A prompt after someone answered it: what was decided, by whom (an admin said so), when."""
    who = f" by {mention(notice.by)}" if notice.by else ""
    if notice.by and notice.by != notice.instance.owner_id:
        who += " (an admin)"
    at = when(notice.at, ZoneInfo(notice.tz_name))
    return _plain(f"*{notice.instance.name}*: {_decision_text(notice)}{who} at {at}.")


def superseded(notice: Superseded) -> Message:
    """An old warning whose deadline moved: its buttons are gone."""
    name = notice.instance.name
    if notice.new_deadline_at is None:
        return _plain(f"*{name}*: this warning is superseded; the instance has no deadline now.")
    new = when(notice.new_deadline_at, ZoneInfo(notice.tz_name))
    who = ""
    if notice.by and notice.by != notice.instance.owner_id:
        who = f" (extended by {mention(notice.by)} (an admin))"
    return _plain(f"*{name}*: this warning is superseded; the deadline is now {new}{who}.")


def busy_again(notice: BusyAgain) -> Message:
    """An idle prompt closed because the instance is busy again."""
    return _plain(f"*{notice.instance.name}* is busy again; no action needed.")


def new_jobs(notice: NewJobs) -> Message:
    """A jobs-done prompt closed because new jobs started."""
    return _plain(
        f"*{notice.instance.name}* has new jobs; it will not be released when the earlier ones "
        "ended."
    )


# --- releases ---------------------------------------------------------------------------------


def manual_release_request(notice: ManualReleaseRequest) -> Message:
    """Ask the owner to release (or stop) a manual instance on its platform and say which
    they did: released (the meter stops, disk and all) or only stopped (its disk keeps
    billing)."""
    inst = notice.instance
    verb = "stop" if notice.mode == "stop" else "release"
    text = (
        f":warning: Please {verb} *{inst.name}* on its platform now "
        f"({reason_text(notice.reason, notice.requested_by, inst.owner_id, notice.mode)}); "
        f"it costs {per_hour(inst)} until you do. Press the "
        "button for what you did: *Released* stops the meter, *Stopped* stops it for compute "
        "while its disk bills on."
    )
    buttons = _done_buttons(notice.instance_id)
    return _with_buttons(text, buttons, f"release-done-{notice.instance_id}")


def manual_release_reminder(notice: ManualReleaseReminder) -> Message:
    """A reminder that a manual instance still waits to be released (or stopped)."""
    inst = notice.instance
    waited = format_duration(notice.now - notice.asked_at)
    verb = "stopped" if notice.mode == "stop" else "released"
    text = (
        f":warning: Reminder: *{inst.name}* was due to be {verb} {waited} ago and still "
        f"costs {per_hour(inst)}. Do it on its platform, then press the button for what you "
        f"did, or keep it with `/gpu extend {inst.name} 2h`."
    )
    buttons = _done_buttons(notice.instance_id)
    return _with_buttons(text, buttons, f"release-remind-{notice.instance_id}")


def release_escalation(notice: ReleaseEscalation) -> Message:
    """To the owner and the channel: a release keeps failing or nobody confirmed it."""
    inst = notice.instance
    cost = per_hour(inst)
    if notice.manual:
        return _plain(
            f":rotating_light: *{inst.name}* ({mention(inst.owner_id)}) should have been "
            f"released but nobody confirmed it; it may still cost {cost}. "
            "Please release it on its platform and press the button in the owner's message."
        )
    error = f" Last error: {escape(notice.last_error)}" if notice.last_error else ""
    return _plain(
        f":rotating_light: Releasing *{inst.name}* ({mention(inst.owner_id)}) on "
        f"{inst.provider} failed {notice.attempts} times; it may still cost {cost}. "
        f"The bot keeps trying; release it on the platform if you can.{error}"
    )


def released_notice(notice: ReleasedNotice) -> Message:
    """Released (or stopped), confirmed by the platform or the owner."""
    inst = notice.instance
    verb = "stopped" if notice.mode == "stop" else "released"
    who = f" by {mention(notice.by)}" if notice.by else ""
    meter = "Its compute meter stopped." if notice.mode == "stop" else "The meter stopped."
    text = (
        f":white_check_mark: *{inst.name}* is {verb}{who} "
        f"({reason_text(notice.reason, notice.requested_by, inst.owner_id, notice.mode)}). {meter}"
    )
    text += final_cost_sentence(notice.final_cost, stopped=notice.mode == "stop")
    if notice.mode == "stop" and notice.storage_bills:
        text += " " + _storage_note(inst)
    if notice.release_at is not None:
        text += (
            f" It is released at {when(notice.release_at, ZoneInfo(notice.tz_name))} unless "
            f"someone starts it again; `/gpu extend {inst.name} 1d` moves that."
        )
    return _plain(text)


def released_unwarned(notice: ReleasedUnwarned) -> Message:
    """For the ops channel: a deadline release whose warnings Slack never confirmed."""
    inst = notice.instance
    return _plain(
        f":rotating_light: *{escape(inst.name)}* (owner {mention(inst.owner_id)}) was released "
        "at its deadline, but Slack never confirmed that a warning reached its owner."
    )


# --- reconciling ------------------------------------------------------------------------------


def released_outside(notice: ReleasedOutside) -> Message:
    """Reconcile found the instance gone, stopped, running again or at another address on the
    platform, without the bot: ``state`` terminated, stopped, started or moved."""
    inst = notice.instance
    came_back = f" It came back at `{notice.address}`." if notice.address else ""
    if notice.state == "moved":
        return _plain(
            f":information_source: *{inst.name}* came back at `{notice.address}` on "
            f"{inst.provider} (restarted there); the bot reaches it there now, and still "
            "expects the host key it pinned."
        )
    if notice.state == "started":
        return _plain(
            f":information_source: *{inst.name}* was started again on {inst.provider} outside "
            f"the bot; its meter runs again ({per_hour(inst)}).{came_back}"
        )
    if notice.state == "stopped":
        return _plain(
            f":information_source: *{inst.name}* was stopped on {inst.provider} outside the "
            f"bot; its compute meter is stopped. {_storage_note(inst)}"
        )
    return _plain(
        f":information_source: *{inst.name}* was released on {inst.provider} outside the "
        "bot; its meter is stopped."
    )


def unregistered_found(notice: UnregisteredFound) -> Message:
    """For the ops channel: an instance nobody registered (see instances.unregistered_notice)."""
    return unregistered_notice(notice.view)


# --- policies ---------------------------------------------------------------------------------


def policy_summary(view: PolicyView) -> Message:
    """An instance's deadline rules, after `/gpu policy` or `/gpu cap`."""
    tz = ZoneInfo(view.tz_name)
    deadline = when(view.deadline_at, tz) if view.deadline_at else "none"
    lines = [f"*{view.name}*: deadline {deadline}"]
    if view.lifetime_cap_at is not None:
        lines.append(
            f"maximum lifetime until {when(view.lifetime_cap_at, tz)} (only an admin lifts it)"
        )
    if view.at_deadline == "wait-for-jobs":
        grace = format_duration(timedelta(seconds=view.max_grace_s))
        lines.append(f"at the deadline: wait for running jobs, at most {grace}")
    elif view.at_deadline == "stop":
        after = format_duration(timedelta(seconds=view.max_grace_s))
        lines.append(
            f"at the deadline: stop (disk kept and billed), released {after} after the deadline "
            "unless someone starts it again"
        )
    else:
        lines.append("at the deadline: release")
    if view.idle_release_after_s:
        after = format_duration(timedelta(seconds=view.idle_release_after_s))
        lines.append(f"idle: released {after} after the idle prompt")
    else:
        lines.append("idle: prompt only")
    if view.release_when_done:
        lines.append("released when its job queue is empty")
    return _plain("\n".join(["• " + line if i else line for i, line in enumerate(lines)]))


# --- answers to prompt buttons ------------------------------------------------------------------


def answered_before(notice: AnsweredBefore) -> Message:
    """A click on a prompt someone already answered."""
    who = f" by {mention(notice.by)}" if notice.by else ""
    decision = (notice.resolution or "answered").replace("_", " ")
    return _plain(f"This was already answered{who}: {escape(decision)}.")


def release_pending(notice: ReleasePending) -> Message:
    """A click on a prompt of a manual instance whose release waits for its owner."""
    inst = notice.instance
    who = "you" if notice.by_owner else mention(inst.owner_id)
    return _plain(
        f"*{inst.name}*: release requested; waiting for {who} to confirm it is released on the "
        f"platform (the buttons in my message). To keep it instead: `/gpu extend {inst.name} 2h`."
    )


def being_released(notice: BeingReleased) -> Message:
    """A click on a prompt whose instance is already being released."""
    return _plain(f"*{notice.name}* is already being released ({notice.state}).")


def extend_answered(notice: Extended) -> Message:
    """After Extend 1h / 4h."""
    what = f"Extended {format_duration(timedelta(seconds=notice.extended_s))}"
    tail = ""
    if notice.deadline_at is not None:
        tail = f"; the deadline is now {when(notice.deadline_at, ZoneInfo(notice.tz_name))}"
    return _plain(f"{what}: *{notice.instance.name}*{tail}.")


def release_confirm(notice: ReleaseConfirmAsk) -> Message:
    """Asked after Release now: the confirmation button."""
    text = f"Release *{notice.instance.name}* now? Anything not saved off the instance is lost."
    confirm = button("Yes, release it", RELEASE_CONFIRM, str(notice.prompt_id), style="danger")
    return _with_buttons(text, [confirm], f"release-confirm-{notice.prompt_id}")


def kept(notice: Kept) -> Message:
    """After Keep it."""
    return _plain(f"Kept *{notice.instance.name}*; it will not be released for this.")


def release_answered(notice: ReleaseAnswered) -> Message:
    """After a release from a prompt: released, waiting for the owner, or under way."""
    name = notice.instance.name
    if notice.state == "confirmed":
        return _plain(f"*{name}* is released.")
    if notice.state == "awaiting_owner":
        return _plain(f"Release *{name}* on its platform, then press the button I sent.")
    return _plain(f"Releasing *{name}* ({notice.state}); I will say when the platform confirms.")


def release_refused(notice: ReleaseRefused) -> Message:
    """A release from a prompt that could not be opened, and why."""
    return _plain(notice.reason)


# --- renting ----------------------------------------------------------------------------------


def rent_started(notice: RentStarted) -> Message:
    """The immediate answer to `/gpu rent`."""
    return _plain(
        f":hourglass_flowing_sand: Renting {len(notice.names)} x {escape(notice.instance_type)} "
        f"on {notice.provider} as {escape(', '.join(notice.names))}. I will post here once SSH "
        "answers and the health check ran (usually a few minutes)."
    )


def rent_finished(notice: RentFinished) -> Message:
    """What `/gpu rent` achieved, posted when it is done."""
    lines = []
    if notice.registered:
        lines.append(
            f":white_check_mark: {mention(notice.owner_id)} rented on {notice.provider} and "
            "registered: "
            + ", ".join(f"*{escape(n)}*" for n in notice.registered)
            + ". `/gpu status NAME` shows them."
        )
    for provider_id, why in notice.failed:
        lines.append(
            f":x: {notice.provider} instance {escape(provider_id)} could not be registered and "
            f"was terminated again: {escape(why)}"
        )
    return _plain("\n".join(lines) or f"Nothing was rented on {notice.provider}.")


def rent_failed(notice: RentFailed) -> Message:
    """`/gpu rent` failed as a whole."""
    if notice.error is None:
        return _plain(f":x: Renting on {notice.provider} failed; see the bot's log.")
    return _plain(f":x: Renting on {notice.provider} failed: {escape(notice.error)}")


def rent_given_back_failed(notice: RentGivenBackFailed) -> Message:
    """A rented instance that could not be registered nor terminated: it bills."""
    return _plain(
        f":rotating_light: {notice.provider} instance {escape(notice.provider_id)} was rented "
        f"but could not be registered ({escape(notice.why)}), and terminating it failed: "
        f"{escape(notice.error)}. Terminate it on the platform now; it is billing."
    )


def rent_recovered(notice: RentRecovered) -> Message:
    """A rental never registered (the bot stopped, say) was terminated."""
    launched = notice.launched_at.strftime("%Y-%m-%d %H:%M UTC")
    return _plain(
        f":warning: {_rented(notice.provider, notice.provider_id, notice.name)}, rented with "
        f"/gpu rent at {launched}, was never registered because {escape(notice.reason)}. It has "
        "been terminated so it does not bill. Rent again with /gpu rent if you still need it."
    )


def rent_recover_failed(notice: RentRecoverFailed) -> Message:
    """A rental never registered could not be terminated: it bills."""
    return _plain(
        f":rotating_light: {_rented(notice.provider, notice.provider_id, notice.name)} was "
        f"rented with /gpu rent but never registered ({escape(notice.reason)}), and terminating "
        f"it failed: {escape(notice.error)}. Terminate it on the platform now; it is billing. "
        "The bot keeps trying."
    )


def rent_launch_checked(notice: RentLaunchChecked) -> Message:
    """A launch without an answer, checked: nothing was started."""
    started = notice.started_at.strftime("%Y-%m-%d %H:%M UTC")
    return _plain(
        f":information_source: Your /gpu rent of {escape(notice.instance_type)} on "
        f"{notice.provider} at {started} got no answer from the platform. The bot checked: "
        f"nothing was started under its name {escape(notice.platform_name)}, so nothing "
        "bills. Rent again if you still need it."
    )


# --- parts ------------------------------------------------------------------------------------


def _plain(text: str) -> Message:
    return fallback(text), (section(text),)


def _with_buttons(text: str, buttons: list[Block], block_id: str) -> Message:
    return fallback(text), (section(text), actions(buttons, block_id=block_id))


def _done_buttons(instance_id: int) -> list[Block]:
    return [
        button("Released on the platform", RELEASE_DONE, str(instance_id), style="primary"),
        button("Stopped on the platform (disk kept)", STOP_DONE, str(instance_id)),
    ]


def _decision_text(notice: Decided) -> str:
    if notice.decision == EXTENDED:
        return f"Extended {format_duration(timedelta(seconds=notice.extended_s))}"
    if notice.decision == RELEASE_CANCELLED:
        added = format_duration(timedelta(seconds=notice.extended_s))
        return f"Release request withdrawn: extended {added}"
    what = "Stop requested" if notice.mode == "stop" else "Release requested"
    if notice.decision == RELEASE_REQUESTED and notice.reason and notice.reason != "user":
        return f"{what} ({reason_text(notice.reason)})"
    return {
        RELEASE_REQUESTED: what,
        KEPT: "Kept",
        CONFIRMED_RELEASED: "Confirmed released on the platform",
        CONFIRMED_STOPPED: "Confirmed stopped on the platform",
    }.get(notice.decision, notice.decision)


def _storage_note(inst: InstanceBrief) -> str:
    """What a stopped instance still costs, and how to stop that."""
    release = f"`/gpu release {inst.name}` terminates it, disk and all."
    if inst.storage_micros_per_hour <= 0:
        return f"Its disk may still bill on the platform while it is stopped; {release}"
    cost = format_money(inst.storage_micros_per_hour, inst.currency)
    return f"Its disk keeps billing ({cost}/h) while it is stopped; {release}"


def _rented(provider: str, provider_id: str, name: str | None) -> str:
    what = f"{provider} instance {escape(provider_id)}"
    return what + (f" ({escape(name)})" if name else "")


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], _Callable[[Any], Message]] = {
    DeadlineWarning: deadline_warning,
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
