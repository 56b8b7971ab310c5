"""Feishu's events reaching the bot: the request URL ``/feishu/events`` and the long connection.

``gpubot feishu --http`` serves :class:`FeishuEndpoint` at ``/feishu/events`` on the production
server of Slack's HTTP mode (bot.http_server: its thread pool, connection limits, request
deadline, 1 MiB bodies and drain). Each request is verified and read by bot.feishu.events before
anything else looks at it: a refused one is answered 400 or 401 with an empty JSON object and
one log line (never a 500 and its traceback, as the SDK's own dispatcher answers), the URL
verification with its challenge, an event the bot does not handle 200. An event id seen
before is answered 200 and not run again (Feishu delivers an event again when it missed the
answer); when the store cannot say whether it was seen within :data:`SEEN_CHECK_S`, 503, so
that Feishu sends it later, and nothing runs.

``gpubot feishu`` (no public URL) opens the SDK's long connection (``lark_oapi.ws.Client``)
with a dispatcher built by the SDK's builder (a message handler and a card callback handler),
wrapped (:class:`GuardedDispatcher`) so that an event the bot does not handle, or one it cannot
read, is acknowledged with one log line rather than the SDK's error frame and traceback. The
long connection is authenticated by the app's id and secret; its frames are neither encrypted
nor signed, so each is read as a verified event is, and event ids pass once as above (a frame
whose id the store cannot check is acknowledged unrun, with a warning: the long connection has
no way to ask for it again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.types import StartResponse, WSGIEnvironment

from lark_oapi.core.enum import LogLevel
from lark_oapi.core.exception import EventException
from lark_oapi.core.json import JSON
from lark_oapi.event.callback.model.p2_card_action_trigger import (
    P2CardActionTrigger,
    P2CardActionTriggerResponse,
)
from lark_oapi.event.custom import CustomizedEvent
from lark_oapi.event.dispatcher_handler import EventDispatcherHandler
from lark_oapi.ws import Client as WsClient
from lark_oapi.ws import client as ws_client

from bot.app import timed_registry, with_home_buttons
from bot.commands import build_registry
from bot.commands.registry import Registry
from bot.errors import GpubotError
from bot.executor import ACKS
from bot.feishu import cards
from bot.feishu.events import (
    EVENT_KEEP_S,
    MESSAGE_RECEIVE,
    EventOnce,
    EventRefused,
    EventVerifier,
    FeishuEvent,
    Ignored,
    MessageReceived,
    UrlChallenge,
    read_event,
)
from bot.feishu.front import FeishuFront, FeishuSender
from bot.feishu.home import with_home_command
from bot.replay import ReplayGuard
from bot.runtime import Runtime
from bot.settings import Settings
from bot.store.deadline import StoreDeadline

log = logging.getLogger(__name__)

#: The request URL's path (the event and the card callback subscriptions both).
EVENTS_PATH = "/feishu/events"
#: Seconds the thread that answers Feishu waits for the store to say whether an event is new
#: (Feishu waits 3 s for the answer).
SEEN_CHECK_S = 1.5
#: An answer: the HTTP status and the JSON object sent back.
Answer = tuple[int, dict[str, Any]]


def build_gate(rt: Runtime, sender: FeishuSender, *, registry: Registry | None = None) -> EventGate:
    """The bot's Feishu front end on ``rt``: its commands and buttons (``registry``, default
    the bot's own, timed, with the Home's buttons, as on Slack), answering through ``sender``
    with cards (bot.feishu.cards); event ids remembered in the runtime's store."""
    commands = with_home_command(registry if registry is not None else build_registry())
    front = FeishuFront(
        rt,
        timed_registry(with_home_buttons(commands), rt.metrics),
        sender,
        card_of=cards.card_of,
        action_of=cards.action_of,
    )
    return EventGate(front, EventOnce(ReplayGuard(db=rt.db, window_s=EVENT_KEEP_S)))


def verifier_of(settings: Settings) -> EventVerifier:
    """The request URL's verifier from FEISHU_VERIFICATION_TOKEN and FEISHU_ENCRYPT_KEY.
    Raises ValueError when either is not set."""
    return EventVerifier(
        verification_token=settings.feishu_verification_token or "",
        encrypt_key=settings.feishu_encrypt_key or "",
    )


class EventGate:
    """What each verified event does and what Feishu is answered: the challenge echoed, an
    event the bot does not handle acknowledged, a message or click handed to ``front`` the
    first time its event id is seen (``once``, asked within ``deadline``)."""

    def __init__(
        self,
        front: FeishuFront,
        once: EventOnce,
        *,
        deadline: StoreDeadline | None = None,
    ) -> None:
        self.front = front
        self.once = once
        self.deadline = deadline if deadline is not None else StoreDeadline(deadline_s=SEEN_CHECK_S)

    def handle(self, event: FeishuEvent) -> Answer:
        """Act on ``event``; the answer for Feishu."""
        if isinstance(event, UrlChallenge):
            return 200, {"challenge": event.challenge}
        if isinstance(event, Ignored):
            log.debug("a Feishu event not handled: %s (%s)", event.event_type, event.reason)
            return 200, {}
        try:
            first = self.deadline.call(self.once.first_time, event.event_id)
        except GpubotError as exc:  # StoreError, StoreHung
            log.warning(
                "could not check Feishu event %s against the store: %s", event.event_id, exc
            )
            return 503, {}
        if not first:
            log.info("Feishu event %s came again; not run twice", event.event_id)
            return 200, {}
        if isinstance(event, MessageReceived):
            self.front.on_message(event)
            return 200, {}
        return 200, self.front.on_card_action(event)


class FeishuEndpoint:
    """The WSGI app of ``POST /feishu/events`` (module docstring); any other path is 404, any
    other method 405. The body is read whole before anything else (the server bounds it)."""

    def __init__(
        self, verifier: EventVerifier, gate: EventGate, *, path: str = EVENTS_PATH
    ) -> None:
        self.verifier = verifier
        self.gate = gate
        self.path = path

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The answer to one request."""
        if environ.get("PATH_INFO") != self.path:
            return _respond(start_response, 404, {})
        if environ.get("REQUEST_METHOD") != "POST":
            return _respond(start_response, 405, {}, [("allow", "POST")])
        raw = _body(environ)
        try:
            event = self.verifier.verify(_headers(environ), raw)
        except EventRefused as exc:
            log.info("refused a Feishu request from %s: %s", _remote(environ), exc.message)
            return _respond(start_response, exc.status, {})
        with ACKS.acking():  # the executor's work waits for the acks (bot.executor)
            try:
                status, answer = self.gate.handle(event)
            except Exception:
                log.exception("a Feishu event could not be handled")
                status, answer = 500, {}
        return _respond(start_response, status, answer)


class GuardedDispatcher(EventDispatcherHandler):  # type: ignore[misc]
    """The long connection's dispatcher: the SDK's own (``inner``, built by its builder) for
    the events the bot handles, and an acknowledgement with one log line, never an error frame,
    for any other event or one that cannot be read."""

    def __init__(self, inner: EventDispatcherHandler) -> None:
        super().__init__()
        self.inner = inner

    def _do_without_validation(self, payload: bytes) -> Any:
        """What the SDK's long connection calls with each event frame; the callback's answer
        (None: a plain acknowledgement)."""
        try:
            return self.inner._do_without_validation(payload)
        except EventException as exc:
            log.info("a Feishu event on the long connection was not handled: %s", exc)
        except EventRefused as exc:
            log.info("refused a Feishu event on the long connection: %s", exc.message)
        except Exception:
            log.exception("a Feishu event on the long connection could not be handled")
        return None


def long_connection_dispatcher(gate: EventGate) -> GuardedDispatcher:
    """The SDK's dispatcher for the long connection, handing messages and card clicks to
    ``gate``, wrapped in :class:`GuardedDispatcher`."""

    def on_message(data: CustomizedEvent) -> None:
        header = vars(data.header) if data.header is not None else {}
        payload = {"schema": "2.0", "header": header, "event": data.event or {}}
        gate.handle(read_event(payload))

    def on_card(data: P2CardActionTrigger) -> P2CardActionTriggerResponse:
        payload = json.loads(JSON.marshal(data) or "{}")
        _, answer = gate.handle(read_event(payload))
        return P2CardActionTriggerResponse(answer)

    inner = (
        EventDispatcherHandler.builder("", "")
        .register_p2_customized_event(MESSAGE_RECEIVE, on_message)
        .register_p2_card_action_trigger(on_card)
        .build()
    )
    return GuardedDispatcher(inner)


class LongConnection:
    """The SDK's long connection for ``app_id``/``app_secret`` at ``domain`` (the settings'
    API URL), dispatching to ``gate``. :meth:`run` holds until :meth:`stop`; the SDK connects
    and reconnects on a thread of its own."""

    def __init__(
        self,
        gate: EventGate,
        *,
        app_id: str,
        app_secret: str,
        domain: str,
        make_client: Callable[..., Any] | None = None,
    ) -> None:
        make = make_client if make_client is not None else WsClient
        self.client = make(
            app_id,
            app_secret,
            event_handler=long_connection_dispatcher(gate),
            domain=domain.rstrip("/"),
            log_level=LogLevel.WARNING,
        )
        self._stopped = threading.Event()

    def run(self) -> None:
        """Connect and serve until :meth:`stop`. Raises what the SDK raises when it cannot
        connect at first (a refused app id or secret)."""
        failed: list[BaseException] = []

        def connect() -> None:
            try:
                asyncio.set_event_loop(ws_client.loop)  # the SDK runs on its module's loop
                self.client.start()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                failed.append(exc)
                self._stopped.set()

        threading.Thread(target=connect, name="gpubot-feishu-ws", daemon=True).start()
        self._stopped.wait()
        if failed:
            raise failed[0]

    def stop(self) -> None:
        """Let :meth:`run` return (the SDK's thread ends with the process)."""
        self._stopped.set()


def _respond(
    start_response: StartResponse,
    status: int,
    answer: Mapping[str, Any],
    extra: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    body = json.dumps(answer).encode()
    start_response(
        f"{status} {_REASONS.get(status, 'Error')}",
        [
            ("content-type", "application/json; charset=utf-8"),
            ("content-length", str(len(body))),
            *(extra or []),
        ],
    )
    return [body]


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _body(environ: WSGIEnvironment) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    stream = environ.get("wsgi.input")
    return stream.read(length) if stream is not None and length > 0 else b""


def _headers(environ: WSGIEnvironment) -> dict[str, str]:
    """The request's headers by lower-case name (``x-lark-signature``)."""
    return {
        key[5:].replace("_", "-").lower(): str(value)
        for key, value in environ.items()
        if key.startswith("HTTP_")
    }


def _remote(environ: WSGIEnvironment) -> str:
    return str(environ.get("REMOTE_ADDR") or "an unknown address")
