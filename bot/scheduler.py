"""The clock: APScheduler 3.11 calling ``tick`` every ``settings.tick_interval_s`` seconds.

Deadlines, prompts and releases are rows; the scheduler keeps no jobs of its own that matter
(an in-memory job store, one interval job, ``coalesce=True``, ``max_instances=1``,
``misfire_grace_time=None``, UTC). The first tick runs at once, so a bot that was down enforces
what came due within one tick of starting.

Each tick is measured into bot.metrics (its duration, each step's duration and overrun past its
budget, failed steps, how late it started, ticks skipped while one still ran) and, once it has
ended, reported to the readiness check (bot.health), which fails when no tick has ended for
three intervals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from bot.fleet.fleet import polling
from bot.health import Health
from bot.metrics import Metrics
from bot.runtime import Runtime
from bot.services.tick import TickReport, step_budget_s, tick

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


@dataclass
class TickWatch:
    """What the clock reports each tick to: the metrics, and the readiness check (None: no
    health is served). ``clock`` is monotonic seconds."""

    metrics: Metrics = field(default_factory=Metrics)
    health: Health | None = None
    clock: Callable[[], float] = time.monotonic
    #: Called after each tick that ran (the store's gauges are read then); never raises.
    after_tick: Callable[[], None] | None = None
    _last_start: float | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def started(self, interval_s: float) -> float:
        """Note a tick starting now; returns how late it is (seconds past one interval after
        the previous tick's start; 0 for the first)."""
        now = self.clock()
        with self._lock:
            previous, self._last_start = self._last_start, now
        return 0.0 if previous is None else max(0.0, now - previous - interval_s)


def start_scheduler(
    rt: Runtime, *, first_tick_now: bool = True, watch: TickWatch | None = None
) -> SchedulerHandle:
    """Start ticking every ``rt.settings.tick_interval_s`` seconds, the first tick at once;
    each tick is reported to ``watch`` (default: the process's metrics only)."""
    watch = watch if watch is not None else TickWatch()
    scheduler = BackgroundScheduler(timezone=UTC)
    options: dict[str, object] = {}
    if first_tick_now:
        options["next_run_time"] = datetime.now(UTC)
    scheduler.add_listener(_skipped(watch), EVENT_JOB_MAX_INSTANCES)
    scheduler.add_job(
        run_tick,
        IntervalTrigger(seconds=rt.settings.tick_interval_s, timezone=UTC),
        args=[rt, watch],
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


def run_tick(rt: Runtime, watch: TickWatch | None = None) -> None:
    """One tick at the runtime's clock, its fan-outs on the fleet's polling pool (apart from
    users' commands), reported to ``watch`` (default: the process's metrics only); never
    raises (APScheduler would only log it)."""
    watch = watch if watch is not None else TickWatch()
    interval_s = rt.settings.tick_interval_s
    lag_s = watch.started(interval_s)
    started = watch.clock()
    try:
        with polling():
            report = tick(rt, rt.now())
    except Exception:  # the clock must keep ticking
        log.exception("tick failed")
        watch.metrics.tick_failed()
        return
    took_s = watch.clock() - started
    watch.metrics.tick_done(
        took_s=took_s,
        lag_s=lag_s,
        steps_s=report.durations_s,
        budgets_s=step_budgets_s(report, interval_s),
        failed=report.errors,
        over_budget=report.over_budget,
    )
    if watch.health is not None:
        watch.health.tick_finished()
    if watch.after_tick is not None:
        watch.after_tick()
    if report.errors:
        log.warning("tick at %s: steps failed: %s", report.now, ", ".join(report.errors))
    if lag_s > 0:
        log.info("tick at %s started %.1f s late", report.now, lag_s)


def step_budgets_s(report: TickReport, interval_s: float) -> dict[str, float]:
    """The time budget (seconds) of each step the tick measured."""
    return {step: step_budget_s(step, interval_s) for step in report.durations_s}


def _skipped(watch: TickWatch) -> Callable[[JobSubmissionEvent], None]:
    def on_max_instances(event: JobSubmissionEvent) -> None:
        if event.job_id == TICK_JOB_ID:
            watch.metrics.tick_skipped()
            log.warning("a tick was skipped: the previous one is still running")

    return on_max_instances
