"""A local stand-in for Feishu's OpenAPI: the calls the bot makes, answered as Feishu answers.

A real HTTP server on 127.0.0.1 (a free port) that the official SDK (``lark_oapi.Client``
with its domain set to :attr:`FeishuStandIn.url`) talks to:

- ``POST /open-apis/auth/v3/tenant_access_token/internal``: the app's tenant token
  (``{code, msg, tenant_access_token, expire}``); every other call needs it as a Bearer token
  (code 99991663 otherwise).
- ``POST /open-apis/im/v1/messages?receive_id_type=...``: a message to a chat (``chat_id``) or a
  person (``open_id``, which lands in the bot's one-to-one chat with them). The same ``uuid``
  within an hour answers the message it made (no second message); at most
  :data:`CHAT_RATE_PER_S` messages a second per chat (code 230020) and
  :data:`APP_RATE_PER_S` for the app (HTTP 429, code 99991400).
- ``POST /open-apis/im/v1/messages/{message_id}/reply`` (``reply_in_thread``), ``PATCH
  /open-apis/im/v1/messages/{message_id}`` (a card, replaced), ``GET /open-apis/im/v1/messages``
  (a chat's history).
- ``POST /open-apis/im/v1/images`` and ``POST /open-apis/im/v1/files`` (multipart uploads).
- ``POST /open-apis/im/v1/pins`` (``{message_id}``): pin a message in its chat; pinning it
  again answers the same pin (:attr:`FeishuStandIn.pins`).

Answers are Feishu's ``{code, msg, data}``. Like Feishu, it refuses a request field it does
not know (code 99992402) and a card it cannot read: not JSON 2.0, an attribute a component
does not have, over 30 KB or 200 components (codes 230099, 230025; :func:`card_problems`
says why). Faults on demand (:meth:`FeishuStandIn.fault`): a slow answer, an answer lost after
the message was stored, HTTP 429 as plain text or as Feishu's 99991400, a 500, a proxy's
HTML 404, and a success without its data. It records every request and keeps what was posted
for tests to read.

Why one module of this size: it answers each OpenAPI path the bot calls as Feishu does (the
token, messages, replies, patches, uploads), with Feishu's limits, error codes and
misbehaviour, so that the official SDK judges it; each path is a small function.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import itertools
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bot.feishu.cards import CARD_BYTES_MAX, CARD_ELEMENTS_MAX, count_elements

#: Messages a chat takes per second (Feishu's limit per chat, and per person for one-to-one),
#: and the app sends per second (the message API's quota; HTTP 429, code 99991400, past it).
CHAT_RATE_PER_S = 5
APP_RATE_PER_S = 50
_APP = "*app*"
#: How long a message's uuid answers with the message it made, in seconds.
UUID_WINDOW_S = 3600.0
UUID_MAX = 50
#: A text message's request, at most (bytes); a card's is CARD_BYTES_MAX.
TEXT_BYTES_MAX = 150 * 1024
IMAGE_BYTES_MAX = 10 * 1024 * 1024
FILE_BYTES_MAX = 30 * 1024 * 1024
TOKEN_EXPIRE_S = 7200
MAX_BODY_BYTES = 40 * 1024 * 1024

#: Feishu's codes, as the stand-in answers them.
CODE_OK = 0
CODE_BAD_PARAM = 230001
CODE_BOT_NOT_IN_CHAT = 230002
CODE_CHAT_RATE = 230020
CODE_TOO_LONG = 230025
CODE_BAD_CARD = 230099
CODE_RATE_LIMIT = 99991400
CODE_BAD_TOKEN = 99991663
CODE_BAD_FIELD = 99992402
CODE_BAD_SECRET = 10014

_RECEIVE_ID_TYPES = ("open_id", "user_id", "union_id", "email", "chat_id")
_FILE_TYPES = ("opus", "mp4", "pdf", "doc", "xls", "ppt", "stream")
_MESSAGES = "/open-apis/im/v1/messages"
_CREATE_FIELDS = frozenset({"receive_id", "msg_type", "content", "uuid"})
_REPLY_FIELDS = frozenset({"content", "msg_type", "reply_in_thread", "uuid"})
_PATCH_FIELDS = frozenset({"content"})
_PIN_FIELDS = frozenset({"message_id"})


class Fault(Enum):
    """Ways the stand-in misbehaves on demand."""

    #: Answer after ``delay_s`` (the request is carried out first).
    SLOW = "slow"
    #: Carry the request out, then close the connection without an answer.
    LOST = "lost"
    #: HTTP 429 with a plain-text body (a gateway's).
    RATE_LIMIT_TEXT = "rate_limit_text"
    #: HTTP 429 with Feishu's ``{"code": 99991400}`` and its rate-limit headers.
    RATE_LIMIT = "rate_limit"
    #: HTTP 500 with a JSON body (nothing carried out).
    SERVER_ERROR = "server_error"
    #: HTTP 404 with an HTML page (a proxy's catch-all; nothing carried out).
    HTML_404 = "html_404"
    #: HTTP 200 with code 0 and no ``data`` (an answer of a shape Feishu's is not).
    NO_DATA = "no_data"


@dataclass(frozen=True)
class Request:
    """One request as received (``body`` parsed from JSON, or the multipart fields' names)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    answered: int


@dataclass
class StoredMessage:
    """A message as a person would see it: ``content`` is the message's content JSON (a card's
    JSON for ``interactive``); ``versions`` are the contents it had before a patch."""

    message_id: str
    chat_id: str
    msg_type: str
    content: str
    create_ms: int
    uuid: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
    thread_id: str | None = None
    versions: list[str] = field(default_factory=list)

    @property
    def card(self) -> dict[str, Any]:
        """The content as JSON (a card for ``interactive``)."""
        loaded = json.loads(self.content)
        assert isinstance(loaded, dict)
        return loaded


@dataclass(frozen=True)
class Upload:
    """An uploaded image or file."""

    key: str
    kind: str
    name: str
    content: bytes


@dataclass
class _Faults:
    kind: Fault
    path: str
    times: int
    delay_s: float


class FeishuStandIn:
    """The stand-in server; use as a context manager or with :meth:`start`/:meth:`stop`.
    ``clock`` (seconds) times the uuid window and the per-chat rate; ``bot_chats`` are the
    group chats the bot is in (None: any ``oc_`` chat)."""

    def __init__(
        self,
        *,
        app_id: str = "cli_standin",
        app_secret: str = "standin-secret",  # noqa: S107 (the stand-in's own)
        clock: Callable[[], float] = time.monotonic,
        bot_chats: set[str] | None = None,
    ) -> None:
        self.app_id = app_id
        self.app_secret = app_secret
        self.clock = clock
        self.bot_chats = bot_chats
        self.token = "t-" + hashlib.sha256(f"{app_id}:{app_secret}".encode()).hexdigest()[:32]
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._messages: list[StoredMessage] = []
        self._uuids: dict[str, tuple[float, str]] = {}
        self._sent_at: dict[str, list[float]] = {}
        self._uploads: list[Upload] = []
        self._pins: dict[str, str] = {}
        self._requests: list[Request] = []
        self._faults: list[_Faults] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- life ---------------------------------------------------------------------------------

    def start(self) -> FeishuStandIn:
        """Listen on 127.0.0.1 at a free port."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FeishuStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The domain to give the SDK (``http://127.0.0.1:PORT``)."""
        assert self._server is not None, "the stand-in is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- for tests ----------------------------------------------------------------------------

    def fault(
        self, kind: Fault, *, path: str = _MESSAGES, times: int = 1, delay_s: float = 0.5
    ) -> None:
        """Misbehave ``times`` times on requests whose path starts with ``path``."""
        with self._lock:
            self._faults.append(_Faults(kind, path, times, delay_s))

    def rotate_token(self) -> None:
        """Issue a new tenant token: the one handed out before is refused from now on."""
        with self._lock:
            self.token = "t-" + hashlib.sha256(self.token.encode()).hexdigest()[:32]

    def heal(self) -> None:
        """Drop every fault still to come."""
        with self._lock:
            self._faults.clear()

    @property
    def messages(self) -> list[StoredMessage]:
        """Every message, oldest first."""
        with self._lock:
            return list(self._messages)

    def message(self, message_id: str) -> StoredMessage | None:
        """The message with ``message_id``, or None."""
        with self._lock:
            return next((m for m in self._messages if m.message_id == message_id), None)

    @property
    def uploads(self) -> list[Upload]:
        """Every uploaded image and file, oldest first."""
        with self._lock:
            return list(self._uploads)

    @property
    def pins(self) -> dict[str, str]:
        """The pinned messages: message id to chat id, in the order pinned."""
        with self._lock:
            return dict(self._pins)

    @property
    def requests(self) -> list[Request]:
        """Every request, oldest first."""
        with self._lock:
            return list(self._requests)

    @staticmethod
    def p2p_chat(open_id: str) -> str:
        """The chat id of the bot's one-to-one chat with ``open_id``."""
        return "oc_p2p" + hashlib.sha256(open_id.encode()).hexdigest()[:26]

    # --- serving ------------------------------------------------------------------------------

    def answer(
        self, method: str, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        """The answer to one request (the handler writes it); records the request."""
        fault = self._take_fault(path)
        if fault is not None and fault.kind not in (Fault.SLOW, Fault.LOST):
            answer = _faulty(fault.kind)
        else:
            answer = self._route(method, path, query, headers, raw)
            if fault is not None:
                answer = _Answer(
                    answer.status, answer.body, answer.content_type, answer.headers, fault
                )
        body = _summary_of(headers, raw)
        with self._lock:
            self._requests.append(Request(method, path, query, body, answer.status))
        return answer

    def _take_fault(self, path: str) -> _Faults | None:
        with self._lock:
            for fault in self._faults:
                if path.startswith(fault.path) and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def _route(
        self, method: str, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        if method == "POST" and path == "/open-apis/auth/v3/tenant_access_token/internal":
            return self._tenant_token(_json(raw))
        route = _ROUTES.get((method, _shape(path)))
        if route is None:
            return _Answer(404, b"404 page not found", "text/plain; charset=utf-8")
        if headers.get("authorization") != f"Bearer {self.token}":
            return _error(
                400,
                CODE_BAD_TOKEN,
                "Invalid access token for authorization. Please make a request with token "
                "attached.",
            )
        return route(self, path, query, headers, raw)

    def _tenant_token(self, body: Any) -> _Answer:
        if not isinstance(body, dict) or set(body) - {"app_id", "app_secret"}:
            return _error(400, CODE_BAD_FIELD, "field validation failed")
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            return _error(400, CODE_BAD_SECRET, "app secret invalid")
        return _ok_flat({"tenant_access_token": self.token, "expire": TOKEN_EXPIRE_S}, status=200)

    def _create(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        body = _json(raw)
        refused = _fields(body, _CREATE_FIELDS, required=("receive_id", "msg_type", "content"))
        if refused is not None:
            return refused
        id_type = query.get("receive_id_type", "")
        if id_type not in _RECEIVE_ID_TYPES:
            return _error(400, CODE_BAD_FIELD, "field validation failed: receive_id_type")
        receive_id = str(body["receive_id"])
        if id_type == "chat_id":
            if self.bot_chats is not None and receive_id not in self.bot_chats:
                return _error(400, CODE_BOT_NOT_IN_CHAT, "Bot/User can NOT be out of the chat.")
            chat_id = receive_id
        else:
            chat_id = self.p2p_chat(receive_id)
        return self._store(chat_id, body, raw, parent=None, in_thread=False)

    def _reply(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        body = _json(raw)
        refused = _fields(body, _REPLY_FIELDS, required=("msg_type", "content"))
        if refused is not None:
            return refused
        parent = self.message(path.split("/")[-2])
        if parent is None:
            return _error(400, CODE_BAD_PARAM, "invalid message_id")
        return self._store(
            parent.chat_id, body, raw, parent=parent, in_thread=bool(body.get("reply_in_thread"))
        )

    def _patch(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        body = _json(raw)
        refused = _fields(body, _PATCH_FIELDS, required=("content",))
        if refused is not None:
            return refused
        message = self.message(path.split("/")[-1])
        if message is None or message.msg_type != "interactive":
            return _error(400, CODE_BAD_PARAM, "invalid message_id")
        problem = _content_problem("interactive", str(body["content"]), len(raw))
        if problem is not None:
            return problem
        with self._lock:
            message.versions.append(message.content)
            message.content = str(body["content"])
        return _ok({})

    def _pin(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        body = _json(raw)
        refused = _fields(body, _PIN_FIELDS, required=("message_id",))
        if refused is not None:
            return refused
        message = self.message(str(body["message_id"]))
        if message is None:
            return _error(400, CODE_BAD_PARAM, "invalid message_id")
        with self._lock:
            self._pins.setdefault(message.message_id, message.chat_id)
        pin = {
            "message_id": message.message_id,
            "chat_id": message.chat_id,
            "operator_id": self.app_id,
            "operator_id_type": "app_id",
            "create_time": str(message.create_ms),
        }
        return _ok({"pin": pin})

    def _history(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        if query.get("container_id_type") != "chat" or not query.get("container_id"):
            return _error(400, CODE_BAD_FIELD, "field validation failed: container_id")
        start_s = int(query.get("start_time", "0") or 0)
        size = min(int(query.get("page_size", "20") or 20), 50)
        found = [
            m
            for m in self.messages
            if m.chat_id == query["container_id"] and m.create_ms >= start_s * 1000
        ]
        if query.get("sort_type") == "ByCreateTimeDesc":
            found.reverse()
        items = [self._item(m) for m in found[:size]]
        return _ok({"has_more": len(found) > size, "page_token": "", "items": items})

    def _image(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        form = _multipart(headers, raw)
        if form is None or set(form) - {"image_type", "image"} or "image" not in form:
            return _error(400, CODE_BAD_FIELD, "field validation failed")
        if form.get("image_type", (b"", ""))[0] not in (b"message", b"avatar"):
            return _error(400, CODE_BAD_FIELD, "field validation failed: image_type")
        content, name = form["image"]
        if not content or len(content) > IMAGE_BYTES_MAX:
            return _error(400, 234006, "The file size exceed the max value.")
        return _ok({"image_key": self._upload("img_v3_", "image", name, content)})

    def _file(
        self, path: str, query: dict[str, str], headers: Mapping[str, str], raw: bytes
    ) -> _Answer:
        form = _multipart(headers, raw)
        allowed, needed = (
            {"file_type", "file_name", "duration", "file"},
            {"file_type", "file_name", "file"},
        )
        if form is None or set(form) - allowed or not needed <= set(form):
            return _error(400, CODE_BAD_FIELD, "field validation failed")
        if form["file_type"][0].decode() not in _FILE_TYPES:
            return _error(400, CODE_BAD_FIELD, "field validation failed: file_type")
        content = form["file"][0]
        if not content or len(content) > FILE_BYTES_MAX:
            return _error(400, 234006, "The file size exceed the max value.")
        name = form["file_name"][0].decode()
        return _ok({"file_key": self._upload("file_v3_", "file", name, content)})

    def _upload(self, prefix: str, kind: str, name: str, content: bytes) -> str:
        key = f"{prefix}{next(self._ids):08d}"
        with self._lock:
            self._uploads.append(Upload(key, kind, name, content))
        return key

    def _store(
        self,
        chat_id: str,
        body: dict[str, Any],
        raw: bytes,
        *,
        parent: StoredMessage | None,
        in_thread: bool,
    ) -> _Answer:
        uuid = body.get("uuid")
        if uuid is not None and (not isinstance(uuid, str) or len(uuid) > UUID_MAX):
            return _error(400, CODE_BAD_FIELD, "field validation failed: uuid")
        msg_type, content = str(body["msg_type"]), str(body["content"])
        problem = _content_problem(msg_type, content, len(raw))
        if problem is not None:
            return problem
        now = self.clock()
        with self._lock:
            if uuid is not None:
                seen = self._uuids.get(uuid)
                if seen is not None and now - seen[0] < UUID_WINDOW_S:
                    earlier = next(m for m in self._messages if m.message_id == seen[1])
                    return _ok(self._item(earlier))
            sent = [at for at in self._sent_at.get(_APP, []) if now - at < 1.0]
            if len(sent) >= APP_RATE_PER_S:
                return _faulty(Fault.RATE_LIMIT)
            recent = [at for at in self._sent_at.get(chat_id, []) if now - at < 1.0]
            if len(recent) >= CHAT_RATE_PER_S:
                return _error(400, CODE_CHAT_RATE, "This chat receives too many messages.")
            self._sent_at[chat_id] = [*recent, now]
            self._sent_at[_APP] = [*sent, now]
            message = StoredMessage(
                message_id=f"om_{next(self._ids):024x}",
                chat_id=chat_id,
                msg_type=msg_type,
                content=content,
                create_ms=int(time.time() * 1000),
                uuid=uuid,
            )
            if parent is not None:
                message.parent_id = parent.message_id
                message.root_id = parent.root_id or parent.message_id
                if in_thread or parent.thread_id:
                    parent.thread_id = parent.thread_id or f"omt_{next(self._ids):020x}"
                    message.thread_id = parent.thread_id
            self._messages.append(message)
            if uuid is not None:
                self._uuids[uuid] = (now, message.message_id)
        return _ok(self._item(message))

    def _item(self, message: StoredMessage) -> dict[str, Any]:
        item: dict[str, Any] = {
            "message_id": message.message_id,
            "msg_type": message.msg_type,
            "create_time": str(message.create_ms),
            "update_time": str(message.create_ms),
            "deleted": False,
            "updated": bool(message.versions),
            "chat_id": message.chat_id,
            "sender": {
                "id": self.app_id,
                "id_type": "app_id",
                "sender_type": "app",
                "tenant_key": "standin-tenant",
            },
            "body": {"content": message.content},
        }
        for name in ("root_id", "parent_id", "thread_id"):
            if getattr(message, name):
                item[name] = getattr(message, name)
        return item


# --- cards ----------------------------------------------------------------------------------

#: The attributes each card component may have (a subset of Feishu's card JSON 2.0: those the
#: bot's cards use and a few around them). Feishu refuses any other in a 2.0 card.
_ATTRIBUTES: dict[str, frozenset[str]] = {
    "markdown": frozenset(
        {"tag", "content", "text_size", "text_align", "icon", "margin", "element_id"}
    ),
    "hr": frozenset({"tag", "margin", "element_id"}),
    "form": frozenset({"tag", "name", "elements", "direction", "padding", "margin", "element_id"}),
    "input": frozenset(
        {
            "tag",
            "name",
            "required",
            "placeholder",
            "default_value",
            "input_type",
            "rows",
            "max_length",
            "width",
            "margin",
            "element_id",
        }
    ),
    "select_static": frozenset(
        {
            "tag",
            "name",
            "required",
            "placeholder",
            "initial_option",
            "options",
            "width",
            "margin",
            "element_id",
        }
    ),
    "multi_select_static": frozenset(
        {
            "tag",
            "name",
            "required",
            "placeholder",
            "selected_values",
            "options",
            "width",
            "margin",
            "element_id",
        }
    ),
    "column_set": frozenset(
        {
            "tag",
            "columns",
            "flex_mode",
            "horizontal_spacing",
            "horizontal_align",
            "background_style",
            "margin",
            "element_id",
        }
    ),
    "column": frozenset(
        {"tag", "width", "weight", "elements", "vertical_align", "vertical_spacing", "padding"}
    ),
    "button": frozenset(
        {
            "tag",
            "text",
            "type",
            "size",
            "width",
            "icon",
            "disabled",
            "behaviors",
            "confirm",
            "hover_tips",
            "margin",
            "element_id",
            "name",
            "form_action_type",
        }
    ),
}
_TOP = frozenset({"schema", "config", "card_link", "header", "body"})
_CONFIG = frozenset(
    {"update_multi", "summary", "width_mode", "enable_forward", "streaming_mode", "locales"}
)
_HEADER = frozenset({"title", "subtitle", "template", "icon", "text_tag_list", "padding"})
_BUTTON_TYPES = frozenset(
    {
        "default",
        "primary",
        "danger",
        "text",
        "primary_text",
        "danger_text",
        "primary_filled",
        "danger_filled",
        "laser",
    }
)
_FLEX_MODES = frozenset({"none", "stretch", "flow", "bisect", "trisect"})
_FORM_FIELDS = frozenset({"input", "select_static", "multi_select_static"})


def card_problems(card: Any) -> list[str]:
    """Why Feishu would refuse ``card`` (a card JSON 2.0 object): empty when it would not."""
    if not isinstance(card, dict):
        return ["the card is not a JSON object"]
    problems = [f"unknown card attribute {key!r}" for key in set(card) - _TOP]
    if card.get("schema") != "2.0":
        problems.append("schema is not 2.0")
    config = card.get("config", {})
    problems += [f"unknown config attribute {key!r}" for key in set(config) - _CONFIG]
    if config.get("update_multi") is False:
        problems.append("a 2.0 card must be shared (update_multi)")
    header = card.get("header")
    if header is not None:
        problems += [f"unknown header attribute {key!r}" for key in set(header) - _HEADER]
        if not _is_text(header.get("title")):
            problems.append("a header needs a plain_text title")
    body = card.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("elements"), list):
        return [*problems, "the card has no body.elements"]
    for element in body["elements"]:
        problems += _element_problems(element, nested_in=None, in_form=False)
    if count_elements(card) > CARD_ELEMENTS_MAX:
        problems.append(f"more than {CARD_ELEMENTS_MAX} components")
    return problems


def _element_problems(element: Any, *, nested_in: str | None, in_form: bool) -> list[str]:
    if not isinstance(element, dict) or element.get("tag") not in _ATTRIBUTES:
        tag = element.get("tag") if isinstance(element, dict) else element
        return [f"unknown component {tag!r}"]
    tag = element["tag"]
    problems = [f"unknown {tag} attribute {key!r}" for key in set(element) - _ATTRIBUTES[tag]]
    if (tag == "column") != (nested_in == "column_set"):
        problems.append(f"a {tag} inside {nested_in or 'the body'}")
    if tag == "markdown" and not isinstance(element.get("content"), str):
        problems.append("a markdown without content")
    if tag == "button":
        problems += _button_problems(element)
    if tag == "form" and nested_in is not None:
        problems.append(f"a form inside {nested_in}")
    if (tag in _FORM_FIELDS or "form_action_type" in element) and not in_form:
        problems.append(f"a {tag} of a form outside a form")
    if "form_action_type" in element and element["form_action_type"] not in ("submit", "reset"):
        problems.append(f"unknown form_action_type {element['form_action_type']!r}")
    if tag in _FORM_FIELDS and not isinstance(element.get("name"), str):
        problems.append(f"a {tag} without a name")
    if tag in ("select_static", "multi_select_static"):
        problems += _options_problems(element)
    if tag == "column_set" and element.get("flex_mode", "none") not in _FLEX_MODES:
        problems.append(f"unknown flex_mode {element.get('flex_mode')!r}")
    for child in element.get("columns", []) + element.get("elements", []):
        problems += _element_problems(child, nested_in=tag, in_form=in_form or tag == "form")
    return problems


def _button_problems(button: dict[str, Any]) -> list[str]:
    problems = []
    if not _is_text(button.get("text")):
        problems.append("a button without plain_text text")
    if button.get("type", "default") not in _BUTTON_TYPES:
        problems.append(f"unknown button type {button.get('type')!r}")
    for behavior in button.get("behaviors", []):
        if behavior.get("type") != "callback" or set(behavior) != {"type", "value"}:
            problems.append(f"unknown behavior {behavior!r}")
    confirm = button.get("confirm")
    if confirm is not None and (
        set(confirm) != {"title", "text"} or not all(_is_text(v) for v in confirm.values())
    ):
        problems.append("a confirm needs a plain_text title and text")
    return problems


def _options_problems(select: dict[str, Any]) -> list[str]:
    options = select.get("options")
    if not isinstance(options, list) or not options:
        return [f"a {select['tag']} without options"]
    problems = [
        f"an option of {select['name']!r} is not {{text, value}}"
        for option in options
        if not isinstance(option, dict)
        or set(option) != {"text", "value"}
        or not _is_text(option["text"])
        or not isinstance(option["value"], str)
    ]
    values = {option.get("value") for option in options if isinstance(option, dict)}
    chosen = select.get("selected_values", [])
    if "initial_option" in select:
        chosen = [*chosen, select["initial_option"]]
    problems += [
        f"{value!r} is not an option of {select['name']!r}"
        for value in chosen
        if value not in values
    ]
    return problems


def _is_text(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("tag") == "plain_text"
        and isinstance(value.get("content"), str)
        and set(value) <= {"tag", "content", "i18n_content"}
    )


def _content_problem(msg_type: str, content: str, request_bytes: int) -> _Answer | None:
    try:
        loaded = json.loads(content)
    except ValueError:
        return _error(400, CODE_BAD_PARAM, "invalid message content")
    if msg_type == "interactive":
        if request_bytes > CARD_BYTES_MAX:
            return _error(400, CODE_TOO_LONG, "The message is too long.")
        problems = card_problems(loaded)
        if problems:
            return _error(400, CODE_BAD_CARD, "Failed to create card content, ext=" + problems[0])
        return None
    if request_bytes > TEXT_BYTES_MAX:
        return _error(400, CODE_TOO_LONG, "The message is too long.")
    keys = {"text": "text", "image": "image_key", "file": "file_key"}
    if msg_type not in keys or not isinstance(loaded, dict) or keys[msg_type] not in loaded:
        return _error(400, CODE_BAD_PARAM, "invalid message content")
    return None


# --- HTTP -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: str = "application/json; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    fault: _Faults | None = None


_Route = Callable[[FeishuStandIn, str, dict[str, str], Mapping[str, str], bytes], _Answer]
_ROUTES: dict[tuple[str, str], _Route] = {
    ("POST", _MESSAGES): FeishuStandIn._create,
    ("GET", _MESSAGES): FeishuStandIn._history,
    ("POST", _MESSAGES + "/*/reply"): FeishuStandIn._reply,
    ("PATCH", _MESSAGES + "/*"): FeishuStandIn._patch,
    ("POST", "/open-apis/im/v1/images"): FeishuStandIn._image,
    ("POST", "/open-apis/im/v1/files"): FeishuStandIn._file,
    ("POST", "/open-apis/im/v1/pins"): FeishuStandIn._pin,
}


def _shape(path: str) -> str:
    """The route of a path: a message id replaced by ``*``."""
    parts = path.split("/")
    if path.startswith(_MESSAGES + "/") and len(parts) > 5:
        parts[5] = "*"
    return "/".join(parts)


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8")) if raw else None
    except ValueError:
        return None


def _fields(body: Any, allowed: frozenset[str], *, required: tuple[str, ...]) -> _Answer | None:
    if not isinstance(body, dict):
        return _error(400, CODE_BAD_FIELD, "field validation failed: the body is not JSON")
    unknown = sorted(set(body) - allowed)
    if unknown:
        return _error(400, CODE_BAD_FIELD, f"field validation failed: unknown field {unknown[0]}")
    missing = [name for name in required if not body.get(name)]
    if missing:
        return _error(400, CODE_BAD_FIELD, f"field validation failed: {missing[0]} is required")
    return None


def _multipart(headers: Mapping[str, str], raw: bytes) -> dict[str, tuple[bytes, str]] | None:
    """A multipart form's fields: name to (content, file name)."""
    content_type = headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        return None
    parser = email.parser.BytesParser(policy=email.policy.HTTP)
    parsed = parser.parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
    form: dict[str, tuple[bytes, str]] = {}
    for part in parsed.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            form[name] = (payload, part.get_filename() or "")
    return form


def _summary_of(headers: Mapping[str, str], raw: bytes) -> Any:
    form = _multipart(headers, raw)
    if form is not None:
        return sorted(form)
    return _json(raw)


def _ok(data: dict[str, Any]) -> _Answer:
    return _Answer(200, json.dumps({"code": CODE_OK, "msg": "success", "data": data}).encode())


def _ok_flat(fields: dict[str, Any], *, status: int) -> _Answer:
    return _Answer(status, json.dumps({"code": CODE_OK, "msg": "ok", **fields}).encode())


def _error(status: int, code: int, msg: str) -> _Answer:
    body = {"code": code, "msg": msg, "error": {"log_id": "20261204000000STANDIN"}}
    return _Answer(status, json.dumps(body).encode())


def _faulty(kind: Fault) -> _Answer:
    if kind is Fault.RATE_LIMIT_TEXT:
        return _Answer(429, b"Too Many Requests", "text/plain; charset=utf-8")
    if kind is Fault.RATE_LIMIT:
        body = json.dumps({"code": CODE_RATE_LIMIT, "msg": "request trigger frequency limit"})
        limits = (("x-ogw-ratelimit-limit", "50"), ("x-ogw-ratelimit-reset", "1"))
        return _Answer(429, body.encode(), headers=limits)
    if kind is Fault.NO_DATA:
        return _Answer(200, json.dumps({"code": CODE_OK, "msg": "success"}).encode())
    if kind is Fault.SERVER_ERROR:
        return _Answer(500, json.dumps({"code": 1500, "msg": "internal error"}).encode())
    page = b"<html><head><title>404 Not Found</title></head><body>Not Found</body></html>"
    return _Answer(404, page, "text/html; charset=utf-8")


def _handler(standin: FeishuStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_PATCH(self) -> None:
            self._serve()

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.send_error(413)
                return
            raw = self.rfile.read(length) if length else b""
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            headers = {key.lower(): value for key, value in self.headers.items()}
            answer = standin.answer(self.command, url.path, query, headers, raw)
            fault = answer.fault
            if fault is not None and fault.kind is Fault.LOST:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault is not None and fault.kind is Fault.SLOW:
                time.sleep(fault.delay_s)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers:
                self.send_header(name, value)
            self.end_headers()
            try:
                self.wfile.write(answer.body)
            except OSError:
                self.close_connection = True

    return Handler
