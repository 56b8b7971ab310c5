"""Jobs: run, list, logs, cancel, who, and the poll that posts one completion reply per job.
No Slack in here: what it posts is a notice (:class:`JobQueued`, :class:`JobFinished`) that
``rt.message`` renders; no network call inside a transaction.

A job is a Job row. ``agent_job_id`` is ``pending-<token>`` until the agent confirms the job;
the agent gets ``--name gpubot-<token>``, so a job whose confirmation was lost (a timeout, a
dropped connection, a crash) is found again by the poll. ``summary_json`` holds the agent's
latest JobRecord (schema 1) for the job.

Polling (``poll_all``, a tick hook) asks each instance with unfinished jobs for
``jobs --since T``, where T is the agent's own creation time of the oldest unfinished job: every
unfinished job appears in the answer, so a job the agent no longer knows is marked ``lost``, and
an instance that was unreachable or a bot that was down catches up on its next poll.
``/gpu jobs`` (fleet or one instance) and ``/gpu logs`` ask the agents in the same way before
they answer, so what they show is the agents' word now; only the clock posts the replies.

``--gpus`` is parsed by :func:`agents.protocol.parse_gpus`, shared with the agent: GPU indices
as CUDA_VISIBLE_DEVICES numbers them, ``any:N``, ``all``, ``none``; the default ``auto`` is one
free GPU (the CPU on a machine without a usable one). A refused request shows the agent's
error document (agents.protocol.JobFailure: a code, a template of agents.messages and its
parameters) in the reader's language, with the instance's name for the machine; an agent
before those documents is shown in its own English.

Completion replies go through the outbox (:mod:`bot.services.speaking.outbox`): the job is marked
``replied_at`` in the transaction that queues its reply (key ``job_reply:<id>``), so each
finished job has exactly one reply queued, and the outbox posts it once, retries or escalates a
post that fails and never repeats one whose answer was lost. While ``/gpu run`` is posting the
job's message it holds ``reply_claimed_at`` (taken over after ``CLAIM_TIMEOUT``), so a very
short job's reply still lands in that message's thread.

Why one module of this size: a job's life is one protocol with the agent (start with its token,
poll, claim the reply, cancel, and every answer an agent can give, old agents' included);
the claim on ``reply_claimed_at`` and the token ties each step to the next, so they stay
together. Who may act on a job is bot.services.jobs.access, what it shows bot.services.jobs.views.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import CursorResult, and_, func, or_, update
from sqlmodel import Session, col, select

from agents.protocol import (
    GPUS_AUTO,
    NOTE_CANCELLED,
    NOTE_CANCELLED_QUEUED,
    NOTE_SUPERVISOR_GONE,
    JobList,
    JobRecord,
    JobRequestError,
    ProtocolError,
    WhoGpu,
    WhoJob,
    dumps,
    gpus_phrase,
    loads,
    parse_gpus,
)
from bot import billing
from bot.errors import (
    AgentBroken,
    Conflict,
    FleetError,
    GpubotError,
    NotFound,
    Unreachable,
    UsageError,
)
from bot.fleet.agent_client import AgentRefused
from bot.fleet.base import Target
from bot.i18n import N_, Language, nt, speaking, t
from bot.logging_setup import log_ids
from bot.notify import Notice
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances.lookup import get_live_instance, handle_fleet_error, target_for
from bot.services.jobs import access as job_access
from bot.services.jobs.views import (
    FINAL_STATES,
    JobListView,
    JobView,
    LogView,
    PollReport,
    SubmitResult,
    WhoGpuView,
    WhoProcess,
    WhoReservation,
    WhoView,
)
from bot.services.speaking import agent_text, audit, outbox, prompts
from bot.store.models import MAX_ROW_ID, Instance, Job

log = logging.getLogger(__name__)

#: A reply claimed longer ago than this was left by a process that died: take it over.
CLAIM_TIMEOUT = timedelta(minutes=5)
#: A submission the agent has not confirmed after this long did not reach it.
SUBMIT_CONFIRM_TIMEOUT = timedelta(minutes=10)
#: How far the bot's and an instance's clocks may disagree when finding unconfirmed jobs.
CLOCK_SLACK = timedelta(hours=1)
PENDING_PREFIX = "pending-"
NAME_PREFIX = "gpubot-"
ACTIVE_STATES = ("queued", "running")
DEFAULT_TAIL = 50
MAX_TAIL = 5000
MAX_RETRIES = 100
#: ``/gpu jobs NAME`` shows the instance's jobs of this period, ``/gpu jobs`` the fleet's.
LIST_WINDOW = timedelta(days=3)
LIST_LIMIT = 40
#: How long ``/gpu jobs`` waits for the agents of its unfinished jobs, in seconds; slower
#: ones are shown as the bot last saw them.
LIST_REFRESH_TIMEOUT_S = 10.0
#: How the agent starts its message on stderr when a command fails; its exit code for a
#: request it refuses.
AGENT_SAYS = "gpu-agent: error: "
AGENT_USAGE_EXIT = 2
#: Instance states whose agents are asked about jobs; others have no agent to ask any more.
REACHABLE_STATES = ("registering", "active", "releasing", "awaiting_confirmation")
#: Why a job was lost, as the bot notes it on the job (stored as template and parameters,
#: shown translated).
LOST_FORGOTTEN = N_("Lost: {name} no longer knows this job.")
LOST_UNCONFIRMED = N_("Lost: {name} never confirmed the job.")
LOST_INSTANCE_GONE = N_("Lost: the instance was {state}.")
#: The agent's notes without parameters, as agents before note templates wrote them (read
#: as their template until those agents are gone: one release).
_FIXED_NOTES = frozenset((NOTE_CANCELLED_QUEUED, NOTE_CANCELLED, NOTE_SUPERVISOR_GONE))
#: A finished job's state in words (the states are English words in the store).
_FINAL_STATE_WORDS = {
    "succeeded": N_("succeeded"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
    "lost": N_("lost"),
}


@dataclass(frozen=True)
class JobQueued(Notice):
    """Posted where the job was asked for: ``job`` is queued; its thread gets the reply."""

    job: JobView


@dataclass(frozen=True)
class JobFinished(Notice):
    """The completion reply: ``job`` ended (succeeded, failed, cancelled or lost)."""

    job: JobView


def submit(
    rt: Runtime,
    caller: Caller,
    instance_name: str,
    command: Sequence[str],
    gpus: str | None = None,
    retries: int = 0,
    release_when_done: bool = False,
) -> SubmitResult:
    """Queue ``command`` (argv, never given to a shell) on the instance and post the job's
    message where the caller typed (else to the caller directly).

    Only the owner, people the owner allowed, or an admin may. Raises UsageError, NotFound,
    Conflict (instance not active), NotAuthorized, FleetError.
    """
    argv = tuple(command)
    request_text = _check_request(argv, gpus, retries)
    now = rt.now()
    token = secrets.token_hex(6)
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, instance_name)
        if inst.state != "active":
            raise Conflict(
                t(
                    "{name} is {state}; jobs run only on active instances.",
                    name=inst.name,
                    state=access.state_words(inst.state),
                )
            )
        access.require_operate(rt, caller, inst, session)
        target = target_for(rt, inst)
        job = Job(
            instance_id=_id(inst),
            agent_job_id=PENDING_PREFIX + token,
            requested_by=caller.user_id,
            command_json=json.dumps(list(argv)),
            gpus=request_text,
            gpu_count=max(parse_gpus(request_text).count, 0),
            retries=retries,
            release_when_done=release_when_done,
            state="queued",
            submitted_at=now,
            channel_id=caller.channel_id,
            reply_claimed_at=now,  # held until the job's message is posted
        )
        session.add(job)
        session.flush()
        job_id = _id(job)
        audit.record(
            session,
            caller.user_id,
            "job_run",
            inst.id,
            at=now,
            job=job_id,
            command=list(argv),
            gpus=request_text,
            retries=retries,
            release_when_done=release_when_done,
        )
    record = _run_on_agent(rt, inst, target, job_id, argv, request_text, retries, token)
    with rt.db.session() as session:
        job = _job(session, job_id)
        _apply_record(job, record, inst)
        view = job_view(job, inst, record)
    view = replace(view, gpus_in_use=_gpus_in_use(rt, inst, record))
    text, body = rt.message(JobQueued(view))
    channel = caller.channel_id or inst.channel_id or rt.settings.channel or caller.user_id
    ref = None
    try:
        ref = rt.notifier.post(channel, text, body)
    except GpubotError:
        log.warning(
            "posting the message of job %s failed",
            job_id,
            exc_info=True,
            extra=log_ids(job_id=job_id, instance_id=inst.id, instance=inst.name),
        )
    with rt.db.session() as session:
        job = _job(session, job_id)
        if ref is not None:
            job.channel_id, job.message_ts = ref.channel, ref.ts
        job.reply_claimed_at = None
    return SubmitResult(job=view, posted=ref is not None)


def list_jobs(
    rt: Runtime, instance_name: str | None = None, caller: Caller | None = None
) -> JobListView:
    """The jobs of one instance as its agent lists them, or the fleet's recent and unfinished
    jobs; either way the bot's rows of unfinished jobs are brought up to date from their
    agents first, so both lists agree. Where an agent cannot be reached its jobs are shown as
    the bot last saw them and ``problem`` says so. With ``caller``, the commands that caller
    may not read are left out (bot.services.jobs.access.readable_jobs)."""
    listing = _list_jobs(rt, instance_name)
    return listing if caller is None else job_access.readable_jobs(rt, caller, listing)


def _list_jobs(rt: Runtime, instance_name: str | None) -> JobListView:
    now = rt.now()
    if instance_name is None:
        return _fleet_jobs(rt, now)
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, instance_name)
        target = target_for(rt, inst)
        active = _active_rows(session, inst.id)
    window = _iso(now - LIST_WINDOW - CLOCK_SLACK)
    since = min(window, _since(active)) if active else window
    try:
        listing = rt.fleet.agent(target).jobs(since=since)
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        with rt.db.session() as session:
            rows = _recent_rows(session, now, inst.id)
        stored = tuple(job_view(row, inst, _stored_record(row)) for row in rows)
        problem = t("As the bot last saw them: {error}", error=exc.message)
        return JobListView(inst.name, stored, problem=problem)
    _apply_listing(rt, _id(inst), listing, now)
    recent = [r for r in listing.jobs if r.state not in FINAL_STATES or _recent(r, now)]
    shown = recent[-LIST_LIMIT:]
    with rt.db.session() as session:
        known = {
            row.agent_job_id: row
            for row in session.exec(
                select(Job).where(
                    Job.instance_id == inst.id,
                    col(Job.agent_job_id).in_([record.id for record in shown]),
                )
            ).all()
        }
    views = [
        job_view(known[r.id], inst, r) if r.id in known else _agent_only_view(inst, r)
        for r in shown
    ]
    return JobListView(inst.name, tuple(views))


def logs(rt: Runtime, caller: Caller, job_ref: str, tail: int | None = None) -> LogView:
    """The last ``tail`` lines (default 50) of a job's log. Job output often holds secrets, so
    only the owner, people the owner allowed, or an admin may read it. Raises UsageError,
    NotFound, NotAuthorized, FleetError."""
    lines = DEFAULT_TAIL if tail is None else tail
    if not 1 <= lines <= MAX_TAIL:
        raise UsageError(t("--tail must be between 1 and {most}.", most=MAX_TAIL))
    inst, agent_job_id, row = _resolve(rt, job_ref)
    access.require_operate(rt, caller, inst, action=f"read the logs of jobs on {inst.name}")
    if agent_job_id.startswith(PENDING_PREFIX):
        raise _unconfirmed(job_ref, inst)
    target = target_for(rt, inst)
    try:
        text = rt.fleet.agent(target).logs(agent_job_id, tail=lines)
    except AgentBroken as exc:
        missing = _not_on_instance(exc, inst, agent_job_id)
        if missing is None:
            handle_fleet_error(rt, inst, exc)
            raise _agent_error(exc, inst) from exc
        raise missing from exc
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        raise
    # The state is asked after the log: a job shown running was still running when its log
    # had been read, and a finished job's log is whole.
    view, stale = _current_view(rt, inst, target, agent_job_id, row)
    return LogView(job=view, text=text, tail=lines, state_stale=stale)


def _current_view(
    rt: Runtime, inst: Instance, target: Target, agent_job_id: str, row: Job | None
) -> tuple[JobView, bool]:
    """The job as its agent has it now, its row brought up to date; with True when the agent
    could not be asked and the view is the bot's last record. A row already final is shown
    as stored (it no longer changes)."""
    stored = _stored_record(row) if row is not None else None
    if row is not None and row.state in FINAL_STATES:
        return job_view(row, inst, stored), False
    created = _aware(stored.created_at) if stored is not None else None
    since = (
        _iso(created - timedelta(seconds=1))
        if created is not None
        else _iso(rt.now() - LIST_WINDOW - CLOCK_SLACK)
    )
    try:
        listing = rt.fleet.agent(target).jobs(since=since)
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        log.info("job state after logs: %s", exc.message)
        return _stored_view(inst, agent_job_id, row, stored), True
    record = next((r for r in listing.jobs if r.id == agent_job_id), None)
    if record is None:
        return _stored_view(inst, agent_job_id, row, stored), True
    if row is None:
        return _agent_only_view(inst, record), False
    with rt.db.session() as session:
        job = _job(session, _id(row))
        _apply_record(job, record, inst)
        return job_view(job, inst, record), False


def _stored_view(
    inst: Instance, agent_job_id: str, row: Job | None, stored: JobRecord | None
) -> JobView:
    return job_view(row, inst, stored) if row is not None else _bare_view(inst, agent_job_id)


def cancel(rt: Runtime, caller: Caller, job_ref: str) -> JobView:
    """Cancel a queued or running job (its whole process tree). Only the owner, people the
    owner allowed, or an admin may. Raises NotFound, Conflict, NotAuthorized, FleetError."""
    inst, agent_job_id, row = _resolve(rt, job_ref)
    if row is not None and row.state in FINAL_STATES:
        raise Conflict(
            t(
                "Job {job} has already finished ({state}).",
                job=job_ref,
                state=_job_state_words(row.state),
            )
        )
    if agent_job_id.startswith(PENDING_PREFIX):
        raise _unconfirmed(job_ref, inst)
    access.require_operate(rt, caller, inst, action=f"cancel jobs on {inst.name}")
    target = target_for(rt, inst)
    try:
        record = rt.fleet.agent(target).cancel(agent_job_id)
    except AgentBroken as exc:
        if _refused_as(exc, "job_finished", "already finished"):
            raise Conflict(t("Job {job} has already finished.", job=job_ref)) from exc
        missing = _not_on_instance(exc, inst, agent_job_id)
        if missing is None:
            raise _agent_error(exc, inst) from exc
        raise missing from exc
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        raise
    with rt.db.session() as session:
        audit.record(
            session, caller.user_id, "job_cancel", inst.id, at=rt.now(), agent_job=agent_job_id
        )
        if row is None:
            return _agent_only_view(inst, record)
        job = _job(session, _id(row))
        _apply_record(job, record, inst)
        return job_view(job, inst, record)


def who(rt: Runtime, name: str, caller: Caller | None = None) -> WhoView:
    """Every GPU of the instance and its processes, shown as Slack users where the process
    belongs to a job the bot ran, with the agent's reservations: the job each GPU is assigned
    to (also while it starts) and the queued jobs waiting; and the memory in use that no
    visible process holds (another container's), so such a GPU is never called free. Raises
    NotFound, FleetError (the agent's own words when it answered with an error). With
    ``caller``, the command lines that caller may not read are left out."""
    view = _who(rt, name)
    return view if caller is None else job_access.readable_who(rt, caller, view)


def _who(rt: Runtime, name: str) -> WhoView:
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        target = target_for(rt, inst)
    try:
        report = rt.fleet.agent(target).who()
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        raise _agent_error(exc, inst) from exc
    views = _GpuViews(rt, inst, report.gpus, report.waiting_any)
    return WhoView(
        instance_name=inst.name,
        gpus=tuple(views.gpu(g) for g in report.gpus),
        waiting_any=tuple(views.reservation(j) for j in report.waiting_any),
    )


class _GpuViews:
    """Turns the agent's GPUs (``who``, or a queued job's ``gpus_in_use``) into views whose
    agent jobs are named as people name them (the bot's job number, else
    ``INSTANCE:AGENT_ID``) with the Slack user who ran them; one query for all of them."""

    def __init__(
        self, rt: Runtime, inst: Instance, gpus: Sequence[WhoGpu], waiting_any: Sequence[WhoJob]
    ) -> None:
        held = [g.held_by for g in gpus if g.held_by is not None]
        queued = [j for g in gpus for j in g.waiting] + list(waiting_any)
        job_ids = {p.job_id for g in gpus for p in g.processes if p.job_id}
        job_ids |= {j.job_id for j in held + queued}
        self.inst = inst
        self.rows: dict[str, Job] = {}
        if job_ids:
            with rt.db.session() as session:
                self.rows = {
                    row.agent_job_id: row
                    for row in session.exec(
                        select(Job).where(
                            Job.instance_id == inst.id, col(Job.agent_job_id).in_(job_ids)
                        )
                    ).all()
                }

    def ref_of(self, agent_job_id: str) -> str:
        row = self.rows.get(agent_job_id)
        return str(row.id) if row is not None else f"{self.inst.name}:{agent_job_id}"

    def reservation(self, job: WhoJob, starting: bool = False) -> WhoReservation:
        row = self.rows.get(job.job_id)
        wanted = gpus_phrase(job.gpus_requested) if not job.gpus and job.gpus_requested else None
        return WhoReservation(
            job_ref=self.ref_of(job.job_id),
            slack_user=row.requested_by if row is not None else None,
            user=job.user,
            starting=starting,
            wanted=wanted,
        )

    def gpu(self, gpu: WhoGpu) -> WhoGpuView:
        procs = []
        for proc in gpu.processes:
            row = self.rows.get(proc.job_id or "")
            procs.append(
                WhoProcess(
                    pid=proc.pid,
                    user=proc.user,
                    slack_user=row.requested_by if row is not None else None,
                    job_ref=self.ref_of(proc.job_id) if proc.job_id else None,
                    command=proc.command,
                    used_mem_bytes=proc.used_mem_bytes,
                    sm_util_pct=proc.sm_util_pct,
                    cpu_pct=proc.cpu_pct,
                    elapsed_s=proc.elapsed_s,
                )
            )
        holder = gpu.held_by
        started = holder is not None and any(p.job_id == holder.job_id for p in gpu.processes)
        return WhoGpuView(
            index=gpu.index,
            name=gpu.name,
            processes=tuple(procs),
            util_gpu_pct=gpu.util_gpu_pct,
            mem_used_bytes=gpu.mem_used_bytes,
            mem_total_bytes=gpu.mem_total_bytes,
            unseen_mem_bytes=gpu.unseen_mem_bytes,
            held_by=None if holder is None else self.reservation(holder, starting=not started),
            waiting=tuple(self.reservation(j) for j in gpu.waiting),
            free_for_jobs=gpu.free_for_jobs,
        )


def _gpus_in_use(rt: Runtime, inst: Instance, record: JobRecord) -> tuple[WhoGpuView, ...]:
    """What holds each GPU a job queued for any free GPUs could not have, as views (no
    command lines: the job's message is read by the whole channel)."""
    if not record.gpus_in_use:
        return ()
    views = _GpuViews(rt, inst, record.gpus_in_use, ())
    return tuple(
        replace(
            view,
            processes=tuple(replace(p, command=None) for p in view.processes),
            waiting=(),
        )
        for view in (views.gpu(g) for g in record.gpus_in_use)
    )


# --- polling and replies ------------------------------------------------------------------


def poll_clause() -> Any:
    """The jobs :func:`poll_all` brings up to date: the unfinished ones."""
    return col(Job.state).in_(ACTIVE_STATES)


def reply_clause(now: datetime) -> Any:
    """The jobs :func:`send_replies` answers at ``now`` (naive UTC): finished, without their
    reply, and not claimed by a poster within ``CLAIM_TIMEOUT``."""
    cutoff = now - CLAIM_TIMEOUT
    return and_(
        col(Job.state).in_(FINAL_STATES),
        col(Job.replied_at).is_(None),
        or_(col(Job.reply_claimed_at).is_(None), col(Job.reply_claimed_at) < cutoff),
    )


def due_clause(now: datetime) -> Any:
    """The jobs :func:`poll_all` has work for at ``now``: to poll, or to answer."""
    return or_(poll_clause(), reply_clause(now))


def poll_all(rt: Runtime, now: datetime | None = None) -> PollReport:
    """Bring every unfinished job up to date from its instance's agent, then post the
    completion replies due. For the scheduler's tick; safe to run late, twice, or from two
    processes at once."""
    now = now or rt.now()
    return _poll(rt, now, instance_ids=None)


def poll_jobs(rt: Runtime, instance_id: int, now: datetime | None = None) -> PollReport:
    """``poll_all`` for one instance."""
    return _poll(rt, now or rt.now(), instance_ids={instance_id})


def unfinished_count(rt: Runtime, instance_id: int) -> int:
    """How many jobs of ``instance_id`` the store holds as not finished yet."""
    query = select(func.count()).where(Job.instance_id == instance_id, poll_clause())
    with rt.db.session() as session:
        return int(session.exec(query).one())


def send_replies(rt: Runtime, now: datetime | None = None, instance_id: int | None = None) -> int:
    """Post the completion reply of every finished job that has none, each in the language of
    the person who ran the job; returns how many."""
    now = now or rt.now()
    with rt.db.session() as session:
        query = select(Job.id, Job.requested_by).where(reply_clause(now))
        if instance_id is not None:
            query = query.where(Job.instance_id == instance_id)
        rows = session.exec(query.order_by(col(Job.id))).all()
        due = [(int(job_id), by) for job_id, by in rows if job_id is not None]
    languages: dict[str, Language] = {}
    replied = 0
    for job_id, requester in due:
        with speaking(prompts.recipient_language(rt, requester, languages)):
            if _reply(rt, job_id, now):
                replied += 1
    return replied


# --- views --------------------------------------------------------------------------------


def job_view(row: Job, inst: Instance, record: JobRecord | None) -> JobView:
    """The view of a stored job; ``record``, the agent's latest word on it, wins over the row
    for state, times and exit code."""
    summary = record.summary if record is not None else None
    if record is not None:
        assigned = record.gpus_assigned
    else:
        assigned = _assigned_from(row.gpus) if row.started_at is not None else ()
    defaulted_to_cpu = (
        row.gpus == GPUS_AUTO and record is not None and record.gpus_requested == "none"
    )
    duration = _duration_s(row, record)
    return JobView(
        id=row.id,
        agent_job_id=row.agent_job_id,
        instance_id=row.instance_id,
        instance_name=inst.name,
        state=record.state if record is not None else row.state,
        command=_command(row.command_json),
        requested_by=row.requested_by,
        user=record.user if record is not None else None,
        name=record.name if record is not None else None,
        gpus_requested=record.gpus_requested if record is not None else row.gpus,
        gpus_assigned=tuple(assigned),
        retries=row.retries,
        attempt=record.attempt if record is not None else 0,
        release_when_done=row.release_when_done,
        submitted_at=row.submitted_at,
        started_at=_naive(record.started_at) if record is not None else row.started_at,
        finished_at=_naive(record.finished_at) if record is not None else row.finished_at,
        exit_code=record.exit_code if record is not None else row.exit_code,
        duration_s=duration,
        gpu_hours=_gpu_hours(duration, len(assigned)),
        cost_micros=row.cost_micros,
        currency=inst.currency,
        summary=summary,
        note=note_words(record) if record is not None else None,
        instance_active=inst.state == "active",
        instance_gpu_count=inst.gpu_count or inst.delivered_gpu_count,
        gpus_note=(
            t("{name} has no usable NVIDIA GPU, so the job runs on the CPU", name=inst.name)
            if defaulted_to_cpu
            else None
        ),
    )


# --- internals ----------------------------------------------------------------------------


def _check_request(argv: tuple[str, ...], gpus: str | None, retries: int) -> str:
    if not argv:
        raise UsageError(
            t("Nothing to run."),
            hint=t("Put the command after a double dash: `-- python train.py`."),
        )
    if not 0 <= retries <= MAX_RETRIES:
        raise UsageError(t("--retries must be between 0 and {most}.", most=MAX_RETRIES))
    try:
        request = parse_gpus(gpus)
    except JobRequestError as exc:
        raise UsageError(agent_text.said(exc.template, exc.params, str(exc))) from exc
    return request.text


def _run_on_agent(
    rt: Runtime,
    inst: Instance,
    target: Target,
    job_id: int,
    argv: tuple[str, ...],
    gpus: str | None,
    retries: int,
    token: str,
) -> JobRecord:
    """``gpu-agent run``; on failure the pending row is dropped, or kept for the poll to settle
    when the agent may have queued the job before the connection failed."""
    try:
        return rt.fleet.agent(target).run(
            argv, gpus=gpus, retries=retries, name=NAME_PREFIX + token
        )
    except FleetError as exc:
        handle_fleet_error(rt, inst, exc)
        with rt.db.session() as session:
            job = _job(session, job_id)
            if isinstance(exc, Unreachable):
                job.reply_claimed_at = None
            else:
                session.delete(job)
        if isinstance(exc, Unreachable):
            raise Unreachable(
                t(
                    "{name} did not confirm the job ({error}). If it was queued, I will find it "
                    "and reply when it ends.",
                    name=inst.name,
                    error=exc.message,
                ),
                instance=inst.name,
                hint=t(
                    "`/gpu jobs {name}` shows the queue; run it again if it is not there.",
                    name=inst.name,
                ),
            ) from exc
        raise _agent_error(exc, inst) from exc


def _poll(rt: Runtime, now: datetime, instance_ids: set[int] | None) -> PollReport:
    updated, unreachable = _refresh(rt, now, instance_ids)
    replied = 0
    if instance_ids is None:
        replied = send_replies(rt, now)
    else:
        replied = sum(send_replies(rt, now, iid) for iid in sorted(instance_ids))
    return PollReport(updated=updated, replied=replied, unreachable=tuple(unreachable))


def _refresh(
    rt: Runtime, now: datetime, instance_ids: set[int] | None, timeout_s: float | None = None
) -> tuple[int, list[str]]:
    """Bring the unfinished rows of ``instance_ids`` (None: every instance) up to date from
    their agents, asked at once, each for at most ``timeout_s`` seconds (default the SSH
    command timeout); returns (rows changed, instances that could not be asked)."""
    plans: dict[str, tuple[int, Target, str]] = {}
    updated = 0
    with rt.db.session() as session:
        query = select(Job).where(poll_clause())
        if instance_ids is not None:
            query = query.where(col(Job.instance_id).in_(instance_ids))
        rows = session.exec(query.order_by(col(Job.id))).all()
        by_instance: dict[int, list[Job]] = {}
        for row in rows:
            by_instance.setdefault(row.instance_id, []).append(row)
        for iid, inst_rows in by_instance.items():
            inst = session.get(Instance, iid)
            if inst is None:
                continue
            if access.visible(rt, inst) is None:
                continue  # local, outside the console: only the console polls it
            if inst.state not in REACHABLE_STATES:
                for row in inst_rows:
                    _mark_lost(row, inst, now, LOST_INSTANCE_GONE, state=inst.state)
                    updated += 1
                continue
            plans[inst.name] = (iid, target_for(rt, inst), _since(inst_rows))
    unreachable: list[str] = []
    if plans:
        since_by_name = {name: since for name, (_, _, since) in plans.items()}
        answers = rt.fleet.fan_out(
            [target for _, target, _ in plans.values()],
            lambda agent: agent.jobs(since=since_by_name[agent.target.name]),
            timeout_s=timeout_s,
        )
        for name, answer in answers.items():
            iid = plans[name][0]
            if isinstance(answer, FleetError):
                unreachable.append(name)
                _note_unreachable(rt, iid, answer)
                continue
            updated += _apply_listing(rt, iid, answer, now)
    return updated, sorted(unreachable)


def _apply_listing(rt: Runtime, instance_id: int, listing: JobList, now: datetime) -> int:
    """Update the instance's unfinished rows from the agent's list; returns rows changed."""
    by_id = {record.id: record for record in listing.jobs}
    by_name = {record.name: record for record in listing.jobs if record.name}
    changed = 0
    with rt.db.session() as session:
        inst = session.get(Instance, instance_id)
        if inst is None:
            return 0
        rows = session.exec(
            select(Job)
            .where(Job.instance_id == instance_id, col(Job.state).in_(ACTIVE_STATES))
            .order_by(col(Job.id))
        ).all()
        for row in rows:
            if row.agent_job_id.startswith(PENDING_PREFIX):
                token = row.agent_job_id[len(PENDING_PREFIX) :]
                record = by_name.get(NAME_PREFIX + token)
                if record is None:
                    if row.submitted_at < now - SUBMIT_CONFIRM_TIMEOUT:
                        _mark_lost(row, inst, now, LOST_UNCONFIRMED, name=inst.name)
                        changed += 1
                    continue
            else:
                record = by_id.get(row.agent_job_id)
                if record is None:
                    _mark_lost(row, inst, now, LOST_FORGOTTEN, name=inst.name)
                    changed += 1
                    continue
            if _apply_record(row, record, inst):
                changed += 1
    return changed


def _apply_record(job: Job, record: JobRecord, inst: Instance) -> bool:
    """Copy the agent's record into the row; returns whether anything changed."""
    before = (job.agent_job_id, job.state, job.summary_json)
    job.agent_job_id = record.id
    job.state = record.state
    job.started_at = _naive(record.started_at)
    job.finished_at = _naive(record.finished_at)
    job.exit_code = record.exit_code
    if record.gpus_assigned:
        job.gpus = ",".join(str(g) for g in record.gpus_assigned)
        job.gpu_count = len(record.gpus_assigned)
    elif record.state != "queued" or record.gpus_requested in (None, "none"):
        job.gpu_count = 0  # it runs (or ran) on the CPU: charged the whole instance's time
    job.summary_json = dumps(record)
    if record.state in FINAL_STATES:
        job.cost_micros = _cost(job, record, inst)
    return before != (job.agent_job_id, job.state, job.summary_json)


def _mark_lost(job: Job, inst: Instance, now: datetime, note: str, **params: str) -> None:
    """Mark the job lost, ``note`` (one of the ``LOST_*`` notes) filled with ``params``
    saying why; stored as the English and as the template with its parameters."""
    record = _stored_record(job)
    if record is None:
        record = JobRecord(
            id=job.agent_job_id,
            name=None,
            state="lost",
            command=_command(job.command_json),
            user=None,
            gpus_requested=job.gpus,
            gpus_assigned=(),
            retries=job.retries,
            attempt=0,
            created_at=_iso(job.submitted_at),
            started_at=None,
            finished_at=None,
            exit_code=None,
        )
    job.state = "lost"
    job.finished_at = now
    lost = replace(
        record,
        state="lost",
        finished_at=_iso(now),
        note=note.format(**params),
        note_template=note,
        note_params=params,
    )
    job.summary_json = dumps(lost)
    job.cost_micros = _cost(job, _stored_record(job), inst)


def _reply(rt: Runtime, job_id: int, now: datetime) -> bool:
    """Queue one completion reply, in the active language, in the outbox (marking the job
    replied in the same transaction) and try to post it; False when another process queued it
    or the post did not go out now (the outbox then retries it)."""
    message_id = _queue_reply(rt, job_id, now)
    return message_id is not None and outbox.deliver(rt, message_id, now=now) is not None


def _queue_reply(rt: Runtime, job_id: int, now: datetime) -> int | None:
    with rt.db.session() as session:
        won = session.execute(
            update(Job)
            .where(
                col(Job.id) == job_id,
                col(Job.replied_at).is_(None),
                or_(
                    col(Job.reply_claimed_at).is_(None),
                    col(Job.reply_claimed_at) < now - CLAIM_TIMEOUT,
                ),
            )
            .values(replied_at=now, reply_claimed_at=None)
        )
        if not (isinstance(won, CursorResult) and won.rowcount == 1):
            return None
        job = _job(session, job_id)
        inst = session.get(Instance, job.instance_id)
        if inst is None:
            return None
        view = job_view(job, inst, _stored_record(job))
        if view.state == "cancelled":
            view = replace(view, cancelled_by=_canceller(session, job))
        thread = job.message_ts
        channel = (job.channel_id if thread else None) or job.requested_by
        text, body = rt.message(JobFinished(view))
        return outbox.enqueue(
            session,
            key=f"job_reply:{job_id}",
            kind="job_reply",
            recipient=channel,
            text=text,
            blocks=body,
            thread_ts=thread,
            instance_id=job.instance_id,
            now=now,
        )


def _canceller(session: Session, job: Job) -> str | None:
    """Who cancelled the job through the bot (the audit log's newest ``job_cancel``), if
    anyone did."""
    for row in audit.entries(session, instance_id=job.instance_id, action="job_cancel"):
        if audit.details(row).get("agent_job") == job.agent_job_id:
            return row.actor
    return None


def _note_unreachable(rt: Runtime, instance_id: int, exc: FleetError) -> None:
    with rt.db.session() as session:
        inst = session.get(Instance, instance_id)
    if inst is not None:
        handle_fleet_error(rt, inst, exc)
    log.info("job poll: %s", exc.message)


def _since(rows: Sequence[Job]) -> str:
    """The agent-clock time at or before which every one of ``rows`` was created."""
    moments = []
    for row in rows:
        record = _stored_record(row)
        created = _aware(record.created_at) if record is not None else None
        if created is None or row.agent_job_id.startswith(PENDING_PREFIX):
            moments.append(row.submitted_at.replace(tzinfo=UTC) - CLOCK_SLACK)
        else:
            moments.append(created - timedelta(seconds=1))
    return min(moments).isoformat(timespec="milliseconds")


def _fleet_jobs(rt: Runtime, now: datetime) -> JobListView:
    """The fleet's recent and unfinished jobs; the instances with unfinished ones among them
    are asked first (as the clock's poll does, without posting replies)."""
    with rt.db.session() as session:
        rows = _recent_rows(session, now, None)
    unfinished = {row.instance_id for row in rows if row.state in ACTIVE_STATES}
    unreachable: list[str] = []
    if unfinished:
        _, unreachable = _refresh(rt, now, unfinished, timeout_s=LIST_REFRESH_TIMEOUT_S)
    with rt.db.session() as session:
        rows = _recent_rows(session, now, None)
        instances = {
            i.id: i
            for i in session.exec(
                select(Instance).where(
                    col(Instance.id).in_({r.instance_id for r in rows}), access.visible_clause(rt)
                )
            ).all()
        }
    views = tuple(
        job_view(row, instances[row.instance_id], _stored_record(row))
        for row in rows
        if row.instance_id in instances
    )
    problem = None
    if unreachable:
        problem = nt(
            "Could not ask {names} now: its jobs are shown as the bot last saw them.",
            "Could not ask {names} now: their jobs are shown as the bot last saw them.",
            len(unreachable),
            names=", ".join(unreachable),
        )
    return JobListView(None, views, problem=problem)


def _active_rows(session: Session, instance_id: int | None) -> list[Job]:
    return list(
        session.exec(
            select(Job)
            .where(Job.instance_id == instance_id, col(Job.state).in_(ACTIVE_STATES))
            .order_by(col(Job.id))
        ).all()
    )


def _recent(record: JobRecord, now: datetime) -> bool:
    """Whether a record changed within the list's window (by the agent's clock, give or take
    CLOCK_SLACK)."""
    changed = _aware(record.updated_at or record.finished_at or record.created_at)
    cutoff = now.replace(tzinfo=UTC) - LIST_WINDOW - CLOCK_SLACK
    return changed is None or changed >= cutoff


def _recent_rows(session: Session, now: datetime, instance_id: int | None) -> list[Job]:
    query = select(Job).where(
        or_(col(Job.state).in_(ACTIVE_STATES), col(Job.submitted_at) >= now - LIST_WINDOW)
    )
    if instance_id is not None:
        query = query.where(Job.instance_id == instance_id)
    rows = session.exec(query.order_by(col(Job.id).desc()).limit(LIST_LIMIT)).all()
    return list(reversed(rows))


def _resolve(rt: Runtime, ref: str) -> tuple[Instance, str, Job | None]:
    """A job named ``42``/``#42`` (the bot's number), an agent job id (or its unique start)
    the bot knows, or ``INSTANCE:AGENT_ID``. Raises NotFound, UsageError."""
    raw = ref.strip().lstrip("#")
    with rt.db.session() as session:
        if raw.isdigit():
            job = session.get(Job, int(raw)) if int(raw) <= MAX_ROW_ID else None
            if job is None:
                raise NotFound(
                    t("There is no job {job}.", job=raw), hint=t("`/gpu jobs` lists them.")
                )
            return _instance_of(rt, session, job), job.agent_job_id, job
        if ":" in raw:
            name, _, agent_id = raw.partition(":")
            inst = get_live_instance(rt, session, name)
            job = session.exec(
                select(Job).where(Job.instance_id == inst.id, Job.agent_job_id == agent_id)
            ).first()
            return inst, agent_id, job
        matches = session.exec(
            select(Job)
            .join(Instance, col(Instance.id) == col(Job.instance_id))
            .where(
                col(Job.agent_job_id).startswith(raw),
                col(Instance.state) != "released",
                access.visible_clause(rt),
            )
            .limit(3)
        ).all()
        if len(matches) == 1:
            return _instance_of(rt, session, matches[0]), matches[0].agent_job_id, matches[0]
        if matches:
            raise UsageError(t("{job!r} matches several jobs; give more of its id.", job=ref))
        raise NotFound(
            t("There is no job {job!r}.", job=ref),
            hint=t("Name a job by its number (`/gpu jobs` lists them) or as INSTANCE:AGENT_ID."),
        )


def _unconfirmed(job_ref: str, inst: Instance) -> Conflict:
    return Conflict(
        t(
            "Job {job} has not been confirmed by {name} yet; try again soon.",
            job=job_ref,
            name=inst.name,
        )
    )


def _job_state_words(state: str) -> str:
    words = _FINAL_STATE_WORDS.get(state)
    return t(words) if words is not None else state


def note_words(record: JobRecord) -> str | None:
    """A job's note in the active language: from its template and parameters (the bot's
    notes and an agent's since note templates), an older agent's fixed notes translated,
    anything else as the agent wrote it."""
    note = record.note
    if record.note_template:
        params = record.note_params
        shown = {"state": access.state_words(str(params["state"]))} if "state" in params else {}
        return agent_text.said(record.note_template, params, note or "", shown=shown)
    if note in _FIXED_NOTES:
        return t(note)
    return note


#: The schema version whose agents tell a refusal in English only (no JobFailure document):
#: their words are shown as they are, for one release; then this step goes.
LEGACY_ERRORS_SCHEMA = 1


def _agent_error(exc: FleetError, inst: Instance) -> FleetError | UsageError:
    """What the agent refused or could not do, in the reader's language, with the instance's
    name for the machine: a UsageError when it refused the request (exit code 2), else an
    AgentBroken. An agent's English without a document (schema
    :data:`LEGACY_ERRORS_SCHEMA`, before documents) is shown as it is; ``exc`` itself when
    the agent said nothing of its own."""
    if isinstance(exc, AgentRefused):
        failure = exc.failure
        text = agent_text.said(failure.template, failure.params, failure.message, name=inst.name)
        refused = failure.exit_code == AGENT_USAGE_EXIT
    elif isinstance(exc, AgentBroken):
        head, _, legacy = exc.message.partition(AGENT_SAYS)
        text = legacy.strip()
        refused = head.rstrip().endswith(f"exit code {AGENT_USAGE_EXIT}")
    else:
        return exc
    if not text:
        return exc
    if refused:
        return UsageError(text)
    return AgentBroken(text, instance=inst.name, hint="")


def _refused_as(exc: AgentBroken, code: str, legacy: str) -> bool:
    """Whether the agent's failure is of ``code``; for an agent before error documents,
    whether its English holds ``legacy``."""
    if isinstance(exc, AgentRefused):
        return exc.failure.code == code
    return legacy in exc.message


def _not_on_instance(exc: AgentBroken, inst: Instance, agent_job_id: str) -> NotFound | None:
    """The agent's "no job" as NotFound that names the Slack command listing the jobs; None
    for any other failure."""
    if not _refused_as(exc, "job_not_found", "error: no job "):
        return None
    return NotFound(
        t(
            "{name} has no job {job!r} (or more than one starts with it).",
            name=inst.name,
            job=agent_job_id,
        ),
        hint=t("`/gpu jobs {name}` lists its jobs.", name=inst.name),
    )


def _instance_of(rt: Runtime, session: Session, job: Job) -> Instance:
    """The registration a job belongs to, while it is live: a released registration's machine
    may be someone else's now, so its jobs are no longer reached."""
    inst = access.visible(rt, session.get(Instance, job.instance_id))
    if inst is None:
        raise NotFound(t("There is no job {job}.", job=job.id), hint=t("`/gpu jobs` lists them."))
    if inst.state == "released":
        raise Conflict(
            t(
                "Job {job} ran on {name}, which has been released; its agent is no longer asked.",
                job=job.id,
                name=inst.name,
            )
        )
    return inst


def _agent_only_view(inst: Instance, record: JobRecord) -> JobView:
    """A job started on the instance without the bot."""
    duration = record.summary.duration_s if record.summary is not None else None
    return JobView(
        id=None,
        agent_job_id=record.id,
        instance_id=_id(inst),
        instance_name=inst.name,
        state=record.state,
        command=tuple(record.command),
        user=record.user,
        name=record.name,
        gpus_requested=record.gpus_requested,
        gpus_assigned=tuple(record.gpus_assigned),
        retries=record.retries,
        attempt=record.attempt,
        started_at=_naive(record.started_at),
        finished_at=_naive(record.finished_at),
        exit_code=record.exit_code,
        duration_s=duration,
        gpu_hours=_gpu_hours(duration, len(record.gpus_assigned)),
        currency=inst.currency,
        summary=record.summary,
        note=note_words(record),
        instance_active=inst.state == "active",
    )


def _bare_view(inst: Instance, agent_job_id: str) -> JobView:
    return JobView(
        id=None,
        agent_job_id=agent_job_id,
        instance_id=_id(inst),
        instance_name=inst.name,
        state="unknown",
        command=(),
        currency=inst.currency,
    )


def _cost(job: Job, record: JobRecord | None, inst: Instance) -> int | None:
    if job.started_at is None:
        return 0
    duration = _duration_s(job, record)
    if duration is None:
        return None
    end = job.started_at + timedelta(seconds=duration)
    return billing.job_cost(
        inst, platform_billing(inst.provider), job.started_at, end, job.gpu_count or None
    )


def _duration_s(job: Job, record: JobRecord | None) -> float | None:
    if record is not None and record.summary is not None:
        return record.summary.duration_s
    if job.started_at is not None and job.finished_at is not None:
        return max(0.0, (job.finished_at - job.started_at).total_seconds())
    return None


def _gpu_hours(duration_s: float | None, gpus: int) -> float | None:
    if duration_s is None:
        return None
    return duration_s / 3600.0 * gpus


def _stored_record(job: Job) -> JobRecord | None:
    if not job.summary_json:
        return None
    try:
        return loads(JobRecord, job.summary_json)
    except ProtocolError:
        return None


def _assigned_from(gpus: str | None) -> tuple[int, ...]:
    if not gpus or gpus == "all":
        return ()
    try:
        return tuple(int(part) for part in gpus.split(",") if part)
    except ValueError:
        return ()


def _command(command_json: str) -> tuple[str, ...]:
    try:
        argv = json.loads(command_json)
    except ValueError:
        return (command_json,)
    return tuple(str(part) for part in argv) if isinstance(argv, list) else (str(argv),)


def _aware(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _naive(text: str | None) -> datetime | None:
    moment = _aware(text)
    return moment.replace(tzinfo=None) if moment is not None else None


def _iso(moment: datetime) -> str:
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return aware.isoformat(timespec="milliseconds")


def _job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(t("There is no job {job}.", job=job_id))
    return job


def _id(row: Instance | Job) -> int:
    assert row.id is not None
    return row.id
