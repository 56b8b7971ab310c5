"""`/gpu rent`: checks before renting, then launch, wait for SSH and register for real (the RunPod
stand-in hands out a real sshd on loopback); instances that cannot be registered are given back.
AWS runs against moto in server mode."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import cast

import boto3
import pytest
from sqlmodel import col, select

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.errors import BudgetExceeded, Conflict, NotFound, ProviderError, UsageError
from bot.providers.aws import AwsProvider
from bot.providers.base import LaunchRequest, ProviderInstance
from bot.providers.runpod import RunpodProvider
from bot.providers.vast import VastProvider
from bot.runtime import Runtime
from bot.services import tick
from bot.services.access import Caller
from bot.services.instances import launches, rent
from bot.services.money import budgets
from bot.store.models import AuditLog, Instance, Launch
from tests.bot.services.support import (
    Clock,
    RecordingNotifier,
    add_instance,
    grant_key,
    make_runtime,
)
from tests.fixtures.platforms.aws import amazon_image
from tests.fixtures.providers import RunpodStandIn
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.integration

OWNER = Caller("UOWNER", channel_id="CTEAM")


class FakeTime:
    """Monotonic time that moves only when the waits sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1

    def monotonic(self) -> float:
        return self.now


def _waiting(**kwargs: float) -> rent.Waiting:
    fake = FakeTime()
    return rent.Waiting(sleep=fake.sleep, monotonic=fake.monotonic, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


def _with_runpod(rt: Runtime, standin: RunpodStandIn) -> RunpodProvider:
    provider = RunpodProvider.from_settings(
        rt.settings.with_(runpod_api_url=standin.url, runpod_api_key=standin.api_key)
    )
    rt.providers.add(provider)
    return provider


def _instances(rt: Runtime) -> list[Instance]:
    with rt.db.session() as session:
        return list(session.exec(select(Instance)).all())


def test_rent_on_runpod_waits_for_ssh_and_registers(rt, sshd: SshServer, tmp_path: Path):
    standin = RunpodStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        _with_runpod(rt, standin)
        rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
        grant_key(rt.db, sshd.client_key_path.name, *("UADMIN", "UOWNER"))
        request = rent.RentRequest(
            provider="runpod",
            instance_type="NVIDIA GeForce RTX 4090",
            name="pod1",
            release_in=timedelta(hours=3),
            ssh_user=sshd.user,
            key_name=sshd.client_key_path.name,
            agent_home=str(tmp_path / "remote-home"),
        )
        plan = rent.plan_rent(rt, OWNER, request)
        result = rent.rent(rt, OWNER, plan, waiting=_waiting())
    finally:
        standin.close()
    assert result.failed == ()
    [registered] = result.registered
    assert registered.instance.name == "pod1"
    [inst] = _instances(rt)
    assert inst.provider == "runpod"
    assert inst.provider_instance_id in standin.instances
    assert inst.port == sshd.port
    assert inst.host_key_fingerprint == sshd.host_key.fingerprint
    assert inst.price_micros == 690_000  # the pod's cost
    assert inst.billing_increment is None  # not said: RunPod's documented per-second rule
    assert (inst.min_charge_s, inst.billing_from) == (None, None)
    assert inst.deadline_at == cast(Clock, rt.clock).now + timedelta(hours=3)
    assert [p["gpu"] for _, path, p in standin.calls if path == "/v2/pods" and p] == [
        {"id": "NVIDIA GeForce RTX 4090", "count": 1}
    ]
    assert standin.answer_problems() == []


def test_an_instance_that_never_answers_ssh_is_given_back(rt, runpod_cloud: RunpodStandIn):
    runpod_cloud.ssh_port = _closed_port()
    _with_runpod(rt, runpod_cloud)
    plan = rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "NVIDIA A40", name="pod2"))
    result = rent.rent(rt, OWNER, plan, waiting=_waiting(ssh_s=30, poll_s=5))
    assert result.registered == ()
    [(pod, why)] = result.failed
    assert "did not answer" in why
    assert runpod_cloud.calls_to("DELETE", f"/pods/{pod}")
    assert pod not in runpod_cloud.instances
    assert _instances(rt) == []
    with rt.db.session() as session:
        actions = session.exec(select(AuditLog.action)).all()
    assert actions == ["rent_launching", "rent_launched", "rent_given_back"]
    assert _launch_states(rt) == [(pod, "terminated")]


def test_checks_come_before_renting(rt, runpod_cloud: RunpodStandIn):
    _with_runpod(rt, runpod_cloud)
    with pytest.raises(ProviderError, match="cannot rent"):
        rent.plan_rent(rt, OWNER, rent.RentRequest("manual", "x"))
    with pytest.raises(NotFound):
        rent.plan_rent(rt, OWNER, rent.RentRequest("azure", "x"))
    rt.providers.add(VastProvider.from_settings(rt.settings.with_(vast_api_key="k")))
    with pytest.raises(ProviderError, match="cannot rent"):
        rent.plan_rent(rt, OWNER, rent.RentRequest("vast", "x"))
    with pytest.raises(UsageError):
        rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "x", count=9))
    with pytest.raises(UsageError):
        rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "x", name="Bad Name!"))
    add_instance(rt.db, name="taken")
    with pytest.raises(Conflict, match="taken"):
        rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "x", name="taken"))
    assert runpod_cloud.calls_to("POST", "/pods") == []


def test_rent_command_answers_at_once_and_posts_when_done(
    rt, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
):
    runpod_cloud.ssh_port = _closed_port()
    _with_runpod(rt, runpod_cloud)
    registry = build_registry()
    assert registry.commands["rent"].name == "rent"
    spec, args = parse("rent runpod 'NVIDIA A40' --name pod3 --release-in 2h", registry)
    waiting = _waiting(ssh_s=10, poll_s=5)
    monkeypatch.setattr(rent, "Waiting", lambda: waiting)
    reply = spec.handler(rt, OWNER, args)
    assert "Renting 1 x NVIDIA A40 on RunPod as pod3" in reply.text
    rt.executor.shutdown(wait=True)
    notifier = cast(RecordingNotifier, rt.notifier)
    [done] = notifier.to("CTEAM")
    assert "could not be registered and was terminated again" in done.text


def test_aws_needs_a_price_and_gives_back_what_it_cannot_reach(rt, aws_endpoint):
    aws = AwsProvider.from_settings(rt.settings.with_(aws_endpoint_url=aws_endpoint))
    rt.providers.add(aws)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_endpoint)
    image = amazon_image(ec2)

    with pytest.raises(UsageError, match="publishes no price") as caught:
        rent.plan_rent(rt, OWNER, rent.RentRequest("aws", "g5.xlarge", image=image))
    assert "--price" in caught.value.hint
    with pytest.raises(ProviderError, match="not an EC2 instance type"):
        rent.plan_rent(rt, OWNER, rent.RentRequest("aws", "g9.huge", price_micros_per_hour=1))
    assert ec2.describe_instances()["Reservations"] == []

    plan = rent.plan_rent(
        rt,
        OWNER,
        rent.RentRequest(
            "aws",
            "p4d.24xlarge",
            count=2,
            name="big",
            image=image,
            price_micros_per_hour=32_770_000,
        ),
    )
    assert plan.names == ("big-1", "big-2")
    assert (plan.gpu_model, plan.gpu_count) == ("NVIDIA A100", 8)
    # moto's addresses answer nobody: both are launched, time out waiting for SSH, given back.
    result = rent.rent(rt, OWNER, plan, waiting=_waiting(ssh_s=1, poll_s=1))
    assert len(result.failed) == 2
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
    }
    assert sorted(states) == sorted(pid for pid, _ in result.failed)
    assert set(states.values()) <= {"shutting-down", "terminated"}


def test_past_a_budget_cap_renting_needs_an_admin(rt: Runtime, runpod_cloud: RunpodStandIn) -> None:
    _with_runpod(rt, runpod_cloud)
    admin = Caller("UADMIN", channel_id="COPS")
    rt.settings = rt.settings.with_(admins=frozenset({"UADMIN"}))
    clock = cast(Clock, rt.clock)
    add_instance(rt.db, owner_id="UOWNER", price_micros=10_000_000, created_at=clock.now)
    budgets.set_budget(rt, admin, "user", "UOWNER", 5_000_000)
    clock.advance(hours=1)
    request = rent.RentRequest("runpod", "NVIDIA A40", name="pod9")
    with pytest.raises(BudgetExceeded, match="used up") as raised:
        rent.plan_rent(rt, OWNER, request)
    assert "admin" in raised.value.hint
    assert runpod_cloud.calls_to("POST", "/pods") == []
    plan = rent.plan_rent(rt, admin, request)  # an admin may rent past the cap
    assert plan.names == ("pod9",)


class Crash(BaseException):
    """The bot process dying in the middle of a rental."""


def _crashed_rental(
    rt: Runtime, standin: RunpodStandIn, monkeypatch: pytest.MonkeyPatch, name: str
) -> str:
    """Launch, then die before registering: the pod runs and only its Launch row knows it."""

    def die(*args: object, **kwargs: object) -> object:
        raise Crash

    monkeypatch.setattr(rent, "_adopt", die)
    plan = rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "NVIDIA A40", name=name))
    with pytest.raises(Crash):
        rent.rent(rt, OWNER, plan, waiting=_waiting())
    monkeypatch.undo()
    [pod] = [p for p, item in standin.instances.items() if item["name"].startswith(f"{name}-")]
    return pod


def test_a_rental_cut_short_by_a_crash_is_terminated_and_its_renter_told(
    rt: Runtime, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_runpod(rt, runpod_cloud)
    rt.settings = replace(rt.settings, timezone="Asia/Shanghai")
    clock = cast(Clock, rt.clock)
    notifier = cast(RecordingNotifier, rt.notifier)
    registered = runpod_cloud.add()
    add_instance(
        rt.db,
        name="kept",
        host=runpod_cloud.ssh_host,  # where the platform lists it
        port=runpod_cloud.ssh_port,
        provider="runpod",
        provider_instance_id=registered,
    )
    pod = _crashed_rental(rt, runpod_cloud, monkeypatch, "pod5")

    # While the dead rental's lease still holds, nothing is touched.
    clock.advance(seconds=launches.CLAIM_LEASE_S - 1)
    assert rent.recover_orphans(rt, clock.now) == []
    assert pod in runpod_cloud.instances
    assert _launch_states(rt) == [(pod, "launched")]

    # Once it has run out, the next tick terminates it once.
    clock.advance(seconds=1)
    report = tick.tick(rt, clock.now)
    assert report.orphans_terminated == [pod]
    assert pod not in runpod_cloud.instances
    assert registered in runpod_cloud.instances  # a registered rental is not an orphan
    [told] = notifier.to("UOWNER")
    assert f"RunPod instance {pod} (pod5)" in told.text
    assert "never registered" in told.text
    assert "rented with /gpu rent at Wed 02 Dec 20:00 CST," in told.text  # the workspace's zone
    assert "terminated" in told.text
    assert _launch_states(rt) == [(pod, "terminated")]
    assert rent.recover_orphans(rt, clock.now + timedelta(hours=1)) == []
    assert len(runpod_cloud.calls_to("DELETE", f"/pods/{pod}")) == 1
    assert len(notifier.to("UOWNER")) == 1


def test_two_processes_in_one_slot_recover_a_rental_once(
    rt: Runtime, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_runpod(rt, runpod_cloud)
    clock = cast(Clock, rt.clock)
    pod = _crashed_rental(rt, runpod_cloud, monkeypatch, "pod7")
    clock.set(clock.now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1))
    # A second bot process on the same store, its own notifier, its own platform client.
    other = make_runtime(rt.db, clock, notifier=RecordingNotifier(), fleet=rt.fleet)
    _with_runpod(other, runpod_cloud)
    barrier = threading.Barrier(2)

    def run(runtime: Runtime) -> tick.TickReport:
        barrier.wait(timeout=10)
        return tick.tick(runtime, clock.now)

    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(run, (rt, other)))
    assert sorted(len(r.orphans_terminated) for r in reports) == [0, 1]
    assert pod not in runpod_cloud.instances
    told = [
        p
        for runtime in (rt, other)
        for p in cast(RecordingNotifier, runtime.notifier).to("UOWNER")
        if "never registered" in p.text
    ]
    assert len(told) == 1
    with rt.db.session() as session:
        recovered = session.exec(
            select(AuditLog).where(col(AuditLog.action).startswith("rent_recover"))
        ).all()
    assert len(recovered) == 1, [r.action for r in recovered]


def test_an_orphan_the_platform_will_not_terminate_is_retried_and_reported_once(
    rt: Runtime, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_runpod(rt, runpod_cloud)
    clock = cast(Clock, rt.clock)
    notifier = cast(RecordingNotifier, rt.notifier)
    pod = _crashed_rental(rt, runpod_cloud, monkeypatch, "pod6")
    clock.advance(hours=1)
    runpod_cloud.fail_next(500, times=20, method="DELETE")
    assert rent.recover_orphans(rt, clock.now) == []
    assert rent.recover_orphans(rt, clock.now + timedelta(minutes=5)) == []
    [alarm] = notifier.to("UOWNER")
    assert "terminating it failed" in alarm.text
    assert "Terminate it on the platform" in alarm.text
    runpod_cloud.failures.clear()
    assert rent.recover_orphans(rt, clock.now + timedelta(minutes=10)) == [pod]
    assert pod not in runpod_cloud.instances
    assert len(notifier.to("UOWNER")) == 2


def test_a_rental_still_being_set_up_is_not_an_orphan(
    rt: Runtime, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_runpod(rt, runpod_cloud)
    clock = cast(Clock, rt.clock)
    seen: list[list[str]] = []

    def slow_adopt(*args: object, **kwargs: object) -> object:
        # Hours pass while this process still sets the instance up: its heartbeat keeps the
        # lease, and nothing is terminated under it.
        for _ in range(3):
            clock.advance(hours=1)
            _wait_for_lease(rt, clock.now + timedelta(seconds=launches.CLAIM_LEASE_S))
            seen.append(rent.recover_orphans(rt, clock.now))
        raise ProviderError("no SSH", retryable=False)

    monkeypatch.setattr(rent, "_adopt", slow_adopt)
    plan = rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "NVIDIA A40", name="pod7"))
    result = rent.rent(rt, OWNER, plan, waiting=_waiting(heartbeat_s=0.01))
    assert seen == [[], [], []]
    [(pod, _)] = result.failed
    assert pod not in runpod_cloud.instances  # given back by the rental itself
    assert len(runpod_cloud.calls_to("DELETE", f"/pods/{pod}")) == 1
    assert _launch_states(rt) == [(pod, "terminated")]
    assert rent.recover_orphans(rt, clock.now + timedelta(hours=3)) == []


def _wait_for_lease(rt: Runtime, until: datetime) -> None:
    """Until the rental's heartbeat (every 0.01 s here) has moved its lease to ``until``."""
    deadline = time.monotonic() + 5
    while True:
        with rt.db.session() as session:
            leases = session.exec(select(Launch.lease_until)).all()
        if leases and min(leases) >= until:
            return
        assert time.monotonic() < deadline, leases
        time.sleep(0.01)


def _launch_states(rt: Runtime) -> list[tuple[str | None, str]]:
    with rt.db.session() as session:
        rows = session.exec(select(Launch).order_by(col(Launch.id))).all()
    return [(r.provider_id, r.state) for r in rows]


# --- a launch call that never answered ----------------------------------------------------------


def _launch_then(
    provider: RunpodProvider, monkeypatch: pytest.MonkeyPatch, error: BaseException, *, start: bool
) -> None:
    """Make the next launch start its pods on the platform (or not) and then raise ``error``,
    as when the bot dies or the connection drops before the platform's answer arrives."""
    real = provider.launch

    def cut_short(request: LaunchRequest) -> list[ProviderInstance]:
        if start:
            real(request)
        raise error

    monkeypatch.setattr(provider, "launch", cut_short)


def _pods_named(standin: RunpodStandIn, name: str) -> list[str]:
    return [p for p, item in standin.instances.items() if item["name"].startswith(f"{name}-")]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (Crash(), "the platform's answer to the launch never reached the bot"),
        (ProviderError("runpod: timed out", retryable=True), "answer to the launch never reached"),
    ],
)
def test_pods_started_by_a_launch_call_that_never_answered_are_found_and_terminated(
    rt: Runtime,
    runpod_cloud: RunpodStandIn,
    monkeypatch: pytest.MonkeyPatch,
    error: BaseException,
    reason: str,
) -> None:
    provider = _with_runpod(rt, runpod_cloud)
    clock = cast(Clock, rt.clock)
    notifier = cast(RecordingNotifier, rt.notifier)
    other = runpod_cloud.add()  # someone else's pod on the same account: never touched
    _launch_then(provider, monkeypatch, error, start=True)
    plan = rent.plan_rent(
        rt, OWNER, rent.RentRequest("runpod", "NVIDIA A40", name="burst", count=2)
    )
    with pytest.raises(type(error)):
        rent.rent(rt, OWNER, plan, waiting=_waiting())
    pods = _pods_named(runpod_cloud, "burst")
    assert len(pods) == 2

    clock.advance(minutes=5)  # the call could still be running: nothing is touched
    assert rent.recover_orphans(rt, clock.now) == []
    assert len(_pods_named(runpod_cloud, "burst")) == 2

    clock.advance(minutes=6)
    assert sorted(rent.recover_orphans(rt, clock.now)) == sorted(pods)
    assert _pods_named(runpod_cloud, "burst") == []
    assert other in runpod_cloud.instances
    told = notifier.to("UOWNER")
    assert len(told) == 2
    assert all(reason in t.text and "terminated so it does not bill" in t.text for t in told)
    assert rent.recover_orphans(rt, clock.now + timedelta(hours=1)) == []
    assert len(notifier.to("UOWNER")) == 2
    with rt.db.session() as session:
        actions = session.exec(select(AuditLog.action)).all()
    assert actions.count("rent_recovered") == 2
    assert actions.count("rent_launch_checked") == 1
    assert sorted(_launch_states(rt)) == sorted((p, "terminated") for p in pods)


def test_a_launch_that_started_nothing_is_settled_and_the_renter_told(
    rt: Runtime, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = _with_runpod(rt, runpod_cloud)
    rt.settings = replace(rt.settings, timezone="Asia/Shanghai")
    clock = cast(Clock, rt.clock)
    notifier = cast(RecordingNotifier, rt.notifier)
    _launch_then(provider, monkeypatch, Crash(), start=False)
    plan = rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "NVIDIA A40", name="solo"))
    with pytest.raises(Crash):
        rent.rent(rt, OWNER, plan, waiting=_waiting())
    clock.advance(minutes=11)
    runpod_cloud.fail_next(500, times=5, method="GET")  # the platform's list fails: try later
    assert rent.recover_orphans(rt, clock.now) == []
    assert notifier.to("UOWNER") == []
    runpod_cloud.failures.clear()
    assert rent.recover_orphans(rt, clock.now + timedelta(minutes=1)) == []
    [told] = notifier.to("UOWNER")
    assert "got no answer from the platform" in told.text
    assert "on RunPod at Wed 02 Dec 20:00 CST got" in told.text  # the workspace's zone
    assert "nothing was started under its name solo-" in told.text
    assert _launch_states(rt) == [(None, "terminated")]
    assert rent.recover_orphans(rt, clock.now + timedelta(hours=1)) == []
    assert len(notifier.to("UOWNER")) == 1


def test_a_refused_launch_is_settled_at_once(rt: Runtime, runpod_cloud: RunpodStandIn) -> None:
    _with_runpod(rt, runpod_cloud)
    clock = cast(Clock, rt.clock)
    notifier = cast(RecordingNotifier, rt.notifier)
    runpod_cloud.fail_next(400, method="POST")
    plan = rent.plan_rent(rt, OWNER, rent.RentRequest("runpod", "NVIDIA A40", name="nope"))
    with pytest.raises(ProviderError) as refused:
        rent.rent(rt, OWNER, plan, waiting=_waiting())
    assert not refused.value.retryable
    assert rent.recover_orphans(rt, clock.now + timedelta(hours=1)) == []
    assert notifier.to("UOWNER") == []
    assert runpod_cloud.calls_to("GET", "/pods") == []  # nothing to look for
    with rt.db.session() as session:
        actions = session.exec(select(AuditLog.action)).all()
    assert actions == ["rent_launching", "rent_launch_refused"]
    assert _launch_states(rt) == [(None, "refused")]


def test_the_platform_name_carries_the_launch_id(
    rt: Runtime, runpod_cloud: RunpodStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_runpod(rt, runpod_cloud)
    pod = _crashed_rental(rt, runpod_cloud, monkeypatch, "tagged")
    with rt.db.session() as session:
        rows = session.exec(select(AuditLog).order_by(AuditLog.id)).all()  # type: ignore[arg-type]
    intent, answer = (json.loads(r.details_json) for r in rows)
    assert intent["launch_id"] == answer["launch_id"]
    assert intent["platform_name"] == f"tagged-{intent['launch_id']}"
    assert runpod_cloud.instances[pod]["name"] == intent["platform_name"]
    assert answer["ids"] == [pod]
    [row] = launches.rows_of(rt, intent["launch_id"])
    assert (row.platform_name, row.provider_id, row.name) == (
        intent["platform_name"],
        pod,
        "tagged",
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
