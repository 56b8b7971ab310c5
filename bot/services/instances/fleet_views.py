"""Looking at instances: the fleet overview, the stored list, one instance in detail (with its
settings), its settings alone, health. A row carries how its GPUs differ from the rented ones for
as long as the last poll says they do.

Looking asks the active instances for their live status (all at once, outside any transaction)
and records what each said on its row; the poller's own columns are left to
bot.services.instances.polling.
An instance that cannot be reached shows its error; the others are unaffected.

A stored status is read through the facts stored with it
(bot.services.instances.lookup.stored_facts):
no view parses a snapshot or matches a GPU spec. Per-person views read one person's rows
(:func:`owner_rows`), the first lines of the team (:func:`first_lines`) and the team's figures
(:func:`fleet_summary`), so what they cost does not grow with the team.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import and_, func, literal_column, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from agents.protocol import HealthCheck, HealthReport, StatusSnapshot
from bot import billing
from bot.errors import FleetError, GpubotError, HostKeyNotPinned
from bot.fleet.base import Target
from bot.i18n import t
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances.lookup import (
    POLLED_STATES,
    StatusFacts,
    by_name_any,
    can_start,
    compare_facts,
    facts_from_json,
    get_live_instance,
    handle_fleet_error,
    instance_view,
    require_active,
    settings_view,
    status_columns,
    status_facts,
    stored_facts,
    stored_status,
    target_for,
)
from bot.services.instances.views import (
    CheckView,
    DeadlineBrief,
    FleetOverview,
    FleetSummary,
    HealthView,
    InstanceDetail,
    InstanceLine,
    InstanceRow,
    InstanceSettings,
    InstanceView,
    JobBrief,
    ListView,
    ProblemView,
    ProcessView,
)
from bot.services.money import costs
from bot.store.models import LIVE_PRICE_COLUMNS, Instance, Job

log = logging.getLogger(__name__)

#: How many of the nearest deadlines a fleet summary holds.
NEAREST_DEADLINES = 10
#: A summary the clock read is served for this many tick intervals (then read afresh).
SUMMARY_MAX_AGE_TICKS = 2
#: The team's figures as the clock last read them, by runtime (``id``; dropped with it):
#: (monotonic seconds when read, the summary).
_SUMMARIES: dict[int, tuple[float, FleetSummary]] = {}
_SUMMARIES_LOCK = threading.Lock()
#: The others' instances on one page of `/gpu list --all`.
LIST_PAGE_SIZE = 50
#: The team's nearest deadlines `/gpu list` shows.
LIST_NEAREST = 5


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


def owner_rows(rt: Runtime, owner_id: str) -> tuple[InstanceRow, ...]:
    """The unreleased instances of ``owner_id`` as stored, by name, with their running jobs:
    one indexed read of theirs, whatever the size of the team."""
    now = rt.now()
    with rt.db.session() as session:
        instances = session.exec(
            select(Instance)
            .where(_unreleased_clause(rt), Instance.owner_id == owner_id)
            .order_by(col(Instance.name), col(Instance.id))
        ).all()
        jobs = running_jobs(session, [i.id for i in instances if i.id is not None])
    return tuple(_row(inst, None, jobs, now) for inst in instances)


def first_lines(rt: Runtime, limit: int) -> tuple[InstanceLine, ...]:
    """The first ``limit`` unreleased instances by name, one line each: what a view lists of
    the team before it counts the rest. Reads only the columns a line shows (the facts the
    poll stored, not its snapshot)."""
    return _lines(rt, _unreleased_clause(rt), limit, 0)


def viewer_list(
    rt: Runtime,
    user_id: str,
    *,
    paged: bool,
    page: int = 1,
    page_size: int = LIST_PAGE_SIZE,
    nearest: int = LIST_NEAREST,
) -> ListView:
    """`/gpu list` for ``user_id``: their unreleased instances in full, the team's figures
    (:func:`fleet_summary`, with the ``nearest`` deadlines) and, when ``paged``, page ``page``
    (from 1) of everyone else's, ``page_size`` lines by name. Indexed reads of theirs and of
    one page (the page's rows and those before it in the name index), so what it costs
    follows the person and the page, not the team. Raises StoreError when the database
    fails."""
    size = max(1, page_size)
    number = max(1, page)
    mine = owner_rows(rt, user_id)
    summary = fleet_summary(rt, nearest)
    others: tuple[InstanceLine, ...] = ()
    if paged:
        where = and_(_unreleased_clause(rt), col(Instance.owner_id) != user_id)
        others = _lines(rt, where, size, (number - 1) * size)
    rest = max(0, summary.count - len(mine))
    return ListView(
        user_id=user_id,
        mine=mine,
        summary=summary,
        others=others,
        paged=paged,
        page=number,
        pages=max(1, -(-rest // size)),
        page_size=size,
        now=summary.now,
        timezone=rt.settings.timezone,
        currency=rt.settings.currency,
    )


def _lines(rt: Runtime, where: Any, limit: int, offset: int) -> tuple[InstanceLine, ...]:
    """Up to ``limit`` unreleased instances matching ``where``, by name, after the first
    ``offset`` of them, one line each (only the columns a line shows)."""
    columns = (
        col(Instance.id),
        col(Instance.name),
        col(Instance.owner_id),
        col(Instance.state),
        col(Instance.gpu_model),
        col(Instance.gpu_count),
        col(Instance.deadline_at),
        col(Instance.currency),
        col(Instance.status_util_pct),
        col(Instance.status_facts_json),
        col(Instance.last_status_json).is_not(None),
        (col(Instance.state) == "stopped"),
        col(Instance.provider),
        col(Instance.price_micros),
        col(Instance.price_per),
        col(Instance.delivered_gpu_count),
        col(Instance.disk_gb),
        col(Instance.storage_micros_per_gb_month),
    )
    with rt.db.session() as session:
        found = session.execute(
            sa_select(*columns)
            .where(where)
            .order_by(col(Instance.name), col(Instance.id))
            .limit(max(0, limit))
            .offset(max(0, offset))
        ).all()
        lines: list[InstanceLine] = []
        for row in found:
            iid, name, owner, state, model, count, deadline, currency, util = row[:9]
            facts_text, has_status, stopped, provider, price, per, delivered, disk, storage = row[
                9:
            ]
            facts = facts_from_json(facts_text) if facts_text else None
            if facts is None and has_status:
                # Stored before its facts were: derived from its snapshot, as a row's are.
                inst = session.get(Instance, iid)
                facts = stored_facts(inst) if inst is not None else None
                util = facts.util_pct if facts else None
            burn, unknown = _burn_of(stopped, provider, price, per, count, delivered, disk, storage)
            compute, _ = _burn_of(False, provider, price, per, count, delivered, None, 0)
            lines.append(
                InstanceLine(
                    id=iid,
                    name=name,
                    owner_id=owner,
                    state=state,
                    gpu_model=model,
                    gpu_count=count,
                    util_pct=util if facts else None,
                    deadline_at=deadline,
                    burn_micros_per_hour=burn,
                    storage_unknown=unknown,
                    price_micros_per_hour=compute,
                    currency=currency,
                    mismatch=compare_facts(model, count, facts) if facts else None,
                )
            )
    return tuple(lines)


def jobs_requested_by(rt: Runtime, user_id: str) -> tuple[tuple[str, JobBrief], ...]:
    """The running jobs ``user_id`` asked for on unreleased instances, with each one's
    instance name, by instance name then job (oldest first): one indexed read."""
    with rt.db.session() as session:
        rows = session.exec(
            select(Job, Instance.name)
            .join(Instance, col(Instance.id) == col(Job.instance_id))
            .where(
                Job.requested_by == user_id,
                Job.state == "running",
                _unreleased_clause(rt),
            )
            .order_by(col(Instance.name), col(Instance.id), col(Job.id))
        ).all()
    return tuple((name, _job_brief(job)) for job, name in rows)


def fleet_summary(rt: Runtime, nearest: int = NEAREST_DEADLINES) -> FleetSummary:
    """The team's unreleased instances in figures (:class:`FleetSummary`), with the
    ``nearest`` deadlines (at most :data:`NEAREST_DEADLINES`): as the clock last read them
    (:func:`refresh_summary`, after each tick of a running bot) while that reading is at most
    :data:`SUMMARY_MAX_AGE_TICKS` tick intervals old, else read now (:func:`read_summary`).
    Raises StoreError when it must be read and the database fails."""
    with _SUMMARIES_LOCK:
        kept = _SUMMARIES.get(id(rt))
    max_age_s = SUMMARY_MAX_AGE_TICKS * rt.settings.tick_interval_s
    if kept is not None and time.monotonic() - kept[0] <= max_age_s:
        summary = kept[1]
        return replace(summary, nearest=summary.nearest[: max(0, nearest)])
    return read_summary(rt, nearest)


def refresh_summary(rt: Runtime) -> None:
    """Read the team's figures for :func:`fleet_summary` now (the clock, after a tick), so
    that a person's view reads no more of the team than its own instances. A failure is
    logged and the last reading ages out."""
    try:
        summary = read_summary(rt, NEAREST_DEADLINES)
    except GpubotError as exc:
        log.warning("the fleet's summary could not be read: %s", exc)
        return
    with _SUMMARIES_LOCK:
        if id(rt) not in _SUMMARIES:
            weakref.finalize(rt, _forget_summary, id(rt))
        _SUMMARIES[id(rt)] = (time.monotonic(), summary)


def _forget_summary(key: int) -> None:
    with _SUMMARIES_LOCK:
        _SUMMARIES.pop(key, None)


def read_summary(rt: Runtime, nearest: int = NEAREST_DEADLINES) -> FleetSummary:
    """The team's figures read now: an aggregate and a limited query, read from the live
    rows' index entries (no row, no status), whose answers are bounded by the states and
    distinct prices and by ``nearest``, not by the instances."""
    now = rt.now()
    live = _unreleased_clause(rt)
    priced = [col(getattr(Instance, name)) for name in LIVE_PRICE_COLUMNS if name != "host"]
    with rt.db.session() as session:
        prices = session.execute(
            sa_select(*priced, func.count()).where(live).group_by(*priced)
        ).all()
        soonest = session.execute(
            sa_select(
                col(Instance.id),
                col(Instance.name),
                col(Instance.owner_id),
                col(Instance.state),
                col(Instance.deadline_at),
            )
            .where(live, col(Instance.deadline_at).is_not(None))
            .order_by(col(Instance.deadline_at), col(Instance.name))
            .limit(max(0, nearest))
        ).all()
    by_state: dict[str, int] = {}
    burn = 0
    unknown = 0
    for state, *prices_of, n in prices:
        by_state[state] = by_state.get(state, 0) + n
        each, stopped_unknown = _burn_of(state == "stopped", *prices_of)
        burn += each * n
        unknown += n if stopped_unknown else 0
    return FleetSummary(
        count=sum(by_state.values()),
        by_state=tuple(sorted(by_state.items())),
        burn_micros_per_hour=burn,
        storage_unknown=unknown,
        nearest=tuple(
            DeadlineBrief(id=iid or 0, name=name, owner_id=owner, state=state, deadline_at=at)
            for iid, name, owner, state, at in soonest
            if at is not None
        ),
        now=now,
    )


@lru_cache(maxsize=4096)
def _burn_of(
    is_stopped: bool,
    provider: str,
    price_micros: int,
    price_per: str,
    gpu_count: int | None,
    delivered_gpu_count: int | None,
    disk_gb: float | None,
    storage_micros_per_gb_month: int,
) -> tuple[int, bool]:
    """(what an instance of these prices costs per hour now, whether it is a stopped one whose
    storage price is unknown), as :class:`InstanceView` says it; prices repeat across a team,
    so each is worked out once."""
    like = Instance(
        name="",
        owner_id="",
        host="",
        ssh_user="",
        provider=provider,
        price_micros=price_micros,
        price_per=price_per,
        gpu_count=gpu_count,
        delivered_gpu_count=delivered_gpu_count,
        disk_gb=disk_gb,
        storage_micros_per_gb_month=storage_micros_per_gb_month,
    )
    if is_stopped:
        each = billing.storage_micros_per_hour(like)
        return each, each <= 0
    return billing.hourly_cost_micros(like), False


def instance_detail(rt: Runtime, name: str) -> InstanceDetail:
    """One instance in detail, asked live when it is active. A released instance's name shows
    its last registration. Raises NotFound."""
    now = rt.now()
    with rt.db.session() as session:
        inst = by_name_any(rt, session, name)
        jobs = running_jobs(session, [inst.id] if inst.id is not None else [])
    outcome = _poll(rt, [inst], now).get(inst.name) if inst.state in POLLED_STATES else None
    row = _row(inst, outcome, jobs, now)
    snapshot = outcome if isinstance(outcome, StatusSnapshot) else stored_status(inst)
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
        summary_parts=tuple(check.summary_parts),
        hint_parts=tuple(check.hint_parts),
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
        found.setdefault(job.instance_id, []).append(_job_brief(job))
    return {key: tuple(value) for key, value in found.items()}


def _job_brief(job: Job) -> JobBrief:
    return JobBrief(
        id=job.id or 0,
        agent_job_id=job.agent_job_id,
        requested_by=job.requested_by,
        command=_command_text(job.command_json),
        started_at=job.started_at,
    )


def _unreleased_clause(rt: Runtime) -> Any:
    """The instances that are not released and that this runtime may see."""
    # The state as a literal, so that the partial indexes of live rows apply (bot.store.models).
    return and_(col(Instance.state) != literal_column("'released'"), access.visible_clause(rt))


def _unreleased(rt: Runtime) -> tuple[list[Instance], dict[int, tuple[JobBrief, ...]]]:
    """The visible instances that are not released, by name, and their running jobs."""
    with rt.db.session() as session:
        instances = list(
            session.exec(
                select(Instance).where(_unreleased_clause(rt)).order_by(col(Instance.name))
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
                values = {"last_error": None, **status_columns(outcome), "last_status_at": now}
            session.exec(update(Instance).where(col(Instance.id) == inst.id).values(**values))


def _row(
    inst: Instance,
    outcome: StatusSnapshot | FleetError | None,
    jobs: dict[int, tuple[JobBrief, ...]],
    now: datetime,
    *,
    costed: bool = True,
) -> InstanceRow:
    """The overview row of ``inst``: the live ``outcome`` where it was asked, else what its
    last stored status says (the facts stored with it: nothing is parsed or matched here);
    ``costed`` False leaves ``cost_micros`` 0."""
    problem = None
    facts: StatusFacts | None
    if isinstance(outcome, StatusSnapshot):
        facts = status_facts(outcome)
        polled_at: datetime | None = now
    else:
        if isinstance(outcome, FleetError):
            problem = ProblemView(type(outcome).__name__, outcome.message, outcome.hint)
        facts = stored_facts(inst)
        polled_at = _status_time(inst) if facts else None
    return InstanceRow(
        instance=instance_view(inst),
        live=isinstance(outcome, StatusSnapshot),
        gpus=facts.gpus if facts else (),
        problem=problem,
        running_jobs=jobs.get(inst.id or 0, ()),
        cost_micros=costs.since_registered_micros(inst, now) if costed else 0,
        polled_at=polled_at,
        nvml_problem=facts.nvml_message if facts else None,
        nvml_code=facts.nvml_code if facts else None,
        mismatch=compare_facts(inst.gpu_model, inst.gpu_count, facts) if facts else None,
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
