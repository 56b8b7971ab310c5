"""One person's Home and `/gpu list` in a team of 50 instances and in a team of 10,000: does
what a person waits for follow their own instances, or the team's?

Two fresh SQLite stores (in files) are filled the same way but for their size: the person
(``UVIEWER``) holds 50 active instances, two running jobs and a budget; everyone else holds 5
instances each (a tenth of them stopped, every one with a deadline). Every active instance is
stored as a poll stores it: an 8-GPU status snapshot of about 6 KB with its processes, and the
facts views read of it (bot.services.instances.lookup.status_columns). The clock has run: the
ledger is accrued up to now. Then, in interleaved rounds of the same run:

  (a) the Home: bot.services.home.home_view for the person, rendered to Block Kit
      (bot.blocks.home), what each publish of their Home runs;
  (b) `/gpu list` for the person, through the real parser and handler: their instances in
      full, the team's figures and nearest deadlines
      (bot.services.instances.fleet_views.viewer_list,
      rendered by bot.blocks.instance_list).

Printed per size: the median milliseconds of (a) and (b) and the ratio of the large team to
the small one for each, against the goal: within 2x. The final JSON line carries the worse of
the two as ``ratio`` and each as ``home_ratio`` and ``list_ratio``.

Run: python bench/home_scale.py [--size 10000] [--rounds 5] [--quick]   (--quick: 2,000)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert  # noqa: E402

from agents.protocol import dumps  # noqa: E402
from bot.blocks import home as home_blocks  # noqa: E402
from bot.commands import build_registry  # noqa: E402
from bot.commands.parser import parse  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from bot.services import home  # noqa: E402
from bot.services.access import Caller  # noqa: E402
from bot.services.instances.lookup import status_columns  # noqa: E402
from bot.services.money import ledger  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Budget, Instance, Job, Person  # noqa: E402
from tests.agents.factories import make_process, make_status  # noqa: E402
from tests.bot.services.support import Clock, make_runtime  # noqa: E402
from tests.fixtures.store import fresh_database  # noqa: E402

NOW = datetime(2026, 6, 10, 12, 5)
VIEWER = "UVIEWER"
#: The person's instances, and each other person's.
MINE = 50
EACH = 5
SMALL = 50
GOAL = 2.0
REGISTRY = build_registry()
LISTER = Caller(user_id=VIEWER, channel_id="CTEAM")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="the large team's instances")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a large team of 2,000")
    args = parser.parse_args()
    large = 2_000 if args.quick else args.size
    with tempfile.TemporaryDirectory() as scratch:
        stores = {size: _store(Path(scratch) / str(size), size) for size in (SMALL, large)}
        try:
            runtimes = {size: _runtime(db) for size, (db, _) in stores.items()}
            for rt in runtimes.values():  # warm: the catalogue, the templates, the caches
                _home(rt)
                _list(rt)
            times: dict[tuple[int, str], list[float]] = {}
            for _ in range(args.rounds):
                for size, rt in runtimes.items():
                    times.setdefault((size, "home"), []).append(_timed(_home, rt))
                    times.setdefault((size, "list"), []).append(_timed(_list, rt))
        finally:
            for _, stack in stores.values():
                stack.__exit__(None, None, None)
    median = {key: statistics.median(value) for key, value in times.items()}
    print(f"one person with {MINE} instances; median of {args.rounds} rounds")
    print(f"{'team':>8} {'Home':>10} {'/gpu list':>12}")
    for size in (SMALL, large):
        print(f"{size:>8} {median[size, 'home']:>8.1f}ms {median[size, 'list']:>10.1f}ms")
    home_ratio = median[large, "home"] / median[SMALL, "home"]
    list_ratio = median[large, "list"] / median[SMALL, "list"]
    print(f"Home {large} / {SMALL}: {home_ratio:.2f}x (goal <= {GOAL:.1f}x)")
    print(f"/gpu list {large} / {SMALL}: {list_ratio:.2f}x (goal <= {GOAL:.1f}x)")
    ratio = max(home_ratio, list_ratio)
    met = ratio <= GOAL
    result = {
        "bench": "home_scale",
        "ratio": round(ratio, 3),
        "goal": GOAL,
        "met": met,
        "home_ratio": round(home_ratio, 3),
        "list_ratio": round(list_ratio, 3),
    }
    print(json.dumps(result))
    return 0 if met else 1


def _home(rt: Runtime) -> None:
    view = home.home_view(rt, VIEWER)
    home_blocks.home_view(view)


def _list(rt: Runtime) -> None:
    spec, args = parse("list", REGISTRY)
    spec.handler(rt, LISTER, args)


def _timed(fn: Callable[[Runtime], None], rt: Runtime) -> float:
    started = time.perf_counter()
    fn(rt)
    return (time.perf_counter() - started) * 1000


def _runtime(db: Database) -> Runtime:
    clock = Clock(NOW)
    rt = make_runtime(db, clock, poll_interval_s=10**7)
    ledger.accrue(db, NOW, rt.settings.tz())  # the clock's work, done before anyone looks
    return rt


def _store(path: Path, size: int) -> tuple[Database, Any]:
    path.mkdir(parents=True)
    stack = fresh_database("sqlite", path)
    db = stack.__enter__()
    _fill(db, size)
    return db, stack


def _fill(db: Database, size: int) -> None:
    """``size`` instances: the person's ``MINE``, the rest ``EACH`` per other person."""
    status = make_status(
        n=8,
        processes=[make_process(gpu_index=i, pid=4000 + i) for i in range(8)],
    )
    polled = status_columns(status)
    assert len(dumps(status)) > 5_000, "a status of about 6 KB"
    created = NOW - timedelta(hours=3)
    owners = [VIEWER] + [f"U{n:06d}" for n in range((size - MINE) // EACH + 1)]
    rows: list[dict[str, Any]] = []
    for i in range(size):
        owner = VIEWER if i < MINE else owners[1 + (i - MINE) // EACH]
        stopped = i % 10 == 9
        row: dict[str, Any] = {
            "name": f"box{i:05d}",
            "owner_id": owner,
            "state": "stopped" if stopped else "active",
            "provider": "manual",
            "host": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            "port": 22,
            "ssh_user": "root",
            "price_micros": 2_100_000 + (i % 7) * 100_000,
            "price_per": "gpu_hour" if i % 3 == 0 else "instance_hour",
            "gpu_model": "H100",
            "gpu_count": 8,
            "disk_gb": 200.0 if i % 20 == 9 else None,
            "storage_micros_per_gb_month": 100_000 if i % 20 == 9 else 0,
            "created_at": created,
            "ssh_ready_at": created,
            "stopped_at": NOW - timedelta(hours=1) if stopped else None,
            "deadline_at": NOW + timedelta(minutes=30 + i % 997),
            "last_polled_at": NOW - timedelta(seconds=20),
            "last_poll_ok": True,
            **({} if stopped else polled),
        }
        rows.append(row)
    with db.session() as session:
        session.execute(insert(Person), [{"slack_id": owner} for owner in owners])
        session.execute(insert(Instance), rows)
        session.add(
            Budget(scope="user", subject=VIEWER, limit_micros=500_000_000, created_by="UADMIN")
        )
        session.flush()
        first = db_ids(session, 2)
        for n, instance_id in enumerate(first):
            session.add(
                Job(
                    instance_id=instance_id,
                    agent_job_id=f"j{n}",
                    requested_by=VIEWER,
                    command_json=json.dumps(["python", "train.py", f"--run={n}"]),
                    state="running",
                    started_at=NOW - timedelta(minutes=10),
                )
            )


def db_ids(session: Any, count: int) -> list[int]:
    """The ids of the person's first ``count`` instances."""
    from sqlmodel import col, select

    found = session.exec(
        select(Instance.id).where(Instance.owner_id == VIEWER).order_by(col(Instance.id))
    ).all()
    return [int(i) for i in found[:count]]


if __name__ == "__main__":
    raise SystemExit(main())
