"""Trust at registration, against real parts: a real sshd as the machine, the platforms'
stand-ins (and moto for AWS) as their records, the store on SQLite and PostgreSQL.

A provider id is proven by the platform's record (its address and SSH port are the machine's),
a re-registration keeps its platform unless an admin changes it, adopting is an admin's act
told to the ops channel, addresses outside GPUBOT_INSTANCE_NETWORKS are refused before any
dial, dial failures read the same to members, failed attempts are limited, and reconcile says
once that a platform cannot be listed and once that it can again.

What the store decides (a re-registration's row, the failed attempts it counts) runs on both
stores; the rest on SQLite only."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from sqlmodel import select

from bot.blocks.forms import REGISTER_FORM, VALUE
from bot.commands import forms
from bot.errors import Conflict, NotAuthorized, Unreachable, UsageError
from bot.fleet.base import HostKey
from bot.fleet.fleet import Fleet
from bot.providers.aws import AwsProvider
from bot.providers.base import Provider
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services import tick
from bot.services.access import Caller
from bot.services.instances import instance_trust, reconcile, registration
from bot.services.instances.registration import RegisterRequest
from bot.services.speaking import audit
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, OutboxMessage
from tests.bot.services.support import Clock, RecordingNotifier, grant_key, make_runtime
from tests.fixtures.platforms.aws import amazon_image
from tests.fixtures.providers import (
    COMPSHARE_PRIVATE_KEY,
    CompshareStandIn,
    RunpodStandIn,
    VastStandIn,
)
from tests.fixtures.sshd import SshServer, start_sshd
from tests.fixtures.store import sqlite_only

pytestmark = pytest.mark.integration

ALICE = Caller("U0ALICE", channel_id="CTEAM", user_name="alice")
BOB = Caller("U0BOB", channel_id="CTEAM", user_name="bob")
ADMIN = Caller("UADMIN", channel_id="CTEAM")
USD = 1_000_000
#: An address of the documentation range: where the platform says the instance is.
ELSEWHERE = "198.51.100.9"


def _runtime(
    db: Database, sshd: SshServer, zipapp: Path, *providers: Provider, **settings: Any
) -> Runtime:
    """A runtime as Slack's (no console): machines over SSH, keys by name from sshd's dir."""
    rt = make_runtime(
        db,
        Clock(),
        providers=list(providers),
        notifier=RecordingNotifier(),
        ssh_key_dir=sshd.directory,
        ssh_connect_timeout_s=3.0,
        ssh_command_timeout_s=30.0,
        **settings,
    )
    rt.fleet = Fleet(rt.settings, zipapp_path=zipapp)
    grant_key(db, sshd.client_key_path.name, "U0ALICE", "U0BOB")
    return rt


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """One real sshd for the module: no test here stops it, changes its keys or counts its
    logins, and each test's store is new."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def closing() -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in made:
        rt.fleet.close()
        rt.executor.shutdown(wait=True)


def _request(sshd: SshServer, name: str, **changes: Any) -> RegisterRequest:
    values: dict[str, Any] = {
        "name": name,
        "address": f"{sshd.user}@{sshd.host}:{sshd.port}",
        "gpu_model": "a100",
        "price_micros_per_hour": 2 * USD,
        "release_in": timedelta(hours=3),
        "key_name": sshd.client_key_path.name,
    }
    values.update(changes)
    return RegisterRequest(**values)


def _live(db: Database) -> list[Instance]:
    with db.session() as session:
        return list(session.exec(select(Instance).where(Instance.state != "released")).all())


def _runpod(standin: RunpodStandIn) -> Provider:
    settings = Settings(runpod_api_url=standin.url, runpod_api_key=standin.api_key)
    return ProviderRegistry.from_settings(settings).get("runpod")


def _vast(standin: VastStandIn) -> Provider:
    settings = Settings(vast_api_url=standin.url, vast_api_key=standin.api_key)
    return ProviderRegistry.from_settings(settings).get("vast")


@dataclass
class Platform:
    """A platform account holding one instance that is not the machine at sshd."""

    provider: Provider
    provider_id: str
    reported: str
    released: Callable[[], bool]


@pytest.fixture(params=["runpod", "vast", "aws"])
def elsewhere(request: pytest.FixtureRequest) -> Iterator[Platform]:
    """Someone's instance, on each platform, at an address that is not the sshd's."""
    if request.param == "aws":
        url = request.getfixturevalue("aws_endpoint")
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        image = amazon_image(ec2)
        answer = ec2.run_instances(ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
        iid = answer["Instances"][0]["InstanceId"]
        provider = AwsProvider.from_settings(Settings(aws_endpoint_url=url))
        seen = provider.get(iid)

        def terminated() -> bool:
            found = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
            return bool(found["State"]["Name"] != "running")

        yield Platform(provider, iid, f"{seen.host}:22", terminated)
        return
    standin: RunpodStandIn | VastStandIn
    if request.param == "runpod":
        standin = RunpodStandIn(ssh_host=ELSEWHERE, ssh_port=22)
    else:
        standin = VastStandIn(ssh_host=ELSEWHERE, ssh_port=22)
    standin.start()
    try:
        provider = _runpod(standin) if isinstance(standin, RunpodStandIn) else _vast(standin)
        held = standin
        yield Platform(
            provider,
            standin.add(),
            f"{ELSEWHERE}:22",
            lambda: bool(held.calls_to("DELETE") or held.calls_to("PUT")),
        )
    finally:
        standin.close()


# --- a provider id is proven by the platform's record ------------------------------------------


@sqlite_only
def test_bob_s_box_under_someone_else_s_instance_id_is_refused(
    db: Database,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    elsewhere: Platform,
    closing: list[Runtime],
) -> None:
    rt = _runtime(db, sshd, fake_gpu_zipapp, elsewhere.provider)
    closing.append(rt)
    request = _request(
        sshd, "bobs", provider=elsewhere.provider.name, provider_id=elsewhere.provider_id
    )
    with pytest.raises(UsageError) as caught:
        registration.register(rt, BOB, request)
    said = caught.value.message
    assert f"reports instance {elsewhere.provider_id} at {elsewhere.reported}" in said
    assert f"not at {sshd.host}:{sshd.port}" in said
    assert "another machine" in said
    assert _live(db) == []
    assert not elsewhere.released()
    # Bob's box registers as what it is.
    registration.register(rt, BOB, _request(sshd, "bobs"))
    [inst] = _live(db)
    assert (inst.provider, inst.provider_instance_id) == ("manual", None)


@pytest.fixture
def pods(sshd: SshServer) -> Iterator[RunpodStandIn]:
    """RunPod, whose pods are at the sshd's address and port."""
    standin = RunpodStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        yield standin
    finally:
        standin.close()


def test_a_re_registration_without_provider_keeps_it_and_the_deadline_terminates(
    db: Database,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    pods: RunpodStandIn,
    closing: list[Runtime],
) -> None:
    rt = _runtime(db, sshd, fake_gpu_zipapp, _runpod(pods))
    closing.append(rt)
    pod = pods.add()
    registration.register(rt, ALICE, _request(sshd, "rp", provider="runpod", provider_id=pod))
    # Again, as the command or the form without --provider: the platform and its id stay.
    again = registration.register(
        rt, ALICE, _request(sshd, "rp", price_micros_per_hour=USD, release_in=timedelta(hours=1))
    )
    assert again.re_registered
    [inst] = _live(db)
    assert (inst.provider, inst.provider_instance_id) == ("runpod", pod)
    clock = rt.clock
    assert isinstance(clock, Clock)
    deadline = inst.deadline_at
    assert deadline is not None
    for at in (-35, -25, -5, 1, 2, 12, 13, 14):
        clock.set(deadline + timedelta(minutes=at))
        tick.tick(rt, clock.now)
    # The deadline went to the platform: the pod was terminated through RunPod's API.
    assert pods.calls_to("DELETE", f"/pods/{pod}"), pods.calls
    assert pod not in pods.instances
    with db.session() as session:
        found = session.get(Instance, inst.id)
        assert found is not None
        assert found.state in ("releasing", "released")


@sqlite_only
def test_the_register_form_left_at_manual_keeps_the_platform(
    db: Database,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    pods: RunpodStandIn,
    closing: list[Runtime],
) -> None:
    """The form's provider field starts at ``manual``: submitted so, with no id, a
    re-registration keeps the instance's platform and id."""
    rt = _runtime(db, sshd, fake_gpu_zipapp, _runpod(pods))
    closing.append(rt)
    pod = pods.add()
    registration.register(rt, ALICE, _request(sshd, "rp", provider="runpod", provider_id=pod))
    fields = {
        "name": "rp",
        "address": f"{sshd.user}@{sshd.host}:{sshd.port}",
        "gpu": "a100-sxm4-80gb",
        "price": "1.50/h",
        "provider": "manual",
        "key": sshd.client_key_path.name,
    }
    values: dict[str, dict[str, Any]] = {}
    for block_id, text in fields.items():
        if block_id in ("gpu", "provider"):
            option = {"text": {"type": "plain_text", "text": text}, "value": text}
            values[block_id] = {VALUE: {"type": "static_select", "selected_option": option}}
        else:
            values[block_id] = {VALUE: {"type": "plain_text_input", "value": text}}
    outcome = forms.submit_form(rt, ALICE, REGISTER_FORM, values)
    assert outcome.errors == {}
    assert outcome.reply is not None
    assert "Re-registered rp" in outcome.reply.text
    [inst] = _live(db)
    assert (inst.provider, inst.provider_instance_id, inst.price_micros) == (
        "runpod",
        pod,
        1_500_000,
    )


@sqlite_only
def test_changing_the_platform_id_is_an_admin_s_act_and_audited(
    db: Database,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    pods: RunpodStandIn,
    closing: list[Runtime],
) -> None:
    rt = _runtime(db, sshd, fake_gpu_zipapp, _runpod(pods))
    closing.append(rt)
    first, second = pods.add(), pods.add()
    registration.register(rt, ALICE, _request(sshd, "rp", provider="runpod", provider_id=first))
    with pytest.raises(UsageError, match="--provider-id needs --provider"):
        registration.register(rt, ALICE, _request(sshd, "rp", provider_id=second))
    with pytest.raises(NotAuthorized, match="Only an admin can change the platform"):
        registration.register(
            rt, ALICE, _request(sshd, "rp", provider="runpod", provider_id=second)
        )
    [inst] = _live(db)
    assert inst.provider_instance_id == first
    registration.register(rt, ADMIN, _request(sshd, "rp", provider="runpod", provider_id=second))
    [inst] = _live(db)
    assert (inst.provider, inst.provider_instance_id, inst.owner_id) == (
        "runpod",
        second,
        ALICE.user_id,
    )
    with db.session() as session:
        [row] = audit.entries(session, action="provider_changed")
        assert audit.details(row) == {
            "before": {"provider": "runpod", "id": first},
            "after": {"provider": "runpod", "id": second},
        }
        assert row.actor == ADMIN.user_id


# --- adopting is an admin's act ----------------------------------------------------------------


@sqlite_only
def test_adopting_is_for_admins_and_told_to_the_ops_channel(
    db: Database, sshd: SshServer, fake_gpu_zipapp: Path, closing: list[Runtime], tmp_path: Path
) -> None:
    standin = CompshareStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        settings = Settings(
            compshare_api_url=standin.url,
            compshare_public_key=standin.api_key,
            compshare_private_key=COMPSHARE_PRIVATE_KEY,
        )
        provider = ProviderRegistry.from_settings(settings).get("compshare")
        rt = _runtime(db, sshd, fake_gpu_zipapp, provider)
        closing.append(rt)
        uid = standin.add()
        request = reconcile.AdoptRequest(
            provider="compshare",
            provider_id=uid,
            name="cs1",
            ssh_user=sshd.user,
            key_name=sshd.client_key_path.name,
            price_micros_per_hour=550_000,
            agent_home=str(tmp_path / "remote-home"),
        )
        with pytest.raises(NotAuthorized) as caught:
            reconcile.adopt(rt, BOB, request)
        assert "Only an admin can adopt" in caught.value.message
        assert f"Ask an admin in the ops channel to adopt compshare {uid}" in caught.value.hint
        assert _live(db) == []
        assert standin.calls == [], "a member's adopt asks the platform nothing"

        result = reconcile.adopt(rt, ADMIN, request)
        assert result.instance.name == "cs1"
        with db.session() as session:
            [told] = session.exec(
                select(OutboxMessage).where(OutboxMessage.key == f"adopted:{result.instance.id}")
            ).all()
        assert told.recipient == "COPS"
        assert f"<@{ADMIN.user_id}> adopted *Compshare* instance `{uid}` (trainer)" in told.text
        assert "Tags: name=trainer, tag=Default, remark=lab-a" in told.text
        # A held instance is not adopted again, by anyone.
        with pytest.raises(Conflict, match="registered already, as cs1"):
            reconcile.adopt(rt, ADMIN, request)
    finally:
        standin.close()


# --- the address policy ------------------------------------------------------------------------


class NoDialFleet:
    """A fleet that fails the test when anything is dialled."""

    def scan_host_key(self, host: str, port: int = 22, **_: Any) -> HostKey:
        raise AssertionError(f"dialled {host}:{port}")

    def forget(self, name: str) -> None:
        return None


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@sqlite_only
def test_internal_addresses_are_refused_before_any_dial_with_one_message(
    db: Database, sshd: SshServer
) -> None:
    rt = make_runtime(db, Clock(), fleet=NoDialFleet(), instance_networks=("public",))
    said: set[str] = set()
    for host in ("169.254.169.254", "127.0.0.1", "10.0.0.1", "[::1]", "100.64.0.1", "localhost"):
        for port in (sshd.port, _closed_port(), 22):
            request = RegisterRequest(name="probe", address=f"root@{host}:{port}")
            for who in (BOB, ADMIN):
                with pytest.raises(NotAuthorized) as caught:
                    registration.register(rt, who, request)
                said.add(caught.value.user_text().replace(host.strip("[]"), "HOST"))
    assert said == {
        "HOST is not an address the bot registers instances at from Slack.\n"
        "Register the instance at its public address; an admin can list a private network "
        "in GPUBOT_INSTANCE_NETWORKS."
    }
    assert _live(db) == []


@sqlite_only
def test_a_listed_network_is_allowed(
    db: Database, sshd: SshServer, fake_gpu_zipapp: Path, closing: list[Runtime]
) -> None:
    rt = _runtime(db, sshd, fake_gpu_zipapp, instance_networks=("127.0.0.0/8",))
    closing.append(rt)
    result = registration.register(rt, BOB, _request(sshd, "box"))
    assert result.host_key_fingerprint == sshd.host_key.fingerprint
    [inst] = _live(db)
    assert inst.host == "127.0.0.1"
    # A name is resolved once and stored as the address it resolved to.
    named = registration.register(
        rt, BOB, _request(sshd, "box", address=f"{sshd.user}@localhost:{sshd.port}")
    )
    assert named.re_registered
    assert _live(db)[0].host == "127.0.0.1"


@sqlite_only
def test_the_console_is_not_limited(db: Database, sshd: SshServer) -> None:
    rt = make_runtime(
        db, Clock(), console=True, instance_networks=("public",), ssh_connect_timeout_s=2.0
    )
    rt.fleet = Fleet(rt.settings)
    try:
        port = _closed_port()
        for _ in range(instance_trust.ATTEMPTS + 2):
            with pytest.raises(Unreachable, match="connection refused"):
                registration.register(
                    rt, BOB, RegisterRequest(name="x", address=f"root@127.0.0.1:{port}")
                )
    finally:
        rt.fleet.close()


def test_dial_failures_read_the_same_to_members_and_are_limited(
    db: Database,
    sshd: SshServer,
    fake_gpu_zipapp: Path,
    closing: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fewer attempts than the bot's 8, so that fewer real registrations reach the limit.
    monkeypatch.setattr(instance_trust, "ATTEMPTS", 5)
    rt = _runtime(db, sshd, fake_gpu_zipapp)
    closing.append(rt)
    clock = rt.clock
    assert isinstance(clock, Clock)
    closed = _closed_port()
    not_ssh = socket.socket()
    not_ssh.bind(("127.0.0.1", 0))
    not_ssh.listen()
    try:
        wrong_user = _request(sshd, "a", address=f"nobody@{sshd.host}:{sshd.port}")
        messages = set()
        for request in (
            RegisterRequest(name="a", address=f"root@127.0.0.1:{closed}"),
            RegisterRequest(name="a", address=f"root@127.0.0.1:{not_ssh.getsockname()[1]}"),
            wrong_user,
            RegisterRequest(name="a", address="root@no-such-host.invalid:22"),
        ):
            with pytest.raises(Unreachable) as caught:
                registration.register(rt, BOB, request)
            messages.add(caught.value.user_text().replace(request.address, "ADDRESS"))
        assert len(messages) == 1, messages
        assert "no SSH server it can use answered there" in messages.pop()
        # An admin is told why.
        with pytest.raises(Unreachable, match="connection refused"):
            registration.register(
                rt, ADMIN, RegisterRequest(name="a", address=f"root@127.0.0.1:{closed}")
            )
    finally:
        not_ssh.close()
    # Bob's four failures and four more reach the limit; then he waits out the window.
    for _ in range(instance_trust.ATTEMPTS - 4):
        with pytest.raises(Unreachable):
            registration.register(
                rt, BOB, RegisterRequest(name="a", address=f"root@127.0.0.1:{closed}")
            )
    with pytest.raises(
        NotAuthorized, match="Too many registrations that failed; try again in 10 min"
    ):
        registration.register(rt, BOB, _request(sshd, "a"))
    # Alice is not held up by Bob, and her successes never count.
    for _ in range(instance_trust.ATTEMPTS + 1):
        registration.register(rt, ALICE, _request(sshd, "alices", release_in=None))
    clock.advance(seconds=instance_trust.WINDOW_S)
    with pytest.raises(Conflict, match="held by <@U0ALICE>"):
        registration.register(rt, BOB, _request(sshd, "a"))


# --- reconcile tells of a platform it cannot list ----------------------------------------------


@sqlite_only
def test_a_catch_all_404_outage_is_told_once_and_its_end_once(
    db: Database, vast_cloud: VastStandIn
) -> None:
    rt = make_runtime(db, Clock(), providers=[_vast(vast_cloud)])
    clock = rt.clock
    assert isinstance(clock, Clock)
    vast_cloud.catch_all(404)
    for _ in range(3):
        assert reconcile.reconcile(rt, clock.advance(minutes=5)) == []
    with db.session() as session:
        [told] = session.exec(select(OutboxMessage)).all()
        outages = audit.entries(session, action="platform_unlisted")
    assert told.key == "list_failed:vast:1"
    assert told.recipient == "COPS"
    assert "cannot list the instances of *Vast*" in told.text
    assert "404" in told.text
    assert "&lt;html&gt;" in told.text or "not the platform" in told.text
    assert len(outages) == 1
    vast_cloud.catch_all(None)
    for _ in range(2):
        reconcile.reconcile(rt, clock.advance(minutes=5))
    vast_cloud.outage(503)
    reconcile.reconcile(rt, clock.advance(minutes=5))
    reconcile.reconcile(rt, clock.advance(minutes=5))
    with db.session() as session:
        keys = [m.key for m in session.exec(select(OutboxMessage).order_by(OutboxMessage.id))]
        again = session.exec(
            select(OutboxMessage).where(OutboxMessage.key == "list_ok:vast:1")
        ).one()
    assert keys == ["list_failed:vast:1", "list_ok:vast:1", "list_failed:vast:2"]
    assert "can list the instances of *Vast* again (it could not for 15m)" in again.text


@sqlite_only
def test_a_rate_limit_is_not_an_outage(db: Database, vast_cloud: VastStandIn) -> None:
    rt = make_runtime(db, Clock(), providers=[_vast(vast_cloud)])
    vast_cloud.outage(429, retry_after="60")
    reconcile.reconcile(rt, rt.now())
    with db.session() as session:
        assert session.exec(select(OutboxMessage)).all() == []
        assert session.exec(select(AuditLog)).all() == []
