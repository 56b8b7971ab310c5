"""Looking at instances (overview, list, detail, health) on SQLite and PostgreSQL, with the real
local transport running the real agent (its NVML faked: no GPU here)."""

from __future__ import annotations

import json
from typing import cast

import pytest

from bot.errors import NotFound
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import fleet_views, registration
from bot.store.db import Database
from bot.store.models import Instance, Job
from tests.bot.services.support import Clock, add_instance, local_request, rows

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM", user_name="owner")
OTHER = Caller(user_id="UOTHER", channel_id="CTEAM")


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


@pytest.fixture
def clock(rt: Runtime) -> Clock:
    return cast(Clock, rt.clock)


# --- reading ----------------------------------------------------------------------------------


def test_fleet_overview_shows_every_instance_and_survives_broken_ones(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    registration.register(rt, OWNER, local_request())
    unpinned = add_instance(db, name="nokey", host="10.255.0.1", owner_id="UOTHER")
    add_instance(db, name="gone", host="10.255.0.2", state="released")
    local_id = next(i.id for i in rows(db, Instance) if i.name == "local")  # rows: any order
    with db.session() as session:
        session.add(
            Job(
                instance_id=local_id,
                agent_job_id="j1",
                requested_by="UOTHER",
                command_json=json.dumps(["python", "train.py"]),
                state="running",
            )
        )
    clock.advance(hours=1)

    overview = fleet_views.fleet_overview(rt)

    assert [r.instance.name for r in overview.rows] == ["local", "nokey"]
    local, nokey = overview.rows
    assert local.live
    assert len(local.gpus) == 2
    assert local.running_jobs[0].command == "python train.py"
    assert local.cost_micros == 4_200_000
    assert local.instance.deadline_at is not None
    assert not nokey.live
    assert nokey.problem is not None
    assert nokey.problem.kind == "HostKeyNotPinned"
    assert overview.hourly_burn_micros == 4_200_000 + 2_100_000
    with db.session() as session:
        stored = session.get(Instance, local_id)
        assert stored is not None
        assert stored.last_status_at == clock.now
        broken = session.get(Instance, unpinned)
        assert broken is not None
        assert "no host key is pinned" in (broken.last_error or "")


def test_list_reads_the_store_without_asking_anyone(rt: Runtime, db: Database) -> None:
    add_instance(db, name="far", host="10.255.0.1")  # unreachable if anyone asked
    overview = fleet_views.list_instances(rt)
    [row] = overview.rows
    assert row.instance.name == "far"
    assert row.problem is None
    assert not row.live


def test_instance_detail_and_health_of_local(rt: Runtime) -> None:
    registration.register(rt, OWNER, local_request())
    detail = fleet_views.instance_detail(rt, "local")
    assert detail.row.live
    assert detail.driver_version == "550.54.15"
    assert detail.hostname
    report = fleet_views.health(rt, OTHER, "local")  # everyone may read
    assert report.instance.name == "local"
    assert {c.status for c in report.checks} <= {"pass", "warn", "fail", "skip"}
    assert "identity" in {c.id for c in report.checks}
    with pytest.raises(NotFound, match="no instance called 'nope'"):
        fleet_views.instance_detail(rt, "nope")
    with pytest.raises(NotFound):
        fleet_views.health(rt, OWNER, "nope")
