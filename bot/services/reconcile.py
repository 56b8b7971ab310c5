"""Reconciling with the platforms: what each account holds, against the registrations.

Run by the clock's reconcile step (bot.services.deadlines.reconcile hands over to
:func:`reconcile`). Each platform is asked for its list outside any transaction; what follows
from it is written in short guarded transactions, each with its notice queued in the outbox in
the same transaction (so a notice goes out once, whatever crashes).

- A registered instance **stopped** outside the bot keeps its registration: it is ``stopped``,
  its compute meter off and its disk still billing (a Release of reason ``reconcile``, mode
  ``stop``). **Started** again, it is ``active`` with its meter running from then
  (bot.billing.restart). **Terminated** (or unknown to the platform), it is released, disk and
  all. A ``crashed`` instance (a container that died) is not a stop: its meter runs on.
- An instance the account holds that **no registration holds** (started from the platform's
  console, say) and that holds compute is reported to the ops channel once (the outbox key
  names the platform and its id), with what it costs per hour, how long it has run and the
  names or tags that say whose it may be, unless it is younger than ``MIN_AGE_S`` or a rental
  `/gpu rent` still looks after (bot.services.rent.recent_launches). ``/gpu adopt`` takes one
  over (:func:`adopt`), as does ``/gpu register --provider-id``.

Instances with a release under way are left to the release engine. The accounts looked at are
the registry's (``ProviderRegistry.accounts``): AWS, present without any setting, only once an
instance of it is registered or its endpoint is set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlmodel import Session, col, select

from bot import billing
from bot.errors import (
    Conflict,
    GpubotError,
    NotFound,
    ProviderError,
    ProviderNotFound,
    UsageError,
)
from bot.notify import Notice
from bot.providers.base import Provider, ProviderInstance
from bot.runtime import Runtime
from bot.services import audit, outbox, registration, releases, rent
from bot.services.access import Caller
from bot.services.views import InstanceBrief, RegisterResult, UnregisteredView
from bot.store.models import Instance, Release

log = logging.getLogger(__name__)

#: Instances younger than this are left alone (a platform's list lags behind a launch, and a
#: registration may be under way).
MIN_AGE_S = 300
#: Registration states reconcile looks at: running ones (stopped or terminated outside) and
#: stopped ones (started or terminated outside).
RUNNING_STATES = ("active", "registering", "lost")
WATCHED_STATES = (*RUNNING_STATES, releases.STOPPED)
#: What reconcile found out about a registered instance.
STOPPED, STARTED, TERMINATED = "stopped", "started", "terminated"


@dataclass(frozen=True)
class ReleasedOutside(Notice):
    """To the owner: the platform shows the instance ``state`` (terminated, stopped or started)
    without the bot having done it; the registration now says so."""

    instance: InstanceBrief
    state: str


@dataclass(frozen=True)
class UnregisteredFound(Notice):
    """For the ops channel: an instance a platform account holds that no registration holds."""

    view: UnregisteredView


@dataclass(frozen=True)
class Registered:
    """A registration reconcile compares with its platform."""

    instance_id: int
    provider_id: str
    state: str


def reconcile(rt: Runtime, now: datetime) -> list[int]:
    """Compare each account's list with the registrations and report what nobody registered
    (see the module docstring). Returns the ids of the instances whose state changed. A
    platform that cannot be asked is skipped until the next run."""
    registered, in_use = _registrations(rt, now)
    launches: rent.RecentLaunches | None = None
    changed: list[int] = []
    for provider in rt.providers.accounts(in_use):
        try:
            listed = provider.list_instances()
        except GpubotError as exc:
            log.warning("reconcile with %s skipped: %s", provider.name, exc)
            continue
        for instance_id, change in _changes(provider, registered.get(provider.name, ()), listed):
            if _record(rt, instance_id, change, now):
                changed.append(instance_id)
        if launches is None:
            launches = rent.recent_launches(rt, now)
        report_unregistered(rt, provider.name, listed, now, launches=launches)
    return changed


def report_unregistered(
    rt: Runtime,
    provider: str,
    listed: Iterable[ProviderInstance],
    now: datetime,
    *,
    launches: rent.RecentLaunches,
) -> list[str]:
    """Tell the ops channel once about each listed instance that holds compute, is older than
    ``MIN_AGE_S``, and neither a registration nor a recent rental holds. Returns the provider
    ids reported now (not those reported before)."""
    recipient = outbox.ops_recipient(rt)
    if recipient is None:
        return []
    with rt.db.session() as session:
        held = _held(session, provider)
    reported: list[str] = []
    for inst in listed:
        if not inst.bills_compute or inst.provider_id in held:
            continue
        if launches.holds(provider, inst):
            continue
        if inst.launched_at is not None and inst.launched_at > now - timedelta(seconds=MIN_AGE_S):
            continue
        key = f"unregistered:{provider}:{inst.provider_id}"[:160]
        with rt.db.session() as session:
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


def adopt(rt: Runtime, caller: Caller, req: AdoptRequest) -> RegisterResult:
    """Register an instance of a platform account from what the platform says about it (its
    address, GPUs and price), then exactly as `/gpu register` does.

    Raises UsageError (a platform without an API, or no price the bot can use), NotFound (the
    platform does not know it), Conflict (it does not run now, or someone holds it), and what
    :func:`bot.services.registration.register` raises."""
    provider = rt.providers.get(req.provider)
    if not provider.capabilities.can_list:
        raise UsageError(
            f"{req.provider} has no API the bot can ask about an instance.",
            hint="Register it with /gpu register NAME USER@HOST --gpu MODEL --price 2.10/h.",
        )
    seen = _look_up(provider, req.provider_id)
    if seen.state != "running" or not seen.host:
        raise Conflict(
            f"{req.provider} instance {req.provider_id} is {seen.raw_state or seen.state}, "
            "not running with an address.",
            hint="Adopt it once it runs (start it on the platform first).",
        )
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
    )
    result = registration.register(rt, caller, request)
    with rt.db.session() as session:
        audit.record(
            session,
            at=rt.now(),
            actor=caller.user_id,
            action="adopted",
            instance_id=result.instance.id,
            provider=provider.name,
            id=seen.provider_id,
        )
    return result


# --- helpers ---------------------------------------------------------------------------------


def _registrations(
    rt: Runtime, now: datetime
) -> tuple[dict[str, list[Registered]], frozenset[str]]:
    """The watched registrations by provider, and the providers any registration names."""
    by_provider: dict[str, list[Registered]] = {}
    with rt.db.session() as session:
        rows = session.exec(
            select(Instance.id, Instance.provider, Instance.provider_instance_id, Instance.state)
            .where(
                col(Instance.state).in_(WATCHED_STATES),
                col(Instance.provider_instance_id).is_not(None),
                col(Instance.created_at) <= now - timedelta(seconds=MIN_AGE_S),
            )
            .order_by(col(Instance.id))
        ).all()
        in_use = frozenset(session.exec(select(Instance.provider).distinct()).all())
    for instance_id, provider, provider_id, state in rows:
        if instance_id is not None and provider_id:
            by_provider.setdefault(provider, []).append(Registered(instance_id, provider_id, state))
    return by_provider, in_use


def _held(session: Session, provider: str) -> set[str]:
    """The provider ids live registrations of ``provider`` hold."""
    rows = session.exec(
        select(Instance.provider_instance_id).where(
            Instance.provider == provider,
            Instance.state != "released",
            col(Instance.provider_instance_id).is_not(None),
        )
    ).all()
    return {pid for pid in rows if pid}


def _changes(
    provider: Provider, members: Iterable[Registered], listed: list[ProviderInstance]
) -> list[tuple[int, str]]:
    """(instance id, change) for the registrations whose platform state moved."""
    by_id = {i.provider_id: i for i in listed}
    found: list[tuple[int, str]] = []
    for member in members:
        seen = by_id.get(member.provider_id)
        if seen is None:
            try:
                seen = provider.get(member.provider_id)
            except ProviderNotFound:
                found.append((member.instance_id, TERMINATED))
                continue
            except ProviderError as exc:
                log.warning("reconcile: %s %s: %s", provider.name, member.provider_id, exc)
                continue
        change = _change(member.state, seen)
        if change is not None:
            found.append((member.instance_id, change))
    return found


def _change(state: str, seen: ProviderInstance) -> str | None:
    if seen.is_gone:
        return TERMINATED
    if state == releases.STOPPED:
        return STARTED if seen.state in ("pending", "running", "crashed") else None
    return STOPPED if seen.state == "stopped" else None


def _record(rt: Runtime, instance_id: int, change: str, now: datetime) -> bool:
    """Write one change with its Release (or audit) row and the owner's notice; False when the
    row moved meanwhile (a release opened, another process recorded it first)."""
    with rt.db.session() as session:
        if releases.open_release(session, instance_id) is not None:
            return False
        inst = session.get(Instance, instance_id)
        if inst is None or inst.state not in WATCHED_STATES:
            return False
        if change == STARTED:
            if not _restart(session, inst, now):
                return False
            key = f"outside:{instance_id}:{STARTED}:{now.isoformat()}"
        else:
            release_id = _stop_or_release(session, inst, change, now)
            if release_id is None:
                return False
            key = f"outside:{instance_id}:{change}:{release_id}"
        session.refresh(inst)
        audit.record(
            session,
            at=now,
            actor="gpubot",
            action=f"{'released' if change == TERMINATED else change}_outside",
            instance_id=instance_id,
            provider=inst.provider,
            provider_state=change,
        )
        text, body = rt.message(ReleasedOutside(releases.instance_view(inst), state=change))
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
    return True


def _stop_or_release(session: Session, inst: Instance, change: str, now: datetime) -> int | None:
    """Stop or release the registration with a confirmed Release of reason ``reconcile``;
    returns the Release's id, or None when the row had moved."""
    assert inst.id is not None
    if change == STOPPED:
        if inst.state not in RUNNING_STATES:
            return None
        done = releases.mark_instance_stopped(session, inst.id, now=now)
    else:
        done = releases.mark_instance_released(session, inst.id, now=now, mode="terminate")
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


def _restart(session: Session, inst: Instance, now: datetime) -> bool:
    """A stopped registration runs again: active, its meter running from ``now``."""
    values = billing.restart(inst, now)
    values.update(state="active", release_mode=None, idle_since=None)
    won = session.exec(
        update(Instance)
        .where(
            col(Instance.id) == inst.id,
            col(Instance.state) == releases.STOPPED,
            col(Instance.released_at).is_(None),
        )
        .values(**values)
    ).rowcount
    return bool(won == 1)


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
            f"{provider.name} does not know an instance {provider_id[:100]!r}.",
            hint="Copy the id from the ops channel's notice or the platform's console.",
        ) from exc


def _price(rt: Runtime, provider: Provider, seen: ProviderInstance, given: int | None) -> int:
    """The price to register: the one given, else the platform's when it is in the bot's
    currency. Raises UsageError when neither can be used."""
    if given is not None:
        return given
    currency = rt.settings.currency
    if seen.price_micros_per_hour is None:
        raise UsageError(
            f"{provider.name} does not say what {seen.provider_id} costs.",
            hint="Add the price you pay, like --price 2.10/h.",
        )
    if seen.currency != currency:
        raise UsageError(
            f"{provider.name} prices {seen.provider_id} in {seen.currency}; the bot counts in "
            f"{currency}.",
            hint=f"Add its price in {currency}, like --price 2.10/h.",
        )
    return seen.price_micros_per_hour
