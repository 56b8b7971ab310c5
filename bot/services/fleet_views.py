"""Looking at instances: the fleet overview, the stored list, one instance in detail (with its
settings), its settings alone, health. A row carries how its GPUs differ from the rented ones for
as long as the last poll says they do.

Looking asks the active instances for their live status (all at once, outside any transaction)
and records what each said on its row; the poller's own columns are left to bot.services.polling.
An instance that cannot be reached shows its error; the others are unaffected.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import update
from sqlmodel import Session, col, select

from agents.protocol import (
    HealthCheck,
    HealthReport,
    ProtocolError,
    StatusSnapshot,
    dumps,
    from_dict,
)
from bot.errors import FleetError, HostKeyNotPinned
from bot.fleet.base import Target
from bot.i18n import t
from bot.runtime import Runtime
from bot.services import access, costs
from bot.services.access import Caller
from bot.services.lookup import (
    POLLED_STATES,
    by_name_any,
    can_start,
    compare_gpus,
    get_live_instance,
    gpu_views,
    handle_fleet_error,
    instance_view,
    require_active,
    settings_view,
    target_for,
)
from bot.services.views import (
    CheckView,
    FleetOverview,
    HealthView,
    InstanceDetail,
    InstanceRow,
    InstanceSettings,
    InstanceView,
    JobBrief,
    ProblemView,
    ProcessView,
)
from bot.store.models import Instance, Job

log = logging.getLogger(__name__)


def fleet_overview(rt: Runtime) -> FleetOverview:
    """Every instance that is not released, with live GPU status for the active ones (asked all
    at once). An instance that cannot be reached shows its error; the others are unaffected."""
    now = rt.now()
    instances, jobs = _unreleased(rt)
    statuses = _poll(rt, [i for i in instances if i.state in POLLED_STATES], now)
    rows = tuple(_row(inst, statuses.get(inst.name), jobs, now) for inst in instances)
    return FleetOverview(rows=rows, now=now, timezone=rt.settings.timezone)


def list_instances(rt: Runtime) -> FleetOverview:
    """Every instance that is not released, as stored (the last poll's GPUs); asks nobody."""
    now = rt.now()
    instances, jobs = _unreleased(rt)
    rows = tuple(_row(inst, None, jobs, now) for inst in instances)
    return FleetOverview(rows=rows, now=now, timezone=rt.settings.timezone)


def instance_detail(rt: Runtime, name: str) -> InstanceDetail:
    """One instance in detail, asked live when it is active. A released instance's name shows
    its last registration. Raises NotFound."""
    now = rt.now()
    with rt.db.session() as session:
        inst = by_name_any(rt, session, name)
        jobs = running_jobs(session, [inst.id] if inst.id is not None else [])
    outcome = _poll(rt, [inst], now).get(inst.name) if inst.state in POLLED_STATES else None
    row = _row(inst, outcome, jobs, now)
    snapshot = outcome if isinstance(outcome, StatusSnapshot) else _stored_status(inst)
    cost = costs.since_registered(inst, now)
    return InstanceDetail(
        row=row,
        now=now,
        timezone=rt.settings.timezone,
        hostname=snapshot.host.hostname if snapshot else None,
        driver_version=snapshot.driver.version if snapshot and snapshot.driver else None,
        cuda_version=snapshot.driver.cuda_version if snapshot and snapshot.driver else None,
        processes=tuple(
            ProcessView(p.gpu_index, p.pid, p.user, p.command, p.used_mem_bytes, p.job_id)
            for p in (snapshot.processes if snapshot else ())
        ),
        compute_cost_micros=cost.compute_micros,
        storage_cost_micros=cost.storage_micros,
        settings=settings_view(inst),
        can_start=inst.state == "stopped" and can_start(rt, inst),
    )


def instance_settings(rt: Runtime, name: str) -> InstanceSettings:
    """The settings of a live instance (`/gpu policy NAME` without options); asks nobody,
    changes nothing. Raises NotFound."""
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
    return InstanceSettings(
        instance=instance_view(inst),
        settings=settings_view(inst),
        now=rt.now(),
        timezone=rt.settings.timezone,
    )


def health(rt: Runtime, caller: Caller, name: str, full: bool = False) -> HealthView:
    """The health checklist of an active instance. Everyone may ask for the quick one; ``full``
    (the CUDA checks and benchmarks, which load the GPUs) only the owner, the people allowed
    on it and admins. Raises NotFound, NotAuthorized, Conflict, FleetError subclasses."""
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        if full:
            access.require_operate(
                rt, caller, inst, session, action=f"run the full health check on {inst.name}"
            )
    require_active(inst, t("checked"))
    try:
        report = rt.fleet.agent(target_for(rt, inst)).health(
            full=full,
            python=inst.python_path,
            expect_gpu=inst.gpu_model,
            expect_count=inst.gpu_count,
        )
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        raise
    log.info("health of %s for %s: %s", inst.name, caller.user_id, report.status)
    return health_view(instance_view(inst), report, full=full)


def health_view(inst: InstanceView, report: HealthReport, *, full: bool) -> HealthView:
    """The view of an agent's health report."""
    return HealthView(
        instance=inst,
        status=report.status,
        checks=tuple(check_view(c) for c in report.checks),
        full=full,
    )


def check_view(check: HealthCheck) -> CheckView:
    """One check of an agent's report; templates kept only when they and their parameters are
    text (an old agent sends none, and the English is then shown as sent)."""
    summary_template, summary_params = _template(check.summary_template, check.summary_params)
    hint_template, hint_params = _template(check.hint_template, check.hint_params)
    return CheckView(
        check.id,
        check.status,
        check.summary,
        check.hint,
        summary_template=summary_template,
        summary_params=summary_params,
        hint_template=hint_template,
        hint_params=hint_params,
    )


def _template(template: object, params: object) -> tuple[str | None, dict[str, str]]:
    if not isinstance(template, str) or not template or not isinstance(params, Mapping):
        return None, {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        return None, {}
    return template, dict(params)


def running_jobs(session: Session, instance_ids: Iterable[int]) -> dict[int, tuple[JobBrief, ...]]:
    """The jobs the bot knows are running, by instance id (oldest first)."""
    ids = list(instance_ids)
    if not ids:
        return {}
    found: dict[int, list[JobBrief]] = {}
    rows = session.exec(
        select(Job)
        .where(col(Job.instance_id).in_(ids), Job.state == "running")
        .order_by(col(Job.id))
    ).all()
    for job in rows:
        found.setdefault(job.instance_id, []).append(
            JobBrief(
                id=job.id or 0,
                agent_job_id=job.agent_job_id,
                requested_by=job.requested_by,
                command=_command_text(job.command_json),
                started_at=job.started_at,
            )
        )
    return {key: tuple(value) for key, value in found.items()}


def _unreleased(rt: Runtime) -> tuple[list[Instance], dict[int, tuple[JobBrief, ...]]]:
    """The visible instances that are not released, by name, and their running jobs."""
    with rt.db.session() as session:
        instances = list(
            session.exec(
                select(Instance)
                .where(Instance.state != "released", access.visible_clause(rt))
                .order_by(col(Instance.name))
            ).all()
        )
        jobs = running_jobs(session, [i.id for i in instances if i.id is not None])
    return instances, jobs


def _poll(
    rt: Runtime, instances: Sequence[Instance], now: datetime
) -> dict[str, StatusSnapshot | FleetError]:
    """Ask every instance for its status at once; record each outcome on its row (the snapshot
    and its time, or the error). The poller's own columns (``last_polled_at``,
    ``last_poll_ok``) are left to it, so looking never delays a poll."""
    outcomes: dict[str, StatusSnapshot | FleetError] = {}
    targets: list[Target] = []
    for inst in instances:
        target = target_for(rt, inst)
        if not target.is_local and target.host_key is None:
            outcomes[inst.name] = HostKeyNotPinned(
                t("{name}: no host key is pinned", name=inst.name), instance=inst.name
            )
            continue
        targets.append(target)
    if targets:
        outcomes.update(rt.fleet.fan_out(targets, lambda agent: agent.status()))
    if outcomes:
        _record_polls(rt, instances, outcomes, now)
    for inst in instances:
        outcome = outcomes.get(inst.name)
        if isinstance(outcome, FleetError):
            handle_fleet_error(rt, inst, outcome)
    return outcomes


def _record_polls(
    rt: Runtime,
    instances: Sequence[Instance],
    outcomes: dict[str, StatusSnapshot | FleetError],
    now: datetime,
) -> None:
    with rt.db.session() as session:
        for inst in instances:
            outcome = outcomes.get(inst.name)
            if outcome is None:
                continue
            if isinstance(outcome, FleetError):
                values: dict[str, object] = {"last_error": outcome.user_text()[:2000]}
            else:
                values = {
                    "last_error": None,
                    "last_status_json": dumps(outcome),
                    "last_status_at": now,
                }
            session.exec(update(Instance).where(col(Instance.id) == inst.id).values(**values))


def _row(
    inst: Instance,
    outcome: StatusSnapshot | FleetError | None,
    jobs: dict[int, tuple[JobBrief, ...]],
    now: datetime,
) -> InstanceRow:
    problem = None
    snapshot: StatusSnapshot | None
    if isinstance(outcome, FleetError):
        problem = ProblemView(type(outcome).__name__, outcome.message, outcome.hint)
        snapshot = _stored_status(inst)
        polled_at = _status_time(inst) if snapshot else None
    elif outcome is None:
        snapshot = _stored_status(inst)
        polled_at = _status_time(inst) if snapshot else None
    else:
        snapshot = outcome
        polled_at = now
    return InstanceRow(
        instance=instance_view(inst),
        live=isinstance(outcome, StatusSnapshot),
        gpus=gpu_views(snapshot) if snapshot else (),
        problem=problem,
        running_jobs=jobs.get(inst.id or 0, ()),
        cost_micros=costs.since_registered_micros(inst, now),
        polled_at=polled_at,
        nvml_problem=snapshot.nvml_error.message if snapshot and snapshot.nvml_error else None,
        nvml_code=snapshot.nvml_error.code if snapshot and snapshot.nvml_error else None,
        mismatch=compare_gpus(inst.gpu_model, inst.gpu_count, snapshot) if snapshot else None,
    )


def _command_text(command_json: str) -> str:
    try:
        argv = json.loads(command_json)
    except ValueError:
        return command_json
    if isinstance(argv, list):
        return " ".join(str(part) for part in argv)
    return str(argv)


def _status_time(inst: Instance) -> datetime | None:
    times = [t for t in (inst.last_status_at, inst.last_polled_at) if t is not None]
    return max(times) if times else None


def _stored_status(inst: Instance) -> StatusSnapshot | None:
    if not inst.last_status_json:
        return None
    try:
        return from_dict(StatusSnapshot, json.loads(inst.last_status_json))
    except (ValueError, ProtocolError):
        return None
