"""Releases through a proxy's catch-all 404: unknown, retried, escalated; never "gone" until the
platform itself says so (Lambda's ``global/object-does-not-exist`` document or a terminated
state)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlmodel import select

from bot.errors import ProviderUnknownOutcome
from bot.providers.base import ProviderInstance, ReleaseOutcome
from bot.providers.registry import ProviderRegistry
from bot.runtime import Runtime
from bot.services.instances import releases
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Prompt, Release
from tests.bot.services.support import (
    T0,
    Clock,
    NoFleet,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)
from tests.fixtures.providers import LambdaStandIn


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def rt(db: Database, clock: Clock, lambda_cloud: LambdaStandIn) -> Runtime:
    settings = Settings(
        lambda_api_url=lambda_cloud.url + "/api/v1", lambda_api_key=lambda_cloud.api_key
    )
    lam = ProviderRegistry.from_settings(settings).get("lambda")
    return make_runtime(db, clock, providers=[lam], fleet=NoFleet(), channel="COPS")


def _retry(rt: Runtime, clock: Clock, release_id: int) -> Release:
    """Move the clock to the release's next attempt and make it."""
    due = releases.load_release(rt, release_id).next_attempt_at
    assert due is not None
    clock.now = max(clock.now, due)
    return releases.process_release(rt, release_id)


def _escalations(rt: Runtime, iid: int) -> list[Prompt]:
    with rt.db.session() as session:
        return list(
            session.exec(
                select(Prompt).where(
                    Prompt.instance_id == iid, Prompt.kind == releases.KIND_ESCALATION
                )
            ).all()
        )


def test_a_catch_all_404_is_retried_escalated_once_and_keeps_the_meter_running(
    rt: Runtime, clock: Clock, lambda_cloud: LambdaStandIn
) -> None:
    pid = lambda_cloud.add()
    iid = add_instance(rt.db, provider="lambda", provider_instance_id=pid, owner_id="UOWNER")
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    assert rel.id is not None
    lambda_cloud.catch_all()

    first = releases.process_release(rt, rel.id)
    assert first.state == "pending"
    assert first.attempts == 1
    assert first.next_attempt_at is not None
    assert first.next_attempt_at > T0
    for _ in range(releases.ESCALATE_AFTER_FAILURES + 2):
        after = _retry(rt, clock, rel.id)
    assert after.state == "escalated"
    assert after.attempts == releases.ESCALATE_AFTER_FAILURES + 3
    assert after.last_error is not None
    assert "404" in after.last_error
    assert "404 page not found" in after.last_error
    assert lambda_cloud.api_key not in after.last_error

    sent = _escalations(rt, iid)
    assert sorted((p.key.split(":")[1], p.recipient) for p in sent) == [
        ("channel", "COPS"),
        ("owner", "UOWNER"),
    ]
    with rt.db.session() as session:
        inst = get_instance(rt.db, iid)
        notice = releases.notice_for(rt, session, sent[0], inst)
        released = session.exec(select(Prompt).where(Prompt.kind == releases.KIND_RELEASED)).all()
    assert isinstance(notice, releases.ReleaseEscalation)
    assert notice.last_error is not None
    assert "The platform answered" in notice.last_error
    assert released == []
    assert inst.released_at is None
    assert inst.stopped_at is None
    assert inst.state == "releasing"
    assert lambda_cloud.instances[pid]["status"] == "active"

    # The platform answers as itself again: the release goes through and is confirmed.
    lambda_cloud.catch_all(None)
    clock.advance(hours=2)
    done = releases.process_release(rt, rel.id)
    for _ in range(3):
        if done.state == "confirmed":
            break
        done = _retry(rt, clock, rel.id)
    assert done.state == "confirmed"
    assert lambda_cloud.instances[pid]["status"] == "terminated"
    assert get_instance(rt.db, iid).released_at is not None
    assert len(_escalations(rt, iid)) == 2  # escalated once, not again


def test_the_platforms_own_not_found_confirms(rt: Runtime, lambda_cloud: LambdaStandIn) -> None:
    iid = add_instance(rt.db, provider="lambda", provider_instance_id="0" * 32, owner_id="U1")
    rel = releases.request_release(rt, iid, reason="user", requested_by="U1")
    assert rel.id is not None

    done = releases.process_release(rt, rel.id)

    assert done.state == "confirmed"
    assert done.mode == "terminate"
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == T0
    assert _escalations(rt, iid) == []


def test_the_meter_stops_when_the_platform_says_it_ended(rt: Runtime, clock: Clock) -> None:
    iid = add_instance(rt.db, provider="lambda", provider_instance_id="x", created_at=T0)
    clock.now = T0 + timedelta(hours=3)
    ended = T0 + timedelta(hours=1)
    with rt.db.session() as session:
        assert releases.mark_instance_released(
            session, iid, now=rt.now(), mode="terminate", at=ended
        )
    inst = get_instance(rt.db, iid)
    assert inst.released_at == ended
    assert inst.stopped_at == ended


def test_a_slow_release_keeps_its_claim_by_heartbeat(
    rt: Runtime, clock: Clock, lambda_cloud: LambdaStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(releases, "CLAIM_HEARTBEAT_S", 0.05)
    pid = lambda_cloud.add()
    iid = add_instance(rt.db, provider="lambda", provider_instance_id=pid)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    assert rel.id is not None
    release_id = rel.id
    lambda_cloud.holds["POST"] = 1.0  # the terminate is slow to answer
    holder = threading.Thread(target=releases.process_release, args=(rt, release_id))
    holder.start()
    try:
        deadline = time.monotonic() + 10
        while not lambda_cloud.calls_to("POST"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        clock.advance(seconds=releases.CLAIM_LEASE_S + 1)  # the first lease has run out
        while (releases.load_release(rt, release_id).next_attempt_at or T0) <= clock.now:
            assert time.monotonic() < deadline, "the holder never renewed its claim"
            time.sleep(0.01)
        other = releases.process_release(rt, release_id)  # another process tries to take it
        assert other.state == "in_progress"
    finally:
        holder.join(timeout=10)
    assert releases.load_release(rt, release_id).state == "confirmed"
    assert len(lambda_cloud.calls_to("POST")) == 1


class _LostAnswerPlatform:
    """Ends the instance at the first release call but loses the answer; afterwards reports it
    terminated, with the time it ended (as EC2's state transition reason gives it)."""

    name = "lossy"
    capabilities = ScriptedPlatform.capabilities

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ended_at: datetime | None = None
        self.release_calls = 0

    def get(self, provider_id: str) -> ProviderInstance:
        state = "terminated" if self.ended_at else "running"
        return ProviderInstance(provider_id, state=state, raw_state=state, ended_at=self.ended_at)

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        self.release_calls += 1
        self.ended_at = self.ended_at or self.clock.now
        raise ProviderUnknownOutcome("the answer timed out after the request was sent")


def test_a_release_whose_answer_was_lost_stops_the_meter_when_the_platform_ended_it(
    db: Database, clock: Clock
) -> None:
    """Found by the team-month simulation: the retry found the instance terminated and stopped
    the meter at the retry, billing minutes the platform did not."""
    platform = _LostAnswerPlatform(clock)
    rt = make_runtime(db, clock, providers=[platform], fleet=NoFleet(), channel="COPS")
    iid = add_instance(rt.db, provider="lossy", provider_instance_id="p-1", created_at=T0)
    clock.now = T0 + timedelta(hours=2)
    release = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    assert release.id is not None
    assert releases.process_release(rt, release.id).state != "confirmed"
    ended = platform.ended_at
    assert ended == T0 + timedelta(hours=2)
    confirmed = _retry(rt, clock, release.id)
    assert confirmed.state == "confirmed"
    assert clock.now > ended  # the retry came later ...
    assert platform.release_calls == 1  # ... looked first, and did not ask again
    inst = get_instance(rt.db, iid)
    assert inst.released_at == ended  # ... and the meter stopped when the platform ended it
