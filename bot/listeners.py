"""The Bolt listeners: ack at once, then parse, run the handler and answer on the bot's executor.

The executor admits a command only while it has room and the caller is under their limit
(bot.executor.BotExecutor); a command turned away is answered at once, ephemerally, unrun.
Listeners are thin: no SQL, no SSH. Errors the bot expects reach the user as an ephemeral
message; anything else is logged with an error id that the user is shown. A button's value is
the id of a row; one that is not (not a number, out of range, malformed) is answered at once
and reaches no handler. Whoever types a command or clicks is remembered (Slack ID and display
name), so `@name` in a later command finds them. Everything is said in the caller's language.

Forms: a `/gpu` command that names a form (``register`` without arguments, ``rent`` …) opens
it as a modal on the executor once the command is answered (its trigger id lasts 3 seconds; a
form that cannot open runs the command as typed); a submission is read by the form's own code
on the executor, and the listener waits up to :data:`FORM_ANSWER_WAIT_S` for it: mistakes are
shown on the form's fields, and the answer comes where the command was typed (the command's
response URL, kept in the view's private metadata; a direct message when Slack refuses that
URL, 30 minutes on, or when a button opened the form). A form sent again while
its submission runs, or after it was accepted, is closed without running twice.

The Home tab (:class:`HomeTabs`) is published when its person opens it, and again after each
of their commands and clicks, at most once every :data:`HOME_REFRESH_S` seconds; a click on
the Home has no response URL, so its answer comes as a direct message.

Every command, click, submission and Home opening runs under a request id of its own
(bot.logging_setup.request_context): each line logged for it, on the listener's thread and on
the executor's, carries the same ``request_id``.

The threads that ack never wait on the store (bot.ack_path): a command turned away is answered
in the language its caller was last spoken to in, the store's work runs on the executor, and a
command still waiting for a store that does not answer is told so.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from slack_bolt import Ack, App, Respond
from slack_sdk import WebClient

from bot.ack_path import (
    Languages,
    StoreWatch,
    in_this_context,
    submit_command,
)
from bot.blocks import home as home_blocks
from bot.blocks.forms import REGISTER_FORM
from bot.commands import forms as form_commands
from bot.commands.help import in_currency, usage_text
from bot.commands.parser import cut_echoes, parse
from bot.commands.registry import Registry, Reply, button_id
from bot.errors import GpubotError, UsageError
from bot.executor import Busy
from bot.i18n import N_, speaking, t
from bot.logging_setup import request_context
from bot.services import home
from bot.services.access import Caller
from bot.services.instances.lookup import ensure_person
from bot.services.speaking.people import language_for

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

#: The one slash command; deploy/manifest.yaml declares it.
SLASH_COMMAND = "/gpu"
#: Said of a button whose value is not an id.
BAD_BUTTON_NOTE = N_(
    "That button is out of date or malformed; run the command again for a new one."
)
#: The answer to a button whose value is not an id (in English; :func:`bad_button_text`).
BAD_BUTTON_TEXT = f":warning: {BAD_BUTTON_NOTE}"
#: How long a submission's listener waits for the form's answer before it closes the form
#: (Slack waits 3 seconds); an answer that comes later arrives as a direct message.
FORM_ANSWER_WAIT_S = 2.0
#: The key of a form's private metadata that holds where its answer goes.
FORM_REPLY_URL = "reply_url"
#: A person's Home tab is published again after their commands at most this often, seconds.
HOME_REFRESH_S = 10.0
#: The most forms (view ids) whose submission is remembered as running or accepted.
SUBMISSIONS_KEPT = 10_000

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Forms:
    """The modal forms the listeners open and read back (:func:`default_forms`: those of
    bot.commands.forms): the forms' callback ids, the form a `/gpu` text opens (None: none),
    a form's view, and a submission's outcome (``errors`` by block id, or a ``reply``)."""

    callback_ids: frozenset[str]
    form_for_command: Callable[[str], str | None]
    form_view: Callable[[Runtime, Caller, str], dict[str, Any]]
    submit_form: Callable[
        [Runtime, Caller, str, Mapping[str, Mapping[str, Any]]], form_commands.FormOutcome
    ]


def default_forms() -> Forms:
    """The bot's forms (bot.commands.forms)."""
    return Forms(
        callback_ids=frozenset(form_commands.FORM_CALLBACK_IDS),
        form_for_command=form_commands.form_for_command,
        form_view=form_commands.form_view,
        submit_form=form_commands.submit_form,
    )


def register_listeners(
    app: App,
    rt: Runtime,
    registry: Registry,
    *,
    forms: Forms | None = None,
    languages: Languages | None = None,
) -> HomeTabs:
    """Add the `/gpu` command (opening a form where the text names one), one listener for
    every registered button, the forms' submissions, the Home tab and the error handler.
    ``languages`` keeps what each person speaks, for answers given without the store (default:
    a new one). Returns the publisher of Home tabs."""
    form_set = forms if forms is not None else default_forms()
    homes = HomeTabs(rt, app.client, languages=languages)
    watch = StoreWatch(rt, homes.languages, tell=_tell)
    submissions = FormSubmissions()

    @app.command(SLASH_COMMAND)
    def on_command(ack: Ack, command: dict[str, Any], respond: Respond) -> None:
        with request_context():
            _on_command(ack, command, respond)

    def _on_command(ack: Ack, command: dict[str, Any], respond: Respond) -> None:
        caller = Caller(
            user_id=str(command.get("user_id", "")),
            channel_id=command.get("channel_id"),
            user_name=command.get("user_name"),
        )
        text = str(command.get("text") or "")
        callback_id = form_set.form_for_command(text)
        try:
            if callback_id:
                # The form opens on the executor: the listener returns at once (Bolt answers
                # Slack when it returns), and a form that cannot open runs the command as typed.
                trigger = str(command.get("trigger_id") or "")
                opening = FormOpening(
                    app.client,
                    form_set,
                    callback_id,
                    trigger,
                    reply_url=str(command.get("response_url") or ""),
                )
                running = submit_command(
                    rt,
                    caller,
                    _open_form_or_run,
                    rt,
                    registry,
                    homes,
                    caller,
                    text,
                    respond,
                    opening,
                )
            else:
                running = submit_command(
                    rt, caller, _run_command, rt, registry, homes, caller, text, respond
                )
        except Busy as exc:
            # Never the store on the thread that acks: the language last read for the caller.
            with speaking(homes.languages.known(caller.user_id)):
                ack(text=busy_text(exc), response_type="ephemeral")
            return
        ack()
        watch.watch(caller.user_id, running, respond)

    if registry.actions:

        @app.action(action_pattern(registry))
        def on_action(
            ack: Ack, body: dict[str, Any], action: dict[str, Any], respond: Respond
        ) -> None:
            with request_context():
                _on_action(ack, body, action, respond)

        def _on_action(
            ack: Ack, body: dict[str, Any], action: dict[str, Any], respond: Respond
        ) -> None:
            ack()
            caller = caller_of_action(body)
            action_id = str(action.get("action_id", ""))
            value = str(action.get("value") or "")
            answer = Answer(rt, caller, respond if body.get("response_url") else None)
            try:
                submit_command(
                    rt, caller, _run_action, rt, registry, homes, caller, action_id, value, answer
                )
            except Busy as exc:
                # A click's answer to the request is not shown: say it where its answer goes.
                with speaking(homes.languages.known(caller.user_id)):
                    answer.send(Reply(text=busy_text(exc)))

    @app.action(home_blocks.HOME_REGISTER)
    def on_home_register(ack: Ack, body: dict[str, Any]) -> None:
        ack()
        caller = caller_of_action(body)
        trigger = str(body.get("trigger_id") or "")
        opening = FormOpening(app.client, form_set, REGISTER_FORM, trigger)
        # On the executor: Bolt answers Slack only when the listener returns.
        with request_context():
            rt.executor.submit(in_this_context(_open_form_or_say_why), rt, caller, opening)

    if form_set.callback_ids:

        @app.view(callback_pattern(form_set.callback_ids))
        def on_submission(ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
            with request_context():
                submit_form(
                    ack, rt, form_set, homes, caller_of_action(body), view, submissions=submissions
                )

    @app.event("app_home_opened")
    def on_home_opened(event: dict[str, Any]) -> None:
        if event.get("tab") == "home" and event.get("user"):
            with request_context():
                homes.opened(str(event["user"]))

    @app.error
    def on_error(error: Exception, body: dict[str, Any]) -> None:
        kind = body.get("type") or body.get("command") or "request"
        log.error("unhandled error in a Slack listener (%s)", kind, exc_info=error)

    return homes


class HomeTabs:
    """Publishes people's Home tabs in their language (views.publish) on the runtime's
    executor: at once when one opens it, and after each of their commands and clicks at most
    once every ``every_s`` seconds (a change within that time is published when it ends).
    Only the Home of someone who opened it since the bot started is published again; a Slack
    or store failure is logged, never raised. One publication of a person's Home is under way
    at a time: one asked for meanwhile is built and sent once after it ends, so a slow
    views.publish holds no more threads and an older view never lands after a newer one."""

    def __init__(
        self,
        rt: Runtime,
        client: WebClient,
        *,
        every_s: float | None = None,
        languages: Languages | None = None,
    ) -> None:
        self.rt = rt
        self.client = client
        #: What each person speaks, as last read (``languages``, default a new one).
        self.languages = languages if languages is not None else Languages(rt)
        self.every_s = HOME_REFRESH_S if every_s is None else every_s
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._last: dict[str, float] = {}
        self._pending: dict[str, threading.Timer] = {}
        self._publishing: set[str] = set()
        self._again: set[str] = set()

    def opened(self, user_id: str) -> None:
        """``user_id`` opened their Home: publish it (on the executor)."""
        with self._lock:
            self._seen.add(user_id)
        self._submit(user_id)

    def changed(self, user_id: str) -> None:
        """A command or click of ``user_id`` completed: publish their Home now, or when the
        interval since the last one ends (nothing when they never opened it), on the executor
        apart from the command (a slow views.publish holds none of their commands' places)."""
        with self._lock:
            if user_id not in self._seen or user_id in self._pending:
                return
            wait_s = self._last.get(user_id, float("-inf")) + self.every_s - time.monotonic()
            if wait_s > 0:
                timer = threading.Timer(wait_s, self._due, args=(user_id,))
                timer.daemon = True
                self._pending[user_id] = timer
                timer.start()
                return
        self._submit(user_id)

    def publish(self, user_id: str) -> bool:
        """Build and publish the Home of ``user_id`` now (or, while one of theirs is under way,
        once more after it: True); False (logged) when that failed."""
        with self._lock:
            if user_id in self._publishing:
                self._again.add(user_id)
                return True
            self._publishing.add(user_id)
        while True:
            published = self._publish_once(user_id)
            with self._lock:
                if user_id not in self._again:
                    self._publishing.discard(user_id)
                    return published
                self._again.discard(user_id)

    def _publish_once(self, user_id: str) -> bool:
        with self._lock:
            self._last[user_id] = time.monotonic()
        try:
            with speaking(self.languages.read(user_id)):
                view = home_blocks.home_view(home.home_view(self.rt, user_id))
            self.client.views_publish(user_id=user_id, view=view)
        except Exception:  # the Home must never cost a command
            log.warning("could not publish the Home tab of %s", user_id, exc_info=True)
            return False
        return True

    def close(self) -> None:
        """Drop the publications waiting for their interval to end."""
        with self._lock:
            timers = list(self._pending.values())
            self._pending.clear()
        for timer in timers:
            timer.cancel()

    def _due(self, user_id: str) -> None:
        with self._lock:
            self._pending.pop(user_id, None)
        self._submit(user_id)

    def _submit(self, user_id: str) -> None:
        try:
            self.rt.executor.submit(self.publish, user_id)
        except RuntimeError:  # the executor is shut down: the bot is stopping
            log.debug("not publishing the Home tab of %s: shutting down", user_id)


class Answer:
    """Where the answer to a click goes: its response URL, or (a click on the Home tab,
    which has none) a direct message to the person who clicked."""

    def __init__(self, rt: Runtime, caller: Caller, respond: Respond | None) -> None:
        self.rt = rt
        self.caller = caller
        self.respond = respond

    def send(self, reply: Reply) -> None:
        """Send ``reply``; a failure is logged. One the response URL refuses (expired, used
        up) goes as a direct message instead; one whose outcome is unknown is not sent twice."""
        if self.respond is not None and send_reply(self.respond, reply):
            return
        send_direct(self.rt, self.caller.user_id, reply)


def open_form(
    client: WebClient,
    rt: Runtime,
    forms: Forms,
    caller: Caller,
    callback_id: str,
    trigger: str,
    *,
    reply_url: str = "",
) -> bool:
    """Open form ``callback_id`` for ``caller`` with ``trigger`` (views.open), in their
    language; False (logged) when it could not be opened. ``reply_url`` (the response URL of
    the command that opened it) is kept in the view, so that the answer goes where the command
    was typed."""
    if not trigger:
        return False
    try:
        with speaking(language_for(rt, caller.user_id)):
            view = forms.form_view(rt, caller, callback_id)
        if reply_url:
            view = {**view, "private_metadata": json.dumps({FORM_REPLY_URL: reply_url})}
        client.views_open(trigger_id=trigger, view=view)
    except Exception:  # the command then runs as typed
        log.warning("could not open the form %s for %s", callback_id, caller.user_id, exc_info=True)
        return False
    return True


def submit_form(
    ack: Ack,
    rt: Runtime,
    forms: Forms,
    homes: HomeTabs,
    caller: Caller,
    view: dict[str, Any],
    *,
    submissions: FormSubmissions,
) -> None:
    """Hand a form's submission to the executor and wait up to :data:`FORM_ANSWER_WAIT_S`
    for it: mistakes go back onto the form's fields; otherwise the form closes and the answer
    comes as a direct message. A form whose submission is running or was accepted is closed
    without running again (Slack sends it again when it missed the first answer)."""
    view_id = str(view.get("id") or "")
    if not submissions.claim(view_id):
        log.info("form %s of %s was sent again; not run twice", view_id, caller.user_id)
        ack()
        return
    callback_id = str(view.get("callback_id", ""))
    values = (view.get("state") or {}).get("values") or {}
    handover = _Handover()
    answer = _form_answer(rt, caller, view)
    try:
        submit_command(
            rt, caller, _run_form, rt, forms, homes, callback_id, values, handover, answer
        )
    except Busy as exc:
        submissions.release(view_id)
        with speaking(homes.languages.known(caller.user_id)):
            ack(response_action="errors", errors={first_input(view): busy_text(exc)})
        return
    errors = handover.wait(FORM_ANSWER_WAIT_S)
    if errors:
        submissions.release(view_id)  # the form stays open to be put right and sent again
        ack(response_action="errors", errors=errors)
    else:
        ack()


class FormSubmissions:
    """The forms (by view id) whose submission is running or was accepted, so that one sent
    twice (Slack repeats a submission whose answer it missed, and the person may press the
    button again) runs once. In this process only; the oldest of :data:`SUBMISSIONS_KEPT`
    are forgotten first."""

    def __init__(self, *, kept: int = SUBMISSIONS_KEPT) -> None:
        self._kept = kept
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def claim(self, view_id: str) -> bool:
        """True when the submission of ``view_id`` may run (a form without an id always may);
        False while one of it runs or after one was accepted."""
        if not view_id:
            return True
        with self._lock:
            if view_id in self._ids:
                return False
            self._ids[view_id] = None
            while len(self._ids) > self._kept:
                self._ids.popitem(last=False)
        return True

    def release(self, view_id: str) -> None:
        """The submission of ``view_id`` was not accepted: it may be sent again."""
        with self._lock:
            self._ids.pop(view_id, None)


class _Handover:
    """Who shows a submission's mistakes: the listener while it waits (on the form's fields),
    the worker once it stopped waiting (in a direct message)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._errors: dict[str, str] | None = None
        self._gone = False

    def settle(self, errors: dict[str, str]) -> bool:
        """The worker's outcome; True when the listener stopped waiting (the worker says it)."""
        with self._lock:
            self._errors = errors
            gone = self._gone
        self._done.set()
        return gone

    def wait(self, timeout_s: float) -> dict[str, str]:
        """The mistakes to show on the form (empty: close it)."""
        self._done.wait(timeout_s)
        with self._lock:
            if self._errors is None:
                self._gone = True
                return {}
            return self._errors


def _tell(respond: Respond, text: str) -> None:
    send_reply(respond, Reply(text=text))


def busy_text(exc: Busy) -> str:
    """The answer to a command turned away unrun."""
    return t(":hourglass: {reason}", reason=exc.user_text())


def bad_button_text() -> str:
    """The answer to a button whose value is not an id, in the active language."""
    return t(":warning: {problem}", problem=t(BAD_BUTTON_NOTE))


def action_pattern(registry: Registry) -> re.Pattern[str]:
    """A pattern matching exactly the registered action ids."""
    return callback_pattern(registry.actions)


def callback_pattern(ids: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching exactly ``ids``."""
    return re.compile("^(?:" + "|".join(re.escape(one) for one in sorted(ids)) + ")$")


def first_input(view: Mapping[str, Any]) -> str:
    """The block id of a view's first input block (where a form-wide message shows)."""
    for block in view.get("blocks") or []:
        if isinstance(block, dict) and block.get("type") == "input" and block.get("block_id"):
            return str(block["block_id"])
    return ""


def caller_of_action(body: Mapping[str, Any]) -> Caller:
    """Who clicked and in which channel, from a block_actions payload."""
    user = body.get("user") or {}
    channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get(
        "channel_id"
    )
    return Caller(
        user_id=str(user.get("id", "")),
        channel_id=channel,
        user_name=user.get("username") or user.get("name"),
    )


def execute_command(rt: Runtime, registry: Registry, caller: Caller, text: str) -> Reply:
    """Parse and run one `/gpu` command; every failure becomes an ephemeral reply."""
    try:
        spec, args = parse(text, registry)
        return spec.handler(rt, caller, args)
    except GpubotError as exc:
        return error_reply(exc, typed=text, currency=rt.settings.currency)
    except Exception:  # noqa: BLE001 - logged with an error id by crash_reply
        return crash_reply(f"/gpu {text[:200]!r}", caller)


def execute_action(
    rt: Runtime, registry: Registry, caller: Caller, action_id: str, value: str
) -> Reply:
    """Run one button's handler; every failure becomes an ephemeral reply."""
    spec = registry.actions.get(action_id)
    if spec is None:
        return Reply(text=t("This button no longer does anything; run the command again."))
    if button_id(value) is None:
        log.warning(
            "button %s by %s had a value that is no id: %r", action_id, caller.user_id, value[:40]
        )
        return Reply(text=bad_button_text())
    try:
        return spec.handler(rt, caller, value)
    except GpubotError as exc:
        return error_reply(exc, currency=rt.settings.currency)
    except Exception:  # noqa: BLE001 - logged with an error id by crash_reply
        return crash_reply(f"button {action_id}={value[:100]!r}", caller)


def error_reply(exc: GpubotError, *, typed: str = "", currency: str = "USD") -> Reply:
    """An ephemeral message for an error the bot expects: message, hint, usage line (its
    amounts as ``currency`` writes them); long words of the command the user ``typed`` are
    echoed cut."""
    lines = [t(":warning: {problem}", problem=cut_echoes(exc.user_text(), typed))]
    if isinstance(exc, UsageError) and exc.usage:
        lines.append(in_currency(usage_text(exc.usage), currency))
    return Reply(text="\n".join(lines))


def crash_reply(what: str, caller: Caller) -> Reply:
    """Log the current exception with a short error id and tell the user that id."""
    error_id = uuid.uuid4().hex[:8]
    log.exception("error id %s: %s by %s failed", error_id, what, caller.user_id)
    return Reply(
        text=t(
            ":x: Something went wrong (error id {error_id}); "
            "an admin can find it in the bot's log.",
            error_id=error_id,
        )
    )


def send_reply(respond: Respond, reply: Reply) -> bool:
    """Answer through the response URL; if Slack refuses the blocks, send the text alone.
    False when Slack refused it outright (nothing was shown); True when it was shown or its
    outcome is unknown (logged; sending it another way could show it twice)."""
    blocks = list(reply.blocks)
    response_type = "ephemeral" if reply.ephemeral else "in_channel"
    try:
        response = respond(
            text=reply.text,
            blocks=blocks or None,
            response_type=response_type,
            replace_original=reply.replace_original,
        )
        if response.status_code == 200:
            return True
        log.error("response URL refused a reply (%s): %s", response.status_code, response.body)
        if not blocks:
            return False
        response = respond(
            text=reply.text,
            response_type=response_type,
            replace_original=reply.replace_original,
        )
    except Exception:
        log.exception("could not send a reply through the response URL")
        return True
    return response.status_code == 200


def send_direct(rt: Runtime, user_id: str, reply: Reply) -> None:
    """Send ``reply`` to ``user_id`` as a direct message; if Slack refuses the blocks, the text
    alone. A failure is logged."""
    try:
        rt.notifier.post(user_id, reply.text, reply.blocks)
        return
    except GpubotError:
        if not reply.blocks:
            log.warning("could not send a direct message to %s", user_id, exc_info=True)
            return
        log.warning("Slack refused a direct message's blocks; sending its text", exc_info=True)
    try:
        rt.notifier.post(user_id, reply.text)
    except GpubotError:
        log.warning("could not send a direct message to %s", user_id, exc_info=True)


def remember_caller(rt: Runtime, caller: Caller) -> None:
    """Record the caller as a person the bot knows (their display name too, when Slack sent
    one), so `@name` finds them. A store failure is logged and never stops the command."""
    if not caller.user_id:
        return
    try:
        with rt.db.session() as session:
            ensure_person(session, caller.user_id, caller.user_name)
    except Exception:  # remembering a name must not cost the command
        log.warning("could not record %s as a person", caller.user_id, exc_info=True)


def _run_command(
    rt: Runtime,
    registry: Registry,
    homes: HomeTabs,
    caller: Caller,
    text: str,
    respond: Respond,
) -> None:
    remember_caller(rt, caller)
    with speaking(homes.languages.read(caller.user_id)):
        send_reply(respond, execute_command(rt, registry, caller, text))
    if text.split()[:1] == ["lang"]:
        homes.languages.read(caller.user_id)  # the answers given on the acking thread follow
    homes.changed(caller.user_id)


@dataclass(frozen=True)
class FormOpening:
    """What opening a form needs: the Slack client, the forms, which one, and the trigger."""

    client: WebClient
    forms: Forms
    callback_id: str
    trigger: str
    #: The response URL of the command that opened the form ("" when a button opened it).
    reply_url: str = ""


def _open_form_or_say_why(rt: Runtime, caller: Caller, opening: FormOpening) -> None:
    """Open the form a button asks for; if it cannot open, tell the person who clicked."""
    if opening.callback_id in opening.forms.callback_ids and open_form(
        opening.client, rt, opening.forms, caller, opening.callback_id, opening.trigger
    ):
        return
    _form_unavailable(rt, caller)


def _open_form_or_run(
    rt: Runtime,
    registry: Registry,
    homes: HomeTabs,
    caller: Caller,
    text: str,
    respond: Respond,
    opening: FormOpening,
) -> None:
    """Open the form the command asks for; if it cannot open, run the command as typed."""
    if open_form(
        opening.client,
        rt,
        opening.forms,
        caller,
        opening.callback_id,
        opening.trigger,
        reply_url=opening.reply_url,
    ):
        return
    _run_command(rt, registry, homes, caller, text, respond)


def _run_action(
    rt: Runtime,
    registry: Registry,
    homes: HomeTabs,
    caller: Caller,
    action_id: str,
    value: str,
    answer: Answer,
) -> None:
    well_formed = action_id in registry.actions and button_id(value) is not None
    if well_formed:
        remember_caller(rt, caller)  # a malformed click reaches nothing and changes nothing
    with speaking(language_for(rt, caller.user_id)):
        answer.send(execute_action(rt, registry, caller, action_id, value))
    if well_formed:
        homes.changed(caller.user_id)


def _run_form(
    rt: Runtime,
    forms: Forms,
    homes: HomeTabs,
    callback_id: str,
    values: Mapping[str, Mapping[str, Any]],
    handover: _Handover,
    answer: Answer,
) -> None:
    caller = answer.caller
    remember_caller(rt, caller)
    with speaking(language_for(rt, caller.user_id)):
        errors, reply = _form_outcome(rt, forms, caller, callback_id, values)
        late = handover.settle(errors)
        if errors and late:
            lines = [t(":warning: The form was not sent:"), *errors.values()]
            answer.send(Reply(text="\n".join(lines)))
        if reply is not None and (late or not errors):
            answer.send(reply)
    if not errors:
        homes.changed(caller.user_id)


def _form_answer(rt: Runtime, caller: Caller, view: Mapping[str, Any]) -> Answer:
    """Where a form's answer goes: the response URL of the command that opened it (kept in
    the view's private metadata), else a direct message (a form opened by a button)."""
    try:
        kept = json.loads(str(view.get("private_metadata") or "{}"))
    except ValueError:
        kept = {}
    url = kept.get(FORM_REPLY_URL) if isinstance(kept, dict) else None
    if not isinstance(url, str) or not url:
        return Answer(rt, caller, None)
    return Answer(rt, caller, Respond(response_url=url))


def _form_outcome(
    rt: Runtime,
    forms: Forms,
    caller: Caller,
    callback_id: str,
    values: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, str], Reply | None]:
    """A submission's mistakes by block id and its answer; a failure becomes an answer."""
    try:
        outcome = forms.submit_form(rt, caller, callback_id, values)
    except GpubotError as exc:
        return {}, error_reply(exc, currency=rt.settings.currency)
    except Exception:  # noqa: BLE001 - logged with an error id by crash_reply
        return {}, crash_reply(f"form {callback_id}", caller)
    return dict(outcome.errors), outcome.reply


def _form_unavailable(rt: Runtime, caller: Caller) -> None:
    with speaking(language_for(rt, caller.user_id)):
        text = t(
            ":warning: The registration form could not be opened; use "
            "`/gpu register NAME USER@HOST --gpu MODEL --price 2.10/h` instead."
        )
    send_direct(rt, caller.user_id, Reply(text=text))
