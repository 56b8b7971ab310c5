"""Budgets: admins set them, alerts once per threshold, caps stop rentals and extensions."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlmodel import col, select

from bot.errors import BudgetExceeded, NotAuthorized, NotFound, UsageError
from bot.services.access import Caller
from bot.services.money import budgets
from bot.services.speaking import outbox
from bot.store.db import Database
from bot.store.models import AuditLog, BudgetAlert, Person
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, make_runtime

ADMIN = Caller("UADMIN", "COPS")
ALICE = Caller("UALICE", "COPS")
USD = 1_000_000
START = datetime(2026, 3, 3, 10, 0)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


def test_only_admins_set_and_remove_budgets(db: Database, clock: Clock) -> None:
    rt = make_runtime(db, clock)
    with pytest.raises(NotAuthorized, match="Only an admin"):
        budgets.set_budget(rt, ALICE, "user", "UALICE", 500 * USD)
    status = budgets.set_budget(rt, ADMIN, "user", "UALICE", 500 * USD)
    assert (status.scope, status.subject, status.limit_micros, status.spent_micros) == (
        "user",
        "UALICE",
        500 * USD,
        0,
    )
    # Setting it again changes the limit; there is still one budget.
    budgets.set_budget(rt, ADMIN, "user", "UALICE", 800 * USD)
    assert [s.limit_micros for s in budgets.list_budgets(rt, clock.now)] == [800 * USD]
    with pytest.raises(NotAuthorized):
        budgets.remove_budget(rt, ALICE, "user", "UALICE")
    budgets.remove_budget(rt, ADMIN, "user", "UALICE")
    assert budgets.list_budgets(rt, clock.now) == []
    with pytest.raises(NotFound, match="no budget"):
        budgets.remove_budget(rt, ADMIN, "user", "UALICE")
    with db.session() as session:
        actions = [row.action for row in session.exec(select(AuditLog).order_by(col(AuditLog.id)))]
    assert actions == ["budget_set", "budget_set", "budget_remove"]


def test_spend_counts_charges_and_the_open_hour(db: Database, clock: Clock) -> None:
    rt = make_runtime(db, clock)
    add_instance(db, owner_id="UALICE", project="llm", price_micros=10 * USD, created_at=START)
    add_instance(db, name="b", owner_id="UBOB", project="llm", price_micros=USD, created_at=START)
    budgets.set_budget(rt, ADMIN, "project", "llm", 100 * USD)
    budgets.set_budget(rt, ADMIN, "user", "UALICE", 50 * USD)
    clock.advance(hours=2, minutes=30)
    statuses = {s.subject: s for s in budgets.list_budgets(rt, clock.now)}
    assert statuses["UALICE"].spent_micros == 25 * USD
    assert statuses["llm"].spent_micros == 27_500_000
    assert statuses["UALICE"].used_pct == 50


def test_alerts_once_per_threshold(db: Database, clock: Clock) -> None:
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier)
    add_instance(db, owner_id="UALICE", project="llm", price_micros=10 * USD, created_at=START)
    budgets.set_budget(rt, ADMIN, "user", "UALICE", 100 * USD)
    budgets.set_budget(rt, ADMIN, "project", "llm", 1000 * USD)
    clock.advance(hours=4)
    assert budgets.check_alerts(rt, clock.now) == []
    clock.advance(hours=1)  # $50: half of alice's budget
    alice_id = budgets.list_budgets(rt, clock.now)[0].budget_id
    assert budgets.check_alerts(rt, clock.now) == [(alice_id, 50)]
    assert budgets.check_alerts(rt, clock.now) == []
    clock.advance(hours=6)  # $110: past 80 and 100 at once -> one message, both marked
    assert budgets.check_alerts(rt, clock.now) == [(alice_id, 80), (alice_id, 100)]
    assert budgets.check_alerts(rt, clock.now) == []
    texts = [p.text for p in notifier.to("UALICE")]
    assert len(texts) == 2
    assert "50% used" in texts[0]
    assert "used up" in texts[1]
    assert "need an admin" in texts[1]
    # A second bot process on the same database sends nothing more.
    other = make_runtime(db, clock, notifier=RecordingNotifier())
    assert budgets.check_alerts(other, clock.now) == []


def test_alerts_start_again_next_month(db: Database, clock: Clock) -> None:
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier)
    add_instance(db, owner_id="UALICE", price_micros=10 * USD, created_at=START)
    budgets.set_budget(rt, ADMIN, "user", "UALICE", 20 * USD)
    clock.advance(hours=3)
    budgets.check_alerts(rt, clock.now)
    assert len(notifier.to("UALICE")) == 1
    clock.set(datetime(2026, 4, 1, 1, 0))
    budgets.check_alerts(rt, clock.now)
    assert len(notifier.to("UALICE")) == 2
    with db.session() as session:
        months = sorted({row.month for row in session.exec(select(BudgetAlert))})
    assert months == ["2026-03", "2026-04"]


def test_failed_alert_is_retried(db: Database, clock: Clock) -> None:
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier)
    add_instance(db, project="llm", price_micros=10 * USD, created_at=START)
    budgets.set_budget(rt, ADMIN, "project", "llm", 10 * USD)
    clock.advance(hours=1)
    notifier.fail_posts = True
    assert len(budgets.check_alerts(rt, clock.now)) == 3  # decided once, queued in the outbox
    assert notifier.posts == []
    notifier.fail_posts = False
    assert budgets.check_alerts(rt, clock.now) == []  # never decided twice
    assert outbox.deliver_due(rt, clock.now) == 0  # the failed post waits out its back-off
    clock.advance(seconds=outbox.RETRY_FIRST_S)
    assert outbox.deliver_due(rt, clock.now) == 1
    assert outbox.deliver_due(rt, clock.now) == 0
    assert len(notifier.to("COPS")) == 1  # project alerts go to the ops channel


def test_check_budget_blocks_past_the_cap_unless_admin(db: Database, clock: Clock) -> None:
    rt = make_runtime(db, clock)
    add_instance(db, owner_id="UALICE", project="llm", price_micros=10 * USD, created_at=START)
    budgets.set_budget(rt, ADMIN, "project", "llm", 30 * USD)
    budgets.check_budget(rt, ALICE, "UALICE", "llm")
    clock.advance(hours=3)
    with pytest.raises(BudgetExceeded, match="project llm is used up") as raised:
        budgets.check_budget(rt, ALICE, "UALICE", "llm")
    assert "<@UADMIN>" in raised.value.hint
    budgets.check_budget(rt, ADMIN, "UALICE", "llm")
    budgets.check_budget(rt, ALICE, "UALICE", None)  # no project: only the user's budget


def test_parse_subjects() -> None:
    assert budgets.parse_scope("User") == "user"
    with pytest.raises(UsageError, match="budget kind"):
        budgets.parse_scope("team")
    assert budgets.parse_subject("user", "<@U123ABC|alice>") == "U123ABC"
    assert budgets.parse_subject("user", "U123ABC") == "U123ABC"
    with pytest.raises(UsageError, match="Slack user"):
        budgets.parse_subject("user", "@alice")
    assert budgets.parse_subject("project", "llm") == "llm"
    with pytest.raises(UsageError, match="project name"):
        budgets.parse_subject("project", "two words")


def test_budget_must_be_positive(db: Database, clock: Clock) -> None:
    rt = make_runtime(db, clock)
    with pytest.raises(UsageError, match="more than 0"):
        budgets.set_budget(rt, ADMIN, "user", "UALICE", 0)
    assert budgets.list_budgets(rt, clock.now + timedelta(hours=1)) == []


def test_resolve_subject_takes_every_way_a_user_arrives(db: Database) -> None:
    with db.session() as session:
        session.add(Person(slack_id="U0ALICE", display_name="Alice"))
        session.add(Person(slack_id="U0SAM1", display_name="sam"))
        session.add(Person(slack_id="U0SAM2", display_name="Sam"))
    for text in ("<@U0ALICE|alice>", "<@U0ALICE>", "U0ALICE", "@U0ALICE", "@alice", " @ALICE "):
        assert budgets.resolve_subject(db, "user", text) == "U0ALICE", text
    with pytest.raises(UsageError, match="nobody called @bob") as raised:
        budgets.resolve_subject(db, "user", "@bob")
    assert "member ID" in raised.value.hint
    with pytest.raises(UsageError, match="2 people called @sam"):
        budgets.resolve_subject(db, "user", "@sam")
    with pytest.raises(UsageError, match="Slack user"):
        budgets.resolve_subject(db, "user", "@")
    assert budgets.resolve_subject(db, "project", "@llm") == "@llm"


def test_resolve_subject_knows_the_caller_and_names_learned_from_mentions(
    db: Database, clock: Clock
) -> None:
    me = Caller(user_id="UADMIN", user_name="root-admin")
    assert budgets.resolve_subject(db, "user", "@Root-Admin", me) == "UADMIN"
    with pytest.raises(UsageError, match="nobody called @dana"):
        budgets.resolve_subject(db, "user", "@dana", me)
    assert budgets.mention_name("<@U0DANA|dana>") == "dana"
    assert budgets.mention_name("<@U0DANA>") is None
    rt = make_runtime(db, clock)
    budgets.set_budget(rt, ADMIN, "user", "U0DANA", 100_000_000, display_name="dana")
    assert budgets.resolve_subject(db, "user", "@dana") == "U0DANA"
    # A name already known is not overwritten by a later mention.
    budgets.set_budget(rt, ADMIN, "user", "U0DANA", 200_000_000, display_name="someone")
    with db.session() as session:
        person = session.get(Person, "U0DANA")
        assert person is not None
        assert person.display_name == "dana"


def test_a_used_up_personal_budget_is_told_to_the_admins_once(db: Database, clock: Clock) -> None:
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, notifier=notifier, channel="COPS")
    add_instance(db, owner_id="UALICE", project="llm", price_micros=10 * USD, created_at=START)
    budgets.set_budget(rt, ADMIN, "user", "UALICE", 100 * USD)
    clock.advance(hours=5)  # $50: only Alice hears of half her budget
    budgets.check_alerts(rt, clock.now)
    assert len(notifier.to("UALICE")) == 1
    assert notifier.to("COPS") == []
    clock.advance(hours=6)  # $110: used up; the team channel hears of it too
    budgets.check_alerts(rt, clock.now)
    budgets.check_alerts(rt, clock.now)
    [told] = notifier.to("COPS")
    assert "used up" in told.text
    assert "UALICE" in told.text
    assert len(notifier.to("UALICE")) == 2
