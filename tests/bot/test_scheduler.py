"""The clock: APScheduler calls tick at once and then every tick interval; shutdown stops it."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from functools import partial

from bot import scheduler as scheduler_module
from bot.fleet.base import Target
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.health import Health
from bot.metrics import Metrics
from bot.runtime import Runtime
from bot.scheduler import TICK_JOB_ID, TickWatch, run_tick, start_scheduler
from bot.services import tick as tick_module
from bot.settings import Settings
from bot.store.db import Database
from bot.store.stats import ping
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime

#: Names of the threads the test step's fan-out ran on.
FAN_OUT_THREADS: list[str] = []


def test_first_tick_at_once_then_every_interval_until_shutdown(sqlite_db):
    clock = Clock(T0 + timedelta(hours=3))
    rt = make_runtime(sqlite_db, clock, tick_interval_s=0.5, poll_interval_s=10**7)
    iid = add_instance(rt.db, deadline_at=T0 + timedelta(hours=1), last_polled_at=T0)

    handle = start_scheduler(rt)
    try:
        job = handle.scheduler.get_job(TICK_JOB_ID)
        assert job.coalesce is True
        assert job.max_instances == 1
        assert job.misfire_grace_time is None
        assert str(job.trigger.timezone) == "UTC"
        deadline = time.monotonic() + 10
        while not rt.notifier.containing("will be released") and time.monotonic() < deadline:
            time.sleep(0.05)
        # The deadline passed while "the bot was down": warned first, not released yet.
        assert len(rt.notifier.containing("will be released")) == 1
        assert get_instance(rt.db, iid).state == "active"

        clock.advance(minutes=11)  # past the grace after the late warning
        deadline = time.monotonic() + 10
        while (
            get_instance(rt.db, iid).state != "awaiting_confirmation"
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert get_instance(rt.db, iid).state == "awaiting_confirmation"
    finally:
        handle.shutdown()
    assert not handle.running
    handle.shutdown()  # twice is fine


def fan_out_from_a_tick(rt: Runtime) -> None:
    """A tick step: one fan-out to ``local``, noting the thread it ran on."""
    answers = rt.fleet.fan_out(
        [Target(name="local", host="local")], lambda agent: threading.current_thread().name
    )
    FAN_OUT_THREADS.extend(str(answer) for answer in answers.values())


def test_a_tick_fans_out_on_the_polling_pool_apart_from_commands(sqlite_db, tmp_path, monkeypatch):
    steps = [("fan_out", lambda rt, now: fan_out_from_a_tick(rt))]
    monkeypatch.setattr(tick_module, "TICK_STEPS", steps)
    FAN_OUT_THREADS.clear()
    fleet = Fleet(Settings(data_dir=tmp_path), local_transport=LocalTransport(home=tmp_path))
    rt = make_runtime(sqlite_db, Clock(T0), fleet=fleet)
    try:
        run_tick(rt)
        fan_out_from_a_tick(rt)  # as a user's command does
    finally:
        fleet.close()
    assert len(FAN_OUT_THREADS) == 2
    assert FAN_OUT_THREADS[0].startswith("fleet-poll")
    assert FAN_OUT_THREADS[1].startswith("fleet-commands")


# --- what each tick reports ---------------------------------------------------------------------


class Monotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


#: Two minutes into a five-minute slot: no reconciling in the ticks below.
QUIET = datetime(2025, 1, 1, 0, 2)


def test_each_tick_is_measured_and_reported_to_readiness(sqlite_db):
    rt = make_runtime(sqlite_db, Clock(QUIET), poll_interval_s=10**7)
    clock = Monotonic()
    health = Health(tick_interval_s=30, database=lambda: None, clock=clock)
    watch = TickWatch(metrics=Metrics(), health=health, clock=clock)

    clock.now += 100  # no tick has ended for over three intervals
    assert not health.ready().ok
    run_tick(rt, watch)
    assert health.ready().ok
    assert watch.metrics.value("gpubot_ticks_total", outcome="ok") == 1
    assert watch.metrics.value("gpubot_tick_lag_seconds") == 0
    for step in ("poll", "deadlines", "releases", "outbox", "ledger"):
        assert watch.metrics.value("gpubot_tick_step_duration_seconds_count", step=step) == 1
        assert watch.metrics.value("gpubot_tick_step_overrun_seconds", step=step) == 0

    clock.now += 30 + 12  # the next tick starts 12 s late
    run_tick(rt, watch)
    assert watch.metrics.value("gpubot_tick_lag_seconds") == 12
    assert watch.metrics.value("gpubot_ticks_total", outcome="ok") == 2


def test_a_dead_database_shows_in_the_steps_and_in_readiness():
    dead = Database("postgresql+psycopg://postgres@127.0.0.1:9/gpubot?connect_timeout=2")
    try:
        rt = make_runtime(dead, Clock(QUIET), poll_interval_s=60)
        clock = Monotonic()
        health = Health(tick_interval_s=30, database=partial(ping, dead), clock=clock)
        watch = TickWatch(metrics=Metrics(), health=health, clock=clock)
        run_tick(rt, watch)
        for step in ("poll", "deadlines", "releases", "outbox"):
            assert watch.metrics.value("gpubot_tick_step_failures_total", step=step) == 1
        failed = {check.name for check in health.ready().checks if not check.ok}
        assert failed == {"database"}
    finally:
        dead.dispose()


def test_a_tick_that_fails_whole_leaves_readiness_to_lapse(sqlite_db, monkeypatch):
    def broken(rt, now):
        raise RuntimeError("the tick itself broke")

    monkeypatch.setattr(scheduler_module, "tick", broken)
    rt = make_runtime(sqlite_db, Clock(QUIET))
    clock = Monotonic()
    health = Health(tick_interval_s=30, database=lambda: None, clock=clock)
    watch = TickWatch(metrics=Metrics(), health=health, clock=clock)
    run_tick(rt, watch)  # logged, never raised
    assert watch.metrics.value("gpubot_ticks_total", outcome="failed") == 1
    clock.now += 91
    assert not health.ready().ok


def slow_first_tick(rt: Runtime) -> None:
    """A tick step that holds the first tick past a few intervals."""
    if not SLOW_TICKS:
        SLOW_TICKS.append(1)
        time.sleep(0.8)


SLOW_TICKS: list[int] = []


def test_ticks_due_while_one_runs_are_counted_as_skipped(sqlite_db, monkeypatch):
    monkeypatch.setattr(tick_module, "TICK_STEPS", [("slow", lambda rt, now: slow_first_tick(rt))])
    SLOW_TICKS.clear()
    rt = make_runtime(sqlite_db, Clock(QUIET), tick_interval_s=0.2, poll_interval_s=10**7)
    watch = TickWatch(metrics=Metrics())
    handle = start_scheduler(rt, watch=watch)
    try:
        deadline = time.monotonic() + 10
        while (watch.metrics.value("gpubot_ticks_total", outcome="ok") or 0) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        handle.shutdown()
    assert (watch.metrics.value("gpubot_ticks_skipped_total") or 0) >= 1
    assert (watch.metrics.value("gpubot_tick_lag_seconds") or 0) >= 0
