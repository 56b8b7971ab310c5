"""What a Home reads follows the person: the facts a poll stores equal a parse of its status,
the Home built from them shows what one built from every parsed status showed, the person's
spend equals the team-wide sum's share, and the fleet's figures equal the whole listing's."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import insert, update
from sqlmodel import col, select

from agents.protocol import StatusSnapshot, dumps, from_dict
from bot.blocks import home as home_blocks
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services import home
from bot.services.home import FLEET_SHOWN, HomeView, home_view
from bot.services.instances import fleet_views
from bot.services.instances.lookup import (
    compare_facts,
    compare_gpus,
    facts_from_json,
    facts_json,
    status_columns,
    status_facts,
)
from bot.services.money import budgets
from bot.store.db import Database
from bot.store.models import Instance, Job, Person
from tests.agents.factories import make_gpu, make_nvml_error, make_process, make_status
from tests.bot.services.support import T0, Clock, add_instance, counting_statements, make_runtime

ALICE = "UALICE"
BOB = "UBOB"
H100_MEM = 80 * 1024**3
A100_40_MEM = 40 * 1024**3

#: Snapshots of every kind a view tells apart: matching, fewer cards, another model, less
#: memory, a MIG slice, NVML failing, no GPU, GPUs that report no utilisation.
SNAPSHOTS: dict[str, StatusSnapshot] = {
    "match": make_status(n=2, processes=[make_process(0)]),
    "busy": make_status([make_gpu(0, util_gpu_pct=91), make_gpu(1, util_gpu_pct=30)]),
    "another": make_status(
        [make_gpu(0, name="NVIDIA A100-SXM4-40GB", mem_total_bytes=A100_40_MEM, sm_count=108)]
    ),
    "mixed": make_status(
        [
            make_gpu(0),
            make_gpu(1, name="NVIDIA A100-SXM4-40GB", mem_total_bytes=A100_40_MEM, sm_count=108),
            make_gpu(2, name="NVIDIA A100-SXM4-40GB", mem_total_bytes=A100_40_MEM, sm_count=108),
        ]
    ),
    "mig": make_status([make_gpu(0, name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", sm_count=16)]),
    "small": make_status([make_gpu(0, mem_total_bytes=A100_40_MEM)]),
    "nvml": make_status([], nvml_error=make_nvml_error()),
    "none": make_status([]),
    "unmeasured": make_status([make_gpu(0, util_gpu_pct=None), make_gpu(1, util_gpu_pct=None)]),
}
RENTED = [("H100", 2), ("H100", 4), ("A100", 1), (None, 2), (None, None), ("RTX 4090", 1)]


@pytest.mark.parametrize("kind", sorted(SNAPSHOTS))
def test_the_stored_facts_equal_a_parse_of_the_stored_status(kind: str) -> None:
    status = SNAPSHOTS[kind]
    columns = status_columns(status)
    parsed = from_dict(StatusSnapshot, json.loads(str(columns["last_status_json"])))
    facts = status_facts(parsed)
    stored = facts_from_json(str(columns["status_facts_json"]))

    assert stored == facts
    assert columns["status_util_pct"] == facts.util_pct
    assert columns["status_gpu_count"] == len(parsed.gpus)
    assert len(str(columns["status_facts_json"])) < len(str(columns["last_status_json"])) / 3
    for language in ("en", "zh"):
        with speaking(language):
            for model, count in RENTED:
                assert compare_facts(model, count, stored) == compare_gpus(model, count, parsed)


def test_facts_of_another_layout_are_not_read() -> None:
    facts = status_facts(SNAPSHOTS["match"])
    assert facts_from_json(facts_json(facts).replace('"v":1', '"v":99')) is None
    assert facts_from_json("not json") is None
    assert facts_from_json('{"v":1,"gpus":[[0]]}') is None


def _team(db: Database, *, with_facts: bool) -> None:
    """Alice's four instances and Bob's three, with statuses of every kind, a stopped one and
    running jobs; the statuses stored as a poll stores them, or (``with_facts`` False) as
    before their facts were."""
    kinds = sorted(SNAPSHOTS)
    people = [ALICE] * 4 + [BOB] * 3
    for n, owner in enumerate(people):
        status = SNAPSHOTS[kinds[n % len(kinds)]]
        stored = status_columns(status) if with_facts else {"last_status_json": dumps(status)}
        model, count = RENTED[n % len(RENTED)]
        add_instance(
            db,
            name=f"box{n}",
            owner_id=owner,
            gpu_model=model,
            gpu_count=count,
            price_per="gpu_hour" if n % 2 else "instance_hour",
            deadline_at=T0 + timedelta(hours=5 - n),
            last_polled_at=T0,
            **stored,
        )
    parked_facts = facts_json(status_facts(SNAPSHOTS["busy"]))
    add_instance(
        db,
        name="parked",
        owner_id=ALICE,
        state="stopped",
        stopped_at=T0,
        disk_gb=100,
        storage_micros_per_gb_month=100_000,
        last_status_json=dumps(SNAPSHOTS["busy"]),
        **({"status_facts_json": parked_facts} if with_facts else {}),
    )
    add_instance(db, name="unpriced", owner_id=BOB, state="stopped", stopped_at=T0)
    add_instance(db, name="gone", owner_id=ALICE, state="released", released_at=T0)
    with db.session() as session:
        for n, (instance, who) in enumerate([(1, ALICE), (2, BOB), (5, ALICE), (6, ALICE)]):
            session.add(
                Job(
                    instance_id=instance,
                    agent_job_id=f"j{n}",
                    requested_by=who,
                    command_json=json.dumps(["python", f"run{n}.py"]),
                    state="running",
                    started_at=T0,
                )
            )


def _whole_fleet(rt: Runtime, view: HomeView) -> HomeView:
    """``view`` with its fleet as the Home listed it before: every instance's row of the
    overview (each status parsed), no summary."""
    rows = fleet_views.list_instances(rt).rows
    fleet = tuple(home._instance(rt, row, view.user_id, view.now) for row in rows)
    return HomeView(**{**vars(view), "fleet": fleet, "summary": None})


@pytest.mark.parametrize("with_facts", [True, False], ids=["polled", "stored-before"])
def test_the_home_shows_what_the_whole_parsed_fleet_showed(
    sqlite_db: Database, with_facts: bool
) -> None:
    _team(sqlite_db, with_facts=with_facts)
    rt = make_runtime(sqlite_db, Clock(T0 + timedelta(hours=2)))
    for user in (ALICE, BOB, "UNOBODY"):
        view = home_view(rt, user)
        before = _whole_fleet(rt, view)
        for language in ("en", "zh"):
            with speaking(language):
                assert home_blocks.home_view(view) == home_blocks.home_view(before)
    view = home_view(rt, ALICE)
    assert [item.name for item in view.mine] == ["box3", "box2", "box1", "box0", "parked"]
    assert [(job.instance_name, job.id) for job in view.jobs] == [
        ("box0", 1),
        ("box4", 3),
        ("box5", 4),
    ]
    listed = [
        (row.instance.name, job.id)
        for row in fleet_views.list_instances(rt).rows
        for job in row.running_jobs
        if job.requested_by == ALICE
    ]
    assert [(job.instance_name, job.id) for job in view.jobs] == listed
    assert view.fleet_count == 9
    shown = {item.name: item for item in _whole_fleet(rt, view).fleet}
    for item in view.mine:
        assert item == shown[item.name]


def test_stored_facts_and_parsed_statuses_make_the_same_home(sqlite_db: Database) -> None:
    _team(sqlite_db, with_facts=True)
    rt = make_runtime(sqlite_db, Clock(T0 + timedelta(hours=2)))
    polled = home_view(rt, ALICE)
    with sqlite_db.session() as session:
        session.exec(update(Instance).values(status_facts_json=None, status_util_pct=None))  # type: ignore[call-overload]
    assert home_view(rt, ALICE) == polled


def test_the_persons_spend_is_their_share_of_the_team_wide_sum(sqlite_db: Database) -> None:
    _team(sqlite_db, with_facts=True)
    clock = Clock(T0 + timedelta(hours=3, minutes=20))
    rt = make_runtime(sqlite_db, clock)
    tz = rt.settings.tz()
    with sqlite_db.session() as session:  # one released earlier this month, settled
        session.exec(
            update(Instance)  # type: ignore[call-overload]
            .where(col(Instance.name) == "gone")
            .values(released_at=T0 + timedelta(hours=1), release_mode="terminate")
        )
    for _ in range(3):  # each person's first, accruing only theirs; then the team's
        mine = {user: home.month_spent_micros(rt, user, clock.now, tz) for user in (ALICE, BOB)}
        spent = budgets.month_to_date(sqlite_db, clock.now, tz)
        assert mine == {user: spent.by_user.get(user, 0) for user in (ALICE, BOB)}
        assert home.month_spent_micros(rt, "UNOBODY", clock.now, tz) == 0
        assert spent.by_user[ALICE] > 0
        clock.advance(hours=1, minutes=7)


def test_the_fleet_summary_equals_the_whole_listing(sqlite_db: Database) -> None:
    _team(sqlite_db, with_facts=True)
    rt = make_runtime(sqlite_db, Clock(T0 + timedelta(hours=2)))
    overview = fleet_views.list_instances(rt)
    summary = fleet_views.fleet_summary(rt, nearest=3)

    assert summary.count == len(overview.rows) == 9
    assert summary.burn_micros_per_hour == overview.hourly_burn_micros
    assert summary.storage_unknown == 1
    assert dict(summary.by_state) == {"active": 7, "stopped": 2}
    soonest = sorted(
        (r for r in overview.rows if r.instance.deadline_at is not None),
        key=lambda r: (r.instance.deadline_at, r.instance.name),
    )[:3]
    assert [d.name for d in summary.nearest] == [r.instance.name for r in soonest]


def test_a_large_team_is_counted_not_listed(sqlite_db: Database) -> None:
    """Past ``FLEET_SHOWN`` the Home lists the first by name and counts the rest, as it did,
    and reads the same number of statements for a team of 10 and of 250."""
    rt = make_runtime(sqlite_db, Clock(T0 + timedelta(hours=1)))
    add_instance(sqlite_db, name="mine", owner_id=ALICE, **status_columns(SNAPSHOTS["busy"]))
    polled = status_columns(SNAPSHOTS["match"])
    home_view(rt, ALICE)

    def grow(to: int) -> None:
        with sqlite_db.session() as session:
            have = len(session.exec(select(Instance.name)).all())
            if session.get(Person, BOB) is None:
                session.add(Person(slack_id=BOB))
                session.flush()
            rows = [
                {
                    "name": f"team{n:04d}",
                    "owner_id": BOB,
                    "state": "active",
                    "host": f"10.9.{n // 256}.{n % 256}",
                    "port": 22,
                    "ssh_user": "root",
                    "price_micros": 1_000_000 + n % 3,
                    "gpu_model": "H100",
                    "gpu_count": 1,
                    "created_at": T0,
                    **polled,
                }
                for n in range(have - 1, to - 1)
            ]
            session.execute(insert(Instance), rows)

    grow(10)
    home_view(rt, ALICE)
    with counting_statements(sqlite_db) as small:
        home_view(rt, ALICE)
    grow(FLEET_SHOWN + 50)
    home_view(rt, ALICE)
    with counting_statements(sqlite_db) as large:
        view = home_view(rt, ALICE)
    assert len(large) == len(small)
    assert len(view.fleet) == FLEET_SHOWN
    assert view.fleet_count == FLEET_SHOWN + 50
    assert view == HomeView(**{**vars(view)})
    before = _whole_fleet(rt, view)
    assert len(before.fleet) == FLEET_SHOWN + 50
    assert home_blocks.home_view(view) == home_blocks.home_view(before)
    assert "50 more not shown." in json.dumps(home_blocks.home_view(view))
