"""A local stand-in for Slack: the Web API methods the bot calls and the response URLs.

The console points the bot's WebClient at it and prints what arrives; the tests use it as the
Slack boundary (tests/fixtures adds Socket Mode to it). It answers like Slack does (``ok``,
``ts``, channel IDs, ``invalid_auth``, ``channel_not_found``, ``no_text``, ``invalid_blocks``,
``ratelimited``), records every call, and checks Block Kit against Slack's limits (those of
bot.blocks.kit). Views (Home tabs with views.publish, modals with views.open and views.update)
are checked with slack_sdk's view model and kept; a modal needs a trigger id at most
:data:`TRIGGER_TTL_S` old and used once (``expired_trigger_id``, ``exchanged_trigger_id``).
What Slack sends the bot (signed requests, payloads) is bot.slack_requests.

Why one module of this size: it answers each Web API method the bot calls as Slack does,
with Slack's limits, errors and misbehaviour (late answers, outages, 429s, expired response
URLs), so that the bot is judged by Slack's contract; each method is a small function.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from bot.blocks import kit
from bot.slack_requests import new_trigger_id

#: The largest request body served, in bytes.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: How long a trigger id opens a modal, in seconds (Slack's).
TRIGGER_TTL_S = 3.0
#: A response URL takes this many posts within this many seconds, as Slack's do.
RESPONSE_URL_USES = 5
RESPONSE_URL_TTL_S = 30 * 60.0


@dataclass(frozen=True)
class ApiCall:
    """One Web API call as received: ``args`` merges query string, form and JSON body."""

    method: str
    args: dict[str, Any]
    token: str | None
    ok: bool
    error: str | None


@dataclass(frozen=True)
class Message:
    """A message as a person would see it. ``ephemeral`` ones are seen by ``user`` only;
    ``replaces`` is the ts of the message it replaced (chat.update or replace_original)."""

    channel: str
    ts: str
    text: str
    blocks: tuple[dict[str, Any], ...] = ()
    thread_ts: str | None = None
    ephemeral: bool = False
    user: str | None = None
    replaces: str | None = None
    via_response_url: bool = False
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class SharedFile:
    """A file uploaded with files_upload_v2 and shared in ``channel``."""

    file_id: str
    filename: str
    title: str
    content: bytes
    channel: str | None
    comment: str | None
    thread_ts: str | None


@dataclass(frozen=True)
class ResponseUrlPost:
    """A JSON post to a response URL: the payload as sent."""

    url: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class StoredView:
    """A view as Slack keeps it: ``view`` as sent plus its ``id``, ``hash`` and empty
    ``state``; a Home tab is ``user``'s, a modal was opened with ``trigger_id``."""

    view_id: str
    view: dict[str, Any]
    user: str | None = None
    trigger_id: str | None = None

    @property
    def kind(self) -> str:
        """``home`` or ``modal``."""
        return str(self.view.get("type", ""))


Event = Message | SharedFile


@dataclass
class _ResponseTarget:
    channel: str
    user: str
    message_ts: str | None
    made_at: float = field(default_factory=time.monotonic)
    uses: int = 0


@dataclass
class _PendingUpload:
    filename: str
    length: int
    content: bytes | None = None


@dataclass
class _State:
    calls: list[ApiCall] = field(default_factory=list)
    responses: list[ResponseUrlPost] = field(default_factory=list)
    messages: dict[tuple[str, str], Message] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    uploads: dict[str, _PendingUpload] = field(default_factory=dict)
    rate_limits: dict[str, int] = field(default_factory=dict)
    #: method -> (seconds to hold the answer after doing the call, calls left)
    late: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: method -> (HTTP status answered without doing the call, calls left)
    outages: dict[str, tuple[int, int]] = field(default_factory=dict)
    views: dict[str, StoredView] = field(default_factory=dict)
    #: user -> the id of their Home tab's view
    homes: dict[str, str] = field(default_factory=dict)
    #: trigger id -> (when it was issued, monotonic seconds; the user it was issued to)
    triggers: dict[str, tuple[float, str | None]] = field(default_factory=dict)
    used_triggers: set[str] = field(default_factory=set)


class LocalSlack:
    """Slack's Web API and response URLs on ``127.0.0.1``; start with :meth:`start`.

    ``token`` is the only bot token accepted; ``channels`` maps known channel IDs to names
    (users' DMs are opened with conversations.open); ``on_event`` sees every message and file
    before the HTTP answer goes back, so a caller that waits for its request sees the output.
    """

    def __init__(
        self,
        *,
        token: str = "xoxb-local",  # noqa: S107 - the stand-in's own made-up token
        channels: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
        team_id: str = "T0LOCAL",
        bot_user_id: str = "U0GPUBOT",
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.token = token
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.on_event = on_event
        self._channels: dict[str, str] = dict(channels or {"C0GENERAL": "general"})
        self._users: dict[str, str] = dict(users or {})
        self._state = _State()
        self._targets: dict[str, _ResponseTarget] = {}
        self._cond = threading.Condition()
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> LocalSlack:
        """Serve on a free loopback port in a background thread; returns self."""
        server = _Server(("127.0.0.1", 0), self._handler_class())
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="local-slack", kwargs={"poll_interval": 0.1}
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> LocalSlack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/``."""
        if self._server is None:
            raise RuntimeError("LocalSlack is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    @property
    def api_url(self) -> str:
        """The Web API base URL to give WebClient (``.../api/``)."""
        return self.base_url + "api/"

    # --- set-up -------------------------------------------------------------------------------

    def add_channel(self, channel_id: str, name: str) -> None:
        """Make a channel known (posting elsewhere gives ``channel_not_found``)."""
        with self._cond:
            self._channels[channel_id] = name

    def add_user(self, user_id: str, name: str) -> None:
        """Make a user known to users.info."""
        with self._cond:
            self._users[user_id] = name

    def user_name(self, user_id: str) -> str | None:
        """A known user's name."""
        with self._cond:
            return self._users.get(user_id)

    def channel_name(self, channel_id: str) -> str | None:
        """A known channel's name (``None`` for DMs and unknown IDs)."""
        with self._cond:
            return self._channels.get(channel_id)

    def answer_late(self, method: str, delay_s: float, times: int = 1) -> None:
        """Do the next ``times`` calls of ``method`` (a post is stored) but hold each answer
        ``delay_s`` seconds, as Slack does when it is slow: a client that gave up earlier never
        learns that its call happened."""
        with self._cond:
            self._state.late[method] = (delay_s, times)

    def outage(self, method: str, status: int = 500, times: int = 10**9) -> None:
        """Answer the next ``times`` calls of ``method`` with ``status`` without doing them
        (``times=0`` ends the outage)."""
        with self._cond:
            self._state.outages[method] = (status, times)

    def rate_limit(self, method: str, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with 429 and ``Retry-After: 0``."""
        with self._cond:
            self._state.rate_limits[method] = times

    def response_url(self, channel: str, user: str, *, message_ts: str | None = None) -> str:
        """A new response URL for a command or click made by ``user`` in ``channel``."""
        url_id = f"R{next(self._ids):08d}"
        with self._cond:
            self._targets[url_id] = _ResponseTarget(channel, user, message_ts)
        return f"{self.base_url}respond/{url_id}"

    def expire_response_url(self, url: str) -> None:
        """Age the response URL ``url`` past Slack's 30 minutes: posts to it are refused."""
        url_id = url.rstrip("/").rsplit("/", 1)[-1]
        with self._cond:
            target = self._targets.get(url_id)
            if target is not None:
                target.made_at -= RESPONSE_URL_TTL_S

    def new_trigger(self, user: str | None = None) -> str:
        """A trigger id as Slack sends with a command or click of ``user``: it opens one modal,
        within :data:`TRIGGER_TTL_S` seconds."""
        trigger = new_trigger_id()
        with self._cond:
            self._state.triggers[trigger] = (time.monotonic(), user)
        return trigger

    # --- what arrived -------------------------------------------------------------------------

    def home_view(self, user: str) -> dict[str, Any] | None:
        """The Home tab last published for ``user``, as Slack keeps it."""
        with self._cond:
            view_id = self._state.homes.get(user)
            stored = self._state.views.get(view_id or "")
        return None if stored is None else stored.view

    def opened_view(self, trigger_id: str) -> StoredView | None:
        """The modal opened with ``trigger_id`` (in its latest version), if one was."""
        with self._cond:
            for stored in self._state.views.values():
                if stored.trigger_id == trigger_id:
                    return stored
        return None

    def view(self, view_id: str) -> StoredView | None:
        """A view by its id (the latest version)."""
        with self._cond:
            return self._state.views.get(view_id)

    @property
    def calls(self) -> list[ApiCall]:
        """Every Web API call so far, in order."""
        with self._cond:
            return list(self._state.calls)

    def calls_to(self, method: str) -> list[ApiCall]:
        """The calls of one method (``chat.postMessage`` ...)."""
        return [call for call in self.calls if call.method == method]

    @property
    def responses(self) -> list[ResponseUrlPost]:
        """Every post to a response URL so far, in order."""
        with self._cond:
            return list(self._state.responses)

    @property
    def events(self) -> list[Event]:
        """Messages and files as people would see them, in order."""
        with self._cond:
            return list(self._state.events)

    def message(self, channel: str, ts: str) -> Message | None:
        """The current version of a message posted with chat.postMessage."""
        with self._cond:
            return self._state.messages.get((channel, ts))

    def wait_for(self, predicate: Callable[[LocalSlack], bool], timeout_s: float = 10.0) -> bool:
        """Block until ``predicate(self)`` holds after some request, or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
        return True

    # --- handling (called by the HTTP handler) ------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The HTTP handler serving this stand-in (GET answers 404)."""
        return _handler_for(self)

    def _api(self, method: str, args: dict[str, Any], token: str | None) -> tuple[int, Any]:
        with self._cond:
            left = self._state.rate_limits.get(method, 0)
            if left:
                self._state.rate_limits[method] = left - 1
            status, down = self._state.outages.get(method, (0, 0))
            if down:
                self._state.outages[method] = (status, down - 1)
            delay_s, slow = self._state.late.get(method, (0.0, 0))
            if slow:
                self._state.late[method] = (delay_s, slow - 1)
        if left:
            self._record(ApiCall(method, args, token, False, "ratelimited"))
            return HTTPStatus.TOO_MANY_REQUESTS, {"ok": False, "error": "ratelimited"}
        if down:
            self._record(ApiCall(method, args, token, False, f"http_{status}"))
            return status, {"ok": False, "error": "internal_error"}
        body, events = self._answer(method, args, token)
        ok = bool(body.get("ok"))
        self._record(ApiCall(method, args, token, ok, None if ok else body.get("error")), events)
        if slow:
            time.sleep(delay_s)
        return HTTPStatus.OK, body

    def _answer(self, method: str, args: dict[str, Any], token: str | None) -> _Answer:
        if not token:
            return _error("not_authed"), []
        if token != self.token:
            return _error("invalid_auth"), []
        handler = _METHODS.get(method)
        if handler is None:
            return _error("unknown_method"), []
        return handler(self, args)

    def _respond(self, url_id: str, payload: dict[str, Any]) -> tuple[int, str]:
        with self._cond:
            target = self._targets.get(url_id)
            refusal = _response_url_refusal(target)
            if target is not None and refusal is None:
                target.uses += 1
        if refusal is not None:
            return HTTPStatus.NOT_FOUND, refusal
        assert target is not None
        blocks = payload.get("blocks") or []
        if not isinstance(blocks, list) or check_blocks(blocks):
            return HTTPStatus.BAD_REQUEST, "invalid_blocks"
        text = payload.get("text")
        if not text and not blocks and not payload.get("delete_original"):
            return HTTPStatus.BAD_REQUEST, "no_text"
        replace = bool(payload.get("replace_original")) and target.message_ts is not None
        ephemeral = payload.get("response_type", "ephemeral") != "in_channel"
        with self._cond:
            original = self._state.messages.get((target.channel, target.message_ts or ""))
        if replace and original is not None:
            ephemeral = original.ephemeral  # a replaced message keeps its audience
        ts = target.message_ts if replace and target.message_ts else self._next_ts()
        message = Message(
            channel=target.channel,
            ts=ts,
            text=str(text or ""),
            blocks=tuple(blocks),
            thread_ts=payload.get("thread_ts"),
            ephemeral=ephemeral,
            user=target.user,
            replaces=target.message_ts if replace else None,
            via_response_url=True,
        )
        with self._cond:
            if replace and (target.channel, ts) in self._state.messages:
                self._state.messages[(target.channel, ts)] = message
        self._record(None, [message], ResponseUrlPost(f"{self.base_url}respond/{url_id}", payload))
        return HTTPStatus.OK, "ok"

    def _upload(self, file_id: str, content: bytes) -> tuple[int, str]:
        with self._cond:
            upload = self._state.uploads.get(file_id)
            if upload is None:
                return HTTPStatus.NOT_FOUND, "file_not_found"
            upload.content = content
            self._cond.notify_all()
        return HTTPStatus.OK, f"OK - {len(content)}"

    def _record(
        self,
        call: ApiCall | None,
        events: Sequence[Event] = (),
        response: ResponseUrlPost | None = None,
    ) -> None:
        for event in events:
            if self.on_event is not None:
                self.on_event(event)
        with self._cond:
            if call is not None:
                self._state.calls.append(call)
            self._state.events.extend(events)
            if response is not None:
                self._state.responses.append(response)
            self._cond.notify_all()

    def _next_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    def _dm_channel(self, user_id: str) -> str:
        return "D" + hashlib.sha256(user_id.encode()).hexdigest()[:10].upper()

    def _resolve_channel(self, channel: str) -> tuple[str, str | None] | None:
        """(channel ID, DM user) for a channel, DM or user ID; None when unknown."""
        with self._cond:
            if channel in self._channels:
                return channel, None
            for user in self._users:
                if channel in (user, self._dm_channel(user)):
                    return self._dm_channel(user), user
        if channel[:1] in ("U", "W"):
            self.add_user(channel, channel.lower())
            return self._dm_channel(channel), channel
        return None


# --- Block Kit checks -----------------------------------------------------------------------


def check_blocks(blocks: Sequence[Any], *, max_blocks: int = kit.MAX_BLOCKS) -> list[str]:
    """What is wrong with a list of blocks by Slack's rules (empty when nothing is): known
    types, slack_sdk's validation and bot.blocks.kit's limits: at most ``max_blocks`` blocks
    (50 in a message), header 150, section text 3000, 10 fields, 25 elements per actions block,
    button text 75 and value 2000 characters."""
    problems: list[str] = []
    if len(blocks) > max_blocks:
        problems.append(f"{len(blocks)} blocks (at most {max_blocks})")
    for index, block in enumerate(blocks):
        problems.extend(f"block {index}: {problem}" for problem in _block_problems(block))
    return problems


def _block_problems(block: Any) -> list[str]:
    if not isinstance(block, dict):
        return ["not an object"]
    try:
        parsed = Block.parse(block)
        if parsed is None:
            return [f"unknown type {block.get('type')!r}"]
        parsed.validate_json()
    except (SlackObjectFormationError, AttributeError, KeyError, TypeError, ValueError) as exc:
        return [str(exc) or type(exc).__name__]
    problems: list[str] = []
    kind = block.get("type")
    if kind == "header" and len(_text_of(block.get("text"))) > kit.HEADER_TEXT_MAX:
        problems.append(f"header text over {kit.HEADER_TEXT_MAX} characters")
    if kind == "section":
        if len(block.get("fields") or []) > kit.FIELDS_MAX:
            problems.append(f"more than {kit.FIELDS_MAX} fields")
        for item in block.get("fields") or []:
            if len(_text_of(item)) > kit.FIELD_TEXT_MAX:
                problems.append(f"a field over {kit.FIELD_TEXT_MAX} characters")
    elements = list(block.get("elements") or []) if kind == "actions" else []
    if kind == "actions" and len(elements) > kit.ACTIONS_ELEMENTS_MAX:
        problems.append(f"more than {kit.ACTIONS_ELEMENTS_MAX} elements")
    if isinstance(block.get("accessory"), dict):
        elements.append(block["accessory"])
    for element in elements:
        problems.extend(_element_problems(element))
    return problems


def _element_problems(element: Any) -> list[str]:
    if not isinstance(element, dict) or element.get("type") != "button":
        return []
    problems: list[str] = []
    if len(_text_of(element.get("text"))) > kit.BUTTON_TEXT_MAX:
        problems.append(f"button text over {kit.BUTTON_TEXT_MAX} characters")
    if len(str(element.get("value", ""))) > kit.BUTTON_VALUE_MAX:
        problems.append(f"button value over {kit.BUTTON_VALUE_MAX} characters")
    confirm = element.get("confirm")
    if isinstance(confirm, dict):
        if len(_text_of(confirm.get("title"))) > kit.CONFIRM_TITLE_MAX:
            problems.append(f"confirm title over {kit.CONFIRM_TITLE_MAX} characters")
        if len(_text_of(confirm.get("text"))) > kit.CONFIRM_TEXT_MAX:
            problems.append(f"confirm text over {kit.CONFIRM_TEXT_MAX} characters")
    return problems


def _text_of(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("text", ""))
    return "" if obj is None else str(obj)


def check_view(view: Any, kind: str) -> list[str]:
    """What is wrong with a view of type ``kind`` (``home`` or ``modal``) by Slack's rules
    (empty when nothing is): slack_sdk's view model (title and buttons 24 characters, 1 to 100
    blocks, no submit on a Home tab), a modal's title, a submit button where it asks for
    input, and every block as :func:`check_blocks` checks them."""
    if not isinstance(view, dict):
        return ["the view is not an object"]
    if view.get("type") != kind:
        return [f"the view's type is {view.get('type')!r}, not {kind!r}"]
    try:
        View(**view).validate_json()
    except (SlackObjectFormationError, AttributeError, KeyError, TypeError, ValueError) as exc:
        return [str(exc) or type(exc).__name__]
    blocks = view.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        return ["a view needs blocks"]
    problems: list[str] = []
    if kind == "modal" and not _text_of(view.get("title")):
        problems.append("a modal needs a title")
    inputs = [b for b in blocks if isinstance(b, dict) and b.get("type") == "input"]
    if inputs and not _text_of(view.get("submit")):
        problems.append("a modal with input blocks needs a submit button")
    ids = [b.get("block_id") for b in blocks if isinstance(b, dict) and b.get("block_id")]
    if len(ids) != len(set(ids)):
        problems.append("block ids repeat")
    return problems + check_blocks(blocks, max_blocks=kit.VIEW_BLOCKS_MAX)


# --- Web API methods --------------------------------------------------------------------------

_Answer = tuple[dict[str, Any], list[Event]]


def _error(code: str) -> dict[str, Any]:
    return {"ok": False, "error": code}


def _blocks_arg(args: Mapping[str, Any]) -> list[Any] | None:
    """The ``blocks`` argument as a list; None when it is not valid JSON or not a list."""
    raw = args.get("blocks")
    if raw in (None, ""):
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, list) else None


def _message_content(args: Mapping[str, Any]) -> tuple[str, list[Any]] | str:
    """(text, blocks), or Slack's error code."""
    blocks = _blocks_arg(args)
    if blocks is None or check_blocks(blocks):
        return "invalid_blocks"
    text = str(args.get("text") or "")
    if not text and not blocks:
        return "no_text"
    return text, blocks


def _auth_test(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    return {
        "ok": True,
        "url": "https://local.slack.invalid/",
        "team": "local",
        "user": "gpubot",
        "team_id": slack.team_id,
        "user_id": slack.bot_user_id,
        "bot_id": "B0GPUBOT",
    }, []


def _post_message(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    where = slack._resolve_channel(str(args.get("channel") or ""))
    if where is None:
        return _error("channel_not_found"), []
    content = _message_content(args)
    if isinstance(content, str):
        return _error(content), []
    channel, dm_user = where
    text, blocks = content
    message = Message(
        channel=channel,
        ts=slack._next_ts(),
        text=text,
        blocks=tuple(blocks),
        thread_ts=args.get("thread_ts") or None,
        user=dm_user,
        metadata=_metadata_arg(args),
    )
    with slack._cond:
        slack._state.messages[(channel, message.ts)] = message
    body = {
        "ok": True,
        "channel": channel,
        "ts": message.ts,
        "message": {"text": text, "blocks": blocks, "ts": message.ts, "bot_id": "B0GPUBOT"},
    }
    return body, [message]


def _metadata_arg(args: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = args.get("metadata")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, dict) else None


def _history(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    """conversations.history: the channel's messages newest first, after ``oldest``; their
    metadata only with ``include_all_metadata``."""
    channel = str(args.get("channel") or "")
    if slack._resolve_channel(channel) is None:
        return _error("channel_not_found"), []
    oldest = float(args.get("oldest") or 0)
    limit = int(args.get("limit") or 100)
    with_metadata = str(args.get("include_all_metadata")).lower() in ("true", "1")
    with slack._cond:
        found = [
            m
            for (where, _), m in slack._state.messages.items()
            if where == channel and not m.ephemeral and float(m.ts) > oldest
        ]
    found.sort(key=lambda m: float(m.ts), reverse=True)
    shown = []
    for message in found[:limit]:
        item: dict[str, Any] = {"type": "message", "ts": message.ts, "text": message.text}
        if with_metadata and message.metadata:
            item["metadata"] = message.metadata
        shown.append(item)
    return {"ok": True, "messages": shown, "has_more": len(found) > limit}, []


def _post_ephemeral(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    where = slack._resolve_channel(str(args.get("channel") or ""))
    if where is None:
        return _error("channel_not_found"), []
    user = str(args.get("user") or "")
    if not user:
        return _error("user_not_found"), []
    content = _message_content(args)
    if isinstance(content, str):
        return _error(content), []
    text, blocks = content
    ts = slack._next_ts()
    message = Message(where[0], ts, text, tuple(blocks), ephemeral=True, user=user)
    return {"ok": True, "message_ts": ts}, [message]


def _update(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    channel, ts = str(args.get("channel") or ""), str(args.get("ts") or "")
    with slack._cond:
        old = slack._state.messages.get((channel, ts))
    if old is None:
        known = slack._resolve_channel(channel)
        return _error("message_not_found" if known else "channel_not_found"), []
    content = _message_content(args)
    if isinstance(content, str):
        return _error(content), []
    text, blocks = content
    message = Message(
        channel, ts, text, tuple(blocks), thread_ts=old.thread_ts, user=old.user, replaces=ts
    )
    with slack._cond:
        slack._state.messages[(channel, ts)] = message
    return {"ok": True, "channel": channel, "ts": ts, "text": text}, [message]


def _open_conversation(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    users = [u for u in str(args.get("users") or "").split(",") if u]
    if len(users) != 1:
        return _error("users_list_not_supplied" if not users else "not_enough_users"), []
    where = slack._resolve_channel(users[0])
    if where is None or where[1] is None:
        return _error("user_not_found"), []
    return {"ok": True, "channel": {"id": where[0]}}, []


def _users_info(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    user = str(args.get("user") or "")
    name = slack.user_name(user)
    if name is None:
        return _error("user_not_found"), []
    profile = {"display_name": name, "real_name": name}
    return {
        "ok": True,
        "user": {"id": user, "name": name, "real_name": name, "tz": "UTC", "profile": profile},
    }, []


def _get_upload_url(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    filename = str(args.get("filename") or "")
    try:
        length = int(args.get("length") or -1)
    except ValueError:
        length = -1
    if not filename or length < 0:
        return _error("invalid_arguments"), []
    file_id = f"F{next(slack._ids):08d}"
    with slack._cond:
        slack._state.uploads[file_id] = _PendingUpload(filename, length)
    return {"ok": True, "file_id": file_id, "upload_url": f"{slack.base_url}upload/{file_id}"}, []


def _complete_upload(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    try:
        files = json.loads(str(args.get("files") or "[]"))
    except ValueError:
        return _error("invalid_arguments"), []
    channel_arg = args.get("channel_id") or None
    channel = None
    if channel_arg:
        where = slack._resolve_channel(str(channel_arg))
        if where is None:
            return _error("channel_not_found"), []
        channel = where[0]
    shared: list[SharedFile] = []
    for item in files if isinstance(files, list) else []:
        file_id = str(item.get("id", "")) if isinstance(item, dict) else ""
        with slack._cond:
            upload = slack._state.uploads.get(file_id)
        if upload is None or upload.content is None:
            return _error("file_not_found"), []
        shared.append(
            SharedFile(
                file_id=file_id,
                filename=upload.filename,
                title=str(item.get("title") or upload.filename),
                content=upload.content,
                channel=channel,
                comment=args.get("initial_comment") or None,
                thread_ts=args.get("thread_ts") or None,
            )
        )
    if not shared:
        return _error("invalid_arguments"), []
    listed = [{"id": f.file_id, "title": f.title, "name": f.filename} for f in shared]
    return {"ok": True, "files": listed}, list(shared)


def _view_arg(args: Mapping[str, Any]) -> Any:
    raw = args.get("view")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return None
    return raw


def _invalid_view(problems: list[str]) -> dict[str, Any]:
    return {
        "ok": False,
        "error": "invalid_arguments",
        "response_metadata": {"messages": [f"[ERROR] {p}" for p in problems[:20]]},
    }


def _keep_view(
    slack: LocalSlack,
    view: dict[str, Any],
    *,
    view_id: str | None = None,
    user: str | None = None,
    trigger_id: str | None = None,
) -> StoredView:
    """Store ``view`` (a new one, or a new version of ``view_id``) as Slack answers it."""
    kept_id = view_id or f"V{next(slack._ids):08d}"
    stored_view = {
        **view,
        "id": kept_id,
        "team_id": slack.team_id,
        "app_id": "A0GPUBOT",
        "bot_id": "B0GPUBOT",
        "hash": f"{int(time.time())}.{secrets.token_hex(4)}",
        "state": {"values": {}},
    }
    stored = StoredView(kept_id, stored_view, user=user, trigger_id=trigger_id)
    with slack._cond:
        slack._state.views[kept_id] = stored
        if user is not None and view.get("type") == "home":
            slack._state.homes[user] = kept_id
    return stored


def _views_publish(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    """views.publish: a user's Home tab (``user_id``, a ``home`` view; ``hash`` must match the
    one published last when given)."""
    user = str(args.get("user_id") or "")
    view = _view_arg(args)
    if not user or view is None:
        return _error("invalid_arguments"), []
    problems = check_view(view, "home")
    if problems:
        return _invalid_view(problems), []
    with slack._cond:
        current = slack._state.views.get(slack._state.homes.get(user, ""))
    given_hash = args.get("hash")
    if given_hash and current is not None and current.view.get("hash") != given_hash:
        return _error("hash_conflict"), []
    stored = _keep_view(slack, view, view_id=current.view_id if current else None, user=user)
    return {"ok": True, "view": stored.view}, []


def _views_open(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    """views.open: a modal, with a trigger id issued at most TRIGGER_TTL_S seconds ago and not
    used before."""
    trigger = str(args.get("trigger_id") or "")
    view = _view_arg(args)
    if not trigger or view is None:
        return _error("invalid_arguments"), []
    problems = check_view(view, "modal")
    if problems:
        return _invalid_view(problems), []
    with slack._cond:
        issued = slack._state.triggers.get(trigger)
        used = trigger in slack._state.used_triggers
        if not used:
            slack._state.used_triggers.add(trigger)
    if used:
        return _error("exchanged_trigger_id"), []
    age = _trigger_age(trigger, issued)
    if age is None:
        return _error("invalid_trigger_id"), []
    if age > TRIGGER_TTL_S:
        return _error("expired_trigger_id"), []
    user = issued[1] if issued else None
    stored = _keep_view(slack, view, user=user, trigger_id=trigger)
    return {"ok": True, "view": stored.view}, []


def _views_update(slack: LocalSlack, args: dict[str, Any]) -> _Answer:
    """views.update: a new version of a view the app opened (``view_id``; ``hash`` must be
    the current one when given)."""
    view_id = str(args.get("view_id") or "")
    view = _view_arg(args)
    if not view_id or view is None:
        return _error("invalid_arguments"), []
    current = slack.view(view_id)
    if current is None:
        return _error("not_found"), []
    problems = check_view(view, current.kind)
    if problems:
        return _invalid_view(problems), []
    given_hash = args.get("hash")
    if given_hash and current.view.get("hash") != given_hash:
        return _error("hash_conflict"), []
    stored = _keep_view(
        slack, view, view_id=view_id, user=current.user, trigger_id=current.trigger_id
    )
    return {"ok": True, "view": stored.view}, []


def _trigger_age(trigger: str, issued: tuple[float, str | None] | None) -> float | None:
    """Seconds since ``trigger`` was issued: by this stand-in, or as its leading Unix time
    says; None for a trigger id that is none."""
    if issued is not None:
        return time.monotonic() - issued[0]
    head = trigger.split(".", 1)[0]
    if not head.isdigit():
        return None
    return max(time.time() - int(head), 0.0)


_METHODS: dict[str, Callable[[LocalSlack, dict[str, Any]], _Answer]] = {
    "auth.test": _auth_test,
    "chat.postMessage": _post_message,
    "chat.postEphemeral": _post_ephemeral,
    "chat.update": _update,
    "conversations.open": _open_conversation,
    "conversations.history": _history,
    "users.info": _users_info,
    "files.getUploadURLExternal": _get_upload_url,
    "files.completeUploadExternal": _complete_upload,
    "views.publish": _views_publish,
    "views.open": _views_open,
    "views.update": _views_update,
}


# --- HTTP ---------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True


def _handler_for(slack: LocalSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "text/plain", b"too large")
                return
            raw = self.rfile.read(length)
            path, _, query = self.path.partition("?")
            parts = path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "api":
                self._api(parts[1], query, raw)
            elif len(parts) == 2 and parts[0] == "upload":
                status, text = slack._upload(parts[1], raw)
                self._send(status, "text/plain", text.encode())
            elif len(parts) == 2 and parts[0] == "respond":
                self._respond(parts[1], raw)
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found")

        def do_GET(self) -> None:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found")

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _api(self, method: str, query: str, raw: bytes) -> None:
            args = _merged_args(query, raw, self.headers.get("Content-Type") or "")
            token = _bearer(self.headers.get("Authorization")) or args.pop("token", None)
            status, body = slack._api(method, args, token)
            headers = {"Retry-After": "0"} if status == HTTPStatus.TOO_MANY_REQUESTS else {}
            self._send(status, "application/json", json.dumps(body).encode(), headers)

        def _respond(self, url_id: str, raw: bytes) -> None:
            try:
                payload = json.loads(raw.decode("utf-8") or "{}")
            except ValueError:
                payload = None
            if not isinstance(payload, dict):
                self._send(HTTPStatus.BAD_REQUEST, "text/plain", b"invalid_payload")
                return
            status, text = slack._respond(url_id, payload)
            self._send(status, "text/plain", text.encode())

        def _send(
            self,
            status: int,
            content_type: str,
            body: bytes,
            headers: Mapping[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            try:
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                return  # the client gave up waiting (a late answer)

    return Handler


def _merged_args(query: str, raw: bytes, content_type: str) -> dict[str, Any]:
    args: dict[str, Any] = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type:
        try:
            body = json.loads(text or "{}")
        except ValueError:
            body = {}
        if isinstance(body, dict):
            args.update(body)
    elif text:
        args.update(urllib.parse.parse_qsl(text, keep_blank_values=True))
    return args


def _bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return None


def _response_url_refusal(target: _ResponseTarget | None) -> str | None:
    """Slack's answer to a post to a response URL that it no longer takes, or None."""
    if target is None:
        return "invalid_response_url"
    if time.monotonic() - target.made_at >= RESPONSE_URL_TTL_S:
        return "expired_url"
    if target.uses >= RESPONSE_URL_USES:
        return "used_url"
    return None
