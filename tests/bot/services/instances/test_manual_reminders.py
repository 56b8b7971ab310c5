"""A forgotten manual release: its reminders widen and stop, the channel is told once, and the
owner can still confirm it afterwards; times given in the past are refused with the time now."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlmodel import col, select

from bot.blocks import render
from bot.errors import NotAuthorized, UsageError
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services import prompt_kinds
from bot.services.access import Caller
from bot.services.instances import lifecycle, policies, registration, releases
from bot.services.tick import tick
from bot.store.models import AuditLog, Instance, Prompt, Release
from bot.values import format_when, parse_when
from tests.bot.services.support import (
    T0,
    Clock,
    add_instance,
    get_instance,
    local_request,
    make_runtime,
    rows,
)
from tests.chinese import assert_chinese

OWNER = Caller("UOWNER")
ADMIN = Caller("UADMIN")
TICK = timedelta(minutes=5)


class Forgetful:
    """The fleet's one call a release makes: forget the instance's connection."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, name: str) -> None:
        self.forgotten.append(name)


@pytest.fixture
def rt(db, clock) -> Runtime:
    return make_runtime(db, clock)


def _forget(rt: Runtime, clock: Clock, *, days: int) -> tuple[int, int]:
    """A manual instance whose deadline release nobody confirms, the clock ticking every
    ``TICK`` for ``days``; returns (instance id, release id).

    A tick at which no open release is due takes none (``process_due_releases`` reads only
    ``Release.next_attempt_at``), so the clock jumps from tick to the next tick at which one
    is: the same calls at the same times as every tick, without the idle ones."""
    iid = add_instance(rt.db, name="hand")
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    assert rel.id is not None
    start = clock.now
    end = start + timedelta(days=days)
    while clock.now < end:
        releases.process_due_releases(rt, clock.now)
        clock.set(_next_tick(rt, start, after=clock.now, until=end))
    return iid, rel.id


def _next_tick(rt: Runtime, start: datetime, *, after: datetime, until: datetime) -> datetime:
    """The first tick (``start`` plus a whole number of ``TICK``) later than ``after`` at which
    an open release is due; the first tick at or after ``until`` when none is due before."""
    with rt.db.session() as session:
        due = list(
            session.exec(
                select(Release.next_attempt_at).where(col(Release.state).in_(releases.OPEN_STATES))
            )
        )
    if any(at is None for at in due):
        return after + TICK
    wanted = min([at for at in due if at is not None] + [until])
    ticks = max(-(-(wanted - start) // TICK), (after - start) // TICK + 1)
    return start + ticks * TICK


def _reminders_at(rt: Runtime) -> list[datetime]:
    with rt.db.session() as session:
        rows = session.exec(
            select(Prompt).where(Prompt.kind == releases.KIND_MANUAL_REMINDER)
        ).all()
    return sorted(p.due_at for p in rows)


def test_a_release_forgotten_for_30_days_is_reminded_13_times_widening_then_never(rt, clock):
    iid, release_id = _forget(rt, clock, days=30)

    owner_posts = rt.notifier.to("UOWNER")
    reminders = [p for p in owner_posts if "Reminder" in p.text]
    assert len(reminders) == len(releases.MANUAL_REMINDERS_AFTER_S) == 13
    assert len(owner_posts) == 1 + 13  # the ask and the reminders, nothing else
    offsets_s = [int((at - T0).total_seconds()) for at in _reminders_at(rt)]
    hour = 3600
    assert offsets_s == [
        *(hour // 2, hour, 2 * hour, 4 * hour, 8 * hour, 16 * hour),
        *(day * 24 * hour for day in range(1, 8)),
    ]
    gaps_s = [b - a for a, b in zip([0, *offsets_s], offsets_s, strict=False)]
    assert gaps_s == sorted(gaps_s)  # never closer together than before
    # Only the last says it is the last, and every one keeps the confirmation buttons.
    assert [("last reminder" in p.text) for p in reminders] == [False] * 12 + [True]
    assert all(p.button_value("instance_release_done") == str(iid) for p in reminders)

    ops = rt.notifier.to("COPS")
    assert len(ops) == 2  # escalated at the second reminder; told once that reminding stopped
    assert "nobody confirmed" in ops[0].text
    assert "stopped reminding <@UOWNER>" in ops[1].text
    assert "13 reminders in 7d" in ops[1].text
    assert "may still cost" in ops[1].text

    release = releases.load_release(rt, release_id)
    assert release.state == releases.QUIET
    assert release.next_attempt_at is None
    assert get_instance(rt.db, iid).state == "awaiting_confirmation"
    with rt.db.session() as session:
        stopped = session.exec(
            select(AuditLog).where(AuditLog.action == "release_reminders_stopped")
        ).all()
    assert len(stopped) == 1


def test_the_whole_tick_leaves_a_quiet_release_alone(rt, clock):
    _forget(rt, clock, days=8)
    posts = len(rt.notifier.posts)
    for _ in range(12):
        clock.advance(hours=2)
        tick(rt, clock.now)  # the first tick of a slot runs every step
        assert releases.process_due_releases(rt, clock.now) == []
        report = tick(rt, clock.now + timedelta(seconds=30))
        assert "releases" in report.skipped  # the clock does not see it as due
    assert len(rt.notifier.posts) == posts


def test_the_owner_still_confirms_a_quiet_release(rt, clock):
    iid, release_id = _forget(rt, clock, days=9)
    clock.advance(hours=1)
    done = releases.confirm_manual_release(rt, OWNER, iid)
    assert done.id == release_id
    assert done.state == "confirmed"
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == clock.now
    with rt.db.session() as session:
        unanswered = session.exec(
            select(Prompt).where(
                Prompt.kind == releases.KIND_MANUAL_REMINDER,
                Prompt.resolved_at == None,  # noqa: E711
            )
        ).all()
    assert unanswered == []


def test_asking_again_for_a_quiet_release_reminds_once_without_telling_the_channel(rt, clock):
    iid, release_id = _forget(rt, clock, days=9)
    ops = len(rt.notifier.to("COPS"))
    reminders = len(rt.notifier.containing("Reminder"))

    rt.fleet = Forgetful()
    again = releases.release_now(rt, OWNER, iid)

    assert again.id == release_id
    assert again.state == releases.QUIET
    assert rt.fleet.forgotten == ["hand"]
    latest = rt.notifier.containing("Reminder")
    assert len(latest) == reminders + 1
    assert latest[-1].button_value("instance_release_done") == str(iid)
    assert len(rt.notifier.to("COPS")) == ops
    assert releases.confirm_manual_release(rt, OWNER, iid).state == "confirmed"


def test_extending_withdraws_a_quiet_release(rt, clock):
    iid, release_id = _forget(rt, clock, days=9)
    lifecycle.extend(rt, OWNER, "hand", timedelta(hours=2))
    assert releases.load_release(rt, release_id).state == releases.CANCELLED
    assert get_instance(rt.db, iid).state == "active"


def test_the_last_reminder_and_the_stop_read_in_chinese(rt, clock):
    iid, _ = _forget(rt, clock, days=8)
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        kinds = prompt_kinds.PROMPT_NOTICES
        rows = session.exec(select(Prompt).order_by(Prompt.id)).all()
        last = [p for p in rows if p.kind == releases.KIND_MANUAL_REMINDER][-1]
        quiet = [p for p in rows if p.key.endswith(":quiet")]
        assert len(quiet) == 1
        notices = [kinds[p.kind](rt, session, p, inst) for p in (last, quiet[0])]
    with speaking("zh"):
        rendered = [render(n) for n in notices if n is not None]
    assert len(rendered) == 2
    assert "最后一次提醒" in rendered[0][0]
    assert "停止提醒" in rendered[1][0]
    for text, body in rendered:
        assert_chinese(text, body)


# --- times in the past ---------------------------------------------------------------------------


@pytest.fixture
def rt_sh(db, clock) -> Runtime:
    return make_runtime(db, clock, timezone="Asia/Shanghai")


def test_a_lifetime_cap_already_over_is_refused_naming_the_time_now(rt_sh, clock):
    iid = add_instance(rt_sh.db, name="gpu1", created_at=T0)
    clock.advance(hours=5)
    with pytest.raises(UsageError) as refused:
        policies.set_lifetime_cap(rt_sh, ADMIN, "gpu1", timedelta(hours=4))
    now_words = format_when(clock.now, rt_sh.settings.tz())
    assert now_words in refused.value.user_text()
    assert "CST" in now_words
    assert "5h" in refused.value.user_text()  # how long it has run already
    assert get_instance(rt_sh.db, iid).lifetime_cap_at is None
    with pytest.raises(UsageError):
        policies.set_lifetime_cap(rt_sh, ADMIN, "gpu1", timedelta(0))

    view = policies.set_lifetime_cap(rt_sh, ADMIN, "gpu1", timedelta(hours=6))
    assert view is not None
    assert get_instance(rt_sh.db, iid).lifetime_cap_at == T0 + timedelta(hours=6)


def test_extending_past_a_cap_that_already_ended_says_so(rt_sh, clock):
    iid = add_instance(rt_sh.db, name="gpu1", created_at=T0, deadline_at=T0 + timedelta(hours=9))
    with rt_sh.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        inst.lifetime_cap_at = T0 + timedelta(hours=1)  # set before caps in the past were refused
        session.add(inst)
    clock.advance(hours=3)
    with pytest.raises(NotAuthorized) as refused:
        lifecycle.extend(rt_sh, OWNER, "gpu1", timedelta(hours=1))
    text = refused.value.user_text()
    assert "ended at" in text
    assert format_when(clock.now, rt_sh.settings.tz()) in text
    assert "would go past" not in text


def test_a_time_typed_in_the_past_is_refused_with_the_time_now(rt_sh, clock):
    tz = rt_sh.settings.tz()
    with pytest.raises(UsageError) as refused:
        parse_when("2020-01-01T10:00", now_utc=clock.now, tz=tz)
    assert format_when(clock.now, tz) in refused.value.user_text()
    with speaking("zh"):
        with pytest.raises(UsageError) as in_chinese:
            parse_when("2020-01-01T10:00", now_utc=clock.now, tz=tz)
        assert_chinese(in_chinese.value.user_text())


def test_a_release_at_in_the_past_is_refused_at_registration_with_the_time_now(local_rt):
    now = local_rt.now()
    with pytest.raises(UsageError) as refused:
        registration.register(
            local_rt, OWNER, local_request(release_in=None, release_at=now - timedelta(minutes=1))
        )
    text = refused.value.user_text()
    assert "--release-at" in text
    assert f"it is now {format_when(now, local_rt.settings.tz())}" in text
    assert rows(local_rt.db, Instance) == []
    assert rows(local_rt.db, Release) == []
