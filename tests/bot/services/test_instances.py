"""Instance services on SQLite and PostgreSQL, with the real local transport running the real
agent (its NVML faked: no GPU here) and a real sshd for registration over SSH."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlmodel import select

from agents.protocol import (
    DriverInfo,
    GpuSnapshot,
    HostInfo,
    NvmlError,
    StatusSnapshot,
)
from bot.blocks import instances as blocks
from bot.errors import (
    AuthenticationFailed,
    BudgetExceeded,
    Conflict,
    HostKeyChanged,
    NotAuthorized,
    NotFound,
    Unreachable,
    UsageError,
)
from bot.listeners import error_reply
from bot.runtime import Runtime
from bot.services import audit, budgets, polling
from bot.services import instances as svc
from bot.services.access import Caller
from bot.services.instances import RegisterRequest
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, Job, Prompt, Release
from tests.bot.services.support import Clock, RecordingNotifier, add_instance
from tests.fixtures.fake_nvml import FakeNvml
from tests.fixtures.instances import A100_80
from tests.fixtures.sshd import SshServer, make_client_key

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM", user_name="owner")
OTHER = Caller(user_id="UOTHER", channel_id="CTEAM")
ADMIN = Caller(user_id="UADMIN", channel_id="CTEAM")
A100_40 = "NVIDIA A100-SXM4-40GB"


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


@pytest.fixture
def clock(rt: Runtime) -> Clock:
    return cast(Clock, rt.clock)


@pytest.fixture
def notifier(rt: Runtime) -> RecordingNotifier:
    return cast(RecordingNotifier, rt.notifier)


def _local(**changes: object) -> RegisterRequest:
    values: dict[str, object] = {
        "name": "local",
        "address": "local",
        "gpu_model": "a100",
        "gpu_count": 2,
        "price_micros_per_hour": 4_200_000,
        "release_in": timedelta(hours=3),
    }
    values.update(changes)
    return RegisterRequest(**values)  # type: ignore[arg-type]


def _rows(db: Database, model: type[Any]) -> list[Any]:
    with db.session() as session:
        return list(session.exec(select(model)).all())


def _audit(db: Database, **filters: object) -> list[AuditLog]:
    with db.session() as session:
        return audit.entries(session, **filters)  # type: ignore[arg-type]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- register ---------------------------------------------------------------------------------


def test_register_local_stores_the_instance_with_meter_and_deadline(
    rt: Runtime, db: Database, clock: Clock, notifier: RecordingNotifier
) -> None:
    result = svc.register(rt, OWNER, _local(project="llm"))

    assert result.mismatch is None
    assert result.host_key_fingerprint is None
    assert [g.name for g in result.gpus] == [A100_80, A100_80]
    assert result.health.checks
    assert result.agent_version
    [inst] = _rows(db, Instance)
    assert (inst.name, inst.owner_id, inst.state, inst.host) == (
        "local",
        "UOWNER",
        "active",
        "local",
    )
    assert inst.deadline_at == clock.now + timedelta(hours=3)
    assert inst.price_micros == 4_200_000
    assert inst.channel_id == "CTEAM"
    assert inst.project == "llm"
    assert inst.delivered_gpu_count == 2
    assert inst.host_key_b64 is None
    assert inst.last_status_json is not None
    assert json.loads(inst.last_status_json)["gpus"]
    [row] = _rows(db, AuditLog)
    assert (row.actor, row.action, row.instance_id) == ("UOWNER", "register", inst.id)
    assert audit.details(row)["after"]["gpu_model"] == "a100"
    assert notifier.posts == []


def test_register_reports_a_gpu_mismatch_loudly_to_owner_and_channels(
    rt: Runtime, db: Database, fake_nvml: FakeNvml, notifier: RecordingNotifier
) -> None:
    fake_nvml.gpus(1, A100_40)
    result = svc.register(rt, OWNER, _local(gpu_model="a100 80gb", gpu_count=2))

    assert result.mismatch is not None
    problems = " ".join(result.mismatch.problems)
    assert "fewer cards: 1 delivered, 2 rented" in problems
    assert "less memory" in problems
    assert sorted(p.channel for p in notifier.posts) == ["COPS", "CTEAM", "UOWNER"]
    assert all("GPU mismatch on local" in p.text for p in notifier.posts)
    assert len(_rows(db, Instance)) == 1  # still registered: the owner decides what to do


def test_register_rejects_bad_input_and_changes_nothing(rt: Runtime, db: Database) -> None:
    bad = [
        _local(name="Local"),
        _local(name="box", address="local"),
        _local(name="local", address="root@10.0.0.1"),
        _local(gpu_count=0),
        _local(gpu_count=65),
        _local(release_in=timedelta(hours=1), release_at=rt.now() + timedelta(hours=2)),
        _local(release_at=rt.now() - timedelta(minutes=1)),
        _local(provider="azure"),
        _local(provider="aws"),  # an AWS instance needs its id
        _local(billing="fortnight"),
        _local(disk_gb=-1.0),
        _local(key_name="../../etc/ssh/ssh_host_ed25519_key"),
        _local(key_name="/root/.ssh/id_ed25519"),
        _local(key_name="bot"),  # no key directory is configured
        _local(price_micros_per_hour=-1),
    ]
    for request in bad:
        with pytest.raises(UsageError):
            svc.register(rt, OWNER, request)
    assert _rows(db, Instance) == []
    assert _rows(db, AuditLog) == []


def test_register_a_taken_name_from_another_address_is_a_conflict(
    rt: Runtime, db: Database
) -> None:
    add_instance(db, name="box1", host="10.0.0.1")
    request = _local(name="box1", address=f"root@127.0.0.1:{_closed_port()}")
    # Someone else's name at a machine that does not answer: refused for the name.
    with pytest.raises(Conflict, match=r"taken by an instance at root@10\.0\.0\.1"):
        svc.register(rt, OTHER, request)
    assert len(_rows(db, Instance)) == 1


@pytest.mark.integration
def test_register_an_unreachable_host_stores_nothing(rt: Runtime, db: Database) -> None:
    request = _local(name="box1", address=f"root@127.0.0.1:{_closed_port()}")
    with pytest.raises(Unreachable) as info:
        svc.register(rt, OWNER, request)
    assert info.value.hint
    assert _rows(db, Instance) == []
    assert _rows(db, AuditLog) == []


def test_registering_again_keeps_the_deadline_unless_given_one(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    svc.register(rt, OWNER, _local())
    svc.extend(rt, OWNER, "local", timedelta(hours=1))
    with pytest.raises(Conflict, match="already registered as local, held by <@UOWNER>"):
        svc.register(rt, OTHER, _local(release_in=None))
    again = svc.register(rt, OWNER, _local(release_in=None, price_micros_per_hour=1_000_000))
    assert again.re_registered
    assert again.instance.deadline_at == clock.now + timedelta(hours=4)
    assert again.instance.price_micros_per_hour == 1_000_000
    moved = svc.register(rt, ADMIN, _local(release_in=timedelta(minutes=30)))
    assert moved.instance.deadline_at == clock.now + timedelta(minutes=30)
    assert moved.instance.owner_id == "UOWNER"
    assert len(_rows(db, Instance)) == 1
    assert [r.action for r in _rows(db, AuditLog)] == [
        "register",
        "extend",
        "re_register",
        "re_register",
    ]


def test_ensure_local_instance_is_idempotent(rt: Runtime, db: Database) -> None:
    first = svc.ensure_local_instance(rt, "UOWNER")
    second = svc.ensure_local_instance(rt, "USOMEONE")
    assert first.id == second.id
    assert first.is_local
    [inst] = _rows(db, Instance)
    assert inst.deadline_at is None
    assert inst.agent_home == str(rt.settings.data_dir / "local-agent")


# --- over SSH ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_register_over_ssh_pins_the_host_key_and_re_registers_after_a_change(
    rt: Runtime, db: Database, sshd: SshServer, notifier: RecordingNotifier, tmp_path: Path
) -> None:
    address = f"{sshd.user}@{sshd.host}:{sshd.port}"
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
    request = _local(
        name="box1",
        address=address,
        key_name=sshd.client_key_path.name,
        agent_home=str(tmp_path / "remote-home"),
        gpu_count=1,
    )
    result = svc.register(rt, OWNER, request)

    assert result.host_key_fingerprint == sshd.host_key.fingerprint
    [inst] = _rows(db, Instance)
    assert inst.host_key_fingerprint == sshd.host_key.fingerprint
    assert inst.host_key_b64 == sshd.host_key.key_b64
    # No NVIDIA driver behind this sshd: registered, with the mismatch said loudly.
    assert result.mismatch is not None
    assert "no GPU is visible" in result.mismatch.problems[0]
    notifier.posts.clear()

    overview = svc.fleet_overview(rt)
    [row] = overview.rows
    assert row.live
    assert row.problem is None

    new_key = sshd.restart_with_new_host_key()
    [polled] = polling.poll_instances(rt, rt.now())  # the scheduler's poll sees it first
    assert not polled.ok
    assert len(notifier.to("UOWNER")) == 1
    for _ in range(2):
        [row] = svc.fleet_overview(rt).rows
        assert row.problem is not None
        assert row.problem.kind == "HostKeyChanged"
    alerts = notifier.to("UOWNER")
    assert len(alerts) == 1  # once per presented key, however often it is seen
    assert new_key.fingerprint in alerts[0].text
    assert sshd.host_key.fingerprint in alerts[0].text
    with pytest.raises(HostKeyChanged):
        svc.health(rt, OTHER, "box1")
    assert len(notifier.to("UOWNER")) == 1

    with pytest.raises(Conflict, match="held by <@UOWNER>"):
        svc.register(rt, OTHER, request)
    again = svc.register(rt, OWNER, request)
    assert again.re_registered
    assert again.host_key_fingerprint == new_key.fingerprint
    [inst] = _rows(db, Instance)
    assert inst.host_key_fingerprint == new_key.fingerprint
    [prompt] = _rows(db, Prompt)
    assert (prompt.kind, prompt.resolution) == ("host_key_changed", "re_registered")
    [row] = svc.fleet_overview(rt).rows
    assert row.live
    actions = [r.action for r in _rows(db, AuditLog)]
    assert actions == ["register", "re_register"]


def test_a_second_instance_over_ssh_beside_local_and_its_failures_read_well(
    rt: Runtime, db: Database, sshd: SshServer, notifier: RecordingNotifier, tmp_path: Path
) -> None:
    svc.ensure_local_instance(rt, OWNER.user_id)
    address = f"{sshd.user}@{sshd.host}:{sshd.port}"
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
    request = _local(
        name="box2",
        address=address,
        key_name=sshd.client_key_path.name,
        agent_home=str(tmp_path / "remote-home"),
        gpu_count=1,
    )
    # A key the instance does not trust: refused, said so with what to do, nothing stored.
    wrong = make_client_key(sshd.directory)
    with pytest.raises(AuthenticationFailed) as refused:
        svc.register(rt, OWNER, replace(request, key_name=wrong.name))
    text = error_reply(refused.value).text
    assert "box2" in text
    assert "authorized_keys" in text
    # Nothing listens there: Unreachable, with a hint.
    with pytest.raises(Unreachable) as unreachable:
        svc.register(rt, OWNER, replace(request, address=f"root@127.0.0.1:{_closed_port()}"))
    assert "SSH port" in error_reply(unreachable.value).text
    assert [i.name for i in _rows(db, Instance)] == ["local"]

    result = svc.register(rt, OWNER, request)
    assert result.host_key_fingerprint == sshd.host_key.fingerprint
    _, shown = blocks.register_result(result)
    assert sshd.host_key.fingerprint in json.dumps(shown)  # the pinned key, shown in Slack
    rows = {row.instance.name: row for row in svc.fleet_overview(rt).rows}
    assert sorted(rows) == ["box2", "local"]
    assert rows["box2"].live
    assert rows["local"].live
    notifier.posts.clear()

    # A changed host key: refused, the owner alerted with both fingerprints, the message says
    # what to do; `local` keeps working.
    new_key = sshd.restart_with_new_host_key()
    with pytest.raises(HostKeyChanged) as changed:
        svc.health(rt, OTHER, "box2")
    text = error_reply(changed.value).text
    assert "re-register" in text
    [alert] = notifier.to("UOWNER")
    assert new_key.fingerprint in alert.text
    assert sshd.host_key.fingerprint in alert.text
    assert svc.health(rt, OTHER, "local").checks

    # sshd gone: box2 shows Unreachable in the overview, `local` is unaffected.
    sshd.kill()
    rows = {row.instance.name: row for row in svc.fleet_overview(rt).rows}
    assert rows["box2"].problem is not None
    assert rows["box2"].problem.kind == "Unreachable"
    assert "1 not reachable" in blocks.fleet_overview(svc.fleet_overview(rt))[0]
    assert rows["local"].live
    assert rows["local"].problem is None


# --- reading ----------------------------------------------------------------------------------


def test_fleet_overview_shows_every_instance_and_survives_broken_ones(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    svc.register(rt, OWNER, _local())
    unpinned = add_instance(db, name="nokey", host="10.255.0.1", owner_id="UOTHER")
    add_instance(db, name="gone", host="10.255.0.2", state="released")
    local_id = _rows(db, Instance)[0].id
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

    overview = svc.fleet_overview(rt)

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
    overview = svc.list_instances(rt)
    [row] = overview.rows
    assert row.instance.name == "far"
    assert row.problem is None
    assert not row.live


def test_instance_detail_and_health_of_local(rt: Runtime) -> None:
    svc.register(rt, OWNER, _local())
    detail = svc.instance_detail(rt, "local")
    assert detail.row.live
    assert detail.driver_version == "550.54.15"
    assert detail.hostname
    report = svc.health(rt, OTHER, "local")  # everyone may read
    assert report.instance.name == "local"
    assert {c.status for c in report.checks} <= {"pass", "warn", "fail", "skip"}
    assert "identity" in {c.id for c in report.checks}
    with pytest.raises(NotFound, match="no instance called 'nope'"):
        svc.instance_detail(rt, "nope")
    with pytest.raises(NotFound):
        svc.health(rt, OWNER, "nope")


# --- extend -----------------------------------------------------------------------------------


def test_extend_by_owner_and_admin_is_audited(rt: Runtime, db: Database, clock: Clock) -> None:
    deadline = clock.now + timedelta(hours=1)
    inst_id = add_instance(db, name="box1", deadline_at=deadline)

    view = svc.extend(rt, OWNER, "box1", timedelta(hours=2))
    assert view.deadline_at == deadline + timedelta(hours=2)
    view = svc.extend(rt, ADMIN, "box1", timedelta(minutes=30))
    assert view.deadline_at == deadline + timedelta(hours=2, minutes=30)
    rows = _audit(db, instance_id=inst_id)
    assert [(r.actor, r.action) for r in rows] == [("UADMIN", "extend"), ("UOWNER", "extend")]
    assert audit.details(rows[1])["by_s"] == 7200


def test_extend_after_the_deadline_passed_counts_from_now(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    add_instance(db, name="box1", deadline_at=clock.now - timedelta(minutes=10))
    view = svc.extend(rt, OWNER, "box1", timedelta(hours=1))
    assert view.deadline_at == clock.now + timedelta(hours=1)


def test_extend_by_someone_else_is_refused_and_changes_nothing(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    deadline = clock.now + timedelta(hours=1)
    add_instance(db, name="box1", deadline_at=deadline)
    with pytest.raises(NotAuthorized, match="Only <@UOWNER>"):
        svc.extend(rt, OTHER, "box1", timedelta(hours=2))
    [inst] = _rows(db, Instance)
    assert inst.deadline_at == deadline
    assert _rows(db, AuditLog) == []


def test_only_an_admin_extends_past_the_lifetime_cap(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    deadline = clock.now + timedelta(hours=1)
    cap = clock.now + timedelta(hours=2)
    add_instance(db, name="box1", deadline_at=deadline, lifetime_cap_at=cap)
    with pytest.raises(NotAuthorized, match="at most") as info:
        svc.extend(rt, OWNER, "box1", timedelta(hours=2))
    assert "admin" in info.value.hint
    assert _rows(db, Instance)[0].deadline_at == deadline
    assert svc.extend(rt, OWNER, "box1", timedelta(hours=1)).deadline_at == cap
    view = svc.extend(rt, ADMIN, "box1", timedelta(hours=5))
    assert view.deadline_at == cap + timedelta(hours=5)
    [last, _] = _audit(db, action="extend")
    assert audit.details(last)["past_cap"] is True


def test_past_a_used_up_budget_only_an_admin_extends(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    deadline = clock.now + timedelta(hours=4)
    add_instance(db, name="box1", project="llm", created_at=clock.now, deadline_at=deadline)
    budgets.set_budget(rt, ADMIN, "project", "llm", 4_000_000)  # two hours at $2.10/h
    assert svc.extend(rt, OWNER, "box1", timedelta(hours=1)).deadline_at == deadline + timedelta(
        hours=1
    )
    clock.advance(hours=2)
    with pytest.raises(BudgetExceeded, match="project llm is used up") as info:
        svc.extend(rt, OWNER, "box1", timedelta(hours=1))
    assert "admin" in info.value.hint
    assert _rows(db, Instance)[0].deadline_at == deadline + timedelta(hours=1)
    assert len(_audit(db, action="extend")) == 1
    # Someone else still hears that they may not, not about the budget.
    with pytest.raises(NotAuthorized, match="Only <@UOWNER>"):
        svc.extend(rt, OTHER, "box1", timedelta(hours=1))
    view = svc.extend(rt, ADMIN, "box1", timedelta(hours=1))
    assert view.deadline_at == deadline + timedelta(hours=2)


def test_extend_odd_cases(rt: Runtime, db: Database, clock: Clock) -> None:
    add_instance(db, name="box1", state="releasing", deadline_at=clock.now)
    add_instance(db, name="old", state="released")
    with pytest.raises(Conflict, match="releasing"):
        svc.extend(rt, OWNER, "box1", timedelta(hours=1))
    with pytest.raises(NotFound):
        svc.extend(rt, OWNER, "old", timedelta(hours=1))
    with pytest.raises(UsageError):
        svc.extend(rt, OWNER, "box1", timedelta(0))


# --- release ----------------------------------------------------------------------------------


def test_ask_release_changes_nothing_and_needs_owner_or_admin(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    add_instance(db, name="box1", created_at=clock.now - timedelta(hours=2))
    with pytest.raises(NotAuthorized):
        svc.ask_release(rt, OTHER, "box1")
    ask = svc.ask_release(rt, OWNER, "box1")
    assert ask.manual
    assert ask.cost_micros == 4_200_000
    assert svc.ask_release(rt, ADMIN, "box1").instance.name == "box1"
    assert _rows(db, Release) == []
    assert _rows(db, Instance)[0].state == "active"


def test_release_of_a_manual_instance_waits_for_the_owner(
    rt: Runtime, db: Database, clock: Clock, notifier: RecordingNotifier
) -> None:
    inst_id = add_instance(db, name="box1", created_at=clock.now - timedelta(hours=1))
    with pytest.raises(NotAuthorized):
        svc.release(rt, OTHER, inst_id)
    assert _rows(db, Release) == []

    view = svc.release(rt, OWNER, inst_id)
    assert view.manual
    assert view.state == "awaiting_owner"
    asked = notifier.to("UOWNER")
    assert asked
    assert "instance_release_done" in asked[-1].action_ids()
    assert _rows(db, Instance)[0].released_at is None  # the meter still runs

    clock.advance(minutes=20)
    with pytest.raises(NotAuthorized):
        svc.confirm_released(rt, OTHER, inst_id)
    done = svc.confirm_released(rt, OWNER, inst_id)
    assert done.state == "confirmed"
    [inst] = _rows(db, Instance)
    assert (inst.state, inst.released_at) == ("released", clock.now)
    again = svc.confirm_released(rt, OWNER, inst_id)  # a second click changes nothing
    assert again.release_id == done.release_id
    actions = [r.action for r in _rows(db, AuditLog)]
    assert actions.count("release_confirmed") == 1
    with pytest.raises(Conflict, match="already released"):
        svc.release(rt, OWNER, inst_id)


def test_release_of_an_unknown_instance_is_not_found(rt: Runtime) -> None:
    with pytest.raises(NotFound):
        svc.release(rt, OWNER, 999)
    with pytest.raises(NotFound):
        svc.ask_release(rt, OWNER, "nope")


# --- host key alerts --------------------------------------------------------------------------


def test_a_changed_host_key_alerts_the_owner_once_per_presented_key(
    rt: Runtime, db: Database, notifier: RecordingNotifier
) -> None:
    add_instance(db, name="box1", host_key_fingerprint="SHA256:old")
    with db.session() as session:
        inst = session.exec(select(Instance)).one()

    def changed(presented: str) -> HostKeyChanged:
        return HostKeyChanged(
            "box1: host key changed",
            instance="box1",
            expected_fingerprint="SHA256:old",
            presented_fingerprint=presented,
        )

    svc.handle_fleet_error(rt, inst, changed("SHA256:new"))
    svc.handle_fleet_error(rt, inst, changed("SHA256:new"))
    svc.handle_fleet_error(rt, inst, changed("SHA256:other"))
    alerts = notifier.to("UOWNER")
    assert len(alerts) == 2
    assert "SHA256:old" in alerts[0].text
    assert "SHA256:new" in alerts[0].text
    assert "SHA256:other" in alerts[1].text
    assert len(_rows(db, Prompt)) == 2


def test_a_failed_alert_is_retried_later(
    rt: Runtime, db: Database, notifier: RecordingNotifier
) -> None:
    add_instance(db, name="box1", host_key_fingerprint="SHA256:old")
    with db.session() as session:
        inst = session.exec(select(Instance)).one()
    error = HostKeyChanged("changed", instance="box1", presented_fingerprint="SHA256:new")
    notifier.fail_posts = True
    svc.handle_fleet_error(rt, inst, error)  # never raises
    notifier.fail_posts = False
    svc.handle_fleet_error(rt, inst, error)
    assert len(notifier.to("UOWNER")) == 1


# --- pure parts -------------------------------------------------------------------------------


def _snapshot(*gpus: tuple[str, int, int], nvml_error: NvmlError | None = None) -> StatusSnapshot:
    return StatusSnapshot(
        host=HostInfo("h", "linux", "6", "3.11", "0.1", 8, None, None, False, False),
        driver=None if nvml_error else DriverInfo("550", "12.4", None),
        nvml_error=nvml_error,
        gpus=tuple(
            GpuSnapshot(
                index=i,
                uuid=f"GPU-{i}",
                name=name,
                pci_bus_id="0",
                mem_total_bytes=mem,
                mem_used_bytes=0,
                mem_free_bytes=mem,
                util_gpu_pct=0,
                util_mem_pct=0,
                temp_c=30,
                power_draw_w=None,
                power_limit_w=None,
                power_default_limit_w=None,
                sm_clock_mhz=None,
                sm_clock_max_mhz=None,
                clock_event_reasons=None,
                ecc_mode_enabled=None,
                ecc_uncorrected_volatile=None,
                remapped_rows_pending=None,
                remapped_rows_failure=None,
                retired_pages_pending=None,
                pcie_gen_current=None,
                pcie_gen_max=None,
                pcie_width_current=None,
                pcie_width_max=None,
                persistence_mode=None,
                mig_mode=None,
                compute_capability=None,
                sm_count=sms,
            )
            for i, (name, mem, sms) in enumerate(gpus)
        ),
        processes=(),
        collected_at="2026-12-02T12:00:00+00:00",
    )


MIB = 1024**2
H100 = ("NVIDIA H100 80GB HBM3", 81559 * MIB, 132)
A100_80_GPU = (A100_80, 81920 * MIB, 108)
A100_40_GPU = (A100_40, 40960 * MIB, 108)
RTX4090 = ("NVIDIA GeForce RTX 4090", 24564 * MIB, 128)


def test_compare_gpus_agrees_when_delivered_as_rented() -> None:
    assert svc.compare_gpus("h100", 2, _snapshot(H100, H100)) is None
    assert svc.compare_gpus("a100", 1, _snapshot(A100_40_GPU)) is None  # either A100 will do
    assert svc.compare_gpus(None, None, _snapshot()) is None
    assert svc.compare_gpus("h100", 1, _snapshot(H100, H100)) is None  # more is not less


def test_compare_gpus_finds_fewer_cards_another_model_and_less_memory() -> None:
    fewer = svc.compare_gpus("h100", 8, _snapshot(H100, H100))
    assert fewer is not None
    assert fewer.problems == ("fewer cards: 2 delivered, 8 rented",)
    other = svc.compare_gpus("a100", 2, _snapshot(RTX4090, RTX4090))
    assert other is not None
    assert other.problems == (
        "less memory: NVIDIA GeForce RTX 4090 has 24 GiB, the rented a100 has 40 GiB or more "
        "(2 cards)",
    )
    wrong = svc.compare_gpus("h100", 1, _snapshot(A100_80_GPU))
    assert wrong is not None
    assert "another model" in wrong.problems[0]
    smaller = svc.compare_gpus("a100 80gb", 1, _snapshot(A100_40_GPU))
    assert smaller is not None
    assert smaller.problems[0].startswith("less memory: NVIDIA A100-SXM4-40GB has 40 GiB")
    mig = ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * 1024 * MIB, 42)
    slice_ = svc.compare_gpus("a100", 1, _snapshot(mig))
    assert slice_ is not None
    assert slice_.problems[0].startswith("another model: NVIDIA A100-SXM4-80GB MIG 3g.40gb is not")


def test_compare_gpus_without_nvml_says_no_gpu_is_visible() -> None:
    error = NvmlError("library_not_found", "libnvidia-ml.so.1 not found", "install the driver")
    found = svc.compare_gpus("a100", 1, _snapshot(nvml_error=error))
    assert found is not None
    assert found.problems == ("no GPU is visible: libnvidia-ml.so.1 not found",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("root@203.0.113.7", svc.Address("root", "203.0.113.7", 22)),
        ("ubuntu@gpu.example.com:2222", svc.Address("ubuntu", "gpu.example.com", 2222)),
        ("root@[::1]:2222", svc.Address("root", "::1", 2222)),
        ("root@[2001:db8::7]", svc.Address("root", "2001:db8::7", 22)),
        ("root@2001:db8::7", svc.Address("root", "2001:db8::7", 22)),
        (" me.x@host ", svc.Address("me.x", "host", 22)),
    ],
)
def test_parse_address(text: str, expected: svc.Address) -> None:
    assert svc.parse_address(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "host",
        "@host",
        "root@",
        "root@host:0",
        "root@host:65536",
        "root@host:ssh",
        "root@[::1",
        "root@[::1]x",
        "root@[zz::1]",
        "root@bad_host",
        "root@-host",
        "ro ot@host",
        "root@host:22:33x",
        "",
    ],
)
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        svc.parse_address(text)
    assert info.value.hint


@pytest.mark.parametrize(
    ("user", "host", "port"), [("root", "203.0.113.7", 22), ("u", "2001:db8::1", 2222)]
)
def test_format_address_reads_back(user: str, host: str, port: int) -> None:
    assert svc.parse_address(svc.format_address(user, host, port)) == svc.Address(user, host, port)


@pytest.mark.parametrize("name", ["a", "box-1", "0abc", "a" * 31])
def test_valid_names(name: str) -> None:
    assert svc.validate_name(name) == name


@pytest.mark.parametrize("name", ["", "-box", "Box", "box_1", "a" * 32, "box 1", "bøx"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(UsageError, match="not a valid instance name"):
        svc.validate_name(name)
