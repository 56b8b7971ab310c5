"""The release engine: Release rows, claimed before each provider call and recorded after.

- ``request_release`` opens a Release (one open Release per instance; asking again returns it).
- ``release_now`` is the one route of a release someone asks for (`/gpu release` and the
  buttons of deadline and idle prompts): it checks who asks, opens the Release and works on it
  at once.
- ``process_release`` claims a due Release with a conditional UPDATE (a lease in
  ``next_attempt_at``), commits, calls the provider outside any transaction and records the
  result. Nothing is marked released until the platform reports the instance stopped or
  terminated, or no longer knows it. Failures are retried with exponential backoff (a 429's
  Retry-After is honoured; a busy machine's 409 starts the back-off over, since the platform
  answers again) and escalated to the owner and the channel after
  ``ESCALATE_AFTER_FAILURES`` failures (at once for a failure retrying cannot fix).
- ``process_due_releases`` takes the due Releases longest due first: each goes to its
  platform's pool, or without pools is worked on in turn until the caller's time budget
  (a ``bot.timebox.Timebox``) is spent; the rest stay due for the next tick.
- Manual instances (no API): the owner is asked to release on the platform and press
  "Released on the platform", or "Stopped on the platform" where they only stopped it;
  reminded at the widening times of ``MANUAL_REMINDERS_AFTER_S`` (30 min, 1 h, 2 h ... then
  daily, for a week), escalated to the channel after ``MANUAL_ESCALATE_AFTER_REMINDERS``
  reminders, and after the last reminder the Release goes ``awaiting_owner_quiet``: the clock
  no longer works on it, the channel is told once that the bot stopped reminding, and the
  owner can still confirm it. ``confirm_manual_release`` stops the meter.
- A stop (mode ``stop``, on a platform that can stop, or a manual one) leaves the instance
  ``stopped``: still registered, its compute meter stopped, its disk still billing. It can be
  released from there (a terminate), and reconcile notices when it runs again.

Release states: pending, in_progress (claimed), escalated (failing, still retried),
awaiting_owner (manual), awaiting_owner_quiet (manual, reminders done), confirmed. Every
message goes out as a Prompt row (see bot.services.speaking.prompts), so none is lost or doubled by
a crash; what each says is a notice of this module (:class:`ManualReleaseRequest`,
:class:`ReleasedNotice`, ...), listed in ``PROMPT_NOTICES``.

Why one module of this size: it is one state machine. Every transition of a Release (claim,
lease, the provider's answer or its silence, escalation, the owner's confirmation) reads and
writes the same row under the same claim, and an unknown outcome must be settled where the
claim is held; split, the claim and its transitions would be read across modules.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import and_, func, or_, update
from sqlmodel import Session, col, select

from bot import billing
from bot.errors import (
    Conflict,
    GpubotError,
    NotFound,
    ProviderBusy,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
    UsageError,
)
from bot.i18n import Language, t
from bot.logging_setup import log_context, log_ids
from bot.notify import Notice
from bot.providers.base import RELEASE_MODES, Provider, ProviderInstance, check_mode
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances.views import InstanceBrief
from bot.services.money import costs, rule_changes
from bot.services.money.costs import FinalCost
from bot.services.speaking import audit, prompts
from bot.store.models import Instance, Prompt, Release
from bot.timebox import Timebox, expired

log = logging.getLogger(__name__)

#: Release states the clock works on: each is due at its ``next_attempt_at`` (at once when NULL).
OPEN_STATES = ("pending", "in_progress", "escalated", "awaiting_owner")
#: A manual release whose reminders are all sent: never due (the clock leaves it alone), still
#: open to its owner's confirmation.
QUIET = "awaiting_owner_quiet"
#: Every state of a Release not yet finished: the clock's, and the quiet one.
UNFINISHED_STATES = (*OPEN_STATES, QUIET)
#: Instance states in which a release is under way or done.
RELEASING_STATES = ("releasing", "awaiting_confirmation", "released")
#: The state of an instance stopped on its platform: compute off, its disk kept (and billed).
STOPPED = "stopped"
#: How long a claim on a Release holds before another process may take it over, unless its
#: holder renews it: a holder that died (``kill -9``) loses it within this time.
CLAIM_LEASE_S = 45
#: How often (real seconds) a holder renews its claim while it works on the release.
CLAIM_HEARTBEAT_S = 15.0
#: When the platform accepted a release but has not finished it: look again after this.
CONFIRM_RECHECK_S = 30
BACKOFF_BASE_S = 60
BACKOFF_MAX_S = 3600
ESCALATE_AFTER_FAILURES = 3
MANUAL_REMIND_S = 1800
#: When the owner of a manual instance is reminded to release it, in seconds after the ask:
#: widening (30 min, 1 h, 2 h, 4 h, 8 h, 16 h, then daily) and none after the last, a week
#: after the ask (13 reminders in all). The last one says so; the channel is told then.
MANUAL_REMINDERS_AFTER_S = (
    MANUAL_REMIND_S,
    3_600,
    7_200,
    14_400,
    28_800,
    57_600,
    *(day * 86_400 for day in range(1, 8)),
)
#: When the owner of a stopped instance is reminded that its disk still bills, counted from
#: the stop: widening, and no more after the last (bot.services.instances.deadlines.check_stopped).
STOPPED_REMINDERS_S = (86_400, 3 * 86_400, 7 * 86_400, 14 * 86_400, 30 * 86_400)
MANUAL_ESCALATE_AFTER_REMINDERS = 2

# Prompt kinds this module sends.
KIND_MANUAL_ASK = "release_manual"
KIND_MANUAL_REMINDER = "release_reminder"
KIND_ESCALATION = "release_escalation"
KIND_RELEASED = "release_notice"
#: The key suffix of the escalation that says the bot stopped reminding.
QUIET_KEY = "quiet"

#: What a :class:`Decided` notice says was decided.
EXTENDED = "extended"
RELEASE_REQUESTED = "release_requested"
KEPT = "kept"
CONFIRMED_RELEASED = "confirmed_released"
CONFIRMED_STOPPED = "confirmed_stopped"
RELEASE_CANCELLED = "release_cancelled"
#: A Release an extension withdrew before the owner confirmed it (a manual instance).
CANCELLED = "cancelled"


@dataclass(frozen=True)
class Decided(Notice):
    """A prompt once answered, its buttons gone: ``decision`` (EXTENDED by ``extended_s``
    seconds, RELEASE_REQUESTED for ``reason`` where given, KEPT, CONFIRMED_RELEASED or
    CONFIRMED_STOPPED), by the Slack user ``by`` (None: the bot), at ``at`` (naive UTC, shown
    in ``tz_name``); ``mode`` ``stop`` when the release asked for is a stop."""

    instance: InstanceBrief
    decision: str
    by: str | None
    at: datetime
    tz_name: str
    reason: str | None = None
    extended_s: int = 0
    mode: str = "terminate"


@dataclass(frozen=True)
class ManualReleaseRequest(Notice):
    """To the owner of an instance without a release API: release it (``mode`` terminate) or
    stop it (``stop``) on its platform for ``reason``, then say which was done with the buttons
    (their values carry ``instance_id``); ``requested_by`` is who asked (None: the bot)."""

    instance: InstanceBrief
    instance_id: int
    reason: str
    mode: str = "terminate"
    requested_by: str | None = None


@dataclass(frozen=True)
class ManualReleaseReminder(Notice):
    """To the owner: the manual release asked for at ``asked_at`` is still not confirmed at
    ``now``; ``last`` when no reminder follows (the channel is told instead)."""

    instance: InstanceBrief
    instance_id: int
    asked_at: datetime
    now: datetime
    mode: str = "terminate"
    last: bool = False


@dataclass(frozen=True)
class ReleaseEscalation(Notice):
    """To the owner and the ops channel: a release failed ``attempts`` times (``last_error``
    the platform's last answer), or, for a ``manual`` one, nobody confirmed it. ``reminders``
    (manual only, 0 otherwise): the bot stopped reminding the owner after that many reminders
    sent over ``reminded_for_s`` seconds, and the instance may still bill."""

    instance: InstanceBrief
    attempts: int
    last_error: str | None
    manual: bool
    reminders: int = 0
    reminded_for_s: int = 0


@dataclass(frozen=True)
class ReleasedNotice(Notice):
    """To the owner: the instance is released (``mode`` terminate) or stopped (``stop``) for
    ``reason``, as the platform or ``by`` confirmed; ``storage_bills`` when its platform bills
    the disk of a stopped instance. ``requested_by`` is who asked for it (None: the bot);
    ``release_at`` is when a stopped instance is released unless started again (policy
    ``stop``), shown in ``tz_name``; ``final_cost`` what the session cost, and why."""

    instance: InstanceBrief
    mode: str
    reason: str
    storage_bills: bool
    by: str | None = None
    requested_by: str | None = None
    release_at: datetime | None = None
    tz_name: str = "UTC"
    final_cost: FinalCost | None = None


def request_release(
    rt: Runtime,
    instance_id: int,
    *,
    reason: str,
    requested_by: str,
    mode: str = "terminate",
    now: datetime | None = None,
    seen_deadline: tuple[datetime | None, datetime | None] | None = None,
) -> Release:
    """Open a Release for an instance, or return the one already open (never two).

    ``reason``: user, deadline, cap, idle, jobs_done. ``seen_deadline`` is the (deadline,
    lifetime cap) the caller decided on: the release is opened only while they are unchanged,
    so an extension committed meanwhile wins. Raises NotFound for an unknown instance, Conflict
    when it is already released or its deadline moved, UsageError for an unknown mode and
    ProviderError when the provider cannot release in that mode."""
    if mode not in RELEASE_MODES:
        raise UsageError(
            t("Unknown release mode {mode!r}.", mode=mode), hint=t("Use terminate or stop.")
        )
    now = now or rt.now()
    with rt.db.session() as session:
        inst = session.get(Instance, instance_id)
        if inst is None:
            raise NotFound(t("There is no instance with id {id}.", id=instance_id))
        existing = open_release(session, instance_id)
        if existing is not None:
            return existing
        if inst.state == "released":
            raise _already_released(inst)
        if inst.state == STOPPED and mode == "stop":
            raise Conflict(
                t("{name} is already stopped.", name=inst.name),
                hint=t("`/gpu release {name}` terminates it, disk and all.", name=inst.name),
            )
        check_mode(rt.providers.get(inst.provider), mode)
        guard = [col(Instance.id) == instance_id, col(Instance.state).not_in(RELEASING_STATES)]
        if seen_deadline is not None:
            guard += [_same(col(Instance.deadline_at), seen_deadline[0])]
            guard += [_same(col(Instance.lifetime_cap_at), seen_deadline[1])]
        won = session.exec(update(Instance).where(*guard).values(state="releasing")).rowcount
        if won != 1 and seen_deadline is not None and _moved(session, instance_id, seen_deadline):
            raise Conflict(t("{name}'s deadline moved; it is not released now.", name=inst.name))
        if won != 1:
            existing = open_release(session, instance_id)
            if existing is not None:
                return existing
            if _instance_state(session, instance_id) == "released":
                raise _already_released(inst)
        release = Release(
            instance_id=instance_id,
            reason=reason,
            mode=mode,
            requested_by=requested_by,
            requested_at=now,
            state="pending",
        )
        session.add(release)
        audit.record(
            session,
            at=now,
            actor=requested_by,
            action="release_requested",
            instance_id=instance_id,
            reason=reason,
            mode=mode,
        )
        session.flush()
    return release


def release_now(
    rt: Runtime,
    caller: Caller,
    instance_id: int,
    *,
    reason: str = "user",
    mode: str = "terminate",
) -> Release:
    """The release an owner (or an admin) asks for, with `/gpu release` or a prompt's button:
    open a Release for ``reason`` (user, idle, jobs_done) and work on it now. A platform with an
    API is asked to terminate (or stop); a manual one gets its owner asked to do it there.
    Returns the Release after that first attempt. Raises NotFound, NotAuthorized, Conflict
    (already released, already stopped), UsageError (a mode that is not one) and
    ProviderError/ConfigError (the platform cannot release in that mode)."""
    with rt.db.session() as session:
        inst = access.visible(rt, session.get(Instance, instance_id))
        if inst is None:
            raise NotFound(
                t("There is no instance with id {id}.", id=instance_id),
                hint=t("`/gpu list` shows the instances."),
            )
        access.require_owner_or_admin(rt, caller, inst, action="release")
    if inst.state == "released":
        raise _already_released(inst)
    opened = request_release(rt, instance_id, reason=reason, requested_by=caller.user_id, mode=mode)
    assert opened.id is not None
    if opened.state == QUIET:
        _wake(rt, opened.id)
    done = process_release(rt, opened.id)
    rt.fleet.forget(inst.name)
    return done


def _already_released(inst: Instance) -> Conflict:
    return Conflict(t("{name} is already released.", name=inst.name))


def _same(column: Any, value: datetime | None) -> Any:
    return column.is_(None) if value is None else column == value


def _moved(
    session: Session, instance_id: int, seen: tuple[datetime | None, datetime | None]
) -> bool:
    row = session.exec(
        select(Instance.deadline_at, Instance.lifetime_cap_at).where(Instance.id == instance_id)
    ).first()
    return row is not None and (row[0], row[1]) != seen


def process_release(rt: Runtime, release_id: int, *, now: datetime | None = None) -> Release:
    """Work on one Release if it is due and nobody else holds it; return its row afterwards.

    Provider calls happen outside any transaction; provider failures are recorded on the row,
    never raised. Raises NotFound for an unknown release id."""
    now = now or rt.now()
    claim = _claim(rt, release_id, now)
    if claim is not None:
        with _heartbeat(rt, claim):
            if claim.manual:
                _process_manual(rt, claim, now)
            else:
                _process_api(rt, claim)
        _deliver_for_release(rt, claim.release_id)
    return load_release(rt, release_id)


def due_clause(now: datetime) -> Any:
    """The Releases :func:`process_due_releases` works on at ``now`` (naive UTC): open, and
    never tried or due again (each an indexed range)."""
    open_ = col(Release.state).in_(OPEN_STATES)
    return or_(
        and_(open_, col(Release.next_attempt_at).is_(None)),
        and_(open_, col(Release.next_attempt_at) <= now),
    )


def process_due_releases(
    rt: Runtime, now: datetime, *, timebox: Timebox | None = None
) -> list[int]:
    """Work on the open Releases whose next attempt is due, longest due first; returns the ids
    taken.

    With the runtime's platform pools (``rt.platform_work``) each goes to its platform's pool
    and this returns at once, so a slow platform never holds the clock; without them each is
    worked on here, in turn. Given a ``timebox``, no further Release is taken once it is spent:
    the rest stay due and the next call takes them first. The one in hand is finished, so this
    can run past the budget by one release's platform calls (each bounded by the platform's HTTP
    timeout) and posts."""
    with rt.db.session() as session:
        due = list(
            session.exec(
                select(Release.id, Instance.provider)
                .join(Instance, col(Instance.id) == col(Release.instance_id))
                .where(due_clause(now))
                .order_by(
                    func.coalesce(col(Release.next_attempt_at), col(Release.requested_at)),
                    col(Release.id),
                )
            )
        )
    taken: list[int] = []
    for release_id, provider in due:
        assert release_id is not None
        if expired(timebox):
            log.info("releases: budget spent, %d due left for the next tick", len(due) - len(taken))
            break
        taken.append(release_id)
        work = partial(_process_logged, rt, release_id, now)
        if rt.platform_work is None:
            work()
        else:
            rt.platform_work.submit(provider, f"release:{release_id}", work)
    return taken


def _process_logged(rt: Runtime, release_id: int, now: datetime) -> None:
    with log_context(release_id=release_id):
        try:
            process_release(rt, release_id, now=now)
        except GpubotError as exc:  # a store hiccup on one release must not stop the others
            log.warning("release %s: %s", release_id, exc)


def confirm_manual_release(
    rt: Runtime,
    caller: Caller,
    instance_id: int,
    *,
    stopped: bool = False,
    now: datetime | None = None,
) -> Release:
    """The owner (or an admin) says a manual instance is released on its platform, or only
    ``stopped`` there (its disk kept): the meter stops, for the disk too unless it was only
    stopped. The Release records what happened, whatever was asked. Only a manual instance
    with an open release (awaiting this answer) can be confirmed; an API platform's meter stops
    when the platform says so.

    Idempotent: confirming twice returns the confirmed Release. Raises NotFound for an unknown
    instance, NotAuthorized for anyone but its owner or an admin, Conflict when nothing awaits
    the confirmation."""
    now = now or rt.now()
    mode = "stop" if stopped else "terminate"
    to_update: list[Prompt] = []
    with rt.db.session() as session:
        inst = access.visible(rt, session.get(Instance, instance_id))
        if inst is None:
            raise NotFound(t("There is no instance with id {id}.", id=instance_id))
        access.require_owner_or_admin(rt, caller, inst, action="confirm it is released")
        release = open_release(session, instance_id)
        if release is None:
            done = _latest_confirmed(session, instance_id)
            if inst.state in ("released", STOPPED) and done is not None:
                return done
        access.require_awaiting_confirmation(inst, _is_manual(rt, inst), release is not None)
        assert release is not None
        won = session.exec(
            update(Release)
            .where(col(Release.id) == release.id, col(Release.state).in_(UNFINISHED_STATES))
            .values(state="confirmed", confirmed_at=now, next_attempt_at=None, mode=mode)
        ).rowcount
        session.refresh(release)
        if won != 1:
            return release
        keep_s = rt.settings.stopped_keep_s
        mark_instance_released(session, instance_id, now=now, mode=mode, keep_s=keep_s)
        to_update = _resolve_release_prompts(session, instance_id, by=caller.user_id, now=now)
        audit.record(
            session,
            at=now,
            actor=caller.user_id,
            action="release_confirmed",
            instance_id=instance_id,
            release_id=release.id,
            manual=True,
            mode=mode,
        )
        view = instance_view(inst)
    decided = Decided(
        view,
        CONFIRMED_STOPPED if stopped else CONFIRMED_RELEASED,
        by=caller.user_id,
        at=now,
        tz_name=rt.settings.timezone,
    )
    languages: dict[str, Language] = {}
    for prompt in to_update:
        prompts.update_message(rt, prompt, decided, languages)
    return release


# --- extending past a release request ---------------------------------------------------------


def require_extendable(rt: Runtime, session: Session, inst: Instance) -> None:
    """Raise Conflict unless the instance's deadline can move: it is active, stopped (its
    release comes later), or a manual instance whose release waits for its owner to confirm it
    (extending withdraws that request: :func:`cancel_awaiting_release`)."""
    if inst.state in ("active", STOPPED) or _awaiting_owner(rt, session, inst):
        return
    raise Conflict(
        t(
            "{name} is {state}; it cannot be extended now.",
            name=inst.name,
            state=access.state_words(inst.state),
        )
    )


def _awaiting_owner(rt: Runtime, session: Session, inst: Instance) -> bool:
    if inst.state != "awaiting_confirmation" or inst.id is None or not _is_manual(rt, inst):
        return False
    release = open_release(session, inst.id)
    return release is not None and release.state in ("awaiting_owner", QUIET)


def state_after_extend(state: str) -> str:
    """The instance's state once extended: a manual one awaiting confirmation runs on."""
    return "active" if state == "awaiting_confirmation" else state


def cancel_awaiting_release(
    session: Session, inst: Instance, *, by: str, now: datetime
) -> list[Prompt]:
    """In the extension's transaction: withdraw the release a manual instance awaits its owner
    to confirm (the Release ``cancelled``, no more reminders) and answer its ask and reminders.
    Returns the posted prompts whose messages to edit (:func:`show_cancelled`)."""
    if inst.id is None:
        return []
    release = open_release(session, inst.id)
    if release is None or release.state not in ("awaiting_owner", QUIET):
        return []
    won = session.exec(
        update(Release)
        .where(col(Release.id) == release.id, col(Release.state).in_(("awaiting_owner", QUIET)))
        .values(state=CANCELLED, next_attempt_at=None)
    ).rowcount
    if won != 1:
        return []
    audit.record(
        session,
        at=now,
        actor=by,
        action="release_cancelled",
        instance_id=inst.id,
        release_id=release.id,
    )
    return _resolve_release_prompts(session, inst.id, by=by, now=now, resolution=CANCELLED)


def show_cancelled(
    rt: Runtime, prompts_to_edit: list[Prompt], inst: InstanceBrief, *, by: str, extended_s: int
) -> None:
    """Edit the ask and reminders of a withdrawn release: their buttons go, and they say who
    extended it by how much."""
    decided = Decided(
        inst,
        RELEASE_CANCELLED,
        by=by,
        at=rt.now(),
        tz_name=rt.settings.timezone,
        extended_s=extended_s,
    )
    languages: dict[str, Language] = {}
    for prompt in prompts_to_edit:
        prompts.update_message(rt, prompt, decided, languages)


def load_release(rt: Runtime, release_id: int) -> Release:
    """The Release row. Raises NotFound."""
    with rt.db.session() as session:
        release = session.get(Release, release_id)
        if release is None:
            raise NotFound(t("There is no release with id {id}.", id=release_id))
        return release


def open_release(session: Session, instance_id: int) -> Release | None:
    """The instance's open Release, or None."""
    return session.exec(
        select(Release)
        .where(Release.instance_id == instance_id, col(Release.state).in_(UNFINISHED_STATES))
        .order_by(col(Release.id).desc())
    ).first()


def mark_instance_released(
    session: Session,
    instance_id: int,
    *,
    now: datetime,
    mode: str,
    at: datetime | None = None,
    keep_s: int = 0,
) -> bool:
    """Stop the meter: the instance is released (terminate: compute and disk), or only stopped
    (stop: see :func:`mark_instance_stopped`). ``at`` is when the platform says it ended, where
    known (the meter stops there, never later than ``now``, never before the instance began).

    Returns False when it was already marked released (or, for a stop, stopped)."""
    now = _stop_time(session, instance_id, now=now, at=at)
    if mode == "stop":
        return mark_instance_stopped(session, instance_id, now=now, keep_s=keep_s)
    values: dict[str, object] = {
        "state": "released",
        "released_at": now,
        "release_mode": mode,
    }
    inst = session.get(Instance, instance_id)
    if inst is not None and inst.stopped_at is None:
        values["stopped_at"] = now
    if mode == "terminate" and inst is not None and inst.storage_deleted_at is None:
        values["storage_deleted_at"] = now
    result = session.exec(
        update(Instance)
        .where(col(Instance.id) == instance_id, col(Instance.released_at).is_(None))
        .values(**values)
    )
    if inst is not None:
        session.refresh(inst)
    return bool(result.rowcount == 1)


def _stop_time(
    session: Session, instance_id: int, *, now: datetime, at: datetime | None
) -> datetime:
    """``at`` bounded to [the instance's creation, ``now``]; ``now`` where ``at`` is unknown."""
    if at is None or at >= now:
        return now
    inst = session.get(Instance, instance_id)
    created = inst.created_at if inst is not None else None
    return max(at, created) if created is not None else at


def mark_instance_stopped(
    session: Session, instance_id: int, *, now: datetime, keep_s: int = 0
) -> bool:
    """Stop the compute meter and keep the registration: the instance is ``stopped`` from
    ``now``, its disk still billing. Its compute deadline goes: its deadline is now when the
    stopped disk is released (:func:`storage_deadline`). Returns False when it was already
    stopped or released."""
    inst = session.get(Instance, instance_id)
    release_at = storage_deadline(inst, now, keep_s) if inst is not None else None
    result = session.exec(
        update(Instance)
        .where(
            col(Instance.id) == instance_id,
            col(Instance.released_at).is_(None),
            col(Instance.state) != STOPPED,
        )
        .values(
            state=STOPPED,
            stopped_at=now,
            release_mode="stop",
            deadline_at=release_at,
            stopped_remind_at=now + timedelta(seconds=STOPPED_REMINDERS_S[0]),
        )
    )
    inst = session.get(Instance, instance_id)
    if inst is not None:
        session.refresh(inst)
    return bool(result.rowcount == 1)


def storage_deadline(inst: Instance, stopped_at: datetime, keep_s: int) -> datetime | None:
    """When a stopped instance's disk is released (terminated): ``--release-after`` past the
    deadline it was stopped at (policy ``stop``), else ``keep_s`` after the stop (the admin's
    GPUBOT_STOPPED_KEEP_S), else never by itself (None: its owner releases it, reminded on a
    widening schedule). An admin's lifetime cap still applies (deadlines.effective_deadline)."""
    deadline = inst.deadline_at
    if inst.deadline_policy == "stop" and deadline is not None and deadline <= stopped_at:
        return deadline + timedelta(seconds=inst.max_grace_s)
    if keep_s > 0:
        return stopped_at + timedelta(seconds=keep_s)
    return None


def instance_view(inst: Instance) -> InstanceBrief:
    """What the renderers need of an instance."""
    return InstanceBrief(
        name=inst.name,
        owner_id=inst.owner_id,
        provider=inst.provider,
        price_micros_per_hour=billing.hourly_cost_micros(inst),
        currency=inst.currency,
        storage_micros_per_hour=billing.storage_micros_per_hour(inst),
    )


def escalation_channel(rt: Runtime, inst: Instance) -> str | None:
    """Where escalations go: the ops channel, else the instance's own channel."""
    return rt.settings.channel or inst.channel_id


# --- claiming and recording -------------------------------------------------------------------


class _Lease:
    """Until when a claim holds (``until``, naive UTC), moved on by its heartbeat. ``lock`` is
    held while the lease is renewed and while the holder records its result, so the row's
    ``next_attempt_at`` and ``until`` never disagree when the holder checks that it still holds."""

    def __init__(self, until: datetime) -> None:
        self.until = until
        self.lock = threading.Lock()
        self.done = threading.Event()


@dataclass(frozen=True)
class _Claim:
    release_id: int
    lease: _Lease
    instance_id: int
    provider: str
    provider_instance_id: str | None
    mode: str
    reason: str
    attempts: int
    escalated: bool
    manual: bool


def _claim(rt: Runtime, release_id: int, now: datetime) -> _Claim | None:
    lease_until = now + timedelta(seconds=CLAIM_LEASE_S)
    with rt.db.session() as session:
        release = session.get(Release, release_id)
        if release is None:
            raise NotFound(t("There is no release with id {id}.", id=release_id))
        if release.state not in OPEN_STATES:
            return None
        if release.next_attempt_at is not None and release.next_attempt_at > now:
            return None
        guard = (
            col(Release.next_attempt_at).is_(None)
            if release.next_attempt_at is None
            else col(Release.next_attempt_at) == release.next_attempt_at
        )
        won = session.exec(
            update(Release)
            .where(col(Release.id) == release_id, col(Release.state) == release.state, guard)
            .values(state="in_progress", next_attempt_at=lease_until)
        ).rowcount
        if won != 1:
            return None
        inst = session.get(Instance, release.instance_id)
        assert inst is not None
        manual = _is_manual(rt, inst)
        return _Claim(
            release_id=release_id,
            lease=_Lease(lease_until),
            instance_id=inst.id or 0,
            provider=inst.provider,
            provider_instance_id=inst.provider_instance_id,
            mode=release.mode,
            reason=release.reason,
            attempts=release.attempts,
            escalated=release.escalated_at is not None,
            manual=manual,
        )


def _is_manual(rt: Runtime, inst: Instance) -> bool:
    if not inst.provider_instance_id:
        return True
    try:
        return not rt.providers.get(inst.provider).capabilities.api_release
    except GpubotError:
        return False  # an unconfigured provider: the attempt fails and escalates


def _process_api(rt: Runtime, claim: _Claim) -> None:
    assert claim.provider_instance_id is not None
    try:
        provider = rt.providers.get(claim.provider)
        try:
            current = provider.get(claim.provider_instance_id)
        except ProviderNotFound:
            _record_confirmed(rt, claim, mode="terminate", detail="gone on the platform")
            return
        if current.state == "terminated" or (claim.mode == "stop" and current.state == "stopped"):
            _record_confirmed(rt, claim, mode=claim.mode, detail=current.raw_state, seen=current)
            return
        outcome = provider.release(claim.provider_instance_id, claim.mode)
    except ProviderNotFound:
        _record_confirmed(rt, claim, mode="terminate", detail="gone on the platform")
        return
    except ProviderRateLimited as exc:
        _record_failure(rt, claim, exc, retry_after_s=exc.retry_after_s)
        return
    except GpubotError as exc:
        _record_failure(rt, claim, exc, retry_after_s=None)
        return
    if outcome.confirmed:
        mode = "terminate" if outcome.already_gone else outcome.mode
        seen = _stopped_disk(provider, claim) if mode == "stop" else None
        _record_confirmed(rt, claim, mode=mode, detail=outcome.detail or outcome.state, seen=seen)
        return
    _record_pending(rt, claim)


def _stopped_disk(provider: Provider, claim: _Claim) -> ProviderInstance | None:
    """The stopped instance as its platform reports it, where the platform bills the disk by
    the instance's state (its stopped disk price applies from the stop); None otherwise or
    when the look fails (reconcile takes the price up later)."""
    if not provider.capabilities.storage_follows_state or claim.provider_instance_id is None:
        return None
    try:
        return provider.get(claim.provider_instance_id)
    except GpubotError as exc:
        log.info(
            "release %s: the stopped disk's price is left to reconcile: %s", claim.release_id, exc
        )
        return None


def _still_ours(claim: _Claim) -> tuple[object, ...]:
    return (
        col(Release.id) == claim.release_id,
        col(Release.state) == "in_progress",
        col(Release.next_attempt_at) == claim.lease.until,
    )


@contextmanager
def _heartbeat(rt: Runtime, claim: _Claim) -> Iterator[None]:
    """Renew the claim every ``CLAIM_HEARTBEAT_S`` (real seconds) while the body runs, so a
    slow platform call keeps it and a dead holder loses it within ``CLAIM_LEASE_S``."""
    beat = threading.Thread(
        target=_renew_until_done,
        args=(rt, claim),
        name=f"release-{claim.release_id}-lease",
        daemon=True,
    )
    beat.start()
    try:
        yield
    finally:
        claim.lease.done.set()
        beat.join(timeout=CLAIM_HEARTBEAT_S)


def _renew_until_done(rt: Runtime, claim: _Claim) -> None:
    while not claim.lease.done.wait(CLAIM_HEARTBEAT_S):
        if not _renew(rt, claim):
            return


def _renew(rt: Runtime, claim: _Claim) -> bool:
    """Move the claim's lease to ``CLAIM_LEASE_S`` from now; False when it is no longer held
    (taken over, or the holder finished)."""
    with claim.lease.lock:
        if claim.lease.done.is_set():
            return False
        until = max(claim.lease.until, rt.now() + timedelta(seconds=CLAIM_LEASE_S))
        try:
            with rt.db.session() as session:
                won = session.exec(
                    update(Release)
                    .where(*_still_ours(claim))  # type: ignore[arg-type]
                    .values(next_attempt_at=until)
                ).rowcount
        except GpubotError as exc:  # the store hiccupped: try again at the next beat
            log.warning("release %s: renewing its claim failed: %s", claim.release_id, exc)
            return True
        if won != 1:
            return False
        claim.lease.until = until
        return True


def _record_confirmed(
    rt: Runtime, claim: _Claim, *, mode: str, detail: str, seen: ProviderInstance | None = None
) -> None:
    """The release is confirmed: the meter stops now (or when the platform, ``seen``, says the
    instance ended), the prompts are resolved, the owner is told. A stop whose instance the
    platform reported (``seen``) takes the platform's stopped disk price from now, where the
    platform bills the disk by state."""
    now = rt.now()
    with claim.lease.lock, rt.db.session() as session:
        won = session.exec(
            update(Release)
            .where(*_still_ours(claim))  # type: ignore[arg-type]
            .values(
                state="confirmed",
                confirmed_at=now,
                next_attempt_at=None,
                last_error=None,
                mode=mode,
            )
        ).rowcount
        if won != 1:
            return
        keep_s = rt.settings.stopped_keep_s
        # Where the platform said when it ended (an earlier try whose answer was lost did end
        # it), the meter stops there, as the platform's bill does.
        ended = seen.ended_at if seen is not None else None
        mark_instance_released(
            session, claim.instance_id, now=now, mode=mode, at=ended, keep_s=keep_s
        )
        _resolve_release_prompts(session, claim.instance_id, by=None, now=now)
        inst = session.get(Instance, claim.instance_id)
        assert inst is not None
        if mode == "stop" and seen is not None and seen.state == "stopped":
            session.refresh(inst)
            rule_changes.take_platform_storage(rt, session, inst, seen, now)
        prompts.ensure_prompt(
            session,
            instance_id=claim.instance_id,
            kind=KIND_RELEASED,
            key=str(claim.release_id),
            recipient=inst.owner_id,
            due_at=now,
        )
        audit.record(
            session,
            at=now,
            actor="gpubot",
            action="release_confirmed",
            instance_id=claim.instance_id,
            release_id=claim.release_id,
            mode=mode,
            detail=detail,
        )


def _record_pending(rt: Runtime, claim: _Claim) -> None:
    now = rt.now()
    with claim.lease.lock, rt.db.session() as session:
        session.exec(
            update(Release)
            .where(*_still_ours(claim))  # type: ignore[arg-type]
            .values(
                state="escalated" if claim.escalated else "pending",
                next_attempt_at=now + timedelta(seconds=CONFIRM_RECHECK_S),
            )
        )


def _record_failure(
    rt: Runtime, claim: _Claim, error: GpubotError, *, retry_after_s: float | None
) -> None:
    now = rt.now()
    attempts = claim.attempts + 1
    retryable = bool(getattr(error, "retryable", True))
    delay = backoff_s(attempts, key=claim.release_id) if retryable else BACKOFF_MAX_S
    if isinstance(error, ProviderBusy):
        # The platform answers again (after an outage, the doubling step may be long): the
        # machine's own transition ends within minutes, so the wait starts over.
        delay = backoff_s(1, key=claim.release_id)
    if retry_after_s is not None:
        # Honoured, but never past the longest back-off: a platform asking for a day would
        # otherwise keep a deadline release (and its billing) waiting that long.
        delay = max(delay, min(int(retry_after_s), BACKOFF_MAX_S))
    escalate = not claim.escalated and (attempts >= ESCALATE_AFTER_FAILURES or not retryable)
    values: dict[str, object] = {
        "state": "escalated" if (escalate or claim.escalated) else "pending",
        "attempts": attempts,
        "next_attempt_at": now + timedelta(seconds=delay),
        "last_error": failure_text(error)[:2000],
    }
    if escalate:
        values["escalated_at"] = now
    log.warning(
        "release %s attempt %s failed: %s",
        claim.release_id,
        attempts,
        error,
        extra=log_ids(release_id=claim.release_id, instance_id=claim.instance_id),
    )
    with claim.lease.lock, rt.db.session() as session:
        won = session.exec(
            update(Release).where(*_still_ours(claim)).values(**values)  # type: ignore[arg-type]
        ).rowcount
        if won != 1 or not escalate:
            return
        _add_escalations(rt, session, claim.instance_id, claim.release_id, now)


def failure_text(error: GpubotError) -> str:
    """What a failed attempt records for the escalation: the error and its hint, and for an
    unknown outcome what the platform (or whatever stood in its place) answered, its status and a
    credential-masked excerpt (escaped where it is shown)."""
    text = error.user_text()
    if isinstance(error, ProviderUnknownOutcome) and error.answer:
        text = "\n".join((text, t("The platform answered: {answer}", answer=error.answer)))
    return text


def _add_escalations(
    rt: Runtime,
    session: Session,
    instance_id: int,
    release_id: int,
    now: datetime,
    *,
    owner_too: bool = True,
) -> None:
    """Escalate to the channel, and to the owner unless ``owner_too`` is False (the owner got a
    reminder in the same tick) and there is a channel to tell."""
    inst = session.get(Instance, instance_id)
    assert inst is not None
    channel = escalation_channel(rt, inst)
    targets = [("channel", channel)]
    if owner_too or not channel:
        targets.insert(0, ("owner", inst.owner_id))
    for suffix, recipient in targets:
        if recipient:
            prompts.ensure_prompt(
                session,
                instance_id=instance_id,
                kind=KIND_ESCALATION,
                key=f"{release_id}:{suffix}",
                recipient=recipient,
                due_at=now,
            )
    audit.record(
        session,
        at=now,
        actor="gpubot",
        action="release_escalated",
        instance_id=instance_id,
        release_id=release_id,
    )


def _process_manual(rt: Runtime, claim: _Claim, now: datetime) -> None:
    """Ask the owner, or remind them at the next time of ``MANUAL_REMINDERS_AFTER_S``; after the
    last reminder the Release goes quiet (never due again) and the channel is told once."""
    with claim.lease.lock, rt.db.session() as session:
        inst = session.get(Instance, claim.instance_id)
        assert inst is not None
        asked = prompts.find_prompt(
            session, claim.instance_id, KIND_MANUAL_ASK, str(claim.release_id)
        )
        escalated = claim.escalated
        sent = 0
        if asked is None:
            prompts.ensure_prompt(
                session,
                instance_id=claim.instance_id,
                kind=KIND_MANUAL_ASK,
                key=str(claim.release_id),
                recipient=inst.owner_id,
                due_at=now,
            )
        else:
            sent = 1 + _count_prompts(
                session, claim.instance_id, KIND_MANUAL_REMINDER, claim.release_id
            )
            prompts.ensure_prompt(
                session,
                instance_id=claim.instance_id,
                kind=KIND_MANUAL_REMINDER,
                key=f"{claim.release_id}:{sent}",
                recipient=inst.owner_id,
                due_at=now,
            )
            if not escalated and sent >= MANUAL_ESCALATE_AFTER_REMINDERS:
                _add_escalations(
                    rt, session, claim.instance_id, claim.release_id, now, owner_too=False
                )
                escalated = True
        values: dict[str, object] = {"state": "awaiting_owner", "next_attempt_at": None}
        gap_s = next_reminder_gap_s(sent)
        if gap_s is None:
            values["state"] = QUIET
            _add_reminders_stopped(rt, session, inst, claim.release_id, now, sent)
        else:
            values["next_attempt_at"] = now + timedelta(seconds=gap_s)
        if escalated and not claim.escalated:
            values["escalated_at"] = now
        won = session.exec(
            update(Release).where(*_still_ours(claim)).values(**values)  # type: ignore[arg-type]
        ).rowcount
        if won != 1:
            session.rollback()
            return
        session.exec(
            update(Instance)
            .where(col(Instance.id) == claim.instance_id, col(Instance.state) != "released")
            .values(state="awaiting_confirmation")
        )


def next_reminder_gap_s(sent: int) -> int | None:
    """Seconds from reminder number ``sent`` (0: the ask) to the next one, or None when that
    was the last (``MANUAL_REMINDERS_AFTER_S``)."""
    after = MANUAL_REMINDERS_AFTER_S
    if sent >= len(after):
        return None
    return after[sent] - (after[sent - 1] if sent > 0 else 0)


def is_last_reminder(number: int) -> bool:
    """Whether reminder ``number`` (counted from 1) is the last one the owner gets."""
    return number >= len(MANUAL_REMINDERS_AFTER_S)


def _add_reminders_stopped(
    rt: Runtime, session: Session, inst: Instance, release_id: int, now: datetime, sent: int
) -> None:
    """Tell the channel (or the owner where there is none) once that the bot stopped
    reminding after ``sent`` reminders, and record it."""
    assert inst.id is not None
    prompts.ensure_prompt(
        session,
        instance_id=inst.id,
        kind=KIND_ESCALATION,
        key=f"{release_id}:{QUIET_KEY}",
        recipient=escalation_channel(rt, inst) or inst.owner_id,
        due_at=now,
    )
    audit.record(
        session,
        at=now,
        actor="gpubot",
        action="release_reminders_stopped",
        instance_id=inst.id,
        release_id=release_id,
        reminders=sent,
    )


def _wake(rt: Runtime, release_id: int) -> None:
    """A quiet manual Release someone asks to release again: due at once, so its owner gets a
    reminder with the buttons (the channel is not told a second time)."""
    with rt.db.session() as session:
        session.exec(
            update(Release)
            .where(col(Release.id) == release_id, col(Release.state) == QUIET)
            .values(state="awaiting_owner", next_attempt_at=None)
        )


def _count_prompts(session: Session, instance_id: int, kind: str, release_id: int) -> int:
    return int(
        session.exec(
            select(func.count())
            .select_from(Prompt)
            .where(
                Prompt.instance_id == instance_id,
                Prompt.kind == kind,
                col(Prompt.key).startswith(f"{release_id}:"),
            )
        ).one()
    )


def _resolve_release_prompts(
    session: Session,
    instance_id: int,
    *,
    by: str | None,
    now: datetime,
    resolution: str = "released",
) -> list[Prompt]:
    """Close the manual ask and reminders; returns those that were posted (to update them)."""
    open_prompts = session.exec(
        select(Prompt)
        .where(
            Prompt.instance_id == instance_id,
            col(Prompt.kind).in_((KIND_MANUAL_ASK, KIND_MANUAL_REMINDER)),
            col(Prompt.resolved_at).is_(None),
        )
        .order_by(col(Prompt.id))
    ).all()
    posted: list[Prompt] = []
    for prompt in open_prompts:
        assert prompt.id is not None
        resolved = prompts.resolve(session, prompt.id, resolution=resolution, by=by, now=now)
        if resolved and prompts.posted_ref(prompt) is not None:
            posted.append(prompt)
    return posted


def _latest_confirmed(session: Session, instance_id: int) -> Release | None:
    return session.exec(
        select(Release)
        .where(Release.instance_id == instance_id, Release.state == "confirmed")
        .order_by(col(Release.id).desc())
    ).first()


def _instance_state(session: Session, instance_id: int) -> str | None:
    return session.exec(select(Instance.state).where(Instance.id == instance_id)).first()


def backoff_s(attempts: int, *, key: int = 0) -> int:
    """Seconds before retry number ``attempts`` of release ``key``: a doubling step (60, 120,
    240 ... at most an hour) with jitter, somewhere in its upper half. The jitter is drawn from
    the release and the attempt, so releases that failed together (one platform's outage) spread
    out instead of retrying together, and one release's schedule can be worked out again."""
    step = int(min(BACKOFF_BASE_S * 2 ** max(attempts - 1, 0), BACKOFF_MAX_S))
    digest = hashlib.blake2b(f"{key}:{attempts}".encode(), digest_size=8).digest()
    share = int.from_bytes(digest, "big") / 2**64  # in [0, 1)
    return step - int(step / 2 * share)


# --- what the prompts say ----------------------------------------------------------------------


def notice_for(rt: Runtime, session: Session, prompt: Prompt, inst: Instance) -> Notice | None:
    """What a prompt of this module's kinds says, from the current rows (None: nothing to send
    any more)."""
    view = instance_view(inst)
    release_id = int(prompt.key.split(":", 1)[0])
    release = session.get(Release, release_id)
    if release is None:
        return None
    if prompt.kind == KIND_MANUAL_ASK:
        if release.state not in UNFINISHED_STATES:
            return None
        return ManualReleaseRequest(
            view,
            instance_id=inst.id or 0,
            reason=release.reason,
            mode=release.mode,
            requested_by=_person(release.requested_by),
        )
    if prompt.kind == KIND_MANUAL_REMINDER:
        if release.state not in UNFINISHED_STATES:
            return None
        return ManualReleaseReminder(
            view,
            instance_id=inst.id or 0,
            asked_at=release.requested_at,
            now=rt.now(),
            mode=release.mode,
            last=is_last_reminder(int(prompt.key.rsplit(":", 1)[1])),
        )
    if prompt.kind == KIND_ESCALATION:
        if release.state not in UNFINISHED_STATES:
            return None
        quiet = prompt.key.endswith(f":{QUIET_KEY}")
        return ReleaseEscalation(
            view,
            attempts=release.attempts,
            last_error=release.last_error,
            manual=quiet or _is_manual(rt, inst),
            reminders=_count_prompts(session, inst.id or 0, KIND_MANUAL_REMINDER, release_id)
            if quiet
            else 0,
            reminded_for_s=int((prompt.due_at - release.requested_at).total_seconds())
            if quiet
            else 0,
        )
    if prompt.kind == KIND_RELEASED:
        storage_bills = False
        try:
            storage_bills = rt.providers.get(inst.provider).capabilities.storage_bills_when_stopped
        except GpubotError:
            storage_bills = True
        return ReleasedNotice(
            view,
            mode=release.mode,
            reason=release.reason,
            storage_bills=storage_bills,
            requested_by=_person(release.requested_by),
            release_at=_stop_policy_release_at(inst, release),
            tz_name=rt.settings.timezone,
            final_cost=costs.final_cost(inst),
        )
    return None


def _person(requested_by: str) -> str | None:
    """A Release's requester as a Slack user ID; None for the bot's own decisions."""
    return None if requested_by == "gpubot" else requested_by


def _stop_policy_release_at(inst: Instance, release: Release) -> datetime | None:
    """When a stopped instance's kept disk is released (its deadline once stopped: see
    :func:`storage_deadline`), or None when it is kept until someone releases it."""
    if release.mode != "stop" or inst.deadline_at is None or inst.state != STOPPED:
        return None
    at = inst.deadline_at
    cap = inst.lifetime_cap_at
    return at if cap is None else min(at, cap)


#: This module's prompt kinds and what they say (joined in
#: bot.services.prompt_kinds.PROMPT_NOTICES).
PROMPT_NOTICES: dict[str, prompts.PromptNotice] = {
    kind: notice_for
    for kind in (KIND_MANUAL_ASK, KIND_MANUAL_REMINDER, KIND_ESCALATION, KIND_RELEASED)
}


def _deliver_for_release(rt: Runtime, release_id: int) -> None:
    """Post the unsent prompts of this release's kinds about its instance now rather than at
    the next tick."""
    with rt.db.session() as session:
        release = session.get(Release, release_id)
        if release is None:
            return
        instance_id = release.instance_id
    prompts.deliver_pending(rt, rt.now(), PROMPT_NOTICES, instance_id=instance_id)
