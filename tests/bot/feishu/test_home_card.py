"""The Home on Feishu: `/gpu home` answers with the person's Home as a card Feishu takes, and
the ops group's pinned summary is posted once, pinned, then updated in place by the clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import select

from bot.commands import build_registry
from bot.feishu import cards
from bot.feishu.client import FeishuClient
from bot.feishu.events import MessageReceived
from bot.feishu.front import FeishuFront
from bot.feishu.home import HOME_COMMAND, PinnedSummary, with_home_command
from bot.feishu.serve import build_gate
from bot.feishu.standin import Fault, FeishuStandIn, card_problems
from bot.runtime import Runtime
from bot.store.db import Database
from bot.store.models import ChatPin
from tests.bot.feishu.doubles import WAIT_S, RecordingSender
from tests.bot.services.support import T0, Clock, add_instance, make_runtime

CHAT = "oc_ops"
PINS = "/open-apis/im/v1/pins"


@pytest.fixture
def rt(db: Database) -> Runtime:
    return make_runtime(db, Clock(), channel=CHAT)


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    with FeishuStandIn(bot_chats={CHAT}, clock=lambda: 1000.0) as server:
        yield server


def client_for(standin: FeishuStandIn) -> FeishuClient:
    return FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url, timeout_s=2.0)


def texts(card: dict[str, Any]) -> str:
    return str(card)


# --- /gpu home ----------------------------------------------------------------------------------


def test_the_front_end_answers_gpu_home() -> None:
    registry = with_home_command(build_registry())
    assert HOME_COMMAND in registry.commands
    assert "主页" in registry.commands  # its alias
    assert HOME_COMMAND not in build_registry().commands  # Slack has its Home tab


def test_the_gate_has_gpu_home(rt: Runtime) -> None:
    gate = build_gate(rt, RecordingSender())
    try:
        assert HOME_COMMAND in gate.front.registry.commands
    finally:
        gate.front.close()


@pytest.mark.parametrize("chat_type", ["p2p", "group"])
def test_gpu_home_answers_with_the_persons_home_to_them_alone(rt: Runtime, chat_type: str) -> None:
    add_instance(
        rt.db, name="mine", owner_id="feishu:ou_alice", deadline_at=T0 + timedelta(hours=3)
    )
    add_instance(rt.db, name="carols", owner_id="UCAROL", deadline_at=T0 + timedelta(hours=5))
    sender = RecordingSender()
    front = FeishuFront(
        rt,
        with_home_command(build_registry()),
        sender,
        card_of=cards.card_of,
        action_of=cards.action_of,
    )
    try:
        event = MessageReceived(
            event_id="ev-home",
            open_id="ou_alice",
            chat_id="oc_team",
            chat_type=chat_type,
            message_id="om_1",
            text="/gpu home" if chat_type == "p2p" else "home",
            mentioned_bot=chat_type == "group",
        )
        running = front.on_message(event)
        assert running is not None
        running.result(timeout=WAIT_S)
    finally:
        front.close()
    [answer] = sender.wait_for(1)
    if chat_type == "p2p":
        assert (answer.how, answer.target) == ("reply", "om_1")
    else:  # a Home is the person's alone: to their one-to-one chat
        assert (answer.how, answer.receive_id_type, answer.target) == (
            "send",
            "open_id",
            "ou_alice",
        )
    card = answer.card
    assert card["header"]["title"]["content"] == "Your GPUs"
    shown = texts(card)
    assert "mine" in shown
    assert "carols" in shown
    assert "Extend 1h" in shown
    assert card_problems(card) == []


# --- the pinned summary -------------------------------------------------------------------------


def test_the_summary_is_posted_and_pinned_once_then_updated_in_place(
    rt: Runtime, standin: FeishuStandIn
) -> None:
    add_instance(rt.db, name="box", deadline_at=T0 + timedelta(hours=2))
    pinned = PinnedSummary(rt, client_for(standin), CHAT)
    pinned.refresh()
    [message] = standin.messages
    assert message.chat_id == CHAT
    assert standin.pins == {message.message_id: CHAT}
    assert "1 instance" in message.content
    assert "box" in message.content
    assert card_problems(message.card) == []
    requests = len(standin.requests)
    pinned.refresh()  # nothing changed: nothing sent
    assert len(standin.requests) == requests
    add_instance(rt.db, name="second", deadline_at=T0 + timedelta(hours=4))
    pinned.refresh()
    [same] = standin.messages
    assert same.message_id == message.message_id
    assert len(same.versions) == 1
    assert "2 instances" in same.content
    assert "second" in same.content
    with rt.db.session() as session:
        assert session.get(ChatPin, CHAT) is not None


def test_after_a_restart_the_same_message_is_updated(rt: Runtime, standin: FeishuStandIn) -> None:
    PinnedSummary(rt, client_for(standin), CHAT).refresh()
    add_instance(rt.db, name="box")
    PinnedSummary(rt, client_for(standin), CHAT).refresh()  # a new process
    [message] = standin.messages
    assert message.versions
    assert len(standin.pins) == 1


def test_a_pin_that_failed_is_made_on_the_next_tick_without_a_second_message(
    rt: Runtime, standin: FeishuStandIn
) -> None:
    pinned = PinnedSummary(rt, client_for(standin), CHAT)
    standin.fault(Fault.SERVER_ERROR, path=PINS)
    pinned.refresh()
    assert standin.pins == {}
    with rt.db.session() as session:
        assert session.exec(select(ChatPin)).all() == []
    pinned.refresh()
    [message] = standin.messages  # the same uuid: the same message
    assert standin.pins == {message.message_id: CHAT}


def test_a_pinned_message_that_is_gone_is_posted_anew(rt: Runtime, standin: FeishuStandIn) -> None:
    with rt.db.session() as session:
        session.add(ChatPin(chat_id=CHAT, message_id="om_deleted", pinned_at=T0))
    pinned = PinnedSummary(rt, client_for(standin), CHAT)
    pinned.refresh()  # refused: forgotten
    assert standin.messages == []
    pinned.refresh()
    [message] = standin.messages
    assert standin.pins == {message.message_id: CHAT}
    with rt.db.session() as session:
        row = session.get(ChatPin, CHAT)
        assert row is not None
        assert row.message_id == message.message_id


def test_feishu_unreachable_keeps_the_clock_going(rt: Runtime, standin: FeishuStandIn) -> None:
    pinned = PinnedSummary(rt, client_for(standin), CHAT)
    standin.fault(Fault.SERVER_ERROR, times=3)
    pinned.refresh()  # logged, not raised
    standin.heal()
    pinned.refresh()
    assert len(standin.messages) == 1
