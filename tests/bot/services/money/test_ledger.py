"""The ledger on real SQLite and PostgreSQL: hourly buckets, final rounding, idempotence."""

from __future__ import annotations

import itertools
import threading
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlmodel import col, select

from bot import billing
from bot.providers.registry import platform_billing
from bot.services.money import ledger
from bot.store.db import Database
from bot.store.models import Charge, Instance, Person

UTC_TZ = ZoneInfo("UTC")
USD = 1_000_000


_PORTS = itertools.count(22_000)


def add_instance(db: Database, **fields: object) -> int:
    """A person and an instance (a machine of its own); returns the instance id."""
    values: dict[str, object] = {
        "name": "box",
        "owner_id": "U1",
        "host": "10.0.0.1",
        "port": next(_PORTS),
        "ssh_user": "ubuntu",
        "state": "active",
        "price_micros": 3_600_000,
    }
    values.update(fields)
    with db.session() as session:
        if session.get(Person, str(values["owner_id"])) is None:
            session.add(Person(slack_id=str(values["owner_id"])))
            session.flush()
        instance = Instance(**values)
        session.add(instance)
        session.flush()
        assert instance.id is not None
        return instance.id


def update_instance(db: Database, instance_id: int, **fields: object) -> None:
    with db.session() as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        for name, value in fields.items():
            setattr(instance, name, value)


def charges(db: Database, instance_id: int, kind: str = "compute") -> list[Charge]:
    with db.session() as session:
        return list(
            session.exec(
                select(Charge)
                .where(Charge.instance_id == instance_id, Charge.kind == kind)
                .order_by(col(Charge.start_at), col(Charge.id))
            )
        )


def spans(rows: list[Charge]) -> list[tuple[str, str, int]]:
    return [
        (r.start_at.strftime("%d %H:%M"), r.end_at.strftime("%d %H:%M"), r.amount_micros)
        for r in rows
    ]


def test_running_instance_is_charged_for_complete_hours_only(db: Database) -> None:
    start = datetime(2026, 3, 10, 10, 20)
    instance_id = add_instance(db, created_at=start)  # $3.60/h = 1000 micros per second
    assert ledger.accrue(db, datetime(2026, 3, 10, 13, 5), UTC_TZ) == 3
    assert spans(charges(db, instance_id)) == [
        ("10 10:20", "10 11:00", 2_400_000),
        ("10 11:00", "10 12:00", 3_600_000),
        ("10 12:00", "10 13:00", 3_600_000),
    ]
    # Running again, or again later within the same hour, charges nothing twice.
    assert ledger.accrue(db, datetime(2026, 3, 10, 13, 5), UTC_TZ) == 0
    assert ledger.accrue(db, datetime(2026, 3, 10, 13, 59), UTC_TZ) == 0
    assert [r.billed_s for r in charges(db, instance_id)] == [2400, 3600, 3600]


def test_release_finalises_the_last_bucket_with_the_session_rounding(db: Database) -> None:
    """Hourly increment: 10:30 to 12:10 is 1h40m, billed as 2 h; the last bucket takes the rest."""
    start = datetime(2026, 3, 10, 10, 30)
    instance_id = add_instance(
        db, created_at=start, provider="manual", billing_increment="hour", price_micros=2 * USD
    )
    ledger.accrue(db, datetime(2026, 3, 10, 12, 5), UTC_TZ)
    assert spans(charges(db, instance_id)) == [
        ("10 10:30", "10 11:00", 1 * USD),
        ("10 11:00", "10 12:00", 2 * USD),
    ]
    released = datetime(2026, 3, 10, 12, 10)
    update_instance(db, instance_id, released_at=released, state="released")
    assert ledger.accrue_instance(db, instance_id, datetime(2026, 3, 10, 12, 11), UTC_TZ) == 1
    rows = charges(db, instance_id)
    assert spans(rows)[-1] == ("10 12:00", "10 12:10", 1 * USD)
    assert rows[-1].billed_s == 7200 - 5400
    assert sum(r.amount_micros for r in rows) == 4 * USD
    with db.session() as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        assert (
            billing.cost_so_far(instance, platform_billing(instance.provider), released) == 4 * USD
        )
    assert ledger.accrue(db, datetime(2026, 3, 12), UTC_TZ) == 0


def test_release_on_a_boundary_already_charged_adds_an_adjustment(db: Database) -> None:
    start = datetime(2026, 3, 10, 10, 30)
    instance_id = add_instance(
        db, created_at=start, provider="manual", billing_increment="hour", price_micros=2 * USD
    )
    ledger.accrue(db, datetime(2026, 3, 10, 12, 0, 5), UTC_TZ)
    update_instance(db, instance_id, released_at=datetime(2026, 3, 10, 12, 0), state="released")
    ledger.accrue(db, datetime(2026, 3, 10, 12, 1), UTC_TZ)
    rows = charges(db, instance_id)
    assert spans(rows)[-1] == ("10 12:00", "10 12:00", 1 * USD)
    assert sum(r.amount_micros for r in rows) == 4 * USD
    assert ledger.accrue(db, datetime(2026, 3, 10, 14), UTC_TZ) == 0


def test_aws_minimum_lands_in_the_only_bucket(db: Database) -> None:
    start = datetime(2026, 3, 10, 10, 0)
    instance_id = add_instance(db, created_at=start, provider="aws")
    update_instance(db, instance_id, stopped_at=start + timedelta(seconds=20), release_mode="stop")
    ledger.accrue(db, start + timedelta(minutes=5), UTC_TZ)
    rows = charges(db, instance_id)
    assert [(r.billed_s, r.amount_micros) for r in rows] == [(60, 60_000)]


def test_month_boundary_splits_buckets_in_the_configured_zone(db: Database) -> None:
    """Asia/Kolkata is UTC+5:30: its February starts at 18:30 UTC on 31 January."""
    kolkata = ZoneInfo("Asia/Kolkata")
    instance_id = add_instance(db, created_at=datetime(2026, 1, 31, 18, 0))
    ledger.accrue(db, datetime(2026, 1, 31, 20, 10), kolkata)
    assert spans(charges(db, instance_id)) == [
        ("31 18:00", "31 18:30", 1_800_000),
        ("31 18:30", "31 19:00", 1_800_000),
        ("31 19:00", "31 20:00", 3_600_000),
    ]
    jan_start, jan_end = ledger.month_bounds("2026-01", kolkata)
    assert jan_end == datetime(2026, 1, 31, 18, 30)
    assert jan_start == datetime(2025, 12, 31, 18, 30)
    assert ledger.month_of(datetime(2026, 1, 31, 18, 30), kolkata) == "2026-02"


def test_month_boundary_in_utc(db: Database) -> None:
    instance_id = add_instance(db, created_at=datetime(2026, 1, 31, 23, 30))
    update_instance(db, instance_id, released_at=datetime(2026, 2, 1, 0, 45), state="released")
    ledger.accrue(db, datetime(2026, 2, 1, 1, 0), UTC_TZ)
    rows = charges(db, instance_id)
    assert spans(rows) == [("31 23:30", "01 00:00", 1_800_000), ("01 00:00", "01 00:45", 2_700_000)]


def test_stop_then_storage_only(db: Database) -> None:
    """Compute ends at the stop; the disk keeps billing every hour until it is deleted."""
    start = datetime(2026, 3, 10, 10, 0)
    instance_id = add_instance(
        db,
        created_at=start,
        provider="runpod",
        disk_gb=730,
        storage_micros_per_gb_month=10_000,  # 730 GB at $0.01/GB-month: 1 cent an hour
    )
    update_instance(db, instance_id, stopped_at=start + timedelta(hours=2), release_mode="stop")
    ledger.accrue(db, start + timedelta(hours=5, minutes=30), UTC_TZ)
    assert sum(r.amount_micros for r in charges(db, instance_id)) == 7_200_000
    storage = charges(db, instance_id, "storage")
    assert [r.amount_micros for r in storage] == [10_000] * 5
    update_instance(db, instance_id, storage_deleted_at=start + timedelta(hours=6, minutes=30))
    ledger.accrue(db, start + timedelta(hours=9), UTC_TZ)
    storage = charges(db, instance_id, "storage")
    assert [r.amount_micros for r in storage][-2:] == [10_000, 5_000]
    assert storage[-1].end_at == start + timedelta(hours=6, minutes=30)
    assert ledger.accrue(db, start + timedelta(days=3), UTC_TZ) == 0


def test_ssh_ready_instance_is_not_charged_before_it_is_ready(db: Database) -> None:
    start = datetime(2026, 3, 10, 10, 0)
    instance_id = add_instance(db, created_at=start, provider="lambda", price_micros=1_200_000)
    assert ledger.accrue(db, start + timedelta(hours=3), UTC_TZ) == 0
    update_instance(db, instance_id, ssh_ready_at=start + timedelta(hours=2, minutes=50))
    ledger.accrue(db, start + timedelta(hours=4, minutes=1), UTC_TZ)
    assert spans(charges(db, instance_id)) == [
        ("10 12:50", "10 13:00", 200_000),
        ("10 13:00", "10 14:00", 1_200_000),
    ]


def test_concurrent_runs_and_a_restart_never_charge_twice(db: Database) -> None:
    start = datetime(2026, 3, 10, 0, 0)
    ids = [add_instance(db, name=f"box{i}", created_at=start) for i in range(4)]
    now = start + timedelta(hours=6, minutes=30)
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            # Each thread is a separate bot process with its own engine on the same database.
            other = Database(db.url.render_as_string(hide_password=False))
            try:
                barrier.wait(timeout=10)
                ledger.accrue(other, now, UTC_TZ)
            finally:
                other.dispose()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    ledger.accrue(db, now, UTC_TZ)  # anything a losing process skipped is written now
    for instance_id in ids:
        rows = charges(db, instance_id)
        assert len(rows) == 6
        assert sum(r.amount_micros for r in rows) == 6 * 3_600_000
        assert len({r.start_at for r in rows}) == 6


def test_plan_is_pure_and_continues_from_the_last_charge() -> None:
    start = datetime(2026, 3, 10, 10, 0)
    instance = Instance(
        name="box", owner_id="U1", host="h", ssh_user="u", created_at=start, price_micros=3_600_000
    )
    state = ledger.KindState(
        last_end_at=start + timedelta(hours=2), charged_micros=7_200_000, billed_s=7200
    )
    planned = ledger.plan_charges(instance, {"compute": state}, start + timedelta(hours=3), UTC_TZ)
    assert [(p.start_at.hour, p.end_at.hour, p.amount_micros) for p in planned] == [
        (12, 13, 3_600_000)
    ]


def test_month_helpers() -> None:
    assert ledger.previous_month("2026-01") == "2025-12"
    assert ledger.next_month("2026-12") == "2027-01"
    assert ledger.month_bounds("2026-02", UTC_TZ) == (datetime(2026, 2, 1), datetime(2026, 3, 1))
    for bad in ("2026-13", "26-01", "2026/01", "2026-1", "abc"):
        try:
            ledger.parse_month(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


def _restart(db: Database, instance_id: int, at: datetime) -> None:
    """What reconcile stores when a stopped instance runs again at ``at``."""
    with db.session() as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        for name, value in billing.restart(
            instance, platform_billing(instance.provider), at
        ).items():
            setattr(instance, name, value)


def test_every_start_is_a_session_and_stopped_time_is_charged_nothing(db: Database) -> None:
    """AWS, $3.60/h and 60 s minimum per start: 20 s, then 30m10s, then 5 s, each a session;
    the hours it stood stopped carry no compute and no billed seconds."""
    start = datetime(2026, 3, 10, 10, 0)
    instance_id = add_instance(db, created_at=start, provider="aws")
    update_instance(db, instance_id, stopped_at=start + timedelta(seconds=20), release_mode="stop")
    ledger.accrue(db, start + timedelta(minutes=5), UTC_TZ)
    _restart(db, instance_id, datetime(2026, 3, 10, 11, 30))
    ledger.accrue(db, datetime(2026, 3, 10, 12, 0, 5), UTC_TZ)
    update_instance(db, instance_id, stopped_at=datetime(2026, 3, 10, 12, 0, 10))
    ledger.accrue_instance(db, instance_id, datetime(2026, 3, 10, 12, 30), UTC_TZ)
    _restart(db, instance_id, datetime(2026, 3, 10, 13, 0))
    released = datetime(2026, 3, 10, 13, 0, 5)
    update_instance(db, instance_id, released_at=released, state="released")
    ledger.accrue(db, datetime(2026, 3, 10, 13, 1), UTC_TZ)
    rows = charges(db, instance_id)
    assert [(r.start_at.strftime("%H:%M:%S"), r.billed_s, r.amount_micros) for r in rows] == [
        ("10:00:00", 60, 60_000),  # the first start's minimum
        ("10:00:20", 0, 0),  # stopped
        ("11:00:00", 1800, 1_800_000),  # from the restart at 11:30
        ("12:00:00", 10, 10_000),  # stopped at 12:00:10
        ("12:00:10", 0, 0),  # stopped
        ("13:00:00", 60, 60_000),  # 5 s run, billed as the minimum of its start
    ]
    with db.session() as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        assert billing.cost_so_far(instance, platform_billing(instance.provider), released) == sum(
            r.amount_micros for r in rows
        )
    assert ledger.accrue(db, datetime(2026, 3, 11), UTC_TZ) == 0
