"""The same money shows the same figure everywhere at the same clock time: `/gpu status`
(since registered), `/gpu spend` and budgets (this month so far), and each says what it is."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from bot.blocks import instances as instance_blocks
from bot.blocks import money
from bot.services.access import Caller
from bot.services.instances import fleet_views, lifecycle
from bot.services.money import budgets, costs, spend
from bot.store.db import Database
from bot.store.models import Person
from tests.bot.services.support import (
    Clock,
    NoFleet,
    RecordingNotifier,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)

ADMIN = Caller("UADMIN", "COPS")
OWNER = Caller("UOWNER", "COPS")
USD = 1_000_000
START = datetime(2026, 12, 2, 12, 0)
UTC = ZoneInfo("UTC")


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


def _spend(db: Database, clock: Clock, by: str = "user") -> spend.SpendReport:
    return spend.spend_report(
        db,
        "2026-12",
        by=by,
        tz=UTC,
        now=clock.now,
        idle_threshold_pct=5.0,
        currency="USD",
    )


def test_status_spend_and_budgets_show_one_figure(db: Database, clock: Clock) -> None:
    rt = make_runtime(db, clock)
    add_instance(
        db, name="box", owner_id="UOWNER", project="llm", price_micros=2_100_000, created_at=START
    )
    budgets.set_budget(rt, ADMIN, "project", "llm", 100 * USD)
    budgets.set_budget(rt, ADMIN, "user", "UOWNER", 100 * USD)
    clock.set(datetime(2026, 12, 2, 14, 25))  # 2h25m at $2.10/h: $5.075 (charged: 2 h, $4.20)
    status = fleet_views.list_instances(rt).rows[0].cost_micros
    report = _spend(db, clock)
    by_project = _spend(db, clock, by="project")
    spent = {s.subject: s.spent_micros for s in budgets.list_budgets(rt, clock.now)}
    assert status == 5_075_000
    assert report.total_micros == status
    assert report.groups[0].total_micros == status
    assert by_project.groups[0].total_micros == status
    assert spent == {"UOWNER": status, "llm": status}
    # What is not charged yet is shown as such, with where the charges end.
    assert report.pending_micros == 5_075_000 - 4_200_000
    assert report.charged_until == datetime(2026, 12, 2, 14, 0)
    text = str(money.spend_message(report))
    assert "this month so far, to 14:25" in text
    assert "Charged up to 14:00" in text
    assert "not yet charged $0.88" in text
    listing = str(money.budget_list_message([], "2026-12", "USD"))
    assert "No budgets" in listing
    statuses = budgets.list_budgets(rt, clock.now)
    shown = str(money.budget_list_message(statuses, "2026-12", "USD", now=clock.now))
    assert "this month so far, to 14:25" in shown
    fleet = str(instance_blocks.instance_list(fleet_views.list_instances(rt)))
    assert "$5.08 so far (since registered)" in fleet


def test_a_release_says_its_final_cost_and_spend_agrees(db: Database, clock: Clock) -> None:
    notifier = RecordingNotifier()
    rt = make_runtime(db, clock, providers=[ScriptedPlatform()], notifier=notifier, fleet=NoFleet())
    instance_id = add_instance(
        db,
        name="hourly",
        owner_id="UOWNER",
        provider="scripted",
        provider_instance_id="i-1",
        price_micros=2 * USD,
        billing_increment="hour",
        created_at=START,
    )
    clock.set(datetime(2026, 12, 2, 13, 10))  # 1h10m on an hourly platform: billed as 2 h
    view = lifecycle.release(rt, OWNER, instance_id)
    assert view.state == "confirmed"
    assert view.final_cost is not None
    text, _ = instance_blocks.release_result(view)
    assert "It cost $4.00: 1h10m billed as 2 h at $2.00/h." in text
    # The notice the owner gets on its own says the same.
    said = [p.text for p in notifier.to("UOWNER") if "is released" in p.text]
    assert said
    assert "It cost $4.00: 1h10m billed as 2 h at $2.00/h." in said[-1]
    # And the month's spend and budgets count what the release cost.
    clock.set(datetime(2026, 12, 2, 15, 0))
    assert _spend(db, clock).total_micros == 4 * USD
    assert budgets.month_to_date(db, clock.now, UTC).of("user", "UOWNER") == 4 * USD


def test_final_cost_of_a_running_instance_is_unknown(db: Database, clock: Clock) -> None:
    instance_id = add_instance(db, name="running", created_at=START)
    assert costs.final_cost(get_instance(db, instance_id)) is None


def test_the_csv_names_people_and_opens_in_excel(db: Database, clock: Clock) -> None:
    add_instance(db, name="box", owner_id="UOWNER", price_micros=USD, created_at=START)
    with db.session() as session:
        person = session.get(Person, "UOWNER")
        assert person is not None
        person.display_name = "王小明"
        session.add(person)
    clock.set(datetime(2026, 12, 2, 15, 0))
    data = spend.spend_csv(_spend(db, clock))
    assert data.startswith(b"\xef\xbb\xbf")  # UTF-8 byte order mark
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))
    assert [(r["owner"], r["owner_name"], r["total_USD"]) for r in rows] == [
        ("UOWNER", "王小明", "3.000000")
    ]
