"""An instance that comes back at another address after a restart on its platform: the
registration follows the platform's address, audited, its owner told once, the fleet's pooled
connection dropped; the pinned host key still holds at the new address."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from bot.errors import FleetError, Unreachable
from bot.fleet.base import Target
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import polling, reconcile
from bot.services.speaking import outbox
from bot.settings import Settings
from bot.store.models import AuditLog, Instance, OutboxMessage, Prompt
from tests.bot.services.support import (
    T0,
    Clock,
    RecordingNotifier,
    add_instance,
    get_instance,
    grant_key,
    make_runtime,
)
from tests.fixtures.providers import LambdaStandIn, RunpodStandIn, free_port
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.integration

OWNER = Caller("UOWNER", channel_id="CTEAM")


class RecordingFleet:
    """Stands in for the fleet: records where each poll went and which connections were
    dropped; every agent answers ``answer`` (a failed poll by default)."""

    closed = False  # the bot is not shutting down

    def __init__(self) -> None:
        self.dialed: list[tuple[str, str, int]] = []
        self.forgotten: list[str] = []
        self.answer: FleetError = Unreachable("connection refused", instance="?")

    def fan_out(self, targets: Sequence[Target], fn: object) -> dict[str, FleetError]:
        self.dialed += [(t.name, t.host, t.port) for t in targets]
        return {t.name: self.answer for t in targets}

    def forget(self, name: str) -> None:
        self.forgotten.append(name)


def _runtime(db, provider) -> tuple[Runtime, Clock, RecordingFleet]:
    clock = Clock(T0)
    fleet = RecordingFleet()
    rt = make_runtime(db, clock, providers=[provider], fleet=fleet, poll_interval_s=60)
    return rt, clock, fleet


def _owner_texts(rt: Runtime) -> list[str]:
    with rt.db.session() as session:
        rows = session.exec(select(OutboxMessage).order_by(col(OutboxMessage.id))).all()
    return [m.text for m in rows if m.recipient == "UOWNER"]


def _moves(rt: Runtime) -> list[dict[str, str]]:
    with rt.db.session() as session:
        rows = session.exec(
            select(AuditLog.details_json).where(AuditLog.action == "address_changed")
        ).all()
    return [json.loads(r or "{}") for r in rows]


def test_a_pod_started_again_at_a_new_address_is_reached_there(db, runpod_cloud: RunpodStandIn):
    provider = ProviderRegistry.from_settings(
        Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    ).get("runpod")
    rt, clock, fleet = _runtime(db, provider)
    pod = runpod_cloud.add()
    iid = add_instance(
        rt.db,
        name="box1",
        host=runpod_cloud.ssh_host,
        port=runpod_cloud.ssh_port,
        provider="runpod",
        provider_instance_id=pod,
        created_at=T0 - timedelta(hours=1),
        host_key_fingerprint="SHA256:pinned",
    )
    runpod_cloud.stop_outside(pod)
    assert reconcile.reconcile(rt, clock.advance(minutes=5)) == [iid]
    runpod_cloud.move(pod, "1.2.3.4", 22022)  # RunPod gives a pod started again a new address
    runpod_cloud.start_outside(pod)
    started = clock.advance(minutes=5)
    assert reconcile.reconcile(rt, started) == [iid]

    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.host, inst.port) == ("active", "1.2.3.4", 22022)
    assert inst.host_key_fingerprint == "SHA256:pinned"  # trust is not reset
    assert inst.poll_due_at == started  # polled at the new address at once
    assert _moves(rt) == [
        {
            "provider": "runpod",
            "old": f"{runpod_cloud.ssh_host}:{runpod_cloud.ssh_port}",
            "new": "1.2.3.4:22022",
        }
    ]
    assert fleet.forgotten == ["box1"]
    told = _owner_texts(rt)
    assert len(told) == 2
    assert "started again on RunPod" in told[1]
    assert "It came back at `1.2.3.4:22022`." in told[1]

    polling.poll_instances(rt, started)
    assert fleet.dialed == [("box1", "1.2.3.4", 22022)]
    # Once: nothing new on the next run.
    assert reconcile.reconcile(rt, clock.advance(minutes=5)) == []
    assert len(_owner_texts(rt)) == 2
    assert len(_moves(rt)) == 1


def _lambda(db, lambda_cloud: LambdaStandIn) -> tuple[Runtime, Clock, RecordingFleet, int, str]:
    provider = ProviderRegistry.from_settings(
        Settings(lambda_api_url=lambda_cloud.url + "/api/v1", lambda_api_key=lambda_cloud.api_key)
    ).get("lambda")
    rt, clock, fleet = _runtime(db, provider)
    box = lambda_cloud.add()
    iid = add_instance(
        rt.db,
        name="box1",
        host=lambda_cloud.ssh_host,
        port=22,
        provider="lambda",
        provider_instance_id=box,
        created_at=T0 - timedelta(hours=1),
    )
    return rt, clock, fleet, iid, box


def test_a_running_instance_follows_the_platform_once_its_old_address_fails(
    db, lambda_cloud: LambdaStandIn
):
    rt, clock, fleet, iid, box = _lambda(db, lambda_cloud)
    with lambda_cloud.lock:  # restarted on the platform between two looks, with a new IP
        lambda_cloud.instances[box]["ip"] = "5.6.7.8"
    # The registered address has not failed yet: it is left alone.
    assert reconcile.reconcile(rt, clock.now) == []
    assert get_instance(rt.db, iid).host == lambda_cloud.ssh_host

    fleet.answer = Unreachable("connection timed out", instance="box1")
    polling.poll_instances(rt, clock.now)
    assert get_instance(rt.db, iid).last_poll_ok is False
    moved_at = clock.advance(minutes=5)
    assert reconcile.reconcile(rt, moved_at) == [iid]
    inst = get_instance(rt.db, iid)
    assert (inst.host, inst.port, inst.state) == ("5.6.7.8", 22, "active")
    told = _owner_texts(rt)
    assert len(told) == 1
    assert "*box1* came back at `5.6.7.8:22` on Lambda" in told[0]
    assert fleet.forgotten == ["box1"]
    polling.poll_instances(rt, moved_at)  # due at once, at the new address
    assert fleet.dialed[-1] == ("box1", "5.6.7.8", 22)

    # The next failed poll does not move it again: the platform still says 5.6.7.8.
    assert reconcile.reconcile(rt, clock.advance(minutes=5)) == []
    assert len(_owner_texts(rt)) == 1


def test_an_address_another_registration_holds_is_not_taken(db, lambda_cloud: LambdaStandIn):
    rt, clock, _, iid, box = _lambda(db, lambda_cloud)
    add_instance(rt.db, name="other", host="5.6.7.8", port=22)
    with lambda_cloud.lock:
        lambda_cloud.instances[box]["ip"] = "5.6.7.8"
    polling.poll_instances(rt, clock.now)  # fails: the fleet answers nothing
    assert reconcile.reconcile(rt, clock.advance(minutes=5)) == []
    assert get_instance(rt.db, iid).host == lambda_cloud.ssh_host
    assert _owner_texts(rt) == []
    assert _moves(rt) == []


def _other_host_key(directory: Path) -> tuple[str, str, str]:
    """(type, base64, SHA256 fingerprint) of a fresh key that is not the server's."""
    path = directory / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    key_type, key_b64 = path.with_suffix(".pub").read_text().split()[:2]
    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return key_type, key_b64, "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def test_the_pinned_host_key_holds_at_the_new_address(
    local_rt: Runtime, sshd: SshServer, tmp_path: Path
):
    rt = local_rt
    standin = RunpodStandIn(ssh_host=sshd.host, ssh_port=sshd.port)
    standin.start()
    try:
        provider = ProviderRegistry.from_settings(
            Settings(runpod_api_url=standin.url, runpod_api_key=standin.api_key)
        ).get("runpod")
        rt.providers.add(provider)
        rt.settings = rt.settings.with_(ssh_key_dir=sshd.directory, poll_interval_s=60)
        grant_key(rt.db, sshd.client_key_path.name, *("UOWNER",))
        pod = standin.add()
        result = reconcile.adopt(
            rt,
            OWNER,
            reconcile.AdoptRequest(
                provider="runpod",
                provider_id=pod,
                name="pod1",
                ssh_user=sshd.user,
                key_name=sshd.client_key_path.name,
                release_in=timedelta(hours=3),
                agent_home=str(tmp_path / "remote-home"),
            ),
        )
        iid = result.instance.id
        assert get_instance(rt.db, iid).host_key_fingerprint == sshd.host_key.fingerprint
        clock = rt.clock
        assert isinstance(clock, Clock)

        # Registered before a restart, at the address it had then.
        _set(rt, iid, port=free_port())
        standin.stop_outside(pod)
        assert reconcile.reconcile(rt, clock.advance(minutes=10)) == [iid]
        standin.start_outside(pod)
        assert reconcile.reconcile(rt, clock.advance(minutes=5)) == [iid]
        assert (get_instance(rt.db, iid).host, get_instance(rt.db, iid).port) == (
            sshd.host,
            sshd.port,
        )
        [polled] = polling.poll_instances(rt, clock.now)
        assert polled.ok  # the same server, the pinned key: reached at the new address

        # Another host key at the new address: refused as any changed host key is.
        key_type, key_b64, fingerprint = _other_host_key(tmp_path)
        _set(
            rt,
            iid,
            port=free_port(),
            host_key_type=key_type,
            host_key_b64=key_b64,
            host_key_fingerprint=fingerprint,
            last_poll_ok=False,
        )
        assert reconcile.reconcile(rt, clock.advance(minutes=5)) == [iid]
        [refused] = polling.poll_instances(rt, clock.now)
        assert not refused.ok
        inst = get_instance(rt.db, iid)
        assert (inst.host, inst.port) == (sshd.host, sshd.port)
        assert inst.host_key_fingerprint == fingerprint  # still pinned, not replaced
        with rt.db.session() as session:
            kinds = session.exec(select(Prompt.kind).where(Prompt.instance_id == iid)).all()
        assert "host_key_changed" in kinds
        outbox.deliver_due(rt, clock.now)
        notifier = rt.notifier
        assert isinstance(notifier, RecordingNotifier)
        assert notifier.containing(f"came back at `{sshd.host}:{sshd.port}`")
    finally:
        standin.close()


def _set(rt: Runtime, iid: int, **values: object) -> None:
    with rt.db.session() as session:
        session.exec(update(Instance).where(col(Instance.id) == iid).values(**values))
