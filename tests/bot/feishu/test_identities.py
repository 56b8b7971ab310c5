"""One person on Slack and Feishu: an admin links the two identities, after which they own,
extend and release as one, from either platform; nobody else links, a link never lets a third
person act, and unlinking leaves the Feishu identity holding nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import col, select

from bot.commands import build_registry
from bot.errors import Conflict, NotAuthorized, UsageError
from bot.feishu.events import MessageReceived
from bot.feishu.front import FeishuFront
from bot.listeners import execute_command
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import lifecycle
from bot.services.speaking import identities
from bot.store.db import Database
from bot.store.models import AuditLog, IdentityLink, Instance, InstanceAccess, Person
from tests.bot.feishu.doubles import WAIT_S, RecordingSender, action_of, card_of
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime

ADMIN = Caller("UADMIN")
ALICE_SLACK = Caller("UALICE")
ALICE_FEISHU = Caller("feishu:ou_alice")
BOB_FEISHU = Caller("feishu:ou_bob")
REGISTRY = build_registry()


@pytest.fixture
def rt(db: Database) -> Runtime:
    return make_runtime(db, Clock(), feishu_admins=frozenset({"ou_boss"}))


def link_alice(rt: Runtime) -> identities.LinkChange:
    return identities.link(rt, ADMIN, "<@UALICE>", "feishu:ou_alice")


def audits(rt: Runtime, action: str) -> list[dict[str, Any]]:
    with rt.db.session() as session:
        rows = session.exec(
            select(AuditLog).where(AuditLog.action == action).order_by(col(AuditLog.id))
        ).all()
        return [{"actor": r.actor, **json.loads(r.details_json)} for r in rows]


# --- who links ----------------------------------------------------------------------------------


def test_an_admin_links_and_it_is_audited(rt: Runtime) -> None:
    change = link_alice(rt)
    assert (change.slack_id, change.feishu_id, change.changed) == (
        "UALICE",
        "feishu:ou_alice",
        True,
    )
    assert identities.slack_of(rt, "feishu:ou_alice") == "UALICE"
    assert identities.feishu_of(rt, "UALICE") == "feishu:ou_alice"
    assert audits(rt, "identity.link") == [
        {"actor": "UADMIN", "slack": "UALICE", "feishu": "feishu:ou_alice", "moved": 0}
    ]
    again = identities.link(rt, ADMIN, "UALICE", "ou_alice")  # the same link, typed otherwise
    assert again.changed is False
    assert len(audits(rt, "identity.link")) == 1


@pytest.mark.parametrize("caller", [ALICE_SLACK, ALICE_FEISHU, BOB_FEISHU])
def test_nobody_but_an_admin_links_or_unlinks(rt: Runtime, caller: Caller) -> None:
    with pytest.raises(NotAuthorized):
        identities.link(rt, caller, "<@UALICE>", "feishu:ou_alice")
    link_alice(rt)
    with pytest.raises(NotAuthorized):
        identities.unlink(rt, caller, "feishu:ou_alice")
    with pytest.raises(NotAuthorized):
        identities.links(rt, caller)
    assert identities.slack_of(rt, "feishu:ou_alice") == "UALICE"


def test_a_feishu_admin_links_too(rt: Runtime) -> None:
    identities.link(rt, Caller("feishu:ou_boss"), "UALICE", "ou_alice")
    assert audits(rt, "identity.link")[0]["actor"] == "feishu:ou_boss"


@pytest.mark.parametrize(
    ("slack", "feishu"),
    [("UALICE", "ou_bob"), ("UCAROL", "feishu:ou_alice")],
)
def test_either_side_of_a_link_cannot_be_linked_again_elsewhere(
    rt: Runtime, slack: str, feishu: str
) -> None:
    link_alice(rt)
    with pytest.raises(Conflict):
        identities.link(rt, ADMIN, slack, feishu)
    with rt.db.session() as session:
        assert len(session.exec(select(IdentityLink)).all()) == 1


@pytest.mark.parametrize(
    ("slack", "feishu"),
    [
        ("UALICE", "feishu:U123"),
        ("UALICE", "oc_chat"),
        ("feishu:ou_bob", "ou_alice"),
        ("x", "ou_a"),
    ],
)
def test_what_is_not_a_person_is_refused(rt: Runtime, slack: str, feishu: str) -> None:
    with pytest.raises(UsageError):
        identities.link(rt, ADMIN, slack, feishu)


def test_the_command_links_lists_and_unlinks(rt: Runtime) -> None:
    linked = execute_command(rt, REGISTRY, ADMIN, "link <@UALICE> feishu:ou_alice")
    assert "feishu:ou_alice" in linked.text
    assert "<@UALICE>" in linked.text
    listed = execute_command(rt, REGISTRY, ADMIN, "link")
    assert "<@UALICE> = `feishu:ou_alice`" in listed.text
    refused = execute_command(rt, REGISTRY, BOB_FEISHU, "link <@UBOB> feishu:ou_bob")
    assert "Only an admin" in refused.text
    unlinked = execute_command(rt, REGISTRY, ADMIN, "unlink <@UALICE>")
    assert "no longer" in unlinked.text
    assert identities.slack_of(rt, "feishu:ou_alice") is None
    assert audits(rt, "identity.unlink") == [
        {"actor": "UADMIN", "slack": "UALICE", "feishu": "feishu:ou_alice"}
    ]


# --- one owner ----------------------------------------------------------------------------------


def test_a_linked_feishu_identity_is_its_slack_person(rt: Runtime) -> None:
    assert identities.resolve(rt, ALICE_FEISHU) == ALICE_FEISHU
    link_alice(rt)
    resolved = identities.resolve(rt, Caller("feishu:ou_alice", channel_id="oc_chat"))
    assert resolved == Caller("UALICE", channel_id="oc_chat", linked_id="feishu:ou_alice")
    assert identities.resolve(rt, BOB_FEISHU) == BOB_FEISHU
    assert identities.resolve(rt, ALICE_SLACK) == ALICE_SLACK


def test_an_instance_registered_from_slack_is_extended_and_released_from_feishu(
    rt: Runtime,
) -> None:
    box = add_instance(rt.db, owner_id="UALICE", deadline_at=T0 + timedelta(hours=2))
    with pytest.raises(NotAuthorized):
        lifecycle.extend(rt, identities.resolve(rt, ALICE_FEISHU), "box", timedelta(hours=1))
    link_alice(rt)
    alice = identities.resolve(rt, ALICE_FEISHU)
    lifecycle.extend(rt, alice, "box", timedelta(hours=1))
    assert get_instance(rt.db, box).deadline_at == T0 + timedelta(hours=3)
    access.require_owner_or_admin(rt, alice, get_instance(rt.db, box), action="release")


def test_what_the_feishu_identity_held_becomes_the_slack_persons(rt: Runtime) -> None:
    live = add_instance(rt.db, name="fbox", owner_id="feishu:ou_alice")
    gone = add_instance(rt.db, name="old", owner_id="feishu:ou_alice", state="released")
    others = add_instance(rt.db, name="carols", owner_id="UCAROL")
    both = add_instance(rt.db, name="shared", owner_id="UCAROL")
    with rt.db.session() as session:
        session.add(Person(slack_id="UALICE"))
        session.flush()
        session.add(
            InstanceAccess(instance_id=others, person_id="feishu:ou_alice", granted_by="UCAROL")
        )
        session.add(
            InstanceAccess(instance_id=both, person_id="feishu:ou_alice", granted_by="UCAROL")
        )
        session.add(InstanceAccess(instance_id=both, person_id="UALICE", granted_by="UCAROL"))
    assert link_alice(rt).moved == 2
    assert get_instance(rt.db, live).owner_id == "UALICE"
    assert get_instance(rt.db, gone).owner_id == "UALICE"  # this month's spend counts once
    with rt.db.session() as session:
        grants = session.exec(select(InstanceAccess.instance_id, InstanceAccess.person_id)).all()
    assert sorted(grants) == sorted([(others, "UALICE"), (both, "UALICE")])
    # Slack's Alice now changes what she registered from Feishu.
    lifecycle.extend(rt, ALICE_SLACK, "fbox", timedelta(hours=1))
    assert access.can_operate(rt, ALICE_SLACK, get_instance(rt.db, others))


def test_a_link_never_lets_a_third_person_act(rt: Runtime) -> None:
    add_instance(rt.db, owner_id="UALICE")
    link_alice(rt)
    bob = identities.resolve(rt, BOB_FEISHU)
    assert bob == BOB_FEISHU
    with pytest.raises(NotAuthorized):
        lifecycle.extend(rt, bob, "box", timedelta(hours=1))
    assert not access.is_admin(rt, identities.resolve(rt, ALICE_FEISHU))


def test_an_admin_on_either_platform_is_an_admin_as_one_person(rt: Runtime) -> None:
    identities.link(rt, ADMIN, "UBOSS", "feishu:ou_boss")  # a Feishu admin, not a Slack one
    assert access.is_admin(rt, identities.resolve(rt, Caller("feishu:ou_boss")))
    assert not access.is_admin(rt, Caller("UBOSS"))  # Slack's admins are GPUBOT_ADMINS


def test_unlinking_leaves_the_feishu_identity_holding_nothing(rt: Runtime) -> None:
    box = add_instance(rt.db, name="fbox", owner_id="feishu:ou_alice")
    link_alice(rt)
    identities.unlink(rt, ADMIN, "feishu:ou_alice")
    alice_feishu = identities.resolve(rt, ALICE_FEISHU)
    assert alice_feishu == ALICE_FEISHU
    with pytest.raises(NotAuthorized):
        lifecycle.extend(rt, alice_feishu, "fbox", timedelta(hours=1))
    assert get_instance(rt.db, box).owner_id == "UALICE"
    with pytest.raises(UsageError):
        identities.unlink(rt, ADMIN, "feishu:ou_alice")


# --- through Feishu's front ---------------------------------------------------------------------


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def front(rt: Runtime, sender: RecordingSender) -> Iterator[FeishuFront]:
    made = FeishuFront(rt, REGISTRY, sender, card_of=card_of, action_of=action_of)
    yield made
    made.close()


def say(front: FeishuFront, text: str, open_id: str, event_id: str) -> None:
    event = MessageReceived(
        event_id=event_id,
        open_id=open_id,
        chat_id="oc_p2p",
        chat_type="p2p",
        message_id=f"om_{event_id}",
        text=text,
    )
    running = front.on_message(event)
    assert running is not None
    running.result(timeout=WAIT_S)


def test_a_linked_person_extends_their_slack_instance_from_feishu(
    rt: Runtime, front: FeishuFront, sender: RecordingSender
) -> None:
    box = add_instance(rt.db, owner_id="UALICE", deadline_at=T0 + timedelta(hours=2))
    say(front, "/gpu extend box 1h", "ou_alice", "ev-1")
    assert "Only <@UALICE>" in sender.wait_for(1)[0].card["text"]
    assert get_instance(rt.db, box).deadline_at == T0 + timedelta(hours=2)
    link_alice(rt)
    say(front, "/gpu extend box 1h", "ou_alice", "ev-2")
    sender.wait_for(2)
    assert get_instance(rt.db, box).deadline_at == T0 + timedelta(hours=3)
    say(front, "/gpu extend box 1h", "ou_bob", "ev-3")
    assert "Only <@UALICE>" in sender.wait_for(3)[2].card["text"]
    assert get_instance(rt.db, box).deadline_at == T0 + timedelta(hours=3)
    with rt.db.session() as session:
        owners = session.exec(select(Instance.owner_id)).all()
    assert owners == ["UALICE"]
