"""Who may do what: everyone reads; the owner or an admin changes an instance; the owner, the
people the owner allowed (InstanceAccess) and admins run and cancel jobs."""

from __future__ import annotations

from sqlmodel import Session, select

from bot.commands.registry import Caller
from bot.errors import NotAuthorized
from bot.runtime import Runtime
from bot.store.models import Instance, InstanceAccess


def is_admin(rt: Runtime, caller: Caller) -> bool:
    """Whether the caller is listed in GPUBOT_ADMINS."""
    return rt.settings.is_admin(caller.user_id)


def is_owner(caller: Caller, instance: Instance) -> bool:
    """Whether the caller owns the instance."""
    return caller.user_id == instance.owner_id


def require_owner_or_admin(
    rt: Runtime, caller: Caller, instance: Instance, *, action: str = "change"
) -> None:
    """Raise NotAuthorized unless the caller owns the instance or is an admin.

    ``action`` completes the sentence "only the owner ... can <action> it"."""
    if is_owner(caller, instance) or is_admin(rt, caller):
        return
    raise NotAuthorized(
        f"Only <@{instance.owner_id}> (the owner of {instance.name}) or an admin can {action} it.",
        hint=f"Ask <@{instance.owner_id}> or an admin to do it.",
    )


def can_operate(
    rt: Runtime, caller: Caller, instance: Instance, session: Session | None = None
) -> bool:
    """Whether the caller may run and cancel jobs: the owner, an admin, or someone the owner
    allowed. Reads InstanceAccess in ``session`` (or a short session of its own)."""
    if is_owner(caller, instance) or is_admin(rt, caller):
        return True
    if instance.id is None:
        return False
    if session is not None:
        return _granted(session, instance.id, caller.user_id)
    with rt.db.session() as own:
        return _granted(own, instance.id, caller.user_id)


def require_operate(
    rt: Runtime, caller: Caller, instance: Instance, session: Session | None = None
) -> None:
    """Raise NotAuthorized unless :func:`can_operate`."""
    if can_operate(rt, caller, instance, session):
        return
    raise NotAuthorized(
        f"Only <@{instance.owner_id}> (the owner of {instance.name}), the people they allowed, "
        "or an admin can run jobs on it.",
        hint=f"Ask <@{instance.owner_id}> to give you access.",
    )


def _granted(session: Session, instance_id: int, user_id: str) -> bool:
    row = session.exec(
        select(InstanceAccess.id).where(
            InstanceAccess.instance_id == instance_id, InstanceAccess.person_id == user_id
        )
    ).first()
    return row is not None
