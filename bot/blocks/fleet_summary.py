"""The team's fleet in figures, as the message the bot keeps pinned in an ops group: how many
instances by state, what they cost per hour together, and the nearest deadlines with owner and
time. A pure function of a :class:`FleetSummary`; it changes only when the fleet does (no
"updated at" line), so an unchanged fleet needs no update of the message.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from bot.blocks import instances as rows
from bot.blocks.kit import Block, Message, context, escape, fallback, header, mention, pack, section
from bot.blocks.kit import when as when_text
from bot.i18n import N_, nt, t
from bot.services import access
from bot.services.instances.views import FleetSummary
from bot.values import format_money

TITLE = N_("The team's fleet")


def pinned_summary(summary: FleetSummary, *, currency: str, timezone: str) -> Message:
    """The pinned message of ``summary`` (money in micro-units of ``currency``, times shown in
    ``timezone``)."""
    blocks: list[Block] = [header(t(TITLE))]
    if not summary.count:
        blocks.append(context(t("The team has no instances.")))
        return fallback(t(TITLE)), tuple(blocks)
    figures = nt(
        "{n} instance, {cost}/h together.",
        "{n} instances, {cost}/h together.",
        summary.count,
        n=summary.count,
        cost=format_money(summary.burn_micros_per_hour, currency),
    )
    states = " · ".join(
        t("{state}: {n}", state=access.state_words(state), n=n) for state, n in summary.by_state
    )
    blocks.append(section(f"{figures}\n{states}"))
    if summary.nearest:
        tz = ZoneInfo(timezone)
        lines = [
            "  ·  ".join(
                (
                    f"*{escape(item.name)}*",
                    mention(item.owner_id),
                    rows.deadline_left(
                        item.deadline_at, summary.now, stopped=item.state == "stopped"
                    )
                    + f" ({when_text(item.deadline_at, tz)})",
                )
            )
            for item in summary.nearest
        ]
        blocks += [section(part) for part in pack([t("*Nearest deadlines*"), *lines])]
    return fallback(f"{t(TITLE)}: {figures}"), tuple(blocks)
