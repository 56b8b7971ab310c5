"""Block Kit for money: spend reports, the monthly digest, budgets, `/gpu fit` and
`/gpu estimate`. Pure functions, values in, (fallback text, blocks) out; amounts in micro-units.
Names people chose (projects, instances, GPU models) are escaped for mrkdwn, in the fallback text
as in the blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from bot import charts
from bot.blocks.kit import SECTION_TEXT_MAX, clip, code, context, escape, header, section
from bot.notify import Block, FileAttachment, Message, Notice
from bot.services.advice import (
    HOURS_IN_LONGEST_MONTH,
    EstimateReport,
    FitReport,
    GpuFit,
    Option,
)
from bot.services.budgets import BudgetAlert, BudgetStatus
from bot.services.costs import FinalCost
from bot.services.digest import Digest, DigestData
from bot.services.spend import SpendLine, SpendReport
from bot.values import format_duration, format_money

TOP_GROUPS = 10
TOP_INSTANCES = 5
TOP_FITS = 12
#: The most characters of a job's command the digest shows.
COMMAND_MAX = 80
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

#: The most GPUs one rented machine has (HGX/DGX boards); more means a multi-node job.
GPUS_PER_MACHINE = 8

#: Nothing measures network traffic, so reports say what they leave out.
EGRESS_NOTE = (
    "Data transfer (egress) is not metered: where a platform charges for it, it is on the "
    "platform's invoice only."
)


def month_name(month: str) -> str:
    """``2026-03`` as ``March 2026``."""
    year, number = month.split("-")
    return f"{_MONTHS[int(number) - 1]} {year}"


def spend_file_titles(report: SpendReport) -> tuple[str, str]:
    """The titles of the files shared with `/gpu spend`: the chart's and the CSV's."""
    name = month_name(report.month)
    return f"GPU spend by {report.by}, {name}", f"GPU spend per instance, {name}"


def spend_message(report: SpendReport, *, shared: bool = False) -> Message:
    """`/gpu spend`: totals, idle cost, the groups asked for and the top instances. The current
    month is this month so far, to ``report.now``; ``shared`` says the chart and the CSV are
    posted to the channel with it."""
    currency = report.currency
    title = f"GPU spend, {month_name(report.month)}" + _so_far(report)
    total = format_money(report.total_micros, currency)
    text = f"{title}: {total}"
    if not report.instances:
        return text, (
            header(title),
            section(f"Nothing was charged in {month_name(report.month)}."),
        )
    blocks: list[Block] = [
        header(title),
        section(_totals_line(report)),
        section(
            f"*By {report.by}*\n" + _group_lines(report.groups, report.by, currency, TOP_GROUPS)
        ),
        section("*Top instances*\n" + _instance_lines(report)),
    ]
    if not report.complete:
        blocks.append(context(_pending_note(report)))
    files = (
        "The chart and a CSV with every instance follow as files in the channel."
        if shared
        else "Only you see this; add `--share` to post it with the chart and a CSV to the channel."
    )
    blocks.append(context(f"{files} {EGRESS_NOTE}"))
    return text, tuple(blocks)


def _so_far(report: SpendReport) -> str:
    if report.complete:
        return ""
    if report.now is None:
        return " (this month so far)"
    return f" (this month so far, to {_clock(report.now, report.timezone)})"


def _pending_note(report: SpendReport) -> str:
    """Where the charges end and what the total adds beyond them."""
    pending = format_money(report.pending_micros, report.currency)
    until = (
        _clock(report.charged_until, report.timezone)
        if report.charged_until is not None
        else "the last full hour"
    )
    return (
        f"Charged up to {until}; the {pending} since (the open hour, and the rounding a "
        "release now would add) is in the totals as not yet charged: the same figures as "
        "`/gpu budget list` and `/gpu status`."
    )


def _clock(at: datetime, timezone: str) -> str:
    """A naive UTC time as ``HH:MM`` in ``timezone``."""
    return at.replace(tzinfo=UTC).astimezone(ZoneInfo(timezone)).strftime("%H:%M")


def digest_message(data: DigestData) -> Message:
    """The monthly digest: total against last month, by user, GPU and project, idle waste,
    where a monthly plan would have been cheaper, and the most expensive jobs."""
    report = data.report
    currency = report.currency
    title = f"GPU spend in {month_name(data.month)}"
    total = format_money(report.total_micros, currency)
    text = f"{title}: {total} ({_change(report.total_micros, data.previous_total_micros)})"
    blocks: list[Block] = [
        header(title),
        section(
            f"*Total {total}* — {_change(report.total_micros, data.previous_total_micros)} "
            f"({format_money(data.previous_total_micros, currency)} in the month before)\n"
            + _idle_line(report)
        ),
    ]
    if report.instances:
        for by in ("user", "gpu", "project"):
            grouped = _group_lines(report.group(by), by, currency, TOP_GROUPS)
            blocks.append(section(f"*By {_BY_TITLE[by]}*\n{grouped}"))
    if data.savings:
        saving_lines = [
            f"• *{escape(s.instance_name)}* ({escape(s.gpu_label)}, <@{s.owner_id}>): "
            f"{format_money(s.compute_micros, currency)} by the hour vs "
            f"{format_money(s.plan_micros, currency)} a month on {s.plan_source} — "
            f"*{format_money(s.saving_micros, currency)} less*"
            for s in data.savings[:TOP_GROUPS]
        ]
        blocks.append(
            section("*A monthly plan would have been cheaper*\n" + "\n".join(saving_lines))
        )
    if data.jobs:
        job_lines = [
            f"• {code(job.job_id)} on *{escape(job.instance_name)}* by <@{job.requested_by}>: "
            f"{format_money(job.cost_micros, currency)} over "
            f"{format_duration(_seconds(job.duration_s))} — {code(clip(job.command, COMMAND_MAX))}"
            for job in data.jobs
        ]
        blocks.append(section("*Most expensive jobs*\n" + "\n".join(job_lines)))
    blocks.append(context("The chart of spend per day is in the thread. " + EGRESS_NOTE))
    return text, tuple(blocks)


def budget_list_message(
    statuses: Sequence[BudgetStatus],
    month: str,
    currency: str,
    *,
    now: datetime | None = None,
    timezone: str = "UTC",
) -> Message:
    """`/gpu budget list`: every budget with this month's spend so far (to ``now``) against
    it."""
    title = f"Budgets, {month_name(month)}"
    if not statuses:
        text = "No budgets are set. An admin sets one with `/gpu budget set user @alice 500`."
        return text, (section(text),)
    lines = [_budget_line(status, currency) for status in statuses]
    text = f"{title}: {len(statuses)} budget{'s' if len(statuses) != 1 else ''}"
    to = f", to {_clock(now, timezone)}" if now is not None else ""
    note = f"Spent: this month so far{to}, the open hour included: the figures `/gpu spend` shows."
    return text, (header(title), section("\n".join(lines)), context(note))


def budget_alert_message(status: BudgetStatus, threshold_pct: int, currency: str) -> Message:
    """A budget crossed 50, 80 or 100% of its monthly limit."""
    who = _subject(status.scope, status.subject)
    spent = format_money(status.spent_micros, currency)
    limit = format_money(status.limit_micros, currency)
    if threshold_pct >= 100:
        text = (
            f":no_entry: The monthly budget of {who} is used up: {spent} of {limit}. "
            "New rentals and extensions now need an admin."
        )
    else:
        text = (
            f":warning: The monthly budget of {who} is {threshold_pct}% used: {spent} of {limit}."
        )
    return text, (section(text),)


def fit_message(report: FitReport) -> Message:
    """`/gpu fit`: the estimate by part and which GPUs hold it, each with its usable memory
    against what it must hold, and prices where known."""
    shape = report.model
    name = shape.name if shape.known else f"{shape.name} (shaped like {shape.shape_from})"
    title = f"{name} {report.mode}, {report.bits}-bit"
    total = _gb(report.memory.total_bytes)
    text = f"{escape(title)}: about {total} of GPU memory"
    parts = "\n".join(
        f"{label:<16}{_gb(size):>12}" for label, size in report.memory.parts() if size
    )
    blocks: list[Block] = [
        header(title),
        section(
            f"Needs about *{total}* for {report.seq} tokens x batch {report.batch}:\n```{parts}```"
        ),
    ]
    if report.fits:
        lines = [_fit_line(fit) for fit in report.fits[:TOP_FITS]]
        blocks.append(
            section("*Fits on* (each card's usable memory vs what it needs)\n" + "\n".join(lines))
        )
    else:
        blocks.append(section("No GPU in the catalogue holds this, even 64 of them."))
    blocks.append(context(FIT_NOTE))
    return text, tuple(blocks)


#: How `/gpu fit` counts, under every answer.
FIT_NOTE = (
    "Usable memory: the card's capacity (published in GB of 10^9 bytes: 16 GB is 14.9 GiB) "
    "less 0.5 GiB for the CUDA context and 5% for fragmentation. Estimates: activation "
    "checkpointing for training, a 16-bit KV cache; more GPUs split the model evenly. Prices: "
    "the cheapest offer in the bot's price table, a list price on the date shown; an unverified "
    "one was not checked against the platform's page and may be out of date."
)

#: What `/gpu estimate`'s prices and hours mean, under every answer.
ESTIMATE_NOTE = (
    "--price, --monthly and --buy are per card (as price pages list them) and multiplied by "
    "--count; --hours is each card's use a month."
)


def estimate_message(report: EstimateReport, currency: str) -> Message:
    """`/gpu estimate`: a month of renting by the hour vs a monthly plan, and buying, with the
    break-evens at the user's own pace."""
    gpus = f"{report.count}x {report.gpu_name}" if report.count > 1 else report.gpu_name
    pace = f"{_number(report.hours)} h a month"
    title = f"{gpus} at {pace}"
    lines = []
    for option in report.options:
        cost = "no price known" if option.cost_micros is None else _money(option, currency)
        when = (
            "" if option.cost_micros is None else (" once" if option.name == "buy" else " a month")
        )
        lines.append(f"• *{option.name}*: {cost}{when} — {option.detail}")
    best = report.cheapest
    text = f"{escape(title)}: cheapest to rent is {best.name}" if best else escape(title)
    per_card = " a card" if report.count > 1 else ""
    prices = [
        f"{label} {_maybe(micros, currency)}{unit}{per_card if micros is not None else ''} "
        f"({source})"
        for label, micros, unit, source in (
            ("hourly", report.hourly_per_card_micros, "/h", report.hourly_source),
            ("monthly plan", report.monthly_per_card_micros, "", report.monthly_source),
            ("buy", report.buy_per_card_micros, "", report.buy_source),
        )
    ]
    even = [line for line in (_plan_line(report), _buy_line(report)) if line]
    blocks: list[Block] = [
        header(title),
        section(
            "\n".join(lines) + (f"\nCheapest: *{best.name}* (to rent at {pace})." if best else "")
        ),
    ]
    if even:
        blocks.append(section(" ".join(even)))
    blocks.append(context("Prices: " + "; ".join(prices) + ". " + ESTIMATE_NOTE))
    return text, tuple(blocks)


def _plan_line(report: EstimateReport) -> str | None:
    even = report.monthly_break_even_hours
    if even is None:
        return None
    if report.plan_never_pays:
        return (
            "A monthly plan *never pays off*, at any usage: "
            f"{_number(even, whole=True)} h by the hour cost what a month of the plan does, "
            f"more than a month has ({HOURS_IN_LONGEST_MONTH} h in a 31-day month)."
        )
    return (
        f"A monthly plan pays off from *{_number(even, whole=True)} h* a month of each card "
        f"(you said {_number(report.hours)} h)."
    )


def _buy_line(report: EstimateReport) -> str | None:
    hours = report.buy_break_even_hours
    months = report.buy_break_even_months
    if hours is None and months is None:
        return None
    pace = f"{_number(report.hours)} h a month"
    if hours is not None:
        line = f"Buying pays off after *{_number(hours, whole=True)} h* of renting by the hour"
        if months is not None and report.buy_against == "hourly":
            return line + f": *{_months(months)}* at {pace}."
        if months is not None:
            return line + f"; at {pace} on the monthly plan, after *{_months(months)}*."
        return line + "."
    assert months is not None
    return f"Buying pays off after *{_months(months)}* of the monthly plan."


def final_cost_text(cost: FinalCost) -> str:
    """What a session cost and why, like ``$4.00: 1h10m billed as 2 h at $2.00/h`` (the
    increment and minimum charge applied), with its storage where it had any."""
    total = format_money(cost.total_micros, cost.currency)
    if not cost.started:
        why = "billing never started"
    else:
        used = _span(cost.used_s)
        billed = "" if cost.billed_s == cost.used_s else f" billed as {_span(cost.billed_s)}"
        rate = (
            ", partly at an earlier price"
            if cost.carried
            else f" at {format_money(cost.hourly_micros, cost.currency)}/h"
        )
        why = f"{used}{billed}{rate}"
    if cost.storage_micros:
        why += f", and {format_money(cost.storage_micros, cost.currency)} of storage"
    return f"{total}: {why}"


def final_cost_sentence(cost: FinalCost | None, *, stopped: bool = False) -> str:
    """The sentence a release (or a stop, ``stopped``) message ends with: what the session
    cost, and why; empty when it is not known."""
    if cost is None:
        return ""
    lead = "Up to the stop it cost" if stopped else "It cost"
    return f" {lead} {final_cost_text(cost)}."


def _span(seconds: int) -> str:
    """Seconds as ``2 h`` when whole hours, ``1 min`` when whole minutes under an hour, else
    like ``1h10m``."""
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds and seconds < 3600 and seconds % 60 == 0:
        return f"{seconds // 60} min"
    return format_duration(timedelta(seconds=seconds)).replace(" ", "")


_BY_TITLE = {
    "user": "user",
    "gpu": "GPU model",
    "instance": "instance",
    "project": "project",
    "provider": "provider",
}


def _totals_line(report: SpendReport) -> str:
    currency = report.currency
    parts = [
        f"*Total {format_money(report.total_micros, currency)}*",
        f"compute {format_money(report.compute_micros, currency)}",
        f"storage {format_money(report.storage_micros, currency)}",
    ]
    if report.pending_micros:
        parts.append(f"not yet charged {format_money(report.pending_micros, currency)}")
    return " · ".join(parts) + "\n" + _idle_line(report)


def _idle_line(report: SpendReport) -> str:
    if not report.compute_micros:
        return "No compute was charged."
    unmeasured = report.unmeasured_micros
    if unmeasured >= report.compute_micros:
        return "Idle cost unknown: no poll measured GPU use in these hours."
    share = Decimal(report.idle_micros * 100) / Decimal(report.compute_micros)
    line = (
        f"Idle GPUs cost *{format_money(report.idle_micros, report.currency)}* "
        f"({share.quantize(Decimal('1'))}% of compute)."
    )
    if unmeasured:
        line += f" GPU use was not measured for {format_money(unmeasured, report.currency)}."
    return line


def _group_lines(lines: Sequence[SpendLine], by: str, currency: str, limit: int) -> str:
    shown = [
        f"• {_label(line.key, by)}: {format_money(line.total_micros, currency)}"
        + (f" (idle {format_money(line.idle_micros, currency)})" if line.idle_micros else "")
        for line in lines[:limit]
    ]
    rest = lines[limit:]
    if rest:
        total = sum(line.total_micros for line in rest)
        shown.append(f"• {len(rest)} more: {format_money(total, currency)}")
    return clip("\n".join(shown), SECTION_TEXT_MAX - 40)


def _instance_lines(report: SpendReport) -> str:
    currency = report.currency
    return "\n".join(
        f"• *{escape(item.name)}* ({escape(item.gpu_label)}, <@{item.owner_id}>): "
        f"{format_money(item.total_micros, currency)}"
        + (f", idle {format_money(item.idle_micros, currency)}" if item.idle_micros else "")
        for item in report.top(TOP_INSTANCES)
    )


def _label(key: str, by: str) -> str:
    return f"<@{key}>" if by == "user" else escape(key)


def _change(current: int, previous: int) -> str:
    if previous == 0:
        return "nothing the month before" if current else "no change"
    percent = (Decimal(current - previous) * 100 / Decimal(previous)).quantize(Decimal("1"))
    if percent == 0:
        return "about the same as the month before"
    word = "up" if percent > 0 else "down"
    return f"{word} {abs(percent)}% on the month before"


def _budget_line(status: BudgetStatus, currency: str) -> str:
    percent = status.used_pct
    mark = (
        ":no_entry:" if percent >= 100 else ":warning:" if percent >= 80 else ":white_check_mark:"
    )
    return (
        f"{mark} {_subject(status.scope, status.subject)}: "
        f"{format_money(status.spent_micros, currency)} of "
        f"{format_money(status.limit_micros, currency)} ({percent}%)"
    )


def _subject(scope: str, subject: str) -> str:
    return f"<@{subject}>" if scope == "user" else f"project *{escape(subject)}*"


def _fit_line(fit: GpuFit) -> str:
    count = f"{fit.count}x " if fit.count > 1 else ""
    price = (
        f" — from {format_money(fit.price_micros_per_hour)}/h on {fit.price_source}"
        if fit.price_micros_per_hour is not None
        else ""
    )
    machines = -(-fit.count // GPUS_PER_MACHINE)
    spread = f"; {machines} machines of up to {GPUS_PER_MACHINE}" if machines > 1 else ""
    each = " each" if fit.count > 1 else ""
    capacity = f"{fit.mem_bytes // 10**9} GB"
    return (
        f"• {count}*{fit.name}* ({capacity}: {_gb(fit.usable_bytes)} usable{each}, "
        f"needs {_gb(fit.per_gpu_bytes)}{each}{spread}){price}"
    )


def _gb(size: int) -> str:
    """Bytes in GiB (2^30 bytes), one decimal."""
    return f"{Decimal(size) / Decimal(2**30):.1f} GiB"


def _money(option: Option, currency: str) -> str:
    return f"*{format_money(option.cost_micros or 0, currency)}*"


def _maybe(micros: int | None, currency: str) -> str:
    return "unknown" if micros is None else format_money(micros, currency)


def _number(value: Decimal, *, whole: bool = False) -> str:
    """``value`` with thousands separators and no trailing zeros; rounded to a whole number
    when ``whole`` (and 10 or more)."""
    if whole and value >= 10:
        value = value.quantize(Decimal(1))
    text = f"{value:,f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _months(months: Decimal) -> str:
    shown = _number(months, whole=True)
    return f"{shown} month" if shown == "1" else f"{shown} months"


def _seconds(seconds: int) -> timedelta:
    return timedelta(seconds=seconds)


def _budget_alert(notice: BudgetAlert) -> Message:
    return budget_alert_message(notice.status, notice.threshold_pct, notice.currency)


def _digest(notice: Digest) -> Message:
    return digest_message(notice.data)


def digest_chart_title(month: str) -> str:
    """The title of ``month``'s chart of spend per day."""
    return f"GPU spend per day, {month_name(month)}"


def _digest_files(notice: Digest) -> tuple[FileAttachment, ...]:
    """The month's spend per day as a PNG chart, shared in the digest's thread."""
    report = notice.data.report
    title = digest_chart_title(notice.data.month)
    chart = charts.daily_chart(title, report.days, currency=report.currency)
    return (FileAttachment(f"gpu-spend-{notice.data.month}.png", chart, title=title),)


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    BudgetAlert: _budget_alert,
    Digest: _digest,
}

#: The notices this module draws files for (joined in bot.blocks.FILE_RENDERERS).
FILE_RENDERERS: dict[type[Notice], Callable[[Any], tuple[FileAttachment, ...]]] = {
    Digest: _digest_files,
}
