"""Who besides the owner may run and cancel jobs on an instance: ``/gpu allow`` and
``/gpu deny``. Only the owner or an admin changes the list; every change is audited."""

from __future__ import annotations

from dataclasses import replace

from sqlmodel import Session, col, select

from bot.errors import UsageError
from bot.i18n import t
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances.lookup import ensure_person, get_live_instance
from bot.services.jobs.views import AccessChange, JobListView, JobView, WhoProcess, WhoView
from bot.services.speaking import audit
from bot.services.speaking.people import resolve_person
from bot.store.models import Instance, InstanceAccess


def allow(rt: Runtime, caller: Caller, instance_name: str, person: str) -> AccessChange:
    """Let ``person`` run and cancel jobs on the instance. Owner or admin only; idempotent.
    Raises NotFound, NotAuthorized, UsageError."""
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, instance_name)
        access.require_owner_or_admin(rt, caller, inst, action="give people access to")
        person_id, display = resolve_person(session, person, caller=caller)
        if person_id == inst.owner_id:
            raise UsageError(
                t(
                    "<@{person}> owns {name} and may already run jobs on it.",
                    person=person_id,
                    name=inst.name,
                ),
                hint=t("Name someone else."),
            )
        changed = _row(session, inst, person_id) is None
        if changed:
            ensure_person(session, person_id, display)
            session.add(
                InstanceAccess(
                    instance_id=_id(inst),
                    person_id=person_id,
                    granted_by=caller.user_id,
                    granted_at=rt.now(),
                )
            )
            audit.record(
                session, caller.user_id, "access.allow", inst.id, at=rt.now(), person=person_id
            )
            session.flush()
        return _change(session, inst, person_id, granted=True, changed=changed)


def deny(rt: Runtime, caller: Caller, instance_name: str, person: str) -> AccessChange:
    """Take back ``person``'s access to the instance's jobs (the jobs they already started
    keep running). Owner or admin only; idempotent. Raises NotFound, NotAuthorized,
    UsageError."""
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, instance_name)
        access.require_owner_or_admin(rt, caller, inst, action="take access away on")
        person_id, _ = resolve_person(session, person, caller=caller)
        if person_id == inst.owner_id:
            raise UsageError(
                t(
                    "<@{person}> owns {name}; the owner always has access.",
                    person=person_id,
                    name=inst.name,
                ),
                hint=t("Name someone the owner allowed."),
            )
        row = _row(session, inst, person_id)
        if row is not None:
            session.delete(row)
            audit.record(
                session, caller.user_id, "access.deny", inst.id, at=rt.now(), person=person_id
            )
            session.flush()
        return _change(session, inst, person_id, granted=False, changed=row is not None)


def allowed_people(session: Session, instance_id: int) -> tuple[str, ...]:
    """Slack IDs the owner allowed on the instance, oldest grant first."""
    rows = session.exec(
        select(InstanceAccess.person_id)
        .where(InstanceAccess.instance_id == instance_id)
        .order_by(col(InstanceAccess.granted_at), col(InstanceAccess.id))
    ).all()
    return tuple(rows)


def readable_jobs(rt: Runtime, caller: Caller, listing: JobListView) -> JobListView:
    """``listing`` as ``caller`` may read it: the command of a job is shown only to the person
    who asked for it, the instance's owner, the people allowed on the instance and admins;
    others see that the job runs, whose it is and its state. Raises StoreError."""
    readers = _readers(rt, caller, {job.instance_id for job in listing.jobs})
    return replace(listing, jobs=tuple(_job_as_read(job, caller, readers) for job in listing.jobs))


def readable_who(rt: Runtime, caller: Caller, view: WhoView) -> WhoView:
    """``/gpu who`` as ``caller`` may read it: the command line of a GPU process is shown to
    the same people as a job's (the process's own Slack user counts as its requester)."""
    with rt.db.session() as session:
        inst = session.exec(
            select(Instance).where(
                Instance.name == view.instance_name, Instance.state != "released"
            )
        ).first()
        sees_all = inst is not None and _may_read(rt, session, caller, inst)
    if sees_all:
        return view
    gpus = tuple(
        replace(gpu, processes=tuple(_process_as_read(p, caller) for p in gpu.processes))
        for gpu in view.gpus
    )
    return replace(view, gpus=gpus)


def _readers(rt: Runtime, caller: Caller, instance_ids: set[int]) -> set[int]:
    """The instances among ``instance_ids`` whose every job's command ``caller`` may read."""
    if access.is_admin(rt, caller):
        return set(instance_ids)
    with rt.db.session() as session:
        return {
            inst_id
            for inst_id in instance_ids
            if (inst := session.get(Instance, inst_id)) is not None
            and _may_read(rt, session, caller, inst)
        }


def _may_read(rt: Runtime, session: Session, caller: Caller, inst: Instance) -> bool:
    if access.is_admin(rt, caller) or access.is_owner(caller, inst):
        return True
    return caller.user_id in allowed_people(session, _id(inst))


def _job_as_read(job: JobView, caller: Caller, readers: set[int]) -> JobView:
    if job.instance_id in readers or job.requested_by == caller.user_id:
        return job
    return replace(job, command=(), command_hidden=True, summary=None)


def _process_as_read(process: WhoProcess, caller: Caller) -> WhoProcess:
    if process.slack_user == caller.user_id or process.command is None:
        return process
    return replace(process, command=None, command_hidden=True)


def _change(
    session: Session, inst: Instance, person_id: str, *, granted: bool, changed: bool
) -> AccessChange:
    return AccessChange(
        instance_name=inst.name,
        owner_id=inst.owner_id,
        person_id=person_id,
        granted=granted,
        changed=changed,
        allowed=allowed_people(session, _id(inst)),
    )


def _row(session: Session, inst: Instance, person_id: str) -> InstanceAccess | None:
    return session.exec(
        select(InstanceAccess).where(
            InstanceAccess.instance_id == _id(inst), InstanceAccess.person_id == person_id
        )
    ).first()


def _id(inst: Instance) -> int:
    if inst.id is None:
        raise ValueError("instance without an id")
    return inst.id
