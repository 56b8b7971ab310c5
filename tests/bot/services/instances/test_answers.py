"""Answering prompt buttons: what each answer changes, and the notice it returns."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import select

from bot.errors import NotAuthorized, NotFound
from bot.i18n import speaking
from bot.services.access import Caller
from bot.services.instances import answers, deadlines, releases
from bot.services.speaking import people
from bot.services.tick import tick
from bot.store.models import Instance, Prompt, Release
from tests.bot.services.support import (
    T0,
    Clock,
    NoFleet,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)
from tests.chinese import assert_chinese

D = T0 + timedelta(hours=2)
OWNER = Caller("UOWNER", channel_id="CTEAM")
OTHER = Caller("UOTHER", channel_id="CTEAM")
ADMIN = Caller("UADMIN", channel_id="CTEAM")


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


def _ticks(rt, clock, until):
    while clock.now <= until:
        tick(rt, clock.now)
        clock.advance(seconds=60)


def _prompts(rt, kind):
    with rt.db.session() as session:
        return list(session.exec(select(Prompt).where(Prompt.kind == kind)).all())


def _warned(rt, clock):
    iid = add_instance(rt.db, provider="scripted", provider_instance_id="i-1", deadline_at=D)
    _ticks(rt, clock, D - timedelta(minutes=30))
    [warning] = _prompts(rt, deadlines.KIND_WARNING)
    assert warning.id is not None
    return iid, warning.id


def test_extend_returns_the_new_deadline_and_a_second_answer_is_refused(rt, clock):
    iid, prompt_id = _warned(rt, clock)
    done = answers.extend(rt, OWNER, prompt_id, timedelta(hours=1))
    assert isinstance(done, answers.Extended)
    assert (done.extended_s, done.deadline_at, done.instance.name) == (
        3600,
        D + timedelta(hours=1),
        "box",
    )
    again = answers.extend(rt, OWNER, prompt_id, timedelta(hours=4))
    assert again == answers.AnsweredBefore("UOWNER", "extended_1h")
    assert get_instance(rt.db, iid).deadline_at == D + timedelta(hours=1)


def test_a_warning_for_a_moved_deadline_is_superseded(rt, clock):
    iid, prompt_id = _warned(rt, clock)
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        inst.deadline_at = D + timedelta(hours=3)
    notice = answers.ask_release(rt, OWNER, prompt_id)
    assert notice == deadlines.Superseded(
        releases.instance_view(get_instance(rt.db, iid)), D + timedelta(hours=3), "UTC"
    )
    assert answers.ask_release(rt, OWNER, prompt_id) == answers.AnsweredBefore(None, "superseded")


def test_release_now_asks_then_releases_through_the_one_release_route(rt, clock, platform):
    iid, prompt_id = _warned(rt, clock)
    asked = answers.ask_release(rt, OWNER, prompt_id)
    assert asked == answers.ReleaseConfirmAsk(
        releases.instance_view(get_instance(rt.db, iid)), prompt_id
    )
    assert get_instance(rt.db, iid).state == "active"
    done = answers.confirm_release(rt, OWNER, prompt_id)
    assert isinstance(done, answers.ReleaseAnswered)
    assert done.state == "confirmed"
    assert platform.release_calls == [("i-1", "terminate")]
    with rt.db.session() as session:
        assert session.exec(select(Release.reason, Release.requested_by)).all() == [
            ("user", "UOWNER")
        ]
    [warning] = _prompts(rt, deadlines.KIND_WARNING)
    assert (warning.resolution, warning.resolved_by) == ("released", "UOWNER")
    assert answers.confirm_release(rt, OWNER, prompt_id) == answers.AnsweredBefore(
        "UOWNER", "released"
    )


def test_keep_and_release_answer_idle_prompts(rt, clock):
    keep = add_instance(rt.db, name="keep", idle_since=T0, idle_release_after_s=600)
    drop = add_instance(
        rt.db, name="drop", idle_since=T0, provider="scripted", provider_instance_id="i-1"
    )
    _ticks(rt, clock, T0 + timedelta(minutes=30))
    by_instance = {p.instance_id: p.id for p in _prompts(rt, deadlines.KIND_IDLE)}
    kept = answers.keep(rt, OWNER, by_instance[keep])
    assert kept == answers.Kept(releases.instance_view(get_instance(rt.db, keep)))
    released = answers.release(rt, OWNER, by_instance[drop])
    assert isinstance(released, answers.ReleaseAnswered)
    with rt.db.session() as session:
        assert session.exec(select(Release.reason)).all() == ["idle"]
    assert answers.release(rt, OWNER, by_instance[drop]) == answers.AnsweredBefore(
        "UOWNER", "released"
    )


def test_only_the_owner_or_an_admin_answers_and_only_prompts_of_the_right_kind(rt, clock):
    _, prompt_id = _warned(rt, clock)
    with pytest.raises(NotAuthorized):
        answers.extend(rt, OTHER, prompt_id, timedelta(hours=1))
    with pytest.raises(NotFound):
        answers.keep(rt, OWNER, prompt_id)
    with pytest.raises(NotFound):
        answers.keep(rt, OWNER, 10**6)


def test_an_answered_warning_is_edited_in_its_recipients_language_not_the_clickers(rt, clock):
    _, prompt_id = _warned(rt, clock)
    people.set_language(rt, OWNER, "zh")
    with speaking("en"):  # an admin who speaks English answers the owner's warning
        done = answers.extend(rt, ADMIN, prompt_id, timedelta(hours=1))
    assert isinstance(done, answers.Extended)
    [warning] = [p for p in rt.notifier.posts if p.updates]
    assert warning.channel == "UOWNER"
    text, blocks = warning.updates[-1]
    assert_chinese(text, blocks)
    assert "box" in text
