"""`/gpu allow` and `/gpu deny` services: owner or admin only, idempotent, audited, mentions
in every form Slack and the console send, bad input changes nothing."""

from __future__ import annotations

import pytest
from sqlmodel import select

from bot.errors import NotAuthorized, NotFound, UsageError
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances.lookup import get_live_instance
from bot.services.jobs import access as job_access
from bot.services.speaking import audit
from bot.store.db import Database
from bot.store.models import InstanceAccess, Person
from tests.bot.services.support import Clock, add_instance, make_runtime

OWNER = Caller("UOWNER", "C1")
ADMIN = Caller("UADMIN", "C1")
BOB = Caller("U0BOB", "C1")


@pytest.fixture
def rt(db: Database) -> Runtime:
    add_instance(db, name="box")
    return make_runtime(db, Clock())


def grants(rt: Runtime) -> list[tuple[str, str]]:
    with rt.db.session() as session:
        rows = session.exec(select(InstanceAccess)).all()
        return sorted((row.person_id, row.granted_by) for row in rows)


def audited(rt: Runtime) -> list[tuple[str, str, object]]:
    with rt.db.session() as session:
        rows = audit.entries(session)
        return [(r.actor, r.action, audit.details(r).get("person")) for r in reversed(rows)]


@pytest.mark.parametrize("typed", ["<@U0BOB|bob>", "<@U0BOB>", "U0BOB", "@U0BOB"])
def test_owner_allows_by_any_mention_form_and_the_person_may_operate(
    rt: Runtime, typed: str
) -> None:
    change = job_access.allow(rt, OWNER, "box", typed)
    assert (change.person_id, change.granted, change.changed) == ("U0BOB", True, True)
    assert change.allowed == ("U0BOB",)
    assert grants(rt) == [("U0BOB", "UOWNER")]
    assert audited(rt) == [("UOWNER", "access.allow", "U0BOB")]
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, "box")
        assert access.can_operate(rt, BOB, inst, session)


def test_allowing_twice_changes_and_audits_once(rt: Runtime) -> None:
    job_access.allow(rt, OWNER, "box", "<@U0BOB|bob>")
    again = job_access.allow(rt, ADMIN, "box", "U0BOB")
    assert again.changed is False
    assert grants(rt) == [("U0BOB", "UOWNER")]
    assert len(audited(rt)) == 1


def test_a_name_slack_sent_lets_people_write_at_name_later(rt: Runtime) -> None:
    job_access.allow(rt, OWNER, "box", "<@U0BOB|bob>")
    job_access.deny(rt, OWNER, "box", "@Bob")
    assert grants(rt) == []
    with rt.db.session() as session:
        person = session.get(Person, "U0BOB")
        assert person is not None
        assert person.display_name == "bob"


def test_deny_takes_access_back_and_is_audited(rt: Runtime) -> None:
    job_access.allow(rt, OWNER, "box", "U0BOB")
    job_access.allow(rt, OWNER, "box", "U0CAROL")
    change = job_access.deny(rt, ADMIN, "box", "<@U0BOB>")
    assert (change.granted, change.changed, change.allowed) == (False, True, ("U0CAROL",))
    assert audited(rt)[-1] == ("UADMIN", "access.deny", "U0BOB")
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, "box")
        assert not access.can_operate(rt, BOB, inst, session)
    assert job_access.deny(rt, OWNER, "box", "U0BOB").changed is False
    assert len(audited(rt)) == 3


@pytest.mark.parametrize(
    ("caller", "name", "person", "error", "message"),
    [
        (BOB, "box", "U0BOB", NotAuthorized, "Only <@UOWNER>"),
        (OWNER, "nosuch", "U0BOB", NotFound, "no instance called"),
        (OWNER, "box", "@nobody", UsageError, "don't know who"),
        (OWNER, "box", "bob", UsageError, "don't know who"),
        (OWNER, "box", "<#C123|general>", UsageError, "don't know who"),
        (OWNER, "box", "UOWNER", UsageError, "owns box"),
    ],
)
def test_bad_requests_change_nothing(
    rt: Runtime,
    caller: Caller,
    name: str,
    person: str,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        job_access.allow(rt, caller, name, person)
    with pytest.raises(error, match=message):
        job_access.deny(rt, caller, name, person)
    assert grants(rt) == []
    assert audited(rt) == []


def test_a_stranger_cannot_take_access_away(rt: Runtime) -> None:
    job_access.allow(rt, OWNER, "box", "U0CAROL")
    with pytest.raises(NotAuthorized):
        job_access.deny(rt, BOB, "box", "U0CAROL")
    assert grants(rt) == [("U0CAROL", "UOWNER")]
