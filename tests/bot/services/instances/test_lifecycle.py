"""Extending and releasing instances on SQLite and PostgreSQL, with the real local transport
running the real agent (its NVML faked: no GPU here)."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest

from bot.errors import (
    BudgetExceeded,
    Conflict,
    NotAuthorized,
    NotFound,
    UsageError,
)
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import lifecycle
from bot.services.money import budgets
from bot.services.speaking import audit
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, Release
from tests.bot.services.support import (
    T0,
    Clock,
    RecordingNotifier,
    add_instance,
    make_runtime,
    rows,
)

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM", user_name="owner")
OTHER = Caller(user_id="UOTHER", channel_id="CTEAM")
ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


@pytest.fixture
def clock(rt: Runtime) -> Clock:
    return cast(Clock, rt.clock)


@pytest.fixture
def notifier(rt: Runtime) -> RecordingNotifier:
    return cast(RecordingNotifier, rt.notifier)


def _audit(db: Database, **filters: object) -> list[AuditLog]:
    with db.session() as session:
        return audit.entries(session, **filters)  # type: ignore[arg-type]


# --- extend -----------------------------------------------------------------------------------


def test_extend_by_owner_and_admin_is_audited(rt: Runtime, db: Database, clock: Clock) -> None:
    deadline = clock.now + timedelta(hours=1)
    inst_id = add_instance(db, name="box1", deadline_at=deadline)

    view = lifecycle.extend(rt, OWNER, "box1", timedelta(hours=2))
    assert view.deadline_at == deadline + timedelta(hours=2)
    view = lifecycle.extend(rt, ADMIN, "box1", timedelta(minutes=30))
    assert view.deadline_at == deadline + timedelta(hours=2, minutes=30)
    rows = _audit(db, instance_id=inst_id)
    assert [(r.actor, r.action) for r in rows] == [("UADMIN", "extend"), ("UOWNER", "extend")]
    assert audit.details(rows[1])["by_s"] == 7200


def test_extend_after_the_deadline_passed_counts_from_now(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    add_instance(db, name="box1", deadline_at=clock.now - timedelta(minutes=10))
    view = lifecycle.extend(rt, OWNER, "box1", timedelta(hours=1))
    assert view.deadline_at == clock.now + timedelta(hours=1)


def test_extend_by_someone_else_is_refused_and_changes_nothing(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    deadline = clock.now + timedelta(hours=1)
    add_instance(db, name="box1", deadline_at=deadline)
    with pytest.raises(NotAuthorized, match="Only <@UOWNER>"):
        lifecycle.extend(rt, OTHER, "box1", timedelta(hours=2))
    [inst] = rows(db, Instance)
    assert inst.deadline_at == deadline
    assert rows(db, AuditLog) == []


def test_only_an_admin_extends_past_the_lifetime_cap(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    deadline = clock.now + timedelta(hours=1)
    cap = clock.now + timedelta(hours=2)
    add_instance(db, name="box1", deadline_at=deadline, lifetime_cap_at=cap)
    with pytest.raises(NotAuthorized, match="at most") as info:
        lifecycle.extend(rt, OWNER, "box1", timedelta(hours=2))
    assert "admin" in info.value.hint
    assert rows(db, Instance)[0].deadline_at == deadline
    assert lifecycle.extend(rt, OWNER, "box1", timedelta(hours=1)).deadline_at == cap
    view = lifecycle.extend(rt, ADMIN, "box1", timedelta(hours=5))
    assert view.deadline_at == cap + timedelta(hours=5)
    [last, _] = _audit(db, action="extend")
    assert audit.details(last)["past_cap"] is True


def test_the_lifetime_cap_refusal_shows_the_cap_as_every_message_does(db: Database) -> None:
    """In the workspace's zone and the speaker's language, not a bare UTC stamp."""
    rt = make_runtime(db, Clock(), timezone="Europe/Berlin")
    cap = T0 + timedelta(hours=2)
    add_instance(db, name="box1", deadline_at=T0 + timedelta(hours=1), lifetime_cap_at=cap)
    with pytest.raises(NotAuthorized) as info:
        lifecycle.extend(rt, OWNER, "box1", timedelta(hours=2))
    assert info.value.message.startswith("box1 may run until Wed 02 Dec 15:00 CET at most")
    with speaking("zh"), pytest.raises(NotAuthorized) as info:
        lifecycle.extend(rt, OWNER, "box1", timedelta(hours=2))
    assert info.value.message.startswith("box1 最多只能运行到 12月02日 周三 15:00 CET")


def test_past_a_used_up_budget_only_an_admin_extends(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    deadline = clock.now + timedelta(hours=4)
    add_instance(db, name="box1", project="llm", created_at=clock.now, deadline_at=deadline)
    budgets.set_budget(rt, ADMIN, "project", "llm", 4_000_000)  # two hours at $2.10/h
    extended = lifecycle.extend(rt, OWNER, "box1", timedelta(hours=1))
    assert extended.deadline_at == deadline + timedelta(hours=1)
    clock.advance(hours=2)
    with pytest.raises(BudgetExceeded, match="project llm is used up") as info:
        lifecycle.extend(rt, OWNER, "box1", timedelta(hours=1))
    assert "admin" in info.value.hint
    assert rows(db, Instance)[0].deadline_at == deadline + timedelta(hours=1)
    assert len(_audit(db, action="extend")) == 1
    # Someone else still hears that they may not, not about the budget.
    with pytest.raises(NotAuthorized, match="Only <@UOWNER>"):
        lifecycle.extend(rt, OTHER, "box1", timedelta(hours=1))
    view = lifecycle.extend(rt, ADMIN, "box1", timedelta(hours=1))
    assert view.deadline_at == deadline + timedelta(hours=2)


def test_extend_odd_cases(rt: Runtime, db: Database, clock: Clock) -> None:
    add_instance(db, name="box1", state="releasing", deadline_at=clock.now)
    add_instance(db, name="old", state="released")
    with pytest.raises(Conflict, match="releasing"):
        lifecycle.extend(rt, OWNER, "box1", timedelta(hours=1))
    with pytest.raises(NotFound):
        lifecycle.extend(rt, OWNER, "old", timedelta(hours=1))
    with pytest.raises(UsageError):
        lifecycle.extend(rt, OWNER, "box1", timedelta(0))


# --- release ----------------------------------------------------------------------------------


def test_ask_release_changes_nothing_and_needs_owner_or_admin(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    add_instance(db, name="box1", created_at=clock.now - timedelta(hours=2))
    with pytest.raises(NotAuthorized):
        lifecycle.ask_release(rt, OTHER, "box1")
    ask = lifecycle.ask_release(rt, OWNER, "box1")
    assert ask.manual
    assert ask.cost_micros == 4_200_000
    assert lifecycle.ask_release(rt, ADMIN, "box1").instance.name == "box1"
    assert rows(db, Release) == []
    assert rows(db, Instance)[0].state == "active"


def test_release_of_a_manual_instance_waits_for_the_owner(
    rt: Runtime, db: Database, clock: Clock, notifier: RecordingNotifier
) -> None:
    inst_id = add_instance(db, name="box1", created_at=clock.now - timedelta(hours=1))
    with pytest.raises(NotAuthorized):
        lifecycle.release(rt, OTHER, inst_id)
    assert rows(db, Release) == []

    view = lifecycle.release(rt, OWNER, inst_id)
    assert view.manual
    assert view.state == "awaiting_owner"
    asked = notifier.to("UOWNER")
    assert asked
    assert "instance_release_done" in asked[-1].action_ids()
    assert rows(db, Instance)[0].released_at is None  # the meter still runs

    clock.advance(minutes=20)
    with pytest.raises(NotAuthorized):
        lifecycle.confirm_released(rt, OTHER, inst_id)
    done = lifecycle.confirm_released(rt, OWNER, inst_id)
    assert done.state == "confirmed"
    [inst] = rows(db, Instance)
    assert (inst.state, inst.released_at) == ("released", clock.now)
    again = lifecycle.confirm_released(rt, OWNER, inst_id)  # a second click changes nothing
    assert again.release_id == done.release_id
    actions = [r.action for r in rows(db, AuditLog)]
    assert actions.count("release_confirmed") == 1
    with pytest.raises(Conflict, match="already released"):
        lifecycle.release(rt, OWNER, inst_id)


def test_release_of_an_unknown_instance_is_not_found(rt: Runtime) -> None:
    with pytest.raises(NotFound):
        lifecycle.release(rt, OWNER, 999)
    with pytest.raises(NotFound):
        lifecycle.ask_release(rt, OWNER, "nope")
