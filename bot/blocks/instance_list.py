"""Block Kit for `/gpu list`: the caller's own instances in full, then the team in figures
(counts by state, what it costs per hour, the nearest deadlines with owner and time) and, where
asked for, one page of the others' instances, a line each. A pure function of a
:class:`ListView`; within Slack's limits whatever the size of the team.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from bot.blocks import instances as rows
from bot.blocks.kit import (
    Block,
    Message,
    context,
    divider,
    escape,
    fallback,
    fit,
    header,
    mention,
    pack,
    section,
    when,
)
from bot.i18n import N_, nt, t
from bot.services import access
from bot.services.instances.views import DeadlineBrief, FleetSummary, InstanceLine, ListView
from bot.values import format_money

#: The command that registers an instance, as the empty list suggests it.
REGISTER_HINT = "`/gpu register NAME USER@HOST --gpu MODEL --price 2.10/h`"
MINE_TITLE = N_("Your instances")
TEAM_TITLE = N_("The team")
#: Own instances each in a section up to this many; more share sections.
MINE_AS_SECTIONS = 20


def viewer_list(view: ListView) -> Message:
    """`/gpu list`: the caller's instances as stored (the GPUs of their last poll), the team's
    figures and nearest deadlines, and the page of the others' instances when one was asked
    for (with how to ask for the next)."""
    tz = ZoneInfo(view.timezone)
    blocks: list[Block] = [*_mine(view, tz), divider(), *_team(view, tz)]
    if view.paged:
        blocks += _page(view)
    elif view.others_count:
        blocks.append(
            context(
                nt(
                    "{n} more instance is someone else's; `/gpu list --all` lists them a page "
                    "at a time.",
                    "{n} more instances are other people's; `/gpu list --all` lists them a "
                    "page at a time.",
                    view.others_count,
                    n=view.others_count,
                )
            )
        )
    summary = view.summary
    text = t(
        "{title}: {mine} of yours; the team has {count} ({burn}/h together).",
        title=t(rows.LIST_TITLE),
        mine=len(view.mine),
        count=summary.count,
        burn=format_money(summary.burn_micros_per_hour, view.currency),
    )
    note = t("{n} more sections not shown; ask for one instance with `/gpu status NAME`.")
    return fallback(text), fit(blocks, note)


def _mine(view: ListView, tz: ZoneInfo) -> list[Block]:
    mine = view.mine
    title = t("{title} ({count})", title=t(MINE_TITLE), count=len(mine))
    if not mine:
        return [
            header(title),
            section(
                t("You have no instances. Register one with {command}.", command=REGISTER_HINT)
            ),
        ]
    burn = sum(row.instance.burn_micros_per_hour for row in mine)
    spent = sum(row.cost_micros for row in mine)
    summary = t(
        "{burn}/h together · {spent} so far (since registered) · as of {time}",
        burn=format_money(burn, view.currency),
        spent=format_money(spent, view.currency),
        time=when(view.now, tz),
    )
    unknown = sum(1 for row in mine if row.instance.storage_unknown)
    if unknown:
        note = nt(
            "the disk of {n} stopped instance not counted (storage price unknown)",
            "the disks of {n} stopped instances not counted (storage price unknown)",
            unknown,
            n=unknown,
        )
        summary = t("{summary} · {note}", summary=summary, note=note)
    texts = [rows.row_text(row, view.now) for row in mine]
    parts = texts if len(texts) <= MINE_AS_SECTIONS else pack(texts, sep="\n\n")
    return [header(title), context(summary), *(section(part) for part in parts)]


def _team(view: ListView, tz: ZoneInfo) -> list[Block]:
    summary = view.summary
    blocks: list[Block] = [header(t("{title} ({count})", title=t(TEAM_TITLE), count=summary.count))]
    if not summary.count:
        blocks.append(context(t("The team has no instances.")))
        return blocks
    blocks.append(section(_figures(summary, view.currency)))
    if summary.nearest:
        lines = [_deadline_line(item, view.now, tz) for item in summary.nearest]
        title = t("*Nearest deadlines*")
        blocks += [section(part) for part in pack([title, *lines])]
    return blocks


def _figures(summary: FleetSummary, currency: str) -> str:
    states = " · ".join(
        t("{state}: {n}", state=access.state_words(state), n=n) for state, n in summary.by_state
    )
    text = nt(
        "{n} instance, {cost}/h together.",
        "{n} instances, {cost}/h together.",
        summary.count,
        n=summary.count,
        cost=format_money(summary.burn_micros_per_hour, currency),
    )
    if summary.storage_unknown:
        text += " " + nt(
            "Not counted: the disk of {n} stopped instance whose storage price is unknown.",
            "Not counted: the disks of {n} stopped instances whose storage price is unknown.",
            summary.storage_unknown,
            n=summary.storage_unknown,
        )
    return f"{text}\n{states}"


def _deadline_line(item: DeadlineBrief, now: datetime, tz: ZoneInfo) -> str:
    left = rows.deadline_left(item.deadline_at, now, stopped=item.state == "stopped")
    at = when(item.deadline_at, tz)
    return f"*{escape(item.name)}*  ·  {mention(item.owner_id)}  ·  {left} ({at})"


def _page(view: ListView) -> list[Block]:
    if not view.others:
        return [
            context(
                t(
                    "Page {page} of {pages}: nobody else's instances here.",
                    page=view.page,
                    pages=view.pages,
                )
            )
        ]
    lines = [_line(item, view.now) for item in view.others]
    blocks: list[Block] = [section(part) for part in pack(lines)]
    if view.page < view.pages:
        more = t(
            "Page {page} of {pages}; {command} for more.",
            page=view.page,
            pages=view.pages,
            command=f"`/gpu list --all --page {view.page + 1}`",
        )
    else:
        more = t("Page {page} of {pages}.", page=view.page, pages=view.pages)
    blocks.append(context(more))
    return blocks


def _line(item: InstanceLine, now: datetime) -> str:
    """Someone else's instance in one line: name, owner, GPUs, utilisation, time left, rate."""
    stopped = item.state == "stopped"
    if item.mismatch is not None and item.mismatch.delivered_names:
        names = ", ".join(sorted(set(item.mismatch.delivered_names)))
        delivered = f"{len(item.mismatch.delivered_names)}x {escape(names)}"
        rented = f"{item.gpu_count or 1}x {escape(item.gpu_model or '?')}"
        gpus = t(":warning: {delivered} (rented {rented})", delivered=delivered, rented=rented)
    elif item.gpu_model:
        gpus = f"{item.gpu_count or 1}x {escape(item.gpu_model)}"
    else:
        gpus = t("GPUs not stated")
    if stopped:
        util = t("stopped")
    elif item.util_pct is None:
        util = t("utilisation unknown")
    else:
        util = t("utilisation {pct}%", pct=item.util_pct)
    left = rows.deadline_left(item.deadline_at, now, stopped=stopped)
    rate = rows.cost_rate(
        item.burn_micros_per_hour,
        item.currency,
        stopped=stopped,
        storage_unknown=item.storage_unknown,
    )
    facts = [mention(item.owner_id), gpus, util, left, rate]
    return f"*{escape(item.name)}*  ·  " + "  ·  ".join(facts)
