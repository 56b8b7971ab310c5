"""Block Kit for instances: registration, the fleet overview, one instance, health, extend and
release. Pure functions: a view in, ``(text, blocks)`` out, within Slack's limits.

Times arrive as naive UTC and are shown in the view's time zone; money arrives in micro-units.
Words from people and machines (addresses, errors, process names) are escaped for mrkdwn, in
the fallback text as in the blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable as _Callable
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.kit import (
    MAX_BLOCKS,
    SECTION_TEXT_MAX,
    Block,
    Message,
    actions,
    ago,
    button,
    clip,
    code,
    context,
    escape,
    fallback,
    fields,
    fit,
    gib,
    header,
    mention,
    pack,
    section,
    time_left,
    when,
)
from bot.blocks.money import final_cost_sentence
from bot.notify import Notice
from bot.services.lookup import HostKeyAlert
from bot.services.registration import GpuMismatch
from bot.services.views import (
    CheckView,
    FleetOverview,
    GpuView,
    HealthView,
    InstanceDetail,
    InstanceRow,
    InstanceSettings,
    InstanceView,
    JobBrief,
    Mismatch,
    RegisterResult,
    ReleaseAsk,
    ReleaseView,
    SettingsView,
    UnregisteredView,
)
from bot.values import format_duration, format_money

RELEASE_ASK = "instance_release_ask"
RELEASE_CONFIRM = "instance_release_confirm"
STOP_CONFIRM = "instance_stop_confirm"
RELEASE_CANCEL = "instance_release_cancel"
RELEASE_DONE = "instance_release_done"
STOP_DONE = "instance_stop_done"

#: Up to this many instances the overview gives each its own section; beyond, rows share.
ROWS_AS_SECTIONS = MAX_BLOCKS - 4
STATUS_EMOJI = {
    "pass": ":white_check_mark:",
    "warn": ":warning:",
    "fail": ":x:",
    "skip": ":white_circle:",
}
_PROBLEM_TEXT_MAX = 300


# --- registration -----------------------------------------------------------------------------


def register_result(result: RegisterResult) -> Message:
    """The reply to `/gpu register`: what was pinned, delivered and checked; a mismatch loudly."""
    inst = result.instance
    tz = ZoneInfo(result.timezone)
    verb = "Re-registered" if result.re_registered else "Registered"
    text = f"{verb} {inst.name} ({escape(inst.address)})."
    items = [
        f"*Address*\n{escape(inst.address)}",
        f"*GPUs*\n{escape(_delivered(result.gpus) or 'none visible')}",
        f"*Price*\n{_price(inst)}",
        f"*Deadline*\n{_deadline(inst, result.now, tz)}{_defaulted(result)}",
        f"*Health*\n{STATUS_EMOJI.get(result.health.status, '')} {result.health.status}",
        f"*Agent*\n{escape(result.agent_version)}",
    ]
    if result.host_key_fingerprint:
        items.append(f"*Host key (pinned)*\n{code(result.host_key_fingerprint)}")
    if inst.project:
        items.append(f"*Project*\n{escape(inst.project)}")
    blocks: list[Block] = [header(f"{verb} {inst.name}"), fields(items)]
    if result.mismatch is not None:
        blocks.append(section(_mismatch_text(result)))
        text += " The delivered GPUs do not match what was rented!"
    if result.settings is not None:
        blocks.append(section(settings_text(result.settings, tz)))
    bad = [c for c in result.health.checks if c.status in ("fail", "warn")]
    if bad:
        blocks.extend(section(t) for t in pack(_check_lines(bad))[:5])
    blocks.append(
        context(
            f"The meter runs from now. `/gpu status {inst.name}` shows it, "
            f"`/gpu extend {inst.name} 2h` moves the deadline."
        )
    )
    return fallback(text), fit(blocks)


def mismatch_notice(result: RegisterResult) -> Message:
    """The loud notice to the owner and the channel: the delivered GPUs are not what was rented."""
    text = _mismatch_text(result)
    return fallback(text), (section(text),)


def host_key_changed(inst: InstanceView, *, expected: str, presented: str) -> Message:
    """To the owner: the instance showed another host key; the bot refuses it until it is
    registered again."""
    text = (
        f":rotating_light: The host key of *{inst.name}* ({escape(inst.address)}) changed. "
        f"Pinned: {code(expected)}; presented now: {code(presented)}. "
        "The bot refuses to connect to it. If the instance was rebuilt, register it again from "
        f"the same address (`/gpu register {inst.name} {escape(inst.address)} ...`); otherwise "
        "treat this as a possible man-in-the-middle and do not use the instance."
    )
    return fallback(text), (section(text),)


# --- the fleet --------------------------------------------------------------------------------


def fleet_overview(overview: FleetOverview) -> Message:
    """`/gpu status`: one compact section per instance (rows share sections when there are many,
    and the rest is summarised when even that exceeds Slack's 50 blocks)."""
    return _fleet(overview, title="GPU fleet")


def instance_list(overview: FleetOverview) -> Message:
    """`/gpu list`: the instances as stored, with the GPUs of their last poll."""
    return _fleet(overview, title="Instances")


def instance_detail(detail: InstanceDetail) -> Message:
    """`/gpu status NAME`: everything about one instance, with a Release button when active."""
    row = detail.row
    inst = row.instance
    tz = ZoneInfo(detail.timezone)
    provider = inst.provider + (
        f" `{escape(inst.provider_instance_id)}`" if inst.provider_instance_id else ""
    )
    cost = format_money(detail.compute_cost_micros + detail.storage_cost_micros, inst.currency)
    if detail.storage_cost_micros:
        cost += f" (storage {format_money(detail.storage_cost_micros, inst.currency)})"
    items = [
        f"*Owner*\n{mention(inst.owner_id)}",
        f"*State*\n{_state(inst.state)}",
        f"*Address*\n{escape(inst.address)}",
        f"*Provider*\n{provider}",
        f"*Rented*\n{_rented_text(inst, row)}",
        f"*Price*\n{_price(inst)}",
        f"*Deadline*\n{_deadline(inst, detail.now, tz)}",
        f"*Cost since registered*\n{cost}",
        *([f"*Stopped*\n{_stopped(inst, detail.now)}"] if inst.is_stopped else []),
        f"*Host key*\n{_host_key(inst)}",
        f"*Software*\n{escape(_software(detail))}",
    ]
    blocks: list[Block] = [header(f"{inst.name}"), fields(items)]
    blocks.append(section(_live_line(row, detail.now)))
    if detail.settings is not None:
        blocks.append(section(settings_text(detail.settings, tz)))
    if row.gpus:
        lines = [_gpu_line(g) for g in row.gpus]
        blocks.extend(_listing("", lines, "GPUs", code_block=True))
    if row.running_jobs:
        lines = [_job_line(j) for j in row.running_jobs]
        blocks.extend(_listing("*Running jobs*", lines, "jobs"))
    if detail.processes:
        lines = [
            f"GPU {p.gpu_index} · pid {p.pid} · {escape(clip(p.user or '?', 32))} · "
            f"{gib(p.used_mem_bytes)} GiB · {escape(clip(p.command or '?', 80))}"
            for p in detail.processes
        ]
        blocks.extend(_listing("*Processes on the GPUs*", lines, "processes"))
    if inst.state == "active" or inst.is_stopped:
        blocks.append(
            actions(
                [button("Release…", RELEASE_ASK, str(inst.id), style="danger")],
                block_id=f"instance-{inst.id}",
            )
        )
    left = time_left(inst.deadline_at, detail.now)
    text = f"{inst.name}: {_state(inst.state)}, {escape(_plain_live(row))}, {left}."
    return fallback(text), fit(blocks)


def instance_settings(view: InstanceSettings) -> Message:
    """`/gpu policy NAME` without options: the deadline and every setting, and how to change
    them."""
    tz = ZoneInfo(view.timezone)
    inst = view.instance
    text = (
        f"*{inst.name}*: deadline {_deadline(inst, view.now, tz)}\n"
        f"{settings_text(view.settings, tz)}"
    )
    hint = (
        f"`/gpu policy {inst.name} --at-deadline ... --idle-release ... --release-when-done ...` "
        f"changes the policy, `/gpu cap {inst.name} 3d` (admins) the lifetime cap; billing, disk "
        f"and storage come from `/gpu register`."
    )
    return fallback(text), (section(text), context(hint))


def settings_text(settings: SettingsView, tz: ZoneInfo) -> str:
    """An instance's settings as a short list (policy, idle, when done, cap, billing, disk)."""
    grace = format_duration(timedelta(seconds=settings.max_grace_s))
    if settings.at_deadline == "wait-for-jobs":
        at_deadline = f"wait for running jobs, at most {grace}"
    elif settings.at_deadline == "stop":
        at_deadline = f"stop (disk kept and billed), released {grace} after the deadline"
    else:
        at_deadline = "release"
    if settings.idle_release_after_s:
        after = format_duration(timedelta(seconds=settings.idle_release_after_s))
        idle = f"released {after} after the idle prompt"
    else:
        idle = "prompt only"
    cap = when(settings.lifetime_cap_at, tz) if settings.lifetime_cap_at else "none"
    minimum = (
        format_duration(timedelta(seconds=settings.min_charge_s))
        if settings.min_charge_s
        else "none"
    )
    lines = [
        "*Settings*",
        f"• at the deadline: {at_deadline}",
        f"• idle: {idle}",
        f"• when its jobs are done: {'released' if settings.release_when_done else 'kept'}",
        f"• lifetime cap: {cap}",
        f"• billing: per {escape(settings.billing_increment)}, minimum charge {minimum}",
        f"• disk: {_disk(settings)}",
    ]
    return "\n".join(lines)


def health_report(view: HealthView) -> Message:
    """`/gpu health NAME [--full]`: every check, pass/warn/fail/skip, with its hint."""
    inst = view.instance
    kind = "Full health check" if view.full else "Health check"
    title = f"{kind} of {inst.name}: {view.status.upper()}"
    blocks: list[Block] = [header(title)]
    blocks.extend(section(t) for t in pack(_check_lines(view.checks)))
    if not view.full:
        blocks.append(
            context(f"`/gpu health {inst.name} --full` also runs the CUDA checks in its Python.")
        )
    counts = Counter(c.status for c in view.checks)
    summary = ", ".join(f"{counts[s]} {s}" for s in ("fail", "warn", "pass", "skip") if counts[s])
    return fallback(f"{escape(title)} ({summary or 'no checks'})."), fit(blocks)


# --- changes ----------------------------------------------------------------------------------


def extended(inst: InstanceView, *, now: datetime, timezone: str) -> Message:
    """After `/gpu extend`: the new deadline, and the lifetime limit when there is one."""
    tz = ZoneInfo(timezone)
    text = (
        f":hourglass_flowing_sand: The deadline of *{inst.name}* is now {_deadline(inst, now, tz)}."
    )
    if inst.lifetime_cap_at is not None:
        text += f" An admin limited its lifetime to {when(inst.lifetime_cap_at, tz)}."
    return fallback(text), (section(text),)


def release_ask(ask: ReleaseAsk) -> Message:
    """Before a release (or a stop): what it cost and what runs, with Yes / Cancel buttons."""
    inst = ask.instance
    stop = ask.mode == "stop"
    verb = "Stop" if stop else "Release"
    now_costs = inst.burn_micros_per_hour
    lines = [
        f"{verb} *{inst.name}* ({escape(inst.address)})? It has cost "
        f"{format_money(ask.cost_micros, inst.currency)} so far"
        + (f" and costs {format_money(now_costs, inst.currency)}/h." if now_costs else ".")
    ]
    if ask.running_jobs:
        lines.append(
            f":warning: {len(ask.running_jobs)} job(s) still running; they will be lost:\n"
            + "\n".join(_job_line(j) for j in ask.running_jobs[:10])
        )
    if ask.manual:
        lines.append(
            f"The bot cannot {verb.lower()} it itself: after you confirm, do it on its platform "
            "and press *Released on the platform* or *Stopped on the platform*; the meter "
            "stops then."
        )
    elif stop:
        lines.append(f"The bot will stop it on {escape(inst.provider)}.")
    else:
        lines.append(f"The bot will terminate it on {escape(inst.provider)}.")
    if stop:
        lines.append(_kept_disk(inst))
    else:
        lines.append("Anything not saved off the instance is lost.")
    text = "\n".join(lines)
    confirm = STOP_CONFIRM if stop else RELEASE_CONFIRM
    buttons = [
        button(f"Yes, {verb.lower()} {inst.name}", confirm, str(inst.id), style="danger"),
        button("Cancel", RELEASE_CANCEL, str(inst.id)),
    ]
    return fallback(text), (section(text), actions(buttons, block_id=f"release-ask-{inst.id}"))


def release_result(view: ReleaseView) -> Message:
    """After the release (or stop) was confirmed: where it stands."""
    inst = view.instance
    stop = view.mode == "stop"
    if view.state == "confirmed" and stop:
        text = (
            f":white_check_mark: *{inst.name}* is stopped. Its compute meter stopped. "
            + _kept_disk(inst)
        )
    elif view.state == "confirmed":
        text = f":white_check_mark: *{inst.name}* is released. The meter stopped."
    if view.state == "confirmed":
        text += final_cost_sentence(view.final_cost, stopped=stop)
    elif view.state == "awaiting_owner" or (view.manual and view.state != "escalated"):
        verb = "Stop" if stop else "Release"
        text = (
            f":hourglass: {verb} *{inst.name}* on its platform now, then press "
            "*Released on the platform* (or *Stopped on the platform*) in the direct message "
            f"the bot sent to {mention(inst.owner_id)}; the meter runs until then."
        )
    elif view.state == "escalated":
        error = f" Last error: {escape(view.last_error)}" if view.last_error else ""
        text = (
            f":warning: Releasing *{inst.name}* keeps failing; the bot keeps trying and told the "
            f"channel.{error}"
        )
    else:
        error = f" (last attempt: {escape(view.last_error)})" if view.last_error else ""
        text = (
            f":hourglass: Release of *{inst.name}* requested; waiting for "
            f"{escape(inst.provider)} to confirm it{error}."
        )
    return fallback(text), (section(text),)


def release_cancelled(inst: InstanceView) -> Message:
    """The release question answered with Cancel: nothing changed."""
    text = f"Release of *{inst.name}* cancelled; nothing changed."
    return fallback(text), (section(text),)


# --- platform accounts ------------------------------------------------------------------------


def unregistered_notice(view: UnregisteredView) -> Message:
    """For the ops channel: an instance the platform account holds that nobody registered, so
    nobody is reminded of it; what it costs, how long it runs, whose it may be, and how to take
    it over."""
    tz = ZoneInfo(view.timezone)
    what = f"`{escape(clip(view.provider_id, 100))}`"
    if view.name:
        what += f" ({escape(clip(view.name, 80))})"
    gpus = f"{view.gpu_count or 1}x {view.gpu_model}" if view.gpu_model else "GPUs not stated"
    if view.price_micros_per_hour is None:
        cost = "its price is not reported"
    else:
        cost = f"costs {format_money(view.price_micros_per_hour, view.currency)}/h"
    if view.launched_at is None:
        age = "running since it was started"
    else:
        ran = format_duration(max(view.now - view.launched_at, timedelta(0)))
        age = f"running for {ran} (since {when(view.launched_at, tz)})"
    state = escape(view.raw_state or view.state)
    lines = [
        f":warning: *{escape(view.provider)}* instance {what} is {state} on the team's account, "
        f"but nobody registered it: {escape(gpus)}, {cost}, {age}.",
    ]
    if view.tags:
        shown = ", ".join(f"{escape(clip(k, 40))}={escape(clip(v, 80))}" for k, v in view.tags[:10])
        lines.append(f"Tags: {shown}")
    lines.append(
        f"Take it over with `/gpu adopt {escape(view.provider)} "
        f"{escape(clip(view.provider_id, 100))} NAME` (reminders and a deadline then apply), or "
        "release it on the platform if nobody needs it."
    )
    text = "\n".join(lines)
    return fallback(text), (section(text),)


# --- helpers ----------------------------------------------------------------------------------


def _fleet(overview: FleetOverview, *, title: str) -> Message:
    rows = overview.rows
    if not rows:
        text = (
            "No instances yet. Register one with "
            "`/gpu register NAME USER@HOST --gpu MODEL --price 2.10/h`."
        )
        return text, (section(text),)
    tz = ZoneInfo(overview.timezone)
    currency = rows[0].instance.currency
    burn = format_money(overview.hourly_burn_micros, currency)
    spent = format_money(overview.cost_micros, currency)
    down = sum(1 for r in rows if r.problem is not None)
    summary = f"{len(rows)} instance(s) · {burn}/h together · {spent} so far (since registered)"
    if down:
        summary += f" · {down} not reachable"
    blocks: list[Block] = [
        header(f"{title} ({len(rows)})"),
        context(f"{summary} · as of {when(overview.now, tz)}"),
    ]
    texts = [_row_text(r, overview.now) for r in rows]
    if len(rows) <= ROWS_AS_SECTIONS:
        blocks.extend(section(t) for t in texts)
    else:
        blocks.extend(section(t) for t in pack(texts, sep="\n\n"))
    note = "{n} more sections not shown; ask for one instance with `/gpu status NAME`."
    return fallback(f"{title}: {summary}."), fit(blocks, note)


def _listing(
    title: str, lines: Sequence[str], what: str, *, code_block: bool = False
) -> list[Block]:
    """A titled section of as many lines as fit, and a context saying how many did not."""
    wrap = 6 if code_block else 0
    room = SECTION_TEXT_MAX - len(title) - 1 - wrap
    first = pack(lines, room)[0]
    shown = first.count("\n") + 1
    body = f"```{first}```" if code_block else first
    blocks = [section(f"{title}\n{body}" if title else body)]
    if shown < len(lines):
        blocks.append(context(f"… and {len(lines) - shown} more {what}."))
    return blocks


def _row_text(row: InstanceRow, now: datetime) -> str:
    inst = row.instance
    first = f"*{inst.name}* · {mention(inst.owner_id)} · {_rented_text(inst, row)} · {_price(inst)}"
    if inst.state != "active":
        first += f" · _{_state(inst.state)}_"
    second = f":zzz: {_stopped(inst, now)}" if inst.is_stopped else None
    lines = [first, second or _live_line(row, now)]
    spent = format_money(row.cost_micros, inst.currency)
    left = "no deadline while stopped" if inst.is_stopped else time_left(inst.deadline_at, now)
    third = f":hourglass_flowing_sand: {left} · {spent} so far (since registered)"
    if row.running_jobs:
        job = row.running_jobs[0]
        more = f" (+{len(row.running_jobs) - 1})" if len(row.running_jobs) > 1 else ""
        third += f" · :gear: {code(clip(job.command, 60))} by {mention(job.requested_by)}{more}"
    lines.append(third)
    return "\n".join(lines)


def _live_line(row: InstanceRow, now: datetime) -> str:
    parts: list[str] = []
    if row.problem is not None:
        message = escape(clip(row.problem.message, _PROBLEM_TEXT_MAX))
        hint = f" {escape(clip(row.problem.hint, _PROBLEM_TEXT_MAX))}" if row.problem.hint else ""
        parts.append(f":red_circle: *{row.problem.kind}*: {message}{hint}")
    if row.nvml_problem:
        parts.append(
            f":warning: GPUs not readable: {escape(clip(row.nvml_problem, _PROBLEM_TEXT_MAX))}"
        )
    stale = "" if row.live or row.polled_at is None else f" (as of {ago(row.polled_at, now)})"
    dot = ":large_green_circle:" if row.live else ":white_circle:"
    if row.gpus:
        parts.append(f"{dot} {_gpu_summary(row.gpus)}{stale}")
    elif row.problem is None and not row.nvml_problem:
        seen = row.live or row.polled_at is not None
        parts.append(f"{dot} no GPUs{stale}" if seen else f"{dot} not polled yet")
    return "\n".join(parts)


def _gpu_summary(gpus: Sequence[GpuView]) -> str:
    utils = [g.util_pct for g in gpus if g.util_pct is not None]
    used = sum(g.mem_used_bytes or 0 for g in gpus)
    total = sum(g.mem_total_bytes or 0 for g in gpus)
    util = f"util {sum(utils) / len(utils):.0f}%" if utils else "util ?"
    if len(gpus) > 1 and utils:
        each = ", ".join("?" if g.util_pct is None else f"{g.util_pct}%" for g in gpus)
        util += f" (per GPU {each})"
    return f"{util} · mem {gib(used)}/{gib(total)} GiB"


def _gpu_line(g: GpuView) -> str:
    util = "?" if g.util_pct is None else f"{g.util_pct}%"
    temp = "" if g.temp_c is None else f"  {g.temp_c}°C"
    power = "" if g.power_w is None else f"  {g.power_w:.0f} W"
    mem = f"mem {gib(g.mem_used_bytes)}/{gib(g.mem_total_bytes)} GiB"
    return f"{g.index}  {escape(clip(g.name, 40))}  util {util}  {mem}{temp}{power}"


def _job_line(job: JobBrief) -> str:
    return f"• job {job.id} {code(clip(job.command, 80))} by {mention(job.requested_by)}"


def _check_lines(checks: Sequence[CheckView]) -> list[str]:
    lines = []
    for check in checks:
        emoji = STATUS_EMOJI.get(check.status, "")
        line = f"{emoji} *{escape(check.id)}*: {escape(clip(check.summary, 500))}"
        if check.hint and check.status != "pass":
            line += f"\n      _{escape(clip(check.hint, 500))}_"
        lines.append(line)
    return lines


def _mismatch_text(result: RegisterResult) -> str:
    inst = result.instance
    rented = _rented(inst)
    problems = "\n".join(
        f"• {escape(p)}" for p in (result.mismatch.problems if result.mismatch else ())
    )
    return (
        f":rotating_light: *GPU mismatch on {inst.name}* ({mention(inst.owner_id)}): rented "
        f"{escape(rented)}, delivered {escape(_delivered(result.gpus) or 'no visible GPU')}.\n"
        f"{problems}\nAsk the platform for the GPUs you pay for (or a refund) before using it."
    )


def _delivered(gpus: Sequence[GpuView]) -> str:
    counts = Counter(g.name for g in gpus)
    return ", ".join(f"{n}x {name}" for name, n in counts.most_common())


def _rented_text(inst: InstanceView, row: InstanceRow) -> str:
    """What was rented, escaped; while the last poll's GPUs differ, what was delivered too."""
    if row.mismatch is None:
        return escape(_rented(inst))
    return ":warning: " + escape(_rented_vs_delivered(inst, row.mismatch, row.gpus))


def _rented_vs_delivered(inst: InstanceView, mismatch: Mismatch, gpus: Sequence[GpuView]) -> str:
    delivered = _delivered(gpus) or ", ".join(mismatch.delivered_names) or "no visible GPU"
    return f"rented {_rented(inst)}, delivered {delivered}"


def _defaulted(result: RegisterResult) -> str:
    """After the deadline of a registration that gave none: that it is the default."""
    if result.default_deadline_s is None:
        return ""
    return " (the default; `--release-in` or `--release-at` to choose)"


def _disk(settings: SettingsView) -> str:
    if settings.disk_gb is None:
        return "not given"
    size = f"{settings.disk_gb:g} GB"
    if not settings.storage_micros_per_gb_month:
        return f"{size}, no storage price"
    price = format_money(settings.storage_micros_per_gb_month, settings.currency)
    return f"{size} at {price}/GB-month"


def _rented(inst: InstanceView) -> str:
    if inst.gpu_model:
        return f"{inst.gpu_count or 1}x {inst.gpu_model}"
    if inst.delivered_gpu_count:
        return f"{inst.delivered_gpu_count}x {inst.delivered_gpu_name or 'GPU'}"
    return "GPUs not stated"


def _price(inst: InstanceView) -> str:
    if inst.price_micros_per_hour == 0:
        return "no price"
    return f"{format_money(inst.price_micros_per_hour, inst.currency)}/h"


def _stopped(inst: InstanceView, now: datetime) -> str:
    """Since when a stopped instance is stopped and what its disk still costs."""
    since = f"stopped {ago(inst.stopped_at, now)}" if inst.stopped_at else "stopped"
    if inst.storage_micros_per_hour <= 0:
        return f"{since}; no storage price recorded (its disk may still bill on the platform)"
    return f"{since}; storage {format_money(inst.storage_micros_per_hour, inst.currency)}/h"


def _kept_disk(inst: InstanceView) -> str:
    if inst.storage_micros_per_hour > 0:
        cost = f" ({format_money(inst.storage_micros_per_hour, inst.currency)}/h)"
    else:
        cost = ""
    return (
        f"Its disk is kept and keeps billing{cost} while it is stopped; "
        f"`/gpu release {inst.name}` terminates it, disk and all."
    )


def _deadline(inst: InstanceView, now: datetime, tz: ZoneInfo) -> str:
    if inst.deadline_at is None:
        return "none"
    return f"{when(inst.deadline_at, tz)} ({time_left(inst.deadline_at, now)})"


def _host_key(inst: InstanceView) -> str:
    if inst.host_key_fingerprint:
        return code(inst.host_key_fingerprint)
    return "none (this machine)" if inst.is_local else "not pinned"


def _state(state: str) -> str:
    return state.replace("_", " ")


def _software(detail: InstanceDetail) -> str:
    parts = []
    if detail.row.instance.agent_version:
        parts.append(f"agent {detail.row.instance.agent_version}")
    if detail.driver_version:
        parts.append(f"driver {detail.driver_version}")
    if detail.cuda_version:
        parts.append(f"CUDA {detail.cuda_version}")
    return ", ".join(parts) or "unknown"


def _plain_live(row: InstanceRow) -> str:
    if row.problem is not None:
        return f"{row.problem.kind}: {row.problem.message}"
    if row.gpus:
        return _gpu_summary(row.gpus)
    return "no GPU data"


def _gpu_mismatch(notice: GpuMismatch) -> Message:
    """The notice of a registration whose GPUs are not what was rented."""
    return mismatch_notice(notice.result)


def _host_key_alert(notice: HostKeyAlert) -> Message:
    """The alert to the owner of an instance that presented another host key."""
    return host_key_changed(notice.instance, expected=notice.expected, presented=notice.presented)


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], _Callable[[Any], Message]] = {
    GpuMismatch: _gpu_mismatch,
    HostKeyAlert: _host_key_alert,
}
