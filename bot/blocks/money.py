"""Block Kit for money: spend reports, the monthly digest, budgets, `/gpu fit` and
`/gpu estimate`. Pure functions, values in, (fallback text, blocks) out; amounts in micro-units.
Names people chose (projects, instances, GPU models) are escaped for mrkdwn, in the fallback text
as in the blocks.

Why one module of this size: the spend report and the digest share its total and group
lines, and the notices of bot.services.money.budgets and .digest are a message each; `/gpu fit`
and `/gpu estimate` (the views of bot.services.money.advice) are the part that could stand alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from unicodedata import east_asian_width
from zoneinfo import ZoneInfo

from bot import charts
from bot.blocks.bills import digest_section
from bot.blocks.kit import (
    SECTION_TEXT_MAX,
    clip,
    code,
    context,
    escape,
    header,
    mention,
    month_name,
    section,
)
from bot.i18n import N_, nt, t
from bot.notify import Block, FileAttachment, Message, Notice
from bot.providers.names import platform_name
from bot.services.money.advice import (
    GUIDE_GPUS,
    HOURS_IN_LONGEST_MONTH,
    EstimateReport,
    FitReport,
    GpuFit,
    ModelShape,
    Option,
)
from bot.services.money.budgets import BudgetAlert, BudgetStatus
from bot.services.money.costs import FinalCost
from bot.services.money.digest import Digest, DigestData
from bot.services.money.spend import NO_PROJECT, SpendLine, SpendReport
from bot.values import format_duration, format_money, format_rate

TOP_GROUPS = 10
TOP_INSTANCES = 5
TOP_FITS = 12
#: The most characters of a job's command the digest shows.
COMMAND_MAX = 80

#: The most GPUs one rented machine has (HGX/DGX boards); more means a multi-node job.
GPUS_PER_MACHINE = 8

#: Nothing measures network traffic, so reports say what they leave out.
EGRESS_NOTE = N_(
    "Data transfer (egress) is not metered: where a platform charges for it, it is on the "
    "platform's invoice only."
)

#: `/gpu spend`'s chart title, heading of the groups, by what they group.
_SPEND_CHART_TITLE = {
    "user": N_("GPU spend by user, {month}"),
    "gpu": N_("GPU spend by gpu, {month}"),
    "instance": N_("GPU spend by instance, {month}"),
    "project": N_("GPU spend by project, {month}"),
    "provider": N_("GPU spend by provider, {month}"),
}
_SPEND_HEADING = {
    "user": N_("*By user*"),
    "gpu": N_("*By gpu*"),
    "instance": N_("*By instance*"),
    "project": N_("*By project*"),
    "provider": N_("*By provider*"),
}
#: The digest's headings of its groups.
_DIGEST_HEADING = {
    "user": N_("*By user*"),
    "gpu": N_("*By GPU model*"),
    "project": N_("*By project*"),
}
#: The ways to get GPU time `/gpu estimate` compares (Option.name), and its price labels.
_OPTION_NAMES = (N_("hourly"), N_("monthly plan"), N_("buy"))
#: The parts of a `/gpu fit` estimate (MemoryBreakdown.parts).
_MEMORY_PARTS = (
    N_("weights"),
    N_("KV cache"),
    N_("optimizer state"),
    N_("gradients"),
    N_("activations"),
)


def spend_file_titles(report: SpendReport) -> tuple[str, str]:
    """The titles of the files shared with `/gpu spend`: the chart's and the CSV's."""
    name = month_name(report.month)
    by = _SPEND_CHART_TITLE.get(report.by)
    chart = t(by, month=name) if by else t("GPU spend by {by}, {month}", by=report.by, month=name)
    return chart, t("GPU spend per instance, {month}", month=name)


def spend_message(report: SpendReport, *, shared: bool = False) -> Message:
    """`/gpu spend`: totals, idle cost, the groups asked for and the top instances. The current
    month is this month so far, to ``report.now``; ``shared`` says the chart and the CSV are
    posted to the channel with it."""
    currency = report.currency
    month = month_name(report.month)
    title = _spend_title(report, month)
    total = format_money(report.total_micros, currency)
    text = t("{title}: {total}", title=title, total=total)
    if not report.instances:
        return text, (
            header(title),
            section(t("Nothing was charged in {month}.", month=month)),
        )
    heading = _SPEND_HEADING.get(report.by)
    by = t(heading) if heading else t("*By {by}*", by=report.by)
    blocks: list[Block] = [
        header(title),
        section(_totals_line(report)),
        section(by + "\n" + _group_lines(report.groups, report.by, currency, TOP_GROUPS)),
        section(t("*Top instances*") + "\n" + _instance_lines(report)),
    ]
    if not report.complete:
        blocks.append(context(_pending_note(report)))
    files = (
        t("The chart and a CSV with every instance follow as files in the channel.")
        if shared
        else t(
            "Only you see this; add `--share` to post it with the chart and a CSV to the channel."
        )
    )
    blocks.append(context(f"{files} {t(EGRESS_NOTE)}"))
    return text, tuple(blocks)


def _spend_title(report: SpendReport, month: str) -> str:
    """``GPU spend, March 2026``, with how far the current month goes."""
    if report.complete:
        return t("GPU spend, {month}", month=month)
    if report.now is None:
        return t("GPU spend, {month} (this month so far)", month=month)
    return t(
        "GPU spend, {month} (this month so far, to {time})",
        month=month,
        time=_clock(report.now, report.timezone),
    )


def _pending_note(report: SpendReport) -> str:
    """Where the charges end and what the total adds beyond them."""
    pending = format_money(report.pending_micros, report.currency)
    until = (
        _clock(report.charged_until, report.timezone)
        if report.charged_until is not None
        else t("the last full hour")
    )
    return t(
        "Charged up to {until}; the {pending} since (the open hour, and the rounding a "
        "release now would add) is in the totals as not yet charged: the same figures as "
        "`/gpu budget list` and `/gpu status`.",
        until=until,
        pending=pending,
    )


def _clock(at: datetime, timezone: str) -> str:
    """A naive UTC time as ``HH:MM`` in ``timezone``."""
    return at.replace(tzinfo=UTC).astimezone(ZoneInfo(timezone)).strftime("%H:%M")


def digest_message(data: DigestData) -> Message:
    """The monthly digest: total against last month, by user, GPU and project, idle waste,
    where a monthly plan would have been cheaper, the most expensive jobs, and the month
    against the platforms' bills (where a configured platform publishes them)."""
    report = data.report
    currency = report.currency
    title = t("GPU spend in {month}", month=month_name(data.month))
    total = format_money(report.total_micros, currency)
    change = _change(report.total_micros, data.previous_total_micros)
    text = t("{title}: {total} ({change})", title=title, total=total, change=change)
    parts = [
        t("compute {amount}", amount=format_money(report.compute_micros, currency)),
        t("storage {amount}", amount=format_money(report.storage_micros, currency)),
    ]
    blocks: list[Block] = [
        header(title),
        section(
            _digest_total(report.total_micros, data.previous_total_micros, currency)
            + "\n"
            + " · ".join(parts)
            + "\n"
            + _idle_line(report)
        ),
    ]
    if report.instances:
        for by, heading in _DIGEST_HEADING.items():
            grouped = _group_lines(report.group(by), by, currency, TOP_GROUPS)
            blocks.append(section(f"{t(heading)}\n{grouped}"))
    if data.savings:
        saving_lines = [
            t(
                "• *{instance}* ({gpu}, {owner}): {hourly} by the hour vs {plan} a month on "
                "{source} — *{saving} less*",
                instance=escape(s.instance_name),
                gpu=escape(s.gpu_label),
                owner=mention(s.owner_id),
                hourly=format_money(s.compute_micros, currency),
                plan=format_money(s.plan_micros, currency),
                source=s.plan_source,
                saving=format_money(s.saving_micros, currency),
            )
            for s in data.savings[:TOP_GROUPS]
        ]
        heading = t("*A monthly plan would have been cheaper*")
        blocks.append(section(heading + "\n" + "\n".join(saving_lines)))
    if data.jobs:
        job_lines = [
            t(
                "• {job} on *{instance}* by {who}: {cost} over {duration} — {command}",
                job=code(job.job_id),
                instance=escape(job.instance_name),
                who=mention(job.requested_by),
                cost=format_money(job.cost_micros, currency),
                duration=format_duration(_seconds(job.duration_s)),
                command=code(clip(job.command, COMMAND_MAX)),
            )
            for job in data.jobs
        ]
        blocks.append(section(t("*Most expensive jobs*") + "\n" + "\n".join(job_lines)))
    if data.bills is not None:
        blocks.append(section(digest_section(data.bills)))
    chart = t("The chart of spend per day is in the thread.")
    blocks.append(context(f"{chart} {t(EGRESS_NOTE)}"))
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
    title = t("Budgets, {month}", month=month_name(month))
    if not statuses:
        text = t("No budgets are set. An admin sets one with `/gpu budget set user @alice 500`.")
        return text, (section(text),)
    lines = [_budget_line(status, currency) for status in statuses]
    count = len(statuses)
    text = nt("{title}: {n} budget", "{title}: {n} budgets", count, title=title, n=count)
    note = (
        t(
            "Spent: this month so far, to {time}, the open hour included: the figures "
            "`/gpu spend` shows.",
            time=_clock(now, timezone),
        )
        if now is not None
        else t("Spent: this month so far, the open hour included: the figures `/gpu spend` shows.")
    )
    return text, (header(title), section("\n".join(lines)), context(note))


def budget_alert_message(status: BudgetStatus, threshold_pct: int, currency: str) -> Message:
    """A budget crossed 50, 80 or 100% of its monthly limit."""
    who = _subject(status.scope, status.subject)
    spent = format_money(status.spent_micros, currency)
    limit = format_money(status.limit_micros, currency)
    if threshold_pct >= 100:
        text = t(
            ":no_entry: The monthly budget of {who} is used up: {spent} of {limit}. "
            "New rentals and extensions now need an admin.",
            who=who,
            spent=spent,
            limit=limit,
        )
    else:
        text = t(
            ":warning: The monthly budget of {who} is {percent}% used: {spent} of {limit}.",
            who=who,
            percent=threshold_pct,
            spent=spent,
            limit=limit,
        )
    return text, (section(text),)


def fit_message(report: FitReport) -> Message:
    """`/gpu fit`: the estimate by part (and by model, where several share the cards), with and
    without the headroom, and which GPUs hold it, each with its usable memory against what it
    must hold, whether comfortably or tightly, and prices where known. The cards the guides
    name (:data:`GUIDE_GPUS`) are listed wherever they hold it."""
    mode = t(_FIT_MODES.get(report.mode, report.mode))
    names = [_model_name(report.model), *(_model_name(need.model) for need in report.each[1:])]
    labels = [
        t("{name} {bits}-bit", name=name, bits=one.bits)
        for name, one in zip(names, report.each, strict=True)
    ]
    if report.models:
        title = t("{models} together, {mode}", models=" + ".join(labels), mode=mode)
    else:
        title = t("{name} {mode}, {bits}-bit", name=names[0], mode=mode, bits=report.bits)
    need, advised = _gb(report.memory.total_bytes), _gb(report.advised_bytes)
    text = t(
        "{title}: at least {need}, {advised} with {headroom}% headroom",
        title=escape(title),
        need=need,
        advised=advised,
        headroom=report.headroom_pct,
    )
    rows = [
        f"{_pad(_part_label(label), 16)}{_gb(size):>12}"
        for label, size in report.memory.parts()
        if size
    ]
    if report.models:
        width = max(_columns(label) for label in labels) + 2
        each = [
            f"{_pad(label, width)}{_gb(one.memory.total_bytes):>12}"
            for label, one in zip(labels, report.each, strict=True)
        ]
        rows = [*each, "", *rows]
    blocks: list[Block] = [
        header(title),
        section(
            t(
                "Needs at least *{need}* for a context of {seq} tokens x batch {batch}; "
                "*{advised}* with {headroom}% headroom (the usual advice is 20-50%):",
                need=need,
                seq=report.seq,
                batch=report.batch,
                advised=advised,
                headroom=report.headroom_pct,
            )
            + "\n```"
            + escape("\n".join(rows))
            + "```"
        ),
    ]
    if report.fits:
        lines = [_fit_line(fit, report.currency, report.headroom_pct) for fit in _shown(report)]
        chunk = t("*Fits on* (each card's usable memory vs what it needs)")
        for line in lines:
            if len(chunk) + 1 + len(line) > SECTION_TEXT_MAX:
                blocks.append(section(chunk))
                chunk = line
            else:
                chunk += "\n" + line
        blocks.append(section(chunk))
    else:
        blocks.append(section(t("No GPU in the catalogue holds this, even 64 of them.")))
    blocks.append(context(t(FIT_NOTE)))
    return text, tuple(blocks)


def _model_name(shape: ModelShape) -> str:
    """A model as asked for, saying whose shape a bare size borrows and whether it is an
    estimate from the nearest size listed."""
    if shape.known:
        return shape.name
    if shape.estimated:
        return t(
            "{name} (estimated: shaped like {shape}, the nearest size listed)",
            name=shape.name,
            shape=shape.shape_from,
        )
    return t("{name} (shaped like {shape})", name=shape.name, shape=shape.shape_from)


def _shown(report: FitReport) -> list[GpuFit]:
    """The first :data:`TOP_FITS` fits, then the guides' cards that hold it as well."""
    shown = list(report.fits[:TOP_FITS])
    shown += [fit for fit in report.fits[TOP_FITS:] if fit.key in GUIDE_GPUS]
    return shown


def _part_label(label: str) -> str:
    """A part of the memory estimate, in the reader's language."""
    return t(label) if label in _MEMORY_PARTS else label


def _pad(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` columns of a monospaced font, where a Chinese
    character takes two."""
    return text + " " * max(width - _columns(text), 0)


def _columns(text: str) -> int:
    """The columns ``text`` takes in a monospaced font, a Chinese character two."""
    return sum(2 if east_asian_width(char) in "WF" else 1 for char in text)


#: `/gpu fit`'s modes (FitReport.mode), as the answer names them.
_FIT_MODES = {
    "inference": N_("inference"),
    "lora": N_("lora"),
    "qlora": N_("qlora"),
    "full": N_("full"),
}

#: How `/gpu fit` counts, under every answer.
FIT_NOTE = N_(
    "Needs: the weights at their precision; for inference the KV cache (2 x layers x KV width x "
    "context x batch x 2 bytes); for training the activations (with activation checkpointing) "
    "and, for LoRA, the adapters with their gradients and AdamW state, for a full fine-tune all "
    "of that for every parameter (16 bytes each). Headroom: the margin the usual advice adds "
    "for what an estimate leaves out; tight means the cards hold the estimate but not the "
    "headroom. Usable memory: the card's capacity (published in GB of 10^9 bytes: 16 GB is "
    "14.9 GiB) less 0.5 GiB for the CUDA context and 5% for fragmentation; more GPUs split the "
    "model evenly. Prices: the cheapest offer in the bot's price table, a list price on the "
    "date shown; an unverified one was not checked against the platform's page and may be out "
    "of date."
)

#: What `/gpu estimate`'s prices and hours mean, under every answer.
ESTIMATE_NOTE = N_(
    "--price, --monthly and --buy are per card (as price pages list them) and multiplied by "
    "--count; --hours is each card's use a month."
)


def estimate_message(report: EstimateReport, currency: str) -> Message:
    """`/gpu estimate`: a month of renting by the hour vs a monthly plan, and buying, with the
    break-evens at the user's own pace."""
    gpus = f"{report.count}x {report.gpu_name}" if report.count > 1 else report.gpu_name
    pace = _pace(report.hours)
    title = t("{gpus} at {pace}", gpus=gpus, pace=pace)
    lines = [_option_line(option, currency) for option in report.options]
    best = report.cheapest
    text = (
        t("{title}: cheapest to rent is {option}", title=escape(title), option=_option(best.name))
        if best
        else escape(title)
    )
    prices = [
        _price(t(label), micros, unit, source, per_card=report.count > 1, currency=currency)
        for label, micros, unit, source in (
            (_OPTION_NAMES[0], report.hourly_per_card_micros, N_("/h"), report.hourly_source),
            (_OPTION_NAMES[1], report.monthly_per_card_micros, "", report.monthly_source),
            (_OPTION_NAMES[2], report.buy_per_card_micros, "", report.buy_source),
        )
    ]
    even = [line for line in (_plan_line(report), _buy_line(report)) if line]
    cheapest = (
        "\n" + t("Cheapest: *{option}* (to rent at {pace}).", option=_option(best.name), pace=pace)
        if best
        else ""
    )
    blocks: list[Block] = [header(title), section("\n".join(lines) + cheapest)]
    if even:
        blocks.append(section(" ".join(even)))
    prices_note = t("Prices: {prices}.", prices="; ".join(prices))
    blocks.append(context(f"{prices_note} {t(ESTIMATE_NOTE)}"))
    return text, tuple(blocks)


def _pace(hours: Decimal) -> str:
    """``50 h a month``."""
    return t("{hours} h a month", hours=_number(hours))


def _option(name: str) -> str:
    """A way to get GPU time (``hourly``, ``monthly plan``, ``buy``) in the reader's language."""
    return t(name) if name in _OPTION_NAMES else name


def _option_line(option: Option, currency: str) -> str:
    """One way to get the GPU time: what it costs, once or a month, and for what."""
    name = _option(option.name)
    if option.cost_micros is None:
        return t("• *{option}*: no price known — {detail}", option=name, detail=option.detail)
    cost = _money(option, currency)
    if option.name == "buy":
        return t(
            "• *{option}*: {cost} once — {detail}", option=name, cost=cost, detail=option.detail
        )
    return t(
        "• *{option}*: {cost} a month — {detail}", option=name, cost=cost, detail=option.detail
    )


def _price(
    label: str, micros: int | None, unit: str, source: str, *, per_card: bool, currency: str
) -> str:
    """One per-card price and where it is from: ``hourly $0.50/h a card (as given)``."""
    if micros is None:
        shown = t(unit) if unit else ""
        return t("{label} unknown{unit} ({source})", label=label, unit=shown, source=source)
    price = format_rate(micros, currency) if unit else format_money(micros, currency)
    if per_card:
        return t("{label} {price} a card ({source})", label=label, price=price, source=source)
    return t("{label} {price} ({source})", label=label, price=price, source=source)


def _plan_line(report: EstimateReport) -> str | None:
    even = report.monthly_break_even_hours
    if even is None:
        return None
    if report.plan_never_pays:
        return t(
            "A monthly plan *never pays off*, at any usage: {hours} h by the hour cost what a "
            "month of the plan does, more than a month has ({longest} h in a 31-day month).",
            hours=_number(even, whole=True),
            longest=HOURS_IN_LONGEST_MONTH,
        )
    return t(
        "A monthly plan pays off from *{hours} h* a month of each card (you said {yours} h).",
        hours=_number(even, whole=True),
        yours=_number(report.hours),
    )


def _buy_line(report: EstimateReport) -> str | None:
    hours = report.buy_break_even_hours
    months = report.buy_break_even_months
    if hours is None and months is None:
        return None
    pace = _pace(report.hours)
    if hours is None:
        assert months is not None
        return t("Buying pays off after *{months}* of the monthly plan.", months=_months(months))
    rented = _number(hours, whole=True)
    if months is not None and report.buy_against == "hourly":
        return t(
            "Buying pays off after *{hours} h* of renting by the hour: *{months}* at {pace}.",
            hours=rented,
            months=_months(months),
            pace=pace,
        )
    if months is not None:
        return t(
            "Buying pays off after *{hours} h* of renting by the hour; at {pace} on the monthly "
            "plan, after *{months}*.",
            hours=rented,
            months=_months(months),
            pace=pace,
        )
    return t("Buying pays off after *{hours} h* of renting by the hour.", hours=rented)


def final_cost_text(cost: FinalCost) -> str:
    """What a session cost and why, like ``$4.00: 1h10m billed as 2 h at $2.00/h`` (the
    increment and minimum charge applied), with its storage where it had any."""
    total = format_money(cost.total_micros, cost.currency)
    if not cost.started:
        why = t("billing never started")
    else:
        used = _span(cost.used_s)
        if cost.billed_s != cost.used_s:
            used = t("{used} billed as {billed}", used=used, billed=_span(cost.billed_s))
        why = (
            t("{usage}, partly at an earlier price", usage=used)
            if cost.carried
            else t(
                "{usage} at {rate}/h",
                usage=used,
                rate=format_money(cost.hourly_micros, cost.currency),
            )
        )
    if cost.storage_micros:
        storage = format_money(cost.storage_micros, cost.currency)
        why = t("{why}, and {storage} of storage", why=why, storage=storage)
    return t("{total}: {why}", total=total, why=why)


def final_cost_sentence(cost: FinalCost | None, *, stopped: bool = False) -> str:
    """The sentence a release (or a stop, ``stopped``) message ends with: what the session
    cost, and why; empty when it is not known."""
    if cost is None:
        return ""
    cost_text = final_cost_text(cost) + unverified_rule(cost.unverified_increment)
    if stopped:
        return " " + t("Up to the stop it cost {cost}.", cost=cost_text)
    return " " + t("It cost {cost}.", cost=cost_text)


def unverified_rule(increment: str | None) -> str:
    """What a quoted cost adds when a setting, not a platform document, decides its billing
    increment (Compshare's GPUBOT_COMPSHARE_BILLING): empty when the rule is documented."""
    if increment is None:
        return ""
    unit = t(_INCREMENT_UNITS.get(increment, increment))
    return " " + t(
        "(billed by the {unit} as GPUBOT_COMPSHARE_BILLING says: no document of the platform "
        "states its increment, so this is unverified)",
        unit=unit,
    )


_INCREMENT_UNITS = {"second": N_("second"), "minute": N_("minute"), "hour": N_("hour")}


def _span(seconds: int) -> str:
    """Seconds as ``2 h`` when whole hours, ``1 min`` when whole minutes under an hour, else
    like ``1h10m`` (``2 小时``, ``1 分钟``, ``1 小时 10 分`` in Chinese)."""
    return format_duration(timedelta(seconds=seconds), compact=True)


def _totals_line(report: SpendReport) -> str:
    currency = report.currency
    parts = [
        t("*Total {total}*", total=format_money(report.total_micros, currency)),
        t("compute {amount}", amount=format_money(report.compute_micros, currency)),
        t("storage {amount}", amount=format_money(report.storage_micros, currency)),
    ]
    if report.pending_micros:
        pending = format_money(report.pending_micros, currency)
        parts.append(t("not yet charged {amount}", amount=pending))
    text = " · ".join(parts) + "\n" + _idle_line(report)
    if report.unpriced_disks:
        names = report.unpriced_disks
        shown = escape(", ".join(clip(name, 40) for name in names[:5]))
        if len(names) > 5:
            shown = t("{names} and {n} more", names=shown, n=len(names) - 5)
        text += "\n" + nt(
            ":warning: Storage leaves out the disk of {names}: stopped, its storage price "
            "unknown. `/gpu policy NAME --disk 200 --storage 0.10/GB-month` tells the bot.",
            ":warning: Storage leaves out the disks of {names}: stopped, their storage price "
            "unknown. `/gpu policy NAME --disk 200 --storage 0.10/GB-month` tells the bot.",
            len(names),
            names=shown,
        )
    return text


def _digest_total(total: int, previous: int, currency: str) -> str:
    """The digest's total against the month before; a month before with nothing charged is
    said so, not shown as an amount."""
    shown = format_money(total, currency)
    if previous == 0:
        if total == 0:
            return t(
                "*Total {total}* — nothing was charged this month or the month before", total=shown
            )
        return t("*Total {total}* — nothing was charged the month before", total=shown)
    return t(
        "*Total {total}* — {change} ({previous} in the month before)",
        total=shown,
        change=_change(total, previous),
        previous=format_money(previous, currency),
    )


def _idle_line(report: SpendReport) -> str:
    """Compute split into in use, idle and not measured (GPU-samples no poll read: neither
    idle nor use), the same figures as the chart's series and the CSV's columns."""
    currency = report.currency
    if not report.compute_micros:
        return t("No compute was charged.")
    unmeasured = report.unmeasured_micros
    if unmeasured >= report.compute_micros:
        return t(
            "GPU use was not measured for any of the compute ({amount}): no poll read the "
            "GPUs, so none of it counts as idle or in use.",
            amount=format_money(unmeasured, currency),
        )
    share = Decimal(report.idle_micros * 100) / Decimal(report.compute_micros)
    return t(
        "Compute in use *{in_use}* · idle *{idle}* ({percent}% of compute) · not measured "
        "*{unmeasured}*.",
        in_use=format_money(report.in_use_micros, currency),
        idle=format_money(report.idle_micros, currency),
        percent=share.quantize(Decimal("1")),
        unmeasured=format_money(unmeasured, currency),
    )


def _group_lines(lines: Sequence[SpendLine], by: str, currency: str, limit: int) -> str:
    shown = [_group_line(line, by, currency) for line in lines[:limit]]
    rest = lines[limit:]
    if rest:
        total = format_money(sum(line.total_micros for line in rest), currency)
        shown.append(t("• {n} more: {total}", n=len(rest), total=total))
    return clip("\n".join(shown), SECTION_TEXT_MAX - 40)


def _group_line(line: SpendLine, by: str, currency: str) -> str:
    label = _label(line.key, by)
    total = format_money(line.total_micros, currency)
    idle = format_money(line.idle_micros, currency)
    unmeasured = format_money(line.unmeasured_micros, currency)
    if line.idle_micros and line.unmeasured_micros:
        return t(
            "• {label}: {total} (idle {idle}, not measured {unmeasured})",
            label=label,
            total=total,
            idle=idle,
            unmeasured=unmeasured,
        )
    if line.idle_micros:
        return t("• {label}: {total} (idle {idle})", label=label, total=total, idle=idle)
    if line.unmeasured_micros:
        return t(
            "• {label}: {total} (not measured {unmeasured})",
            label=label,
            total=total,
            unmeasured=unmeasured,
        )
    return t("• {label}: {total}", label=label, total=total)


def _instance_lines(report: SpendReport) -> str:
    currency = report.currency
    lines = []
    for item in report.top(TOP_INSTANCES):
        values = {
            "name": escape(item.name),
            "gpu": escape(item.gpu_label),
            "owner": mention(item.owner_id),
            "total": format_money(item.total_micros, currency),
        }
        idle = format_money(item.idle_micros, currency)
        unmeasured = format_money(item.unmeasured_micros, currency)
        if item.idle_micros and item.unmeasured_micros:
            line = t(
                "• *{name}* ({gpu}, {owner}): {total}, idle {idle}, not measured {unmeasured}",
                idle=idle,
                unmeasured=unmeasured,
                **values,
            )
        elif item.idle_micros:
            line = t("• *{name}* ({gpu}, {owner}): {total}, idle {idle}", idle=idle, **values)
        elif item.unmeasured_micros:
            line = t(
                "• *{name}* ({gpu}, {owner}): {total}, not measured {unmeasured}",
                unmeasured=unmeasured,
                **values,
            )
        else:
            line = t("• *{name}* ({gpu}, {owner}): {total}", **values)
        lines.append(line)
    return "\n".join(lines)


def _label(key: str, by: str) -> str:
    return mention(key) if by == "user" else escape(group_name(key, by))


def group_name(key: str, by: str) -> str:
    """A spend group's key (:func:`bot.services.money.spend.group_key`) as a reader names it, plain
    text: a platform by its name (优云智算), no project in the active language; user IDs,
    instances, projects and GPUs as they are."""
    if by == "provider":
        return platform_name(key)
    if by == "project" and key == NO_PROJECT:
        return t(NO_PROJECT)
    return key


def _change(current: int, previous: int) -> str:
    if previous == 0:
        return t("nothing the month before") if current else t("no change")
    percent = (Decimal(current - previous) * 100 / Decimal(previous)).quantize(Decimal("1"))
    if percent == 0:
        return t("about the same as the month before")
    if percent > 0:
        return t("up {percent}% on the month before", percent=percent)
    return t("down {percent}% on the month before", percent=abs(percent))


def _budget_line(status: BudgetStatus, currency: str) -> str:
    percent = status.used_pct
    mark = (
        ":no_entry:" if percent >= 100 else ":warning:" if percent >= 80 else ":white_check_mark:"
    )
    return t(
        "{mark} {who}: {spent} of {limit} ({percent}%)",
        mark=mark,
        who=_subject(status.scope, status.subject),
        spent=format_money(status.spent_micros, currency),
        limit=format_money(status.limit_micros, currency),
        percent=percent,
    )


def _subject(scope: str, subject: str) -> str:
    if scope == "user":
        return mention(subject)
    return t("project *{name}*", name=escape(subject))


def _fit_line(fit: GpuFit, currency: str, headroom_pct: int) -> str:
    count = f"{fit.count}x " if fit.count > 1 else ""
    sizes = {
        "capacity": f"{fit.mem_bytes // 10**9} GB",
        "usable": _gb(fit.usable_bytes),
        "needs": _gb(fit.per_gpu_bytes),
    }
    detail = (
        t("{capacity}: {usable} usable each, needs {needs} each", **sizes)
        if fit.count > 1
        else t("{capacity}: {usable} usable, needs {needs}", **sizes)
    )
    machines = -(-fit.count // GPUS_PER_MACHINE)
    if machines > 1:
        detail = t(
            "{detail}; {machines} machines of up to {per_machine}",
            detail=detail,
            machines=machines,
            per_machine=GPUS_PER_MACHINE,
        )
    line = t("• {count}*{name}* ({detail})", count=count, name=fit.name, detail=detail)
    if not fit.tight:
        verdict = t("comfortable with {headroom}% headroom", headroom=headroom_pct)
    elif fit.comfortable_count:
        verdict = t(
            "tight: {cards} with {headroom}% headroom",
            cards=nt("one card", "{n} cards", fit.comfortable_count, n=fit.comfortable_count),
            headroom=headroom_pct,
        )
    else:
        verdict = t("tight: no room for {headroom}% headroom", headroom=headroom_pct)
    line = t("{line} — {verdict}", line=line, verdict=verdict)
    if fit.price_micros_per_hour is None:
        return line
    price = format_money(fit.price_micros_per_hour, currency)
    return t("{line} — from {price}/h on {source}", line=line, price=price, source=fit.price_source)


def _gb(size: int) -> str:
    """Bytes in GiB (2^30 bytes), one decimal."""
    return f"{Decimal(size) / Decimal(2**30):.1f} GiB"


def _money(option: Option, currency: str) -> str:
    return f"*{format_money(option.cost_micros or 0, currency)}*"


def _number(value: Decimal, *, whole: bool = False) -> str:
    """``value`` with thousands separators and no trailing zeros; rounded to a whole number
    when ``whole`` (and 10 or more)."""
    if whole and value >= 10:
        value = value.quantize(Decimal(1))
    text = f"{value:,f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _months(months: Decimal) -> str:
    shown = _number(months, whole=True)
    return nt("{n} month", "{n} months", 1 if shown == "1" else 2, n=shown)


def _seconds(seconds: int) -> timedelta:
    return timedelta(seconds=seconds)


def _budget_alert(notice: BudgetAlert) -> Message:
    return budget_alert_message(notice.status, notice.threshold_pct, notice.currency)


def _digest(notice: Digest) -> Message:
    return digest_message(notice.data)


def digest_chart_title(month: str) -> str:
    """The title of ``month``'s chart of spend per day."""
    return t("GPU spend per day, {month}", month=month_name(month))


def day_columns(report: SpendReport) -> list[charts.DayColumn]:
    """The report's days as the chart draws them: (day, compute in use, idle, not measured,
    storage) micros, each series adding up to the figure the text gives."""
    return [
        (day.day, day.in_use_micros, day.idle_micros, day.unmeasured_micros, day.other_micros)
        for day in report.days
    ]


def _digest_files(notice: Digest) -> tuple[FileAttachment, ...]:
    """The month's spend per day as a PNG chart, shared in the digest's thread."""
    report = notice.data.report
    title = digest_chart_title(notice.data.month)
    chart = charts.daily_chart(title, day_columns(report), currency=report.currency)
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
