"""The outbox: each message queued once, posted once, retried with a back-off, escalated once,
and never repeated when Slack's answer was lost. Drills go through the real Slack client to the
Slack stand-in; time is the test's clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from slack_sdk import WebClient
from sqlmodel import select

from bot.errors import SlackError
from bot.local_slack import LocalSlack
from bot.notify import FileAttachment, MessageRef
from bot.runtime import Runtime
from bot.services.speaking import outbox, prompts
from bot.services.tick import tick
from bot.slack_notifier import SlackNotifier
from bot.store.db import Database
from bot.store.models import AuditLog, OutboxMessage, Prompt
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, make_runtime

TOKEN = "xoxb-outbox"


def _queue(rt: Runtime, key: str = "notice:one", recipient: str = "UOWNER", **kw: Any) -> int:
    with rt.db.session() as session:
        return outbox.enqueue(
            session,
            key=key,
            kind="notice",
            recipient=recipient,
            text=f"hello {key}",
            now=rt.now(),
            **kw,
        )


def _row(rt: Runtime, message_id: int) -> OutboxMessage:
    with rt.db.session() as session:
        row = session.get(OutboxMessage, message_id)
    assert row is not None
    return row


def _audits(rt: Runtime, action: str) -> list[AuditLog]:
    with rt.db.session() as session:
        return list(session.exec(select(AuditLog).where(AuditLog.action == action)).all())


def test_deciding_twice_queues_once_and_posts_once(db: Database) -> None:
    notifier = RecordingNotifier()
    rt = make_runtime(db, Clock(), notifier=notifier)
    first = _queue(rt)
    assert _queue(rt) == first
    ref = outbox.deliver(rt, first)
    assert ref is not None
    assert ref.channel == "UOWNER"
    assert outbox.deliver(rt, first) is None
    assert outbox.deliver_due(rt, rt.now()) == 0
    (post,) = notifier.posts
    assert post.key == f"outbox:{first}"  # marked, so a lost answer can be looked for
    row = _row(rt, first)
    assert (row.delivery, row.message_ts, row.attempts) == (outbox.POSTED, post.ts, 1)


def test_a_failing_slack_is_retried_with_a_back_off_and_escalated_once(db: Database) -> None:
    clock = Clock()
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier, channel="COPS", timezone="Asia/Shanghai")
    message_id = _queue(rt)
    notifier.fail_posts = True
    tries = 0
    for _ in range(120):  # an hour of ticks, one every 30 s
        before = _row(rt, message_id).attempts
        outbox.deliver_due(rt, clock.now)
        tries += _row(rt, message_id).attempts - before
        clock.advance(seconds=30)
    # 30, 60, 120, 240, 480, 900, 900 ... seconds apart: not every tick.
    assert 6 <= tries <= 10
    row = _row(rt, message_id)
    assert row.delivery is None
    assert row.escalated_at is not None
    assert len(_audits(rt, "outbox_escalated")) == 1
    escalations = [r for r in _pending(rt) if r.kind == outbox.KIND_ESCALATION]
    assert len(escalations) == 1
    assert escalations[0].recipient == "COPS"
    assert "could not be posted" in escalations[0].text
    assert "tries since Wed 02 Dec 20:00 CST:" in escalations[0].text  # the workspace's zone
    notifier.fail_posts = False  # Slack is back
    clock.advance(seconds=outbox.RETRY_MAX_S)
    assert outbox.deliver_due(rt, clock.now) == 2
    clock.advance(hours=1)
    assert outbox.deliver_due(rt, clock.now) == 0
    assert len(notifier.to("UOWNER")) == 1
    assert len(notifier.to("COPS")) == 1


def _pending(rt: Runtime) -> list[OutboxMessage]:
    with rt.db.session() as session:
        return outbox.pending(session)


def test_a_post_whose_answer_was_lost_is_never_repeated(db: Database) -> None:
    class SlowSlack(RecordingNotifier):
        def post(self, *args: Any, **kwargs: Any) -> MessageRef:
            super().post(*args, **kwargs)
            raise SlackError("Slack's answer timed out", error="unreachable", outcome_unknown=True)

    clock = Clock()
    slow = SlowSlack()
    rt = make_runtime(db, clock, notifier=slow)
    message_id = _queue(rt)
    assert outbox.deliver(rt, message_id) is None
    for _ in range(10):
        clock.advance(minutes=10)
        outbox.deliver_due(rt, clock.now)
    assert len(slow.posts) == 1
    assert _row(rt, message_id).delivery == outbox.UNCONFIRMED
    (entry,) = _audits(rt, "outbox_unconfirmed")
    assert '"key": "notice:one"' in entry.details_json


def test_a_refused_post_fails_for_good_and_is_escalated_at_once(db: Database) -> None:
    class Archived(RecordingNotifier):
        def post(self, channel: str, *args: Any, **kwargs: Any) -> MessageRef:
            if channel == "CGONE":
                raise SlackError("is_archived", error="is_archived")
            return super().post(channel, *args, **kwargs)

    clock = Clock()
    notifier = Archived()
    rt = make_runtime(db, clock, notifier=notifier, channel="COPS")
    message_id = _queue(rt, recipient="CGONE")
    assert outbox.deliver(rt, message_id) is None
    assert _row(rt, message_id).delivery == outbox.FAILED
    assert outbox.deliver_due(rt, clock.now) == 1  # the escalation
    (escalation,) = notifier.to("COPS")
    assert "<#CGONE>" in escalation.text
    assert "is_archived" in escalation.text
    clock.advance(hours=2)
    assert outbox.deliver_due(rt, clock.now) == 0


def test_a_claim_left_by_a_dead_process_is_looked_for_before_posting_again(db: Database) -> None:
    class Crash(RuntimeError):
        pass

    class DiesAfterSlackStored(RecordingNotifier):
        def post(self, *args: Any, **kwargs: Any) -> MessageRef:
            super().post(*args, **kwargs)
            raise Crash("the bot process died here")

    clock = Clock()
    dying = DiesAfterSlackStored()
    rt = make_runtime(db, clock, notifier=dying)
    message_id = _queue(rt)
    with pytest.raises(Crash):
        outbox.deliver(rt, message_id)
    clock.advance(seconds=outbox.CLAIM_LEASE_S - 1)
    assert outbox.deliver_due(rt, clock.now) == 0  # the claim may still be in flight
    clock.advance(seconds=2)
    survivor = RecordingNotifier()
    survivor.posts = dying.posts  # the same Slack workspace
    rt2 = make_runtime(db, clock, notifier=survivor)
    assert outbox.deliver_due(rt2, clock.now) == 1  # found in the history, recorded
    assert len(survivor.posts) == 1
    assert _row(rt, message_id).message_ts == survivor.posts[0].ts


def test_two_processes_delivering_at_once_post_each_message_once(db: Database) -> None:
    clock = Clock()
    notifier = RecordingNotifier()
    runtimes = [make_runtime(db, clock, notifier=notifier) for _ in range(4)]
    for i in range(20):
        _queue(runtimes[0], key=f"notice:{i}")
    threads = [threading.Thread(target=outbox.deliver_due, args=(r, clock.now)) for r in runtimes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.text for p in notifier.posts) == sorted(f"hello notice:{i}" for i in range(20))


def test_a_file_waits_for_its_message_and_lands_in_its_thread(db: Database) -> None:
    uploads: list[tuple[str, str, str | None]] = []

    class Uploading(RecordingNotifier):
        def upload_file(self, channel: str, filename: str, content: bytes, **kw: Any) -> None:
            uploads.append((channel, filename, kw.get("thread_ts")))

    clock = Clock()
    notifier = Uploading()
    rt = make_runtime(db, clock, notifier=notifier)
    notifier.fail_posts = True
    message_id = _queue(rt, files=(FileAttachment("chart.png", b"\x89PNG"),))
    assert outbox.deliver_due(rt, clock.now) == 0
    assert uploads == []  # the file never goes before its message
    notifier.fail_posts = False
    clock.advance(seconds=outbox.RETRY_FIRST_S)
    assert outbox.deliver_due(rt, clock.now) == 1
    assert uploads == [("UOWNER", "chart.png", _row(rt, message_id).message_ts)]
    clock.advance(hours=1)
    outbox.deliver_due(rt, clock.now)
    assert len(uploads) == 1


# --- drills through the real Slack client ---------------------------------------------------


@pytest.fixture
def slack() -> Iterator[LocalSlack]:
    with LocalSlack(token=TOKEN, channels={"COPS": "ops"}, users={"UOWNER": "owner"}) as stand_in:
        yield stand_in


def _slack_runtime(db: Database, slack: LocalSlack) -> Runtime:
    client = WebClient(token=TOKEN, base_url=slack.api_url, timeout=1)
    return make_runtime(db, Clock(), notifier=SlackNotifier(client), channel="COPS")


def _stored(slack: LocalSlack, fragment: str) -> list[str]:
    return [
        str(call.args.get("text", ""))
        for call in slack.calls_to("chat.postMessage")
        if call.ok and fragment in str(call.args.get("text", ""))
    ]


@pytest.mark.integration
def test_drill_slack_answers_after_the_timeout(db: Database, slack: LocalSlack) -> None:
    rt = _slack_runtime(db, slack)
    clock = rt.clock
    assert isinstance(clock, Clock)
    slack.answer_late("chat.postMessage", delay_s=2.0)
    message_id = _queue(rt)
    for _ in range(20):  # ten minutes of ticks
        tick(rt, clock.now)
        clock.advance(seconds=30)
    assert len(_stored(slack, "hello notice:one")) == 1  # stored once, never posted again
    assert _row(rt, message_id).delivery == outbox.UNCONFIRMED


@pytest.mark.integration
def test_drill_slack_down_for_an_hour(db: Database, slack: LocalSlack) -> None:
    rt = _slack_runtime(db, slack)
    clock = rt.clock
    assert isinstance(clock, Clock)
    slack.outage("chat.postMessage", status=500)
    slack.outage("conversations.history", status=500)
    message_id = _queue(rt)
    for _ in range(120):  # an hour of ticks
        tick(rt, clock.now)
        clock.advance(seconds=30)
    assert _stored(slack, "") == []
    tried = len(slack.calls_to("chat.postMessage"))
    assert 6 <= tried <= 25  # backed off: one message and one escalation, not 120 ticks each
    slack.outage("chat.postMessage", times=0)
    slack.outage("conversations.history", times=0)
    for _ in range(40):  # Slack is back: twenty minutes of ticks
        tick(rt, clock.now)
        clock.advance(seconds=30)
    assert len(_stored(slack, "hello notice:one")) == 1
    assert len(_stored(slack, "could not be posted")) == 1  # the ops channel was told once
    assert _row(rt, message_id).delivery == outbox.POSTED


def _prompt(rt: Runtime, recipient: str = "UOWNER") -> int:
    iid = add_instance(rt.db)
    with rt.db.session() as session:
        prompt = prompts.ensure_prompt(
            session, instance_id=iid, kind="idle", key="k", recipient=recipient, due_at=rt.now()
        )
        assert prompt.id is not None
        return prompt.id


def test_a_prompt_that_keeps_failing_is_escalated_once_through_the_outbox(db: Database) -> None:
    clock = Clock()
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier, channel="COPS")
    prompt_id = _prompt(rt)
    notifier.fail_posts = True
    for _ in range(40):  # twenty minutes of ticks
        prompts.deliver(rt, prompt_id, "are you still using it?")
        clock.advance(seconds=30)
    (escalation,) = [r for r in _pending(rt) if r.kind == outbox.KIND_ESCALATION]
    assert escalation.key == f"escalation:prompt:{prompt_id}"
    notifier.fail_posts = False
    assert prompts.deliver(rt, prompt_id, "are you still using it?") is not None
    assert outbox.deliver_due(rt, clock.now) == 1
    assert len(notifier.to("UOWNER")) == 1
    assert len(notifier.to("COPS")) == 1


def test_a_prompt_slack_refuses_for_good_is_closed_and_escalated(db: Database) -> None:
    class NotInvited(RecordingNotifier):
        def post(self, channel: str, *args: Any, **kwargs: Any) -> MessageRef:
            if channel == "CSECRET":
                raise SlackError("not_in_channel", error="not_in_channel")
            return super().post(channel, *args, **kwargs)

    clock = Clock()
    notifier = NotInvited()
    rt = make_runtime(db, clock, notifier=notifier, channel="COPS")
    prompt_id = _prompt(rt, recipient="CSECRET")
    assert prompts.deliver(rt, prompt_id, "release it?") is None
    with rt.db.session() as session:
        prompt = session.get(Prompt, prompt_id)
    assert prompt is not None
    assert prompt.delivery == prompts.FAILED
    clock.advance(minutes=5)
    assert prompts.deliver(rt, prompt_id, "release it?") is None  # not tried again
    assert outbox.deliver_due(rt, clock.now) == 1
    (told,) = notifier.to("COPS")
    assert "<#CSECRET>" in told.text
    assert len(_audits(rt, "prompt_failed")) == 1
