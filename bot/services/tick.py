"""One tick of the clock: everything the bot does on its own, in order.

``tick(rt, now)`` polls agents, runs the hooks other parts register (jobs, the ledger, budgets,
the digest), applies the rules (deadlines, idle, release-when-done), works on due releases,
reconciles with the providers' own lists (and terminates rentals the bot launched but never
registered because it stopped in between; one process alone does this in each slot, by a
StepClaim row), closes prompts that no longer apply and posts the
prompts that are due. Every step reads and writes rows, so running it late, twice, or from two
processes neither drops nor doubles anything. A step that fails is logged and the others still
run.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache, partial
from typing import TypeVar

from sqlalchemy import exc as sa_exc

from bot.runtime import Runtime
from bot.services import deadlines, polling, prompts, releases, rent
from bot.store.models import StepClaim

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Steps other parts of the bot add, as "module:function"; each is called as fn(rt, now)
#: (or fn(rt)) after the agents are polled and before the rules run. Add one line per hook.
TICK_HOOKS: list[str] = [
    "bot.services.jobs:poll_all",
    "bot.services.ledger:ledger_tick",
    "bot.services.budgets:budget_tick",
    "bot.services.digest:digest_tick",
]

#: How often the providers' lists are compared with the store.
RECONCILE_EVERY_S = 300
#: The pool (and the work's key) of reconciling, with the platform pools.
RECONCILE = "reconcile"

_EPOCH = datetime(1970, 1, 1)


@dataclass
class TickReport:
    """What one tick did; ``errors`` names the steps that failed."""

    now: datetime
    polled: int = 0
    released_requested: list[int] = field(default_factory=list)
    releases_processed: int = 0
    reconciled: list[int] = field(default_factory=list)
    orphans_terminated: list[str] = field(default_factory=list)
    prompts_closed: int = 0
    prompts_posted: int = 0
    errors: list[str] = field(default_factory=list)


def tick(rt: Runtime, now: datetime | None = None) -> TickReport:
    """Run every step once at ``now`` (naive UTC; default the runtime's clock)."""
    now = now or rt.now()
    report = TickReport(now=now)
    report.polled = len(_run(report, "poll", lambda: polling.poll_instances(rt, now)) or ())
    for spec in TICK_HOOKS:
        _run(report, spec, partial(_call_hook, spec, rt, now))
    rules: tuple[tuple[str, Callable[[Runtime, datetime], list[int]]], ...] = (
        ("deadlines", deadlines.check_deadlines),
        ("idle", deadlines.check_idle),
        ("jobs_done", deadlines.check_jobs_done),
    )
    for name, rule in rules:
        report.released_requested.extend(_run(report, name, partial(rule, rt, now)) or ())
    # What people must hear goes out before the platforms are asked anything.
    report.prompts_closed = _run(report, "refresh", lambda: deadlines.refresh_prompts(rt, now)) or 0
    report.prompts_posted = _run(report, "prompts", lambda: prompts.deliver_pending(rt, now)) or 0
    processed = _run(report, "releases", lambda: releases.process_due_releases(rt, now))
    report.releases_processed = len(processed or ())
    if _reconcile_due(rt, now) and claim_step(rt, "reconcile", _slot(now, _reconcile_every(rt))):
        if rt.platform_work is None:
            _reconcile(rt, now, report)
        else:
            rt.platform_work.submit(RECONCILE, RECONCILE, partial(_reconcile, rt, now, None))
    return report


def _reconcile(rt: Runtime, now: datetime, report: TickReport | None) -> None:
    """Compare the platforms' lists with the store and recover rentals cut short."""
    into = report or TickReport(now=now)
    into.reconciled = _run(into, "reconcile", lambda: deadlines.reconcile(rt, now)) or []
    into.orphans_terminated = (
        _run(into, "rent_orphans", lambda: rent.recover_orphans(rt, now)) or []
    )
    # What reconciling found out (stopped or released outside the bot) is said at once.
    _run(into, "prompts", lambda: prompts.deliver_pending(rt, now))


@lru_cache(maxsize=64)
def resolve_hook(spec: str) -> Callable[..., object]:
    """The function a "module:function" hook names. Raises ImportError or AttributeError."""
    module_name, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"tick hook {spec} is not callable")
    return fn  # type: ignore[no-any-return]


def _call_hook(spec: str, rt: Runtime, now: datetime) -> None:
    fn = resolve_hook(spec)
    if len(inspect.signature(fn).parameters) >= 2:
        fn(rt, now)
    else:
        fn(rt)


def claim_step(rt: Runtime, step: str, slot: int) -> bool:
    """Whether this process does ``step`` in ``slot``: the first to store the claim does;
    another process, or a second tick in the same slot, does not."""
    try:
        with rt.db.session() as session:
            session.add(StepClaim(step=step, slot=slot, claimed_at=rt.now()))
    except sa_exc.IntegrityError:
        return False
    return True


def _reconcile_due(rt: Runtime, now: datetime) -> bool:
    """True on the first tick in each ``RECONCILE_EVERY_S`` slot of the clock."""
    every = _reconcile_every(rt)
    previous = now - timedelta(seconds=rt.settings.tick_interval_s)
    return _slot(now, every) != _slot(previous, every)


def _reconcile_every(rt: Runtime) -> float:
    return max(RECONCILE_EVERY_S, rt.settings.tick_interval_s)


def _slot(at: datetime, every: float) -> int:
    return int((at - _EPOCH).total_seconds() // every)


def _run(report: TickReport, name: str, fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:  # one failing step must not stop the others
        log.exception("tick step %s failed", name)
        report.errors.append(name)
        return None
