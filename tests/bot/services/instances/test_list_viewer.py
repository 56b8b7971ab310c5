"""`/gpu list` for one person: theirs in full, the team in bounded figures, the others a page
at a time; through the real parser and renderer, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert
from sqlmodel import select

from bot.blocks import instance_list as list_blocks
from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import fleet_views
from bot.store.db import Database
from bot.store.models import Instance, Person
from tests.bot.blocks.slack_limits import check_message
from tests.bot.services.support import T0, Clock, add_instance, counting_statements, make_runtime
from tests.chinese import assert_chinese

REGISTRY = build_registry()
ALICE = Caller(user_id="UALICE", channel_id="CTEAM")
ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")
NOW = T0 + timedelta(hours=1)


def _run(rt: Runtime, text: str, caller: Caller) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, caller, args)


def _team(db: Database, size: int, *, mine: int = 3, start: int = 0) -> None:
    """``size`` live instances named ``box00000``…, the first ``mine`` of them Alice's, the
    others each of one of seven people; every one with a deadline, one in ten stopped."""
    people = ["UALICE", *(f"U{n:04d}" for n in range(7))]
    rows: list[dict[str, Any]] = []
    for i in range(start, start + size):
        stopped = i % 10 == 9
        rows.append(
            {
                "name": f"box{i:05d}",
                "owner_id": "UALICE" if i < mine else people[1 + i % 7],
                "state": "stopped" if stopped else "active",
                "host": f"10.0.{i // 256}.{i % 256}",
                "port": 22,
                "ssh_user": "root",
                "price_micros": 1_000_000 + (i % 3) * 500_000,
                "gpu_model": "A100",
                "gpu_count": 1,
                "created_at": T0,
                "stopped_at": T0 if stopped else None,
                "deadline_at": NOW + timedelta(minutes=10 + (i * 37) % 500),
            }
        )
    with db.session() as session:
        known = set(session.exec(select(Person.slack_id)).all())
        new = [{"slack_id": p} for p in people if p not in known]
        if new:
            session.execute(insert(Person), new)
        session.execute(insert(Instance), rows)


def _names(text: str) -> list[str]:
    return re.findall(r"\*(box\d{5})\*", text)


def test_my_instances_in_full_and_the_team_in_figures(db: Database) -> None:
    rt = make_runtime(db, Clock(NOW))
    _team(db, 40, mine=3)
    add_instance(db, name="gone", owner_id="UALICE", state="released", released_at=T0)

    reply = _run(rt, "list", ALICE)

    blocks = check_message((reply.text, tuple(reply.blocks or ())))
    shown = str(blocks)
    mine_part, team_part = shown.split("'divider'", 1)
    assert _names(mine_part) == ["box00000", "box00001", "box00002"]
    assert "gone" not in shown
    assert "so far (since registered)" in mine_part  # in full: what each cost so far
    assert "40 instances" in team_part
    assert "active: 36" in team_part
    assert "stopped: 4" in team_part
    view = fleet_views.viewer_list(rt, "UALICE", paged=False)
    assert view.summary.burn_micros_per_hour > 0
    assert len(view.summary.nearest) == fleet_views.LIST_NEAREST
    nearest = [item.name for item in view.summary.nearest]
    assert _names(team_part) == nearest  # the nearest deadlines, nobody else's lines
    assert "<@U0000>" in team_part or "<@U0001>" in team_part
    assert "37 more instances are other people's; `/gpu list --all`" in team_part
    assert "Instances: 3 of yours; the team has 40" in reply.text


def test_pages_of_all_cover_every_instance_exactly_once(db: Database) -> None:
    rt = make_runtime(db, Clock(NOW))
    _team(db, 2 * fleet_views.LIST_PAGE_SIZE + 7, mine=4)
    first = _run(rt, "list --all", ALICE)
    assert "Page 1 of 3; `/gpu list --all --page 2` for more." in str(first.blocks)
    assert str(first.blocks) == str(_run(rt, "list --all --page 1", ALICE).blocks)
    for page in (1, 2, 3):
        shown = str(_run(rt, f"list --all --page {page}", ALICE).blocks)
        lines = fleet_views.viewer_list(rt, "UALICE", paged=True, page=page).others
        assert set(_names(shown)) >= {line.name for line in lines}
    assert "Page 3 of 3." in shown
    view = fleet_views.viewer_list(rt, "UALICE", paged=True, page=4)
    assert view.others == ()
    everyone = [f"box{i:05d}" for i in range(2 * fleet_views.LIST_PAGE_SIZE + 7)]
    paged = [
        line.name
        for page in (1, 2, 3)
        for line in fleet_views.viewer_list(rt, "UALICE", paged=True, page=page).others
    ]
    mine = [row.instance.name for row in fleet_views.viewer_list(rt, "UALICE", paged=False).mine]
    assert sorted(mine + paged) == everyone  # each exactly once
    assert len(set(mine + paged)) == len(everyone)


def test_an_admin_sees_the_first_page_unasked(db: Database) -> None:
    rt = make_runtime(db, Clock(NOW))
    _team(db, 12, mine=0)
    shown = str(_run(rt, "list", ADMIN).blocks)
    assert "You have no instances." in shown
    assert "Page 1 of 1." in shown
    member = str(_run(rt, "list", ALICE).blocks)
    assert "Page 1" not in member
    assert "12 more instances are other people's" in member


def test_the_team_part_costs_the_same_statements_for_10_or_250(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(NOW))
    _team(sqlite_db, 10, mine=3)
    fleet_views.viewer_list(rt, "UALICE", paged=True)
    with counting_statements(sqlite_db) as small:
        small_view = fleet_views.viewer_list(rt, "UALICE", paged=True)
    _team(sqlite_db, 240, mine=0, start=10)
    with counting_statements(sqlite_db) as large:
        large_view = fleet_views.viewer_list(rt, "UALICE", paged=True)
    assert large_view.summary.count == 250
    assert len(large_view.mine) == len(small_view.mine) == 3
    assert len(large_view.others) == fleet_views.LIST_PAGE_SIZE
    assert len(large_view.summary.nearest) == len(small_view.summary.nearest)
    assert len(large) == len(small)
    for statement in large:  # every read is bounded: by owner, by page, or an aggregate
        if "FROM instance" in statement and "GROUP BY" not in statement:
            assert "LIMIT" in statement or "owner_id =" in statement or "IN (" in statement, (
                statement
            )


def test_the_list_in_chinese(db: Database) -> None:
    rt = make_runtime(db, Clock(NOW))
    _team(db, 2 * fleet_views.LIST_PAGE_SIZE, mine=2)
    with speaking("zh"):
        for text in ("list", "list --all", "list --all --page 2", "list --all --page 9"):
            reply = _run(rt, text, ALICE)
            assert_chinese(reply.text, list(reply.blocks or ()))
        empty = list_blocks.viewer_list(fleet_views.viewer_list(rt, "UNOBODY", paged=False))
        assert_chinese(empty[0], list(empty[1]))
    page_two = str(_run_zh(rt, "list --all --page 2").blocks)
    assert "第 2 页，共 2 页" in page_two  # noqa: RUF001


def _run_zh(rt: Runtime, text: str) -> Reply:
    with speaking("zh"):
        return _run(rt, text, ALICE)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_page_of_nothing_says_so(db: Database) -> None:
    rt = make_runtime(db, Clock(NOW))
    _team(db, 5, mine=5)
    shown = str(_run(rt, "list --all --page 3", ALICE).blocks)
    assert "Page 3 of 1: nobody else's instances here." in shown
