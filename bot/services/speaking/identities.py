"""One person on two platforms: an admin links a Feishu identity to a Slack ID.

A Feishu person is ``feishu:ou_...`` and a Slack one ``U...``; to the bot they are two people
until an admin links them (``/gpu link @slack-person feishu:ou_...``). From then on:

- **The Slack ID is the person.** A command or click from the linked Feishu identity runs for
  a caller whose ``user_id`` is the Slack ID (:func:`resolve`), with the Feishu identity kept as
  ``linked_id``: what the person owns, is allowed on and spends is counted under one ID, so an
  instance registered from Slack is extended or released from Feishu and the other way round,
  and a budget counts both once. An admin on either platform is an admin on both.
- **What the Feishu identity held moves to the Slack ID when linked**: its instances (released
  ones too, so this month's spend counts once) and the access it was given on others'.
  Unlinking moves nothing back: the Feishu identity is a person of its own again, holding
  nothing, and what was done under the link stays with the Slack ID.
- **Only an admin links or unlinks**, each change audited. A Feishu identity links to one Slack
  ID and a Slack ID to one Feishu identity; linking either elsewhere is refused until it is
  unlinked, so a link can never hand one person's instances to a third.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sqlalchemy import delete, update
from sqlalchemy import exc as sa_exc
from sqlmodel import Session, col, select

from bot.errors import Conflict, GpubotError, NotAuthorized, UsageError
from bot.i18n import t
from bot.services import access
from bot.services.access import Caller
from bot.services.speaking import audit
from bot.services.speaking.people import resolve_person
from bot.settings import FEISHU_USER_PREFIX
from bot.store.models import IdentityLink, Instance, InstanceAccess, Person

if TYPE_CHECKING:
    from bot.runtime import Runtime

log = logging.getLogger(__name__)

#: A Feishu person as typed: ``feishu:ou_...`` or ``ou_...``.
_FEISHU_ID = re.compile(r"(?:feishu[:])?(ou_[A-Za-z0-9_-]{1,60})")


@dataclass(frozen=True)
class LinkChange:
    """A link made (``linked``) or removed between ``slack_id`` and ``feishu_id``;
    ``changed`` False when it already was so; ``moved`` the instances moved to the Slack ID."""

    slack_id: str
    feishu_id: str
    linked: bool
    changed: bool
    moved: int = 0


@dataclass(frozen=True)
class LinkView:
    """One link, for the admins' listing."""

    slack_id: str
    feishu_id: str
    linked_by: str


def link(rt: Runtime, caller: Caller, slack: str, feishu: str) -> LinkChange:
    """Link the Feishu identity ``feishu`` to the Slack person ``slack`` (as typed). Admin only;
    idempotent; audited. Raises NotAuthorized, UsageError (not a Feishu or Slack person),
    Conflict (either is linked to someone else), StoreError."""
    _require_admin(rt, caller)
    feishu_id = feishu_id_of(feishu)
    now = rt.now()
    with rt.db.session() as session:
        slack_id = _slack_id_of(session, slack, caller)
        by_feishu = session.get(IdentityLink, feishu_id)
        by_slack = session.exec(
            select(IdentityLink).where(IdentityLink.slack_id == slack_id)
        ).first()
        if by_feishu is not None and by_feishu.slack_id == slack_id:
            return LinkChange(slack_id, feishu_id, linked=True, changed=False)
        taken = by_feishu or by_slack
        if taken is not None:
            raise Conflict(
                t(
                    "{feishu} is linked to <@{slack}> already.",
                    feishu=taken.feishu_id,
                    slack=taken.slack_id,
                ),
                hint=t("Unlink it first: `/gpu unlink {feishu}`.", feishu=taken.feishu_id),
            )
        _ensure_person(session, slack_id)
        session.add(
            IdentityLink(
                feishu_id=feishu_id, slack_id=slack_id, linked_by=caller.user_id, linked_at=now
            )
        )
        moved = _move_holdings(session, feishu_id, slack_id)
        audit.record(
            session,
            caller.user_id,
            "identity.link",
            None,
            at=now,
            slack=slack_id,
            feishu=feishu_id,
            moved=moved,
        )
    return LinkChange(slack_id, feishu_id, linked=True, changed=True, moved=moved)


def unlink(rt: Runtime, caller: Caller, who: str) -> LinkChange:
    """Remove the link of ``who`` (its Feishu identity or its Slack person, as typed). Admin
    only; audited. Raises NotAuthorized, UsageError (no such link, or nobody), StoreError."""
    _require_admin(rt, caller)
    now = rt.now()
    with rt.db.session() as session:
        row = _link_of(session, who, caller)
        if row is None:
            raise UsageError(t("{who} is not linked.", who=who.strip()[:80]))
        slack_id, feishu_id = row.slack_id, row.feishu_id
        session.exec(delete(IdentityLink).where(col(IdentityLink.feishu_id) == feishu_id))
        audit.record(
            session,
            caller.user_id,
            "identity.unlink",
            None,
            at=now,
            slack=slack_id,
            feishu=feishu_id,
        )
    return LinkChange(slack_id, feishu_id, linked=False, changed=True)


def links(rt: Runtime, caller: Caller) -> tuple[LinkView, ...]:
    """Every link, by Slack ID. Admin only. Raises NotAuthorized, StoreError."""
    _require_admin(rt, caller)
    with rt.db.session() as session:
        rows = session.exec(select(IdentityLink).order_by(col(IdentityLink.slack_id))).all()
        return tuple(LinkView(r.slack_id, r.feishu_id, r.linked_by) for r in rows)


def resolve(rt: Runtime, caller: Caller) -> Caller:
    """``caller`` as the bot treats them: a linked Feishu identity as its Slack ID (the Feishu
    one kept as ``linked_id``), anyone else unchanged. When the store cannot say, the caller is
    left as they are (with no more rights than their own identity has), with a warning."""
    if not caller.user_id.startswith(FEISHU_USER_PREFIX):
        return caller
    try:
        slack_id = slack_of(rt, caller.user_id)
    except GpubotError as exc:
        log.warning("could not read the link of %s: %s", caller.user_id, exc)
        return caller
    if slack_id is None:
        return caller
    return replace(caller, user_id=slack_id, linked_id=caller.user_id)


def slack_of(rt: Runtime, feishu_id: str) -> str | None:
    """The Slack ID linked to ``feishu_id``, or None. Raises StoreError."""
    with rt.db.session() as session:
        row = session.get(IdentityLink, feishu_id)
        return None if row is None else row.slack_id


def feishu_of(rt: Runtime, slack_id: str) -> str | None:
    """The Feishu identity linked to ``slack_id``, or None. Raises StoreError."""
    with rt.db.session() as session:
        return session.exec(
            select(IdentityLink.feishu_id).where(IdentityLink.slack_id == slack_id)
        ).first()


def feishu_id_of(text: str) -> str:
    """``feishu:ou_...`` from ``ou_...`` or ``feishu:ou_...``. Raises UsageError otherwise."""
    found = _FEISHU_ID.fullmatch(text.strip())
    if found is None:
        raise UsageError(
            t(
                "{text} is not a Feishu person; give their open_id, like feishu:ou_1a2b.",
                text=text.strip()[:80],
            )
        )
    return FEISHU_USER_PREFIX + found.group(1)


def _slack_id_of(session: Session, text: str, caller: Caller) -> str:
    person, _ = resolve_person(session, text, caller=caller)
    if person.startswith(FEISHU_USER_PREFIX):
        raise UsageError(t("{text} is not a Slack person.", text=text.strip()[:80]))
    return person


def _link_of(session: Session, who: str, caller: Caller) -> IdentityLink | None:
    if _FEISHU_ID.fullmatch(who.strip()):
        return session.get(IdentityLink, feishu_id_of(who))
    slack_id = _slack_id_of(session, who, caller)
    return session.exec(select(IdentityLink).where(IdentityLink.slack_id == slack_id)).first()


def _move_holdings(session: Session, feishu_id: str, slack_id: str) -> int:
    """Move the Feishu identity's instances and access to the Slack ID; the instances moved."""
    moved = session.exec(
        update(Instance).where(col(Instance.owner_id) == feishu_id).values(owner_id=slack_id)
    ).rowcount
    held = set(
        session.exec(
            select(InstanceAccess.instance_id).where(InstanceAccess.person_id == slack_id)
        ).all()
    )
    for grant in session.exec(
        select(InstanceAccess).where(InstanceAccess.person_id == feishu_id)
    ).all():
        if grant.instance_id in held:
            session.delete(grant)
        else:
            grant.person_id = slack_id
            session.add(grant)
    return int(moved or 0)


def _ensure_person(session: Session, slack_id: str) -> None:
    """Add the Slack person if unknown (a concurrent insert is fine): their instances point
    at them."""
    if session.get(Person, slack_id) is not None:
        return
    try:
        with session.begin_nested():
            session.add(Person(slack_id=slack_id))
    except sa_exc.IntegrityError:
        if session.get(Person, slack_id) is None:
            raise


def _require_admin(rt: Runtime, caller: Caller) -> None:
    if not access.is_admin(rt, caller):
        raise NotAuthorized(t("Only an admin links a person's Feishu and Slack identities."))
