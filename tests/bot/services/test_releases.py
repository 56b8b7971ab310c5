"""The release engine: idempotent requests, provider confirmation, backoff, escalation, manual."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlmodel import select

from bot.commands.registry import Caller
from bot.errors import (
    Conflict,
    NotAuthorized,
    ProviderAuthError,
    ProviderError,
    ProviderRateLimited,
)
from bot.platform_work import PlatformWork
from bot.services import releases
from bot.services.tick import tick
from bot.store.models import AuditLog, Instance, Prompt, Release
from tests.bot.services.support import (
    T0,
    Clock,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def platform() -> ScriptedPlatform:
    return ScriptedPlatform()


@pytest.fixture
def rt(db, clock, platform):
    return make_runtime(db, clock, providers=[platform])


def _api_instance(rt) -> int:
    return add_instance(rt.db, provider="scripted", provider_instance_id="i-1")


def _release(rt, release_id: int) -> Release:
    return releases.load_release(rt, release_id)


def test_request_is_idempotent_and_audited(rt):
    iid = _api_instance(rt)
    first = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    second = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    assert first.id == second.id
    assert get_instance(rt.db, iid).state == "releasing"
    with rt.db.session() as session:
        assert len(session.exec(select(Release)).all()) == 1
        actions = [a.action for a in session.exec(select(AuditLog)).all()]
    assert actions == ["release_requested"]


def test_release_confirmed_only_when_the_platform_says_terminated(rt, clock, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    platform.answers.extend(["shutting-down"])
    platform.state = "running"

    after = releases.process_release(rt, rel.id)
    assert after.state == "pending"
    assert after.next_attempt_at == T0 + timedelta(seconds=releases.CONFIRM_RECHECK_S)
    inst = get_instance(rt.db, iid)
    assert inst.released_at is None
    assert inst.state == "releasing"

    # Not due yet: nothing happens.
    assert releases.process_due_releases(rt, clock.now) == []
    platform.state = "terminated"
    clock.advance(seconds=releases.CONFIRM_RECHECK_S)
    done = releases.process_due_releases(rt, clock.now)
    assert [releases.load_release(rt, r).state for r in done] == ["confirmed"]
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == clock.now
    assert inst.storage_deleted_at == clock.now
    assert platform.release_calls == [("i-1", "terminate")]  # the recheck only looked
    notices = rt.notifier.containing("is released")
    assert [p.channel for p in notices] == ["UOWNER"]


def test_already_gone_counts_as_released(rt, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    platform.state = "missing"
    assert releases.process_release(rt, rel.id).state == "confirmed"
    assert get_instance(rt.db, iid).release_mode == "terminate"
    assert platform.release_calls == []


def test_failures_back_off_then_escalate_once_to_owner_and_channel(rt, clock, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    platform.answers.extend([ProviderError("HTTP 500") for _ in range(4)])

    delays = []
    for _ in range(4):
        after = releases.process_release(rt, rel.id)
        delays.append(after.next_attempt_at - clock.now)
        clock.set(after.next_attempt_at)
    assert delays == [timedelta(seconds=s) for s in (60, 120, 240, 480)]
    after = _release(rt, rel.id)
    assert after.state == "escalated"
    assert after.attempts == 4
    assert "HTTP 500" in (after.last_error or "")
    escalations = rt.notifier.containing("failed 3 times")
    assert sorted(p.channel for p in escalations) == ["COPS", "UOWNER"]
    assert get_instance(rt.db, iid).released_at is None

    releases.process_release(rt, rel.id)  # the platform recovers
    assert _release(rt, rel.id).state == "confirmed"
    assert len(rt.notifier.containing("failed")) == 2


def test_rate_limit_honours_retry_after(rt, clock, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    platform.answers.append(ProviderRateLimited("slow down", retry_after_s=900))
    after = releases.process_release(rt, rel.id)
    assert after.next_attempt_at == clock.now + timedelta(seconds=900)
    assert after.state == "pending"


def test_a_retry_after_of_a_day_waits_no_longer_than_the_longest_back_off(rt, clock, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    platform.answers.append(ProviderRateLimited("slow down", retry_after_s=86_400))
    after = releases.process_release(rt, rel.id)
    assert after.next_attempt_at == clock.now + timedelta(seconds=releases.BACKOFF_MAX_S)


def test_auth_error_escalates_at_once(rt, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    platform.answers.append(ProviderAuthError("HTTP 401"))
    after = releases.process_release(rt, rel.id)
    assert after.state == "escalated"
    assert after.attempts == 1
    assert len(rt.notifier.containing("failed 1 times")) == 2


def test_stop_mode_keeps_storage_billing(rt, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")
    platform.answers.append("stopped")
    assert releases.process_release(rt, rel.id).state == "confirmed"
    inst = get_instance(rt.db, iid)
    assert inst.release_mode == "stop"
    assert inst.stopped_at is not None
    assert inst.storage_deleted_at is None
    assert "storage keeps billing" in rt.notifier.containing("is stopped")[0].text


def test_stop_refused_where_the_platform_cannot_stop(rt):
    iid = add_instance(rt.db)
    with pytest.raises(ProviderError, match="cannot stop"):
        releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")
    assert get_instance(rt.db, iid).state == "active"


def test_two_workers_call_the_platform_once(rt, platform):
    iid = _api_instance(rt)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    platform.gate = threading.Event()
    results: list[str] = []
    workers = [
        threading.Thread(target=lambda: results.append(releases.process_release(rt, rel.id).state))
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(0.5)
    platform.gate.set()
    for w in workers:
        w.join(5)
    assert platform.release_calls == [("i-1", "terminate")]
    assert _release(rt, rel.id).state == "confirmed"
    assert len(rt.notifier.containing("is released")) == 1


def test_manual_release_asks_reminds_escalates_and_confirms(rt, clock):
    iid = add_instance(rt.db, name="hand")
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    after = releases.process_release(rt, rel.id)
    assert after.state == "awaiting_owner"
    assert get_instance(rt.db, iid).state == "awaiting_confirmation"
    ask = rt.notifier.to("UOWNER")[0]
    assert ask.button_value("instance_release_done") == str(iid)

    for _ in range(2):
        clock.advance(seconds=releases.MANUAL_REMIND_S)
        releases.process_due_releases(rt, clock.now)
    assert len(rt.notifier.containing("Reminder")) == 2
    assert len(rt.notifier.to("COPS")) == 1
    # The owner already has the reminder: the escalation goes to the channel only.
    assert [p.channel for p in rt.notifier.containing("nobody confirmed")] == ["COPS"]
    assert get_instance(rt.db, iid).released_at is None

    with pytest.raises(NotAuthorized):
        releases.confirm_manual_release(rt, Caller("USOMEONE"), iid)
    clock.advance(minutes=5)
    done = releases.confirm_manual_release(rt, Caller("UOWNER"), iid)
    assert done.state == "confirmed"
    inst = get_instance(rt.db, iid)
    assert inst.state == "released"
    assert inst.released_at == clock.now
    assert "Confirmed released on the platform by <@UOWNER>" in ask.current_text
    assert ask.action_ids() == []
    again = releases.confirm_manual_release(rt, Caller("UOWNER"), iid)
    assert again.id == done.id
    with rt.db.session() as session:
        open_prompts = session.exec(
            select(Prompt).where(Prompt.kind == "release_reminder", Prompt.resolved_at == None)  # noqa: E711
        ).all()
    assert open_prompts == []
    with pytest.raises(Conflict):
        releases.request_release(rt, iid, reason="user", requested_by="UOWNER")


def test_slack_down_does_not_lose_the_manual_ask(rt, clock):
    iid = add_instance(rt.db, name="hand")
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    rt.notifier.fail_posts = True
    releases.process_release(rt, rel.id)
    assert rt.notifier.posts == []
    rt.notifier.fail_posts = False
    from bot.services import prompts

    assert prompts.deliver_pending(rt, clock.now) == 1
    assert prompts.deliver_pending(rt, clock.now) == 0
    assert len(rt.notifier.to("UOWNER")) == 1


def test_a_confirmation_nothing_awaits_is_refused_and_the_meter_runs_on(rt, clock):
    iid = add_instance(rt.db, name="hand")
    with pytest.raises(Conflict, match="no release of it is waiting"):
        releases.confirm_manual_release(rt, Caller("UADMIN"), iid)
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert (inst.state, inst.released_at) == ("active", None)
        assert session.exec(select(Release)).all() == []


def test_a_stale_confirmation_of_an_api_instance_never_stops_its_meter(rt, platform):
    iid = add_instance(rt.db, name="api", provider="scripted", provider_instance_id="i-1")
    platform.answers.append("stopping")  # the platform has not finished yet
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    releases.process_release(rt, rel.id)
    for who in (Caller("UOWNER"), Caller("UADMIN")):
        with pytest.raises(Conflict, match="whose API says when it is released"):
            releases.confirm_manual_release(rt, who, iid)
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        assert inst is not None
        assert inst.released_at is None
        assert inst.state != "released"


@pytest.mark.integration
def test_through_the_runpod_api_a_429_waits_for_retry_after(db, clock, runpod_cloud):
    from bot.providers.runpod import RunpodProvider
    from bot.settings import Settings

    provider = RunpodProvider.from_settings(
        Settings(runpod_api_url=runpod_cloud.url, runpod_api_key=runpod_cloud.api_key)
    )
    rt = make_runtime(db, clock, providers=[provider])
    pod = runpod_cloud.add()
    iid = add_instance(rt.db, provider="runpod", provider_instance_id=pod)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")

    runpod_cloud.fail_next(429, method="DELETE", retry_after="120")
    after = releases.process_release(rt, rel.id)
    assert after.state == "pending"
    assert after.next_attempt_at == clock.now + timedelta(seconds=120)
    assert "HTTP 429" in (after.last_error or "")
    assert pod in runpod_cloud.instances

    clock.advance(seconds=119)
    assert releases.process_due_releases(rt, clock.now) == []
    clock.advance(seconds=1)
    [done] = releases.process_due_releases(rt, clock.now)
    assert releases.load_release(rt, done).state == "confirmed"
    assert pod not in runpod_cloud.instances
    assert get_instance(rt.db, iid).released_at == clock.now


@pytest.mark.integration
def test_through_the_lambda_api_an_instance_terminated_outside_is_confirmed(
    db, clock, lambda_cloud
):
    from bot.providers.lambda_cloud import LambdaProvider
    from bot.settings import Settings

    provider = LambdaProvider.from_settings(
        Settings(lambda_api_url=lambda_cloud.url, lambda_api_key=lambda_cloud.api_key)
    )
    rt = make_runtime(db, clock, providers=[provider])
    iid_cloud = lambda_cloud.add()
    iid = add_instance(rt.db, provider="lambda", provider_instance_id=iid_cloud)
    rel = releases.request_release(rt, iid, reason="deadline", requested_by="gpubot")
    lambda_cloud.terminate_outside(iid_cloud)
    assert releases.process_release(rt, rel.id).state == "confirmed"
    assert lambda_cloud.calls_to("POST", "terminate") == []


def test_a_slow_platform_never_holds_the_clock_or_another_platform(db, clock, platform):
    slow, fast = platform, ScriptedPlatform()
    fast.name = "fastcloud"
    slow.gate = threading.Event()  # each call waits until the test lets it go: a 30 s platform
    pools = PlatformWork()
    rt = make_runtime(db, clock, providers=[slow, fast], poll_interval_s=10**7)
    rt.platform_work = pools
    try:
        on_slow = add_instance(rt.db, name="a", provider="scripted", provider_instance_id="i-1")
        on_fast = add_instance(rt.db, name="b", provider="fastcloud", provider_instance_id="i-2")
        warned = add_instance(
            rt.db, name="c", deadline_at=clock.now + timedelta(minutes=20), last_polled_at=T0
        )
        for iid in (on_slow, on_fast):
            releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
        report = tick(rt, clock.now)  # returns although the slow platform has not answered
        assert report.releases_processed == 2
        assert rt.notifier.containing("*c* will be released")  # prompts went out meanwhile
        assert _until(lambda: get_instance(rt.db, on_fast).state == "released")
        assert get_instance(rt.db, on_slow).state == "releasing"
        tick(rt, clock.now + timedelta(seconds=30))  # the next tick does not queue it again
        assert pools.in_flight("scripted") == 1
        slow.gate.set()
        assert pools.wait_idle(10)
        assert get_instance(rt.db, on_slow).state == "released"
        assert slow.release_calls == [("i-1", "terminate")]
        assert fast.release_calls == [("i-2", "terminate")]
        assert get_instance(rt.db, warned).state == "active"
    finally:
        slow.gate.set()
        pools.shutdown()


def _until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
