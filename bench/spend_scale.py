"""`/gpu spend`, the monthly digest and one tick over a year's ledger: do they cost what the
database's own aggregation costs?

For each store (SQLite in a file, PostgreSQL on 127.0.0.1:5432) a fresh database gets
``--instances`` instances (default 500) that ran for ``--months`` months (default 12) at one
GPU each, with their hourly compute charges (about 4.4 M rows at the defaults, and the ledger
states that go with them), each carrying the polls and GPU-samples of its hour as the ledger
writes them (one poll a minute; a quarter of the hours idle). Then, each the median of
``--repeat`` runs:

  spend:    the spend report of the last month (by user);
  digest:   the digest of the last month (the report, the month before, plan savings, jobs);
  baseline: the plain ``GROUP BY`` of the same month's charges per instance (the same totals);
  tick:     one tick of the clock over that ledger (nothing due), against
  tick0:    one tick over an empty store with as many instances.

The charges are written straight into the store, so the first report and the first digest sum
up their months from the charges (the spend summary the ledger then keeps up to date): they run
once before the timed runs, and their times are printed apart.

Printed: milliseconds and the ratios spend/baseline, digest/baseline and tick/tick0. Targets:
spend and digest within 2x the baseline; the tick within 2x of the tick over an empty ledger.

Run: python bench/spend_scale.py [--instances 500] [--months 12] [--repeat 3]
                                  [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, insert, select  # noqa: E402

from bot.services import digest, ledger, spend  # noqa: E402
from bot.services.tick import tick  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Charge, Instance, LedgerState, Person  # noqa: E402
from tests.bot.services.support import Clock, make_runtime  # noqa: E402
from tests.fixtures.store import fresh_database  # noqa: E402

UTC = ZoneInfo("UTC")
START = datetime(2025, 12, 1)
PRICE_MICROS = 2_000_000
CHUNK = 20_000
TARGET_RATIO = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=500)
    parser.add_argument("--months", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    worst = 0.0
    for store in args.stores.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            worst = max(worst, _measure(store, Path(scratch), args))
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    print(f"\nworst ratio: {worst:.2f}x ({verdict} {TARGET_RATIO:g}x)")
    return 0


def _measure(store: str, scratch: Path, args: argparse.Namespace) -> float:
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
        # The charges were written here, not by the ledger: the first report and digest sum up
        # their months from the charges (once; the ledger keeps a summed-up month up to date,
        # and the tick sums up each month at its start). Timed apart, not in the ratios.
        started = time.perf_counter()
        report = spend.spend_report(
            db, month, tz=UTC, now=now, idle_threshold_pct=5.0, currency="USD"
        )
        build_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        digest.build_digest(db, month, tz=UTC, now=now, idle_threshold_pct=5.0, currency="USD")
        build_digest_ms = (time.perf_counter() - started) * 1000
        base_total = _baseline(db, month)
        assert sum(i.total_micros for i in report.instances) == base_total, "totals differ"
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
    print(f"  spend   {spend_ms:9.1f} ms  {ratios[0]:6.2f}x the baseline")
    print(f"  digest  {digest_ms:9.1f} ms  {ratios[1]:6.2f}x the baseline")
    print(f"  baseline{base_ms:9.1f} ms  (GROUP BY of the month's charges)")
    print(f"  tick    {tick_ms:9.1f} ms  {ratios[2]:6.2f}x a tick over an empty ledger")
    print(f"  tick0   {tick0_ms:9.1f} ms")
    print(
        f"  first report {build_ms:.1f} ms ({build_ms / base_ms:.2f}x the baseline), "
        f"first digest {build_digest_ms:.1f} ms ({build_digest_ms / base_ms:.2f}x) "
        "(summing up the month, the month before, from their charges: once)"
    )
    return max(ratios)


def _baseline(db: Database, month: str) -> int:
    start, end = ledger.month_bounds(month, UTC)
    with db.session() as session:
        rows = session.execute(
            select(Charge.instance_id, func.sum(Charge.amount_micros))
            .where(Charge.start_at >= start, Charge.start_at < end)  # type: ignore[arg-type]
            .group_by(Charge.instance_id)
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
        session.add(Person(slack_id="UOWNER", created_at=START))
        session.flush()
        session.execute(
            insert(Instance), [_instance(i, end, with_history) for i in range(instances)]
        )
        ids = [int(i) for i in session.execute(select(Instance.id)).scalars()]
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
        "owner_id": "UOWNER",
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
