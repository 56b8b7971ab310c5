"""The clock: APScheduler calls tick at once and then every tick interval; shutdown stops it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from bot.fleet.base import Target
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.runtime import Runtime
from bot.scheduler import TICK_JOB_ID, run_tick, start_scheduler
from bot.services import tick as tick_module
from bot.settings import Settings
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime

#: Names of the threads the test hook's fan-out ran on.
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
    """A tick hook: one fan-out to ``local``, noting the thread it ran on."""
    answers = rt.fleet.fan_out(
        [Target(name="local", host="local")], lambda agent: threading.current_thread().name
    )
    FAN_OUT_THREADS.extend(str(answer) for answer in answers.values())


def test_a_tick_fans_out_on_the_polling_pool_apart_from_commands(sqlite_db, tmp_path, monkeypatch):
    monkeypatch.setattr(tick_module, "TICK_HOOKS", ["tests.bot.test_scheduler:fan_out_from_a_tick"])
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
