"""`/gpu spend`, the monthly digest and one tick over a year's ledger: do they cost what the
database's own aggregation costs, and does summing up a month hold other writers back?

For each store (SQLite in a file, PostgreSQL on 127.0.0.1:5432) a fresh database gets
``--instances`` instances (default 500, owned by ten people) that ran for ``--months`` months
(default 12) at one GPU each, with their hourly compute charges (about 4.4 M rows at the
defaults, and the ledger states that go with them), each carrying the polls and GPU-samples of
its hour as the ledger writes them (one poll a minute; a quarter of the hours idle).

The charges are written straight into the store, so the first report sums up its month from
the charges (the spend summary the ledger then keeps up to date). It is timed with a writer
beside it: a thread that commits one small row at a time, as the ledger writes (on PostgreSQL
under the summary lock's shared side), measured idle first; the writer's longest wait during
the build is the figure (goal: under 100 ms). The report's totals per owner and per instance
are checked against a plain ``GROUP BY`` of the month's charges. Then, each the median of
``--repeat`` runs:

  spend:    the spend report of the last month (by user);
  digest:   the digest of the last month (the report, the month before, plan savings, jobs);
  baseline: the plain ``GROUP BY`` of the same month's charges per instance (the same totals);
  tick:     one tick of the clock over that ledger (nothing due), against
  tick0:    one tick over an empty store with as many instances.

Printed: milliseconds, the writer's waits, and the ratios spend/baseline, digest/baseline and
tick/tick0 (targets: within 2x). The last line is the result as JSON (bench/run_all.py):
``ratio`` is the writer's longest wait over 100 ms (goal 1).

Run: python bench/spend_scale.py [--quick] [--instances 500] [--months 12] [--repeat 3]
                                  [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, insert, select  # noqa: E402
from sqlmodel import col  # noqa: E402

from bot.services.money import digest, ledger, spend  # noqa: E402
from bot.services.tick import tick  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import AuditLog, Charge, Instance, LedgerState, Person  # noqa: E402
from tests.bot.services.support import Clock, make_runtime  # noqa: E402
from tests.fixtures.store import fresh_database  # noqa: E402

UTC = ZoneInfo("UTC")
START = datetime(2025, 12, 1)
PRICE_MICROS = 2_000_000
CHUNK = 20_000
TARGET_RATIO = 2.0
#: The longest a writer may wait beside the first build of a month's summary.
WRITER_GOAL_MS = 100.0
OWNERS = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 instances, 3 months")
    parser.add_argument("--instances", type=int, default=None)
    parser.add_argument("--months", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    if args.instances is None:
        args.instances = 100 if args.quick else 500
    if args.months is None:
        args.months = 3 if args.quick else 12
    worst = 0.0
    worst_wait_ms = 0.0
    figures: dict[str, object] = {}
    totals_ok = True
    for store in args.stores.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            found = _measure(store, Path(scratch), args)
        worst = max(worst, found["worst_ratio"])
        worst_wait_ms = max(worst_wait_ms, found["writer_max_ms"])
        totals_ok = totals_ok and bool(found["totals_ok"])
        figures.update({f"{store}_{name}": value for name, value in found.items()})
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    print(f"\nworst ratio: {worst:.2f}x ({verdict} {TARGET_RATIO:g}x)")
    wait_verdict = "under" if worst_wait_ms < WRITER_GOAL_MS else "OVER"
    print(
        f"longest writer wait beside a first build: {worst_wait_ms:.1f} ms "
        f"({wait_verdict} {WRITER_GOAL_MS:g} ms); totals per owner "
        f"{'equal' if totals_ok else 'DIFFER'}"
    )
    result = {
        "bench": "spend_scale",
        "figure": "a writer's longest wait beside the first build of a month / 100 ms",
        "ratio": round(worst_wait_ms / WRITER_GOAL_MS, 3),
        "goal": 1.0,
        "better": "lower",
        "met": worst_wait_ms < WRITER_GOAL_MS and totals_ok and worst <= TARGET_RATIO,
        "totals_per_owner_equal": totals_ok,
        "worst_read_ratio": round(worst, 2),
        **figures,
    }
    print(json.dumps(result))
    return 0


def _measure(store: str, scratch: Path, args: argparse.Namespace) -> dict[str, float]:
    end = _month_start(START, args.months)
    month = ledger.month_of(end - timedelta(hours=1), UTC)
    now = end + timedelta(minutes=5)
    with (
        fresh_database(store, scratch / "big") as db,
        fresh_database(store, scratch / "empty") as empty,
    ):
        started = time.perf_counter()
        charges = _fill(db, args.instances, end, with_history=True)
        _fill(empty, args.instances, end, with_history=False)
        print(
            f"\n{store}: {args.instances} instances, {charges:,} charges, month {month} "
            f"(filled in {time.perf_counter() - started:.0f} s)"
        )
        # The charges were written here, not by the ledger: the first report sums up its month
        # from the charges, with a writer beside it. Timed apart, not in the ratios.
        writer = _Writer(db)
        idle_ms = writer.idle_ms(30)
        writer.start()
        started = time.perf_counter()
        report = spend.spend_report(
            db, month, tz=UTC, now=now, idle_threshold_pct=5.0, currency="USD"
        )
        build_ms = (time.perf_counter() - started) * 1000
        waits = writer.stop()
        started = time.perf_counter()
        digest.build_digest(db, month, tz=UTC, now=now, idle_threshold_pct=5.0, currency="USD")
        build_digest_ms = (time.perf_counter() - started) * 1000
        totals_ok = _check_totals(db, month, report)
        spend_ms = _median_ms(
            lambda: spend.spend_report(
                db, month, tz=UTC, now=now, idle_threshold_pct=5.0, currency="USD"
            ),
            args.repeat,
        )
        digest_ms = _median_ms(
            lambda: digest.build_digest(
                db, month, tz=UTC, now=now, idle_threshold_pct=5.0, currency="USD"
            ),
            args.repeat,
        )
        base_ms = _median_ms(lambda: _baseline(db, month), args.repeat)
        tick_ms = _tick_ms(db, now, args.repeat)
        tick0_ms = _tick_ms(empty, now, args.repeat)
    ratios = (spend_ms / base_ms, digest_ms / base_ms, tick_ms / tick0_ms)
    longest = max(waits, default=0.0)
    print(
        f"  first report {build_ms:.1f} ms ({build_ms / base_ms:.2f}x the baseline), "
        f"first digest {build_digest_ms:.1f} ms (summing up the month before)"
    )
    print(
        f"  writer beside the first report: {len(waits)} writes, longest wait {longest:.1f} ms, "
        f"p50 {_percentile(waits, 50):.1f} ms, p99 {_percentile(waits, 99):.1f} ms; "
        f"idle {idle_ms:.2f} ms ({longest / idle_ms:.0f}x idle)"
    )
    print(
        f"  totals per owner and instance against a GROUP BY: {'equal' if totals_ok else 'DIFFER'}"
    )
    print(f"  spend   {spend_ms:9.1f} ms  {ratios[0]:6.2f}x the baseline")
    print(f"  digest  {digest_ms:9.1f} ms  {ratios[1]:6.2f}x the baseline")
    print(f"  baseline{base_ms:9.1f} ms  (GROUP BY of the month's charges)")
    print(f"  tick    {tick_ms:9.1f} ms  {ratios[2]:6.2f}x a tick over an empty ledger")
    print(f"  tick0   {tick0_ms:9.1f} ms")
    return {
        "worst_ratio": max(ratios),
        "writer_max_ms": round(longest, 2),
        "writer_idle_ms": round(idle_ms, 3),
        "writer_vs_idle": round(longest / idle_ms, 1),
        "first_build_ms": round(build_ms, 1),
        "baseline_ms": round(base_ms, 2),
        "spend_ratio": round(ratios[0], 2),
        "totals_ok": totals_ok,
    }


class _Writer:
    """A thread committing one small row at a time, as the ledger writes (on PostgreSQL under
    the summary lock's shared side), and how long each took in milliseconds."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.waits: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def write(self) -> float:
        started = time.perf_counter()
        with self.db.session() as session:
            ledger._lock_summaries(session, exclusive=False)
            session.add(AuditLog(actor="bench", action="write"))
        return (time.perf_counter() - started) * 1000

    def idle_ms(self, count: int) -> float:
        return statistics.median(self.write() for _ in range(count))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[float]:
        self._done.set()
        self._thread.join()
        return self.waits

    def _run(self) -> None:
        while not self._done.is_set():
            self.waits.append(self.write())
            time.sleep(0.001)  # a writer now and then, not a busy loop holding the GIL


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def _check_totals(db: Database, month: str, report: spend.SpendReport) -> bool:
    """Whether the report's totals per owner and per instance are a GROUP BY's of the month's
    charges, to the micro-unit."""
    start, end = ledger.month_bounds(month, UTC)
    in_month = (col(Charge.start_at) >= start, col(Charge.start_at) < end)
    with db.session() as session:
        by_owner = {
            str(owner): int(total)
            for owner, total in session.execute(
                select(col(Instance.owner_id), func.sum(col(Charge.amount_micros)))
                .join(Instance, col(Instance.id) == col(Charge.instance_id))
                .where(*in_month)
                .group_by(col(Instance.owner_id))
            ).all()
        }
        by_instance = {
            int(instance_id): int(total)
            for instance_id, total in session.execute(
                select(col(Charge.instance_id), func.sum(col(Charge.amount_micros)))
                .where(*in_month)
                .group_by(col(Charge.instance_id))
            ).all()
        }
    owners = {line.key: line.total_micros for line in report.group("user")}
    instances = {item.instance_id: item.total_micros for item in report.instances}
    return owners == by_owner and instances == by_instance and len(owners) == OWNERS


def _baseline(db: Database, month: str) -> int:
    start, end = ledger.month_bounds(month, UTC)
    with db.session() as session:
        rows = session.execute(
            select(col(Charge.instance_id), func.sum(col(Charge.amount_micros)))
            .where(col(Charge.start_at) >= start, col(Charge.start_at) < end)
            .group_by(col(Charge.instance_id))
        ).all()
    return sum(int(total) for _, total in rows)


def _tick_ms(db: Database, now: datetime, repeat: int) -> float:
    clock = Clock(now)
    rt = make_runtime(db, clock, poll_interval_s=10**7, channel=None)  # no digest posts
    tick(rt, clock.now)  # the ledger looks at every instance once

    def one() -> None:
        clock.advance(seconds=30)
        report = tick(rt, clock.now)
        assert not report.errors, report.errors

    return _median_ms(one, repeat)


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _fill(db: Database, instances: int, end: datetime, *, with_history: bool) -> int:
    """Instances running from START with their hourly charges up to ``end``, their ledger states
    and the last month's hourly roll-ups; without history, started half an hour before ``end``
    (nothing charged yet). Returns how many charges were written."""
    with db.session() as session:
        for owner in range(OWNERS):
            session.add(Person(slack_id=f"U{owner}", created_at=START))
        session.flush()
        session.execute(
            insert(Instance), [_instance(i, end, with_history) for i in range(instances)]
        )
        ids = [int(i) for i in session.execute(select(col(Instance.id))).scalars()]
    if not with_history:
        return 0
    hours = int((end - START).total_seconds() // 3600)
    last_month = _month_start(START, _months_between(START, end) - 1)
    written = 0
    for instance_id in ids:
        rows = list(_charges(instance_id, hours))
        with db.session() as session:
            for chunk in _chunks(rows):
                session.execute(insert(Charge), chunk)
            session.add(
                LedgerState(
                    instance_id=instance_id,
                    kind=ledger.COMPUTE,
                    last_end_at=end,
                    charged_micros=hours * PRICE_MICROS,
                    billed_s=hours * 3600,
                    month=ledger.month_of(end - timedelta(hours=1), UTC),
                    month_micros=int((end - last_month).total_seconds() // 3600) * PRICE_MICROS,
                )
            )
        written += len(rows)
    return written


def _instance(i: int, end: datetime, with_history: bool) -> dict[str, object]:
    return {
        "name": f"box{i}",
        "owner_id": f"U{i % OWNERS}",
        "state": "active",
        "provider": "manual",
        "host": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
        "port": 22,
        "ssh_user": "root",
        "price_micros": PRICE_MICROS,
        "gpu_model": "A100",
        "gpu_count": 1,
        "project": f"p{i % 7}",
        "created_at": START if with_history else end - timedelta(minutes=30),
        "deadline_at": end + timedelta(days=30),
        "last_polled_at": end + timedelta(days=1),
        "ledger_checked_at": end if with_history else None,
        "ledger_due_at": end + timedelta(hours=1) if with_history else None,
    }


def _charges(instance_id: int, hours: int) -> Iterator[dict[str, object]]:
    for hour in range(hours):
        at = START + timedelta(hours=hour)
        idle = (hour + instance_id) % 4 == 0
        yield {
            "instance_id": instance_id,
            "kind": ledger.COMPUTE,
            "start_at": at,
            "end_at": at + timedelta(hours=1),
            "billed_s": 3600,
            "amount_micros": PRICE_MICROS,
            "currency": "USD",
            "created_at": at + timedelta(hours=1),
            # One poll a minute, as the ledger copies them from the bucket's roll-up, with the
            # bucket's GPU-samples (one GPU: one a poll), which the reports split it by.
            "polls": 60,
            "bad_polls": 0,
            "max_util_pct": 1.0 if idle else 80.0,
            "idle_gpu_samples": 60 if idle else 0,
            "busy_gpu_samples": 0 if idle else 60,
            "unmeasured_gpu_samples": 0,
        }


def _chunks(rows: list[dict[str, object]]) -> Iterator[list[dict[str, object]]]:
    for start in range(0, len(rows), CHUNK):
        yield rows[start : start + CHUNK]


def _month_start(first: datetime, months: int) -> datetime:
    total = first.year * 12 + first.month - 1 + months
    return datetime(total // 12, total % 12 + 1, 1)


def _months_between(first: datetime, end: datetime) -> int:
    return (end.year - first.year) * 12 + end.month - first.month


if __name__ == "__main__":
    raise SystemExit(main())
