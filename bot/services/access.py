"""The trust model: who may touch which machine. Every service asks here; the store backs it.

1. **``local`` exists only in the console.** The bot's own machine is the instance ``local``
   only where the runtime serves the local console (``Runtime.console``). Anywhere else (Slack,
   HTTP or Socket Mode) a lookup of it, by name, id or job, answers as for an instance that does
   not exist, lists leave it out, registering it is refused, and the fleet has no transport for
   it (:class:`bot.errors.LocalRefused`).
2. **A machine has one live registration and one owner.** Its identity is its pinned host key,
   its ``(host, port, user)`` and, where it has one, its ``(provider, provider id)``. A second
   registration of a machine that is held, under any name, is refused and names the holder,
   unless the holder's owner or an admin makes it: then it is a re-registration (the same name)
   or a rename (another name) of that one registration. Partial unique indexes on live rows
   (``bot.store.models.Instance``) make this hold when two registrations race.
3. **Changes are the owner's or an admin's:** re-register, rename, extend, release, policy,
   allow and deny. A re-registration is a change like ``extend``: a later deadline passes the
   same budget and lifetime-cap checks, and new billing rules apply from that moment only.
4. **Jobs, and reads that can leak or disturb, are for the owner, the people the owner allowed
   (``/gpu allow``) and admins:** run, cancel, logs (job output often holds secrets) and
   ``health --full`` (benchmarks that load the GPUs). Each registration keeps its own agent home
   on the instance, so a job id belongs to one registration and two registrations never see
   each other's jobs.
5. **Everyone may read the rest:** status, list, the quick health check, the job list, who.
6. **The "Released on the platform" confirmation** stops the meter only of a ``manual``
   instance that awaits it, and only for its owner or an admin.
7. **Keys by name** (bot.fleet.keys): ``--key NAME`` picks a key from the admins' directory.

Checks run in the same transaction as the change they guard; the changes themselves are
conditional updates where a concurrent change could slip between.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_
from sqlmodel import Session, col, select

from bot.errors import Conflict, NotAuthorized, UsageError
from bot.fleet.base import LOCAL_HOST
from bot.runtime import Runtime
from bot.store.models import Instance, InstanceAccess

LOCAL_NAME = "local"
#: A Slack user mention as Slack sends it: ``<@U123|name>`` or ``<@U123>``.
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|([^>]*))?>")


@dataclass(frozen=True)
class Caller:
    """Who typed or clicked (a Slack user ID), where (a channel ID), and their display name."""

    user_id: str
    channel_id: str | None = None
    user_name: str | None = None


@dataclass(frozen=True)
class MachineIdentity:
    """What makes two registrations the same machine (any one of these matching)."""

    host: str
    port: int
    user: str
    host_key_fingerprint: str | None = None
    provider: str | None = None
    provider_id: str | None = None


def is_admin(rt: Runtime, caller: Caller) -> bool:
    """Whether the caller is listed in GPUBOT_ADMINS."""
    return rt.settings.is_admin(caller.user_id)


def is_owner(caller: Caller, instance: Instance) -> bool:
    """Whether the caller owns the instance."""
    return caller.user_id == instance.owner_id


def is_local(instance: Instance) -> bool:
    """Whether the row is the bot's own machine."""
    return instance.host == LOCAL_HOST


def visible(rt: Runtime, instance: Instance | None) -> Instance | None:
    """``instance``, or None when this runtime must not see it (``local`` outside the
    console)."""
    if instance is None or (is_local(instance) and not rt.console):
        return None
    return instance


def visible_clause(rt: Runtime) -> Any:
    """A WHERE clause that leaves out what this runtime must not see (always true in the
    console)."""
    if rt.console:
        return col(Instance.id).is_not(None)
    return col(Instance.host) != LOCAL_HOST


def refuse_local(rt: Runtime, name: str, host: str) -> None:
    """Raise NotAuthorized when a registration names the bot's own machine outside the console;
    in the console, UsageError unless the name ``local`` goes with the address ``local``."""
    wants_local = name == LOCAL_NAME or host == LOCAL_HOST
    if wants_local and not rt.console:
        raise NotAuthorized(
            "local means the machine the bot runs on, which can be used only from the bot's "
            "own console.",
            hint="Register a rented instance by its address, like root@203.0.113.7:22, under "
            "another name.",
        )
    if (name == LOCAL_NAME) != (host == LOCAL_HOST):
        raise UsageError(
            "The name local and the address local go together: they mean the machine the bot "
            "runs on.",
            hint="Use another name for a remote instance.",
        )


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
    """Whether the caller may run and cancel jobs, read their logs and run the full health
    check: the owner, an admin, or someone the owner allowed. Reads InstanceAccess in
    ``session`` (or a short session of its own)."""
    if is_owner(caller, instance) or is_admin(rt, caller):
        return True
    if instance.id is None:
        return False
    if session is not None:
        return _granted(session, instance.id, caller.user_id)
    with rt.db.session() as own:
        return _granted(own, instance.id, caller.user_id)


def require_operate(
    rt: Runtime,
    caller: Caller,
    instance: Instance,
    session: Session | None = None,
    *,
    action: str = "run jobs on it",
) -> None:
    """Raise NotAuthorized unless :func:`can_operate`; ``action`` ends "... can <action>"."""
    if can_operate(rt, caller, instance, session):
        return
    raise NotAuthorized(
        f"Only <@{instance.owner_id}> (the owner of {instance.name}), the people they allowed, "
        f"or an admin can {action}.",
        hint=f"Ask <@{instance.owner_id}> to give you access (`/gpu allow {instance.name} "
        f"<@{caller.user_id}>`).",
    )


def machine_holders(
    session: Session, identity: MachineIdentity, *, exclude_id: int | None = None
) -> list[Instance]:
    """The live registrations that are this machine by any of its identities, oldest first."""
    same = [
        and_(
            col(Instance.host) == identity.host,
            col(Instance.port) == identity.port,
            col(Instance.ssh_user) == identity.user,
        )
    ]
    if identity.host_key_fingerprint:
        same.append(col(Instance.host_key_fingerprint) == identity.host_key_fingerprint)
    if identity.provider and identity.provider_id:
        same.append(
            and_(
                col(Instance.provider) == identity.provider,
                col(Instance.provider_instance_id) == identity.provider_id,
            )
        )
    query = select(Instance).where(col(Instance.state) != "released", or_(*same))
    if exclude_id is not None:
        query = query.where(col(Instance.id) != exclude_id)
    return list(session.exec(query.order_by(col(Instance.id))).all())


def holder_for_registration(
    rt: Runtime, caller: Caller, holders: Sequence[Instance], name: str
) -> Instance | None:
    """Which live registration a registration of this machine under ``name`` changes: None for
    a machine nobody holds; the holder when the caller owns it or is an admin (a
    re-registration or a rename). Raises Conflict naming the holder otherwise, or when the
    machine's identities point at two registrations."""
    if not holders:
        return None
    if len(holders) > 1:
        names = " and ".join(f"{h.name} (<@{h.owner_id}>)" for h in holders[:2])
        raise Conflict(
            f"This machine is already registered twice, as {names}.",
            hint="Release one of them first (its owner or an admin can).",
        )
    holder = holders[0]
    if is_owner(caller, holder) or is_admin(rt, caller):
        return holder
    raise Conflict(
        f"This machine is already registered as {holder.name}, held by <@{holder.owner_id}>.",
        hint=f"Ask <@{holder.owner_id}> to allow you on it (`/gpu allow {holder.name} "
        f"<@{caller.user_id}>`) or to release it first.",
    )


def require_awaiting_confirmation(instance: Instance, is_manual: bool, is_open: bool) -> None:
    """Raise Conflict unless the instance is a manual one whose release is open, waiting for
    "Released on the platform" (an API platform's meter stops only when the platform says so)."""
    if not is_manual:
        raise Conflict(
            f"{instance.name} runs on {instance.provider}, whose API says when it is released; "
            "the bot stops its meter then.",
            hint=f"Use `/gpu release {instance.name}` to release it.",
        )
    if not is_open or instance.state not in ("releasing", "awaiting_confirmation"):
        state = instance.state.replace("_", " ")
        raise Conflict(
            f"{instance.name} is {state}; no release of it is waiting for your confirmation.",
            hint=f"Use `/gpu release {instance.name}` first; the bot then asks you to confirm.",
        )


def parse_mention(text: str) -> tuple[str, str | None] | None:
    """A Slack user mention ``<@U123|name>`` or ``<@U123>`` as (Slack ID, the display name it
    carries or None); None when ``text`` (spaces around it aside) is not one."""
    found = _MENTION.fullmatch(text.strip())
    if found is None:
        return None
    return found.group(1), (found.group(2) or None)


def _granted(session: Session, instance_id: int, user_id: str) -> bool:
    row = session.exec(
        select(InstanceAccess.id).where(
            InstanceAccess.instance_id == instance_id, InstanceAccess.person_id == user_id
        )
    ).first()
    return row is not None
