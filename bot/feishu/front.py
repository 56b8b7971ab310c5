"""Feishu messages run as `/gpu` commands, card clicks as button actions, answers as cards.

A text message is a command when it reads ``/gpu …`` or ``gpu …`` in a one-to-one chat with
the bot, or mentions the bot (``@gpubot …``, the ``/gpu`` then optional) there or in a group; a
group message that does not mention the bot is not the bot's. The command runs exactly as a
Slack one does (bot.listeners.execute_command, on the bot's executor and within its limits),
for the Caller ``feishu:<open_id>``, so every trust rule applies unchanged: admins are listed
in GPUBOT_FEISHU_ADMINS, and ``local`` answers as an instance that does not exist outside the
console. The answer is a card (``card_of``) in reply to the message, in its thread when it was
in one; what Slack shows only to the person (an ephemeral reply) goes to their one-to-one chat
with the bot when the command came from a group.

A click on a card's button (``card.action.trigger``) is authorised again for the person who
clicked, as Slack's buttons are (bot.listeners.execute_action): its answer replaces the card
(``replace_original``), goes to the clicker's one-to-one chat (ephemeral), or replies to the
card. The callback itself is answered at once, empty, or with a toast when the bot is too busy.

Everything sent goes through a :class:`FeishuSender` (bot.feishu.client.FeishuClient, or a
double in tests). Each answer carries a ``uuid`` made from the event id, so that Feishu posts
it once however often the event comes; a failure is logged, and an answer that could not be put
in the chat (refused, not of unknown outcome) goes to the person's one-to-one chat instead.
"""

from __future__ import annotations

import logging
import re
import uuid as uuid_module
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from bot.ack_path import Languages, submit_command
from bot.commands.registry import Registry, Reply, button_id
from bot.errors import GpubotError
from bot.executor import Busy
from bot.feishu.events import CardAction, MessageReceived
from bot.i18n import N_, speaking, t
from bot.listeners import (
    busy_text,
    execute_action,
    execute_command,
    remember_caller,
)
from bot.services.access import Caller

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

#: Turns a reply's text and blocks into a Feishu card (bot.feishu.cards.card_of).
CardOf = Callable[[str, Sequence[Mapping[str, Any]]], dict[str, Any]]
#: Reads a button's callback value as (action id, value) (bot.feishu.cards.action_of).
ActionOf = Callable[[Mapping[str, Any]], tuple[str, str]]
#: Said in a one-to-one chat to a message that is not a command.
NOT_A_COMMAND_NOTE = N_("To talk to the bot, send `/gpu help`.")
#: The longest ``uuid`` Feishu takes on a message (characters).
UUID_MAX_CHARS = 50
_COMMAND_PREFIX = re.compile(r"^(?:/gpu|gpu)(?:\s+|$)", re.IGNORECASE)


class FeishuSender(Protocol):
    """What the front needs of Feishu's OpenAPI (bot.feishu.client.FeishuClient). Each
    method raises a bot.errors.GpubotError subclass on failure, one with a true
    ``outcome_unknown`` when the message may have been posted all the same."""

    def send(
        self, receive_id_type: str, receive_id: str, card: dict[str, Any], *, uuid: str
    ) -> str:
        """Post ``card`` to a chat (``chat_id``) or a person (``open_id``); its message id."""
        ...

    def reply(self, message_id: str, card: dict[str, Any], *, uuid: str, in_thread: bool) -> str:
        """Post ``card`` in reply to ``message_id`` (in its thread); the new message's id."""
        ...

    def update(self, message_id: str, card: dict[str, Any]) -> None:
        """Replace the card of message ``message_id``."""
        ...


def command_text(event: MessageReceived) -> str | None:
    """The `/gpu` command a message holds (``""`` for a bare ``/gpu``), or None when it is not
    one for the bot (module docstring)."""
    text = event.text.strip()
    prefixed = _COMMAND_PREFIX.match(text)
    rest = text[prefixed.end() :].strip() if prefixed else text
    if event.chat_type == "p2p" and (prefixed or event.mentioned_bot):
        return rest
    if event.chat_type == "group" and event.mentioned_bot:
        return rest
    return None


class FeishuFront:
    """Runs Feishu messages and card clicks for ``rt`` through ``registry`` (module
    docstring). ``on_message`` and ``on_card_action`` return at once; the work runs on the
    runtime's executor, and notes that need none (busy, not a command) on ``notes`` (default:
    one thread of its own)."""

    def __init__(
        self,
        rt: Runtime,
        registry: Registry,
        sender: FeishuSender,
        *,
        card_of: CardOf,
        action_of: ActionOf,
        languages: Languages | None = None,
        notes: Executor | None = None,
    ) -> None:
        self.rt = rt
        self.registry = registry
        self.sender = sender
        self.card_of = card_of
        self.action_of = action_of
        self.languages = languages if languages is not None else Languages(rt)
        self.notes = (
            notes
            if notes is not None
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpubot-feishu-notes")
        )

    def on_message(self, event: MessageReceived) -> Future[None] | None:
        """Start the command ``event`` holds, if any: the command running on the executor, or
        None when none runs (not a command: a one-to-one message is told how to ask for help;
        the bot too busy: the person is told)."""
        text = command_text(event)
        if text is None:
            if event.chat_type == "p2p":
                with speaking(self.languages.known(event.user_id)):
                    note = Reply(text=t(NOT_A_COMMAND_NOTE))
                self.notes.submit(self._answer_message, event, note)
            return None
        caller = Caller(user_id=event.user_id, channel_id=event.chat_id)
        try:
            return submit_command(self.rt, caller, self._run_command, caller, text, event)
        except Busy as exc:
            with speaking(self.languages.known(caller.user_id)):
                note = Reply(text=busy_text(exc))
            self.notes.submit(self._answer_message, event, note)
            return None

    def on_card_action(self, event: CardAction) -> dict[str, Any]:
        """Run the button ``event`` clicked for its clicker; the callback's answer: empty, or
        a toast saying the bot is too busy (nothing was run)."""
        action_id, value = self._action(event.value)
        caller = Caller(user_id=event.user_id, channel_id=event.open_chat_id or None)
        try:
            submit_command(self.rt, caller, self._run_action, caller, action_id, value, event)
        except Busy as exc:
            with speaking(self.languages.known(caller.user_id)):
                # A toast is plain text: the reason without the message's emoji.
                return {"toast": {"type": "warning", "content": exc.user_text()}}
        return {}

    def close(self) -> None:
        """Stop the notes' thread (notes under way finish)."""
        self.notes.shutdown(wait=False)

    # --- on the executor ---------------------------------------------------------------------

    def _run_command(self, caller: Caller, text: str, event: MessageReceived) -> None:
        remember_caller(self.rt, caller)
        with speaking(self.languages.read(caller.user_id)):
            reply = execute_command(self.rt, self.registry, caller, text)
            self._answer_message(event, reply)

    def _run_action(self, caller: Caller, action_id: str, value: str, event: CardAction) -> None:
        if action_id in self.registry.actions and button_id(value) is not None:
            remember_caller(self.rt, caller)  # a malformed click reaches nothing
        with speaking(self.languages.read(caller.user_id)):
            reply = execute_action(self.rt, self.registry, caller, action_id, value)
            self._answer_click(event, reply)

    # --- answers -------------------------------------------------------------------------------

    def _answer_message(self, event: MessageReceived, reply: Reply) -> None:
        card = self._card(reply)
        uuid = _uuid("m", event.event_id)
        if reply.ephemeral and event.chat_type != "p2p":
            self._send_direct(event.open_id, card, uuid)
            return
        try:
            self.sender.reply(event.message_id, card, uuid=uuid, in_thread=bool(event.thread_id))
        except GpubotError as exc:
            self._failed("a reply to message %s", event.message_id, exc, event.open_id, card, uuid)

    def _answer_click(self, event: CardAction, reply: Reply) -> None:
        card = self._card(reply)
        uuid = _uuid("a", event.event_id)
        try:
            if reply.replace_original:
                self.sender.update(event.open_message_id, card)
            elif reply.ephemeral:
                self._send_direct(event.open_id, card, uuid)
            else:
                self.sender.reply(event.open_message_id, card, uuid=uuid, in_thread=False)
        except GpubotError as exc:
            self._failed(
                "the answer to card %s", event.open_message_id, exc, event.open_id, card, uuid
            )

    def _failed(
        self,
        what: str,
        where: str,
        exc: GpubotError,
        open_id: str,
        card: dict[str, Any],
        uuid: str,
    ) -> None:
        """Log a failed answer; one refused outright goes to the person's one-to-one chat."""
        if getattr(exc, "outcome_unknown", False):
            log.warning("Feishu may not have posted " + what + ": %s", where, exc.message)
            return
        log.warning("Feishu refused " + what + " (%s); sending it directly", where, exc.message)
        self._send_direct(open_id, card, _uuid("d", uuid))

    def _send_direct(self, open_id: str, card: dict[str, Any], uuid: str) -> None:
        try:
            self.sender.send("open_id", open_id, card, uuid=uuid)
        except GpubotError as exc:
            log.warning("could not send a card to %s: %s", open_id, exc.message)

    def _card(self, reply: Reply) -> dict[str, Any]:
        """The card of ``reply``; its text alone when its blocks cannot be made a card (a bug,
        logged: the person still gets the answer)."""
        try:
            return self.card_of(reply.text, reply.blocks)
        except ValueError:
            log.exception("a reply's blocks could not be made a Feishu card; sending its text")
            return self.card_of(reply.text, ())

    def _action(self, value: Mapping[str, Any]) -> tuple[str, str]:
        """The button's (action id, value); a value that cannot be read is ("", "") (answered
        as a button that does nothing any more)."""
        try:
            return self.action_of(value)
        except (GpubotError, ValueError, KeyError, TypeError):
            log.warning("a card button's value could not be read")
            return "", ""


def _uuid(kind: str, event_id: str) -> str:
    """A message's idempotency key: ``kind`` and the event id it answers (a fresh one when
    the event has none), at most :data:`UUID_MAX_CHARS` characters."""
    if not event_id:
        return f"{kind}-{uuid_module.uuid4().hex}"
    return f"{kind}-{event_id}"[:UUID_MAX_CHARS]
