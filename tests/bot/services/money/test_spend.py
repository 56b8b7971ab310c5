"""`/gpu spend` reports over the real ledger on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlmodel import col, select

from bot.errors import UsageError
from bot.services.money import ledger, samples, spend
from bot.store.db import Database
from bot.store.models import Charge, UtilSample
from tests.bot.services.money.test_ledger import add_instance, update_instance

UTC_TZ = ZoneInfo("UTC")
USD = 1_000_000


def add_samples(
    db: Database, instance_id: int, start: datetime, hours: int, **fields: object
) -> None:
    """A poll every 15 minutes for ``hours`` from ``start``, its GPUs judged as ``fields`` say
    (``gpus_idle``, ``gpus_busy``, ``gpus_unmeasured``)."""
    with db.session() as session:
        for quarter in range(hours * 4):
            values: dict[str, object] = {"ok": True, "util_avg_pct": 50.0}
            values.update(fields)
            samples.record(
                session,
                UtilSample(
                    instance_id=instance_id, at=start + timedelta(minutes=15 * quarter), **values
                ),
                UTC_TZ,
            )


@pytest.fixture
def fleet(db: Database) -> dict[str, int]:
    """March 2026: alice's H100 box ran 10 h (4 idle), bob's 4090 ran 5 h; both crossed into
    April; a February box is outside the month."""
    march = datetime(2026, 3, 5, 8, 0)
    ids = {
        "h100": add_instance(
            db,
            name="h100",
            owner_id="UALICE",
            project="llm",
            provider="lambda",
            gpu_model="h100-sxm",
            gpu_count=2,
            price_micros=4 * USD,
            price_per="gpu_hour",
            created_at=march,
            ssh_ready_at=march,
        ),
        "rtx": add_instance(
            db,
            name="rtx",
            owner_id="UBOB",
            provider="runpod",
            gpu_model="rtx-4090",
            price_micros=500_000,
            created_at=march,
            disk_gb=73,
            storage_micros_per_gb_month=100_000,  # $7.30/month -> 1 cent an hour
        ),
        "old": add_instance(
            db,
            name="old",
            owner_id="UBOB",
            price_micros=USD,
            created_at=datetime(2026, 2, 1),
        ),
    }
    update_instance(db, ids["h100"], released_at=march + timedelta(hours=10), state="released")
    update_instance(db, ids["rtx"], stopped_at=march + timedelta(hours=5), release_mode="stop")
    update_instance(db, ids["old"], released_at=datetime(2026, 2, 1, 3), state="released")
    add_samples(db, ids["h100"], march, 6, util_avg_pct=80.0, gpus_busy=2)
    add_samples(db, ids["h100"], march + timedelta(hours=6), 4, util_avg_pct=1.0, gpus_idle=2)
    # One failed poll among four idle ones in bob's first hour: a fifth of it is not measured.
    add_samples(db, ids["rtx"], march, 2, util_avg_pct=0.0, gpus_idle=1)
    with db.session() as session:
        samples.record(
            session,
            UtilSample(instance_id=ids["rtx"], at=march + timedelta(minutes=20), ok=False),
            UTC_TZ,
        )
    return ids


def report(db: Database, month: str = "2026-03", by: str = "user") -> spend.SpendReport:
    return spend.spend_report(
        db,
        month,
        by=by,
        tz=UTC_TZ,
        now=datetime(2026, 4, 2, 12, 0),
        idle_threshold_pct=5.0,
        currency="USD",
    )


def test_totals_idle_and_groups(db: Database, fleet: dict[str, int]) -> None:
    result = report(db)
    assert result.complete
    assert result.compute_micros == 10 * 8 * USD + 5 * 500_000
    # Bob's stopped 4090 keeps billing its disk until the end of March (from 08:00 on the 5th).
    storage_hours = (datetime(2026, 4, 1) - datetime(2026, 3, 5, 8)).total_seconds() / 3600
    assert result.storage_micros == round(storage_hours * 10_000)
    # Four idle hours on the H100 box; bob's hour with a failed poll is 4/5 idle and 1/5 not
    # measured, his second hour (all polls at 0%) idle, his last three (no poll) not measured.
    assert result.idle_micros == 4 * 8 * USD + 400_000 + 500_000
    assert result.unmeasured_micros == 100_000 + 3 * 500_000
    assert result.in_use_micros == 6 * 8 * USD
    assert [line.key for line in result.groups] == ["UALICE", "UBOB"]
    assert result.groups[0].total_micros == 80 * USD
    assert result.top(1)[0].name == "h100"
    assert [i.name for i in result.instances] == ["h100", "rtx"]


def test_group_by_each_dimension(db: Database, fleet: dict[str, int]) -> None:
    result = report(db, by="gpu")
    assert [line.key for line in result.groups] == ["2x h100-sxm", "rtx-4090"]
    assert [line.key for line in result.group("project")] == ["llm", spend.NO_PROJECT]
    assert [line.key for line in result.group("provider")] == ["lambda", "runpod"]
    assert [line.key for line in result.group("instance")] == ["h100", "rtx"]


def test_other_months_hold_their_own_charges(db: Database, fleet: dict[str, int]) -> None:
    february = report(db, "2026-02")
    assert [i.name for i in february.instances] == ["old"]
    assert february.total_micros == 3 * USD
    april = report(db, "2026-04")
    assert not april.complete
    assert [i.name for i in april.instances] == ["rtx"]  # storage only
    assert april.compute_micros == 0


def test_a_past_month_s_total_is_one_sum_equal_to_its_report(
    db: Database, fleet: dict[str, int]
) -> None:
    now = datetime(2026, 4, 2, 12, 0)
    for month in ("2026-02", "2026-03"):
        total = spend.month_total_micros(db, month, tz=UTC_TZ, now=now)
        assert total == report(db, month).total_micros > 0


def test_days_split_in_use_idle_and_not_measured(db: Database, fleet: dict[str, int]) -> None:
    result = report(db)
    assert len(result.days) == 31
    fifth = {day.day: day for day in result.days}[date(2026, 3, 5)]
    assert fifth.idle_micros == 4 * 8 * USD + 900_000
    assert fifth.unmeasured_micros == 1_600_000
    assert fifth.in_use_micros == 6 * 8 * USD
    assert sum(day.total_micros for day in result.days) == result.total_micros
    assert sum(day.other_micros for day in result.days) == result.storage_micros


def test_csv_has_one_row_per_instance(db: Database, fleet: dict[str, int]) -> None:
    rows = list(csv.DictReader(io.StringIO(spend.spend_csv(report(db)).decode())))
    assert [row["instance"] for row in rows] == ["h100", "rtx"]
    assert rows[0]["total_USD"] == "80.000000"
    assert rows[0]["idle_USD"] == "32.000000"
    assert rows[0]["in_use_USD"] == "48.000000"
    assert (rows[1]["in_use_USD"], rows[1]["idle_USD"]) == ("0.000000", "0.900000")
    assert (rows[0]["unmeasured_USD"], rows[1]["unmeasured_USD"]) == ("0.000000", "1.600000")
    assert rows[0]["compute_hours"] == "10.00"
    assert rows[1]["owner"] == "UBOB"


def test_arguments_are_checked() -> None:
    now = datetime(2026, 3, 15)
    assert spend.parse_month_arg(None, now, UTC_TZ) == "2026-03"
    assert spend.parse_month_arg("2026-01", now, UTC_TZ) == "2026-01"
    with pytest.raises(UsageError, match="not started"):
        spend.parse_month_arg("2026-04", now, UTC_TZ)
    with pytest.raises(UsageError, match="not a month"):
        spend.parse_month_arg("March", now, UTC_TZ)
    assert spend.parse_group(None) == "user"
    assert spend.parse_group("GPU") == "gpu"
    with pytest.raises(UsageError, match="--by"):
        spend.parse_group("team")


@pytest.mark.parametrize("zone", ["Asia/Shanghai", "Europe/Berlin", "America/New_York"])
def test_days_are_local_days_across_a_dst_change(
    db: Database, fleet: dict[str, int], zone: str
) -> None:
    """The database folds charges into local days; the same fold done here from the rows
    agrees in a zone without DST and in two whose clocks change in March 2026."""
    tz = ZoneInfo(zone)
    result = spend.spend_report(
        db,
        "2026-03",
        tz=tz,
        now=datetime(2026, 4, 2, 12, 0),
        idle_threshold_pct=5.0,
        currency="USD",
    )
    start, end = ledger.month_bounds("2026-03", tz)
    wanted: dict[date, int] = {}
    with db.read_session() as session:
        for charge in session.exec(
            select(Charge).where(col(Charge.start_at) >= start, col(Charge.start_at) < end)
        ):
            local = charge.start_at.replace(tzinfo=UTC).astimezone(tz).date()
            wanted[local] = wanted.get(local, 0) + charge.amount_micros
    got = {day.day: day.total_micros for day in result.days if day.total_micros}
    assert got == wanted
    pending = sum(item.pending_micros for item in result.instances)
    assert sum(got.values()) == result.total_micros - pending
    assert result.days[0].day == date(2026, 3, 1)
    assert len(result.days) == 31
