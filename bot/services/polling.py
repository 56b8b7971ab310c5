"""Polling agents: each active instance's status every ``settings.poll_interval_s`` into
``Instance.last_*`` and a UtilSample row, and the instance's ``idle_since``.

An instance is idle in a sample when the poll succeeded, the mean GPU utilisation is under
``settings.idle_threshold_pct``, no process holds a GPU and no agent job is queued or running.
A failed poll, a GPU that reports no utilisation, or a gap in polling longer than
``GAP_FACTOR`` poll intervals counts as activity (never as idle).

Each instance is claimed for a poll with a conditional UPDATE of ``last_polled_at``, so two bot
processes never poll it twice in one interval; the SSH calls run outside any transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, update
from sqlmodel import Session, col, select

from agents.protocol import StatusSnapshot, dumps
from bot.errors import FleetError, HostKeyChanged
from bot.fleet.base import Target
from bot.fleet.fleet import FAN_OUT_WORKERS
from bot.logging_setup import log_ids
from bot.runtime import Runtime
from bot.services import access, samples
from bot.services.lookup import POLLED_STATES, handle_fleet_error, target_for
from bot.store.models import Instance, Job, UtilSample
from bot.timebox import Timebox, expired

log = logging.getLogger(__name__)

#: A gap in polling longer than this many intervals restarts the idle clock.
GAP_FACTOR = 3
#: Instances per fan-out: twice the polling pool's width. A batch waits for its slowest agent
#: (at most the SSH command timeout), so the next batch starts only while the time budget lasts.
POLL_BATCH = 2 * FAN_OUT_WORKERS


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
    """Poll every active instance whose last poll is at least a poll interval old, least
    recently polled first, ``POLL_BATCH`` at a time. Given a ``timebox``, no further batch is
    started once it is spent: the instances left stay due and come first on the next call."""
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
    results: list[PollResult] = []
    with rt.db.session() as session:
        for instance_id, target, previous in claimed:
            answer = answers.get(target.name)
            if answer is None:
                answer = FleetError("no answer", instance=target.name)
            results.append(_record(rt, session, instance_id, answer, previous, now))
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


def _due(rt: Runtime, now: datetime) -> list[tuple[int, datetime | None]]:
    """(id, last poll) of the instances due for a poll, least recently polled first."""
    due_before = now - timedelta(seconds=rt.settings.poll_interval_s) + timedelta(seconds=1)
    with rt.db.session() as session:
        rows = session.exec(
            select(Instance.id, Instance.last_polled_at)
            .where(
                access.visible_clause(rt),
                # Each branch an indexed range (state, last poll): released instances never
                # weigh on the clock.
                or_(
                    and_(
                        col(Instance.state).in_(POLLED_STATES),
                        col(Instance.last_polled_at).is_(None),
                    ),
                    and_(
                        col(Instance.state).in_(POLLED_STATES),
                        col(Instance.last_polled_at) < due_before,
                    ),
                ),
            )
            .order_by(col(Instance.last_polled_at).asc().nulls_first(), col(Instance.id))
        ).all()
    return [(instance_id, previous) for instance_id, previous in rows if instance_id is not None]


def _claim(
    rt: Runtime, batch: list[tuple[int, datetime | None]], now: datetime
) -> list[tuple[int, Target, datetime | None]]:
    """Claim each instance of ``batch`` still polled and not polled since it was read."""
    claimed: list[tuple[int, Target, datetime | None]] = []
    with rt.db.session() as session:
        for instance_id, previous in batch:
            guard = (
                col(Instance.last_polled_at).is_(None)
                if previous is None
                else col(Instance.last_polled_at) == previous
            )
            won = session.exec(
                update(Instance)
                .where(
                    col(Instance.id) == instance_id,
                    col(Instance.state).in_(POLLED_STATES),
                    guard,
                )
                .values(last_polled_at=now)
            ).rowcount
            inst = session.get(Instance, instance_id) if won == 1 else None
            if inst is not None:
                claimed.append((instance_id, target_for(rt, inst), previous))
    return claimed


def _record(
    rt: Runtime,
    session: Session,
    instance_id: int,
    answer: StatusSnapshot | FleetError,
    previous_poll: datetime | None,
    now: datetime,
) -> PollResult:
    inst = session.get(Instance, instance_id)
    assert inst is not None
    if isinstance(answer, FleetError):
        samples.record(
            session, UtilSample(instance_id=instance_id, at=now, ok=False), rt.settings.tz()
        )
        inst.last_poll_ok = False
        inst.last_error = answer.user_text()[:2000]
        inst.idle_since = None
        session.add(inst)
        log.info(
            "poll %s failed: %s",
            inst.name,
            answer,
            extra=log_ids(instance_id=instance_id, instance=inst.name),
        )
        return PollResult(
            instance_id, ok=False, idle=False, util_avg_pct=None, error=inst.last_error
        )
    util, procs, jobs, idle = sample_from(
        answer,
        running_jobs=_active_jobs(session, instance_id),
        threshold_pct=rt.settings.idle_threshold_pct,
    )
    samples.record(
        session,
        UtilSample(
            instance_id=instance_id,
            at=now,
            ok=True,
            util_avg_pct=util,
            gpu_procs=procs,
            running_jobs=jobs,
        ),
        rt.settings.tz(),
    )
    gap = timedelta(seconds=rt.settings.poll_interval_s * GAP_FACTOR)
    continuous = previous_poll is not None and now - previous_poll <= gap and inst.last_poll_ok
    if not idle:
        inst.idle_since = None
    elif inst.idle_since is None or not continuous:
        inst.idle_since = now
    inst.last_poll_ok = True
    inst.last_error = None
    inst.last_status_json = dumps(answer)
    session.add(inst)
    return PollResult(instance_id, ok=True, idle=idle, util_avg_pct=util)


def _active_jobs(session: Session, instance_id: int) -> int:
    return len(
        session.exec(
            select(Job.id).where(
                Job.instance_id == instance_id, col(Job.state).in_(("queued", "running"))
            )
        ).all()
    )
