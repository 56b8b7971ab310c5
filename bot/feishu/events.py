"""Feishu's event and card-callback requests: verified, decrypted and read into typed events.

A request is checked as Feishu sends it, by the algorithm of the official SDK lark-oapi
(``EventDispatcherHandler`` and ``AESCipher``), before anything reads what it says:

1. ``X-Lark-Signature`` is the hex ``sha256(timestamp + nonce + encrypt key + body)`` of the
   ``X-Lark-Request-Timestamp`` and ``X-Lark-Request-Nonce`` headers and the raw body, and the
   timestamp is within :data:`WINDOW_S` of now, either way; a signed request is checked so
   before its body is read at all;
2. its body is ``{"encrypt": BASE64}``: AES-256-CBC under the key ``sha256(encrypt key)``, the
   first 16 bytes of the ciphertext being the IV, PKCS#7 padding; a plaintext body is refused
   (the app has an encrypt key, so Feishu encrypts everything it sends);
3. the verification token inside the decrypted body matches (``header.token`` in a schema 2.0
   event or card callback, ``token`` in a v1 event and in the URL verification).

The URL verification alone may come unsigned (Feishu sends it so): its token and its
encryption are what it carries; anything else unsigned is refused.

A refusal is :class:`EventRefused` with the HTTP status to answer (400: unreadable, 401: not
from Feishu or stale); the event itself is one of :class:`MessageReceived`, :class:`CardAction`,
:class:`UrlChallenge` or :class:`Ignored` (an event type the bot does not handle, answered 200).
:class:`EventOnce` remembers event ids so that an event Feishu delivers again (it retries at
15 s, 5 min, 1 h and 6 h when an answer is missed) runs once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from bot.errors import GpubotError
from bot.replay import ReplayGuard

#: The signature headers Feishu sends with each event and callback.
SIGNATURE_HEADER = "X-Lark-Signature"
TIMESTAMP_HEADER = "X-Lark-Request-Timestamp"
NONCE_HEADER = "X-Lark-Request-Nonce"
#: How far a request's timestamp may be from now, either way (seconds).
WINDOW_S = 5 * 60
#: How long an event id is remembered (seconds): Feishu's retries span about 7.1 hours.
EVENT_KEEP_S = 8 * 3600
#: The event types the bot handles.
MESSAGE_RECEIVE = "im.message.receive_v1"
CARD_ACTION = "card.action.trigger"
URL_VERIFICATION = "url_verification"
#: The prefix of a Feishu person's user id in the bot (``feishu:ou_...``).
USER_PREFIX = "feishu:"
_AES_BLOCK_BYTES = 16
_MENTION_KEY = re.compile(r"@_user_\d+|@_all")


class EventRefused(GpubotError):
    """A request that is not a genuine, fresh Feishu request, or cannot be read. ``status`` is
    the HTTP status to answer it with (400 or 401); the message says why, for the log only."""

    def __init__(self, message: str, *, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Mention:
    """Someone a message @-mentions: their open_id, their name, whether they are a bot."""

    key: str
    open_id: str
    name: str
    is_bot: bool


@dataclass(frozen=True)
class MessageReceived:
    """A person's text message to the bot (``im.message.receive_v1``). ``text`` has the
    mentions of the bot taken out and other mentions written ``@name``; ``mentioned_bot`` says
    whether the bot was among them. ``root_id`` and ``thread_id`` are empty outside a thread."""

    event_id: str
    open_id: str
    chat_id: str
    chat_type: str
    message_id: str
    text: str
    mentioned_bot: bool = False
    root_id: str = ""
    thread_id: str = ""

    @property
    def user_id(self) -> str:
        """The sender as the bot knows people (``feishu:ou_...``)."""
        return USER_PREFIX + self.open_id


@dataclass(frozen=True)
class CardAction:
    """A click on a card's button (``card.action.trigger``): who clicked (open_id), the
    button's callback value, the card's message and chat, and, for a form's submit button,
    what the form held (``form_value``: field name to what was typed or chosen)."""

    event_id: str
    open_id: str
    value: Mapping[str, Any]
    open_message_id: str
    open_chat_id: str = ""
    form_value: Mapping[str, Any] = field(default_factory=dict)

    @property
    def user_id(self) -> str:
        """The clicker as the bot knows people (``feishu:ou_...``)."""
        return USER_PREFIX + self.open_id


@dataclass(frozen=True)
class UrlChallenge:
    """Feishu's check of the request URL; answered ``{"challenge": challenge}``."""

    challenge: str


@dataclass(frozen=True)
class Ignored:
    """An event the bot does not act on (its type, and why), answered 200."""

    event_type: str
    event_id: str = ""
    reason: str = "not handled"


FeishuEvent = MessageReceived | CardAction | UrlChallenge | Ignored


class EventVerifier:
    """Checks and reads the requests Feishu sends to the request URL (module docstring), with
    the app's ``verification_token`` and ``encrypt_key``; ``clock`` gives epoch seconds.
    ``bot_open_id`` (when known) tells the bot's own mentions from other bots'."""

    def __init__(
        self,
        *,
        verification_token: str,
        encrypt_key: str,
        clock: Callable[[], float] = time.time,
        window_s: float = WINDOW_S,
        bot_open_id: str = "",
    ) -> None:
        if not verification_token or not encrypt_key:
            raise ValueError("Feishu's verification token and encrypt key: both needed")
        self._token = verification_token
        self._key = encrypt_key
        self._clock = clock
        self._window_s = window_s
        self._bot_open_id = bot_open_id

    def verify(self, headers: Mapping[str, str], body: bytes) -> FeishuEvent:
        """The event a request carries. ``headers`` are looked up without regard to case.
        Raises EventRefused (400: unreadable; 401: not from Feishu, tampered with or stale)."""
        lower = {name.lower(): value for name, value in headers.items()}
        signed = bool(lower.get(SIGNATURE_HEADER.lower()))
        if signed:  # checked before anything reads the body
            self._check_signature(lower, body)
        outer = _json_object(body)
        if "encrypt" not in outer:
            raise EventRefused("a body that is not encrypted")
        payload = _json_object(decrypt(self._key, outer["encrypt"]))
        check_token(payload, self._token)
        if _event_type(payload) == URL_VERIFICATION:
            return UrlChallenge(challenge=_text(payload.get("challenge")))
        if not signed:
            raise EventRefused("no signature")
        return read_event(payload, bot_open_id=self._bot_open_id)

    def _check_signature(self, lower: Mapping[str, str], body: bytes) -> None:
        """Raise EventRefused unless the signature (``lower``: headers by lower-case name)
        is Feishu's over this body and its timestamp is fresh."""
        stamp = lower.get(TIMESTAMP_HEADER.lower(), "")
        nonce = lower.get(NONCE_HEADER.lower(), "")
        signature = lower.get(SIGNATURE_HEADER.lower(), "")
        if not stamp:
            raise EventRefused("a signature without its timestamp")
        if not (stamp.isascii() and stamp.isdigit()):
            raise EventRefused("a timestamp that is not a number")
        off_s = int(stamp) - self._clock()
        if abs(off_s) > self._window_s:
            raise EventRefused(f"a timestamp {abs(off_s):.0f} s from now")
        expected = signature_of(stamp, nonce, self._key, body)
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            raise EventRefused("a bad signature")


class EventOnce:
    """Lets each Feishu event id through once (``guard``: a bot.replay.ReplayGuard, on the
    store so that processes sharing it agree), remembered :data:`EVENT_KEEP_S` seconds."""

    def __init__(self, guard: ReplayGuard | None = None) -> None:
        self.guard = guard if guard is not None else ReplayGuard(window_s=EVENT_KEEP_S)

    def first_time(self, event_id: str) -> bool:
        """True the first time ``event_id`` is seen (an empty id always passes). Raises
        StoreError when the store cannot say."""
        if not event_id:
            return True
        return self.guard.first_time(f"feishu:{event_id}"[:128], None)


def signature_of(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """Feishu's request signature: hex sha256 of timestamp, nonce, encrypt key and raw body."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def decrypt(encrypt_key: str, encrypted: object) -> bytes:
    """The plaintext of an ``encrypt`` field (module docstring). Raises EventRefused (401)
    when it does not decrypt under the key."""
    if not isinstance(encrypted, str):
        raise EventRefused("an encrypt field that is not text", status=400)
    try:
        data = base64.b64decode(encrypted, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EventRefused("an encrypt field that is not base64", status=400) from exc
    if len(data) < 2 * _AES_BLOCK_BYTES or len(data) % _AES_BLOCK_BYTES:
        raise EventRefused("a ciphertext of the wrong length")
    key = hashlib.sha256(encrypt_key.encode()).digest()
    iv, ciphertext = data[:_AES_BLOCK_BYTES], data[_AES_BLOCK_BYTES:]
    decryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
    padded = decryptor.update(ciphertext) + decryptor.finalize()
    pad = padded[-1]
    if not 1 <= pad <= _AES_BLOCK_BYTES or padded[-pad:] != bytes([pad]) * pad:
        raise EventRefused("a ciphertext that does not decrypt under the encrypt key")
    return padded[:-pad]


def encrypt(encrypt_key: str, plaintext: bytes, *, iv: bytes) -> str:
    """``plaintext`` encrypted as Feishu encrypts (the inverse of :func:`decrypt`), base64;
    ``iv`` is 16 bytes. For the stand-in and the tests."""
    if len(iv) != _AES_BLOCK_BYTES:
        raise ValueError("the IV is 16 bytes")
    pad = _AES_BLOCK_BYTES - len(plaintext) % _AES_BLOCK_BYTES
    key = hashlib.sha256(encrypt_key.encode()).digest()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    body = encryptor.update(plaintext + bytes([pad]) * pad) + encryptor.finalize()
    return base64.b64encode(iv + body).decode()


def check_token(payload: Mapping[str, Any], verification_token: str) -> None:
    """Raise EventRefused (401) unless ``payload`` carries the verification token: in
    ``header.token`` (schema 2.0) or ``token`` (v1 events, the URL verification)."""
    header = payload.get("header")
    token = header.get("token") if isinstance(header, dict) else payload.get("token")
    if not isinstance(token, str) or not hmac.compare_digest(
        token.encode(), verification_token.encode()
    ):
        raise EventRefused("a wrong verification token")


def read_event(payload: Mapping[str, Any], *, bot_open_id: str = "") -> FeishuEvent:
    """The typed event in a decrypted, verified body (or in a long connection's frame).
    Raises EventRefused (400) for a handled event whose fields are missing."""
    event_type = _event_type(payload)
    if event_type == URL_VERIFICATION:
        return UrlChallenge(challenge=_text(payload.get("challenge")))
    header = payload.get("header")
    event_id = _text(header.get("event_id")) if isinstance(header, dict) else ""
    if not isinstance(header, dict):
        event_id = _text(payload.get("uuid"))
        return Ignored(event_type or "unknown", event_id, reason="a v1 event")
    event = payload.get("event")
    if not isinstance(event, dict):
        raise EventRefused(f"a {event_type} event without its event object", status=400)
    if event_type == MESSAGE_RECEIVE:
        return _message(event_id, event, bot_open_id)
    if event_type == CARD_ACTION:
        return _card_action(event_id, event)
    return Ignored(event_type or "unknown", event_id)


def _message(event_id: str, event: Mapping[str, Any], bot_open_id: str) -> FeishuEvent:
    sender = _object(event.get("sender"))
    message = _object(event.get("message"))
    if sender.get("sender_type") != "user":
        return Ignored(MESSAGE_RECEIVE, event_id, reason="not sent by a person")
    if message.get("message_type") != "text":
        return Ignored(MESSAGE_RECEIVE, event_id, reason="not a text message")
    open_id = _text(_object(sender.get("sender_id")).get("open_id"))
    chat_id, message_id = _text(message.get("chat_id")), _text(message.get("message_id"))
    if not (open_id and chat_id and message_id):
        raise EventRefused("a message without its sender, chat or id", status=400)
    try:
        content = json.loads(_text(message.get("content")) or "{}")
    except ValueError as exc:
        raise EventRefused("a message whose content is not JSON", status=400) from exc
    mentions = _mentions(message.get("mentions"), bot_open_id)
    text = _text(content.get("text")) if isinstance(content, dict) else ""
    return MessageReceived(
        event_id=event_id,
        open_id=open_id,
        chat_id=chat_id,
        chat_type=_text(message.get("chat_type")),
        message_id=message_id,
        text=_without_mentions(text, mentions),
        mentioned_bot=any(one.is_bot for one in mentions),
        root_id=_text(message.get("root_id")),
        thread_id=_text(message.get("thread_id")),
    )


def _card_action(event_id: str, event: Mapping[str, Any]) -> CardAction:
    operator = _object(event.get("operator"))
    action = _object(event.get("action"))
    context = _object(event.get("context"))
    open_id = _text(operator.get("open_id"))
    message_id = _text(context.get("open_message_id"))
    value = action.get("value")
    if not (open_id and message_id) or not isinstance(value, dict):
        raise EventRefused("a card action without its clicker, message or value", status=400)
    form_value = action.get("form_value")
    return CardAction(
        event_id=event_id,
        open_id=open_id,
        value=dict(value),
        open_message_id=message_id,
        open_chat_id=_text(context.get("open_chat_id")),
        form_value=dict(form_value) if isinstance(form_value, dict) else {},
    )


def _mentions(raw: object, bot_open_id: str) -> tuple[Mention, ...]:
    found: list[Mention] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        open_id = _text(_object(item.get("id")).get("open_id"))
        is_bot = open_id == bot_open_id if bot_open_id else item.get("mentioned_type") == "bot"
        found.append(Mention(_text(item.get("key")), open_id, _text(item.get("name")), is_bot))
    return tuple(found)


def _without_mentions(text: str, mentions: tuple[Mention, ...]) -> str:
    """``text`` with the bot's mention keys taken out and a person's written ``@name``."""
    by_key = {one.key: one for one in mentions if one.key}

    def replace(found: re.Match[str]) -> str:
        mention = by_key.get(found.group(0))
        if mention is None or mention.is_bot:
            return ""
        return "@" + re.sub(r"\s+", "", mention.name) if mention.name else ""

    return " ".join(_MENTION_KEY.sub(replace, text).split())


def _event_type(payload: Mapping[str, Any]) -> str:
    header = payload.get("header")
    if isinstance(header, dict):
        return _text(header.get("event_type"))
    event = payload.get("event")
    if payload.get("type") == "event_callback" and isinstance(event, dict):
        return _text(event.get("type"))
    return _text(payload.get("type"))


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventRefused("a body that is not JSON", status=400) from exc
    if not isinstance(value, dict):
        raise EventRefused("a body that is not a JSON object", status=400)
    return value


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
