"""The buttons on deadline warnings and idle prompts (and `/gpu cap` against them), through the
registry and the command parser, over the tick that posts the prompts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.errors import NotAuthorized, UsageError
from bot.services import answers, deadlines
from bot.services.access import Caller
from bot.services.tick import tick
from bot.store.models import AuditLog, Instance, Release
from tests.bot.services.support import (
    T0,
    Clock,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)

REGISTRY = build_registry()
OWNER = Caller("UOWNER", channel_id="CTEAM")
OTHER = Caller("UOTHER", channel_id="CTEAM")
ADMIN = Caller("UADMIN", channel_id="CTEAM")
D = T0 + timedelta(hours=2)


class _NoFleet:
    def forget(self, name: str) -> None:
        return None


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def platform():
    return ScriptedPlatform()


@pytest.fixture
def rt(sqlite_db, clock, platform):
    return make_runtime(
        sqlite_db, clock, providers=[platform], poll_interval_s=10**7, fleet=_NoFleet()
    )


@pytest.fixture
def iid(rt):
    return add_instance(
        rt.db,
        provider="scripted",
        provider_instance_id="i-1",
        deadline_at=D,
        last_polled_at=T0,
    )


def _click(rt, action_id, caller, value):
    return REGISTRY.actions[action_id].handler(rt, caller, value)


def _command(rt, caller, text):
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, caller, args)


def _ticks(rt, clock, until, step_s=60):
    while clock.now <= until:
        tick(rt, clock.now)
        clock.advance(seconds=step_s)


def _warnings(rt):
    return rt.notifier.containing("will be released")


def test_extend_1h_updates_every_warning_and_moves_the_deadline(rt, clock, iid):
    _ticks(rt, clock, D - timedelta(minutes=10))
    first, second = _warnings(rt)
    value = second.button_value("deadline_extend_1h")

    reply = _click(rt, "deadline_extend_1h", OWNER, value)
    assert "Extended 1h" in reply.text
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=1)
    for posted in (first, second):
        assert "Extended 1h by <@UOWNER>" in posted.current_text
        assert posted.action_ids() == []

    again = _click(rt, "deadline_extend_4h", OWNER, value)
    assert "already answered by <@UOWNER>" in again.text
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=1)

    _ticks(rt, clock, D + timedelta(hours=1))
    assert len(_warnings(rt)) == 4
    assert get_instance(rt.db, iid).state == "released"


@pytest.mark.parametrize("clicks", [2, 4])
def test_a_double_click_extends_once(db, clock, platform, monkeypatch, clicks):
    rt = make_runtime(db, clock, providers=[platform], poll_interval_s=10**7, fleet=_NoFleet())
    iid = add_instance(
        rt.db, provider="scripted", provider_instance_id="i-1", deadline_at=D, last_polled_at=T0
    )
    _ticks(rt, clock, D - timedelta(minutes=30))
    value = _warnings(rt)[0].button_value("deadline_extend_1h")
    # Every click has seen the warning open before any of them extends.
    barrier = threading.Barrier(clicks)
    opened = answers._open_prompt

    def open_then_wait(*args, **kwargs):
        found = opened(*args, **kwargs)
        barrier.wait(timeout=10)
        return found

    monkeypatch.setattr(answers, "_open_prompt", open_then_wait)
    with ThreadPoolExecutor(clicks) as pool:
        replies = list(
            pool.map(lambda _: _click(rt, "deadline_extend_1h", OWNER, value), range(clicks))
        )
    texts = sorted(reply.text for reply in replies)
    assert sum("Extended 1h" in text for text in texts) == 1, texts
    assert sum("already answered by <@UOWNER>" in text for text in texts) == clicks - 1, texts
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=1)
    with rt.db.session() as session:
        extends = session.exec(select(AuditLog).where(AuditLog.action == "extend")).all()
    assert len(extends) == 1


def test_an_extension_committed_while_the_tick_decided_wins(rt, clock, iid, monkeypatch):
    _ticks(rt, clock, D - timedelta(minutes=1))
    request = deadlines._request

    def extend_then_request(*args, **kwargs):
        # The owner's extension commits after the tick decided and before it asks to release.
        with rt.db.session() as session:
            session.exec(
                update(Instance)
                .where(col(Instance.id) == iid)
                .values(deadline_at=D + timedelta(hours=1))
            )
        return request(*args, **kwargs)

    monkeypatch.setattr(deadlines, "_request", extend_then_request)
    tick(rt, D)
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.deadline_at) == ("active", D + timedelta(hours=1))
    with rt.db.session() as session:
        assert session.exec(select(Release)).all() == []


def test_only_the_owner_or_an_admin_may_answer(rt, clock, iid):
    _ticks(rt, clock, D - timedelta(minutes=30))
    value = _warnings(rt)[0].button_value("deadline_extend_1h")
    with pytest.raises(NotAuthorized):
        _click(rt, "deadline_extend_1h", OTHER, value)
    assert get_instance(rt.db, iid).deadline_at == D
    _click(rt, "deadline_extend_4h", ADMIN, value)
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=4)


def test_a_warning_for_an_old_deadline_says_it_is_superseded(rt, clock, iid):
    _ticks(rt, clock, D - timedelta(minutes=30))
    warning = _warnings(rt)[0]
    _command(rt, OWNER, "extend box 2h")
    reply = _click(rt, "deadline_extend_1h", OWNER, warning.button_value("deadline_extend_1h"))
    assert "superseded" in reply.text
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=2)
    assert "superseded" in warning.current_text


def test_release_now_asks_to_confirm_then_releases(rt, clock, iid, platform):
    _ticks(rt, clock, D - timedelta(minutes=30))
    warning = _warnings(rt)[0]
    ask = _click(rt, "deadline_release_now", OWNER, warning.button_value("deadline_release_now"))
    assert get_instance(rt.db, iid).state == "active"
    [confirm] = [e for b in ask.blocks if b["type"] == "actions" for e in b["elements"]]
    assert confirm["action_id"] == "deadline_release_confirm"

    done = _click(rt, "deadline_release_confirm", OWNER, confirm["value"])
    assert "released" in done.text
    assert get_instance(rt.db, iid).state == "released"
    assert platform.release_calls == [("i-1", "terminate")]
    assert "Release requested by <@UOWNER>" in warning.current_text
    with rt.db.session() as session:
        assert session.exec(select(Release.reason, Release.requested_by)).all() == [
            ("user", "UOWNER")
        ]


def test_owners_extend_within_the_cap_only_admins_past_it(rt, clock, iid):
    with pytest.raises(NotAuthorized) as refused:
        _command(rt, OWNER, "cap box 3h")
    assert refused.value.hint == "Ask an admin: <@UADMIN>."
    reply = _command(rt, ADMIN, "cap box 3h")
    assert "maximum lifetime" in reply.text
    cap = get_instance(rt.db, iid).lifetime_cap_at
    assert cap == T0 + timedelta(hours=3)

    _ticks(rt, clock, D - timedelta(minutes=30))
    value = _warnings(rt)[0].button_value("deadline_extend_4h")
    with pytest.raises(NotAuthorized):
        _click(rt, "deadline_extend_4h", OWNER, value)
    _click(rt, "deadline_extend_1h", OWNER, value)
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=1)

    _command(rt, ADMIN, "cap box none")
    assert get_instance(rt.db, iid).lifetime_cap_at is None


def test_idle_keep_and_idle_release(rt, clock, platform):
    keep = add_instance(
        rt.db, name="keep", idle_since=T0, idle_release_after_s=600, last_polled_at=T0
    )
    drop = add_instance(
        rt.db,
        name="drop",
        idle_since=T0,
        provider="scripted",
        provider_instance_id="i-1",
        last_polled_at=T0,
    )
    _ticks(rt, clock, T0 + timedelta(minutes=30))
    prompts = {p.text.split("*")[1]: p for p in rt.notifier.containing("has been idle")}
    assert set(prompts) == {"keep", "drop"}

    _click(rt, "idle_keep", OWNER, prompts["keep"].button_value("idle_keep"))
    assert "Kept by <@UOWNER>" in prompts["keep"].current_text
    reply = _click(rt, "idle_release", OWNER, prompts["drop"].button_value("idle_release"))
    assert "released" in reply.text

    _ticks(rt, clock, T0 + timedelta(hours=2), step_s=300)
    assert get_instance(rt.db, keep).state == "active"
    assert get_instance(rt.db, drop).state == "released"
    with rt.db.session() as session:
        assert session.exec(select(Release.reason)).all() == ["idle"]


def test_a_broken_button_value_is_refused(rt):
    with pytest.raises(UsageError, match="broken"):
        _click(rt, "deadline_extend_1h", OWNER, "7; drop")
