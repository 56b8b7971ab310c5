"""Deadline, policy, idle and release-when-done rules, driven through tick() with a hand clock."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from bot.errors import SlackError
from bot.notify import MessageRef
from bot.services.instances import deadlines, releases
from bot.services.tick import RECONCILE_EVERY_S, TICK_STEPS, tick
from bot.store.models import AuditLog, Instance, Job, Prompt, Release
from tests.bot.services.support import (
    T0,
    add_instance,
    get_instance,
    make_runtime,
)
from tests.bot.ticking import tick_through

D = T0 + timedelta(hours=2)
NEVER_POLL = 10**7


@pytest.fixture
def rt(db, clock, platform):
    return make_runtime(db, clock, providers=[platform], poll_interval_s=NEVER_POLL)


def _instance(rt, **fields) -> int:
    values = {
        "provider": "scripted",
        "provider_instance_id": "i-1",
        "deadline_at": D,
        "last_polled_at": T0,
        "last_poll_ok": True,
    }
    values.update(fields)
    return add_instance(rt.db, **values)


def _run(rt, clock, *, until, step_s=60):
    """Tick every ``step_s`` seconds from the clock's time up to ``until`` (inclusive), skipping
    the ticks at which nothing is due (tests/bot/ticking.py)."""
    errors: list[str] = []
    tick_through(rt, clock, until, step_s=step_s, errors=errors)
    assert [step for step in errors if step not in dict(TICK_STEPS)] == []


def _warnings(rt):
    return rt.notifier.containing("will be released")


def _set(rt, instance_id, **values):
    with rt.db.session() as session:
        session.exec(update(Instance).where(col(Instance.id) == instance_id).values(**values))


def test_warned_at_30_and_10_minutes_then_released_at_the_deadline(rt, clock, platform):
    iid = _instance(rt)
    _run(rt, clock, until=D - timedelta(minutes=30, seconds=1))
    assert _warnings(rt) == []

    _run(rt, clock, until=D - timedelta(seconds=1))
    warned = _warnings(rt)
    assert [p.channel for p in warned] == ["UOWNER", "UOWNER"]
    assert "in *30m*" in warned[0].text
    assert "in *10m*" in warned[1].text
    assert warned[0].action_ids() == [
        "deadline_extend_1h",
        "deadline_extend_4h",
        "deadline_release_now",
    ]
    assert get_instance(rt.db, iid).state == "active"

    _run(rt, clock, until=D)
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == D
    assert platform.release_calls == [("i-1", "terminate")]
    # The warnings lost their buttons and say what happened.
    assert all(p.action_ids() == [] for p in warned)
    assert "Release requested (its deadline passed)" in warned[1].current_text

    _run(rt, clock, until=D + timedelta(hours=1))
    assert len(_warnings(rt)) == 2
    assert len(platform.release_calls) == 1


def test_extend_during_a_warning_supersedes_it(rt, clock, platform):
    iid = _instance(rt)
    _run(rt, clock, until=D - timedelta(minutes=20))
    first = _warnings(rt)
    assert len(first) == 1

    new_deadline = D + timedelta(hours=1)
    _set(rt, iid, deadline_at=new_deadline)
    _run(rt, clock, until=D + timedelta(minutes=5))
    assert "superseded" in first[0].current_text
    assert first[0].action_ids() == []
    assert get_instance(rt.db, iid).state == "active"
    assert platform.release_calls == []
    assert len(_warnings(rt)) == 1  # nothing new yet: 55 minutes left

    _run(rt, clock, until=new_deadline)
    assert len(_warnings(rt)) == 3
    assert get_instance(rt.db, iid).released_at == new_deadline


def test_deadline_passed_while_the_bot_was_down_warns_first(rt, clock, platform):
    iid = _instance(rt)
    clock.set(D + timedelta(hours=3))  # the bot comes back long after the deadline
    _run(rt, clock, until=clock.now)
    late = _warnings(rt)
    assert len(late) == 1
    assert "passed while the bot could not warn you" in late[0].text
    assert get_instance(rt.db, iid).state == "active"
    came_back = late[0]

    grace = deadlines.notice_s(rt)
    _run(rt, clock, until=D + timedelta(hours=3, seconds=grace - 31))
    assert get_instance(rt.db, iid).state == "active"
    _run(rt, clock, until=D + timedelta(hours=3, seconds=grace + 30))
    assert get_instance(rt.db, iid).state == "released"
    assert len(_warnings(rt)) == 1
    assert came_back.action_ids() == []


def test_bot_back_inside_the_window_sends_only_the_latest_warning(rt, clock):
    iid = _instance(rt)
    clock.set(D - timedelta(minutes=5))
    _run(rt, clock, until=clock.now)
    warned = _warnings(rt)
    assert len(warned) == 1
    assert "in *10m*" in warned[0].text  # at least the shortest offset, so past the deadline
    _run(rt, clock, until=D + timedelta(minutes=4))
    assert get_instance(rt.db, iid).state == "active"
    _run(rt, clock, until=D + timedelta(minutes=5, seconds=30))
    assert get_instance(rt.db, iid).state == "released"
    assert len(_warnings(rt)) == 1


def test_a_slack_outage_never_holds_the_release_back(rt, clock, platform):
    iid = _instance(rt)
    rt.notifier.fail_posts = True  # every call fails, for the whole hour
    _run(rt, clock, until=D - timedelta(seconds=1))
    assert get_instance(rt.db, iid).state == "active"
    _run(rt, clock, until=D + timedelta(minutes=30))
    assert get_instance(rt.db, iid).state == "released"  # at the deadline, as policy says
    assert platform.release_calls == [("i-1", "terminate")]
    with rt.db.session() as session:
        [unwarned] = session.exec(
            select(AuditLog).where(AuditLog.action == "released_unwarned")
        ).all()
        first = session.exec(select(Prompt.first_attempt_at).order_by(Prompt.id)).first()
    assert unwarned.instance_id == iid
    assert first == D - timedelta(minutes=30)  # the notice counts from the first try
    assert rt.notifier.posts == []


def test_a_warning_first_tried_late_still_gives_its_notice_then_releases(rt, clock, platform):
    iid = _instance(rt)
    clock.set(D + timedelta(minutes=5))  # the bot was down through both warnings
    rt.notifier.fail_posts = True
    _run(rt, clock, until=D + timedelta(minutes=14))
    assert get_instance(rt.db, iid).state == "active"  # 10 minutes from the first try
    _run(rt, clock, until=D + timedelta(minutes=16))
    assert get_instance(rt.db, iid).state == "released"


def test_a_warning_whose_answer_was_lost_is_not_posted_again(rt, clock, platform):
    iid = _instance(rt)
    stored: list[str] = []

    def lost_answer(channel: str, text: str, blocks=(), *, thread_ts=None, key=None) -> MessageRef:
        stored.append(text)  # Slack keeps the post; its answer never comes back
        raise SlackError("timed out", error="unreachable", outcome_unknown=True)

    rt.notifier.post = lost_answer
    _run(rt, clock, until=D + timedelta(minutes=2))
    warnings = [text for text in stored if "will be released" in text]
    assert len(warnings) == 2  # the 30- and the 10-minute warning, once each, never again
    assert get_instance(rt.db, iid).state == "released"
    with rt.db.session() as session:
        deliveries = session.exec(
            select(Prompt.delivery).where(Prompt.kind == deadlines.KIND_WARNING).order_by(Prompt.id)
        ).all()
        unconfirmed = session.exec(
            select(AuditLog).where(AuditLog.action == "prompt_unconfirmed")
        ).all()
    assert deliveries == ["unconfirmed", "unconfirmed"]
    assert len(unconfirmed) == 4  # two warnings, the ops escalation, the release notice


def _job(rt, iid, *, state="running", release_when_done=False, agent_job_id="j1") -> int:
    with rt.db.session() as session:
        job = Job(
            instance_id=iid,
            agent_job_id=agent_job_id,
            requested_by="UOWNER",
            command_json='["train"]',
            state=state,
            release_when_done=release_when_done,
            submitted_at=T0,
        )
        session.add(job)
        session.flush()
        assert job.id is not None
        return job.id


def _finish(rt, job_id):
    with rt.db.session() as session:
        session.exec(update(Job).where(col(Job.id) == job_id).values(state="succeeded"))


def test_wait_for_jobs_holds_until_the_job_ends_during_the_grace(rt, clock):
    iid = _instance(rt, deadline_policy="wait-for-jobs", max_grace_s=7200)
    job = _job(rt, iid)
    _run(rt, clock, until=D + timedelta(minutes=40))
    assert "once its jobs finish" in _warnings(rt)[0].text
    assert get_instance(rt.db, iid).state == "active"
    _finish(rt, job)
    _run(rt, clock, until=D + timedelta(minutes=41))
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == D + timedelta(minutes=41)


def test_wait_for_jobs_stops_at_the_maximum_grace(rt, clock):
    iid = _instance(rt, deadline_policy="wait-for-jobs", max_grace_s=3600)
    _job(rt, iid)
    _run(rt, clock, until=D + timedelta(minutes=59, seconds=59))
    assert get_instance(rt.db, iid).state == "active"
    _run(rt, clock, until=D + timedelta(hours=1))
    assert get_instance(rt.db, iid).state == "released"


def test_lifetime_cap_is_a_hard_stop(rt, clock):
    cap = T0 + timedelta(hours=1)
    iid = _instance(rt, deadline_policy="wait-for-jobs", lifetime_cap_at=cap)
    _job(rt, iid)
    _run(rt, clock, until=cap)
    warned = _warnings(rt)
    assert len(warned) == 2
    assert "only an admin can extend it" in warned[0].text
    assert get_instance(rt.db, iid).state == "released"
    with rt.db.session() as session:
        assert session.exec(select(Release.reason)).all() == ["cap"]


def _idle(rt, iid, since):
    _set(rt, iid, idle_since=since)


def test_idle_prompt_with_cost_and_release_after_a_further_window(rt, clock):
    iid = _instance(rt, deadline_at=None, idle_release_after_s=3600)
    _idle(rt, iid, T0)
    _run(rt, clock, until=T0 + timedelta(minutes=29, seconds=59))
    assert rt.notifier.containing("idle") == []
    _run(rt, clock, until=T0 + timedelta(minutes=30))
    idle = rt.notifier.containing("has been idle")
    assert len(idle) == 1
    assert "$2.10/h" in idle[0].text
    assert idle[0].action_ids() == ["idle_keep", "idle_release"]
    _run(rt, clock, until=T0 + timedelta(minutes=89, seconds=59))
    assert get_instance(rt.db, iid).state == "active"
    _run(rt, clock, until=T0 + timedelta(minutes=90))
    assert get_instance(rt.db, iid).state == "released"
    with rt.db.session() as session:
        assert session.exec(select(Release.reason)).all() == ["idle"]


def test_idle_without_idle_release_only_prompts(rt, clock):
    iid = _instance(rt, deadline_at=None)
    _idle(rt, iid, T0)
    _run(rt, clock, until=T0 + timedelta(minutes=31))
    _run(rt, clock, until=T0 + timedelta(hours=5), step_s=600)
    assert len(rt.notifier.containing("has been idle")) == 1
    assert get_instance(rt.db, iid).state == "active"


def test_activity_cancels_the_idle_release(rt, clock):
    iid = _instance(rt, deadline_at=None, idle_release_after_s=3600)
    _idle(rt, iid, T0)
    _run(rt, clock, until=T0 + timedelta(minutes=45))
    prompt = rt.notifier.containing("has been idle")[0]
    _idle(rt, iid, None)  # a poll saw the GPU busy
    _run(rt, clock, until=T0 + timedelta(hours=3), step_s=300)
    assert get_instance(rt.db, iid).state == "active"
    assert "busy again" in prompt.current_text
    assert prompt.action_ids() == []


def test_release_when_done_prompts_then_releases_after_the_grace(rt, clock):
    iid = _instance(rt, deadline_at=None)
    job = _job(rt, iid, release_when_done=True)
    _run(rt, clock, until=T0 + timedelta(minutes=10))
    assert rt.notifier.containing("jobs on") == []
    _finish(rt, job)
    _run(rt, clock, until=T0 + timedelta(minutes=11))
    done = rt.notifier.containing("jobs on *box* are done")
    assert len(done) == 1
    _run(rt, clock, until=T0 + timedelta(minutes=20))
    assert get_instance(rt.db, iid).state == "active"
    _run(rt, clock, until=T0 + timedelta(minutes=21))
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == T0 + timedelta(minutes=21)


def test_a_new_job_during_the_grace_keeps_the_instance(rt, clock):
    iid = _instance(rt, deadline_at=None, release_when_done=True)
    _job(rt, iid, state="succeeded")
    _run(rt, clock, until=T0 + timedelta(minutes=1))
    prompt = rt.notifier.containing("are done")[0]
    second = _job(rt, iid, agent_job_id="j2")
    _run(rt, clock, until=T0 + timedelta(minutes=30))
    assert get_instance(rt.db, iid).state == "active"
    assert "has new jobs" in prompt.current_text
    _finish(rt, second)
    _run(rt, clock, until=T0 + timedelta(minutes=31))
    assert len(rt.notifier.containing("are done")) == 2
    _run(rt, clock, until=T0 + timedelta(minutes=42))
    assert get_instance(rt.db, iid).state == "released"


def test_reconcile_stops_the_meter_of_an_instance_released_outside(rt, clock, platform):
    iid = _instance(rt, deadline_at=None)
    _run(rt, clock, until=T0 + timedelta(minutes=12))
    assert get_instance(rt.db, iid).state == "active"
    platform.state = "terminated"
    gone_at = clock.now
    _run(rt, clock, until=gone_at + timedelta(seconds=RECONCILE_EVERY_S))
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert gone_at <= inst.released_at <= gone_at + timedelta(seconds=RECONCILE_EVERY_S)
    notes = rt.notifier.containing("outside the bot")
    assert [p.channel for p in notes] == ["UOWNER"]
    with rt.db.session() as session:
        assert session.exec(select(AuditLog.action)).all() == ["released_outside"]
        assert session.exec(select(Release.reason, Release.state)).all() == [
            ("reconcile", "confirmed")
        ]
    assert platform.release_calls == []


def test_two_ticks_at_once_warn_and_release_once(rt, clock, platform):
    iid = _instance(rt)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(at):
        try:
            barrier.wait(5)
            tick(rt, at)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    for at in (D - timedelta(minutes=30), D - timedelta(minutes=10), D, D + timedelta(minutes=1)):
        clock.set(at)
        workers = [threading.Thread(target=run, args=(at,)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
    assert errors == []
    assert len(_warnings(rt)) == 2
    assert platform.release_calls == [("i-1", "terminate")]
    assert get_instance(rt.db, iid).state == "released"
    with rt.db.session() as session:
        keys = session.exec(select(Prompt.key).where(Prompt.kind == "deadline_warning")).all()
    assert sorted(keys) == [f"{D.isoformat()}:1800", f"{D.isoformat()}:600"]


def test_manual_instance_at_its_deadline_asks_the_owner(rt, clock):
    iid = _instance(rt, provider="manual", provider_instance_id=None)
    _run(rt, clock, until=D)
    assert get_instance(rt.db, iid).state == "awaiting_confirmation"
    ask = rt.notifier.containing("Please release *box* on its platform")
    assert len(ask) == 1
    assert ask[0].action_ids() == ["instance_release_done", "instance_stop_done"]
    with rt.db.session() as session:
        release = releases.open_release(session, iid)
        assert release is not None
        assert release.state == "awaiting_owner"


def test_instances_due_in_one_tick_are_warned_in_id_order_however_the_store_reads_them(rt, clock):
    """The steps take what is due by id, so the same history makes the same prompts in the
    same order. On PostgreSQL an unordered read follows the heap, where an update (or vacuum)
    moves a row: two runs of one team-month seed differed there until the steps ordered theirs.
    Here the earlier deadline and the heap (the first row updated last) both put the second
    instance first."""
    first = _instance(rt, name="box-a")
    second = _instance(
        rt, name="box-b", provider_instance_id="i-2", deadline_at=D - timedelta(minutes=1)
    )
    _set(rt, first, last_polled_at=T0)  # a new row version, after the second's
    clock.set(D - timedelta(minutes=25))  # both inside the 30-minute warning at one tick
    _run(rt, clock, until=clock.now)
    with rt.db.session() as session:
        warned = session.exec(
            select(Prompt.instance_id)
            .where(Prompt.kind == deadlines.KIND_WARNING)
            .order_by(col(Prompt.id))
        ).all()
    assert warned == [first, second]
