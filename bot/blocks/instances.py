"""Block Kit for instances: registration, the fleet overview, one instance, health, extend and
release. Pure functions: a view in, ``(text, blocks)`` out, within Slack's limits.

Times arrive as naive UTC and are shown in the view's time zone; money arrives in micro-units.
Words from people and machines (addresses, errors, process names) are escaped for mrkdwn, in
the fallback text as in the blocks.

Why one module of this size: these are the views of bot.services.instances.views, and the
registration, overview, detail, health and release messages share its row, GPU, deadline and
cost phrases. The notices of the instances services that have words of their own live in the
module named after their service (bot.blocks.deadlines, .releases, .reconcile, .answers, .rent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable as _Callable
from collections.abc import Mapping, Sequence
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
    confirm_dialog,
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
from bot.blocks.money import final_cost_sentence, unverified_rule
from bot.i18n import N_, nt, placeholders, t
from bot.notify import Notice
from bot.providers.names import platform_name
from bot.services import access
from bot.services.instances.lookup import HostKeyAlert
from bot.services.instances.registration import GpuMismatch
from bot.services.instances.starts import StartResult
from bot.services.instances.views import (
    STORAGE_HINT,
    CheckView,
    FleetOverview,
    GpuView,
    HealthView,
    InstanceBrief,
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
)
from bot.services.speaking import agent_text, nvml_words
from bot.values import format_duration, format_money, format_rate

RELEASE_ASK = "instance_release_ask"
RELEASE_CONFIRM = "instance_release_confirm"
#: Start a stopped instance on its platform (value: the instance id).
START_INSTANCE = "instance_start"
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
#: What a health status is called (translated where shown).
STATUS_NAMES = {"pass": N_("pass"), "warn": N_("warn"), "fail": N_("fail"), "skip": N_("skip")}
#: How many checks had a status, for a health summary (``{n}`` the count).
STATUS_COUNTS = {
    "fail": N_("{n} fail"),
    "warn": N_("{n} warn"),
    "pass": N_("{n} pass"),
    "skip": N_("{n} skip"),
}
#: The unit an instance is billed by (translated where shown; others as stored).
INCREMENT_NAMES = {"second": N_("second"), "minute": N_("minute"), "hour": N_("hour")}
FLEET_TITLE = N_("GPU fleet")
LIST_TITLE = N_("Instances")
MORE_GPUS = N_("… and {n} more GPUs.")
MORE_JOBS = N_("… and {n} more jobs.")
MORE_PROCESSES = N_("… and {n} more processes.")
_PROBLEM_TEXT_MAX = 300
#: The agent's nvml check's summary when NVML fails (agents/checks/gpu.py).
NVML_FAILED = "NVML failed ({code}): {message}"
#: What a row calls the error that kept its live data away (ProblemView.kind, the class name).
PROBLEM_KINDS: dict[str, str] = {
    "Unreachable": N_("Unreachable"),
    "CommandTimeout": N_("Timed out"),
    "AuthenticationFailed": N_("Login refused"),
    "HostKeyChanged": N_("Host key changed"),
    "HostKeyNotPinned": N_("Host key not pinned"),
    "AgentMissing": N_("Agent missing"),
    "AgentBroken": N_("Agent broken"),
    "LocalRefused": N_("Refused locally"),
    "OutputTooLarge": N_("Output too large"),
    "FleetError": N_("Fleet error"),
}


def problem_kind(kind: str) -> str:
    """The error class ``kind`` as the reader's language names it (the class name where it has
    no name of its own)."""
    name = PROBLEM_KINDS.get(kind)
    return t(name) if name else kind


# --- registration -----------------------------------------------------------------------------


def register_result(result: RegisterResult) -> Message:
    """The reply to `/gpu register`: what was pinned, delivered and checked; a mismatch loudly."""
    inst = result.instance
    tz = ZoneInfo(result.timezone)
    address = escape(inst.address)
    if result.re_registered:
        text = t("Re-registered {name} ({address}).", name=inst.name, address=address)
        title = t("Re-registered {name}", name=inst.name)
    else:
        text = t("Registered {name} ({address}).", name=inst.name, address=address)
        title = t("Registered {name}", name=inst.name)
    status = result.health.status
    delivered = _delivered(result.gpus) or t("none visible")
    items = [
        t("*Address*\n{value}", value=address),
        t("*GPUs*\n{value}", value=escape(delivered)),
        t("*Price*\n{value}", value=_price(inst)),
        _deadline_field(result, tz),
        t(
            "*Health*\n{emoji} {status}",
            emoji=STATUS_EMOJI.get(status, ""),
            status=_status_name(status),
        ),
        t("*Agent*\n{value}", value=escape(result.agent_version)),
    ]
    if result.host_key_fingerprint:
        items.append(t("*Host key (pinned)*\n{value}", value=code(result.host_key_fingerprint)))
    if inst.project:
        items.append(t("*Project*\n{value}", value=escape(inst.project)))
    blocks: list[Block] = [header(title), fields(items)]
    if result.mismatch is not None:
        blocks.append(section(_mismatch_text(result)))
        text += " " + t("The delivered GPUs do not match what was rented!")
    if result.settings is not None:
        blocks.append(section(settings_text(result.settings, tz)))
    bad = [c for c in result.health.checks if c.status in ("fail", "warn")]
    if bad:
        blocks.extend(section(part) for part in pack(_check_lines(bad))[:5])
    blocks.append(
        context(
            t(
                "The meter runs from now. `/gpu status {name}` shows it, "
                "`/gpu extend {name} 2h` moves the deadline.",
                name=inst.name,
            )
        )
    )
    return fallback(text), fit(blocks, _more_not_shown())


def mismatch_notice(result: RegisterResult) -> Message:
    """The loud notice to the owner and the channel: the delivered GPUs are not what was rented."""
    text = _mismatch_text(result)
    return fallback(text), (section(text),)


def host_key_changed(inst: InstanceView, *, expected: str, presented: str) -> Message:
    """To the owner: the instance showed another host key; the bot refuses it until it is
    registered again."""
    text = t(
        ":rotating_light: The host key of *{name}* ({address}) changed. "
        "Pinned: {pinned}; presented now: {presented}. "
        "The bot refuses to connect to it. If the instance was rebuilt, register it again from "
        "the same address (`/gpu register {name} {address} ...`); otherwise "
        "treat this as a possible man-in-the-middle and do not use the instance.",
        name=inst.name,
        address=escape(inst.address),
        pinned=code(expected),
        presented=code(presented),
    )
    return fallback(text), (section(text),)


# --- the fleet --------------------------------------------------------------------------------


def fleet_overview(overview: FleetOverview) -> Message:
    """`/gpu status`: one compact section per instance (rows share sections when there are many,
    and the rest is summarised when even that exceeds Slack's 50 blocks)."""
    return _fleet(overview, title=t(FLEET_TITLE))


def instance_list(overview: FleetOverview) -> Message:
    """`/gpu list`: the instances as stored, with the GPUs of their last poll."""
    return _fleet(overview, title=t(LIST_TITLE))


def instance_detail(detail: InstanceDetail) -> Message:
    """`/gpu status NAME`: everything about one instance, with a Release button when active."""
    row = detail.row
    inst = row.instance
    tz = ZoneInfo(detail.timezone)
    provider = escape(platform_name(inst.provider)) + (
        f" `{escape(inst.provider_instance_id)}`" if inst.provider_instance_id else ""
    )
    cost = format_money(detail.compute_cost_micros + detail.storage_cost_micros, inst.currency)
    if detail.storage_cost_micros:
        storage = format_money(detail.storage_cost_micros, inst.currency)
        cost = t("{cost} (storage {storage})", cost=cost, storage=storage)
    items = [
        t("*Owner*\n{value}", value=mention(inst.owner_id)),
        t("*State*\n{value}", value=_state(inst.state)),
        t("*Address*\n{value}", value=escape(inst.address)),
        t("*Provider*\n{value}", value=provider),
        t("*Rented*\n{value}", value=_rented_text(inst, row)),
        t("*Price*\n{value}", value=_price(inst)),
        t("*Deadline*\n{value}", value=_deadline(inst, detail.now, tz)),
        t("*Cost since registered*\n{value}", value=cost),
        *([t("*Stopped*\n{value}", value=_stopped(inst, detail.now))] if inst.is_stopped else []),
        t("*Host key*\n{value}", value=_host_key(inst)),
        t("*Software*\n{value}", value=escape(_software(detail))),
    ]
    blocks: list[Block] = [header(f"{inst.name}"), fields(items)]
    blocks.append(section(_live_line(row, detail.now)))
    if detail.settings is not None:
        blocks.append(section(settings_text(detail.settings, tz)))
    if row.gpus:
        lines = [_gpu_line(g) for g in row.gpus]
        blocks.extend(_listing("", lines, MORE_GPUS, code_block=True))
    if row.running_jobs:
        lines = [_job_line(j) for j in row.running_jobs]
        blocks.extend(_listing(t("*Running jobs*"), lines, MORE_JOBS))
    if detail.processes:
        lines = [
            t(
                "GPU {gpu} · pid {pid} · {user} · {memory} GiB · {command}",
                gpu=p.gpu_index,
                pid=p.pid,
                user=escape(clip(p.user or "?", 32)),
                memory=gib(p.used_mem_bytes),
                command=escape(clip(p.command or "?", 80)),
            )
            for p in detail.processes
        ]
        blocks.extend(_listing(t("*Processes on the GPUs*"), lines, MORE_PROCESSES))
    if inst.is_stopped:
        blocks.append(stopped_buttons(inst, inst.id, can_start=detail.can_start))
    elif inst.state == "active":
        blocks.append(
            actions(
                [button(t("Release…"), RELEASE_ASK, str(inst.id), style="danger")],
                block_id=f"instance-{inst.id}",
            )
        )
    text = t(
        "{name}: {state}, {live}, {left}.",
        name=inst.name,
        state=_state(inst.state),
        live=escape(_plain_live(row)),
        left=deadline_left(inst.deadline_at, detail.now, stopped=inst.is_stopped),
    )
    return fallback(text), fit(blocks, _more_not_shown())


def instance_settings(view: InstanceSettings) -> Message:
    """`/gpu policy NAME` without options: the deadline and every setting, and how to change
    them."""
    tz = ZoneInfo(view.timezone)
    inst = view.instance
    text = t(
        "*{name}*: deadline {deadline}\n{settings}",
        name=inst.name,
        deadline=_deadline(inst, view.now, tz),
        settings=settings_text(view.settings, tz),
    )
    hint = t(
        "`/gpu policy {name} --at-deadline ... --idle-release ... --release-when-done ...` "
        "changes the policy, `/gpu cap {name} 3d` (admins) the lifetime cap; billing, disk "
        "and storage come from `/gpu register`.",
        name=inst.name,
    )
    return fallback(text), (section(text), context(hint))


def settings_text(settings: SettingsView, tz: ZoneInfo) -> str:
    """An instance's settings as a short list (policy, idle, when done, cap, billing, disk)."""
    grace = format_duration(timedelta(seconds=settings.max_grace_s))
    if settings.at_deadline == "wait-for-jobs":
        at_deadline = t("wait for running jobs, at most {grace}", grace=grace)
    elif settings.at_deadline == "stop":
        at_deadline = t(
            "stop (disk kept and billed), released {grace} after the deadline", grace=grace
        )
    else:
        at_deadline = t("release")
    if settings.idle_release_after_s:
        after = format_duration(timedelta(seconds=settings.idle_release_after_s))
        idle = t("released {after} after the idle prompt", after=after)
    else:
        idle = t("prompt only")
    cap = when(settings.lifetime_cap_at, tz) if settings.lifetime_cap_at else t("none")
    minimum = (
        format_duration(timedelta(seconds=settings.min_charge_s))
        if settings.min_charge_s
        else t("none")
    )
    increment = settings.billing_increment
    unit = t(INCREMENT_NAMES[increment]) if increment in INCREMENT_NAMES else escape(increment)
    lines = [
        t("*Settings*"),
        t("• at the deadline: {policy}", policy=at_deadline),
        t("• idle: {idle}", idle=idle),
        t("• when its jobs are done: released")
        if settings.release_when_done
        else t("• when its jobs are done: kept"),
        t("• lifetime cap: {cap}", cap=cap),
        t("• billing: per {unit}, minimum charge {minimum}", unit=unit, minimum=minimum)
        + unverified_rule(settings.unverified_increment),
        t("• disk: {disk}", disk=_disk(settings)),
    ]
    return "\n".join(lines)


def health_report(view: HealthView) -> Message:
    """`/gpu health NAME [--full]`: every check, pass/warn/fail/skip, with its hint."""
    inst = view.instance
    status = _status_name(view.status).upper()
    if view.full:
        title = t("Full health check of {name}: {status}", name=inst.name, status=status)
    else:
        title = t("Health check of {name}: {status}", name=inst.name, status=status)
    blocks: list[Block] = [header(title)]
    blocks.extend(section(part) for part in pack(_check_lines(view.checks)))
    if not view.full:
        blocks.append(
            context(
                t(
                    "`/gpu health {name} --full` also runs the CUDA checks in its Python.",
                    name=inst.name,
                )
            )
        )
    counts = Counter(c.status for c in view.checks)
    summary = _listed(
        [t(STATUS_COUNTS[s], n=counts[s]) for s in ("fail", "warn", "pass", "skip") if counts[s]]
    )
    text = t("{title} ({summary}).", title=escape(title), summary=summary or t("no checks"))
    return fallback(text), fit(blocks, _more_not_shown())


# --- changes ----------------------------------------------------------------------------------


def extended(inst: InstanceView, *, now: datetime, timezone: str) -> Message:
    """After `/gpu extend`: the new deadline, and the lifetime limit when there is one."""
    tz = ZoneInfo(timezone)
    text = t(
        ":hourglass_flowing_sand: The deadline of *{name}* is now {deadline}.",
        name=inst.name,
        deadline=_deadline(inst, now, tz),
    )
    if inst.lifetime_cap_at is not None:
        cap = when(inst.lifetime_cap_at, tz)
        text += " " + t("An admin limited its lifetime to {cap}.", cap=cap)
    return fallback(text), (section(text),)


def release_ask(ask: ReleaseAsk) -> Message:
    """Before a release (or a stop): what it cost and what runs, with Yes / Cancel buttons; the
    Yes button asks once more in a confirm dialog that names the instance and its cost."""
    inst = ask.instance
    stop = ask.mode == "stop"
    lines = [_release_question(ask)]
    if ask.running_jobs:
        lines.append(
            t(
                ":warning: {count} job(s) still running; they will be lost:\n{jobs}",
                count=len(ask.running_jobs),
                jobs="\n".join(_job_line(j) for j in ask.running_jobs[:10]),
            )
        )
    provider = escape(platform_name(inst.provider))
    if ask.manual and stop:
        lines.append(
            t(
                "The bot cannot stop it itself: after you confirm, do it on its platform "
                "and press *Released on the platform* or *Stopped on the platform*; the meter "
                "stops then."
            )
        )
    elif ask.manual:
        lines.append(
            t(
                "The bot cannot release it itself: after you confirm, do it on its platform "
                "and press *Released on the platform* or *Stopped on the platform*; the meter "
                "stops then."
            )
        )
    elif stop:
        lines.append(t("The bot will stop it on {provider}.", provider=provider))
    else:
        lines.append(t("The bot will terminate it on {provider}.", provider=provider))
    if stop:
        lines.append(_kept_disk(inst))
    else:
        lines.append(t("Anything not saved off the instance is lost."))
    text = "\n".join(lines)
    if stop:
        confirm = button(
            t("Yes, stop {name}", name=inst.name),
            STOP_CONFIRM,
            str(inst.id),
            style="danger",
            confirm=_stop_dialog(ask),
        )
    else:
        confirm = button(
            t("Yes, release {name}", name=inst.name),
            RELEASE_CONFIRM,
            str(inst.id),
            style="danger",
            confirm=_release_dialog(ask),
        )
    buttons = [confirm, button(t("Cancel"), RELEASE_CANCEL, str(inst.id))]
    return fallback(text), (section(text), actions(buttons, block_id=f"release-ask-{inst.id}"))


def release_result(view: ReleaseView) -> Message:
    """After the release (or stop) was confirmed: where it stands."""
    inst = view.instance
    stop = view.mode == "stop"
    if view.state == "confirmed" and stop:
        text = (
            t(
                ":white_check_mark: *{name}* is stopped. Its compute meter stopped.",
                name=inst.name,
            )
            + " "
            + _kept_disk(inst)
        )
    elif view.state == "confirmed":
        text = t(":white_check_mark: *{name}* is released. The meter stopped.", name=inst.name)
    if view.state == "confirmed":
        text += final_cost_sentence(view.final_cost, stopped=stop)
    elif view.state == "awaiting_owner" or (view.manual and view.state != "escalated"):
        text = _awaiting_owner_text(inst, stop=stop)
    elif view.state == "escalated" and view.last_error:
        text = t(
            ":warning: Releasing *{name}* keeps failing; the bot keeps trying and told the "
            "channel. Last error: {error}",
            name=inst.name,
            error=escape(view.last_error),
        )
    elif view.state == "escalated":
        text = t(
            ":warning: Releasing *{name}* keeps failing; the bot keeps trying and told the "
            "channel.",
            name=inst.name,
        )
    elif view.last_error:
        text = t(
            ":hourglass: Release of *{name}* requested; waiting for {provider} to confirm it "
            "(last attempt: {error}).",
            name=inst.name,
            provider=escape(platform_name(inst.provider)),
            error=escape(view.last_error),
        )
    else:
        text = t(
            ":hourglass: Release of *{name}* requested; waiting for {provider} to confirm it.",
            name=inst.name,
            provider=escape(platform_name(inst.provider)),
        )
    return fallback(text), (section(text),)


def release_cancelled(inst: InstanceView) -> Message:
    """The release question answered with Cancel: nothing changed."""
    text = t("Release of *{name}* cancelled; nothing changed.", name=inst.name)
    return fallback(text), (section(text),)


# --- helpers ----------------------------------------------------------------------------------


def _fleet(overview: FleetOverview, *, title: str) -> Message:
    rows = overview.rows
    if not rows:
        text = t(
            "No instances yet. Register one with "
            "`/gpu register NAME USER@HOST --gpu MODEL --price 2.10/h`."
        )
        return text, (section(text),)
    tz = ZoneInfo(overview.timezone)
    currency = rows[0].instance.currency
    summary = t(
        "{count} instance(s) · {burn}/h together · {spent} so far (since registered)",
        count=len(rows),
        burn=format_money(overview.hourly_burn_micros, currency),
        spent=format_money(overview.cost_micros, currency),
    )
    unknown = sum(1 for r in rows if r.instance.storage_unknown)
    if unknown:
        summary = t(
            "{summary} · {note}",
            summary=summary,
            note=nt(
                "the disk of {n} stopped instance not counted (storage price unknown)",
                "the disks of {n} stopped instances not counted (storage price unknown)",
                unknown,
                n=unknown,
            ),
        )
    down = sum(1 for r in rows if r.problem is not None)
    if down:
        summary = t("{summary} · {count} not reachable", summary=summary, count=down)
    blocks: list[Block] = [
        header(t("{title} ({count})", title=title, count=len(rows))),
        context(t("{summary} · as of {time}", summary=summary, time=when(overview.now, tz))),
    ]
    texts = [_row_text(r, overview.now) for r in rows]
    if len(rows) <= ROWS_AS_SECTIONS:
        blocks.extend(section(part) for part in texts)
    else:
        blocks.extend(section(part) for part in pack(texts, sep="\n\n"))
    note = t("{n} more sections not shown; ask for one instance with `/gpu status NAME`.")
    return fallback(t("{title}: {summary}.", title=title, summary=summary)), fit(blocks, note)


def _more_not_shown() -> str:
    """The note of :func:`fit` (``{n}`` left for it to fill)."""
    return t("{n} more not shown.")


def _listing(
    title: str, lines: Sequence[str], more: str, *, code_block: bool = False
) -> list[Block]:
    """A titled section of as many lines as fit, and a context saying how many did not
    (``more`` a marked sentence with ``{n}``)."""
    wrap = 6 if code_block else 0
    room = SECTION_TEXT_MAX - len(title) - 1 - wrap
    first = pack(lines, room)[0]
    shown = first.count("\n") + 1
    body = f"```{first}```" if code_block else first
    blocks = [section(f"{title}\n{body}" if title else body)]
    if shown < len(lines):
        blocks.append(context(t(more, n=len(lines) - shown)))
    return blocks


def _listed(items: Sequence[str]) -> str:
    """Items joined as a list in the active language (``a, b, c``)."""
    if not items:
        return ""
    joined = items[0]
    for item in items[1:]:
        joined = t("{first}, {second}", first=joined, second=item)
    return joined


def row_text(row: InstanceRow, now: datetime) -> str:
    """One instance as the overview shows it: who, what, GPUs, time left, cost so far, job."""
    return _row_text(row, now)


def _row_text(row: InstanceRow, now: datetime) -> str:
    inst = row.instance
    first = f"*{inst.name}* · {mention(inst.owner_id)} · {_rented_text(inst, row)} · {_price(inst)}"
    if inst.state not in ("active", "stopped"):
        first += f" · _{_state(inst.state)}_"
    second = f":zzz: {_stopped(inst, now)}" if inst.is_stopped else None
    lines = [first, second or _live_line(row, now)]
    spent = format_money(row.cost_micros, inst.currency)
    left = deadline_left(inst.deadline_at, now, stopped=inst.is_stopped)
    third = t(
        ":hourglass_flowing_sand: {left} · {spent} so far (since registered)",
        left=left,
        spent=spent,
    )
    if row.running_jobs:
        job = row.running_jobs[0]
        more = f" (+{len(row.running_jobs) - 1})" if len(row.running_jobs) > 1 else ""
        running = t(
            ":gear: {command} by {user}",
            command=code(clip(job.command, 60)),
            user=mention(job.requested_by),
        )
        third += f" · {running}{more}"
    lines.append(third)
    return "\n".join(lines)


def _live_line(row: InstanceRow, now: datetime) -> str:
    parts: list[str] = []
    if row.problem is not None:
        message = escape(clip(row.problem.message, _PROBLEM_TEXT_MAX))
        hint = f" {escape(clip(row.problem.hint, _PROBLEM_TEXT_MAX))}" if row.problem.hint else ""
        # A kind the bot names is bold; any other is the fleet's own word, shown as it is.
        known = row.problem.kind in PROBLEM_KINDS
        kind = f"*{problem_kind(row.problem.kind)}*" if known else escape(row.problem.kind)
        parts.append(f":red_circle: {kind}: {message}{hint}")
    if row.nvml_problem:
        problem = escape(nvml_words.described(row.nvml_code or "unknown", row.nvml_problem))
        parts.append(t(":warning: GPUs not readable: {problem}", problem=problem))
    stale = not row.live and row.polled_at is not None
    dot = ":large_green_circle:" if row.live else ":white_circle:"
    if row.gpus:
        summary = _gpu_summary(row.gpus)
        if stale and row.polled_at is not None:
            ago_text = ago(row.polled_at, now)
            parts.append(t("{dot} {gpus} (as of {ago})", dot=dot, gpus=summary, ago=ago_text))
        else:
            parts.append(f"{dot} {summary}")
    elif row.problem is None and not row.nvml_problem:
        if stale and row.polled_at is not None:
            parts.append(t("{dot} no GPUs (as of {ago})", dot=dot, ago=ago(row.polled_at, now)))
        elif row.live:
            parts.append(t("{dot} no GPUs", dot=dot))
        else:
            parts.append(t("{dot} not polled yet", dot=dot))
    return "\n".join(parts)


def _gpu_summary(gpus: Sequence[GpuView]) -> str:
    utils = [g.util_pct for g in gpus if g.util_pct is not None]
    used = sum(g.mem_used_bytes or 0 for g in gpus)
    total = sum(g.mem_total_bytes or 0 for g in gpus)
    util = t("util {value}", value=f"{sum(utils) / len(utils):.0f}%" if utils else "?")
    if len(gpus) > 1 and utils:
        each = ", ".join("?" if g.util_pct is None else f"{g.util_pct}%" for g in gpus)
        util = t("{util} (per GPU {each})", util=util, each=each)
    return t("{util} · mem {used}/{total} GiB", util=util, used=gib(used), total=gib(total))


def _gpu_line(g: GpuView) -> str:
    return t(
        "{index}  {name}  util {util}  mem {used}/{total} GiB{temperature}{power}",
        index=g.index,
        name=escape(clip(g.name, 40)),
        util="?" if g.util_pct is None else f"{g.util_pct}%",
        used=gib(g.mem_used_bytes),
        total=gib(g.mem_total_bytes),
        temperature="" if g.temp_c is None else f"  {g.temp_c}°C",
        power="" if g.power_w is None else f"  {g.power_w:.0f} W",
    )


def _job_line(job: JobBrief) -> str:
    return t(
        "• job {id} {command} by {user}",
        id=job.id,
        command=code(clip(job.command, 80)),
        user=mention(job.requested_by),
    )


def _check_lines(checks: Sequence[CheckView]) -> list[str]:
    lines = []
    for check in checks:
        emoji = STATUS_EMOJI.get(check.status, "")
        summary = _nvml_failed(check) or _finding(check, hint=False)
        line = f"{emoji} *{escape(check.id)}*: {escape(clip(summary, 500))}"
        if check.hint and check.status != "pass":
            hint = nvml_words.hint(_finding(check, hint=True))
            line += f"\n      _{escape(clip(hint, 500))}_"
        lines.append(line)
    return lines


def _nvml_failed(check: CheckView) -> str | None:
    """The agent's "NVML failed ({code}): {message}" as the kind of error in words, with the
    driver's message as a code-formatted detail; None for any other finding."""
    params = check.summary_params
    if check.summary_template != NVML_FAILED or "code" not in params:
        return None
    problem = nvml_words.described(params["code"], params.get("message", ""))
    return t("NVML failed: {problem}", problem=problem)


def _finding(check: CheckView, *, hint: bool) -> str:
    """A check's summary (or hint) in the reader's language: from its parts when the agent
    sent parts, else from its template."""
    if hint:
        if check.hint_parts:
            return agent_text.parts(check.hint, check.hint_parts, sentences=True)
        return finding(check.hint, check.hint_template, check.hint_params)
    if check.summary_parts:
        return agent_text.parts(check.summary, check.summary_parts, sentences=False)
    return finding(check.summary, check.summary_template, check.summary_params)


def finding(english: str, template: str | None, params: Mapping[str, str]) -> str:
    """An agent's finding in the reader's language: the catalogue's text for its template,
    filled with the parameters as sent. The English as sent when there is no template (an
    old agent), the catalogue does not know it (English, or a newer agent), or the
    parameters do not fit it."""
    if not template:
        return english
    translated = t(template)
    if translated == template:
        return english
    wanted = placeholders(translated)
    if not wanted <= params.keys():
        return english
    return translated.format(**{name: str(params[name]) for name in wanted})


def _status_name(status: str) -> str:
    """A health status as the reader calls it (unknown ones as they are)."""
    return t(STATUS_NAMES[status]) if status in STATUS_NAMES else status


def _deadline_field(result: RegisterResult, tz: ZoneInfo) -> str:
    """The deadline of a registration; that it is the default when the command gave none."""
    deadline = _deadline(result.instance, result.now, tz)
    if result.default_deadline_s is None:
        return t("*Deadline*\n{value}", value=deadline)
    return t(
        "*Deadline*\n{value} (the default; `--release-in` or `--release-at` to choose)",
        value=deadline,
    )


def _mismatch_text(result: RegisterResult) -> str:
    inst = result.instance
    problems = "\n".join(
        f"• {escape(p)}" for p in (result.mismatch.problems if result.mismatch else ())
    )
    return t(
        ":rotating_light: *GPU mismatch on {name}* ({owner}): rented {rented}, delivered "
        "{delivered}.\n{problems}\nAsk the platform for the GPUs you pay for (or a refund) "
        "before using it.",
        name=inst.name,
        owner=mention(inst.owner_id),
        rented=escape(_rented(inst)),
        delivered=escape(_delivered(result.gpus) or t("no visible GPU")),
        problems=problems,
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
    delivered = _delivered(gpus) or ", ".join(mismatch.delivered_names) or t("no visible GPU")
    return t("rented {rented}, delivered {delivered}", rented=_rented(inst), delivered=delivered)


def _disk(settings: SettingsView) -> str:
    if settings.disk_gb is None:
        return t("not given")
    size = f"{settings.disk_gb:g}"
    if not settings.storage_micros_per_gb_month:
        return t("{size} GB, no storage price", size=size)
    price = format_money(settings.storage_micros_per_gb_month, settings.currency)
    return t("{size} GB at {price}/GB-month", size=size, price=price)


def _rented(inst: InstanceView) -> str:
    if inst.gpu_model:
        return f"{inst.gpu_count or 1}x {inst.gpu_model}"
    if inst.delivered_gpu_count:
        return f"{inst.delivered_gpu_count}x {inst.delivered_gpu_name or 'GPU'}"
    return t("GPUs not stated")


def _price(inst: InstanceView) -> str:
    return cost_rate(
        inst.burn_micros_per_hour,
        inst.currency,
        stopped=inst.is_stopped,
        storage_unknown=inst.storage_unknown,
    )


def cost_rate(rate_micros: int, currency: str, *, stopped: bool, storage_unknown: bool) -> str:
    """What an instance costs per hour now, in the same words on every surface: its price, or
    for a stopped one its disk's (``stopped: disk $0.10/h``)."""
    if stopped:
        if storage_unknown:
            return t("stopped: disk price unknown")
        return t("stopped: disk {price}/h", price=format_money(rate_micros, currency))
    if rate_micros <= 0:
        return t("no price")
    return format_rate(rate_micros, currency)


def deadline_left(deadline_at: datetime | None, now: datetime, *, stopped: bool) -> str:
    """What is left before the deadline, in the same words on every surface; for a stopped
    instance, when its kept disk is released (it has no compute deadline)."""
    if not stopped:
        return time_left(deadline_at, now)
    if deadline_at is None:
        return t("kept until released")
    if deadline_at > now:
        return t("disk released in {duration}", duration=format_duration(deadline_at - now))
    return t("disk release due")


def _stopped(inst: InstanceView, now: datetime) -> str:
    """Since when a stopped instance is stopped and what its disk still costs."""
    if inst.storage_micros_per_hour <= 0:
        if inst.stopped_at is None:
            unknown = t(
                "stopped; no storage price recorded (its disk may still bill on the platform)"
            )
        else:
            unknown = t(
                "stopped {ago}; no storage price recorded (its disk may still bill on the "
                "platform)",
                ago=ago(inst.stopped_at, now),
            )
        return t("{status}. {hint}", status=unknown, hint=t(STORAGE_HINT, name=inst.name))
    storage = format_money(inst.storage_micros_per_hour, inst.currency)
    if inst.stopped_at is None:
        return t("stopped; storage {price}/h", price=storage)
    return t("stopped {ago}; storage {price}/h", ago=ago(inst.stopped_at, now), price=storage)


def _kept_disk(inst: InstanceView) -> str:
    if inst.storage_micros_per_hour > 0:
        return t(
            "Its disk is kept and keeps billing ({price}/h) while it is stopped; "
            "`/gpu release {name}` terminates it, disk and all.",
            price=format_money(inst.storage_micros_per_hour, inst.currency),
            name=inst.name,
        )
    unknown = t(
        "Its disk is kept and keeps billing while it is stopped; "
        "`/gpu release {name}` terminates it, disk and all.",
        name=inst.name,
    )
    hint = t(STORAGE_HINT, name=inst.name)
    return unknown + hint if unknown.endswith("。") else f"{unknown} {hint}"


def _release_question(ask: ReleaseAsk) -> str:
    """The first line of a release (or stop) question: the instance and what it costs."""
    inst = ask.instance
    values = {
        "name": inst.name,
        "address": escape(inst.address),
        "cost": format_money(ask.cost_micros, inst.currency),
        "rate": format_money(inst.burn_micros_per_hour, inst.currency),
    }
    stop = ask.mode == "stop"
    if stop and inst.burn_micros_per_hour:
        return t(
            "Stop *{name}* ({address})? It has cost {cost} so far and costs {rate}/h.", **values
        )
    if stop:
        return t("Stop *{name}* ({address})? It has cost {cost} so far.", **values)
    if inst.burn_micros_per_hour:
        return t(
            "Release *{name}* ({address})? It has cost {cost} so far and costs {rate}/h.",
            **values,
        )
    return t("Release *{name}* ({address})? It has cost {cost} so far.", **values)


def _release_dialog(ask: ReleaseAsk) -> Block:
    """The confirm dialog of the Yes button of a release: the instance, what it cost, what its
    release frees."""
    inst = ask.instance
    cost = format_money(ask.cost_micros, inst.currency)
    if inst.burn_micros_per_hour:
        text = t(
            "Releasing *{name}* ends its {rate}/h; anything not saved off it is lost. "
            "It has cost {cost} so far.",
            name=inst.name,
            rate=format_money(inst.burn_micros_per_hour, inst.currency),
            cost=cost,
        )
    else:
        text = t(
            "Releasing *{name}* loses anything not saved off it. It has cost {cost} so far.",
            name=inst.name,
            cost=cost,
        )
    return confirm_dialog(
        t("Release {name}?", name=inst.name),
        text,
        confirm=t("Yes, release it"),
    )


def _stop_dialog(ask: ReleaseAsk) -> Block:
    """The confirm dialog of the Yes button of a stop: the instance, what it cost, and that its
    disk keeps billing."""
    inst = ask.instance
    cost = format_money(ask.cost_micros, inst.currency)
    if inst.storage_micros_per_hour > 0:
        text = t(
            "Stopping *{name}* ends its compute billing; its disk is kept and keeps billing "
            "({storage}/h). "
            "It has cost {cost} so far.",
            name=inst.name,
            storage=format_money(inst.storage_micros_per_hour, inst.currency),
            cost=cost,
        )
    else:
        text = t(
            "Stopping *{name}* ends its compute billing; its disk is kept and keeps billing. "
            "It has cost {cost} so far.",
            name=inst.name,
            cost=cost,
        )
    return confirm_dialog(
        t("Stop {name}?", name=inst.name),
        text,
        confirm=t("Yes, stop it"),
    )


def _awaiting_owner_text(inst: InstanceView, *, stop: bool) -> str:
    """A manual platform's release (or stop): the owner does it and presses the button."""
    if stop:
        return t(
            ":hourglass: Stop *{name}* on its platform now, then press "
            "*Released on the platform* (or *Stopped on the platform*) in the direct message "
            "the bot sent to {owner}; the meter runs until then.",
            name=inst.name,
            owner=mention(inst.owner_id),
        )
    return t(
        ":hourglass: Release *{name}* on its platform now, then press "
        "*Released on the platform* (or *Stopped on the platform*) in the direct message "
        "the bot sent to {owner}; the meter runs until then.",
        name=inst.name,
        owner=mention(inst.owner_id),
    )


def _deadline(inst: InstanceView, now: datetime, tz: ZoneInfo) -> str:
    left = deadline_left(inst.deadline_at, now, stopped=inst.is_stopped)
    if inst.deadline_at is None:
        return left if inst.is_stopped else t("none")
    return t("{time} ({left})", time=when(inst.deadline_at, tz), left=left)


def _host_key(inst: InstanceView) -> str:
    if inst.host_key_fingerprint:
        return code(inst.host_key_fingerprint)
    return t("none (this machine)") if inst.is_local else t("not pinned")


def _state(state: str) -> str:
    return access.state_words(state)


def _software(detail: InstanceDetail) -> str:
    parts = []
    if detail.row.instance.agent_version:
        parts.append(t("agent {version}", version=detail.row.instance.agent_version))
    if detail.driver_version:
        parts.append(t("driver {version}", version=detail.driver_version))
    if detail.cuda_version:
        parts.append(f"CUDA {detail.cuda_version}")
    return _listed(parts) or t("unknown")


def _plain_live(row: InstanceRow) -> str:
    if row.problem is not None:
        return f"{problem_kind(row.problem.kind)}: {row.problem.message}"
    if row.gpus:
        return _gpu_summary(row.gpus)
    return t("no GPU data")


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


def stopped_buttons(
    inst: InstanceView | InstanceBrief, instance_id: int, *, can_start: bool
) -> Block:
    """What a stopped instance offers: Start (where the bot can start it on its platform) and
    Release (terminate, disk and all), each asking first; never Extend (it has no compute
    deadline)."""
    name = escape(inst.name)
    release = button(
        t("Release"),
        RELEASE_CONFIRM,
        str(instance_id),
        style="danger",
        confirm=confirm_dialog(
            t("Release {name}?", name=inst.name),
            t("*{name}* is terminated on its platform, its disk and data with it.", name=name),
            confirm=t("Yes, release it"),
        ),
    )
    if not can_start:
        return actions([release], block_id=f"stopped-{instance_id}")
    start = button(
        t("Start"),
        START_INSTANCE,
        str(instance_id),
        style="primary",
        confirm=confirm_dialog(
            t("Start {name}?", name=inst.name),
            t(
                "*{name}* runs again on its platform: its compute bills again ({price}/h) and it "
                "gets a new deadline.",
                name=name,
                price=format_money(inst.price_micros_per_hour, inst.currency),
            ),
            confirm=t("Yes, start it"),
        ),
    )
    return actions([start, release], block_id=f"stopped-{instance_id}")


def start_result(result: StartResult) -> Message:
    """After the Start button: running again (its new deadline said), or still starting."""
    inst = result.instance
    if result.started:
        text = t(
            ":arrow_forward: *{name}* runs again; its meter runs from now ({price}/h).",
            name=escape(inst.name),
            price=format_money(inst.price_micros_per_hour, inst.currency),
        )
    else:
        text = t(
            ":hourglass_flowing_sand: {provider} is starting *{name}* ({state}); the bot records "
            "the start, and its new deadline, once it runs.",
            provider=escape(platform_name(inst.provider)),
            name=escape(inst.name),
            state=escape(result.platform_state),
        )
    return fallback(text), (section(text),)
