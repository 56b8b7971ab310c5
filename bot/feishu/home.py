"""The Home on Feishu: `/gpu home` answers with the person's Home as a card, and the ops group
keeps the team's fleet in a pinned message that the clock brings up to date.

Feishu has no Home tab. A person asks for theirs with `/gpu home` (bot.services.home, drawn by
bot.blocks.home as on Slack, then made a card): in their one-to-one chat with the bot, or there
when they ask in a group, since it is theirs alone. Its buttons (Extend 1h, Release, Register)
answer as the Home tab's do.

The ops group (GPUBOT_FEISHU_CHAT) has :class:`PinnedSummary`: after each tick of the clock the
fleet's summary (bot.blocks.fleet_summary) is posted once, pinned (``im/v1/pins``), and from
then on updated in place, only when it reads differently. The message is kept in the store
(``ChatPin``), so a restart updates the same message. Posting uses a uuid made from the chat
and a generation, so a post whose answer was lost, or one made by two processes at once, is one
message within Feishu's hour; a message Feishu no longer takes (deleted, say) is forgotten and
posted anew on the next tick. Nothing here raises into the clock: failures are logged.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import exc as sa_exc

from bot.blocks import home as home_blocks
from bot.blocks.fleet_summary import pinned_summary
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import GpubotError
from bot.feishu import cards
from bot.feishu.client import message_uuid
from bot.i18n import N_, speaking, t
from bot.services import home
from bot.services.access import Caller
from bot.services.instances import fleet_views
from bot.store.models import ChatPin

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

HOME_COMMAND = "home"
#: Feishu's refusals that mean no retry can bring the pinned message back.
_GONE = frozenset({"invalid_arguments", "not_in_channel", "channel_not_found"})


class PinSender(Protocol):
    """What the pinned summary needs of Feishu (bot.feishu.client.FeishuClient). Each method
    raises bot.errors.FeishuError on failure."""

    def send(
        self, receive_id_type: str, receive_id: str, card: Mapping[str, Any], *, uuid: str
    ) -> str:
        """Post ``card`` to a chat; its message id."""
        ...

    def update(self, message_id: str, card: Mapping[str, Any]) -> None:
        """Replace the card of a message the bot sent."""
        ...

    def pin(self, message_id: str) -> None:
        """Pin a message in its chat."""
        ...


def with_home_command(registry: Registry) -> Registry:
    """A copy of ``registry`` that also answers `/gpu home` (when it does not already)."""
    both = Registry(commands=dict(registry.commands), actions=dict(registry.actions))
    if HOME_COMMAND not in both.commands:
        both.command(
            CommandSpec(
                name=HOME_COMMAND,
                summary=N_("Your Home: your GPUs, jobs, spend and the team's fleet."),
                usage="/gpu home",
                examples=("/gpu home",),
                configure=_no_arguments,
                handler=handle_home,
                aliases=("主页",),
            )
        )
    return both


def handle_home(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """The caller's Home, to them alone. Raises StoreError."""
    tab = home_blocks.home_view(home.home_view(rt, caller.user_id))
    blocks: Sequence[dict[str, Any]] = tab["blocks"]
    return Reply(text=t("Your Home"), blocks=tuple(blocks), ephemeral=True)


class PinnedSummary:
    """The fleet's summary pinned in ``chat_id`` through ``sender`` (module docstring);
    :meth:`refresh` is the clock's after-tick step."""

    def __init__(self, rt: Runtime, sender: PinSender, chat_id: str) -> None:
        self.rt = rt
        self.sender = sender
        self.chat_id = chat_id
        self._shown: str | None = None
        self._generation = 0

    def refresh(self) -> None:
        """Post and pin the summary, or update it in place when it reads differently."""
        try:
            card = self._card()
        except GpubotError as exc:
            log.warning("the fleet's summary could not be read for Feishu: %s", exc)
            return
        shown = json.dumps(card, sort_keys=True, ensure_ascii=False)
        if shown == self._shown:
            return
        try:
            message_id = self._stored()
            if message_id is None:
                self._post(card)
            else:
                self._update(message_id, card)
        except GpubotError as exc:
            log.warning(
                "the pinned summary in %s was not brought up to date: %s", self.chat_id, exc
            )
            return
        self._shown = shown

    def _card(self) -> dict[str, Any]:
        summary = fleet_views.fleet_summary(self.rt)
        settings = self.rt.settings
        with speaking(None):
            text, blocks = pinned_summary(
                summary, currency=settings.currency, timezone=settings.timezone
            )
        return cards.card_of(text, blocks)

    def _post(self, card: dict[str, Any]) -> None:
        """Send, pin, then keep the message: a pin that fails leaves nothing kept, so the next
        tick sends again with the same uuid (the same message) and pins it."""
        uuid = message_uuid("pinned-summary", self.chat_id, str(self._generation))
        message_id = self.sender.send("chat_id", self.chat_id, card, uuid=uuid)
        self.sender.pin(message_id)
        with self.rt.db.session() as session:
            try:
                with session.begin_nested():
                    session.add(
                        ChatPin(
                            chat_id=self.chat_id, message_id=message_id, pinned_at=self.rt.now()
                        )
                    )
            except sa_exc.IntegrityError:
                log.info("another process keeps the pinned summary of %s", self.chat_id)

    def _update(self, message_id: str, card: dict[str, Any]) -> None:
        try:
            self.sender.update(message_id, card)
        except GpubotError as exc:
            if getattr(exc, "outcome_unknown", False) or getattr(exc, "error", "") not in _GONE:
                raise
            log.warning("the pinned summary %s is gone (%s); posting it anew", message_id, exc)
            self._forget(message_id)
            raise

    def _stored(self) -> str | None:
        with self.rt.db.session() as session:
            row = session.get(ChatPin, self.chat_id)
            return None if row is None else row.message_id

    def _forget(self, message_id: str) -> None:
        self._generation += 1
        with self.rt.db.session() as session:
            row = session.get(ChatPin, self.chat_id)
            if row is not None and row.message_id == message_id:
                session.delete(row)


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    return None
