"""Who besides the owner may run and cancel jobs on an instance: ``/gpu allow`` and
``/gpu deny``. Only the owner or an admin changes the list; every change is audited."""

from __future__ import annotations

import re

from sqlmodel import Session, col, func, select

from bot.errors import UsageError
from bot.runtime import Runtime
from bot.services import access, audit
from bot.services.access import Caller
from bot.services.instances import ensure_person, get_live_instance
from bot.services.job_views import AccessChange
from bot.store.models import Instance, InstanceAccess, Person

#: ``<@U123|name>`` or ``<@U123>`` (Slack, escaped), or a bare ID ``U123``/``W123``.
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|([^>]*))?>")
_SLACK_ID = re.compile(r"@?([UW][A-Z0-9]{2,})")
_NAME = re.compile(r"@([\w.\-]+)")


def parse_person(session: Session, text: str) -> tuple[str, str | None]:
    """A person as typed: ``<@U123|name>``/``<@U123>`` (Slack), ``U123``, or ``@name`` (a
    display name the bot knows). Returns (Slack ID, display name or None). Raises UsageError."""
    raw = text.strip()
    mention = _MENTION.fullmatch(raw)
    if mention:
        return mention.group(1), (mention.group(2) or None)
    bare = _SLACK_ID.fullmatch(raw)
    if bare:
        return bare.group(1), None
    named = _NAME.fullmatch(raw)
    if named:
        wanted = named.group(1).lower()
        rows = session.exec(
            select(Person).where(func.lower(col(Person.display_name)) == wanted)
        ).all()
        if len(rows) == 1:
            return rows[0].slack_id, rows[0].display_name
        if len(rows) > 1:
            raise UsageError(
                f"More than one person is called @{named.group(1)}.",
                hint="Mention them so Slack turns the name into a link, or give their Slack ID.",
            )
    raise UsageError(
        f"I don't know who {raw!r} is.",
        hint="Mention the person (pick them from Slack's @ list) or give their Slack ID, "
        "e.g. U0123ABC.",
    )


def allow(rt: Runtime, caller: Caller, instance_name: str, person: str) -> AccessChange:
    """Let ``person`` run and cancel jobs on the instance. Owner or admin only; idempotent.
    Raises NotFound, NotAuthorized, UsageError."""
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, instance_name)
        access.require_owner_or_admin(rt, caller, inst, action="give people access to")
        person_id, display = parse_person(session, person)
        if person_id == inst.owner_id:
            raise UsageError(
                f"<@{person_id}> owns {inst.name} and may already run jobs on it.",
                hint="Name someone else.",
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
        person_id, _ = parse_person(session, person)
        if person_id == inst.owner_id:
            raise UsageError(
                f"<@{person_id}> owns {inst.name}; the owner always has access.",
                hint="Name someone the owner allowed.",
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
