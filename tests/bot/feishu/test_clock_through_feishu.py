"""The clock speaking through Feishu: a runtime that serves Feishu alone, wired as `gpubot
feishu --http` wires it (a routing notifier with Feishu's notifier and no Slack, the ops channel
GPUBOT_FEISHU_CHAT, the request URL on the production HTTP server), its notifier talking to the
OpenAPI stand-in through the official SDK, on SQLite and PostgreSQL.

- A deadline warning lands once in the owner's one-to-one chat with its buttons; a stranger's
  click on them is refused; the owner's Extend moves the deadline once, updates the warning in
  place, and no second warning follows.
- A release at the deadline that nobody answered reaches the owner once and the ops group once,
  though the stand-in loses Feishu's answers after storing the messages.
- The month's digest (in Chinese, in yuan) goes to the ops group once, its chart as an image in
  its thread, with the total that `/gpu spend` reports.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest
from sqlmodel import col, select

from bot.app import build_runtime
from bot.executor import BotExecutor
from bot.feishu.client import FeishuClient
from bot.feishu.notifier import FeishuNotifier
from bot.feishu.routing import RoutingNotifier, ops_channel
from bot.feishu.serve import EVENTS_PATH, EventGate, FeishuEndpoint, build_gate, verifier_of
from bot.feishu.standin import Fault, FeishuStandIn, StoredMessage
from bot.http_server import SlackHttpServer
from bot.providers.manual import ManualProvider
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services.instances import deadlines, releases
from bot.services.money import spend
from bot.services.speaking import identities, prompts
from bot.services.tick import tick
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Prompt
from bot.values import format_money
from tests.bot.feishu.test_events import KEY, TOKEN, card_event
from tests.bot.feishu.test_readme_walk import card_words
from tests.bot.feishu.test_serve import now_sealed, post
from tests.bot.services.support import T0, Clock, ScriptedPlatform, add_instance, get_instance
from tests.bot.ticking import tick_through

ALICE = "ou_alice"
BOB = "ou_bob"
OPS_CHAT = "oc_ops"
#: The instance's deadline in the deadline tests.
D = T0 + timedelta(hours=2)
#: Never due for polling: the tests' machines have no agent to answer.
NEVER_POLL_S = 10**7
#: The longest wait for the executor or the platform pools to finish, in seconds.
IDLE_WAIT_S = 20.0
WARNED = "will be released in"
MESSAGES = "/open-apis/im/v1/messages"
EXTEND_BUTTONS = ["deadline_extend_1h", "deadline_extend_4h", "deadline_release_now"]


@dataclass
class Served:
    """The runtime serving Feishu alone, the stand-in it talks to and the request URL."""

    rt: Runtime
    clock: Clock
    platform: ScriptedPlatform
    standin: FeishuStandIn
    url: str

    def tick_through(self, until: datetime) -> None:
        """Tick up to ``until``, each tick's work finished (releases on the platform pools)."""
        tick_through(self.rt, self.clock, until)
        self.settle()

    def tick_at(self, at: datetime) -> None:
        """One tick at ``at``, its work finished."""
        tick(self.rt, self.clock.set(at))
        self.settle()

    def settle(self) -> None:
        assert self.rt.platform_work is not None
        assert self.rt.platform_work.wait_idle(IDLE_WAIT_S)
        assert isinstance(self.rt.executor, BotExecutor)
        assert self.rt.executor.wait_idle(IDLE_WAIT_S)

    def click(self, open_id: str, message: StoredMessage, action_id: str, event_id: str) -> None:
        """``open_id`` clicks the button ``action_id`` of ``message``'s card, as Feishu sends
        the callback (encrypted and signed) to the request URL; waits for its work."""
        event = card_event(button_value(message, action_id), event_id=event_id)
        event["event"]["operator"]["open_id"] = open_id
        event["event"]["context"] = {
            "open_message_id": message.message_id,
            "open_chat_id": message.chat_id,
        }
        assert post(self.url, *now_sealed(event)) == (200, {})
        self.settle()

    def chat(self, chat_id: str) -> list[StoredMessage]:
        """The messages in ``chat_id`` that are not replies, oldest first."""
        return [m for m in self.standin.messages if m.chat_id == chat_id and m.parent_id is None]

    def p2p(self, open_id: str) -> list[StoredMessage]:
        """The bot's one-to-one chat with ``open_id``."""
        return self.chat(self.standin.p2p_chat(open_id))

    def patches_of(self, message_id: str) -> int:
        """How many times the bot replaced ``message_id``'s card (and Feishu took it)."""
        path = f"/open-apis/im/v1/messages/{message_id}"
        return sum(
            1
            for r in self.standin.requests
            if r.method == "PATCH" and r.path == path and r.answered == 200
        )


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    ticks = itertools.count(0.0, 1.0)  # a second between calls: no chat's rate is reached
    with FeishuStandIn(clock=lambda: next(ticks)) as running:
        yield running


@pytest.fixture
def settings(standin: FeishuStandIn) -> Settings:
    return Settings(
        feishu_app_id=standin.app_id,
        feishu_app_secret=standin.app_secret,
        feishu_verification_token=TOKEN,
        feishu_encrypt_key=KEY,
        feishu_api_url=standin.url,
        feishu_chat=OPS_CHAT,
        poll_interval_s=NEVER_POLL_S,
    )


@pytest.fixture
def served(db: Database, standin: FeishuStandIn, settings: Settings) -> Iterator[Served]:
    yield from serve(db, standin, settings)


def serve(db: Database, standin: FeishuStandIn, settings: Settings) -> Iterator[Served]:
    """As bot.cli's ``_feishu`` wires Feishu alone over HTTP, on ``db`` and a hand clock."""
    settings = settings.with_(channel=ops_channel(settings, slack=False, feishu=True))
    client = FeishuClient(
        settings.feishu_app_id or "",
        settings.feishu_app_secret or "",
        api_url=settings.feishu_api_url,
        timeout_s=5.0,
    )
    clock = Clock()
    platform = ScriptedPlatform()
    router = RoutingNotifier(slack=None, feishu=FeishuNotifier(client, now=clock))
    rt = build_runtime(
        settings,
        notifier=router,
        clock=clock,
        db=db,
        providers=ProviderRegistry([ManualProvider(), platform]),
    )
    router.feishu_of = partial(identities.feishu_of, rt)
    gate: EventGate = build_gate(rt, client)
    server = SlackHttpServer(None, chat=FeishuEndpoint(verifier_of(settings), gate), port=0)
    server.start()
    try:
        yield Served(rt, clock, platform, standin, server.base_url + EVENTS_PATH)
    finally:
        server.shutdown()
        gate.front.close()
        rt.executor.shutdown(wait=True)
        if rt.platform_work is not None:
            rt.platform_work.shutdown()
        rt.fleet.close()


def deadline_instance(db: Database, **fields: Any) -> int:
    """Alice's instance on the scripted platform, due for release at ``D``."""
    values: dict[str, Any] = {
        "name": "box",
        "owner_id": "feishu:" + ALICE,
        "provider": "scripted",
        "provider_instance_id": "i-1",
        "deadline_at": D,
        "last_polled_at": T0,
        "last_poll_ok": True,
    }
    values.update(fields)
    return add_instance(db, **values)


def button_value(message: StoredMessage, action_id: str) -> dict[str, Any]:
    """The callback value of the button ``action_id`` on the card ``message`` was posted with
    (Feishu's client may still show it)."""
    for value in callbacks(first_card(message)["body"]["elements"]):
        if value.get("action_id") == action_id:
            return value
    raise AssertionError(f"no button {action_id} on {card_words(message.card)!r}")


def action_ids(card: dict[str, Any]) -> list[str]:
    """The action ids of a card's buttons, in order."""
    return [str(value.get("action_id")) for value in callbacks(card["body"]["elements"])]


def callbacks(elements: Sequence[Any]) -> Iterator[dict[str, Any]]:
    """The callback values of every button in ``elements``, nested ones too, in order."""
    for element in elements:
        if not isinstance(element, dict):
            continue
        if element.get("tag") == "button":
            for behavior in element.get("behaviors", []):
                if behavior.get("type") == "callback":
                    yield dict(behavior["value"])
        yield from callbacks(element.get("elements", []))
        yield from callbacks(element.get("columns", []))


def first_card(message: StoredMessage) -> dict[str, Any]:
    """The card ``message`` was posted with (before any update)."""
    loaded = json.loads(message.versions[0]) if message.versions else message.card
    assert isinstance(loaded, dict)
    return loaded


def warnings_in(messages: Sequence[StoredMessage]) -> list[StoredMessage]:
    return [m for m in messages if WARNED in card_words(first_card(m))]


# --- a deadline warning, answered ------------------------------------------------------------


def test_a_warning_reaches_its_owner_once_and_her_extend_is_taken_once(served: Served) -> None:
    iid = deadline_instance(served.rt.db)
    served.tick_through(D - timedelta(minutes=25))
    [warning] = warnings_in(served.p2p(ALICE))
    assert warning.msg_type == "interactive"
    assert action_ids(warning.card) == EXTEND_BUTTONS
    assert "Extend 1h" in card_words(warning.card)
    assert served.chat(OPS_CHAT) == []

    # A stranger's click on Alice's button is refused: nothing moves, the card stays.
    served.click(BOB, warning, "deadline_extend_1h", "ev-bob")
    assert get_instance(served.rt.db, iid).deadline_at == D
    assert served.patches_of(warning.message_id) == 0
    [refusal] = served.p2p(BOB)
    assert "Only @ou_alice (the owner of box) or an admin" in card_words(refusal.card)
    assert not action_ids(refusal.card)

    served.click(ALICE, warning, "deadline_extend_1h", "ev-alice-1")
    assert get_instance(served.rt.db, iid).deadline_at == D + timedelta(hours=1)
    assert served.patches_of(warning.message_id) == 1
    # Updated in place: its buttons gone, it says who extended it.
    assert action_ids(warning.card) == []
    assert card_words(warning.card).startswith("box: Extended 1h by @ou_alice")

    # The same button once more (Feishu kept the old card open): nothing more happens.
    served.click(ALICE, warning, "deadline_extend_1h", "ev-alice-2")
    assert get_instance(served.rt.db, iid).deadline_at == D + timedelta(hours=1)
    assert served.patches_of(warning.message_id) == 1

    answers = [card_words(m.card) for m in served.p2p(ALICE) if m is not warning]
    assert answers[0].startswith("Extended 1h: box; the deadline is now")
    assert answers[1].startswith("This was already answered by @ou_alice")

    # The old deadline passes without a word; the new one's first warning is 30 min before it.
    served.tick_through(D + timedelta(minutes=20))
    assert warnings_in(served.p2p(ALICE)) == [warning]
    assert get_instance(served.rt.db, iid).state == "active"
    assert served.platform.release_calls == []
    assert served.chat(OPS_CHAT) == []


# --- a release nobody answered -----------------------------------------------------------------


def test_a_release_nobody_answered_reaches_owner_and_ops_once_though_answers_are_lost(
    served: Served,
) -> None:
    iid = deadline_instance(served.rt.db)
    # Feishu stores both warnings but their answers never come back: posted, unconfirmed.
    served.standin.fault(Fault.LOST, times=2)
    served.tick_through(D - timedelta(seconds=1))
    assert len(warnings_in(served.p2p(ALICE))) == 2
    assert get_instance(served.rt.db, iid).state == "active"

    # At the deadline: the answers of the first two messages are lost again.
    served.standin.fault(Fault.LOST, times=2)
    served.tick_at(D)
    served.tick_through(D + timedelta(minutes=30))
    assert get_instance(served.rt.db, iid).state == "released"
    assert served.platform.release_calls == [("i-1", "terminate")]

    alice = served.p2p(ALICE)
    released = [m for m in alice if "is released (its deadline passed)" in card_words(m.card)]
    assert len(released) == 1, [card_words(m.card) for m in alice]
    assert len(warnings_in(alice)) == 2
    assert len(alice) == 3
    # The ops group hears of it because no warning was confirmed to have reached Alice (a
    # release after a confirmed warning tells its owner alone).
    ops = served.chat(OPS_CHAT)
    assert len(ops) == 1, [card_words(m.card) for m in ops]
    assert "was released at its deadline" in card_words(ops[0].card)
    assert "Slack" not in card_words(ops[0].card)  # the words name no chat platform
    # Each was sent once and its answer lost: none was tried again.
    sent = [r for r in served.standin.requests if r.method == "POST" and r.path == MESSAGES]
    assert len(sent) == 4
    with served.rt.db.session() as session:
        query = select(Prompt.kind, Prompt.delivery).order_by(col(Prompt.id))
        deliveries = session.exec(query).all()
    assert [tuple(row) for row in deliveries] == [
        (deadlines.KIND_WARNING, prompts.UNCONFIRMED),
        (deadlines.KIND_WARNING, prompts.UNCONFIRMED),
        (deadlines.KIND_UNWARNED, prompts.UNCONFIRMED),
        (releases.KIND_RELEASED, prompts.UNCONFIRMED),
    ]


# --- the monthly digest, in Chinese ---------------------------------------------------------


@pytest.fixture
def served_zh(db: Database, standin: FeishuStandIn, settings: Settings) -> Iterator[Served]:
    yield from serve(db, standin, settings.with_(language="zh", currency="CNY"))


def test_the_months_digest_goes_to_the_ops_group_once_with_its_chart(served_zh: Served) -> None:
    rt, clock = served_zh.rt, served_zh.clock
    served_zh.platform.state = "terminated"  # its one machine is gone: nothing to reconcile
    add_instance(
        rt.db,
        name="a800",
        owner_id="feishu:" + ALICE,
        gpu_model="A800",
        price_micros=10_000_000,  # ¥10/h
        currency="CNY",
        created_at=datetime(2026, 11, 29, 0, 0),
        released_at=datetime(2026, 11, 30, 12, 0),
        state="released",
    )
    clock.set(datetime(2026, 11, 30, 23, 50))
    served_zh.tick_through(datetime(2026, 12, 1, 0, 14))
    early = [card_words(m.card) for m in served_zh.chat(OPS_CHAT)]
    assert early == []  # due at 00:15 on the 1st

    served_zh.tick_through(datetime(2026, 12, 1, 1, 0))
    [digest] = served_zh.chat(OPS_CHAT)
    words = card_words(digest.card)
    report = spend.spend_report(
        rt.db,
        "2026-11",
        tz=rt.settings.tz(),
        now=clock.now,
        idle_threshold_pct=rt.settings.idle_threshold_pct,
        currency="CNY",
    )
    assert report.total_micros == 36 * 10_000_000
    assert format_money(report.total_micros, "CNY") in words
    assert "GPU 花费" in words  # "GPU spend in {month}", in the catalogue's Chinese

    [chart] = [u for u in served_zh.standin.uploads if u.kind == "image"]
    assert chart.content.startswith(b"\x89PNG")
    thread = [m for m in served_zh.standin.messages if m.parent_id == digest.message_id]
    images = [m for m in thread if m.msg_type == "image"]
    assert [json.loads(m.content)["image_key"] for m in images] == [chart.key]
    captions = [card_words(m.card) for m in thread if m.msg_type == "interactive"]
    assert len(captions) == 1
    assert "每日 GPU 花费" in captions[0]

    # A day on, nothing is posted again.
    served_zh.tick_through(datetime(2026, 12, 2, 1, 0))
    assert served_zh.chat(OPS_CHAT) == [digest]
    assert len(served_zh.standin.uploads) == 1
