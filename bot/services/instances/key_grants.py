"""Who may use which SSH key of the key directory (GPUBOT_SSH_KEY_DIR).

An admin grants a key to a person (``/gpu keys allow KEY @person``) and takes it back
(``/gpu keys revoke KEY @person``); ``/gpu keys`` lists the keys and who holds each, to admins
only. A member registers with ``--key NAME`` only for a key granted to them; admins use any.
The bot's default key (GPUBOT_SSH_KEY, used when ``--key`` is left out) stays everyone's. The
names of the keys are shown to admins alone: a member asking for a key that is not there, or
not theirs, gets one answer that names no key. Every grant and revocation is audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session, col, select

from bot.errors import NotAuthorized
from bot.fleet import keys
from bot.i18n import t
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances.lookup import ensure_person
from bot.services.speaking import audit
from bot.services.speaking.people import resolve_person
from bot.store.models import KeyGrant


@dataclass(frozen=True)
class KeyChange:
    """A grant made (``granted``) or taken back; ``changed`` is False when it was already so."""

    key_name: str
    person_id: str
    granted: bool
    changed: bool


@dataclass(frozen=True)
class KeyHolders:
    """One key of the directory and the Slack IDs of the people it is granted to."""

    key_name: str
    people: tuple[str, ...]


@dataclass(frozen=True)
class KeyListView:
    """``/gpu keys``: every key of the directory with its holders; ``granted_missing`` are keys
    granted to someone that are no longer in the directory."""

    keys: tuple[KeyHolders, ...]
    granted_missing: tuple[KeyHolders, ...] = ()


def usable_key(rt: Runtime, caller: Caller, name: str) -> Path:
    """The private key ``name`` for ``caller``: any key of the directory for an admin, a key
    granted to them for anyone else. Raises UsageError; to a member the same words whether the
    key is missing or not theirs, and never the names of other keys."""
    keys.check_key_name(name)
    if access.is_admin(rt, caller):
        return keys.key_path(rt.settings, name, names_shown=True)
    with rt.db.session() as session:
        granted = _grant(session, name, caller.user_id) is not None
    if not granted:
        raise keys.no_such_key(name)
    return keys.key_path(rt.settings, name)


def allow(rt: Runtime, caller: Caller, key_name: str, person: str) -> KeyChange:
    """Let ``person`` register with the key ``key_name``. Admin only; idempotent; audited.
    Raises NotAuthorized, UsageError (no such key in the directory, nobody by that name)."""
    _require_admin(rt, caller)
    keys.key_path(rt.settings, key_name, names_shown=True)
    with rt.db.session() as session:
        person_id, display = resolve_person(session, person, caller=caller)
        changed = _grant(session, key_name, person_id) is None
        if changed:
            ensure_person(session, person_id, display)
            session.add(
                KeyGrant(
                    key_name=key_name,
                    person_id=person_id,
                    granted_by=caller.user_id,
                    granted_at=rt.now(),
                )
            )
            audit.record(
                session,
                caller.user_id,
                "key.allow",
                None,
                at=rt.now(),
                key=key_name,
                person=person_id,
            )
    return KeyChange(key_name, person_id, granted=True, changed=changed)


def revoke(rt: Runtime, caller: Caller, key_name: str, person: str) -> KeyChange:
    """Take the key ``key_name`` back from ``person`` (instances already registered with it
    keep it). Admin only; idempotent; audited. Raises NotAuthorized, UsageError."""
    _require_admin(rt, caller)
    keys.check_key_name(key_name)
    with rt.db.session() as session:
        person_id, _display = resolve_person(session, person, caller=caller)
        row = _grant(session, key_name, person_id)
        if row is not None:
            session.delete(row)
            audit.record(
                session,
                caller.user_id,
                "key.revoke",
                None,
                at=rt.now(),
                key=key_name,
                person=person_id,
            )
    return KeyChange(key_name, person_id, granted=False, changed=row is not None)


def listing(rt: Runtime, caller: Caller) -> KeyListView:
    """Every key of the directory and who may use it. Admin only. Raises NotAuthorized."""
    _require_admin(rt, caller)
    names = keys.key_names(rt.settings)
    with rt.db.session() as session:
        rows = session.exec(
            select(KeyGrant).order_by(col(KeyGrant.key_name), col(KeyGrant.granted_at))
        ).all()
    holders: dict[str, list[str]] = {}
    for row in rows:
        holders.setdefault(row.key_name, []).append(row.person_id)
    return KeyListView(
        keys=tuple(KeyHolders(name, tuple(holders.get(name, ()))) for name in names),
        granted_missing=tuple(
            KeyHolders(name, tuple(people))
            for name, people in sorted(holders.items())
            if name not in names
        ),
    )


def _require_admin(rt: Runtime, caller: Caller) -> None:
    if not access.is_admin(rt, caller):
        raise NotAuthorized(t("Only an admin decides who may use which SSH key."))


def _grant(session: Session, key_name: str, person_id: str) -> KeyGrant | None:
    return session.exec(
        select(KeyGrant).where(KeyGrant.key_name == key_name, KeyGrant.person_id == person_id)
    ).first()
