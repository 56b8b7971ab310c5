"""One tick of the clock at 100, 1,000 and 10,000 registered instances: does its cost follow the
work that is due, or the size of the fleet?

For each store (SQLite in a file, PostgreSQL on 127.0.0.1:5432) and each fleet size, a fresh
database is filled with that many active instances on the manual platform (registered half an
hour ago, polled a moment ago, deadlines a day away), the clock ticks once to settle (the ledger
schedules every instance), then:

  (a) none due: the median of ``--ticks`` ticks 30 s apart, and the SQL statements one tick
      makes (counted on the engine);
  (c) an hour boundary: the median of ``--ticks`` ticks each a second past the next UTC hour,
      when every instance's hourly bucket closes and the ledger charges all of them (checked:
      each instance gets its charge for the hour), and the statements of the last;
  (b) 1 % due: as (a), after moving 1 % of the deadlines into the warning window (each such
      tick posts their warnings: work that is due);
  baseline: the median of one indexed ``SELECT`` of the instances whose deadline has come
      (the query a clock cannot do without), in the same run on the same database;
  insert: the baseline of (c), the median of one plain multi-row INSERT of as many charges as
      there are instances, in one transaction rolled back (the write no ledger can do without).

Printed per store and size: statements per tick (a), (b) and (c), milliseconds per tick, the
ratio of (a) to the baseline and of (c) to the insert, and the ledger step's seconds in (c)
against its budget. Targets: statements per tick of (a) and (b) the same at every size; at
10,000 with none due, (a) within 20x the baseline. (c) has no target of its own: it is printed
so that the tick's costliest regular case is measured.

Run: python bench/tick_scale.py [--sizes 100,1000,10000] [--ticks 5] [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import event, func, insert, select, update  # noqa: E402
from sqlmodel import col  # noqa: E402

from bot.runtime import Runtime  # noqa: E402
from bot.services.tick import step_budget_s, tick  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Charge, Instance, Person  # noqa: E402
from tests.bot.services.support import Clock, make_runtime  # noqa: E402
from tests.fixtures.store import fresh_database  # noqa: E402

NOW = datetime(2026, 6, 10, 12, 5)
TARGET_RATIO = 20.0
#: The settings' default tick interval, which the steps' budgets derive from.
TICK_INTERVAL_S = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    worst = 0.0
    for store in args.stores.split(","):
        print(f"\n{store}:")
        print(
            f"{'instances':>10} {'stmts (a)':>10} {'stmts (b)':>10} {'tick (a)':>10} "
            f"{'tick (b)':>10} {'baseline':>10} {'(a)/base':>9}"
        )
        rows: list[tuple[int, dict[str, Any]]] = []
        for size in sizes:
            row = measure(store, size, args.ticks)
            rows.append((size, row))
            print(
                f"{size:>10} {row['stmts_none']:>10} {row['stmts_due']:>10} "
                f"{row['tick_none_ms']:>8.1f}ms {row['tick_due_ms']:>8.1f}ms "
                f"{row['baseline_ms']:>8.2f}ms {row['ratio']:>8.1f}x"
            )
            if size == max(sizes):
                worst = max(worst, row["ratio"])
        budget_s = step_budget_s("ledger", TICK_INTERVAL_S)
        print(
            f"{'instances':>10} {'stmts (c)':>10} {'tick (c)':>10} {'insert':>10} "
            f"{'(c)/ins':>9} {'ledger (c)':>11}   (c): an hour boundary, every instance charged"
        )
        for size, row in rows:
            print(
                f"{size:>10} {row['stmts_hour']:>10} {row['tick_hour_ms']:>8.1f}ms "
                f"{row['insert_ms']:>8.1f}ms {row['hour_ratio']:>8.1f}x "
                f"{row['ledger_hour_s']:>10.2f}s   (budget {budget_s:g} s)"
            )
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    print(f"\nlargest fleet, none due: {worst:.1f}x the baseline ({verdict} {TARGET_RATIO:g}x)")
    return 0


def measure(store: str, size: int, ticks: int) -> dict[str, Any]:
    """Fill a fresh ``store`` with ``size`` instances and time its ticks and the baseline."""
    with tempfile.TemporaryDirectory() as scratch, fresh_database(store, Path(scratch)) as db:
        _fill(db, size)
        clock = Clock(NOW)
        rt = make_runtime(db, clock, poll_interval_s=10**7)
        tick(rt, clock.now)  # settles: the ledger schedules every instance
        stmts_none, none_ms = _ticks(rt, clock, ticks)
        # Before (b): its deadlines would come due by the next hour and add releases to (c).
        # (b) then ticks at the same minutes of the hour as right after (a), as the clock's
        # slots (full ticks, reconciling) fall alike.
        into_hour = clock.now - _hour_of(clock.now)
        stmts_hour, hour_ms, ledger_s = _hour_ticks(rt, clock, ticks, size)
        clock.set(_hour_of(clock.now) + into_hour)
        _due_soon(db, max(1, size // 100), clock.now)
        stmts_due, due_ms = _ticks(rt, clock, ticks)
        base_ms = _median_ms(lambda: _baseline(db, clock.now), repeat=max(ticks, 20))
        charges = _charge_rows(db, clock.now)
        insert_ms = _median_ms(lambda: _insert_baseline(db, charges), repeat=max(ticks, 3))
        return {
            "stmts_none": stmts_none,
            "stmts_due": stmts_due,
            "stmts_hour": stmts_hour,
            "tick_none_ms": none_ms,
            "tick_due_ms": due_ms,
            "tick_hour_ms": hour_ms,
            "ledger_hour_s": ledger_s,
            "baseline_ms": base_ms,
            "insert_ms": insert_ms,
            "ratio": none_ms / base_ms,
            "hour_ratio": hour_ms / insert_ms,
        }


def _ticks(rt: Runtime, clock: Clock, count: int) -> tuple[int, float]:
    """The statements of the last tick and the median milliseconds over ``count`` ticks."""
    times: list[float] = []
    statements = 0
    for _ in range(count):
        clock.advance(seconds=30)
        with _counting(rt.db) as counter:
            started = time.perf_counter()
            report = tick(rt, clock.now)
            times.append((time.perf_counter() - started) * 1000)
        assert not report.errors, report.errors
        statements = counter[0]
    return statements, statistics.median(times)


def _hour_ticks(rt: Runtime, clock: Clock, count: int, size: int) -> tuple[int, float, float]:
    """(c): ``count`` ticks, each a second past the next UTC hour. Returns the statements of the
    last tick, the median milliseconds and the median seconds of its ledger step. Raises
    SystemExit when a tick fails or leaves an instance without its charge for the hour."""
    times: list[float] = []
    ledger_s: list[float] = []
    statements = 0
    for _ in range(count):
        boundary = _hour_of(clock.now) + timedelta(hours=1)
        clock.set(boundary + timedelta(seconds=1))
        with _counting(rt.db) as counter:
            started = time.perf_counter()
            report = tick(rt, clock.now)
            times.append((time.perf_counter() - started) * 1000)
        if report.errors:
            raise SystemExit(f"tick at {clock.now}: {report.errors}")
        statements = counter[0]
        ledger_s.append(report.durations_s.get("ledger", 0.0))
        charged = _charged_for(rt.db, boundary)
        if charged != size:
            raise SystemExit(f"tick at {clock.now}: {charged} of {size} instances charged")
    return statements, statistics.median(times), statistics.median(ledger_s)


def _hour_of(at: datetime) -> datetime:
    """The start of the UTC hour holding ``at``."""
    return at.replace(minute=0, second=0, microsecond=0)


def _charged_for(db: Database, end_at: datetime) -> int:
    """How many instances have a compute charge ending at ``end_at``."""
    with db.session() as session:
        found = session.execute(
            select(func.count(func.distinct(col(Charge.instance_id)))).where(
                col(Charge.kind) == "compute", col(Charge.end_at) == end_at
            )
        ).scalar_one()
    return int(found)


def _charge_rows(db: Database, now: datetime) -> list[dict[str, Any]]:
    """A compute charge per instance for an hour a day ahead (none exists there yet)."""
    start = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=24)
    with db.engine.connect() as connection:
        ids = connection.execute(select(Instance.id)).scalars().all()  # type: ignore[call-overload]
    return [
        {
            "instance_id": instance_id,
            "kind": "compute",
            "start_at": start,
            "end_at": start + timedelta(hours=1),
            "billed_s": 3600,
            "amount_micros": 2_100_000,
            "currency": "USD",
            "created_at": now,
            "polls": 60,
            "bad_polls": 0,
            "max_util_pct": 80.0,
            "idle_gpu_samples": 0,
            "busy_gpu_samples": 60,
            "unmeasured_gpu_samples": 0,
        }
        for instance_id in ids
    ]


def _insert_baseline(db: Database, rows: list[dict[str, Any]]) -> None:
    """One INSERT of ``rows`` into the charges, in a transaction rolled back."""
    with db.engine.connect() as connection:
        transaction = connection.begin()
        try:
            connection.execute(insert(Charge), rows)
        finally:
            transaction.rollback()


def _baseline(db: Database, now: datetime) -> None:
    with db.session() as session:
        session.exec(select(Instance.id).where(Instance.deadline_at <= now)).all()  # type: ignore[call-overload]


def _median_ms(fn: Callable[[], None], *, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


@contextmanager
def _counting(db: Database) -> Iterator[list[int]]:
    counter = [0]

    def count(*_args: Any) -> None:
        counter[0] += 1

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        yield counter
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


def _fill(db: Database, size: int) -> None:
    created = NOW - timedelta(minutes=30)
    rows = [
        {
            "name": f"box{i}",
            "owner_id": "UOWNER",
            "state": "active",
            "provider": "manual",
            "host": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            "port": 22,
            "ssh_user": "root",
            "price_micros": 2_100_000,
            "gpu_model": "A100",
            "gpu_count": 1,
            "created_at": created,
            "deadline_at": NOW + timedelta(days=1),
            "last_polled_at": NOW,
        }
        for i in range(size)
    ]
    with db.session() as session:
        session.add(Person(slack_id="UOWNER", created_at=created))
        session.flush()
        session.execute(insert(Instance), rows)


def _due_soon(db: Database, count: int, now: datetime) -> None:
    """Move ``count`` deadlines into the warning window, a minute apart."""
    with db.session() as session:
        ids = session.exec(select(Instance.id).order_by(Instance.id).limit(count)).all()  # type: ignore[call-overload]
        for offset, (instance_id,) in enumerate(ids):
            session.execute(
                update(Instance)
                .where(Instance.id == instance_id)  # type: ignore[arg-type]
                .values(deadline_at=now + timedelta(minutes=20, seconds=offset))
            )


if __name__ == "__main__":
    raise SystemExit(main())
