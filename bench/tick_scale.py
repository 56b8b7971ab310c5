"""One tick of the clock at 100, 1,000 and 10,000 registered instances: does its cost follow the
work that is due, or the size of the fleet?

For each store (SQLite in a file, PostgreSQL on 127.0.0.1:5432) and each fleet size, a fresh
database is filled with that many active instances on the manual platform (registered half an
hour ago, polled a moment ago, deadlines a day away), the clock ticks once to settle (the ledger
schedules every instance), then:

  (a) none due: the median of ``--ticks`` ticks 30 s apart, and the SQL statements one tick
      makes (counted on the engine);
  (b) 1 % due: as (a), after moving 1 % of the deadlines into the warning window (each such
      tick posts their warnings: work that is due);
  baseline: the median of one indexed ``SELECT`` of the instances whose deadline has come
      (the query a clock cannot do without), in the same run on the same database.

Printed per store and size: statements per tick (a) and (b), milliseconds per tick and the
ratio of (a) to the baseline. Targets: statements per tick the same at every size; at 10,000
with none due, (a) within 20x the baseline.

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

from sqlalchemy import event, insert, select, update  # noqa: E402

from bot.runtime import Runtime  # noqa: E402
from bot.services.tick import tick  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Instance, Person  # noqa: E402
from tests.bot.services.support import Clock, make_runtime  # noqa: E402
from tests.fixtures.store import fresh_database  # noqa: E402

NOW = datetime(2026, 6, 10, 12, 5)
TARGET_RATIO = 20.0


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
        for size in sizes:
            row = measure(store, size, args.ticks)
            print(
                f"{size:>10} {row['stmts_none']:>10} {row['stmts_due']:>10} "
                f"{row['tick_none_ms']:>8.1f}ms {row['tick_due_ms']:>8.1f}ms "
                f"{row['baseline_ms']:>8.2f}ms {row['ratio']:>8.1f}x"
            )
            if size == max(sizes):
                worst = max(worst, row["ratio"])
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
        _due_soon(db, max(1, size // 100), clock.now)
        stmts_due, due_ms = _ticks(rt, clock, ticks)
        base_ms = _median_ms(lambda: _baseline(db, clock.now), repeat=max(ticks, 20))
        return {
            "stmts_none": stmts_none,
            "stmts_due": stmts_due,
            "tick_none_ms": none_ms,
            "tick_due_ms": due_ms,
            "baseline_ms": base_ms,
            "ratio": none_ms / base_ms,
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
