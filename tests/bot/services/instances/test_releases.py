"""The release engine: idempotent requests, provider confirmation, backoff, escalation, manual."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlmodel import select

from bot.errors import (
    Conflict,
    NotAuthorized,
    ProviderAuthError,
    ProviderError,
    ProviderRateLimited,
)
from bot.platform_work import PlatformWork
from bot.providers.base import ProviderCapabilities
from bot.providers.registry import platform_billing
from bot.services import prompt_kinds
from bot.services.access import Caller
from bot.services.instances import releases
from bot.services.speaking import prompts
from bot.services.tick import tick
from bot.store.models import AuditLog, Instance, Prompt, Release
from tests.bot.services.support import (
    T0,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)


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
    assert delays == [timedelta(seconds=releases.backoff_s(n, key=rel.id)) for n in (1, 2, 3, 4)]
    for delay, step in zip(delays, (60, 120, 240, 480), strict=True):  # doubling, jittered
        assert timedelta(seconds=step / 2) <= delay <= timedelta(seconds=step)
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


def test_stop_mode_keeps_the_registration_and_storage_billing(rt, clock, platform):
    iid = _api_instance(rt)
    with rt.db.session() as session:
        inst = session.get(Instance, iid)
        inst.disk_gb, inst.storage_micros_per_gb_month = 730, 100_000  # $0.10/h
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")
    platform.answers.append("stopped")
    assert releases.process_release(rt, rel.id).state == "confirmed"
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.release_mode) == ("stopped", "stop")
    assert inst.stopped_at == clock.now
    assert inst.released_at is None
    assert inst.storage_deleted_at is None
    notice = rt.notifier.containing("is stopped")[0].text
    assert "Its compute meter stopped" in notice
    assert "keeps billing ($0.10/h)" in notice
    with pytest.raises(Conflict, match="already stopped"):
        releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")


def test_a_stopped_instance_is_released_from_there(rt, clock, platform):
    iid = _api_instance(rt)
    stop = releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")
    platform.answers.append("stopped")
    releases.process_release(rt, stop.id)
    stopped_at = clock.now
    clock.advance(hours=5)
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    assert releases.process_release(rt, rel.id).state == "confirmed"
    assert platform.release_calls == [("i-1", "stop"), ("i-1", "terminate")]
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.release_mode) == ("released", "terminate")
    assert inst.stopped_at == stopped_at  # compute ended at the stop
    assert inst.released_at == inst.storage_deleted_at == clock.now  # the disk at the release


class _CannotStop(ScriptedPlatform):
    name = "nostop"
    capabilities = ProviderCapabilities(
        can_stop=False,
        storage_bills_when_stopped=False,
        billing=platform_billing("nostop"),
        can_launch=False,
    )


def test_stop_refused_where_the_platform_cannot_stop(db, clock):
    rt = make_runtime(db, clock, providers=[_CannotStop()])
    iid = add_instance(rt.db, provider="nostop", provider_instance_id="i-1")
    with pytest.raises(ProviderError, match="cannot stop"):
        releases.request_release(rt, iid, reason="user", requested_by="UOWNER", mode="stop")
    assert get_instance(rt.db, iid).state == "active"


def test_a_manual_instance_s_owner_confirms_it_stopped(rt, clock):
    iid = add_instance(rt.db, disk_gb=100, storage_micros_per_gb_month=73_000)  # $0.01/h
    rel = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    releases.process_release(rt, rel.id)
    ask = rt.notifier.containing("Please release *box*")[0]
    assert ask.action_ids() == ["instance_release_done", "instance_stop_done"]
    owner = Caller(user_id="UOWNER", channel_id="D1")
    done = releases.confirm_manual_release(rt, owner, iid, stopped=True)
    assert (done.state, done.mode) == ("confirmed", "stop")
    inst = get_instance(rt.db, iid)
    assert inst.state == "stopped"
    assert inst.stopped_at == clock.now
    assert inst.storage_deleted_at is None
    assert "Confirmed stopped on the platform" in ask.current_text
    # Confirming again changes nothing; releasing it later asks the owner again.
    assert releases.confirm_manual_release(rt, owner, iid, stopped=True).id == done.id
    clock.advance(hours=1)
    again = releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    releases.process_release(rt, again.id)
    releases.confirm_manual_release(rt, owner, iid)
    inst = get_instance(rt.db, iid)
    assert (inst.state, inst.storage_deleted_at) == ("released", clock.now)


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
    assert prompts.deliver_pending(rt, clock.now, prompt_kinds.PROMPT_NOTICES) == 1
    assert prompts.deliver_pending(rt, clock.now, prompt_kinds.PROMPT_NOTICES) == 0
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


def test_releases_that_failed_together_retry_apart(rt, clock, platform):
    """One platform's outage fails many releases at once; their retries spread out."""
    ids = [
        add_instance(rt.db, name=f"box{n}", provider="scripted", provider_instance_id=f"i-{n}")
        for n in range(20)
    ]
    opened = [
        releases.request_release(rt, iid, reason="deadline", requested_by="gpubot") for iid in ids
    ]
    platform.answers.extend(ProviderError("HTTP 503") for _ in opened)
    retries = {releases.process_release(rt, rel.id).next_attempt_at for rel in opened}
    assert len(retries) >= 10  # not one instant for all twenty (31 whole seconds to pick from)
    assert max(retries) - min(retries) >= timedelta(seconds=15)
    assert all(
        clock.now + timedelta(seconds=30) <= at <= clock.now + timedelta(seconds=60)
        for at in retries
    )
    # The same release's schedule is the same every time it is worked out.
    assert releases.backoff_s(3, key=opened[0].id) == releases.backoff_s(3, key=opened[0].id)


class _Forgetful:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, name: str) -> None:
        self.forgotten.append(name)


def test_release_now_checks_who_asks_then_releases_at_once(rt, platform):
    iid = _api_instance(rt)
    rt.fleet = _Forgetful()
    with pytest.raises(NotAuthorized):
        releases.release_now(rt, Caller("UOTHER"), iid)
    assert get_instance(rt.db, iid).state == "active"

    done = releases.release_now(rt, Caller("UOWNER"), iid, reason="idle")
    assert (done.state, done.reason, done.requested_by) == ("confirmed", "idle", "UOWNER")
    assert platform.release_calls == [("i-1", "terminate")]
    assert rt.fleet.forgotten == ["box"]
    assert rt.notifier.containing("*box* is released")
    with pytest.raises(Conflict, match="already released"):
        releases.release_now(rt, Caller("UADMIN"), iid)
