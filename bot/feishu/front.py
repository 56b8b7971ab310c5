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

Forms: a command that opens a Slack modal (``/gpu register`` or ``/gpu rent`` typed alone,
bot.listeners.Forms) is answered with the same form as a card form (bot.feishu.cards.form_of),
sent where only its person sees it (in reply in a one-to-one chat, else to their one-to-one
chat), and so is the Home card's *Register* button; a form that cannot be made runs the command
as typed. Its submission (a ``card.action.trigger`` carrying ``form_value``) is read back as
Slack's view state (bot.feishu.cards.submission_of) and run by the form's own code
(bot.commands.forms), for the person who submitted it: mistakes come back on the form, which
keeps what was typed; otherwise the form is closed (its card says it was sent) and the answer
goes where the command was typed (kept in the form's private metadata). A form submitted again
while its submission runs, or after it was accepted, does not run again
(bot.listeners.FormSubmissions, by the form card's message id).

Everything sent goes through a :class:`FeishuSender` (bot.feishu.client.FeishuClient, or a
double in tests); an answer Feishu asks to slow down for (a chat takes 5 messages a second)
is sent again after Feishu's wait, a few times. Each answer carries a ``uuid`` made from the
event id, so that Feishu posts it once however often the event comes; a failure is logged, and
an answer that could not be put in the chat (refused, not of unknown outcome) goes to the
person's one-to-one chat instead.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid as uuid_module
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from bot.ack_path import Languages, submit_command
from bot.blocks.forms import REGISTER_FORM
from bot.blocks.home import HOME_REGISTER
from bot.commands.registry import Registry, Reply, button_id
from bot.errors import GpubotError
from bot.executor import Busy
from bot.feishu import cards
from bot.feishu.cards import Submission
from bot.feishu.events import CardAction, MessageReceived
from bot.feishu.notifier import slowed
from bot.i18n import N_, speaking, t
from bot.listeners import (
    Forms,
    FormSubmissions,
    busy_text,
    crash_reply,
    default_forms,
    error_reply,
    execute_action,
    execute_command,
    remember_caller,
)
from bot.services.access import Caller
from bot.services.speaking import identities

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

#: Turns a reply's text and blocks into a Feishu card (bot.feishu.cards.card_of).
CardOf = Callable[[str, Sequence[Mapping[str, Any]]], dict[str, Any]]
#: Reads a button's callback value as (action id, value) (bot.feishu.cards.action_of).
ActionOf = Callable[[Mapping[str, Any]], tuple[str, str]]
#: A modal view as a card form (bot.feishu.cards.form_of).
FormOf = Callable[..., dict[str, Any]]
#: A form's submission read back as Slack's view state (bot.feishu.cards.submission_of).
SubmissionOf = Callable[[Mapping[str, Any], Mapping[str, Any]], Submission]
#: Said in a one-to-one chat to a message that is not a command.
NOT_A_COMMAND_NOTE = N_("To talk to the bot, send `/gpu help`.")
#: What a form's card says once its submission was accepted.
FORM_SENT_NOTE = N_(":white_check_mark: The form was sent.")
#: The key of a form's private metadata that holds where its answer goes.
FORM_ANSWER_TO = "feishu_answer_to"
#: The longest ``uuid`` Feishu takes on a message (characters).
UUID_MAX_CHARS = 50
#: How many times an answer Feishu asked to slow down is sent again, after its wait.
RATE_LIMIT_RETRIES = 3
T = TypeVar("T")
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


@dataclass(frozen=True)
class Where:
    """Where a command's answers go: in reply to ``message_id`` (in its thread when
    ``in_thread``); what only its person (``open_id``) sees goes to their one-to-one chat
    unless the message is in it (``p2p``)."""

    message_id: str
    open_id: str
    in_thread: bool = False
    p2p: bool = True

    @classmethod
    def of(cls, event: MessageReceived) -> Where:
        """Where the answers to the message ``event`` go."""
        return cls(event.message_id, event.open_id, bool(event.thread_id), event.chat_type == "p2p")


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
        sleep: Callable[[float], None] = time.sleep,
        forms: Forms | None = None,
        form_of: FormOf = cards.form_of,
        submission_of: SubmissionOf = cards.submission_of,
    ) -> None:
        self.rt = rt
        self.registry = registry
        self.sender = sender
        self.card_of = card_of
        self.action_of = action_of
        self.forms = forms if forms is not None else default_forms()
        self.form_of = form_of
        self.submission_of = submission_of
        self.submissions = FormSubmissions()
        self.sleep = sleep
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
        form_id = self.forms.form_for_command(text)
        try:
            if form_id:
                return submit_command(
                    self.rt, caller, self._open_form_or_run, caller, text, event, form_id
                )
            return submit_command(self.rt, caller, self._run_command, caller, text, event)
        except Busy as exc:
            with speaking(self.languages.known(caller.user_id)):
                note = Reply(text=busy_text(exc))
            self.notes.submit(self._answer_message, event, note)
            return None

    def on_card_action(self, event: CardAction) -> dict[str, Any]:
        """Run the button ``event`` clicked for its clicker; the callback's answer: empty, or
        a toast saying the bot is too busy (nothing was run). A form's submit button hands its
        form to the form's code (module docstring)."""
        if cards.CALLBACK_ID in event.value:
            return self._on_submission(event)
        action_id, value = self._action(event.value)
        caller = Caller(user_id=event.user_id, channel_id=event.open_chat_id or None)
        try:
            if action_id == HOME_REGISTER:
                where = Where(event.open_message_id, event.open_id, p2p=False)
                submit_command(
                    self.rt, caller, self._open_form, caller, where, event.event_id, REGISTER_FORM
                )
            else:
                submit_command(self.rt, caller, self._run_action, caller, action_id, value, event)
        except Busy as exc:
            return self._busy_toast(caller, exc)
        return {}

    def close(self) -> None:
        """Stop the notes' thread (notes under way finish)."""
        self.notes.shutdown(wait=False)

    def _on_submission(self, event: CardAction) -> dict[str, Any]:
        """Run a form's submission once (the callback's answer as in :meth:`on_card_action`)."""
        try:
            submission = self.submission_of(event.value, event.form_value)
        except (ValueError, KeyError, TypeError):
            log.warning("a card form's submission could not be read")
            return {}
        if submission.callback_id not in self.forms.callback_ids:
            log.warning("a card form %r the bot does not have", submission.callback_id[:40])
            return {}
        form = event.open_message_id
        if not self.submissions.claim(form):
            log.info("form %s of %s was sent again; not run twice", form, event.user_id)
            return {}
        caller = Caller(user_id=event.user_id, channel_id=event.open_chat_id or None)
        try:
            submit_command(self.rt, caller, self._run_form, caller, submission, event)
        except Busy as exc:
            self.submissions.release(form)
            return self._busy_toast(caller, exc)
        return {}

    def _busy_toast(self, caller: Caller, exc: Busy) -> dict[str, Any]:
        with speaking(self.languages.known(caller.user_id)):
            # A toast is plain text: the reason without the message's emoji.
            return {"toast": {"type": "warning", "content": exc.user_text()}}

    # --- on the executor ---------------------------------------------------------------------

    def _run_command(self, caller: Caller, text: str, event: MessageReceived) -> None:
        caller = identities.resolve(self.rt, caller)
        remember_caller(self.rt, caller)
        with speaking(self.languages.read(caller.user_id)):
            reply = execute_command(self.rt, self.registry, caller, text)
            self._answer_message(event, reply)

    def _open_form_or_run(
        self, caller: Caller, text: str, event: MessageReceived, form_id: str
    ) -> None:
        """Send the form the command asks for; if it cannot be made, run the command as typed."""
        if not self._open_form(caller, Where.of(event), event.event_id, form_id):
            self._run_command(caller, text, event)

    def _open_form(self, caller: Caller, where: Where, event_id: str, form_id: str) -> bool:
        """Send form ``form_id`` to ``caller`` only (its answer to go to ``where``); False
        (logged) when it could not be made."""
        caller = identities.resolve(self.rt, caller)
        remember_caller(self.rt, caller)
        with speaking(self.languages.read(caller.user_id)):
            try:
                view = self.forms.form_view(self.rt, caller, form_id)
                answer_to = {"m": where.message_id, "t": where.in_thread, "p": where.p2p}
                metadata = json.dumps({FORM_ANSWER_TO: answer_to})
                card = self.form_of({**view, "private_metadata": metadata})
            except Exception:  # the command then runs as typed
                log.warning(
                    "could not make the form %s for %s", form_id, caller.user_id, exc_info=True
                )
                return False
        self._deliver(where, card, _uuid("o", event_id), only_them=True)
        return True

    def _run_form(self, caller: Caller, submission: Submission, event: CardAction) -> None:
        caller = identities.resolve(self.rt, caller)
        remember_caller(self.rt, caller)
        with speaking(self.languages.read(caller.user_id)):
            errors, reply = self._form_outcome(caller, submission)
            if errors:
                self.submissions.release(event.open_message_id)  # to be put right, sent again
                self._update(event.open_message_id, self._form_again(caller, submission, errors))
                return
            self._update(event.open_message_id, self.card_of(t(FORM_SENT_NOTE), ()))
            if reply is not None:
                where = _answer_to(submission, event)
                self._deliver(where, self._card(reply), _uuid("f", event.event_id), reply.ephemeral)

    def _form_outcome(
        self, caller: Caller, submission: Submission
    ) -> tuple[dict[str, str], Reply | None]:
        """A submission's mistakes by block id and its answer; a failure becomes an answer."""
        try:
            outcome = self.forms.submit_form(
                self.rt, caller, submission.callback_id, submission.values
            )
        except GpubotError as exc:
            return {}, error_reply(exc, currency=self.rt.settings.currency)
        except Exception:  # noqa: BLE001 - logged with an error id by crash_reply
            return {}, crash_reply(f"form {submission.callback_id}", caller)
        return dict(outcome.errors), outcome.reply

    def _form_again(
        self, caller: Caller, submission: Submission, errors: Mapping[str, str]
    ) -> dict[str, Any]:
        """The form once more, holding what was submitted, each mistake under its field (the
        mistakes alone when the form cannot be made again)."""
        try:
            view = self.forms.form_view(self.rt, caller, submission.callback_id)
            view = {**view, "private_metadata": submission.private_metadata}
            return self.form_of(view, values=submission.values, errors=errors)
        except Exception:
            log.warning("could not make the form %s again", submission.callback_id, exc_info=True)
            lines = [t(":warning: The form was not sent:"), *errors.values()]
            return self.card_of("\n".join(lines), ())

    def _run_action(self, caller: Caller, action_id: str, value: str, event: CardAction) -> None:
        caller = identities.resolve(self.rt, caller)
        if action_id in self.registry.actions and button_id(value) is not None:
            remember_caller(self.rt, caller)  # a malformed click reaches nothing
        with speaking(self.languages.read(caller.user_id)):
            reply = execute_action(self.rt, self.registry, caller, action_id, value)
            self._answer_click(event, reply)

    # --- answers -------------------------------------------------------------------------------

    def _answer_message(self, event: MessageReceived, reply: Reply) -> None:
        self._deliver(
            Where.of(event), self._card(reply), _uuid("m", event.event_id), reply.ephemeral
        )

    def _deliver(self, where: Where, card: dict[str, Any], uuid: str, only_them: bool) -> None:
        """Put ``card`` in reply at ``where``; one only its person may see (``only_them``) goes
        to their one-to-one chat when ``where`` is not in it."""
        if only_them and not where.p2p:
            self._send_direct(where.open_id, card, uuid)
            return
        try:
            self._slowed(
                lambda: self.sender.reply(
                    where.message_id, card, uuid=uuid, in_thread=where.in_thread
                )
            )
        except GpubotError as exc:
            self._failed("a reply to message %s", where.message_id, exc, where.open_id, card, uuid)

    def _update(self, message_id: str, card: dict[str, Any]) -> None:
        """Replace the card of ``message_id``; a failure is logged."""
        try:
            self._slowed(lambda: self.sender.update(message_id, card))
        except GpubotError as exc:
            log.warning("could not update the card %s: %s", message_id, exc.message)

    def _slowed(self, call: Callable[[], T]) -> T:
        """``call``, made again after Feishu's wait, at most :data:`RATE_LIMIT_RETRIES` more
        times (bot.feishu.notifier.slowed)."""
        return slowed(call, retries=RATE_LIMIT_RETRIES, sleep=self.sleep)

    def _answer_click(self, event: CardAction, reply: Reply) -> None:
        card = self._card(reply)
        uuid = _uuid("a", event.event_id)
        try:
            if reply.replace_original:
                self._slowed(lambda: self.sender.update(event.open_message_id, card))
            elif reply.ephemeral:
                self._send_direct(event.open_id, card, uuid)
            else:
                self._slowed(
                    lambda: self.sender.reply(
                        event.open_message_id, card, uuid=uuid, in_thread=False
                    )
                )
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
            self._slowed(lambda: self.sender.send("open_id", open_id, card, uuid=uuid))
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


def _answer_to(submission: Submission, event: CardAction) -> Where:
    """Where a form's answer goes: where the command that opened it was typed (its private
    metadata), else in reply to the form's card."""
    try:
        kept = json.loads(submission.private_metadata or "{}")
    except ValueError:
        kept = {}
    spot = kept.get(FORM_ANSWER_TO) if isinstance(kept, dict) else None
    if isinstance(spot, dict) and isinstance(spot.get("m"), str) and spot["m"]:
        return Where(spot["m"], event.open_id, bool(spot.get("t")), bool(spot.get("p", True)))
    return Where(event.open_message_id, event.open_id)


def _uuid(kind: str, event_id: str) -> str:
    """A message's idempotency key: ``kind`` and the event id it answers (a fresh one when
    the event has none), at most :data:`UUID_MAX_CHARS` characters."""
    if not event_id:
        return f"{kind}-{uuid_module.uuid4().hex}"
    return f"{kind}-{event_id}"[:UUID_MAX_CHARS]
