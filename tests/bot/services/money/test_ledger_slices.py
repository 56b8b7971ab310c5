"""The ledger in slices, on real SQLite and PostgreSQL: a catch-up goes in bounded pieces that
resume from the store (after a crash, in another process, with two processes at once) and add
up to exactly what one run charges; a month's summary is built in committed ranges and stays
equal to a GROUP BY of the charges.

What the store decides (a crash mid-transaction, two processes at once, the summary's and the
report's SQL) runs on both stores; the other ways through the same queries on SQLite only."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func
from sqlmodel import col, select

import bot.timebox
from bot.services.money import ledger
from bot.store.db import Database
from bot.store.models import Charge, Instance, LedgerState, SpendDay, SpendMonth
from bot.timebox import Timebox
from tests.bot.services.support import add_instance
from tests.fixtures.store import sqlite_only

UTC_TZ = ZoneInfo("UTC")
#: Sixty days of running before the ledger first looks: a catch-up of 1,440 hourly buckets.
NOW = datetime(2026, 5, 3, 10, 30)
CREATED = NOW - timedelta(days=60, minutes=10)
INSTANCES = 5


class Ticking:
    """A monotonic clock that moves ``step_s`` seconds each time it is read (no sleeping)."""

    def __init__(self, step_s: float) -> None:
        self.at = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.at += self.step_s
        return self.at


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices small enough that the catch-up takes many of them."""
    monkeypatch.setattr(ledger, "SLICE_BUCKETS", 50)
    monkeypatch.setattr(ledger, "BATCH_CHARGES", 120)
    monkeypatch.setattr(ledger, "ACCRUE_BATCH", 2)


def _fleet(db: Database) -> list[int]:
    """Instances running since CREATED, some with a disk (storage charges too), one released
    a month ago (its last bucket carries the rounding), one stopped."""
    ids = []
    for index in range(INSTANCES):
        fields: dict[str, object] = {
            "name": f"box{index}",
            "created_at": CREATED + timedelta(minutes=7 * index),
            "price_micros": 2_100_000 + 1_000 * index,
            "billing_increment": "hour" if index % 2 else "second",
        }
        if index % 2 == 0:
            fields.update(disk_gb=100.0, storage_micros_per_gb_month=50_000)
        if index == 1:
            fields.update(state="released", released_at=NOW - timedelta(days=30, minutes=13))
        if index == 2:
            fields.update(state="stopped", stopped_at=NOW - timedelta(days=3, minutes=41))
        ids.append(add_instance(db, **fields))
    return ids


def _one_shot(db: Database, ids: list[int]) -> list[tuple[int, str, datetime, datetime, int, int]]:
    """What one unsliced plan charges each instance up to NOW (pure: bot.services.money.ledger)."""
    with db.read_session() as session:
        instances = session.exec(select(Instance).where(col(Instance.id).in_(ids))).all()
    expected = []
    for instance in instances:
        assert instance.id is not None
        for charge in ledger.plan_charges(instance, {}, NOW, UTC_TZ):
            expected.append(
                (
                    instance.id,
                    charge.kind,
                    charge.start_at,
                    charge.end_at,
                    charge.billed_s,
                    charge.amount_micros,
                )
            )
    return sorted(expected)


def _written(db: Database) -> list[tuple[int, str, datetime, datetime, int, int]]:
    with db.read_session() as session:
        rows = session.exec(select(Charge)).all()
    return sorted(
        (c.instance_id, c.kind, c.start_at, c.end_at, c.billed_s, c.amount_micros) for c in rows
    )


def _states(db: Database) -> dict[tuple[int, str], tuple[int, int]]:
    with db.read_session() as session:
        rows = session.exec(select(LedgerState)).all()
    return {(s.instance_id, s.kind): (s.charged_micros, s.billed_s) for s in rows}


def _totals(
    charges: list[tuple[int, str, datetime, datetime, int, int]],
) -> dict[tuple[int, str], tuple[int, int]]:
    totals: dict[tuple[int, str], tuple[int, int]] = {}
    for instance_id, kind, _, _, billed, amount in charges:
        micros, seconds = totals.get((instance_id, kind), (0, 0))
        totals[(instance_id, kind)] = (micros + amount, seconds + billed)
    return totals


@sqlite_only
def test_a_catch_up_in_time_boxed_slices_charges_what_one_run_does(
    db: Database, small_slices: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _fleet(db)
    expected = _one_shot(db, ids)
    assert len(expected) > 4_000  # sixty days of hours, compute and storage
    monkeypatch.setattr(bot.timebox, "monotonic", Ticking(0.01))
    calls = 0
    written = 0
    while True:
        count = ledger.accrue(db, NOW, UTC_TZ, box=Timebox.open(0.2))
        calls += 1
        written += count
        with db.read_session() as session:
            due = session.exec(select(Instance.id).where(ledger.due_clause(NOW))).all()
        if not count:
            break
        assert calls < 1_000
    assert calls > 5  # the box held each call to a slice
    assert written == len(expected)
    assert _written(db) == expected
    assert _states(db) == _totals(expected)
    # Settled: only the instances whose session still runs are due again, at the next hour.
    with db.read_session() as session:
        released = session.get(Instance, ids[1])
    assert released is not None
    assert released.ledger_settled
    assert set(due) <= set(ids) - {ids[1]}
    assert ledger.accrue(db, NOW, UTC_TZ) == 0


@sqlite_only
def test_unboxed_accrue_runs_every_slice_to_the_end(db: Database, small_slices: None) -> None:
    ids = _fleet(db)
    expected = _one_shot(db, ids)
    assert ledger.accrue(db, NOW, UTC_TZ) == len(expected)
    assert _written(db) == expected
    released = ids[1]
    assert ledger.accrue_instance(db, released, NOW, UTC_TZ) == 0


def test_a_restart_mid_catch_up_loses_and_doubles_nothing(
    db: Database, small_slices: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _fleet(db)
    expected = _one_shot(db, ids)
    real_insert = ledger._insert
    inserts = 0

    def crash_on_the_fifth(*args: object, **kwargs: object) -> None:
        nonlocal inserts
        inserts += 1
        if inserts == 5:
            raise KeyboardInterrupt("the process is killed mid-transaction")
        real_insert(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger, "_insert", crash_on_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        ledger.accrue(db, NOW, UTC_TZ)
    partial = _written(db)
    assert 0 < len(partial) < len(expected)
    # The committed slices are whole: every instance's state matches its charges.
    assert _states(db) == _totals(partial)
    monkeypatch.setattr(ledger, "_insert", real_insert)
    restarted = Database(db.url.render_as_string(hide_password=False))
    try:
        assert ledger.accrue(restarted, NOW, UTC_TZ) == len(expected) - len(partial)
    finally:
        restarted.dispose()
    assert _written(db) == expected
    assert _states(db) == _totals(expected)


def test_two_processes_share_a_catch_up_without_doubling_a_charge(
    db: Database, small_slices: None
) -> None:
    ids = _fleet(db)
    expected = _one_shot(db, ids)
    url = db.url.render_as_string(hide_password=False)
    processes = [Database(url), Database(url)]
    start = threading.Barrier(len(processes))
    counts: list[int] = []
    failures: list[BaseException] = []

    def run(process: Database) -> None:
        try:
            start.wait()
            counts.append(ledger.accrue(process, NOW, UTC_TZ))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(process,)) for process in processes]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        for process in processes:
            process.dispose()
    assert not failures
    assert sum(counts) == len(expected)
    assert _written(db) == expected
    assert _states(db) == _totals(expected)


# --- the month's summary, built in ranges -----------------------------------------------------

MONTH = "2026-04"


def _summary_by_instance(db: Database, threshold_pct: float) -> dict[int, tuple[int, int]]:
    with db.read_session() as session:
        rows = session.execute(
            select(
                SpendDay.instance_id,
                func.sum(SpendDay.compute_micros),
                func.sum(SpendDay.other_micros),
            )
            .where(ledger.summary_clause(MONTH, UTC_TZ, threshold_pct))
            .group_by(col(SpendDay.instance_id))
        ).all()
    return {int(i): (int(c), int(o)) for i, c, o in rows}


def _group_by(db: Database) -> dict[int, tuple[int, int]]:
    """The month's charges per instance, compute and the rest, by a plain GROUP BY."""
    start, end = ledger.month_bounds(MONTH, UTC_TZ)
    with db.read_session() as session:
        rows = session.execute(
            select(Charge.instance_id, Charge.kind, func.sum(Charge.amount_micros))
            .where(col(Charge.start_at) >= start, col(Charge.start_at) < end)
            .group_by(col(Charge.instance_id), col(Charge.kind))
        ).all()
    totals: dict[int, tuple[int, int]] = {}
    for instance_id, kind, amount in rows:
        compute, other = totals.get(int(instance_id), (0, 0))
        if kind == ledger.COMPUTE:
            compute += int(amount)
        else:
            other += int(amount)
        totals[int(instance_id)] = (compute, other)
    return totals


def _marker(db: Database, threshold_pct: float) -> SpendMonth | None:
    with db.read_session() as session:
        return session.get(SpendMonth, (ledger.zone_name(UTC_TZ), threshold_pct, MONTH))


@pytest.fixture
def one_id_a_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "SUMMARY_CHUNK_IDS", 1)
    monkeypatch.setattr(ledger, "SUMMARY_CHUNK_IDS_MAX", 1)


def test_a_summary_built_in_ranges_while_the_ledger_writes_equals_a_group_by(
    db: Database, one_id_a_range: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _fleet(db)
    middle = NOW - timedelta(days=10)  # April 23rd: half the month charged
    ledger.accrue(db, middle, UTC_TZ)
    monkeypatch.setattr(bot.timebox, "monotonic", Ticking(1.0))
    # Two ranges in the first call, then the box is spent: the summary is not whole.
    assert not ledger.build_summary(db, MONTH, UTC_TZ, 5.0, box=Timebox.open(3.5))
    marker = _marker(db, 5.0)
    assert marker is not None
    assert marker.summed_to_id is not None
    assert 0 < marker.summed_to_id < max(ids)
    with db.read_session() as session:
        assert not ledger.summary_ready(session, MONTH, UTC_TZ, 5.0)
    # The ledger writes the rest of the month, on both sides of where the build stopped.
    later = NOW - timedelta(days=2)
    assert ledger.accrue(db, later, UTC_TZ) > 0
    partial = _summary_by_instance(db, 5.0)
    assert set(partial) == {i for i in ids if i <= marker.summed_to_id}
    calls = 1
    while not ledger.build_summary(db, MONTH, UTC_TZ, 5.0, box=Timebox.open(2.5)):
        calls += 1
        assert calls < 50
    assert calls >= 2  # it resumed where it stopped
    with db.read_session() as session:
        assert ledger.summary_ready(session, MONTH, UTC_TZ, 5.0)
    assert _summary_by_instance(db, 5.0) == _group_by(db)
    # And the ledger keeps the whole summary equal as it goes on.
    ledger.accrue(db, datetime(2026, 5, 1, 0, 30), UTC_TZ)
    assert _summary_by_instance(db, 5.0) == _group_by(db)


@sqlite_only
def test_an_instance_registered_during_a_build_is_summed_up(
    db: Database, one_id_a_range: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _fleet(db)
    ledger.accrue(db, NOW - timedelta(days=10), UTC_TZ)
    monkeypatch.setattr(bot.timebox, "monotonic", Ticking(1.0))
    assert not ledger.build_summary(db, MONTH, UTC_TZ, 5.0, box=Timebox.open(1.5))
    late = add_instance(db, name="late", created_at=datetime(2026, 4, 25, 9, 15))
    ledger.accrue(db, NOW - timedelta(days=2), UTC_TZ)
    assert late > max(ids)
    while not ledger.build_summary(db, MONTH, UTC_TZ, 5.0, box=Timebox.open(4.5)):
        pass
    summed = _summary_by_instance(db, 5.0)
    assert late in summed
    assert summed == _group_by(db)


def test_a_report_reads_only_a_whole_summary(
    db: Database, one_id_a_range: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.services.money import spend

    _fleet(db)
    ledger.accrue(db, NOW, UTC_TZ)
    monkeypatch.setattr(bot.timebox, "monotonic", Ticking(1.0))
    assert not ledger.build_summary(db, MONTH, UTC_TZ, 5.0, box=Timebox.open(1.5))
    total = spend.month_total_micros(db, MONTH, tz=UTC_TZ, now=NOW, idle_threshold_pct=5.0)
    assert total == sum(c + o for c, o in _group_by(db).values())
    report = spend.spend_report(
        db, MONTH, tz=UTC_TZ, now=NOW, idle_threshold_pct=5.0, currency="USD"
    )
    assert {i.instance_id: (i.compute_micros, i.storage_micros) for i in report.instances} == (
        _group_by(db)
    )
    whole = _marker(db, 5.0)
    assert whole is not None
    assert whole.summed_to_id is None


@sqlite_only
def test_the_clock_charges_a_catch_up_a_slice_a_tick(
    db: Database, small_slices: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.services.tick import tick
    from tests.bot.services.support import Clock, make_runtime

    ids = _fleet(db)
    expected = _one_shot(db, ids)
    clock = Clock(NOW)
    rt = make_runtime(db, clock, poll_interval_s=10**7, tick_interval_s=30.0, channel=None)
    monkeypatch.setattr(bot.timebox, "monotonic", Ticking(0.05))
    first = tick(rt, clock.now)
    assert "ledger" not in first.errors  # (no agents to poll here)
    assert 0 < len(_written(db)) < len(expected)  # the budget held the step to a slice
    ticks = 1
    while len(_written(db)) < len(expected):
        clock.advance(seconds=1)  # within NOW's hour: the same charges are due
        assert "ledger" not in tick(rt, clock.now).errors
        ticks += 1
        assert ticks < 500
    assert _written(db) == expected
    assert _states(db) == _totals(expected)
