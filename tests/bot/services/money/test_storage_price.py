"""A storage price given mid-month (`/gpu policy NAME --disk --storage`): the charges written
before it keep their price, the ledger and the month's summary add up to the instance's cost,
and a price set meanwhile by someone else (another process, another person) is never written
over with a carry computed from what was read before it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlalchemy import update as sa_update
from sqlmodel import select

from bot import billing
from bot.errors import Conflict
from bot.providers.registry import platform_billing
from bot.services.access import Caller
from bot.services.instances import registration
from bot.services.money import ledger
from bot.store.db import Database
from bot.store.models import AuditLog, Charge, Instance, SpendDay
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime
from tests.fixtures.store import fresh_database

pytestmark = pytest.mark.integration

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
#: $0.10 per GB-month, $0.20 per GB-month (micros).
DIME, TWO_DIMES = 100_000, 200_000


def _charged(db: Database, instance_id: int) -> list[tuple[str, Any, int]]:
    with db.session() as session:
        rows = session.exec(
            select(Charge).where(Charge.instance_id == instance_id).order_by(Charge.start_at)
        ).all()
        return [(row.kind, row.start_at, row.amount_micros) for row in rows]


def _summed(db: Database, instance_id: int, month: str) -> int:
    with db.session() as session:
        total = session.exec(
            select(func.sum(SpendDay.compute_micros + SpendDay.other_micros)).where(
                SpendDay.instance_id == instance_id, SpendDay.month == month
            )
        ).one()
        return int(total or 0)


def test_a_storage_price_mid_month_reprices_nothing_already_charged(db: Database) -> None:
    """730 GB at $0.10/GB-month ($0.10/h) for 3 hours, charged and summed up; then $0.20 from
    now on: the three hours keep their $0.30, the hours after cost $0.20 each, and the charges,
    the month's summary and the instance's cost agree to the micro."""
    clock = Clock(T0)
    rt = make_runtime(db, clock)
    tz = rt.settings.tz()
    month = ledger.month_of(T0, tz)
    iid = add_instance(
        db, created_at=T0, price_micros=0, disk_gb=730.0, storage_micros_per_gb_month=DIME
    )
    ledger.build_summary(db, month, tz, rt.settings.idle_threshold_pct)
    ledger.accrue(db, T0 + timedelta(hours=3), tz)
    before = _charged(db, iid)
    assert sum(amount for _, _, amount in before) == 300_000

    clock.advance(hours=3, minutes=30)
    registration.set_storage(rt, OWNER, "box", storage_micros_per_gb_month=TWO_DIMES)
    assert _charged(db, iid)[: len(before)] == before  # nothing written is repriced
    later = T0 + timedelta(hours=6)
    ledger.accrue(db, later, tz)
    rows = _charged(db, iid)
    total = sum(amount for _, _, amount in rows)
    assert total == 300_000 + 50_000 + 100_000 + 2 * 200_000
    inst = get_instance(db, iid)
    assert billing.cost_so_far(inst, platform_billing(inst.provider), later) == total
    assert _summed(db, iid, month) == total


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Database]:
    """PostgreSQL only: on SQLite every writer's transaction begins IMMEDIATE, so a write
    cannot land between another transaction's read and its write."""
    with fresh_database("postgresql", tmp_path) as database:
        yield database


def test_a_storage_price_set_meanwhile_is_not_written_over(
    pg: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two settings at once: the second commits its price after the first read the row; the
    first is refused (Conflict, nothing of it written) instead of writing its price with a
    carry computed from the row it read."""
    clock = Clock(T0 + timedelta(hours=2))
    rt = make_runtime(pg, clock)
    iid = add_instance(pg, created_at=T0, price_micros=0, disk_gb=730.0)
    real_close = ledger.close_charges
    raced: list[bool] = []

    def close_charges(session: Any, instance: Instance, at: Any, tz: Any) -> int:
        if not raced:
            raced.append(True)
            with pg.session() as other:  # another process, committed first
                other.exec(
                    sa_update(Instance)
                    .where(Instance.id == iid)  # type: ignore[arg-type]
                    .values(storage_micros_per_gb_month=TWO_DIMES, storage_carried_s=7200)
                )
        return real_close(session, instance, at, tz)

    monkeypatch.setattr(ledger, "close_charges", close_charges)
    with pytest.raises(Conflict, match="changed while its storage was being set"):
        registration.set_storage(rt, OWNER, "box", storage_micros_per_gb_month=DIME)
    inst = get_instance(pg, iid)
    assert (inst.storage_micros_per_gb_month, inst.storage_carried_s) == (TWO_DIMES, 7200)
    assert _charged(pg, iid) == []
    # Asked again, it applies over what is there now.
    registration.set_storage(rt, OWNER, "box", storage_micros_per_gb_month=DIME)
    assert get_instance(pg, iid).storage_micros_per_gb_month == DIME


def test_the_same_storage_price_again_changes_and_records_nothing(db: Database) -> None:
    rt = make_runtime(db, Clock(T0 + timedelta(hours=1)))
    iid = add_instance(db, created_at=T0, price_micros=0, disk_gb=730.0)
    registration.set_storage(rt, OWNER, "box", storage_micros_per_gb_month=DIME)
    carried = get_instance(db, iid).storage_carried_s
    rt.clock.advance(hours=1)  # type: ignore[attr-defined]
    registration.set_storage(rt, OWNER, "box", disk_gb=730.0, storage_micros_per_gb_month=DIME)
    assert get_instance(db, iid).storage_carried_s == carried
    with db.session() as session:
        actions = session.exec(select(AuditLog.action).where(AuditLog.instance_id == iid)).all()
    assert list(actions).count("storage") == 1
