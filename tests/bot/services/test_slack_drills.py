"""Fault drills for what the bot says on its own, against the Slack stand-in through the real
Slack client: a Slack that stores a post and answers after the client gave up, and one that
fails every call for an hour. Time is the test's clock; each late answer costs one real second.
Each drill ends with nothing lost, nothing doubled and the instance released on time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from slack_sdk import WebClient
from sqlmodel import select

from bot.local_slack import LocalSlack
from bot.runtime import Runtime
from bot.services.instances import deadlines
from bot.services.tick import tick
from bot.slack_notifier import SlackNotifier
from bot.store.db import Database
from bot.store.models import AuditLog, Prompt
from tests.bot.services.support import (
    T0,
    Clock,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)

pytestmark = pytest.mark.integration

TOKEN = "xoxb-drill"
D = T0 + timedelta(hours=1)


@pytest.fixture
def slack() -> Iterator[LocalSlack]:
    with LocalSlack(token=TOKEN, channels={"COPS": "ops"}, users={"UOWNER": "owner"}) as stand_in:
        yield stand_in


@pytest.fixture
def platform() -> ScriptedPlatform:
    return ScriptedPlatform()


@pytest.fixture
def rt(db: Database, slack: LocalSlack, platform: ScriptedPlatform) -> Runtime:
    client = WebClient(token=TOKEN, base_url=slack.api_url, timeout=1)
    return make_runtime(
        db, Clock(), providers=[platform], notifier=SlackNotifier(client), poll_interval_s=10**7
    )


def _due_at_d(rt: Runtime) -> int:
    """An instance on the scripted platform whose deadline is D (not polled meanwhile)."""
    return add_instance(
        rt.db,
        provider="scripted",
        provider_instance_id="i-1",
        deadline_at=D,
        last_polled_at=T0 + timedelta(days=1),
    )


def _ticks(rt: Runtime, until: timedelta, step_s: int = 60) -> None:
    clock = rt.clock
    assert isinstance(clock, Clock)
    while clock.now <= T0 + until:
        report = tick(rt, clock.now)
        assert "deadlines" not in report.errors
        assert "prompts" not in report.errors
        clock.advance(seconds=step_s)


def _posted(slack: LocalSlack, fragment: str) -> list[str]:
    """Texts of the chat.postMessage calls Slack did (stored) that contain ``fragment``."""
    return [
        str(call.args.get("text", ""))
        for call in slack.calls_to("chat.postMessage")
        if call.ok and fragment in str(call.args.get("text", ""))
    ]


def test_a_slack_that_answers_after_the_timeout_gets_each_warning_once(
    rt: Runtime, slack: LocalSlack, platform: ScriptedPlatform
) -> None:
    iid = _due_at_d(rt)
    slack.answer_late("chat.postMessage", delay_s=2.0, times=2)  # both warnings: answers lost
    _ticks(rt, timedelta(minutes=61))
    # What the owner saw: the 30- and the 10-minute warning, once each, then the release.
    assert len(_posted(slack, "will be released")) == 2
    assert get_instance(rt.db, iid).state == "released"
    assert platform.release_calls == [("i-1", "terminate")]
    assert len(_posted(slack, "is released")) == 1
    with rt.db.session() as session:
        deliveries = session.exec(
            select(Prompt.delivery).where(Prompt.kind == deadlines.KIND_WARNING)
        ).all()
        unwarned = session.exec(
            select(AuditLog).where(AuditLog.action == "released_unwarned")
        ).all()
    assert sorted(d or "" for d in deliveries) == ["unconfirmed", "unconfirmed"]
    assert len(unwarned) == 1  # on record: no warning was ever confirmed


def test_a_slack_down_for_an_hour_delays_no_release_and_loses_no_notice(
    rt: Runtime, slack: LocalSlack, platform: ScriptedPlatform
) -> None:
    iid = _due_at_d(rt)
    slack.outage("chat.postMessage", status=500)
    _ticks(rt, timedelta(minutes=60))
    assert get_instance(rt.db, iid).state == "released"  # at the deadline
    assert platform.release_calls == [("i-1", "terminate")]
    assert _posted(slack, "") == []
    failed = [c for c in slack.calls_to("chat.postMessage") if not c.ok]
    assert failed  # it kept trying
    slack.outage("chat.postMessage", times=0)  # Slack is back
    _ticks(rt, timedelta(minutes=65))
    assert len(_posted(slack, "is released")) == 1  # the notice arrives, once
    # The ops channel is told, once.
    assert len(_posted(slack, "never confirmed that a warning reached")) == 1
    assert _posted(slack, "will be released") == []  # warnings about the past are not sent
    with rt.db.session() as session:
        assert session.exec(select(AuditLog).where(AuditLog.action == "released_unwarned")).all()
