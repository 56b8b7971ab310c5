"""Block Kit for the notices of :mod:`bot.services.instances.rent`: `/gpu rent` under way, done
or failed, and a rental the bot never registered, terminated (or not) afterwards. Pure
functions, a notice in, ``(text, blocks)`` out.

Times arrive as naive UTC and are shown in the notice's time zone. Errors and ids from a
platform are escaped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

from bot.blocks.kit import (
    Message,
    escape,
    mention,
    when,
)
from bot.blocks.parts import plain, sentences
from bot.i18n import t
from bot.notify import Notice
from bot.providers.names import platform_name
from bot.services.instances.rent import (
    RentFailed,
    RentFinished,
    RentGivenBackFailed,
    RentLaunchChecked,
    RentRecovered,
    RentRecoverFailed,
    RentStarted,
)


def rent_started(notice: RentStarted) -> Message:
    """The immediate answer to `/gpu rent`."""
    return plain(
        sentences(
            t(
                ":hourglass_flowing_sand: Renting {count} x {instance_type} on {provider} as "
                "{names}.",
                count=len(notice.names),
                instance_type=escape(notice.instance_type),
                provider=platform_name(notice.provider),
                names=escape(", ".join(notice.names)),
            ),
            t(
                "I will post here once SSH answers and the health check ran (usually a few "
                "minutes)."
            ),
        )
    )


def rent_finished(notice: RentFinished) -> Message:
    """What `/gpu rent` achieved, posted when it is done."""
    lines = []
    if notice.registered:
        lines.append(
            sentences(
                t(
                    ":white_check_mark: {owner} rented on {provider} and registered: {names}.",
                    owner=mention(notice.owner_id),
                    provider=platform_name(notice.provider),
                    names=", ".join(f"*{escape(n)}*" for n in notice.registered),
                ),
                t("`/gpu status NAME` shows them."),
            )
        )
    for provider_id, why in notice.failed:
        lines.append(
            t(
                ":x: {provider} instance {provider_id} could not be registered and was "
                "terminated again: {why}",
                provider=platform_name(notice.provider),
                provider_id=escape(provider_id),
                why=escape(why),
            )
        )
    return plain(
        "\n".join(lines)
        or t("Nothing was rented on {provider}.", provider=platform_name(notice.provider))
    )


def rent_failed(notice: RentFailed) -> Message:
    """`/gpu rent` failed as a whole."""
    if notice.error is None:
        return plain(
            t(
                ":x: Renting on {provider} failed; see the bot's log.",
                provider=platform_name(notice.provider),
            )
        )
    return plain(
        t(
            ":x: Renting on {provider} failed: {error}",
            provider=platform_name(notice.provider),
            error=escape(notice.error),
        )
    )


def rent_given_back_failed(notice: RentGivenBackFailed) -> Message:
    """A rented instance that could not be registered nor terminated: it bills."""
    return plain(
        sentences(
            t(
                ":rotating_light: {provider} instance {provider_id} was rented but could not be "
                "registered ({why}), and terminating it failed: {error}.",
                provider=platform_name(notice.provider),
                provider_id=escape(notice.provider_id),
                why=escape(notice.why),
                error=escape(notice.error),
            ),
            t("Terminate it on the platform now; it is billing."),
        )
    )


def rent_recovered(notice: RentRecovered) -> Message:
    """A rental never registered (the bot stopped, say) was terminated."""
    launched = when(notice.launched_at, ZoneInfo(notice.tz_name))
    return plain(
        sentences(
            t(
                ":warning: {instance}, rented with /gpu rent at {at}, was never registered because "
                "{reason}.",
                instance=_rented(notice.provider, notice.provider_id, notice.name),
                at=launched,
                reason=escape(notice.reason),
            ),
            t("It has been terminated so it does not bill."),
            t("Rent again with /gpu rent if you still need it."),
        )
    )


def rent_recover_failed(notice: RentRecoverFailed) -> Message:
    """A rental never registered could not be terminated: it bills."""
    return plain(
        sentences(
            t(
                ":rotating_light: {instance} was rented with /gpu rent but never registered "
                "({reason}), and terminating it failed: {error}.",
                instance=_rented(notice.provider, notice.provider_id, notice.name),
                reason=escape(notice.reason),
                error=escape(notice.error),
            ),
            t("Terminate it on the platform now; it is billing."),
            t("The bot keeps trying."),
        )
    )


def rent_launch_checked(notice: RentLaunchChecked) -> Message:
    """A launch without an answer, checked: nothing was started."""
    return plain(
        sentences(
            t(
                ":information_source: Your /gpu rent of {instance_type} on {provider} at {at} "
                "got no answer from the platform.",
                instance_type=escape(notice.instance_type),
                provider=platform_name(notice.provider),
                at=when(notice.started_at, ZoneInfo(notice.tz_name)),
            ),
            t(
                "The bot checked: nothing was started under its name {platform_name}, so nothing "
                "bills.",
                platform_name=escape(notice.platform_name),
            ),
            t("Rent again if you still need it."),
        )
    )


def _rented(provider: str, provider_id: str, name: str | None) -> str:
    """A rented instance as ``lambda instance i-1 (box)``."""
    if name:
        return t(
            "{provider} instance {provider_id} ({name})",
            provider=platform_name(provider),
            provider_id=escape(provider_id),
            name=escape(name),
        )
    return t(
        "{provider} instance {provider_id}",
        provider=platform_name(provider),
        provider_id=escape(provider_id),
    )


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    RentStarted: rent_started,
    RentFinished: rent_finished,
    RentFailed: rent_failed,
    RentGivenBackFailed: rent_given_back_failed,
    RentRecovered: rent_recovered,
    RentRecoverFailed: rent_recover_failed,
    RentLaunchChecked: rent_launch_checked,
}
