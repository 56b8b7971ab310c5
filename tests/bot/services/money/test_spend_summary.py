"""The spend summary (SpendDay) behind `/gpu spend` and the digest, on SQLite and PostgreSQL:
what a report reads from it equals what the charges add up to, kept up to date by the ledger,
rebuilt when the zone or the idle threshold changes, never counted twice."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import exc as sa_exc
from sqlmodel import col, select

from bot.services.money import ledger, samples, spend
from bot.store.db import Database
from bot.store.models import Charge, Instance, SpendDay, SpendMonth, UtilHour, UtilSample
from tests.bot.services.money.test_ledger import add_instance, update_instance
from tests.bot.services.support import Clock, make_runtime

BERLIN = ZoneInfo("Europe/Berlin")
SHANGHAI = ZoneInfo("Asia/Shanghai")
UTC_TZ = ZoneInfo("UTC")
USD = 1_000_000
MARCH = "2026-03"

#: Per instance: compute, storage, idle, compute seconds, unmeasured.
Sums = dict[int, tuple[int, int, int, int, int]]
#: Per local day: compute in use, idle, not measured, storage.
Days = dict[date, tuple[int, int, int, int]]
#: A poll of the 4-GPU box: its GPUs (idle, in use, not measured), or None for a failed poll.
POLLS: tuple[tuple[int, int, int] | None, ...] = ((4, 0, 0), (0, 4, 0), (3, 1, 0), None, (1, 2, 1))
#: Roll-ups from before GPU-samples were counted: the highest utilisation, or None (failed).
LEGACY_UTILS = (1.0, 80.0, 30.0, None)


def add_fleet(db: Database, tz: ZoneInfo) -> dict[str, int]:
    """Around March 2026 in ``tz``: a 4-GPU box running from before the month (hourly polls
    judged idle, busy, mixed or failed around its DST change; roll-ups from before GPU-samples
    were counted around the month's start, idle only under 50% or not; none elsewhere), a
    stopped box whose disk bills on, and a short rental released mid-hour."""
    ids = {
        "gpu": add_instance(
            db,
            name="gpu",
            created_at=datetime(2026, 2, 26, 7, 30),
            price_micros=3_600_000,
            gpu_count=4,
        ),
        "disk": add_instance(
            db,
            name="disk",
            owner_id="U2",
            created_at=datetime(2026, 3, 10, 5, 17),
            price_micros=USD,
            disk_gb=73,
            storage_micros_per_gb_month=100_000,
        ),
        "short": add_instance(
            db, name="short", created_at=datetime(2026, 3, 28, 23, 40), price_micros=2 * USD
        ),
    }
    update_instance(db, ids["disk"], stopped_at=datetime(2026, 3, 12, 9), release_mode="stop")
    update_instance(db, ids["short"], released_at=datetime(2026, 3, 29, 3, 10, 7), state="released")
    windows = [
        (ids["gpu"], datetime(2026, 3, 28, 12), 48),
        (ids["short"], datetime(2026, 3, 28, 23, 45), 3),
    ]
    with db.session() as session:
        for instance_id, start, hours in windows:
            for hour in range(hours):
                gpus = POLLS[hour % len(POLLS)]
                idle, busy, unmeasured = gpus or (0, 0, 0)
                samples.record(
                    session,
                    UtilSample(
                        instance_id=instance_id,
                        at=start + timedelta(hours=hour, minutes=20),
                        ok=gpus is not None,
                        util_avg_pct=None if gpus is None else 50.0,
                        gpus_idle=idle,
                        gpus_busy=busy,
                        gpus_unmeasured=unmeasured,
                    ),
                    tz,
                )
        box = session.get(Instance, ids["gpu"])
        assert box is not None
        for hour in range(36):
            util = LEGACY_UTILS[hour % len(LEGACY_UTILS)]
            at = datetime(2026, 2, 28, 6) + timedelta(hours=hour, minutes=20)
            session.add(
                UtilHour(
                    instance_id=ids["gpu"],
                    bucket_start=ledger.bucket_start(box, at, tz),
                    polls=1,
                    bad_polls=1 if util is None else 0,
                    max_util_pct=util,
                )
            )
    return ids


def split(row: Charge, threshold: float) -> tuple[int, int, int]:
    """A compute charge as (in use, idle, not measured): by its GPU-samples, else by its polls
    under ``threshold`` (all not measured without a poll); idle and not measured rounded down."""
    counts = (row.idle_gpu_samples or 0, row.busy_gpu_samples or 0, row.unmeasured_gpu_samples or 0)
    polls, bad = row.polls or 0, row.bad_polls or 0
    if sum(counts):
        idle_n, unmeasured_n, whole = counts[0], counts[2], sum(counts)
    elif polls:
        quiet = row.max_util_pct is not None and row.max_util_pct < threshold
        idle_n, unmeasured_n, whole = (polls - bad if quiet else 0), bad, polls
    else:
        idle_n, unmeasured_n, whole = 0, 1, 1
    idle = row.amount_micros * idle_n // whole
    unmeasured = row.amount_micros * unmeasured_n // whole
    return row.amount_micros - idle - unmeasured, idle, unmeasured


def from_charges(db: Database, month: str, tz: ZoneInfo, threshold: float) -> tuple[Sums, Days]:
    """The month's totals added up here from its Charge rows, one by one."""
    start, end = ledger.month_bounds(month, tz)
    with db.read_session() as session:
        rows = session.exec(
            select(Charge).where(col(Charge.start_at) >= start, col(Charge.start_at) < end)
        ).all()
    sums: dict[int, list[int]] = {}
    days: dict[date, list[int]] = {}
    for row in rows:
        compute = row.kind == ledger.COMPUTE
        in_use, idle, unmeasured = split(row, threshold) if compute else (0, 0, 0)
        assert in_use >= 0
        assert in_use + idle + unmeasured == (row.amount_micros if compute else 0)
        entry = sums.setdefault(row.instance_id, [0, 0, 0, 0, 0])
        entry[0 if compute else 1] += row.amount_micros
        entry[2] += idle
        entry[3] += row.billed_s if compute else 0
        entry[4] += unmeasured
        local = row.start_at.replace(tzinfo=UTC).astimezone(tz).date()
        day = days.setdefault(local, [0, 0, 0, 0])
        day[0] += in_use
        day[1] += idle
        day[2] += unmeasured
        day[3] += 0 if compute else row.amount_micros
    return (
        {key: (v[0], v[1], v[2], v[3], v[4]) for key, v in sums.items()},
        {key: (v[0], v[1], v[2], v[3]) for key, v in days.items() if any(v)},
    )


def of_report(report: spend.SpendReport) -> tuple[Sums, Days]:
    """The same totals as a report shows them (what is not yet charged left out)."""
    sums = {
        item.instance_id: (
            item.compute_micros,
            item.storage_micros,
            item.idle_micros,
            item.compute_s,
            item.unmeasured_micros,
        )
        for item in report.instances
        if (item.compute_micros, item.storage_micros) != (0, 0)
    }
    days = {
        day.day: (day.in_use_micros, day.idle_micros, day.unmeasured_micros, day.other_micros)
        for day in report.days
        if day.total_micros
    }
    return sums, days


def report(
    db: Database, now: datetime, tz: ZoneInfo, threshold: float = 5.0, month: str = MARCH
) -> spend.SpendReport:
    return spend.spend_report(
        db, month, tz=tz, now=now, idle_threshold_pct=threshold, currency="USD"
    )


def markers(db: Database) -> set[tuple[str, float, str]]:
    with db.read_session() as session:
        return {
            (row.zone, row.threshold_pct, row.month) for row in session.exec(select(SpendMonth))
        }


@pytest.fixture
def no_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on a summary must be there already: building one fails the test."""

    def fail(*args: object) -> bool:
        raise AssertionError(f"the summary was built again: {args[1:]}")

    monkeypatch.setattr(ledger, "build_summary", fail)


@pytest.mark.parametrize("tz", [BERLIN, SHANGHAI], ids=["berlin", "shanghai"])
def test_a_month_s_report_equals_its_charges(db: Database, tz: ZoneInfo) -> None:
    add_fleet(db, tz)
    result = report(db, datetime(2026, 4, 2, 12), tz)
    assert result.complete
    sums, days = from_charges(db, MARCH, tz, 5.0)
    assert of_report(result) == (sums, days)
    assert result.idle_micros > 0
    assert result.unmeasured_micros > 0
    assert result.storage_micros > 0
    assert min(days) == date(2026, 3, 1)
    assert max(days) == date(2026, 3, 31)
    assert result.total_micros == sum(sum(parts) for parts in days.values())
    assert result.in_use_micros > 0
    assert result.in_use_micros + result.idle_micros + result.unmeasured_micros == (
        result.compute_micros
    )
    # The digest's month-before total and a total without a threshold agree with the charges.
    now = datetime(2026, 5, 2)
    ledger.accrue(db, now, tz)
    april_sums, _ = from_charges(db, "2026-04", tz, 5.0)
    for threshold in (None, 5.0, 20.0):
        total = spend.month_total_micros(
            db, "2026-04", tz=tz, now=now, idle_threshold_pct=threshold
        )
        assert total == sum(s[0] + s[1] for s in april_sums.values()) > 0


def test_the_summary_follows_the_charges_written_after_it(
    db: Database, request: pytest.FixtureRequest
) -> None:
    add_fleet(db, BERLIN)
    first = report(db, datetime(2026, 3, 20, 10, 5), BERLIN)
    assert not first.complete
    assert of_report(first) == from_charges(db, MARCH, BERLIN, 5.0)
    assert markers(db) == {("Europe/Berlin", 5.0, MARCH)}
    request.getfixturevalue("no_builds")
    # Across the DST change and the short rental's release, then past the month's end.
    for now in (datetime(2026, 3, 29, 4, 30), datetime(2026, 4, 1, 3)):
        later = report(db, now, BERLIN)
        expected = from_charges(db, MARCH, BERLIN, 5.0)
        assert of_report(later) == expected
        assert later.total_micros > first.total_micros
    assert spend.month_total_micros(db, MARCH, tz=BERLIN, now=now) == sum(
        s[0] + s[1] for s in expected[0].values()
    )


def test_a_tick_sums_up_the_month_at_its_start(db: Database) -> None:
    add_fleet(db, SHANGHAI)
    clock = Clock(datetime(2026, 2, 28, 16, 30))  # 00:30 on 1 March in Shanghai
    rt = make_runtime(db, clock, timezone="Asia/Shanghai", idle_threshold_pct=7.5)
    ledger.ledger_tick(rt, clock.now)
    assert markers(db) == {("Asia/Shanghai", 7.5, MARCH)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger, "build_summary", lambda *args: pytest.fail("built again"))
        for _ in range(3):
            ledger.ledger_tick(rt, clock.advance(days=10))
        result = report(db, clock.now, SHANGHAI, threshold=7.5)
    assert of_report(result) == from_charges(db, MARCH, SHANGHAI, 7.5)
    assert result.total_micros > 0


def test_another_threshold_is_summed_up_and_kept_too(
    db: Database, request: pytest.FixtureRequest
) -> None:
    add_fleet(db, BERLIN)
    now = datetime(2026, 3, 28, 20, 5)
    low, high = report(db, now, BERLIN, 5.0), report(db, now, BERLIN, 50.0)
    assert of_report(low) == from_charges(db, MARCH, BERLIN, 5.0)
    assert of_report(high) == from_charges(db, MARCH, BERLIN, 50.0)
    # Only roll-ups from before GPU-samples were counted are judged under the threshold: the
    # GPU-samples were judged when polled.
    assert high.idle_micros > low.idle_micros > 0
    assert high.unmeasured_micros == low.unmeasured_micros > 0
    request.getfixturevalue("no_builds")
    later = datetime(2026, 4, 1, 1)
    for threshold in (50.0, 5.0, 50.0):
        result = report(db, later, BERLIN, threshold)
        assert of_report(result) == from_charges(db, MARCH, BERLIN, threshold)


def test_a_zone_change_drops_the_other_zone_s_summary_and_back(db: Database) -> None:
    add_fleet(db, BERLIN)
    now = datetime(2026, 3, 20, 10, 5)
    report(db, now, BERLIN)
    report(db, now, UTC_TZ)
    assert markers(db) == {("Europe/Berlin", 5.0, MARCH), ("UTC", 5.0, MARCH)}
    # Charges written in Berlin time: the UTC summary of March holds some of them, so it goes.
    ledger.accrue(db, datetime(2026, 3, 25, 7, 30), BERLIN)
    assert markers(db) == {("Europe/Berlin", 5.0, MARCH)}
    with db.read_session() as session:
        assert not session.exec(select(SpendDay).where(SpendDay.zone == "UTC")).all()
    result = report(db, datetime(2026, 3, 25, 7, 30), UTC_TZ)  # rebuilt, not stale
    assert of_report(result) == from_charges(db, MARCH, UTC_TZ, 5.0)
    # Back in Berlin after charges written in UTC: rebuilt too.
    ledger.accrue(db, datetime(2026, 3, 30, 12, 30), UTC_TZ)
    assert ("Europe/Berlin", 5.0, MARCH) not in markers(db)
    back = report(db, datetime(2026, 3, 30, 12, 30), BERLIN)
    assert of_report(back) == from_charges(db, MARCH, BERLIN, 5.0)


def test_racing_accrues_count_each_charge_once(db: Database) -> None:
    add_fleet(db, SHANGHAI)
    report(db, datetime(2026, 3, 2, 9, 5), SHANGHAI)
    now = datetime(2026, 3, 31, 12, 5)
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            ledger.accrue(db, now, SHANGHAI)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger, "build_summary", lambda *args: pytest.fail("built again"))
        result = report(db, now, SHANGHAI)
    assert of_report(result) == from_charges(db, MARCH, SHANGHAI, 5.0)


def test_a_batch_that_clashes_leaves_nothing_in_the_summary(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when another process wrote a bucket first: the batch rolls back after it added to
    the summary, and is charged again one instance at a time."""
    add_fleet(db, BERLIN)
    report(db, datetime(2026, 3, 2, 9, 5), BERLIN)
    original = ledger._summarise
    calls: list[int] = []

    def clash(session: Any, rows: list[dict[str, Any]], tz: ZoneInfo) -> None:
        original(session, rows, tz)
        calls.append(len(rows))
        if len(calls) == 1:
            raise sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    monkeypatch.setattr(ledger, "_summarise", clash)
    now = datetime(2026, 3, 29, 6, 5)
    assert ledger.accrue(db, now, BERLIN) > 0
    assert len(calls) > 1
    monkeypatch.setattr(ledger, "_summarise", original)
    monkeypatch.setattr(ledger, "build_summary", lambda *args: pytest.fail("built again"))
    assert of_report(report(db, now, BERLIN)) == from_charges(db, MARCH, BERLIN, 5.0)


def test_offset_changes_and_local_days_follow_the_zone() -> None:
    start, end = ledger.month_bounds(MARCH, BERLIN)
    assert ledger._offset_changes(start, end, BERLIN) == [
        (datetime(2026, 2, 28, 23), 3600),
        (datetime(2026, 3, 29, 1), 7200),
    ]
    start, end = ledger.month_bounds("2026-10", BERLIN)
    assert ledger._offset_changes(start, end, BERLIN)[1:] == [(datetime(2026, 10, 25, 1), 3600)]
    assert ledger._offset_changes(*ledger.month_bounds(MARCH, SHANGHAI), SHANGHAI) == [
        (datetime(2026, 2, 28, 16), 8 * 3600)
    ]
    assert ledger.day_date(ledger.local_day(datetime(2026, 3, 28, 23), BERLIN)) == date(2026, 3, 29)
    assert ledger.day_date(ledger.local_day(datetime(2026, 3, 28, 22, 59), BERLIN)) == date(
        2026, 3, 28
    )
