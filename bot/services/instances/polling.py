"""Polling agents: each active instance's status every ``settings.poll_interval_s`` into
``Instance.last_*`` (with what views read of it: ``Instance.status_*``, see
bot.services.instances.lookup.status_columns) and a UtilSample row, and the instance's
``idle_since``.

An instance is idle in a sample when the poll succeeded, the mean GPU utilisation is under
``settings.idle_threshold_pct``, no process holds a GPU and no agent job is queued or running.
A failed poll, a GPU that reports no utilisation, or a gap in polling longer than
``GAP_FACTOR`` poll intervals counts as activity (never as idle).

Polls are spread over the interval: each instance has a stable place in it (a hash of its id,
:func:`next_poll_at`), so a fleet's polls fall evenly on the ticks instead of all on one. A new
registration is polled at once; after that, at its place in each interval (``poll_due_at``),
never sooner than half an interval after the poll before. A row without a place (written before
polls were spread) is due a poll interval after its last poll; one whose place was set under a
longer interval is due ``OVERDUE_FACTOR`` intervals after its last poll.

A batch of due instances is claimed with one conditional UPDATE (still due, still polled), so
two bot processes never poll one twice in an interval; the SSH calls run outside any
transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, update
from sqlmodel import Session, col, select

from agents.protocol import StatusSnapshot
from bot.errors import FleetError, HostKeyChanged
from bot.fleet.base import Target
from bot.fleet.fleet import FAN_OUT_WORKERS
from bot.i18n import t
from bot.logging_setup import log_ids
from bot.runtime import Runtime
from bot.services import access
from bot.services.instances.lookup import (
    POLLED_STATES,
    handle_fleet_error,
    status_columns,
    target_for,
)
from bot.services.money import samples
from bot.store.models import Instance, Job, UtilSample
from bot.timebox import Timebox, expired

log = logging.getLogger(__name__)

#: A gap in polling longer than this many intervals restarts the idle clock.
GAP_FACTOR = 3
#: Instances per fan-out: twice the polling pool's width. A batch waits for its slowest agent
#: (at most the SSH command timeout), so the next batch starts only while the time budget lasts.
POLL_BATCH = 2 * FAN_OUT_WORKERS
#: A row whose ``poll_due_at`` lies further ahead (its place was set under a longer interval) is
#: polled this many poll intervals after its last poll.
OVERDUE_FACTOR = 2
#: Knuth's multiplicative hash (2^32 / golden ratio): consecutive ids land far apart in the
#: interval.
_SPREAD = 2_654_435_761
_EPOCH = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class PollResult:
    """One instance's poll: ``ok`` False when the agent could not be asked."""

    instance_id: int
    ok: bool
    idle: bool
    util_avg_pct: float | None
    error: str | None = None


def poll_instances(
    rt: Runtime, now: datetime, *, timebox: Timebox | None = None
) -> list[PollResult]:
    """Poll every active instance due (at once when never polled, else at its place in the
    interval: see the module docstring), least recently polled first, ``POLL_BATCH`` at a
    time. Given a ``timebox``, no further batch is started once it is spent: the instances
    left stay due and come first on the next call."""
    due = _due(rt, now)
    results: list[PollResult] = []
    for start in range(0, len(due), POLL_BATCH):
        if start and expired(timebox):
            log.info("poll: budget spent, %d instances left for the next tick", len(due) - start)
            break
        claimed = _claim(rt, due[start : start + POLL_BATCH], now)
        if claimed:
            results.extend(_poll_batch(rt, claimed, now))
    return results


def _poll_batch(
    rt: Runtime, claimed: list[tuple[int, Target, datetime | None]], now: datetime
) -> list[PollResult]:
    targets = [target for _, target, _ in claimed]
    answers = rt.fleet.fan_out(targets, lambda agent: agent.status())
    if rt.fleet.closed:
        # Shutting down: a poll the bot hung up on says nothing of the machine (not a failed
        # poll, no idle clock reset); the next start polls it again.
        answers = {name: a for name, a in answers.items() if not isinstance(a, FleetError)}
        claimed = [c for c in claimed if c[1].name in answers]
    results: list[PollResult] = []
    new_samples: list[UtilSample] = []
    with rt.db.session() as session:
        # One query each loads the batch's rows (held here: the session keeps only weak
        # references) and counts their jobs; the samples are recorded together.
        ids = [instance_id for instance_id, _, _ in claimed]
        loaded = session.exec(select(Instance).where(col(Instance.id).in_(ids))).all()
        rows = {inst.id: inst for inst in loaded if inst.id is not None}
        active = _active_jobs(session, ids)
        for instance_id, target, previous in claimed:
            answer = answers.get(target.name)
            if answer is None:
                answer = FleetError(t("no answer"), instance=target.name)
            result, sample = _record(
                rt, rows[instance_id], answer, previous, now, active.get(instance_id, 0)
            )
            results.append(result)
            new_samples.append(sample)
        samples.record_all(session, new_samples, rt.settings.tz(), rows)
    _alert_host_key_changes(rt, claimed, answers)
    return results


def _alert_host_key_changes(
    rt: Runtime,
    claimed: list[tuple[int, Target, datetime | None]],
    answers: dict[str, StatusSnapshot | FleetError],
) -> None:
    """A changed host key alerts the owner (once per presented key), after the transaction."""
    for instance_id, target, _ in claimed:
        answer = answers.get(target.name)
        if not isinstance(answer, HostKeyChanged):
            continue
        with rt.db.session() as session:
            inst = session.get(Instance, instance_id)
        if inst is not None:
            handle_fleet_error(rt, inst, answer)


def sample_from(
    snapshot: StatusSnapshot, *, running_jobs: int, threshold_pct: float
) -> tuple[float | None, int, int, bool]:
    """(mean GPU utilisation %, GPU processes, running jobs, idle) from a status snapshot;
    ``running_jobs`` is what the store knows, raised to the jobs seen holding GPUs."""
    utils = [g.util_gpu_pct for g in snapshot.gpus if g.util_gpu_pct is not None]
    util = sum(utils) / len(utils) if utils else None
    procs = len(snapshot.processes)
    jobs = max(running_jobs, len({p.job_id for p in snapshot.processes if p.job_id}))
    idle = (
        snapshot.nvml_error is None
        and util is not None
        and util < threshold_pct
        and procs == 0
        and jobs == 0
    )
    return util, procs, jobs, idle


def next_poll_at(instance_id: int, after: datetime, interval_s: float) -> datetime:
    """When instance ``instance_id`` is next polled after a poll at ``after`` (naive UTC): the
    first start of its place in the interval (``interval_s`` seconds, offset by a hash of the
    id) that is at least half an interval after ``after``."""
    period_us = max(1, round(interval_s * 1_000_000))
    phase_us = ((instance_id * _SPREAD) % 2**32) * period_us >> 32
    earliest_us = (after - _EPOCH) // _US + period_us // 2
    slots = -((phase_us - earliest_us) // period_us)  # ceil((earliest - phase) / period)
    return _EPOCH + timedelta(microseconds=phase_us + slots * period_us)


def due_clause(rt: Runtime, now: datetime) -> Any:
    """A WHERE clause for the instances due a poll at ``now`` (see the module docstring)."""
    return or_(*due_branches(rt, **due_times(rt, now)))


def due_times(rt: Runtime, now: datetime) -> dict[str, datetime]:
    """The times :func:`due_branches` compares with, at ``now``."""
    interval = timedelta(seconds=rt.settings.poll_interval_s)
    return {
        "now": now,
        "unplaced_before": now - interval + timedelta(seconds=1),
        "overdue_before": now - OVERDUE_FACTOR * interval,
    }


def due_branches(rt: Runtime, *, now: Any, unplaced_before: Any, overdue_before: Any) -> list[Any]:
    """The instances due a poll, as clauses any of which holds: each an indexed range (state,
    last poll) or (state, poll due), so released instances never weigh on the clock. The
    times are datetimes or bound parameters (see :func:`due_times`)."""
    visible = access.visible_clause(rt)
    polled = col(Instance.state).in_(POLLED_STATES)
    return [
        and_(visible, polled, col(Instance.last_polled_at).is_(None)),
        and_(visible, polled, col(Instance.poll_due_at) <= now),
        and_(
            visible,
            polled,
            col(Instance.poll_due_at).is_(None),
            col(Instance.last_polled_at) < unplaced_before,
        ),
        and_(visible, polled, col(Instance.last_polled_at) < overdue_before),
    ]


def _due(rt: Runtime, now: datetime) -> list[tuple[int, datetime | None]]:
    """(id, last poll) of the instances due for a poll, least recently polled first."""
    with rt.db.session() as session:
        rows = session.exec(
            select(Instance.id, Instance.last_polled_at)
            .where(due_clause(rt, now))
            .order_by(col(Instance.last_polled_at).asc().nulls_first(), col(Instance.id))
        ).all()
    return [(instance_id, previous) for instance_id, previous in rows if instance_id is not None]


def _claim(
    rt: Runtime, batch: list[tuple[int, datetime | None]], now: datetime
) -> list[tuple[int, Target, datetime | None]]:
    """Claim the instances of ``batch`` still due and polled, in one UPDATE that also sets
    each one's next poll; another process's claim since the read makes a row not due."""
    if not batch:
        return []
    interval_s = rt.settings.poll_interval_s
    previous = dict(batch)
    next_due = {iid: next_poll_at(iid, now, interval_s) for iid in previous}
    with rt.db.session() as session:
        won = session.exec(
            update(Instance)
            .where(col(Instance.id).in_(list(previous)), due_clause(rt, now))
            .values(
                last_polled_at=now,
                poll_due_at=case(next_due, value=col(Instance.id)),
            )
            .returning(col(Instance.id))
        ).all()
        rows = session.exec(select(Instance).where(col(Instance.id).in_([i for (i,) in won])))
        targets = {inst.id: target_for(rt, inst) for inst in rows.all()}
    return [(iid, targets[iid], prev) for iid, prev in batch if iid is not None and iid in targets]


def _record(
    rt: Runtime,
    inst: Instance,
    answer: StatusSnapshot | FleetError,
    previous_poll: datetime | None,
    now: datetime,
    running_jobs: int,
) -> tuple[PollResult, UtilSample]:
    """One instance's poll written into its row; returns the result and the sample to record."""
    instance_id = inst.id
    assert instance_id is not None
    if isinstance(answer, FleetError):
        failed = UtilSample(instance_id=instance_id, at=now, ok=False)
        samples.settle_gpus(failed, inst)  # from the row as it was before this poll
        inst.last_poll_ok = False
        inst.last_error = answer.user_text()[:2000]
        inst.idle_since = None
        log.info(
            "poll %s failed: %s",
            inst.name,
            answer,
            extra=log_ids(instance_id=instance_id, instance=inst.name),
        )
        result = PollResult(
            instance_id, ok=False, idle=False, util_avg_pct=None, error=inst.last_error
        )
        return result, failed
    util, procs, jobs, idle = sample_from(
        answer, running_jobs=running_jobs, threshold_pct=rt.settings.idle_threshold_pct
    )
    gpus = samples.judge_gpus(answer, rt.settings.idle_threshold_pct)
    sample = UtilSample(
        instance_id=instance_id,
        at=now,
        ok=True,
        util_avg_pct=util,
        gpu_procs=procs,
        running_jobs=jobs,
        gpus_idle=gpus.idle,
        gpus_busy=gpus.busy,
        gpus_unmeasured=gpus.unmeasured,
    )
    samples.settle_gpus(sample, inst)  # from the row as it was before this poll
    gap = timedelta(seconds=rt.settings.poll_interval_s * GAP_FACTOR)
    continuous = previous_poll is not None and now - previous_poll <= gap and inst.last_poll_ok
    if not idle:
        inst.idle_since = None
    elif inst.idle_since is None or not continuous:
        inst.idle_since = now
    inst.last_poll_ok = True
    inst.last_error = None
    for column, value in status_columns(answer).items():
        setattr(inst, column, value)
    return PollResult(instance_id, ok=True, idle=idle, util_avg_pct=util), sample


def _active_jobs(session: Session, instance_ids: list[int]) -> dict[int, int]:
    """Queued and running jobs by instance, of ``instance_ids`` (absent: none); one query."""
    rows = session.exec(
        select(Job.instance_id, func.count())
        .where(col(Job.instance_id).in_(instance_ids), col(Job.state).in_(("queued", "running")))
        .group_by(col(Job.instance_id))
    ).all()
    return {int(instance_id): int(count) for instance_id, count in rows if instance_id is not None}
