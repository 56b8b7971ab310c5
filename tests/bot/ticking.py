"""The clock driven through hours of ticks, in a test: jumps from each tick to the next one at
which a step has work, instead of ticking through the idle minutes between.

A tick at which no step's due check holds (``tick.DUE_CLAUSES``) runs no step with such a check:
it costs the look-up of what is due and nothing else happens. Each check only becomes true as
time goes on and stays true until a tick acts on it, so the first tick of a stretch at which
anything is due is found by a galloping search over the stretch (a few look-ups for hours of
idle minutes). The skipped ticks would have run only the steps that have no due check (the
digest, bills, pruning, reconciling); the tick catches up on their slots at the next tick it
runs, since it compares the slot of each tick with the slot of the runtime's previous tick.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_
from sqlmodel import select

from bot.runtime import Runtime
from bot.services import tick as ticks
from tests.bot.services.support import Clock


def tick_through(
    rt: Runtime,
    clock: Clock,
    until: datetime,
    *,
    step_s: float = 60,
    errors: list[str] | None = None,
) -> int:
    """Tick at ``clock.now`` and at each ``step_s`` seconds after it up to ``until``, skipping
    the ticks at which nothing is due (the last one, at or before ``until``, always runs);
    leaves ``clock`` one step past that last tick, as a loop over every tick does. The steps
    that failed in the ticks that ran are added to ``errors`` when given. Returns how many
    ticks ran."""
    step = timedelta(seconds=step_s)
    start = clock.now
    if start > until:
        return 0
    last = (until - start) // step
    at = 0
    failed = errors if errors is not None else []
    failed += ticks.tick(rt, clock.set(start)).errors
    ran = 1
    while at < last:
        at = _next_due(rt, start, step, after=at, last=last)
        failed += ticks.tick(rt, clock.set(start + at * step)).errors
        ran += 1
    clock.set(start + (last + 1) * step)
    return ran


def anything_due(rt: Runtime, at: datetime) -> bool:
    """Whether any tick step that has a due check would find work at ``at`` (naive UTC)."""
    checks = [
        ticks.due_check(model, clause(rt, at)) for model, clause in ticks.DUE_CLAUSES.values()
    ]
    with rt.db.session() as session:
        return bool(session.execute(select(or_(*checks))).scalar())


def _next_due(rt: Runtime, start: datetime, step: timedelta, *, after: int, last: int) -> int:
    """The first tick index in (``after``, ``last``] at which anything is due; ``last`` when
    none is. Gallops (1, 2, 4, ... ticks on), then bisects."""
    idle, gap = after, 1
    while True:
        probe = min(after + gap, last)
        if anything_due(rt, start + probe * step):
            break
        if probe == last:
            return last
        idle, gap = probe, gap * 2
    # Nothing is due at ``idle``, something is at ``probe``: the first due tick lies between.
    while probe - idle > 1:
        middle = (idle + probe) // 2
        if anything_due(rt, start + middle * step):
            probe = middle
        else:
            idle = middle
    return probe
