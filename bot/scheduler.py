"""The clock: APScheduler 3.11 calling ``tick`` every ``settings.tick_interval_s`` seconds.

Deadlines, prompts and releases are rows; the scheduler keeps no jobs of its own that matter
(an in-memory job store, one interval job, ``coalesce=True``, ``max_instances=1``,
``misfire_grace_time=None``, UTC). The first tick runs at once, so a bot that was down enforces
what came due within one tick of starting.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from bot.fleet.fleet import polling
from bot.runtime import Runtime
from bot.services.tick import tick

log = logging.getLogger(__name__)

TICK_JOB_ID = "gpubot-tick"


@dataclass
class SchedulerHandle:
    """The running clock; ``shutdown()`` stops it (waiting for a tick under way)."""

    scheduler: BackgroundScheduler

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop ticking. Safe to call twice."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=wait)

    @property
    def running(self) -> bool:
        """Whether the clock still ticks."""
        return bool(self.scheduler.running)


def start_scheduler(rt: Runtime, *, first_tick_now: bool = True) -> SchedulerHandle:
    """Start ticking every ``rt.settings.tick_interval_s`` seconds, the first tick at once."""
    scheduler = BackgroundScheduler(timezone=UTC)
    options: dict[str, object] = {}
    if first_tick_now:
        options["next_run_time"] = datetime.now(UTC)
    scheduler.add_job(
        run_tick,
        IntervalTrigger(seconds=rt.settings.tick_interval_s, timezone=UTC),
        args=[rt],
        id=TICK_JOB_ID,
        coalesce=True,
        max_instances=1,
        misfire_grace_time=None,
        replace_existing=True,
        **options,
    )
    scheduler.start()
    log.info("clock started: a tick every %g s", rt.settings.tick_interval_s)
    return SchedulerHandle(scheduler)


def run_tick(rt: Runtime) -> None:
    """One tick at the runtime's clock, its fan-outs on the fleet's polling pool (apart from
    users' commands); never raises (APScheduler would only log it)."""
    try:
        with polling():
            report = tick(rt, rt.now())
    except Exception:  # the clock must keep ticking
        log.exception("tick failed")
        return
    if report.errors:
        log.warning("tick at %s: steps failed: %s", report.now, ", ".join(report.errors))
