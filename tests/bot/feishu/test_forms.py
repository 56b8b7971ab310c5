"""The register and rent forms in Feishu: `/gpu register` or `/gpu rent` typed alone is answered
with a card form, and its submission runs through the forms' own code as Slack's does. Feishu's
requests are sent as Feishu sends them (encrypted, signed) to the request URL, and every answer
goes through the official SDK to the OpenAPI stand-in, which refuses a card Feishu would."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from sqlmodel import select

from bot.blocks.forms import REGISTER_FORM, RENT_FORM
from bot.blocks.home import HOME_REGISTER
from bot.feishu.cards import CALLBACK_ID, SUBMIT, plain_of
from bot.feishu.client import FeishuClient
from bot.feishu.events import EventVerifier
from bot.feishu.front import FORM_SENT_NOTE
from bot.feishu.serve import EVENTS_PATH, EventGate, FeishuEndpoint, build_gate
from bot.feishu.standin import FeishuStandIn, StoredMessage
from bot.http_server import SlackHttpServer
from bot.runtime import Runtime
from bot.store.db import Database
from bot.store.models import Instance
from tests.bot.commands.test_forms import LaunchingPlatform
from tests.bot.feishu.test_events import KEY, TOKEN, card_event, message_event
from tests.bot.feishu.test_serve import now_sealed, post
from tests.bot.services.support import Clock, make_runtime

WAIT_S = 10.0


@dataclass
class Feishu:
    """The bot's request URL, the stand-in it answers through, and the SDK's client."""

    url: str
    standin: FeishuStandIn
    client: FeishuClient
    gate: EventGate

    def typed(self, text: str, *, group: bool = False, event_id: str = "ev-typed") -> str:
        """Alice types ``text`` to the bot (in the team's group, mentioning it, when ``group``):
        the message as Feishu stores it, then its event sent to the bot; the message's id."""
        if group:
            content = {"text": f"@_user_1 {text}"}
            message_id = self.client.send_content(
                "chat_id", "oc_team", "text", content, uuid=f"u-{event_id}"
            )
            mention = {"key": "@_user_1", "id": {"open_id": "ou_bot"}, "mentioned_type": "bot"}
            event = message_event(
                f"@_user_1 {text}", chat_type="group", mentions=[mention], event_id=event_id
            )
            event["event"]["message"].update(chat_id="oc_team", message_id=message_id)
        else:
            message_id = self.client.send_content(
                "open_id", "ou_alice", "text", {"text": text}, uuid=f"u-{event_id}"
            )
            event = message_event(text, event_id=event_id)
            event["event"]["message"].update(
                chat_id=self.standin.p2p_chat("ou_alice"), message_id=message_id
            )
        assert post(self.url, *now_sealed(event)) == (200, {})
        return message_id

    def submit(
        self, form: StoredMessage, form_value: dict[str, Any], *, event_id: str
    ) -> tuple[int, dict[str, Any]]:
        """Alice presses the form's submit button with ``form_value`` filled in."""
        event = card_event(submit_value(form.card), event_id=event_id)
        event["event"]["operator"]["open_id"] = "ou_alice"
        event["event"]["action"].update(tag="button", name=SUBMIT, form_value=form_value)
        event["event"]["context"].update(open_message_id=form.message_id, open_chat_id=form.chat_id)
        return post(self.url, *now_sealed(event))


def submit_value(card: dict[str, Any]) -> dict[str, Any]:
    """The callback value of a card form's submit button."""
    [form] = card["body"]["elements"]
    [button] = [e for e in form["elements"] if e.get("form_action_type") == "submit"]
    value = button["behaviors"][0]["value"]
    assert isinstance(value, dict)
    return value


def fields(card: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A card form's fields by name."""
    [form] = card["body"]["elements"]
    return {e["name"]: e for e in form["elements"] if e.get("tag") != "button" and "name" in e}


def wait_until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def messages_in(standin: FeishuStandIn, chat_id: str) -> list[StoredMessage]:
    return [m for m in standin.messages if m.chat_id == chat_id]


def first_card_in(standin: FeishuStandIn, chat_id: str, *, after: int = 0) -> StoredMessage:
    """The first card the bot put in ``chat_id`` after the first ``after`` messages there, as
    it was then (the stand-in's own copy changes when the card is updated)."""
    wait_until(
        lambda: any(m.msg_type == "interactive" for m in messages_in(standin, chat_id)[after:])
    )
    found = next(m for m in messages_in(standin, chat_id)[after:] if m.msg_type == "interactive")
    return replace(found, versions=list(found.versions))


@pytest.fixture
def platform() -> LaunchingPlatform:
    return LaunchingPlatform()


@pytest.fixture
def rt(sqlite_db: Database, platform: LaunchingPlatform) -> Runtime:
    return make_runtime(sqlite_db, Clock(), providers=[platform])


@pytest.fixture
def feishu(rt: Runtime) -> Iterator[Feishu]:
    with FeishuStandIn() as standin:
        client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
        gate = build_gate(rt, client)
        verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
        server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
        try:
            yield Feishu(server.base_url + EVENTS_PATH, standin, client, gate)
        finally:
            server.shutdown()
            gate.front.close()


def test_register_typed_alone_is_answered_with_a_card_form(feishu: Feishu) -> None:
    typed = feishu.typed("/gpu register")
    p2p = feishu.standin.p2p_chat("ou_alice")
    form = first_card_in(feishu.standin, p2p)
    assert form.parent_id == typed  # in reply to the command
    assert submit_value(form.card)[CALLBACK_ID] == REGISTER_FORM
    assert {"name", "address", "gpu", "price", "deadline"} <= set(fields(form.card))
    assert fields(form.card)["gpu"]["tag"] == "select_static"


def test_a_form_asked_for_in_a_group_goes_to_the_persons_own_chat(feishu: Feishu) -> None:
    feishu.typed("/gpu rent", group=True)
    form = first_card_in(feishu.standin, feishu.standin.p2p_chat("ou_alice"))
    assert submit_value(form.card)[CALLBACK_ID] == RENT_FORM
    assert [m.msg_type for m in messages_in(feishu.standin, "oc_team")] == ["text"]


def test_mistakes_come_back_on_the_form_which_keeps_what_was_typed(
    feishu: Feishu, sqlite_db: Database
) -> None:
    feishu.typed("/gpu register")
    form = first_card_in(feishu.standin, feishu.standin.p2p_chat("ou_alice"))
    assert feishu.submit(form, {"name": "box1", "count": "2"}, event_id="ev-s1") == (200, {})
    wait_until(lambda: len(feishu.standin.message(form.message_id).versions) == 1)  # type: ignore[union-attr]
    again = feishu.standin.message(form.message_id)
    assert again is not None
    shown = fields(again.card)
    assert shown["name"]["default_value"] == "box1"
    assert shown["count"]["default_value"] == "2"
    words = json.dumps(again.card, ensure_ascii=False)
    assert words.count("Fill this in.") == 3  # address, GPU and price: required, left empty
    with sqlite_db.session() as session:
        assert session.exec(select(Instance)).all() == []
    # Put right and sent again, it runs again (the mistakes did not use the form up).
    assert feishu.submit(form, {"name": "box1", "count": "-1"}, event_id="ev-s2") == (200, {})
    wait_until(lambda: len(feishu.standin.message(form.message_id).versions) == 2)  # type: ignore[union-attr]


def test_the_rent_form_rents_and_answers_where_the_command_was_typed_once(
    feishu: Feishu, platform: LaunchingPlatform
) -> None:
    typed = feishu.typed("/gpu rent", group=True)
    p2p = feishu.standin.p2p_chat("ou_alice")
    form = first_card_in(feishu.standin, p2p)
    offers = [option["value"] for option in fields(form.card)["type"]["options"]]
    offer = next(value for value in offers if value.startswith("runpod:"))
    filled = {"type": offer, "count": "2", "name": "pod", "deadline": "8h"}
    assert feishu.submit(form, filled, event_id="ev-rent") == (200, {})
    # The form closes (its card says it was sent); the answer replies to the command.
    wait_until(lambda: len(messages_in(feishu.standin, "oc_team")) == 2)
    answer = messages_in(feishu.standin, "oc_team")[1]
    assert answer.parent_id == typed
    assert "pod" in json.dumps(answer.card, ensure_ascii=False)
    closed = feishu.standin.message(form.message_id)
    assert closed is not None
    assert closed.versions
    assert plain_of(FORM_SENT_NOTE.split(" ", 1)[1]) in json.dumps(closed.card)
    wait_until(lambda: len(platform.launched) == 1)
    assert platform.launched[0].count == 2
    # The same form submitted again (a second press) runs nothing more.
    assert feishu.submit(form, filled, event_id="ev-rent-again") == (200, {})
    time.sleep(0.3)
    assert len(platform.launched) == 1
    assert len(messages_in(feishu.standin, "oc_team")) == 2
    assert len(feishu.standin.message(form.message_id).versions) == 1  # type: ignore[union-attr]


def test_the_home_cards_register_button_sends_the_form(feishu: Feishu) -> None:
    notice = feishu.client.send_content(
        "open_id", "ou_alice", "text", {"text": "home"}, uuid="home"
    )
    click = card_event({"action_id": HOME_REGISTER, "value": "register"}, event_id="ev-home")
    click["event"]["operator"]["open_id"] = "ou_alice"
    click["event"]["context"]["open_message_id"] = notice
    assert post(feishu.url, *now_sealed(click)) == (200, {})
    form = first_card_in(feishu.standin, feishu.standin.p2p_chat("ou_alice"), after=1)
    assert submit_value(form.card)[CALLBACK_ID] == REGISTER_FORM
