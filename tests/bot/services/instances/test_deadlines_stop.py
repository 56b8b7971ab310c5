"""Policy ``stop``: stopped at the deadline (disk kept), released ``--release-after`` later
unless started again; against the RunPod and Lambda stand-ins, through `/gpu policy` and the
tick, with a hand clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import select

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import UsageError
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.tick import tick
from bot.settings import Settings
from bot.store.models import Instance, Release
from tests.bot.services.support import T0, Clock, NoFleet, add_instance, get_instance, make_runtime
from tests.fixtures.providers import LambdaStandIn, RunpodStandIn

pytestmark = pytest.mark.integration

REGISTRY = build_registry()
OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
D = T0 + timedelta(hours=2)
AFTER = timedelta(hours=24)
#: 730 GB at $0.10 per GB-month: $0.10 an hour. On RunPod a 365 GB container disk and a 365 GB
#: volume running; stopped, the volume alone at $0.20 per GB-month: $0.10 an hour too.
DISK = {"disk_gb": 730.0, "storage_micros_per_gb_month": 100_000}
POD_DISK = {"disk_gb": 365, "volume_gb": 365}


@pytest.fixture
def rt(db, clock, runpod_cloud: RunpodStandIn) -> Runtime:
    settings = Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    runpod = ProviderRegistry.from_settings(settings).get("runpod")
    return make_runtime(db, clock, providers=[runpod], poll_interval_s=10**7, fleet=NoFleet())


def run(rt: Runtime, text: str, caller: Caller = OWNER) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, caller, args)


def _ticks(rt: Runtime, clock: Clock, until, step_s: int = 300) -> None:
    while clock.now <= until:
        tick(rt, clock.now)
        clock.advance(seconds=step_s)


def _pod_box(rt: Runtime, runpod_cloud: RunpodStandIn) -> tuple[int, str]:
    pod = runpod_cloud.add(**POD_DISK)
    iid = add_instance(
        rt.db,
        provider="runpod",
        provider_instance_id=pod,
        deadline_at=D,
        last_polled_at=T0,
        **DISK,
    )
    reply = run(rt, "policy box --at-deadline stop --release-after 24h")
    assert "at the deadline: stop" in reply.text
    return iid, pod


def _stopped_at_the_deadline(rt, clock, runpod_cloud) -> tuple[int, str]:
    iid, pod = _pod_box(rt, runpod_cloud)
    _ticks(rt, clock, D)
    warned = rt.notifier.containing("will be stopped in")
    assert [w.text.split("*")[3] for w in warned] == ["30m", "10m"]
    assert "It is released (disk and all) at Thu 03 Dec 14:00 UTC" in warned[0].text
    assert runpod_cloud.instances[pod]["status"] == "EXITED"
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.released_at) == ("stopped", None)
    return iid, pod


def test_stopped_at_the_deadline_warned_then_released_after(rt, clock, runpod_cloud):
    iid, pod = _stopped_at_the_deadline(rt, clock, runpod_cloud)
    [told] = rt.notifier.containing("is stopped")
    assert "Its disk keeps billing ($0.10/h)" in told.text
    assert "It is released at Thu 03 Dec 14:00 UTC unless someone starts it again" in told.text
    status = run(rt, "status")
    assert "stopped: disk $0.10/h" in str(status.blocks)
    assert "disk released in 23h 55m" in str(status.blocks)

    clock.set(D + AFTER - timedelta(minutes=40))  # nothing happens in between
    _ticks(rt, clock, D + AFTER - timedelta(minutes=5))
    warned = rt.notifier.containing("(stopped) will be released in")
    assert [w.text.split("*")[3] for w in warned] == ["30m", "10m"]
    assert "Extend 1h" in str(warned[0].blocks)
    assert pod in runpod_cloud.instances  # not before its time

    _ticks(rt, clock, D + AFTER)
    assert pod not in runpod_cloud.instances
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    with rt.db.session() as session:
        rows = session.exec(select(Release.reason, Release.mode, Release.state)).all()
    assert sorted(rows) == [
        ("deadline", "stop", "confirmed"),
        ("deadline", "terminate", "confirmed"),
    ]


def test_started_again_it_gets_a_new_deadline_and_the_old_release_time_is_gone(
    rt, clock, runpod_cloud
):
    iid, pod = _stopped_at_the_deadline(rt, clock, runpod_cloud)
    runpod_cloud.start_outside(pod)
    started = clock.now
    _ticks(rt, clock, D + timedelta(hours=1))
    assert rt.notifier.containing("was started again")
    inst = get_instance(rt.db, iid)
    new_deadline = inst.deadline_at
    assert inst.state == "active"
    assert new_deadline is not None
    assert started <= new_deadline - timedelta(seconds=rt.settings.default_release_in_s)
    # At its new deadline the policy stops it again, to be released a day after that: the
    # old release time passes with its disk kept.
    clock.set(D + AFTER - timedelta(minutes=40))
    _ticks(rt, clock, D + AFTER + timedelta(hours=1))
    assert pod in runpod_cloud.instances
    inst = get_instance(rt.db, iid)
    assert inst.state == "stopped"
    assert inst.deadline_at == new_deadline + AFTER


def test_extend_keeps_the_stopped_disk_longer(rt, clock, runpod_cloud):
    """Stopped, its deadline is when its disk is released: extending moves that."""
    iid, pod = _stopped_at_the_deadline(rt, clock, runpod_cloud)
    run(rt, "extend box 2h")
    inst = get_instance(rt.db, iid)
    release_at = D + AFTER + timedelta(hours=2)
    assert (inst.state, inst.deadline_at) == ("stopped", release_at)
    clock.set(D + AFTER - timedelta(minutes=40))
    _ticks(rt, clock, D + AFTER + timedelta(minutes=30))
    assert pod in runpod_cloud.instances  # the old release time passed: kept
    clock.set(release_at - timedelta(minutes=40))
    _ticks(rt, clock, release_at)
    assert pod not in runpod_cloud.instances
    assert get_instance(rt.db, iid).state == "released"


def test_a_platform_that_cannot_stop_refuses_the_policy(db, clock, lambda_cloud: LambdaStandIn):
    settings = Settings(
        lambda_api_url=lambda_cloud.url + "/api/v1", lambda_api_key=lambda_cloud.api_key
    )
    lam = ProviderRegistry.from_settings(settings).get("lambda")
    rt = make_runtime(db, clock, providers=[lam], poll_interval_s=10**7, fleet=NoFleet())
    iid = add_instance(rt.db, provider="lambda", provider_instance_id=lambda_cloud.add())
    with pytest.raises(UsageError, match="cannot stop an instance") as refused:
        run(rt, "policy box --at-deadline stop --release-after 24h")
    assert "--at-deadline release" in (refused.value.hint or "")
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert (inst.deadline_policy, inst.max_grace_s) == ("release", 3600)
