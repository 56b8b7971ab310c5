"""Stopped as a state of its own, through the real commands and buttons: `/gpu release NAME
--stop` on RunPod (its stand-in) and on a manual platform, the stopped instance in status,
list and `/gpu spend` with what its disk costs, and its release from there."""

from __future__ import annotations

import math
from datetime import timedelta
from fractions import Fraction
from typing import cast

import pytest
from sqlalchemy import update as sa_update
from sqlmodel import col, select

from bot import billing
from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import Conflict, NotAuthorized, ProviderError, UsageError
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import deadlines
from bot.services.money import spend
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
    assert runpod_cloud.instances[pod]["status"] == "RUNNING"  # asking changed nothing

    done = click(rt, "instance_stop_confirm", str(iid))
    assert "*box* is stopped" in done.text
    assert runpod_cloud.instances[pod]["status"] == "EXITED"
    stopped_at = clock.now
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at, inst.released_at) == ("stopped", stopped_at, None)

    clock.advance(hours=3)
    # RunPod bills the stopped pod's 20 GB volume alone, at $0.20/GB-month: $0.0055/h.
    for listing in (run(rt, "status"), run(rt, "list")):
        assert "stopped: disk $0.0055/h" in str(listing.blocks)
        assert "stopped 3h ago; storage $0.0055/h" in str(listing.blocks)
        assert "$0.0055/h together" in str(listing.blocks)  # what it costs now: its disk
    detail = run(rt, "status box")
    assert "*Stopped*\\nstopped 3h ago; storage $0.0055/h" in str(detail.blocks)
    assert action_ids(detail) == ["instance_start", "instance_release_confirm"]
    with pytest.raises(Conflict, match="already stopped"):
        run(rt, "release box --stop")

    ask = click(rt, "instance_release_ask", str(iid))
    assert "Release *box*" in ask.text
    assert "costs $0.0055/h" in ask.text
    assert "*box* is released" in click(rt, "instance_release_confirm", str(iid)).text
    assert pod not in runpod_cloud.instances
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at) == ("released", stopped_at)
    assert inst.released_at == inst.storage_deleted_at == clock.now
    assert _releases(rt) == [("user", "stop", "confirmed"), ("user", "terminate", "confirmed")]

    # What it cost: compute for the 2 hours it ran; the disk for all 5, at the registered
    # $0.10/h while it ran, then at RunPod's stopped rate for its 20 GB volume: 3 h x 20 GB x
    # $0.20/GB-month / 730 h = 16,438.36 micro-dollars, rounded up once.
    disk = 2 * 100_000 + math.ceil(Fraction(3 * 20 * 200_000, 730))
    cost = billing.cost_breakdown(
        inst, platform_billing(inst.provider), clock.now + timedelta(days=1)
    )
    assert (
        (cost.compute_micros, cost.storage_micros) == (2 * 3_600_000, disk) == (7_200_000, 216_439)
    )
    month = spend.spend_report(
        rt.db,
        "2026-12",
        tz=rt.settings.tz(),
        now=clock.now + timedelta(hours=2),
        idle_threshold_pct=5.0,
        currency="USD",
    )
    [item] = month.instances
    assert (item.compute_micros, item.storage_micros) == (2 * 3_600_000, disk)


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
    assert "stopped: disk" in str(run(rt, "list").blocks)

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


def test_a_stopped_instance_without_a_storage_price_says_so_and_how_to_give_it(
    rt: Runtime, runpod_cloud: RunpodStandIn
):
    """Stopped with no storage price recorded (adopted, or registered without --disk and
    --storage): nothing shows its disk as costing $0.00/h; every view says the price is not
    known and how to tell the bot, and `/gpu policy NAME --disk --storage` does, from then on."""
    from bot.blocks import home as home_blocks
    from bot.i18n import speaking
    from bot.services import home

    settings = Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    rt.providers.add(ProviderRegistry.from_settings(settings).get("runpod"))
    clock = cast(Clock, rt.clock)
    iid = add_instance(
        rt.db,
        provider="runpod",
        # A pod whose answers name no disk: the bot learns no storage price from RunPod.
        provider_instance_id=runpod_cloud.add(disk_gb=0, volume_gb=None),
        price_micros=3_600_000,
        created_at=T0 - timedelta(hours=2),
    )
    hint = "`/gpu policy box --disk 200 --storage 0.10/GB-month`"

    ask = run(rt, "release box --stop")
    assert hint in ask.text
    done = click(rt, "instance_stop_confirm", str(iid))
    assert "*box* is stopped" in done.text
    assert hint in done.text
    clock.advance(hours=3)

    for listing in (run(rt, "status"), run(rt, "list")):
        shown = str(listing.blocks)
        assert "stopped 3h ago; no storage price recorded" in shown
        assert hint in shown
        assert "the disk of 1 stopped instance not counted (storage price unknown)" in shown
        assert "storage $0.00/h" not in shown
    assert hint in str(run(rt, "status box").blocks)
    page = str(home_blocks.home_view(home.home_view(rt, "UOWNER")))
    assert "stopped: disk price unknown" in page
    assert "$0.00/h" not in page.replace("$0.00/h together", "")
    assert "Not counted: the disk of 1 stopped instance whose storage price is unknown." in page
    month = str(run(rt, "spend").blocks)
    assert "Storage leaves out the disk of box: stopped, its storage price unknown." in month
    assert "`/gpu policy NAME --disk 200 --storage 0.10/GB-month` tells the bot" in month
    with speaking("zh"):
        zh = str(run(rt, "status").blocks) + str(
            home_blocks.home_view(home.home_view(rt, "UOWNER"))
        )
        zh += str(run(rt, "spend").blocks)
    assert "/gpu policy box --disk 200 --storage 0.10/GB-month" in zh
    assert "no storage price" not in zh
    assert "storage price unknown" not in zh
    assert "存储费用未计入 box 的磁盘" in zh

    # Told now: the disk bills from here on, the three stopped hours before cost nothing.
    told_at = clock.now
    reply = run(rt, "policy box --disk 730 --storage 0.10/GB-month")
    assert not reply.ephemeral
    assert "730 GB at $0.10/GB-month" in reply.text + str(reply.blocks)
    inst = get_instance(rt.db, iid)
    assert billing.storage_micros_per_hour(inst) == 100_000
    assert (
        billing.cost_breakdown(inst, platform_billing(inst.provider), told_at).storage_micros == 0
    )
    later = billing.cost_breakdown(
        inst, platform_billing(inst.provider), told_at + timedelta(hours=2)
    )
    assert later.storage_micros == 2 * 100_000
    listing = str(run(rt, "status").blocks)
    assert "stopped 3h ago; storage $0.10/h" in listing
    assert "not counted" not in listing
    assert "Storage leaves out" not in str(run(rt, "spend").blocks)
    # Only the owner or an admin may say it; a price needs a size.
    with pytest.raises(NotAuthorized):
        run(rt, "policy box --storage 0.20/GB-month", Caller(user_id="USTRANGER"))
    assert get_instance(rt.db, iid).storage_micros_per_gb_month == 100_000


def test_a_storage_price_needs_a_disk_size(rt: Runtime) -> None:
    add_instance(rt.db)
    with pytest.raises(UsageError, match="--storage needs --disk"):
        run(rt, "policy box --storage 0.10/GB-month")
    run(rt, "policy box --disk 100")
    run(rt, "policy box --storage 0.10/GB-month")
    inst = get_instance(rt.db, 1)
    assert (inst.disk_gb, inst.storage_micros_per_gb_month) == (100.0, 100_000)
