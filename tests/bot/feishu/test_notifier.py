"""FeishuNotifier against the stand-in: the Notifier protocol's posts, DMs, thread replies,
updates and files, and a keyed post whose answer was lost made once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from bot.blocks import kit
from bot.errors import FeishuError
from bot.feishu.client import FeishuClient, message_uuid
from bot.feishu.notifier import FeishuNotifier, receiver_of
from bot.feishu.standin import CHAT_RATE_PER_S, Fault, FeishuStandIn
from bot.notify import MessageRef, Notifier
from bot.runtime import Runtime
from bot.services.speaking import outbox
from bot.services.speaking.outbox import failure_kind
from bot.store.db import Database
from bot.store.models import OutboxMessage
from tests.bot.services.support import Clock, make_runtime

CHAT = "oc_ops"
ALICE = "feishu:ou_alice"
NOW = datetime(2026, 3, 3, 12, 0)


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    with FeishuStandIn(bot_chats={CHAT}, clock=lambda: 1000.0) as server:
        yield server


def notifier_for(standin: FeishuStandIn, *, timeout_s: float = 2.0) -> FeishuNotifier:
    client = FeishuClient(
        standin.app_id, standin.app_secret, api_url=standin.url, timeout_s=timeout_s
    )
    return FeishuNotifier(client, now=lambda: NOW)


def test_it_is_a_notifier(standin: FeishuStandIn) -> None:
    notifier: Notifier = notifier_for(standin)
    assert isinstance(notifier, FeishuNotifier)


def test_posts_to_a_group_and_to_a_person_as_cards(standin: FeishuStandIn) -> None:
    notifier = notifier_for(standin)
    blocks = (
        kit.section(":warning: *box* is due"),
        kit.actions([kit.button("Release", "release", "7", style="danger")]),
    )
    group = notifier.post(CHAT, "box is due", blocks)
    dm = notifier.post(ALICE, "*box* was released")
    assert group.channel == CHAT
    assert dm.channel == ALICE
    stored = {m.message_id: m for m in standin.messages}
    assert stored[group.ts].chat_id == CHAT
    card = stored[group.ts].card
    assert card["body"]["elements"][0]["content"] == "\u26a0\ufe0f **box** is due"
    [button] = card["body"]["elements"][1]["columns"][0]["elements"]
    assert button["behaviors"][0]["value"] == {"action_id": "release", "value": "7"}
    assert stored[dm.ts].chat_id == FeishuStandIn.p2p_chat("ou_alice")
    assert stored[dm.ts].card["body"]["elements"][0]["content"] == "**box** was released"


def test_a_reply_goes_in_the_thread_and_an_update_replaces_the_card(
    standin: FeishuStandIn,
) -> None:
    notifier = notifier_for(standin)
    root = notifier.post(CHAT, "job j-1 started")
    reply = notifier.post(CHAT, "job j-1 finished", thread_ts=root.ts)
    notifier.update(root, "job j-1 *done*")
    parent, child = standin.messages
    assert child.message_id == reply.ts
    assert child.parent_id == root.ts
    assert child.thread_id is not None
    assert parent.thread_id == child.thread_id
    assert parent.card["body"]["elements"][0]["content"] == "job j-1 **done**"
    assert parent.card["config"]["summary"] == {"content": "job j-1 done"}


def test_a_keyed_post_whose_answer_was_lost_is_made_once(standin: FeishuStandIn) -> None:
    notifier = notifier_for(standin, timeout_s=0.5)
    notifier.post(CHAT, "warm")
    standin.fault(Fault.LOST)
    with pytest.raises(FeishuError) as caught:
        notifier.post(CHAT, "digest", key="outbox:9")
    assert failure_kind(caught.value) == "unknown"
    assert notifier.find(CHAT, "outbox:9", since=NOW - timedelta(minutes=2)) is None
    again = notifier.post(CHAT, "digest", key="outbox:9")
    keyed = message_uuid("outbox:9", CHAT, "")
    assert [m.message_id for m in standin.messages if m.uuid == keyed] == [again.ts]
    assert len(standin.messages) == 2
    other = notifier.post(ALICE, "digest", key="outbox:9")
    assert other.ts != again.ts


def test_posts_without_a_key_are_never_merged(standin: FeishuStandIn) -> None:
    notifier = notifier_for(standin)
    first = notifier.post(CHAT, "same words")
    second = notifier.post(CHAT, "same words")
    assert first.ts != second.ts


def test_a_chart_goes_as_an_image_after_its_caption_and_a_csv_as_a_file(
    standin: FeishuStandIn,
) -> None:
    notifier = notifier_for(standin)
    digest = notifier.post(CHAT, "March digest")
    notifier.upload_file(
        CHAT,
        "spend-2026-03.png",
        b"\x89PNG-chart",
        title="GPU spend per day, March 2026",
        thread_ts=digest.ts,
    )
    notifier.upload_file(ALICE, "spend-2026-03.csv", b"a,b\n", title="spend", comment="Yours.")
    _, caption, image, note, csv = standin.messages
    assert caption.card["body"]["elements"][0]["content"] == "**GPU spend per day, March 2026**"
    assert caption.parent_id == digest.ts
    assert (image.msg_type, image.parent_id) == ("image", digest.ts)
    assert image.thread_id == caption.thread_id is not None
    png, sheet = standin.uploads
    assert image.card == {"image_key": png.key}
    assert png.content == b"\x89PNG-chart"
    assert note.card["body"]["elements"][0]["content"] == "Yours."
    assert (csv.msg_type, csv.chat_id) == ("file", FeishuStandIn.p2p_chat("ou_alice"))
    assert (sheet.name, sheet.content) == ("spend-2026-03.csv", b"a,b\n")


@pytest.mark.parametrize("channel", ["U0ALICE", "C0OPS", "feishu:on_union", ""])
def test_a_channel_that_is_not_feishus_is_refused_for_good(channel: str) -> None:
    with pytest.raises(FeishuError) as caught:
        receiver_of(channel)
    assert caught.value.error == "channel_not_found"
    assert failure_kind(caught.value) == "permanent"


def test_an_update_of_a_message_that_is_gone_is_refused(standin: FeishuStandIn) -> None:
    notifier = notifier_for(standin)
    with pytest.raises(FeishuError) as caught:
        notifier.update(MessageRef(CHAT, "om_gone"), "x")
    assert not caught.value.outcome_unknown


def test_a_post_feishu_asks_to_slow_down_is_made_after_the_wait() -> None:
    clock = [1000.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    with FeishuStandIn(clock=lambda: clock[0]) as standin:
        client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
        notifier = FeishuNotifier(client, now=lambda: NOW, sleep=sleep)
        refs = [notifier.post(CHAT, f"message {i}") for i in range(CHAT_RATE_PER_S + 1)]
        assert slept == [1.0]  # the chat's 5 a second: Feishu names no wait
        assert len({ref.ts for ref in refs}) == len(standin.messages) == CHAT_RATE_PER_S + 1
        standin.fault(Fault.RATE_LIMIT, times=2)
        notifier.update(refs[0], "changed")
        assert slept == [1.0, 1.0, 1.0]  # x-ogw-ratelimit-reset: 1
        standin.fault(Fault.RATE_LIMIT_TEXT, times=3)
        with pytest.raises(FeishuError) as caught:
            notifier.post(CHAT, "given up")
        assert caught.value.error == "ratelimited"
        assert len(slept) == 5


# --- the outbox's exactly-once drills, through Feishu -----------------------------------------


def _feishu_runtime(db: Database, standin: FeishuStandIn, *, timeout_s: float = 2.0) -> Runtime:
    clock = Clock()
    rt = make_runtime(db, clock, channel=CHAT)
    client = FeishuClient(
        standin.app_id, standin.app_secret, api_url=standin.url, timeout_s=timeout_s
    )
    rt.notifier = FeishuNotifier(client, now=clock, sleep=lambda _s: None)
    return rt


def _queue(rt: Runtime, key: str, recipient: str = ALICE) -> int:
    with rt.db.session() as session:
        return outbox.enqueue(
            session, key=key, kind="notice", recipient=recipient, text=f"hello {key}", now=rt.now()
        )


def _row(rt: Runtime, message_id: int) -> OutboxMessage:
    with rt.db.session() as session:
        row = session.get(OutboxMessage, message_id)
    assert row is not None
    return row


def _ticks(rt: Runtime, clock: Clock, n: int) -> None:
    for _ in range(n):
        outbox.deliver_due(rt, clock.now)
        clock.advance(seconds=30)


def test_drill_a_process_that_died_after_feishu_stored_the_post(
    sqlite_db: Database, standin: FeishuStandIn
) -> None:
    class Crash(RuntimeError):
        pass

    class DiesAfterFeishuStored(FeishuNotifier):
        def post(self, *args: Any, **kwargs: Any) -> MessageRef:
            super().post(*args, **kwargs)
            raise Crash("the bot process died here")

    rt = _feishu_runtime(sqlite_db, standin)
    clock = rt.clock
    assert isinstance(clock, Clock)
    live = rt.notifier
    assert isinstance(live, FeishuNotifier)
    rt.notifier = DiesAfterFeishuStored(live.client, now=clock)
    message_id = _queue(rt, "notice:died")
    with pytest.raises(Crash):
        outbox.deliver(rt, message_id)
    clock.advance(seconds=outbox.CLAIM_LEASE_S + 1)
    rt.notifier = live  # the process that takes the lapsed claim over
    assert outbox.deliver_due(rt, clock.now) == 1
    [stored] = [m for m in standin.messages if "notice:died" in m.content]
    assert _row(rt, message_id).delivery == outbox.POSTED
    assert _row(rt, message_id).message_ts == stored.message_id


def test_drill_feishus_answer_lost_is_never_repeated(
    sqlite_db: Database, standin: FeishuStandIn
) -> None:
    rt = _feishu_runtime(sqlite_db, standin, timeout_s=0.5)
    clock = rt.clock
    assert isinstance(clock, Clock)
    standin.fault(Fault.LOST)
    message_id = _queue(rt, "notice:lost", recipient=CHAT)
    _ticks(rt, clock, 10)
    assert len([m for m in standin.messages if "notice:lost" in m.content]) == 1  # stored once
    assert _row(rt, message_id).delivery == outbox.UNCONFIRMED


def test_drill_feishu_slowing_the_bot_down_for_ten_minutes(
    sqlite_db: Database, standin: FeishuStandIn
) -> None:
    rt = _feishu_runtime(sqlite_db, standin)
    clock = rt.clock
    assert isinstance(clock, Clock)
    standin.fault(Fault.RATE_LIMIT, times=10**6)
    message_id = _queue(rt, "notice:slow")
    _ticks(rt, clock, 20)
    assert standin.messages == []
    assert _row(rt, message_id).delivery is None  # still to be posted
    standin.heal()
    _ticks(rt, clock, 40)
    assert len([m for m in standin.messages if "notice:slow" in m.content]) == 1
    assert _row(rt, message_id).delivery == outbox.POSTED


def test_a_block_no_card_can_show_is_refused_for_good(standin: FeishuStandIn) -> None:
    notifier = notifier_for(standin)
    with pytest.raises(FeishuError) as caught:
        notifier.post(CHAT, "a form in a message", [{"type": "input", "block_id": "x"}])
    assert caught.value.error == "invalid_blocks"
    assert failure_kind(caught.value) == "permanent"
    assert standin.messages == []
