"""Jobs, releases, deadlines, access and the bot's own errors in Simplified Chinese: the errors a
person meets (not the owner, an unknown job, a job that cannot be cancelled, a busy bot ...), and
what the bot says on its own (a deadline warning, a release to do by hand, a finished job, a
change seen on the platform) in the language its recipient chose, while everyone else keeps the
workspace's English."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from agents.protocol import JobRecord
from bot.errors import GpubotError, Unreachable
from bot.executor import BotExecutor, Busy
from bot.i18n import active_language, set_default_language, speaking
from bot.notify import Notice
from bot.runtime import Runtime
from bot.services import access, prompt_kinds
from bot.services.access import Caller
from bot.services.instances import deadlines, policies, reconcile, releases
from bot.services.instances.policies import PolicyChange
from bot.services.jobs import access as job_access
from bot.services.jobs import runs as jobs
from bot.services.speaking import outbox, prompts
from bot.store.db import Database
from bot.store.models import Instance, Job, OutboxMessage, Person
from tests.bot.services.support import (
    T0,
    Clock,
    NoFleet,
    Posted,
    RecordingNotifier,
    ScriptedPlatform,
    add_instance,
    make_runtime,
    rows,
)
from tests.chinese import HAN, assert_chinese, assert_said_in_chinese, chinese_error

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
STRANGER = Caller(user_id="USTRANGER", channel_id="CTEAM")
ADMIN = Caller(user_id="UADMIN", channel_id="COPS")
ZH, EN = "UZH", "UEN"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def platform() -> ScriptedPlatform:
    return ScriptedPlatform()


@pytest.fixture
def notifier() -> RecordingNotifier:
    return RecordingNotifier()


@pytest.fixture
def rt(
    sqlite_db: Database, clock: Clock, platform: ScriptedPlatform, notifier: RecordingNotifier
) -> Runtime:
    runtime = make_runtime(
        sqlite_db,
        clock,
        providers=[platform],
        notifier=notifier,
        fleet=NoFleet(),
        poll_interval_s=10**7,
    )
    with sqlite_db.session() as session:
        session.add(Person(slack_id=ZH, language="zh"))
        session.add(Person(slack_id=EN, language="en"))
    return runtime


@pytest.fixture
def rendered(rt: Runtime) -> list[tuple[str, str]]:
    """(notice class, language) of every notice the runtime puts into words."""
    seen: list[tuple[str, str]] = []
    render = rt.render

    def spy(notice: Notice) -> Any:
        seen.append((type(notice).__name__, active_language()))
        return render(notice)

    rt.render = spy
    return seen


def _job(rt: Runtime, instance_id: int, **fields: Any) -> int:
    values: dict[str, Any] = {
        "instance_id": instance_id,
        "agent_job_id": "20261202-aaaa",
        "requested_by": "UOWNER",
        "command_json": json.dumps(["python", "train.py"]),
        "state": "succeeded",
        "submitted_at": T0,
        "started_at": T0,
        "finished_at": T0 + timedelta(minutes=5),
        "exit_code": 0,
    }
    values.update(fields)
    with rt.db.session() as session:
        job = Job(**values)
        session.add(job)
        session.flush()
        assert job.id is not None
        return job.id


def _words(posted: Posted) -> list[Any]:
    return [posted.text, list(posted.blocks)]


# --- errors a person meets ----------------------------------------------------------------------


def test_only_the_owner_or_an_admin_changes_an_instance_in_chinese(rt: Runtime) -> None:
    add_instance(rt.db, name="box")
    text = chinese_error(
        lambda: job_access.allow(rt, STRANGER, "box", "<@UFRIEND>"), "<@UOWNER>", "box"
    )
    assert "授权" in text
    chinese_error(lambda: job_access.allow(rt, OWNER, "box", "<@UOWNER>"), "<@UOWNER>", "box")
    chinese_error(lambda: job_access.deny(rt, OWNER, "box", "<@UOWNER>"), "<@UOWNER>")
    chinese_error(lambda: policies.set_policy(rt, STRANGER, "box", PolicyChange("release")))


def test_an_action_named_by_a_caller_in_the_active_language_still_reads_whole(
    rt: Runtime,
) -> None:
    inst = Instance(name="box", owner_id="UOWNER", host="h", ssh_user="root", price_micros=1)
    with speaking("zh"), pytest.raises(GpubotError) as caught:
        access.require_owner_or_admin(rt, STRANGER, inst, action="extend")
    assert "延长" in caught.value.message
    assert_said_in_chinese(caught.value.user_text())
    fallback = chinese_error(
        lambda: access.require_owner_or_admin(rt, STRANGER, inst, action="重命名"), "重命名"
    )
    assert "<@UOWNER>" in fallback


def test_unknown_and_finished_jobs_are_refused_in_chinese(rt: Runtime) -> None:
    iid = add_instance(rt.db, name="box")
    chinese_error(lambda: jobs.cancel(rt, OWNER, "999"), "999", "`/gpu jobs`")
    chinese_error(lambda: jobs.cancel(rt, OWNER, "nosuchjob"), "'nosuchjob'", "INSTANCE:AGENT_ID")
    done = _job(rt, iid)
    text = chinese_error(lambda: jobs.cancel(rt, OWNER, str(done)), str(done))
    assert "succeeded" not in text
    pending = _job(rt, iid, agent_job_id="pending-abc", state="queued", finished_at=None)
    chinese_error(lambda: jobs.cancel(rt, OWNER, str(pending)), str(pending), "box")
    chinese_error(lambda: jobs.logs(rt, OWNER, str(done), tail=0), "5000")


def test_reading_logs_needs_the_owners_leave_in_chinese(rt: Runtime) -> None:
    iid = add_instance(rt.db, name="box")
    done = _job(rt, iid)
    text = chinese_error(
        lambda: jobs.logs(rt, STRANGER, str(done)), "<@UOWNER>", "`/gpu allow box <@USTRANGER>`"
    )
    assert "日志" in text


def test_a_bad_job_request_is_refused_in_chinese(rt: Runtime) -> None:
    add_instance(rt.db, name="box")
    chinese_error(lambda: jobs.submit(rt, OWNER, "box", []), "`-- python train.py`")
    chinese_error(lambda: jobs.submit(rt, OWNER, "box", ["ls"], retries=101), "100")


def test_policies_and_caps_are_refused_in_chinese(rt: Runtime) -> None:
    add_instance(rt.db, name="box", provider="manual")
    chinese_error(lambda: policies.set_policy(rt, OWNER, "box", PolicyChange()), "--at-deadline")
    chinese_error(
        lambda: policies.set_policy(rt, OWNER, "box", PolicyChange(at_deadline="later")), "'later'"
    )
    chinese_error(
        lambda: policies.set_policy(rt, OWNER, "box", PolicyChange(release_after_s=3600)),
        "--release-after",
    )
    chinese_error(
        lambda: policies.set_lifetime_cap(rt, OWNER, "box", timedelta(days=1)), "<@UADMIN>"
    )


def test_releases_are_refused_in_chinese(rt: Runtime) -> None:
    chinese_error(lambda: releases.release_now(rt, OWNER, 999), "999", "`/gpu list`")
    gone = add_instance(rt.db, name="gone", state="released")
    chinese_error(lambda: releases.request_release(rt, gone, reason="user", requested_by="U"))
    releasing = add_instance(rt.db, name="busy", state="releasing")
    with rt.db.session() as session:
        inst = session.get(Instance, releasing)
        assert inst is not None
        text = chinese_error(lambda: releases.require_extendable(rt, session, inst), "busy")
    assert "释放中" in text


def test_a_machine_held_by_someone_else_is_refused_in_chinese(rt: Runtime) -> None:
    held = Instance(name="theirs", owner_id="UOTHER", host="h", ssh_user="root", price_micros=1)
    chinese_error(
        lambda: access.holder_for_registration(rt, OWNER, [held], "mine"),
        "theirs",
        "<@UOTHER>",
        "`/gpu allow theirs <@UOWNER>`",
    )
    chinese_error(lambda: access.refuse_local(rt, "local", "local"))
    api = Instance(
        name="cloud", owner_id="UOWNER", host="h", ssh_user="root", price_micros=1, state="active"
    )
    chinese_error(
        lambda: access.require_awaiting_confirmation(api, is_manual=False, is_open=False),
        "`/gpu release cloud`",
    )


def test_adopting_what_the_bot_cannot_ask_about_is_refused_in_chinese(rt: Runtime) -> None:
    request = reconcile.AdoptRequest(provider="manual", provider_id="i-9", name="box")
    chinese_error(lambda: reconcile.adopt(rt, ADMIN, request), "手动登记", "--price 2.10/h")
    # A member hears first that adopting is an admin's act, and whom to ask.
    chinese_error(lambda: reconcile.adopt(rt, OWNER, request), "manual i-9")


def test_a_busy_bot_says_so_in_chinese() -> None:
    gate = threading.Event()
    pool = BotExecutor(1, per_user=1, max_queued=0)
    try:
        pool.submit_command("U1", gate.wait, 5)
        with speaking("zh"), pytest.raises(Busy) as mine:
            pool.submit_command("U1", gate.wait, 5)
        with speaking("zh"), pytest.raises(Busy) as full:
            pool.submit_command("U2", gate.wait, 5)
    finally:
        gate.set()
        pool.shutdown(wait=True)
    assert_said_in_chinese(mine.value.user_text(), full.value.user_text())
    assert "1" in mine.value.user_text()
    assert "gpubot" in full.value.user_text()


def test_the_hints_of_the_error_classes_are_said_in_the_readers_language() -> None:
    english = Unreachable("x").hint
    with speaking("zh"):
        chinese = Unreachable("连接超时。").user_text()
    assert english not in chinese
    assert_said_in_chinese(chinese)
    assert "SSH" in chinese
    assert Unreachable("x", hint="").hint == ""


def _noted(note: str, template: str | None = None, **params: str) -> JobRecord:
    return JobRecord(
        id="j1",
        name=None,
        state="lost",
        command=("x",),
        user=None,
        gpus_requested=None,
        gpus_assigned=(),
        retries=0,
        attempt=0,
        created_at="2026-01-01T00:00:00+00:00",
        started_at=None,
        finished_at=None,
        exit_code=None,
        note=note,
        note_template=template,
        note_params=params,
    )


def test_the_bots_own_notes_on_a_job_are_shown_in_chinese() -> None:
    forgotten = _noted("Lost: box no longer knows this job.", jobs.LOST_FORGOTTEN, name="box")
    released = _noted("Lost: the instance was released.", jobs.LOST_INSTANCE_GONE, state="released")
    with speaking("zh"):
        lost = jobs.note_words(forgotten)
        gone = jobs.note_words(released)
        theirs = jobs.note_words(_noted("exit code 137 (killed)"))
    assert lost is not None
    assert "box" in lost
    assert gone is not None
    assert "已释放" in gone
    assert_said_in_chinese(lost, gone)
    assert theirs == "exit code 137 (killed)"
    assert jobs.note_words(forgotten) == "Lost: box no longer knows this job."


def test_an_escalation_to_the_ops_channel_is_in_the_workspaces_language(rt: Runtime) -> None:
    set_default_language("zh")
    with rt.db.session() as session, speaking("en"):
        outbox.escalate(
            rt,
            session,
            about="outbox:1",
            kind="job_reply",
            recipient="UOWNER",
            attempts=5,
            first_attempt_at=T0,
            now=T0,
            exc=GpubotError("channel_not_found"),
            instance_id=None,
        )
    (row,) = rows(rt.db, OutboxMessage)
    assert row.recipient == "COPS"
    assert_said_in_chinese(row.text)
    assert "<@UOWNER>" in row.text
    assert "5" in row.text


# --- what the bot says on its own ---------------------------------------------------------------


def test_a_deadline_warning_goes_to_each_owner_in_their_language(
    rt: Runtime, clock: Clock, notifier: RecordingNotifier, rendered: list[tuple[str, str]]
) -> None:
    deadline = T0 + timedelta(minutes=20)
    add_instance(rt.db, name="zhbox", owner_id=ZH, provider="scripted", deadline_at=deadline)
    add_instance(rt.db, name="enbox", owner_id=EN, provider="scripted", deadline_at=deadline)
    deadlines.check_deadlines(rt, clock.now)
    prompts.deliver_pending(rt, clock.now, prompt_kinds.PROMPT_NOTICES)

    assert sorted(lang for kind, lang in rendered if kind == "DeadlineWarning") == ["en", "zh"]
    (chinese,) = notifier.to(ZH)
    (english,) = notifier.to(EN)
    assert_chinese(*_words(chinese))
    assert "zhbox" in chinese.text
    assert not HAN.search(english.text), english.text


def test_a_release_to_do_by_hand_asks_the_owner_in_their_language(
    rt: Runtime, notifier: RecordingNotifier, rendered: list[tuple[str, str]]
) -> None:
    iid = add_instance(rt.db, name="zhbox", owner_id=ZH, provider="manual")
    with speaking("en"):  # an English-speaking admin asks
        releases.release_now(rt, ADMIN, iid)
    assert ("ManualReleaseRequest", "zh") in rendered
    (asked,) = notifier.to(ZH)
    assert_chinese(*_words(asked))
    assert "zhbox" in asked.text

    with speaking("en"):
        releases.confirm_manual_release(rt, ADMIN, iid)
    assert ("Decided", "zh") in rendered
    assert_chinese(asked.updates[-1][0], list(asked.updates[-1][1]))


def test_a_finished_jobs_reply_is_in_the_language_of_who_ran_it(
    rt: Runtime, notifier: RecordingNotifier, rendered: list[tuple[str, str]]
) -> None:
    iid = add_instance(rt.db, name="box")
    _job(rt, iid, requested_by=ZH, agent_job_id="job-zh")
    _job(rt, iid, requested_by=EN, agent_job_id="job-en")
    _job(rt, iid, requested_by=ZH, agent_job_id="job-zh-2", state="failed", exit_code=1)
    assert jobs.send_replies(rt) == 3

    assert [lang for kind, lang in rendered if kind == "JobFinished"] == ["zh", "en", "zh"]
    chinese = notifier.to(ZH)
    (english,) = notifier.to(EN)
    assert len(chinese) == 2
    for posted in chinese:
        assert_chinese(*_words(posted))
        assert "box" in posted.text
    assert not HAN.search(english.text), english.text


def test_a_change_seen_on_the_platform_is_told_to_the_owner_in_their_language(
    rt: Runtime, clock: Clock, platform: ScriptedPlatform, rendered: list[tuple[str, str]]
) -> None:
    add_instance(
        rt.db,
        name="zhbox",
        owner_id=ZH,
        provider="scripted",
        provider_instance_id="i-1",
        created_at=T0 - timedelta(hours=1),
    )
    platform.state = "stopped"
    assert reconcile.reconcile(rt, clock.now)
    assert ("ReleasedOutside", "zh") in rendered
    with rt.db.session() as session:
        (row,) = outbox.pending(session)
        text, blocks = row.text, json.loads(row.blocks_json or "[]")
    assert row.recipient == ZH
    assert_chinese(text, blocks)
    assert "zhbox" in text
