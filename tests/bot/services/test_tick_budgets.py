"""The tick's time budgets, under a controlled monotonic clock (``bot.timebox.monotonic``): each
step is measured, a step past its budget is reported and logged and the steps after it still
run; releases and polling take no new item once their budget is spent and the next tick
finishes the rest, nothing doubled. Nothing here sleeps."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest
from sqlmodel import select

from bot import timebox
from bot.errors import FleetError
from bot.fleet.base import Target
from bot.providers.base import ProviderInstance, ReleaseOutcome
from bot.services import tick as tick_module
from bot.services.instances import polling, releases
from bot.services.tick import step_budget_s, tick
from bot.store.models import AuditLog, Release
from tests.bot.services.support import (
    T0,
    Clock,
    ScriptedPlatform,
    add_instance,
    get_instance,
    make_runtime,
)

INTERVAL_S = 30.0


class Stopwatch:
    """The monotonic clock the budgets read, moved by hand (seconds)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def stopwatch(monkeypatch: pytest.MonkeyPatch) -> Stopwatch:
    watch = Stopwatch()
    monkeypatch.setattr(timebox, "monotonic", watch)
    return watch


@pytest.fixture
def step(monkeypatch: pytest.MonkeyPatch, stopwatch: Stopwatch) -> list[float]:
    """One tick step, ``slow``, that takes as many (controlled) seconds as the test puts in the
    returned list, one entry per call; a negative entry also fails."""
    costs: list[float] = []

    def slow(rt, now):
        cost = costs.pop(0) if costs else 0.0
        stopwatch.advance(abs(cost))
        if cost < 0:
            raise RuntimeError("a slow step that breaks")

    monkeypatch.setattr(tick_module, "TICK_STEPS", [("slow", slow)])
    return costs


class SlowPlatform:
    """A platform with one state per instance whose release takes ``release_s`` seconds of the
    controlled clock; counts every release call."""

    name = "slowcloud"
    capabilities = ScriptedPlatform.capabilities

    def __init__(self, stopwatch: Stopwatch, release_s: float) -> None:
        self.stopwatch = stopwatch
        self.release_s = release_s
        self.states: dict[str, str] = {}
        self.release_calls: list[str] = []

    def list_instances(self) -> list[ProviderInstance]:
        return [self.get(pid) for pid in self.states]

    def get(self, provider_id: str) -> ProviderInstance:
        state = self.states[provider_id]
        return ProviderInstance(provider_id=provider_id, state=state, raw_state=state)

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        self.release_calls.append(provider_id)
        self.stopwatch.advance(self.release_s)
        self.states[provider_id] = "terminated"
        return ReleaseOutcome(provider_id, mode, confirmed=True, state="terminated")

    def price(self, instance_type: str) -> int | None:
        return None

    def instance_types(self) -> list[object]:
        return []

    def launch(self, request: object) -> list[ProviderInstance]:
        raise AssertionError("no launches here")


class SlowFleet:
    """Stands in for the fleet: every fan-out takes ``fan_out_s`` controlled seconds and no
    agent answers (a failed poll); records the names of each fan-out's targets."""

    closed = False  # the bot is not shutting down

    def __init__(self, stopwatch: Stopwatch, fan_out_s: float) -> None:
        self.stopwatch = stopwatch
        self.fan_out_s = fan_out_s
        self.fan_outs: list[list[str]] = []

    def fan_out(self, targets: Sequence[Target], fn: object) -> dict[str, FleetError]:
        self.fan_outs.append([t.name for t in targets])
        self.stopwatch.advance(self.fan_out_s)
        return {t.name: FleetError("no answer", instance=t.name) for t in targets}


def test_budgets_are_shares_of_the_interval_with_a_floor():
    assert step_budget_s("poll", 30) == step_budget_s("releases", 30) == 6.0
    assert step_budget_s("prompts", 30) == 3.0
    assert step_budget_s("deadlines", 30) == step_budget_s("jobs", 30) == 1.5
    assert step_budget_s("deadlines", 2) == tick_module.MIN_STEP_BUDGET_S


def test_an_overrunning_step_is_reported_and_the_later_steps_still_run(
    sqlite_db, stopwatch, step, caplog
):
    clock = Clock(T0)
    platform = ScriptedPlatform()
    rt = make_runtime(
        sqlite_db, clock, providers=[platform], poll_interval_s=10**7, tick_interval_s=INTERVAL_S
    )
    on_platform = add_instance(
        rt.db, name="a", provider="scripted", provider_instance_id="i-1", last_polled_at=T0
    )
    releases.request_release(rt, on_platform, reason="user", requested_by="UOWNER")
    warned = add_instance(
        rt.db, name="b", deadline_at=T0 + timedelta(minutes=20), last_polled_at=T0
    )
    step.append(20.0)  # the step takes 20 s of a 1.5 s budget

    with caplog.at_level(logging.WARNING, logger="bot.services.tick"):
        report = tick(rt, clock.now)

    assert report.over_budget == ["slow"]
    assert report.durations_s["slow"] == 20.0
    assert {"poll", "deadlines", "idle", "jobs_done", "refresh", "prompts", "releases"} <= set(
        report.durations_s
    )
    assert [r.getMessage() for r in caplog.records if "budget" in r.getMessage()] == [
        "tick step slow took 20.0 s, past its budget of 1.5 s"
    ]
    # The steps after it ran with budgets of their own: the warning and the release went out.
    assert report.errors == []
    assert report.prompts_posted == 1
    assert rt.notifier.containing("*b* will be released")
    assert report.releases_processed == 1
    assert get_instance(rt.db, on_platform).state == "released"
    assert get_instance(rt.db, warned).state == "active"


def test_a_failing_step_is_measured_too(sqlite_db, stopwatch, step):
    clock = Clock(T0)
    rt = make_runtime(sqlite_db, clock, poll_interval_s=10**7, tick_interval_s=INTERVAL_S)
    step.append(-3.0)  # fails after 3 s
    report = tick(rt, clock.now)
    assert report.errors == ["slow"]
    assert report.over_budget == ["slow"]
    assert report.durations_s["slow"] == 3.0


def test_a_release_step_with_many_due_stops_at_its_budget_and_the_next_tick_finishes(
    sqlite_db, stopwatch, step
):
    clock = Clock(T0)
    platform = SlowPlatform(stopwatch, release_s=2.0)  # 3 releases fill the 6 s budget
    rt = make_runtime(
        sqlite_db, clock, providers=[platform], poll_interval_s=10**7, tick_interval_s=INTERVAL_S
    )
    instance_ids = []
    for n in range(8):
        pid = f"p-{n}"
        platform.states[pid] = "running"
        iid = add_instance(
            rt.db, name=f"n{n}", provider="slowcloud", provider_instance_id=pid, last_polled_at=T0
        )
        releases.request_release(rt, iid, reason="user", requested_by="UOWNER", now=clock.now)
        instance_ids.append(iid)
        clock.advance(seconds=1)  # each asked a second after the one before

    taken_per_tick = []
    for n in range(4):
        if n == 1:  # those left by the first tick are untouched, still due
            with rt.db.session() as session:
                left = session.exec(select(Release).where(Release.state == "pending")).all()
            assert [(r.attempts, r.next_attempt_at) for r in left] == [(0, None)] * 5
        report = tick(rt, clock.now)
        assert "releases" not in report.errors
        assert "releases" not in report.over_budget  # stopped at the budget, not past it
        taken_per_tick.append(report.releases_processed)
        clock.advance(seconds=INTERVAL_S)

    assert taken_per_tick == [3, 3, 2, 0]
    # Longest due first: the platform was asked in the order the releases were asked for.
    assert platform.release_calls == [f"p-{n}" for n in range(8)]  # each once
    assert all(get_instance(rt.db, iid).state == "released" for iid in instance_ids)
    with rt.db.session() as session:
        rows = session.exec(select(Release)).all()
        confirmed = session.exec(
            select(AuditLog).where(AuditLog.action == "release_confirmed")
        ).all()
    assert sorted(r.state for r in rows) == ["confirmed"] * 8
    assert len(confirmed) == 8
    assert len(rt.notifier.containing("is released")) == 8


def test_release_without_a_budget_takes_every_due_one(sqlite_db, stopwatch):
    clock = Clock(T0)
    platform = SlowPlatform(stopwatch, release_s=60.0)
    rt = make_runtime(sqlite_db, clock, providers=[platform])
    for n in range(3):
        platform.states[f"p-{n}"] = "running"
        iid = add_instance(rt.db, name=f"n{n}", provider="slowcloud", provider_instance_id=f"p-{n}")
        releases.request_release(rt, iid, reason="user", requested_by="UOWNER")
    assert len(releases.process_due_releases(rt, clock.now)) == 3
    assert len(platform.release_calls) == 3


def test_polling_stops_at_its_budget_and_the_least_recently_polled_go_first(
    sqlite_db, stopwatch, step, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(polling, "POLL_BATCH", 2)
    clock = Clock(T0)
    fleet = SlowFleet(stopwatch, fan_out_s=7.0)  # one fan-out is past the 6 s budget
    rt = make_runtime(
        sqlite_db, clock, fleet=fleet, poll_interval_s=3600, tick_interval_s=INTERVAL_S
    )
    last: dict[str, datetime | None] = {
        "never": None,
        "h5": T0 - timedelta(hours=5),
        "h3": T0 - timedelta(hours=3),
        "h2": T0 - timedelta(hours=2),
        "recent": T0 - timedelta(minutes=5),  # not due
    }
    for name, at in last.items():
        add_instance(rt.db, name=name, last_polled_at=at)

    reports = []
    for _ in range(3):
        reports.append(tick(rt, clock.now))
        clock.advance(seconds=INTERVAL_S)

    assert [r.polled for r in reports] == [2, 2, 0]
    assert fleet.fan_outs == [["never", "h5"], ["h3", "h2"]]
    # A batch in hand is finished: 7 s of a 6 s budget, reported; no second batch was started.
    assert [r.over_budget for r in reports] == [["poll"], ["poll"], []]
    assert [r.durations_s["poll"] for r in reports] == [7.0, 7.0, 0.0]
    assert all("poll" not in r.errors for r in reports)


def test_polling_without_a_budget_polls_every_due_instance_in_batches(
    sqlite_db, stopwatch, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(polling, "POLL_BATCH", 2)
    clock = Clock(T0)
    fleet = SlowFleet(stopwatch, fan_out_s=60.0)
    rt = make_runtime(sqlite_db, clock, fleet=fleet, poll_interval_s=60)
    for n in range(5):
        add_instance(rt.db, name=f"n{n}")
    results = polling.poll_instances(rt, clock.now)
    assert len(results) == 5
    assert not any(r.ok for r in results)
    assert [len(names) for names in fleet.fan_outs] == [2, 2, 1]
    assert polling.poll_instances(rt, clock.now) == []  # each once
