"""Every command reads a person the same way: mention, member ID or @name."""

from __future__ import annotations

import logging

import pytest

from bot.errors import StoreError, UsageError
from bot.i18n import speaking
from bot.logging_setup import RepeatLimiter
from bot.services import access
from bot.services.access import Caller, parse_member_id
from bot.services.money import budgets
from bot.services.speaking import people
from bot.services.speaking.people import resolve_person
from bot.store.db import Database
from bot.store.models import Person
from tests.bot.services.support import Clock, make_runtime
from tests.chinese import assert_chinese


def _people(db: Database) -> None:
    with db.session() as session:
        session.add(Person(slack_id="U0ALICE", display_name="Alice"))
        session.add(Person(slack_id="U0SAM1", display_name="sam"))
        session.add(Person(slack_id="U0SAM2", display_name="Sam"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<@U0ALICE|alice>", ("U0ALICE", "alice")),
        ("<@U0ALICE>", ("U0ALICE", None)),
        ("U0ALICE", ("U0ALICE", None)),
        ("@U0ALICE", ("U0ALICE", None)),
        ("@alice", ("U0ALICE", "Alice")),
        (" @ALICE ", ("U0ALICE", "Alice")),
    ],
)
def test_a_person_arrives_in_every_form(sqlite_db: Database, text: str, expected: object) -> None:
    _people(sqlite_db)
    with sqlite_db.session() as session:
        assert resolve_person(session, text) == expected


def test_the_caller_is_known_by_their_own_name(sqlite_db: Database) -> None:
    me = Caller("U0ME", user_name="root-admin")
    with sqlite_db.session() as session:
        assert resolve_person(session, "@Root-Admin", caller=me) == ("U0ME", "root-admin")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("@bob", "I know nobody called @bob"),
        ("@sam", "I know 2 people called @sam"),
        ("bob", "not a Slack user's mention, ID or @name"),
        ("<#C123|general>", "not a Slack user's mention, ID or @name"),
        ("@", "not a Slack user's mention, ID or @name"),
        ("@" + "x" * 10_000, "not a Slack user's mention, ID or @name"),
    ],
)
def test_nobody_or_many_is_one_clear_answer(sqlite_db: Database, text: str, message: str) -> None:
    _people(sqlite_db)
    with sqlite_db.session() as session, pytest.raises(UsageError, match=message) as raised:
        resolve_person(session, text)
    assert "member ID" in (raised.value.hint or "")
    assert len(raised.value.message) < 300


@pytest.mark.parametrize("text", ["@bob", "@sam", "bob"])
def test_nobody_or_many_is_said_in_the_callers_language(sqlite_db: Database, text: str) -> None:
    _people(sqlite_db)
    with (
        speaking("zh"),
        sqlite_db.session() as session,
        pytest.raises(UsageError) as raised,
    ):
        resolve_person(session, text)
    assert_chinese(raised.value.message)
    assert_chinese(raised.value.hint or "")


@pytest.mark.parametrize(
    "text",
    ["U012AB3CD", "W0ADMIN", "UAB", " U0ALICE ", "U1", "UA", "u012ab3cd", "U0Ä", "U" + "A" * 70],
)
def test_a_member_id_is_read_by_one_rule_for_budgets_and_people(
    sqlite_db: Database, text: str
) -> None:
    """A bare ID a budget takes is one every other command takes, and the other way round."""
    member_id = parse_member_id(text)
    if member_id is None:
        with pytest.raises(UsageError):
            budgets.parse_subject("user", text)
        with sqlite_db.session() as session, pytest.raises(UsageError):
            resolve_person(session, text)
        return
    assert member_id == text.strip()
    assert budgets.parse_subject("user", text) == member_id
    with sqlite_db.session() as session:
        assert resolve_person(session, text) == (member_id, None)
    assert access.parse_mention(f"<@{member_id}|x>") == (member_id, "x")


def test_the_member_id_rule() -> None:
    assert parse_member_id("@U012AB3CD") == "U012AB3CD"
    assert parse_member_id("W0ADMIN") == "W0ADMIN"
    for wrong in ("U1", "UA", "u012ab3cd", "@alice", "C0123ABC", "U0Ä", "U" + "A" * 64, "U0 A"):
        assert parse_member_id(wrong) is None, wrong


def test_a_store_that_fails_logs_the_language_reads_once_a_minute(
    sqlite_db: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime(sqlite_db, Clock(), language="zh")
    monkeypatch.setattr(people, "LANGUAGE_READS", RepeatLimiter())
    seconds = iter([0.0, 1.0, 2.0, 61.0, 62.0])
    monkeypatch.setattr(people.time, "monotonic", lambda: next(seconds))

    def broken() -> object:
        raise StoreError("the store is down")

    monkeypatch.setattr(rt.db, "session", broken)
    caplog.set_level(logging.WARNING, logger=people.__name__)
    assert [people.language_for(rt, f"U{n}") for n in range(5)] == ["zh"] * 5
    lines = [r for r in caplog.records if r.name == people.__name__]
    assert [bool(r.exc_info) for r in lines] == [True, False]  # a traceback once, then a count
    assert "3 times in the last 61 s" in lines[1].getMessage()
