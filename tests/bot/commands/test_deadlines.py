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
from bot.services.access import Caller
from bot.services.instances import answers, deadlines
from bot.services.tick import tick
from bot.store.models import AuditLog, Instance, Release
from tests.bot.services.support import (
    T0,
    Clock,
    NoFleet,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)
from tests.bot.ticking import tick_through

REGISTRY = build_registry()
OWNER = Caller("UOWNER", channel_id="CTEAM")
OTHER = Caller("UOTHER", channel_id="CTEAM")
ADMIN = Caller("UADMIN", channel_id="CTEAM")
D = T0 + timedelta(hours=2)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def platform():
    return ScriptedPlatform()


@pytest.fixture
def rt(sqlite_db, clock, platform):
    return make_runtime(
        sqlite_db, clock, providers=[platform], poll_interval_s=10**7, fleet=NoFleet()
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
    """Every tick from now to ``until``, ``step_s`` apart, that has anything to do."""
    tick_through(rt, clock, until, step_s=step_s)


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


@pytest.mark.parametrize(
    ("db", "clicks"),
    [
        pytest.param("sqlite", 2, id="sqlite-2"),
        pytest.param("sqlite", 4, id="sqlite-4"),
        # The store's locking is what holds the clicks apart: once on PostgreSQL too.
        pytest.param("postgresql", 4, id="postgresql-4", marks=pytest.mark.integration),
    ],
    indirect=["db"],
)
def test_a_double_click_extends_once(db, clock, platform, monkeypatch, clicks):
    rt = make_runtime(db, clock, providers=[platform], poll_interval_s=10**7, fleet=NoFleet())
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
    [warning] = _warnings(rt)
    # Only the Extend the owner may use is offered; the cap is named.
    assert warning.action_ids() == ["deadline_extend_1h", "deadline_release_now"]
    assert "The lifetime cap set by an admin ends it at" in warning.text
    value = warning.button_value("deadline_extend_1h")
    with pytest.raises(NotAuthorized):  # a click on an Extend 4h of an older message
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


# --- who asked, Extend only where it can work, manual instances past their deadline -----------


def test_an_admin_release_tells_the_owner_who_released_it(rt, clock, iid):
    assert "Release *box*" in _command(rt, ADMIN, "release box").text
    _click(rt, "instance_release_confirm", ADMIN, str(iid))
    [told] = rt.notifier.containing("is released")
    assert told.channel == "UOWNER"
    assert "released by <@UADMIN> (an admin)" in told.text
    assert "requested by its owner" not in told.text


def test_the_owner_releasing_is_still_said_so(rt, clock, iid):
    _command(rt, OWNER, "release box")
    _click(rt, "instance_release_confirm", OWNER, str(iid))
    [told] = rt.notifier.containing("is released")
    assert "(requested by its owner)" in told.text


def test_an_admin_extending_names_the_admin_on_the_owners_warning(rt, clock, iid):
    _ticks(rt, clock, D - timedelta(minutes=30))
    [warning] = _warnings(rt)
    _click(rt, "deadline_extend_1h", ADMIN, warning.button_value("deadline_extend_1h"))
    assert "Extended 1h by <@UADMIN> (an admin)" in warning.current_text


def test_an_admin_extend_command_names_the_admin_on_the_superseded_warning(rt, clock, iid):
    _ticks(rt, clock, D - timedelta(minutes=30))
    [warning] = _warnings(rt)
    _command(rt, ADMIN, "extend box 2h")
    _ticks(rt, clock, clock.now)
    assert "superseded" in warning.current_text
    assert "extended by <@UADMIN> (an admin)" in warning.current_text


def test_a_warning_at_the_cap_offers_no_extend_to_the_owner(rt, clock, iid):
    _command(rt, ADMIN, "cap box 2h")  # the cap is the deadline
    _ticks(rt, clock, D - timedelta(minutes=30))
    [warning] = _warnings(rt)
    assert warning.action_ids() == ["deadline_release_now"]
    assert "The lifetime cap set by an admin ends it at Wed 02 Dec 14:00 UTC" in warning.text
    assert "only an admin can extend it past that" in warning.text


def test_an_admin_owner_gets_every_extend_under_a_cap(rt, clock):
    add_instance(
        rt.db,
        owner_id="UADMIN",
        provider="scripted",
        provider_instance_id="i-1",
        deadline_at=D,
        lifetime_cap_at=D,
        last_polled_at=T0,
    )
    _ticks(rt, clock, D - timedelta(minutes=30))
    [warning] = _warnings(rt)
    assert warning.action_ids() == [
        "deadline_extend_1h",
        "deadline_extend_4h",
        "deadline_release_now",
    ]


def _manual_past_deadline(rt, clock):
    iid = add_instance(rt.db, provider="manual", deadline_at=D, last_polled_at=T0)
    _ticks(rt, clock, D)
    assert get_instance(rt.db, iid).state == "awaiting_confirmation"
    return iid


def test_a_stale_extend_on_a_manual_release_says_it_awaits_confirmation(rt, clock):
    _manual_past_deadline(rt, clock)
    warning = _warnings(rt)[0]
    reply = _click(rt, "deadline_extend_1h", OWNER, warning.button_value("deadline_extend_1h"))
    assert "release requested; waiting for you to confirm it is released on the platform" in (
        reply.text
    )
    assert "`/gpu extend box 2h`" in reply.text
    assert "already answered" not in reply.text


def test_extend_takes_back_a_manual_release_awaiting_confirmation(rt, clock):
    iid = _manual_past_deadline(rt, clock)
    [ask] = rt.notifier.containing("Please release *box* on its platform")
    clock.advance(minutes=5)
    reply = _command(rt, OWNER, "extend box 2h")
    assert "box" in reply.text
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.deadline_at) == ("active", clock.now + timedelta(hours=2))
    with rt.db.session() as session:
        assert session.exec(select(Release.state)).all() == ["cancelled"]
    assert "Release request withdrawn: extended 2h by <@UOWNER>" in ask.current_text
    assert ask.action_ids() == []
    # No reminder comes any more, and the next deadline is watched as usual.
    before = len(rt.notifier.posts)
    _ticks(rt, clock, clock.now + timedelta(hours=1), step_s=300)
    assert rt.notifier.posts[before:] == []
    _ticks(rt, clock, inst.deadline_at, step_s=60)
    assert get_instance(rt.db, iid).state == "awaiting_confirmation"


def test_a_stale_extend_after_the_release_was_taken_back_gives_the_deadline_now(rt, clock):
    iid = _manual_past_deadline(rt, clock)
    warning = _warnings(rt)[0]
    _command(rt, OWNER, "extend box 2h")
    deadline = get_instance(rt.db, iid).deadline_at
    reply = _click(rt, "deadline_extend_1h", OWNER, warning.button_value("deadline_extend_1h"))
    # The instance runs: never "already answered: released".
    assert "released" not in reply.text
    assert "this warning is superseded; the deadline is now" in reply.text
    assert get_instance(rt.db, iid).deadline_at == deadline


def test_only_the_owner_or_an_admin_takes_back_a_manual_release(rt, clock):
    iid = _manual_past_deadline(rt, clock)
    with pytest.raises(NotAuthorized):
        _command(rt, OTHER, "extend box 2h")
    _command(rt, ADMIN, "extend box 1h")
    assert get_instance(rt.db, iid).state == "active"


def test_reminder_buttons_and_extend_work_after_a_restart(rt, clock, sqlite_db, platform):
    iid = _manual_past_deadline(rt, clock)
    _ticks(rt, clock, clock.now + timedelta(minutes=31), step_s=300)
    [reminder] = rt.notifier.containing("Reminder: *box*")
    assert "`/gpu extend box 2h`" in reminder.text
    restarted = make_runtime(
        sqlite_db, clock, providers=[platform], poll_interval_s=10**7, fleet=NoFleet()
    )
    value = reminder.button_value("instance_release_done")
    reply = _click(restarted, "instance_release_done", OWNER, value)
    assert "released" in reply.text
    assert get_instance(restarted.db, iid).state == "released"


def test_extend_after_a_restart_takes_back_the_manual_release(rt, clock, sqlite_db, platform):
    iid = _manual_past_deadline(rt, clock)
    restarted = make_runtime(
        sqlite_db, clock, providers=[platform], poll_interval_s=10**7, fleet=NoFleet()
    )
    _command(restarted, OWNER, "extend box 2h")
    assert get_instance(restarted.db, iid).state == "active"


def test_the_stop_policy_needs_its_release_after(rt, clock, iid):
    with pytest.raises(UsageError, match="--release-after"):
        _command(rt, OWNER, "policy box --at-deadline stop")
    with pytest.raises(UsageError, match="goes with --at-deadline stop"):
        _command(rt, OWNER, "policy box --release-after 24h")
    reply = _command(rt, OWNER, "policy box --at-deadline stop --release-after 24h")
    assert "at the deadline: stop (disk kept and billed), released 1d after the deadline" in (
        reply.text
    )
    assert get_instance(rt.db, iid).deadline_policy == "stop"
