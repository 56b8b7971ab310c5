"""The rules the clock enforces, as decisions over rows: deadline warnings and releases (by
each instance's policy and an admin's lifetime cap), stopped instances, idle prompts and idle
release, release-when-done, and prompts that no longer apply.

Rules only write rows (Prompt, Release) inside short transactions; posting happens afterwards
through bot.services.speaking.prompts, and provider calls through
bot.services.instances.releases, outside any transaction.

Deadlines:
- A warning goes out at each offset in ``settings.warning_offsets_s`` before the effective
  deadline (the earlier of ``deadline_at`` and an admin's ``lifetime_cap_at``). Each is a Prompt
  keyed by the deadline and the offset, so it is sent once; when the bot was down through
  several offsets only the latest due one is sent.
- Nothing is released without a warning first: the release happens at
  ``max(deadline, first warning posted + shortest offset)``. A bot that was down through the
  whole warning window therefore warns on its first tick and releases after that grace
  (``notice_s``, 10 minutes by default).
- Policy ``wait-for-jobs`` holds the release while jobs run, up to ``max_grace_s`` past the
  deadline. An admin's lifetime cap is a hard stop and ignores this policy.
- Policy ``stop`` (platforms that can stop): at the deadline the instance is stopped, its disk
  kept (and billed); it is released ``max_grace_s`` after the deadline (``--release-after``),
  with the usual warnings before. Started again after that stop (reconcile notices it), it is
  neither stopped again nor released for that deadline; extending moves both times.

Why one module of this size: each rule here (deadline, stopped, idle, release when done,
superseded prompts) writes the same Prompt and Release rows under the same guards and is
worded by the same ``notice_for``; the policies and caps they read are
bot.services.instances.policies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_
from sqlmodel import Session, col, func, select

from bot import billing
from bot.errors import (
    Conflict,
    GpubotError,
)
from bot.i18n import Language
from bot.logging_setup import log_ids
from bot.notify import Notice
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services import access
from bot.services.instances import releases
from bot.services.instances.lookup import can_start
from bot.services.instances.releases import Decided
from bot.services.instances.views import InstanceBrief, InstanceView
from bot.services.speaking import audit, prompts
from bot.store.models import AuditLog, Instance, Job, Prompt, Release, UtilSample

log = logging.getLogger(__name__)

KIND_WARNING = "deadline_warning"
KIND_IDLE = "idle"
KIND_JOBS_DONE = "jobs_done"
KIND_UNWARNED = "release_unwarned"
KIND_STOPPED = "stopped_reminder"

#: After the queue of a release-when-done instance drains: release after this grace.
JOBS_DONE_GRACE_S = 600
#: The grace after a late warning when no offsets are configured.
DEFAULT_NOTICE_S = 600

ACTIVE_JOB_STATES = ("queued", "running")
#: The deadline policy that stops the instance at the deadline and releases it later.
STOP_POLICY = "stop"
#: What the Extend buttons of a warning offer, in seconds.
EXTEND_CHOICES_S = (3600, 4 * 3600)


@dataclass(frozen=True)
class DeadlineWarning(Notice):
    """To the owner before a deadline release; its buttons answer prompt ``prompt_id``. The
    release happens at ``release_at``: the deadline, or later when the deadline left too little
    notice or passed while the bot could not warn. With ``policy`` ``wait-for-jobs`` it waits
    for running jobs; ``capped`` when an admin's lifetime cap is the deadline. ``action`` is
    ``stop`` when the instance is stopped then (policy ``stop``), to be released at
    ``final_release_at``; ``stopped`` when it is stopped already. ``extend_s`` lists the Extend
    choices (seconds) the recipient may use; ``cap_at`` is the admin's lifetime cap. Times naive
    UTC, shown in ``tz_name``."""

    instance: InstanceBrief
    prompt_id: int
    deadline_at: datetime
    release_at: datetime
    now: datetime
    tz_name: str
    policy: str = "release"
    capped: bool = False
    action: str = "release"
    final_release_at: datetime | None = None
    stopped: bool = False
    extend_s: tuple[int, ...] = EXTEND_CHOICES_S
    cap_at: datetime | None = None
    #: On an instance billed by the whole hour: the last minute of the hour the release falls
    #: in, already paid for (None: not billed by the hour, or nothing to gain).
    paid_until: datetime | None = None


@dataclass(frozen=True)
class IdlePrompt(Notice):
    """To the owner: the instance has been idle since ``idle_since`` (no GPU use, no jobs); its
    buttons (keep, release) answer prompt ``prompt_id``. ``release_at`` is when an unanswered
    prompt releases it, None when idle release is off."""

    instance: InstanceBrief
    prompt_id: int
    idle_since: datetime
    now: datetime
    release_at: datetime | None
    tz_name: str


@dataclass(frozen=True)
class JobsDonePrompt(Notice):
    """To the owner: the job queue of an instance marked release-when-done drained; it is
    released at ``release_at`` unless kept (prompt ``prompt_id``)."""

    instance: InstanceBrief
    prompt_id: int
    release_at: datetime
    tz_name: str


@dataclass(frozen=True)
class StoppedReminder(Notice):
    """To the owner: the instance has stood stopped since ``stopped_at``, its disk billing
    (``instance.storage_micros_per_hour``; ``storage_micros`` so far, in micro-units); it is
    released at ``release_at`` (None: only when someone releases it). ``last`` when no
    reminder follows; ``can_start`` when a button can start it on its platform. Its buttons
    answer the instance (not the prompt). Times naive UTC, shown in ``tz_name``."""

    instance: InstanceBrief
    instance_id: int
    stopped_at: datetime
    storage_micros: int
    release_at: datetime | None
    now: datetime
    tz_name: str
    last: bool = False
    can_start: bool = False


@dataclass(frozen=True)
class Superseded(Notice):
    """A warning whose deadline moved (to ``new_deadline_at``, None when there is none now):
    its buttons are gone. ``by`` is who last extended it (None: not known)."""

    instance: InstanceBrief
    new_deadline_at: datetime | None
    tz_name: str
    by: str | None = None


@dataclass(frozen=True)
class BusyAgain(Notice):
    """An idle prompt closed because the instance is busy again."""

    instance: InstanceBrief


@dataclass(frozen=True)
class NewJobs(Notice):
    """A jobs-done prompt closed because new jobs started on the instance."""

    instance: InstanceBrief


@dataclass(frozen=True)
class ReleasedUnwarned(Notice):
    """For the ops channel: a deadline release whose warnings the chat platform never confirmed
    reached the owner."""

    instance: InstanceBrief


@dataclass(frozen=True)
class Deadline:
    """An instance's effective deadline; ``capped`` when an admin's lifetime cap sets it."""

    at: datetime
    capped: bool

    @property
    def key(self) -> str:
        """The deadline as it appears in prompt keys."""
        return deadline_key(self.at)


def effective_deadline(inst: Instance) -> Deadline | None:
    """The earlier of the deadline and the lifetime cap, or None when neither is set. A stopped
    instance's deadline is when its disk is released (releases.storage_deadline)."""
    cap = inst.lifetime_cap_at
    at = inst.deadline_at
    if cap is not None and (at is None or cap <= at):
        return Deadline(cap, True)
    if at is None:
        return None
    return Deadline(at, False)


def stops_at_deadline(inst: Instance, deadline: Deadline) -> bool:
    """Whether reaching ``deadline`` stops the instance rather than releasing it."""
    return inst.deadline_policy == STOP_POLICY and inst.state == "active" and not deadline.capped


def deadline_key(at: datetime) -> str:
    """A deadline in prompt keys: ISO 8601 to the second."""
    return at.replace(microsecond=0).isoformat()


def notice_s(rt: Runtime) -> int:
    """The least warning an owner gets before a deadline release: the shortest offset."""
    offsets = [o for o in rt.settings.warning_offsets_s if o > 0]
    return min(offsets) if offsets else DEFAULT_NOTICE_S


# --- deadlines --------------------------------------------------------------------------------

#: Instances whose deadline is watched: running, and stopped (their disk still bills).
DEADLINE_STATES = ("active", "stopped")


def deadlines_due_clause(rt: Runtime, now: datetime) -> Any:
    """The instances :func:`check_deadlines` looks at, at ``now`` (naive UTC): watched, with
    a deadline or a lifetime cap within the earliest warning (each an indexed range)."""
    horizon = now + timedelta(seconds=max((*rt.settings.warning_offsets_s, 0)))
    visible = access.visible_clause(rt)
    watched = col(Instance.state).in_(DEADLINE_STATES)
    return or_(
        and_(visible, watched, col(Instance.deadline_at) <= horizon),
        and_(visible, watched, col(Instance.lifetime_cap_at) <= horizon),
    )


def check_deadlines(rt: Runtime, now: datetime) -> list[int]:
    """Create due warnings and request the releases that came due, for running and for stopped
    instances (a stopped one still bills its disk: at its deadline it is released for good);
    returns the instance ids whose release was requested."""
    due: list[tuple[int, str, str, Deadline, tuple[datetime | None, datetime | None]]] = []
    # Only deadlines close enough to need a warning or a release (indexed ranges): the cost
    # follows what is due, not the size of the fleet.
    with rt.db.session() as session:
        instances = session.exec(
            select(Instance).where(deadlines_due_clause(rt, now)).order_by(col(Instance.id))
        ).all()
        for inst in instances:
            reason = _deadline_step(rt, session, inst, now)
            deadline = effective_deadline(inst)
            if reason is not None and inst.id is not None and deadline is not None:
                mode = "stop" if stops_at_deadline(inst, deadline) else "terminate"
                seen = (inst.deadline_at, inst.lifetime_cap_at)
                due.append((inst.id, reason, mode, deadline, seen))
    requested: list[int] = []
    for instance_id, reason, mode, deadline, seen in due:
        # Only for the deadline seen here: an extension committed since then wins.
        if _request(rt, instance_id, reason=reason, now=now, seen_deadline=seen, mode=mode):
            requested.append(instance_id)
            _escalate_if_unwarned(rt, instance_id, deadline, now)
    return requested


def _escalate_if_unwarned(rt: Runtime, instance_id: int, deadline: Deadline, now: datetime) -> None:
    """A deadline release whose warnings never surely reached the owner (Slack failed or its
    answers were lost) goes on record in the audit log, and to the ops channel as a prompt that
    is posted once Slack takes it."""
    with rt.db.session() as session:
        delivered = session.exec(
            select(Prompt.id).where(
                Prompt.instance_id == instance_id,
                Prompt.kind == KIND_WARNING,
                col(Prompt.key).startswith(f"{deadline.key}:"),
                Prompt.delivery == prompts.POSTED,
            )
        ).first()
        if delivered is not None:
            return
        audit.record(
            session,
            at=now,
            actor="gpubot",
            action="released_unwarned",
            instance_id=instance_id,
            deadline_at=deadline.at,
        )
        if rt.settings.channel:
            prompts.ensure_prompt(
                session,
                instance_id=instance_id,
                kind=KIND_UNWARNED,
                key=deadline.key,
                recipient=rt.settings.channel,
                due_at=now,
            )


def _deadline_step(rt: Runtime, session: Session, inst: Instance, now: datetime) -> str | None:
    """One instance: add the due warning; return the release reason when it must go now."""
    deadline = effective_deadline(inst)
    if deadline is None or inst.id is None:
        return None
    if now < deadline.at:
        offsets = [
            o for o in rt.settings.warning_offsets_s if deadline.at - timedelta(seconds=o) <= now
        ]
        if offsets:
            offset = min(offsets)
            prompts.ensure_prompt(
                session,
                instance_id=inst.id,
                kind=KIND_WARNING,
                key=f"{deadline.key}:{offset}",
                recipient=inst.owner_id,
                due_at=deadline.at - timedelta(seconds=offset),
            )
        return None
    if stops_at_deadline(inst, deadline) and _stopped_at(session, inst.id, deadline) is not None:
        return None  # started again after its deadline stop: not stopped again for this one
    first_sent = _first_warning_sent(session, inst.id, deadline)
    if first_sent is None:
        prompts.ensure_prompt(
            session,
            instance_id=inst.id,
            kind=KIND_WARNING,
            key=f"{deadline.key}:late",
            recipient=inst.owner_id,
            due_at=now,
        )
        return None
    if now < release_time(rt, deadline, first_sent):
        return None
    if deadline.capped:
        return "cap"
    if (
        inst.deadline_policy == "wait-for-jobs"
        and now < deadline.at + timedelta(seconds=inst.max_grace_s)
        and jobs_running(session, inst)
    ):
        return None
    return "deadline"


def _stopped_at(session: Session, instance_id: int, deadline: Deadline) -> datetime | None:
    """When the bot stopped the instance for this deadline (policy ``stop``), or None."""
    return session.exec(
        select(func.max(Release.confirmed_at)).where(
            Release.instance_id == instance_id,
            Release.reason == "deadline",
            Release.mode == "stop",
            Release.state == "confirmed",
            col(Release.requested_at) >= deadline.at,
        )
    ).first()


def release_time(rt: Runtime, deadline: Deadline, first_warning_sent_at: datetime) -> datetime:
    """When a deadline release happens: at the deadline, but never sooner than ``notice_s``
    after the first warning was posted."""
    return max(deadline.at, first_warning_sent_at + timedelta(seconds=notice_s(rt)))


def _first_warning_sent(session: Session, instance_id: int, deadline: Deadline) -> datetime | None:
    """When the bot first tried to warn about this deadline, whatever came of the try: the
    notice counts from there, so a slow or failing Slack never holds the release back."""
    return session.exec(
        select(func.min(Prompt.first_attempt_at)).where(
            Prompt.instance_id == instance_id,
            Prompt.kind == KIND_WARNING,
            col(Prompt.key).startswith(f"{deadline.key}:"),
        )
    ).first()


def _newer_warning(session: Session, prompt: Prompt, deadline: Deadline) -> bool:
    newer = session.exec(
        select(Prompt.id).where(
            Prompt.instance_id == prompt.instance_id,
            Prompt.kind == KIND_WARNING,
            col(Prompt.key).startswith(f"{deadline.key}:"),
            col(Prompt.id) > prompt.id,
        )
    ).first()
    return newer is not None


def jobs_running(session: Session, inst: Instance) -> bool:
    """Whether the instance has a queued or running job (Job rows, or the last poll saw one;
    a failed last poll counts as running)."""
    active_job = session.exec(
        select(Job.id).where(Job.instance_id == inst.id, col(Job.state).in_(ACTIVE_JOB_STATES))
    ).first()
    if active_job is not None:
        return True
    sample = _last_sample(session, inst)
    if sample is None:
        return False
    return (not sample.ok) or sample.running_jobs > 0


def _last_sample(session: Session, inst: Instance) -> UtilSample | None:
    return session.exec(
        select(UtilSample)
        .where(UtilSample.instance_id == inst.id)
        .order_by(col(UtilSample.at).desc(), col(UtilSample.id).desc())
    ).first()


def _request(
    rt: Runtime,
    instance_id: int,
    *,
    reason: str,
    now: datetime,
    seen_deadline: tuple[datetime | None, datetime | None] | None = None,
    mode: str = "terminate",
) -> bool:
    try:
        releases.request_release(
            rt,
            instance_id,
            reason=reason,
            requested_by="gpubot",
            mode=mode,
            now=now,
            seen_deadline=seen_deadline,
        )
    except Conflict:
        return False
    except GpubotError as exc:
        log.warning(
            "instance %s: cannot request its release: %s",
            instance_id,
            exc,
            extra=log_ids(instance_id=instance_id),
        )
        return False
    return True


# --- stopped instances -------------------------------------------------------------------------


def stopped_due_clause(rt: Runtime, now: datetime) -> Any:
    """The instances :func:`check_stopped` reminds about at ``now`` (naive UTC): stopped, with
    a reminder due."""
    return and_(
        access.visible_clause(rt),
        col(Instance.state) == releases.STOPPED,
        col(Instance.stopped_remind_at) <= now,
    )


def check_stopped(rt: Runtime, now: datetime) -> list[int]:
    """Remind the owners of stopped instances whose reminder is due that the disk still bills
    (one Prompt per reminder of releases.STOPPED_REMINDERS_S, the latest due one only when the
    bot was down through several; none after the last). Returns the instance ids reminded."""
    reminded: list[int] = []
    with rt.db.session() as session:
        instances = session.exec(
            select(Instance).where(stopped_due_clause(rt, now)).order_by(col(Instance.id))
        ).all()
        for inst in instances:
            assert inst.id is not None
            stopped_at = inst.stopped_at or now
            elapsed_s = (now - stopped_at).total_seconds()
            due = [i for i, s in enumerate(releases.STOPPED_REMINDERS_S) if s <= elapsed_s]
            later = [s for s in releases.STOPPED_REMINDERS_S if s > elapsed_s]
            if due:
                number = due[-1]
                prompts.ensure_prompt(
                    session,
                    instance_id=inst.id,
                    kind=KIND_STOPPED,
                    key=f"{deadline_key(stopped_at)}:{number}",
                    recipient=inst.owner_id,
                    due_at=stopped_at + timedelta(seconds=releases.STOPPED_REMINDERS_S[number]),
                )
                reminded.append(inst.id)
            inst.stopped_remind_at = stopped_at + timedelta(seconds=later[0]) if later else None
            session.add(inst)
    return reminded


def _stopped_reminder(
    rt: Runtime, prompt: Prompt, inst: Instance, view: InstanceBrief
) -> StoppedReminder | None:
    """What a stopped reminder says now; None once the instance runs again, is released or
    was stopped another time."""
    if inst.state != releases.STOPPED or inst.stopped_at is None or inst.id is None:
        return None
    stopped_key, _, number = prompt.key.rpartition(":")
    if stopped_key != deadline_key(inst.stopped_at):
        return None
    now = rt.now()
    deadline = effective_deadline(inst)
    return StoppedReminder(
        view,
        instance_id=inst.id,
        stopped_at=inst.stopped_at,
        storage_micros=billing.cost_breakdown(
            inst, platform_billing(inst.provider), now
        ).storage_micros,
        release_at=deadline.at if deadline else None,
        now=now,
        tz_name=rt.settings.timezone,
        last=number == str(len(releases.STOPPED_REMINDERS_S) - 1),
        can_start=can_start(rt, inst),
    )


# --- idle ----------------------------------------------------------------------------------------


def idle_due_clause(rt: Runtime, now: datetime) -> Any:
    """The instances :func:`check_idle` looks at, at ``now`` (naive UTC): running and idle
    for ``settings.idle_window_s``."""
    return and_(
        col(Instance.state) == "active",
        access.visible_clause(rt),
        col(Instance.idle_since).is_not(None),
        col(Instance.idle_since) <= now - timedelta(seconds=rt.settings.idle_window_s),
    )


def check_idle(rt: Runtime, now: datetime) -> list[int]:
    """Prompt owners of instances idle for ``settings.idle_window_s``; release those with
    ``idle_release_after_s`` once that long passed since the prompt with no answer and no
    activity. Returns the instance ids whose release was requested."""
    window = timedelta(seconds=rt.settings.idle_window_s)
    due: list[int] = []
    with rt.db.session() as session:
        instances = session.exec(
            select(Instance).where(idle_due_clause(rt, now)).order_by(col(Instance.id))
        ).all()
        for inst in instances:
            assert inst.id is not None
            assert inst.idle_since is not None
            prompt = prompts.ensure_prompt(
                session,
                instance_id=inst.id,
                kind=KIND_IDLE,
                key=deadline_key(inst.idle_since),
                recipient=inst.owner_id,
                due_at=inst.idle_since + window,
            )
            if _grace_over(prompt, inst.idle_release_after_s, now):
                due.append(inst.id)
    return [iid for iid in due if _request(rt, iid, reason="idle", now=now)]


def _grace_over(prompt: Prompt, grace_s: int | None, now: datetime) -> bool:
    """An unanswered prompt whose grace, counted from the first try to post it, has run out."""
    if grace_s is None or prompt.first_attempt_at is None or prompt.resolved_at is not None:
        return False
    return now >= prompt.first_attempt_at + timedelta(seconds=grace_s)


# --- release when done ----------------------------------------------------------------------------


def jobs_done_due_clause(rt: Runtime, now: datetime) -> Any:
    """The instances :func:`check_jobs_done` looks at (``now`` is not needed): running, and
    asked to be released when done, by their flag or a job's."""
    visible = access.visible_clause(rt)
    active = col(Instance.state) == "active"
    flagged_jobs = select(Job.instance_id).where(col(Job.release_when_done).is_(True))
    return or_(
        and_(visible, active, col(Instance.release_when_done).is_(True)),
        and_(visible, active, col(Instance.id).in_(flagged_jobs)),
    )


def check_jobs_done(rt: Runtime, now: datetime) -> list[int]:
    """Instances to release when their job queue drains (the instance's flag, or its latest
    job's): prompt once the queue is empty, release ``JOBS_DONE_GRACE_S`` after the prompt.
    Returns the instance ids whose release was requested."""
    due: list[int] = []
    with rt.db.session() as session:
        # Only instances that asked to be released when done, or have a job that asked: one
        # query, whatever the fleet's size.
        instances = session.exec(
            select(Instance).where(jobs_done_due_clause(rt, now)).order_by(col(Instance.id))
        ).all()
        for inst in instances:
            assert inst.id is not None
            latest = session.exec(
                select(Job).where(Job.instance_id == inst.id).order_by(col(Job.id).desc())
            ).first()
            if latest is None or not (inst.release_when_done or latest.release_when_done):
                continue
            if jobs_running(session, inst):
                continue
            prompt = prompts.ensure_prompt(
                session,
                instance_id=inst.id,
                kind=KIND_JOBS_DONE,
                key=f"job:{latest.id}",
                recipient=inst.owner_id,
                due_at=now,
            )
            if _grace_over(prompt, JOBS_DONE_GRACE_S, now):
                due.append(inst.id)
    return [iid for iid in due if _request(rt, iid, reason="jobs_done", now=now)]


# --- superseded prompts ---------------------------------------------------------------------------


def refresh_due_clause(rt: Runtime, now: datetime) -> Any:
    """The prompts :func:`refresh_prompts` looks at (neither argument is needed): posted,
    still open, of a kind that can go stale."""
    return and_(
        col(Prompt.kind).in_((KIND_WARNING, KIND_IDLE, KIND_JOBS_DONE)),
        col(Prompt.resolved_at).is_(None),
        col(Prompt.message_ts).is_not(None),
    )


def refresh_prompts(rt: Runtime, now: datetime) -> int:
    """Close posted prompts that no longer apply (deadline moved, instance released, idle
    instance busy again, new jobs started) and edit their messages so their buttons are gone.
    Returns how many were closed."""
    edits: list[tuple[Prompt, Notice]] = []
    tz_name = rt.settings.timezone
    with rt.db.session() as session:
        open_prompts = session.exec(
            select(Prompt).where(refresh_due_clause(rt, now)).order_by(col(Prompt.id))
        ).all()
        for prompt in open_prompts:
            inst = session.get(Instance, prompt.instance_id)
            assert inst is not None
            assert prompt.id is not None
            outcome = _stale_outcome(session, prompt, inst, tz_name, now)
            if outcome is None:
                continue
            resolution, notice = outcome
            if prompts.resolve(session, prompt.id, resolution=resolution, by=None, now=now):
                edits.append((prompt, notice))
    languages: dict[str, Language] = {}
    for prompt, notice in edits:
        prompts.update_message(rt, prompt, notice, languages)
    return len(edits)


def _stale_outcome(
    session: Session, prompt: Prompt, inst: Instance, tz_name: str, now: datetime
) -> tuple[str, Notice] | None:
    view = releases.instance_view(inst)
    if inst.state != "active" and not _warns_while_stopped(session, prompt, inst):
        release = session.exec(
            select(Release).where(Release.instance_id == inst.id).order_by(col(Release.id).desc())
        ).first()
        reason = release.reason if release is not None else "user"
        by = None
        if release is not None and release.requested_by != "gpubot":
            by = release.requested_by
        decided = Decided(
            view,
            releases.RELEASE_REQUESTED,
            by=by,
            at=now,
            tz_name=tz_name,
            reason=reason,
            mode=release.mode if release is not None else "terminate",
        )
        return "released", decided
    if prompt.kind == KIND_WARNING:
        deadline = effective_deadline(inst)
        if deadline is not None and prompt.key.startswith(f"{deadline.key}:"):
            return None
        at = deadline.at if deadline else None
        return "superseded", Superseded(view, at, tz_name, by=_extended_by(session, inst))
    if prompt.kind == KIND_IDLE:
        if inst.idle_since is not None and deadline_key(inst.idle_since) == prompt.key:
            return None
        return "active", BusyAgain(view)
    if not jobs_running(session, inst):
        return None
    return "superseded", NewJobs(view)


def _warns_while_stopped(session: Session, prompt: Prompt, inst: Instance) -> bool:
    """A warning about the current deadline of a stopped instance with no release under way:
    still open (its disk bills until that deadline's release)."""
    if prompt.kind != KIND_WARNING or inst.state != releases.STOPPED or inst.id is None:
        return False
    deadline = effective_deadline(inst)
    if deadline is None or not prompt.key.startswith(f"{deadline.key}:"):
        return False
    return releases.open_release(session, inst.id) is None


def _extended_by(session: Session, inst: Instance) -> str | None:
    """Who last extended the instance (a Slack user ID), or None."""
    return session.exec(
        select(AuditLog.actor)
        .where(AuditLog.instance_id == inst.id, AuditLog.action == "extend")
        .order_by(col(AuditLog.id).desc())
    ).first()


# --- what the prompts say -------------------------------------------------------------------------


def notice_for(rt: Runtime, session: Session, prompt: Prompt, inst: Instance) -> Notice | None:
    """What a prompt of this module's kinds says, from the current rows; None when the prompt
    no longer applies."""
    assert prompt.id is not None
    view = releases.instance_view(inst)
    if prompt.kind == KIND_UNWARNED:
        return ReleasedUnwarned(view)
    if prompt.kind == KIND_STOPPED:
        return _stopped_reminder(rt, prompt, inst, view)
    if prompt.kind == KIND_WARNING and _warns_while_stopped(session, prompt, inst):
        return _warning(rt, session, prompt, inst, view)
    if inst.state != "active":
        return None
    if prompt.kind == KIND_WARNING:
        return _warning(rt, session, prompt, inst, view)
    if prompt.kind == KIND_IDLE:
        return _idle(rt, prompt, inst, view)
    if prompt.kind == KIND_JOBS_DONE:
        if jobs_running(session, inst):
            return None
        release_at = rt.now() + timedelta(seconds=JOBS_DONE_GRACE_S)
        return JobsDonePrompt(view, prompt.id, release_at, rt.settings.timezone)
    return None


#: This module's prompt kinds and what they say (joined in
#: bot.services.prompt_kinds.PROMPT_NOTICES).
PROMPT_NOTICES: dict[str, prompts.PromptNotice] = {
    kind: notice_for
    for kind in (
        KIND_WARNING,
        KIND_IDLE,
        KIND_JOBS_DONE,
        KIND_UNWARNED,
        KIND_STOPPED,
    )
}


def _warning(
    rt: Runtime, session: Session, prompt: Prompt, inst: Instance, view: InstanceBrief
) -> DeadlineWarning | None:
    assert prompt.id is not None
    deadline = effective_deadline(inst)
    if deadline is None or not prompt.key.startswith(f"{deadline.key}:"):
        return None
    if _newer_warning(session, prompt, deadline):
        return None  # a later warning for the same deadline replaces this unsent one
    now = rt.now()
    first_sent = _first_warning_sent(session, inst.id or 0, deadline) or now
    stop = stops_at_deadline(inst, deadline)
    final = deadline.at + timedelta(seconds=inst.max_grace_s) if stop else None
    if final is not None and inst.lifetime_cap_at is not None:
        final = min(final, inst.lifetime_cap_at)
    return DeadlineWarning(
        view,
        prompt_id=prompt.id,
        deadline_at=deadline.at,
        release_at=release_time(rt, deadline, first_sent),
        now=now,
        tz_name=rt.settings.timezone,
        policy="release" if deadline.capped else inst.deadline_policy,
        capped=deadline.capped,
        action="stop" if stop else "release",
        final_release_at=final,
        stopped=inst.state == releases.STOPPED,
        extend_s=extend_choices(rt, inst, prompt.recipient, now),
        cap_at=inst.lifetime_cap_at,
        paid_until=None if stop or deadline.capped else paid_hour_end(inst, deadline.at),
    )


#: How long before the end of a paid hour the offered deadline falls (a release takes a moment).
PAID_HOUR_MARGIN = timedelta(minutes=1)


def paid_hour_end(inst: Instance, at: datetime) -> datetime | None:
    """On a running instance billed by the whole hour, the last minute of the billed hour that
    holds ``at`` (naive UTC): keeping it until then costs nothing more than releasing it at
    ``at``. None when it is not billed by the hour, billing has not started, it is stopped, an
    admin's cap comes first, or less than a minute is gained."""
    if (
        inst.state != "active"
        or billing.rules_for(inst, platform_billing(inst.provider)).increment != "hour"
    ):
        return None
    start = inst.compute_session_at or billing.billing_start(inst, platform_billing(inst.provider))
    if start is None or at < start:
        return None
    hour = timedelta(hours=1)
    hours = max(1, -(-(at - start) // hour))
    end = start + hours * hour - PAID_HOUR_MARGIN
    if end - at < timedelta(minutes=1):
        return None
    if inst.lifetime_cap_at is not None and end > inst.lifetime_cap_at:
        return None
    return end


def extend_choices(
    rt: Runtime, inst: Instance | InstanceView, user_id: str, now: datetime
) -> tuple[int, ...]:
    """The Extend choices (seconds, of ``EXTEND_CHOICES_S``) that ``user_id`` may use now: all
    for an admin; for anyone else those that stay within the admin's lifetime cap."""
    cap = inst.lifetime_cap_at
    if cap is None or rt.settings.is_admin(user_id):
        return EXTEND_CHOICES_S
    start = max(inst.deadline_at or now, now)
    return tuple(s for s in EXTEND_CHOICES_S if start + timedelta(seconds=s) <= cap)


def _idle(rt: Runtime, prompt: Prompt, inst: Instance, view: InstanceBrief) -> IdlePrompt | None:
    assert prompt.id is not None
    if inst.idle_since is None or deadline_key(inst.idle_since) != prompt.key:
        return None
    now = rt.now()
    release_at = None
    if inst.idle_release_after_s:
        release_at = now + timedelta(seconds=inst.idle_release_after_s)
    return IdlePrompt(view, prompt.id, inst.idle_since, now, release_at, rt.settings.timezone)
