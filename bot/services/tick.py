"""One tick of the clock: everything the bot does on its own, in order.

``tick(rt, now)`` polls agents, runs the steps in ``TICK_STEPS`` (jobs, the ledger, budgets,
the digest), applies the rules (deadlines, idle, release-when-done), works on due releases,
reconciles with the providers' own lists (and terminates rentals the bot launched but never
registered because it stopped in between; one process alone does this in each slot, by a
StepClaim row), closes prompts that no longer apply and posts the prompts and the outbox's
messages that are due (before any platform is asked anything). Every step reads and writes
rows, so running it late, twice, or from two processes neither drops nor doubles anything. A
step that fails is logged and the others still run.

Time budgets (seconds): each step may take a share of ``settings.tick_interval_s``
(``STEP_SHARES``, else ``DEFAULT_STEP_SHARE``, never under ``MIN_STEP_BUDGET_S``). At the default
30 s interval polling and releases get 6 s, posting prompts 3 s and every other step 1.5 s; a
tick's shares add up to less than one interval (reconciling, once every ``RECONCILE_EVERY_S``
and then only without platform pools, comes on top). The tick measures every step, failed ones
too, on ``bot.timebox.monotonic`` into ``TickReport.durations_s``; a step that runs past its
budget is named in ``TickReport.over_budget`` and in a logged warning, and the steps after it
still run. Polling and releases also honour their budget: once it is spent they take no new
instance or release, and what is left stays due for the next tick, first in line; the item in
hand is finished, so they can overrun by one item (bounded by the SSH command timeout, or the
platform's HTTP timeout). The other steps are measured only: the rules and ``TICK_STEPS`` work on
rows, and posting takes every due message, each bounded by Slack's timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TypeVar

from sqlalchemy import exc as sa_exc

from bot.runtime import Runtime
from bot.services import (
    budgets,
    deadlines,
    digest,
    jobs,
    ledger,
    outbox,
    polling,
    prompt_kinds,
    prompts,
    releases,
    rent,
    samples,
)
from bot.store.models import StepClaim
from bot.timebox import Timebox

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A step of the tick: called as ``fn(rt, now)``; what it returns is not used.
Step = Callable[[Runtime, datetime], object]

#: The steps run after the agents are polled and before the rules, in order, by step name.
TICK_STEPS: list[tuple[str, Step]] = [
    ("jobs", jobs.poll_all),
    ("ledger", ledger.ledger_tick),
    ("budgets", budgets.budget_tick),
    ("digest", digest.digest_tick),
]

#: How often the providers' lists are compared with the store.
RECONCILE_EVERY_S = 300
#: How often raw utilisation samples past their retention are pruned (one process per slot).
PRUNE_EVERY_S = 3600
#: The pool (and the work's key) of reconciling, with the platform pools.
RECONCILE = "reconcile"

#: A step's time budget as a share of the tick interval, by step name.
STEP_SHARES: dict[str, float] = {"poll": 0.2, "releases": 0.2, "prompts": 0.1}
#: The share of every step not in ``STEP_SHARES``.
DEFAULT_STEP_SHARE = 0.05
#: No step's budget is shorter than this many seconds, however short the interval.
MIN_STEP_BUDGET_S = 1.0

_EPOCH = datetime(1970, 1, 1)


@dataclass
class TickReport:
    """What one tick did; ``errors`` names the steps that failed, ``durations_s`` says how long
    each step took (seconds, summed when a step ran twice) and ``over_budget`` names those that
    ran past their budget. ``interval_s`` is the tick interval the budgets derive from (None:
    steps are measured against no budget)."""

    now: datetime
    interval_s: float | None = None
    durations_s: dict[str, float] = field(default_factory=dict)
    over_budget: list[str] = field(default_factory=list)
    polled: int = 0
    released_requested: list[int] = field(default_factory=list)
    releases_processed: int = 0
    reconciled: list[int] = field(default_factory=list)
    orphans_terminated: list[str] = field(default_factory=list)
    prompts_closed: int = 0
    prompts_posted: int = 0
    outbox_posted: int = 0
    errors: list[str] = field(default_factory=list)


def tick(rt: Runtime, now: datetime | None = None) -> TickReport:
    """Run every step once at ``now`` (naive UTC; default the runtime's clock)."""
    now = now or rt.now()
    report = TickReport(now=now, interval_s=rt.settings.tick_interval_s)
    poll = partial(polling.poll_instances, rt, now)
    report.polled = len(_run(report, "poll", lambda: poll(timebox=_box(report, "poll"))) or ())
    for name, step in TICK_STEPS:
        _run(report, name, partial(step, rt, now))
    rules: tuple[tuple[str, Callable[[Runtime, datetime], list[int]]], ...] = (
        ("deadlines", deadlines.check_deadlines),
        ("idle", deadlines.check_idle),
        ("jobs_done", deadlines.check_jobs_done),
    )
    for name, rule in rules:
        report.released_requested.extend(_run(report, name, partial(rule, rt, now)) or ())
    # What people must hear goes out before the platforms are asked anything.
    report.prompts_closed = _run(report, "refresh", lambda: deadlines.refresh_prompts(rt, now)) or 0
    post = partial(prompts.deliver_pending, rt, now, prompt_kinds.KINDS)
    report.prompts_posted = _run(report, "prompts", post) or 0
    report.outbox_posted = _run(report, "outbox", lambda: outbox.deliver_due(rt, now)) or 0
    due = partial(releases.process_due_releases, rt, now)
    processed = _run(report, "releases", lambda: due(timebox=_box(report, "releases")))
    report.releases_processed = len(processed or ())
    if _slot(now, PRUNE_EVERY_S) != _slot(_previous(rt, now), PRUNE_EVERY_S) and claim_step(
        rt, "prune", _slot(now, PRUNE_EVERY_S)
    ):
        _run(report, "prune", lambda: samples.prune(rt, now))
    if _reconcile_due(rt, now) and claim_step(rt, "reconcile", _slot(now, _reconcile_every(rt))):
        if rt.platform_work is None:
            _reconcile(rt, now, report)
        else:
            rt.platform_work.submit(RECONCILE, RECONCILE, partial(_reconcile, rt, now, None))
    return report


def _reconcile(rt: Runtime, now: datetime, report: TickReport | None) -> None:
    """Compare the platforms' lists with the store and recover rentals cut short."""
    into = report or TickReport(now=now, interval_s=rt.settings.tick_interval_s)
    into.reconciled = _run(into, "reconcile", lambda: deadlines.reconcile(rt, now)) or []
    into.orphans_terminated = (
        _run(into, "rent_orphans", lambda: rent.recover_orphans(rt, now)) or []
    )
    # What reconciling found out (stopped or released outside the bot) is said at once.
    _run(into, "prompts", lambda: prompts.deliver_pending(rt, now, prompt_kinds.KINDS))
    _run(into, "outbox", lambda: outbox.deliver_due(rt, now))


def claim_step(rt: Runtime, step: str, slot: int) -> bool:
    """Whether this process does ``step`` in ``slot``: the first to store the claim does;
    another process, or a second tick in the same slot, does not."""
    try:
        with rt.db.session() as session:
            session.add(StepClaim(step=step, slot=slot, claimed_at=rt.now()))
    except sa_exc.IntegrityError:
        return False
    return True


def _previous(rt: Runtime, now: datetime) -> datetime:
    """When the tick before this one ran (by the interval)."""
    return now - timedelta(seconds=rt.settings.tick_interval_s)


def _reconcile_due(rt: Runtime, now: datetime) -> bool:
    """True on the first tick in each ``RECONCILE_EVERY_S`` slot of the clock."""
    every = _reconcile_every(rt)
    previous = now - timedelta(seconds=rt.settings.tick_interval_s)
    return _slot(now, every) != _slot(previous, every)


def _reconcile_every(rt: Runtime) -> float:
    return max(RECONCILE_EVERY_S, rt.settings.tick_interval_s)


def _slot(at: datetime, every: float) -> int:
    return int((at - _EPOCH).total_seconds() // every)


def step_budget_s(name: str, interval_s: float) -> float:
    """Seconds step ``name`` may take in a tick every ``interval_s`` seconds."""
    return max(STEP_SHARES.get(name, DEFAULT_STEP_SHARE) * interval_s, MIN_STEP_BUDGET_S)


def _box(report: TickReport, name: str) -> Timebox | None:
    """The time budget of step ``name``, opened now (None when the report has no interval)."""
    if report.interval_s is None:
        return None
    return Timebox.open(step_budget_s(name, report.interval_s))


def _run(report: TickReport, name: str, fn: Callable[[], T]) -> T | None:
    """Run one step: a failure is logged and named in ``report.errors``; its duration is
    recorded, and a run past its budget named in ``report.over_budget`` and logged."""
    box = _box(report, name) or Timebox.open(float("inf"))
    try:
        return fn()
    except Exception:  # one failing step must not stop the others
        log.exception("tick step %s failed", name)
        report.errors.append(name)
        return None
    finally:
        took = box.elapsed_s()
        report.durations_s[name] = report.durations_s.get(name, 0.0) + took
        if took > box.budget_s:
            log.warning(
                "tick step %s took %.1f s, past its budget of %.1f s", name, took, box.budget_s
            )
            if name not in report.over_budget:
                report.over_budget.append(name)
