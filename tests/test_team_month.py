"""The team-month simulation (bench/team_month.py): the same seed gives the same report (on
PostgreSQL with two processes too, whatever order its rows lie in), a
build broken on purpose (a warning skipped, a post doubled, a charge dropped, a job's reply
dropped) is caught by the invariant that guards it, every kind of fault fires in a day, jobs
run through the real job service and each ending gets one reply, Home and `/gpu bills` agree
with spend and the platform, the closed month's digest is checked when a run crosses a month's
end, the stand-in agent runs its queue as gpu-agent does, and what the simulation found stays
reproduced."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlmodel import select

from agents.protocol import parse_gpus
from bot.services.instances import releases
from bot.services.money import costs, ledger, spend
from bot.store.db import Database
from bot.store.models import Charge, Instance, Person

ROOT = Path(__file__).resolve().parents[1]
ACTIVE = ("queued", "running")


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("team_month", ROOT / "bench" / "team_month.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["team_month"] = module
    spec.loader.exec_module(module)
    return module


HARNESS = _harness()


def _month(
    *extra: str, seed: int = 11, days: float = 0.5, people: int = 4, instances: int = 6
) -> dict[str, Any]:
    args = HARNESS.parse_args(
        [
            *("--seed", str(seed), "--days", str(days), "--jobs", "20"),
            *("--people", str(people), "--instances", str(instances)),
            *extra,
        ]
    )
    report, _trace, _logged = HARNESS.run(args)
    return dict(report)


def _made_once(factory: pytest.TempPathFactory, worker_id: str, name: str, **kw: Any) -> Any:
    """The report of ``_month(**kw)``, made once for all of a run's test workers: the first
    worker to need it makes it and keeps it in the run's temporary folder (shared by its
    workers), the others wait for it and read it (pytest-xdist's recipe for a fixture made
    once). A worker that fails to make it leaves nothing behind, so the next one tries."""
    if worker_id == "master":  # not distributed
        return _month(**kw)
    root = factory.getbasetemp().parent
    kept = root / f"team_month_{name}.json"
    with (root / f"team_month_{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kept.exists():
            return json.loads(kept.read_text())
        report = _month(**kw)
        kept.write_text(json.dumps(report))
        return report


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    """Two days of a small team (the issue's two-day seeds on every change)."""
    return dict(_made_once(tmp_path_factory, worker_id, "clean", days=2.0))


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    """A day with more people and machines: every kind of fault fires in it."""
    return dict(
        _made_once(tmp_path_factory, worker_id, "day", seed=5, days=1.0, people=6, instances=10)
    )


def test_a_clean_run_keeps_every_promise(clean: dict[str, Any]) -> None:
    assert clean["violations"] == []
    assert clean["instances"] >= 6
    # The bot's month is the platforms' bill, and what they told it of an end only later.
    assert clean["bot_month_micros"] == clean["platform_month_micros"] + clean["told_late_micros"]
    assert clean["platform_month_micros"] > 0
    assert sum(clean["faults"].values()) > 0
    # Every call went through the bot's own clients to the platforms' stand-ins, over HTTP,
    # and RunPod's answers fit its OpenAPI document.
    assert clean["runpod"]["answers_by_status"]["200"] > 0
    assert clean["vast"]["answers_by_status"]["200"] > 0
    assert clean["lambda"]["answers_by_status"]["200"] > 0
    assert clean["currency"] == "USD"
    assert clean["runpod"]["answers_checked"] > 0
    assert clean["runpod"]["answer_problems"] == 0


def test_jobs_run_through_the_job_service_and_each_ending_gets_one_reply(
    clean: dict[str, Any],
) -> None:
    asked = clean["jobs_asked"]
    # A job the agent did not confirm is kept for the poll to find; one refused is not; one
    # whose bot process died while taking it may have been taken.
    most = sum(asked.get(k, 0) for k in ("taken", "Unreachable", "through_slack"))
    most += asked.get("killed_while_taken", 0)
    assert asked.get("taken", 0) <= clean["jobs"] <= most
    finished = sum(n for state, n in clean["jobs_by_state"].items() if state not in ACTIVE)
    assert finished >= 5
    assert clean["jobs_without_one_reply"] == 0
    assert clean["home_vs_spend_micros"] == clean["home_vs_platform_micros"] == 0


def test_people_also_ask_through_the_bolt_app_with_signed_requests(
    clean: dict[str, Any], day: dict[str, Any]
) -> None:
    """Commands and clicks (warnings' buttons: a day has enough of them) go through the Bolt
    app as signed requests, and the app refuses none."""
    assert clean["slack_requests"].get("command_200", 0) > 0
    sent = day["slack_requests"]
    assert sent.get("command_200", 0) > 0
    assert sent.get("click_200", 0) > 0
    for report in (clean, day):
        assert set(report["slack_requests"]) <= {"command_200", "click_200", "double_click"}


def test_the_same_seed_gives_the_same_report() -> None:
    first, again = _month(), _month()  # half a day each
    assert first["instances"] >= 6
    assert sum(first["faults"].values()) > 0
    assert {k: v for k, v in again.items() if k != "wall_s"} == {
        k: v for k, v in first.items() if k != "wall_s"
    }


#: The tables whose rows the bot reads in batches (small beside charges and samples), with the
#: key they are reversed by.
SHUFFLED = {
    "instance": "id",
    "prompt": "id",
    "job": "id",
    "launch": "id",
    "release": "id",
    "outbox": "id",
    "budget": "id",
    "budgetalert": "id",
    "stepclaim": "id",
    "keygrant": "id",
    "instanceaccess": "id",
    "person": "slack_id",
    "ledgerstate": "instance_id",
    "billfetch": "provider",
    "platformbill": "start_at",
}


def _reverse_heaps(db: Database) -> None:
    """Rewrite every row of :data:`SHUFFLED`'s tables, last key first, in one round trip: an
    unordered read on PostgreSQL follows the heap, so it now meets them newest first."""
    loops = "".join(
        f"FOR r IN SELECT ctid AS at FROM {table} ORDER BY {key} DESC LOOP "
        f"UPDATE {table} SET {key} = {key} WHERE ctid = r.at; END LOOP; "
        for table, key in SHUFFLED.items()
    )
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"DO $$ DECLARE r record; BEGIN {loops}END $$;")


@pytest.mark.integration
def test_the_same_seed_gives_the_same_report_on_postgresql_whatever_order_rows_lie_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two bot processes on PostgreSQL, one of them killed, keep every promise; and twice: as
    they come, then with the rows rewritten newest first before every tick. PostgreSQL's
    unordered reads follow the heap, which updates and vacuum reorder as they please; a read
    whose order matters says so, and the report holds."""
    month = {"seed": 5, "days": 0.5, "people": 6, "instances": 10}
    plain = _month("--store", "postgresql", **month)
    assert plain["processes"] == 2
    assert plain["faults"]["process_kill"] >= 1
    assert plain["store_inconsistencies"] == 0
    assert plain["violations"] == []
    real_tick = HARNESS.tick

    def after_a_reversal(rt: Any, now: datetime) -> Any:
        _reverse_heaps(rt.db)
        return real_tick(rt, now)

    monkeypatch.setattr(HARNESS, "tick", after_a_reversal)
    reversed_ = _month("--store", "postgresql", **month)
    assert plain["instances"] >= 10
    assert {k: v for k, v in reversed_.items() if k != "wall_s"} == {
        k: v for k, v in plain.items() if k != "wall_s"
    }


@pytest.mark.parametrize(
    ("broken", "figure"),
    [
        ("double_post", "doubled_messages"),
        ("drop_charge", "digest_vs_platform_micros"),
        ("skip_warning", "unwarned_releases"),
        ("drop_reply", "jobs_without_one_reply"),
    ],
)
def test_a_build_broken_on_purpose_is_caught(broken: str, figure: str) -> None:
    report = _month("--break", broken, days=0.25)
    assert report[figure] > 0
    assert report["violations"]


def test_every_fault_kind_fires_in_a_day_and_the_bills_agree(day: dict[str, Any]) -> None:
    report = day
    missing = [kind for kind in HARNESS.FAULT_KINDS if report["faults"].get(kind, 0) == 0]
    assert missing == []
    # The platforms' faults reached the bot as their HTTP answers: 500s, 503s in the outage,
    # a catch-all 404 page or the platform's own 404, 429s, a 409 for the locked pod (RunPod
    # locks), and a release done whose answer was dropped.
    answers = {name: report[name]["answers_by_status"] for name in ("runpod", "vast", "lambda")}
    assert "409" in answers["runpod"]
    for statuses in answers.values():
        assert {"404", "429", "500", "503"} <= set(statuses)
    assert sum(statuses["lost"] for statuses in answers.values()) >= 1
    # The platform publishes its bills to the start of today: the first day is on them.
    assert report["bill_lines"] > 0
    assert report["bills_vs_platform_micros"] == 0
    assert report["violations"] == []


def test_the_admin_and_strangers_act_and_nobody_acts_on_what_is_not_theirs(
    clean: dict[str, Any],
) -> None:
    actions = clean["actions"]
    assert actions.get("budget_set", 0) + actions.get("lifetime_cap", 0) >= 2
    assert sum(n for kind, n in actions.items() if kind.startswith("not_theirs_")) > 0
    assert clean["unauthorised_changes"] == 0


def test_a_run_across_a_month_end_checks_the_closed_months_digest() -> None:
    report = _month("--start", "2027-03-31T18:00", seed=3, days=0.3)
    assert report["closed_months"] == 1
    assert report["start"] == "2027-03-31T18:00"
    assert set(report["spend_micros_by_month"]) == {"2027-03", "2027-04"}
    assert report["closed_digest_vs_platform_micros"] == 0
    assert report["digests_missing"] == 0
    assert report["status_vs_platform_micros"] == 0
    assert report["per_owner_vs_platform_micros"] == 0


def test_a_machine_ended_behind_the_bots_back_is_not_charged_past_its_end(
    tmp_path: Path,
) -> None:
    db = Database(f"sqlite:///{tmp_path}/gpubot.db")
    db.migrate()
    tz = ZoneInfo("UTC")
    start = datetime(2027, 3, 1, 18, 0)
    try:
        with db.session() as session:
            session.add(Person(slack_id="UP001"))
            session.flush()
            inst = Instance(
                name="box19",
                owner_id="UP001",
                state="active",
                host="127.0.0.1",
                port=30_019,
                ssh_user="root",
                price_micros=2_200 * 3600,
                gpu_model="H100",
                gpu_count=1,
                provider="runpod",
                provider_instance_id="pod0019xyz",
                billing_increment="second",
                min_charge_s=0,
                billing_from="created",
                created_at=start,
                deadline_at=start + timedelta(hours=6),
            )
            session.add(inst)
            session.flush()
            assert inst.id is not None
            instance_id = inst.id
        # The hour 18:00-19:00 is charged while the store believes the machine runs ...
        ledger.accrue(db, start + timedelta(hours=1), tz)
        # ... and the platform then says it ended at 18:55 (reconciliation stops the meter).
        with db.session() as session:
            releases.mark_instance_released(
                session,
                instance_id,
                now=start + timedelta(hours=1, minutes=5),
                mode="terminate",
                at=start + timedelta(minutes=55),
            )
        now = start + timedelta(hours=1, minutes=5)
        ledger.accrue(db, now, tz)
        with db.session() as session:
            released = session.get(Instance, instance_id)
            assert released is not None
            shown = costs.since_registered_micros(released, now)
        billed = 55 * 60 * 2_200
        assert shown == billed
        assert spend.month_total_micros(db, "2027-03", tz=tz, now=now) == billed
    finally:
        db.dispose()


def _sim_job(
    agents: Any, job_id: str, fate: str, run_s: int, gpus: str | None, retries: int = 0
) -> Any:
    at = datetime(2027, 3, 1, 12, 0)
    return agents.SimJob(
        id=job_id,
        name=None,
        command=("python", "train.py", f"--sim={fate}:{run_s}"),
        request=parse_gpus(gpus),
        retries=retries,
        fate=fate,
        run_s=run_s,
        created_at=at,
        updated_at=at,
    )


def test_the_stand_in_agent_runs_its_queue_as_gpu_agent_does() -> None:
    agents = sys.modules["bench.sim.agents"]
    host = agents.SimHost("box0", "pod0000xyz", gpu_count=2)
    at = datetime(2027, 3, 1, 12, 0)
    host.submit(_sim_job(agents, "1", "ok", 600, "all"), at)
    host.submit(_sim_job(agents, "2", "flaky", 300, "any:1", retries=1), at)
    host.submit(_sim_job(agents, "3", "oom", 300, "0", retries=2), at)
    host.submit(_sim_job(agents, "4", "hang", 60, None), at)
    assert [j.state for j in host.jobs.values()] == ["running", "queued", "queued", "queued"]
    host.advance(at + timedelta(seconds=600))  # 1 ends; 2 and 3 take a GPU each
    assert host.jobs["1"].state == "succeeded"
    assert host.jobs["2"].assigned == (0,)
    assert host.jobs["2"].state == "running"
    assert host.jobs["3"].state == "queued"  # it wants GPU 0, which 2 holds
    assert host.jobs["4"].assigned == ()  # first come, first served: behind 3
    host.advance(at + timedelta(seconds=1_500))
    # 2 failed once and was retried; 3 failed at each of its three attempts.
    assert (host.jobs["2"].state, host.jobs["2"].attempt, host.jobs["2"].exit_code) == (
        "succeeded",
        1,
        0,
    )
    assert host.jobs["3"].state == "running"
    assert host.jobs["3"].attempt == 1
    host.advance(at + timedelta(hours=5))
    assert (host.jobs["3"].state, host.jobs["3"].attempt, host.jobs["3"].exit_code) == (
        "failed",
        2,
        1,
    )
    assert host.jobs["4"].state == "running"  # a hang never ends on its own
    record = agents.record_of(host.jobs["3"])
    assert record.summary is not None
    assert record.summary.diagnoses[0].code == "cuda_oom"


def test_a_process_killed_mid_post_leaves_the_post_landed_and_dies() -> None:
    processes = sys.modules["bench.sim.processes"]
    world_module = sys.modules["bench.sim.world"]
    world = world_module.World(rng=__import__("random").Random(1))
    clock = world_module.SimClock(datetime(2027, 3, 1))
    slack = world_module.SimSlack(world, clock)
    doom = processes.Doom(at="post", after=True)
    handle = processes.ProcessSlack(slack, doom)
    with pytest.raises(processes.Killed):
        handle.post("CTEAM", "hello", key="outbox:1")
    assert [p.key for p in slack.posts] == ["outbox:1"]
    assert doom.fired
    assert doom.at is None
    handle.post("CTEAM", "again", key="outbox:2")  # a doom fires once
    assert len(slack.posts) == 2


def test_the_stores_own_check_finds_what_no_run_may_leave(tmp_path: Path) -> None:
    processes = sys.modules["bench.sim.processes"]
    db = Database(f"sqlite:///{tmp_path}/gpubot.db")
    db.migrate()
    at = datetime(2027, 3, 1, 12, 0)
    try:
        with db.session() as session:
            session.add(Person(slack_id="UP001"))
            session.flush()
            # The same machine, reached as another user (the store's unique key holds the user).
            for name, user in (("box1", "root"), ("box2", "ubuntu")):
                session.add(
                    Instance(
                        name=name,
                        owner_id="UP001",
                        state="active",
                        host="127.0.0.1",
                        port=30_001,
                        ssh_user=user,
                        price_micros=3_600,
                        created_at=at,
                    )
                )
        assert processes.store_consistent(db, at) == ["127.0.0.1:30001: 2 live registrations"]
        with db.session() as session:
            box2 = session.exec(select(Instance).where(Instance.name == "box2")).one()
            box2.state = "released"
            box1 = session.exec(select(Instance).where(Instance.name == "box1")).one()
            assert box1.id is not None
            hour = timedelta(hours=1)
            for start in (at, at + hour, at + 3 * hour):
                session.add(
                    Charge(instance_id=box1.id, kind="compute", start_at=start, end_at=start + hour)
                )
        assert processes.store_consistent(db, at) == [
            f"instance {box1.id}: no charge 2027-03-01 14:00:00-2027-03-01 15:00:00"
        ]
    finally:
        db.dispose()


def test_the_back_off_rule_excuses_what_the_platform_failed_and_nothing_more() -> None:
    """A release the platform failed four times in a row (5-minute ticks) may take the doubling
    back-off's steps; a busy 409 after an hour of failures allows one first step, not the
    doubling: the wait the bot took before it started over was found by the simulation."""
    from bench.sim.promise import _after_failed_calls

    deadline = datetime(2027, 3, 6, 13, 35)
    base = deadline + timedelta(minutes=20)  # the notice window and two ticks
    four = [(deadline + timedelta(minutes=5 * n), n == 0) for n in range(4)]
    moved = _after_failed_calls(base, deadline, four, 300)
    # The fourth failure (13:50) allows the fourth step (8 min) and two ticks.
    assert moved == deadline + timedelta(minutes=15 + 8 + 10)
    # Six failures (an outage) allow up to the sixth step, 32 min, after the last (14:00).
    outage = [(deadline + timedelta(minutes=5 * n), False) for n in range(6)]
    assert _after_failed_calls(base, deadline, outage, 300) == datetime(2027, 3, 6, 14, 42)
    # Then, inside that, a 409: the platform is up, so it allows one first step, where a
    # seventh failure of the platform allows the doubling's next step (60 min, the most).
    then = datetime(2027, 3, 6, 14, 35)
    busy = _after_failed_calls(base, deadline, [*outage, (then, True)], 300)
    failed = _after_failed_calls(base, deadline, [*outage, (then, False)], 300)
    assert busy == then + timedelta(minutes=1 + 10)
    assert failed == then + timedelta(minutes=60 + 10)
    # Failures after the limit passed, or before the deadline, excuse nothing.
    late = [(base + timedelta(minutes=1), False)]
    assert _after_failed_calls(base, deadline, late, 300) == base
    early = [(deadline - timedelta(minutes=1), False)]
    assert _after_failed_calls(base, deadline, early, 300) == base


@pytest.mark.parametrize("name", ["runpod", "vast"])
def test_a_platform_tells_of_an_end_only_when_asked_and_the_rule_allows_no_more(name: str) -> None:
    """A machine terminated in the platform's console is gone from its answers, with no end
    time: the bot may meter it to the moment the platform first answered that it was gone
    (here a list without it), and not past that, nor stop before the end."""
    import random

    from bench.sim.platforms import Platforms
    from bench.sim.world import SimClock, World

    start = datetime(2027, 3, 1, 12, 0)
    clock = SimClock(start)
    world = World(rng=random.Random(1), calm=True)
    with Platforms(world, clock, [HARNESS.PLATFORMS[name]]) as platforms:
        [platform] = platforms.all
        machine = platform.open(550, 30_001, start)
        other = platform.open(275, 30_002, start)
        clock.now = start + timedelta(minutes=55)
        platforms.end_outside(machine.provider_id, clock.now)
        platforms.end_outside(other.provider_id, clock.now)
        clock.now = told = start + timedelta(hours=1)
        listed = {item.provider_id for item in platform.list_instances()}
        assert machine.provider_id not in listed
        # The platform's own bill stops at the end: 55 minutes of compute and disks.
        per_s = 550 + platform.disk_per_s
        assert platforms.bill_micros(machine, told) == 55 * 60 * per_s
        problems = platforms.settle(
            {
                machine.provider_id: told,  # stopped when the platform said it was gone
                other.provider_id: told + timedelta(minutes=5),  # nobody told it then
            },
            told,
        )
        assert problems == [
            f"box{int(''.join(c for c in other.provider_id if c.isdigit()))}: the meter stopped "
            f"at 03-01 13:05, when {name} had not told the bot that the machine (ended "
            "03-01 12:55) was gone"
        ]
        # The bot may say 5 minutes more than the platform billed for the first.
        late = 5 * 60 * per_s
        assert platforms.owed_micros(machine, told) == platforms.bill_micros(machine, told) + late
        assert platforms.owed_micros(other, told) == platforms.bill_micros(other, told)
        assert platforms.unseen_end_micros(told) == late
        # A meter that stopped before the machine's end is the bot's error too.
        early = platforms.settle({machine.provider_id: start + timedelta(minutes=50)}, told)
        assert len(early) == 1
        assert "before the machine ended" in early[0]


@pytest.mark.parametrize("start", ["2027-03-31T18:30", "2027-03-31T18:00+08:00", "31.03.2027"])
def test_a_start_off_the_hour_or_in_a_zone_is_refused_with_what_to_give(
    start: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        HARNESS.parse_args(["--start", start])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--start" in err
    assert "YYYY-MM-DDTHH:00" in err or "whole UTC hour" in err
