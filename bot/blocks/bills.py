"""`/gpu bills` and the ops channel's bill flags in words and Block Kit.

Money is written with :func:`bot.values.format_money` in each line's own currency; a platform's
bill age with :func:`bot.blocks.kit.ago`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from bot.blocks.kit import (
    SECTION_TEXT_MAX,
    ago,
    clip,
    code,
    context,
    escape,
    fallback,
    header,
    month_name,
    pack,
    section,
)
from bot.i18n import N_, nt, t
from bot.notify import Block, Message, Notice
from bot.providers.names import platform_list, platform_name
from bot.services.money.bills import (
    DISCOUNT,
    INCREMENT,
    MINIMUM,
    NOT_BILLED,
    START,
    STORAGE,
    UNEXPLAINED,
    UNREGISTERED,
    BillLine,
    BillMismatch,
    BillsReport,
    PlatformBills,
)
from bot.services.money.digest import BillsDigest, PlatformBillTotals
from bot.values import format_money

#: Blocks kept for the platforms' lines, so the message stays within Slack's 50.
MAX_LINE_SECTIONS = 40

#: What each likely cause means, as the flags and the report say it.
CAUSE_WORDS: dict[str, str] = {
    INCREMENT: N_("the billing increment (the platform rounds the time to another increment)"),
    MINIMUM: N_("a minimum charge (the platform bills a minimum that gpubot did not)"),
    STORAGE: N_("storage (the compute agrees, the storage does not)"),
    START: N_("the start time (the platform started billing at another time than gpubot)"),
    DISCOUNT: N_("a discount (the platform billed less: night, holiday or promotional rates)"),
    UNREGISTERED: N_("never registered (the platform billed an instance gpubot never saw)"),
    NOT_BILLED: N_("not billed (the platform billed nothing for an instance gpubot charged)"),
    UNEXPLAINED: N_("not explained by the increment, a minimum, storage or the start time"),
}


def bills_message(report: BillsReport) -> Message:
    """`/gpu bills`: each platform's bill beside gpubot's charges, with its age; the platforms
    that publish no bill named in a sentence each."""
    month = month_name(report.month)
    title = t("Platform bills against gpubot, {month} (UTC)", month=month)
    blocks: list[Block] = [header(title)]
    texts: list[str] = []
    flagged = 0
    for platform in report.platforms:
        lines = [_platform_heading(platform, report)]
        lines.extend(_line(line) for line in platform.lines)
        if platform.fetched_at is not None and not platform.lines:
            lines.append(t("Nothing billed on either side in {month}.", month=month))
        flagged += sum(1 for line in platform.lines if line.flagged)
        texts.extend(pack(lines))
    blocks.extend(section(text) for text in texts[:MAX_LINE_SECTIONS])
    if len(texts) > MAX_LINE_SECTIONS:
        blocks.append(context(t("More lines than one message holds were left out.")))
    if not report.platforms:
        blocks.append(section(t("No platform gpubot uses publishes a per-instance bill.")))
    for name in report.unreadable:
        blocks.append(
            context(
                t(
                    "{provider} publishes no per-instance bill gpubot can read.",
                    provider=escape(platform_name(name)),
                )
            )
        )
    summary = (
        nt(
            "{n} difference past one cent or 1 % is flagged.",
            "{n} differences past one cent or 1 % are flagged.",
            flagged,
            n=flagged,
        )
        if flagged
        else t("No difference past one cent or 1 %.")
    )
    return fallback(t("{title}: {summary}", title=title, summary=summary)), tuple(blocks)


def mismatch_message(notice: BillMismatch) -> Message:
    """The ops channel's flag for one instance whose bill differs from gpubot's."""
    line = notice.line
    money = _figures(line)
    text = t(
        ":warning: {provider} billed {instance} {platform} in {month}; gpubot counted {bot}, "
        "a difference of {difference}. Likely cause: {cause}.",
        provider=escape(platform_name(line.provider)),
        instance=_instance(line),
        platform=money["platform"],
        month=month_name(notice.month),
        bot=money["bot"],
        difference=money["difference"],
        cause=t(CAUSE_WORDS.get(line.cause or UNEXPLAINED, CAUSE_WORDS[UNEXPLAINED])),
    )
    note = t(
        "Compared over the days the platform's bill covers whole; `/gpu bills` shows every "
        "instance."
    )
    return fallback(text), (section(clip(text, SECTION_TEXT_MAX)), context(note))


def _platform_heading(platform: PlatformBills, report: BillsReport) -> str:
    name = f"*{escape(platform_name(platform.provider))}*"
    if platform.fetched_at is None:
        if platform.error:
            return t(
                "{provider}: not read yet; the last try failed: {error}",
                provider=name,
                error=escape(platform.error),
            )
        return t("{provider}: not read yet (the clock reads it within the hour)", provider=name)
    age = ago(platform.fetched_at, report.now)
    if platform.error:
        return t(
            "{provider}: the last read failed ({error}); these bills were fetched {age}",
            provider=name,
            error=escape(platform.error),
            age=age,
        )
    return t("{provider}: fetched {age}", provider=name, age=age)


def _line(line: BillLine) -> str:
    money = _figures(line)
    words = t(
        "• {instance}: gpubot {bot}, platform {platform}, difference {difference}",
        instance=_instance(line),
        bot=money["bot"],
        platform=money["platform"],
        difference=money["difference"],
    )
    if line.flagged:
        cause = t(CAUSE_WORDS.get(line.cause or UNEXPLAINED, CAUSE_WORDS[UNEXPLAINED]))
        words += "\n    " + t(":warning: likely cause: {cause}", cause=cause)
    return words


def _instance(line: BillLine) -> str:
    if line.name is None:
        return t("{id} (never registered)", id=code(line.provider_instance_id))
    return f"*{escape(line.name)}* ({code(line.provider_instance_id)})"


def _figures(line: BillLine) -> dict[str, str]:
    """gpubot's side, the platform's side (compute and storage apart where split) and the
    difference, as money in the line's currency."""
    currency = line.currency

    def money(micros: int) -> str:
        return format_money(micros, currency)

    if line.bot_total_micros is None:
        bot = t("nothing (never registered)")
    elif line.bot_storage_micros:
        bot = t(
            "{total} (compute {compute}, storage {storage})",
            total=money(line.bot_total_micros),
            compute=money(line.bot_compute_micros or 0),
            storage=money(line.bot_storage_micros),
        )
    else:
        bot = money(line.bot_total_micros)
    if line.platform_total_micros is None:
        platform = t("nothing billed")
    elif line.platform_storage_micros is not None:
        platform = t(
            "{total} (compute {compute}, storage {storage})",
            total=money(line.platform_total_micros),
            compute=money(line.platform_compute_micros or 0),
            storage=money(line.platform_storage_micros),
        )
    else:
        platform = money(line.platform_total_micros)
    difference = money(line.difference_micros)
    if line.difference_micros > 0:
        difference = "+" + difference
    return {"bot": bot, "platform": platform, "difference": difference}


def digest_section(section_data: BillsDigest) -> str:
    """The monthly digest's section against the platforms' bills, compact: per platform the
    totals of `/gpu bills MONTH` (gpubot, the platform, the difference) with the bill's age,
    how many instances are flagged and the largest with its likely cause; the platforms that
    publish no per-instance bill in one line."""
    lines = [
        t(
            "*Against the platforms' bills* ({month}, UTC; `/gpu bills {key}` lists each instance)",
            month=month_name(section_data.month),
            key=section_data.month,
        )
    ]
    for totals in section_data.platforms:
        lines.extend(_digest_platform(totals, section_data))
    names = section_data.unreadable
    if names:
        lines.append(
            nt(
                "{names} publishes no per-instance bill gpubot can read.",
                "{names} publish no per-instance bill gpubot can read.",
                len(names),
                names=escape(platform_list(names)),
            )
        )
    return clip("\n".join(lines), SECTION_TEXT_MAX)


def _digest_platform(totals: PlatformBillTotals, section_data: BillsDigest) -> list[str]:
    name = f"*{escape(platform_name(totals.provider))}*"
    if totals.fetched_at is None:
        if totals.error:
            return [
                t(
                    "• {provider}: not read yet; the last try failed: {error}",
                    provider=name,
                    error=escape(clip(totals.error, 300)),
                )
            ]
        return [t("• {provider}: not read yet", provider=name)]

    def money(micros: int) -> str:
        return format_money(micros, totals.currency)

    difference = money(totals.difference_micros)
    if totals.difference_micros > 0:
        difference = "+" + difference
    read = t("bills fetched {age}", age=ago(totals.fetched_at, section_data.now))
    covered = _covered(totals, section_data.month)
    if covered:
        read = t("{read}, covering {days}", read=read, days=covered)
    if totals.error:
        read = t(
            "{read}; the last read failed: {error}",
            read=read,
            error=escape(clip(totals.error, 300)),
        )
    first = t(
        "• {provider}: gpubot {bot}, platform {platform}, difference {difference} ({read})",
        provider=name,
        bot=money(totals.bot_micros),
        platform=money(totals.platform_micros),
        difference=difference,
        read=read,
    )
    largest = totals.largest
    if largest is None:
        second = nt(
            "no difference past one cent or 1 % over {n} instance",
            "no difference past one cent or 1 % over {n} instances",
            totals.instances,
            n=totals.instances,
        )
        return [first, "    " + second]
    largest_difference = money(largest.difference_micros)
    if largest.difference_micros > 0:
        largest_difference = "+" + largest_difference
    second = nt(
        ":warning: {flagged} of {n} instance flagged; the largest: {instance} {difference}, "
        "likely {cause}",
        ":warning: {flagged} of {n} instances flagged; the largest: {instance} {difference}, "
        "likely {cause}",
        totals.instances,
        flagged=totals.flagged,
        n=totals.instances,
        instance=_instance(largest),
        difference=largest_difference,
        cause=t(CAUSE_WORDS.get(largest.cause or UNEXPLAINED, CAUSE_WORDS[UNEXPLAINED])),
    )
    return [first, "    " + second]


def _covered(totals: PlatformBillTotals, month: str) -> str | None:
    """The days of ``month`` the bill covers (``2026-11-17 to 2026-11-30``) when not all of
    them; None when it covers the whole month or says nothing of its days."""
    start, end = totals.covered_from, totals.covered_to
    if start is None or end is None:
        return None
    year, number = (int(part) for part in month.split("-"))
    month_start = datetime(year, number, 1)
    month_end = datetime(year + number // 12, number % 12 + 1, 1)
    first, last = max(start, month_start), min(end, month_end)
    if first <= month_start and last >= month_end:
        return None
    if last <= first:
        return t("none of its days")
    return t(
        "{first} to {last}",
        first=first.date().isoformat(),
        last=(last - timedelta(days=1)).date().isoformat(),
    )


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    BillMismatch: mismatch_message,
}
