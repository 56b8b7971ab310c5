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
from bot.i18n import N_, t
from bot.runtime import Runtime
from bot.store.models import Instance, InstanceAccess

LOCAL_NAME = "local"
#: A Slack member ID: ``U`` or ``W`` and upper-case letters and digits, 3 to 64 characters in
#: all (Slack's own are 9 to 11). The one rule for an ID typed bare and one inside a mention.
_MEMBER_ID = r"[UW][A-Z0-9]{2,63}"
#: A Slack user mention as Slack sends it: ``<@U123|name>`` or ``<@U123>``.
_MENTION = re.compile(rf"<@({_MEMBER_ID})(?:\|([^>]*))?>")
#: A member ID typed bare, an ``@`` before it allowed.
_BARE_MEMBER_ID = re.compile(rf"@?({_MEMBER_ID})")

#: What :func:`require_owner_or_admin` says, by the ``action`` its callers pass (whole
#: sentences, so that each language can order its words).
_OWNER_OR_ADMIN: dict[str, str] = {
    "change": N_("Only <@{owner}> (the owner of {name}) or an admin can change it."),
    "extend": N_("Only <@{owner}> (the owner of {name}) or an admin can extend it."),
    "release": N_("Only <@{owner}> (the owner of {name}) or an admin can release it."),
    "stop": N_("Only <@{owner}> (the owner of {name}) or an admin can stop it."),
    "give people access to": N_(
        "Only <@{owner}> (the owner of {name}) or an admin can give people access to it."
    ),
    "take access away on": N_(
        "Only <@{owner}> (the owner of {name}) or an admin can take access away on it."
    ),
    "change the policy of": N_(
        "Only <@{owner}> (the owner of {name}) or an admin can change the policy of it."
    ),
    "answer prompts about": N_(
        "Only <@{owner}> (the owner of {name}) or an admin can answer prompts about it."
    ),
    "confirm it is released": N_(
        "Only <@{owner}> (the owner of {name}) or an admin can confirm it is released."
    ),
}
#: What :func:`require_operate` says, by its ``action`` (``{name}``: the instance's name).
_OPERATE: dict[str, str] = {
    "run jobs on it": N_(
        "Only <@{owner}> (the owner of {name}), the people they allowed, or an admin can run "
        "jobs on it."
    ),
    "read the logs of jobs on {name}": N_(
        "Only <@{owner}> (the owner of {name}), the people they allowed, or an admin can read "
        "the logs of jobs on {name}."
    ),
    "cancel jobs on {name}": N_(
        "Only <@{owner}> (the owner of {name}), the people they allowed, or an admin can "
        "cancel jobs on {name}."
    ),
    "run the full health check on {name}": N_(
        "Only <@{owner}> (the owner of {name}), the people they allowed, or an admin can run "
        "the full health check on {name}."
    ),
}

#: What an instance's state is called in a sentence (``{name} is <state>``).
_STATE_WORDS: dict[str, str] = {
    "registering": N_("registering"),
    "active": N_("active"),
    "releasing": N_("releasing"),
    "awaiting_confirmation": N_("awaiting confirmation"),
    "released": N_("released"),
    "stopped": N_("stopped"),
    "lost": N_("lost"),
}


@dataclass(frozen=True)
class Caller:
    """Who typed or clicked (a Slack user ID), where (a channel ID), and their display name.
    ``linked_id``: the Feishu identity they spoke as, when an admin linked it to ``user_id``
    (bot.services.speaking.identities)."""

    user_id: str
    channel_id: str | None = None
    user_name: str | None = None
    linked_id: str | None = None


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
    """Whether the caller is listed in GPUBOT_ADMINS (or, by the Feishu identity linked to
    them, in GPUBOT_FEISHU_ADMINS)."""
    if caller.linked_id is not None and rt.settings.is_admin(caller.linked_id):
        return True
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
            t(
                "local means the machine the bot runs on, which can be used only from the "
                "bot's own console."
            ),
            hint=t(
                "Register a rented instance by its address, like root@203.0.113.7:22, under "
                "another name."
            ),
        )
    if (name == LOCAL_NAME) != (host == LOCAL_HOST):
        raise UsageError(
            t(
                "The name local and the address local go together: they mean the machine the "
                "bot runs on."
            ),
            hint=t("Use another name for a remote instance."),
        )


def require_owner_or_admin(
    rt: Runtime, caller: Caller, instance: Instance, *, action: str = "change"
) -> None:
    """Raise NotAuthorized unless the caller owns the instance or is an admin.

    ``action`` completes the sentence "only the owner ... can <action> it" (in English, or
    as the active language has it)."""
    if is_owner(caller, instance) or is_admin(rt, caller):
        return
    owner, name = instance.owner_id, instance.name
    sentence = _sentence_for(_OWNER_OR_ADMIN, action, name)
    raise NotAuthorized(
        t(sentence, owner=owner, name=name)
        if sentence
        else t(
            "Only <@{owner}> (the owner of {name}) or an admin can {action} it.",
            owner=owner,
            name=name,
            action=action,
        ),
        hint=t("Ask <@{owner}> or an admin to do it.", owner=owner),
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
    owner, name = instance.owner_id, instance.name
    sentence = _sentence_for(_OPERATE, action, name)
    raise NotAuthorized(
        t(sentence, owner=owner, name=name)
        if sentence
        else t(
            "Only <@{owner}> (the owner of {name}), the people they allowed, or an admin can "
            "{action}.",
            owner=owner,
            name=name,
            action=action,
        ),
        hint=t(
            "Ask <@{owner}> to give you access (`/gpu allow {name} <@{caller}>`).",
            owner=owner,
            name=name,
            caller=caller.user_id,
        ),
    )


def _sentence_for(sentences: dict[str, str], action: str, name: str) -> str | None:
    """The whole sentence for ``action`` (as typed in English, or already in the active
    language), or None for an action the table does not hold."""
    for key, sentence in sentences.items():
        if action in (key.format(name=name), t(key, name=name)):
            return sentence
    return None


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
        first, second = holders[0], holders[1]
        raise Conflict(
            t(
                "This machine is already registered twice, as {first} (<@{first_owner}>) and "
                "{second} (<@{second_owner}>).",
                first=first.name,
                first_owner=first.owner_id,
                second=second.name,
                second_owner=second.owner_id,
            ),
            hint=t("Release one of them first (its owner or an admin can)."),
        )
    holder = holders[0]
    if is_owner(caller, holder) or is_admin(rt, caller):
        return holder
    raise Conflict(
        t(
            "This machine is already registered as {name}, held by <@{owner}>.",
            name=holder.name,
            owner=holder.owner_id,
        ),
        hint=t(
            "Ask <@{owner}> to allow you on it (`/gpu allow {name} <@{caller}>`) or to release "
            "it first.",
            owner=holder.owner_id,
            name=holder.name,
            caller=caller.user_id,
        ),
    )


def require_awaiting_confirmation(instance: Instance, is_manual: bool, is_open: bool) -> None:
    """Raise Conflict unless the instance is a manual one whose release is open, waiting for
    "Released on the platform" (an API platform's meter stops only when the platform says so)."""
    name = instance.name
    if not is_manual:
        raise Conflict(
            t(
                "{name} runs on {provider}, whose API says when it is released; the bot stops "
                "its meter then.",
                name=name,
                provider=instance.provider,
            ),
            hint=t("Use `/gpu release {name}` to release it.", name=name),
        )
    if not is_open or instance.state not in ("releasing", "awaiting_confirmation"):
        raise Conflict(
            t(
                "{name} is {state}; no release of it is waiting for your confirmation.",
                name=name,
                state=state_words(instance.state),
            ),
            hint=t("Use `/gpu release {name}` first; the bot then asks you to confirm.", name=name),
        )


def state_words(state: str) -> str:
    """An instance state as words in the active language (``awaiting confirmation``)."""
    words = _STATE_WORDS.get(state)
    return t(words) if words else state.replace("_", " ")


def parse_mention(text: str) -> tuple[str, str | None] | None:
    """A Slack user mention ``<@U123|name>`` or ``<@U123>`` as (Slack ID, the display name it
    carries or None); None when ``text`` (spaces around it aside) is not one."""
    found = _MENTION.fullmatch(text.strip())
    if found is None:
        return None
    return found.group(1), (found.group(2) or None)


def parse_member_id(text: str) -> str | None:
    """A Slack member ID typed bare, ``U0123ABC`` or ``@U0123ABC`` (spaces around it aside), as
    the ID; None when ``text`` is not one. Mentions are :func:`parse_mention`'s."""
    found = _BARE_MEMBER_ID.fullmatch(text.strip())
    return found.group(1) if found is not None else None


def _granted(session: Session, instance_id: int, user_id: str) -> bool:
    row = session.exec(
        select(InstanceAccess.id).where(
            InstanceAccess.instance_id == instance_id, InstanceAccess.person_id == user_id
        )
    ).first()
    return row is not None
