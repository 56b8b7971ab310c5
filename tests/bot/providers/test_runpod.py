"""RunPod on REST v2 against its stand-in, which checks every request against RunPod's v2 OpenAPI
document and answers only in its shapes: the pod lifecycle, what a 404 means, rate limits and
locks, the catalogue, the billing history, and the disk priced as RunPod bills it."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from fractions import Fraction
from typing import cast

import pytest
from sqlalchemy import func
from sqlmodel import select

from bot import billing
from bot.errors import ProviderError, ProviderRateLimited, ProviderUnknownOutcome
from bot.providers import runpod
from bot.providers.base import LaunchRequest
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.providers.runpod import RunpodProvider
from bot.runtime import Runtime
from bot.services.instances import reconcile, releases
from bot.services.money import ledger
from bot.settings import Settings
from bot.store.models import Charge
from tests.bot.services.support import T0, Clock, add_instance, get_instance
from tests.fixtures.platforms.runpod import schema_errors
from tests.fixtures.providers import RunpodStandIn

pytestmark = pytest.mark.integration


@pytest.fixture
def provider(runpod_cloud: RunpodStandIn) -> RunpodProvider:
    found = ProviderRegistry.from_settings(
        Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    ).get("runpod")
    assert isinstance(found, RunpodProvider)
    return found


def test_the_default_api_is_v2():
    assert Settings().runpod_api_url == "https://api.runpod.io/v2"


def test_create_stop_start_terminate(provider: RunpodProvider, runpod_cloud: RunpodStandIn):
    (pod,) = provider.launch(
        LaunchRequest("NVIDIA GeForce RTX 4090", name="train", image="img:1", disk_gb=40)
    )
    assert pod.state == "running"
    assert pod.launched_at == runpod_cloud.now
    (created,) = [body for method, path, body in runpod_cloud.calls if method == "POST"]
    assert created["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1}
    assert created["disk"] == 40
    assert "mounts" not in created  # no volume unless asked: RunPod bills one even stopped
    assert schema_errors("CreatePodRequest", created) == []

    stopped = provider.release(pod.provider_id, "stop")
    assert (stopped.confirmed, stopped.state) == (True, "stopped")
    assert provider.get(pod.provider_id).price_micros_per_hour is None  # cost 0.0 stopped
    assert provider.start(pod.provider_id).state == "running"
    done = provider.release(pod.provider_id, "terminate")
    assert done.confirmed
    assert not done.already_gone
    assert pod.provider_id not in {i.provider_id for i in provider.list_instances()}
    assert runpod_cloud.answer_problems() == []


def test_a_volume_is_made_only_when_asked(provider: RunpodProvider, runpod_cloud: RunpodStandIn):
    (pod,) = provider.launch(
        LaunchRequest("NVIDIA GeForce RTX 4090", disk_gb=50, extra=(("volume_gb", "20"),))
    )
    assert (pod.disk_gb, pod.storage_micros_per_gb_month) == (70.0, 100_000)
    provider.release(pod.provider_id, "stop")
    stopped = provider.get(pod.provider_id)
    assert (stopped.disk_gb, stopped.storage_micros_per_gb_month) == (20.0, 200_000)


def test_what_runpod_refuses_as_invalid_is_not_retried(runpod_cloud: RunpodStandIn):
    answer = runpod_cloud.handle(
        "POST",
        "/v2/pods",
        {"authorization": f"Bearer {runpod_cloud.api_key}", "user-agent": "t"},
        {"name": "x", "imageName": "old-v1-field", "gpu": {"id": "g"}},
    )
    assert answer.status == 400
    assert "additional properties 'imageName' not allowed" in " ".join(answer.body["errors"])


def test_only_runpods_own_not_found_means_gone(provider, runpod_cloud: RunpodStandIn):
    pod = runpod_cloud.add()
    runpod_cloud.catch_all()
    with pytest.raises(ProviderUnknownOutcome):
        provider.release(pod, "terminate")
    runpod_cloud.catch_all(None)
    assert provider.get(pod).state == "running"

    runpod_cloud.terminate_outside(pod)
    outcome = provider.release(pod, "terminate")
    assert (outcome.confirmed, outcome.already_gone) == (True, True)


def test_a_rate_limit_names_its_wait(provider, runpod_cloud: RunpodStandIn):
    runpod_cloud.rate_limit(1, reset_s=9)
    with pytest.raises(ProviderRateLimited) as caught:
        provider.list_instances()
    assert caught.value.retry_after_s == 9


def test_a_locked_pod_is_busy_and_retried(provider, runpod_cloud: RunpodStandIn):
    pod = runpod_cloud.add()
    runpod_cloud.lock_pod(pod)
    with pytest.raises(ProviderError) as caught:
        provider.release(pod, "terminate")
    assert caught.value.retryable
    runpod_cloud.lock_pod(pod, False)
    assert provider.release(pod, "terminate").confirmed


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("PROVISIONING", "pending"),
        ("STARTING", "pending"),
        ("RUNNING", "running"),
        ("EXITED", "stopped"),
        ("ERROR", "crashed"),
    ],
)
def test_every_v2_status_maps(provider, runpod_cloud: RunpodStandIn, status: str, state: str):
    pod = runpod_cloud.add(status=status)
    assert provider.get(pod).state == state


def test_a_status_v2_does_not_document_is_an_error_not_a_guess():
    with pytest.raises(ProviderError, match="does not know"):
        runpod._pod({"id": "p", "status": "HIBERNATING"})


def test_the_catalogue_prices_one_gpu(provider):
    assert provider.price("NVIDIA GeForce RTX 4090") == 690_000
    assert provider.price("NVIDIA B300") is None


def test_the_billing_history_adds_up_per_pod(provider, runpod_cloud: RunpodStandIn):
    pod = runpod_cloud.add(cost=1.0, disk_gb=1, volume_gb=None)
    runpod_cloud.advance(3 * 3600)
    [charge] = provider.charges(runpod_cloud.now - timedelta(days=1), runpod_cloud.now)
    assert charge.provider_id == pod
    assert charge.compute_micros == 3_000_000
    # 1 GB of container disk for 3 hours at $0.10 per GB-month of 730 h: 410.96 micro-USD.
    assert charge.storage_micros == 411
    assert charge.total_micros == 3_000_411
    # The answers fit RunPod's document (the billing metadata counts its records and pods).
    assert runpod_cloud.answer_problems() == []


def test_a_pod_that_ran_then_stood_stopped_costs_what_runpod_bills(
    local_rt: Runtime, runpod_cloud: RunpodStandIn
):
    """2 h running with a 50 GB container disk and a 20 GB volume, then 48 h stopped: the
    disk is $0.10/GB-month for both while running and $0.20 for the volume alone once stopped,
    per second (RunPod's billing page); gpubot's figures equal the stand-in's bill."""
    rt = local_rt
    clock, pod, iid = _registered_pod(rt, runpod_cloud)

    _both_advance(clock, runpod_cloud, hours=2)
    runpod_cloud.stop_outside(pod)
    assert reconcile.reconcile(rt, clock.now) == [iid]
    _both_advance(clock, runpod_cloud, hours=48)

    inst = get_instance(rt.db, iid)
    ours = billing.cost_breakdown(inst, platform_billing(inst.provider), clock.now)
    theirs = runpod_cloud.bill(pod, T0, clock.now)
    assert ours.compute_micros == round(theirs["gpuAmount"] * 1_000_000)
    # By hand, RunPod's rates per second over a 730-hour month: 70 GB x $0.10 x 2 h running
    # (19,178.08 micro-dollars), then 20 GB x $0.20 x 48 h stopped (263,013.70): 282,191.78.
    # gpubot sums the stretches exactly and rounds up to a micro-unit once.
    running = Fraction(70 * 100_000 * 2 * 3600, 730 * 3600)
    stopped = Fraction(20 * 200_000 * 48 * 3600, 730 * 3600)
    assert ours.storage_micros == math.ceil(running + stopped) == 282_192
    assert ours.storage_micros == round(theirs["diskAmount"] * 1_000_000)
    # The ledger's hourly storage charges add up to the same figure.
    ledger.accrue(rt.db, clock.now, rt.settings.tz())
    with rt.db.session() as session:
        charged = session.exec(
            select(func.sum(Charge.amount_micros)).where(
                Charge.instance_id == iid, Charge.kind == "storage"
            )
        ).one()
    assert charged == 282_192


def test_a_stop_the_bot_makes_prices_the_stopped_volume_from_the_stop(
    local_rt: Runtime, runpod_cloud: RunpodStandIn
):
    """The same pod stopped by the bot's own release (`/gpu release --stop`), with no reconcile
    in between: the volume's stopped rate applies from the stop, to the micro-unit."""
    rt = local_rt
    clock, pod, iid = _registered_pod(rt, runpod_cloud)
    _both_advance(clock, runpod_cloud, hours=2)
    release = releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")
    assert release.id is not None
    done = releases.process_release(rt, release.id)
    if done.state != "confirmed":  # RunPod answers the stop before the pod is EXITED
        done = releases.process_release(rt, release.id)
    assert done.state == "confirmed"
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.disk_gb, inst.storage_micros_per_gb_month) == (
        "stopped",
        20.0,
        200_000,
    )
    _both_advance(clock, runpod_cloud, hours=48)

    inst = get_instance(rt.db, iid)
    ours = billing.cost_breakdown(inst, platform_billing(inst.provider), clock.now)
    theirs = runpod_cloud.bill(pod, T0, clock.now)
    assert ours.storage_micros == round(theirs["diskAmount"] * 1_000_000) == 282_192


def _registered_pod(rt: Runtime, runpod_cloud: RunpodStandIn) -> tuple[Clock, str, int]:
    """A pod with a 50 GB container disk and a 20 GB volume, registered at $0.10/GB-month for
    its 70 GB from T0 (RunPod's running rate): (the bot's clock, the pod, its registration)."""
    rt.providers.add(
        ProviderRegistry.from_settings(
            Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
        ).get("runpod")
    )
    runpod_cloud.now = T0
    pod = runpod_cloud.add(cost=0.69, disk_gb=50, volume_gb=20)
    iid = add_instance(
        rt.db,
        provider="runpod",
        provider_instance_id=pod,
        price_micros=690_000,
        created_at=T0,
        disk_gb=70.0,
        storage_micros_per_gb_month=100_000,
    )
    return cast(Clock, rt.clock), pod, iid


def _both_advance(clock: Clock, standin: RunpodStandIn, *, hours: int) -> datetime:
    standin.advance(hours * 3600)
    return clock.advance(hours=hours)
