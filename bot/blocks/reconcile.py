"""Block Kit for the notices of :mod:`bot.services.instances.reconcile`: an instance released,
stopped, started or moved on its platform without the bot, and one the team's platform account
holds that nobody registered. Pure functions, a notice (or view) in, ``(text, blocks)`` out.

Times arrive as naive UTC and are shown in the notice's time zone; money arrives in
micro-units. What a platform reports (ids, names, tags, states) is escaped and clipped.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.kit import (
    Message,
    clip,
    escape,
    fallback,
    mention,
    section,
    when,
)
from bot.blocks.parts import per_hour, plain, sentences, storage_note
from bot.i18n import t
from bot.notify import Notice
from bot.providers.names import platform_name
from bot.services.instances.reconcile import ReleasedOutside, UnregisteredFound
from bot.services.instances.views import UnregisteredView
from bot.values import format_duration, format_money


def released_outside(notice: ReleasedOutside) -> Message:
    """Reconcile found the instance gone, stopped, running again or at another address on the
    platform, without the bot: ``state`` terminated, stopped, started or moved."""
    inst = notice.instance
    if notice.state == "moved":
        return plain(
            t(
                ":information_source: *{name}* came back at `{address}` on {provider} "
                "(restarted there); the bot reaches it there now, and still expects the host key "
                "it pinned.",
                name=inst.name,
                address=notice.address,
                provider=platform_name(inst.provider),
            )
        )
    if notice.state == "started" and notice.by:
        text = t(
            ":arrow_forward: *{name}* was started again on {provider} by {user}; its meter runs "
            "again ({cost}).",
            name=inst.name,
            provider=platform_name(inst.provider),
            user=mention(notice.by),
            cost=per_hour(inst),
        )
    elif notice.state == "started":
        text = t(
            ":information_source: *{name}* was started again on {provider} outside the bot; its "
            "meter runs again ({cost}).",
            name=inst.name,
            provider=platform_name(inst.provider),
            cost=per_hour(inst),
        )
    if notice.state == "started":
        if notice.address:
            text = sentences(text, t("It came back at `{address}`.", address=notice.address))
        if notice.deadline_at is not None:
            text = sentences(
                text,
                t(
                    "Its new deadline is {at}; `/gpu extend {name}` moves it.",
                    at=when(notice.deadline_at, ZoneInfo(notice.tz_name)),
                    name=inst.name,
                ),
            )
        return plain(text)
    if notice.state == "stopped":
        return plain(
            sentences(
                t(
                    ":information_source: *{name}* was stopped on {provider} outside the bot; its "
                    "compute meter is stopped.",
                    name=inst.name,
                    provider=platform_name(inst.provider),
                ),
                storage_note(inst),
                _platform_release(notice),
            )
        )
    return plain(
        t(
            ":information_source: *{name}* was released on {provider} outside the bot; its "
            "meter is stopped.",
            name=inst.name,
            provider=platform_name(inst.provider),
        )
    )


def unregistered_found(notice: UnregisteredFound) -> Message:
    """For the ops channel: an instance nobody registered (see instances.unregistered_notice)."""
    return unregistered_notice(notice.view)


def unregistered_notice(view: UnregisteredView) -> Message:
    """For the ops channel: an instance the platform account holds that nobody registered, so
    nobody is reminded of it; what it costs, how long it runs, whose it may be, and how to take
    it over."""
    tz = ZoneInfo(view.timezone)
    what = f"`{escape(clip(view.provider_id, 100))}`"
    if view.name:
        what += f" ({escape(clip(view.name, 80))})"
    gpus = f"{view.gpu_count or 1}x {view.gpu_model}" if view.gpu_model else t("GPUs not stated")
    if view.price_micros_per_hour is None:
        cost = t("its price is not reported")
    else:
        price = format_money(view.price_micros_per_hour, view.currency)
        cost = t("costs {price}/h", price=price)
    if view.launched_at is None:
        age = t("running since it was started")
    else:
        ran = format_duration(max(view.now - view.launched_at, timedelta(0)))
        age = t("running for {ran} (since {start})", ran=ran, start=when(view.launched_at, tz))
    lines = [
        t(
            ":warning: *{provider}* instance {what} is {state} on the team's account, "
            "but nobody registered it: {gpus}, {cost}, {age}.",
            provider=escape(platform_name(view.provider)),
            what=what,
            state=escape(view.raw_state or view.state),
            gpus=escape(gpus),
            cost=cost,
            age=age,
        ),
    ]
    if view.tags:
        shown = ", ".join(f"{escape(clip(k, 40))}={escape(clip(v, 80))}" for k, v in view.tags[:10])
        lines.append(t("Tags: {tags}", tags=shown))
    lines.append(
        t(
            "Take it over with `/gpu adopt {provider} {id} NAME` (reminders and a deadline then "
            "apply), or release it on the platform if nobody needs it.",
            provider=escape(view.provider),
            id=escape(clip(view.provider_id, 100)),
        )
    )
    text = "\n".join(lines)
    return fallback(text), (section(text),)


def _platform_release(notice: ReleasedOutside) -> str:
    """When the platform itself releases the stopped instance (and its disk), where it says."""
    if notice.platform_release_at is None:
        return ""
    return t(
        "{provider} itself releases it, disk and data, at {at} unless it is started again.",
        provider=platform_name(notice.instance.provider),
        at=when(notice.platform_release_at, ZoneInfo(notice.tz_name)),
    )


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    ReleasedOutside: released_outside,
    UnregisteredFound: unregistered_found,
}
