"""Reconciling with the platforms, against their stand-ins (and moto for AWS): an instance
stopped outside the bot and started again, one terminated while stopped, and instances that
nobody registered, reported once to the ops channel and adopted over a real sshd."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from sqlmodel import select

from bot import billing
from bot.errors import UsageError
from bot.providers.aws import AwsProvider
from bot.providers.base import Provider
from bot.providers.names import platform_name
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import reconcile
from bot.services.money import ledger
from bot.services.speaking import outbox
from bot.settings import Settings
from bot.store.models import AuditLog, Charge, Instance, Launch, OutboxMessage, Release
from tests.bot.services.support import (
    T0,
    Clock,
    RecordingNotifier,
    add_instance,
    get_instance,
    grant_key,
    make_runtime,
)
from tests.fixtures.platforms.aws import amazon_image
from tests.fixtures.providers import (
    COMPSHARE_PRIVATE_KEY,
    CompshareStandIn,
    RunpodStandIn,
    VastStandIn,
)
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.integration

OWNER = Caller("UOWNER", channel_id="CTEAM")
ADMIN = Caller("UADMIN", channel_id="CTEAM")
#: 730 GB at $0.10 per GB-month: $0.10 an hour.
DISK = {"disk_gb": 730.0, "storage_micros_per_gb_month": 100_000}


@dataclass
class Account:
    """A platform account: the provider the bot uses, and the platform's own console."""

    provider: Provider
    create: Callable[[], str]
    stop_outside: Callable[[str], None]
    start_outside: Callable[[str], None]
    terminate_outside: Callable[[str], None]


def _rest(name: str, standin: VastStandIn | CompshareStandIn) -> Account:
    if name == "compshare":
        settings = Settings(
            compshare_api_url=standin.url,
            compshare_public_key=standin.api_key,
            compshare_private_key=COMPSHARE_PRIVATE_KEY,
        )
    else:
        settings = Settings(vast_api_url=standin.url, vast_api_key=standin.api_key)
    provider = ProviderRegistry.from_settings(settings).get(name)
    return Account(
        provider,
        standin.add,
        standin.stop_outside,
        standin.start_outside,
        standin.terminate_outside,
    )


@pytest.fixture(params=["vast", "compshare", "aws"])
def account(request: pytest.FixtureRequest) -> Iterator[Account]:
    if request.param != "aws":
        yield _rest(request.param, request.getfixturevalue(f"{request.param}_cloud"))
        return
    url = request.getfixturevalue("aws_endpoint")
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
    image = amazon_image(ec2)

    def create() -> str:
        answer = ec2.run_instances(ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
        return answer["Instances"][0]["InstanceId"]

    yield Account(
        AwsProvider.from_settings(Settings(aws_endpoint_url=url)),
        create,
        lambda iid: ec2.stop_instances(InstanceIds=[iid]),
        lambda iid: ec2.start_instances(InstanceIds=[iid]),
        lambda iid: ec2.terminate_instances(InstanceIds=[iid]),
    )


def _runtime(db, *providers: Provider, **settings) -> Runtime:
    return make_runtime(db, Clock(T0), providers=list(providers), **settings)


def _registered(rt: Runtime, account: Account) -> tuple[int, str]:
    provider_id = account.create()
    seen = account.provider.get(provider_id)  # registered at the address the platform lists
    iid = add_instance(
        rt.db,
        host=seen.host or "127.0.0.1",
        port=seen.ssh_port,
        provider=account.provider.name,
        provider_instance_id=provider_id,
        created_at=T0 - timedelta(hours=2),
        price_micros=3_600_000,  # $3.60/h: $0.001 a second
        **DISK,
    )
    return iid, provider_id


def _outbox(rt: Runtime) -> list[OutboxMessage]:
    with rt.db.session() as session:
        return list(session.exec(select(OutboxMessage).order_by(OutboxMessage.id)).all())


def test_stopped_outside_the_bot_then_started_again(db, account: Account):
    rt = _runtime(db, account.provider)
    clock = rt.clock
    assert isinstance(clock, Clock)
    iid, provider_id = _registered(rt, account)
    assert reconcile.reconcile(rt, clock.now) == []  # running, as registered

    account.stop_outside(provider_id)
    stopped_at = clock.advance(minutes=20)
    assert reconcile.reconcile(rt, clock.now) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at, inst.released_at) == ("stopped", stopped_at, None)
    stopped_cost = billing.cost_breakdown(inst, platform_billing(inst.provider), stopped_at)
    # Stopped for three hours: compute stays where it was, the disk bills on.
    later = billing.cost_breakdown(
        inst, platform_billing(inst.provider), stopped_at + timedelta(hours=3)
    )
    assert later.compute_micros == stopped_cost.compute_micros
    assert later.storage_micros == stopped_cost.storage_micros + 3 * 100_000
    assert reconcile.reconcile(rt, clock.advance(minutes=5)) == []  # nothing new

    registered_at = (inst.host, inst.port)
    account.start_outside(provider_id)
    started_at = clock.advance(hours=3)
    assert reconcile.reconcile(rt, clock.now) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at) == ("active", None)
    # Where the platform runs it now (EC2 gives a started instance a new public IP).
    listed = account.provider.get(provider_id)
    assert (inst.host, inst.port) == (listed.host, listed.ssh_port)
    moved = (inst.host, inst.port) != registered_at
    # Billed again from the start on, not for the three hours it stood stopped, the start a
    # billing session of its own (an hourly platform rounds it on its own; see bot.billing).
    slack = (
        billing.rules_for(inst, platform_billing(inst.provider)).increment_s * 1_000
    )  # $0.001 a second
    hour_later = billing.cost_breakdown(
        inst, platform_billing(inst.provider), started_at + timedelta(hours=1)
    ).compute_micros
    at_start = billing.cost_breakdown(
        inst, platform_billing(inst.provider), started_at
    ).compute_micros
    assert 0 <= hour_later - (stopped_cost.compute_micros + 3_600_000) <= slack - 1_000
    assert 0 <= at_start - stopped_cost.compute_micros <= slack - 1_000
    assert hour_later == stopped_cost.compute_micros + 3_600_000
    assert at_start == stopped_cost.compute_micros

    told = [m.text for m in _outbox(rt) if m.recipient == "UOWNER"]
    assert len(told) == 2
    assert f"was stopped on {platform_name(account.provider.name)} outside the bot" in told[0]
    assert "keeps billing ($0.10/h)" in told[0]
    assert "started again" in told[1]
    assert (f"It came back at `{inst.host}:{inst.port}`" in told[1]) == moved
    with rt.db.session() as session:
        assert session.exec(select(Release.reason, Release.mode, Release.state)).all() == [
            ("reconcile", "stop", "confirmed")
        ]
        actions = session.exec(select(AuditLog.action).order_by(AuditLog.id)).all()
    assert actions == ["stopped_outside", "started_outside"] + ["address_changed"] * moved


def test_the_ledger_charges_nothing_for_the_stopped_hours(db, vast_cloud: VastStandIn):
    account = _rest("vast", vast_cloud)
    rt = _runtime(db, account.provider)
    clock = rt.clock
    assert isinstance(clock, Clock)
    iid, provider_id = _registered(rt, account)
    tz = rt.settings.tz()
    account.stop_outside(provider_id)
    reconcile.reconcile(rt, clock.set(T0 + timedelta(minutes=30)))
    ledger.accrue(rt.db, clock.now, tz)
    account.start_outside(provider_id)
    reconcile.reconcile(rt, clock.set(T0 + timedelta(hours=3)))
    end = T0 + timedelta(hours=5)
    ledger.accrue(rt.db, end, tz)
    with rt.db.session() as session:
        charges = session.exec(select(Charge).where(Charge.instance_id == iid)).all()
    compute = sum(c.amount_micros for c in charges if c.kind == "compute")
    storage = sum(c.amount_micros for c in charges if c.kind == "storage")
    # Ran 2h30m before the stop and 2h after the start, at $3.60/h; the disk all 7 hours.
    assert compute == round(4.5 * 3_600_000)
    assert storage == 7 * 100_000
    inst = get_instance(rt.db, iid)
    assert compute + storage == billing.cost_so_far(inst, platform_billing(inst.provider), end)


def test_terminated_while_stopped_ends_the_disk_too(db, compshare_cloud: CompshareStandIn):
    account = _rest("compshare", compshare_cloud)
    rt = _runtime(db, account.provider)
    clock = rt.clock
    assert isinstance(clock, Clock)
    iid, provider_id = _registered(rt, account)
    account.stop_outside(provider_id)
    reconcile.reconcile(rt, clock.now)
    account.terminate_outside(provider_id)
    gone_at = clock.advance(hours=1)
    assert reconcile.reconcile(rt, clock.now) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at) == ("released", T0)
    assert inst.released_at == inst.storage_deleted_at == gone_at
    assert "was released on Compshare outside the bot" in _outbox(rt)[-1].text


def test_a_release_under_way_is_left_to_the_release_engine(db, vast_cloud: VastStandIn):
    account = _rest("vast", vast_cloud)
    rt = _runtime(db, account.provider)
    iid, provider_id = _registered(rt, account)
    with rt.db.session() as session:
        session.add(Release(instance_id=iid, reason="user", requested_by="UOWNER", requested_at=T0))
    account.stop_outside(provider_id)
    assert reconcile.reconcile(rt, T0) == []
    assert get_instance(rt.db, iid).state == "active"


# --- instances nobody registered --------------------------------------------------------------


def test_an_instance_started_outside_the_bot_is_reported_once(db, runpod_cloud: RunpodStandIn):
    provider = ProviderRegistry.from_settings(
        Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    ).get("runpod")
    rt = _runtime(db, provider)
    stray = runpod_cloud.add()
    registered = runpod_cloud.add()
    add_instance(rt.db, provider="runpod", provider_instance_id=registered)
    stopped = runpod_cloud.add(status="EXITED")  # holds no compute
    now = T0 + timedelta(hours=2)  # the pods started 11:00, an hour before T0
    assert reconcile.reconcile(rt, now) == []
    assert reconcile.reconcile(rt, now + timedelta(minutes=5)) == []
    [notice] = [m for m in _outbox(rt) if m.recipient == "COPS"]
    assert notice.key == f"unregistered:runpod:{stray}"
    assert f"`{stray}` (trainer)" in notice.text
    assert "$0.69/h" in notice.text
    assert "running for 3h (since Wed 02 Dec 11:00 UTC)" in notice.text
    assert f"/gpu adopt runpod {stray} NAME" in notice.text
    assert registered not in notice.text
    assert stopped not in notice.text
    with rt.db.session() as session:
        found = session.exec(select(AuditLog).where(AuditLog.action == "unregistered_found"))
        assert len(found.all()) == 1


def test_young_instances_and_rentals_are_left_alone(db, vast_cloud: VastStandIn):
    provider = _rest("vast", vast_cloud).provider
    rt = _runtime(db, provider)
    young = vast_cloud.add()
    launched = vast_cloud.add()
    named = vast_cloud.add()
    with vast_cloud.lock:
        vast_cloud.instances[named]["label"] = "box-1-ab12cd34"  # a launch cut short named it
    with rt.db.session() as session:  # two rentals in progress: one answered, one not
        for key, state, provider_id in (
            ("aa", "launched", launched),
            ("ab12cd34", "launching", None),
        ):
            session.add(
                Launch(
                    launch_key=key,
                    position=1,
                    provider="vast",
                    instance_type="gpu",
                    platform_name=f"box-1-{key}",
                    renter="UOWNER",
                    provider_id=provider_id,
                    state=state,
                    lease_until=T0,
                    started_at=T0,
                    changed_at=T0,
                )
            )
    just_started = vast_cloud.instances[young]["start_date"] + 60  # a minute after it started
    from datetime import UTC, datetime

    now = datetime.fromtimestamp(just_started, UTC).replace(tzinfo=None)
    reconcile.reconcile(rt, now)
    assert _outbox(rt) == []
    reconcile.reconcile(rt, now + timedelta(minutes=10))
    assert [m.key for m in _outbox(rt)] == [f"unregistered:vast:{young}"]


def test_nobody_to_tell_reports_nothing(db, vast_cloud: VastStandIn):
    rt = _runtime(db, _rest("vast", vast_cloud).provider, channel=None, admins=frozenset())
    vast_cloud.add()
    reconcile.reconcile(rt, T0 + timedelta(hours=2))
    assert _outbox(rt) == []


def test_a_platform_that_fails_is_skipped_until_the_next_run(db, vast_cloud: VastStandIn):
    rt = _runtime(db, _rest("vast", vast_cloud).provider)
    vast_cloud.add()
    vast_cloud.outage(503)
    assert reconcile.reconcile(rt, T0 + timedelta(hours=2)) == []
    vast_cloud.outage(None)
    reconcile.reconcile(rt, T0 + timedelta(hours=2, minutes=5))
    keys = sorted(m.key for m in _outbox(rt))
    # The outage and its end are said once each; the instance nobody registered, once listed.
    assert keys == ["list_failed:vast:1", "list_ok:vast:1", "unregistered:vast:1001"]


def test_reported_then_adopted(local_rt: Runtime, sshd: SshServer, tmp_path: Path):
    rt = local_rt
    standin = CompshareStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        account = _rest("compshare", standin)
        rt.providers.add(account.provider)
        rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
        grant_key(rt.db, sshd.client_key_path.name, *("UADMIN", "UOWNER"))
        provider_id = standin.add()
        clock = rt.clock
        assert isinstance(clock, Clock)
        clock.set(T0 + timedelta(hours=1))
        reconcile.reconcile(rt, clock.now)
        outbox.deliver_due(rt, clock.now)
        notifier = rt.notifier
        assert isinstance(notifier, RecordingNotifier)
        [notice] = notifier.to("COPS")
        assert "3.96 CNY/h" in notice.text
        assert "running for 2h (since Wed 02 Dec 11:00 UTC)" in notice.text
        assert "name=trainer, tag=Default, remark=lab-a" in notice.text

        request = reconcile.AdoptRequest(
            provider="compshare",
            provider_id=provider_id,
            name="cs1",
            ssh_user=sshd.user,
            key_name=sshd.client_key_path.name,
            release_in=timedelta(hours=3),
            agent_home=str(tmp_path / "remote-home"),
        )
        # The platform prices it in CNY, the bot counts in USD: a price is needed, and
        # nothing is stored without one.
        with pytest.raises(UsageError, match="in CNY") as caught:
            reconcile.adopt(rt, OWNER, request)
        assert "--price" in caught.value.hint
        with rt.db.session() as session:
            assert session.exec(select(Instance)).all() == []

        from dataclasses import replace

        result = reconcile.adopt(rt, OWNER, replace(request, price_micros_per_hour=550_000))
        assert result.instance.name == "cs1"
        inst = get_instance(rt.db, result.instance.id)
        assert (inst.provider, inst.provider_instance_id) == ("compshare", provider_id)
        assert (inst.host, inst.port) == (sshd.host, sshd.port)
        assert (inst.gpu_model, inst.gpu_count, inst.price_micros) == ("4090", 2, 550_000)
        assert inst.host_key_fingerprint == sshd.host_key.fingerprint
        assert inst.deadline_at == clock.now + timedelta(hours=3)

        # Once held by a registration, it is never reported again.
        reconcile.reconcile(rt, clock.advance(hours=1))
        outbox.deliver_due(rt, clock.now)
        assert [p for p in notifier.to("COPS") if "nobody registered" in p.text] == [notice]
    finally:
        standin.close()


def test_aws_is_looked_at_once_the_team_uses_it():
    registry = ProviderRegistry.from_settings(Settings(vast_api_key="k"))
    assert [p.name for p in registry.accounts()] == ["vast"]
    assert [p.name for p in registry.accounts({"aws"})] == ["aws", "vast"]
    explicit = ProviderRegistry.from_settings(Settings(aws_endpoint_url="http://127.0.0.1:9"))
    assert [p.name for p in explicit.accounts()] == ["aws"]


def test_a_bot_counting_in_yuan_adopts_at_the_platform_s_price(
    local_rt: Runtime, sshd: SshServer, tmp_path: Path
):
    """Compshare prices in CNY: a bot that counts in CNY takes that price, and bills it by
    Compshare's rules in the catalogue (started hours)."""
    rt = local_rt
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory, currency="CNY")
    grant_key(rt.db, sshd.client_key_path.name, *("UADMIN", "UOWNER"))
    standin = CompshareStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        rt.providers.add(_rest("compshare", standin).provider)
        provider_id = standin.add()
        clock = rt.clock
        assert isinstance(clock, Clock)
        request = reconcile.AdoptRequest(
            provider="compshare",
            provider_id=provider_id,
            name="cs1",
            ssh_user=sshd.user,
            key_name=sshd.client_key_path.name,
            release_in=timedelta(hours=3),
            agent_home=str(tmp_path / "remote-home"),
        )
        result = reconcile.adopt(rt, OWNER, request)
        inst = get_instance(rt.db, result.instance.id)
        assert (inst.price_micros, inst.currency) == (3_960_000, "CNY")
        rules = billing.rules_for(inst, platform_billing(inst.provider))
        assert (rules.increment, rules.currency) == ("hour", "CNY")
        ten_minutes = billing.cost_so_far(
            inst, platform_billing(inst.provider), inst.created_at + timedelta(minutes=10)
        )
        assert ten_minutes == 3_960_000
    finally:
        standin.close()


def test_adopting_a_vast_instance_takes_its_disk_and_storage_price(
    local_rt: Runtime, sshd: SshServer, tmp_path: Path
):
    """Vast says an instance's disk and what it costs an hour (in dph_total too): the
    registration bills the disk apart, at Vast's price, and compute without it."""
    rt = local_rt
    rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory)
    grant_key(rt.db, sshd.client_key_path.name, *("UADMIN", "UOWNER"))
    standin = VastStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        rt.providers.add(_rest("vast", standin).provider)
        provider_id = standin.add()
        request = reconcile.AdoptRequest(
            provider="vast",
            provider_id=provider_id,
            name="v1",
            ssh_user=sshd.user,
            key_name=sshd.client_key_path.name,
            release_in=timedelta(hours=3),
            agent_home=str(tmp_path / "remote-home"),
        )
        inst = get_instance(rt.db, reconcile.adopt(rt, OWNER, request).instance.id)
        assert (inst.price_micros, inst.disk_gb) == (700_000, 86.4)
        # 86.4 GB at 0.012 $/h: what Vast bills for the disk, to the micro (rounded up).
        assert 12_000 <= billing.storage_micros_per_hour(inst) <= 12_001
        hour = billing.cost_breakdown(
            inst, platform_billing(inst.provider), inst.created_at + timedelta(hours=1)
        )
        assert hour.compute_micros + hour.storage_micros in (712_000, 712_001)
    finally:
        standin.close()


def test_adopting_with_a_storage_price_but_no_disk_is_refused(db, runpod_cloud: RunpodStandIn):
    provider = ProviderRegistry.from_settings(
        Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    ).get("runpod")
    rt = _runtime(db, provider)
    request = reconcile.AdoptRequest(
        provider="runpod",
        provider_id=runpod_cloud.add(disk_gb=0, volume_gb=None),  # no disk RunPod would bill
        name="rp1",
        storage_micros_per_gb_month=100_000,
    )
    with pytest.raises(UsageError, match="--storage needs --disk"):
        reconcile.adopt(rt, ADMIN, request)


def test_a_stop_seen_outside_prices_a_disk_nobody_priced(db, vast_cloud: VastStandIn):
    """Registered without a storage price, stopped on Vast: the registration takes the disk
    and the stopped price Vast says, from the stop on (the hours before cost no storage)."""
    account = _rest("vast", vast_cloud)
    rt = _runtime(db, account.provider)
    clock = rt.clock
    assert isinstance(clock, Clock)
    provider_id = account.create()
    iid = add_instance(
        rt.db,
        provider="vast",
        provider_instance_id=provider_id,
        created_at=T0 - timedelta(hours=2),
        price_micros=3_600_000,
    )
    vast_cloud.stop_outside(provider_id, storage_cost=0.2)  # 86.4 GB: 0.024 $/h stopped
    stopped_at = clock.advance(minutes=20)
    assert reconcile.reconcile(rt, clock.now) == [iid]
    inst = get_instance(rt.db, iid)
    assert inst.state == "stopped"
    assert inst.disk_gb == 86.4
    assert 24_000 <= billing.storage_micros_per_hour(inst) <= 24_001
    at_stop = billing.cost_breakdown(inst, platform_billing(inst.provider), stopped_at)
    assert at_stop.storage_micros == 0
    later = billing.cost_breakdown(
        inst, platform_billing(inst.provider), stopped_at + timedelta(hours=2)
    )
    assert 48_000 <= later.storage_micros <= 48_002
    [told] = [m.text for m in _outbox(rt) if m.recipient == "UOWNER"]
    assert "keeps billing ($0.0240/h)" in told
    assert "/gpu policy" not in told


def test_a_stop_seen_outside_keeps_a_storage_price_someone_gave(db, vast_cloud: VastStandIn):
    account = _rest("vast", vast_cloud)
    rt = _runtime(db, account.provider)
    iid, provider_id = _registered(rt, account)
    vast_cloud.stop_outside(provider_id, storage_cost=0.2)
    clock = rt.clock
    assert isinstance(clock, Clock)
    assert reconcile.reconcile(rt, clock.advance(minutes=20)) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.disk_gb, inst.storage_micros_per_gb_month) == (730.0, 100_000)


def test_the_meter_stops_when_ec2_says_it_stopped_and_terminated(db, aws_endpoint: str):
    """EC2 writes when a user stopped or terminated an instance ("User initiated (... GMT)"):
    reconcile, looking later, stops the meter there, not when it happened to look."""
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_endpoint)
    image = amazon_image(ec2)
    provider = AwsProvider.from_settings(Settings(aws_endpoint_url=aws_endpoint))
    # moto stamps transitions with the real time: the bot's clock looks 40 minutes after it.
    started = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    rt = make_runtime(db, Clock(started + timedelta(minutes=40)), providers=[provider])
    provider_id = ec2.run_instances(
        ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1
    )["Instances"][0]["InstanceId"]
    seen = provider.get(provider_id)
    iid = add_instance(
        rt.db,
        host=seen.host or "127.0.0.1",
        provider="aws",
        provider_instance_id=provider_id,
        created_at=started - timedelta(hours=2),
        price_micros=3_600_000,
        **DISK,
    )

    ec2.stop_instances(InstanceIds=[provider_id])
    stopped = provider.get(provider_id).ended_at
    assert stopped is not None
    assert started <= stopped <= started + timedelta(minutes=5)
    assert reconcile.reconcile(rt, rt.clock()) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.stopped_at) == ("stopped", stopped)

    ec2.terminate_instances(InstanceIds=[provider_id])
    ended = provider.get(provider_id).ended_at
    assert ended is not None
    assert ended >= stopped
    assert reconcile.reconcile(rt, rt.clock()) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.released_at, inst.storage_deleted_at) == ("released", ended, ended)
    assert inst.stopped_at == stopped  # compute had stopped already


def test_ec2_s_transition_reason_gives_a_time_only_when_it_carries_one():
    from bot.providers.aws import _instance

    def seen(reason: str) -> datetime | None:
        item = {"InstanceId": "i-1", "State": {"Name": "stopped"}, "StateTransitionReason": reason}
        return _instance(item).ended_at

    assert seen("User initiated (2026-12-04 10:00:00 GMT)") == datetime(2026, 12, 4, 10, 0)
    assert seen("Server.ScheduledStop: Stopped due to scheduled retirement") is None
    assert seen("User initiated (2026-13-04 10:00:00 GMT)") is None


def test_a_compshare_stop_seen_outside_takes_the_powered_off_disk_price_and_release_time(
    db, compshare_cloud: CompshareStandIn
):
    """Stopped on Compshare: the registration (in yuan) takes the disk Compshare lists as
    billed while powered off and its price, and the owner is told when Compshare itself
    releases the machine."""
    account = _rest("compshare", compshare_cloud)
    rt = _runtime(db, account.provider, currency="CNY", timezone="Asia/Shanghai")
    clock = rt.clock
    assert isinstance(clock, Clock)
    provider_id = account.create()
    iid = add_instance(
        rt.db,
        provider="compshare",
        provider_instance_id=provider_id,
        created_at=T0 - timedelta(hours=2),
        price_micros=3_960_000,
        currency="CNY",
    )
    account.stop_outside(provider_id)
    stopped_at = clock.advance(minutes=20)
    assert reconcile.reconcile(rt, clock.now) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.disk_gb, inst.storage_micros_per_gb_month) == (
        "stopped",
        100.0,
        365_000,
    )
    # 100 GB at 0.365 CNY per GB-month of 730 h: 0.05 CNY an hour, as Compshare lists it.
    assert billing.storage_micros_per_hour(inst) == 50_000
    later = billing.cost_breakdown(
        inst, platform_billing(inst.provider), stopped_at + timedelta(hours=10)
    )
    assert later.storage_micros == 500_000
    [told] = [m.text for m in _outbox(rt) if m.recipient == "UOWNER"]
    assert "keeps billing (0.0500 CNY/h)" in told
    # ReleaseTime 2026-12-09 11:00 UTC is 19:00 in Shanghai.
    assert "Compshare itself releases it, disk and data, at" in told
    assert "at Wed 09 Dec 19:00 CST unless it is started again" in told


class _ReleasedWhileListing:
    """A provider whose list is taken, then (another thread's release finishing) the
    registration of ``provider_id`` is marked released before reconcile reads the store."""

    def __init__(self, provider: Provider, rt: Runtime, iid: int, released_at: datetime) -> None:
        self.provider, self.rt, self.iid, self.released_at = provider, rt, iid, released_at
        self.name, self.capabilities = provider.name, provider.capabilities

    def list_instances(self) -> list:
        listed = self.provider.list_instances()
        with self.rt.db.session() as session:
            inst = session.get(Instance, self.iid)
            assert inst is not None
            inst.state, inst.released_at = "released", self.released_at
        return listed

    def __getattr__(self, name: str) -> object:
        return getattr(self.provider, name)


@pytest.mark.parametrize("released", ["after the list", "before the list"])
def test_a_machine_released_while_its_platform_is_listed_is_not_reported_as_a_stranger(
    db, runpod_cloud: RunpodStandIn, released: str
):
    """Found by a shuffled run: reconcile read the registrations after the platform's list, so
    a release finished in between left a machine the list still showed running and no
    registration held, and the ops channel was told to adopt it. A registration released since
    the list was asked for still holds its machine; one released before it does not."""
    provider = ProviderRegistry.from_settings(
        Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    ).get("runpod")
    rt = _runtime(db)
    pod = runpod_cloud.add()
    iid = add_instance(rt.db, provider="runpod", provider_instance_id=pod)
    now = T0 + timedelta(hours=2)
    at = now if released == "after the list" else now - timedelta(seconds=1)
    rt.providers = ProviderRegistry([_ReleasedWhileListing(provider, rt, iid, at)])  # type: ignore[list-item]
    rt.clock = Clock(now)
    reconcile.reconcile(rt, now)
    keys = [m.key for m in _outbox(rt) if m.recipient == "COPS"]
    assert keys == ([] if released == "after the list" else [f"unregistered:runpod:{pod}"])
