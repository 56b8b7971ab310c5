"""Feishu's requests verified and read as Feishu sends them (encrypted, signed), checked against
the official SDK's own decryption and dispatcher, and refused when any part is tampered with."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from lark_oapi.core.model import RawRequest
from lark_oapi.core.utils import AESCipher
from lark_oapi.event.custom import CustomizedEvent
from lark_oapi.event.dispatcher_handler import EventDispatcherHandler

from bot.feishu.events import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    CardAction,
    EventOnce,
    EventRefused,
    EventVerifier,
    Ignored,
    MessageReceived,
    UrlChallenge,
    decrypt,
    encrypt,
    read_event,
    signature_of,
)

TOKEN = "v-token-0123456789"
KEY = "encrypt-key-abcdef"
NOW_S = 1_800_000_000.0


def message_event(
    text: str = "/gpu status",
    *,
    chat_type: str = "p2p",
    mentions: list[dict[str, Any]] | None = None,
    event_id: str = "ev-1",
    token: str = TOKEN,
    sender_type: str = "user",
    message_type: str = "text",
    thread_id: str = "",
) -> dict[str, Any]:
    """An im.message.receive_v1 event as Feishu's documentation shows it."""
    message: dict[str, Any] = {
        "message_id": "om_1",
        "root_id": "om_0" if thread_id else "",
        "parent_id": "",
        "create_time": "1800000000000",
        "chat_id": "oc_chat",
        "chat_type": chat_type,
        "message_type": message_type,
        "content": json.dumps({"text": text}),
        "mentions": mentions or [],
    }
    if thread_id:
        message["thread_id"] = thread_id
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "token": token,
            "create_time": "1800000000000",
            "event_type": "im.message.receive_v1",
            "tenant_key": "tenant",
            "app_id": "cli_app",
        },
        "event": {
            "sender": {
                "sender_id": {"open_id": "ou_alice", "union_id": "on_a", "user_id": "a"},
                "sender_type": sender_type,
                "tenant_key": "tenant",
            },
            "message": message,
        },
    }


def card_event(value: dict[str, Any], *, event_id: str = "ev-card") -> dict[str, Any]:
    """A card.action.trigger callback (schema 2.0)."""
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "token": TOKEN,
            "create_time": "1800000000000",
            "event_type": "card.action.trigger",
            "tenant_key": "tenant",
            "app_id": "cli_app",
        },
        "event": {
            "operator": {"tenant_key": "tenant", "open_id": "ou_bob", "union_id": "on_b"},
            "token": "c-update-token",
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": "om_card", "open_chat_id": "oc_chat"},
        },
    }


def sealed(
    payload: dict[str, Any], *, key: str = KEY, stamp: float = NOW_S, nonce: str = "n0nce"
) -> tuple[dict[str, str], bytes]:
    """Headers and body as Feishu sends ``payload``: encrypted under ``key``, then signed."""
    body = json.dumps({"encrypt": encrypt(key, json.dumps(payload).encode(), iv=os.urandom(16))})
    raw = body.encode()
    timestamp = str(int(stamp))
    headers = {
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: signature_of(timestamp, nonce, key, raw),
        "Content-Type": "application/json",
    }
    return headers, raw


def verifier(**kwargs: Any) -> EventVerifier:
    return EventVerifier(verification_token=TOKEN, encrypt_key=KEY, clock=lambda: NOW_S, **kwargs)


# --- the SDK's own algorithm ---------------------------------------------------------------------


def test_the_sdk_decrypts_what_is_encrypted_here_and_back() -> None:
    plaintext = json.dumps(message_event()).encode()
    encrypted = encrypt(KEY, plaintext, iv=os.urandom(16))
    assert AESCipher(KEY).decrypt_str(encrypted) == plaintext.decode()
    assert decrypt(KEY, encrypted) == plaintext


def test_the_sdk_dispatcher_accepts_the_same_signed_request() -> None:
    seen: list[str] = []

    def on_message(event: CustomizedEvent) -> None:
        seen.append(event.header.event_id)

    handler: EventDispatcherHandler = (
        EventDispatcherHandler.builder(KEY, TOKEN)
        .register_p2_customized_event("im.message.receive_v1", on_message)
        .build()
    )
    headers, body = sealed(message_event(event_id="ev-sdk"))
    request = RawRequest()
    request.uri = "/feishu/events"
    request.body = body
    request.headers = headers
    assert handler.do(request).status_code == 200
    assert seen == ["ev-sdk"]
    assert isinstance(verifier().verify(headers, body), MessageReceived)


# --- accepted ------------------------------------------------------------------------------------


def test_a_message_is_read_with_its_sender_chat_and_text() -> None:
    headers, body = sealed(message_event("/gpu status", thread_id="omt_1"))
    event = verifier().verify(headers, body)
    assert event == MessageReceived(
        event_id="ev-1",
        open_id="ou_alice",
        chat_id="oc_chat",
        chat_type="p2p",
        message_id="om_1",
        text="/gpu status",
        mentioned_bot=False,
        root_id="om_0",
        thread_id="omt_1",
    )
    assert event.user_id == "feishu:ou_alice"


def test_headers_are_read_without_regard_to_case() -> None:
    headers, body = sealed(message_event())
    lower = {name.lower(): value for name, value in headers.items()}
    assert isinstance(verifier().verify(lower, body), MessageReceived)


def test_the_bots_mention_is_taken_out_and_a_persons_becomes_at_name() -> None:
    mentions = [
        {"key": "@_user_1", "id": {"open_id": "ou_bot"}, "name": "gpubot", "mentioned_type": "bot"},
        {"key": "@_user_2", "id": {"open_id": "ou_carol"}, "name": "Carol Li"},
    ]
    payload = message_event("@_user_1  allow box @_user_2", chat_type="group", mentions=mentions)
    event = read_event(payload)
    assert isinstance(event, MessageReceived)
    assert event.text == "allow box @CarolLi"
    assert event.mentioned_bot


def test_the_bots_own_open_id_decides_which_mention_is_the_bot() -> None:
    mentions = [
        {"key": "@_user_1", "id": {"open_id": "ou_other"}, "name": "other", "mentioned_type": "bot"}
    ]
    payload = message_event("@_user_1 status", chat_type="group", mentions=mentions)
    event = read_event(payload, bot_open_id="ou_bot")
    assert isinstance(event, MessageReceived)
    assert not event.mentioned_bot
    assert event.text == "@other status"


def test_a_card_click_is_read_with_the_clicker_value_and_message() -> None:
    headers, body = sealed(card_event({"action_id": "release_confirm", "value": "12"}))
    event = verifier().verify(headers, body)
    assert event == CardAction(
        event_id="ev-card",
        open_id="ou_bob",
        value={"action_id": "release_confirm", "value": "12"},
        open_message_id="om_card",
        open_chat_id="oc_chat",
    )
    assert event.user_id == "feishu:ou_bob"


def test_the_url_challenge_is_answered_unsigned_when_its_token_and_encryption_hold() -> None:
    payload = {"challenge": "ch-123", "token": TOKEN, "type": "url_verification"}
    _, body = sealed(payload)
    assert verifier().verify({}, body) == UrlChallenge("ch-123")


def test_an_event_the_bot_does_not_handle_is_ignored() -> None:
    payload = message_event()
    payload["header"]["event_type"] = "im.chat.member.bot.added_v1"
    headers, body = sealed(payload)
    assert verifier().verify(headers, body) == Ignored("im.chat.member.bot.added_v1", "ev-1")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"sender_type": "app"}, "not sent by a person"),
        ({"message_type": "image"}, "not a text message"),
    ],
)
def test_messages_from_bots_and_other_kinds_are_ignored(
    change: dict[str, str], reason: str
) -> None:
    event = read_event(message_event(**change))  # type: ignore[arg-type]
    assert isinstance(event, Ignored)
    assert event.reason == reason


def test_a_v1_event_is_ignored_after_its_token_is_checked() -> None:
    payload = {
        "uuid": "u-1",
        "token": TOKEN,
        "ts": "1800000000.0",
        "type": "event_callback",
        "event": {"type": "message", "open_id": "ou_alice"},
    }
    headers, body = sealed(payload)
    assert verifier().verify(headers, body) == Ignored("message", "u-1", reason="a v1 event")
    bad = {**payload, "token": "nope"}
    headers, body = sealed(bad)
    with pytest.raises(EventRefused):
        verifier().verify(headers, body)


# --- refused -------------------------------------------------------------------------------------


def _refused(headers: dict[str, str], body: bytes) -> EventRefused:
    with pytest.raises(EventRefused) as caught:
        verifier().verify(headers, body)
    return caught.value


@pytest.mark.parametrize("header", [SIGNATURE_HEADER, TIMESTAMP_HEADER, NONCE_HEADER])
def test_tampering_with_any_signed_header_is_refused(header: str) -> None:
    headers, body = sealed(message_event())
    headers[header] = headers[header][:-1] + ("0" if headers[header][-1] != "0" else "1")
    assert _refused(headers, body).status == 401


def test_a_body_changed_after_signing_is_refused() -> None:
    headers, body = sealed(message_event())
    other = sealed(message_event("/gpu release box"))[1]
    assert _refused(headers, other).status == 401
    # One bit of the ciphertext: the signature no longer matches.
    outer = json.loads(body)
    chars = list(outer["encrypt"])
    chars[30] = "A" if chars[30] != "A" else "B"
    tampered = json.dumps({"encrypt": "".join(chars)}).encode()
    assert _refused(headers, tampered).status == 401


def test_a_body_resigned_without_the_key_is_refused() -> None:
    headers, body = sealed(message_event(), key="someone-elses-key")
    assert _refused(headers, body).status == 401


def test_a_wrong_verification_token_is_refused_even_when_well_signed() -> None:
    headers, body = sealed(message_event(token="stolen"))
    assert "token" in _refused(headers, body).message


def test_missing_signature_headers_are_refused() -> None:
    _, body = sealed(message_event())
    assert _refused({}, body).status == 401


@pytest.mark.parametrize("off_s", [-301, 301])
def test_a_timestamp_outside_five_minutes_is_refused(off_s: int) -> None:
    headers, body = sealed(message_event(), stamp=NOW_S + off_s)
    assert "timestamp" in _refused(headers, body).message
    inside, body = sealed(message_event(), stamp=NOW_S + (299 if off_s > 0 else -299))
    assert isinstance(verifier().verify(inside, body), MessageReceived)


def test_a_plaintext_body_is_refused() -> None:
    raw = json.dumps(message_event()).encode()
    stamp = str(int(NOW_S))
    headers = {
        TIMESTAMP_HEADER: stamp,
        NONCE_HEADER: "n",
        SIGNATURE_HEADER: signature_of(stamp, "n", KEY, raw),
    }
    assert _refused(headers, raw).status == 401


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"encrypt": 5}', b'{"encrypt": "%%%"}'])
def test_an_unreadable_body_is_a_400(body: bytes) -> None:
    assert _refused({}, body).status == 400


def test_a_challenge_with_a_wrong_token_is_refused() -> None:
    _, body = sealed({"challenge": "c", "token": "wrong", "type": "url_verification"})
    assert _refused({}, body).status == 401


def test_a_handled_event_without_its_fields_is_a_400() -> None:
    payload = card_event({"action_id": "x", "value": "1"})
    del payload["event"]["context"]
    headers, body = sealed(payload)
    assert _refused(headers, body).status == 400


# --- event ids -----------------------------------------------------------------------------------


def test_an_event_id_passes_once() -> None:
    once = EventOnce()
    assert once.first_time("ev-1")
    assert not once.first_time("ev-1")
    assert once.first_time("ev-2")
    assert once.first_time("")


def test_the_verifier_needs_both_secrets() -> None:
    with pytest.raises(ValueError, match="both needed"):
        EventVerifier(verification_token="", encrypt_key=KEY)
    with pytest.raises(ValueError, match="both needed"):
        EventVerifier(verification_token=TOKEN, encrypt_key="")


def test_a_signed_url_challenge_is_answered_and_a_badly_signed_one_refused() -> None:
    payload = {"challenge": "ch-9", "token": TOKEN, "type": "url_verification"}
    headers, body = sealed(payload)
    assert verifier().verify(headers, body) == UrlChallenge("ch-9")
    headers[SIGNATURE_HEADER] = "0" * 64
    assert _refused(headers, body).status == 401
