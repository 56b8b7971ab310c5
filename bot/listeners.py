"""The Bolt listeners: ack at once, then parse, run the handler and answer on the bot's executor.

The executor admits a command only while it has room and the caller is under their limit
(bot.executor.BotExecutor); a command turned away is answered at once, ephemerally, unrun.
Listeners are thin: no SQL, no SSH. Errors the bot expects reach the user as an ephemeral
message; anything else is logged with an error id that the user is shown. A button's value is
the id of a row; one that is not (not a number, out of range, malformed) is answered at once
and reaches no handler. Whoever types a command or clicks is remembered (Slack ID and display
name), so `@name` in a later command finds them.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from slack_bolt import Ack, App, Respond

from bot.commands.help import usage_text
from bot.commands.parser import parse
from bot.commands.registry import Registry, Reply
from bot.errors import GpubotError, UsageError
from bot.executor import BotExecutor, Busy
from bot.i18n import speaking
from bot.services.access import Caller
from bot.services.lookup import ensure_person
from bot.services.people import language_for

if TYPE_CHECKING:
    from bot.runtime import Runtime
from bot.store.models import MAX_ROW_ID

log = logging.getLogger(__name__)

#: The one slash command; deploy/manifest.yaml declares it.
SLASH_COMMAND = "/gpu"
#: The largest id a button may carry (a larger one overflows an id column on PostgreSQL).
MAX_BUTTON_ID = MAX_ROW_ID
#: The answer to a button whose value is not an id.
BAD_BUTTON_TEXT = (
    ":warning: That button is out of date or malformed; run the command again for a new one."
)
_BUTTON_ID = re.compile(r"[1-9][0-9]{0,9}")

P = ParamSpec("P")
T = TypeVar("T")


def register_listeners(app: App, rt: Runtime, registry: Registry) -> None:
    """Add the `/gpu` command, one listener for every registered button, and the error handler."""

    @app.command(SLASH_COMMAND)
    def on_command(ack: Ack, command: dict[str, Any], respond: Respond) -> None:
        caller = Caller(
            user_id=str(command.get("user_id", "")),
            channel_id=command.get("channel_id"),
            user_name=command.get("user_name"),
        )
        text = str(command.get("text") or "")
        try:
            submit_command(rt, caller, _run_command, rt, registry, caller, text, respond)
        except Busy as exc:
            ack(text=busy_text(exc), response_type="ephemeral")
            return
        ack()

    if registry.actions:

        @app.action(action_pattern(registry))
        def on_action(
            ack: Ack, body: dict[str, Any], action: dict[str, Any], respond: Respond
        ) -> None:
            ack()
            caller = caller_of_action(body)
            action_id = str(action.get("action_id", ""))
            value = str(action.get("value") or "")
            try:
                submit_command(
                    rt, caller, _run_action, rt, registry, caller, action_id, value, respond
                )
            except Busy as exc:
                # A click's answer to the request is not shown: say it through the response URL.
                send_reply(respond, Reply(text=busy_text(exc)))

    @app.error
    def on_error(error: Exception, body: dict[str, Any]) -> None:
        kind = body.get("type") or body.get("command") or "request"
        log.error("unhandled error in a Slack listener (%s)", kind, exc_info=error)


def submit_command(
    rt: Runtime, caller: Caller, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> Future[T]:
    """Hand a command of ``caller`` to the runtime's executor. Raises Busy when the executor
    (a BotExecutor) has no room for it or the caller is at their limit."""
    if isinstance(rt.executor, BotExecutor):
        return rt.executor.submit_command(caller.user_id, fn, *args, **kwargs)
    return rt.executor.submit(fn, *args, **kwargs)


def busy_text(exc: Busy) -> str:
    """The answer to a command turned away unrun."""
    return f":hourglass: {exc.user_text()}"


def action_pattern(registry: Registry) -> re.Pattern[str]:
    """A pattern matching exactly the registered action ids."""
    ids = "|".join(re.escape(action_id) for action_id in sorted(registry.actions))
    return re.compile(f"^(?:{ids})$")


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
        return error_reply(exc)
    except Exception:  # noqa: BLE001 - logged with an error id by crash_reply
        return crash_reply(f"/gpu {text[:200]!r}", caller)


def execute_action(
    rt: Runtime, registry: Registry, caller: Caller, action_id: str, value: str
) -> Reply:
    """Run one button's handler; every failure becomes an ephemeral reply."""
    spec = registry.actions.get(action_id)
    if spec is None:
        return Reply(text="This button no longer does anything; run the command again.")
    if button_id(value) is None:
        log.warning(
            "button %s by %s had a value that is no id: %r", action_id, caller.user_id, value[:40]
        )
        return Reply(text=BAD_BUTTON_TEXT)
    try:
        return spec.handler(rt, caller, value)
    except GpubotError as exc:
        return error_reply(exc)
    except Exception:  # noqa: BLE001 - logged with an error id by crash_reply
        return crash_reply(f"button {action_id}={value[:100]!r}", caller)


def button_id(value: str) -> int | None:
    """A button's value as an id: digits without a leading zero, 1 to :data:`MAX_BUTTON_ID`;
    None for anything else."""
    if _BUTTON_ID.fullmatch(value) is None:
        return None
    number = int(value)
    return number if number <= MAX_BUTTON_ID else None


def error_reply(exc: GpubotError) -> Reply:
    """An ephemeral message for an error the bot expects: message, hint, usage line."""
    lines = [f":warning: {exc.user_text()}"]
    if isinstance(exc, UsageError) and exc.usage:
        lines.append(usage_text(exc.usage))
    return Reply(text="\n".join(lines))


def crash_reply(what: str, caller: Caller) -> Reply:
    """Log the current exception with a short error id and tell the user that id."""
    error_id = uuid.uuid4().hex[:8]
    log.exception("error id %s: %s by %s failed", error_id, what, caller.user_id)
    return Reply(
        text=(
            f":x: Something went wrong (error id {error_id}); "
            "an admin can find it in the bot's log."
        )
    )


def send_reply(respond: Respond, reply: Reply) -> None:
    """Answer through the response URL; if Slack refuses the blocks, send the text alone."""
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
            return
        log.error("response URL refused a reply (%s): %s", response.status_code, response.body)
        if blocks:
            respond(
                text=reply.text,
                response_type=response_type,
                replace_original=reply.replace_original,
            )
    except Exception:
        log.exception("could not send a reply through the response URL")


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
    rt: Runtime, registry: Registry, caller: Caller, text: str, respond: Respond
) -> None:
    remember_caller(rt, caller)
    with speaking(language_for(rt, caller.user_id)):
        send_reply(respond, execute_command(rt, registry, caller, text))


def _run_action(
    rt: Runtime,
    registry: Registry,
    caller: Caller,
    action_id: str,
    value: str,
    respond: Respond,
) -> None:
    if action_id in registry.actions and button_id(value) is not None:
        remember_caller(rt, caller)  # a malformed click reaches nothing and changes nothing
    with speaking(language_for(rt, caller.user_id)):
        send_reply(respond, execute_action(rt, registry, caller, action_id, value))
