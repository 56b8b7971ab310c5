"""Stopped as a state of its own, through the real commands and buttons: `/gpu release NAME
--stop` on RunPod (its stand-in) and on a manual platform, the stopped instance in status,
list and `/gpu spend` with what its disk costs, and its release from there."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest
from sqlalchemy import update as sa_update
from sqlmodel import col, select

from bot import billing
from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import Conflict, ProviderError
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services import deadlines, spend
from bot.services.access import Caller
from bot.settings import Settings
from bot.store.models import Instance, Prompt, Release
from tests.bot.services.support import T0, Clock, RecordingNotifier, add_instance, get_instance
from tests.fixtures.providers import LambdaStandIn, RunpodStandIn

REGISTRY = build_registry()

pytestmark = pytest.mark.integration

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
#: 730 GB at $0.10 per GB-month: $0.10 an hour.
DISK = {"disk_gb": 730.0, "storage_micros_per_gb_month": 100_000}


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


def run(rt: Runtime, text: str, caller: Caller = OWNER) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, caller, args)


def click(rt: Runtime, action_id: str, value: str, caller: Caller = OWNER) -> Reply:
    return REGISTRY.actions[action_id].handler(rt, caller, value)


def action_ids(reply: Reply) -> list[str]:
    return [
        element["action_id"]
        for block in reply.blocks
        if block.get("type") == "actions"
        for element in block["elements"]
    ]


def _releases(rt: Runtime) -> list[tuple[str, str, str]]:
    with rt.db.session() as session:
        return list(session.exec(select(Release.reason, Release.mode, Release.state)).all())


def test_stop_then_release_on_runpod(rt: Runtime, runpod_cloud: RunpodStandIn):
    settings = Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    rt.providers.add(ProviderRegistry.from_settings(settings).get("runpod"))
    clock = cast(Clock, rt.clock)
    pod = runpod_cloud.add()
    iid = add_instance(
        rt.db,
        provider="runpod",
        provider_instance_id=pod,
        price_micros=3_600_000,
        created_at=T0 - timedelta(hours=2),
        **DISK,
    )

    ask = run(rt, "release box --stop")
    assert "Stop *box*" in ask.text
    assert "keeps billing ($0.10/h)" in ask.text
    assert action_ids(ask) == ["instance_stop_confirm", "instance_release_cancel"]
    assert runpod_cloud.instances[pod]["desiredStatus"] == "RUNNING"  # asking changed nothing

    done = click(rt, "instance_stop_confirm", str(iid))
    assert "*box* is stopped" in done.text
    assert runpod_cloud.instances[pod]["desiredStatus"] == "EXITED"
    stopped_at = clock.now
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at, inst.released_at) == ("stopped", stopped_at, None)

    clock.advance(hours=3)
    for listing in (run(rt, "status"), run(rt, "list")):
        assert "_stopped_" in str(listing.blocks)
        assert "stopped 3h ago; storage $0.10/h" in str(listing.blocks)
        assert "$0.10/h together" in str(listing.blocks)  # what it costs now: its disk
    detail = run(rt, "status box")
    assert "*Stopped*\\nstopped 3h ago; storage $0.10/h" in str(detail.blocks)
    assert action_ids(detail) == ["instance_release_ask"]
    with pytest.raises(Conflict, match="already stopped"):
        run(rt, "release box --stop")

    ask = click(rt, "instance_release_ask", str(iid))
    assert "Release *box*" in ask.text
    assert "costs $0.10/h" in ask.text
    assert "*box* is released" in click(rt, "instance_release_confirm", str(iid)).text
    assert pod not in runpod_cloud.instances
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at) == ("released", stopped_at)
    assert inst.released_at == inst.storage_deleted_at == clock.now
    assert _releases(rt) == [("user", "stop", "confirmed"), ("user", "terminate", "confirmed")]

    # What it cost: compute for the 2 hours it ran, the disk for all 5.
    cost = billing.cost_breakdown(inst, clock.now + timedelta(days=1))
    assert (cost.compute_micros, cost.storage_micros) == (2 * 3_600_000, 5 * 100_000)
    month = spend.spend_report(
        rt.db,
        "2026-12",
        tz=rt.settings.tz(),
        now=clock.now + timedelta(hours=2),
        idle_threshold_pct=5.0,
        currency="USD",
    )
    [item] = month.instances
    assert (item.compute_micros, item.storage_micros) == (2 * 3_600_000, 5 * 100_000)


def test_a_manual_instance_s_owner_confirms_it_stopped(rt: Runtime):
    clock = cast(Clock, rt.clock)
    iid = add_instance(rt.db, created_at=T0 - timedelta(hours=1), **DISK)
    ask = run(rt, "release box --stop")
    assert "*Stopped on the platform*" in ask.text
    waiting = click(rt, "instance_stop_confirm", str(iid))
    assert "Stop *box* on its platform now" in waiting.text
    notifier = cast(RecordingNotifier, rt.notifier)
    [dm] = notifier.containing("Please stop *box*")
    assert dm.channel == "UOWNER"
    assert dm.action_ids() == ["instance_release_done", "instance_stop_done"]
    assert get_instance(rt.db, iid).state == "awaiting_confirmation"

    clock.advance(minutes=5)
    done = click(rt, "instance_stop_done", dm.button_value("instance_stop_done"))
    assert "*box* is stopped" in done.text
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at, inst.storage_deleted_at) == ("stopped", clock.now, None)
    assert "_stopped_" in str(run(rt, "list").blocks)

    # Released from there: the owner is asked again, and says it is released.
    clock.advance(hours=2)
    click(rt, "instance_release_confirm", str(iid))
    second = notifier.containing("Please release *box*")[-1]
    click(rt, "instance_release_done", second.button_value("instance_release_done"))
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.storage_deleted_at) == ("released", clock.now)
    assert _releases(rt) == [("user", "stop", "confirmed"), ("user", "terminate", "confirmed")]


def test_a_platform_that_cannot_stop_says_so_and_nothing_changes(
    rt: Runtime, lambda_cloud: LambdaStandIn
):
    settings = Settings(
        lambda_api_url=lambda_cloud.url + "/api/v1", lambda_api_key=lambda_cloud.api_key
    )
    rt.providers.add(ProviderRegistry.from_settings(settings).get("lambda"))
    iid = add_instance(rt.db, provider="lambda", provider_instance_id=lambda_cloud.add())
    with pytest.raises(ProviderError, match="cannot stop") as caught:
        run(rt, "release box --stop")
    assert "terminate" in caught.value.hint
    assert get_instance(rt.db, iid).state == "active"
    assert _releases(rt) == []
    with rt.db.session() as session:
        assert session.exec(select(Instance.state)).all() == ["active"]


def test_a_stopped_instance_is_warned_and_released_at_its_deadline(rt: Runtime) -> None:
    deadline = T0 + timedelta(hours=2)
    iid = add_instance(
        rt.db, name="parked", state="stopped", stopped_at=T0, deadline_at=deadline, **DISK
    )
    clock = rt.clock
    assert isinstance(clock, Clock)
    clock.set(deadline - timedelta(minutes=25))
    assert deadlines.check_deadlines(rt, clock.now) == []
    with rt.db.session() as session:
        warnings = session.exec(select(Prompt.key).where(Prompt.instance_id == iid)).all()
    assert len(warnings) == 1  # the 30-minute warning: its disk still bills
    with rt.db.session() as session:
        session.exec(
            sa_update(Prompt)
            .where(col(Prompt.instance_id) == iid)
            .values(first_attempt_at=clock.now, delivery="posted")
        )
    clock.set(deadline + timedelta(minutes=1))
    assert deadlines.check_deadlines(rt, clock.now) == [iid]
    assert _releases(rt) == [("deadline", "terminate", "pending")]
