"""`/gpu spend`, `/gpu budget`, `/gpu fit` and `/gpu estimate`.

Handlers are thin: read the arguments, call the money services, render with bot.blocks.money.
Bad values raise UsageError before anything changes. `fit` and `estimate` quote the price table
of the configured currency (bot.services.money.price_tables), and say so where there is none.
"""

from __future__ import annotations

import argparse
import logging

from bot import charts
from bot.blocks import money as blocks
from bot.blocks.kit import context, escape
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import GpubotError, UsageError
from bot.i18n import N_, t
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.money import advice, budgets, ledger, price_tables, spend
from bot.values import parse_money, parse_price, whole_number

log = logging.getLogger(__name__)

SPEND_USAGE = "/gpu spend [YYYY-MM] [--by user|gpu|instance|project|provider] [--share]"
BUDGET_USAGE = (
    "/gpu budget list | /gpu budget set user @USER AMOUNT | /gpu budget set project P AMOUNT "
    "| /gpu budget rm user @USER | /gpu budget rm project P"
)
FIT_USAGE = (
    "/gpu fit SIZE[:BITS][+SIZE[:BITS]...] [inference|lora|qlora|full|推理|微调|全量] "
    "[--context N (or --seq N)] [--batch N] [--bits 16|8|4] [--headroom PCT]"
)
ESTIMATE_USAGE = N_(
    "/gpu estimate --gpu MODEL [--count N] --hours N [--price 2.10/h] [--monthly PRICE] "
    "[--buy PRICE] (--hours: each card's use a month; prices per card, times --count)"
)
_REMOVE_WORDS = frozenset({"rm", "remove", "delete", "del"})


# --- spend ------------------------------------------------------------------------------------


def _configure_spend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("month", nargs="?", metavar="YYYY-MM")
    parser.add_argument("--by", type=spend.parse_group, default="user")
    parser.add_argument("--share", action="store_true")


def _spend(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    settings = rt.settings
    now = rt.now()
    tz = settings.tz()
    month = spend.parse_month_arg(args.month, now, tz)
    report = spend.spend_report(
        rt.db,
        month,
        by=args.by,
        tz=tz,
        now=now,
        idle_threshold_pct=settings.idle_threshold_pct,
        currency=settings.currency,
    )
    shared = bool(args.share and report.instances and caller.channel_id)
    text, body = blocks.spend_message(report, shared=shared)
    if not shared:
        return Reply(text=text, blocks=body)
    problem = share_spend_files(rt, caller.channel_id or "", report)
    if problem:
        body = (*body, context(problem))
    return Reply(text=text, blocks=body, ephemeral=False)


def share_spend_files(rt: Runtime, channel: str, report: spend.SpendReport) -> str | None:
    """Upload the chart (PNG) and the CSV of a spend report; returns what went wrong, if
    anything (the report itself is still answered)."""
    title, csv_title = blocks.spend_file_titles(report)
    names = report.names if report.by == "user" else {}
    items = [
        (names.get(line.key) or blocks.group_name(line.key, report.by), line.total_micros)
        for line in report.groups
    ]
    try:
        rt.notifier.upload_file(
            channel,
            f"gpu-spend-{report.month}-by-{report.by}.png",
            charts.bar_chart(title, items, currency=report.currency),
            title=title,
        )
        rt.notifier.upload_file(
            channel,
            f"gpu-spend-{report.month}.csv",
            spend.spend_csv(report),
            title=csv_title,
        )
    except GpubotError as exc:
        log.warning("spend files for %s could not be uploaded: %s", report.month, exc)
        return t("The chart and CSV could not be uploaded: {problem}", problem=exc.message)
    return None


# --- budget -----------------------------------------------------------------------------------


def _configure_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", metavar="list|set|rm", type=str.lower)
    parser.add_argument("words", nargs="*", metavar="ARGS")


def _budget(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    action, words = args.action, list(args.words)
    now = rt.now()
    month = ledger.month_of(now, rt.settings.tz())
    currency = rt.settings.currency
    if action == "list":
        if words:
            raise UsageError(t("`budget list` takes no arguments."), usage=BUDGET_USAGE)
        text, body = blocks.budget_list_message(
            budgets.list_budgets(rt, now), month, currency, now=now, timezone=rt.settings.timezone
        )
        return Reply(text=text, blocks=body)
    if action == "set":
        if len(words) != 3:
            raise UsageError(
                t("`budget set` needs a kind, who and an amount."),
                usage=BUDGET_USAGE,
                hint=t(
                    "Like `/gpu budget set user @alice 500` or `/gpu budget set project llm 2000`."
                ),
            )
        scope = budgets.parse_scope(words[0])
        subject = budgets.resolve_subject(rt.db, scope, words[1], caller)
        status = budgets.set_budget(
            rt,
            caller,
            scope,
            subject,
            parse_money(words[2], currency),
            display_name=budgets.mention_name(words[1]),
        )
        text, body = blocks.budget_list_message(
            [status], month, currency, now=now, timezone=rt.settings.timezone
        )
        return Reply(text=t("Budget set. {summary}", summary=text), blocks=body, ephemeral=False)
    if action in _REMOVE_WORDS:
        if len(words) != 2:
            raise UsageError(
                t("`budget rm` needs a kind and who."),
                usage=BUDGET_USAGE,
                hint=t("Like `/gpu budget rm user @alice` or `/gpu budget rm project llm`."),
            )
        scope = budgets.parse_scope(words[0])
        subject = budgets.resolve_subject(rt.db, scope, words[1], caller)
        budgets.remove_budget(rt, caller, scope, subject)
        removed = (
            t("The budget of <@{user}> is removed.", user=subject)
            if scope == "user"
            else t("The budget of project {project} is removed.", project=escape(subject))
        )
        return Reply(text=removed, ephemeral=False)
    raise UsageError(t("`budget {action}` is not known.", action=action), usage=BUDGET_USAGE)


# --- fit and estimate ---------------------------------------------------------------------------


def _configure_fit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("size", metavar="SIZE")
    parser.add_argument("mode", metavar="MODE", nargs="?")
    parser.add_argument(
        "--context", "--seq", dest="seq", type=whole_number("--context", 1), metavar="N"
    )
    parser.add_argument("--batch", type=whole_number("--batch", 1), metavar="N")
    parser.add_argument("--bits", type=_bits, metavar="16|8|4")
    parser.add_argument("--headroom", type=advice.parse_headroom, metavar="PCT")


def _fit(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    currency = rt.settings.currency
    table = price_tables.table_for(currency)
    report = advice.fit(
        args.size,
        args.mode,
        seq=args.seq,
        batch=args.batch,
        bits=args.bits,
        headroom_pct=args.headroom,
        table=table or price_tables.unpriced(currency),
    )
    text, body = blocks.fit_message(report)
    if table is None:
        body = (*body, context(no_price_table(currency)))
    return Reply(text=text, blocks=body)


def _configure_estimate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", required=True, metavar="MODEL")
    parser.add_argument("--count", type=whole_number("--count", 1), default=1, metavar="N")
    parser.add_argument("--hours", required=True, type=advice.parse_hours, metavar="N")
    parser.add_argument("--price", metavar="2.10/h")
    parser.add_argument("--monthly", metavar="PRICE")
    parser.add_argument("--buy", metavar="PRICE")


def _estimate(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    currency = rt.settings.currency
    table = price_tables.table_for(currency)
    given = (
        None if args.price is None else parse_price(args.price, currency),
        None if args.monthly is None else parse_money(args.monthly, currency),
        None if args.buy is None else parse_money(args.buy, currency),
    )
    if table is None and given == (None, None, None):
        raise UsageError(
            no_price_table(currency),
            usage=ESTIMATE_USAGE,
            hint=t(
                "Give the prices per card: --price 2.10 (an hour), --monthly 1200, --buy 30000."
            ),
        )
    report = advice.estimate(
        args.gpu,
        hours=args.hours,
        count=args.count,
        hourly_micros=given[0],
        monthly_micros=given[1],
        buy_micros=given[2],
        table=table,
        currency=currency,
    )
    text, body = blocks.estimate_message(report, currency)
    if table is None:
        body = (*body, context(no_price_table(currency)))
    return Reply(text=text, blocks=body)


def no_price_table(currency: str) -> str:
    """What `fit` and `estimate` say where the bot has no price table in ``currency``."""
    return t(
        "The bot has no price table in {currency} (GPUBOT_CURRENCY), so it quotes no list "
        "prices rather than another currency's; it has tables in {tables}.",
        currency=currency,
        tables=", ".join(price_tables.currencies()),
    )


# --- values -----------------------------------------------------------------------------------


def _bits(text: str) -> int:
    if text.strip() not in ("16", "8", "4"):
        raise UsageError(
            t("--bits {value!r} is not supported.", value=text[:20]), hint=t("Use 16, 8 or 4.")
        )
    return int(text)


SPEND = CommandSpec(
    name="spend",
    summary=N_(
        "What a month cost (this month: so far, the open hour included, as budgets and "
        "status count it): by user, GPU, instance, project or provider; idle waste. Answered to "
        "you only; --share posts it with a chart and a CSV to the channel"
    ),
    usage=SPEND_USAGE,
    examples=("/gpu spend", "/gpu spend 2026-03 --by project --share"),
    configure=_configure_spend,
    handler=_spend,
)
BUDGET = CommandSpec(
    name="budget",
    summary=N_(
        "Monthly budgets per user or project, set by admins: alerts at 50/80/100%; "
        "past the cap, rentals and extensions need an admin"
    ),
    usage=BUDGET_USAGE,
    examples=(
        "/gpu budget list",
        "/gpu budget set user @alice 500",
        "/gpu budget set user U0123ABC 500",
        "/gpu budget set project llm 2000",
        "/gpu budget rm user @alice",
    ),
    configure=_configure_budget,
    handler=_budget,
    aliases=("budgets",),
)
FIT = CommandSpec(
    name="fit",
    summary=N_(
        "How much GPU memory a model needs, which GPUs hold it (comfortably or tightly) and "
        "what they cost: weights by precision, the KV cache for --context and --batch, training "
        "state, and --headroom (default 20%). Join models with + to ask whether they fit "
        "together, each with its own precision after a colon"
    ),
    usage=FIT_USAGE,
    examples=(
        "/gpu fit 7b lora",
        "/gpu fit 7b 推理 --bits 4",
        "/gpu fit 70b inference --context 8192 --headroom 30",
        "/gpu fit 7b:4bit+13b:4bit inference",
        "/gpu fit llama-3.1-70b full",
    ),
    configure=_configure_fit,
    handler=_fit,
)
ESTIMATE = CommandSpec(
    name="estimate",
    summary=N_(
        "A month of renting by the hour vs a monthly plan, and buying, with the "
        "break-evens at your pace: --hours is each card's use a month; --price, --monthly and "
        "--buy are per card and multiplied by --count"
    ),
    usage=ESTIMATE_USAGE,
    examples=(
        "/gpu estimate --gpu a100 --hours 50",
        "/gpu estimate --gpu 4090 --count 2 --hours 400 --monthly 350 --buy 1800",
    ),
    configure=_configure_estimate,
    handler=_estimate,
)


def register(registry: Registry) -> None:
    """Add this module's commands and buttons to ``registry``."""
    for spec in (
        SPEND,
        BUDGET,
        FIT,
        ESTIMATE,
    ):
        registry.command(spec)
