"""Fault drill for a platform outage, against the RunPod and Lambda HTTP stand-ins through the
real provider clients and the real tick, ticking every 30 s of the test's clock.

RunPod answers every request with HTTP 500 for half an hour, then with 429 and a Retry-After of
40 minutes for another half hour. What the owner sees: both warnings for each of their three
instances, as usual; at the deadlines (during the outage) the two on Lambda are released on
time, each with its "is released" message. The pod on RunPod cannot be released: the bot tries
again after about 1, 2, 4, 8 minutes and so on, jittered (never every tick), waits as long as
RunPod's Retry-After asks, and after the third failed try the owner and the ops channel get one
message each ("Releasing *pod* (@owner) on runpod failed 3 times; it may still cost $2.10/h. The bot
keeps trying; ... Last error: ... HTTP 500 ..."), and nothing more during the outage. At the
first try after RunPod is back the pod is terminated, once, and the owner gets one "is
released. The meter stopped." message; the pod is billed up to that moment and not after. The
clock keeps its cadence throughout: every tick runs every step well inside its interval.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlmodel import select

from bot import billing
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.registry import platform_billing
from bot.providers.runpod import RunpodProvider
from bot.runtime import Runtime
from bot.services.instances import releases
from bot.services.tick import TickReport, tick
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Release
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime
from tests.bot.ticking import tick_through
from tests.fixtures.providers import LambdaStandIn, RunpodStandIn

pytestmark = pytest.mark.integration

INTERVAL_S = 30
D = T0 + timedelta(hours=1)  # the pod's deadline, and the first Lambda instance's
D2 = T0 + timedelta(hours=1, minutes=30)  # the second Lambda instance's
OUTAGE = T0 + timedelta(minutes=55)  # RunPod answers 500 from here
RATE_LIMITED = OUTAGE + timedelta(minutes=30)  # then 429 with Retry-After
RECOVERED = OUTAGE + timedelta(hours=1)  # and answers again from here
RETRY_AFTER_S = 2400
END = RECOVERED + timedelta(hours=1)  # the last tick


@pytest.fixture
def rt(db: Database, runpod_cloud: RunpodStandIn, lambda_cloud: LambdaStandIn) -> Runtime:
    settings = Settings(
        runpod_api_url=runpod_cloud.url,
        runpod_api_key=runpod_cloud.api_key,
        lambda_api_url=lambda_cloud.url,
        lambda_api_key=lambda_cloud.api_key,
    )
    return make_runtime(
        db,
        Clock(T0),
        providers=[RunpodProvider.from_settings(settings), LambdaProvider.from_settings(settings)],
        poll_interval_s=10**7,
        tick_interval_s=INTERVAL_S,
    )


def _instance(rt: Runtime, name: str, provider: str, provider_id: str, deadline: datetime) -> int:
    return add_instance(
        rt.db,
        name=name,
        provider=provider,
        provider_instance_id=provider_id,
        deadline_at=deadline,
        created_at=T0 - timedelta(hours=1),
        last_polled_at=T0 + timedelta(days=1),  # not polled meanwhile
    )


def _ticks(
    rt: Runtime, until: datetime, each: Callable[[datetime, TickReport], None]
) -> list[TickReport]:
    """Tick every ``INTERVAL_S`` of the test's clock up to ``until``; ``each`` sees every tick."""
    clock = rt.clock
    assert isinstance(clock, Clock)
    reports = []
    while clock.now <= until:
        report = tick(rt, clock.now)
        each(clock.now, report)
        reports.append(report)
        clock.advance(seconds=INTERVAL_S)
    return reports


def _pod_release(rt: Runtime, iid: int) -> Release:
    with rt.db.session() as session:
        return session.exec(select(Release).where(Release.instance_id == iid)).one()


def test_a_platform_down_for_an_hour_is_retried_with_backoff_and_released_once_after(
    rt: Runtime, runpod_cloud: RunpodStandIn, lambda_cloud: LambdaStandIn
) -> None:
    pod = runpod_cloud.add()
    on_runpod = _instance(rt, "pod", "runpod", pod, D)
    first, second = lambda_cloud.add(), lambda_cloud.add()
    on_lambda = _instance(rt, "lam1", "lambda", first, D)
    on_lambda_later = _instance(rt, "lam2", "lambda", second, D2)

    tries: list[tuple[datetime, int, str, timedelta]] = []  # (when, status, error, wait after)

    def watch(now: datetime, report: TickReport) -> None:
        assert report.errors == [], report.errors
        if now == OUTAGE:
            runpod_cloud.outage(500)
        elif now == RATE_LIMITED:
            runpod_cloud.outage(429, retry_after=str(RETRY_AFTER_S))
        elif now == RECOVERED:
            runpod_cloud.outage(None)
        if now < D:
            return
        release = _pod_release(rt, on_runpod)
        if release.attempts > len(tries):  # this tick tried, and failed
            assert release.attempts == len(tries) + 1  # once per tick at most
            assert release.next_attempt_at is not None
            status = 429 if "HTTP 429" in (release.last_error or "") else 500
            tries.append((now, status, release.last_error or "", release.next_attempt_at - now))

    reports = _ticks(rt, END, watch)

    # The other platform's instances were released on time, during the outage, once each.
    assert get_instance(rt.db, on_lambda).released_at == D
    assert get_instance(rt.db, on_lambda_later).released_at == D2
    assert lambda_cloud.instances[first]["status"] == "terminated"
    assert lambda_cloud.instances[second]["status"] == "terminated"
    assert len(lambda_cloud.answered_to("POST", "terminate")) == 2

    # The pod: tried at the deadline, then after the jittered back-off (the upper half of 1, 2,
    # 4, 8, 16 minutes) for the 500s, then after the 40 minutes RunPod's Retry-After asked for
    # (longer than the back-off's at most 32 minutes).
    failed_500 = len(tries) - 1
    assert [t[1] for t in tries] == [500] * failed_500 + [429]
    assert failed_500 >= 4  # half an hour of 500s: at least 1 + 2 + 4 + 8 minutes of waits
    pod_release_id = _pod_release(rt, on_runpod).id
    assert all("HTTP 500" in t[2] for t in tries[:failed_500])
    assert [t[3] for t in tries] == [
        *(
            timedelta(seconds=releases.backoff_s(n, key=pod_release_id))
            for n in range(1, failed_500 + 1)
        ),
        # Retry-After is honoured; a longer back-off (the jitter can make it so) wins.
        max(
            timedelta(seconds=RETRY_AFTER_S),
            timedelta(seconds=releases.backoff_s(len(tries), key=pod_release_id)),
        ),
    ]
    assert tries[0][0] == D
    # Never every tick: one request per try (each failed at its first call), and the list
    # RunPod is asked for when reconciling, which stops once the pod is being released.
    during = len(range(0, int((RECOVERED - D).total_seconds()), INTERVAL_S))
    pod_requests = [(m, s) for m, p, s in runpod_cloud.answered if pod in p]
    assert len(tries) < during / 10
    assert pod_requests[: len(tries)] == [("GET", t[1]) for t in tries]

    # Released at the first try after RunPod came back (the one Retry-After set), once.
    due = tries[-1][0] + tries[-1][3]
    done_at = due + timedelta(seconds=-(due - T0).total_seconds() % INTERVAL_S)  # its next tick
    assert done_at > RECOVERED
    release = _pod_release(rt, on_runpod)
    assert (release.state, release.attempts, release.confirmed_at) == (
        "confirmed",
        len(tries),
        done_at,
    )
    assert pod not in runpod_cloud.instances
    assert runpod_cloud.answered_to("DELETE", pod) == [204]  # terminated exactly once
    inst = get_instance(rt.db, on_runpod)
    assert (inst.state, inst.released_at, inst.release_mode) == ("released", done_at, "terminate")
    # Billing stops at the release: it cost more than at the deadline, and nothing after.
    at_release = billing.cost_so_far(inst, platform_billing(inst.provider), done_at)
    assert billing.cost_so_far(inst, platform_billing(inst.provider), D) < at_release
    assert (
        billing.cost_so_far(inst, platform_billing(inst.provider), done_at + timedelta(days=1))
        == at_release
    )

    # What people were told: the escalation once to the ops channel (and once to the owner),
    # after the third failure; each instance's release once.
    escalations = rt.notifier.containing("failed 3 times")
    assert sorted(p.channel for p in escalations) == ["COPS", "UOWNER"]
    assert "Releasing *pod* (<@UOWNER>) on RunPod failed 3 times" in escalations[0].text
    assert "HTTP 500" in escalations[0].text
    assert len(rt.notifier.containing("failed")) == 2
    assert [p.channel for p in rt.notifier.to("COPS")] == ["COPS"] * 3
    # The ops channel also heard, once each, that RunPod could not be listed and listed again.
    assert len(rt.notifier.containing("cannot list the instances of *RunPod*")) == 1
    assert len(rt.notifier.containing("the instances of *RunPod* again")) == 1
    for name in ("pod", "lam1", "lam2"):
        assert len(rt.notifier.containing(f"*{name}* is released")) == 1
        assert len(rt.notifier.containing(f"*{name}* will be released")) == 2

    # The clock kept its cadence: every tick ran every step, well inside its interval. (Whether
    # each step kept its own budget of real time depends on the machine's load, not on the
    # bot: bench/tick_scale.py measures that.)
    assert len(reports) == int((END - T0).total_seconds()) // 30 + 1
    assert max(sum(r.durations_s.values()) for r in reports) < INTERVAL_S / 3


def test_a_busy_answer_after_a_long_outage_starts_the_back_off_over(
    rt: Runtime, runpod_cloud: RunpodStandIn
) -> None:
    """Found by the team-month simulation: after an hour of 500s the back-off's step is half an
    hour or more; a 409 then (the platform answers again, busy with the machine) kept the
    doubling, and the machine billed another hour. A busy answer starts the wait over."""
    clock = rt.clock
    assert isinstance(clock, Clock)
    pod = runpod_cloud.add()
    iid = _instance(rt, "pod", "runpod", pod, D)
    runpod_cloud.outage(500)
    tick_through(rt, clock, D + timedelta(minutes=50), step_s=INTERVAL_S)
    grown = _pod_release(rt, iid)
    assert grown.attempts >= 5
    assert grown.next_attempt_at is not None
    assert grown.next_attempt_at - clock.now > timedelta(minutes=10)  # a long step by now

    runpod_cloud.outage(409)  # up again, and busy with the machine at the next try
    tick_through(rt, clock, grown.next_attempt_at + timedelta(seconds=INTERVAL_S))
    busy = _pod_release(rt, iid)
    assert busy.attempts == grown.attempts + 1
    assert "HTTP 409" in (busy.last_error or "")
    assert busy.next_attempt_at is not None
    tried_at = busy.next_attempt_at - timedelta(seconds=releases.backoff_s(1, key=busy.id))
    assert tried_at <= clock.now  # the wait after the 409 is the first step: a minute at most

    runpod_cloud.outage(None)
    tick_through(rt, clock, busy.next_attempt_at + timedelta(seconds=INTERVAL_S))
    done = _pod_release(rt, iid)
    assert done.state == "confirmed"
    assert done.confirmed_at is not None
    assert done.confirmed_at - tried_at <= timedelta(seconds=60 + INTERVAL_S)
    assert runpod_cloud.answered_to("DELETE", pod) == [204]  # terminated exactly once
    assert get_instance(rt.db, iid).state == "released"
