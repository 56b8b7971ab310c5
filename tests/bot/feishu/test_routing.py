"""Slack and Feishu from one process on one store: each message goes to its channel's platform,
updates follow their message, the ops channel is one destination, and the outbox's
exactly-once rules hold per destination through the router."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from bot.cli import EXIT_CONFIG, main
from bot.errors import FeishuError, SlackError
from bot.feishu.client import FeishuClient
from bot.feishu.notifier import FeishuNotifier
from bot.feishu.routing import RoutingNotifier, is_feishu, ops_channel
from bot.feishu.standin import Fault, FeishuStandIn
from bot.notify import MessageRef, Notifier
from bot.runtime import Runtime
from bot.services.speaking import identities, outbox
from bot.services.speaking.outbox import failure_kind
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import IdentityLink, OutboxMessage, Person
from tests.bot.services.support import Clock, RecordingNotifier, make_runtime

CHAT = "oc_ops"
ALICE = "feishu:ou_alice"
NOW = datetime(2026, 3, 3, 12, 0)


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    with FeishuStandIn(bot_chats={CHAT}, clock=lambda: 1000.0) as server:
        yield server


def feishu_notifier(standin: FeishuStandIn, *, timeout_s: float = 2.0) -> FeishuNotifier:
    client = FeishuClient(
        standin.app_id, standin.app_secret, api_url=standin.url, timeout_s=timeout_s
    )
    return FeishuNotifier(client, now=lambda: NOW)


def both(standin: FeishuStandIn, **kwargs: float) -> tuple[RoutingNotifier, RecordingNotifier]:
    slack = RecordingNotifier()
    return RoutingNotifier(slack=slack, feishu=feishu_notifier(standin, **kwargs)), slack


@pytest.mark.parametrize(
    ("channel", "feishu"),
    [
        ("feishu:ou_alice", True),
        ("oc_ops", True),
        ("U0123ABC", False),
        ("C0123ABC", False),
        ("D0123ABC", False),
        ("ou_alice", False),  # a bare open_id is not how the bot names a person
    ],
)
def test_a_channel_belongs_to_one_platform(channel: str, feishu: bool) -> None:
    assert is_feishu(channel) is feishu


def test_it_is_a_notifier(standin: FeishuStandIn) -> None:
    router: Notifier = both(standin)[0]
    assert isinstance(router, RoutingNotifier)


def test_posts_go_to_their_platform_and_updates_follow_their_message(
    standin: FeishuStandIn,
) -> None:
    router, slack = both(standin)
    to_group = router.post(CHAT, "box is due")
    to_alice = router.post(ALICE, "*box* was released")
    to_bob = router.post("UBOB", "*box* was released")
    in_thread = router.post(CHAT, "job done", thread_ts=to_group.ts)
    router.update(to_group, "box is *extended*")
    router.update(to_bob, "box is *back*")
    assert [p.channel for p in slack.posts] == ["UBOB"]
    assert slack.posts[0].updates == [("box is *back*", ())]
    stored = {m.message_id: m for m in standin.messages}
    assert set(stored) == {to_group.ts, to_alice.ts, in_thread.ts}
    assert (to_group.channel, to_alice.channel, to_bob.channel) == (CHAT, ALICE, "UBOB")
    assert stored[in_thread.ts].parent_id == to_group.ts
    assert stored[to_group.ts].card["body"]["elements"][0]["content"] == "box is **extended**"
    assert stored[to_alice.ts].chat_id == FeishuStandIn.p2p_chat("ou_alice")


def test_find_asks_the_channels_platform(standin: FeishuStandIn) -> None:
    router, slack = both(standin)
    posted = router.post("UBOB", "hello", key="outbox:1")
    assert router.find("UBOB", "outbox:1", since=NOW) == posted
    # Feishu's find answers None: the repeated post, with the key's uuid, is the look.
    router.post(CHAT, "hello", key="outbox:2")
    assert router.find(CHAT, "outbox:2", since=NOW) is None
    assert len(slack.posts) == 1


def test_files_go_to_their_platform(standin: FeishuStandIn) -> None:
    router, _ = both(standin)
    root = router.post(CHAT, "the digest")
    router.upload_file(
        CHAT, "costs.csv", b"a,b\n1,2\n", title="Costs", comment="", thread_ts=root.ts
    )
    assert [u.name for u in standin.uploads] == ["costs.csv"]


def test_a_platform_not_served_is_refused_for_good() -> None:
    slack_only = RoutingNotifier(slack=RecordingNotifier(), feishu=None)
    with pytest.raises(FeishuError) as refused:
        slack_only.post(CHAT, "hello")
    assert refused.value.error == "channel_not_found"
    assert failure_kind(refused.value) == "permanent"
    feishu_only = RoutingNotifier(slack=None, feishu=RecordingNotifier())
    with pytest.raises(SlackError) as slack_refused:
        feishu_only.update(MessageRef("C0123", "1.0001"), "hello")
    assert failure_kind(slack_refused.value) == "permanent"


def test_feishu_alone_reaches_a_slack_person_through_their_link(standin: FeishuStandIn) -> None:
    links = {"UALICE": ALICE}
    router = RoutingNotifier(slack=None, feishu=feishu_notifier(standin), feishu_of=links.get)
    ref = router.post("UALICE", "*box* is due")
    assert ref.channel == ALICE
    [stored] = standin.messages
    assert stored.chat_id == FeishuStandIn.p2p_chat("ou_alice")
    router.update(ref, "*box* was extended")
    assert standin.messages[0].versions  # updated in place, on Feishu
    with pytest.raises(SlackError):
        router.post("UNOBODY", "hello")


@pytest.mark.parametrize(
    ("slack", "feishu", "channel", "chat", "expected"),
    [
        (True, False, "COPS", "oc_ops", "COPS"),
        (False, True, "COPS", "oc_ops", "oc_ops"),
        (True, True, "COPS", "oc_ops", "COPS"),
        (True, True, None, "oc_ops", "oc_ops"),
        (False, True, None, None, None),
    ],
)
def test_the_ops_channel_is_one_destination(
    slack: bool, feishu: bool, channel: str | None, chat: str | None, expected: str | None
) -> None:
    settings = Settings(channel=channel, feishu_chat=chat)
    assert ops_channel(settings, slack=slack, feishu=feishu) == expected


# --- the outbox through the router, on the store ------------------------------------------------


def _runtime(db: Database, router: RoutingNotifier) -> Runtime:
    rt = make_runtime(db, Clock(NOW), channel=CHAT)
    rt.notifier = router
    return rt


def _queue(rt: Runtime, key: str, recipient: str) -> int:
    with rt.db.session() as session:
        return outbox.enqueue(
            session, key=key, kind="notice", recipient=recipient, text=key, now=rt.now()
        )


def _delivery(rt: Runtime, message_id: int) -> OutboxMessage:
    with rt.db.session() as session:
        row = session.get(OutboxMessage, message_id)
        assert row is not None
        return row


def test_the_outbox_posts_each_row_once_on_its_platform(
    db: Database, standin: FeishuStandIn
) -> None:
    router, slack = both(standin)
    rt = _runtime(db, router)
    to_feishu = _queue(rt, "notice:feishu", ALICE)
    to_ops = _queue(rt, "notice:ops", CHAT)
    to_slack = _queue(rt, "notice:slack", "UBOB")
    assert outbox.deliver_due(rt, NOW) == 3
    assert outbox.deliver_due(rt, NOW) == 0  # nothing twice
    assert sorted(m.card["config"]["summary"]["content"] for m in standin.messages) == [
        "notice:feishu",
        "notice:ops",
    ]
    assert [p.text for p in slack.posts] == ["notice:slack"]
    feishu_row, ops_row, slack_row = (_delivery(rt, i) for i in (to_feishu, to_ops, to_slack))
    assert (feishu_row.channel_id, ops_row.channel_id, slack_row.channel_id) == (
        ALICE,
        CHAT,
        "UBOB",
    )
    assert {feishu_row.message_ts, ops_row.message_ts} == {m.message_id for m in standin.messages}


def test_feishus_lost_answer_is_never_repeated_and_slack_is_not_held_up(
    sqlite_db: Database, standin: FeishuStandIn
) -> None:
    router, slack = both(standin, timeout_s=0.5)
    rt = _runtime(sqlite_db, router)
    standin.fault(Fault.LOST)
    lost = _queue(rt, "notice:lost", CHAT)
    fine = _queue(rt, "notice:fine", "UBOB")
    clock = rt.clock
    assert isinstance(clock, Clock)
    for _ in range(6):
        outbox.deliver_due(rt, clock.now)
        clock.advance(seconds=outbox.RETRY_MAX_S)
    assert len([m for m in standin.messages if "notice:lost" in m.content]) == 1
    assert _delivery(rt, lost).delivery == outbox.UNCONFIRMED
    assert _delivery(rt, fine).delivery == outbox.POSTED
    assert [p.text for p in slack.posts] == ["notice:fine"]


def test_feishu_alone_reaches_a_linked_person_from_the_store(
    db: Database, standin: FeishuStandIn
) -> None:
    router = RoutingNotifier(slack=None, feishu=feishu_notifier(standin))
    rt = _runtime(db, router)
    router.feishu_of = lambda slack_id: identities.feishu_of(rt, slack_id)
    with db.session() as session:
        session.add(Person(slack_id="UALICE"))
        session.flush()
        session.add(IdentityLink(feishu_id=ALICE, slack_id="UALICE", linked_by="UADMIN"))
    to_alice = _queue(rt, "notice:alice", "UALICE")
    to_carol = _queue(rt, "notice:carol", "UCAROL")
    outbox.deliver_due(rt, NOW)
    assert _delivery(rt, to_alice).channel_id == ALICE
    assert _delivery(rt, to_carol).delivery == outbox.FAILED  # refused for good, never twice
    [stored] = standin.messages
    assert stored.chat_id == FeishuStandIn.p2p_chat("ou_alice")


# --- gpubot feishu --with-slack ------------------------------------------------------------------


def test_serving_both_needs_slacks_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "GPUBOT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUBOT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FEISHU_APP_ID", "cli_app")
    monkeypatch.setenv("FEISHU_APP_SECRET", "secret")
    assert main(["feishu", "--with-slack"]) == EXIT_CONFIG
    assert "SLACK_BOT_TOKEN is not set" in capsys.readouterr().err
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    assert main(["feishu", "--with-slack"]) == EXIT_CONFIG
    assert "SLACK_APP_TOKEN is not set" in capsys.readouterr().err
