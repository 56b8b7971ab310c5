"""One process, Slack and Feishu on one store: each message goes to the platform of its channel.

:class:`RoutingNotifier` is the bot's Notifier when it serves both (``gpubot feishu
--with-slack``), and when it serves Feishu alone. A channel is Feishu's when it is a person
``feishu:ou_...`` or a group ``oc_...`` (:func:`is_feishu`); anything else (``U...``, ``C...``,
``D...``) is Slack's. A :class:`bot.notify.MessageRef` holds the channel it was posted to, so an
update or a reply in a thread goes where its message is.

Where the bot speaks on its own in one place (the ops channel: escalations, budget alerts, the
digest, registrations, releases, the prompts about released instances), that place is **one
destination**, so each message is one outbox row posted once, as ever (:func:`ops_channel`):

- Slack alone: GPUBOT_CHANNEL;
- Feishu alone: GPUBOT_FEISHU_CHAT;
- both: GPUBOT_CHANNEL, or GPUBOT_FEISHU_CHAT when no Slack channel is set. The Feishu ops
  group then has the fleet's summary, pinned and kept up to date by the clock
  (bot.feishu.home.PinnedSummary), rather than a second copy of each message, whose buttons
  would answer twice and whose delivery could not be recorded once.

A person linked on both platforms (bot.services.speaking.identities) is their Slack ID: what
the bot tells them goes to Slack while Slack is served, and to their Feishu identity when only
Feishu is (``feishu_of``). A message for a platform that is not served is refused for good
(``channel_not_found``), so the outbox marks it failed and escalates, and never posts it twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from bot.errors import FeishuError, GpubotError, SlackError
from bot.i18n import N_, t
from bot.notify import MessageRef, Notifier
from bot.settings import FEISHU_USER_PREFIX, Settings

log = logging.getLogger(__name__)

#: Looks up the Feishu identity linked to a Slack ID (None: none). Raises StoreError.
FeishuOf = Callable[[str], str | None]

_NOT_SERVED = N_("{channel} is on {platform}, which this bot does not serve.")
_SERVE_HINT = N_("Run `gpubot feishu --with-slack` to serve both, or check where it was sent.")


def is_feishu(channel: str) -> bool:
    """Whether ``channel`` is Feishu's: a person ``feishu:ou_...`` or a group ``oc_...``."""
    return channel.startswith(FEISHU_USER_PREFIX) or channel.startswith("oc_")


def ops_channel(settings: Settings, *, slack: bool, feishu: bool) -> str | None:
    """The ops channel of a process serving ``slack`` and/or ``feishu`` (module docstring)."""
    if slack and settings.channel:
        return settings.channel
    if feishu:
        return settings.feishu_chat
    return settings.channel


class RoutingNotifier:
    """Sends Feishu's channels to ``feishu`` and the rest to ``slack`` (either None when that
    platform is not served); with no Slack, a Slack person linked to a Feishu identity
    (``feishu_of``) is reached there. Every method raises what the chosen notifier raises, or
    SlackError / FeishuError ``channel_not_found`` for a platform not served."""

    def __init__(
        self,
        *,
        slack: Notifier | None,
        feishu: Notifier | None,
        feishu_of: FeishuOf | None = None,
    ) -> None:
        self.slack = slack
        self.feishu = feishu
        self.feishu_of = feishu_of

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        """Post on the channel's platform (bot.notify.Notifier.post)."""
        notifier, where = self._route(channel)
        return notifier.post(where, text, blocks, thread_ts=thread_ts, key=key)

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        """Look on the channel's platform (bot.notify.Notifier.find)."""
        notifier, where = self._route(channel)
        return notifier.find(where, key, since=since)

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        """Replace the message where it was posted (its ref's channel)."""
        notifier, _ = self._route(ref.channel)
        notifier.update(ref, text, blocks)

    def upload_file(
        self,
        channel: str,
        filename: str,
        content: bytes,
        *,
        title: str,
        comment: str = "",
        thread_ts: str | None = None,
    ) -> None:
        """Share a file on the channel's platform (bot.notify.Notifier.upload_file)."""
        notifier, where = self._route(channel)
        notifier.upload_file(
            where, filename, content, title=title, comment=comment, thread_ts=thread_ts
        )

    def _route(self, channel: str) -> tuple[Notifier, str]:
        """The notifier for ``channel`` and the channel as it takes it."""
        if is_feishu(channel):
            if self.feishu is None:
                raise _not_served(channel, "Feishu", FeishuError)
            return self.feishu, channel
        if self.slack is not None:
            return self.slack, channel
        linked = self._linked(channel)
        if linked is not None and self.feishu is not None:
            return self.feishu, linked
        raise _not_served(channel, "Slack", SlackError)

    def _linked(self, channel: str) -> str | None:
        if self.feishu_of is None:
            return None
        try:
            return self.feishu_of(channel)
        except GpubotError as exc:
            log.warning("could not read the Feishu identity linked to %s: %s", channel, exc)
            return None


def _not_served(
    channel: str, platform: str, kind: type[SlackError] | type[FeishuError]
) -> GpubotError:
    return kind(
        t(_NOT_SERVED, channel=channel, platform=platform),
        error="channel_not_found",
        hint=t(_SERVE_HINT),
    )
