"""The clock: APScheduler calls tick at once and then every tick interval; shutdown stops it."""

from __future__ import annotations

import time
from datetime import timedelta

from bot.scheduler import TICK_JOB_ID, start_scheduler
from tests.bot.services.support import T0, Clock, add_instance, get_instance, make_runtime


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
