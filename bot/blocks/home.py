"""Block Kit for the Home tab: a :class:`~bot.services.home.HomeView` in, a Home view out
(``{"type": "home", "blocks": [...]}``, at most 100 blocks), in the active language.

Each of the person's instances has Extend 1h and Release buttons, each asking first in Slack's
own confirm dialog (Release is then the release button of `/gpu release`); the team's fleet is
one line per instance; a Register button opens the registration form.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.instances import RELEASE_CONFIRM, cost_rate, deadline_left, stopped_buttons
from bot.blocks.kit import (
    Block,
    actions,
    button,
    clip,
    code,
    confirm_dialog,
    context,
    divider,
    escape,
    header,
    home,
    mention,
    pack,
    section,
    when,
)
from bot.i18n import active_language, nt, t
from bot.services.home import FLEET_SHOWN, HomeInstance, HomeJob, HomeView, nearest_first
from bot.services.instances.views import STORAGE_HINT, InstanceBrief
from bot.values import format_duration, format_money

#: Button action ids: Extend 1h on one of the person's instances (its handler is in
#: bot.commands.home) and Register (the listeners open the registration form).
HOME_EXTEND = "home_extend_1h"
#: What the Extend button adds to the deadline.
HOME_EXTEND_BY = timedelta(hours=1)
HOME_REGISTER = "home_register"
#: The person's instances shown with their buttons (two blocks each), nearest deadline first:
#: about a screenful. The rest, whose deadlines are later, are collapsed into one line each
#: (up to LINES_SHOWN) and counted, with the command that lists them.
MINE_SHOWN = 10
#: The jobs and fleet lines shown; the rest are counted.
LINES_SHOWN = FLEET_SHOWN


def home_view(view: HomeView) -> dict[str, Any]:
    """The Home tab of ``view``'s person."""
    blocks: list[Block] = [header(t("Your GPUs")), *_mine(view)]
    blocks += [divider(), header(t("Your running jobs")), *_jobs(view)]
    blocks += [divider(), header(t("Your spend this month")), section(_spend(view))]
    blocks += [divider(), header(t("The team's fleet")), *_fleet(view)]
    blocks += [
        actions(
            [button(t("Register an instance"), HOME_REGISTER, "register", style="primary")],
            block_id="home-register",
        ),
        context(t("Updated {at}.", at=when(view.now, ZoneInfo(view.timezone)))),
    ]
    return home(blocks)


def _mine(view: HomeView) -> list[Block]:
    if not view.mine:
        return [
            section(
                t(
                    "You have no instances. Register one you rented with the button below, "
                    "or with `/gpu register`."
                )
            )
        ]
    mine = nearest_first(view.mine)
    blocks: list[Block] = []
    for item in mine[:MINE_SHOWN]:
        blocks.append(section(_mine_text(item, view.now), block_id=f"home-inst-{item.id}"))
        blocks.append(_home_buttons(item, view))
    rest = mine[MINE_SHOWN:]
    if rest:
        lines = [_collapsed_line(item, view.now) for item in rest[:LINES_SHOWN]]
        blocks += [section(text) for text in pack(lines)]
        blocks.append(
            context(
                nt(
                    "{n} more instance, with a later deadline; `/gpu status` lists them all.",
                    "{n} more instances, with later deadlines; `/gpu status` lists them all.",
                    len(rest),
                    n=len(rest),
                )
            )
        )
    return blocks


def _collapsed_line(item: HomeInstance, now: datetime) -> str:
    """One of the person's instances past the first screenful: its name and time left."""
    return f"*{escape(item.name)}*  ·  {_left(item, now)}"


def _mine_text(item: HomeInstance, now: datetime) -> str:
    facts = [_gpus(item), _util(item), _left(item, now), _rate(item)]
    cost = t("{cost} so far", cost=format_money(item.cost_micros, item.currency))
    return f"*{escape(item.name)}*  ·  " + "  ·  ".join([*facts, cost])


def _rate(item: HomeInstance) -> str:
    stopped = item.state == "stopped"
    return _rate_text(
        active_language(), item.burn_micros_per_hour, item.currency, stopped, item.storage_unknown
    )


@lru_cache(maxsize=1024)
def _rate_text(language: str, rate: int, currency: str, stopped: bool, unknown: bool) -> str:
    """:func:`cost_rate` in ``language`` (the active one): a team's instances share a few
    prices, so a long fleet formats each once."""
    return cost_rate(rate, currency, stopped=stopped, storage_unknown=unknown)


def _left(item: HomeInstance, now: datetime) -> str:
    return deadline_left(item.deadline_at, now, stopped=item.state == "stopped")


def _home_buttons(item: HomeInstance, view: HomeView) -> Block:
    """A stopped instance offers Start (where the bot can) and Release; a running one Extend
    1h (where the person may) and Release."""
    if item.state == "stopped":
        brief = InstanceBrief(
            name=item.name,
            owner_id=item.owner_id,
            provider="",
            price_micros_per_hour=item.price_micros_per_hour,
            currency=item.currency,
        )
        return stopped_buttons(brief, item.id, can_start=item.can_start)
    return actions(_buttons(item, view), block_id=f"home-actions-{item.id}")


def _buttons(item: HomeInstance, view: HomeView) -> list[Block]:
    """Extend 1h (where the person may: not past an admin's cap) and Release, each asking
    first in a confirm dialog."""
    extend = button(t("Extend 1h"), HOME_EXTEND, str(item.id), confirm=_extend_dialog(item, view))
    release = button(
        t("Release"),
        RELEASE_CONFIRM,
        str(item.id),
        style="danger",
        confirm=_release_dialog(item),
    )
    return [extend, release] if item.can_extend else [release]


def _extend_dialog(item: HomeInstance, view: HomeView) -> Block:
    added = HOME_EXTEND_BY
    values = {
        "name": escape(item.name),
        "at": when(max(item.deadline_at or view.now, view.now) + added, ZoneInfo(view.timezone)),
        "duration": format_duration(added),
    }
    if item.state == "stopped":
        what = t("*{name}* stays stopped, its disk kept, until {at} ({duration} more).", **values)
    else:
        what = t("*{name}* keeps running until {at} ({duration} more).", **values)
    if item.burn_micros_per_hour > 0:
        cost = format_money(item.burn_micros_per_hour * added // timedelta(hours=1), item.currency)
        what += " " + t("That costs about {cost} more.", cost=cost)
    elif item.storage_unknown:
        what += " " + t(STORAGE_HINT, name=item.name)
    return confirm_dialog(
        t("Extend {name} by {duration}?", name=item.name, duration=values["duration"]),
        what,
        confirm=t("Yes, extend"),
    )


def _release_dialog(item: HomeInstance) -> Block:
    cost = format_money(item.cost_micros, item.currency)
    if item.burn_micros_per_hour > 0:
        text = t(
            "Releasing *{name}* ends its {rate}/h; anything not saved off it is lost. "
            "It has cost {cost} so far.",
            name=escape(item.name),
            rate=format_money(item.burn_micros_per_hour, item.currency),
            cost=cost,
        )
    else:
        text = t(
            "Releasing *{name}* loses anything not saved off it. It has cost {cost} so far.",
            name=escape(item.name),
            cost=cost,
        )
    return confirm_dialog(
        t("Release {name}?", name=item.name),
        text,
        confirm=t("Yes, release it"),
    )


def _jobs(view: HomeView) -> list[Block]:
    if not view.jobs:
        return [context(t("No jobs of yours are running."))]
    lines = [_job_line(job, view.now) for job in view.jobs[:LINES_SHOWN]]
    blocks = [section(text) for text in pack(lines)]
    return _with_rest(blocks, len(view.jobs) - LINES_SHOWN)


def _job_line(job: HomeJob, now: datetime) -> str:
    command = code(clip(job.command, 120))
    if job.started_at is None:
        return t(
            "`#{id}` on *{name}*: {command}",
            id=job.id,
            name=escape(job.instance_name),
            command=command,
        )
    ran = format_duration(max(now - job.started_at, timedelta(0)))
    return t(
        "`#{id}` on *{name}*: {command}, running for {ran}",
        id=job.id,
        name=escape(job.instance_name),
        command=command,
        ran=ran,
    )


def _spend(view: HomeView) -> str:
    spent = format_money(view.spent_micros, view.currency)
    if view.budget_micros is None:
        return t(
            "{spent} in {month} so far. You have no monthly budget.",
            spent=spent,
            month=view.month,
        )
    pct = view.budget_used_pct or 0
    text = t(
        "{spent} of your {budget} budget in {month} ({pct}%).",
        spent=spent,
        budget=format_money(view.budget_micros, view.currency),
        month=view.month,
        pct=pct,
    )
    if pct >= 100:
        text += " " + t(":no_entry: It is used up: new rentals and extensions need an admin.")
    elif pct >= 80:
        text += " " + t(":warning: Most of it is spent.")
    return text


def _fleet(view: HomeView) -> list[Block]:
    count = view.fleet_count
    if not count:
        return [context(t("The team has no instances."))]
    lines = [_fleet_line(item, view.now) for item in view.fleet[:LINES_SHOWN]]
    blocks = [section(text) for text in pack(lines)]
    summary = nt(
        "{n} instance, {cost}/h together.",
        "{n} instances, {cost}/h together.",
        count,
        n=count,
        cost=format_money(view.fleet_burn_micros_per_hour, view.currency),
    )
    unknown = view.fleet_storage_unknown
    if unknown:
        summary += " " + nt(
            "Not counted: the disk of {n} stopped instance whose storage price is unknown.",
            "Not counted: the disks of {n} stopped instances whose storage price is unknown.",
            unknown,
            n=unknown,
        )
    blocks.append(context(summary))
    return _with_rest(blocks, count - min(len(view.fleet), LINES_SHOWN))


def _fleet_line(item: HomeInstance, now: datetime) -> str:
    facts = [mention(item.owner_id), _gpus(item), _util(item), _left(item, now), _rate(item)]
    return f"*{escape(item.name)}*  ·  " + "  ·  ".join(facts)


def _with_rest(blocks: Sequence[Block], left: int) -> list[Block]:
    if left <= 0:
        return list(blocks)
    return [*blocks, context(t("{n} more not shown.", n=left))]


def _gpus(item: HomeInstance) -> str:
    """The GPUs delivered, as the agent found them, marked where they are not what was
    rented; else what was rented."""
    if item.delivered_gpu_name:
        delivered = f"{item.delivered_gpu_count or 1}x {escape(item.delivered_gpu_name)}"
        rented = f"{item.gpu_count or 1}x {escape(item.gpu_model or '?')}"
        return t(":warning: {delivered} (rented {rented})", delivered=delivered, rented=rented)
    if not item.gpu_model:
        return t("GPUs not stated")
    return f"{item.gpu_count or 1}x {escape(item.gpu_model)}"


def _util(item: HomeInstance) -> str:
    if item.state == "stopped":
        return t("stopped")
    if item.util_pct is None:
        return t("utilisation unknown")
    return t("utilisation {pct}%", pct=item.util_pct)
