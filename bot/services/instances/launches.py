"""The launch engine: one Launch row per instance `/gpu rent` asks a platform for, moved from
state to state by conditional UPDATEs in short transactions (never a platform call inside one).

States (``bot.store.models.Launch``)::

    launching -> launched | refused
    launched  -> checked -> adopted
    launched | checked -> orphaned -> terminated
    launching (no answer) -> orphaned (found on the platform) | terminated (nothing started)

The renting process holds its rows (``holder``) with a lease (``lease_until``): while the launch
call runs, until ``LAUNCH_CALL`` after it began (the call cannot outlast it, and the platform's
list has caught up by then); from the answer on, ``CLAIM_LEASE_S`` renewed every
``CLAIM_HEARTBEAT_S`` by :func:`holding`, so a process killed with ``kill -9`` loses its rows
within ``CLAIM_LEASE_S``. Orphan recovery is a query (:func:`due_clause`): the rows in launching,
launched, checked or orphaned whose lease has run out. A process takes such a row with
:func:`claim_orphan` or :func:`claim_unanswered`, a conditional UPDATE only one process wins, so
two bot processes never both adopt or both terminate one instance.

Every move is checked against the mover's ``holder`` token: a holder that lost its lease (taken
over) moves nothing. The audit log only records what happened.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, update
from sqlmodel import Session, col, select

from bot.errors import GpubotError
from bot.providers.base import ProviderInstance
from bot.runtime import Runtime
from bot.store.models import Instance, Launch

log = logging.getLogger(__name__)

LAUNCHING = "launching"
REFUSED = "refused"
LAUNCHED = "launched"
CHECKED = "checked"
ADOPTED = "adopted"
ORPHANED = "orphaned"
TERMINATED = "terminated"
#: Every state, in the order a launch goes through them.
STATES = (LAUNCHING, REFUSED, LAUNCHED, CHECKED, ADOPTED, ORPHANED, TERMINATED)
#: The states the renting process holds and renews while it sets the instances up.
HELD = (LAUNCHED, CHECKED)
#: The states of a rental in progress: orphan recovery takes them once their lease ran out.
IN_PROGRESS = (LAUNCHING, LAUNCHED, CHECKED, ORPHANED)
#: How long a claim holds before another process may take it over, unless renewed.
CLAIM_LEASE_S = 45
#: How often (real seconds) the renting process renews its claim while it sets instances up.
CLAIM_HEARTBEAT_S = 15.0
#: After this, a launch call without a recorded answer has ended (HTTP timeouts are far shorter).
LAUNCH_CALL = timedelta(minutes=10)
#: After a failed termination, the next try is due this many seconds later.
RETRY_S = 60


@dataclass(frozen=True)
class Claim:
    """A Launch row held by ``holder`` (a token of one claim) until ``lease_until``."""

    id: int
    launch_key: str
    position: int
    provider: str
    provider_id: str | None
    name: str | None
    renter: str
    instance_type: str
    platform_name: str
    started_at: datetime
    state: str
    reason: str | None
    told: bool
    holder: str
    lease_until: datetime


def new_holder() -> str:
    """A token naming one claim (a process's hold on some rows)."""
    return secrets.token_hex(8)


def due_clause(now: datetime) -> Any:
    """The Launch rows orphan recovery takes at ``now`` (naive UTC): in progress and past
    their lease (an indexed range per state)."""
    return and_(col(Launch.state).in_(IN_PROGRESS), col(Launch.lease_until) <= now)


def open_launch(
    session: Session,
    *,
    launch_key: str,
    provider: str,
    instance_type: str,
    platform_name: str,
    names: Sequence[str],
    renter: str,
    holder: str,
    now: datetime,
) -> None:
    """In ``session``'s transaction: one launching row per name, held by ``holder`` until the
    launch call has surely ended."""
    for position, name in enumerate(names, start=1):
        session.add(
            Launch(
                launch_key=launch_key,
                position=position,
                provider=provider,
                instance_type=instance_type,
                platform_name=platform_name,
                name=name,
                renter=renter,
                state=LAUNCHING,
                holder=holder,
                lease_until=now + LAUNCH_CALL,
                started_at=now,
                changed_at=now,
            )
        )


def record_answer(
    session: Session, launch_key: str, holder: str, provider_ids: Sequence[str], now: datetime
) -> bool:
    """In ``session``'s transaction: the platform answered with ``provider_ids`` (in the order
    of the rows): each becomes launched, held for ``CLAIM_LEASE_S``; rows it did not start are
    refused, and ids beyond the rows get rows of their own. False (nothing changed) when
    ``holder`` no longer holds the launch."""
    rows = _lock_held(session, launch_key, holder, (LAUNCHING,), now)
    if not rows:
        return False
    lease_until = now + timedelta(seconds=CLAIM_LEASE_S)
    for pos, row in enumerate(rows):
        if pos < len(provider_ids):
            _move(session, row, holder, LAUNCHED, now, provider_id=provider_ids[pos])
            row.lease_until = lease_until
        else:
            _move(session, row, None, REFUSED, now, last_error="not started by the platform")
    for provider_id in provider_ids[len(rows) :]:
        _add_like(session, rows, provider_id, LAUNCHED, holder, lease_until, now)
    return True


def record_refused(
    session: Session, launch_key: str, holder: str, error: str, now: datetime
) -> bool:
    """In ``session``'s transaction: the platform refused the launch; its rows are settled.
    False when ``holder`` no longer holds it."""
    rows = _lock_held(session, launch_key, holder, (LAUNCHING,), now)
    for row in rows:
        _move(session, row, None, REFUSED, now, last_error=error)
    return bool(rows)


def advance(rt: Runtime, launch_id: int, holder: str, to_state: str) -> bool:
    """Move a row ``holder`` holds (in launched or checked) on to checked or adopted (then
    held no more). False when it is no longer held."""
    now = rt.now()
    values: dict[str, object] = {"state": to_state, "changed_at": now}
    if to_state == ADOPTED:
        values["holder"] = None
    with rt.db.session() as session:
        won = session.exec(
            update(Launch).where(*_held_by(launch_id, holder)).values(**values)
        ).rowcount
    return bool(won == 1)


def give_up(rt: Runtime, launch_id: int, holder: str, *, reason: str) -> Claim | None:
    """The renting process will not register a row it holds (in launched or checked): it
    becomes orphaned, still held, for the renter to terminate now. None when no longer held."""
    now = rt.now()
    with rt.db.session() as session:
        won = session.exec(
            update(Launch)
            .where(*_held_by(launch_id, holder))
            .values(
                state=ORPHANED,
                reason=reason,
                lease_until=now + timedelta(seconds=CLAIM_LEASE_S),
                changed_at=now,
            )
        ).rowcount
        if won != 1:
            return None
        row = session.get(Launch, launch_id)
        assert row is not None
        return _claim_of(row)


def due(rt: Runtime, now: datetime) -> list[Launch]:
    """The rows :func:`due_clause` selects at ``now``, longest due first."""
    with rt.db.session() as session:
        return list(
            session.exec(
                select(Launch)
                .where(due_clause(now))
                .order_by(col(Launch.lease_until), col(Launch.id))
            ).all()
        )


def claim_orphan(
    rt: Runtime, row: Launch, now: datetime, holder: str, *, reason: str
) -> Claim | None:
    """Take a due row in launched, checked or orphaned (as read in ``row``): it becomes
    orphaned (``reason`` kept when it already was), held by ``holder``. None when another
    process took it first or it moved on."""
    assert row.id is not None
    lease_until = now + timedelta(seconds=CLAIM_LEASE_S)
    keep = row.reason if row.state == ORPHANED and row.reason else reason
    with rt.db.session() as session:
        won = session.exec(
            update(Launch)
            .where(
                col(Launch.id) == row.id,
                col(Launch.state) == row.state,
                col(Launch.lease_until) == row.lease_until,
                col(Launch.lease_until) <= now,
            )
            .values(
                state=ORPHANED, holder=holder, lease_until=lease_until, reason=keep, changed_at=now
            )
        ).rowcount
        if won != 1:
            return None
        taken = session.get(Launch, row.id)
        assert taken is not None
        return _claim_of(taken)


def claim_unanswered(rt: Runtime, launch_key: str, now: datetime, holder: str) -> list[Claim]:
    """Take every row of a launch whose call never answered and has surely ended (launching,
    past its lease), held by ``holder``; [] when another process took it first."""
    lease_until = now + timedelta(seconds=CLAIM_LEASE_S)
    with rt.db.session() as session:
        won = session.exec(
            update(Launch)
            .where(
                col(Launch.launch_key) == launch_key,
                col(Launch.state) == LAUNCHING,
                col(Launch.lease_until) <= now,
            )
            .values(holder=holder, lease_until=lease_until, changed_at=now)
        ).rowcount
        if not won:
            return []
        return [_claim_of(r) for r in _held_rows(session, launch_key, holder, (LAUNCHING,))]


def found_unanswered(
    session: Session,
    claims: Sequence[Claim],
    provider_ids: Sequence[str],
    now: datetime,
    *,
    reason: str,
) -> list[Claim]:
    """In ``session``'s transaction: what a launch that never answered started, as found on its
    platform. Its rows take the ids found, in order, and become orphaned (still held); rows
    left over are terminated (nothing started). Returns the orphans to terminate."""
    if not claims:
        return []
    holder = claims[0].holder
    rows = _lock_held(session, claims[0].launch_key, holder, (LAUNCHING,), now)
    orphans: list[Claim] = []
    for pos, row in enumerate(rows):
        if pos < len(provider_ids):
            _move(session, row, holder, ORPHANED, now, provider_id=provider_ids[pos])
            row.reason = reason
            orphans.append(_claim_of(row))
        else:
            _move(session, row, None, TERMINATED, now, last_error="nothing started")
    if rows:
        lease_until = claims[0].lease_until
        for provider_id in provider_ids[len(rows) :]:
            extra = _add_like(session, rows, provider_id, ORPHANED, holder, lease_until, now)
            extra.reason = reason
            orphans.append(_claim_of(extra))
    session.flush()
    return orphans


def registered(rt: Runtime, claim: Claim) -> bool:
    """Whether the claimed instance was registered after all (then it is no orphan)."""
    if claim.provider_id is None:
        return False
    with rt.db.session() as session:
        found = session.exec(
            select(Instance.id).where(
                Instance.provider == claim.provider,
                Instance.provider_instance_id == claim.provider_id,
            )
        ).first()
    return found is not None


def settle(session: Session, claim: Claim, state: str, now: datetime, *, detail: str) -> bool:
    """In ``session``'s transaction: the held orphan ends in ``state`` (terminated, or adopted
    when it was registered after all). False when it is no longer held."""
    won = session.exec(
        update(Launch)
        .where(*_still_ours(claim))
        .values(state=state, holder=None, changed_at=now, last_error=detail)
    ).rowcount
    return bool(won == 1)


def retry_later(session: Session, claim: Claim, now: datetime, *, error: str, told: bool) -> bool:
    """In ``session``'s transaction: terminating the held orphan failed; it is due again in
    ``RETRY_S`` (``told``: its renter has now been told). False when no longer held."""
    values: dict[str, object] = {
        "holder": None,
        "lease_until": now + timedelta(seconds=RETRY_S),
        "attempts": col(Launch.attempts) + 1,
        "last_error": error,
        "changed_at": now,
    }
    if told:
        values["told_at"] = now
    won = session.exec(update(Launch).where(*_still_ours(claim)).values(**values)).rowcount
    return bool(won == 1)


@contextmanager
def holding(
    rt: Runtime, launch_key: str, holder: str, *, every_s: float = CLAIM_HEARTBEAT_S
) -> Iterator[None]:
    """Renew ``holder``'s lease on the launch's rows in launched or checked every ``every_s``
    real seconds while the body runs, so a live renter keeps them and a dead one loses them
    within ``CLAIM_LEASE_S``."""
    done = threading.Event()
    beat = threading.Thread(
        target=_renew_until_done,
        args=(rt, launch_key, holder, done, every_s),
        name=f"launch-{launch_key}-lease",
        daemon=True,
    )
    beat.start()
    try:
        yield
    finally:
        done.set()
        beat.join(timeout=every_s)


def renew(rt: Runtime, launch_key: str, holder: str) -> int:
    """Move ``holder``'s lease on the launch's held rows to ``CLAIM_LEASE_S`` from now;
    returns how many rows it still holds."""
    until = rt.now() + timedelta(seconds=CLAIM_LEASE_S)
    with rt.db.session() as session:
        moved = session.exec(
            update(Launch)
            .where(
                col(Launch.launch_key) == launch_key,
                col(Launch.holder) == holder,
                col(Launch.state).in_(HELD),
                col(Launch.lease_until) < until,
            )
            .values(lease_until=until)
        ).rowcount
        held = session.exec(
            select(Launch.id).where(
                col(Launch.launch_key) == launch_key,
                col(Launch.holder) == holder,
                col(Launch.state).in_(HELD),
            )
        ).all()
    log.debug("launch %s: lease renewed on %d rows", launch_key, moved)
    return len(held)


def rows_of(rt: Runtime, launch_key: str) -> list[Launch]:
    """The launch's rows, by position."""
    with rt.db.session() as session:
        return list(
            session.exec(
                select(Launch).where(Launch.launch_key == launch_key).order_by(col(Launch.position))
            ).all()
        )


@dataclass(frozen=True)
class RecentLaunches:
    """The rentals in progress, which their own recovery looks after: (provider, provider id)
    of every instance launched, and (provider, platform name) of every launch call whose answer
    has not come (what it named its instances)."""

    ids: frozenset[tuple[str, str]]
    names: frozenset[tuple[str, str]]

    def holds(self, provider: str, instance: ProviderInstance) -> bool:
        """Whether ``instance`` on ``provider`` is one of these launches."""
        if (provider, instance.provider_id) in self.ids:
            return True
        name = instance.name or ""
        return any(p == provider and name.startswith(n) for p, n in self.names if n)


def recent_launches(rt: Runtime) -> RecentLaunches:
    """The rentals in progress, as the Launch table holds them (launching, launched, checked,
    orphaned), whichever process works on them."""
    with rt.db.session() as session:
        rows = session.exec(
            select(Launch).where(col(Launch.state).in_(IN_PROGRESS)).order_by(col(Launch.id))
        ).all()
    ids = {(r.provider, r.provider_id) for r in rows if r.provider_id}
    names = {
        (r.provider, r.platform_name) for r in rows if r.state == LAUNCHING and r.platform_name
    }
    return RecentLaunches(frozenset(ids), frozenset(names))


def _renew_until_done(
    rt: Runtime, launch_key: str, holder: str, done: threading.Event, every_s: float
) -> None:
    while not done.wait(every_s):
        try:
            if renew(rt, launch_key, holder) == 0:
                return
        except GpubotError as exc:  # the store hiccupped: try again at the next beat
            log.warning("launch %s: renewing its lease failed: %s", launch_key, exc)


def _lock_held(
    session: Session, launch_key: str, holder: str, states: Sequence[str], now: datetime
) -> list[Launch]:
    """The launch's rows ``holder`` holds in ``states``, by position, locked for the rest of
    the transaction (an UPDATE first: no other process moves them before it ends)."""
    session.exec(
        update(Launch)
        .where(
            col(Launch.launch_key) == launch_key,
            col(Launch.holder) == holder,
            col(Launch.state).in_(states),
        )
        .values(changed_at=now)
    )
    return _held_rows(session, launch_key, holder, states)


def _held_rows(
    session: Session, launch_key: str, holder: str, states: Sequence[str]
) -> list[Launch]:
    return list(
        session.exec(
            select(Launch)
            .where(
                Launch.launch_key == launch_key,
                Launch.holder == holder,
                col(Launch.state).in_(states),
            )
            .order_by(col(Launch.position))
            .execution_options(populate_existing=True)
        ).all()
    )


def _add_like(
    session: Session,
    rows: Sequence[Launch],
    provider_id: str,
    state: str,
    holder: str,
    lease_until: datetime,
    now: datetime,
) -> Launch:
    """A row for an instance the platform started beyond those asked for, like ``rows``."""
    first = rows[0]
    session.flush()
    last = session.exec(
        select(func.max(Launch.position)).where(Launch.launch_key == first.launch_key)
    ).one()
    row = Launch(
        launch_key=first.launch_key,
        position=(last or 0) + 1,
        provider=first.provider,
        instance_type=first.instance_type,
        platform_name=first.platform_name,
        renter=first.renter,
        provider_id=provider_id,
        state=state,
        holder=holder,
        lease_until=lease_until,
        started_at=first.started_at,
        changed_at=now,
    )
    session.add(row)
    session.flush()
    return row


def _move(
    session: Session,
    row: Launch,
    holder: str | None,
    state: str,
    now: datetime,
    *,
    provider_id: str | None = None,
    last_error: str | None = None,
) -> None:
    """Move a row this transaction locked (:func:`_lock_held`) to ``state``."""
    row.state = state
    row.holder = holder
    row.changed_at = now
    if provider_id is not None:
        row.provider_id = provider_id
    if last_error is not None:
        row.last_error = last_error
    session.add(row)


def _held_by(launch_id: int, holder: str) -> tuple[Any, ...]:
    return (
        col(Launch.id) == launch_id,
        col(Launch.holder) == holder,
        col(Launch.state).in_(HELD),
    )


def _still_ours(claim: Claim) -> tuple[Any, ...]:
    return (
        col(Launch.id) == claim.id,
        col(Launch.holder) == claim.holder,
        col(Launch.state) == ORPHANED,
    )


def _claim_of(row: Launch) -> Claim:
    assert row.id is not None
    assert row.holder is not None
    return Claim(
        id=row.id,
        launch_key=row.launch_key,
        position=row.position,
        provider=row.provider,
        provider_id=row.provider_id,
        name=row.name,
        renter=row.renter,
        instance_type=row.instance_type,
        platform_name=row.platform_name,
        started_at=row.started_at,
        state=row.state,
        reason=row.reason,
        told=row.told_at is not None,
        holder=row.holder,
        lease_until=row.lease_until,
    )
