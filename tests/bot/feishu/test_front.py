"""Feishu messages and card clicks run through the same command path as Slack's, answered as
cards where Feishu shows them: in reply, in the thread, or in the person's one-to-one chat."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from bot.commands import build_registry
from bot.commands.registry import ActionSpec, CommandSpec, Registry, Reply
from bot.errors import FeishuError, SlackError
from bot.executor import BotExecutor
from bot.feishu.events import CardAction, MessageReceived
from bot.feishu.front import NOT_A_COMMAND_NOTE, FeishuFront, command_text
from bot.fleet.base import LOCAL_HOST
from bot.runtime import Runtime
from bot.services.access import Caller, is_admin
from bot.store.db import Database
from bot.store.models import Person
from tests.bot.feishu.doubles import WAIT_S, RecordingSender, Sent, action_of, card_of
from tests.bot.services.support import Clock, add_instance, make_runtime

#: What the test commands and buttons saw: the caller's user id, admin or not.
SEEN: list[tuple[str, bool]] = []


def _whoami(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    SEEN.append((caller.user_id, is_admin(rt, caller)))
    return Reply(text=f"you are {caller.user_id}", ephemeral=False)


def _secret(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    return Reply(text="only you see this")


def _button(replace_original: bool, ephemeral: bool) -> Any:
    def handler(rt: Runtime, caller: Caller, value: str) -> Reply:
        SEEN.append((caller.user_id, is_admin(rt, caller)))
        return Reply(
            text=f"clicked {value}", ephemeral=ephemeral, replace_original=replace_original
        )

    return handler


def _command(name: str, handler: Any) -> CommandSpec:
    return CommandSpec(
        name=name,
        summary=name,
        usage=f"/gpu {name}",
        examples=(),
        configure=lambda parser: None,
        handler=handler,
    )


def small_registry() -> Registry:
    registry = Registry()
    registry.command(_command("whoami", _whoami))
    registry.command(_command("secret", _secret))
    registry.action(ActionSpec("swap", _button(replace_original=True, ephemeral=False)))
    registry.action(ActionSpec("tell", _button(replace_original=False, ephemeral=True)))
    registry.action(ActionSpec("say", _button(replace_original=False, ephemeral=False)))
    return registry


def message(text: str, **changes: Any) -> MessageReceived:
    base = MessageReceived(
        event_id="ev-1",
        open_id="ou_alice",
        chat_id="oc_chat",
        chat_type="p2p",
        message_id="om_1",
        text=text,
    )
    return replace(base, **changes)


def click(action_id: str, value: str = "7", **changes: Any) -> CardAction:
    base = CardAction(
        event_id="ev-card",
        open_id="ou_bob",
        value={"action_id": action_id, "value": value},
        open_message_id="om_card",
        open_chat_id="oc_chat",
    )
    return replace(base, **changes)


@pytest.fixture
def rt(sqlite_db: Database) -> Runtime:
    return make_runtime(sqlite_db, Clock(), feishu_admins=frozenset({"ou_boss"}))


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def front(rt: Runtime, sender: RecordingSender) -> Iterator[FeishuFront]:
    SEEN.clear()
    made = FeishuFront(rt, small_registry(), sender, card_of=card_of, action_of=action_of)
    yield made
    made.close()


def run(front: FeishuFront, event: MessageReceived) -> None:
    running = front.on_message(event)
    assert running is not None
    running.result(timeout=WAIT_S)


# --- what is a command -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "chat_type", "mentioned", "expected"),
    [
        ("/gpu status", "p2p", False, "status"),
        ("gpu status box", "p2p", False, "status box"),
        ("GPU help", "p2p", False, "help"),
        ("/gpu", "p2p", False, ""),
        ("status", "p2p", True, "status"),
        ("/gpu status", "group", True, "status"),
        ("status", "group", True, "status"),
        ("status", "p2p", False, None),
        ("gpus are busy", "p2p", False, None),
        ("/gpu status", "group", False, None),
        ("gpu status", "group", False, None),
        ("/gpu status", "topic", True, None),
    ],
)
def test_command_text(text: str, chat_type: str, mentioned: bool, expected: str | None) -> None:
    event = message(text, chat_type=chat_type, mentioned_bot=mentioned)
    assert command_text(event) == expected


# --- messages ----------------------------------------------------------------------------------


def test_a_one_to_one_command_is_answered_in_reply_as_its_sender(
    front: FeishuFront, sender: RecordingSender
) -> None:
    run(front, message("/gpu whoami"))
    [sent] = sender.wait_for(1)
    assert sent == Sent(
        "reply", "om_1", card_of("you are feishu:ou_alice", ()), "m-ev-1", in_thread=False
    )
    assert SEEN == [("feishu:ou_alice", False)]


def test_the_caller_is_remembered_as_a_person(
    front: FeishuFront, sender: RecordingSender, rt: Runtime
) -> None:
    run(front, message("/gpu whoami"))
    with rt.db.session() as session:
        assert session.get(Person, "feishu:ou_alice") is not None


def test_a_group_command_mentioning_the_bot_is_answered_in_its_thread(
    front: FeishuFront, sender: RecordingSender
) -> None:
    run(front, message("whoami", chat_type="group", mentioned_bot=True, thread_id="omt_1"))
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target, sent.in_thread) == ("reply", "om_1", True)


def test_an_ephemeral_answer_to_a_group_goes_to_the_persons_own_chat(
    front: FeishuFront, sender: RecordingSender
) -> None:
    run(front, message("/gpu secret", chat_type="group", mentioned_bot=True))
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.receive_id_type, sent.target) == ("send", "open_id", "ou_alice")
    assert sent.card["text"] == "only you see this"


def test_an_ephemeral_answer_in_a_one_to_one_chat_replies_there(
    front: FeishuFront, sender: RecordingSender
) -> None:
    run(front, message("/gpu secret"))
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target) == ("reply", "om_1")


def test_a_group_message_without_the_bot_runs_nothing(
    front: FeishuFront, sender: RecordingSender
) -> None:
    assert front.on_message(message("/gpu whoami", chat_type="group")) is None
    assert SEEN == []
    assert sender.sent == []


def test_a_one_to_one_message_that_is_no_command_is_told_how_to_ask(
    front: FeishuFront, sender: RecordingSender
) -> None:
    assert front.on_message(message("hello")) is None
    [sent] = sender.wait_for(1)
    assert sent.how == "reply"
    assert NOT_A_COMMAND_NOTE in sent.card["text"]
    assert SEEN == []


def test_feishu_admins_are_admins_and_no_one_else(
    front: FeishuFront, sender: RecordingSender
) -> None:
    run(front, message("/gpu whoami", open_id="ou_boss", event_id="ev-a"))
    run(front, message("/gpu whoami", open_id="ou_alice", event_id="ev-b"))
    # A Slack admin's ID typed as an open_id is no one's admin here.
    run(front, message("/gpu whoami", open_id="UADMIN", event_id="ev-c"))
    assert SEEN == [("feishu:ou_boss", True), ("feishu:ou_alice", False), ("feishu:UADMIN", False)]


def test_a_usage_error_is_answered_like_slacks(front: FeishuFront, sender: RecordingSender) -> None:
    run(front, message("/gpu nonsense"))
    [sent] = sender.wait_for(1)
    assert ":warning:" in sent.card["text"]


def test_a_refused_reply_goes_to_the_persons_own_chat(
    front: FeishuFront, sender: RecordingSender
) -> None:
    sender.fail = SlackError("message gone", error="230011")
    run(front, message("/gpu whoami", chat_type="group", mentioned_bot=True))
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target, sent.uuid) == ("send", "ou_alice", "d-m-ev-1")


def test_a_reply_of_unknown_outcome_is_not_sent_again(
    front: FeishuFront, sender: RecordingSender
) -> None:
    sender.fail = SlackError("timed out", error="unreachable", outcome_unknown=True)
    run(front, message("/gpu whoami"))
    assert sender.sent == []


def test_a_reply_feishu_asks_to_slow_down_is_sent_again_after_its_wait(
    rt: Runtime, sender: RecordingSender
) -> None:
    waits: list[float] = []
    front = FeishuFront(
        rt, small_registry(), sender, card_of=card_of, action_of=action_of, sleep=waits.append
    )
    try:
        sender.fail = FeishuError("slow down", error="ratelimited", retry_after_s=0.5)
        run(front, message("/gpu whoami"))
    finally:
        front.close()
    [sent] = sender.sent
    assert (sent.how, sent.target, sent.uuid) == ("reply", "om_1", "m-ev-1")  # in its place
    assert waits == [0.5]


# --- card clicks -------------------------------------------------------------------------------


def test_a_click_that_replaces_the_card_updates_it_in_place(
    front: FeishuFront, sender: RecordingSender
) -> None:
    assert front.on_card_action(click("swap")) == {}
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target, sent.card["text"]) == ("update", "om_card", "clicked 7")
    assert SEEN == [("feishu:ou_bob", False)]  # the clicker, not whoever got the card


def test_an_ephemeral_click_answer_goes_to_the_clickers_own_chat(
    front: FeishuFront, sender: RecordingSender
) -> None:
    front.on_card_action(click("tell"))
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target, sent.uuid) == ("send", "ou_bob", "a-ev-card")


def test_a_click_answer_for_all_replies_to_the_card(
    front: FeishuFront, sender: RecordingSender
) -> None:
    front.on_card_action(click("say", open_id="ou_boss"))
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target, sent.in_thread) == ("reply", "om_card", False)
    assert SEEN == [("feishu:ou_boss", True)]


@pytest.mark.parametrize("value", ["01", "x", "99999999999"])
def test_a_malformed_button_value_reaches_no_handler(
    front: FeishuFront, sender: RecordingSender, value: str
) -> None:
    front.on_card_action(click("swap", value))
    [sent] = sender.wait_for(1)
    assert "out of date or malformed" in sent.card["text"]
    assert SEEN == []


def test_an_unreadable_callback_value_is_a_button_that_does_nothing(
    front: FeishuFront, sender: RecordingSender
) -> None:
    front.on_card_action(replace(click("swap"), value={"nothing": "here"}))
    [sent] = sender.wait_for(1)
    assert "no longer does anything" in sent.card["text"]
    assert SEEN == []


def test_a_busy_bot_answers_a_click_with_a_toast_and_runs_nothing(
    rt: Runtime, sender: RecordingSender
) -> None:
    SEEN.clear()
    gate = threading.Event()
    executor = BotExecutor(1, max_queued=0, per_user=1)
    busy_rt = replace(rt, executor=executor)
    front = FeishuFront(busy_rt, small_registry(), sender, card_of=card_of, action_of=action_of)
    try:
        held: Future[bool] = executor.submit_command("feishu:ou_bob", gate.wait, WAIT_S)
        answer = front.on_card_action(click("swap"))
        assert answer["toast"]["type"] == "warning"
        assert "You already have 1 command running" in answer["toast"]["content"]
        gate.set()
        held.result(timeout=WAIT_S)
        assert SEEN == []
    finally:
        gate.set()
        front.close()
        executor.shutdown(wait=True)


# --- trust, with the bot's own commands --------------------------------------------------------


def test_local_is_no_instance_from_feishu(
    rt: Runtime, sender: RecordingSender, sqlite_db: Database
) -> None:
    local_id = add_instance(
        sqlite_db, name="local", host=LOCAL_HOST, port=0, owner_id="feishu:ou_alice"
    )
    front = FeishuFront(rt, build_registry(), sender, card_of=card_of, action_of=action_of)
    try:
        run(front, message("/gpu status local"))
        front.on_card_action(click("instance_release_confirm", str(local_id), open_id="ou_alice"))
        said = [sent.card["text"] for sent in sender.wait_for(2)]
    finally:
        front.close()
    assert "There is no instance called 'local'" in said[0]
    assert f"There is no instance with id {local_id}" in said[1]


def test_commands_run_on_the_runtimes_executor(rt: Runtime, sender: RecordingSender) -> None:
    names: list[str] = []

    def whoami(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
        names.append(threading.current_thread().name)
        return Reply(text="ok")

    registry = Registry()
    registry.command(_command("whoami", whoami))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="the-bots-pool")
    front = FeishuFront(
        replace(rt, executor=pool), registry, sender, card_of=card_of, action_of=action_of
    )
    try:
        run(front, message("/gpu whoami"))
    finally:
        front.close()
        pool.shutdown(wait=True)
    assert len(names) == 1
    assert names[0].startswith("the-bots-pool")


def test_the_note_for_a_message_that_is_no_command_speaks_the_workspaces_language(
    sqlite_db: Database, sender: RecordingSender
) -> None:
    rt = make_runtime(sqlite_db, Clock(), language="zh")
    front = FeishuFront(rt, small_registry(), sender, card_of=card_of, action_of=action_of)
    try:
        assert front.on_message(message("你好")) is None
        [sent] = sender.wait_for(1)
    finally:
        front.close()
    assert sent.card["text"].startswith("要使用机器人")
    assert "`/gpu help`" in sent.card["text"]


def test_blocks_that_make_no_card_are_answered_with_their_text(
    rt: Runtime, sender: RecordingSender
) -> None:
    def strict_card_of(text: str, blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if blocks:
            raise ValueError("a block type the cards do not know")
        return card_of(text, blocks)

    def odd(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
        return Reply(text="the answer", blocks=({"type": "video"},))

    registry = Registry()
    registry.command(_command("odd", odd))
    front = FeishuFront(rt, registry, sender, card_of=strict_card_of, action_of=action_of)
    try:
        run(front, message("/gpu odd"))
    finally:
        front.close()
    [sent] = sender.wait_for(1)
    assert sent.card == {"text": "the answer", "blocks": []}
