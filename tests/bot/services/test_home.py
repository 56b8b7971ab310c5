"""The Home tab's data: a person's instances, jobs, spend against budget and the team's fleet,
built from the store in a constant number of queries."""

from __future__ import annotations

import json
from datetime import timedelta

from agents.protocol import dumps
from bot.services.home import home_view
from bot.store.db import Database
from bot.store.models import Budget, Job
from tests.agents.factories import make_gpu, make_status
from tests.bot.services.support import T0, Clock, add_instance, counting_statements, make_runtime

ALICE = "UALICE"
BOB = "UBOB"


def _job(db: Database, instance_id: int, requested_by: str, command: list[str]) -> None:
    with db.session() as session:
        session.add(
            Job(
                instance_id=instance_id,
                agent_job_id=f"j{instance_id}{requested_by}",
                requested_by=requested_by,
                command_json=json.dumps(command),
                state="running",
                started_at=T0,
            )
        )


def test_the_home_holds_my_instances_jobs_spend_budget_and_the_fleet(db: Database) -> None:
    clock = Clock(T0)
    rt = make_runtime(db, clock)
    status = dumps(make_status([make_gpu(0, util_gpu_pct=90), make_gpu(1, util_gpu_pct=30)]))
    box = add_instance(
        db,
        name="box",
        owner_id=ALICE,
        gpu_count=2,
        deadline_at=T0 + timedelta(hours=3),
        last_status_json=status,
    )
    add_instance(db, name="bobs", owner_id=BOB, price_micros=1_000_000)
    add_instance(db, name="old", owner_id=ALICE, state="released", released_at=T0)
    _job(db, box, ALICE, ["python", "train.py"])
    _job(db, box, BOB, ["python", "eval.py"])
    with db.session() as session:
        session.add(Budget(scope="user", subject=ALICE, limit_micros=50_000_000, created_by="U"))
    clock.advance(hours=2)

    view = home_view(rt, ALICE)

    [mine] = view.mine
    assert (mine.id, mine.name, mine.gpu_count, mine.util_pct) == (box, "box", 2, 60)
    assert mine.deadline_at == T0 + timedelta(hours=3)
    assert mine.cost_micros == 4_200_000
    assert [item.name for item in view.fleet] == ["bobs", "box"]
    assert [(job.instance_name, job.command) for job in view.jobs] == [("box", "python train.py")]
    assert view.spent_micros == 4_200_000
    assert view.budget_micros == 50_000_000
    assert view.budget_used_pct == 8
    assert view.month == "2026-12"
    assert home_view(rt, BOB).budget_micros is None


def test_the_home_costs_the_same_queries_for_one_instance_or_thirty(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(T0 + timedelta(hours=1)))
    add_instance(sqlite_db, name="box0", owner_id=ALICE)
    home_view(rt, ALICE)  # the ledger catches up once
    with counting_statements(sqlite_db) as one:
        home_view(rt, ALICE)
    for n in range(1, 30):
        add_instance(sqlite_db, name=f"box{n}", owner_id=ALICE if n % 2 else BOB)
    home_view(rt, ALICE)
    with counting_statements(sqlite_db) as thirty:
        view = home_view(rt, ALICE)
    assert len(view.fleet) == 30
    assert len(thirty) == len(one)


def test_a_stopped_instance_shows_what_its_disk_costs(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(T0))
    add_instance(
        sqlite_db,
        name="parked",
        owner_id=ALICE,
        state="stopped",
        stopped_at=T0,
        disk_gb=100,
        storage_micros_per_gb_month=100_000,
    )
    [item] = home_view(rt, ALICE).mine
    assert item.state == "stopped"
    assert 0 < item.burn_micros_per_hour < 2_100_000
