"""Reconciling with the platforms: what each account holds, against the registrations.

Run by the clock's reconcile step (bot.services.tick calls
:func:`reconcile`). Each platform is asked for its list outside any transaction; what follows
from it is written in short guarded transactions, each with its notice queued in the outbox in
the same transaction (so a notice goes out once, whatever crashes).

- A registered instance **stopped** outside the bot keeps its registration: it is ``stopped``,
  its compute meter off and its disk still billing (a Release of reason ``reconcile``, mode
  ``stop``). **Started** again, it is ``active`` with its meter running from then
  (bot.billing.restart). **Terminated** (or unknown to the platform), it is released, disk and
  all. A ``crashed`` instance (a container that died) is not a stop: its meter runs on.
- An instance that **came back at another address** (a restart gives many platforms' instances
  a new public IP or SSH port) is reached there from then on: when the platform lists it
  running at another host or port and it was seen starting again, or the bot cannot reach it
  at the stored address (its last poll failed), the registration takes the platform's address
  in the same conditional update, the change is audited (``address_changed``), the fleet's
  pooled connection is dropped, and the owner is told once. A registered address that answers
  is left alone (it may be a proxy or an alias of the platform's). The pinned host key stays:
  another key at the new address is refused like any changed host key.
- An instance the account holds that **no registration holds** (started from the platform's
  console, say) and that holds compute is reported to the ops channel once (the outbox key
  names the platform and its id), with what it costs per hour, how long it has run and the
  names or tags that say whose it may be, unless it is younger than ``MIN_AGE_S`` or a rental
  in progress (its Launch row: bot.services.instances.launches.recent_launches). ``/gpu adopt``
  takes one over (:func:`adopt`): an admin's act (the console's too), told to the ops channel
  with who, what and the platform's name and tags for it (:class:`Adopted`); ``/gpu register
  --provider-id`` does too where the platform puts that id at the address registered
  (bot.services.instances.instance_trust.prove_platform).
- A platform whose list **cannot be had** (an outage, a catch-all 404 or an HTML page:
  ProviderUnknownOutcome) is said once to the ops channel with what it answered
  (:class:`PlatformUnlisted`, outbox key ``list_failed:PROVIDER:N``), and once when it lists
  again (:class:`PlatformListedAgain`, ``list_ok:PROVIDER:N``): the N-th outage of that
  platform, so one outage is never said twice, whatever runs or processes see it. A rate limit
  (429) is the platform answering, not an outage.

Instances with a release under way are left to the release engine. The accounts looked at are
the registry's (``ProviderRegistry.accounts``): AWS, present without any setting, only once an
instance of it is registered or its endpoint is set.

Why one module of this size: one comparison of a platform's list with the store, and every
change it can find (stopped, started, moved, terminated, unregistered, adopted) is written
under the same guards with its notice queued in the same transaction; the adopting of an
unregistered machine is the last of those changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, or_, update
from sqlmodel import Session, col, select

from bot import billing
from bot.errors import (
    Conflict,
    GpubotError,
    NotAuthorized,
    NotFound,
    ProviderError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderUnknownOutcome,
    UsageError,
)
from bot.i18n import Language, speaking, t
from bot.notify import Notice
from bot.providers.base import Provider, ProviderInstance
from bot.providers.names import platform_name
from bot.providers.registry import platform_billing
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import launches as launch_rows
from bot.services.instances import registration, releases
from bot.services.instances.instance_trust import Adopted, PlatformListedAgain, PlatformUnlisted
from bot.services.instances.views import InstanceBrief, RegisterResult, UnregisteredView
from bot.services.money import rule_changes
from bot.services.speaking import audit, outbox, prompts
from bot.store.models import Instance, OutboxMessage, Release

if TYPE_CHECKING:
    from bot.fleet.fleet import Fleet

log = logging.getLogger(__name__)

#: Instances younger than this are left alone (a platform's list lags behind a launch, and a
#: registration may be under way).
MIN_AGE_S = 300
#: Registration states reconcile looks at: running ones (stopped or terminated outside) and
#: stopped ones (started or terminated outside).
RUNNING_STATES = ("active", "registering", "lost")
WATCHED_STATES = (*RUNNING_STATES, releases.STOPPED)
#: What reconcile found out about a registered instance (MOVED: running at another address).
STOPPED, STARTED, TERMINATED, MOVED = "stopped", "started", "terminated", "moved"
#: Registration states whose address follows the platform's.
MOVABLE_STATES = ("active", "lost", releases.STOPPED)


@dataclass(frozen=True)
class ReleasedOutside(Notice):
    """To the owner: the platform shows the instance ``state`` (terminated, stopped, started or
    moved) without the bot having done it; the registration now says so. ``address``
    (``host:port``) is where it came back, when that changed."""

    instance: InstanceBrief
    state: str
    address: str | None = None
    #: When the platform itself releases the stopped instance (naive UTC), where it says, shown
    #: in ``tz_name``.
    platform_release_at: datetime | None = None
    tz_name: str = "UTC"
    #: Who started it through the bot (a Slack user ID); None: it happened outside the bot.
    by: str | None = None
    #: The new compute deadline of an instance started again (naive UTC).
    deadline_at: datetime | None = None


@dataclass(frozen=True)
class UnregisteredFound(Notice):
    """For the ops channel: an instance a platform account holds that no registration holds."""

    view: UnregisteredView


@dataclass(frozen=True)
class Registered:
    """A registration reconcile compares with its platform: its state, its address, whether
    its last poll reached it (None: never polled) and its owner (a Slack user ID)."""

    instance_id: int
    provider_id: str
    state: str
    host: str = ""
    port: int = 22
    last_poll_ok: bool | None = None
    owner_id: str | None = None
    #: The disk (GB) and its price (micro-units per GB-month) the registration bills now.
    disk_gb: float | None = None
    storage_micros_per_gb_month: int = 0


@dataclass(frozen=True)
class Change:
    """What changed for one registration: ``kind`` (STOPPED, STARTED, TERMINATED, MOVED) and
    the platform's ``address`` (host, port) to take, if any."""

    member: Registered
    kind: str
    address: tuple[str, int] | None = None
    #: The instance as the platform listed it (its disk and storage price, where it says).
    seen: ProviderInstance | None = None
    #: Who made the change through the bot (a Slack user ID); None: it happened outside.
    by: str | None = None


def reconcile(rt: Runtime, now: datetime) -> list[int]:
    """Compare each account's list with the registrations and report what nobody registered
    (see the module docstring). Returns the ids of the instances whose state or address
    changed. A platform that cannot be asked is skipped until the next run."""
    registered, in_use = _registrations(rt, now)
    launches: launch_rows.RecentLaunches | None = None
    changed: list[int] = []
    languages: dict[str, Language] = {}
    for provider in rt.providers.accounts(in_use):
        asked_at = rt.now()
        try:
            listed = provider.list_instances()
        except GpubotError as exc:
            log.warning("reconcile with %s skipped: %s", provider.name, exc)
            if not isinstance(exc, ProviderRateLimited):
                report_unlisted(rt, provider.name, exc, now)
            continue
        report_listed(rt, provider.name, now)
        members = registered.get(provider.name, ())
        for change in _changes(provider, members, listed):
            owner = change.member.owner_id
            with speaking(prompts.recipient_language(rt, owner, languages)):
                recorded = _record(rt, change, now)
            if recorded:
                changed.append(change.member.instance_id)
        if provider.capabilities.storage_follows_state:
            _follow_storage(rt, members, listed, now)
        if launches is None:
            launches = launch_rows.recent_launches(rt)
        report_unregistered(
            rt, provider.name, listed, now, launches=launches, listed_since=asked_at
        )
    return changed


def report_unregistered(
    rt: Runtime,
    provider: str,
    listed: Iterable[ProviderInstance],
    now: datetime,
    *,
    launches: launch_rows.RecentLaunches,
    listed_since: datetime | None = None,
) -> list[str]:
    """Tell the ops channel once about each listed instance that holds compute, is older than
    ``MIN_AGE_S``, and neither a registration nor a recent rental holds. A registration
    released since ``listed_since`` (naive UTC: when the list was asked for) still holds its
    machine: the list is older than its release. Returns the provider ids reported now (not
    those reported before)."""
    recipient = outbox.ops_recipient(rt)
    if recipient is None:
        return []
    with rt.db.session() as session:
        held = _held(session, provider, listed_since)
    reported: list[str] = []
    for inst in listed:
        if not inst.bills_compute or inst.provider_id in held:
            continue
        if launches.holds(provider, inst):
            continue
        if inst.launched_at is not None and inst.launched_at > now - timedelta(seconds=MIN_AGE_S):
            continue
        key = f"unregistered:{provider}:{inst.provider_id}"[:160]
        with rt.db.session() as session, speaking(None):  # the ops channel's language
            if outbox.find(session, key) is not None:
                continue
            text, body = rt.message(UnregisteredFound(_unregistered_view(rt, provider, inst, now)))
            outbox.enqueue(
                session,
                key=key,
                kind="notice",
                recipient=recipient,
                text=text,
                blocks=body,
                now=now,
            )
            audit.record(
                session,
                at=now,
                actor="gpubot",
                action="unregistered_found",
                instance_id=None,
                provider=provider,
                id=inst.provider_id,
                state=inst.raw_state,
            )
        reported.append(inst.provider_id)
    return reported


def report_unlisted(rt: Runtime, provider: str, exc: GpubotError, now: datetime) -> bool:
    """Tell the ops channel that ``provider`` cannot be listed, unless this outage was told
    already. Returns True when queued now."""
    recipient = outbox.ops_recipient(rt)
    if recipient is None:
        return False
    answer = exc.message
    if isinstance(exc, ProviderUnknownOutcome) and exc.answer and exc.answer not in answer:
        answer = f"{answer} ({exc.answer})"
    with rt.db.session() as session, speaking(None):
        last = _last_outage(session, provider)
        if last is not None and outbox.find(session, _listed_key(provider, last)) is None:
            return False  # told already, not over yet
        number = (last or 0) + 1
        notice = PlatformUnlisted(provider, answer[:500], now, rt.settings.timezone)
        outbox.enqueue_notice(
            rt, session, notice, key=_unlisted_key(provider, number), recipient=recipient, now=now
        )
        audit.record(
            session,
            "gpubot",
            "platform_unlisted",
            None,
            at=now,
            provider=provider,
            answer=answer[:500],
        )
    return True


def report_listed(rt: Runtime, provider: str, now: datetime) -> bool:
    """Tell the ops channel that ``provider`` lists again when an outage was told and its end
    was not. Returns True when queued now."""
    recipient = outbox.ops_recipient(rt)
    if recipient is None:
        return False
    with rt.db.session() as session, speaking(None):
        last = _last_outage(session, provider)
        if last is None or outbox.find(session, _listed_key(provider, last)) is not None:
            return False
        told = outbox.find(session, _unlisted_key(provider, last))
        since = told.created_at if told is not None else now
        notice = PlatformListedAgain(provider, since, now, rt.settings.timezone)
        outbox.enqueue_notice(
            rt, session, notice, key=_listed_key(provider, last), recipient=recipient, now=now
        )
    return True


def _unlisted_key(provider: str, number: int) -> str:
    return f"list_failed:{provider}:{number}"


def _listed_key(provider: str, number: int) -> str:
    return f"list_ok:{provider}:{number}"


def _last_outage(session: Session, provider: str) -> int | None:
    """The number of ``provider``'s last outage told to the ops channel, or None."""
    prefix = _unlisted_key(provider, 0)[:-1]
    keys = session.exec(
        select(OutboxMessage.key).where(col(OutboxMessage.key).startswith(prefix, autoescape=True))
    ).all()
    numbers = [int(key[len(prefix) :]) for key in keys if key[len(prefix) :].isdigit()]
    return max(numbers) if numbers else None


# --- adopting --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdoptRequest:
    """What `/gpu adopt` asks for: an instance by its platform and id, the name to register it
    under, and what the platform cannot say (the SSH login, the deadline). A price or GPUs
    given win over the platform's; ``price_micros_per_hour`` is in the bot's currency."""

    provider: str
    provider_id: str
    name: str
    ssh_user: str = "root"
    key_name: str | None = None
    release_in: timedelta | None = None
    release_at: datetime | None = None
    price_micros_per_hour: int | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    project: str | None = None
    python_path: str | None = None
    #: Where the agent keeps its jobs there (default: a home of its own, see register).
    agent_home: str | None = None
    #: The disk in GB and its price (micros of the bot's currency per GB-month), where given;
    #: else the platform's, where it says them.
    disk_gb: float | None = None
    storage_micros_per_gb_month: int | None = None


def adopt(rt: Runtime, caller: Caller, req: AdoptRequest) -> RegisterResult:
    """Register an instance of a platform account from what the platform says about it (its
    address, GPUs and price), then exactly as `/gpu register` does.

    Only an admin may adopt (and the console): a member is refused with NotAuthorized that says
    to ask an admin. The ops channel is told who adopted what (:class:`Adopted`).

    Raises NotAuthorized, UsageError (a platform without an API, or no price the bot can use),
    NotFound (the platform does not know it), Conflict (it does not run now, or a registration
    holds it), and what :func:`bot.services.instances.registration.register` raises."""
    if not (rt.console or access.is_admin(rt, caller)):
        raise NotAuthorized(
            t("Only an admin can adopt an instance of the team's platform accounts."),
            hint=t(
                "Ask an admin in the ops channel to adopt {provider} {id} for you.",
                provider=req.provider,
                id=req.provider_id[:100],
            ),
        )
    provider = rt.providers.get(req.provider)
    if not provider.capabilities.can_list:
        raise UsageError(
            t(
                "{provider} has no API the bot can ask about an instance.",
                provider=platform_name(req.provider),
            ),
            hint=t("Register it with /gpu register NAME USER@HOST --gpu MODEL --price 2.10/h."),
        )
    seen = _look_up(provider, req.provider_id)
    _refuse_held(rt, provider.name, seen.provider_id)
    if seen.state != "running" or not seen.host:
        raise Conflict(
            t(
                "{provider} instance {id} is {state}, not running with an address.",
                provider=platform_name(req.provider),
                id=req.provider_id,
                state=seen.raw_state or seen.state,
            ),
            hint=t("Adopt it once it runs (start it on the platform first)."),
        )
    disk_gb, storage = _storage(rt, seen, req)
    request = registration.RegisterRequest(
        name=req.name,
        address=registration.format_address(req.ssh_user, seen.host, seen.ssh_port),
        gpu_model=req.gpu_model or seen.gpu_model,
        gpu_count=req.gpu_count or seen.gpu_count,
        price_micros_per_hour=_price(rt, provider, seen, req.price_micros_per_hour),
        release_in=req.release_in,
        release_at=req.release_at,
        provider=provider.name,
        provider_id=seen.provider_id,
        project=req.project,
        python_path=req.python_path,
        key_name=req.key_name,
        agent_home=req.agent_home,
        disk_gb=disk_gb,
        storage_micros_per_gb_month=storage,
    )
    result = registration.register(rt, caller, request)
    now = rt.now()
    recipient = outbox.ops_recipient(rt)
    with rt.db.session() as session:
        audit.record(
            session,
            at=now,
            actor=caller.user_id,
            action="adopted",
            instance_id=result.instance.id,
            provider=provider.name,
            id=seen.provider_id,
            platform_name=seen.name,
            tags=[list(tag) for tag in seen.tags],
        )
        if recipient is not None:
            with speaking(None):
                notice = Adopted(
                    caller.user_id,
                    result.instance.name,
                    provider.name,
                    seen.provider_id,
                    seen.name,
                    seen.tags,
                )
                text, body = rt.message(notice)
            outbox.enqueue(
                session,
                key=f"adopted:{result.instance.id}"[:160],
                kind="notice",
                recipient=recipient,
                text=text,
                blocks=body,
                now=now,
                instance_id=result.instance.id,
            )
    return result


def _refuse_held(rt: Runtime, provider: str, provider_id: str) -> None:
    """Raise Conflict when a live registration holds ``provider``'s ``provider_id``: adopting
    takes over only what nobody registered."""
    with rt.db.session() as session:
        holder = session.exec(
            select(Instance).where(
                Instance.provider == provider,
                Instance.provider_instance_id == provider_id,
                Instance.state != "released",
            )
        ).first()
    if holder is not None:
        raise Conflict(
            t(
                "{provider} instance {id} is registered already, as {name} (<@{owner}>).",
                provider=platform_name(provider),
                id=provider_id[:100],
                name=holder.name,
                owner=holder.owner_id,
            ),
            hint=t("Its owner or an admin can change it with /gpu register."),
        )


# --- helpers ---------------------------------------------------------------------------------


def _registrations(
    rt: Runtime, now: datetime
) -> tuple[dict[str, list[Registered]], frozenset[str]]:
    """The watched registrations by provider, and the providers any registration names."""
    by_provider: dict[str, list[Registered]] = {}
    with rt.db.session() as session:
        rows = session.exec(
            select(Instance)
            .where(
                col(Instance.state).in_(WATCHED_STATES),
                col(Instance.provider_instance_id).is_not(None),
                col(Instance.created_at) <= now - timedelta(seconds=MIN_AGE_S),
            )
            .order_by(col(Instance.id))
        ).all()
        in_use = frozenset(session.exec(select(Instance.provider).distinct()).all())
    for row in rows:
        member = registered(row)
        if member is not None:
            by_provider.setdefault(row.provider, []).append(member)
    return by_provider, in_use


def registered(row: Instance) -> Registered | None:
    """What reconcile compares of a registration; None without a provider id."""
    if row.id is None or not row.provider_instance_id:
        return None
    return Registered(
        row.id,
        row.provider_instance_id,
        row.state,
        row.host,
        row.port,
        row.last_poll_ok,
        row.owner_id,
        row.disk_gb,
        row.storage_micros_per_gb_month,
    )


def record_started(rt: Runtime, instance_id: int, seen: ProviderInstance, by: str) -> bool:
    """A stopped registration that ``by`` (a Slack user) started from the bot runs on its
    platform (``seen``): recorded as a start seen by reconcile is (meter, new deadline, the
    platform's address and disk price), told to its owner as started by ``by``. False when
    the platform does not show it running or the row moved meanwhile."""
    if seen.state not in ("running",):
        return False
    with rt.db.session() as session:
        inst = session.get(Instance, instance_id)
        member = registered(inst) if inst is not None else None
    if member is None:
        return False
    address = _new_address(member, seen, STARTED)
    return _record(rt, Change(member, STARTED, address, seen, by=by), rt.now())


def _held(session: Session, provider: str, released_since: datetime | None) -> set[str]:
    """The provider ids that live registrations of ``provider`` hold, and those released since
    ``released_since`` (a list taken before their release still shows them running)."""
    live: ColumnElement[bool] = col(Instance.state) != "released"
    if released_since is not None:
        live = or_(live, col(Instance.released_at) >= released_since)
    rows = session.exec(
        select(Instance.provider_instance_id).where(
            Instance.provider == provider,
            live,
            col(Instance.provider_instance_id).is_not(None),
        )
    ).all()
    return {pid for pid in rows if pid}


def _changes(
    provider: Provider, members: Iterable[Registered], listed: list[ProviderInstance]
) -> list[Change]:
    """The changes of the registrations whose platform state or address moved."""
    by_id = {i.provider_id: i for i in listed}
    found: list[Change] = []
    for member in members:
        seen = by_id.get(member.provider_id)
        if seen is None:
            try:
                seen = provider.get(member.provider_id)
            except ProviderNotFound:
                found.append(Change(member, TERMINATED))
                continue
            except ProviderError as exc:
                log.warning("reconcile: %s %s: %s", provider.name, member.provider_id, exc)
                continue
        kind = _change(member.state, seen)
        address = _new_address(member, seen, kind)
        if kind is None and address is not None:
            kind = MOVED
        if kind is not None:
            found.append(Change(member, kind, address, seen))
    return found


def _new_address(
    member: Registered, seen: ProviderInstance, kind: str | None
) -> tuple[str, int] | None:
    """The platform's address for a registration that must take it: the instance runs at
    another host or port, and it was seen starting again or its last poll failed."""
    if seen.state != "running" or not seen.host or member.state not in MOVABLE_STATES:
        return None
    if (seen.host, seen.ssh_port) == (member.host, member.port):
        return None
    if kind == STARTED or (kind is None and member.last_poll_ok is False):
        return seen.host, seen.ssh_port
    return None


def _change(state: str, seen: ProviderInstance) -> str | None:
    if seen.is_gone:
        return TERMINATED
    if state == releases.STOPPED:
        return STARTED if seen.state in ("pending", "running", "crashed") else None
    return STOPPED if seen.state == "stopped" else None


def _record(rt: Runtime, found: Change, now: datetime) -> bool:
    """Write one change with its Release (or audit) row and the owner's notice (in the active
    language); False when the row moved meanwhile (a release opened, another process recorded
    it first)."""
    instance_id, change = found.member.instance_id, found.kind
    with rt.db.session() as session:
        if releases.open_release(session, instance_id) is not None:
            return False
        inst = session.get(Instance, instance_id)
        if inst is None or inst.state not in WATCHED_STATES:
            return False
        address = _free_address(session, inst, found.address)
        if change == MOVED and address is None:
            return False
        if change in (STARTED, MOVED):
            done = (
                _restart(session, inst, found.member, address, now, started_deadline(rt, now))
                if change == STARTED
                else _move(session, inst, found.member, address, now)
            )
            if not done:
                return False
            key = f"outside:{instance_id}:{change}:{now.isoformat()}"
        else:
            ended = found.seen.ended_at if found.seen is not None else None
            keep_s = rt.settings.stopped_keep_s
            release_id = _stop_or_release(session, inst, change, now, ended, keep_s)
            if release_id is None:
                return False
            key = f"outside:{instance_id}:{change}:{release_id}"
        session.refresh(inst)
        if change in (STOPPED, STARTED):
            rule_changes.take_platform_storage(rt, session, inst, found.seen, now)
        if change != MOVED:
            audit.record(
                session,
                at=now,
                actor=found.by or "gpubot",
                action=change
                if found.by
                else f"{'released' if change == TERMINATED else change}_outside",
                instance_id=instance_id,
                provider=inst.provider,
                provider_state=change,
            )
        shown = None
        if address is not None and change in (STARTED, MOVED):
            shown = _audit_move(session, inst, found.member, now)
        notice = ReleasedOutside(
            releases.instance_view(inst),
            state=change,
            address=shown,
            platform_release_at=found.seen.platform_release_at
            if change == STOPPED and found.seen is not None
            else None,
            tz_name=rt.settings.timezone,
            by=found.by,
            deadline_at=inst.deadline_at if change == STARTED else None,
        )
        text, body = rt.message(notice)
        outbox.enqueue(
            session,
            key=key,
            kind="notice",
            recipient=inst.owner_id,
            text=text,
            blocks=body,
            now=now,
            instance_id=instance_id,
        )
    if shown is not None:
        _forget(rt, inst.name)
    return True


def _stop_or_release(
    session: Session,
    inst: Instance,
    change: str,
    now: datetime,
    ended: datetime | None,
    keep_s: int,
) -> int | None:
    """Stop or release the registration with a confirmed Release of reason ``reconcile``, its
    meter stopped when the platform says it ended (``ended``, naive UTC; ``now`` when it does
    not say); returns the Release's id, or None when the row had moved."""
    assert inst.id is not None
    if change == STOPPED and inst.state not in RUNNING_STATES:
        return None
    mode = "stop" if change == STOPPED else "terminate"
    done = releases.mark_instance_released(
        session, inst.id, now=now, mode=mode, at=ended, keep_s=keep_s
    )
    if not done:
        return None
    release = Release(
        instance_id=inst.id,
        reason="reconcile",
        mode="stop" if change == STOPPED else "terminate",
        requested_by="gpubot",
        requested_at=now,
        state="confirmed",
        confirmed_at=now,
    )
    session.add(release)
    session.flush()
    return release.id


def _follow_storage(
    rt: Runtime, members: Iterable[Registered], listed: list[ProviderInstance], now: datetime
) -> None:
    """On a platform whose disk bills by the instance's state, each registration whose disk or
    disk price is not what the platform reports now (a stop or start the bot made itself, a
    volume resized) takes the platform's from ``now``: the rest of a stretch is at most one
    reconcile late."""
    by_id = {i.provider_id: i for i in listed}
    for member in members:
        seen = by_id.get(member.provider_id)
        if seen is None or seen.disk_gb is None or seen.storage_micros_per_gb_month is None:
            continue
        if (member.disk_gb, member.storage_micros_per_gb_month) == (
            seen.disk_gb,
            seen.storage_micros_per_gb_month,
        ):
            continue
        with rt.db.session() as session:
            inst = session.get(Instance, member.instance_id)
            if inst is None or inst.state not in WATCHED_STATES:
                continue
            rule_changes.take_platform_storage(rt, session, inst, seen, now)


def started_deadline(rt: Runtime, now: datetime) -> datetime:
    """The compute deadline of a stopped instance that runs again: the default deadline a new
    registration gets (GPUBOT_DEFAULT_RELEASE_IN_S) from ``now``; its owner extends it."""
    return now + timedelta(seconds=rt.settings.default_release_in_s)


def _restart(
    session: Session,
    inst: Instance,
    seen: Registered,
    address: tuple[str, int] | None,
    now: datetime,
    deadline_at: datetime,
) -> bool:
    """A stopped registration runs again: active, its meter running from ``now``, with a new
    compute deadline ``deadline_at``, at ``address`` when it came back at another one."""
    values = billing.restart(inst, platform_billing(inst.provider), now)
    values.update(
        state="active",
        release_mode=None,
        idle_since=None,
        deadline_at=deadline_at,
        stopped_remind_at=None,
    )
    values.update(_address_values(address, now))
    won = session.exec(
        update(Instance)
        .where(
            col(Instance.id) == inst.id,
            col(Instance.state) == releases.STOPPED,
            col(Instance.released_at).is_(None),
            *_same_address(seen),
        )
        .values(**values)
    ).rowcount
    return bool(won == 1)


def _move(
    session: Session,
    inst: Instance,
    seen: Registered,
    address: tuple[str, int] | None,
    now: datetime,
) -> bool:
    """A running registration takes the platform's ``address`` (polled there at once)."""
    won = session.exec(
        update(Instance)
        .where(
            col(Instance.id) == inst.id,
            col(Instance.state).in_(MOVABLE_STATES),
            col(Instance.released_at).is_(None),
            *_same_address(seen),
        )
        .values(**_address_values(address, now))
    ).rowcount
    return bool(won == 1)


def _same_address(seen: Registered) -> tuple[Any, ...]:
    """Guards: the row's address is still the one compared with the platform's."""
    return col(Instance.host) == seen.host, col(Instance.port) == seen.port


def _address_values(address: tuple[str, int] | None, now: datetime) -> dict[str, Any]:
    """The columns a new address sets: host, port, and a poll due at once."""
    if address is None:
        return {}
    return {"host": address[0], "port": address[1], "poll_due_at": now}


def _free_address(
    session: Session, inst: Instance, address: tuple[str, int] | None
) -> tuple[str, int] | None:
    """``address``, unless another live registration holds it with the same SSH user (then
    the platform's word cannot be taken: logged, and the registration keeps its address)."""
    if address is None:
        return None
    holder = session.exec(
        select(Instance.name).where(
            Instance.host == address[0],
            Instance.port == address[1],
            Instance.ssh_user == inst.ssh_user,
            Instance.state != "released",
            col(Instance.id) != inst.id,
        )
    ).first()
    if holder is None:
        return address
    log.warning(
        "reconcile: %s runs at %s:%s, which %s holds; its address is left as it was",
        inst.name,
        address[0],
        address[1],
        holder,
    )
    return None


def _audit_move(session: Session, inst: Instance, seen: Registered, now: datetime) -> str:
    """Audit the registration's new address (``inst`` as refreshed); returns it as host:port."""
    shown = _host_port(inst.host, inst.port)
    audit.record(
        session,
        at=now,
        actor="gpubot",
        action="address_changed",
        instance_id=inst.id,
        provider=inst.provider,
        old=_host_port(seen.host, seen.port),
        new=shown,
    )
    return shown


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _forget(rt: Runtime, name: str) -> None:
    """Drop the fleet's pooled connection to ``name``, so the next call dials the new address."""
    fleet: Fleet | None = rt.fleet  # a runtime without a fleet pools nothing
    if fleet is not None:
        fleet.forget(name)


def _unregistered_view(
    rt: Runtime, provider: str, inst: ProviderInstance, now: datetime
) -> UnregisteredView:
    return UnregisteredView(
        provider=provider,
        provider_id=inst.provider_id,
        name=inst.name,
        state=inst.state,
        raw_state=inst.raw_state,
        gpu_model=inst.gpu_model,
        gpu_count=inst.gpu_count,
        price_micros_per_hour=inst.price_micros_per_hour,
        currency=inst.currency,
        launched_at=inst.launched_at,
        tags=inst.tags,
        now=now,
        timezone=rt.settings.timezone,
    )


def _look_up(provider: Provider, provider_id: str) -> ProviderInstance:
    try:
        return provider.get(provider_id)
    except ProviderNotFound as exc:
        raise NotFound(
            t(
                "{provider} does not know an instance {id!r}.",
                provider=platform_name(provider.name),
                id=provider_id[:100],
            ),
            hint=t("Copy the id from the ops channel's notice or the platform's console."),
        ) from exc


def _storage(rt: Runtime, seen: ProviderInstance, req: AdoptRequest) -> tuple[float | None, int]:
    """The disk (GB) and storage price (micros per GB-month) to register: each as given, else
    the platform's where it says it in the bot's currency; 0 where the price is not known."""
    disk_gb = req.disk_gb if req.disk_gb is not None else seen.disk_gb
    if req.storage_micros_per_gb_month is not None:
        if disk_gb is None:
            raise UsageError(
                t("--storage needs --disk (the size it is charged on)."),
                hint=t("Like --disk 200."),
            )
        return disk_gb, req.storage_micros_per_gb_month
    if seen.storage_micros_per_gb_month is None or seen.currency != rt.settings.currency:
        return disk_gb, 0
    return disk_gb, seen.storage_micros_per_gb_month


def _price(rt: Runtime, provider: Provider, seen: ProviderInstance, given: int | None) -> int:
    """The price to register: the one given, else the platform's when it is in the bot's
    currency. Raises UsageError when neither can be used."""
    if given is not None:
        return given
    currency = rt.settings.currency
    if seen.price_micros_per_hour is None:
        raise UsageError(
            t(
                "{provider} does not say what {id} costs.",
                provider=provider.name,
                id=seen.provider_id,
            ),
            hint=t("Add the price you pay, like --price 2.10/h."),
        )
    if seen.currency != currency:
        raise UsageError(
            t(
                "{provider} prices {id} in {currency}; the bot counts in {ours}.",
                provider=provider.name,
                id=seen.provider_id,
                currency=seen.currency,
                ours=currency,
            ),
            hint=t("Add its price in {currency}, like --price 2.10/h.", currency=currency),
        )
    return seen.price_micros_per_hour
