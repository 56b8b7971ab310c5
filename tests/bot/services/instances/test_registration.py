"""Registering instances on SQLite and PostgreSQL, with the real local transport running the real
agent (its NVML faked: no GPU here) and a real sshd for registration over SSH."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest

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
    Conflict,
    HostKeyChanged,
    Unreachable,
    UsageError,
)
from bot.i18n import speaking
from bot.listeners import error_reply
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import fleet_views, lifecycle, lookup, polling, registration
from bot.services.speaking import audit
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, Prompt
from tests.bot.services.support import (
    Clock,
    RecordingNotifier,
    add_instance,
    grant_key,
    local_request,
    rows,
)
from tests.chinese import assert_chinese
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


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- register ---------------------------------------------------------------------------------


def test_register_local_stores_the_instance_with_meter_and_deadline(
    rt: Runtime, db: Database, clock: Clock, notifier: RecordingNotifier
) -> None:
    result = registration.register(rt, OWNER, local_request(project="llm"))

    assert result.mismatch is None
    assert result.host_key_fingerprint is None
    assert [g.name for g in result.gpus] == [A100_80, A100_80]
    assert result.health.checks
    assert result.agent_version
    [inst] = rows(db, Instance)
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
    [row] = rows(db, AuditLog)
    assert (row.actor, row.action, row.instance_id) == ("UOWNER", "register", inst.id)
    assert audit.details(row)["after"]["gpu_model"] == "a100"
    assert notifier.posts == []


def test_register_reports_a_gpu_mismatch_in_the_reply_and_once_to_the_ops_channel(
    rt: Runtime, db: Database, fake_nvml: FakeNvml, notifier: RecordingNotifier
) -> None:
    fake_nvml.gpus(1, A100_40)
    result = registration.register(rt, OWNER, local_request(gpu_model="a100 80gb", gpu_count=2))

    assert result.mismatch is not None
    problems = " ".join(result.mismatch.problems)
    assert "fewer cards: 1 delivered, 2 rented" in problems
    assert "less memory" in problems
    # One message (it used to be three: the owner, the ops channel and the caller's channel,
    # where the reply already says it).
    assert [p.channel for p in notifier.posts] == ["COPS"]
    assert "GPU mismatch on local" in notifier.posts[0].text
    assert "GPU mismatch on local" in blocks.register_result(result)[0] + str(
        blocks.register_result(result)[1]
    )
    assert len(rows(db, Instance)) == 1  # still registered: the owner decides what to do


def test_a_mismatch_is_said_in_the_callers_language_and_the_workspaces_to_the_ops_channel(
    rt: Runtime, fake_nvml: FakeNvml, notifier: RecordingNotifier
) -> None:
    fake_nvml.gpus(1, A100_40)
    with speaking("zh"):
        result = registration.register(rt, OWNER, local_request(gpu_model="a100", gpu_count=2))
    assert result.mismatch is not None
    [problem] = result.mismatch.problems
    assert_chinese(problem)
    assert problem != "fewer cards: 1 delivered, 2 rented"
    assert "1" in problem
    [ops] = notifier.posts
    assert ops.channel == "COPS"
    assert "fewer cards: 1 delivered, 2 rented" in ops.text


def test_a_mismatch_is_not_posted_again_where_the_reply_went(
    rt: Runtime, fake_nvml: FakeNvml, notifier: RecordingNotifier
) -> None:
    fake_nvml.gpus(1, A100_40)
    in_ops = Caller(user_id="UOWNER", channel_id="COPS")
    result = registration.register(rt, in_ops, local_request(gpu_model="a100", gpu_count=2))
    assert result.mismatch is not None
    assert notifier.posts == []


def _shown(message: tuple[str, object]) -> str:
    return message[0] + json.dumps(message[1])


def test_a_mismatch_shows_in_status_list_and_detail_while_it_holds(
    rt: Runtime, fake_nvml: FakeNvml
) -> None:
    fake_nvml.gpus(4, "NVIDIA GeForce RTX 4090")
    registration.register(rt, OWNER, local_request(gpu_model="A100", gpu_count=8))
    said = "rented 8x A100, delivered 4x NVIDIA GeForce RTX 4090"

    assert said in _shown(blocks.fleet_overview(fleet_views.fleet_overview(rt)))
    assert said in _shown(blocks.instance_list(fleet_views.list_instances(rt)))
    assert said in _shown(blocks.instance_detail(fleet_views.instance_detail(rt, "local")))

    fake_nvml.gpus(8, A100_80)  # the platform fixed it
    for shown in (
        _shown(blocks.fleet_overview(fleet_views.fleet_overview(rt))),
        _shown(blocks.instance_list(fleet_views.list_instances(rt))),
        _shown(blocks.instance_detail(fleet_views.instance_detail(rt, "local"))),
    ):
        assert "delivered" not in shown
        assert "8x A100" in shown


@pytest.mark.integration
def test_a_registration_without_a_deadline_says_it_got_the_default(
    rt: Runtime, db: Database, clock: Clock, sshd: SshServer, tmp_path: Path
) -> None:
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory, default_release_in_s=3600)
    grant_key(db, sshd.client_key_path.name, OWNER.user_id)
    request = local_request(
        name="box1",
        address=f"{sshd.user}@{sshd.host}:{sshd.port}",
        key_name=sshd.client_key_path.name,
        agent_home=str(tmp_path / "remote-home"),
        gpu_model=None,
        gpu_count=None,
        release_in=None,
    )
    result = registration.register(rt, OWNER, request)
    [inst] = rows(db, Instance)
    assert inst.deadline_at == clock.now + timedelta(hours=1)
    assert result.default_deadline_s == 3600
    shown = _shown(blocks.register_result(result))
    assert "(1h left) (the default; `--release-in` or `--release-at` to choose)" in shown

    again = registration.register(rt, OWNER, request)  # a re-registration keeps its deadline
    assert again.re_registered
    assert again.default_deadline_s is None
    assert "the default" not in _shown(blocks.register_result(again))


def test_a_registration_with_a_deadline_does_not_call_it_the_default(rt: Runtime) -> None:
    result = registration.register(rt, OWNER, local_request())
    assert result.default_deadline_s is None
    assert "the default" not in _shown(blocks.register_result(result))


def test_the_registration_reply_and_status_show_the_settings(rt: Runtime) -> None:
    request = local_request(
        billing="minute", min_charge_s=600, disk_gb=200.0, storage_micros_per_gb_month=100_000
    )
    result = registration.register(rt, OWNER, request)
    detail = _shown(blocks.instance_detail(fleet_views.instance_detail(rt, "local")))
    for shown in (_shown(blocks.register_result(result)), detail):
        for line in (
            "at the deadline: release",
            "idle: prompt only",
            "when its jobs are done: kept",
            "lifetime cap: none",
            "billing: per minute, minimum charge 10m",
            "disk: 200 GB at $0.10/GB-month",
        ):
            assert line in shown, line


def test_a_used_up_budget_stops_a_new_registration_but_not_an_admin(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    from bot.errors import BudgetExceeded
    from bot.services.money import budgets
    from tests.bot.services.support import add_instance

    add_instance(db, name="old", owner_id="UOWNER", created_at=clock.now, price_micros=10_000_000)
    budgets.set_budget(rt, ADMIN, "user", "UOWNER", 5_000_000)
    clock.advance(hours=1)  # $10 of a $5 budget
    with pytest.raises(BudgetExceeded, match="is used up") as info:
        registration.register(rt, OWNER, local_request())
    assert "admin" in info.value.hint
    assert [i.name for i in rows(db, Instance)] == ["old"]
    assert [r.action for r in rows(db, AuditLog)] == ["budget_set"]

    registration.register(rt, ADMIN, local_request())
    assert sorted(i.name for i in rows(db, Instance)) == ["local", "old"]


def test_register_rejects_bad_input_and_changes_nothing(rt: Runtime, db: Database) -> None:
    bad = [
        local_request(name="Local"),
        local_request(name="box", address="local"),
        local_request(name="local", address="root@10.0.0.1"),
        local_request(gpu_count=0),
        local_request(gpu_count=65),
        local_request(release_in=timedelta(hours=1), release_at=rt.now() + timedelta(hours=2)),
        local_request(release_at=rt.now() - timedelta(minutes=1)),
        local_request(provider="azure"),
        local_request(provider="aws"),  # an AWS instance needs its id
        local_request(billing="fortnight"),
        local_request(disk_gb=-1.0),
        local_request(key_name="../../etc/ssh/ssh_host_ed25519_key"),
        local_request(key_name="/root/.ssh/id_ed25519"),
        local_request(key_name="bot"),  # no key directory is configured
        local_request(price_micros_per_hour=-1),
    ]
    for request in bad:
        with pytest.raises(UsageError):
            registration.register(rt, OWNER, request)
    assert rows(db, Instance) == []
    assert rows(db, AuditLog) == []


def test_register_a_taken_name_from_another_address_is_a_conflict(
    rt: Runtime, db: Database
) -> None:
    add_instance(db, name="box1", host="10.0.0.1")
    request = local_request(name="box1", address=f"root@127.0.0.1:{_closed_port()}")
    # Someone else's name at a machine that does not answer: refused for the name.
    with pytest.raises(Conflict, match=r"taken by an instance at root@10\.0\.0\.1"):
        registration.register(rt, OTHER, request)
    assert len(rows(db, Instance)) == 1


@pytest.mark.integration
def test_register_an_unreachable_host_stores_nothing(rt: Runtime, db: Database) -> None:
    request = local_request(name="box1", address=f"root@127.0.0.1:{_closed_port()}")
    with pytest.raises(Unreachable) as info:
        registration.register(rt, OWNER, request)
    assert info.value.hint
    assert rows(db, Instance) == []
    assert rows(db, AuditLog) == []


def test_registering_again_keeps_the_deadline_unless_given_one(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    registration.register(rt, OWNER, local_request())
    lifecycle.extend(rt, OWNER, "local", timedelta(hours=1))
    with pytest.raises(Conflict, match="already registered as local, held by <@UOWNER>"):
        registration.register(rt, OTHER, local_request(release_in=None))
    again = registration.register(
        rt, OWNER, local_request(release_in=None, price_micros_per_hour=1_000_000)
    )
    assert again.re_registered
    assert again.instance.deadline_at == clock.now + timedelta(hours=4)
    assert again.instance.price_micros_per_hour == 1_000_000
    moved = registration.register(rt, ADMIN, local_request(release_in=timedelta(minutes=30)))
    assert moved.instance.deadline_at == clock.now + timedelta(minutes=30)
    assert moved.instance.owner_id == "UOWNER"
    assert len(rows(db, Instance)) == 1
    assert [r.action for r in rows(db, AuditLog)] == [
        "register",
        "extend",
        "re_register",
        "re_register",
    ]


def test_ensure_local_instance_is_idempotent(rt: Runtime, db: Database) -> None:
    first = registration.ensure_local_instance(rt, "UOWNER")
    second = registration.ensure_local_instance(rt, "USOMEONE")
    assert first.id == second.id
    assert first.is_local
    [inst] = rows(db, Instance)
    assert inst.deadline_at is None
    assert inst.agent_home == str(rt.settings.data_dir / "local-agent")


# --- over SSH ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_register_over_ssh_pins_the_host_key_and_re_registers_after_a_change(
    rt: Runtime, db: Database, sshd: SshServer, notifier: RecordingNotifier, tmp_path: Path
) -> None:
    address = f"{sshd.user}@{sshd.host}:{sshd.port}"
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
    grant_key(rt.db, sshd.client_key_path.name, OWNER.user_id, OTHER.user_id)
    request = local_request(
        name="box1",
        address=address,
        key_name=sshd.client_key_path.name,
        agent_home=str(tmp_path / "remote-home"),
        gpu_count=1,
    )
    result = registration.register(rt, OWNER, request)

    assert result.host_key_fingerprint == sshd.host_key.fingerprint
    [inst] = rows(db, Instance)
    assert inst.host_key_fingerprint == sshd.host_key.fingerprint
    assert inst.host_key_b64 == sshd.host_key.key_b64
    # No NVIDIA driver behind this sshd: registered, with the mismatch said loudly.
    assert result.mismatch is not None
    assert "no GPU is visible" in result.mismatch.problems[0]
    notifier.posts.clear()

    overview = fleet_views.fleet_overview(rt)
    [row] = overview.rows
    assert row.live
    assert row.problem is None

    new_key = sshd.restart_with_new_host_key()
    [polled] = polling.poll_instances(rt, rt.now())  # the scheduler's poll sees it first
    assert not polled.ok
    assert len(notifier.to("UOWNER")) == 1
    for _ in range(2):
        [row] = fleet_views.fleet_overview(rt).rows
        assert row.problem is not None
        assert row.problem.kind == "HostKeyChanged"
    alerts = notifier.to("UOWNER")
    assert len(alerts) == 1  # once per presented key, however often it is seen
    assert new_key.fingerprint in alerts[0].text
    assert sshd.host_key.fingerprint in alerts[0].text
    with pytest.raises(HostKeyChanged):
        fleet_views.health(rt, OTHER, "box1")
    assert len(notifier.to("UOWNER")) == 1

    with pytest.raises(Conflict, match="held by <@UOWNER>"):
        registration.register(rt, OTHER, request)
    again = registration.register(rt, OWNER, request)
    assert again.re_registered
    assert again.host_key_fingerprint == new_key.fingerprint
    [inst] = rows(db, Instance)
    assert inst.host_key_fingerprint == new_key.fingerprint
    [prompt] = rows(db, Prompt)
    assert (prompt.kind, prompt.resolution) == ("host_key_changed", "re_registered")
    [row] = fleet_views.fleet_overview(rt).rows
    assert row.live
    actions = [r.action for r in rows(db, AuditLog)]
    assert actions == ["register", "re_register"]


def test_a_second_instance_over_ssh_beside_local_and_its_failures_read_well(
    rt: Runtime, db: Database, sshd: SshServer, notifier: RecordingNotifier, tmp_path: Path
) -> None:
    registration.ensure_local_instance(rt, OWNER.user_id)
    address = f"{sshd.user}@{sshd.host}:{sshd.port}"
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
    grant_key(rt.db, sshd.client_key_path.name, OWNER.user_id, OTHER.user_id)
    request = local_request(
        name="box2",
        address=address,
        key_name=sshd.client_key_path.name,
        agent_home=str(tmp_path / "remote-home"),
        gpu_count=1,
    )
    # A key the instance does not trust: refused, said so with what to do, nothing stored.
    wrong = make_client_key(sshd.directory)
    grant_key(rt.db, wrong.name, OWNER.user_id)
    with pytest.raises(AuthenticationFailed) as refused:
        registration.register(rt, OWNER, replace(request, key_name=wrong.name))
    text = error_reply(refused.value).text
    assert "box2" in text
    assert "authorized_keys" in text
    # Nothing listens there: Unreachable, with a hint.
    with pytest.raises(Unreachable) as unreachable:
        registration.register(
            rt, OWNER, replace(request, address=f"root@127.0.0.1:{_closed_port()}")
        )
    assert "SSH port" in error_reply(unreachable.value).text
    assert [i.name for i in rows(db, Instance)] == ["local"]

    result = registration.register(rt, OWNER, request)
    assert result.host_key_fingerprint == sshd.host_key.fingerprint
    _, shown = blocks.register_result(result)
    assert sshd.host_key.fingerprint in json.dumps(shown)  # the pinned key, shown in Slack
    listed = {row.instance.name: row for row in fleet_views.fleet_overview(rt).rows}
    assert sorted(listed) == ["box2", "local"]
    assert listed["box2"].live
    assert listed["local"].live
    notifier.posts.clear()

    # A changed host key: refused, the owner alerted with both fingerprints, the message says
    # what to do; `local` keeps working.
    new_key = sshd.restart_with_new_host_key()
    with pytest.raises(HostKeyChanged) as changed:
        fleet_views.health(rt, OTHER, "box2")
    text = error_reply(changed.value).text
    assert "re-register" in text
    [alert] = notifier.to("UOWNER")
    assert new_key.fingerprint in alert.text
    assert sshd.host_key.fingerprint in alert.text
    assert fleet_views.health(rt, OTHER, "local").checks

    # sshd gone: box2 shows Unreachable in the overview, `local` is unaffected.
    sshd.kill()
    listed = {row.instance.name: row for row in fleet_views.fleet_overview(rt).rows}
    assert listed["box2"].problem is not None
    assert listed["box2"].problem.kind == "Unreachable"
    assert "1 not reachable" in blocks.fleet_overview(fleet_views.fleet_overview(rt))[0]
    assert listed["local"].live
    assert listed["local"].problem is None


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
    assert lookup.compare_gpus("h100", 2, _snapshot(H100, H100)) is None
    assert lookup.compare_gpus("a100", 1, _snapshot(A100_40_GPU)) is None  # either A100 will do
    assert lookup.compare_gpus(None, None, _snapshot()) is None
    assert lookup.compare_gpus("h100", 1, _snapshot(H100, H100)) is None  # more is not less


def test_compare_gpus_finds_fewer_cards_another_model_and_less_memory() -> None:
    fewer = lookup.compare_gpus("h100", 8, _snapshot(H100, H100))
    assert fewer is not None
    assert fewer.problems == ("fewer cards: 2 delivered, 8 rented",)
    other = lookup.compare_gpus("a100", 2, _snapshot(RTX4090, RTX4090))
    assert other is not None
    assert other.problems == (
        "less memory: NVIDIA GeForce RTX 4090 has 24 GiB, the rented a100 has 40 GiB or more "
        "(2 cards)",
    )
    wrong = lookup.compare_gpus("h100", 1, _snapshot(A100_80_GPU))
    assert wrong is not None
    assert "another model" in wrong.problems[0]
    smaller = lookup.compare_gpus("a100 80gb", 1, _snapshot(A100_40_GPU))
    assert smaller is not None
    assert smaller.problems[0].startswith("less memory: NVIDIA A100-SXM4-40GB has 40 GiB")
    mig = ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * 1024 * MIB, 42)
    slice_ = lookup.compare_gpus("a100", 1, _snapshot(mig))
    assert slice_ is not None
    assert slice_.problems[0].startswith("another model: NVIDIA A100-SXM4-80GB MIG 3g.40gb is not")


def test_compare_gpus_without_nvml_says_no_gpu_is_visible() -> None:
    error = NvmlError("library_not_found", "libnvidia-ml.so.1 not found", "install the driver")
    found = lookup.compare_gpus("a100", 1, _snapshot(nvml_error=error))
    assert found is not None
    assert found.problems == (
        "no GPU is visible: the NVIDIA driver library does not load "
        "(NVML said: `libnvidia-ml.so.1 not found`)",
    )
    with speaking("zh"):
        found = lookup.compare_gpus("a100", 1, _snapshot(nvml_error=error))
    assert found is not None
    [problem] = found.problems
    assert_chinese(problem)
    assert "NVIDIA 驱动库无法加载" in problem
    assert "`libnvidia-ml.so.1 not found`" in problem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("root@203.0.113.7", registration.Address("root", "203.0.113.7", 22)),
        ("ubuntu@gpu.example.com:2222", registration.Address("ubuntu", "gpu.example.com", 2222)),
        ("root@[::1]:2222", registration.Address("root", "::1", 2222)),
        ("root@[2001:db8::7]", registration.Address("root", "2001:db8::7", 22)),
        ("root@2001:db8::7", registration.Address("root", "2001:db8::7", 22)),
        (" me.x@host ", registration.Address("me.x", "host", 22)),
    ],
)
def test_parse_address(text: str, expected: registration.Address) -> None:
    assert registration.parse_address(text) == expected


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
        registration.parse_address(text)
    assert info.value.hint


@pytest.mark.parametrize(
    ("user", "host", "port"), [("root", "203.0.113.7", 22), ("u", "2001:db8::1", 2222)]
)
def test_format_address_reads_back(user: str, host: str, port: int) -> None:
    assert registration.parse_address(
        registration.format_address(user, host, port)
    ) == registration.Address(user, host, port)


@pytest.mark.parametrize("name", ["a", "box-1", "0abc", "a" * 31])
def test_valid_names(name: str) -> None:
    assert registration.validate_name(name) == name


@pytest.mark.parametrize("name", ["", "-box", "Box", "box_1", "a" * 32, "box 1", "bøx"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(UsageError, match="not a valid instance name"):
        registration.validate_name(name)


def test_a_used_up_budget_stops_a_re_registration_that_moves_the_deadline_later(
    rt: Runtime, db: Database, clock: Clock
) -> None:
    from bot.errors import BudgetExceeded
    from bot.services.money import budgets

    registration.register(rt, OWNER, local_request())
    budgets.set_budget(rt, ADMIN, "user", "UOWNER", 1_000_000)
    clock.advance(hours=1)  # $4.20 of a $1 budget
    [before] = rows(db, Instance)
    with pytest.raises(BudgetExceeded, match="is used up"):
        registration.register(rt, OWNER, local_request(release_in=timedelta(hours=10)))
    [after] = rows(db, Instance)
    assert after.deadline_at == before.deadline_at
    again = registration.register(rt, OWNER, local_request(release_in=timedelta(hours=1)))
    assert again.re_registered  # an earlier deadline needs no budget
